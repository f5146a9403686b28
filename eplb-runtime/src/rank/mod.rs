//! The rank machine: one rank's EPLB cycle as a sans-IO state machine.
//!
//! In the shape of quinn-proto's `Connection`: inputs are `handle_*` calls, outputs come from
//! [`RankMachine::poll`] as [`Action`]s. The machine never waits, never reads a clock, never calls
//! a transport or a planner, and allocates only in [`RankMachine::new`] (every buffer is sized
//! from the shape). A driver executes each action and feeds its result back: the
//! [`Controller`](crate::controller::Controller) with a [`Transport`](crate::transport::Transport)
//! and the planner thread, the simulator with an in-memory collective and the policy called in
//! place, a Python engine with its own collectives.
//!
//! # Driving it
//!
//! After every forward, call [`RankMachine::handle_exchanged`] if a layer was launched, then
//! [`RankMachine::handle_forward`], then `poll()` until it returns `None`, executing each action
//! and answering those that need an answer:
//!
//! | action | the driver | answer |
//! | --- | --- | --- |
//! | [`Action::GatherHeat`] | all-gather `send` (`[T][L][S]` words) from every rank, rank-major | [`RankMachine::handle_gathered`] |
//! | [`Action::SubmitPlan`] | fold the gathered heat ([`RankMachine::fold_heat`]) and ask the planner | [`RankMachine::handle_plan`] when the plan is ready or failed (any time later) |
//! | [`Action::AgreeFlag`] | all-reduce one flag (logical AND) | [`RankMachine::handle_agreed`] |
//! | [`Action::VoteLayer`] | all-gather the two words `words` from every rank | [`RankMachine::handle_votes`] |
//! | [`Action::AgreeDigest`] | all-gather the two words `digest` from every rank | [`RankMachine::handle_digests`] |
//! | [`Action::Settle`] | tell the planner whether every rank took the cycle (the policy state advances or rolls back) | none |
//! | [`Action::Record`] | hand [`RankMachine::plan`] to the record sink | none |
//! | [`Action::AgreePlacement`] | all-gather the two words `digest` from every rank | [`RankMachine::handle_placements`] |
//! | [`Action::Launch`] | start the layer's exchange (rows from [`RankMachine::placement`] and [`RankMachine::plan`]) before the next forward | [`RankMachine::handle_exchanged`] after it |
//! | [`Action::SendOnly`] | send this rank's part of the layer's exchange, receive nothing | none |
//! | [`Action::Commit`] | install the layer | [`RankMachine::handle_committed`] |
//! | [`Action::Abort`] | forget the layer's exchange | none |
//!
//! While an answer is outstanding `poll()` returns `None`. Collectives come in the same order on
//! every rank, because every rank runs the same machine on the same agreed inputs.
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

use std::fmt;

use eplb_core::{Cycle, Error, HeatStage, Placement, Shape, StageClassifier, Step};

/// The digest word of a failed plan (a real placement hash of 0 is mapped to 1).
pub const FAILED_PLAN: u64 = 0;

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
    /// its peers tell it what they did ([`RankMachine::handle_votes`]).
    pub atomic_collectives: bool,
}

/// What an [`Action::AgreeFlag`] votes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vote {
    /// "I have this cycle's plan (ready or failed)".
    PlanReady,
}

/// Word 1 of a layer vote: this rank's outcome of the previous vote of the walk.
pub mod outcome {
    /// The previous layer was aborted here.
    pub const ABORTED: u64 = 0;
    /// The previous layer was committed here.
    pub const COMMITTED: u64 = 1;
    /// No previous vote in this walk, or its outcome is unknown here.
    pub const UNKNOWN: u64 = 2;
}

/// One thing the driver must do.
#[must_use = "every action must be executed and, where the table says so, answered"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action<'a> {
    /// All-gather `send` (this rank's slot heat, `[T][L][S]` token counts) from every rank into a
    /// rank-major buffer of `ranks * send.len()` words, then call
    /// [`RankMachine::handle_gathered`].
    GatherHeat {
        /// This rank's words.
        send: &'a [u64],
    },
    /// Ask the planner for `cycle`: the current placement is [`RankMachine::placement`], the heat
    /// is [`RankMachine::fold_heat`] of the gathered words, the seed is `seed`.
    SubmitPlan {
        /// The cycle number (1, 2, ... on every rank alike).
        cycle: u64,
        /// Seed for randomised policies.
        seed: u64,
    },
    /// All-reduce `flag` with a logical AND over every rank (one byte each way), then call
    /// [`RankMachine::handle_agreed`].
    AgreeFlag {
        /// This rank's flag.
        flag: bool,
        /// What it is about.
        on: Vote,
    },
    /// The vote on `layer`'s exchange: all-gather the two words `words` (`[my exchange
    /// succeeded (1) or not (0), my outcome of the previous vote` ([`outcome`])`]`) into a
    /// rank-major buffer of `2 * ranks` words, then call [`RankMachine::handle_votes`]. The layer
    /// commits iff every rank's word 0 is 1. Word 1 lets a rank whose previous vote failed locally
    /// learn what its peers did.
    VoteLayer {
        /// The layer.
        layer: u16,
        /// This rank's words.
        words: [u64; 2],
    },
    /// All-gather the two words `digest` (`[cycle, placement hash]`, hash [`FAILED_PLAN`] when
    /// the plan failed here) into a rank-major buffer of `2 * ranks` words, then call
    /// [`RankMachine::handle_digests`].
    AgreeDigest {
        /// This rank's digest.
        digest: [u64; 2],
    },
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
    /// Record mode: hand [`RankMachine::plan`] to the record sink.
    Record {
        /// The cycle.
        cycle: u64,
    },
    /// Before the next forward, start this rank's exchange of `layer` from
    /// [`RankMachine::placement`] to [`RankMachine::plan`]; report with
    /// [`RankMachine::handle_exchanged`] after the forward.
    Launch {
        /// The layer.
        layer: u16,
    },
    /// At the end of a layer walk (and on resume): all-gather the two words `digest`
    /// (`[cycle, hash of the live placement]`) into a rank-major buffer of `2 * ranks` words,
    /// then call [`RankMachine::handle_placements`]. A rank that did not learn the outcome of a
    /// layer vote (its collective failed after its peers' succeeded) learns it here.
    AgreePlacement {
        /// This rank's digest.
        digest: [u64; 2],
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

/// What one forward led to, for the engine's logs and tests.
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
    /// The cycle ended.
    pub cycle_done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaiting {
    Nothing,
    Gathered,
    Agreed(Vote),
    Votes(u16),
    Digests,
    Placements,
    Committed(u16),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerJob {
    Idle,
    Launched(u16),
    /// Not exchanged (a previous layer's outcome is unknown here): votes no after the forward.
    Skipped(u16),
    Exchanged(u16, bool),
    Commit(u16),
    Abort(u16),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Task {
    Idle,
    Gather,
    Submit,
    AgreeReady,
    AgreeDigest,
    CheckPlacement,
    Settle {
        taken: bool,
        record: bool,
        resync: bool,
    },
    Record,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PlanSlot {
    /// No answer from the planner for the current cycle.
    Missing,
    /// The plan in `plan` (its hash).
    Ready(u64),
    /// The planner failed.
    Failed,
}

/// The per-slot heat ring: `[W][L][S]` token counts; counted iteration `k` of a cycle goes to
/// bucket `k / per`.
#[derive(Debug, Clone)]
struct SlotHeat {
    per: u32,
    counted: u32,
    words: usize,
    data: Vec<u64>,
}

impl SlotHeat {
    fn new(layers: usize, slots: usize, heat_interval: u32) -> Result<Self, Error> {
        let (w, per) = eplb_core::heat::layout_for_interval(heat_interval)?;
        Ok(Self {
            per,
            counted: 0,
            words: layers * slots,
            data: vec![0; w * layers * slots],
        })
    }
    fn windows(&self) -> usize {
        self.counted.div_ceil(self.per) as usize
    }
    fn add(&mut self, counts: &[u32]) {
        let b = (self.counted / self.per) as usize;
        if let Some(bucket) = self.data.get_mut(b * self.words..(b + 1) * self.words) {
            for (h, &c) in bucket.iter_mut().zip(counts) {
                *h = h.saturating_add(u64::from(c));
            }
            self.counted += 1;
        }
    }
    fn held(&self) -> &[u64] {
        self.data.get(..self.windows() * self.words).unwrap_or(&[])
    }
    fn reset(&mut self) {
        let n = self.windows() * self.words;
        if let Some(d) = self.data.get_mut(..n) {
            d.fill(0);
        }
        self.counted = 0;
    }
}

/// A bad call into the machine (the driver's bug), never a runtime condition.
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

/// FNV-1a 64 over a placement's ids (one step per id); never [`FAILED_PLAN`].
pub fn placement_hash(placement: &[u16]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &v in placement {
        h ^= u64::from(v);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    if h == FAILED_PLAN { 1 } else { h }
}

/// [`placement_hash`] of `placement` with layer `layer` taken from `plan`.
fn placement_hash_with_layer(placement: &[u16], plan: &[u16], shape: &Shape, layer: u16) -> u64 {
    let per = shape.slots_per_layer();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (l, (old, new)) in placement
        .chunks_exact(per)
        .zip(plan.chunks_exact(per))
        .enumerate()
    {
        let rows = if l == usize::from(layer) { new } else { old };
        for &v in rows {
            h ^= u64::from(v);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    if h == FAILED_PLAN { 1 } else { h }
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
    plan_slot: PlanSlot,
    changed: Vec<bool>,
    cycle_no: u64,
    submitted: bool,
    awaiting: Awaiting,
    layer: LayerJob,
    due: Option<u16>,
    /// A layer whose vote this rank could not learn (its exchange data is kept).
    unsure: Option<u16>,
    /// This cycle walks layers: check the placement at its end.
    walked: bool,
    /// This rank's outcome of the previous layer vote of the walk ([`outcome`]).
    last_outcome: u64,
    /// The unsure layer once its outcome is known: `(layer, committed)`.
    resolved: Option<(u16, bool)>,
    /// The layer this rank launched last (its exchange data is live in the driver).
    launched: Option<u16>,
    task: Task,
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
        let cycle = Cycle::new(cfg.heat_interval, cfg.algo_interval)?;
        let heat = SlotHeat::new(shape.layers(), shape.slots_per_rank(), cfg.heat_interval)?;
        Ok(Self {
            shape,
            rank,
            cfg: MachineConfig {
                max_collective_failures: cfg.max_collective_failures.max(1),
                ..cfg
            },
            cycle,
            heat,
            placement: placement.to_vec(),
            plan: placement.to_vec(),
            plan_slot: PlanSlot::Missing,
            changed: vec![false; shape.layers()],
            cycle_no: 0,
            submitted: false,
            awaiting: Awaiting::Nothing,
            layer: LayerJob::Idle,
            due: None,
            unsure: None,
            walked: false,
            last_outcome: outcome::UNKNOWN,
            resolved: None,
            launched: None,
            task: Task::Idle,
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
        self.cycle.layer_in_flight().is_some() || self.layer != LayerJob::Idle || self.due.is_some()
    }
    /// Whether the machine balances or is suspended.
    pub fn health(&self) -> Health {
        self.health
    }
    /// Counters.
    pub fn stats(&self) -> MachineStats {
        self.stats
    }
    /// What happened since the last [`RankMachine::take_events`].
    pub fn take_events(&mut self) -> Events {
        core::mem::take(&mut self.events)
    }
    /// Words this rank sends in a heat gather (`T * L * S`), once the heat interval is complete.
    pub fn gather_len(&self) -> usize {
        self.heat.held().len()
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
        if let LayerJob::Skipped(l) = self.layer {
            self.layer = LayerJob::Exchanged(l, false);
        }
        if let LayerJob::Launched(l) = self.layer {
            log::error!(
                "eplb rank {}: layer {l}: no exchange result reported; counted as failed",
                self.rank
            );
            self.layer = LayerJob::Exchanged(l, false);
        }
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
                self.task = Task::Gather;
            }
            Step::Wait => {}
            Step::UpdateLayer(l) => self.layer_due(l),
            Step::PlanDue => self.task = Task::AgreeReady,
            Step::CycleDone => {
                if core::mem::take(&mut self.walked) {
                    self.task = Task::CheckPlacement;
                }
                self.end_cycle();
            }
        }
        Ok(())
    }

    fn layer_due(&mut self, l: u16) {
        self.due = Some(l);
    }

    /// The heat all-gather finished: `Ok` with every rank's words, or the collective failed.
    pub fn handle_gathered(&mut self, ok: bool) {
        if self.awaiting != Awaiting::Gathered {
            return;
        }
        self.awaiting = Awaiting::Nothing;
        if !self.collective_done(ok, "heat gather", true) {
            return;
        }
        self.cycle_no += 1;
        self.submitted = true;
        self.plan_slot = PlanSlot::Missing;
        self.task = Task::Submit;
    }

    /// Folds the gathered slot heat (`[R][T][L][S]`, rank-major) through the live placement into
    /// per-window logical heat `samples` (`[T][L][N]`) and its sum `loads` (`[L][N]`). Returns
    /// `T`. This is the one fold from slot heat to logical heat.
    pub fn fold_heat(
        &self,
        gathered: &[u64],
        loads: &mut [f64],
        samples: &mut [f64],
    ) -> Result<usize, MachineError> {
        let (l, s, n, r) = (
            self.shape.layers(),
            self.shape.slots_per_rank(),
            self.shape.experts(),
            self.shape.ranks(),
        );
        let t = self.heat.windows().max(1);
        check(
            "gathered slot heat [R][T][L][S]",
            r * t * l * s,
            gathered.len(),
        )?;
        check("logical loads [L][N]", l * n, loads.len())?;
        check("logical samples [T][L][N]", t * l * n, samples.len())?;
        fold_slot_heat(&self.shape, &self.placement, t, gathered, samples);
        loads.fill(0.0);
        for win in samples.chunks_exact(l * n) {
            for (a, b) in loads.iter_mut().zip(win) {
                *a += b;
            }
        }
        Ok(t)
    }

    /// The planner's answer for `cycle`: the plan's placement, or `None` when the policy failed.
    /// Answers for another cycle are ignored.
    pub fn handle_plan(&mut self, cycle: u64, plan: Option<Placement<'_>>) {
        if cycle != self.cycle_no || !self.submitted || self.plan_slot != PlanSlot::Missing {
            return;
        }
        match plan {
            Some(p) if *p.shape() == self.shape => {
                self.plan.copy_from_slice(p.as_slice());
                self.plan_slot = PlanSlot::Ready(placement_hash(&self.plan));
            }
            Some(_) => {
                log::error!(
                    "eplb rank {}: cycle {cycle}: the plan has another shape",
                    self.rank
                );
                self.plan_slot = PlanSlot::Failed;
            }
            None => self.plan_slot = PlanSlot::Failed,
        }
    }

    /// An [`Action::AgreeFlag`] finished: `Some(AND over every rank)`, or `None` when the
    /// collective failed.
    pub fn handle_agreed(&mut self, result: Option<bool>) {
        let Awaiting::Agreed(vote) = self.awaiting else {
            return;
        };
        self.awaiting = Awaiting::Nothing;
        let ok = self.collective_done(result.is_some(), "agreement", vote == Vote::PlanReady);
        let all = result.unwrap_or(false);
        match vote {
            Vote::PlanReady => {
                if !ok {
                    return;
                }
                if all {
                    self.task = Task::AgreeDigest;
                } else {
                    self.stats.late_iterations += 1;
                    self.events.plan_late = true;
                }
            }
        }
    }

    /// A [`Action::VoteLayer`] finished: every rank's two words, rank-major, or `None` when the
    /// collective failed here.
    ///
    /// A rank that voted yes and saw the collective fail cannot know whether its peers committed:
    /// it keeps the exchange (no commit, no abort), votes no on the next layer without
    /// exchanging it, and learns the outcome from its peers' word 1 of that vote (or, at the end
    /// of the walk, from the placement check).
    pub fn handle_votes(&mut self, all: Option<&[u64]>) {
        let Awaiting::Votes(l) = self.awaiting else {
            return;
        };
        self.awaiting = Awaiting::Nothing;
        let all = all.filter(|a| a.len() == 2 * self.shape.ranks());
        let mine = matches!(self.layer, LayerJob::Exchanged(_, true));
        let ok = self.collective_done(all.is_some(), "layer vote", false);
        if let (Some(u), Some(all)) = (self.unsure, all) {
            // Word 1 of the peers is their outcome of the vote on `u`: anyone who committed it
            // saw every rank say yes.
            let committed = all
                .chunks_exact(2)
                .any(|w| w.get(1) == Some(&outcome::COMMITTED));
            self.unsure = None;
            self.resolved = Some((u, committed));
        }
        let Some(all) = all else {
            if mine && self.unsure.is_none() && !self.cfg.atomic_collectives {
                log::error!(
                    "eplb rank {}: layer {l}: the outcome of the vote is unknown here; the \
                     exchange is kept until the peers tell",
                    self.rank
                );
                self.unsure = Some(l);
                self.last_outcome = outcome::UNKNOWN;
                self.layer = LayerJob::Idle;
            } else {
                self.last_outcome = outcome::ABORTED;
                self.layer = self.abort_or_drop(l);
            }
            return;
        };
        let yes = ok && all.chunks_exact(2).all(|w| w.first() == Some(&1));
        self.last_outcome = if yes {
            outcome::COMMITTED
        } else {
            outcome::ABORTED
        };
        self.layer = if yes {
            LayerJob::Commit(l)
        } else {
            self.abort_or_drop(l)
        };
    }

    /// The job that ends a failed layer: an abort if this rank launched it, else a drop.
    fn abort_or_drop(&mut self, l: u16) -> LayerJob {
        if self.launched == Some(l) {
            LayerJob::Abort(l)
        } else {
            self.stats.layers_failed += 1;
            self.events.failed = Some(l);
            LayerJob::Idle
        }
    }

    /// The digest all-gather finished: every rank's `[cycle, hash]`, rank-major, or `None` when
    /// the collective failed.
    pub fn handle_digests(&mut self, all: Option<&[u64]>) {
        if self.awaiting != Awaiting::Digests {
            return;
        }
        self.awaiting = Awaiting::Nothing;
        let all = match all {
            Some(a) if a.len() == 2 * self.shape.ranks() => Some(a),
            Some(a) => {
                log::error!(
                    "eplb rank {}: digest gather returned {} words, expected {}",
                    self.rank,
                    a.len(),
                    2 * self.shape.ranks()
                );
                None
            }
            None => None,
        };
        if !self.collective_done(all.is_some(), "digest agreement", true) {
            return;
        }
        let all = all.unwrap_or(&[]);
        let mine = self.digest();
        let failed = all.chunks_exact(2).any(|d| d[1] == FAILED_PLAN);
        let same = all.chunks_exact(2).all(|d| d == mine);
        self.stats.plans_taken += 1;
        self.submitted = false;
        self.changed.iter_mut().for_each(|c| *c = false);
        if failed || !same {
            if failed {
                self.stats.plan_failures += 1;
            } else {
                self.stats.digest_mismatches += 1;
                let first = all
                    .chunks_exact(2)
                    .position(|d| d != mine)
                    .unwrap_or_default();
                log::error!(
                    "eplb rank {}: cycle {}: rank {first} holds another plan (digest {:016x}, mine \
                     {:016x}); the cycle is abandoned on every rank",
                    self.rank,
                    self.cycle_no,
                    all.get(2 * first + 1).copied().unwrap_or_default(),
                    mine[1]
                );
            }
            self.plan.copy_from_slice(&self.placement);
            self.task = Task::Settle {
                taken: false,
                record: false,
                resync: !failed,
            };
            self.events.plan_taken = Some(0);
            let _ = self.cycle.on_plan(&self.changed);
            self.end_cycle();
            return;
        }
        let record = self.cfg.mode == RunMode::Record;
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
        self.task = Task::Settle {
            taken: true,
            record,
            resync: false,
        };
        self.events.plan_taken = Some(self.changed.iter().filter(|&&c| c).count());
        match self.cycle.on_plan(&self.changed) {
            Step::UpdateLayer(l) => {
                self.walked = true;
                self.layer_due(l);
            }
            _ => self.end_cycle(),
        }
    }

    /// The placement check finished: every rank's `[cycle, hash of its live placement]`,
    /// rank-major, or `None` when the collective failed. A layer whose vote this rank could not
    /// learn is committed when every other rank holds it, aborted when none does. Placements that
    /// still differ stop balancing ([`Health::Diverged`]).
    pub fn handle_placements(&mut self, all: Option<&[u64]>) {
        if self.awaiting != Awaiting::Placements {
            return;
        }
        self.awaiting = Awaiting::Nothing;
        let all = all.filter(|a| a.len() == 2 * self.shape.ranks());
        if !self.collective_done(all.is_some(), "placement check", false) {
            return;
        }
        let all = all.unwrap_or(&[]);
        let mine = [self.cycle_no, placement_hash(&self.placement)];
        let others = |d: [u64; 2]| {
            all.chunks_exact(2)
                .enumerate()
                .all(|(r, x)| r == self.rank || x == d)
        };
        if let Some(l) = self.unsure {
            let with = [
                self.cycle_no,
                placement_hash_with_layer(&self.placement, &self.plan, &self.shape, l),
            ];
            if others(with) {
                self.unsure = None;
                self.layer = LayerJob::Commit(l);
                return;
            }
            if others(mine) {
                self.unsure = None;
                self.layer = LayerJob::Abort(l);
                return;
            }
        } else if others(mine) {
            return;
        }
        log::error!(
            "eplb rank {}: the ranks hold different placements after cycle {}; balancing stopped \
             until the engine resumes it",
            self.rank,
            self.cycle_no
        );
        self.health = Health::Diverged;
        self.abandon_cycle();
    }

    /// This rank's exchange of `layer` finished after the forward (`ok`: every byte arrived).
    pub fn handle_exchanged(&mut self, layer: u16, ok: bool) {
        if self.layer == LayerJob::Launched(layer) {
            self.layer = LayerJob::Exchanged(layer, ok);
        }
    }

    /// The commit of `layer` finished (`ok`: the slots hold the new experts).
    pub fn handle_committed(&mut self, layer: u16, ok: bool) {
        if self.awaiting != Awaiting::Committed(layer) {
            return;
        }
        self.awaiting = Awaiting::Nothing;
        self.layer = LayerJob::Idle;
        self.launched = None;
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
            self.task = Task::CheckPlacement;
        }
    }

    /// The next action, or `None` when there is nothing to do or an answer is outstanding.
    pub fn poll(&mut self) -> Option<Action<'_>> {
        if self.awaiting != Awaiting::Nothing {
            return None;
        }
        match self.layer {
            LayerJob::Exchanged(layer, ok) => {
                self.awaiting = Awaiting::Votes(layer);
                self.stats.collectives += 1;
                return Some(Action::VoteLayer {
                    layer,
                    words: [u64::from(ok), self.last_outcome],
                });
            }
            LayerJob::Commit(layer) => {
                self.awaiting = Awaiting::Committed(layer);
                return Some(Action::Commit { layer });
            }
            LayerJob::Abort(layer) => {
                self.layer = LayerJob::Idle;
                self.launched = None;
                self.stats.layers_failed += 1;
                self.events.failed = Some(layer);
                return Some(Action::Abort { layer });
            }
            LayerJob::Idle => {
                if let Some((layer, committed)) = self.resolved.take() {
                    log::info!(
                        "eplb rank {}: layer {layer}: the peers {} it",
                        self.rank,
                        if committed { "committed" } else { "aborted" }
                    );
                    self.layer = if committed {
                        LayerJob::Commit(layer)
                    } else {
                        LayerJob::Abort(layer)
                    };
                    return self.poll();
                }
                if let Some(layer) = self.due.take() {
                    if self.unsure.is_some() {
                        // No receive while a layer's outcome is unknown: send only, vote "no"
                        // after the forward, when the peers vote.
                        self.layer = LayerJob::Skipped(layer);
                        return Some(Action::SendOnly { layer });
                    } else {
                        self.layer = LayerJob::Launched(layer);
                        self.launched = Some(layer);
                        return Some(Action::Launch { layer });
                    }
                }
            }
            LayerJob::Launched(_) | LayerJob::Skipped(_) => {}
        }
        let task = core::mem::replace(&mut self.task, Task::Idle);
        match task {
            Task::Idle => None,
            Task::Gather => {
                self.awaiting = Awaiting::Gathered;
                self.stats.collectives += 1;
                Some(Action::GatherHeat {
                    send: self.heat.held(),
                })
            }
            Task::Submit => Some(Action::SubmitPlan {
                cycle: self.cycle_no,
                seed: self.cfg.seed.wrapping_add(self.cycle_no),
            }),
            Task::AgreeReady => {
                self.awaiting = Awaiting::Agreed(Vote::PlanReady);
                self.stats.collectives += 1;
                Some(Action::AgreeFlag {
                    flag: self.plan_slot != PlanSlot::Missing,
                    on: Vote::PlanReady,
                })
            }
            Task::AgreeDigest => {
                self.awaiting = Awaiting::Digests;
                self.stats.collectives += 1;
                Some(Action::AgreeDigest {
                    digest: self.digest(),
                })
            }
            Task::CheckPlacement => {
                self.awaiting = Awaiting::Placements;
                self.stats.collectives += 1;
                Some(Action::AgreePlacement {
                    digest: [self.cycle_no, placement_hash(&self.placement)],
                })
            }
            Task::Settle {
                taken,
                record,
                resync,
            } => {
                if record {
                    self.task = Task::Record;
                }
                Some(Action::Settle {
                    cycle: self.cycle_no,
                    taken,
                    resync,
                })
            }
            Task::Record => Some(Action::Record {
                cycle: self.cycle_no,
            }),
        }
    }

    fn digest(&self) -> [u64; 2] {
        let hash = match self.plan_slot {
            PlanSlot::Ready(h) => h,
            PlanSlot::Missing | PlanSlot::Failed => FAILED_PLAN,
        };
        [self.cycle_no, hash]
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
        if self.submitted {
            self.submitted = false;
            self.task = Task::Settle {
                taken: false,
                record: false,
                resync: false,
            };
        } else if !matches!(self.task, Task::Settle { .. }) {
            self.task = Task::Idle;
        }
        match self.layer {
            LayerJob::Launched(l) | LayerJob::Exchanged(l, _) => self.layer = self.abort_or_drop(l),
            LayerJob::Skipped(_) => self.layer = LayerJob::Idle,
            _ => {}
        }
        self.due = None;
        self.walked = false;
    }

    fn end_cycle(&mut self) {
        self.events.cycle_done = true;
        self.heat.reset();
        self.changed.iter_mut().for_each(|c| *c = false);
    }
}

/// Folds rank-major slot heat `[R][T][L][S]` through `placement` (`[L][R][S]`) into logical
/// per-window heat `[T][L][N]` (overwritten).
pub fn fold_slot_heat(
    shape: &Shape,
    placement: &[u16],
    windows: usize,
    gathered: &[u64],
    samples: &mut [f64],
) {
    let (l, s, n) = (shape.layers(), shape.slots_per_rank(), shape.experts());
    let per = shape.slots_per_layer();
    samples.fill(0.0);
    let part = windows * l * s;
    if part == 0 {
        return;
    }
    for (rank, chunk) in gathered.chunks_exact(part).enumerate() {
        for (i, win) in chunk.chunks_exact(l * s).enumerate() {
            for (layer, row) in win.chunks_exact(s).enumerate() {
                let base = layer * per + rank * s;
                for (slot, &c) in row.iter().enumerate() {
                    if let Some(&e) = placement.get(base + slot)
                        && let Some(x) = samples.get_mut((i * l + layer) * n + usize::from(e))
                    {
                        *x += c as f64;
                    }
                }
            }
        }
    }
}
