//! A trace read for replay, and one policy's run over it with its cost.
//!
//! `eplb simulate`, `eplb report` and the Python `eplb.simulate` all go through here: read
//! the trace ([`Replay::load`]), then [`Replay::run`] a policy with its parameters. The
//! trace's own model (its `model` object) sizes an expert when the cost settings name none.

use eplb_map::heat::load_heat;
use eplb_policies::PolicyKind;
use eplb_runtime::policies::{Param, policy_with};
use serde_json::Value;

use crate::SimError;
use crate::cost::{CostBasis, CostSpec, ModelPreset, MoveCost, sequence_cost};
use crate::simulate::{
    Initial, SimConfig, SimPolicy, SimResult, SimTrace, simulate, simulate_with,
};

/// A trace in memory with what its header says and the cost basis of its replays.
#[derive(Debug, Clone)]
pub struct Replay {
    /// The windows' counts.
    pub trace: SimTrace,
    /// The trace's own name, if it has one.
    pub name: Option<String>,
    /// The name of the model the trace names, if any.
    pub model: Option<String>,
    /// What one expert weighs and how fast it moves.
    pub basis: CostBasis,
    /// What the trace reader found questionable but accepted (the command prints them as
    /// `warning: SOURCE: ...`).
    pub warnings: Vec<String>,
}

/// One policy's run over a [`Replay`]: the simulator's result and the cost of each placement
/// change (`costs[k]` from log entry `k` to `k + 1`).
#[derive(Debug, Clone)]
pub struct Run {
    /// The simulator's result.
    pub result: SimResult,
    /// The cost of each change between consecutive placements of the log.
    pub costs: Vec<MoveCost>,
}

impl Replay {
    /// Reads an `eplb-trace/v1` trace (`bytes`; `source` names it in errors) for replay. With
    /// no model in `cost`, the model the trace names sizes an expert (`CostSpec::resolve_for_trace`).
    /// The cost settings are checked first, so a bad flag is reported before a bad trace.
    pub fn load(bytes: &[u8], source: &str, cost: &CostSpec) -> Result<Self, SimError> {
        let setting = |why: String| SimError::Setting {
            what: "cost".to_owned(),
            why,
        };
        cost.resolve().map_err(setting)?;
        let (preset, model) = trace_model(bytes);
        let basis = cost.resolve_for_trace(preset).map_err(setting)?;
        let trace_err = |why: String| SimError::Trace {
            source: source.to_owned(),
            why,
        };
        let heat = load_heat(bytes, None).map_err(|e| trace_err(e.to_string()))?;
        let counts = heat
            .counts_u64()
            .ok_or_else(|| trace_err("counts must be whole token counts".to_owned()))?;
        Ok(Replay {
            trace: SimTrace {
                windows: heat.windows(),
                layers: heat.layers(),
                experts: heat.experts(),
                counts,
            },
            name: heat.name().map(str::to_owned),
            model,
            basis,
            warnings: heat.warnings().iter().map(ToString::to_string).collect(),
        })
    }

    /// This replay's first window repeated `windows` times: an aggregate trace (one window
    /// summing a whole run) read as a stationary workload.
    pub fn stationary(&self, windows: usize) -> Self {
        let t = &self.trace;
        let one = t.layers * t.experts;
        let first = t.counts.get(..one).unwrap_or(&[]);
        let mut counts = Vec::with_capacity(one * windows);
        for _ in 0..windows {
            counts.extend_from_slice(first);
        }
        Self {
            trace: SimTrace {
                windows,
                layers: t.layers,
                experts: t.experts,
                counts,
            },
            ..self.clone()
        }
    }

    /// Replays `cfg.policy` with `params` (set through the policy's own parser; `static` takes
    /// none) and prices each placement change at this replay's cost basis. `progress` is
    /// called with (windows done, windows).
    pub fn run(
        &self,
        cfg: &SimConfig,
        params: &[Param],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Run, SimError> {
        let custom = check_params(cfg.policy, params)?;
        let result = match custom {
            Some(p) => simulate_with(&self.trace, cfg, Box::new(p), progress),
            None => simulate(&self.trace, cfg, progress),
        }
        .map_err(SimError::Run)?;
        let costs = sequence_cost(
            &result.shape,
            result.log.iter().map(|e| e.placement.as_slice()),
            self.basis.payload.total_bytes(),
        )?;
        Ok(Run { result, costs })
    }
}

impl Run {
    /// Whether the run's numbers are the policy's: an error when every plan failed (they are
    /// the initial placement's), else a warning line when some did (the placement stayed as
    /// it was for them), else `None`.
    pub fn check_plans(&self) -> Result<Option<String>, SimError> {
        let r = &self.result;
        if r.plan_failures == 0 {
            return Ok(None);
        }
        let why = r
            .first_plan_failure
            .as_deref()
            .unwrap_or("unknown")
            .to_owned();
        if r.plan_failures >= r.plans {
            return Err(SimError::EveryPlanFailed {
                plans: r.plans,
                why,
            });
        }
        Ok(Some(format!(
            "{} of {} plans failed (the placement stayed as it was for them): {why}",
            r.plan_failures, r.plans
        )))
    }
}

/// The policy with `params` set, when any are given; an unknown key or a value out of range
/// is an error naming it (before any input is read, when called first).
pub fn check_params(
    policy: SimPolicy,
    params: &[Param],
) -> Result<Option<eplb_policies::AnyPolicy>, SimError> {
    let setting = |why: String| SimError::Setting {
        what: "--param".to_owned(),
        why,
    };
    match (policy, params.is_empty()) {
        (_, true) => Ok(None),
        (SimPolicy::Policy(k), false) => policy_with(k, params)
            .map(Some)
            .map_err(|e| setting(e.to_string())),
        (SimPolicy::Static, false) => {
            Err(setting("policy `static` takes no parameters".to_owned()))
        }
    }
}

/// `static`, a policy number `0..4` or a policy name.
pub fn parse_sim_policy(s: &str) -> Result<SimPolicy, SimError> {
    if s == "static" {
        return Ok(SimPolicy::Static);
    }
    s.parse::<PolicyKind>()
        .map(SimPolicy::Policy)
        .map_err(|e| SimError::Setting {
            what: format!("--policy {s}"),
            why: e.to_string(),
        })
}

impl core::str::FromStr for Initial {
    type Err = SimError;

    /// `default` or `random:SEED`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "default" {
            return Ok(Initial::Default);
        }
        s.strip_prefix("random:")
            .and_then(|x| x.parse::<u64>().ok())
            .map(Initial::Random)
            .ok_or_else(|| SimError::Setting {
                what: format!("--initial {s}"),
                why: "expected `default` or `random:SEED`".to_owned(),
            })
    }
}

/// The model preset a trace names in its `model` object, and that object's `name`.
pub fn trace_model(bytes: &[u8]) -> (Option<ModelPreset>, Option<String>) {
    // A one-object trace, or the header line of the line layout (a runtime recording).
    let first_line = || {
        let end = bytes.iter().position(|&b| b == b'\n')?;
        serde_json::from_slice::<Value>(bytes.get(..end)?).ok()
    };
    let Some(v) = serde_json::from_slice::<Value>(bytes)
        .ok()
        .or_else(first_line)
    else {
        return (None, None);
    };
    let Some(m) = v.get("model") else {
        return (None, None);
    };
    (
        ModelPreset::from_trace_model(m),
        m.get("name").and_then(Value::as_str).map(str::to_owned),
    )
}
