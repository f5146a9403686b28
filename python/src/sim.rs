//! `eplb simulate` in this process: `eplb-sim` called with typed arguments.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use eplb_core::metrics::Routing;
use eplb_runtime::config::deployment::QuantType;
use eplb_sim::cost::{CostSpec, Link, ModelPreset};
use eplb_sim::json as sim_json;
use eplb_sim::replay::{check_params, parse_sim_policy};
use eplb_sim::time::TimeSpec;
use eplb_sim::{Initial, Replay, SimConfig, SimError};
use pyo3::prelude::*;

use crate::errors::guarded;

/// How often a replay checks for a pending signal (Ctrl-C).
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// The unwind payload of a replay stopped by a signal.
struct Interrupted;

/// `eplb simulate --json` in this process with typed settings (GIL released): the JSON text
/// of the object the command prints (the very bytes, so no float is re-rounded). Unset cost
/// settings take the command's defaults (the trace's model, else DeepSeek-V3 W8A8; 10 Gbit/s).
/// Also the warnings the command prints on standard error (without `warning: `).
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
pub(crate) fn simulate(
    py: Python<'_>,
    trace: PathBuf,
    ranks: u16,
    redundant: u32,
    policy: String,
    heat_interval: u32,
    algo_interval: u32,
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
) -> PyResult<(String, Vec<String>)> {
    // Ctrl-C: the replay checks for signals (with the GIL, at most every 100 ms, between
    // windows) and unwinds with `Interrupted`; the pending KeyboardInterrupt is then raised.
    let interrupted: Mutex<Option<PyErr>> = Mutex::new(None);
    let result = guarded(py, || -> Result<(String, Vec<String>), String> {
        let mut warnings = Vec::new();
        if ranks == 0 {
            return Err("ranks must be at least 1".to_owned());
        }
        let policy = parse_sim_policy(&policy).map_err(|e| e.to_string())?;
        check_params(policy, &params).map_err(|e| e.to_string())?;
        let initial: Initial = initial.parse().map_err(|e: SimError| e.to_string())?;
        let routing: Routing = routing
            .parse()
            .map_err(|e| format!("routing `{routing}`: {e}"))?;
        fn named<T: std::str::FromStr>(v: Option<String>, flag: &str) -> Result<Option<T>, String>
        where
            T::Err: std::fmt::Display,
        {
            v.map(|s| s.parse::<T>().map_err(|e| format!("{flag} {s}: {e}")))
                .transpose()
        }
        let cost = CostSpec {
            model: named::<ModelPreset>(model, "model")?,
            hidden,
            intermediate,
            quant: named::<QuantType>(quant, "quant")?,
            fused_mc2,
            link: named::<Link>(link, "link")?,
        };
        cost.resolve()?;
        let time = TimeSpec {
            hardware,
            role: role
                .map(|r| eplb_sim::time::parse_role(&r))
                .transpose()
                .map_err(|e| e.to_string())?,
            tokens_per_rank,
            ..TimeSpec::default()
        };
        time.check().map_err(|e| e.to_string())?;
        if let Some(log) = &placements_log {
            eplb_runtime::fsio::refuse_overwrite_input(log, &[trace.as_path()])
                .map_err(|e| e.to_string())?;
        }
        let source = trace.display().to_string();
        let bytes = eplb_runtime::fsio::read_bounded(&trace, max_input_bytes)
            .map_err(|e| format!("{source}: {e}"))?;
        let replay = Replay::load(&bytes, &source, &cost).map_err(|e| e.to_string())?;
        for w in &replay.warnings {
            warnings.push(format!("{source}: {w}"));
        }
        if let Some(w) = replay.short_trace_warning(heat_interval, algo_interval) {
            warnings.push(format!("{source}: {w}"));
        }
        let cfg = SimConfig {
            ranks,
            redundant,
            ranks_per_node,
            groups,
            policy,
            heat_interval,
            algo_interval,
            initial,
            routing,
            seed,
            expert_bytes: 64,
            payoff_gate: None,
            events: Vec::new(),
        };
        let basis = time
            .resolve(&replay.basis, ranks_per_node)
            .map_err(|e| e.to_string())?;
        let cfg = SimConfig {
            payoff_gate: payoff_gate.then(|| basis.gate(&cfg)),
            ..cfg
        };
        let mut last = Instant::now();
        let mut check = |_: usize, _: usize| {
            if last.elapsed() < SIGNAL_CHECK {
                return;
            }
            last = Instant::now();
            if let Err(e) = Python::attach(|py| py.check_signals()) {
                if let Ok(mut slot) = interrupted.lock() {
                    *slot = Some(e);
                }
                std::panic::resume_unwind(Box::new(Interrupted));
            }
        };
        let run = replay
            .run(&cfg, &params, &mut check)
            .map_err(|e| e.to_string())?;
        if let Some(path) = &placements_log {
            sim_json::write_placements_log(
                path,
                &run.result,
                policy.name(),
                replay.name.as_deref(),
            )
            .map_err(|e| e.to_string())?;
        }
        if let Some(warning) = run.check_plans().map_err(|e| e.to_string())? {
            warnings.push(warning);
        }
        let figures = eplb_sim::time::estimate(&replay.trace, &run, &cfg, &basis, None)
            .map_err(|e| e.to_string())?;
        let mut v = sim_json::run_json(&run, &replay.basis, policy.name(), routing);
        figures.add_json(&mut v, &basis);
        sim_json::add_membership(
            &mut v,
            &run.result,
            replay.basis.payload.total_bytes() as u64,
            basis.reload_bytes_per_s,
        );
        for w in &warnings {
            log::warn!("eplb: {w}");
        }
        Ok((v.to_string(), warnings))
    });
    if let Some(e) = interrupted.into_inner().ok().flatten() {
        return Err(e);
    }
    result
}
