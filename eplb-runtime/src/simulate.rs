//! `eplb simulate`: replays a trace's windows through the real controllers, planner thread,
//! transfer planning and host transport, exactly as `SIMULATION.md` defines.
//!
//! One trace window is one controller iteration on every rank (`R` rank threads meet in a
//! [`HostWorld`]). The plan computed after window `s_k + H - 1` is due `A` windows later; time is
//! simulated, so the controllers wait for it (its wall time is measured), and all changed layers
//! are committed by update iterations between windows `a_k - 1` and `a_k` (`a_k = s_k + H + A`),
//! so every window `>= a_k` sees the whole new placement. A cycle whose `a_k >= T` is not run.
//! Per-slot token counts handed to the controllers follow the routing model (§4) in whole
//! tokens, so folding them back gives the trace's counts exactly.

use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use eplb_core::metrics::{self, Routing};
use eplb_core::{HeatStage, Layout, Placement, ReplicaChoice, Shape, StageClassifier};

use crate::controller::{Controller, ControllerConfig, RunMode};
use crate::planner::Planner;
use crate::policies::{Keep, policy_for};
use crate::transport::host::{HostTransport, HostWorld};
use eplb_policies::PolicyKind;

/// A trace in memory: `counts[w][l][e]`.
///
/// A window's count must fit the controllers' per-iteration `u32` counters: a count above
/// `u32::MAX` is refused by [`simulate`] (never truncated or saturated).
#[derive(Debug, Clone)]
pub struct SimTrace {
    /// Windows `T`.
    pub windows: usize,
    /// Layers `L`.
    pub layers: usize,
    /// Experts `N`.
    pub experts: usize,
    /// `[T][L][N]` token counts.
    pub counts: Vec<u64>,
}

/// Which policy the simulator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimPolicy {
    /// Never rebalance (the baseline).
    Static,
    /// A real policy.
    Policy(PolicyKind),
}

impl SimPolicy {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            SimPolicy::Static => "static",
            SimPolicy::Policy(k) => k.name(),
        }
    }
}

/// The initial placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initial {
    /// vLLM-Ascend HEAD's default layout.
    Default,
    /// The default layout with expert ids permuted per layer by a seeded permutation.
    Random(u64),
}

/// Simulation settings.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// EP ranks `R`.
    pub ranks: u16,
    /// Redundant experts `X`.
    pub redundant: u32,
    /// Ranks per node (DeepSeek's hierarchy); `R` when absent.
    pub ranks_per_node: Option<u16>,
    /// Expert groups (DeepSeek's hierarchy); 1 when absent.
    pub groups: Option<u16>,
    /// The policy.
    pub policy: SimPolicy,
    /// `H` (>= 1).
    pub heat_interval: u32,
    /// `A` (>= 1).
    pub algo_interval: u32,
    /// Initial placement.
    pub initial: Initial,
    /// Routing model of the reported metrics.
    pub routing: Routing,
    /// Seed of randomised policies.
    pub seed: u64,
    /// Bytes per expert moved by the host transport.
    pub expert_bytes: usize,
}

/// One entry of the `eplb-placements/v1` log.
#[derive(Debug, Clone, PartialEq)]
pub struct LogEntry {
    /// Cycle (0 = the initial placement).
    pub cycle: usize,
    /// First window this placement serves.
    pub active_from_window: usize,
    /// `[L][R][S]`.
    pub placement: Vec<u16>,
    /// `[s_k, s_k + H)` (absent for the initial placement).
    pub heat_windows: Option<(usize, usize)>,
    /// Wall time of the policy call.
    pub policy_time_s: Option<f64>,
}

/// The metrics of `SIMULATION.md` §5 plus extras.
#[derive(Debug, Clone, PartialEq)]
pub struct SimResult {
    /// The shape simulated.
    pub shape: Shape,
    /// Mean PAR over all (window, layer).
    pub mean_par: f64,
    /// p99 over windows of the layer-mean PAR.
    pub p99_par: f64,
    /// Max PAR over all (window, layer).
    pub max_par: f64,
    /// Mean PAR over windows `>= H + A`.
    pub mean_par_from_first_activation: f64,
    /// p99 over windows `>= H + A`.
    pub p99_par_from_first_activation: f64,
    /// Mean PAR under the other routing model (even split when routing is log2phy and back).
    pub other_routing_mean_par: f64,
    /// Mean lower-bound PAR over all (window, layer).
    pub lower_bound_mean_par: f64,
    /// Activations whose placement differs from the one before.
    pub changes: usize,
    /// Cycles run.
    pub cycles: usize,
    /// Weight fetches summed over changes.
    pub moves_total: usize,
    /// Slots whose content changed, summed over changes.
    pub slot_writes_total: usize,
    /// The most (layer, rank) rows holding an expert twice, over all placements used.
    pub same_rank_duplicate_rows_max: usize,
    /// Mean policy wall time per cycle (ms).
    pub policy_time_ms_mean: f64,
    /// Max policy wall time per cycle (ms).
    pub policy_time_ms_max: f64,
    /// Layers whose exchange failed.
    pub failed_layers: u64,
    /// Plans taken (cycles that reached their activation).
    pub plans: u64,
    /// Plans whose policy call failed (the placement stayed as it was for them).
    pub plan_failures: u64,
    /// The first policy failure, with its cycle.
    pub first_plan_failure: Option<String>,
    /// The placement log.
    pub log: Vec<LogEntry>,
    /// `PAR[w][l]` under the routing model, `[T][L]` (the numbers behind the PAR metrics).
    pub par: Vec<f64>,
    /// The lower-bound PAR of every window and layer, `[T][L]`.
    pub lower_bound: Vec<f64>,
}

impl SimResult {
    /// `moves_total / changes` (0 without changes).
    pub fn moves_per_change(&self) -> f64 {
        if self.changes == 0 {
            0.0
        } else {
            self.moves_total as f64 / self.changes as f64
        }
    }
}

/// numpy's `percentile(v, q)` with linear interpolation.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = q / 100.0 * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(v.len() - 1);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The initial placement `[L][R][S]`.
pub fn initial_placement(shape: &Shape, initial: Initial) -> Result<Vec<u16>, String> {
    let mut p = vec![0u16; shape.placement_len()];
    Layout::Default
        .fill(shape, &mut p)
        .map_err(|e| e.to_string())?;
    if let Initial::Random(seed) = initial {
        let mut st = seed;
        let n = shape.experts();
        for layer in p.chunks_exact_mut(shape.slots_per_layer()) {
            let mut perm: Vec<u16> = (0..n as u16).collect();
            for i in (1..n).rev() {
                let j = (splitmix(&mut st) % (i as u64 + 1)) as usize;
                perm.swap(i, j);
            }
            for x in layer.iter_mut() {
                *x = perm[usize::from(*x)];
            }
        }
    }
    Ok(p)
}

/// Per-slot whole-token counts `[L][R][S]` of one window under `routing`.
pub fn route_window(
    shape: &Shape,
    placement: &[u16],
    counts: &[u64],
    routing: Routing,
    out: &mut [u32],
) {
    let (n, r, s) = (shape.experts(), shape.ranks(), shape.slots_per_rank());
    let per = shape.slots_per_layer();
    out.fill(0);
    let mut holders: Vec<usize> = Vec::with_capacity(per);
    for (l, (layer, w)) in placement
        .chunks_exact(per)
        .zip(counts.chunks_exact(n))
        .enumerate()
    {
        for (e, &c) in w.iter().enumerate() {
            if c == 0 {
                continue;
            }
            holders.clear();
            match routing {
                Routing::Log2Phy => {
                    // The last slot of e on each distinct holder, ranks ascending.
                    for rank in 0..r {
                        let row = &layer[rank * s..(rank + 1) * s];
                        if let Some(slot) = row.iter().rposition(|&x| usize::from(x) == e) {
                            holders.push(rank * s + slot);
                        }
                    }
                    let d = holders.len();
                    let shares: Vec<(u64, u64)> = (0..d)
                        .map(|j| {
                            let m = ((r - 1 - j) / d + 1) as u64;
                            (c * m / r as u64, c * m % r as u64)
                        })
                        .collect();
                    apportion(c, &holders, &shares, l * per, out);
                }
                Routing::Even => {
                    holders.extend((0..per).filter(|&j| usize::from(layer[j]) == e));
                    let k = holders.len() as u64;
                    let shares: Vec<(u64, u64)> = holders.iter().map(|_| (c / k, c % k)).collect();
                    apportion(c, &holders, &shares, l * per, out);
                }
            }
        }
    }
}

/// Gives each holder its floor share, then the remaining tokens one each to the holders with the
/// largest remainders (lowest index first on ties).
fn apportion(c: u64, holders: &[usize], shares: &[(u64, u64)], base: usize, out: &mut [u32]) {
    let mut rest = c - shares.iter().map(|s| s.0).sum::<u64>();
    for (&h, &(q, _)) in holders.iter().zip(shares) {
        out[base + h] = out[base + h].saturating_add(q as u32);
    }
    if rest > 0 {
        let mut order: Vec<usize> = (0..holders.len()).collect();
        order.sort_by(|&a, &b| shares[b].1.cmp(&shares[a].1).then(a.cmp(&b)));
        for j in order {
            if rest == 0 {
                break;
            }
            out[base + holders[j]] = out[base + holders[j]].saturating_add(1);
            rest -= 1;
        }
    }
}

/// Runs the simulation. `progress` is called after every window with `(done, total)`.
pub fn simulate(
    trace: &SimTrace,
    cfg: &SimConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimResult, String> {
    let policy: Box<dyn eplb_policies::Policy + Send> = match cfg.policy {
        SimPolicy::Static => Box::new(Keep),
        SimPolicy::Policy(k) => policy_for(k)?,
    };
    simulate_with(trace, cfg, policy, progress)
}

/// [`simulate`] with a given policy object (for tuning and tests); `cfg.policy` only names it.
pub fn simulate_with(
    trace: &SimTrace,
    cfg: &SimConfig,
    policy: Box<dyn eplb_policies::Policy + Send>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimResult, String> {
    let (t_len, l, n) = (trace.windows, trace.layers, trace.experts);
    if trace.counts.len() != t_len * l * n {
        return Err(format!(
            "trace counts hold {} values, expected {t_len} x {l} x {n}",
            trace.counts.len()
        ));
    }
    if cfg.heat_interval == 0 || cfg.algo_interval == 0 {
        return Err("--heat-interval and --algo-interval must be at least 1".into());
    }
    let layers = u16::try_from(l).map_err(|_| format!("{l} layers is too many"))?;
    let experts = u16::try_from(n).map_err(|_| format!("{n} experts is too many"))?;
    let shape = Shape::from_redundant(layers, experts, cfg.ranks, cfg.redundant)
        .and_then(|s| {
            s.topology(
                cfg.ranks_per_node.unwrap_or(cfg.ranks),
                cfg.groups.unwrap_or(1),
            )
        })
        .map_err(|e| e.to_string())?;
    // Validate up front as `eplb plan` does: the shape's range, the policy's topology, its
    // buffer sizes.
    eplb_policies::buffer_lens(policy.as_ref(), &shape)
        .map_err(|e| format!("policy {}: {e}", cfg.policy.name()))?;
    // Counts reach the controllers as per-iteration u32 values: refuse what does not fit.
    if let Some(i) = trace.counts.iter().position(|&c| c > u64::from(u32::MAX)) {
        let (w, rest) = (i / (l * n), i % (l * n));
        return Err(format!(
            "trace window {w}, layer {}, expert {}: count {} does not fit a per-iteration u32 counter (at most {})",
            rest / n,
            rest % n,
            trace.counts.get(i).copied().unwrap_or(0),
            u32::MAX
        ));
    }
    let initial = initial_placement(&shape, cfg.initial)?;
    let r = shape.ranks();
    let (h, a) = (cfg.heat_interval as usize, cfg.algo_interval as usize);

    let planner = Arc::new(Planner::spawn(policy, shape));
    let world = HostWorld::new(r, Duration::from_secs(600));
    let ctrl_cfg = ControllerConfig {
        heat_interval: cfg.heat_interval,
        algo_interval: cfg.algo_interval,
        stage: HeatStage::All,
        classifier: StageClassifier::new(1, 0),
        mode: RunMode::Dynamic,
        seed: cfg.seed,
        replica_choice: ReplicaChoice::Plain,
        wait_for_plan: Some(Duration::from_secs(3600)),
    };

    let data = Arc::new(Mutex::new(WindowData {
        counts: vec![0; shape.placement_len()],
        stop: false,
        placement: initial.clone(),
        plan_time: None,
        failed: 0,
        plans: 0,
        plan_failures: 0,
        error: None,
    }));
    let start = Arc::new(Barrier::new(r + 1));
    let end = Arc::new(Barrier::new(r + 1));
    let mut threads = Vec::with_capacity(r);
    for rank in 0..r {
        let rows: Vec<Vec<u16>> = initial
            .chunks_exact(shape.slots_per_layer())
            .map(|layer| {
                layer[rank * shape.slots_per_rank()..(rank + 1) * shape.slots_per_rank()].to_vec()
            })
            .collect();
        let transport = HostTransport::new(Arc::clone(&world), rank, &rows, cfg.expert_bytes);
        let ctrl = Controller::new(
            shape,
            initial.clone(),
            ctrl_cfg.clone(),
            transport,
            Arc::clone(&planner),
        )
        .map_err(|e| e.to_string())?;
        let (data, start, end) = (Arc::clone(&data), Arc::clone(&start), Arc::clone(&end));
        let th = std::thread::Builder::new()
            .name(format!("eplb-sim-rank{rank}"))
            .spawn(move || rank_loop(ctrl, &data, &start, &end))
            .map_err(|e| format!("cannot start rank thread: {e}"))?;
        threads.push(th);
    }

    let mut live = initial.clone();
    let mut log = vec![LogEntry {
        cycle: 0,
        active_from_window: 0,
        placement: initial.clone(),
        heat_windows: None,
        policy_time_s: None,
    }];
    let mut driving = true;
    let mut cycle_start = 0usize;
    let mut par = vec![0.0f64; t_len * l];
    let mut other = vec![0.0f64; t_len * l];
    let mut lb = vec![0.0f64; t_len * l];
    let other_routing = match cfg.routing {
        Routing::Log2Phy => Routing::Even,
        Routing::Even => Routing::Log2Phy,
    };
    let mut scratch = vec![0u32; metrics::scratch_len(&shape)];
    let mut rank_buf = vec![0.0f64; r];
    let mut copies = vec![0u16; n];
    let mut loads = vec![0.0f64; n];
    let mut failure: Option<String> = None;
    for w in 0..t_len {
        let counts = &trace.counts[w * l * n..(w + 1) * l * n];
        // Score window w under the placement live during it.
        let p = Placement::new(shape, &live).map_err(|e| e.to_string())?;
        for (layer, lp) in p.layers().enumerate() {
            for (x, &c) in loads.iter_mut().zip(&counts[layer * n..(layer + 1) * n]) {
                *x = c as f64;
            }
            par[w * l + layer] =
                metrics::layer_par(&lp, &loads, cfg.routing, &mut scratch, &mut rank_buf)
                    .map_err(|e| e.to_string())?;
            other[w * l + layer] =
                metrics::layer_par(&lp, &loads, other_routing, &mut scratch, &mut rank_buf)
                    .map_err(|e| e.to_string())?;
            lb[w * l + layer] =
                metrics::lower_bound_par(&shape, &loads, &mut copies).map_err(|e| e.to_string())?;
        }
        // A cycle starting now would activate at w + H + A: run it only if that is inside.
        if driving && w == cycle_start && w + h + a >= t_len {
            driving = false;
        }
        if driving {
            {
                let mut d = data.lock().map_err(|_| "simulation state poisoned")?;
                route_window(&shape, &live, counts, cfg.routing, &mut d.counts);
                d.plan_time = None;
            }
            start.wait();
            end.wait();
            let mut d = data.lock().map_err(|_| "simulation state poisoned")?;
            if let Some(e) = d.error.take() {
                failure = Some(e);
                driving = false;
            }
            if let Some(secs) = d.plan_time.take() {
                // The plan taken after window w is live from window w + 1.
                log.push(LogEntry {
                    cycle: log.len(),
                    active_from_window: w + 1,
                    placement: d.placement.clone(),
                    heat_windows: Some((cycle_start, cycle_start + h)),
                    policy_time_s: Some(secs),
                });
                cycle_start = w + 1;
            }
            live.clone_from(&d.placement);
        }
        progress(w + 1, t_len);
    }
    {
        let mut d = data.lock().map_err(|_| "simulation state poisoned")?;
        d.stop = true;
    }
    start.wait();
    let (mut failed_layers, mut plans, mut plan_failures) = (0, 0, 0);
    for th in threads {
        th.join().map_err(|_| "a rank thread panicked")?;
    }
    if let Ok(d) = data.lock() {
        (failed_layers, plans, plan_failures) = (d.failed, d.plans, d.plan_failures);
    }
    let first_plan_failure = planner.first_failure();
    if let Some(e) = failure {
        return Err(e);
    }

    // Metrics.
    let layer_mean: Vec<f64> = par
        .chunks_exact(l)
        .map(|c| c.iter().sum::<f64>() / l as f64)
        .collect();
    let first = (h + a).min(t_len);
    let tail = &layer_mean[first..];
    let mean = |v: &[f64]| {
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let mut changes = 0;
    let mut moves_total = 0;
    let mut slot_writes_total = 0;
    let mut dup_max = 0;
    for pair in log.windows(2) {
        let (old, new) = (&pair[0].placement, &pair[1].placement);
        if old != new {
            changes += 1;
            moves_total += metrics::moves(old, new, shape.slots_per_rank());
            slot_writes_total += metrics::slot_writes(old, new);
        }
    }
    for e in &log {
        let p = Placement::new(shape, &e.placement).map_err(|e| e.to_string())?;
        dup_max = dup_max.max(p.colocated_rows());
    }
    let times: Vec<f64> = log.iter().filter_map(|e| e.policy_time_s).collect();
    Ok(SimResult {
        shape,
        mean_par: mean(&par),
        p99_par: percentile(&layer_mean, 99.0),
        max_par: par.iter().copied().fold(f64::MIN, f64::max),
        mean_par_from_first_activation: mean(tail),
        p99_par_from_first_activation: percentile(tail, 99.0),
        other_routing_mean_par: mean(&other),
        lower_bound_mean_par: mean(&lb),
        changes,
        cycles: log.len() - 1,
        moves_total,
        slot_writes_total,
        same_rank_duplicate_rows_max: dup_max,
        policy_time_ms_mean: if times.is_empty() {
            0.0
        } else {
            mean(&times) * 1e3
        },
        policy_time_ms_max: times.iter().copied().fold(0.0, f64::max) * 1e3,
        failed_layers,
        plans,
        plan_failures,
        first_plan_failure,
        log,
        par,
        lower_bound: lb,
    })
}

/// What the driver and the rank threads share.
struct WindowData {
    /// `[L][R][S]` routed counts of the current window.
    counts: Vec<u32>,
    stop: bool,
    /// Rank 0's live placement after the window (and its update iterations).
    placement: Vec<u16>,
    /// Set when a plan was taken after this window: the policy's wall time.
    plan_time: Option<f64>,
    failed: u64,
    /// Rank 0's plans taken and plan failures so far.
    plans: u64,
    plan_failures: u64,
    error: Option<String>,
}

fn rank_loop(
    mut ctrl: Controller<HostTransport>,
    data: &Mutex<WindowData>,
    start: &Barrier,
    end: &Barrier,
) {
    let shape = *ctrl.shape();
    let (l, s, rank) = (shape.layers(), shape.slots_per_rank(), ctrl.rank());
    let per = shape.slots_per_layer();
    let mut mine = vec![0u32; l * s];
    let zeros = vec![0u32; l * s];
    loop {
        start.wait();
        {
            let Ok(d) = data.lock() else { return };
            if d.stop {
                return;
            }
            for layer in 0..l {
                let base = layer * per + rank * s;
                mine[layer * s..(layer + 1) * s].copy_from_slice(&d.counts[base..base + s]);
            }
        }
        let mut plan_time = None;
        let mut error = None;
        ctrl.before_forward();
        match ctrl.after_forward(&mine, 0) {
            Ok(rep) => {
                if rep.plan_taken.is_some() {
                    plan_time = Some(ctrl.current_plan().map_or(0.0, |p| p.elapsed.as_secs_f64()));
                }
            }
            Err(e) => error = Some(e.to_string()),
        }
        // Update iterations between windows: the layer-by-layer update is part of the delay.
        while error.is_none() && ctrl.is_updating() {
            ctrl.before_forward();
            if let Err(e) = ctrl.after_forward(&zeros, 0) {
                error = Some(e.to_string());
            }
        }
        if rank == 0 {
            if let Ok(mut d) = data.lock() {
                d.placement.copy_from_slice(ctrl.placement());
                d.plan_time = plan_time;
                d.failed = ctrl.stats().layers_failed;
                d.plans = ctrl.stats().plans_taken;
                d.plan_failures = ctrl.stats().plan_failures;
                if error.is_some() {
                    d.error = error;
                }
            }
        } else if let Some(e) = error
            && let Ok(mut d) = data.lock()
        {
            d.error = Some(e);
        }
        end.wait();
    }
}
