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
//! The files: `action` (what the machine asks, what a collective answers), `heat` (the slot heat
//! ring and the fold), `agree` (the next task, the reply awaited, the plan slot, the plan and
//! placement checks), `walk` (the layer walk and its votes), `error`, and `local` (the
//! [`LocalCollective`] of one-thread drivers).
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

use eplb_core::{Cycle, Error, HeatStage, LiveSet, Placement, Shape, StageClassifier, Step};

use action::gather_what;
pub use action::{Action, Collective, Gather, LayerAction, PlanInput, PlannerAction, Reply};
pub use agree::{AGREE_WORDS, FAILED_PLAN, agree_tag, placement_hash, seal, tag_gather};
use agree::{Agree, Awaiting, Task};
pub use error::MachineError;
use error::check;
use heat::SlotHeat;
pub use local::{
    DriveError, Entered, LocalCollective, LocalFault, LocalHooks, LocalWorld, PlanAnswer,
};
use members::MemberStep;
pub use walk::outcome;
use walk::{LayerStep, Walk};

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
    plan: Vec<u16>,
    /// The new rows `[R][S]` of a layer held open ([`walk`]'s `kept`).
    kept: Vec<u16>,
    /// Each rank's placement hash once its open layer is settled (the placement check), `[R]`.
    post: Vec<u64>,
    changed: Vec<bool>,
    cycle_no: u64,
    agree: Agree,
    walk: Walk,
    events: Events,
    consecutive_failures: u32,
    health: Health,
    stats: MachineStats,
    /// The ranks that serve (agreed).
    live: LiveSet,
    /// The ranks the collectives run over: `live`, or a proposed set being agreed.
    net: LiveSet,
    /// `net.count()`, kept (a driver asks it before every poll).
    net_count: usize,
    /// The set a membership change proposes.
    proposed: LiveSet,
    members: MemberStep,
}

impl RankMachine {
    /// The machine of `rank`, starting from `placement` (`[L][R][S]`, the same on every rank).
    pub fn new(
        shape: Shape,
        rank: usize,
        placement: &[u16],
        cfg: MachineConfig,
    ) -> Result<Self, MachineError> {
        Placement::new(shape, placement)?;
        Self::build(shape, rank, placement, LiveSet::all(shape.ranks())?, cfg)
    }

    /// The machine of `rank` after membership changes: `placement` is the one the ranks of
    /// `live` hold (the slots of ranks outside it [`EMPTY`](eplb_core::EMPTY),
    /// [`validate_elastic`](eplb_core::live::validate_elastic)). A rank that is not in `live`
    /// (one that comes back) does nothing until the engine tells every rank a set that holds it
    /// ([`RankMachine::handle_membership`]); its rows stay empty, so no token reaches it, until
    /// a layer walk brings its weights from its peers.
    pub fn new_elastic(
        shape: Shape,
        rank: usize,
        placement: &[u16],
        live: LiveSet,
        cfg: MachineConfig,
    ) -> Result<Self, MachineError> {
        eplb_core::live::validate_elastic(&shape, &live, placement)?;
        Self::build(shape, rank, placement, live, cfg)
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
            plan: placement.to_vec(),
            kept: vec![0; shape.slots_per_layer()],
            post: vec![0; shape.ranks()],
            changed: vec![false; shape.layers()],
            cycle_no: 0,
            agree: Agree::new(),
            walk: Walk::new(),
            events: Events::default(),
            consecutive_failures: 0,
            health: Health::Running,
            stats: MachineStats::default(),
            live,
            net: live,
            net_count: live.count(),
            proposed: live,
            members: MemberStep::Idle,
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
        if self.health != Health::Running || !self.takes_part() {
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
                self.agree.task = Task::Gather;
            }
            Step::Wait => {}
            Step::UpdateLayer(l) => self.walk.due = Some(l),
            Step::PlanDue => self.agree.task = Task::AgreeReady,
            Step::CycleDone => {
                if core::mem::take(&mut self.walk.walking) {
                    self.agree.check = true;
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
        match self.agree.awaiting {
            Awaiting::Gather(of) => {
                self.agree.awaiting = Awaiting::Nothing;
                let words = match reply {
                    None => Ok(None),
                    Some(Reply::Words(w)) => {
                        let want = self.net_count * self.sent_len(of);
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
                let folded = match of {
                    Gather::Heat => self.on_heat(words),
                    Gather::Ready => {
                        self.on_ready(words);
                        Ok(())
                    }
                    Gather::Digest => {
                        self.on_digests(words);
                        Ok(())
                    }
                    Gather::Vote { layer } => {
                        self.on_votes(layer, words);
                        Ok(())
                    }
                    Gather::Placement => {
                        self.on_placements(words);
                        Ok(())
                    }
                    Gather::Members => {
                        self.on_members(words);
                        Ok(())
                    }
                };
                bad.and(folded)
            }
            Awaiting::Nothing | Awaiting::Committed(_) | Awaiting::Loaded(_) => {
                Err(MachineError::Reply {
                    expected: "no collective reply (none was asked for)",
                    got,
                })
            }
        }
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
        self.agree.check = true;
    }

    /// What resume and a membership change share: balancing runs again from a dropped cycle.
    fn restart(&mut self) {
        self.health = Health::Running;
        self.consecutive_failures = 0;
        self.walk.commit_tries = 0;
        self.abandon_cycle();
    }

    /// The next action, or `None` when there is nothing to do or an answer is outstanding.
    pub fn poll(&mut self) -> Option<Action<'_>> {
        if self.agree.awaiting != Awaiting::Nothing {
            return None;
        }
        if !self.takes_part() {
            // A rank that comes back waits for the engine's membership change.
            return None;
        }
        match self.next_layer_step() {
            Some(LayerStep::Vote {
                layer,
                words: [a, b],
            }) => {
                let live = placement_hash(&self.placement);
                Some(self.gather_words(Gather::Vote { layer }, a, b, live))
            }
            Some(LayerStep::Do(a)) => Some(Action::Layer(a)),
            None => self.poll_task(),
        }
    }

    /// Whether this rank is live, or is being let in by a membership change under way.
    fn takes_part(&self) -> bool {
        self.live.contains(self.rank)
            || (self.members != MemberStep::Idle && self.proposed.contains(self.rank))
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
        if self.agree.submitted {
            self.agree.submitted = false;
            self.agree.task = Task::Settle {
                taken: false,
                record: false,
                resync: false,
            };
        } else if !matches!(self.agree.task, Task::Settle { .. }) {
            self.agree.task = Task::Idle;
        }
        self.abandon_walk();
    }

    fn end_cycle(&mut self) {
        self.events.cycle_done = true;
        self.heat.reset();
        self.changed.iter_mut().for_each(|c| *c = false);
    }
}
