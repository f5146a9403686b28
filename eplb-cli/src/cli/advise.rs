//! `eplb advise`: sweeps policies x heat interval x algorithm interval x redundant experts over
//! a trace (`eplb_sim::advise`), ranks the settings by net estimated saving against no EPLB and
//! recommends one, or none.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use clap::Args;
use eplb_policies::PolicyKind;
use eplb_sim::advise::{Engine, Grid, advise};
use eplb_sim::{Replay, SimConfig, SimPolicy};

use super::args::{Io, RunArgs};

#[derive(Debug, Args)]
pub(super) struct AdviseArgs {
    /// An eplb-trace/v1 trace with windows (one window = one iteration).
    #[arg(long)]
    trace: PathBuf,
    /// EP ranks.
    #[arg(long, value_parser = super::args::parse_ranks)]
    ranks: u16,
    /// Redundant experts to try, comma-separated (default: the fewest the shape allows, and
    /// one slot per rank more).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    redundant_list: Option<Vec<i128>>,
    /// Policies to try, comma-separated names or numbers (default: every policy but random).
    #[arg(long, value_delimiter = ',', value_parser = super::args::parse_policy)]
    policies: Option<Vec<PolicyKind>>,
    /// Heat intervals to try, comma-separated (default: T/16, T/8, T/4 of the trace's T
    /// windows).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    heat_intervals: Option<Vec<i128>>,
    /// Algorithm intervals to try, comma-separated (default: 1 and max(2, T/32)).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    algo_intervals: Option<Vec<i128>>,
    #[command(flatten)]
    run: RunArgs,
    /// Also try every setting with the pay-off gate on (`eplb_payoff_gate`): twice the runs.
    #[arg(long)]
    payoff_gate: bool,
    /// Worker threads (default: every core).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    threads: Option<u32>,
    /// Write the recommended configuration here (atomically), in the words of `--engine`.
    #[arg(long)]
    config_out: Option<PathBuf>,
    /// The engine the configuration is for: eplb (eplb's own runtime, the default: an
    /// `eplb_config`), vllm, vllm-ascend or sglang (with eplb's plugin).
    #[arg(long, value_parser = parse_engine)]
    engine: Option<Engine>,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

fn parse_engine(s: &str) -> Result<Engine, String> {
    Engine::from_name(s).ok_or_else(|| {
        format!(
            "{s}: unknown engine; expected one of {}",
            Engine::ALL.map(Engine::name).join(", ")
        )
    })
}

/// The values of a list flag, each by its one rule.
fn checked<T>(
    flag: &str,
    values: Option<&Vec<i128>>,
    rule: fn(i128) -> Result<T, eplb_core::SettingError>,
) -> Result<Option<Vec<T>>, String> {
    values
        .map(|v| {
            v.iter()
                .map(|&x| super::args::setting(flag, x, rule))
                .collect()
        })
        .transpose()
}

pub(super) fn run(a: &AdviseArgs, io: &mut Io) -> Result<ExitCode, String> {
    use eplb_core::settings;
    let redundant_list = checked(
        "--redundant-list",
        a.redundant_list.as_ref(),
        settings::redundant_experts,
    )?;
    let heat_intervals = checked(
        "--heat-intervals",
        a.heat_intervals.as_ref(),
        settings::heat_interval,
    )?;
    let algo_intervals = checked(
        "--algo-intervals",
        a.algo_intervals.as_ref(),
        settings::algo_interval,
    )?;
    let (initial, routing) = a.run.check()?;
    let engine = a.engine.unwrap_or_default();
    if a.payoff_gate && !engine.runs_gate() {
        return Err(format!(
            "--payoff-gate with --engine {}: only eplb's runtime runs the pay-off gate",
            engine.name()
        ));
    }
    if let Some(p) = a.policies.iter().flatten().find(|p| !engine.runs(**p)) {
        return Err(format!(
            "--policies {}: eplb's plugin does not serve it on --engine {}",
            p.name(),
            engine.name()
        ));
    }
    if let Some(out) = &a.config_out {
        eplb_runtime::fsio::refuse_overwrite_input(out, &[a.trace.as_path()])
            .map_err(|e| e.to_string())?;
    }
    let bytes = io.read(&a.trace)?;
    let source = a.trace.display().to_string();
    let replay = Replay::load(&bytes, &source, &a.run.cost.spec()).map_err(|e| e.to_string())?;
    for w in &replay.warnings {
        errln!("warning: {source}: {w}");
    }
    let t = &replay.trace;
    let mut grid = Grid::default_for(Grid::replay_windows(t.windows), t.experts, a.ranks);
    if let Some(p) = &a.policies {
        grid.policies = p.clone();
    }
    grid.policies.retain(|p| engine.runs(*p));
    if let Some(h) = heat_intervals {
        grid.heat_intervals = h;
    }
    if let Some(x) = algo_intervals {
        grid.algo_intervals = x;
    }
    if let Some(x) = redundant_list {
        grid.redundant = x;
    }
    if a.payoff_gate {
        grid.payoff_gate = vec![false, true];
    }
    let base = SimConfig {
        ranks: a.ranks,
        redundant: 0,
        ranks_per_node: a.run.topo.ranks_per_node,
        groups: a.run.topo.groups,
        policy: SimPolicy::Static,
        heat_interval: 1,
        algo_interval: 1,
        initial,
        routing,
        seed: a.run.seed,
        expert_bytes: 64,
        payoff_gate: None,
        events: Vec::new(),
    };
    let threads = a.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        |n| n as usize,
    );
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let shown = Mutex::new(false);
    let progress = |done: usize, total: usize| {
        if tty && let Ok(mut shown) = shown.lock() {
            let width = 30;
            let filled = done * width / total.max(1);
            let _ = write!(
                std::io::stderr(),
                "\r[{}{}] {done}/{total} settings, {:.0} s",
                "=".repeat(filled),
                " ".repeat(width - filled),
                started.elapsed().as_secs_f64()
            );
            let _ = std::io::stderr().flush();
            *shown = true;
        }
    };
    let spec = a.run.time.spec_with(io)?;
    let advice = advise(&replay, &base, &spec, &grid, threads, &progress);
    if shown.into_inner().unwrap_or(false) {
        errln!();
    }
    let advice = advice.map_err(|e| e.to_string())?;
    let written = advice
        .engine_config(engine, &spec, &replay.basis, routing)
        .map_err(|e| e.to_string())?;
    if let Some(out) = &a.config_out {
        let text = serde_json::to_string_pretty(&written.document)
            .map_err(|e| format!("{}: {e}", out.display()))?;
        eplb_runtime::fsio::write_atomic(out, format!("{text}\n").as_bytes())
            .map_err(|e| format!("{}: {e}", out.display()))?;
    }
    if a.json {
        let mut v = advice.to_json();
        v["engine_config"] = written.to_json();
        outln!(io, "{v}");
    } else {
        outln!(io, "{}", replay.basis.describe());
        outln!(io, "{}", advice.time.describe());
        outln!(
            io,
            "{}",
            advice.time.describe_topology(usize::from(a.ranks))
        );
        if let Some(n) = advice.stationary {
            outln!(
                io,
                "the trace has one window (an aggregate): replayed as a stationary workload of {n} iterations"
            );
        }
        outln!(
            io,
            "baseline (no EPLB: static, {} redundant): {:.3} ms per step, of it {:.3} ms MoE, over windows {}..{}",
            advice.baseline_redundant,
            advice.baseline_ms,
            advice.baseline_moe_ms,
            advice.first_window,
            advice.stationary.unwrap_or(t.windows)
        );
        io.out.push_str(&advice.table());
        outln!(io, "{}", advice.recommendation());
        if let Some(ab) = advice.ab_run() {
            outln!(io, "{ab}");
        }
        if let Some(out) = &a.config_out {
            outln!(
                io,
                "wrote {} (for {})",
                out.display(),
                written.engine.name()
            );
            if !written.env.is_empty() {
                let env: Vec<String> = written
                    .env
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                outln!(
                    io,
                    "run it with {} in the engine's environment",
                    env.join(" ")
                );
            }
            if let Some(f) = written.flags.as_deref().filter(|f| !f.is_empty()) {
                outln!(io, "engine flags: {f}");
            }
            for n in &written.notes {
                outln!(io, "note: {n}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
