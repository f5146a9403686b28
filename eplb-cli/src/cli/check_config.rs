//! `eplb check-config`: an `eplb_config` (with its deployment facts) checked as the runtime
//! would at start-up.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use eplb_map::map::{ReadOptions, read_map_json};
use eplb_runtime::config::deployment::{Deployment, Hardware, QuantType, Role};
use eplb_runtime::config::{EplbConfig, MapRejected, ProcessEnv};

use super::args::{Io, parse_from_str, parse_quant};

/// The deployment facts of `check-config` (override the file's `deployment` object).
#[derive(Debug, Args)]
pub(super) struct DeploymentArgs {
    /// Hardware: A2, A3, 950PR, 950DT.
    #[arg(long, value_parser = parse_from_str::<Hardware>)]
    hardware: Option<Hardware>,
    /// MoE quant type: none, W8A8, W8A8-Dynamic, W4A8, MXFP4, MXFP8, W4A8MXFP4, W4A16, W4A16MXFP4.
    #[arg(long = "quant", alias = "quant-type", value_parser = parse_quant)]
    quant_type: Option<QuantType>,
    /// Fused MC2 is enabled.
    #[arg(long)]
    fused_mc2: bool,
    /// Node role: prefill, decode, colocated.
    #[arg(long, value_parser = parse_from_str::<Role>)]
    role: Option<Role>,
    /// Typical input length (tokens).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    input_len: Option<u32>,
    /// Typical concurrency (requests).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: Option<u32>,
    /// Physical experts per die.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    experts_per_die: Option<u32>,
    /// Tokens per die per forward.
    #[arg(long)]
    tokens_per_die: Option<u32>,
}

impl DeploymentArgs {
    fn facts(&self) -> Deployment {
        Deployment {
            hardware: self.hardware,
            quant_type: self.quant_type,
            fused_mc2: self.fused_mc2.then_some(true),
            role: self.role,
            input_len: self.input_len,
            concurrency: self.concurrency,
            experts_per_die: self.experts_per_die,
            tokens_per_die: self.tokens_per_die,
        }
    }
}

#[derive(Debug, Args)]
pub(super) struct CheckConfigArgs {
    /// `{"eplb_config": {...}}` or the inner object.
    file: PathBuf,
    /// Logical experts of the model (with --ranks: checks the redundancy divides).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    experts: Option<u16>,
    /// EP ranks (with `eplb_payoff_gate`: the gate is built for them).
    #[arg(long, value_parser = super::args::parse_ranks)]
    ranks: Option<u16>,
    /// Ranks per node (with --ranks and `eplb_payoff_gate`; default: one node).
    #[arg(long, value_parser = super::args::parse_ranks)]
    ranks_per_node: Option<u16>,
    #[command(flatten)]
    deployment: DeploymentArgs,
    /// One JSON object on stdout: `file`, `valid`, `mode`, `summary`, `deployment_facts`,
    /// `warnings`, `payoff_gate`.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(a: &CheckConfigArgs, io: &mut Io) -> Result<ExitCode, String> {
    let validator = |p: &Path| -> Result<(), MapRejected> {
        let mut opts = ReadOptions::lenient();
        if let Some(n) = a.experts {
            opts = opts.experts(n);
        }
        if let Some(r) = a.ranks {
            opts = opts.ranks(r);
        }
        let bytes = eplb_runtime::fsio::read_bounded(p, io.limit)?;
        read_map_json(&bytes, &opts)?;
        Ok(())
    };
    let overrides = a.deployment.facts();
    let cfg = match EplbConfig::from_file_with_limit(
        &a.file,
        io.limit,
        &ProcessEnv,
        Some(&validator),
        &overrides,
    ) {
        Ok(c) => c,
        Err(errors) => {
            for m in errors.messages() {
                errln!("error: {}: {m}", a.file.display());
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    // With a map file, the map decides the redundancy (the validator checked it against
    // --experts/--ranks); otherwise the configured redundancy must divide.
    if let (Some(n), Some(r), None) = (a.experts, a.ranks, cfg.expert_map_path())
        && let Err(e) = cfg.check_shape(n, r)
    {
        errln!("error: {}: {e}", a.file.display());
        return Ok(ExitCode::FAILURE);
    }
    // The gate the runtime would build: every default applied and every number checked, as
    // at start-up.
    let gate = match eplb_runtime::startup::resolve_payoff_gate(&cfg) {
        Ok(g) => g,
        Err(e) => {
            errln!("error: {}: {e}", a.file.display());
            return Ok(ExitCode::FAILURE);
        }
    };
    let step = match (&gate, a.ranks) {
        (Some(_), Some(ranks)) => {
            let info = eplb_runtime::startup::ModelInfo {
                layers: 1,
                experts: a.experts.unwrap_or(ranks),
                ranks,
                ranks_per_node: a.ranks_per_node.unwrap_or(ranks),
                groups: 1,
                max_num_seqs: 0,
                speculative_tokens: 0,
                tp_size: 0,
            };
            match eplb_runtime::startup::payoff_gate(&cfg, &info) {
                Ok(g) => g,
                Err(e) => {
                    errln!("error: {}: {e}", a.file.display());
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        _ => None,
    };
    let warnings = cfg.warnings();
    for w in &warnings {
        errln!("warning: {w}");
    }
    if a.json {
        let gate_json = gate.as_ref().map(|g| {
            let tm = &g.time;
            serde_json::json!({
                "model": tm.model.name,
                "hardware": tm.hardware.name,
                "role": g.role.name(),
                "tokens_per_rank": tm.tokens_per_rank,
                "quant_type": g.quant.name(),
                "fused_mc2": g.fused_mc2,
                "dtype": tm.model.dtype.name(),
                "expert_bytes": tm.expert_bytes,
                "iterations": g.iterations,
                "calibrated": g.calibration.is_some(),
                "ranks": step.map(|_| a.ranks),
                "step_other_ms": step.map(|s| s.step_other_ms),
            })
        });
        let v = serde_json::json!({
            "file": a.file.display().to_string(),
            "valid": true,
            "mode": cfg.mode().name(),
            "summary": cfg.summary(),
            "deployment_facts": cfg.deployment_facts().map(|d| d.summary()),
            "warnings": warnings,
            "payoff_gate": gate_json,
        });
        outln!(io, "{v}");
        return Ok(ExitCode::SUCCESS);
    }
    outln!(io, "{}: valid", a.file.display());
    outln!(io, "{}", cfg.summary());
    if let Some(d) = cfg.deployment_facts() {
        outln!(io, "deployment facts: {}", d.summary());
    }
    if let Some(g) = &gate {
        let mut line = format!("pay-off gate it builds: {}", g.summary());
        if let (Some(s), Some(r)) = (&step, a.ranks) {
            line.push_str(&format!(
                "; on {r} ranks the rest of the step is {:.3} ms",
                s.step_other_ms
            ));
        }
        outln!(io, "{line}");
    }
    Ok(ExitCode::SUCCESS)
}
