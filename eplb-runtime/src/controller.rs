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
//!
//! The machine's own types are re-exported here, not mirrored: the settings
//! ([`MachineConfig`], inside [`ControllerConfig`]), the counters ([`MachineStats`]), what a
//! forward led to ([`Events`]) and the one error of a bad call ([`MachineError`]).

use std::fmt;
use std::sync::Arc;

use eplb_core::{Cycle, LayerPlacement, LiveSet, Placement, ReplicaChoice, Shape};

use crate::planner::{Plan, PlanRequest, Planner};
use crate::rank::{Action, Collective, LayerAction, PlanInput, PlannerAction, RankMachine, Reply};
pub use crate::rank::{Events, Health, MachineConfig, MachineError, MachineStats, RunMode};
use crate::transfer::{RankPlan, plan_layer};
use crate::transport::{Op, Site, Transport, TransportError};

/// Receives each plan in record mode (rank 0 writes the expert-map JSON).
pub type RecordSink = Box<dyn FnMut(&Shape, &[u16]) -> std::io::Result<()> + Send>;

/// Settings of one controller: its machine's, and how `log2phy` picks among an expert's copies.
#[derive(Debug, Clone, Copy)]
pub struct ControllerConfig {
    /// The rank machine's settings; `atomic_collectives` is taken from the transport
    /// ([`Transport::atomic_collectives`]), whatever it says here.
    pub machine: MachineConfig,
    /// Replica choice for `log2phy`.
    pub replica_choice: ReplicaChoice,
}

/// Consecutive collective failures after which a controller built from a config suspends
/// balancing ([`MachineConfig::max_collective_failures`]).
pub const DEFAULT_MAX_COLLECTIVE_FAILURES: u32 = 3;

/// The layer exchange launched on this rank.
struct InFlight {
    /// This rank's part of the layer's transfers.
    plan: RankPlan,
    /// What the launch returned.
    launched: Result<(), TransportError>,
    /// Whether `Transport::wait` ran for it.
    waited: bool,
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
    /// Every rank's words of a gather (reserved in `new` for the largest, the heat).
    gathered: Vec<u64>,
    /// The cycle submitted to the planner and not yet answered.
    waiting_for: Option<u64>,
    /// The planner's answer that was handed to the machine last (shared, not copied).
    plan: Option<Arc<crate::planner::Outcome>>,
    launch_due: Option<u16>,
    in_flight: Option<InFlight>,
    /// Metrics updates on cycle events (issue 29).
    metrics: Option<crate::metrics::RankObserver>,
    /// Rank 0's heat recording (issue 29).
    heat_record: Option<crate::heat_record::HeatRecorder>,
    /// The engine's iteration times since the last recorded cycle: `(sum ms, count)`.
    iteration_ms: (f64, u64),
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
    /// The controller of `transport.rank()`, starting from `placement` (the same on every
    /// rank). With a live set ([`Placement::with_live`]) it is the controller of a rank of a
    /// deployment after membership changes (a rank that comes back, say): `placement` is the
    /// one the ranks of the set hold, with [`EMPTY`](eplb_core::EMPTY) slots on the ranks outside it. A rank
    /// outside the set serves nothing and takes part in no collective until every rank is told
    /// a set that holds it ([`Controller::set_membership`]); then it receives its weights from
    /// its peers layer by layer, and no token reaches a slot before its weights are there.
    pub fn new(
        placement: Placement<'_>,
        cfg: ControllerConfig,
        transport: T,
        planner: Arc<Planner>,
    ) -> Result<Self, MachineError> {
        let shape = *placement.shape();
        let colocated = placement.colocated_rows();
        if colocated > 0 {
            log::warn!(
                "eplb: the initial placement has {colocated} rank rows holding an expert twice; \
                 the second copy gets no tokens under log2phy routing"
            );
        }
        if transport.ranks() != shape.ranks() || transport.rank() >= shape.ranks() {
            return Err(MachineError::Endpoint {
                rank: transport.rank(),
                ranks: transport.ranks(),
                shape_ranks: shape.ranks(),
            });
        }
        let mcfg = MachineConfig {
            atomic_collectives: transport.atomic_collectives(),
            ..cfg.machine
        };
        let machine = RankMachine::new(transport.rank(), placement, mcfg)?;
        let gather_words = shape.ranks() * machine.max_gather_words();
        let mut c = Self {
            machine,
            replica_choice: cfg.replica_choice,
            transport,
            planner,
            record: None,
            expert_map: vec![0; shape.loads_len()],
            log2phy: vec![0; shape.loads_len()],
            gathered: Vec::with_capacity(gather_words),
            waiting_for: None,
            plan: None,
            launch_due: None,
            in_flight: None,
            metrics: None,
            heat_record: None,
            iteration_ms: (0.0, 0),
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

    /// Updates `metrics` on every cycle event from now on (`expert_bytes`: one expert copy).
    pub fn set_metrics(&mut self, metrics: crate::metrics::Metrics, expert_bytes: u64) {
        let (shape, placement) = (*self.machine.shape(), self.machine.placement());
        self.metrics = Some(crate::metrics::RankObserver::new(
            metrics,
            shape,
            placement,
            expert_bytes,
        ));
    }
    /// Appends each cycle's folded heat to `recorder` (set it on rank 0).
    pub fn set_heat_recorder(&mut self, recorder: crate::heat_record::HeatRecorder) {
        self.heat_record = Some(recorder);
    }

    /// The engine's measured time of the iteration (the whole step: TPOT in decode, one
    /// prefill iteration) that just ran, ms. With a heat recording on, each recorded window
    /// carries the mean of the times reported since the previous recorded cycle as its
    /// `iteration_ms` (`eplb calibrate --measured` takes such a recording). Optional: an
    /// engine that never calls it records windows without the field. A time that is not finite
    /// and `> 0` is ignored (with a debug log line); never fails the serving path.
    pub fn record_iteration_ms(&mut self, ms: f64) {
        if self.heat_record.is_none() {
            return;
        }
        if ms.is_finite() && ms > 0.0 {
            self.iteration_ms.0 += ms;
            self.iteration_ms.1 += 1;
        } else {
            log::debug!("eplb: iteration time {ms} ms ignored (not finite and > 0)");
        }
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
    /// Hands the transport endpoint back, dropping the controller (e.g. to build the controller
    /// of a rank that comes back over the endpoint it kept, [`Controller::new`] from a placement with its live set). An
    /// exchange in flight is aborted first: its receive buffers are forgotten, live slots stay.
    pub fn into_transport(mut self) -> T {
        if let Some(f) = self.in_flight.take() {
            self.transport.abort(&f.plan);
        }
        self.transport
    }
    /// The rank machine.
    pub fn machine(&self) -> &RankMachine {
        &self.machine
    }
    /// Counters.
    pub fn stats(&self) -> MachineStats {
        self.machine.stats()
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
    /// The engine changes the membership ([`RankMachine::handle_membership`]): call it on every
    /// rank of `live` at the same iteration, before its `after_forward`. The ranks agree on the
    /// set over the transport (which then runs its collectives over `live` only), reroute (no
    /// token to a rank outside it from then on) and plan over the live ranks from the next
    /// cycle.
    ///
    /// Calls compose ([`RankMachine::handle_membership`]): a set given while a change is still
    /// being agreed replaces the proposed one, and [`Controller::remove_ranks`] and
    /// [`Controller::add_ranks`] apply to it; a refused call changes nothing.
    pub fn set_membership(&mut self, live: LiveSet) -> Result<(), MachineError> {
        self.machine.handle_membership(live)?;
        self.membership_proposed();
        Ok(())
    }
    /// [`Controller::set_membership`] with `gone` removed from the set under agreement (the
    /// proposed one while a change is under way, else the live one).
    pub fn remove_ranks(&mut self, gone: &[usize]) -> Result<(), MachineError> {
        self.machine.remove_ranks(gone)?;
        self.membership_proposed();
        Ok(())
    }
    /// [`Controller::set_membership`] with `back` added to the set under agreement (the
    /// proposed one while a change is under way, else the live one).
    pub fn add_ranks(&mut self, back: &[usize]) -> Result<(), MachineError> {
        self.machine.add_ranks(back)?;
        self.membership_proposed();
        Ok(())
    }
    /// The machine took a membership change: the cycle is dropped, so an exchange in flight is
    /// aborted now, not waited for (its peer may be the rank that left).
    fn membership_proposed(&mut self) {
        self.waiting_for = None;
        self.launch_due = None;
        if let Some(f) = self.in_flight.take() {
            self.transport.abort(&f.plan);
        }
    }
    /// The ranks that serve.
    pub fn live(&self) -> &LiveSet {
        self.machine.live()
    }
    /// The cycle this rank asked the planner and whose answer it has not taken yet, if any.
    /// With [`Controller::planner`], a test or an offline replay can wait for the answer
    /// ([`Planner::wait_result`]) so that every plan is taken at the iteration it is due, as
    /// `eplb simulate` takes it; a serving engine never waits ([`Controller::after_forward`]
    /// does not).
    pub fn awaited_cycle(&self) -> Option<u64> {
        self.waiting_for
    }
    /// This rank's planner (its thread runs the policy).
    pub fn planner(&self) -> &Arc<Planner> {
        &self.planner
    }
    /// The plan of the current cycle, once taken.
    pub fn current_plan(&self) -> Option<&Plan> {
        self.plan.as_deref().and_then(|o| o.as_ref().ok())
    }

    fn refresh_maps(&mut self, layer: usize) -> Result<(), MachineError> {
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
        let lp = LayerPlacement::with_live(shape, layer, rows, self.machine.live())?;
        if let Some(m) = self.expert_map.get_mut(layer * n..(layer + 1) * n) {
            lp.expert_map(rank, m)?;
        }
        if let Some(m) = self.log2phy.get_mut(layer * n..(layer + 1) * n) {
            lp.log2phy(rank, self.replica_choice, m)?;
        }
        Ok(())
    }

    /// This rank's part of `layer`'s exchange from the live placement to the plan.
    fn rank_plan(&self, layer: u16) -> Result<RankPlan, TransportError> {
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
            return Err(TransportError::Invalid {
                at: Site::new(Op::Launch, rank).layer(l),
                detail: "the layer is not in the shape".into(),
            });
        };
        let mut lp = plan_layer(&shape, l, old, new).map_err(|e| TransportError::Invalid {
            at: Site::new(Op::Launch, rank).layer(l),
            detail: format!("the layer's transfers cannot be planned: {e}"),
        })?;
        if rank < lp.ranks.len() {
            Ok(lp.ranks.swap_remove(rank))
        } else {
            Err(TransportError::Invalid {
                at: Site::new(Op::Launch, rank).layer(l),
                detail: "no transfers planned for this rank".into(),
            })
        }
    }

    /// Before a forward: launches the due layer's exchange, if any.
    pub fn before_forward(&mut self) {
        let Some(layer) = self.launch_due.take() else {
            return;
        };
        let (plan, launched) = match self.rank_plan(layer) {
            Ok(plan) => {
                let launched = self.transport.launch(&plan);
                (plan, launched)
            }
            Err(e) => {
                log::error!("eplb rank {}: layer {layer}: {e}", self.machine.rank());
                let empty = RankPlan {
                    layer: usize::from(layer),
                    sends: Vec::new(),
                    recvs: Vec::new(),
                    loads: Vec::new(),
                    new_row: Vec::new(),
                    install: Vec::new(),
                };
                (empty, Err(e))
            }
        };
        self.in_flight = Some(InFlight {
            plan,
            launched,
            waited: false,
        });
    }

    /// After a forward: `slot_counts` are this rank's tokens per slot (`[L][S]`),
    /// `padded_tokens` the batch's padded token count. Returns what the forward led to.
    pub fn after_forward(
        &mut self,
        slot_counts: &[u32],
        padded_tokens: u64,
    ) -> Result<Events, MachineError> {
        let shape = *self.machine.shape();
        let expected = shape.layers() * shape.slots_per_rank();
        if slot_counts.len() != expected {
            // Checked before anything moves (the machine checks it again).
            return Err(MachineError::Len {
                what: "per-slot token counts [L][S]",
                expected,
                got: slot_counts.len(),
            });
        }
        if self.launch_due.is_some() {
            // The engine skipped before_forward: launch now, wait below.
            self.before_forward();
        }
        if let Some(f) = &mut self.in_flight
            && !f.waited
        {
            f.waited = true;
            let local = f
                .launched
                .clone()
                .and_then(|()| self.transport.wait(&f.plan));
            if let Err(e) = &local {
                log::error!(
                    "eplb rank {}: layer {} exchange: {e}",
                    self.machine.rank(),
                    f.plan.layer
                );
            }
            self.machine
                .handle_exchanged(f.plan.layer as u16, local.is_ok());
        }
        self.poll_planner();
        self.machine.handle_forward(slot_counts, padded_tokens)?;
        self.drive()?;
        if let Some(m) = self.metrics.as_mut() {
            let events = self.machine.take_events();
            let plan = self.plan.as_deref().and_then(|o| o.as_ref().ok());
            m.after_forward(&events, &self.machine, plan);
            return Ok(events);
        }
        Ok(self.machine.take_events())
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
        let plan = outcome.as_ref().as_ref().ok();
        self.machine.handle_plan(cycle, plan);
        if plan.is_some() {
            self.plan = Some(Arc::clone(&outcome));
        }
    }

    /// Executes the machine's actions until it has none.
    fn drive(&mut self) -> Result<(), MachineError> {
        let rank = self.machine.rank();
        loop {
            // The ranks the next collective runs over (a membership change alters it).
            let members = self.machine.collective_count();
            let Some(action) = self.machine.poll() else {
                break;
            };
            match action {
                Action::Members { live } => {
                    if let Err(e) = self.transport.set_live(live) {
                        log::error!(
                            "eplb rank {rank}: the transport cannot run over {live:?}: {e}; the \
                             membership agreement will fail"
                        );
                    }
                }
                Action::Reroute => {
                    for l in 0..self.machine.shape().layers() {
                        self.refresh_maps(l)?;
                    }
                }
                Action::Collective(c) => {
                    let reply =
                        collective(&mut self.transport, &mut self.gathered, rank, members, c);
                    self.machine.handle_collective(reply)?;
                }
                Action::Planner(PlannerAction::Submit(input)) => {
                    if let Some(rec) = self.heat_record.as_mut() {
                        let (sum, n) = core::mem::take(&mut self.iteration_ms);
                        let mean = (n > 0).then(|| sum / n as f64);
                        rec.record_timed(input.cycle, input.windows, input.samples, mean);
                    }
                    self.planner.submit(request(&input));
                    self.waiting_for = Some(input.cycle);
                }
                Action::Planner(PlannerAction::Settle {
                    cycle,
                    taken,
                    resync,
                }) => {
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
                Action::Layer(step) => self.layer(step)?,
            }
        }
        Ok(())
    }

    /// Executes one step of a layer's exchange.
    fn layer(&mut self, step: LayerAction) -> Result<(), MachineError> {
        let rank = self.machine.rank();
        match step {
            LayerAction::Launch { layer } => self.launch_due = Some(layer),
            LayerAction::Load { layer } => {
                let loaded = self
                    .rank_plan(layer)
                    .and_then(|plan| self.transport.load(&plan));
                if let Err(e) = &loaded {
                    log::error!("eplb rank {rank}: layer {layer} load: {e}");
                }
                self.machine.handle_loaded(layer, loaded.is_ok());
            }
            LayerAction::SendOnly { layer } => {
                // The kept exchange stays in flight: send this layer's part, receive nothing.
                let sent = self
                    .rank_plan(layer)
                    .and_then(|plan| self.transport.launch_sends(&plan));
                if let Err(e) = sent {
                    log::error!("eplb rank {rank}: layer {layer} sends: {e}");
                }
            }
            LayerAction::Commit { layer } => {
                let committed = match self.in_flight.take() {
                    Some(f) if f.plan.layer == usize::from(layer) => {
                        match self.transport.commit(&f.plan) {
                            Ok(()) => true,
                            Err(e) => {
                                // Every rank agreed the bytes arrived and the peers install
                                // them: keep the exchange (its received data) so that the
                                // machine can try the install again, and the map pointing at
                                // what the slots hold.
                                log::error!("eplb rank {rank}: layer {layer} commit: {e}");
                                self.in_flight = Some(f);
                                false
                            }
                        }
                    }
                    other => {
                        self.in_flight = other;
                        false
                    }
                };
                self.machine.handle_committed(layer, committed);
                if committed {
                    self.refresh_maps(usize::from(layer))?;
                }
            }
            LayerAction::Abort { layer } => {
                if let Some(f) = self.in_flight.take() {
                    if f.plan.layer == usize::from(layer) {
                        self.transport.abort(&f.plan);
                    } else {
                        self.in_flight = Some(f);
                    }
                }
                if self.launch_due == Some(layer) {
                    self.launch_due = None;
                }
            }
        }
        Ok(())
    }

    fn log_plan(&self) {
        let Some(plan) = self.current_plan() else {
            return;
        };
        if self.machine.rank() != 0 || plan.cycle() != self.machine.cycle_number() {
            return;
        }
        log::info!(
            "[Expert Hotness] current: mean={:.3} max={:.3}, updated: mean={:.3} max={:.3}",
            plan.summary().before.mean,
            plan.summary().before.max,
            plan.summary().after.mean,
            plan.summary().after.max
        );
        if plan.summary().colocated_rows > 0 {
            log::warn!(
                "eplb: the plan holds an expert twice on {} rank rows; applied as is",
                plan.summary().colocated_rows
            );
        }
    }
}

/// Runs one collective on `transport` (an all-gather into `gathered`); the machine's reply, or
/// `None` when it failed here.
fn collective<'g, T: Transport>(
    transport: &mut T,
    gathered: &'g mut Vec<u64>,
    rank: usize,
    members: usize,
    c: Collective<'_>,
) -> Option<Reply<'g>> {
    match c {
        Collective::AllAnd { flag } => match transport.all_agree(flag) {
            Ok(all) => Some(Reply::Flag(all)),
            Err(e) => {
                log::error!("eplb rank {rank}: agreement failed: {e}");
                None
            }
        },
        Collective::AllGather { of, send } => {
            gathered.clear();
            gathered.resize(members * send.len(), 0);
            match transport.all_gather(send, gathered) {
                Ok(()) => Some(Reply::Words(gathered)),
                Err(e) => {
                    log::error!("eplb rank {rank}: {of} failed: {e}");
                    None
                }
            }
        }
    }
}

/// The planner's request for `input` (copied: the planner thread owns it).
fn request(input: &PlanInput<'_>) -> PlanRequest {
    PlanRequest {
        cycle: input.cycle,
        current: input.current.to_vec(),
        live: *input.live,
        loads: input.loads.to_vec(),
        samples: Some((input.windows, input.samples.to_vec())),
        seed: input.seed,
    }
}
