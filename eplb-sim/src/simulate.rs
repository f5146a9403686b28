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

use eplb_core::live::{lost_experts, retire};
use eplb_core::metrics::{self, Routing};
use eplb_core::{
    EMPTY, HeatStage, LayerPlacement, Layout, LiveSet, Placement, Shape, StageClassifier,
};

use eplb_policies::PolicyKind;
use eplb_runtime::planner::{Plan, PolicyHost, policy_input};
use eplb_runtime::policies::policy_for;
use eplb_runtime::rank::{
    Action, LayerAction, LocalCollective, MachineConfig, PlanInput, PlannerAction, RankMachine,
    RunMode,
};
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

/// What a membership event does to its rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberKind {
    /// The rank stops (its machine is never driven again, its slots empty).
    Fail,
    /// A rank that failed comes back, with empty slots until a layer walk fills them.
    Join,
}

impl MemberKind {
    /// `fail` or `join` (the JSON's `kind`).
    pub fn name(self) -> &'static str {
        match self {
            MemberKind::Fail => "fail",
            MemberKind::Join => "join",
        }
    }

    /// The command-line flag that asks for it (`--fail-rank` or `--join-rank`).
    pub fn flag(self) -> &'static str {
        match self {
            MemberKind::Fail => "--fail-rank",
            MemberKind::Join => "--join-rank",
        }
    }
}

/// A membership event of a replay: `rank` fails or joins at `window`, before that window is
/// routed (`SIMULATION.md`, "Elastic membership").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberEvent {
    /// The window at whose start the event happens.
    pub window: usize,
    /// The rank.
    pub rank: u16,
    /// Fail or join.
    pub kind: MemberKind,
}

impl MemberEvent {
    /// Parses `R@W` (rank `R` at window `W`) for `kind`; an error names the flag and the value.
    pub fn parse(kind: MemberKind, text: &str) -> Result<Self, crate::SimError> {
        let bad = |why: &str| crate::SimError::Setting {
            what: format!("{} {text}", kind.flag()),
            why: why.to_owned(),
        };
        let (r, w) = text
            .split_once('@')
            .ok_or_else(|| bad("expected RANK@WINDOW, such as 5@40"))?;
        let rank = r
            .trim()
            .parse::<u16>()
            .map_err(|_| bad("the rank (before @) is not a whole number below 65536"))?;
        let window = w
            .trim()
            .parse::<usize>()
            .map_err(|_| bad("the window (after @) is not a whole number"))?;
        Ok(Self { window, rank, kind })
    }

    /// `--fail-rank 5@40`, the event as the command line names it.
    pub fn describe(&self) -> String {
        format!("{} {}@{}", self.kind.flag(), self.rank, self.window)
    }
}

/// Checks `events` against a run of `ranks` ranks, `windows` windows, `experts` experts and
/// `slots_per_rank` slots per rank: every rank below `R` and window below `T`, events in window
/// order, a failure only of a live rank, a join only of a failed one, and never fewer live ranks
/// than `ceil(N / S)` (the slots every expert needs). The error names the event.
pub fn validate_events(
    events: &[MemberEvent],
    ranks: usize,
    windows: usize,
    experts: usize,
    slots_per_rank: usize,
) -> Result<(), crate::SimError> {
    let mut live = vec![true; ranks];
    let need = experts.div_ceil(slots_per_rank.max(1));
    let mut last = 0;
    for e in events {
        let bad = |why: String| crate::SimError::Setting {
            what: e.describe(),
            why,
        };
        let r = usize::from(e.rank);
        if r >= ranks {
            return Err(bad(format!("rank {r} is not below the {ranks} ranks")));
        }
        if e.window >= windows {
            return Err(bad(format!(
                "window {} is not below the trace's {windows} windows",
                e.window
            )));
        }
        if e.window < last {
            return Err(bad(format!(
                "events must be in window order (an earlier one is at window {last})"
            )));
        }
        last = e.window;
        match e.kind {
            MemberKind::Fail if !live[r] => {
                return Err(bad(format!("rank {r} has already failed")));
            }
            MemberKind::Join if live[r] => {
                return Err(bad(format!(
                    "rank {r} is live; only a rank that failed can join"
                )));
            }
            _ => {}
        }
        live[r] = e.kind == MemberKind::Join;
        let count = live.iter().filter(|&&l| l).count();
        if count < need {
            return Err(bad(format!(
                "it leaves {count} live ranks, fewer than the {need} that {experts} experts need \
                 at {slots_per_rank} slots per rank"
            )));
        }
    }
    Ok(())
}

/// What one membership event did to the replay (`simulate --json`'s `membership_events`).
#[derive(Debug, Clone, PartialEq)]
pub struct MemberOutcome {
    /// The event.
    pub event: MemberEvent,
    /// Live ranks after it.
    pub live_ranks: usize,
    /// (layer, expert) pairs with no copy on a live rank right after it (summed over layers).
    pub lost_experts: usize,
    /// Tokens of experts with no live copy, from the event's window up to the next event.
    pub unserved_tokens: u64,
    /// Expert copies (layer, rank, expert) read from host memory because no live rank held
    /// them, in the layer walks from the event up to the next event.
    pub reload_copies: u64,
    /// The most reload copies of one rank (ranks reload in parallel, each over its own link).
    pub reload_copies_max_rank: u64,
    /// The mean over windows of the layer-mean PAR over the cycle (`H + A` windows) before the
    /// event, from the first activation on when the event comes after it: the baseline.
    pub par_before_event: f64,
    /// The layer-mean PAR of the event's window (over the live ranks).
    pub par_window_after: f64,
    /// The first window from the event on (before the next event) with no lost expert, no empty
    /// slot on a live rank, and a layer-mean PAR at most 5 % above `par_before_event`.
    pub recovered_at_window: Option<usize>,
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
    /// The pay-off gate, applied to every plan as the runtime applies it
    /// (`eplb_payoff_gate`); `None`: off.
    pub payoff_gate: Option<eplb_core::time::gate::Gate>,
    /// Membership events in window order ([`validate_events`]); empty: every rank serves
    /// throughout, and the run is exactly the strict one.
    pub events: Vec<MemberEvent>,
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
    /// What each membership event did (empty without events).
    pub membership: Vec<MemberOutcome>,
    /// Per window: tokens of experts with no copy on a live rank (`[T]`, zeros without events).
    pub unserved: Vec<u64>,
}

impl SimResult {
    /// Reload copies summed over the membership events.
    pub fn reload_copies_total(&self) -> u64 {
        self.membership.iter().map(|m| m.reload_copies).sum()
    }

    /// Unserved tokens summed over the windows.
    pub fn unserved_tokens_total(&self) -> u64 {
        self.unserved.iter().sum()
    }
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

/// Runs the simulation. `progress` is called after every window with `(done, total)`.
pub fn simulate(
    trace: &SimTrace,
    cfg: &SimConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimResult, String> {
    let policy: Box<dyn eplb_policies::Policy + Send> = match cfg.policy {
        SimPolicy::Static => policy_for(PolicyKind::Static),
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
    validate_events(&cfg.events, r, t_len, n, shape.slots_per_rank()).map_err(|e| e.to_string())?;
    let start = eplb_core::Placement::new(shape, &initial).map_err(|e| e.to_string())?;
    let mut machines = (0..r)
        .map(|rank| RankMachine::new(rank, start, mcfg))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    // One planner serves every rank: one rank (the feeder) folds the heat and feeds it, once per
    // cycle. That is rank 0, or with failures the lowest rank that never fails; when every rank
    // fails at some point, every rank folds and the first live one to ask feeds the planner.
    let anchor = (0..r).find(|&q| {
        !cfg.events
            .iter()
            .any(|e| e.kind == MemberKind::Fail && usize::from(e.rank) == q)
    });
    let feeders: Vec<bool> = (0..r).map(|q| anchor.is_none_or(|a| a == q)).collect();
    for m in machines.iter_mut() {
        if !feeders[m.rank()] {
            m.share_planner();
        }
    }
    let mut world = SimWorld::new(shape, &machines, policy, feeders.clone())?;
    world.host.set_gate(cfg.payoff_gate);

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
    // Elastic membership: the ranks still driven, the live set, and what each event did.
    let mut driven = vec![true; r];
    let mut live_set = LiveSet::all(r).map_err(|e| e.to_string())?;
    let mut next_event = 0usize;
    let mut outcomes: Vec<MemberOutcome> = Vec::new();
    let mut unserved = vec![0u64; t_len];
    let mut lost_w = vec![0usize; t_len];
    let mut empty_live_w = vec![false; t_len];
    let mut lost_buf = vec![false; n];
    let mut live_loads = Vec::with_capacity(r);
    for w in 0..t_len {
        let counts = &trace.counts[w * l * n..(w + 1) * l * n];
        // Membership events, before the window is routed.
        let mut members_changed = false;
        while let Some(ev) = cfg.events.get(next_event).filter(|e| e.window == w) {
            next_event += 1;
            let q = usize::from(ev.rank);
            let before = live_set;
            match ev.kind {
                MemberKind::Fail => {
                    live_set.remove(q).map_err(|e| e.to_string())?;
                    // It never enters a collective again.
                    driven[q] = false;
                    world.launched[q] = None;
                    world.asked[q] = false;
                }
                MemberKind::Join => {
                    live_set.insert(q).map_err(|e| e.to_string())?;
                    if driving {
                        // A fresh machine from the placement the survivors hold.
                        let lead = lead_rank(anchor, &driven, &machines);
                        let mut m = eplb_core::Placement::with_live(
                            shape,
                            machines[lead].placement(),
                            &before,
                        )
                        .map_err(|e| e.to_string())
                        .and_then(|p| RankMachine::new(q, p, mcfg).map_err(|e| e.to_string()))
                        .map_err(|e| format!("{}: {e}", ev.describe()))?;
                        if !feeders[q] {
                            m.share_planner();
                        }
                        machines[q] = m;
                        driven[q] = true;
                        world.launched[q] = None;
                        world.asked[q] = false;
                    }
                }
            }
            // Reloads so far belong to the event before.
            if let Some(prev) = outcomes.last_mut() {
                book_reloads(prev, &mut world.reloads);
            }
            world.reloads.fill(0);
            outcomes.push(MemberOutcome {
                event: *ev,
                live_ranks: live_set.count(),
                lost_experts: 0,
                unserved_tokens: 0,
                reload_copies: 0,
                reload_copies_max_rank: 0,
                par_before_event: f64::NAN,
                par_window_after: f64::NAN,
                recovered_at_window: None,
            });
            members_changed = true;
        }
        if members_changed {
            if driving {
                // Every live rank is told the new set at this iteration; the drive below runs
                // their agreement and reroute.
                world.net.set_live(&live_set);
                for (m, &d) in machines.iter_mut().zip(&driven) {
                    if d {
                        m.handle_membership(live_set).map_err(|e| {
                            format!("simulation: window {w}: rank {}: {e}", m.rank())
                        })?;
                    }
                }
                // The machines drop the cycle under way; the next one starts now.
                cycle_start = w;
            }
            // The routing-only step: no token goes to a rank that left.
            retire(&shape, &live_set, &mut live).map_err(|e| e.to_string())?;
            router.rebuild(&live);
        }
        // Score window w under the placement live during it.
        if live_set.is_all() && !live.contains(&EMPTY) {
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
        } else {
            // Over the live ranks only: an EMPTY slot holds nothing, a lost expert's tokens are
            // unserved, PAR is max / mean of the live ranks' loads.
            for layer in 0..l {
                let lc = &counts[layer * n..(layer + 1) * n];
                for (x, &c) in loads.iter_mut().zip(lc) {
                    *x = c as f64;
                }
                let rows = &live[layer * per..(layer + 1) * per];
                let lp = LayerPlacement::with_live(shape, layer, rows, &live_set)
                    .map_err(|e| format!("simulation: window {w}: {e}"))?;
                for (routing, out) in [(cfg.routing, &mut par), (other_routing, &mut other)] {
                    metrics::rank_loads(&lp, &loads, routing, &mut scratch, &mut rank_buf)
                        .map_err(|e| e.to_string())?;
                    live_loads.clear();
                    live_loads.extend(live_set.iter().map(|q| rank_buf[q]));
                    out[w * l + layer] = metrics::par(&live_loads);
                }
                lb[w * l + layer] = lower_bound_par(&shape, &loads, &mut copies, &mut heap)
                    .map_err(|e| e.to_string())?;
                lost_w[w] += lost_experts(&shape, rows, &live_set, &mut lost_buf)
                    .map_err(|e| e.to_string())?;
                unserved[w] += lost_buf
                    .iter()
                    .zip(lc)
                    .filter(|(lost, _)| **lost)
                    .map(|(_, &c)| c)
                    .sum::<u64>();
                empty_live_w[w] |= live_set
                    .iter()
                    .any(|q| rows[q * s..(q + 1) * s].contains(&EMPTY));
            }
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
        for (m, _) in machines.iter_mut().zip(&driven).filter(|(_, d)| **d) {
            let rank = m.rank();
            for layer in 0..l {
                let base = layer * per + rank * s;
                mine[layer * s..(layer + 1) * s].copy_from_slice(&routed[base..base + s]);
            }
            world.exchange_done(m);
            m.handle_forward(&mine, 0).map_err(|e| e.to_string())?;
        }
        world.drive(&mut machines, &driven)?;
        let lead = lead_rank(anchor, &driven, &machines);
        let taken = machines[lead].take_events().plan_taken.is_some();
        // Update iterations between windows: the layer-by-layer update is part of the delay.
        let mut updates = 0usize;
        while machines[lead].is_updating() {
            updates += 1;
            if updates > 2 * l + 2 {
                return Err(format!(
                    "simulation livelock: the layer update after window {w} did not end within {} \
                     iterations",
                    2 * l + 2
                ));
            }
            for (m, _) in machines.iter_mut().zip(&driven).filter(|(_, d)| **d) {
                world.exchange_done(m);
                m.handle_forward(&zeros, 0).map_err(|e| e.to_string())?;
            }
            world.drive(&mut machines, &driven)?;
        }
        for m in machines.iter_mut() {
            let _ = m.take_events();
        }
        if taken {
            // The plan taken after window w is live from window w + 1.
            log.push(LogEntry {
                cycle: log.len(),
                active_from_window: w + 1,
                placement: machines[lead].placement().to_vec(),
                heat_windows: Some((cycle_start, cycle_start + h)),
                policy_time_s: Some(world.plan_time),
            });
            cycle_start = w + 1;
        }
        if live != machines[lead].placement() {
            live.copy_from_slice(machines[lead].placement());
            router.rebuild(&live);
        }
        progress(w + 1, t_len);
    }
    if let Some(last) = outcomes.last_mut() {
        book_reloads(last, &mut world.reloads);
    }
    let stats = machines[lead_rank(anchor, &driven, &machines)].stats();
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
            moves_total += if new.contains(&EMPTY) {
                elastic_moves(old, new, shape.slots_per_rank())
            } else {
                metrics::moves(old, new, shape.slots_per_rank())
            };
            slot_writes_total += metrics::slot_writes(old, new);
        }
    }
    for e in &log {
        let rows = if e.placement.contains(&EMPTY) {
            elastic_colocated_rows(&e.placement, shape.slots_per_rank())
        } else {
            Placement::new(shape, &e.placement)
                .map_err(|e| e.to_string())?
                .colocated_rows()
        };
        dup_max = dup_max.max(rows);
    }
    // What each membership event did: lost experts at it, unserved tokens and recovery up to
    // the next event.
    let bounds: Vec<usize> = outcomes
        .iter()
        .skip(1)
        .map(|o| o.event.window)
        .chain(core::iter::once(t_len))
        .collect();
    for (o, &end) in outcomes.iter_mut().zip(&bounds) {
        let at = o.event.window;
        let lo = if at > first {
            at.saturating_sub(h + a).max(first)
        } else {
            at.saturating_sub(h + a)
        };
        o.par_before_event = mean(&layer_mean[lo..at]);
        o.par_window_after = layer_mean[at];
        o.lost_experts = lost_w[at];
        o.unserved_tokens = unserved[at..end].iter().sum();
        let limit = o.par_before_event * 1.05;
        o.recovered_at_window =
            (at..end).find(|&x| lost_w[x] == 0 && !empty_live_w[x] && layer_mean[x] <= limit);
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
        membership: outcomes,
        unserved,
    })
}

/// The rank whose machine speaks for the cluster (its placement, its events, its counters): the
/// feeder that never fails, or else the lowest rank driven and live.
fn lead_rank(anchor: Option<usize>, driven: &[bool], machines: &[RankMachine]) -> usize {
    anchor.unwrap_or_else(|| {
        (0..machines.len())
            .find(|&q| driven[q] && machines[q].live().contains(q))
            .or_else(|| driven.iter().position(|&d| d))
            .unwrap_or(0)
    })
}

/// Adds the reloads counted per rank since the event to its outcome.
fn book_reloads(o: &mut MemberOutcome, per_rank: &mut [u64]) {
    o.reload_copies += per_rank.iter().sum::<u64>();
    o.reload_copies_max_rank = o
        .reload_copies_max_rank
        .max(per_rank.iter().copied().max().unwrap_or(0));
    per_rank.fill(0);
}

/// [`metrics::moves`] over placements with [`EMPTY`] slots: an empty slot fetches nothing.
fn elastic_moves(old: &[u16], new: &[u16], s: usize) -> usize {
    old.chunks_exact(s.max(1))
        .zip(new.chunks_exact(s.max(1)))
        .map(|(o, nw)| {
            nw.iter()
                .enumerate()
                .filter(|&(i, e)| *e != EMPTY && !nw[..i].contains(e) && !o.contains(e))
                .count()
        })
        .sum()
}

/// Rows (layer, rank) holding some expert twice, [`EMPTY`] slots not counted.
fn elastic_colocated_rows(p: &[u16], s: usize) -> usize {
    p.chunks_exact(s.max(1))
        .filter(|row| {
            row.iter()
                .enumerate()
                .any(|(i, e)| *e != EMPTY && row[..i].contains(e))
        })
        .count()
}

/// The simulator's side of the rank machines: an in-memory collective, the policy called in
/// place (one planner shared by every rank, as ranks of one process may share one), and
/// transfers that always arrive.
struct SimWorld {
    shape: Shape,
    /// The first policy failure, with its cycle (for the report).
    first_failure: Option<String>,
    /// The policy, planned in place once per cycle for every rank and settled by the first
    /// rank's `Settle` (the host ignores the repeats).
    host: PolicyHost,
    /// The placement of the last plan (valid when `planned` says so).
    plan: Option<Plan>,
    /// The cycle planned last and whether its plan is valid.
    planned: Option<(u64, bool)>,
    /// Wall time of the last policy call (0 when it failed).
    plan_time: f64,
    /// Per rank: the layer launched and whether its exchange can succeed.
    launched: Vec<Option<(u16, bool)>>,
    /// `(cycle, layer, ok)` of the last layer whose transfers were planned.
    layer_ok: Option<(u64, u16, bool)>,
    net: LocalCollective,
    /// Per rank: it submitted a request this round.
    asked: Vec<bool>,
    /// Per rank: it folds the heat and may feed the shared planner.
    feeders: Vec<bool>,
    /// Per rank: expert copies planned to be read from host memory (no live rank held them)
    /// since the last membership event.
    reloads: Vec<u64>,
}

impl SimWorld {
    fn new(
        shape: Shape,
        machines: &[RankMachine],
        policy: Box<dyn eplb_policies::Policy + Send>,
        feeders: Vec<bool>,
    ) -> Result<Self, String> {
        let r = shape.ranks();
        // The shape's range, the policy's topology and its buffer sizes, before a window runs.
        eplb_policies::buffer_lens(policy.as_ref(), &shape).map_err(|e| e.to_string())?;
        Ok(Self {
            first_failure: None,
            shape,
            host: PolicyHost::new(policy, shape),
            plan: None,
            planned: None,
            plan_time: 0.0,
            launched: vec![None; r],
            layer_ok: None,
            net: LocalCollective::new(machines),
            asked: vec![false; r],
            feeders,
            reloads: vec![0; r],
        })
    }

    /// Reports the exchange a rank launched before this iteration.
    fn exchange_done(&mut self, m: &mut RankMachine) {
        if let Some((layer, ok)) = self.launched.get_mut(m.rank()).and_then(Option::take) {
            m.handle_exchanged(layer, ok);
        }
    }

    /// Runs every machine's actions until all are idle: local actions at once, collectives when
    /// every rank has entered the same one. A rank that never joins a collective its peers wait
    /// in, or more than [`LocalCollective::MAX_ROUNDS`] rounds, fails the run (a livelock).
    fn drive(&mut self, machines: &mut [RankMachine], driven: &[bool]) -> Result<(), String> {
        for _ in 0..LocalCollective::MAX_ROUNDS {
            for (m, _) in machines.iter_mut().zip(driven).filter(|(_, d)| **d) {
                self.run_local(m)?;
            }
            self.hand_plans(machines)?;
            if !self
                .net
                .answer(machines)
                .map_err(|e| format!("simulation {e}"))?
            {
                return Ok(());
            }
        }
        Err(format!(
            "simulation livelock: the ranks still exchange after {} collectives in one \
             iteration",
            LocalCollective::MAX_ROUNDS
        ))
    }

    /// Executes `m`'s local actions until it enters a collective or has none.
    fn run_local(&mut self, m: &mut RankMachine) -> Result<(), String> {
        let rank = m.rank();
        loop {
            match m.poll() {
                None => return Ok(()),
                Some(Action::Collective(c)) => {
                    return self
                        .net
                        .enter(rank, c)
                        .map_err(|e| format!("simulation: {e}"));
                }
                Some(Action::Planner(PlannerAction::Submit(input))) => {
                    self.plan_for(rank, &input)?
                }
                Some(Action::Planner(PlannerAction::Settle {
                    cycle,
                    taken,
                    resync,
                })) => self.host.settle(cycle, taken, resync),
                Some(Action::Layer(LayerAction::Launch { layer })) => {
                    let ok = self.layer_plannable(m, layer);
                    self.launched[rank] = Some((layer, ok));
                }
                Some(Action::Layer(LayerAction::Commit { layer })) => {
                    m.handle_committed(layer, true)
                }
                Some(Action::Members { live }) => self.net.set_live(live),
                Some(Action::Layer(LayerAction::Load { layer })) => m.handle_loaded(layer, true),
                Some(Action::Record { .. }) | Some(Action::Reroute) | Some(Action::Layer(_)) => {}
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
            Ok(plan) => {
                for load in &plan.loads {
                    if let Some(x) = self.reloads.get_mut(usize::from(load.rank)) {
                        *x += 1;
                    }
                }
                true
            }
            Err(e) => {
                log::error!("eplb simulate: layer {layer}: {e}");
                false
            }
        };
        self.layer_ok = Some((key.0, key.1, ok));
        ok
    }

    /// Runs the policy for the input's cycle once, on the first feeder's input (rank 0 without
    /// failures; the other ranks share its planner and submit empty inputs); the plan is handed
    /// to every rank that asked for it by [`SimWorld::hand_plans`].
    fn plan_for(&mut self, rank: usize, input: &PlanInput<'_>) -> Result<(), String> {
        if self.feeders.get(rank).copied().unwrap_or(false)
            && self.planned.map(|p| p.0) != Some(input.cycle)
        {
            let ok = self.compute(input)?;
            self.planned = Some((input.cycle, ok));
        }
        self.asked[rank] = true;
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
        let plan = self.plan.as_ref().filter(|_| ok);
        for (m, asked) in machines.iter_mut().zip(self.asked.iter_mut()) {
            if core::mem::take(asked) {
                m.handle_plan(cycle, plan);
            }
        }
        Ok(())
    }

    fn compute(&mut self, input: &PlanInput<'_>) -> Result<bool, String> {
        let cycle = input.cycle;
        let shape = self.shape;
        let samples = Some((input.windows, input.samples));
        let outcome = policy_input(
            &shape,
            input.current,
            input.live,
            input.loads,
            samples,
            input.seed,
        )
        .and_then(|i| self.host.plan(cycle, &i));
        match outcome {
            Ok(plan) => {
                self.plan_time = plan.elapsed().as_secs_f64();
                self.plan = Some(plan);
                Ok(true)
            }
            Err(e) => {
                log::error!("eplb simulate: cycle {cycle}: {e}");
                if self.first_failure.is_none() {
                    self.first_failure = Some(format!("cycle {cycle}: {e}"));
                }
                self.plan_time = 0.0;
                Ok(false)
            }
        }
    }
}

/// Routes a window's logical counts to whole-token per-slot counts `[L][R][S]` under the
/// routing model (`SIMULATION.md` §4), with the holders of every expert kept per placement:
/// rebuilt when the placement changes, so a window costs `O(L * N * copies)`.
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

    /// Per-slot whole-token counts `[L][R][S]` of one window, exactly as §4 defines them.
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
