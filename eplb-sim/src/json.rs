//! The machine-readable results: the `simulate --json` object and the `eplb-placements/v1` log.
//!
//! The keys are a contract (`DESIGN.md`, "The command-line tool"): add, never rename.

use eplb_core::metrics::Routing;
use serde_json::{Value, json};

use crate::cost::{CostBasis, MoveCost};
use crate::simulate::SimResult;
use crate::time::{TimeBasis, TimeFigures};

/// Bytes moved over all cycles, their mean per cycle, and the mean transfer time per cycle at
/// the link (cycles that change nothing count as zero).
pub fn sim_cost(costs: &[MoveCost], basis: &CostBasis) -> (u64, f64, f64) {
    let total: u64 = costs.iter().map(MoveCost::bytes_moved).sum();
    // `+ 0.0`: an empty float sum is -0.0.
    let ms = costs
        .iter()
        .map(|c| c.transfer_ms(&basis.link))
        .sum::<f64>()
        + 0.0;
    let n = costs.len().max(1) as f64;
    (total, total as f64 / n, ms / n)
}

/// The cost keys of `simulate --json`.
fn add_sim_cost(v: &mut Value, costs: &[MoveCost], basis: &CostBasis) {
    let (total, per_cycle, ms) = sim_cost(costs, basis);
    v["bytes_moved_total"] = json!(total);
    v["bytes_per_cycle_mean"] = json!(per_cycle);
    v["transfer_ms_per_cycle_mean"] = json!(ms);
    v["transfer_ms_per_cycle_max"] = json!(
        costs
            .iter()
            .map(|c| c.transfer_ms(&basis.link))
            .fold(0.0, f64::max)
    );
    v["payload"] = basis.payload_json();
    v["link"] = basis.link.to_json();
}

/// The metric keys of the `simulate --json` object ([`simulation`] adds the rest).
pub fn sim_json(r: &SimResult, policy: &str, routing: Routing) -> Value {
    let slots = r.shape.placement_len() as f64;
    json!({
        "policy": policy,
        "routing": routing.name(),
        "mean_par": r.mean_par,
        "p99_par": r.p99_par,
        "max_par": r.max_par,
        "mean_par_from_first_activation": r.mean_par_from_first_activation,
        "p99_par_from_first_activation": r.p99_par_from_first_activation,
        "changes": r.changes,
        "moves_total": r.moves_total,
        "moves_per_change": r.moves_per_change(),
        "moves_per_change_fraction": r.moves_per_change() / slots,
        "slot_writes_total": r.slot_writes_total,
        "same_rank_duplicate_rows_max": r.same_rank_duplicate_rows_max,
        "policy_time_ms_mean": r.policy_time_ms_mean,
        "policy_time_ms_max": r.policy_time_ms_max,
        "cycles": r.cycles,
        "other_routing_mean_par": r.other_routing_mean_par,
        "lower_bound_mean_par": r.lower_bound_mean_par,
        "failed_layers": r.failed_layers,
        "plan_failures": r.plan_failures,
    })
}

/// The membership keys of `simulate --json` (`docs/cli.md`): `membership_events` (one object
/// per `--fail-rank`/`--join-rank` event) and the totals `reload_copies_total`,
/// `reload_bytes_total`, `unserved_tokens_total`. `expert_bytes` is one expert's payload,
/// `reload_bytes_per_s` the rate a rank reads it back from host memory
/// ([`crate::time::DEFAULT_RELOAD_BYTES_PER_S`]); a rank reloads its copies one after another,
/// the ranks in parallel, so `reload_ms` is the busiest rank's bytes over the rate.
fn add_membership(v: &mut Value, r: &SimResult, expert_bytes: u64, reload_bytes_per_s: f64) {
    let finite = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
    let events: Vec<Value> = r
        .membership
        .iter()
        .map(|o| {
            json!({
                "window": o.event.window,
                "rank": o.event.rank,
                "kind": o.event.kind.name(),
                "live_ranks": o.live_ranks,
                "lost_experts": o.lost_experts,
                "unserved_tokens": o.unserved_tokens,
                "reload_copies": o.reload_copies,
                "reload_bytes": o.reload_copies.saturating_mul(expert_bytes),
                "reload_ms": o.reload_copies_max_rank as f64 * expert_bytes as f64
                    / reload_bytes_per_s * 1e3,
                "par_before_event": finite(o.par_before_event),
                "par_window_after": finite(o.par_window_after),
                "recovered_at_window": o.recovered_at_window,
            })
        })
        .collect();
    v["membership_events"] = json!(events);
    v["reload_copies_total"] = json!(r.reload_copies_total());
    v["reload_bytes_total"] = json!(r.reload_copies_total().saturating_mul(expert_bytes));
    v["reload_bytes_per_s"] = json!(reload_bytes_per_s);
    v["unserved_tokens_total"] = json!(r.unserved_tokens_total());
}

/// The `eplb-placements/v1` log of a run (`SIMULATION.md` §7): every placement the run served,
/// with the cycle, the first window it served and the heat windows it was planned from.
/// `case` names the trace.
pub fn placements_log(r: &SimResult, policy: &str, case: Option<&str>) -> Value {
    let s = r.shape;
    let nest = |p: &[u16]| -> Value {
        p.chunks_exact(s.slots_per_layer())
            .map(|layer| {
                layer
                    .chunks_exact(s.slots_per_rank())
                    .map(|row| row.to_vec())
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .into()
    };
    let entries: Vec<serde_json::Value> = r
        .log
        .iter()
        .map(|e| {
            let mut v = json!({
                "cycle": e.cycle,
                "active_from_window": e.active_from_window,
                "placement": nest(&e.placement),
            });
            if let Some((a, b)) = e.heat_windows {
                v["heat_windows"] = json!([a, b]);
            }
            if let Some(t) = e.policy_time_s {
                v["policy_time_s"] = json!(t);
            }
            v
        })
        .collect();
    let mut doc = json!({
        "format": "eplb-placements/v1",
        "policy": policy,
        "num_layers": s.layers(),
        "num_ranks": s.ranks(),
        "slots_per_rank": s.slots_per_rank(),
        "num_experts": s.experts(),
        "entries": entries,
    });
    if let Some(c) = case {
        doc["case"] = json!(c);
    }
    doc
}

/// The `simulate --json` object of one run (`docs/cli.md`): the metrics of `result`
/// ([`sim_json`]), the cost of its changes (`costs`, priced at `basis`), the time model's
/// estimate (`figures` at `time`: the `est_*` keys and `time_model`) and the membership keys.
/// The one recipe of `eplb simulate --json`, the runs of `eplb report` and Python's
/// `eplb.simulate`.
pub fn simulation(
    result: &SimResult,
    costs: &[MoveCost],
    basis: &CostBasis,
    figures: &TimeFigures,
    time: &TimeBasis,
    policy: &str,
    routing: Routing,
) -> Value {
    let mut v = sim_json(result, policy, routing);
    add_sim_cost(&mut v, costs, basis);
    figures.add_json(&mut v, time);
    add_membership(
        &mut v,
        result,
        basis.payload.total_bytes() as u64,
        time.reload_bytes_per_s,
    );
    v
}

/// Writes the `eplb-placements/v1` log of `run` to `path`, atomically
/// ([`eplb_runtime::fsio::write_atomic`]).
pub fn write_placements_log(
    path: &std::path::Path,
    r: &SimResult,
    policy: &str,
    case: Option<&str>,
) -> Result<(), crate::SimError> {
    let file_err = |why: String| crate::SimError::File {
        path: path.display().to_string(),
        why,
    };
    let text = serde_json::to_string(&placements_log(r, policy, case))
        .map_err(|e| file_err(e.to_string()))?;
    eplb_runtime::fsio::write_atomic(path, text.as_bytes()).map_err(|e| file_err(e.to_string()))
}
