//! `eplb validate`: every problem of an expert-map JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use eplb_map::map::{ReadOptions, check_map_json};

use super::args::Io;

#[derive(Debug, Args)]
pub(super) struct ValidateArgs {
    /// The expert-map JSON.
    map: PathBuf,
    /// Logical experts of the model.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    experts: Option<u16>,
    /// EP ranks.
    #[arg(long, value_parser = super::args::parse_ranks)]
    ranks: Option<u16>,
    /// Accept an expert held twice on one device.
    #[arg(long)]
    allow_duplicates: bool,
}

pub(super) fn run(a: &ValidateArgs, io: &mut Io) -> Result<ExitCode, String> {
    let bytes = io.read(&a.map)?;
    let mut opts = if a.allow_duplicates {
        ReadOptions::lenient()
    } else {
        ReadOptions::strict()
    };
    if let Some(n) = a.experts {
        opts = opts.experts(n);
    }
    if let Some(r) = a.ranks {
        opts = opts.ranks(r);
    }
    let report = check_map_json(&bytes, &opts);
    match report.map {
        Some(map) if report.errors.is_empty() => {
            for w in map.warnings() {
                errln!("warning: {}: {w}", a.map.display());
            }
            let s = map.shape();
            outln!(
                io,
                "{}: valid: {} layers, {} devices x {} slots, {} experts, {} redundant",
                a.map.display(),
                s.layers(),
                s.ranks(),
                s.slots_per_rank(),
                s.experts(),
                s.redundant()
            );
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            for e in &report.errors {
                errln!("error: {}: {e}", a.map.display());
            }
            if report.truncated {
                errln!("error: {}: more problems not listed", a.map.display());
            }
            Ok(ExitCode::FAILURE)
        }
    }
}
