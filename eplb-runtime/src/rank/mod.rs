//! The rank machine: one rank's EPLB cycle as a sans-IO state machine.
//!
//! In the shape of str0m's `Rtc` and quinn-proto's `Connection`: one input per source (a forward,
//! a collective's reply, the planner's answer, a layer's exchange and install, the engine's
//! resume), one output, [`RankMachine::poll`], drained until `None`. The machine never waits,
//! never reads a clock, never calls a transport or a planner, and allocates only in
//! [`RankMachine::new`] (every buffer is sized from the shape). A driver executes each action and
//! feeds its result back: the [`Controller`](crate::controller::Controller) with a
//! [`Transport`](crate::transport::Transport) and the planner thread, the simulator with a
//! [`LocalCollective`] and the policy called in place.
//!
//! # Driving it
//!
//! After every forward, call [`RankMachine::handle_exchanged`] if a layer was launched, then
//! [`RankMachine::handle_forward`], then drain the machine:
//!
//! ```text
//! while let Some(action) = machine.poll() {
//!     match action { /* execute it; answer it where the table says so */ }
//! }
//! ```
//!
//! | action | the driver | answer |
//! | --- | --- | --- |
//! | [`Collective::AllGather`] `{ of, send }` | all-gather `send` from every rank into a rank-major buffer of `ranks * send.len()` words | [`RankMachine::handle_collective`] with [`Reply::Words`], or `None` when it failed |
//! | [`Collective::AllAnd`] `{ flag }` | all-reduce `flag` with a logical AND (the machine asks for none; drivers still serve it) | [`RankMachine::handle_collective`] with [`Reply::Flag`], or `None` when it failed |
//! | [`PlannerAction::Submit`] | ask the planner with the [`PlanInput`] (the machine folded the gathered heat) | [`RankMachine::handle_plan`] when the plan is ready or failed (any time later) |
//! | [`PlannerAction::Settle`] | tell the planner whether every rank took the cycle (the policy state advances or rolls back) | none |
//! | [`Action::Record`] | hand [`RankMachine::plan`] to the record sink | none |
//! | [`LayerAction::Launch`] | start the layer's exchange (rows from [`RankMachine::placement`] and [`RankMachine::plan`]) before the next forward | [`RankMachine::handle_exchanged`] after it |
//! | [`LayerAction::SendOnly`] | send this rank's part of the layer's exchange, receive nothing | none |
//! | [`LayerAction::Commit`] | install the layer | [`RankMachine::handle_committed`] |
//! | [`LayerAction::Abort`] | forget the layer's exchange | none |
//!
//! While an answer is outstanding `poll()` returns `None`. Collectives come in the same order on
//! every rank, because every rank runs the same machine on the same agreed inputs. The machine
//! knows which reply it waits for: a reply of another kind or length is a [`MachineError`] (and
//! counts as a failed collective).
//!
//! Every agreement (readiness, digest, vote, placement check) is an all-gather of
//! [`AGREE_WORDS`] words per rank, `[tag, a, b, live, check]` ([`Gather`]): the tag names the
//! cycle, step and layer, `check` seals the words. A collective that fails on one rank only, or a
//! word corrupted on one rank only, never moves that rank off its peers' step; words of another
//! step (out of step) make every rank that reads them drop the cycle and check placements at
//! once, where the ranks adopt the highest cycle and a rank on another placement than the
//! majority's repairs it (installs or drops the layer it holds open) or stops
//! ([`Health::Diverged`]). [`RankMachine::handle_resume`] resynchronizes every rank.
//!
//! The files, as rooms with walls (quinn-proto's `MtuDiscovery` is the model): each room owns its
//! state behind private fields and small methods that return an outcome, and this module applies
//! every outcome to the machine's statistics, events, health, cycle, placement and plan, in one
//! place. `action` (what the machine asks, what a collective answers); `wire` (the agreement word
//! format, the protocol's public surface, and the kept placement hash); `heat` (`SlotHeat`: the
//! slot heat ring and the fold); `walk` (`Walk`: the layer walk, its votes, a layer held open
//! and its kept rows; outcomes `LayerStep`, `Dropped`, `Install`); `agree` (`Agree`: the
//! next task, the answer awaited, the plan slot, the words sent, each rank's settled placement;
//! outcomes `Verdict`, the readiness, `Agreed`); `members` (`Members`: the agreed, collective
//! and proposed sets and the member step; outcomes `MemberPoll`, `Adopt`); `error`; and
//! `local` (the [`LocalCollective`] of one-thread drivers). The rooms import `action`, `wire`
//! and `error`, never each other.
//!
//! **Invariant:** no collective is asked for on an iteration where nothing is due: while
//! collecting heat, while the planner runs and between cycles every action is local.
//!
//! **Invariant:** a layer moves only after every rank agreed on the plan's digest (cycle number and
//! a hash of the placement); a mismatch or a failed plan anywhere abandons the cycle on every rank.
//!
//! **Invariant:** after [`MachineConfig::max_collective_failures`] consecutive collective
//! failures the machine suspends balancing: no more actions until
//! [`RankMachine::handle_resume`].
//!
//! **Invariant:** a layer commits only after a vote in which every rank's words were at that
//! vote's step and said yes; a rank that cannot read a vote or install a layer holds the layer
//! open and settles it from its peers' placement hashes, never serving on a placement its peers
//! do not hold without saying so ([`Health::Diverged`]).
//!
//! **Invariant:** no panic on any input (the crate's panic-free lint wall covers this module);
//! allocation only in [`RankMachine::new`].

mod action;
mod agree;
mod error;
mod heat;
mod local;
mod members;
mod walk;
pub mod wire;

use eplb_core::{Cycle, Error, HeatStage, LiveSet, Placement, Shape, StageClassifier, Step};

use action::gather_what;
pub use action::{Action, Collective, Gather, LayerAction, PlanInput, PlannerAction, Reply};
use agree::{Agree, Awaiting, Task, Verdict};
pub use error::MachineError;
use error::check;
use heat::SlotHeat;
pub use local::{
    DriveError, Entered, LocalCollective, LocalFault, LocalHooks, LocalWorld, PlanAnswer,
};
use members::{Adopt, MemberPoll, Members};
use walk::{Dropped, Install, LayerStep, Walk};
pub use wire::{AGREE_WORDS, FAILED_PLAN, agree_tag, outcome, placement_hash, seal, tag_gather};
use wire::{Heard, PlacementHash};

/// What a rank does with an agreed plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    /// Apply plans: move weights layer by layer.
    Dynamic,
    /// Plan but never move a weight; each plan is handed to the driver to record.
    Record,
}

/// Settings of one rank machine.
#[derive(Debug, Clone, Copy)]
pub struct MachineConfig {
    /// `H`: matching iterations of heat per cycle.
    pub heat_interval: u32,
    /// `A`: iterations the planner gets.
    pub algo_interval: u32,
    /// Which iterations feed the heat.
    pub stage: HeatStage,
    /// Prefill/decode classifier.
    pub classifier: StageClassifier,
    /// Dynamic or record.
    pub mode: RunMode,
    /// Seed handed to the policy (plus the cycle number).
    pub seed: u64,
    /// Consecutive collective failures after which balancing is suspended (at least 1).
    pub max_collective_failures: u32,
    /// The collectives fail on every rank or on none (the host transport's guarantee). When
    /// `false`, a rank that voted yes on a layer and saw the vote fail keeps the exchange until
    /// its peers tell it what they did. The [`Controller`](crate::controller::Controller) sets
    /// it from [`Transport::atomic_collectives`](crate::transport::Transport::atomic_collectives).
    pub atomic_collectives: bool,
}

/// Whether the machine balances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Balancing.
    Running,
    /// Suspended after this many consecutive collective failures; no collectives until resumed.
    Suspended {
        /// Consecutive failures that led here.
        failures: u32,
    },
    /// This rank holds another placement than the majority of the ranks and cannot repair it
    /// (the placement check, or a layer it failed to install three times); no collectives until
    /// resumed, when the placement check tries the repair again.
    Diverged,
}

/// Counters of one machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineStats {
    /// Cycles whose plan was taken (applied, recorded, or unchanged) or failed everywhere.
    pub plans_taken: u64,
    /// Iterations at which the plan was due but some rank did not have it.
    pub late_iterations: u64,
    /// Plans that failed (policy error or panic on some rank).
    pub plan_failures: u64,
    /// Cycles abandoned because ranks held different plans.
    pub digest_mismatches: u64,
    /// Layers committed.
    pub layers_committed: u64,
    /// Layer exchanges that failed on some rank (the layer kept its old placement).
    pub layers_failed: u64,
    /// Collectives that failed.
    pub collective_failures: u64,
    /// Collectives asked for (gathers and agreements).
    pub collectives: u64,
    /// Agreements that came back out of step (another step's or cycle's tag): each dropped the
    /// cycle on every rank that read it and led to a placement check.
    pub resyncs: u64,
    /// Layer installs that failed on this rank (each retried; see [`RankMachine::handle_committed`]).
    pub commit_failures: u64,
    /// Membership changes adopted ([`RankMachine::handle_membership`]).
    pub membership_changes: u64,
    /// Membership changes refused: the ranks were told different sets.
    pub membership_refused: u64,
    /// Layers whose lost experts this rank loaded from storage ([`LayerAction::Load`]).
    pub loads: u64,
    /// Loads that failed (the layer kept its rows).
    pub load_failures: u64,
}

/// What happened since the last [`RankMachine::take_events`] (one forward, for a driver that
/// takes them after every forward), for the engine's logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Events {
    /// A layer committed.
    pub committed: Option<u16>,
    /// A layer whose exchange failed (it kept its old placement).
    pub failed: Option<u16>,
    /// The heat snapshot was taken.
    pub snapshot: bool,
    /// The plan was due and taken: `Some(changed layers)` (0 in record mode or when it failed).
    pub plan_taken: Option<usize>,
    /// The plan was due but not ready everywhere.
    pub plan_late: bool,
    /// The cycle ended; the live placement is final until the next plan.
    pub cycle_done: bool,
    /// Balancing is suspended or stopped ([`Health`] is not `Running`) until the engine resumes
    /// it.
    pub suspended: bool,
    /// The ranks agreed on a new live set ([`RankMachine::handle_membership`]).
    pub membership: bool,
}

/// One rank's cycle.
#[derive(Debug, Clone)]
pub struct RankMachine {
    shape: Shape,
    rank: usize,
    cfg: MachineConfig,
    cycle: Cycle,
    heat: SlotHeat,
    placement: Vec<u16>,
    /// [`placement_hash`] of `placement`, kept: updated wherever the placement changes (from
    /// the installed layer on, or whole after a membership change), never recomputed in a poll.
    live_hash: PlacementHash,
    plan: Vec<u16>,
    changed: Vec<bool>,
    cycle_no: u64,
    agree: Agree,
    walk: Walk,
    members: Members,
    events: Events,
    consecutive_failures: u32,
    health: Health,
    stats: MachineStats,
}

impl RankMachine {
    /// The machine of `rank`, starting from `placement` (the same on every rank). With a live
    /// set ([`Placement::with_live`]) it is the machine of a deployment after membership
    /// changes: the slots of ranks outside the set are [`EMPTY`](eplb_core::EMPTY). A rank that
    /// is not in the set (one that comes back) does nothing until the engine tells every rank a
    /// set that holds it ([`RankMachine::handle_membership`]); its rows stay empty, so no token
    /// reaches it, until a layer walk brings its weights from its peers.
    pub fn new(
        rank: usize,
        placement: Placement<'_>,
        cfg: MachineConfig,
    ) -> Result<Self, MachineError> {
        let shape = *placement.shape();
        let live = match placement.live() {
            Some(l) => *l,
            None => LiveSet::all(shape.ranks())?,
        };
        Self::build(shape, rank, placement.as_slice(), live, cfg)
    }

    fn build(
        shape: Shape,
        rank: usize,
        placement: &[u16],
        live: LiveSet,
        cfg: MachineConfig,
    ) -> Result<Self, MachineError> {
        if rank >= shape.ranks() {
            return Err(Error::Index {
                what: "rank",
                index: rank,
                bound: shape.ranks(),
            }
            .into());
        }
        Ok(Self {
            shape,
            rank,
            cfg: MachineConfig {
                max_collective_failures: cfg.max_collective_failures.max(1),
                ..cfg
            },
            cycle: Cycle::new(cfg.heat_interval, cfg.algo_interval)?,
            heat: SlotHeat::new(&shape, cfg.heat_interval)?,
            placement: placement.to_vec(),
            live_hash: PlacementHash::new(placement, shape.slots_per_layer()),
            plan: placement.to_vec(),
            changed: vec![false; shape.layers()],
            cycle_no: 0,
            agree: Agree::new(shape.ranks()),
            walk: Walk::new(shape.slots_per_layer()),
            members: Members::new(live),
            events: Events::default(),
            consecutive_failures: 0,
            health: Health::Running,
            stats: MachineStats::default(),
        })
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// This rank's plans come from a planner that another rank of its process feeds (ranks
    /// that share a process may share one planner, since every rank submits the same
    /// request): from now on it folds no gathered heat, and its
    /// [`PlannerAction::Submit`] carries an empty input (`windows` 0, no loads, no samples),
    /// which the driver answers with the shared plan. The simulator sets it on every rank but
    /// rank 0, so that the heat is folded once per cycle, not `R` times.
    pub fn share_planner(&mut self) {
        self.heat.stop_folding();
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// The live placement `[L][R][S]`.
    pub fn placement(&self) -> &[u16] {
        &self.placement
    }
    /// The taken plan's placement `[L][R][S]` (the live placement before the first plan).
    pub fn plan(&self) -> &[u16] {
        &self.plan
    }
    /// The current cycle number (0 before the first snapshot).
    pub fn cycle_number(&self) -> u64 {
        self.cycle_no
    }
    /// The cycle state.
    pub fn cycle(&self) -> &Cycle {
        &self.cycle
    }
    /// Whether a layer update is under way.
    pub fn is_updating(&self) -> bool {
        self.walk.is_active()
    }
    /// Whether the machine balances or is suspended.
    pub fn health(&self) -> Health {
        self.health
    }
    /// Counters.
    pub fn stats(&self) -> MachineStats {
        self.stats
    }
    /// The most words this rank sends in one all-gather (its whole heat ring, `W * L * S`, and
    /// at least the two of an agreement): a driver sizes its receive buffer to `ranks` times it.
    pub fn max_gather_words(&self) -> usize {
        self.heat.capacity().max(AGREE_WORDS)
    }
    /// What happened since the last call.
    pub fn take_events(&mut self) -> Events {
        let mut ev = core::mem::take(&mut self.events);
        ev.suspended = self.health != Health::Running;
        ev
    }
    /// The ranks that serve (agreed).
    pub fn live(&self) -> &LiveSet {
        self.members.live()
    }
    /// The ranks the collectives run over (the agreed set, or a proposed one being agreed).
    pub fn collective_ranks(&self) -> &LiveSet {
        self.members.net()
    }
    /// How many ranks the collectives run over ([`RankMachine::collective_ranks`]'s count, kept:
    /// a driver sizes every gather's reply with it).
    pub fn collective_count(&self) -> usize {
        self.members.net_count()
    }
    /// Whether a membership change is under way on this rank (announced, not yet rerouted).
    pub fn is_changing_membership(&self) -> bool {
        self.members.is_changing()
    }
    /// Experts (summed over layers) with no copy on a live rank of the live placement.
    pub fn lost_count(&self) -> usize {
        members::lost_count(&self.shape, &self.placement, self.members.live())
    }

    /// A forward finished: `slot_counts` are this rank's tokens per slot (`[L][S]`),
    /// `padded_tokens` the batch's padded token count.
    pub fn handle_forward(
        &mut self,
        slot_counts: &[u32],
        padded_tokens: u64,
    ) -> Result<(), MachineError> {
        check(
            "per-slot token counts [L][S]",
            self.shape.layers() * self.shape.slots_per_rank(),
            slot_counts.len(),
        )?;
        self.walk.after_forward(self.rank);
        if self.health != Health::Running || !self.members.takes_part(self.rank) {
            return Ok(());
        }
        let matched = self
            .cfg
            .stage
            .matches(self.cfg.classifier.classify(padded_tokens));
        match self.cycle.on_iteration(matched, &self.changed) {
            Step::Collect { counted } => {
                if counted {
                    self.heat.add(slot_counts)?;
                }
            }
            Step::Snapshot => {
                self.heat.add(slot_counts)?;
                self.events.snapshot = true;
                self.agree.set_task(Task::Gather);
            }
            Step::Wait => {}
            Step::UpdateLayer(l) => self.walk.set_due(l),
            Step::PlanDue => self.agree.set_task(Task::AgreeReady),
            Step::CycleDone => {
                if self.walk.end() {
                    self.agree.request_check();
                }
                self.end_cycle();
            }
        }
        Ok(())
    }

    /// The collective asked for last finished: its reply, or `None` when it failed on this rank.
    ///
    /// A reply of another kind or length than the one asked for is an error; the machine then
    /// books the collective as failed.
    ///
    /// A collective that fails here (or an agreement word that fails its check) never moves this
    /// rank off the step its peers are at, since they may have read every word: a failed heat
    /// gather leaves this rank without a plan (every rank then drops the cycle at the digest); a
    /// failed readiness flag or digest is read as the rank's own word says (the next tags
    /// tell); a rank that voted yes on a layer and saw the vote fail keeps the exchange, votes no
    /// on the next layer without exchanging it, and settles the layer from its peers' placement
    /// hashes at that vote or at the placement check. An agreement whose tags differ (out of step)
    /// drops the cycle on every rank that read it, and they check their placements at once
    /// (`Gather::Placement`).
    pub fn handle_collective(&mut self, reply: Option<Reply<'_>>) -> Result<(), MachineError> {
        let got = match reply {
            None => "a failure",
            Some(Reply::Flag(_)) => "a flag",
            Some(Reply::Words(_)) => "words",
        };
        let Awaiting::Gather(of) = self.agree.awaiting() else {
            return Err(MachineError::Reply {
                expected: "no collective reply (none was asked for)",
                got,
            });
        };
        self.agree.wait_for(Awaiting::Nothing);
        let words = match reply {
            None => Ok(None),
            Some(Reply::Words(w)) => {
                let sent = match of {
                    Gather::Heat => self.heat.held().len(),
                    _ => AGREE_WORDS,
                };
                let want = self.members.net_count() * sent;
                check(gather_what(of), want, w.len()).map(|()| Some(w))
            }
            Some(Reply::Flag(_)) => Err(MachineError::Reply {
                expected: gather_what(of),
                got,
            }),
        };
        let (words, bad) = match words {
            Ok(w) => (w, Ok(())),
            Err(e) => (None, Err(e)),
        };
        if of == Gather::Heat {
            return bad.and(self.on_heat(words));
        }
        // Read before a failure is booked (booking may drop the walk).
        let yes_here = self.walk.voted_yes();
        let heard = self.agree.hear(words, of);
        match heard {
            Heard::InStep(_) => {
                self.collective_done(true, agreement(of), false);
            }
            Heard::Unknown { .. } => {
                self.collective_done(false, agreement(of), false);
            }
            Heard::OutOfStep => {}
        }
        match of {
            Gather::Heat => {}
            Gather::Ready => self.on_ready(heard),
            Gather::Digest => self.on_digests(heard),
            Gather::Vote { layer } => self.on_votes(layer, heard, yes_here),
            Gather::Placement => self.on_placements(heard),
            Gather::Members => self.on_members(heard),
        }
        bad
    }

    /// The heat gather answered with every rank's words (length checked), or failed.
    ///
    /// The cycle goes on either way, so that every rank stays at the same step: a rank without
    /// the heat has no plan, says so in its digest ([`FAILED_PLAN`]), and every rank drops the
    /// cycle there.
    fn on_heat(&mut self, all: Option<&[u64]>) -> Result<(), MachineError> {
        let folded = match all {
            Some(words) => self
                .heat
                .fold(&self.shape, &self.placement, self.members.live(), words),
            None => Ok(()),
        };
        let ok = all.is_some() && folded.is_ok();
        self.collective_done(ok, "heat gather", false);
        if self.health == Health::Running {
            self.cycle_no += 1;
            self.agree.heat_gathered(ok);
        }
        folded
    }

    /// The readiness words answered, or failed here. Unknown here: a rank that has its answer
    /// goes on to the digest as if every rank had (the digest's tags tell), one that has none asks
    /// again after the next iteration, as every rank does then.
    fn on_ready(&mut self, heard: Heard<'_>) {
        let words = match heard {
            Heard::OutOfStep => return self.out_of_step(Gather::Ready),
            Heard::Unknown { .. } if self.health != Health::Running => return,
            Heard::Unknown { .. } => None,
            Heard::InStep(words) => Some(words),
        };
        if !self.agree.on_ready(words) {
            self.stats.late_iterations += 1;
            self.events.plan_late = true;
        }
    }

    /// The digest gather answered with every rank's words, or failed here. Unknown here: a
    /// failed plan here failed everywhere; a plan held here is taken as if every rank held it
    /// (no layer moves unless every rank votes on it at the same step).
    fn on_digests(&mut self, heard: Heard<'_>) {
        let words = match heard {
            Heard::OutOfStep => return self.out_of_step(Gather::Digest),
            Heard::Unknown { .. } if self.health != Health::Running => return,
            Heard::Unknown { .. } => None,
            Heard::InStep(words) => Some(words),
        };
        let record = self.cfg.mode == RunMode::Record;
        let verdict = self.agree.on_digests(words, record);
        self.stats.plans_taken += 1;
        self.changed.iter_mut().for_each(|c| *c = false);
        match verdict {
            Verdict::Take => {}
            Verdict::Failed | Verdict::Mismatch { .. } => {
                if let Verdict::Mismatch { rank, theirs, mine } = verdict {
                    self.stats.digest_mismatches += 1;
                    log::error!(
                        "eplb rank {}: cycle {}: rank {rank} holds another plan (digest \
                         {theirs:016x}, mine {mine:016x}); the cycle is abandoned on every rank",
                        self.rank,
                        self.cycle_no,
                    );
                } else {
                    self.stats.plan_failures += 1;
                }
                self.plan.copy_from_slice(&self.placement);
                self.events.plan_taken = Some(0);
                let _ = self.cycle.on_plan(&self.changed);
                self.end_cycle();
                return;
            }
        }
        if !record {
            let per = self.shape.slots_per_layer();
            for ((c, old), new) in self
                .changed
                .iter_mut()
                .zip(self.placement.chunks_exact(per))
                .zip(self.plan.chunks_exact(per))
            {
                *c = old != new;
            }
        }
        self.events.plan_taken = Some(self.changed.iter().filter(|&&c| c).count());
        match self.cycle.on_plan(&self.changed) {
            Step::UpdateLayer(l) => self.walk.start(l),
            _ => self.end_cycle(),
        }
    }

    /// The layer vote answered with every rank's words, or failed here ([`Walk::on_vote`]).
    fn on_votes(&mut self, l: u16, heard: Heard<'_>, yes_here: bool) {
        let dropped = self.walk.on_vote(
            self.rank,
            l,
            heard,
            yes_here,
            self.cfg.atomic_collectives,
            &self.plan,
            &self.live_hash,
        );
        self.book(dropped);
        if heard == Heard::OutOfStep {
            self.out_of_step(Gather::Vote { layer: l });
        }
    }

    /// The placement check answered with every rank's words, or failed here.
    ///
    /// The ranks compare placement hashes, never cycle numbers: each adopts the highest cycle
    /// among the tags (a stale cycle's plan is gone already: the check follows a dropped or ended
    /// cycle). Every rank computes each rank's placement once it settled its open layer (the one
    /// whose vote or install it could not finish, its exchange kept; word `a` is the hash with it
    /// installed): installed if some rank holds that placement (then every rank voted yes on
    /// it), dropped otherwise. The placement most ranks then hold (ties: the lowest hash) is the
    /// agreed one. A rank that does not hold it after settling its open layer cannot repair it:
    /// it says so and stops balancing ([`Health::Diverged`]). Unknown here: nothing changes (the
    /// next readiness flag compares the placements again).
    fn on_placements(&mut self, heard: Heard<'_>) {
        let words = match heard {
            Heard::OutOfStep => return self.out_of_step(Gather::Placement),
            Heard::Unknown { .. } => return,
            Heard::InStep(words) => words,
        };
        let top = wire::top_cycle(words).unwrap_or(self.cycle_no);
        if top != self.cycle_no {
            log::warn!(
                "eplb rank {}: resynchronized from cycle {} to cycle {top}",
                self.rank,
                self.cycle_no
            );
            self.cycle_no = top;
        }
        let members = self.members.net_count();
        let agreed = self.agree.on_placements(words, members);
        let open = self.agree.sent_a();
        let mine = self
            .walk
            .settle_from_check(words, open)
            .unwrap_or(self.live_hash.value());
        if mine == agreed.hash {
            if agreed.holders < members {
                log::warn!(
                    "eplb rank {}: {} of {members} ranks hold another placement than \
                     {:016x}; each repairs it or stops",
                    self.rank,
                    members - agreed.holders,
                    agreed.hash,
                );
            }
            return;
        }
        log::error!(
            "eplb rank {}: this rank's placement ({mine:016x}) differs from the one {} of {} \
             ranks hold ({:016x}) and it cannot repair it; balancing stopped on this rank until \
             the engine resumes it",
            self.rank,
            agreed.holders,
            members,
            agreed.hash,
        );
        self.health = Health::Diverged;
        self.abandon_cycle();
    }

    /// The members' words answered, or failed here ([`Members::on_words`]).
    fn on_members(&mut self, heard: Heard<'_>) {
        match self.members.on_words(heard) {
            Adopt::Adopt { cycle } => {
                if let Some(top) = cycle
                    && top > self.cycle_no
                {
                    self.cycle_no = top;
                }
                self.adopt_members();
                // Compare the placements over the new set at once: it settles a layer some
                // rank holds open from before the change (its vote's outcome unknown there),
                // and catches a rank on another placement.
                self.agree.request_check();
            }
            Adopt::Refuse => {
                self.stats.membership_refused += 1;
                self.health = Health::Suspended {
                    failures: self.consecutive_failures.max(1),
                };
                log::error!(
                    "eplb rank {}: the ranks were told different live sets (mine {:?}); nothing \
                     is adopted and balancing is suspended until the engine resumes it or tells \
                     every rank the same set",
                    self.rank,
                    self.members.proposed()
                );
            }
        }
    }

    /// Adopts the proposed set: retires the slots of ranks outside it and asks for the reroute.
    fn adopt_members(&mut self) {
        let before = self.members.adopt();
        let live = *self.members.live();
        let emptied = eplb_core::live::retire(&self.shape, &live, &mut self.placement).unwrap_or(0);
        self.live_hash.changed_from(&self.placement, 0);
        self.plan.copy_from_slice(&self.placement);
        // A layer held open keeps its new rows for the check: without the ranks that left.
        if let Ok(one) = self.shape.with_layers(1) {
            self.walk.retire_kept(&one, &live);
        }
        let lost = self.lost_count();
        self.stats.membership_changes += 1;
        self.events.membership = true;
        // The policy's state was built for the old set: every rank restarts it alike.
        self.agree.set_task(Task::Settle {
            taken: false,
            record: false,
            resync: true,
        });
        log::warn!(
            "eplb rank {}: the ranks agreed on {live:?} (was {before:?}): {emptied} slots \
             emptied, {lost} expert copies lost over all layers until a plan reloads them; \
             routing now skips the ranks that left",
            self.rank,
        );
    }

    /// The ranks read another step's words in `of`: this rank drops the cycle (so does every
    /// rank that read the same words) and checks its placement at once. Only a placement check
    /// out of step counts as a failed collective (towards the suspension): the check it leads
    /// to is the resynchronization, and a check that cannot realign the ranks must end.
    fn out_of_step(&mut self, of: Gather) {
        self.stats.resyncs += 1;
        log::warn!(
            "eplb rank {}: cycle {}: {of}: the ranks are out of step; the cycle is dropped and the \
             ranks check their placements",
            self.rank,
            self.cycle_no
        );
        if of == Gather::Placement {
            self.collective_done(false, "placement check (out of step)", true);
        } else {
            self.abandon_cycle();
        }
        if self.health == Health::Running {
            self.agree.request_check();
        }
    }

    /// The load of `layer`'s lost experts finished ([`LayerAction::Load`]): `ok` when every one
    /// is in its receive buffer. A failed load is logged; this rank then takes part in the
    /// layer's exchange as usual (its peers' sends and receives stay matched) but votes no, so
    /// the layer keeps its rows on every rank (the next cycle's plan tries again).
    pub fn handle_loaded(&mut self, layer: u16, ok: bool) {
        if !self.agree.answered(Awaiting::Loaded(layer)) {
            return;
        }
        if ok {
            self.stats.loads += 1;
        } else {
            self.stats.load_failures += 1;
            log::error!(
                "eplb rank {}: layer {layer}: loading the experts that lost every copy failed; \
                 this rank votes no and the layer keeps its rows on every rank",
                self.rank
            );
        }
        self.walk.on_loaded(layer, ok);
    }

    /// This rank's exchange of `layer` finished after the forward (`ok`: every byte arrived).
    pub fn handle_exchanged(&mut self, layer: u16, ok: bool) {
        self.walk.on_exchanged(layer, ok);
    }

    /// The commit of `layer` finished (`ok`: the slots hold the new experts).
    ///
    /// Every rank voted yes, so the peers hold the new layer: a failed install is repaired, not
    /// dropped. The driver keeps the exchange (its received data) after a failed install; the
    /// machine asks for the commit again at once, then holds the layer open (sends only, votes
    /// no, receives nothing until it is settled) and installs it at the next vote or placement
    /// check that shows a peer holding the placement with it. A third failure stops balancing on
    /// this rank ([`Health::Diverged`]), with a log line naming the layer; the layer stays open,
    /// and the placement check after the engine's resume tries it once more.
    pub fn handle_committed(&mut self, layer: u16, ok: bool) {
        if !self.agree.answered(Awaiting::Committed(layer)) {
            return;
        }
        let rank = self.rank;
        match self.walk.on_committed(layer, ok, &self.plan) {
            Install::Done => {
                let per = self.shape.slots_per_layer();
                let range = usize::from(layer) * per..(usize::from(layer) + 1) * per;
                let src = self.walk.installed_rows(layer, &self.plan);
                if let (Some(dst), Some(src)) = (self.placement.get_mut(range), src) {
                    dst.copy_from_slice(src);
                }
                self.live_hash
                    .changed_layer(&self.placement, usize::from(layer));
                self.stats.layers_committed += 1;
                self.events.committed = Some(layer);
            }
            Install::Retry { tries } => {
                self.stats.commit_failures += 1;
                log::warn!(
                    "eplb rank {rank}: layer {layer}: install failed (try {tries}); trying again"
                );
            }
            Install::Kept { tries } => {
                self.stats.commit_failures += 1;
                log::error!(
                    "eplb rank {rank}: layer {layer}: install failed {tries} times; the exchange \
                     is kept and the placement check repairs the layer"
                );
            }
            Install::Diverged { tries } => {
                self.stats.commit_failures += 1;
                log::error!(
                    "eplb rank {rank}: layer {layer}: install failed {tries} times; this rank \
                     holds another placement than its peers and stops balancing until the engine \
                     resumes it"
                );
                self.health = Health::Diverged;
                self.abandon_cycle();
            }
        }
    }

    /// The planner's answer for `cycle`: the plan, or `None` when the policy failed. Answers
    /// for another cycle are ignored. The plan was validated when the planner host built it; a
    /// plan for another live set (a stale answer across a membership change) counts as a failed
    /// plan.
    pub fn handle_plan(&mut self, cycle: u64, plan: Option<&crate::planner::Plan>) {
        let plan = plan.filter(|p| p.live() == self.members.live());
        self.take_plan(cycle, plan.map(|p| (self.shape, p.placement())));
    }

    fn take_plan(&mut self, cycle: u64, plan: Option<(Shape, &[u16])>) {
        if cycle != self.cycle_no || !self.agree.awaits_plan() {
            return;
        }
        let hash = match plan {
            Some((shape, p)) if shape == self.shape && p.len() == self.plan.len() => {
                self.plan.copy_from_slice(p);
                Some(placement_hash(&self.plan, self.shape.slots_per_layer()))
            }
            Some(_) => {
                log::error!(
                    "eplb rank {}: cycle {cycle}: the plan has another shape",
                    self.rank
                );
                None
            }
            None => None,
        };
        self.agree.plan_answered(hash);
    }

    /// The engine changes the membership: from now on the ranks of `live` serve (it holds this
    /// rank). Called on every rank of `live` at the same iteration, whatever each rank's state,
    /// mid-walk too. The cycle under way is dropped; the ranks agree on the set, reroute (a
    /// routing-only step), and the next cycles plan over the live ranks (`ARCHITECTURE.md`,
    /// "Membership changes").
    ///
    /// Calls compose: a set given while a change is still being agreed replaces the proposed
    /// one (the change starts over with it), and [`RankMachine::remove_ranks`] and
    /// [`RankMachine::add_ranks`] apply to the proposed set, so that any sequence of calls means
    /// one call with their combined effect.
    ///
    /// Errors (nothing changes): `live` drawn from another number of ranks, not holding this
    /// rank, with too few slots for every expert (`live * S < N`), or another set than the one
    /// whose words this rank has in flight ([`MachineError::MembershipInFlight`]; the same set
    /// is a no-op then).
    pub fn handle_membership(&mut self, live: LiveSet) -> Result<(), MachineError> {
        let in_flight = self.agree.awaiting() == Awaiting::Gather(Gather::Members);
        self.members
            .check(&self.shape, self.rank, &live, in_flight)?;
        if in_flight {
            return Ok(());
        }
        log::warn!(
            "eplb rank {}: membership change proposed: {live:?} (was {:?}); the cycle under way \
             is dropped and the ranks agree on the set",
            self.rank,
            self.members.live()
        );
        self.restart();
        self.members.propose(live);
        Ok(())
    }

    /// [`RankMachine::handle_membership`] with `gone` removed from the set under agreement (the
    /// proposed one while a change is under way, else the agreed one).
    pub fn remove_ranks(&mut self, gone: &[usize]) -> Result<(), MachineError> {
        self.handle_membership(self.members.target().without(gone)?)
    }

    /// [`RankMachine::handle_membership`] with `back` added to the set under agreement (the
    /// proposed one while a change is under way, else the agreed one).
    pub fn add_ranks(&mut self, back: &[usize]) -> Result<(), MachineError> {
        self.handle_membership(self.members.target().with(back)?)
    }

    /// The engine resumes balancing (on every rank at the same iteration, whatever each rank's
    /// health, mid-walk too): every rank drops the cycle under way (a launched layer is aborted, a
    /// submitted plan settled as not taken), the ranks check their placements at once (adopting
    /// the highest cycle, repairing a kept layer), then a fresh cycle starts on every rank.
    pub fn handle_resume(&mut self) {
        log::info!(
            "eplb rank {}: balancing resumed ({:?}); the ranks resynchronize",
            self.rank,
            self.health
        );
        self.restart();
        self.agree.request_check();
    }

    /// What resume and a membership change share: balancing runs again from a dropped cycle.
    fn restart(&mut self) {
        self.health = Health::Running;
        self.consecutive_failures = 0;
        self.walk.restart();
        self.abandon_cycle();
    }

    /// The next action, or `None` when there is nothing to do or an answer is outstanding.
    pub fn poll(&mut self) -> Option<Action<'_>> {
        if self.agree.awaiting() != Awaiting::Nothing {
            return None;
        }
        if !self.members.takes_part(self.rank) {
            // A rank that comes back waits for the engine's membership change.
            return None;
        }
        let (shape, rank) = (&self.shape, self.rank);
        let (placement, plan) = (&self.placement, &self.plan);
        let step = self.walk.next_step(rank, |layer| {
            members::needs_load(shape, rank, placement, plan, layer)
        });
        match step {
            Some(LayerStep::Vote {
                layer,
                words: [a, b],
            }) => Some(self.gather_words(Gather::Vote { layer }, a, b, self.live_hash.value())),
            Some(LayerStep::Do(action)) => {
                match action {
                    LayerAction::Commit { layer } => {
                        self.agree.wait_for(Awaiting::Committed(layer));
                    }
                    LayerAction::Load { layer } => self.agree.wait_for(Awaiting::Loaded(layer)),
                    LayerAction::Abort { layer } => self.book(Dropped(Some(layer))),
                    LayerAction::Launch { .. } | LayerAction::SendOnly { .. } => {}
                }
                Some(Action::Layer(action))
            }
            None => self.poll_task(),
        }
    }

    /// The action of the next cycle task, if any.
    fn poll_task(&mut self) -> Option<Action<'_>> {
        match self.agree.take_task() {
            Task::Idle => {
                if self.members.is_changing() {
                    return self.poll_members();
                }
                if !self.agree.take_check() || self.health != Health::Running {
                    return None;
                }
                let open = self.walk.open_hash(&self.live_hash);
                let live = self.live_hash.value();
                Some(self.gather_words(Gather::Placement, open, 0, live))
            }
            Task::Gather => {
                self.agree.send_heat();
                self.stats.collectives += 1;
                Some(Action::Collective(Collective::AllGather {
                    of: Gather::Heat,
                    send: self.heat.held(),
                }))
            }
            Task::Submit => Some(Action::Planner(PlannerAction::Submit(PlanInput {
                cycle: self.cycle_no,
                seed: self.cfg.seed.wrapping_add(self.cycle_no),
                current: &self.placement,
                live: self.members.live(),
                windows: self.heat.folded_windows(),
                loads: self.heat.loads(),
                samples: self.heat.samples(),
            }))),
            Task::AgreeReady => {
                let ready = u64::from(self.agree.has_plan());
                let live = self.live_hash.value();
                Some(self.gather_words(Gather::Ready, ready, 0, live))
            }
            Task::AgreeDigest => {
                let hash = self.agree.digest();
                Some(self.gather_words(Gather::Digest, hash, 0, 0))
            }
            Task::Settle {
                taken,
                record,
                resync,
            } => {
                if record {
                    self.agree.set_task(Task::Record);
                }
                Some(Action::Planner(PlannerAction::Settle {
                    cycle: self.cycle_no,
                    taken,
                    resync,
                }))
            }
            Task::Record => Some(Action::Record {
                cycle: self.cycle_no,
            }),
        }
    }

    /// The membership step's action, if one is due.
    fn poll_members(&mut self) -> Option<Action<'_>> {
        match self.members.poll()? {
            MemberPoll::Announce => Some(Action::Members {
                live: self.members.net(),
            }),
            MemberPoll::Agree { digest } => {
                let live = self.live_hash.value();
                Some(self.gather_words(Gather::Members, digest, 0, live))
            }
            MemberPoll::Reroute => Some(Action::Reroute),
        }
    }

    /// Asks for an agreement gather of `of` with this rank's words `a`, `b` and `live`: tags and
    /// seals them, books it and waits for its answer.
    fn gather_words(&mut self, of: Gather, a: u64, b: u64, live: u64) -> Action<'_> {
        self.stats.collectives += 1;
        Action::Collective(Collective::AllGather {
            of,
            send: self.agree.send(of, self.cycle_no, a, b, live),
        })
    }

    /// Books a layer that failed here without an abort.
    fn book(&mut self, dropped: Dropped) {
        if let Dropped(Some(layer)) = dropped {
            self.stats.layers_failed += 1;
            self.events.failed = Some(layer);
        }
    }

    /// Books a collective's outcome; on failure abandons the cycle (and suspends balancing after
    /// too many in a row). Returns `ok`.
    fn collective_done(&mut self, ok: bool, what: &str, abandon: bool) -> bool {
        if ok {
            self.consecutive_failures = 0;
            return true;
        }
        self.stats.collective_failures += 1;
        self.consecutive_failures += 1;
        log::error!(
            "eplb rank {}: {what} failed here ({} in a row)",
            self.rank,
            self.consecutive_failures
        );
        if abandon {
            self.abandon_cycle();
        }
        if self.consecutive_failures >= self.cfg.max_collective_failures {
            self.health = Health::Suspended {
                failures: self.consecutive_failures,
            };
            log::error!(
                "eplb rank {}: balancing suspended after {} consecutive collective failures; \
                 serving continues on the current placement until the engine resumes it",
                self.rank,
                self.consecutive_failures
            );
            self.abandon_cycle();
        }
        false
    }

    /// Drops the cycle: heat restarts, a submitted plan is settled as not taken, a layer not yet
    /// committed is aborted.
    fn abandon_cycle(&mut self) {
        self.cycle.reset();
        self.heat.reset();
        self.changed.iter_mut().for_each(|c| *c = false);
        self.agree.drop_cycle();
        let dropped = self.walk.abandon();
        self.book(dropped);
    }

    fn end_cycle(&mut self) {
        self.events.cycle_done = true;
        self.heat.reset();
        self.changed.iter_mut().for_each(|c| *c = false);
    }
}

/// The name of an agreement, for the logs.
fn agreement(of: Gather) -> &'static str {
    match of {
        Gather::Heat => "heat gather",
        Gather::Ready => "plan-ready agreement",
        Gather::Digest => "digest agreement",
        Gather::Vote { .. } => "layer vote",
        Gather::Placement => "placement check",
        Gather::Members => "membership agreement",
    }
}
