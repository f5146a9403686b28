//! `eplb simulate --metrics-out`: the Prometheus metrics the runtime would have exported over a
//! replay ([`eplb_runtime::metrics`]), in the text exposition format, so that the dashboard
//! (`docs/grafana-eplb.json`) can be tried on a trace.
//!
//! Per cycle of the placements log: the balancedness and PAR before and after the plan under
//! the cycle's heat (the windows it gathered, summed; even split over copies, as the planner
//! computes them), the policy's measured time, and per changed layer the expert copies and
//! bytes moved. A replay has no serving clock: `eplb_walk_duration_seconds` stays empty, and
//! the planner histogram holds this machine's policy wall times (the only numbers that differ
//! between two runs).

use std::time::Duration;

use eplb_core::metrics::{Routing, layer_par, scratch_len};
use eplb_core::{LayerPlacement, Placement};
use eplb_runtime::metrics::{Failures, Metrics, MetricsSettings, PlanSample, layer_copies_moved};
use eplb_runtime::rank::Health;
use prometheus_client::registry::Registry;

use crate::{SimResult, SimTrace};

/// The exposition (Prometheus text format 0.0.4) of the metrics the runtime would have
/// exported over `result`, a replay of `trace`; an expert copy weighs `expert_bytes`.
pub fn replay_metrics(
    trace: &SimTrace,
    result: &SimResult,
    expert_bytes: u64,
    settings: &MetricsSettings,
) -> Result<String, crate::SimError> {
    let shape = result.shape;
    let (l, n) = (shape.layers(), shape.experts());
    let ln = l * n;
    let mut registry = Registry::default();
    let m = Metrics::register(&mut registry, settings, l);
    m.record_health(Health::Running);
    let mut scratch = vec![0u32; scratch_len(&shape)];
    let mut rank_buf = vec![0.0f64; shape.ranks()];
    let mut loads = vec![0.0f64; ln];
    let (mut before, mut after) = (vec![0.0; l], vec![0.0; l]);
    let per = shape.slots_per_layer();
    let mut failed_left = result.plan_failures;
    for pair in result.log.windows(2) {
        let [old, new] = pair else { continue };
        // A failed plan keeps the placement and has no policy time.
        if old.placement == new.placement && new.policy_time_s == Some(0.0) && failed_left > 0 {
            failed_left -= 1;
            m.record_plan(None);
            continue;
        }
        let (s, e) = new.heat_windows.unwrap_or((0, 0));
        loads.iter_mut().for_each(|x| *x = 0.0);
        for w in s..e.min(trace.windows) {
            let window = trace.counts.get(w * ln..(w + 1) * ln).unwrap_or(&[]);
            for (x, &c) in loads.iter_mut().zip(window) {
                *x += c as f64;
            }
        }
        let po = Placement::new(shape, &old.placement).map_err(crate::SimError::Shape)?;
        let pn = Placement::new(shape, &new.placement).map_err(crate::SimError::Shape)?;
        for (layer, (lo, lnw)) in po.layers().zip(pn.layers()).enumerate() {
            let heat = loads.get(layer * n..(layer + 1) * n).unwrap_or(&[]);
            let par = |lp: &LayerPlacement<'_>, scratch: &mut [u32], rank_buf: &mut [f64]| {
                layer_par(lp, heat, Routing::Even, scratch, rank_buf)
                    .map_err(crate::SimError::Shape)
            };
            if let Some(b) = before.get_mut(layer) {
                *b = par(&lo, &mut scratch, &mut rank_buf)?;
            }
            if let Some(a) = after.get_mut(layer) {
                *a = par(&lnw, &mut scratch, &mut rank_buf)?;
            }
        }
        m.record_plan(Some(&PlanSample {
            par_before: &before,
            par_after: &after,
            planner_time: Duration::from_secs_f64(new.policy_time_s.unwrap_or(0.0).max(0.0)),
            // The placements log keeps no gate summary.
            gate: None,
        }));
        let mut moved = false;
        for layer in 0..l {
            let range = layer * per..(layer + 1) * per;
            let (Some(o), Some(nw)) = (old.placement.get(range.clone()), new.placement.get(range))
            else {
                continue;
            };
            if o != nw {
                let copies = layer_copies_moved(o, nw, shape.slots_per_rank());
                m.record_layer_moved(layer, copies, copies.saturating_mul(expert_bytes));
                moved = true;
            }
        }
        m.record_walk(None, moved);
    }
    m.record_failures(&Failures {
        failed_plans: result.plan_failures,
        layers_aborted: result.failed_layers,
        ..Failures::default()
    });
    eplb_runtime::metrics::encode_text(&registry).map_err(|_| crate::SimError::Encode {
        what: "the Prometheus text exposition",
    })
}
