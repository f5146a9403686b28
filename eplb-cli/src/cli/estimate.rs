//! `eplb estimate`: prices one step of a deployment without a trace (`eplb_sim::estimate`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use eplb_core::time::ModelSpec;
use eplb_core::time::Role;
use eplb_core::time::step::Overlap;
use eplb_sim::cost::CostSpec;
use eplb_sim::estimate::estimate_step;
use eplb_sim::time::TimeSpec;

use super::args::{Io, parse_hardware, parse_overlap, parse_role, read_calibration_arg};

#[derive(Debug, Args)]
pub(super) struct EstimateArgs {
    /// Model preset: deepseek-v3 (= deepseek-r1), qwen3-235b, qwen3-30b, deepseek-v2-lite,
    /// kimi-k2, mixtral-8x7b.
    #[arg(long, value_parser = super::args::parse_model)]
    model: ModelSpec,
    /// Hardware preset: a2, a3, 950pr, 950dt, h100, h200, b200, h800, gb200.
    #[arg(long, value_parser = parse_hardware)]
    hardware: String,
    /// EP ranks.
    #[arg(long, value_parser = super::args::parse_ranks)]
    ranks: u16,
    /// Ranks per node (default: the hardware preset's node, printed).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    ranks_per_node: Option<u16>,
    /// decode or prefill.
    #[arg(long, value_parser = parse_role)]
    role: Role,
    /// Tokens per step per rank.
    #[arg(long)]
    tokens_per_rank: f64,
    /// Mean context of a decode request, tokens (default 4096).
    #[arg(long)]
    context_tokens: Option<f64>,
    /// Prompt length of a prefill request, tokens (default 4096).
    #[arg(long)]
    prompt_tokens: Option<f64>,
    /// Overlap of computation and all-to-all: none (default) or two-batch.
    #[arg(long, value_parser = parse_overlap)]
    overlap: Option<Overlap>,
    /// The busiest rank's MoE token load over the mean (1.0 = balanced; default 1.0).
    #[arg(long, default_value_t = 1.0)]
    par: f64,
    /// An `eplb calibrate` output (eplb-calibration/v1).
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(a: &EstimateArgs, io: &mut Io) -> Result<ExitCode, String> {
    let cost = CostSpec {
        model: Some(a.model),
        ..CostSpec::default()
    }
    .resolve()
    .map_err(|e| crate::words::cost_error(&e))?;
    let spec = TimeSpec {
        hardware: Some(a.hardware.clone()),
        role: Some(a.role),
        tokens_per_rank: Some(a.tokens_per_rank),
        context_tokens: a.context_tokens,
        prompt_tokens: a.prompt_tokens,
        overlap: a.overlap,
        calibration: read_calibration_arg(a.calibration.as_deref(), io)?,
        ..TimeSpec::default()
    };
    spec.check().map_err(|e| e.to_string())?;
    let est =
        estimate_step(&spec, &cost, a.ranks, a.ranks_per_node, a.par).map_err(|e| e.to_string())?;
    if a.json {
        outln!(io, "{}", est.to_json());
    } else {
        outln!(io, "{}", est.describe());
    }
    Ok(ExitCode::SUCCESS)
}
