//! A serving cluster in one process: `R` rank threads, each a
//! [`Controller`](eplb_runtime::controller::Controller) built from an `eplb_config` by
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
use eplb_runtime::config::EplbConfig;
use eplb_runtime::controller::{Controller, MachineStats};
use eplb_runtime::startup::{ModelInfo, StartError, attach_metrics, controller};
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
    /// Times the trace is fed (at least 1).
    pub passes: usize,
    /// Sleep after every forward (a serving pace for the metrics example).
    pub pace: Option<Duration>,
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

/// Runs `trace` through `spec.ranks` controllers built from `cfg` (dynamic mode; the env guard
/// is the caller's). With `registry`, every rank registers its metrics there under the label
/// `rank`. `model` gives the shape (its `layers`, `experts` and `ranks` must match the trace
/// and `spec`).
pub fn run_cluster(
    trace: &SimTrace,
    cfg: &EplbConfig,
    model: &ModelInfo,
    spec: &ClusterSpec,
    registry: Option<&mut Registry>,
) -> Result<ClusterRun, ClusterError> {
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
    let mut controllers: Vec<Controller<HostTransport>> = Vec::with_capacity(r);
    let (initial, shape) = eplb_runtime::startup::startup(cfg, model)
        .map(|(s, p)| (p, s))
        .map_err(ClusterError::Start)?;
    let per = shape.slots_per_layer();
    let s = shape.slots_per_rank();
    for rank in 0..r {
        let rows: Vec<Vec<u16>> = initial
            .chunks_exact(per)
            .map(|l| l.get(rank * s..(rank + 1) * s).unwrap_or(&[]).to_vec())
            .collect();
        let t = HostTransport::new(Arc::clone(&world), rank, &rows, spec.expert_bytes);
        controllers.push(controller(cfg, model, t).map_err(ClusterError::Start)?);
    }
    if let Some(reg) = registry {
        for c in controllers.iter_mut() {
            let sub = reg.sub_registry_with_label(("rank".into(), c.rank().to_string().into()));
            attach_metrics(c, cfg, sub, spec.expert_bytes as u64);
        }
    }
    let trace = Arc::new(trace.clone());
    let passes = spec.passes.max(1);
    let pace = spec.pace;
    let threads: Vec<_> = controllers
        .into_iter()
        .map(|mut c| {
            let trace = Arc::clone(&trace);
            std::thread::spawn(move || -> Result<(ClusterRun, MachineStats, Vec<u16>), String> {
                let (l, n, w) = (trace.layers, trace.experts, trace.windows);
                let rank = c.rank();
                let mut counts = vec![0u32; l * s];
                let mut run = ClusterRun::default();
                for it in 0..w * passes {
                    let win = it % w.max(1);
                    let window = trace.counts.get(win * l * n..(win + 1) * l * n).unwrap_or(&[]);
                    slot_counts(&shape, c.placement(), window, rank, &mut counts);
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
                    if let Some(p) = pace {
                        std::thread::sleep(p);
                    } else if ev.plan_late {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    run.iterations = it + 1;
                }
                let out = (run, c.stats(), c.placement().to_vec());
                // Dropping the controller joins rank 0's heat writer: the file is complete.
                drop(c);
                Ok(out)
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
