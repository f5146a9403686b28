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
//! | [`Collective::AllAnd`] `{ flag }` | all-reduce `flag` with a logical AND | [`RankMachine::handle_collective`] with [`Reply::Flag`], or `None` when it failed |
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
//! The state lives in three parts: `heat` (the slot heat ring and the fold), `agree` (the next
//! task, the reply awaited, the plan slot) and `walk` (the layer walk).
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
//! **Invariant:** no panic on any input; allocation only in [`RankMachine::new`].
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]

mod agree;
mod heat;
mod local;
mod walk;

use std::fmt;

use eplb_core::{Cycle, Error, HeatStage, Placement, Shape, StageClassifier, Step};

use agree::{Agree, Awaiting, PlanSlot, Task};
pub use agree::{FAILED_PLAN, placement_hash};
use heat::SlotHeat;
pub use local::{DriveError, Entered, LocalCollective};
pub use walk::outcome;
use walk::{LayerJob, LayerStep, Walk};

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

/// One thing the driver must do.
#[must_use = "every action must be executed and, where the table says so, answered"]
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action<'a> {
    /// A collective over every rank; answer with [`RankMachine::handle_collective`].
    Collective(Collective<'a>),
    /// A request or a settlement for the planner.
    Planner(PlannerAction<'a>),
    /// A step of one layer's exchange.
    Layer(LayerAction),
    /// Record mode: hand [`RankMachine::plan`] to the record sink.
    Record {
        /// The cycle.
        cycle: u64,
    },
}

/// A collective, entered by every rank in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective<'a> {
    /// All-gather `send` from every rank into a rank-major buffer of `ranks * send.len()` words;
    /// answer [`Reply::Words`].
    AllGather {
        /// What the words are.
        of: Gather,
        /// This rank's words.
        send: &'a [u64],
    },
    /// All-reduce `flag` ("I have this cycle's plan, ready or failed") with a logical AND (one
    /// byte each way); answer [`Reply::Flag`]. If some rank has no answer yet, every rank asks
    /// again after the next iteration.
    AllAnd {
        /// This rank's flag.
        flag: bool,
    },
}

/// What an [`Collective::AllGather`] gathers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gather {
    /// This rank's slot heat, `[T][L][S]` token counts.
    Heat,
    /// `[cycle, placement hash of the plan]` (hash [`FAILED_PLAN`] when the plan failed here).
    Digest,
    /// The vote on `layer`'s exchange: `[my exchange succeeded (1) or not (0), my outcome of the
    /// previous vote` ([`outcome`])`]`. The layer commits iff every rank's word 0 is 1. Word 1
    /// lets a rank whose previous vote failed locally learn what its peers did.
    Vote {
        /// The layer.
        layer: u16,
    },
    /// At the end of a layer walk (and on resume): `[cycle, hash of the live placement]`. A rank
    /// that did not learn the outcome of a layer vote (its collective failed after its peers'
    /// succeeded) learns it here.
    Placement,
}

impl fmt::Display for Gather {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gather::Heat => f.write_str("heat gather"),
            Gather::Digest => f.write_str("digest agreement"),
            Gather::Vote { layer } => write!(f, "layer {layer} vote"),
            Gather::Placement => f.write_str("placement check"),
        }
    }
}

/// A collective's reply on this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// The AND over every rank of [`Collective::AllAnd`].
    Flag(bool),
    /// Every rank's words of [`Collective::AllGather`], rank-major.
    Words(&'a [u64]),
}

/// What the planner is asked for one cycle, borrowed from the machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanInput<'a> {
    /// The cycle number (1, 2, ... on every rank alike).
    pub cycle: u64,
    /// Seed for randomised policies.
    pub seed: u64,
    /// The live placement the heat was measured on, `[L][R][S]`.
    pub current: &'a [u16],
    /// `T`: heat windows in `samples`.
    pub windows: usize,
    /// Logical loads `[L][N]`, summed over the heat interval.
    pub loads: &'a [f64],
    /// Per-window logical loads `[T][L][N]`, oldest first.
    pub samples: &'a [f64],
}

/// The planner's side of a cycle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PlannerAction<'a> {
    /// Ask the planner for a plan; answer with [`RankMachine::handle_plan`] any time later.
    Submit(PlanInput<'a>),
    /// Every rank took cycle `cycle` (`taken`) or it was abandoned: the planner advances the
    /// policy's state to the one after the cycle, or rolls it back to the one before. With
    /// `resync` (the ranks held different plans, so their policy states may differ) every rank
    /// restarts the policy from its initial state.
    Settle {
        /// The cycle.
        cycle: u64,
        /// Whether every rank took it.
        taken: bool,
        /// Restart the policy state from scratch.
        resync: bool,
    },
}

/// A step of one layer's exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerAction {
    /// Before the next forward, start this rank's exchange of `layer` from
    /// [`RankMachine::placement`] to [`RankMachine::plan`]; report with
    /// [`RankMachine::handle_exchanged`] after the forward.
    Launch {
        /// The layer.
        layer: u16,
    },
    /// Send this rank's part of `layer`'s exchange but receive nothing (a previous layer's
    /// received data is still kept, its outcome unknown here); no answer. The machine votes no
    /// on this layer after the forward, so that the peers' receives complete and the walk stays
    /// in step.
    SendOnly {
        /// The layer.
        layer: u16,
    },
    /// Every rank's exchange succeeded: install `layer`, then call
    /// [`RankMachine::handle_committed`].
    Commit {
        /// The layer.
        layer: u16,
    },
    /// The exchange failed somewhere: forget it; the live slots stay as they were.
    Abort {
        /// The layer.
        layer: u16,
    },
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
    /// The placement check found ranks holding different placements that this rank cannot
    /// reconcile; no collectives until resumed.
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
}

/// A bad call into the machine or its driver (the caller's bug), never a runtime condition.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum MachineError {
    /// A shape or placement problem.
    Core(Error),
    /// A buffer has the wrong length.
    Len {
        /// Which buffer.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Given length.
        got: usize,
    },
    /// A collective reply of the wrong kind, or one nobody asked for.
    Reply {
        /// The reply the machine waits for.
        expected: &'static str,
        /// The reply it got.
        got: &'static str,
    },
    /// The transport endpoint does not match the shape.
    Endpoint {
        /// The endpoint's rank.
        rank: usize,
        /// The endpoint's world size.
        ranks: usize,
        /// Ranks in the shape.
        shape_ranks: usize,
    },
}

impl fmt::Display for MachineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MachineError::Core(e) => e.fmt(f),
            MachineError::Len {
                what,
                expected,
                got,
            } => write!(f, "{what}: expected {expected} values, got {got}"),
            MachineError::Reply { expected, got } => {
                write!(f, "collective reply: expected {expected}, got {got}")
            }
            MachineError::Endpoint {
                rank,
                ranks,
                shape_ranks,
            } => write!(
                f,
                "transport: endpoint is rank {rank} of {ranks}, the shape has {shape_ranks} ranks"
            ),
        }
    }
}

impl std::error::Error for MachineError {}

impl From<Error> for MachineError {
    fn from(e: Error) -> Self {
        MachineError::Core(e)
    }
}

fn check(what: &'static str, expected: usize, got: usize) -> Result<(), MachineError> {
    if expected == got {
        Ok(())
    } else {
        Err(MachineError::Len {
            what,
            expected,
            got,
        })
    }
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
    changed: Vec<bool>,
    cycle_no: u64,
    agree: Agree,
    walk: Walk,
    events: Events,
    consecutive_failures: u32,
    health: Health,
    stats: MachineStats,
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
            changed: vec![false; shape.layers()],
            cycle_no: 0,
            agree: Agree::new(),
            walk: Walk::new(),
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
        self.heat.capacity().max(self.agree.sent.len())
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
        if self.health != Health::Running {
            return Ok(());
        }
        let matched = self
            .cfg
            .stage
            .matches(self.cfg.classifier.classify(padded_tokens));
        match self.cycle.on_iteration(matched, &self.changed) {
            Step::Collect { counted } => {
                if counted {
                    self.heat.add(slot_counts);
                }
            }
            Step::Snapshot => {
                self.heat.add(slot_counts);
                self.events.snapshot = true;
                self.agree.task = Task::Gather;
            }
            Step::Wait => {}
            Step::UpdateLayer(l) => self.walk.due = Some(l),
            Step::PlanDue => self.agree.task = Task::AgreeReady,
            Step::CycleDone => {
                if core::mem::take(&mut self.walk.walking) {
                    self.agree.task = Task::CheckPlacement;
                }
                self.end_cycle();
            }
        }
        Ok(())
    }

    /// The collective asked for last finished: its reply, or `None` when it failed on this rank.
    ///
    /// A reply of another kind or length than the one asked for is an error; the machine then
    /// books the collective as failed. A failed collective abandons the cycle, except a layer
    /// vote and the placement check, which a rank resolves with its peers: a rank that voted yes
    /// on a layer and saw the vote fail keeps the exchange, votes no on the next layer without
    /// exchanging it, and learns the outcome from its peers' word 1 of that vote (or from the
    /// placement check at the end of the walk).
    pub fn handle_collective(&mut self, reply: Option<Reply<'_>>) -> Result<(), MachineError> {
        let got = match reply {
            None => "a failure",
            Some(Reply::Flag(_)) => "a flag",
            Some(Reply::Words(_)) => "words",
        };
        match self.agree.awaiting {
            Awaiting::Ready => {
                self.agree.awaiting = Awaiting::Nothing;
                let flag = match reply {
                    Some(Reply::Flag(all)) => Some(all),
                    _ => None,
                };
                self.on_ready(flag);
                match reply {
                    Some(Reply::Words(_)) => Err(MachineError::Reply {
                        expected: "a flag (the plan-ready AND)",
                        got,
                    }),
                    _ => Ok(()),
                }
            }
            Awaiting::Gather(of) => {
                self.agree.awaiting = Awaiting::Nothing;
                let words = match reply {
                    None => Ok(None),
                    Some(Reply::Words(w)) => {
                        let want = self.shape.ranks() * self.sent_len(of);
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
                };
                bad.and(folded)
            }
            Awaiting::Nothing | Awaiting::Committed(_) => Err(MachineError::Reply {
                expected: "no collective reply (none was asked for)",
                got,
            }),
        }
    }

    /// Words this rank sent in a gather of `of`.
    fn sent_len(&self, of: Gather) -> usize {
        match of {
            Gather::Heat => self.heat.held().len(),
            Gather::Digest | Gather::Vote { .. } | Gather::Placement => self.agree.sent.len(),
        }
    }

    /// The planner's answer for `cycle`: the plan's placement, or `None` when the policy failed.
    /// Answers for another cycle are ignored.
    pub fn handle_plan(&mut self, cycle: u64, plan: Option<Placement<'_>>) {
        if cycle != self.cycle_no
            || !self.agree.submitted
            || self.agree.plan_slot != PlanSlot::Missing
        {
            return;
        }
        self.agree.plan_slot = match plan {
            Some(p) if *p.shape() == self.shape => {
                self.plan.copy_from_slice(p.as_slice());
                PlanSlot::Ready(placement_hash(&self.plan))
            }
            Some(_) => {
                log::error!(
                    "eplb rank {}: cycle {cycle}: the plan has another shape",
                    self.rank
                );
                PlanSlot::Failed
            }
            None => PlanSlot::Failed,
        };
    }

    /// This rank's exchange of `layer` finished after the forward (`ok`: every byte arrived).
    pub fn handle_exchanged(&mut self, layer: u16, ok: bool) {
        if self.walk.job == LayerJob::Launched(layer) {
            self.walk.job = LayerJob::Exchanged(layer, ok);
        }
    }

    /// The commit of `layer` finished (`ok`: the slots hold the new experts).
    pub fn handle_committed(&mut self, layer: u16, ok: bool) {
        if self.agree.awaiting != Awaiting::Committed(layer) {
            return;
        }
        self.agree.awaiting = Awaiting::Nothing;
        self.walk.release();
        if !ok {
            log::error!("eplb rank {}: layer {layer} commit failed", self.rank);
            self.stats.layers_failed += 1;
            self.events.failed = Some(layer);
            return;
        }
        let per = self.shape.slots_per_layer();
        let range = usize::from(layer) * per..(usize::from(layer) + 1) * per;
        if let (Some(dst), Some(src)) =
            (self.placement.get_mut(range.clone()), self.plan.get(range))
        {
            dst.copy_from_slice(src);
        }
        self.stats.layers_committed += 1;
        self.events.committed = Some(layer);
    }

    /// The engine resumes balancing after a suspension (on every rank at the same iteration):
    /// the ranks first check that they hold the same placement, then a fresh cycle starts.
    pub fn handle_resume(&mut self) {
        if self.health != Health::Running {
            log::info!("eplb rank {}: balancing resumed", self.rank);
            self.health = Health::Running;
            self.consecutive_failures = 0;
            self.agree.task = Task::CheckPlacement;
        }
    }

    /// The next action, or `None` when there is nothing to do or an answer is outstanding.
    pub fn poll(&mut self) -> Option<Action<'_>> {
        if self.agree.awaiting != Awaiting::Nothing {
            return None;
        }
        match self.next_layer_step() {
            Some(LayerStep::Vote { layer, words }) => {
                Some(self.gather_words(Gather::Vote { layer }, words))
            }
            Some(LayerStep::Do(a)) => Some(Action::Layer(a)),
            None => self.poll_task(),
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
            "eplb rank {}: {what} failed ({} in a row); the cycle is abandoned",
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

/// The name of a gather's reply buffer, for errors.
fn gather_what(of: Gather) -> &'static str {
    match of {
        Gather::Heat => "gathered slot heat [R][T][L][S]",
        Gather::Digest => "gathered plan digests [R][2]",
        Gather::Vote { .. } => "gathered layer votes [R][2]",
        Gather::Placement => "gathered placement digests [R][2]",
    }
}
