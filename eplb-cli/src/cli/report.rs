//! `eplb report`: several policies replayed over one trace, one self-contained HTML page.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use eplb_runtime::policies::Param;
use eplb_sim::{Replay, SimPolicy};

use super::args::{Io, ReplayArgs, parse_param};

#[derive(Debug, Args)]
pub(super) struct ReportArgs {
    #[command(flatten)]
    replay: ReplayArgs,
    /// `all`, or a comma-separated list of static, 0..4, random, default, swift, flashlb,
    /// incremental, deepseek (static is always run as the baseline).
    #[arg(long, default_value = "all")]
    policies: String,
    /// A policy parameter, `KEY=VALUE` (repeatable), for each listed policy that takes `KEY`
    /// (at least one must).
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
    params: Vec<Param>,
    /// Where to write the HTML page (atomically).
    #[arg(long)]
    out: PathBuf,
}

pub(super) fn run(
    a: &ReportArgs,
    argv: &[std::ffi::OsString],
    io: &mut Io,
) -> Result<ExitCode, String> {
    use crate::report::{PolicyList, ReportJob, shell_quote};
    let policies = PolicyList::parse(&a.policies)?;
    eplb_runtime::fsio::refuse_overwrite_input(&a.out, &[a.replay.trace.as_path()])
        .map_err(|e| e.to_string())?;
    if let Some(dir) = a.out.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        return Err(format!(
            "--out {}: {} is not a directory",
            a.out.display(),
            dir.display()
        ));
    }
    let (
        Replay {
            trace,
            name,
            model,
            basis,
            ..
        },
        base,
    ) = a.replay.load(io, SimPolicy::Static)?;
    let time = a
        .replay
        .run
        .time
        .spec_with(io)?
        .resolve(&basis, base.ranks_per_node)
        .map_err(|e| e.to_string())?;
    let words: Vec<String> = argv
        .iter()
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    let trace_name = name.unwrap_or_else(|| {
        a.replay.trace.file_name().map_or_else(
            || a.replay.trace.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        )
    });
    let report = crate::report::run(ReportJob {
        trace: &trace,
        trace_name,
        trace_model: model,
        base,
        policies,
        params: a.params.clone(),
        basis: &basis,
        time: &time,
        command: shell_quote(&words),
    })?;
    let html = crate::report::page::render(&report)?;
    eplb_runtime::fsio::write_atomic(&a.out, html.as_bytes())
        .map_err(|e| format!("{}: {e}", a.out.display()))?;
    outln!(io, "wrote {}", a.out.display());
    Ok(ExitCode::SUCCESS)
}
