//! `eplb plan`: one placement from recorded heat, written as a vLLM-Ascend expert map.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use eplb_core::metrics;
use eplb_core::{Layout, Placement};
use eplb_map::heat::load_heat;
use eplb_map::map::to_json;
use eplb_policies::PolicyKind;
use eplb_runtime::planner::{PlanRequest, PolicyHost, plan_once};
use eplb_runtime::policies::{Param, policy_with};
use eplb_sim::cost::{CostBasis, MoveCost, human_bytes, human_ms, move_cost};
use serde_json::json;

use super::args::{
    CostArgs, Io, Topology, layout_shape, parse_param, parse_policy, read_current, warn_heat,
};

#[derive(Debug, Args)]
pub(super) struct PlanArgs {
    /// Heat: an eplb-trace/v1 trace, an SGLang logical_count dump, or a JSON array `[L][N]`.
    #[arg(long)]
    loads: PathBuf,
    /// EP ranks.
    #[arg(long, value_parser = super::args::parse_ranks)]
    ranks: u16,
    /// Redundant experts (0..=65535).
    #[arg(long, allow_negative_numbers = true)]
    redundant: i128,
    #[command(flatten)]
    topo: Topology,
    /// Policy: 0..4 or random, default, swift, flashlb, incremental, deepseek.
    #[arg(long)]
    policy: String,
    /// A policy parameter, `KEY=VALUE` (repeatable; `README.md`, "Policy parameters"). From
    /// the default layout the incremental policy's `cold_start` defaults to 1 (every layer is
    /// rebuilt).
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
    params: Vec<Param>,
    /// The current placement (expert-map JSON); default: the default layout.
    #[arg(long)]
    current: Option<PathBuf>,
    /// Seed of randomised policies.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to write the new expert map.
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    cost: CostArgs,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(a: &PlanArgs, io: &mut Io) -> Result<ExitCode, String> {
    let kind = parse_policy(&a.policy)?;
    // Checks the parameters before any file is read.
    policy_with(kind, &a.params).map_err(|e| format!("--param: {e}"))?;
    if let Some(out) = &a.out {
        let mut inputs = vec![a.loads.as_path()];
        inputs.extend(a.current.as_deref());
        eplb_runtime::fsio::refuse_overwrite_input(out, &inputs).map_err(|e| e.to_string())?;
    }
    a.cost.resolve()?;
    let bytes = io.read(&a.loads)?;
    // One parse, after the bounded scan: per-slot loads are the one format that needs a
    // placement. The trace's model is read after it, without building the counts.
    let heat = load_heat(&bytes, None).map_err(|e| match e {
        eplb_map::Error::NeedsPlacement => format!(
            "{}: per-slot loads need a placement; use `eplb hotness` or convert to [L][N]",
            a.loads.display()
        ),
        e => format!("{}: {e}", a.loads.display()),
    })?;
    let basis = a
        .cost
        .resolve_for_trace(eplb_sim::replay::trace_model(&bytes).0)?;
    drop(bytes);
    warn_heat(&heat, &a.loads);
    let redundant = super::args::setting(
        "--redundant",
        a.redundant,
        eplb_core::settings::redundant_experts,
    )?;
    let shape = layout_shape(&heat, a.ranks, redundant, &a.topo)?;
    let mut default = vec![0u16; shape.placement_len()];
    Layout::Default
        .fill(&shape, &mut default)
        .map_err(|e| e.to_string())?;
    let current = match &a.current {
        Some(p) => read_current(io, p, &shape)?,
        None => default.clone(),
    };
    let (params, rebuilt) = one_shot_params(kind, &a.params, current == default);
    let policy = policy_with(kind, &params).map_err(|e| format!("--param: {e}"))?;
    let samples = (heat.windows() > 1).then(|| (heat.windows(), heat.as_slice().to_vec()));
    // The shape's range, the policy's topology and its buffer sizes, before any allocation.
    eplb_policies::buffer_lens(&policy, &shape)
        .map_err(|e| format!("policy {}: {e}", kind.name()))?;
    let req = PlanRequest {
        cycle: 1,
        current,
        live: eplb_core::LiveSet::all(shape.ranks()).map_err(|e| e.to_string())?,
        loads: heat.summed(),
        samples,
        seed: a.seed,
    };
    let mut host = PolicyHost::new(Box::new(policy), shape);
    let plan = plan_once(&mut host, &req).map_err(|e| match &a.current {
        Some(p) => format!("policy {} on --current {}: {e}", kind.name(), p.display()),
        None => format!("policy {}: {e}", kind.name()),
    })?;
    if plan.summary().colocated_rows > 0 {
        errln!(
            "warning: the plan holds an expert twice on {} device rows (the second copy gets no tokens under log2phy)",
            plan.summary().colocated_rows
        );
    }
    let mut copies = vec![0u16; shape.experts()];
    let lower: Vec<f64> = req
        .loads
        .chunks_exact(shape.experts())
        .map(|w| metrics::lower_bound_par(&shape, w, &mut copies).unwrap_or(1.0))
        .collect();
    if let Some(out) = &a.out {
        let p = Placement::new(shape, plan.placement()).map_err(|e| e.to_string())?;
        eplb_runtime::fsio::write_atomic(out, to_json(&p).as_bytes())
            .map_err(|e| format!("{}: {e}", out.display()))?;
    }
    let elapsed_us = plan.elapsed().as_secs_f64() * 1e6;
    let cost = move_cost(
        &shape,
        &req.current,
        plan.placement(),
        basis.payload.total_bytes(),
    )
    .map_err(|e| e.to_string())?;
    if a.json {
        let mut v = json!({
            "policy": kind.name(),
            "layers": shape.layers(),
            "par_before": plan.par_before(),
            "par_after": plan.par_after(),
            "lower_bound": lower,
            "moves": plan.summary().moves,
            "elapsed_us": elapsed_us,
            "changed_layers": plan.summary().changed_layers,
            "colocated_rows": plan.summary().colocated_rows,
        });
        add_plan_cost(&mut v, &cost, &basis);
        outln!(io, "{v}");
    } else {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        outln!(
            io,
            "policy {}: {} layers, R={} S={} X={}",
            kind.name(),
            shape.layers(),
            shape.ranks(),
            shape.slots_per_rank(),
            shape.redundant()
        );
        if rebuilt {
            outln!(
                io,
                "from the default layout: every layer rebuilt (cold_start=1; --param cold_start=5 for the loop's threshold)"
            );
        }
        outln!(
            io,
            "PAR (even split): before mean={:.4} max={:.4}, after mean={:.4} max={:.4}, lower bound mean={:.4}",
            plan.summary().before.mean,
            plan.summary().before.max,
            plan.summary().after.mean,
            plan.summary().after.max,
            mean(&lower)
        );
        outln!(
            io,
            "changed layers: {}, weight fetches: {}, policy time: {:.1} us",
            plan.summary().changed_layers,
            plan.summary().moves,
            elapsed_us
        );
        outln!(io, "{}", basis.describe());
        outln!(io, "{}", plan_cost_line(&cost, &basis));
        if let Some(out) = &a.out {
            outln!(io, "wrote {}", out.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The parameters of a one-shot plan: from the default layout, which has nothing to keep and
/// no later call to polish it, the incremental policy rebuilds every layer (`cold_start = 1`)
/// unless `--param cold_start` says otherwise; its default threshold is for the loop, where a
/// rebuild's extra fetches recur. Also whether that default was added.
fn one_shot_params(kind: PolicyKind, params: &[Param], from_default: bool) -> (Vec<Param>, bool) {
    let mut all = params.to_vec();
    let add = kind == PolicyKind::Incremental
        && from_default
        && !params.iter().any(|(k, _)| k == "cold_start");
    if add {
        all.insert(0, ("cold_start".to_owned(), 1.0));
    }
    (all, add)
}

/// The cost keys of `plan --json`.
fn add_plan_cost(v: &mut serde_json::Value, cost: &MoveCost, basis: &CostBasis) {
    v["bytes_moved"] = json!(cost.bytes_moved());
    v["bytes_per_layer"] = json!(cost.bytes_per_layer());
    v["transfer_ms"] = json!(cost.transfer_ms(&basis.link));
    v["transfer_ms_max_layer"] = json!(cost.transfer_ms_max_layer(&basis.link));
    v["payload"] = basis.payload_json();
    v["link"] = basis.link.to_json();
}

fn plan_cost_line(cost: &MoveCost, basis: &CostBasis) -> String {
    let max_layer = cost.bytes_per_layer().into_iter().max().unwrap_or(0);
    format!(
        "cost: {} expert copies, {} moved (at most {} in one layer); at {}: about {} for the update, the longest layer {} (busiest rank's link)",
        cost.transfers(),
        human_bytes(cost.bytes_moved()),
        human_bytes(max_layer),
        basis.link.name(),
        human_ms(cost.transfer_ms(&basis.link)),
        human_ms(cost.transfer_ms_max_layer(&basis.link))
    )
}
