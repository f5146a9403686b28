//! `eplb simulate`: replays a trace's windows through `R` [rank machines](eplb_runtime::rank), the
//! policy and transfer planning on one thread, exactly as `SIMULATION.md` defines.
//!
//! One trace window is one forward iteration on every rank's machine. The simulator drives the
//! machines with [`LocalWorld`] (a run is one `SimRun`: apply the window's membership events,
//! score it, drive the ranks, finish): it serves their collectives in memory, runs the policy in place
//! right after the snapshot (one planner for every rank; its wall time is measured), and lets a
//! layer's exchange succeed when its transfers can be planned. The plan taken `A` windows after
//! the snapshot is walked by update iterations between windows `a_k - 1` and `a_k`
//! (`a_k = s_k + H + A`), so every window `>= a_k` sees the whole new placement. A cycle whose
//! `a_k >= T` is not run. Per-slot token counts handed to the machines follow the routing model
//! (§4) in whole tokens, so folding them back gives the trace's counts exactly. The driver loop is
//! bounded: more than 16 collectives in one iteration, or a layer walk longer than `2L + 2`
//! iterations, fails the run as a livelock.

use eplb_core::live::{count_lost, lost_experts, retire};
use eplb_core::metrics::{self, Routing};
use eplb_core::{
    EMPTY, HeatStage, LayerPlacement, Layout, LiveSet, Placement, Shape, StageClassifier,
};

use eplb_policies::PolicyKind;
use eplb_runtime::planner::{Plan, PolicyHost, policy_input};
use eplb_runtime::policies::policy_for;
use eplb_runtime::rank::{
    LocalHooks, LocalWorld, MachineConfig, PlanAnswer, PlanInput, RankMachine, RunMode,
};
use eplb_runtime::transfer::plan_loads;

use crate::SimError;
pub use crate::events::{MemberEvent, MemberKind};

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

/// Checks `events` against a run of `ranks` ranks, `windows` windows, `experts` experts and
/// `slots_per_rank` slots per rank: every rank below `R` and window below `T`, events in window
/// order, a failure only of a live rank, a join only of a failed one, and never fewer live ranks
/// than `ceil(N / S)` (the slots every expert needs). The error names the event
/// ([`SimError::Event`]).
pub fn validate_events(
    events: &[MemberEvent],
    ranks: usize,
    windows: usize,
    experts: usize,
    slots_per_rank: usize,
) -> Result<(), SimError> {
    let mut live = vec![true; ranks];
    let need = experts.div_ceil(slots_per_rank.max(1));
    let mut last = 0;
    // The ranks with an event at window `last`.
    let mut seen_at_window: Vec<u16> = Vec::new();
    for e in events {
        let bad = |why: String| SimError::Event { event: *e, why };
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
        if e.window == last && seen_at_window.contains(&e.rank) {
            return Err(bad(format!(
                "rank {r} already has an event at window {}: a restart fails at one window and \
                 joins at a later one",
                e.window
            )));
        }
        if e.window != last {
            seen_at_window.clear();
        }
        seen_at_window.push(e.rank);
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
pub fn initial_placement(shape: &Shape, initial: Initial) -> Result<Vec<u16>, SimError> {
    let mut p = vec![0u16; shape.placement_len()];
    Layout::Default
        .fill(shape, &mut p)
        .map_err(SimError::Shape)?;
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
) -> Result<SimResult, SimError> {
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
) -> Result<SimResult, SimError> {
    let mut run = SimRun::new(trace, cfg, policy)?;
    for w in 0..trace.windows {
        run.window(w)?;
        progress(w + 1, trace.windows);
    }
    run.finish()
}

/// The shape a trace and settings form, checked as `eplb plan` checks it (the shape's range,
/// the policy's topology, its buffer sizes) before a window runs; also every count must fit a
/// rank machine's per-iteration `u32` counter.
fn run_shape(
    trace: &SimTrace,
    cfg: &SimConfig,
    policy: &dyn eplb_policies::Policy,
) -> Result<Shape, SimError> {
    let (t_len, l, n) = (trace.windows, trace.layers, trace.experts);
    if trace.counts.len() != t_len * l * n {
        return Err(SimError::Counts {
            values: trace.counts.len(),
            windows: t_len,
            layers: l,
            experts: n,
        });
    }
    if cfg.heat_interval == 0 || cfg.algo_interval == 0 {
        return Err(SimError::Intervals {
            heat: cfg.heat_interval,
            algo: cfg.algo_interval,
        });
    }
    let too_many = |what, count| SimError::TooMany { what, count };
    let layers = u16::try_from(l).map_err(|_| too_many("layers", l))?;
    let experts = u16::try_from(n).map_err(|_| too_many("experts", n))?;
    let shape = Shape::from_redundant(layers, experts, cfg.ranks, cfg.redundant)
        .and_then(|s| {
            s.topology(
                cfg.ranks_per_node.unwrap_or(cfg.ranks),
                cfg.groups.unwrap_or(1),
            )
        })
        .map_err(SimError::Shape)?;
    eplb_policies::buffer_lens(policy, &shape).map_err(|error| SimError::Policy {
        policy: cfg.policy.name(),
        error,
    })?;
    if let Some(i) = trace.counts.iter().position(|&c| c > u64::from(u32::MAX)) {
        let (w, rest) = (i / (l * n), i % (l * n));
        return Err(SimError::Counter {
            window: w,
            layer: rest / n,
            expert: rest % n,
            count: trace.counts.get(i).copied().unwrap_or(0),
        });
    }
    Ok(shape)
}

/// A rank machine on `placement` with the ranks of `live` serving (the one place the
/// simulator builds one).
fn new_machine(
    shape: Shape,
    rank: usize,
    placement: &[u16],
    live: LiveSet,
    mcfg: MachineConfig,
) -> Result<RankMachine, eplb_runtime::rank::MachineError> {
    let placement = Placement::with_live(shape, placement, &live)?;
    RankMachine::new(rank, placement, mcfg)
}

/// One replay in progress (`SIMULATION.md`): the rank machines and their one-thread driver,
/// the placement the tokens are routed on, the log, the scores and the membership events'
/// outcomes. A window is three phases ([`SimRun::window`]): apply its membership events, score
/// it under the placement live during it, and drive the ranks through it; [`SimRun::finish`]
/// turns the run into its [`SimResult`].
struct SimRun<'a> {
    trace: &'a SimTrace,
    cfg: &'a SimConfig,
    shape: Shape,
    mcfg: MachineConfig,
    machines: Vec<RankMachine>,
    world: LocalWorld,
    planner: SimPlanner,
    /// The feeder that never fails, if any ([`lead_rank`]).
    anchor: Option<usize>,
    /// Per rank: it folds the heat and may feed the shared planner.
    feeders: Vec<bool>,
    /// The placement the tokens are routed on: the lead's, retired to the live ranks.
    live: Vec<u16>,
    /// The ranks that serve.
    live_set: LiveSet,
    router: Router,
    /// Per-slot counts of the window `[L][R][S]`, one rank's share `[L][S]`, and the zeros
    /// of an update iteration.
    routed: Vec<u32>,
    mine: Vec<u32>,
    zeros: Vec<u32>,
    /// Cycles still run (a cycle whose activation falls after the trace is not).
    driving: bool,
    /// The first window of the cycle under way.
    cycle_start: usize,
    /// The next membership event.
    next_event: usize,
    log: Vec<LogEntry>,
    outcomes: Vec<MemberOutcome>,
    score: Score,
}

impl<'a> SimRun<'a> {
    fn new(
        trace: &'a SimTrace,
        cfg: &'a SimConfig,
        policy: Box<dyn eplb_policies::Policy + Send>,
    ) -> Result<Self, SimError> {
        let shape = run_shape(trace, cfg, policy.as_ref())?;
        let initial = initial_placement(&shape, cfg.initial)?;
        let r = shape.ranks();
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
        validate_events(
            &cfg.events,
            r,
            trace.windows,
            trace.experts,
            shape.slots_per_rank(),
        )?;
        let live_set = LiveSet::all(r).map_err(SimError::Shape)?;
        let mut machines = (0..r)
            .map(|rank| new_machine(shape, rank, &initial, live_set, mcfg))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| SimError::Machine {
                window: None,
                rank: 0,
                error,
            })?;
        // One planner serves every rank: one rank (the feeder) folds the heat and feeds it,
        // once per cycle. That is rank 0, or with failures the lowest rank that never fails;
        // when every rank fails at some point, every rank folds and the first live one to ask
        // feeds the planner.
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
        let mut planner = SimPlanner::new(shape, policy, feeders.clone());
        planner.host.set_gate(cfg.payoff_gate);
        let (l, s) = (shape.layers(), shape.slots_per_rank());
        Ok(Self {
            trace,
            cfg,
            shape,
            mcfg,
            world: LocalWorld::new(&machines),
            machines,
            planner,
            anchor,
            feeders,
            router: Router::new(&shape, &initial, cfg.routing),
            log: vec![LogEntry {
                cycle: 0,
                active_from_window: 0,
                placement: initial.clone(),
                heat_windows: None,
                policy_time_s: None,
            }],
            live: initial,
            live_set,
            routed: vec![0; shape.placement_len()],
            mine: vec![0; l * s],
            zeros: vec![0; l * s],
            driving: true,
            cycle_start: 0,
            next_event: 0,
            outcomes: Vec::new(),
            score: Score::new(&shape, trace.windows, cfg.routing),
        })
    }

    /// Window `w`: its membership events, its score, then the ranks driven through it.
    fn window(&mut self, w: usize) -> Result<(), SimError> {
        self.apply_events(w)?;
        let (l, n) = (self.trace.layers, self.trace.experts);
        let counts = &self.trace.counts[w * l * n..(w + 1) * l * n];
        self.score
            .window(&self.shape, w, counts, &self.live, &self.live_set)?;
        // A cycle starting now would activate at w + H + A: run it only if that is inside.
        let (h, a) = (self.heat(), self.algo());
        if self.driving && w == self.cycle_start && w + h + a >= self.trace.windows {
            self.driving = false;
        }
        if self.driving {
            self.drive_window(w)?;
        }
        Ok(())
    }

    fn heat(&self) -> usize {
        self.cfg.heat_interval as usize
    }

    fn algo(&self) -> usize {
        self.cfg.algo_interval as usize
    }

    fn lead(&self) -> usize {
        lead_rank(self.anchor, self.world.driven(), &self.machines)
    }

    /// The membership events of window `w`, before it is routed: the ranks stop or join, the
    /// survivors are told the new set, and no token goes to a rank that left.
    fn apply_events(&mut self, w: usize) -> Result<(), SimError> {
        let mut changed = false;
        while let Some(ev) = self
            .cfg
            .events
            .get(self.next_event)
            .filter(|e| e.window == w)
        {
            self.next_event += 1;
            self.apply_event(*ev)?;
            changed = true;
        }
        if !changed {
            return Ok(());
        }
        if self.driving {
            // Every live rank is told the new set at this iteration; the drive runs their
            // agreement and reroute.
            self.world.net_mut().set_live(&self.live_set);
            for (m, &d) in self.machines.iter_mut().zip(self.world.driven()) {
                if d {
                    m.handle_membership(self.live_set)
                        .map_err(|error| SimError::Machine {
                            window: Some(w),
                            rank: m.rank(),
                            error,
                        })?;
                }
            }
            // The machines drop the cycle under way; the next one starts now.
            self.cycle_start = w;
        }
        // The routing-only step: no token goes to a rank that left.
        retire(&self.shape, &self.live_set, &mut self.live).map_err(SimError::Shape)?;
        self.router.rebuild(&self.live);
        Ok(())
    }

    /// One membership event: the rank stops (its machine is never driven again) or joins
    /// with a fresh machine on the survivors' placement; its outcome starts.
    fn apply_event(&mut self, ev: MemberEvent) -> Result<(), SimError> {
        let q = usize::from(ev.rank);
        let before = self.live_set;
        match ev.kind {
            MemberKind::Fail => {
                self.live_set.remove(q).map_err(SimError::Shape)?;
                // It never enters a collective again.
                self.world.set_driven(q, false);
            }
            MemberKind::Join => {
                self.live_set.insert(q).map_err(SimError::Shape)?;
                if self.driving {
                    // A fresh machine from the placement the survivors hold.
                    let lead = self.lead();
                    let placement = self.machines[lead].placement();
                    let mut m =
                        new_machine(self.shape, q, placement, before, self.mcfg).map_err(|e| {
                            SimError::Event {
                                event: ev,
                                why: e.to_string(),
                            }
                        })?;
                    if !self.feeders[q] {
                        m.share_planner();
                    }
                    self.machines[q] = m;
                    self.world.set_driven(q, true);
                }
            }
        }
        // Reloads so far belong to the event before.
        if let Some(prev) = self.outcomes.last_mut() {
            book_reloads(prev, &mut self.planner.reloads);
        }
        self.planner.reloads.fill(0);
        // Experts with no copy on a live rank right after this event (several events at one
        // window each report their own).
        let mut lost_now = 0;
        for rows in self.live.chunks_exact(self.shape.slots_per_layer()) {
            lost_now += count_lost(&self.shape, rows, &self.live_set).map_err(SimError::Shape)?;
        }
        self.outcomes.push(MemberOutcome {
            event: ev,
            live_ranks: self.live_set.count(),
            lost_experts: lost_now,
            unserved_tokens: 0,
            reload_copies: 0,
            reload_copies_max_rank: 0,
            par_before_event: f64::NAN,
            par_window_after: f64::NAN,
            recovered_at_window: None,
        });
        Ok(())
    }

    /// Window `w` on every driven rank: its forward, every action until all are idle, then
    /// the update iterations between windows (the layer walk is part of the delay); a plan
    /// taken after `w` is logged as live from `w + 1`.
    fn drive_window(&mut self, w: usize) -> Result<(), SimError> {
        let (l, n) = (self.trace.layers, self.trace.experts);
        let counts = &self.trace.counts[w * l * n..(w + 1) * l * n];
        self.router.route(counts, &mut self.routed);
        let (s, per) = (self.shape.slots_per_rank(), self.shape.slots_per_layer());
        for rank in 0..self.machines.len() {
            if !self.world.is_driven(rank) {
                continue;
            }
            for layer in 0..l {
                let base = layer * per + rank * s;
                self.mine[layer * s..(layer + 1) * s].copy_from_slice(&self.routed[base..base + s]);
            }
            self.forward(w, rank, false)?;
        }
        self.drive(w)?;
        let lead = self.lead();
        let taken = self.machines[lead].take_events().plan_taken.is_some();
        let limit = 2 * l + 2;
        let mut updates = 0usize;
        while self.machines[lead].is_updating() {
            updates += 1;
            if updates > limit {
                return Err(SimError::Livelock {
                    window: w,
                    iterations: limit,
                });
            }
            for rank in 0..self.machines.len() {
                if self.world.is_driven(rank) {
                    self.forward(w, rank, true)?;
                }
            }
            self.drive(w)?;
        }
        for m in self.machines.iter_mut() {
            let _ = m.take_events();
        }
        let lead_placement = self.machines[lead].placement();
        if taken {
            // The plan taken after window w is live from window w + 1.
            self.log.push(LogEntry {
                cycle: self.log.len(),
                active_from_window: w + 1,
                placement: lead_placement.to_vec(),
                heat_windows: Some((self.cycle_start, self.cycle_start + self.heat())),
                policy_time_s: Some(self.planner.plan_time),
            });
            self.cycle_start = w + 1;
        }
        if self.live != lead_placement {
            self.live.copy_from_slice(lead_placement);
            self.router.rebuild(&self.live);
        }
        Ok(())
    }

    /// One forward of `rank` in window `w`: its routed counts, or zeros in an update iteration.
    fn forward(&mut self, w: usize, rank: usize, update: bool) -> Result<(), SimError> {
        let counts = if update { &self.zeros } else { &self.mine };
        self.world
            .forward(&mut self.machines[rank], counts, 0)
            .map_err(|error| SimError::Machine {
                window: Some(w),
                rank,
                error,
            })
    }

    /// Every driven machine's actions until all are idle ([`LocalWorld::drive`]).
    fn drive(&mut self, w: usize) -> Result<(), SimError> {
        self.world
            .drive(&mut self.machines, &mut self.planner)
            .map_err(|e| e.at_window(w))
    }

    /// The run's result: the metrics over the scores, the changes over the log, and what each
    /// membership event did.
    fn finish(mut self) -> Result<SimResult, SimError> {
        if let Some(last) = self.outcomes.last_mut() {
            book_reloads(last, &mut self.planner.reloads);
        }
        let stats = self.machines[self.lead()].stats();
        let (t_len, l, s) = (
            self.trace.windows,
            self.trace.layers,
            self.shape.slots_per_rank(),
        );
        let score = &self.score;
        let layer_mean: Vec<f64> = score
            .par
            .chunks_exact(l)
            .map(|c| c.iter().sum::<f64>() / l as f64)
            .collect();
        let first = (self.heat() + self.algo()).min(t_len);
        let tail = &layer_mean[first..];
        let (mut changes, mut moves_total, mut slot_writes_total) = (0, 0, 0);
        for pair in self.log.windows(2) {
            let (old, new) = (&pair[0].placement, &pair[1].placement);
            if old != new {
                changes += 1;
                moves_total += metrics::moves(old, new, s);
                slot_writes_total += metrics::slot_writes(old, new);
            }
        }
        let mut dup_max = 0;
        for e in &self.log {
            dup_max = dup_max.max(colocated_rows(&self.shape, &e.placement));
        }
        let cycle = self.heat() + self.algo();
        score.book_outcomes(&mut self.outcomes, &layer_mean, first, cycle);
        let times: Vec<f64> = self.log.iter().filter_map(|e| e.policy_time_s).collect();
        let score = self.score;
        Ok(SimResult {
            shape: self.shape,
            mean_par: mean(&score.par),
            p99_par: percentile(&layer_mean, 99.0),
            max_par: score.par.iter().copied().fold(f64::MIN, f64::max),
            mean_par_from_first_activation: mean(tail),
            p99_par_from_first_activation: percentile(tail, 99.0),
            other_routing_mean_par: mean(&score.other),
            lower_bound_mean_par: mean(&score.lb),
            changes,
            cycles: self.log.len() - 1,
            moves_total,
            slot_writes_total,
            same_rank_duplicate_rows_max: dup_max,
            policy_time_ms_mean: if times.is_empty() {
                0.0
            } else {
                mean(&times) * 1e3
            },
            policy_time_ms_max: times.iter().copied().fold(0.0, f64::max) * 1e3,
            failed_layers: stats.layers_failed,
            plans: stats.plans_taken,
            plan_failures: stats.plan_failures,
            first_plan_failure: self.planner.first_failure.take(),
            log: self.log,
            par: score.par,
            lower_bound: score.lb,
            membership: self.outcomes,
            unserved: score.unserved,
        })
    }
}

/// The mean of `v` (`NaN` when empty).
fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The scores of every window: PAR under the routing model and the other one, the lower bound,
/// and (with membership events) the lost experts and unserved tokens, with the buffers that
/// compute them.
struct Score {
    routing: Routing,
    other_routing: Routing,
    /// `[T][L]`.
    par: Vec<f64>,
    other: Vec<f64>,
    lb: Vec<f64>,
    /// Per window: tokens of experts with no live copy, lost (layer, expert) pairs, and
    /// whether a live rank has an empty slot.
    unserved: Vec<u64>,
    lost: Vec<usize>,
    empty_live: Vec<bool>,
    scratch: Vec<u32>,
    rank_buf: Vec<f64>,
    copies: Vec<u16>,
    heap: std::collections::BinaryHeap<(u64, std::cmp::Reverse<usize>)>,
    loads: Vec<f64>,
    live_loads: Vec<f64>,
    lost_buf: Vec<bool>,
}

impl Score {
    fn new(shape: &Shape, windows: usize, routing: Routing) -> Self {
        let (l, n, r) = (shape.layers(), shape.experts(), shape.ranks());
        Self {
            routing,
            other_routing: match routing {
                Routing::Log2Phy => Routing::Even,
                Routing::Even => Routing::Log2Phy,
            },
            par: vec![0.0; windows * l],
            other: vec![0.0; windows * l],
            lb: vec![0.0; windows * l],
            unserved: vec![0; windows],
            lost: vec![0; windows],
            empty_live: vec![false; windows],
            scratch: vec![0; metrics::scratch_len(shape)],
            rank_buf: vec![0.0; r],
            copies: vec![0; n],
            heap: std::collections::BinaryHeap::with_capacity(n),
            loads: vec![0.0; n],
            live_loads: Vec::with_capacity(r),
            lost_buf: vec![false; n],
        }
    }

    /// Scores window `w` (`counts` `[L][N]`) under `live`, the placement live during it, over
    /// the live ranks only: an EMPTY slot holds nothing, a lost expert's tokens are unserved,
    /// PAR is max / mean of the live ranks' loads (with every rank live and every slot full,
    /// nothing is lost and PAR is over every rank).
    fn window(
        &mut self,
        shape: &Shape,
        w: usize,
        counts: &[u64],
        live: &[u16],
        live_set: &LiveSet,
    ) -> Result<(), SimError> {
        let (l, n, s, per) = (
            shape.layers(),
            shape.experts(),
            shape.slots_per_rank(),
            shape.slots_per_layer(),
        );
        let whole = live_set.is_all() && !live.contains(&EMPTY);
        for layer in 0..l {
            let lc = &counts[layer * n..(layer + 1) * n];
            for (x, &c) in self.loads.iter_mut().zip(lc) {
                *x = c as f64;
            }
            let rows = &live[layer * per..(layer + 1) * per];
            let lp = LayerPlacement::with_live(*shape, layer, rows, live_set)
                .map_err(SimError::Shape)?;
            let at = w * l + layer;
            for (routing, out) in [
                (self.routing, &mut self.par),
                (self.other_routing, &mut self.other),
            ] {
                metrics::rank_loads(
                    &lp,
                    &self.loads,
                    routing,
                    &mut self.scratch,
                    &mut self.rank_buf,
                )
                .map_err(SimError::Shape)?;
                out[at] = if live_set.is_all() {
                    metrics::par(&self.rank_buf)
                } else {
                    self.live_loads.clear();
                    self.live_loads
                        .extend(live_set.iter().map(|q| self.rank_buf[q]));
                    metrics::par(&self.live_loads)
                };
            }
            self.lb[at] = lower_bound_par(shape, &self.loads, &mut self.copies, &mut self.heap)
                .map_err(SimError::Shape)?;
            if whole {
                continue;
            }
            self.lost[w] +=
                lost_experts(shape, rows, live_set, &mut self.lost_buf).map_err(SimError::Shape)?;
            self.unserved[w] += self
                .lost_buf
                .iter()
                .zip(lc)
                .filter(|(lost, _)| **lost)
                .map(|(_, &c)| c)
                .sum::<u64>();
            self.empty_live[w] |= live_set
                .iter()
                .any(|q| rows[q * s..(q + 1) * s].contains(&EMPTY));
        }
        Ok(())
    }

    /// What each membership event did: lost experts at it, unserved tokens and recovery up to
    /// the next event. `layer_mean` is the layer-mean PAR per window, `first` the first
    /// activation's window, `cycle` `H + A`.
    fn book_outcomes(
        &self,
        outcomes: &mut [MemberOutcome],
        layer_mean: &[f64],
        first: usize,
        cycle: usize,
    ) {
        let bounds: Vec<usize> = outcomes
            .iter()
            .skip(1)
            .map(|o| o.event.window)
            .chain(core::iter::once(layer_mean.len()))
            .collect();
        for (o, &end) in outcomes.iter_mut().zip(&bounds) {
            let at = o.event.window;
            let lo = if at > first {
                at.saturating_sub(cycle).max(first)
            } else {
                at.saturating_sub(cycle)
            };
            o.par_before_event = mean(&layer_mean[lo..at]);
            o.par_window_after = layer_mean[at];
            o.unserved_tokens = self.unserved[at..end].iter().sum();
            let limit = o.par_before_event * 1.05;
            o.recovered_at_window = (at..end)
                .find(|&x| self.lost[x] == 0 && !self.empty_live[x] && layer_mean[x] <= limit);
        }
    }
}

/// Rows (layer, rank) of `p` holding some expert twice ([`EMPTY`] slots hold none).
fn colocated_rows(shape: &Shape, p: &[u16]) -> usize {
    p.chunks_exact(shape.slots_per_rank().max(1))
        .filter(|row| eplb_core::placement::first_duplicate(row).is_some())
        .count()
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

/// The simulator's planner and layer hooks for [`LocalWorld`]: the policy called in place (one
/// planner shared by every rank, as ranks of one process may share one), and transfers that
/// arrive whenever they can be planned.
struct SimPlanner {
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
    /// `(cycle, layer, ok)` of the last layer whose transfers were planned.
    layer_ok: Option<(u64, u16, bool)>,
    /// Per rank: it folds the heat and may feed the shared planner.
    feeders: Vec<bool>,
    /// Per rank: expert copies planned to be read from host memory (no live rank held them)
    /// since the last membership event.
    reloads: Vec<u64>,
}

impl LocalHooks for SimPlanner {
    type Error = SimError;

    /// Runs the policy for the input's cycle once, on the first feeder's input (rank 0 without
    /// failures; the other ranks share its planner and submit empty inputs); the plan is
    /// handed to every rank that asked for it at the end of the round.
    fn submit(&mut self, rank: usize, input: &PlanInput<'_>) -> Result<PlanAnswer<'_>, SimError> {
        if self.feeders.get(rank).copied().unwrap_or(false)
            && self.planned.map(|p| p.0) != Some(input.cycle)
        {
            let ok = self.compute(input);
            self.planned = Some((input.cycle, ok));
        }
        Ok(PlanAnswer::Later)
    }

    fn planned(&mut self) -> Option<(u64, Option<&Plan>)> {
        let (cycle, ok) = self.planned?;
        Some((cycle, self.plan.as_ref().filter(|_| ok)))
    }

    fn settle(&mut self, _rank: usize, cycle: u64, taken: bool, resync: bool) {
        self.host.settle(cycle, taken, resync);
    }

    fn launch(&mut self, m: &RankMachine, layer: u16) -> bool {
        self.layer_plannable(m, layer)
    }
}

impl SimPlanner {
    fn new(
        shape: Shape,
        policy: Box<dyn eplb_policies::Policy + Send>,
        feeders: Vec<bool>,
    ) -> Self {
        let r = shape.ranks();
        Self {
            first_failure: None,
            shape,
            host: PolicyHost::new(policy, shape),
            plan: None,
            planned: None,
            plan_time: 0.0,
            layer_ok: None,
            feeders,
            reloads: vec![0; r],
        }
    }

    /// Whether the transfers of `layer` can be planned (once per cycle and layer), counting
    /// the copies the ranks load from host memory.
    fn layer_plannable(&mut self, m: &RankMachine, layer: u16) -> bool {
        let key = (m.cycle_number(), layer);
        if let Some((c, l, ok)) = self.layer_ok
            && (c, l) == key
        {
            return ok;
        }
        let per = self.shape.slots_per_layer();
        let range = usize::from(layer) * per..(usize::from(layer) + 1) * per;
        let ok = match plan_loads(&self.shape, &m.placement()[range.clone()], &m.plan()[range]) {
            Ok(loads) => {
                for load in &loads {
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

    /// Calls the policy on `input`: whether it planned (a failure is logged and kept).
    fn compute(&mut self, input: &PlanInput<'_>) -> bool {
        let cycle = input.cycle;
        match plan_input(&mut self.host, &self.shape, input) {
            Ok(plan) => {
                self.plan_time = plan.elapsed().as_secs_f64();
                self.plan = Some(plan);
                true
            }
            Err(e) => {
                log::error!("eplb simulate: cycle {cycle}: {e}");
                if self.first_failure.is_none() {
                    self.first_failure = Some(format!("cycle {cycle}: {e}"));
                }
                self.plan_time = 0.0;
                false
            }
        }
    }
}

/// The policy host's plan for a machine's `input` (the one place the simulator builds a
/// policy input).
fn plan_input(
    host: &mut PolicyHost,
    shape: &Shape,
    input: &PlanInput<'_>,
) -> Result<eplb_runtime::planner::Plan, eplb_runtime::planner::PlanFailure> {
    let (cycle, samples) = (input.cycle, Some((input.windows, input.samples)));
    policy_input(
        shape,
        input.current,
        input.live,
        input.loads,
        samples,
        input.seed,
    )
    .and_then(|i| host.plan(cycle, &i))
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
