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

use crate::time::{TimeBasis, TimeSpec, estimate, window_ms};
use crate::{Replay, SimConfig, SimError, SimPolicy};

/// The smallest net saving, percent of MoE time, for which `advise` recommends EPLB: below it
/// the estimate is within the model's own uncertainty and the moves are not worth the risk.
pub const MIN_SAVING_PCT: f64 = 1.0;

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
    /// Net saving against the baseline over the common windows, percent (stalls included).
    pub net_saving_pct: f64,
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
    /// The baseline's mean estimated MoE ms per iteration over the common windows.
    pub baseline_ms: f64,
    /// The first common window (`max(H + A)` over the settings run).
    pub first_window: usize,
    /// Whether the best setting saves at least [`MIN_SAVING_PCT`].
    pub recommended: bool,
    /// `Some(n)` when the trace had one window and was replayed as a stationary workload of
    /// `n` iterations ([`STATIONARY_WINDOWS`]).
    pub stationary: Option<usize>,
    /// The time model used.
    pub time: TimeBasis,
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
        &time.model,
        base_run
            .result
            .log
            .first()
            .map(|e| (0, e.placement.as_slice())),
    )?;
    let base_total = sum_from(&baseline, first_window);
    let tail_len = trace.windows.saturating_sub(first_window).max(1) as f64;

    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Row>>> = Mutex::new(vec![None; settings.len()]);
    let total = settings.len();
    let work = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(s) = settings.get(i) else { break };
            let row = run_setting(
                replay,
                base,
                &time,
                *s,
                i,
                &baseline,
                base_total,
                first_window,
                tail_len,
            );
            if let Ok(mut r) = results.lock()
                && let Some(slot) = r.get_mut(i)
            {
                *slot = Some(row);
            }
            progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
        }
    };
    let threads = threads.clamp(1, total);
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|sc| {
            for _ in 0..threads {
                sc.spawn(work);
            }
        });
    }
    let mut rows: Vec<Row> = results
        .into_inner()
        .map_err(|_| SimError::Worker { setting: None })?
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.ok_or(SimError::Worker { setting: Some(i) }))
        .collect::<Result<_, _>>()?;
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
    let recommended = rows.first().is_some_and(|r| {
        r.error.is_none() && r.net_saving_pct.is_finite() && r.net_saving_pct >= MIN_SAVING_PCT
    });
    Ok(Advice {
        rows,
        baseline_redundant,
        baseline_ms: base_total / tail_len,
        first_window,
        recommended,
        stationary: stationary.map(|r| r.trace.windows),
        time,
    })
}

#[allow(clippy::too_many_arguments)]
fn run_setting(
    replay: &Replay,
    base: &SimConfig,
    time: &TimeBasis,
    s: Setting,
    index: usize,
    baseline: &[f64],
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
    let cfg = SimConfig {
        payoff_gate: s.payoff_gate.then(|| time.gate(&cfg)),
        ..cfg
    };
    let failed = |e: String| Row {
        setting: s,
        index,
        error: Some(e),
        moe_ms: f64::NAN,
        net_saving_pct: f64::NAN,
        stall_ms_per_cycle_mean: f64::NAN,
        stall_ms_per_cycle_max: f64::NAN,
        stall_ms_total: f64::NAN,
        cycles: 0,
        changes: 0,
        mean_par: f64::NAN,
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
    Row {
        setting: s,
        index,
        error: None,
        moe_ms: ours / tail_len,
        net_saving_pct: if base_total > 0.0 {
            (base_total - (ours + stall_total)) / base_total * 100.0
        } else {
            f64::NAN
        },
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
            "est_net_saving_pct": self.net_saving_pct,
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
    /// The best row, when EPLB is recommended.
    pub fn winner(&self) -> Option<&Row> {
        self.rows.first().filter(|_| self.recommended)
    }

    /// The `eplb_config` to use: the winner's, or `{"dynamic_eplb": false}`.
    pub fn eplb_config(&self) -> Value {
        match self.winner() {
            Some(r) => r.setting.eplb_config(),
            None => json!({"dynamic_eplb": false}),
        }
    }

    /// The one-line recommendation.
    pub fn recommendation(&self) -> String {
        match self.winner() {
            Some(r) => {
                let s = &r.setting;
                format!(
                    "enable: policy {}, heat interval {}, algorithm interval {}, {} redundant{}: -{:.1}% MoE time per iteration, stalls {:.2} ms per cycle",
                    s.policy.name(),
                    s.heat_interval,
                    s.algo_interval,
                    s.redundant,
                    if s.payoff_gate {
                        ", pay-off gate on"
                    } else {
                        ""
                    },
                    r.net_saving_pct,
                    r.stall_ms_per_cycle_mean
                )
            }
            None => {
                let best = self
                    .rows
                    .first()
                    .filter(|r| r.error.is_none() && r.net_saving_pct.is_finite());
                match best {
                    Some(r) if r.net_saving_pct > 0.0 => format!(
                        "do not enable: the best setting saves only {:.2}% net of its moves (below the {MIN_SAVING_PCT}% threshold)",
                        r.net_saving_pct
                    ),
                    Some(_) => {
                        "do not enable: the moves cost more than the balance saves".to_owned()
                    }
                    None => "do not enable: no setting could be run".to_owned(),
                }
            }
        }
    }

    /// The `advise --json` object.
    pub fn to_json(&self) -> Value {
        json!({
            "recommended": self.recommended,
            "recommendation": self.recommendation(),
            "threshold_pct": MIN_SAVING_PCT,
            "baseline": {
                "policy": "static",
                "redundant": self.baseline_redundant,
                "est_moe_ms_per_iter_mean": self.baseline_ms,
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
            "time_model": self.time.to_json(),
        })
    }

    /// The ranked table for people (one line per setting, a header first).
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:>4}  {:<17} {:>5} {:>5} {:>5}  {:>10}  {:>8}  {:>12}  {:>11}  {:>6}  {:>7}\n",
            "rank",
            "policy",
            "H",
            "A",
            "X",
            "MoE ms/it",
            "net %",
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
                "{:>4}  {:<17} {:>5} {:>5} {:>5}  {:>10.3}  {:>8.2}  {:>9.2} ms  {:>8.2} ms  {:>6}  {:>7.4}\n",
                i + 1,
                s.label(),
                s.heat_interval,
                s.algo_interval,
                s.redundant,
                r.moe_ms,
                r.net_saving_pct,
                r.stall_ms_per_cycle_mean,
                r.stall_ms_per_cycle_max,
                r.cycles,
                r.mean_par
            ));
        }
        out
    }
}
