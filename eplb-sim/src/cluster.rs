//! A serving cluster in one process: `R` rank threads, each a
//! [`Controller`] built from an `eplb_config` by
//! [`eplb_runtime::startup::controller`] (its own planner thread, rank 0's heat recording) over
//! the in-process host transport, fed a trace's windows as forwards. Unlike [`crate::simulate`]
//! (one thread, the machines driven directly), this is the runtime as an engine runs it:
//! threads, the planner off the serving thread, real weight exchanges, the metrics hooks.
//! `examples/serve_metrics.rs` and the heat-recording test use it.
//!
//! Window `w` of the trace is iteration `w` (the trace repeats `passes` times); each rank counts
//! a logical expert's tokens on the first copy of the expert in its layer's placement (rank-major),
//! so folding the ranks' slot counts gives the trace's counts exactly.

use std::sync::Arc;
use std::time::Duration;

use eplb_core::Shape;
use eplb_policies::Policy;
use eplb_runtime::config::EplbConfig;
use eplb_runtime::controller::{Controller, MachineStats};
use eplb_runtime::planner::Planner;
use eplb_runtime::startup::{ModelInfo, StartError, attach_metrics, controller};
use eplb_runtime::transport::Transport;
use eplb_runtime::transport::host::{HostTransport, HostWorld};
use prometheus_client::registry::Registry;

use crate::SimTrace;

/// What to run.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// EP ranks `R`.
    pub ranks: u16,
    /// Bytes of one expert's weights in the host transport.
    pub expert_bytes: usize,
    /// Bytes one expert copy weighs in the metrics (`eplb_moved_bytes_total`): the model's,
    /// while the host transport moves `expert_bytes` of stand-in weights.
    pub metrics_expert_bytes: u64,
    /// Times the trace is fed (at least 1).
    pub passes: usize,
    /// Sleep after every forward (a serving pace for the metrics example).
    pub pace: Option<Duration>,
    /// After this many forwards with balancing suspended, every rank resumes it (as an engine
    /// would once its collectives work again); `None`: never.
    pub resume_after: Option<usize>,
}

/// What rank 0 saw.
#[derive(Debug, Clone, Default)]
pub struct ClusterRun {
    /// Iterations run.
    pub iterations: usize,
    /// Iterations at which rank 0 took a plan (`Events::plan_taken`), with the changed layers.
    pub plans_taken: Vec<(usize, usize)>,
    /// Iterations at which rank 0's cycle ended (`Events::cycle_done`).
    pub cycles_done: Vec<usize>,
    /// Every rank's counters at the end.
    pub stats: Vec<MachineStats>,
    /// Every rank's final placement `[L][R][S]`.
    pub placements: Vec<Vec<u16>>,
}

/// Why a cluster run failed.
#[derive(Debug)]
pub enum ClusterError {
    /// A controller could not be built.
    Start(StartError),
    /// The trace does not fit the config's shape, or a rank failed.
    Run(String),
}

impl std::fmt::Display for ClusterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterError::Start(e) => write!(f, "start-up: {e}"),
            ClusterError::Run(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for ClusterError {}

/// A rank's slot counts `[L][S]` of `window` (`[L][N]`) under `placement` `[L][R][S]` of
/// `shape`: each expert's tokens on its first copy (rank-major).
pub fn slot_counts(shape: &Shape, placement: &[u16], window: &[u64], rank: usize, out: &mut [u32]) {
    let (layers, experts, slots) = (shape.layers(), shape.experts(), shape.slots_per_rank());
    let per = shape.slots_per_layer();
    let mut first = vec![usize::MAX; experts];
    for l in 0..layers {
        first.iter_mut().for_each(|f| *f = usize::MAX);
        let rows = placement.get(l * per..(l + 1) * per).unwrap_or(&[]);
        for (i, &e) in rows.iter().enumerate() {
            if let Some(f) = first.get_mut(usize::from(e))
                && *f == usize::MAX
            {
                *f = i;
            }
        }
        for s in 0..slots {
            let i = rank * slots + s;
            let e = rows.get(i).map(|&e| usize::from(e));
            let c = match e {
                Some(e) if first.get(e) == Some(&i) => {
                    window.get(l * experts + e).copied().unwrap_or(0)
                }
                _ => 0,
            };
            if let Some(o) = out.get_mut(l * slots + s) {
                *o = u32::try_from(c).unwrap_or(u32::MAX);
            }
        }
    }
}

/// `R` controllers built from one config, ready to run a trace.
pub struct Cluster<T: Transport> {
    trace: Arc<SimTrace>,
    shape: Shape,
    spec: ClusterSpec,
    world: Arc<HostWorld>,
    controllers: Vec<Controller<T>>,
    cfg: EplbConfig,
}

impl<T: Transport + 'static> Cluster<T> {
    /// Builds `spec.ranks` controllers from `cfg` (dynamic mode; the env guard is the
    /// caller's) over the host transport, each endpoint passed through `wrap` (the identity, or
    /// a transport that injects faults). `model` gives the shape: its `layers`, `experts` and
    /// `ranks` must match the trace and `spec`.
    pub fn build(
        trace: &SimTrace,
        cfg: &EplbConfig,
        model: &ModelInfo,
        spec: &ClusterSpec,
        wrap: impl Fn(HostTransport) -> T,
    ) -> Result<Self, ClusterError> {
        Self::build_with(trace, cfg, model, spec, wrap, &|_| None)
    }

    /// [`Cluster::build`] where `policy(rank)` may give a rank another policy object than the
    /// config's (a fault injector, for instance); the rest is as `startup::controller` does it.
    pub fn build_with(
        trace: &SimTrace,
        cfg: &EplbConfig,
        model: &ModelInfo,
        spec: &ClusterSpec,
        wrap: impl Fn(HostTransport) -> T,
        policy: &dyn Fn(usize) -> Option<Box<dyn Policy + Send>>,
    ) -> Result<Self, ClusterError> {
        let r = usize::from(spec.ranks);
        if usize::from(model.layers) != trace.layers
            || usize::from(model.experts) != trace.experts
            || model.ranks != spec.ranks
        {
            return Err(ClusterError::Run(format!(
                "the trace ({} layers x {} experts) does not fit the model ({} x {}, {} ranks)",
                trace.layers, trace.experts, model.layers, model.experts, model.ranks
            )));
        }
        let world = HostWorld::new(r, Duration::from_secs(5));
        let (shape, initial) =
            eplb_runtime::startup::startup(cfg, model).map_err(ClusterError::Start)?;
        let (per, s) = (shape.slots_per_layer(), shape.slots_per_rank());
        let mut controllers = Vec::with_capacity(r);
        for rank in 0..r {
            let rows: Vec<Vec<u16>> = initial
                .chunks_exact(per)
                .map(|l| l.get(rank * s..(rank + 1) * s).unwrap_or(&[]).to_vec())
                .collect();
            let t = HostTransport::new(Arc::clone(&world), rank, &rows, spec.expert_bytes);
            let c = match policy(rank) {
                None => controller(cfg, model, wrap(t)).map_err(ClusterError::Start)?,
                Some(p) => by_hand(cfg, model, shape, &initial, wrap(t), p)?,
            };
            controllers.push(c);
        }
        Ok(Self {
            trace: Arc::new(trace.clone()),
            shape,
            spec: spec.clone(),
            world,
            controllers,
            cfg: cfg.clone(),
        })
    }

    /// The host transport's meeting point (to inject transfer faults).
    pub fn world(&self) -> &Arc<HostWorld> {
        &self.world
    }

    /// Registers every rank's metrics in `registry` under the label `rank` (as `eplb_metrics`
    /// says; nothing when it turns them off).
    pub fn register_metrics(&mut self, registry: &mut Registry) {
        for c in self.controllers.iter_mut() {
            let sub =
                registry.sub_registry_with_label(("rank".into(), c.rank().to_string().into()));
            attach_metrics(c, &self.cfg, sub, self.spec.metrics_expert_bytes);
        }
    }

    /// Runs the trace on one thread per rank; returns what rank 0 saw and every rank's
    /// counters and placement.
    pub fn run(self) -> Result<ClusterRun, ClusterError> {
        let Self {
            trace,
            shape,
            spec,
            controllers,
            ..
        } = self;
        let passes = spec.passes.max(1);
        let threads: Vec<_> = controllers
            .into_iter()
            .map(|mut c| {
                let trace = Arc::clone(&trace);
                let spec = spec.clone();
                std::thread::spawn(move || {
                    let out = drive(&mut c, &shape, &trace, &spec, passes);
                    let out = out.map(|run| (run, c.stats(), c.placement().to_vec()));
                    // Dropping the controller joins rank 0's heat writer: the file is complete.
                    drop(c);
                    out
                })
            })
            .collect();
        let mut result = ClusterRun::default();
        for (rank, t) in threads.into_iter().enumerate() {
            let (run, stats, placement) = t
                .join()
                .map_err(|_| ClusterError::Run(format!("rank {rank} panicked")))?
                .map_err(ClusterError::Run)?;
            if rank == 0 {
                result = ClusterRun {
                    stats: Vec::new(),
                    placements: Vec::new(),
                    ..run
                };
            }
            result.stats.push(stats);
            result.placements.push(placement);
        }
        Ok(result)
    }
}

/// A rank's controller with policy object `p`, otherwise as [`controller`] builds it.
fn by_hand<T: Transport>(
    cfg: &EplbConfig,
    model: &ModelInfo,
    shape: Shape,
    initial: &[u16],
    t: T,
    p: Box<dyn Policy + Send>,
) -> Result<Controller<T>, ClusterError> {
    use eplb_runtime::startup::{controller_config, heat_recorder, payoff_gate};
    let ccfg = controller_config(cfg, model).map_err(ClusterError::Start)?;
    let gate = payoff_gate(cfg, model).map_err(ClusterError::Start)?;
    let planner = Arc::new(Planner::with_gate(p, shape, gate));
    let rank = t.rank();
    let start = eplb_core::Placement::new(shape, initial)
        .map_err(|e| ClusterError::Start(eplb_runtime::rank::MachineError::from(e).into()))?;
    let mut c =
        Controller::new(start, ccfg, t, planner).map_err(|e| ClusterError::Start(e.into()))?;
    if rank == 0
        && let Some(path) = cfg.observe().heat_record_path.as_deref()
    {
        heat_recorder(&mut c, cfg, path);
    }
    Ok(c)
}

/// One rank's serving loop.
fn drive<T: Transport>(
    c: &mut Controller<T>,
    shape: &Shape,
    trace: &SimTrace,
    spec: &ClusterSpec,
    passes: usize,
) -> Result<ClusterRun, String> {
    let (l, n, w) = (trace.layers, trace.experts, trace.windows);
    let rank = c.rank();
    let mut counts = vec![0u32; l * shape.slots_per_rank()];
    let mut run = ClusterRun::default();
    let mut suspended_for = 0usize;
    for it in 0..w * passes {
        let win = it % w.max(1);
        let window = trace
            .counts
            .get(win * l * n..(win + 1) * l * n)
            .unwrap_or(&[]);
        slot_counts(shape, c.placement(), window, rank, &mut counts);
        c.before_forward();
        let tokens = counts.iter().map(|&x| u64::from(x)).sum::<u64>();
        let ev = c
            .after_forward(&counts, tokens)
            .map_err(|e| format!("rank {rank}, iteration {it}: {e}"))?;
        if let Some(k) = ev.plan_taken {
            run.plans_taken.push((it, k));
        }
        if ev.cycle_done {
            run.cycles_done.push(it);
        }
        if ev.suspended {
            suspended_for += 1;
            if spec.resume_after.is_some_and(|k| suspended_for >= k) {
                c.resume();
                suspended_for = 0;
            }
        }
        if let Some(p) = spec.pace {
            std::thread::sleep(p);
        } else if ev.plan_late {
            std::thread::sleep(Duration::from_millis(1));
        }
        run.iterations = it + 1;
    }
    Ok(run)
}

/// Runs `trace` through `spec.ranks` controllers built from `cfg` over the host transport
/// ([`Cluster::build`], [`Cluster::run`]); with `registry`, every rank registers its metrics
/// there under the label `rank`.
pub fn run_cluster(
    trace: &SimTrace,
    cfg: &EplbConfig,
    model: &ModelInfo,
    spec: &ClusterSpec,
    registry: Option<&mut Registry>,
) -> Result<ClusterRun, ClusterError> {
    let mut cluster = Cluster::build(trace, cfg, model, spec, |t| t)?;
    if let Some(reg) = registry {
        cluster.register_metrics(reg);
    }
    cluster.run()
}
