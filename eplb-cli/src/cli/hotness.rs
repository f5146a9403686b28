//! `eplb hotness`: the hotness numbers of one placement under recorded heat.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use eplb_core::metrics::{self, Routing};
use eplb_map::heat::load_heat;
use eplb_map::map::{ReadOptions, read_map_json};

use super::args::{Io, warn_heat};

#[derive(Debug, Args)]
pub(super) struct HotnessArgs {
    /// The placement (expert-map JSON).
    #[arg(long)]
    map: PathBuf,
    /// Heat: a trace, an SGLang dump, a JSON array `[L][N]`, or per-slot loads `[L][R][S]`.
    #[arg(long)]
    loads: PathBuf,
    /// Also draw the rank loads per layer (log2phy routing) as an SVG heat map here.
    #[arg(long)]
    svg: Option<PathBuf>,
}

pub(super) fn run(a: &HotnessArgs, io: &mut Io) -> Result<ExitCode, String> {
    if let Some(out) = &a.svg {
        eplb_runtime::fsio::refuse_overwrite_input(out, &[a.map.as_path(), a.loads.as_path()])
            .map_err(|e| e.to_string())?;
    }
    let map = read_map_json(&io.read(&a.map)?, &ReadOptions::lenient())
        .map_err(|e| format!("{}: {e}", a.map.display()))?;
    for w in map.warnings() {
        errln!("warning: {}: {w}", a.map.display());
    }
    let shape = map.shape();
    let placement = map.placement().view().map_err(|e| e.to_string())?;
    let heat = load_heat(&io.read(&a.loads)?, Some(&placement))
        .map_err(|e| format!("{}: {e}", a.loads.display()))?;
    warn_heat(&heat, &a.loads);
    if heat.layers() != shape.layers() || heat.experts() > shape.experts() {
        return Err(format!(
            "{} has {} layers x {} experts, the map {} layers x {} experts",
            a.loads.display(),
            heat.layers(),
            heat.experts(),
            shape.layers(),
            shape.experts()
        ));
    }
    let loads = heat.summed();
    if loads.len() != shape.loads_len() {
        return Err(format!(
            "{}: {} experts per layer, the map has {}",
            a.loads.display(),
            heat.experts(),
            shape.experts()
        ));
    }
    let mut scratch = vec![0u32; metrics::scratch_len(&shape)];
    let mut ranks = vec![0.0; shape.ranks()];
    let mut even = vec![0.0; shape.layers()];
    let mut routed = vec![0.0; shape.layers()];
    let h_even = metrics::hotness(
        &placement,
        &loads,
        Routing::Even,
        &mut scratch,
        &mut ranks,
        &mut even,
    )
    .map_err(|e| e.to_string())?;
    let h_routed = metrics::hotness(
        &placement,
        &loads,
        Routing::Log2Phy,
        &mut scratch,
        &mut ranks,
        &mut routed,
    )
    .map_err(|e| e.to_string())?;
    outln!(
        io,
        "[Expert Hotness] current: mean={:.3} max={:.3}",
        h_even.mean,
        h_even.max
    );
    outln!(
        io,
        "under log2phy routing: mean={:.3} max={:.3}",
        h_routed.mean,
        h_routed.max
    );
    outln!(io, "layer  PAR(even)  PAR(log2phy)");
    for (l, (e, r)) in even.iter().zip(&routed).enumerate() {
        outln!(io, "{l:>5}  {e:>9.4}  {r:>12.4}");
    }
    if let Some(out) = &a.svg {
        let title = format!(
            "{} under {} (log2phy routing)",
            a.map.display(),
            a.loads.display()
        );
        let svg = crate::report::hotness_svg(&placement, &loads, Routing::Log2Phy, &title)?;
        eplb_runtime::fsio::write_atomic(out, svg.as_bytes())
            .map_err(|e| format!("{}: {e}", out.display()))?;
        outln!(io, "wrote {}", out.display());
    }
    Ok(ExitCode::SUCCESS)
}
