//! `eplb report`: runs the simulator for several policies on one trace and writes one
//! self-contained HTML page of SVG charts ([`page`]), drawn by [`charts`].
//!
//! Every number on the page comes from the [`SimResult`] of each run, the same results that
//! `eplb simulate --json` prints; the page embeds them as a JSON data block
//! (`<script type="application/json" id="eplb-report-data">`, see [`Report::data`]) so that a
//! reader or a test can check the charts against `simulate --json`.
//!
//! **Invariant:** the page fetches nothing and needs no JavaScript: the charts are inline SVG and
//! all text is escaped.

pub mod charts;
pub mod page;

use std::io::{IsTerminal, Write};
use std::time::Instant;

use eplb_core::metrics::{self, Routing};
use eplb_core::{Placement, Shape};
use eplb_policies::PolicyKind;
use serde_json::{Value, json};

use eplb_sim::cost::{CostBasis, MoveCost, sequence_cost};
use eplb_sim::simulate::{simulate, simulate_with};
use eplb_sim::time::{TimeBasis, TimeFigures, estimate_log};
use eplb_sim::{SimConfig, SimPolicy, SimResult, SimTrace};

/// The policies of `--policies`: `all`, or a comma-separated list of `static` and policy names
/// or numbers. `static` is always run (first) as the baseline of the heat map and rank loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyList {
    /// In order, without repeats, `static` first.
    pub policies: Vec<SimPolicy>,
    /// `all` was asked for: a policy that cannot run on the shape is left out with a note
    /// instead of failing the report.
    pub all: bool,
}

impl PolicyList {
    /// Parses `--policies`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "all" {
            let mut policies = vec![SimPolicy::Static];
            policies.extend(PolicyKind::ALL.into_iter().map(SimPolicy::Policy));
            return Ok(Self {
                policies,
                all: true,
            });
        }
        let mut policies = vec![SimPolicy::Static];
        for name in s.split(',').map(str::trim) {
            if name.is_empty() {
                return Err(format!(
                    "--policies {s}: empty policy name (expected `all` or P,Q,...)"
                ));
            }
            let p = if name == "static" {
                SimPolicy::Static
            } else {
                SimPolicy::Policy(name.parse::<PolicyKind>().map_err(|_| {
                    let names: Vec<&str> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
                    format!(
                        "--policies: unknown policy `{name}` (expected `all` or a comma-separated list of static, 0..4, {})",
                        names.join(", ")
                    )
                })?)
            };
            if !policies.contains(&p) {
                policies.push(p);
            }
        }
        Ok(Self {
            policies,
            all: false,
        })
    }
}

/// The parameters of `all` that policy `k` takes.
fn params_of(
    k: PolicyKind,
    all: &[eplb_runtime::policies::Param],
) -> Vec<eplb_runtime::policies::Param> {
    all.iter()
        .filter(|(key, _)| k.params().iter().any(|i| i.name == key.as_str()))
        .cloned()
        .collect()
}

/// `policy: a, b; other: none` for the error of a `--param` that no listed policy takes.
fn takes_list(order: &[SimPolicy]) -> String {
    let parts: Vec<String> = order
        .iter()
        .filter_map(|p| match p {
            SimPolicy::Policy(k) => {
                let names: Vec<&str> = k.params().iter().map(|i| i.name).collect();
                Some(if names.is_empty() {
                    format!("{k}: none")
                } else {
                    format!("{k}: {}", names.join(", "))
                })
            }
            SimPolicy::Static => None,
        })
        .collect();
    parts.join("; ")
}

/// What `eplb report` is asked to do.
pub struct ReportJob<'a> {
    /// The trace.
    pub trace: &'a SimTrace,
    /// Its name (the trace's `name`, else the file name).
    pub trace_name: String,
    /// The model the trace names, as written there (informative).
    pub trace_model: Option<String>,
    /// Simulation settings; `policy` is replaced by each policy in turn.
    pub base: SimConfig,
    /// The policies.
    pub policies: PolicyList,
    /// `--param KEY=VALUE`: each is given to every policy of the list that takes `KEY`.
    pub params: Vec<eplb_runtime::policies::Param>,
    /// The cost model.
    pub basis: &'a CostBasis,
    /// The time model.
    pub time: &'a TimeBasis,
    /// The command line that made the page, shell-quoted.
    pub command: String,
}

/// One policy's run.
#[derive(Debug, Clone)]
pub struct Run {
    /// The policy.
    pub policy: SimPolicy,
    /// The simulator's result.
    pub result: SimResult,
    /// The cost of each cycle (`log[k-1]` to `log[k]`).
    pub costs: Vec<MoveCost>,
    /// The `simulate --json` object of this run.
    pub metrics: Value,
    /// The time model's figures of this run.
    pub time: TimeFigures,
}

impl Run {
    /// Layer-mean PAR per window.
    pub fn par_per_window(&self) -> Vec<f64> {
        layer_mean(&self.result.par, self.result.shape.layers())
    }

    /// `(cycle, window, changed)` of every activation.
    pub fn activations(&self) -> Vec<(usize, usize, bool)> {
        self.result
            .log
            .windows(2)
            .map(|p| {
                (
                    p[1].cycle,
                    p[1].active_from_window,
                    p[0].placement != p[1].placement,
                )
            })
            .collect()
    }

    /// Weight fetches (`docs/simulation.md` §5 moves) at each cycle.
    pub fn fetches_per_cycle(&self) -> Vec<usize> {
        let s = self.result.shape.slots_per_rank();
        self.result
            .log
            .windows(2)
            .map(|p| {
                if p[0].placement == p[1].placement {
                    0
                } else {
                    metrics::moves(&p[0].placement, &p[1].placement, s)
                }
            })
            .collect()
    }
}

/// The runs of a report and what the page needs besides. It holds at least the `static` run.
pub struct Report {
    /// Runs in order, `static` first (never empty).
    runs: Vec<Run>,
    /// Policies of `all` left out, with the reason.
    skipped: Vec<(String, String)>,
    trace_name: String,
    trace_model: Option<String>,
    base: SimConfig,
    basis: CostBasis,
    time: TimeBasis,
    command: String,
    /// `[T][L]` counts of the trace (for the rank loads).
    counts: Vec<u64>,
    windows: usize,
    experts: usize,
}

fn layer_mean(par: &[f64], layers: usize) -> Vec<f64> {
    par.chunks_exact(layers.max(1))
        .map(|c| c.iter().sum::<f64>() / c.len() as f64)
        .collect()
}

/// The placement live in window `w`: the last log entry active at or before it.
fn placement_at(r: &SimResult, w: usize) -> &[u16] {
    r.log
        .iter()
        .rev()
        .find(|e| e.active_from_window <= w)
        .or(r.log.first())
        .map_or(&[], |e| e.placement.as_slice())
}

/// Shows progress on stderr: a bar redrawn in place on a terminal, else one line per policy.
struct Progress {
    tty: bool,
    started: Instant,
}

impl Progress {
    fn window(&self, i: usize, n: usize, name: &str, done: usize, total: usize) {
        if self.tty {
            let width = 30;
            let filled = done * width / total.max(1);
            eprint!(
                "\r[{i}/{n}] {name:<12} [{}{}] {done}/{total} windows",
                "=".repeat(filled),
                " ".repeat(width - filled)
            );
            let _ = std::io::stderr().flush();
        }
    }

    fn finished(&self, i: usize, n: usize, name: &str, what: &str) {
        if self.tty {
            eprint!("\r\x1b[2K");
        }
        eprintln!(
            "report: [{i}/{n}] {name}: {what} ({:.1} s elapsed)",
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Runs `static` and then every other policy of `job` (progress on stderr) and collects the
/// results.
pub fn run(job: ReportJob<'_>) -> Result<Report, String> {
    let progress = Progress {
        tty: std::io::stderr().is_terminal(),
        started: Instant::now(),
    };
    let mut order = vec![SimPolicy::Static];
    for &p in &job.policies.policies {
        if !order.contains(&p) {
            order.push(p);
        }
    }
    // Each parameter goes to the policies that take it; one that no listed policy takes is an
    // error, before any run.
    for (key, _) in &job.params {
        let taken = order.iter().any(|p| match p {
            SimPolicy::Policy(k) => k.params().iter().any(|i| i.name == key.as_str()),
            SimPolicy::Static => false,
        });
        if !taken {
            return Err(format!(
                "--param {key}: no policy of --policies takes it ({})",
                takes_list(&order)
            ));
        }
    }
    for p in &order {
        if let SimPolicy::Policy(k) = *p {
            eplb_runtime::policies::policy_with(k, &params_of(k, &job.params))
                .map_err(|e| format!("--param: {e}"))?;
        }
    }
    let n = order.len();
    let mut runs = Vec::with_capacity(n);
    let mut skipped = Vec::new();
    for (i, &policy) in order.iter().enumerate() {
        let name = policy.name();
        let cfg = SimConfig {
            policy,
            ..job.base.clone()
        };
        let mut cb = |done: usize, total: usize| progress.window(i + 1, n, name, done, total);
        let own = match policy {
            SimPolicy::Policy(k) => params_of(k, &job.params),
            SimPolicy::Static => Vec::new(),
        };
        let run = match (policy, own.is_empty()) {
            (SimPolicy::Policy(k), false) => eplb_runtime::policies::policy_with(k, &own)
                .map_err(|e| format!("--param: {e}"))
                .and_then(|p| {
                    simulate_with(job.trace, &cfg, Box::new(p), &mut cb)
                        .map_err(|e| crate::words::sim_error(&e))
                }),
            _ => simulate(job.trace, &cfg, &mut cb).map_err(|e| crate::words::sim_error(&e)),
        };
        let result = match run {
            Ok(r) => r,
            // `static` failing means the options themselves are wrong: always an error.
            Err(e) if job.policies.all && policy != SimPolicy::Static => {
                progress.finished(i + 1, n, name, &format!("left out: {e}"));
                skipped.push((name.to_owned(), e));
                continue;
            }
            Err(e) => {
                if progress.tty {
                    eprintln!();
                }
                // `static` fails only on the options (shape, intervals): no policy to name.
                return Err(if policy == SimPolicy::Static {
                    e
                } else {
                    format!("policy {name}: {e}")
                });
            }
        };
        let costs = sequence_cost(
            &result.shape,
            result.log.iter().map(|e| e.placement.as_slice()),
            job.basis.payload.total_bytes(),
        )
        .map_err(|e| format!("policy {name}: {e}"))?;
        let static_ms = runs.first().map(|r: &Run| r.time.static_times());
        let time = estimate_log(
            job.trace,
            &result.shape,
            &result.log,
            &costs,
            &cfg,
            job.time,
            static_ms.as_ref(),
        )
        .map_err(|e| format!("policy {name}: {e}"))?;
        let metrics = eplb_sim::json::simulation(
            &result,
            &costs,
            job.basis,
            &time,
            job.time,
            name,
            cfg.routing,
        );
        progress.finished(
            i + 1,
            n,
            name,
            &format!("{} cycles, {} changes", result.cycles, result.changes),
        );
        runs.push(Run {
            policy,
            result,
            costs,
            metrics,
            time,
        });
    }
    Ok(Report {
        runs,
        skipped,
        trace_name: job.trace_name,
        trace_model: job.trace_model,
        base: job.base,
        basis: job.basis.clone(),
        time: job.time.clone(),
        command: job.command,
        counts: job.trace.counts.clone(),
        windows: job.trace.windows,
        experts: job.trace.experts,
    })
}

/// The worst (window, layer) of `static`, and the rank loads there before (static) and after
/// (the best policy).
#[derive(Debug, Clone, PartialEq)]
pub struct RankLoads {
    /// The window.
    pub window: usize,
    /// The layer.
    pub layer: usize,
    /// Rank loads under `static`'s placement.
    pub before: Vec<f64>,
    /// Rank loads under the best policy's placement live in that window.
    pub after: Vec<f64>,
}

impl Report {
    /// The topology line the time model assumed for this run's ranks.
    pub fn topology_line(&self) -> String {
        self.time.describe_topology(self.shape().ranks())
    }

    fn shape(&self) -> Shape {
        self.runs[0].result.shape
    }

    /// Windows `< H + A` always run on the initial placement.
    pub fn first_activation(&self) -> usize {
        (self.base.heat_interval as usize + self.base.algo_interval as usize).min(self.windows)
    }

    /// The `static` run.
    pub fn baseline(&self) -> &Run {
        &self.runs[0]
    }

    /// The policy (other than `static`, if any ran) with the lowest mean PAR from the first
    /// activation on (the mean over all windows when no window is past it); ties go to the
    /// first in order.
    pub fn best(&self) -> &Run {
        let key = |r: &Run| {
            let v = r.result.mean_par_from_first_activation;
            if v.is_finite() { v } else { r.result.mean_par }
        };
        self.runs
            .iter()
            .skip(1)
            .fold(None::<&Run>, |best, r| match best {
                Some(b) if key(b) <= key(r) => Some(b),
                _ => Some(r),
            })
            .unwrap_or(&self.runs[0])
    }

    /// The policy (not `static`) with the largest net estimated saving against `static`
    /// (`est_net_saving_pct`), the first in order on ties; `None` when no policy other than
    /// `static` ran or none has a finite saving (no plan became active).
    pub fn time_best(&self) -> Option<&Run> {
        self.runs
            .iter()
            .skip(1)
            .filter(|r| r.time.net_saving_pct().is_finite())
            .fold(None::<&Run>, |best, r| match best {
                Some(b) if b.time.net_saving_pct() >= r.time.net_saving_pct() => Some(b),
                _ => Some(r),
            })
    }

    /// The page's one-sentence verdict: which policy saves most, by how much, net of its
    /// moves, or that none pays.
    pub fn time_verdict(&self) -> String {
        let tm = &self.time.model;
        let setting = format!(
            "{} on {}, {}, {} tokens per rank per iteration",
            tm.model.name,
            tm.hardware.name,
            self.time.role.name(),
            tm.tokens_per_rank
        );
        let first = self.first_activation();
        match self.time_best() {
            None if self.runs.len() < 2 => format!(
                "Only static ran, so there is no saving to estimate (time model: {setting})."
            ),
            None => format!(
                "No placement became active within the trace (first possible activation: window {first}), so no policy's saving can be estimated (time model: {setting})."
            ),
            Some(r) => {
                let t = &r.time;
                let pct = t.net_saving_pct();
                let (lo, hi) = t.net_saving_band_pct();
                let verdict = eplb_sim::advise::Verdict::of(lo, hi).name();
                if pct > 0.0 {
                    format!(
                        "{} saves most: {:.1}% of the estimated step (band {:.1}% to {:.1}%; verdict {verdict}) net of its moves ({:.3} ms per step instead of {:.3} ms under static from window {first}, stalls {:.2} ms per cycle at most; time model: {setting}).",
                        r.policy.name(),
                        pct,
                        lo,
                        hi,
                        t.mean_ms(),
                        t.static_mean_ms(),
                        t.stall_max_ms()
                    )
                } else {
                    format!(
                        "No policy pays: the best, {}, is {:.1}% of the estimated step slower than static net of its moves (band {:.1}% to {:.1}% saving; verdict {verdict}; {:.3} ms per step plus {:.2} ms of stalls in all, against {:.3} ms; time model: {setting}).",
                        r.policy.name(),
                        -pct,
                        lo,
                        hi,
                        t.mean_ms(),
                        t.stall_total_ms(),
                        t.static_mean_ms()
                    )
                }
            }
        }
    }

    /// The worst layer at the worst window of `static` (windows from the first activation on
    /// when there are any): the window of the largest layer-mean PAR, then its largest layer.
    pub fn rank_loads(&self) -> Result<RankLoads, String> {
        let shape = self.shape();
        let (l, n) = (shape.layers(), self.experts);
        let base = &self.baseline().result;
        let means = layer_mean(&base.par, l);
        let from = if self.first_activation() < self.windows {
            self.first_activation()
        } else {
            0
        };
        let argmax = |v: &[f64], off: usize| -> usize {
            v.iter()
                .enumerate()
                .fold((off, f64::MIN), |(bi, bv), (i, &x)| {
                    if x > bv { (i + off, x) } else { (bi, bv) }
                })
                .0
        };
        let window = argmax(means.get(from..).unwrap_or(&[]), from);
        let layer = argmax(base.par.get(window * l..(window + 1) * l).unwrap_or(&[]), 0);
        let loads: Vec<f64> = self
            .counts
            .get((window * l + layer) * n..(window * l + layer + 1) * n)
            .ok_or("the trace is shorter than its windows")?
            .iter()
            .map(|&c| c as f64)
            .collect();
        let mut scratch = vec![0u32; metrics::scratch_len(&shape)];
        let mut at = |r: &SimResult| -> Result<Vec<f64>, String> {
            let placement = placement_at(r, window);
            let mut out = vec![0.0; shape.ranks()];
            if placement.contains(&eplb_core::EMPTY) {
                // After a membership event: a rank whose row is all EMPTY serves nothing.
                let (per, s) = (shape.slots_per_layer(), shape.slots_per_rank());
                let rows = placement
                    .get(layer * per..(layer + 1) * per)
                    .ok_or("the placement is shorter than its layers")?;
                let flags: Vec<bool> = rows
                    .chunks_exact(s)
                    .map(|row| row.iter().any(|&e| e != eplb_core::EMPTY))
                    .collect();
                let live = eplb_core::LiveSet::from_flags(&flags).map_err(|e| e.to_string())?;
                let lp = eplb_core::LayerPlacement::with_live(shape, layer, rows, &live)
                    .map_err(|e| e.to_string())?;
                metrics::rank_loads(&lp, &loads, self.base.routing, &mut scratch, &mut out)
                    .map_err(|e| e.to_string())?;
            } else {
                let p = Placement::new(shape, placement).map_err(|e| e.to_string())?;
                let lp = p.try_layer(layer).map_err(|e| e.to_string())?;
                metrics::rank_loads(&lp, &loads, self.base.routing, &mut scratch, &mut out)
                    .map_err(|e| e.to_string())?;
            }
            Ok(out)
        };
        Ok(RankLoads {
            window,
            layer,
            before: at(base)?,
            after: at(&self.best().result)?,
        })
    }

    /// The data behind the charts and the table, as embedded in the page:
    /// `{"format": "eplb-report/v1", "command", "trace", "model", "routing", "heat_interval",
    /// "algo_interval", "windows", "layers", "ranks", "slots_per_rank", "experts",
    /// "first_activation", "lower_bound_per_window", "policies": [{"policy", "metrics" (the
    /// `simulate --json` object), "par_per_window", "activations": [{"cycle", "window",
    /// "changed"}], "fetches_per_cycle", "bytes_per_cycle", "transfer_ms_per_cycle"}],
    /// "skipped": [{"policy", "reason"}], "best_policy", "heatmap": [{"policy", "par"
    /// ([T][L])}], "rank_loads": {"window", "layer", "before": {"policy", "loads", "par"},
    /// "after": {...}}}`.
    pub fn data(&self) -> Result<Value, String> {
        let shape = self.shape();
        let l = shape.layers();
        let link = &self.basis.link;
        let policies: Vec<Value> = self
            .runs
            .iter()
            .map(|r| {
                json!({
                    "policy": r.policy.name(),
                    "metrics": r.metrics,
                    "par_per_window": r.par_per_window(),
                    "activations": r.activations().iter().map(|&(c, w, ch)| json!({
                        "cycle": c, "window": w, "changed": ch,
                    })).collect::<Vec<_>>(),
                    "fetches_per_cycle": r.fetches_per_cycle(),
                    "bytes_per_cycle": r.costs.iter().map(MoveCost::bytes_moved).collect::<Vec<_>>(),
                    "transfer_ms_per_cycle": r.costs.iter().map(|c| c.transfer_ms(link)).collect::<Vec<_>>(),
                    "est_moe_ms_per_window": r.time.moe_per_window_ms,
                    "est_step_ms_per_window": r.time.per_window_ms,
                    "est_stalls": r.time.stalls.iter().map(|c| json!({
                        "cycle": c.cycle, "window": c.window, "changed_layers": c.changed_layers, "ms": c.ms,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let nest = |par: &[f64]| -> Vec<Vec<f64>> {
            par.chunks_exact(l.max(1)).map(<[f64]>::to_vec).collect()
        };
        let (base, best) = (self.baseline(), self.best());
        let rl = self.rank_loads()?;
        let heatmap: Vec<Value> = [base, best]
            .iter()
            .map(|r| json!({"policy": r.policy.name(), "par": nest(&r.result.par)}))
            .collect();
        Ok(json!({
            "format": "eplb-report/v1",
            "command": self.command,
            "trace": self.trace_name,
            "model": self.trace_model,
            "routing": match self.base.routing {
                Routing::Log2Phy => "log2phy",
                Routing::Even => "even",
            },
            "heat_interval": self.base.heat_interval,
            "algo_interval": self.base.algo_interval,
            "windows": self.windows,
            "layers": l,
            "ranks": shape.ranks(),
            "slots_per_rank": shape.slots_per_rank(),
            "experts": shape.experts(),
            "first_activation": self.first_activation(),
            "lower_bound_per_window": layer_mean(&base.result.lower_bound, l),
            "policies": policies,
            "skipped": self.skipped.iter().map(|(p, why)| json!({"policy": p, "reason": why})).collect::<Vec<_>>(),
            "best_policy": best.policy.name(),
            "time_model": self.time.to_json(),
            "topology": self.time.topology_json(Some(self.shape().ranks())),
            "time_verdict": self.time_verdict(),
            "time_best_policy": self.time_best().map(|r| r.policy.name()),
            "heatmap": heatmap,
            "rank_loads": {
                "window": rl.window,
                "layer": rl.layer,
                "before": {"policy": base.policy.name(), "loads": rl.before, "par": metrics::par(&rl.before)},
                "after": {"policy": best.policy.name(), "loads": rl.after, "par": metrics::par(&rl.after)},
            },
        }))
    }
}

/// `args` quoted for a POSIX shell: words of safe characters as they are, others in single
/// quotes.
pub fn shell_quote<S: AsRef<str>>(args: &[S]) -> String {
    args.iter()
        .map(|a| {
            let a = a.as_ref();
            let safe = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
            if safe {
                a.to_owned()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The SVG of `eplb hotness --svg`: the load of every rank in every layer of one placement,
/// relative to the layer's mean rank load, as a heat map (layers x ranks).
pub fn hotness_svg(
    placement: &Placement<'_>,
    loads: &[f64],
    routing: Routing,
    title: &str,
) -> Result<String, String> {
    let shape = *placement.shape();
    let (l, r) = (shape.layers(), shape.ranks());
    let mut scratch = vec![0u32; metrics::scratch_len(&shape)];
    let mut rel = Vec::with_capacity(l * r);
    let mut buf = vec![0.0; r];
    for (layer, w) in placement.layers().zip(loads.chunks_exact(shape.experts())) {
        metrics::rank_loads(&layer, w, routing, &mut scratch, &mut buf)
            .map_err(|e| e.to_string())?;
        let mean = buf.iter().sum::<f64>() / r as f64;
        rel.extend(buf.iter().map(|&x| if mean > 0.0 { x / mean } else { 1.0 }));
    }
    charts::heatmap(
        &[charts::HeatPanel {
            title: title.to_owned(),
            values: &rel,
        }],
        &charts::HeatAxes {
            caption: "Rank load per layer (relative to the layer's mean rank load)",
            cols: r,
            col_width: 1,
            rows: l,
            x_desc: "rank",
            y_desc: "layer",
            scale_desc: "rank load / mean",
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(
            shell_quote(&["eplb", "report", "--out", "a b.html", "it's", ""]),
            r"eplb report --out 'a b.html' 'it'\''s' ''"
        );
    }

    #[test]
    fn policy_lists() {
        let all = PolicyList::parse("all").unwrap();
        assert!(all.all);
        assert_eq!(all.policies.len(), 1 + PolicyKind::ALL.len());
        let some = PolicyList::parse("deepseek, 1,deepseek").unwrap();
        assert_eq!(
            some.policies,
            [
                SimPolicy::Static,
                SimPolicy::Policy(PolicyKind::DeepSeek),
                SimPolicy::Policy("1".parse().unwrap())
            ]
        );
        for bad in ["", "deepseek,", "nope", "static,,swift"] {
            assert!(PolicyList::parse(bad).is_err(), "{bad}");
        }
    }
}
