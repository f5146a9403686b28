//! `eplb estimate`: one step of a deployment priced without a trace (`docs/time-model.md`,
//! "eplb estimate"): the whole-step model ([`StepModel`]) at a busiest-rank load `par` times
//! the mean, with the model's band.

use eplb_core::time::step::{StepModel, StepTime};
use serde_json::{Value, json};

use crate::SimError;
use crate::cost::CostBasis;
use crate::time::{TimeBasis, TimeSpec, fixed};

/// A priced step and its band.
#[derive(Debug, Clone, PartialEq)]
pub struct StepEstimate {
    /// The model.
    pub basis: TimeBasis,
    /// EP ranks.
    pub ranks: u16,
    /// Busiest rank's MoE load over the mean.
    pub par: f64,
    /// The step under the basis' calibration.
    pub central: StepTime,
    /// The step with every term at the fast end of the band.
    pub low: StepTime,
    /// The step with every term at the slow end of the band.
    pub high: StepTime,
}

/// Prices one step of `ranks` ranks (`ranks_per_node` of them per node, when given; it must
/// divide `ranks`) at PAR `par` (1.0 = balanced).
pub fn estimate_step(
    spec: &TimeSpec,
    cost: &CostBasis,
    ranks: u16,
    ranks_per_node: Option<u16>,
    par: f64,
) -> Result<StepEstimate, SimError> {
    let setting = |what: &str, why: String| SimError::Setting {
        what: what.to_owned(),
        why,
    };
    if ranks == 0 {
        return Err(setting("--ranks", "must be at least 1".to_owned()));
    }
    if let Some(g) = ranks_per_node
        && (g == 0 || !ranks.is_multiple_of(g))
    {
        return Err(setting(
            "--ranks-per-node",
            format!("{g} must be at least 1 and divide the {ranks} ranks"),
        ));
    }
    if !(par.is_finite() && par >= 1.0 && par <= f64::from(ranks)) {
        return Err(setting(
            "--par",
            format!("{par} must be a finite number between 1 (balanced) and the ranks ({ranks})"),
        ));
    }
    let basis = spec.resolve(cost, ranks_per_node)?;
    let step: &StepModel = &basis.step;
    let r = usize::from(ranks);
    let err = |e: eplb_core::Error| setting("time model", e.to_string());
    let terms = step.moe_layer_par(r, par).map_err(err)?;
    let layers = vec![terms; usize::from(step.time.model.moe_layers)];
    let central = step
        .step_from_terms(&layers, &step.calibration)
        .map_err(err)?;
    let (fast, slow) = step.calibration.band(basis.calibration_source.is_some());
    let low = step.step_from_terms(&layers, &fast).map_err(err)?;
    let high = step.step_from_terms(&layers, &slow).map_err(err)?;
    Ok(StepEstimate {
        basis,
        ranks,
        par,
        central,
        low,
        high,
    })
}

impl StepEstimate {
    /// The `estimate --json` object.
    pub fn to_json(&self) -> Value {
        let c = &self.central;
        json!({
            "iteration_ms": c.iteration_ms,
            "iteration_ms_low": self.low.iteration_ms,
            "iteration_ms_high": self.high.iteration_ms,
            "moe_ms": c.moe_ms,
            "gemm_ms": c.gemm_ms,
            "attention_ms": c.attention_ms,
            "a2a_ms": c.a2a_ms,
            "a2a_latency_ms": c.a2a_latency_ms,
            "other_ms": c.other_ms,
            "hidden_by_overlap_ms": c.hidden_ms,
            "moe_share_pct": c.moe_ms / c.iteration_ms * 100.0,
            "ranks": self.ranks,
            "par": self.par,
            "role": self.basis.role.name(),
            "topology": self.basis.topology_json(Some(usize::from(self.ranks))),
            "time_model": self.basis.to_json(),
        })
    }

    /// Lines for people: the model, the topology, the step and its parts.
    pub fn describe(&self) -> String {
        let c = &self.central;
        format!(
            "{}\n{}\nstep ({}, PAR {}): {} ms (band {} to {} ms): MoE {} ms (routed GEMM {} ms, all-to-all {} ms of which latency {} ms), attention {} ms, other {} ms, hidden by overlap {} ms",
            self.basis.describe(),
            self.basis.describe_topology(usize::from(self.ranks)),
            self.basis.role.name(),
            self.par,
            fixed(c.iteration_ms, 3),
            fixed(self.low.iteration_ms, 3),
            fixed(self.high.iteration_ms, 3),
            fixed(c.moe_ms, 3),
            fixed(c.gemm_ms, 3),
            fixed(c.a2a_ms, 3),
            fixed(c.a2a_latency_ms, 3),
            fixed(c.attention_ms, 3),
            fixed(c.other_ms, 3),
            fixed(c.hidden_ms, 3)
        )
    }
}
