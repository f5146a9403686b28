//! The per-rank controller: a short driver of the [rank machine](crate::rank) over a
//! [`Transport`] and the planner thread.
//!
//! A serving engine calls [`Controller::before_forward`] before every forward (it launches the
//! due layer's transfer) and [`Controller::after_forward`] after it with the iteration's per-slot
//! token counts and padded token count. `after_forward` feeds the machine (exchange result, plan,
//! forward) and executes its actions until it has none: collectives on the transport, requests
//! and settlements to the planner, commits and aborts.
//!
//! Nothing here blocks on the planner: when a plan is due and some rank does not have it yet,
//! every rank tries again after the next iteration. A failed or timed-out exchange leaves the
//! layer on its old placement on every rank (the ranks agree on success before committing).
//! [`crate::startup::controller`] builds a rank's controller from an `eplb_config` in one call.

use std::fmt;
use std::sync::Arc;

use eplb_core::{
    Cycle, HeatStage, LayerPlacement, Placement, ReplicaChoice, Shape, StageClassifier,
};

use crate::planner::{Plan, PlanRequest, Planner};
pub use crate::rank::RunMode;
use crate::rank::{Action, Health, MachineConfig, MachineError, RankMachine};
use crate::transfer::{RankPlan, plan_layer};
use crate::transport::{Op, Site, Transport, TransportError};

/// Receives each plan in record mode (rank 0 writes the expert-map JSON).
pub type RecordSink = Box<dyn FnMut(&Shape, &[u16]) -> std::io::Result<()> + Send>;

/// Settings of one controller.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
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
    /// Seed handed to the policy.
    pub seed: u64,
    /// Replica choice for `log2phy`.
    pub replica_choice: ReplicaChoice,
    /// Consecutive collective failures after which balancing is suspended until
    /// [`Controller::resume`] (at least 1; [`DEFAULT_MAX_COLLECTIVE_FAILURES`] from a config).
    pub max_collective_failures: u32,
}

/// Consecutive collective failures after which a controller built from a config suspends
/// balancing.
pub const DEFAULT_MAX_COLLECTIVE_FAILURES: u32 = 3;

/// A bad call into the controller (the serving engine's bug), never a runtime condition.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ControllerError {
    /// A shape or placement problem.
    Core(eplb_core::Error),
    /// The per-slot counts have the wrong length.
    Counts {
        /// Expected `L * S`.
        expected: usize,
        /// Given.
        got: usize,
    },
    /// The transport does not match the shape.
    Transport(String),
}

impl fmt::Display for ControllerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControllerError::Core(e) => e.fmt(f),
            ControllerError::Counts { expected, got } => write!(
                f,
                "per-slot token counts: expected {expected} values ([L][S]), got {got}"
            ),
            ControllerError::Transport(e) => write!(f, "transport: {e}"),
        }
    }
}

impl std::error::Error for ControllerError {}

impl From<eplb_core::Error> for ControllerError {
    fn from(e: eplb_core::Error) -> Self {
        ControllerError::Core(e)
    }
}

impl From<MachineError> for ControllerError {
    fn from(e: MachineError) -> Self {
        match e {
            MachineError::Core(e) => ControllerError::Core(e),
            MachineError::Len { expected, got, .. } => ControllerError::Counts { expected, got },
        }
    }
}

/// Counters of one controller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControllerStats {
    /// Cycles whose plan was taken (applied, recorded, or unchanged) or failed everywhere.
    pub plans_taken: u64,
    /// Iterations at which the plan was due but some rank did not have it.
    pub late_iterations: u64,
    /// Plans that failed (policy error or panic on some rank).
    pub plan_failures: u64,
    /// Layers committed.
    pub layers_committed: u64,
    /// Layer exchanges that failed on some rank (the layer kept its old placement).
    pub layers_failed: u64,
    /// Collectives that failed (the cycle was abandoned).
    pub collective_failures: u64,
    /// Cycles abandoned because ranks held different plans (digest mismatch).
    pub digest_mismatches: u64,
    /// Collectives run (gathers and agreements).
    pub collectives: u64,
}

/// What happened in one [`Controller::after_forward`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// A layer committed after this forward.
    pub committed: Option<usize>,
    /// A layer whose exchange failed after this forward (kept its old placement).
    pub failed: Option<usize>,
    /// The heat snapshot was taken and the planner woken.
    pub snapshot: bool,
    /// The plan was due and taken: `Some(number of changed layers)` (0 in record mode or when
    /// the plan failed).
    pub plan_taken: Option<usize>,
    /// The plan was due but not ready everywhere.
    pub plan_late: bool,
    /// The cycle ended; the live placement is final until the next plan.
    pub cycle_done: bool,
    /// Balancing is suspended (after too many consecutive collective failures) until
    /// [`Controller::resume`].
    pub suspended: bool,
}

/// The controller of one rank.
pub struct Controller<T: Transport> {
    machine: RankMachine,
    replica_choice: ReplicaChoice,
    transport: T,
    planner: Arc<Planner>,
    record: Option<RecordSink>,
    expert_map: Vec<i32>,
    log2phy: Vec<u32>,
    gathered: Vec<u64>,
    digests: Vec<u64>,
    /// The cycle submitted to the planner and not yet answered.
    waiting_for: Option<u64>,
    /// The planner's answer that was handed to the machine last (shared, not copied).
    plan: Option<Arc<crate::planner::Outcome>>,
    launch_due: Option<u16>,
    /// The layer launched: its rank plan, the launch result, and whether it was waited for.
    in_flight: Option<(RankPlan, Result<(), TransportError>, bool)>,
}

impl<T: Transport> fmt::Debug for Controller<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("rank", &self.machine.rank())
            .field("cycle", self.machine.cycle())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<T: Transport> Controller<T> {
    /// The controller of `transport.rank()`, starting from `placement` (`[L][R][S]`, the same on
    /// every rank).
    pub fn new(
        shape: Shape,
        placement: Vec<u16>,
        cfg: ControllerConfig,
        transport: T,
        planner: Arc<Planner>,
    ) -> Result<Self, ControllerError> {
        let p = Placement::new(shape, &placement)?;
        let colocated = p.colocated_rows();
        if colocated > 0 {
            log::warn!(
                "eplb: the initial placement has {colocated} rank rows holding an expert twice; \
                 the second copy gets no tokens under log2phy routing"
            );
        }
        if transport.ranks() != shape.ranks() || transport.rank() >= shape.ranks() {
            return Err(ControllerError::Transport(format!(
                "endpoint is rank {} of {}, the shape has {} ranks",
                transport.rank(),
                transport.ranks(),
                shape.ranks()
            )));
        }
        let machine = RankMachine::new(
            shape,
            transport.rank(),
            &placement,
            MachineConfig {
                heat_interval: cfg.heat_interval,
                algo_interval: cfg.algo_interval,
                stage: cfg.stage,
                classifier: cfg.classifier,
                mode: cfg.mode,
                seed: cfg.seed,
                max_collective_failures: cfg.max_collective_failures,
                atomic_collectives: transport.atomic_collectives(),
            },
        )?;
        let (w, _) = eplb_core::heat::layout_for_interval(cfg.heat_interval)?;
        let mut c = Self {
            machine,
            replica_choice: cfg.replica_choice,
            transport,
            planner,
            record: None,
            expert_map: vec![0; shape.loads_len()],
            log2phy: vec![0; shape.loads_len()],
            gathered: Vec::with_capacity(
                shape.ranks() * w * shape.layers() * shape.slots_per_rank(),
            ),
            digests: vec![0; 2 * shape.ranks()],
            waiting_for: None,
            plan: None,
            launch_due: None,
            in_flight: None,
        };
        for l in 0..shape.layers() {
            c.refresh_maps(l)?;
        }
        Ok(c)
    }

    /// Hands each plan to `sink` in record mode (set it on rank 0).
    pub fn set_record_sink(&mut self, sink: RecordSink) {
        self.record = Some(sink);
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.machine.rank()
    }
    /// The shape.
    pub fn shape(&self) -> &Shape {
        self.machine.shape()
    }
    /// The live placement `[L][R][S]`.
    pub fn placement(&self) -> &[u16] {
        self.machine.placement()
    }
    /// This rank's expert map of `layer` (`[N]`, slot or -1).
    pub fn expert_map(&self, layer: usize) -> &[i32] {
        let n = self.shape().experts();
        self.expert_map
            .get(layer * n..(layer + 1) * n)
            .unwrap_or(&[])
    }
    /// This rank's `log2phy` of `layer` (`[N]`).
    pub fn log2phy(&self, layer: usize) -> &[u32] {
        let n = self.shape().experts();
        self.log2phy.get(layer * n..(layer + 1) * n).unwrap_or(&[])
    }
    /// The transport endpoint.
    pub fn transport(&self) -> &T {
        &self.transport
    }
    /// The rank machine.
    pub fn machine(&self) -> &RankMachine {
        &self.machine
    }
    /// Counters.
    pub fn stats(&self) -> ControllerStats {
        let m = self.machine.stats();
        ControllerStats {
            plans_taken: m.plans_taken,
            late_iterations: m.late_iterations,
            plan_failures: m.plan_failures,
            layers_committed: m.layers_committed,
            layers_failed: m.layers_failed,
            collective_failures: m.collective_failures,
            digest_mismatches: m.digest_mismatches,
            collectives: m.collectives,
        }
    }
    /// The cycle state.
    pub fn cycle(&self) -> &Cycle {
        self.machine.cycle()
    }
    /// Whether a layer update is under way.
    pub fn is_updating(&self) -> bool {
        self.machine.is_updating()
    }
    /// Whether balancing runs or is suspended.
    pub fn health(&self) -> Health {
        self.machine.health()
    }
    /// Resumes balancing after a suspension (the engine's call, once its collectives work
    /// again); a fresh cycle starts.
    pub fn resume(&mut self) {
        self.machine.handle_resume();
    }
    /// The plan of the current cycle, once taken.
    pub fn current_plan(&self) -> Option<&Plan> {
        self.plan.as_deref().and_then(|o| o.as_ref().ok())
    }

    fn refresh_maps(&mut self, layer: usize) -> Result<(), ControllerError> {
        let shape = *self.machine.shape();
        let (per, n, rank) = (
            shape.slots_per_layer(),
            shape.experts(),
            self.machine.rank(),
        );
        let rows = self
            .machine
            .placement()
            .get(layer * per..(layer + 1) * per)
            .ok_or(eplb_core::Error::Index {
                what: "layer",
                index: layer,
                bound: shape.layers(),
            })?;
        let lp = LayerPlacement::new(shape, layer, rows)?;
        if let Some(m) = self.expert_map.get_mut(layer * n..(layer + 1) * n) {
            lp.expert_map(rank, m)?;
        }
        if let Some(m) = self.log2phy.get_mut(layer * n..(layer + 1) * n) {
            lp.log2phy(rank, self.replica_choice, m)?;
        }
        Ok(())
    }

    /// Before a forward: launches the due layer's exchange, if any.
    pub fn before_forward(&mut self) {
        let Some(layer) = self.launch_due.take() else {
            return;
        };
        let shape = *self.machine.shape();
        let per = shape.slots_per_layer();
        let l = usize::from(layer);
        let range = l * per..(l + 1) * per;
        let (Some(old), Some(new)) = (
            self.machine.placement().get(range.clone()),
            self.machine.plan().get(range),
        ) else {
            return;
        };
        let rank = self.machine.rank();
        let rank_plan = match plan_layer(&shape, l, old, new) {
            Ok(mut lp) if rank < lp.ranks.len() => lp.ranks.swap_remove(rank),
            Ok(_) => return,
            Err(e) => {
                log::error!("eplb rank {rank}: layer {layer}: {e}");
                let empty = RankPlan {
                    layer: l,
                    sends: Vec::new(),
                    recvs: Vec::new(),
                    new_row: Vec::new(),
                    install: Vec::new(),
                };
                self.in_flight = Some((
                    empty,
                    Err(TransportError::Invalid {
                        at: Site::new(Op::Launch, rank).layer(l),
                        detail: format!("the layer's transfers cannot be planned: {e}"),
                    }),
                    false,
                ));
                return;
            }
        };
        let launched = self.transport.launch(&rank_plan);
        self.in_flight = Some((rank_plan, launched, false));
    }

    /// Sends this rank's part of `layer` without receiving (the kept exchange stays in flight).
    fn send_only(&mut self, layer: u16) {
        let shape = *self.machine.shape();
        let (per, l, rank) = (
            shape.slots_per_layer(),
            usize::from(layer),
            self.machine.rank(),
        );
        let range = l * per..(l + 1) * per;
        let (Some(old), Some(new)) = (
            self.machine.placement().get(range.clone()),
            self.machine.plan().get(range),
        ) else {
            return;
        };
        match plan_layer(&shape, l, old, new) {
            Ok(mut lp) if rank < lp.ranks.len() => {
                let rank_plan = lp.ranks.swap_remove(rank);
                if let Err(e) = self.transport.launch_sends(&rank_plan) {
                    log::error!("eplb rank {rank}: layer {layer} sends: {e}");
                }
            }
            Ok(_) => {}
            Err(e) => log::error!("eplb rank {rank}: layer {layer}: {e}"),
        }
    }

    /// After a forward: `slot_counts` are this rank's tokens per slot (`[L][S]`),
    /// `padded_tokens` the batch's padded token count.
    pub fn after_forward(
        &mut self,
        slot_counts: &[u32],
        padded_tokens: u64,
    ) -> Result<Report, ControllerError> {
        let shape = *self.machine.shape();
        let expected = shape.layers() * shape.slots_per_rank();
        if slot_counts.len() != expected {
            return Err(ControllerError::Counts {
                expected,
                got: slot_counts.len(),
            });
        }
        if self.launch_due.is_some() {
            // The engine skipped before_forward: launch now, wait below.
            self.before_forward();
        }
        if let Some((rank_plan, launched, waited @ false)) = &mut self.in_flight {
            *waited = true;
            let local = launched
                .clone()
                .and_then(|()| self.transport.wait(rank_plan));
            if let Err(e) = &local {
                log::error!(
                    "eplb rank {}: layer {} exchange: {e}",
                    self.machine.rank(),
                    rank_plan.layer
                );
            }
            self.machine
                .handle_exchanged(rank_plan.layer as u16, local.is_ok());
        }
        self.poll_planner();
        self.machine.handle_forward(slot_counts, padded_tokens)?;
        self.drive()?;
        let ev = self.machine.take_events();
        Ok(Report {
            committed: ev.committed.map(usize::from),
            failed: ev.failed.map(usize::from),
            snapshot: ev.snapshot,
            plan_taken: ev.plan_taken,
            plan_late: ev.plan_late,
            cycle_done: ev.cycle_done,
            suspended: self.machine.health() != Health::Running,
        })
    }

    /// Hands the planner's answer to the machine once it is there.
    fn poll_planner(&mut self) {
        let Some(cycle) = self.waiting_for else {
            return;
        };
        let Some(outcome) = self.planner.try_result(cycle) else {
            return;
        };
        self.waiting_for = None;
        match outcome.as_ref() {
            Ok(plan) => match Placement::new(*self.machine.shape(), &plan.placement) {
                Ok(p) => {
                    self.machine.handle_plan(cycle, Some(p));
                    self.plan = Some(Arc::clone(&outcome));
                }
                Err(e) => {
                    log::error!("eplb: cycle {cycle}: the planner's placement: {e}");
                    self.machine.handle_plan(cycle, None);
                }
            },
            Err(_) => self.machine.handle_plan(cycle, None),
        }
    }

    /// All-gathers `words` (a digest or a vote, two words per rank) into `self.digests`,
    /// logging a failure as `what` failed: whether every rank's words arrived.
    fn gather_words(&mut self, words: &[u64], what: std::fmt::Arguments<'_>) -> bool {
        let r = self.transport.all_gather(words, &mut self.digests);
        if let Err(e) = &r {
            log::error!("eplb rank {}: {what} failed: {e}", self.machine.rank());
        }
        r.is_ok()
    }

    /// Executes the machine's actions until it has none.
    fn drive(&mut self) -> Result<(), ControllerError> {
        let rank = self.machine.rank();
        while let Some(action) = self.machine.poll() {
            match action {
                Action::GatherHeat { send } => {
                    self.gathered.clear();
                    self.gathered.resize(self.transport.ranks() * send.len(), 0);
                    let r = self.transport.all_gather(send, &mut self.gathered);
                    if let Err(e) = &r {
                        log::error!("eplb rank {rank}: heat gather failed: {e}");
                    }
                    self.machine.handle_gathered(r.is_ok());
                }
                Action::SubmitPlan { cycle, seed } => self.submit(cycle, seed)?,
                Action::AgreeFlag { flag, .. } => {
                    let r = self.transport.all_agree(flag);
                    if let Err(e) = &r {
                        log::error!("eplb rank {rank}: agreement failed: {e}");
                    }
                    self.machine.handle_agreed(r.ok());
                }
                Action::AgreeDigest { digest } => {
                    let ok = self.gather_words(&digest, format_args!("digest agreement"));
                    self.machine
                        .handle_digests(ok.then_some(self.digests.as_slice()));
                }
                Action::VoteLayer { layer, words } => {
                    let ok = self.gather_words(&words, format_args!("layer {layer} vote"));
                    self.machine
                        .handle_votes(ok.then_some(self.digests.as_slice()));
                }
                Action::AgreePlacement { digest } => {
                    let ok = self.gather_words(&digest, format_args!("placement check"));
                    self.machine
                        .handle_placements(ok.then_some(self.digests.as_slice()));
                }
                Action::Settle {
                    cycle,
                    taken,
                    resync,
                } => {
                    self.planner.settle(cycle, taken, resync);
                    if self.waiting_for == Some(cycle) {
                        self.waiting_for = None;
                    }
                    if taken {
                        self.log_plan();
                    }
                }
                Action::Record { .. } => {
                    let shape = *self.machine.shape();
                    if let Some(sink) = self.record.as_mut()
                        && let Err(e) = sink(&shape, self.machine.plan())
                    {
                        log::error!("eplb: recording the expert map failed: {e}");
                    }
                }
                Action::Launch { layer } => self.launch_due = Some(layer),
                Action::SendOnly { layer } => self.send_only(layer),
                Action::Commit { layer } => {
                    let committed = match self.in_flight.take() {
                        Some((rank_plan, _, _)) if rank_plan.layer == usize::from(layer) => {
                            match self.transport.commit(&rank_plan) {
                                Ok(()) => true,
                                Err(e) => {
                                    // Every rank agreed the bytes arrived; a local install
                                    // failure is a bug in the backend. Keep the map pointing at
                                    // what the slots hold.
                                    log::error!("eplb rank {rank}: layer {layer} commit: {e}");
                                    false
                                }
                            }
                        }
                        _ => false,
                    };
                    self.machine.handle_committed(layer, committed);
                    if committed {
                        self.refresh_maps(usize::from(layer))?;
                    }
                }
                Action::Abort { layer } => {
                    if let Some(f) = self.in_flight.take() {
                        if f.0.layer == usize::from(layer) {
                            self.transport.abort(&f.0);
                        } else {
                            self.in_flight = Some(f);
                        }
                    }
                    if self.launch_due == Some(layer) {
                        self.launch_due = None;
                    }
                }
            }
        }
        Ok(())
    }

    /// Folds the gathered heat and hands the request to the planner (moved, not copied).
    fn submit(&mut self, cycle: u64, seed: u64) -> Result<(), ControllerError> {
        let shape = *self.machine.shape();
        let (l, n) = (shape.layers(), shape.experts());
        let per_rank = self.gathered.len() / shape.ranks().max(1);
        let t = (per_rank / (l * shape.slots_per_rank()).max(1)).max(1);
        let mut loads = vec![0.0; l * n];
        let mut samples = vec![0.0; t * l * n];
        self.machine
            .fold_heat(&self.gathered, &mut loads, &mut samples)?;
        self.planner.submit(PlanRequest {
            cycle,
            current: self.machine.placement().to_vec(),
            loads,
            samples: Some((t, samples)),
            seed,
        });
        self.waiting_for = Some(cycle);
        Ok(())
    }

    fn log_plan(&self) {
        let Some(plan) = self.current_plan() else {
            return;
        };
        if self.machine.rank() != 0 || plan.cycle != self.machine.cycle_number() {
            return;
        }
        log::info!(
            "[Expert Hotness] current: mean={:.3} max={:.3}, updated: mean={:.3} max={:.3}",
            plan.summary.before.mean,
            plan.summary.before.max,
            plan.summary.after.mean,
            plan.summary.after.max
        );
        if plan.summary.colocated_rows > 0 {
            log::warn!(
                "eplb: the plan holds an expert twice on {} rank rows; applied as is",
                plan.summary.colocated_rows
            );
        }
    }
}
