//! `eplb simulate`: replays a trace's windows through `R` [rank machines](eplb_runtime::rank), the
//! policy and transfer planning on one thread, exactly as `SIMULATION.md` defines.
//!
//! One trace window is one forward iteration on every rank's machine. The simulator is the
//! machines' driver (`SimWorld`): it serves their collectives in memory, runs the policy in place
//! right after the snapshot (one planner for every rank; its wall time is measured), and lets a
//! layer's exchange succeed when its transfers can be planned. The plan taken `A` windows after
//! the snapshot is walked by update iterations between windows `a_k - 1` and `a_k`
//! (`a_k = s_k + H + A`), so every window `>= a_k` sees the whole new placement. A cycle whose
//! `a_k >= T` is not run. Per-slot token counts handed to the machines follow the routing model
//! (§4) in whole tokens, so folding them back gives the trace's counts exactly. The driver loop is
//! bounded: more than 16 collectives in one iteration, or a layer walk longer than `2L + 2`
//! iterations, fails the run as a livelock.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use eplb_core::metrics::{self, Routing};
use eplb_core::{HeatStage, Layout, Placement, Shape, StageClassifier};

use eplb_policies::PolicyKind;
use eplb_runtime::policies::{Keep, policy_for};
use eplb_runtime::rank::RunMode;
use eplb_runtime::rank::{Action, MachineConfig, RankMachine, Vote};
use eplb_runtime::transfer::plan_layer;

/// A trace in memory: `counts[w][l][e]`.
///
/// A window's count must fit the rank machines' per-iteration `u32` counters: a count above
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
    /// Bytes per expert of a moved weight. The one-thread simulator plans every transfer but
    /// moves no bytes, so it does not use this; kept so that configs and bindings stay valid.
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
    /// Plans taken (cycles that reached their activation, a failed plan included).
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
                            let m = metrics::log2phy_sources(r, d, j) as u64;
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
        SimPolicy::Policy(k) => policy_for(k),
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
    // Counts reach the rank machines as per-iteration u32 values: refuse what does not fit.
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

    let mcfg = MachineConfig {
        heat_interval: cfg.heat_interval,
        algo_interval: cfg.algo_interval,
        stage: HeatStage::All,
        classifier: StageClassifier::new(1, 0),
        mode: RunMode::Dynamic,
        seed: cfg.seed,
        max_collective_failures: 3,
        atomic_collectives: true,
    };
    let mut machines = (0..r)
        .map(|rank| RankMachine::new(shape, rank, &initial, mcfg))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut world = SimWorld::new(shape, cfg.heat_interval, policy)?;

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
    let mut heap = std::collections::BinaryHeap::with_capacity(n);
    let mut loads = vec![0.0f64; n];
    let mut router = Router::new(&shape, &live, cfg.routing);
    let mut routed = vec![0u32; shape.placement_len()];
    let (s, per) = (shape.slots_per_rank(), shape.slots_per_layer());
    let mut mine = vec![0u32; l * s];
    let zeros = vec![0u32; l * s];
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
            lb[w * l + layer] = lower_bound_par(&shape, &loads, &mut copies, &mut heap)
                .map_err(|e| e.to_string())?;
        }
        // A cycle starting now would activate at w + H + A: run it only if that is inside.
        if driving && w == cycle_start && w + h + a >= t_len {
            driving = false;
        }
        if !driving {
            progress(w + 1, t_len);
            continue;
        }
        router.route(counts, &mut routed);
        for m in machines.iter_mut() {
            let rank = m.rank();
            for layer in 0..l {
                let base = layer * per + rank * s;
                mine[layer * s..(layer + 1) * s].copy_from_slice(&routed[base..base + s]);
            }
            world.exchange_done(m);
            m.handle_forward(&mine, 0).map_err(|e| e.to_string())?;
        }
        world.drive(&mut machines)?;
        let taken = machines[0].take_events().plan_taken.is_some();
        // Update iterations between windows: the layer-by-layer update is part of the delay.
        let mut updates = 0usize;
        while machines[0].is_updating() {
            updates += 1;
            if updates > 2 * l + 2 {
                return Err(format!(
                    "simulation livelock: the layer update after window {w} did not end within {} \
                     iterations",
                    2 * l + 2
                ));
            }
            for m in machines.iter_mut() {
                world.exchange_done(m);
                m.handle_forward(&zeros, 0).map_err(|e| e.to_string())?;
            }
            world.drive(&mut machines)?;
        }
        for m in machines.iter_mut() {
            let _ = m.take_events();
        }
        if taken {
            // The plan taken after window w is live from window w + 1.
            log.push(LogEntry {
                cycle: log.len(),
                active_from_window: w + 1,
                placement: machines[0].placement().to_vec(),
                heat_windows: Some((cycle_start, cycle_start + h)),
                policy_time_s: Some(world.plan_time),
            });
            cycle_start = w + 1;
        }
        if live != machines[0].placement() {
            live.copy_from_slice(machines[0].placement());
            router.rebuild(&live);
        }
        progress(w + 1, t_len);
    }
    let stats = machines[0].stats();
    let (failed_layers, plans, plan_failures) =
        (stats.layers_failed, stats.plans_taken, stats.plan_failures);

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
        first_plan_failure: world.first_failure.take(),
        log,
        par,
        lower_bound: lb,
    })
}

/// What a rank posted to the collective of the current round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Posted {
    Gather,
    Flag(bool, Vote),
    Digest,
    Vote(u16),
    Placement,
}

/// Rounds of [`SimWorld::drive`] before it declares a livelock: one iteration needs at most a
/// layer vote, a heat gather, a readiness flag and a digest agreement.
const MAX_ROUNDS: usize = 16;

/// The simulator's side of the rank machines: an in-memory collective, the policy called in
/// place (one planner shared by every rank, as ranks of one process may share one), and
/// transfers that always arrive.
struct SimWorld {
    shape: Shape,
    /// The first policy failure, with its cycle (for the report).
    first_failure: Option<String>,
    policy: Box<dyn eplb_policies::Policy + Send>,
    scratch: Vec<u64>,
    /// The policy state after the last cycle every rank took.
    state: Vec<u64>,
    /// The state after the cycle being planned (kept iff every rank takes it).
    working: Vec<u64>,
    gathered: Vec<u64>,
    gather_len: usize,
    loads: Vec<f64>,
    samples: Vec<f64>,
    plan: Vec<u16>,
    changed: Vec<bool>,
    par_before: Vec<f64>,
    par_after: Vec<f64>,
    /// The cycle planned last and whether its plan is valid.
    planned: Option<(u64, bool)>,
    settled: u64,
    /// Wall time of the last policy call (0 when it failed).
    plan_time: f64,
    /// Per rank: the layer launched and whether its exchange can succeed.
    launched: Vec<Option<(u16, bool)>>,
    /// `(cycle, layer, ok)` of the last layer whose transfers were planned.
    layer_ok: Option<(u64, u16, bool)>,
    posted: Vec<Option<Posted>>,
    digests: Vec<u64>,
    /// Per rank: it submitted a request this round.
    asked: Vec<bool>,
}

impl SimWorld {
    fn new(
        shape: Shape,
        heat_interval: u32,
        policy: Box<dyn eplb_policies::Policy + Send>,
    ) -> Result<Self, String> {
        let (w, _) =
            eplb_core::heat::layout_for_interval(heat_interval).map_err(|e| e.to_string())?;
        let (l, r, s, n) = (
            shape.layers(),
            shape.ranks(),
            shape.slots_per_rank(),
            shape.experts(),
        );
        let lens =
            eplb_policies::buffer_lens(policy.as_ref(), &shape).map_err(|e| e.to_string())?;
        let scratch = vec![0u64; lens.scratch];
        let state = vec![0u64; lens.state];
        Ok(Self {
            first_failure: None,
            shape,
            scratch,
            working: state.clone(),
            state,
            policy,
            gathered: vec![0; r * w * l * s],
            gather_len: 0,
            loads: vec![0.0; l * n],
            samples: vec![0.0; w * l * n],
            plan: vec![0; shape.placement_len()],
            changed: vec![false; l],
            par_before: vec![0.0; l],
            par_after: vec![0.0; l],
            planned: None,
            settled: 0,
            plan_time: 0.0,
            launched: vec![None; r],
            layer_ok: None,
            posted: vec![None; r],
            digests: vec![0; 2 * r],
            asked: vec![false; r],
        })
    }

    /// Reports the exchange a rank launched before this iteration.
    fn exchange_done(&mut self, m: &mut RankMachine) {
        if let Some((layer, ok)) = self.launched.get_mut(m.rank()).and_then(Option::take) {
            m.handle_exchanged(layer, ok);
        }
    }

    /// Runs every machine's actions until all are idle: local actions at once, collectives when
    /// every rank has posted the same one. A rank that never joins a collective its peers wait
    /// in, or more than [`MAX_ROUNDS`] rounds, fails the run (a livelock).
    fn drive(&mut self, machines: &mut [RankMachine]) -> Result<(), String> {
        for _ in 0..MAX_ROUNDS {
            let mut any = false;
            for m in machines.iter_mut() {
                let p = self.run_local(m)?;
                any |= p.is_some();
                self.posted[m.rank()] = p;
            }
            self.hand_plans(machines)?;
            if !any {
                return Ok(());
            }
            let first = self.posted[0];
            if let Some(rank) = self.posted.iter().position(|p| *p != first) {
                return Err(format!(
                    "simulation livelock: rank 0 waits in {first:?}, rank {rank} in {:?}",
                    self.posted[rank]
                ));
            }
            match first {
                Some(Posted::Gather) => machines.iter_mut().for_each(|m| m.handle_gathered(true)),
                Some(Posted::Flag(..)) => {
                    // Every rank posted the same flag (checked above): the AND is that flag.
                    let all = matches!(first, Some(Posted::Flag(true, _)));
                    machines.iter_mut().for_each(|m| m.handle_agreed(Some(all)));
                }
                Some(Posted::Digest) => {
                    let d = &self.digests;
                    machines.iter_mut().for_each(|m| m.handle_digests(Some(d)));
                }
                Some(Posted::Vote(_)) => {
                    let d = &self.digests;
                    machines.iter_mut().for_each(|m| m.handle_votes(Some(d)));
                }
                Some(Posted::Placement) => {
                    let d = &self.digests;
                    machines
                        .iter_mut()
                        .for_each(|m| m.handle_placements(Some(d)));
                }
                None => return Ok(()),
            }
        }
        Err(format!(
            "simulation livelock: the ranks still exchange after {MAX_ROUNDS} collectives in one \
             iteration"
        ))
    }

    /// Executes `m`'s local actions; returns the collective it then waits in, if any.
    fn run_local(&mut self, m: &mut RankMachine) -> Result<Option<Posted>, String> {
        let rank = m.rank();
        loop {
            let action = m.poll();
            match action {
                None => return Ok(None),
                Some(Action::GatherHeat { send }) => {
                    if rank == 0 {
                        self.gather_len = send.len();
                    }
                    let len = self.gather_len;
                    let dst = self.gathered.get_mut(rank * len..(rank + 1) * len);
                    match dst {
                        Some(d) if send.len() == len => d.copy_from_slice(send),
                        _ => {
                            return Err(format!(
                                "rank {rank} gathers {} heat words, rank 0 {len}",
                                send.len()
                            ));
                        }
                    }
                    return Ok(Some(Posted::Gather));
                }
                Some(Action::AgreeFlag { flag, on }) => return Ok(Some(Posted::Flag(flag, on))),
                Some(Action::AgreeDigest { digest }) => {
                    self.digests[2 * rank..2 * rank + 2].copy_from_slice(&digest);
                    return Ok(Some(Posted::Digest));
                }
                Some(Action::VoteLayer { layer, words }) => {
                    self.digests[2 * rank..2 * rank + 2].copy_from_slice(&words);
                    return Ok(Some(Posted::Vote(layer)));
                }
                Some(Action::AgreePlacement { digest }) => {
                    self.digests[2 * rank..2 * rank + 2].copy_from_slice(&digest);
                    return Ok(Some(Posted::Placement));
                }
                Some(Action::SubmitPlan { cycle, seed }) => self.plan_for(m, cycle, seed)?,
                Some(Action::Settle {
                    cycle,
                    taken,
                    resync,
                }) => {
                    if cycle > self.settled {
                        self.settled = cycle;
                        if taken {
                            core::mem::swap(&mut self.state, &mut self.working);
                        } else if resync {
                            self.state.fill(0);
                        }
                    }
                }
                Some(Action::Record { .. }) | Some(Action::Abort { .. }) => {}
                Some(Action::Launch { layer }) => {
                    let ok = self.layer_plannable(m, layer);
                    self.launched[rank] = Some((layer, ok));
                }
                Some(Action::Commit { layer }) => m.handle_committed(layer, true),
                Some(Action::SendOnly { .. }) => {}
            }
        }
    }

    /// Whether the transfers of `layer` can be planned (once per cycle and layer).
    fn layer_plannable(&mut self, m: &RankMachine, layer: u16) -> bool {
        let key = (m.cycle_number(), layer);
        if let Some((c, l, ok)) = self.layer_ok
            && (c, l) == key
        {
            return ok;
        }
        let per = self.shape.slots_per_layer();
        let range = usize::from(layer) * per..(usize::from(layer) + 1) * per;
        let ok = match plan_layer(
            &self.shape,
            usize::from(layer),
            &m.placement()[range.clone()],
            &m.plan()[range],
        ) {
            Ok(_) => true,
            Err(e) => {
                log::error!("eplb simulate: layer {layer}: {e}");
                false
            }
        };
        self.layer_ok = Some((key.0, key.1, ok));
        ok
    }

    /// Runs the policy for `cycle` (once for all ranks); the plan is handed to every rank that
    /// asked for it by [`SimWorld::hand_plans`].
    fn plan_for(&mut self, m: &mut RankMachine, cycle: u64, seed: u64) -> Result<(), String> {
        if self.planned.map(|p| p.0) != Some(cycle) {
            let ok = self.compute(m, seed)?;
            self.planned = Some((cycle, ok));
        }
        self.asked[m.rank()] = true;
        Ok(())
    }

    /// Hands the plan (validated once) to the ranks that submitted a request this round.
    fn hand_plans(&mut self, machines: &mut [RankMachine]) -> Result<(), String> {
        let Some((cycle, ok)) = self.planned else {
            return Ok(());
        };
        if !self.asked.iter().any(|&a| a) {
            return Ok(());
        }
        let plan = if ok {
            Some(Placement::new(self.shape, &self.plan).map_err(|e| e.to_string())?)
        } else {
            None
        };
        for (m, asked) in machines.iter_mut().zip(self.asked.iter_mut()) {
            if core::mem::take(asked) {
                m.handle_plan(cycle, plan);
            }
        }
        Ok(())
    }

    fn compute(&mut self, m: &RankMachine, seed: u64) -> Result<bool, String> {
        let (l, s, n) = (
            self.shape.layers(),
            self.shape.slots_per_rank(),
            self.shape.experts(),
        );
        let t = (self.gather_len / (l * s)).max(1);
        let r = self.shape.ranks();
        let gathered = &self.gathered[..r * self.gather_len];
        let samples = &mut self.samples[..t * l * n];
        m.fold_heat(gathered, &mut self.loads, samples)
            .map_err(|e| e.to_string())?;
        self.working.copy_from_slice(&self.state);
        let shape = self.shape;
        let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<f64, String> {
            let current = Placement::new(shape, m.placement()).map_err(|e| e.to_string())?;
            let samples = eplb_policies::Samples::new(&shape, t, &self.samples[..t * l * n])
                .map_err(|e| e.to_string())?;
            let input = eplb_policies::Input::new(current, &self.loads, Some(samples), seed)
                .map_err(|e| e.to_string())?;
            let started = Instant::now();
            eplb_policies::rebalance(
                self.policy.as_mut(),
                &input,
                &mut self.scratch,
                &mut self.working,
                eplb_policies::Output {
                    placement: &mut self.plan,
                    changed: &mut self.changed,
                    par_before: &mut self.par_before,
                    par_after: &mut self.par_after,
                },
            )
            .map_err(|e| e.to_string())?;
            Ok(started.elapsed().as_secs_f64())
        }))
        .unwrap_or_else(|_| Err("policy panicked".into()));
        match outcome {
            Ok(secs) => {
                self.plan_time = secs;
                Ok(true)
            }
            Err(e) => {
                log::error!("eplb simulate: cycle {}: {e}", m.cycle_number());
                if self.first_failure.is_none() {
                    self.first_failure = Some(format!("cycle {}: {e}", m.cycle_number()));
                }
                self.plan_time = 0.0;
                Ok(false)
            }
        }
    }
}

/// [`route_window`] with the holders of every expert kept per placement: rebuilt when the
/// placement changes, so a window costs `O(L * N * copies)` instead of `O(L * N * R * S)`.
pub(crate) struct Router {
    routing: Routing,
    shape: Shape,
    /// `[L][N + 1]` offsets into `holders`.
    start: Vec<u32>,
    /// Global slot indices within the layer, per expert in the order the routing model uses.
    holders: Vec<u32>,
    seen: Vec<u32>,
    shares: Vec<(u64, u64)>,
    order: Vec<usize>,
}

impl Router {
    pub(crate) fn new(shape: &Shape, placement: &[u16], routing: Routing) -> Self {
        let mut r = Self {
            routing,
            shape: *shape,
            start: vec![0; shape.layers() * (shape.experts() + 1)],
            holders: Vec::with_capacity(shape.placement_len()),
            seen: vec![0; shape.experts()],
            shares: Vec::with_capacity(shape.ranks() * shape.slots_per_rank()),
            order: Vec::with_capacity(shape.ranks() * shape.slots_per_rank()),
        };
        r.rebuild(placement);
        r
    }

    pub(crate) fn rebuild(&mut self, placement: &[u16]) {
        let (n, ranks, s, per) = (
            self.shape.experts(),
            self.shape.ranks(),
            self.shape.slots_per_rank(),
            self.shape.slots_per_layer(),
        );
        self.holders.clear();
        for (l, layer) in placement.chunks_exact(per).enumerate() {
            let starts = &mut self.start[l * (n + 1)..(l + 1) * (n + 1)];
            // The slots each expert is routed to, in order.
            let mut pick = |f: &mut dyn FnMut(usize, usize)| match self.routing {
                Routing::Log2Phy => {
                    self.seen.fill(u32::MAX);
                    for rank in 0..ranks {
                        for slot in (0..s).rev() {
                            let j = rank * s + slot;
                            let e = usize::from(layer[j]);
                            if e < n && self.seen[e] != rank as u32 {
                                self.seen[e] = rank as u32;
                                f(e, j);
                            }
                        }
                    }
                }
                Routing::Even => {
                    for (j, &e) in layer.iter().enumerate() {
                        if usize::from(e) < n {
                            f(usize::from(e), j);
                        }
                    }
                }
            };
            let mut count = vec![0u32; n + 1];
            pick(&mut |e, _| count[e + 1] += 1);
            for e in 0..n {
                count[e + 1] += count[e];
            }
            let base = self.holders.len() as u32;
            for (o, c) in starts.iter_mut().zip(&count) {
                *o = base + c;
            }
            let total = count[n] as usize;
            let at = self.holders.len();
            self.holders.resize(at + total, 0);
            let mut fill = count.clone();
            let holders = &mut self.holders[at..];
            pick(&mut |e, j| {
                holders[fill[e] as usize] = j as u32;
                fill[e] += 1;
            });
        }
    }

    /// Per-slot whole-token counts `[L][R][S]` of one window, exactly as [`route_window`].
    pub(crate) fn route(&mut self, counts: &[u64], out: &mut [u32]) {
        let (n, r, per) = (
            self.shape.experts(),
            self.shape.ranks(),
            self.shape.slots_per_layer(),
        );
        out.fill(0);
        for (l, w) in counts.chunks_exact(n).enumerate() {
            let starts = &self.start[l * (n + 1)..(l + 1) * (n + 1)];
            for (e, &c) in w.iter().enumerate() {
                if c == 0 {
                    continue;
                }
                let hs = &self.holders[starts[e] as usize..starts[e + 1] as usize];
                let d = hs.len();
                self.shares.clear();
                match self.routing {
                    Routing::Log2Phy => self.shares.extend((0..d).map(|j| {
                        let m = metrics::log2phy_sources(r, d, j) as u64;
                        (c * m / r as u64, c * m % r as u64)
                    })),
                    Routing::Even => self
                        .shares
                        .extend((0..d).map(|_| (c / d as u64, c % d as u64))),
                }
                let base = l * per;
                let mut rest = c - self.shares.iter().map(|s| s.0).sum::<u64>();
                for (&h, &(q, _)) in hs.iter().zip(&self.shares) {
                    let o = &mut out[base + h as usize];
                    *o = o.saturating_add(q as u32);
                }
                if rest > 0 {
                    self.order.clear();
                    self.order.extend(0..d);
                    let shares = &self.shares;
                    self.order
                        .sort_by(|&a, &b| shares[b].1.cmp(&shares[a].1).then(a.cmp(&b)));
                    for &j in &self.order {
                        if rest == 0 {
                            break;
                        }
                        let o = &mut out[base + hs[j] as usize];
                        *o = o.saturating_add(1);
                        rest -= 1;
                    }
                }
            }
        }
    }
}

/// [`metrics::lower_bound_par`] with the D'Hondt seats handed out from a heap: the same value
/// bit for bit in `O((N + X) log N)` instead of `O(X N)` (the scoring of an EP384 window was
/// dominated by it). Equal: after `X` seats the largest remaining quotient `w_e / c_e` is the
/// same whichever of two equal quotients got a seat first, and each quotient is computed the same
/// way; a test compares both on random loads.
pub fn lower_bound_par(
    shape: &Shape,
    loads: &[f64],
    copies: &mut [u16],
    heap: &mut std::collections::BinaryHeap<(u64, std::cmp::Reverse<usize>)>,
) -> Result<f64, eplb_core::Error> {
    let r = shape.ranks();
    if loads.len() != shape.experts() || copies.len() != shape.experts() {
        // The core function reports the exact problem.
        return metrics::lower_bound_par(shape, loads, copies);
    }
    metrics::check_loads(0, loads)?;
    let total: f64 = loads.iter().sum();
    if total <= 0.0 {
        return Ok(1.0);
    }
    copies.fill(1);
    let cap = r.min(usize::from(u16::MAX)) as u16;
    heap.clear();
    if cap > 1 {
        // Non-negative finite f64s order like their bits.
        heap.extend(
            loads
                .iter()
                .enumerate()
                .map(|(e, &w)| (w.to_bits(), std::cmp::Reverse(e))),
        );
    }
    for _ in 0..shape.redundant() {
        let Some((_, std::cmp::Reverse(e))) = heap.pop() else {
            break;
        };
        let c = &mut copies[e];
        *c += 1;
        if *c < cap {
            heap.push(((loads[e] / f64::from(*c)).to_bits(), std::cmp::Reverse(e)));
        }
    }
    let m_star = loads
        .iter()
        .zip(copies.iter())
        .map(|(&w, &c)| w / f64::from(c.max(1)))
        .fold(0.0f64, f64::max);
    let avg = total / r as f64;
    Ok(avg.max(m_star) / avg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_lower_bound_equals_the_core_one_bit_for_bit() {
        let mut x: u64 = 7;
        let mut heap = std::collections::BinaryHeap::new();
        for (ranks, redundant, experts) in
            [(8u16, 8u32, 64u16), (64, 64, 256), (4, 12, 16), (2, 2, 2)]
        {
            let shape = Shape::from_redundant(3, experts, ranks, redundant).unwrap();
            let n = usize::from(experts);
            let mut a = vec![0u16; n];
            let mut b = vec![0u16; n];
            for round in 0..200 {
                let mut loads: Vec<f64> = (0..n)
                    .map(|_| {
                        let v = splitmix(&mut x);
                        // Many ties (small integers), some zeros, some large values.
                        match round % 3 {
                            0 => (v % 4) as f64,
                            1 => (v % 1000) as f64,
                            _ => (v % 1_000_000) as f64 * 0.37,
                        }
                    })
                    .collect();
                if round % 4 == 3 {
                    // One expert hotter than R copies can absorb: its copies hit the cap.
                    loads[0] = 1e9;
                }
                let want = metrics::lower_bound_par(&shape, &loads, &mut a).unwrap();
                let got = lower_bound_par(&shape, &loads, &mut b, &mut heap).unwrap();
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "R{ranks} X{redundant} round {round}"
                );
            }
        }
    }
}
