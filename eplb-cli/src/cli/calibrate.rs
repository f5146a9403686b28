//! `eplb calibrate`: fits the step model's free multipliers to measured step times
//! (`eplb_sim::calibrate`) and writes an `eplb-calibration/v1` file for `--calibration`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use eplb_core::time::ModelSpec;
use eplb_core::time::step::{Calibration, Overlap};
use eplb_sim::calibrate::{
    RecordingDefaults, calibration_json, fit, read_measured, read_recording,
};
use eplb_sim::cost::CostSpec;
use eplb_sim::time::TimeSpec;
use serde_json::json;

use super::args::{Io, parse_hardware, parse_overlap, parse_role};

#[derive(Debug, Args)]
pub(super) struct CalibrateArgs {
    /// Measured step times: a JSON array (or `{"points": [...]}`) or a CSV with columns
    /// role, tokens_per_rank, step_ms and optionally ranks, context_tokens, prompt_tokens, par
    /// (`docs/time-model.md`, "Calibration"); or a heat recording (`eplb-trace/v1`, line
    /// layout) whose windows carry `iteration_ms` (then `--role` says its role).
    #[arg(long)]
    measured: PathBuf,
    /// The role a heat recording given to `--measured` ran in: decode or prefill.
    #[arg(long, value_parser = parse_role)]
    role: Option<eplb_core::time::Role>,
    /// Write the calibration here (atomically).
    #[arg(long)]
    out: PathBuf,
    /// Model preset of the measured deployment.
    #[arg(long, value_parser = super::args::parse_model)]
    model: ModelSpec,
    /// Hardware preset of the measured deployment.
    #[arg(long, value_parser = parse_hardware)]
    hardware: String,
    /// EP ranks (points without a `ranks` column).
    #[arg(long, value_parser = super::args::parse_ranks)]
    ranks: u16,
    /// Ranks per node (default: the hardware preset's node).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    ranks_per_node: Option<u16>,
    /// Overlap the engine ran with: none (default) or two-batch.
    #[arg(long, value_parser = parse_overlap)]
    overlap: Option<Overlap>,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(a: &CalibrateArgs, io: &mut Io) -> Result<ExitCode, String> {
    eplb_runtime::fsio::refuse_overwrite_input(&a.out, &[a.measured.as_path()])
        .map_err(|e| e.to_string())?;
    let src = a.measured.display().to_string();
    let bytes = io.read(&a.measured)?;
    let defaults = RecordingDefaults {
        role: a.role,
        ranks: a.ranks,
        top_k: a.model.top_k,
    };
    let points = match read_recording(&bytes, &src, defaults).map_err(|e| e.to_string())? {
        Some(points) => points,
        None => read_measured(&bytes, &src, a.ranks).map_err(|e| e.to_string())?,
    };
    let cost = CostSpec {
        model: Some(a.model),
        ..CostSpec::default()
    }
    .resolve()
    .map_err(|e| crate::words::cost_error(&e))?;
    let spec = TimeSpec {
        hardware: Some(a.hardware.clone()),
        overlap: a.overlap,
        ..TimeSpec::default()
    };
    spec.check().map_err(|e| e.to_string())?;
    let f = fit(&spec, &cost, a.ranks_per_node, &points).map_err(|e| e.to_string())?;
    let report = json!({
        "fitted_on": {
            "measured": src,
            "model": cost.model,
            "hardware": a.hardware,
            "ranks": a.ranks,
            "ranks_per_node": a.ranks_per_node,
            "overlap": a.overlap.unwrap_or_default().name(),
            "points": points.len(),
        },
        "rms_relative_error": f.rms_rel,
        "max_relative_error": f.max_rel,
        "residuals": points.iter().zip(&f.residuals).map(|(p, (m, pr))| json!({
            "role": p.role.name(),
            "ranks": p.ranks,
            "tokens_per_rank": p.tokens_per_rank,
            "par": p.par,
            "measured_ms": m,
            "predicted_ms": pr,
            "relative_error": (pr - m) / m,
        })).collect::<Vec<_>>(),
    });
    let v = calibration_json(&f.calibration, report);
    let text = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
    eplb_runtime::fsio::write_atomic(&a.out, format!("{text}\n").as_bytes())
        .map_err(|e| format!("{}: {e}", a.out.display()))?;
    if a.json {
        outln!(io, "{v}");
    } else {
        let c = f.calibration.as_array();
        let names = Calibration::NAMES;
        outln!(
            io,
            "fitted {} point(s): {}",
            points.len(),
            names
                .iter()
                .zip(c)
                .map(|(n, x)| format!("{n} x{x:.3}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for (p, (m, pr)) in points.iter().zip(&f.residuals) {
            outln!(
                io,
                "  {} EP{} T={} PAR {}: measured {m:.3} ms, fitted {pr:.3} ms ({:+.1}%)",
                p.role.name(),
                p.ranks,
                p.tokens_per_rank,
                p.par,
                (pr - m) / m * 100.0
            );
        }
        outln!(
            io,
            "rms relative error {:.2}%, max {:.2}%; wrote {}",
            f.rms_rel * 100.0,
            f.max_rel * 100.0,
            a.out.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
