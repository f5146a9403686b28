//! `eplb advise`: should EPLB be enabled on this workload, and with which settings?
//!
//! [`advise`] replays a trace for every setting of a [`Grid`] (policy x heat interval x
//! algorithm interval x redundant experts), prices each run with the time model
//! ([`crate::time`]) and ranks the settings by their net estimated saving against no EPLB:
//! the `static` run with the fewest redundant experts the shape allows (0 when `R` divides
//! `N`), from the trace's initial placement. Each setting's total is its estimated MoE time of
//! every window plus the stalls of its cycles; the saving is
//! `(baseline - (policy + stalls)) / baseline * 100` over the common windows
//! `[max(H + A), T)` of the grid (steady state: every setting has had its first activation,
//! and every setting is judged on the same windows; stalls of cycles activated before that are
//! left out with the windows they served).
//!
//! The runs go to `threads` workers that take grid indices from a shared counter; results are
//! stored by index and ranked with a stable sort, so the table is the same on any number of
//! threads. EPLB is recommended when the best setting saves at least [`MIN_SAVING_PCT`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use eplb_policies::PolicyKind;
use serde_json::{Value, json};

use crate::time::{TimeBasis, TimeSpec, WindowTimes, estimate, saving_pct, window_ms};
use crate::{Replay, SimConfig, SimError, SimPolicy, SimTrace};

mod engine;

pub use engine::{Engine, EngineConfig};

/// The smallest net saving, percent of the whole step (TPOT in decode, the iteration in
/// prefill), for which `advise` recommends EPLB: it says **enable** only when the low end of
/// the saving's band clears it, **do not enable** when the high end misses it, and otherwise
/// **benchmark first** (research note §5).
pub const MIN_SAVING_PCT: f64 = 3.0;

/// Share of a one-window (aggregate) trace's load assumed to drift between rebalances for the
/// low end of its band: the load served is `(1 - d)` the trace's and `d` a permutation of it
/// that changes every [`DRIFT_PERIOD`] iterations. An assumption, stated: an aggregate keeps no
/// time, so how much the load moves is unknown.
pub const DRIFT_SHARE: f64 = 0.25;

/// Iterations between the drifting part's changes (see [`DRIFT_SHARE`]).
pub const DRIFT_PERIOD: usize = 25;

/// What `advise` tells the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The low end of the saving clears the threshold.
    Enable,
    /// The high end of the saving misses the threshold.
    DoNotEnable,
    /// In between: measure before deciding.
    BenchmarkFirst,
}

impl Verdict {
    /// `enable`, `do-not-enable` or `benchmark-first`.
    pub const fn name(self) -> &'static str {
        match self {
            Verdict::Enable => "enable",
            Verdict::DoNotEnable => "do-not-enable",
            Verdict::BenchmarkFirst => "benchmark-first",
        }
    }

    /// The verdict of a saving band `[low, high]` (percent of the step).
    pub fn of(low: f64, high: f64) -> Verdict {
        if low.is_finite() && low >= MIN_SAVING_PCT {
            Verdict::Enable
        } else if !(high.is_finite() && high >= MIN_SAVING_PCT) {
            Verdict::DoNotEnable
        } else {
            Verdict::BenchmarkFirst
        }
    }
}

/// The same trace with each layer's expert ids permuted by a fixed seeded shuffle (the
/// shipped traces' load falls with the id, which flatters EPLB against a contiguous static
/// placement).
pub fn permuted_ids(replay: &Replay, seed: u64) -> Replay {
    let t = &replay.trace;
    let (l, n) = (t.layers, t.experts);
    let perms: Vec<Vec<usize>> = (0..l)
        .map(|layer| shuffle(n, seed ^ layer as u64))
        .collect();
    let mut counts = vec![0u64; t.counts.len()];
    for (w, chunk) in t.counts.chunks_exact(l * n).enumerate() {
        for (layer, row) in chunk.chunks_exact(n).enumerate() {
            for (e, &c) in row.iter().enumerate() {
                if let Some(slot) = counts.get_mut(w * l * n + layer * n + perms[layer][e]) {
                    *slot = c;
                }
            }
        }
    }
    Replay {
        trace: SimTrace {
            counts,
            ..t.clone()
        },
        ..replay.clone()
    }
}

/// A one-window trace as `windows` iterations whose load drifts: `(1 - DRIFT_SHARE)` of the
/// window as given plus `DRIFT_SHARE` of it under an id permutation that changes every
/// [`DRIFT_PERIOD`] iterations.
pub fn drifting(replay: &Replay, windows: usize) -> Replay {
    let t = &replay.trace;
    let (l, n) = (t.layers, t.experts);
    let first = t.counts.get(..l * n).unwrap_or(&[]);
    let mut counts = Vec::with_capacity(l * n * windows);
    let mut perm = replay.clone();
    for w in 0..windows {
        if w % DRIFT_PERIOD == 0 {
            perm = permuted_ids(
                &Replay {
                    trace: SimTrace {
                        windows: 1,
                        counts: first.to_vec(),
                        ..t.clone()
                    },
                    ..replay.clone()
                },
                0xD21F7 + (w / DRIFT_PERIOD) as u64,
            );
        }
        for (&a, &b) in first.iter().zip(&perm.trace.counts) {
            let x = (1.0 - DRIFT_SHARE) * a as f64 + DRIFT_SHARE * b as f64;
            counts.push(x.round() as u64);
        }
    }
    Replay {
        trace: SimTrace {
            windows,
            layers: l,
            experts: n,
            counts,
        },
        ..replay.clone()
    }
}

/// A seeded Fisher-Yates shuffle of `0..n` (splitmix64).
fn shuffle(n: usize, seed: u64) -> Vec<usize> {
    let mut x = seed;
    let mut next = || {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        p.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    p
}

/// Iterations an aggregate (one-window) trace is replayed for: it is taken as a stationary
/// workload, its one window repeated. Long enough that every default setting activates and
/// then serves at least twice its first activation, short enough for the time limit.
pub const STATIONARY_WINDOWS: usize = 200;

/// The settings to sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grid {
    /// Policies.
    pub policies: Vec<PolicyKind>,
    /// Heat intervals `H` (windows = iterations).
    pub heat_intervals: Vec<u32>,
    /// Algorithm intervals `A`.
    pub algo_intervals: Vec<u32>,
    /// Redundant experts `X`.
    pub redundant: Vec<u32>,
    /// The pay-off gate off (`false`) and/or on (`true`).
    pub payoff_gate: Vec<bool>,
}

/// One setting of the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The policy.
    pub policy: PolicyKind,
    /// `H`.
    pub heat_interval: u32,
    /// `A`.
    pub algo_interval: u32,
    /// `X`.
    pub redundant: u32,
    /// The pay-off gate is on.
    pub payoff_gate: bool,
}

/// The fewest redundant experts `x >= 0` with `(experts + x) % ranks == 0`.
pub fn min_redundant(experts: usize, ranks: u16) -> u32 {
    let r = usize::from(ranks.max(1));
    ((r - experts % r) % r) as u32
}

impl Grid {
    /// The windows a trace of `windows` windows is replayed over: an aggregate (one-window)
    /// trace becomes [`STATIONARY_WINDOWS`] iterations of its one window.
    pub fn replay_windows(windows: usize) -> usize {
        if windows == 1 {
            STATIONARY_WINDOWS
        } else {
            windows
        }
    }

    /// The default grid for a trace of `windows` windows and `experts` experts on `ranks`
    /// ranks: every policy but `random` (a test of the update path, not a balancer); heat
    /// intervals `T/16`, `T/8`, `T/4` (at least 1, without repeats); algorithm intervals 1 and
    /// `max(2, T/32)`; redundant experts the fewest the shape allows and one slot per rank more.
    /// Settings whose first activation `H + A` is not inside the trace are dropped by
    /// [`Grid::settings`].
    pub fn default_for(windows: usize, experts: usize, ranks: u16) -> Self {
        let t = windows as u32;
        let mut heat: Vec<u32> = [t / 16, t / 8, t / 4].map(|h| h.max(1)).to_vec();
        heat.dedup();
        let mut algo = vec![1, (t / 32).max(2)];
        algo.dedup();
        let x0 = min_redundant(experts, ranks);
        Self {
            policies: PolicyKind::ALL
                .into_iter()
                .filter(|k| *k != PolicyKind::Random)
                .collect(),
            heat_intervals: heat,
            algo_intervals: algo,
            redundant: vec![x0, x0 + u32::from(ranks)],
            payoff_gate: vec![false],
        }
    }

    /// Every setting, policy-major, then `H`, `A`, `X`, the gate in the order given, keeping only those
    /// whose first activation `H + A` falls inside `windows`.
    pub fn settings(&self, windows: usize) -> Vec<Setting> {
        let mut out = Vec::new();
        for &policy in &self.policies {
            for &heat_interval in &self.heat_intervals {
                for &algo_interval in &self.algo_intervals {
                    if heat_interval as usize + algo_interval as usize >= windows {
                        continue;
                    }
                    for &redundant in &self.redundant {
                        for &payoff_gate in &self.payoff_gate {
                            out.push(Setting {
                                policy,
                                heat_interval,
                                algo_interval,
                                redundant,
                                payoff_gate,
                            });
                        }
                    }
                }
            }
        }
        out
    }
}

/// One setting's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The setting.
    pub setting: Setting,
    /// Its index in the grid's settings.
    pub index: usize,
    /// Why it could not be run, if it could not (its figures are then NaN).
    pub error: Option<String>,
    /// Mean estimated MoE ms per iteration over the common windows.
    pub moe_ms: f64,
    /// Mean estimated step ms per iteration over the common windows.
    pub step_ms: f64,
    /// Net saving against the baseline over the common windows, percent of the step (stalls
    /// included).
    pub net_saving_pct: f64,
    /// The same at the model band's low-saving corner.
    pub net_saving_pct_low: f64,
    /// The same at the model band's high-saving corner.
    pub net_saving_pct_high: f64,
    /// Mean stall per cycle (every cycle of the run), ms.
    pub stall_ms_per_cycle_mean: f64,
    /// Largest stall of one such cycle, ms.
    pub stall_ms_per_cycle_max: f64,
    /// Sum of those stalls, ms.
    pub stall_ms_total: f64,
    /// Cycles run.
    pub cycles: usize,
    /// Cycles that changed the placement.
    pub changes: usize,
    /// Mean PAR from the first activation (the simulator's figure).
    pub mean_par: f64,
}

/// The outcome of [`advise`].
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// Ranked rows: best net saving first, grid order on ties, failed settings last.
    pub rows: Vec<Row>,
    /// The baseline's redundant experts (`static`, no EPLB).
    pub baseline_redundant: u32,
    /// The baseline's mean estimated step ms per iteration over the common windows.
    pub baseline_ms: f64,
    /// The first common window (`max(H + A)` over the settings run).
    pub first_window: usize,
    /// Whether the verdict is [`Verdict::Enable`].
    pub recommended: bool,
    /// The verdict for the best setting.
    pub verdict: Verdict,
    /// The best setting's saving, percent of the step: `(low, central, high)` over the model's
    /// band, the ids as given and permuted, and (one-window traces) drift.
    pub saving_pct: (f64, f64, f64),
    /// The best setting's central saving with the expert ids permuted.
    pub permuted_saving_pct: Option<f64>,
    /// The best setting's central saving when a one-window trace's load drifts.
    pub drift_saving_pct: Option<f64>,
    /// The baseline's mean estimated MoE ms per iteration over the common windows.
    pub baseline_moe_ms: f64,
    /// `Some(n)` when the trace had one window and was replayed as a stationary workload of
    /// `n` iterations ([`STATIONARY_WINDOWS`]).
    pub stationary: Option<usize>,
    /// The time model used.
    pub time: TimeBasis,
    /// EP ranks.
    pub ranks: u16,
}

fn sum_from(v: &[f64], from: usize) -> f64 {
    v.get(from..).unwrap_or(&[]).iter().sum()
}

/// Sweeps `grid` over `replay` with the shape, topology, initial placement, routing and seed of
/// `base` (its policy, intervals and redundant count are replaced by each setting's), on
/// `threads` threads (at least 1). `progress(done, total)` is called from the workers after
/// each setting.
pub fn advise(
    replay: &Replay,
    base: &SimConfig,
    spec: &TimeSpec,
    grid: &Grid,
    threads: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Advice, SimError> {
    // An aggregate dump (one window) is a stationary workload: its window, repeated.
    let stationary = (replay.trace.windows == 1).then(|| replay.stationary(STATIONARY_WINDOWS));
    let replay = stationary.as_ref().unwrap_or(replay);
    let trace = &replay.trace;
    let time = spec.resolve(&replay.basis, base.ranks_per_node)?;
    let settings = grid.settings(trace.windows);
    if settings.is_empty() {
        return Err(SimError::Setting {
            what: "advise grid".to_owned(),
            why: format!(
                "no setting has its first activation (H + A) inside the trace's {} window(s); \
                 advise replays the trace window by window, so it needs at least H + A + 1 \
                 windows (give smaller --heat-intervals/--algo-intervals)",
                trace.windows
            ),
        });
    }
    let first_window = settings
        .iter()
        .map(|s| s.heat_interval as usize + s.algo_interval as usize)
        .max()
        .unwrap_or(0)
        .min(trace.windows);
    // The baseline: no EPLB, the fewest redundant experts the shape allows.
    let baseline_redundant = min_redundant(trace.experts, base.ranks);
    let base_cfg = SimConfig {
        policy: SimPolicy::Static,
        redundant: baseline_redundant,
        ..base.clone()
    };
    let base_run = replay.run(&base_cfg, &[], &mut |_, _| {})?;
    let baseline = window_ms(
        trace,
        &base_run.result.shape,
        &base_cfg,
        &time,
        base_run
            .result
            .log
            .first()
            .map(|e| (0, e.placement.as_slice())),
    )?;
    let base_total = sum_from(&baseline.step_ms, first_window);
    let tail_len = trace.windows.saturating_sub(first_window).max(1) as f64;

    let mut rows = run_grid(&settings, threads, progress, |s, i| {
        run_setting(
            replay,
            base,
            &time,
            s,
            i,
            &baseline,
            base_total,
            first_window,
            tail_len,
        )
    })?;
    rows.sort_by(|a, b| {
        let key = |r: &Row| {
            if r.error.is_none() && r.net_saving_pct.is_finite() {
                r.net_saving_pct
            } else {
                f64::NEG_INFINITY
            }
        };
        key(b).total_cmp(&key(a)).then(a.index.cmp(&b.index))
    });
    // Nothing to recommend from: an error, not a "do not enable" verdict.
    if let Some(first) = rows.iter().min_by_key(|r| r.index)
        && rows
            .iter()
            .all(|r| r.error.is_some() || !r.net_saving_pct.is_finite())
    {
        return Err(SimError::Setting {
            what: "advise".to_owned(),
            why: format!(
                "no setting could be estimated ({} tried); the first ({}, H {}, A {}, {} redundant) failed: {}",
                rows.len(),
                first.setting.label(),
                first.setting.heat_interval,
                first.setting.algo_interval,
                first.setting.redundant,
                first
                    .error
                    .as_deref()
                    .unwrap_or("its saving is not a finite number")
            ),
        });
    }
    let band = Band::of(
        &rows,
        replay,
        base,
        &time,
        first_window,
        stationary.is_some(),
    )?;
    let (lo, central, hi) = band.saving_pct;
    let verdict = Verdict::of(lo, hi);
    Ok(Advice {
        rows,
        baseline_redundant,
        baseline_ms: base_total / tail_len,
        baseline_moe_ms: sum_from(&baseline.moe_ms, first_window) / tail_len,
        first_window,
        recommended: verdict == Verdict::Enable,
        verdict,
        saving_pct: (lo, central, hi),
        permuted_saving_pct: band.permuted_saving_pct,
        drift_saving_pct: band.drift_saving_pct,
        stationary: stationary.map(|r| r.trace.windows),
        time,
        ranks: base.ranks,
    })
}

/// Runs `row(setting, index)` for every setting on `threads` threads (each takes the next
/// setting left), calling `progress(done, total)` after each; the rows in setting order.
fn run_grid(
    settings: &[Setting],
    threads: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
    row: impl Fn(Setting, usize) -> Row + Sync,
) -> Result<Vec<Row>, SimError> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Row>>> = Mutex::new(vec![None; settings.len()]);
    let total = settings.len();
    let work = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(s) = settings.get(i) else { break };
            let r = row(*s, i);
            if let Ok(mut all) = results.lock()
                && let Some(slot) = all.get_mut(i)
            {
                *slot = Some(r);
            }
            progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
        }
    };
    let threads = threads.clamp(1, total.max(1));
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|sc| {
            for _ in 0..threads {
                sc.spawn(work);
            }
        });
    }
    results
        .into_inner()
        .map_err(|_| SimError::Worker { setting: None })?
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.ok_or(SimError::Worker { setting: Some(i) }))
        .collect()
}

/// The recommended setting's saving band: its model band, widened by a re-run with the
/// trace's expert ids permuted and, for an aggregate (stationary) trace, by a drifting re-run.
struct Band {
    /// Low, central and high saving, percent of the step.
    saving_pct: (f64, f64, f64),
    permuted_saving_pct: Option<f64>,
    drift_saving_pct: Option<f64>,
}

impl Band {
    /// The band of the first of `rows` (sorted best first), if it is a valid row.
    fn of(
        rows: &[Row],
        replay: &Replay,
        base: &SimConfig,
        time: &TimeBasis,
        first_window: usize,
        stationary: bool,
    ) -> Result<Self, SimError> {
        let trace = &replay.trace;
        // The best setting's band: the model's parameter box, the ids permuted, and drift for an
        // aggregate trace.
        let best = rows
            .first()
            .filter(|r| r.error.is_none() && r.net_saving_pct.is_finite())
            .cloned();
        let (mut lo, mut hi, central) = match &best {
            Some(r) => (
                r.net_saving_pct_low,
                r.net_saving_pct_high,
                r.net_saving_pct,
            ),
            None => (f64::NAN, f64::NAN, f64::NAN),
        };
        let mut permuted_saving_pct = None;
        let mut drift_saving_pct = None;
        if let Some(r) = &best {
            let widen = |x: &Row, lo: &mut f64, hi: &mut f64| {
                for v in [
                    x.net_saving_pct,
                    x.net_saving_pct_low,
                    x.net_saving_pct_high,
                ] {
                    if v.is_finite() {
                        *lo = lo.min(v);
                        *hi = hi.max(v);
                    }
                }
            };
            let p = permuted_ids(replay, 0x1D5);
            let x = one_setting(&p, base, time, r.setting, first_window)?;
            permuted_saving_pct = Some(x.net_saving_pct);
            widen(&x, &mut lo, &mut hi);
            if stationary {
                let d = drifting(replay, trace.windows);
                let x = one_setting(&d, base, time, r.setting, first_window)?;
                drift_saving_pct = Some(x.net_saving_pct);
                widen(&x, &mut lo, &mut hi);
            }
        }
        Ok(Self {
            saving_pct: (lo, central, hi),
            permuted_saving_pct,
            drift_saving_pct,
        })
    }
}

/// One setting's row on `replay` against its own no-EPLB baseline.
fn one_setting(
    replay: &Replay,
    base: &SimConfig,
    time: &TimeBasis,
    s: Setting,
    first_window: usize,
) -> Result<Row, SimError> {
    let trace = &replay.trace;
    let base_cfg = SimConfig {
        policy: SimPolicy::Static,
        redundant: min_redundant(trace.experts, base.ranks),
        ..base.clone()
    };
    let base_run = replay.run(&base_cfg, &[], &mut |_, _| {})?;
    let baseline = window_ms(
        trace,
        &base_run.result.shape,
        &base_cfg,
        time,
        base_run
            .result
            .log
            .first()
            .map(|e| (0, e.placement.as_slice())),
    )?;
    let base_total = sum_from(&baseline.step_ms, first_window);
    let tail_len = trace.windows.saturating_sub(first_window).max(1) as f64;
    let row = run_setting(
        replay,
        base,
        time,
        s,
        0,
        &baseline,
        base_total,
        first_window,
        tail_len,
    );
    match &row.error {
        Some(e) => Err(SimError::Setting {
            what: format!(
                "advise: policy {} with {} redundant experts",
                s.policy.name(),
                s.redundant
            ),
            why: e.clone(),
        }),
        None => Ok(row),
    }
}

#[allow(clippy::too_many_arguments)]
fn run_setting(
    replay: &Replay,
    base: &SimConfig,
    time: &TimeBasis,
    s: Setting,
    index: usize,
    baseline: &WindowTimes,
    base_total: f64,
    first_window: usize,
    tail_len: f64,
) -> Row {
    let cfg = SimConfig {
        policy: SimPolicy::Policy(s.policy),
        redundant: s.redundant,
        heat_interval: s.heat_interval,
        algo_interval: s.algo_interval,
        ..base.clone()
    };
    let gate = s.payoff_gate.then(|| time.gate(&cfg)).transpose();
    let failed = |e: String| Row {
        setting: s,
        index,
        error: Some(e),
        moe_ms: f64::NAN,
        step_ms: f64::NAN,
        net_saving_pct: f64::NAN,
        net_saving_pct_low: f64::NAN,
        net_saving_pct_high: f64::NAN,
        stall_ms_per_cycle_mean: f64::NAN,
        stall_ms_per_cycle_max: f64::NAN,
        stall_ms_total: f64::NAN,
        cycles: 0,
        changes: 0,
        mean_par: f64::NAN,
    };
    let cfg = match gate {
        Ok(payoff_gate) => SimConfig { payoff_gate, ..cfg },
        Err(e) => return failed(e.to_string()),
    };
    let run = match replay.run(&cfg, &[], &mut |_, _| {}) {
        Ok(r) => r,
        Err(e) => return failed(e.to_string()),
    };
    if let Err(e) = run.check_plans() {
        return failed(e.to_string());
    }
    let fig = match estimate(&replay.trace, &run, &cfg, time, Some(baseline)) {
        Ok(f) => f,
        Err(e) => return failed(e.to_string()),
    };
    // Every cycle's stall counts, also of the moves before the common windows (the first move
    // of a stationary workload, say), while the savings count only over the common windows:
    // conservative, and the same rule for every setting.
    let stalls: Vec<f64> = fig.stalls.iter().map(|c| c.ms).collect();
    let stall_total = stalls.iter().sum::<f64>() + 0.0;
    let ours = sum_from(&fig.per_window_ms, first_window);
    let corner = |ours: &[f64], base: &[f64]| {
        saving_pct(
            sum_from(base, first_window),
            sum_from(ours, first_window),
            stall_total,
        )
    };
    let a = corner(&fig.corners[0], &baseline.low_ms);
    let b = corner(&fig.corners[1], &baseline.high_ms);
    let central = saving_pct(base_total, ours, stall_total);
    Row {
        setting: s,
        index,
        error: None,
        moe_ms: sum_from(&fig.moe_per_window_ms, first_window) / tail_len,
        step_ms: ours / tail_len,
        net_saving_pct: central,
        net_saving_pct_low: a.min(b).min(central),
        net_saving_pct_high: a.max(b).max(central),
        stall_ms_per_cycle_mean: if stalls.is_empty() {
            0.0
        } else {
            stall_total / stalls.len() as f64
        },
        stall_ms_per_cycle_max: stalls.iter().copied().fold(0.0, f64::max),
        stall_ms_total: stall_total,
        cycles: run.result.cycles,
        changes: run.result.changes,
        mean_par: run.result.mean_par_from_first_activation,
    }
}

impl Setting {
    /// The policy's name, with `+gate` when the pay-off gate is on.
    pub fn label(&self) -> String {
        if self.payoff_gate {
            format!("{}+gate", self.policy.name())
        } else {
            self.policy.name().to_owned()
        }
    }

    /// The `eplb_config` object that enables this setting (vLLM-Ascend's keys; the policy by
    /// number where vLLM-Ascend has one, else by name, as `eplb check-config` accepts).
    pub fn eplb_config(&self) -> Value {
        let policy = match self.policy.number() {
            Some(n) => json!(n),
            None => json!(self.policy.name()),
        };
        let mut v = json!({
            "dynamic_eplb": true,
            "num_redundant_experts": self.redundant,
            "expert_heat_collection_interval": self.heat_interval,
            "algorithm_execution_interval": self.algo_interval,
            "eplb_policy_type": policy,
        });
        if self.payoff_gate {
            v["eplb_payoff_gate"] = json!(true);
        }
        v
    }
}

impl Row {
    /// The row as a JSON object.
    pub fn to_json(&self, rank: usize) -> Value {
        let s = &self.setting;
        json!({
            "rank": rank,
            "policy": s.policy.name(),
            "heat_interval": s.heat_interval,
            "algo_interval": s.algo_interval,
            "redundant": s.redundant,
            "payoff_gate": s.payoff_gate,
            "est_moe_ms_per_iter_mean": self.moe_ms,
            "est_step_ms_per_iter_mean": self.step_ms,
            "est_net_saving_pct": self.net_saving_pct,
            "est_net_saving_pct_low": self.net_saving_pct_low,
            "est_net_saving_pct_high": self.net_saving_pct_high,
            "est_stall_ms_per_cycle_mean": self.stall_ms_per_cycle_mean,
            "est_stall_ms_per_cycle_max": self.stall_ms_per_cycle_max,
            "est_stall_ms_total": self.stall_ms_total,
            "cycles": self.cycles,
            "changes": self.changes,
            "mean_par_from_first_activation": self.mean_par,
            "error": self.error,
        })
    }
}

impl Advice {
    /// The best row, when the verdict is enable.
    pub fn winner(&self) -> Option<&Row> {
        self.rows.first().filter(|_| self.recommended)
    }

    /// The best row that ran (the candidate of a benchmark).
    pub fn best(&self) -> Option<&Row> {
        self.rows
            .first()
            .filter(|r| r.error.is_none() && r.net_saving_pct.is_finite())
    }

    /// The `eplb_config` to use: the winner's, or `{"dynamic_eplb": false}`; a gated row's
    /// `eplb_payoff_gate` is the object of this advice's time model ([`Advice::gate_object`]).
    pub fn eplb_config(&self) -> Value {
        match self.winner() {
            Some(r) => self.setting_config(&r.setting),
            None => json!({"dynamic_eplb": false}),
        }
    }

    /// The `eplb_payoff_gate` object of this advice's time model: what the runtime's gate
    /// needs to price as the rows were priced (the quant type goes into `deployment`).
    pub fn gate_object(&self) -> Value {
        let tm = &self.time.model;
        let mut g = json!({
            "model": tm.model.name,
            "hardware": tm.hardware.name,
            "role": self.time.role.name(),
            "tokens_per_rank": tm.tokens_per_rank,
        });
        if let Some(src) = &self.time.calibration_source {
            g["calibration"] = json!(src);
        }
        g
    }

    /// `setting`'s `eplb_config`, its gate (when on) with this advice's time model.
    pub fn setting_config(&self, setting: &Setting) -> Value {
        let mut v = setting.eplb_config();
        if setting.payoff_gate {
            v["eplb_payoff_gate"] = self.gate_object();
        }
        v
    }

    fn band_text(&self) -> String {
        let (lo, c, hi) = self.saving_pct;
        format!("{c:.1}% of the step (band {lo:.1}% to {hi:.1}%)")
    }

    /// The one-line recommendation: the verdict, the saving with its band, the setting.
    pub fn recommendation(&self) -> String {
        let Some(r) = self.best() else {
            return "do not enable: no setting could be run".to_owned();
        };
        let s = &r.setting;
        let what = format!(
            "policy {}, heat interval {}, algorithm interval {}, {} redundant{}",
            s.policy.name(),
            s.heat_interval,
            s.algo_interval,
            s.redundant,
            if s.payoff_gate {
                ", pay-off gate on"
            } else {
                ""
            },
        );
        match self.verdict {
            Verdict::Enable => format!(
                "enable: {what}: saves {}, stalls {:.2} ms per cycle",
                self.band_text(),
                r.stall_ms_per_cycle_mean
            ),
            Verdict::DoNotEnable => format!(
                "do not enable: the best setting ({what}) saves {}, below the {MIN_SAVING_PCT}% threshold even at the high end",
                self.band_text()
            ),
            Verdict::BenchmarkFirst => format!(
                "benchmark first: the best setting ({what}) saves {}; the {MIN_SAVING_PCT}% threshold lies inside the band",
                self.band_text()
            ),
        }
    }

    /// The A/B run to make when the verdict is benchmark-first.
    pub fn ab_run(&self) -> Option<String> {
        if self.verdict != Verdict::BenchmarkFirst {
            return None;
        }
        let r = self.best()?;
        let step = match self.time.role {
            eplb_core::time::Role::Decode => "TPOT",
            eplb_core::time::Role::Prefill => "the prefill iteration time",
        };
        Some(format!(
            "A/B: serve the same load twice for at least {} steps after warm-up, (A) with EPLB off ({{\"dynamic_eplb\": false}}) and (B) with EPLB on ({}); or, as an upper bound of any EPLB gain, (B) with the engine's forced-balanced routing (SGLang --ep-dispatch-algorithm fake). Enable EPLB if {step} improves by at least {MIN_SAVING_PCT}% (the model expects {:.1}%, between {:.1}% and {:.1}%).",
            (10 * (r.setting.heat_interval + r.setting.algo_interval)).max(1000),
            self.setting_config(&r.setting),
            self.saving_pct.1,
            self.saving_pct.0,
            self.saving_pct.2
        ))
    }

    /// The `advise --json` object.
    pub fn to_json(&self) -> Value {
        json!({
            "recommended": self.recommended,
            "verdict": self.verdict.name(),
            "saving_pct_low": self.saving_pct.0,
            "saving_pct_central": self.saving_pct.1,
            "saving_pct_high": self.saving_pct.2,
            "saving_pct_ids_permuted": self.permuted_saving_pct,
            "saving_pct_drift": self.drift_saving_pct,
            "ab_run": self.ab_run(),
            "recommendation": self.recommendation(),
            "threshold_pct": MIN_SAVING_PCT,
            "saving_of": "whole step (TPOT in decode, iteration in prefill)",
            "baseline": {
                "name": crate::time::BASELINE,
                "policy": "static",
                "redundant": self.baseline_redundant,
                "est_moe_ms_per_iter_mean": self.baseline_moe_ms,
                "est_step_ms_per_iter_mean": self.baseline_ms,
            },
            "first_window": self.first_window,
            "stationary_windows": self.stationary,
            "table": self
                .rows
                .iter()
                .enumerate()
                .map(|(i, r)| r.to_json(i + 1))
                .collect::<Vec<_>>(),
            "eplb_config": self.eplb_config(),
            "candidate_eplb_config": self.best().map(|r| self.setting_config(&r.setting)),
            "time_model": self.time.to_json(),
            "topology": self.time.topology_json(Some(usize::from(self.ranks))),
        })
    }

    /// The ranked table for people (one line per setting, a header first).
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:>4}  {:<17} {:>5} {:>5} {:>5}  {:>10}  {:>10}  {:>8}  {:>16}  {:>12}  {:>11}  {:>6}  {:>7}\n",
            "rank",
            "policy",
            "H",
            "A",
            "X",
            "step ms/it",
            "MoE ms/it",
            "net %",
            "band %",
            "stall/cycle",
            "stall max",
            "cycles",
            "PAR"
        );
        for (i, r) in self.rows.iter().enumerate() {
            let s = &r.setting;
            if let Some(e) = &r.error {
                out.push_str(&format!(
                    "{:>4}  {:<17} {:>5} {:>5} {:>5}  failed: {e}\n",
                    i + 1,
                    s.label(),
                    s.heat_interval,
                    s.algo_interval,
                    s.redundant
                ));
                continue;
            }
            out.push_str(&format!(
                "{:>4}  {:<17} {:>5} {:>5} {:>5}  {:>10.3}  {:>10.3}  {:>8.2}  {:>16}  {:>9.2} ms  {:>8.2} ms  {:>6}  {:>7.4}\n",
                i + 1,
                s.label(),
                s.heat_interval,
                s.algo_interval,
                s.redundant,
                r.step_ms,
                r.moe_ms,
                r.net_saving_pct,
                format!("{:.2}..{:.2}", r.net_saving_pct_low, r.net_saving_pct_high),
                r.stall_ms_per_cycle_mean,
                r.stall_ms_per_cycle_max,
                r.cycles,
                r.mean_par
            ));
        }
        out
    }
}
