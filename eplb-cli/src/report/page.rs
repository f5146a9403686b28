//! The HTML page of `eplb report`: well-formed (XHTML-compatible) markup, inline CSS, inline SVG,
//! no script that runs, every text escaped.

use std::fmt::Write as _;

use eplb_sim::time::fixed;
use serde_json::Value;

use super::charts::{self, FetchSeries, HeatAxes, HeatPanel, ParSeries, TimeSeries};
use super::{Report, Run};
use eplb_sim::cost::{human_bytes, human_ms};

/// `s` escaped for HTML text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// JSON that is safe inside a `<script>` element: `<`, `>` and `&` (which JSON only has
/// inside strings) as `\u` escapes.
fn script_json(v: &Value) -> Result<String, String> {
    let s = serde_json::to_string(v).map_err(|e| e.to_string())?;
    Ok(s.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026"))
}

/// The `simulate --json` keys of the summary table, in this order; any other numeric key
/// follows in name order.
const TABLE_KEYS: [&str; 21] = [
    "mean_par",
    "p99_par",
    "max_par",
    "mean_par_from_first_activation",
    "p99_par_from_first_activation",
    "lower_bound_mean_par",
    "other_routing_mean_par",
    "cycles",
    "changes",
    "moves_total",
    "moves_per_change",
    "moves_per_change_fraction",
    "slot_writes_total",
    "same_rank_duplicate_rows_max",
    "bytes_moved_total",
    "bytes_per_cycle_mean",
    "transfer_ms_per_cycle_mean",
    "transfer_ms_per_cycle_max",
    "policy_time_ms_mean",
    "policy_time_ms_max",
    "failed_layers",
];

/// A table cell: integers as they are, other numbers with 4 decimals, null as `n/a`.
fn cell(v: Option<&Value>) -> String {
    match v {
        Some(Value::Number(n)) if n.is_u64() || n.is_i64() => n.to_string(),
        // `+ 0.0` shows a negative zero as 0.
        Some(Value::Number(n)) => n
            .as_f64()
            .map_or("n/a".into(), |f| format!("{:.4}", f + 0.0)),
        _ => "n/a".into(),
    }
}

fn summary_table(runs: &[Run]) -> String {
    let mut keys: Vec<String> = TABLE_KEYS.iter().map(|k| (*k).to_owned()).collect();
    let mut extra: Vec<String> = runs
        .iter()
        .filter_map(|r| r.metrics.as_object())
        .flat_map(|o| o.iter())
        .filter(|(k, v)| (v.is_number() || v.is_null()) && !TABLE_KEYS.contains(&k.as_str()))
        .map(|(k, _)| k.clone())
        .collect();
    extra.sort();
    extra.dedup();
    keys.extend(extra);
    let mut t = String::from("<table class=\"summary\">\n<thead><tr><th>metric</th>");
    for r in runs {
        let _ = write!(t, "<th>{}</th>", esc(r.policy.name()));
    }
    t.push_str("</tr></thead>\n<tbody>\n");
    for k in &keys {
        let _ = write!(t, "<tr><td><code>{}</code></td>", esc(k));
        for r in runs {
            let _ = write!(t, "<td>{}</td>", esc(&cell(r.metrics.get(k))));
        }
        t.push_str("</tr>\n");
    }
    t.push_str("</tbody>\n</table>\n");
    t
}

const STYLE: &str = "
body { font-family: sans-serif; color: #222; margin: 24px auto; max-width: 1320px; padding: 0 10px; }
h1 { font-size: 26px; margin-bottom: 4px; }
h2 { font-size: 20px; margin-top: 34px; border-bottom: 1px solid #ccc; padding-bottom: 4px; }
p, li { font-size: 15px; line-height: 1.45; }
.facts { color: #444; }
figure { margin: 8px 0; }
svg { max-width: 100%; height: auto; display: block; }
table.summary { border-collapse: collapse; font-size: 14px; }
table.summary th, table.summary td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
table.summary td:first-child, table.summary th:first-child { text-align: left; }
table.summary tbody tr:nth-child(odd) { background: #f6f6f6; }
pre.command { background: #f3f3f3; padding: 10px; white-space: pre-wrap; word-break: break-all; font-size: 13px; }
.note { background: #fff6d6; border: 1px solid #e5d28a; padding: 6px 10px; }
.verdict { font-size: 17px; font-weight: bold; background: #eef5ff; border-left: 4px solid #1f77b4; padding: 8px 12px; }
";

/// The whole page.
pub fn render(rep: &Report) -> Result<String, String> {
    let data = rep.data()?;
    let shape = rep.shape();
    let (t, l) = (rep.windows, shape.layers());
    let first = rep.first_activation();
    let link = &rep.basis.link;
    let base = rep.baseline();
    let best = rep.best();
    let colors: Vec<_> = rep
        .runs
        .iter()
        .enumerate()
        .map(|(i, r)| charts::policy_color(r.policy.name(), i.saturating_sub(1)))
        .collect();

    // 1. PAR per window.
    let means: Vec<Vec<f64>> = rep.runs.iter().map(Run::par_per_window).collect();
    let acts: Vec<Vec<usize>> = rep
        .runs
        .iter()
        .map(|r| {
            r.activations()
                .into_iter()
                .filter(|a| a.2)
                .map(|a| a.1)
                .collect()
        })
        .collect();
    let series: Vec<ParSeries<'_>> = rep
        .runs
        .iter()
        .enumerate()
        .map(|(i, r)| ParSeries {
            name: r.policy.name(),
            color: colors[i],
            values: &means[i],
            activations: &acts[i],
        })
        .collect();
    let lower = super::layer_mean(&base.result.lower_bound, l);
    // Membership events (`--fail-rank`, `--join-rank`): the same in every run.
    let events: Vec<(usize, String)> = base
        .result
        .membership
        .iter()
        .map(|o| {
            let verb = match o.event.kind {
                eplb_sim::MemberKind::Fail => "fails",
                eplb_sim::MemberKind::Join => "joins",
            };
            (o.event.window, format!("rank {} {verb}", o.event.rank))
        })
        .collect();
    let par_svg = charts::par_lines(&series, &lower, first, &events)?;

    // 1b. Estimated MoE time per window, with each cycle's stall.
    let stalls: Vec<Vec<(usize, f64)>> = rep
        .runs
        .iter()
        .map(|r| {
            r.time
                .stalls
                .iter()
                .filter(|c| c.changed_layers > 0)
                .map(|c| (c.window, c.ms))
                .collect()
        })
        .collect();
    let time_series: Vec<TimeSeries<'_>> = rep
        .runs
        .iter()
        .enumerate()
        .map(|(i, r)| TimeSeries {
            // `n/a` where the trace has no window after the first activation.
            label: if i == 0 {
                format!(
                    "{}: {} ms MoE ({} ms per step)",
                    r.policy.name(),
                    fixed(r.time.static_moe_mean_ms(), 3),
                    fixed(r.time.static_mean_ms(), 3)
                )
            } else {
                let pct = r.time.net_saving_pct();
                format!(
                    "{}: {} ms MoE ({} ms per step), stalls {} ms in all (at most {} ms per cycle), net saving {}% of the step",
                    r.policy.name(),
                    fixed(r.time.moe_mean_ms(), 3),
                    fixed(r.time.mean_ms(), 3),
                    fixed(r.time.stall_total_ms(), 1),
                    fixed(r.time.stall_max_ms(), 1),
                    if pct.is_finite() {
                        format!("{pct:+.1}")
                    } else {
                        "n/a".to_owned()
                    }
                )
            },
            color: colors[i],
            values: &r.time.moe_per_window_ms,
            stalls: &stalls[i],
        })
        .collect();
    let time_svg = charts::time_lines(&time_series, first, &events)?;

    // 2. Fetches per cycle (static fetches nothing and is left out).
    let fetches: Vec<Vec<usize>> = rep.runs.iter().map(Run::fetches_per_cycle).collect();
    let mut fetch_series = Vec::new();
    let mut totals = String::from("<ul>\n");
    for (i, r) in rep.runs.iter().enumerate() {
        let bytes: u64 = r.costs.iter().map(|c| c.bytes_moved()).sum();
        let ms = r.costs.iter().map(|c| c.transfer_ms(link)).sum::<f64>() + 0.0;
        let n: usize = fetches[i].iter().sum();
        let line = format!(
            "{}: {} fetches, {} in all, {} of transfers on {}",
            r.policy.name(),
            n,
            human_bytes(bytes),
            human_ms(ms),
            link.name()
        );
        let _ = writeln!(totals, "<li>{}</li>", esc(&line));
        if i > 0 {
            fetch_series.push(FetchSeries {
                label: line,
                color: colors[i],
                fetches: &fetches[i],
            });
        }
    }
    totals.push_str("</ul>\n");
    let cycles = rep.runs.iter().map(|r| r.result.cycles).max().unwrap_or(0);
    let fetch_svg = charts::fetch_bars(&fetch_series, cycles)?;

    // 3. Per-layer PAR heat map: static next to the best policy. A long trace is drawn with
    // windows averaged into at most HEAT_COLS columns (the data block keeps every window).
    let bin = t.div_ceil(HEAT_COLS).max(1);
    let cols = t.div_ceil(bin);
    let caption = if bin > 1 {
        format!("Per-layer PAR (layers x windows, mean of each {bin} windows), one colour scale")
    } else {
        "Per-layer PAR (layers x windows), one colour scale".to_owned()
    };
    let heat_svg = charts::heatmap(
        &[
            HeatPanel {
                title: format!("{} (before)", base.policy.name()),
                values: &binned(&transpose(&base.result.par, t, l), t, bin),
            },
            HeatPanel {
                title: format!("{} (best mean PAR from window {first})", best.policy.name()),
                values: &binned(&transpose(&best.result.par, t, l), t, bin),
            },
        ],
        &HeatAxes {
            caption: &caption,
            cols,
            col_width: bin,
            rows: l,
            x_desc: "window",
            y_desc: "layer",
            scale_desc: "PAR",
        },
    )?;

    // 4. Rank loads of the worst layer at the worst window.
    let rl = rep.rank_loads()?;
    let rank_svg = charts::rank_bars(
        &format!(
            "Rank loads of layer {} in window {} (the worst of static)",
            rl.layer, rl.window
        ),
        (
            &format!(
                "before: {} (PAR {:.4})",
                base.policy.name(),
                eplb_core::metrics::par(&rl.before)
            ),
            colors[0],
            &rl.before,
        ),
        (
            &format!(
                "after: {} (PAR {:.4})",
                best.policy.name(),
                eplb_core::metrics::par(&rl.after)
            ),
            colors[rep
                .runs
                .iter()
                .position(|r| r.policy == best.policy)
                .unwrap_or(0)],
            &rl.after,
        ),
    )?;

    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n");
    let _ = writeln!(
        h,
        "<title>{}</title>",
        esc(&format!("eplb report: {}", rep.trace_name))
    );
    let _ = writeln!(h, "<style>{STYLE}</style>\n</head>\n<body>");
    let _ = writeln!(
        h,
        "<h1>{}</h1>",
        esc(&format!("eplb report: {}", rep.trace_name))
    );
    let _ = writeln!(
        h,
        "<p class=\"verdict\" id=\"time-verdict\">{}</p>",
        esc(&rep.time_verdict())
    );
    let facts = format!(
        "{} windows x {} layers x {} experts; EP{} ranks, {} slots per rank, {} redundant; routing {}; heat {} windows, plan active {} windows later (first possible activation: window {}); initial placement {:?}; seed {}.",
        t,
        l,
        shape.experts(),
        shape.ranks(),
        shape.slots_per_rank(),
        shape.redundant(),
        data["routing"].as_str().unwrap_or(""),
        rep.base.heat_interval,
        rep.base.algo_interval,
        first,
        rep.base.initial,
        rep.base.seed,
    );
    let _ = writeln!(h, "<p class=\"facts\">{}</p>", esc(&facts));
    if let Some(m) = &rep.trace_model {
        let _ = writeln!(
            h,
            "<p class=\"facts\">{}</p>",
            esc(&format!("Trace model: {m}."))
        );
    }
    let _ = writeln!(h, "<p class=\"facts\">{}</p>", esc(&rep.basis.describe()));
    let _ = writeln!(h, "<p class=\"facts\">{}</p>", esc(&rep.time.describe()));
    let _ = writeln!(h, "<p class=\"facts\">{}</p>", esc(&rep.topology_line()));
    if first >= t {
        let _ = writeln!(
            h,
            "<p class=\"note\">{}</p>",
            esc(&format!(
                "The trace has {t} window(s), and a plan is active at window H + A = {first} at the earliest: no plan ever became active, so every policy shows the initial placement. Use a trace with more windows to see rebalancing."
            ))
        );
    }
    for (p, why) in &rep.skipped {
        let _ = writeln!(
            h,
            "<p class=\"note\">{}</p>",
            esc(&format!("Policy {p} was left out: {why}"))
        );
    }
    h.push_str("<h2>Estimated MoE time per iteration</h2>\n");
    let _ = writeln!(
        h,
        "<p>{}</p>",
        esc(
            "The time model's MoE time of one iteration (every MoE layer: the slowest rank's compute or weight reads, plus dispatch and combine) under the placement live in each window, one window standing for one iteration; a circle marks a cycle that changed the placement, at the window its placement became active, its area growing with the cycle's stall (the digest, one vote per changed layer and each layer's exchange beyond one iteration). The legend gives each policy's mean from the first possible activation, its stalls in all and its net saving against static."
        )
    );
    let _ = writeln!(h, "<figure id=\"chart-time\">{time_svg}</figure>");
    h.push_str("<h2>PAR per window</h2>\n");
    h.push_str("<p>The peak-to-average ratio of rank loads, averaged over layers, for each policy; the dashed black line is the lower bound no placement can beat; a triangle marks a window where a new placement became active.</p>\n");
    let _ = writeln!(h, "<figure id=\"chart-par\">{par_svg}</figure>");
    h.push_str("<h2>Weight fetches per cycle</h2>\n");
    let _ = writeln!(
        h,
        "<p>{}</p>",
        esc(&format!(
            "Expert copies some rank must fetch at each cycle (docs/simulation.md, moves), with the bytes and the transfer time of the cost model ({} per expert; per layer the busiest rank's link, layers one after another). static never fetches.",
            human_bytes(rep.basis.payload.total_bytes() as u64)
        ))
    );
    let _ = writeln!(h, "<figure id=\"chart-fetches\">{fetch_svg}</figure>");
    h.push_str(&totals);
    h.push_str("<h2>Per-layer PAR</h2>\n");
    let _ = writeln!(
        h,
        "<p>{}</p>",
        esc(&format!(
            "PAR of every layer in every window: static on the left, {} (the lowest mean PAR from window {first} on) on the right.",
            best.policy.name()
        ))
    );
    let _ = writeln!(h, "<figure id=\"chart-heatmap\">{heat_svg}</figure>");
    h.push_str("<h2>Rank loads, before and after</h2>\n");
    let _ = writeln!(
        h,
        "<p>{}</p>",
        esc(&format!(
            "The layer and window where static is worst (windows from {} on): tokens per rank under static's placement and under {}'s placement live in that window.",
            if first < t { first } else { 0 },
            best.policy.name()
        ))
    );
    let _ = writeln!(h, "<figure id=\"chart-rank-loads\">{rank_svg}</figure>");
    h.push_str("<h2>Summary</h2>\n<p>The numbers of <code>eplb simulate --json</code> for each policy (4 decimals).</p>\n");
    h.push_str(&summary_table(&rep.runs));
    h.push_str("<h2>Command</h2>\n");
    let _ = writeln!(h, "<pre class=\"command\">{}</pre>", esc(&rep.command));
    let _ = writeln!(
        h,
        "<script type=\"application/json\" id=\"eplb-report-data\">{}</script>",
        script_json(&data)?
    );
    h.push_str("</body>\n</html>\n");
    Ok(h)
}

/// The most heat-map columns drawn; longer traces are averaged into bins of windows.
const HEAT_COLS: usize = 300;

/// Rows of `t` values to rows of `t.div_ceil(bin)` bin means.
fn binned(rows: &[f64], t: usize, bin: usize) -> Vec<f64> {
    if bin <= 1 || t == 0 {
        return rows.to_vec();
    }
    rows.chunks_exact(t)
        .flat_map(|row| {
            row.chunks(bin)
                .map(|c| c.iter().sum::<f64>() / c.len() as f64)
        })
        .collect()
}

/// `[T][L]` to `[L][T]` (rows = layers for the heat map).
fn transpose(par: &[f64], t: usize, l: usize) -> Vec<f64> {
    let mut out = vec![f64::NAN; t * l];
    for w in 0..t {
        for layer in 0..l {
            if let (Some(o), Some(&v)) = (out.get_mut(layer * t + w), par.get(w * l + layer)) {
                *o = v;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heat_map_rows() {
        // [T=2][L=3] to [L][T].
        assert_eq!(
            transpose(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3),
            [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
        // Two rows of 5 windows in bins of 2 (the last bin is short).
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0];
        assert_eq!(binned(&rows, 5, 2), [1.5, 3.5, 5.0, 15.0, 35.0, 50.0]);
        assert_eq!(binned(&rows, 5, 1), rows);
    }

    #[test]
    fn escapes() {
        assert_eq!(
            esc("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
        let v = serde_json::json!({"c": "</script><b>&"});
        let s = script_json(&v).unwrap();
        assert!(!s.contains('<') && !s.contains('&'));
        assert_eq!(serde_json::from_str::<Value>(&s).unwrap(), v);
    }
}
