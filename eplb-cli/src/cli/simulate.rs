//! `eplb simulate`: one policy replayed over a trace (`eplb_sim`), printed or as `--json`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use eplb_core::metrics::Routing;
use eplb_runtime::policies::Param;
use eplb_sim::SimResult;
use eplb_sim::cost::{CostBasis, MoveCost, human_bytes, human_ms};
use eplb_sim::json::{self, sim_cost};
use eplb_sim::replay::{check_params, parse_sim_policy};

use super::args::{Io, ReplayArgs, parse_param};

#[derive(Debug, Args)]
pub(super) struct SimulateArgs {
    #[command(flatten)]
    replay: ReplayArgs,
    /// Policy: static, 0..4, random, default, swift, flashlb, incremental, deepseek.
    #[arg(long)]
    policy: String,
    /// A policy parameter, `KEY=VALUE` (repeatable; `README.md`, "Policy parameters").
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
    params: Vec<Param>,
    /// Write the eplb-placements/v1 log here.
    #[arg(long)]
    placements_log: Option<PathBuf>,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Write the Prometheus metrics the runtime would have exported over the replay here (text
    /// exposition format; `eplb_runtime::metrics`).
    #[arg(long, value_name = "FILE")]
    metrics_out: Option<PathBuf>,
}

pub(super) fn run(a: &SimulateArgs, io: &mut Io) -> Result<ExitCode, String> {
    let policy = parse_sim_policy(&a.policy).map_err(|e| e.to_string())?;
    // Parameters are checked before any input is read.
    check_params(policy, &a.params).map_err(|e| e.to_string())?;
    for out in [&a.placements_log, &a.metrics_out].into_iter().flatten() {
        eplb_runtime::fsio::refuse_overwrite_input(out, &[a.replay.trace.as_path()])
            .map_err(|e| e.to_string())?;
    }
    let (replay, cfg) = a.replay.load(io, policy)?;
    if a.metrics_out.is_some() && !cfg.events.is_empty() {
        return Err(
            "--metrics-out does not support --fail-rank/--join-rank yet (its per-cycle \
             figures need every rank live)"
                .to_owned(),
        );
    }
    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut shown = false;
    let mut progress = |done: usize, total: usize| {
        if tty && started.elapsed().as_secs_f64() > 1.0 {
            let width = 30;
            let filled = done * width / total.max(1);
            let _ = write!(
                std::io::stderr(),
                "\r[{}{}] {done}/{total} windows",
                "=".repeat(filled),
                " ".repeat(width - filled)
            );
            let _ = std::io::stderr().flush();
            shown = true;
        }
    };
    let run = replay
        .run(&cfg, &a.params, &mut progress)
        .map_err(|e| crate::words::sim_error(&e))?;
    if shown {
        errln!();
    }
    let (r, basis) = (&run.result, &replay.basis);
    if let Some(path) = &a.placements_log {
        json::write_placements_log(path, r, policy.name(), replay.name.as_deref())
            .map_err(|e| e.to_string())?;
    }
    if let Some(path) = &a.metrics_out {
        let text = eplb_sim::metrics_out::replay_metrics(
            &replay.trace,
            r,
            basis.payload.total_bytes() as u64,
            &eplb_runtime::metrics::MetricsSettings::default(),
        )
        .map_err(|e| crate::words::sim_error(&e))?;
        eplb_runtime::fsio::write_atomic(path, text.as_bytes())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let time = a
        .replay
        .run
        .time
        .spec_with(io)?
        .resolve(basis, cfg.ranks_per_node)
        .map_err(|e| e.to_string())?;
    let figures = eplb_sim::time::estimate(&replay.trace, &run, &cfg, &time, None)
        .map_err(|e| e.to_string())?;
    if a.json {
        let v = json::simulation(
            r,
            &run.costs,
            basis,
            &figures,
            &time,
            policy.name(),
            cfg.routing,
        );
        outln!(io, "{v}");
    } else {
        print_sim(io, r, policy.name(), cfg.routing);
        outln!(io, "{}", basis.describe());
        outln!(io, "{}", sim_cost_line(&run.costs, basis));
        outln!(io, "{}", figures.describe(&time));
        print_members(
            io,
            r,
            basis.payload.total_bytes() as u64,
            time.reload_bytes_per_s,
        );
    }
    // A failed plan keeps the old placement: say so, and never pass a run whose every plan
    // failed off as the policy's result.
    if let Some(warning) = run.check_plans().map_err(|e| e.to_string())? {
        errln!("warning: {warning}");
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per membership event: what was lost, reloaded and when PAR came back.
fn print_members(io: &mut Io, r: &SimResult, expert_bytes: u64, reload_bytes_per_s: f64) {
    for o in &r.membership {
        let bytes = o.reload_copies.saturating_mul(expert_bytes);
        let ms = o.reload_copies_max_rank as f64 * expert_bytes as f64 / reload_bytes_per_s * 1e3;
        outln!(
            io,
            "window {}: rank {} {}s ({} live): {} experts lost, {} tokens unserved, {} copies reloaded ({}, about {} on the busiest rank); PAR {} before, {} at the event, back within 5 % at {}",
            o.event.window,
            o.event.rank,
            o.event.kind.name(),
            o.live_ranks,
            o.lost_experts,
            o.unserved_tokens,
            o.reload_copies,
            human_bytes(bytes),
            human_ms(ms),
            eplb_sim::time::fixed(o.par_before_event, 4),
            eplb_sim::time::fixed(o.par_window_after, 4),
            o.recovered_at_window
                .map_or_else(|| "no window".to_owned(), |w| format!("window {w}"))
        );
    }
}

fn sim_cost_line(costs: &[MoveCost], basis: &CostBasis) -> String {
    let (total, per_cycle, ms) = sim_cost(costs, basis);
    format!(
        "cost: {} moved over {} cycles ({} per cycle on average); at {}: about {} per cycle (busiest rank's link, layers one after another)",
        human_bytes(total),
        costs.len(),
        human_bytes(per_cycle.round() as u64),
        basis.link.name(),
        human_ms(ms)
    )
}

fn print_sim(io: &mut Io, r: &SimResult, policy: &str, routing: Routing) {
    let s = r.shape;
    outln!(
        io,
        "policy {policy}: L={} N={} R={} S={} X={}, routing {}, {} cycles",
        s.layers(),
        s.experts(),
        s.ranks(),
        s.slots_per_rank(),
        s.redundant(),
        routing.name(),
        r.cycles
    );
    outln!(
        io,
        "PAR: mean {}  p99 {}  max {}  | from first activation: mean {}  p99 {}",
        eplb_sim::time::fixed(r.mean_par, 4),
        eplb_sim::time::fixed(r.p99_par, 4),
        eplb_sim::time::fixed(r.max_par, 3),
        eplb_sim::time::fixed(r.mean_par_from_first_activation, 4),
        eplb_sim::time::fixed(r.p99_par_from_first_activation, 4)
    );
    outln!(
        io,
        "changes {}  moves {} ({:.1} per change, {:.1}% of slots)  slot writes {}  same-rank duplicate rows max {}",
        r.changes,
        r.moves_total,
        r.moves_per_change(),
        100.0 * r.moves_per_change() / s.placement_len() as f64,
        r.slot_writes_total,
        r.same_rank_duplicate_rows_max
    );
    outln!(
        io,
        "policy time per cycle: mean {:.2} ms, max {:.2} ms; lower bound mean PAR {:.4}",
        r.policy_time_ms_mean,
        r.policy_time_ms_max,
        r.lower_bound_mean_par
    );
}
