//! `eplb simulate` in this process: `eplb-sim` called with typed arguments.

use std::path::PathBuf;

use eplb_core::metrics::Routing;
use eplb_runtime::config::deployment::parse_quant;
use eplb_sim::cost::{CostSpec, Link, parse_model};
use eplb_sim::json as sim_json;
use eplb_sim::replay::{check_params, parse_sim_policy};
use eplb_sim::time::TimeSpec;
use eplb_sim::{Initial, Replay, SimConfig};
use pyo3::prelude::*;

use crate::errors::{Cancel, Error, guarded_cancel};

/// The unwind payload of a replay stopped because its caller was interrupted (Ctrl-C).
struct Interrupted;

/// `eplb simulate --json` in this process with typed settings (GIL released): the dict of the
/// object the command prints, built in Rust (`eplb_sim::json::simulation`, the command's own
/// recipe). Unset cost settings take the command's defaults (the trace's model, else
/// DeepSeek-V3 W8A8; 10 Gbit/s). Also the warnings the command prints on standard error
/// (without `warning: `).
#[pyfunction]
#[pyo3(signature = (
    trace, ranks, redundant, policy, heat_interval, algo_interval, *,
    ranks_per_node = None, groups = None, initial = "default".to_owned(),
    routing = "log2phy".to_owned(), seed = 0, params = Vec::new(), placements_log = None,
    model = None, hidden = None, intermediate = None, quant = None, fused_mc2 = false,
    link = None, max_input_bytes = eplb_runtime::fsio::DEFAULT_INPUT_LIMIT,
    hardware = None, role = None, tokens_per_rank = None, payoff_gate = false,
))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn simulate<'py>(
    py: Python<'py>,
    trace: PathBuf,
    ranks: i64,
    redundant: i64,
    policy: String,
    heat_interval: i64,
    algo_interval: i64,
    ranks_per_node: Option<u16>,
    groups: Option<u16>,
    initial: String,
    routing: String,
    seed: u64,
    params: Vec<(String, f64)>,
    placements_log: Option<PathBuf>,
    model: Option<String>,
    hidden: Option<u64>,
    intermediate: Option<u64>,
    quant: Option<String>,
    fused_mc2: bool,
    link: Option<String>,
    max_input_bytes: u64,
    hardware: Option<String>,
    role: Option<String>,
    tokens_per_rank: Option<f64>,
    payoff_gate: bool,
) -> PyResult<(Bound<'py, PyAny>, Vec<String>)> {
    let args = SimArgs {
        trace,
        ranks,
        redundant,
        policy,
        heat_interval,
        algo_interval,
        ranks_per_node,
        groups,
        initial,
        routing,
        seed,
        params,
        placements_log,
        max_input_bytes,
        payoff_gate,
    };
    let cost = CostArgs {
        model,
        hidden,
        intermediate,
        quant,
        fused_mc2,
        link,
    };
    let time = TimeArgs {
        hardware,
        role,
        tokens_per_rank,
    };
    // Ctrl-C: the guard returns the KeyboardInterrupt within a tick; the replay sees the
    // cancel flag between windows and stops.
    let (v, warnings) = guarded_cancel(py, move |cancel| run(&args, &cost, &time, cancel))?;
    Ok((to_py(py, &v)?, warnings))
}

/// The replay's settings, as `eplb simulate`'s flags name them; the numbers as given, checked
/// by their one rule ([`eplb_core::settings`]) when the replay starts.
struct SimArgs {
    trace: PathBuf,
    ranks: i64,
    redundant: i64,
    policy: String,
    heat_interval: i64,
    algo_interval: i64,
    ranks_per_node: Option<u16>,
    groups: Option<u16>,
    initial: String,
    routing: String,
    seed: u64,
    params: Vec<(String, f64)>,
    placements_log: Option<PathBuf>,
    max_input_bytes: u64,
    payoff_gate: bool,
}

/// The cost model's settings (`--model`, `--hidden`, ...), read into a [`CostSpec`].
struct CostArgs {
    model: Option<String>,
    hidden: Option<u64>,
    intermediate: Option<u64>,
    quant: Option<String>,
    fused_mc2: bool,
    link: Option<String>,
}

impl CostArgs {
    fn spec(&self) -> Result<CostSpec, Error> {
        fn named<T: std::str::FromStr>(v: &Option<String>, flag: &str) -> Result<Option<T>, Error>
        where
            T::Err: std::fmt::Display,
        {
            v.as_ref()
                .map(|s| {
                    s.parse::<T>()
                        .map_err(|e| Error::from(format!("{flag} {s}: {e}")))
                })
                .transpose()
        }
        let cost = CostSpec {
            model: self
                .model
                .as_deref()
                .map(|s| parse_model(s).map_err(|e| format!("model {s}: {e}")))
                .transpose()?,
            hidden: self.hidden,
            intermediate: self.intermediate,
            quant: self
                .quant
                .as_deref()
                .map(|s| parse_quant(s).map_err(|e| format!("quant {s}: {e}")))
                .transpose()?,
            fused_mc2: self.fused_mc2,
            link: named::<Link>(&self.link, "link")?,
        };
        cost.resolve()?;
        Ok(cost)
    }
}

/// The time model's settings (`--hardware`, `--role`, `--tokens-per-rank`), read into a
/// [`TimeSpec`].
struct TimeArgs {
    hardware: Option<String>,
    role: Option<String>,
    tokens_per_rank: Option<f64>,
}

impl TimeArgs {
    fn spec(&self) -> Result<TimeSpec, Error> {
        let time = TimeSpec {
            hardware: self.hardware.clone(),
            role: self
                .role
                .as_deref()
                .map(eplb_sim::time::parse_role)
                .transpose()?,
            tokens_per_rank: self.tokens_per_rank,
            ..TimeSpec::default()
        };
        time.check()?;
        Ok(time)
    }
}

/// `eplb simulate --json`'s recipe: the settings checked before the trace is read, the
/// replay, its placements log, and the JSON object with the warnings.
fn run(
    a: &SimArgs,
    cost: &CostArgs,
    time: &TimeArgs,
    cancel: &Cancel,
) -> Result<(serde_json::Value, Vec<String>), Error> {
    use eplb_core::settings;
    let mut warnings = Vec::new();
    let rule = |name: &str, v: i64, r: fn(i128) -> Result<u32, eplb_core::SettingError>| {
        r(i128::from(v)).map_err(|e| Error::from(format!("{name}: {e}")))
    };
    let ranks = settings::ranks(i128::from(a.ranks)).map_err(|e| format!("ranks: {e}"))?;
    let redundant = rule("redundant", a.redundant, settings::redundant_experts)?;
    let heat_interval = rule("heat_interval", a.heat_interval, settings::heat_interval)?;
    let algo_interval = rule("algo_interval", a.algo_interval, settings::algo_interval)?;
    let policy = parse_sim_policy(&a.policy)?;
    check_params(policy, &a.params)?;
    let initial: Initial = a.initial.parse::<Initial>()?;
    let routing: Routing = a
        .routing
        .parse()
        .map_err(|e| Error::from(format!("routing `{}`: {e}", a.routing)))?;
    let cost = cost.spec()?;
    let time = time.spec()?;
    if let Some(log) = &a.placements_log {
        eplb_runtime::fsio::refuse_overwrite_input(log, &[a.trace.as_path()])?;
    }
    let source = a.trace.display().to_string();
    let bytes = eplb_runtime::fsio::read_bounded(&a.trace, a.max_input_bytes)
        .map_err(|e| Error::from(format!("{source}: {e}")))?;
    let replay = Replay::load(&bytes, &source, &cost)?;
    for w in &replay.warnings {
        warnings.push(format!("{source}: {w}"));
    }
    if let Some(w) = replay.short_trace_warning(heat_interval, algo_interval) {
        warnings.push(format!("{source}: {w}"));
    }
    let cfg = SimConfig {
        ranks,
        redundant,
        ranks_per_node: a.ranks_per_node,
        groups: a.groups,
        policy,
        heat_interval,
        algo_interval,
        initial,
        routing,
        seed: a.seed,
        expert_bytes: 64,
        payoff_gate: None,
        events: Vec::new(),
    };
    let basis = time.resolve(&replay.basis, a.ranks_per_node)?;
    let cfg = SimConfig {
        payoff_gate: a.payoff_gate.then(|| basis.gate(&cfg)).transpose()?,
        ..cfg
    };
    let mut check = |_: usize, _: usize| {
        if cancel.is_set() {
            std::panic::resume_unwind(Box::new(Interrupted));
        }
    };
    let run = replay.run(&cfg, &a.params, &mut check)?;
    if let Some(path) = &a.placements_log {
        sim_json::write_placements_log(path, &run.result, policy.name(), replay.name.as_deref())?;
    }
    if let Some(warning) = run.check_plans()? {
        warnings.push(warning);
    }
    let figures = eplb_sim::time::estimate(&replay.trace, &run, &cfg, &basis, None)?;
    let v = sim_json::simulation(
        &run.result,
        &run.costs,
        &replay.basis,
        &figures,
        &basis,
        policy.name(),
        routing,
    );
    for w in &warnings {
        log::warn!("eplb: {w}");
    }
    Ok((v, warnings))
}

/// A JSON value as the Python object `json.loads` makes of its text: a dict, list, str, int,
/// float, bool or None (a float is the same double, an integer the same integer).
fn to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::types::{PyDict, PyList};
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for x in items {
                list.append(to_py(py, x)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, x) in map {
                dict.set_item(k, to_py(py, x)?)?;
            }
            dict.into_any()
        }
    })
}
