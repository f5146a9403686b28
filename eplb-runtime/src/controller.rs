//! The per-rank controller: a thin driver of the core cycle around each forward.
//!
//! A serving engine calls [`Controller::before_forward`] before every forward (it launches the
//! due layer's transfer) and [`Controller::after_forward`] after it with the iteration's per-slot
//! token counts and padded token count (it adds the heat, takes the snapshot and wakes the
//! planner, agrees on plan readiness with every rank, waits for and commits the layer).
//!
//! Nothing here blocks on the planner: when a plan is due and some rank does not have it yet,
//! every rank tries again after the next iteration. A failed or timed-out exchange leaves the
//! layer on its old placement on every rank (the ranks agree on success before committing).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use eplb_core::{
    Cycle, HeatStage, HeatWindow, LayerPlacement, Placement, ReplicaChoice, Shape, StageClassifier,
    Step,
};

use crate::planner::{Plan, PlanRequest, Planner};
use crate::transfer::{RankPlan, plan_layer};
use crate::transport::{Transport, TransportError};

/// What the controller does with a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    /// Apply plans: move weights layer by layer.
    Dynamic,
    /// Plan but never move a weight; each plan is handed to the record sink.
    Record,
}

/// Receives each plan in record mode (rank 0 writes the expert-map JSON).
pub type RecordSink = Box<dyn FnMut(&Shape, &[u16]) -> Result<(), String> + Send>;

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
    /// Simulated time: when the plan is due, wait for it (up to this long) instead of retrying
    /// at the next iteration, and let rank 0 wait for the planner right after the snapshot so
    /// the policy runs alone. Only the simulator sets it.
    pub wait_for_plan: Option<Duration>,
}

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

/// Counters of one controller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControllerStats {
    /// Cycles whose plan was taken (applied, recorded, or unchanged).
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
}

/// The controller of one rank.
pub struct Controller<T: Transport> {
    shape: Shape,
    rank: usize,
    cfg: ControllerConfig,
    cycle: Cycle,
    transport: T,
    planner: Arc<Planner>,
    record: Option<RecordSink>,
    placement: Vec<u16>,
    expert_map: Vec<i32>,
    log2phy: Vec<u32>,
    heat: HeatWindow<Vec<u64>>,
    slot_shape: Shape,
    cycle_no: u64,
    plan: Option<Arc<Plan>>,
    changed: Vec<bool>,
    in_flight: Option<(RankPlan, Result<(), TransportError>)>,
    stats: ControllerStats,
}

impl<T: Transport> fmt::Debug for Controller<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("rank", &self.rank)
            .field("cycle", &self.cycle)
            .field("stats", &self.stats)
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
        let cycle = Cycle::new(cfg.heat_interval, cfg.algo_interval)?;
        // Local heat is kept per slot: a ring of [W][L][S] (a "shape" with S experts per layer).
        let s = shape.slots_per_rank() as u16;
        let slot_shape = Shape::new(shape.layers() as u16, s, 1, s)?;
        let (w, per) = eplb_core::heat::layout_for_interval(cfg.heat_interval)?;
        let heat = HeatWindow::new(
            &slot_shape,
            w,
            per,
            vec![0u64; eplb_core::heat::storage_len(&slot_shape, w)],
        )?;
        let rank = transport.rank();
        let mut c = Self {
            shape,
            rank,
            cfg,
            cycle,
            transport,
            planner,
            record: None,
            placement,
            expert_map: vec![0; shape.loads_len()],
            log2phy: vec![0; shape.loads_len()],
            heat,
            slot_shape,
            cycle_no: 0,
            plan: None,
            changed: vec![false; shape.layers()],
            in_flight: None,
            stats: ControllerStats::default(),
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
        self.rank
    }
    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// The live placement `[L][R][S]`.
    pub fn placement(&self) -> &[u16] {
        &self.placement
    }
    /// This rank's expert map of `layer` (`[N]`, slot or -1).
    pub fn expert_map(&self, layer: usize) -> &[i32] {
        let n = self.shape.experts();
        self.expert_map
            .get(layer * n..(layer + 1) * n)
            .unwrap_or(&[])
    }
    /// This rank's `log2phy` of `layer` (`[N]`).
    pub fn log2phy(&self, layer: usize) -> &[u32] {
        let n = self.shape.experts();
        self.log2phy.get(layer * n..(layer + 1) * n).unwrap_or(&[])
    }
    /// The transport endpoint.
    pub fn transport(&self) -> &T {
        &self.transport
    }
    /// Counters.
    pub fn stats(&self) -> ControllerStats {
        self.stats
    }
    /// The cycle state.
    pub fn cycle(&self) -> &Cycle {
        &self.cycle
    }
    /// Whether a layer update is under way (the simulator runs update iterations until not).
    pub fn is_updating(&self) -> bool {
        self.cycle.layer_in_flight().is_some()
    }
    /// The plan of the current cycle, once taken.
    pub fn current_plan(&self) -> Option<&Arc<Plan>> {
        self.plan.as_ref()
    }

    fn refresh_maps(&mut self, layer: usize) -> Result<(), ControllerError> {
        let per = self.shape.slots_per_layer();
        let n = self.shape.experts();
        let rows =
            self.placement
                .get(layer * per..(layer + 1) * per)
                .ok_or(eplb_core::Error::Index {
                    what: "layer",
                    index: layer,
                    bound: self.shape.layers(),
                })?;
        let lp = LayerPlacement::new(self.shape, layer, rows)?;
        if let Some(m) = self.expert_map.get_mut(layer * n..(layer + 1) * n) {
            lp.expert_map(self.rank, m)?;
        }
        if let Some(m) = self.log2phy.get_mut(layer * n..(layer + 1) * n) {
            lp.log2phy(self.rank, self.cfg.replica_choice, m)?;
        }
        Ok(())
    }

    /// Before a forward: launches the due layer's exchange, if any.
    pub fn before_forward(&mut self) {
        let Some(layer) = self.cycle.layer_in_flight() else {
            return;
        };
        if self.in_flight.is_some() {
            return;
        }
        let Some(plan) = self.plan.clone() else {
            return;
        };
        let per = self.shape.slots_per_layer();
        let range = layer as usize * per..(layer as usize + 1) * per;
        let (Some(old), Some(new)) = (self.placement.get(range.clone()), plan.placement.get(range))
        else {
            return;
        };
        let rank_plan = match plan_layer(&self.shape, layer as usize, old, new) {
            Ok(mut lp) if self.rank < lp.ranks.len() => lp.ranks.swap_remove(self.rank),
            Ok(_) => return,
            Err(e) => {
                log::error!("eplb rank {}: layer {layer}: {e}", self.rank);
                let empty = RankPlan {
                    layer: layer as usize,
                    sends: Vec::new(),
                    recvs: Vec::new(),
                    new_row: Vec::new(),
                    install: Vec::new(),
                };
                self.in_flight = Some((
                    empty,
                    Err(TransportError::Invalid {
                        what: e.to_string(),
                    }),
                ));
                return;
            }
        };
        let launched = self.transport.launch(&rank_plan);
        self.in_flight = Some((rank_plan, launched));
    }

    /// After a forward: `slot_counts` are this rank's tokens per slot (`[L][S]`),
    /// `padded_tokens` the batch's padded token count.
    pub fn after_forward(
        &mut self,
        slot_counts: &[u32],
        padded_tokens: u64,
    ) -> Result<Report, ControllerError> {
        let expected = self.shape.layers() * self.shape.slots_per_rank();
        if slot_counts.len() != expected {
            return Err(ControllerError::Counts {
                expected,
                got: slot_counts.len(),
            });
        }
        let mut report = Report::default();
        self.finish_layer(&mut report)?;
        let matched = self
            .cfg
            .stage
            .matches(self.cfg.classifier.classify(padded_tokens));
        let step = self.cycle.on_iteration(matched, &self.changed);
        self.handle(step, slot_counts, &mut report)?;
        Ok(report)
    }

    fn handle(
        &mut self,
        step: Step,
        slot_counts: &[u32],
        report: &mut Report,
    ) -> Result<(), ControllerError> {
        match step {
            Step::Collect { counted } => {
                if counted {
                    self.add_heat(slot_counts)?;
                }
            }
            Step::Snapshot => {
                self.add_heat(slot_counts)?;
                report.snapshot = true;
                self.snapshot();
            }
            Step::Wait | Step::UpdateLayer(_) => {}
            Step::PlanDue => self.plan_due(report)?,
            Step::CycleDone => self.end_cycle(report),
        }
        Ok(())
    }

    fn add_heat(&mut self, slot_counts: &[u32]) -> Result<(), ControllerError> {
        // The local ring holds [W][L][S] with the slot index as the "expert".
        self.heat.add_logical_u32(slot_counts)?;
        self.heat.end_iteration();
        Ok(())
    }

    fn snapshot(&mut self) {
        let (l, s, n, r) = (
            self.shape.layers(),
            self.shape.slots_per_rank(),
            self.shape.experts(),
            self.shape.ranks(),
        );
        let t = self.heat.windows().max(1);
        let mut local = vec![0u64; t * l * s];
        for (i, chunk) in local.chunks_exact_mut(l * s).enumerate() {
            for (layer, c) in chunk.chunks_exact_mut(s).enumerate() {
                if let Some(b) = self.heat.bucket(i, layer) {
                    c.copy_from_slice(b);
                }
            }
        }
        self.heat.reset();
        let mut all = vec![0u64; r * local.len()];
        if let Err(e) = self.transport.all_gather(&local, &mut all) {
            log::error!(
                "eplb rank {}: heat gather failed: {e}; cycle abandoned",
                self.rank
            );
            self.stats.collective_failures += 1;
            self.cycle.reset();
            return;
        }
        // Fold [R][T][L][S] slot heat into logical [T][L][N] through the live placement.
        let per = self.shape.slots_per_layer();
        let mut samples = vec![0.0f64; t * l * n];
        for (rank, part) in all.chunks_exact(local.len().max(1)).enumerate() {
            for (i, win) in part.chunks_exact(l * s).enumerate() {
                for (layer, row) in win.chunks_exact(s).enumerate() {
                    let base = layer * per + rank * s;
                    for (slot, &c) in row.iter().enumerate() {
                        if let Some(&e) = self.placement.get(base + slot)
                            && let Some(x) = samples.get_mut((i * l + layer) * n + usize::from(e))
                        {
                            *x += c as f64;
                        }
                    }
                }
            }
        }
        let mut loads = vec![0.0f64; l * n];
        for win in samples.chunks_exact(l * n) {
            for (a, b) in loads.iter_mut().zip(win) {
                *a += b;
            }
        }
        self.cycle_no += 1;
        self.planner.submit(PlanRequest {
            cycle: self.cycle_no,
            current: self.placement.clone(),
            loads,
            samples: Some((t, samples)),
            seed: self.cfg.seed.wrapping_add(self.cycle_no),
        });
        // Simulated time: rank 0 lets the planner run alone (the other ranks soon wait for
        // it), so its measured wall time is the policy's, not the simulator's.
        if let (Some(t), 0) = (self.cfg.wait_for_plan, self.rank) {
            let _ = self.planner.wait_result(self.cycle_no, t);
        }
    }

    fn agree(&mut self, flag: bool) -> Option<bool> {
        match self.transport.all_agree(flag) {
            Ok(v) => Some(v),
            Err(e) => {
                log::error!("eplb rank {}: agreement failed: {e}", self.rank);
                self.stats.collective_failures += 1;
                None
            }
        }
    }

    fn plan_due(&mut self, report: &mut Report) -> Result<(), ControllerError> {
        let outcome = match self.cfg.wait_for_plan {
            Some(t) => self.planner.wait_result(self.cycle_no, t),
            None => self.planner.try_result(self.cycle_no),
        };
        let Some(everywhere) = self.agree(outcome.is_some()) else {
            self.cycle.reset();
            return Ok(());
        };
        if !everywhere {
            self.stats.late_iterations += 1;
            report.plan_late = true;
            self.cycle.on_plan_late();
            return Ok(());
        }
        let plan = outcome.and_then(|o| o.as_ref().as_ref().ok().cloned());
        let Some(all_ok) = self.agree(plan.is_some()) else {
            self.cycle.reset();
            return Ok(());
        };
        self.stats.plans_taken += 1;
        self.changed.iter_mut().for_each(|c| *c = false);
        match plan {
            Some(plan) if all_ok => {
                if self.rank == 0 {
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
                match self.cfg.mode {
                    RunMode::Dynamic => self.changed.copy_from_slice(&plan.changed),
                    RunMode::Record => {
                        if let Some(sink) = self.record.as_mut()
                            && let Err(e) = sink(&self.shape, &plan.placement)
                        {
                            log::error!("eplb: recording the expert map failed: {e}");
                        }
                    }
                }
                self.plan = Some(Arc::new(plan));
            }
            _ => {
                self.stats.plan_failures += 1;
                self.plan = None;
            }
        }
        report.plan_taken = Some(self.changed.iter().filter(|&&c| c).count());
        let step = self.cycle.on_plan(&self.changed);
        if step == Step::CycleDone {
            self.end_cycle(report);
        }
        Ok(())
    }

    fn finish_layer(&mut self, report: &mut Report) -> Result<(), ControllerError> {
        let Some((rank_plan, launched)) = self.in_flight.take() else {
            return Ok(());
        };
        let layer = rank_plan.layer;
        let local = launched.and_then(|()| self.transport.wait(&rank_plan));
        if let Err(e) = &local {
            log::error!("eplb rank {}: layer {layer} exchange: {e}", self.rank);
        }
        let ok = self.agree(local.is_ok()).unwrap_or(false);
        if !ok {
            self.transport.abort(&rank_plan);
            self.stats.layers_failed += 1;
            report.failed = Some(layer);
            return Ok(());
        }
        if let Err(e) = self.transport.commit(&rank_plan) {
            // Every rank agreed the bytes arrived; a local install failure is a bug in the
            // backend. Keep the map pointing at what the slots hold.
            log::error!("eplb rank {}: layer {layer} commit: {e}", self.rank);
            self.stats.layers_failed += 1;
            report.failed = Some(layer);
            return Ok(());
        }
        let per = self.shape.slots_per_layer();
        if let Some(plan) = &self.plan
            && let (Some(dst), Some(src)) = (
                self.placement.get_mut(layer * per..(layer + 1) * per),
                plan.placement.get(layer * per..(layer + 1) * per),
            )
        {
            dst.copy_from_slice(src);
        }
        self.refresh_maps(layer)?;
        self.stats.layers_committed += 1;
        report.committed = Some(layer);
        Ok(())
    }

    fn end_cycle(&mut self, report: &mut Report) {
        report.cycle_done = true;
        self.heat.reset();
        self.changed.iter_mut().for_each(|c| *c = false);
    }

    /// The slot heat ring's shape (`[L]` layers of `S` slots), for diagnostics.
    pub fn slot_heat_shape(&self) -> &Shape {
        &self.slot_shape
    }
}
