//! `eplb check-config`: an `eplb_config` (with its deployment facts) checked as the runtime
//! would at start-up.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use eplb_map::map::{ReadOptions, read_map_json};
use eplb_runtime::config::deployment::{Deployment, Hardware, QuantType, Role};
use eplb_runtime::config::{EplbConfig, MapRejected, ProcessEnv};

use super::args::{Io, parse_from_str};

/// The deployment facts of `check-config` (override the file's `deployment` object).
#[derive(Debug, Args)]
pub(super) struct DeploymentArgs {
    /// Hardware: A2, A3, 950PR, 950DT.
    #[arg(long, value_parser = parse_from_str::<Hardware>)]
    hardware: Option<Hardware>,
    /// MoE quant type: none, W8A8, W8A8-Dynamic, W4A8, MXFP4, MXFP8, W4A8MXFP4, W4A16, W4A16MXFP4.
    #[arg(long = "quant", alias = "quant-type", value_parser = parse_from_str::<QuantType>)]
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
    /// EP ranks.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    ranks: Option<u16>,
    #[command(flatten)]
    deployment: DeploymentArgs,
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
    for w in cfg.warnings() {
        errln!("warning: {w}");
    }
    outln!(io, "{}: valid", a.file.display());
    outln!(io, "{}", cfg.summary());
    if let Some(d) = cfg.deployment_facts() {
        outln!(io, "deployment facts: {}", d.summary());
    }
    Ok(ExitCode::SUCCESS)
}
