//! Maps and hotness: the expert-map JSON read, validated, written (through the CLI's bounded
//! reader and atomic writer) and rendered, and the PAR of a placement under some loads.

use std::path::PathBuf;

use eplb_core::Placement;
use eplb_core::metrics::{self, Routing};
use eplb_map::map::{ReadOptions, check_map_json, read_map_json, to_json};
use numpy::ndarray::ArrayD;
use numpy::{IntoPyArray, PyArray1, PyArray3};
use pyo3::prelude::*;

use crate::convert::{dim_u16, placement_arg, read_loads};
use crate::errors::{Error, err, guarded, guarded_short, os_error};

/// Per-layer PAR of `placement` under `loads`, and its mean and max.
#[pyfunction]
#[pyo3(signature = (placement, loads, routing="even"))]
pub(crate) fn hotness<'py>(
    py: Python<'py>,
    placement: &Bound<'py, PyAny>,
    loads: &Bound<'py, PyAny>,
    routing: &str,
) -> PyResult<(Bound<'py, PyArray1<f64>>, f64, f64)> {
    let routing = match routing {
        "even" => Routing::Even,
        "log2phy" => Routing::Log2Phy,
        o => {
            return Err(err(format!("routing `{o}`: expected `even` or `log2phy`")));
        }
    };
    let (ldims, w) = read_loads(loads, "loads", &[2])?;
    let (shape, v) = placement_arg(placement, Some(ldims[1]))?;
    if ldims[0] != shape.layers() {
        return Err(err(format!(
            "loads: {} layers, the placement has {}",
            ldims[0],
            shape.layers()
        )));
    }
    let (per, h) = guarded(py, move || {
        let p = Placement::new(shape, &v)?;
        let mut scratch = vec![0u32; metrics::scratch_len(&shape)];
        let mut ranks = vec![0.0; shape.ranks()];
        let mut per = vec![0.0; shape.layers()];
        let h = metrics::hotness(&p, &w, routing, &mut scratch, &mut ranks, &mut per)?;
        Ok((per, h))
    })?;
    Ok((PyArray1::from_vec(py, per), h.mean, h.max))
}

/// Reads `path` through the CLI's bounded reader in the guard (off the GIL, Ctrl-C answered):
/// a regular file of at most `limit` bytes (a FIFO or a device is refused without being
/// opened, so `/dev/zero` cannot grow without bound and a FIFO cannot block). I/O errors
/// raise Python's own `OSError` subclasses (`FileNotFoundError`, `PermissionError`, ...)
/// naming the path; the rest raise `EplbError`.
fn read_file(py: Python<'_>, path: &str, limit: u64) -> PyResult<Vec<u8>> {
    let (p, shown) = (PathBuf::from(path), path.to_owned());
    guarded(py, move || {
        eplb_runtime::fsio::read_bounded(&p, limit).map_err(|e| match e {
            eplb_runtime::fsio::ReadError::Io(io) => Error::Py(os_error(&io, Some(&shown))),
            other => Error::from(format!("{shown}: {other}")),
        })
    })
}

/// Reads a vLLM-Ascend expert-map JSON (co-located copies accepted) into `[L,R,S]` int64.
#[pyfunction]
#[pyo3(signature = (path, max_input_bytes = eplb_runtime::fsio::DEFAULT_INPUT_LIMIT))]
pub(crate) fn read_map<'py>(
    py: Python<'py>,
    path: &str,
    max_input_bytes: u64,
) -> PyResult<Bound<'py, PyArray3<i64>>> {
    let bytes = read_file(py, path, max_input_bytes)?;
    let path = path.to_owned();
    let (shape, ids) = guarded(py, move || {
        let m =
            read_map_json(&bytes, &ReadOptions::lenient()).map_err(|e| format!("{path}: {e}"))?;
        let ids: Vec<i64> = m
            .placement()
            .as_slice()
            .iter()
            .map(|&e| i64::from(e))
            .collect();
        Ok((m.shape(), ids))
    })?;
    ArrayD::from_shape_vec(
        vec![shape.layers(), shape.ranks(), shape.slots_per_rank()],
        ids,
    )
    .map_err(Error::from)?
    .into_pyarray(py)
    .cast_into::<PyArray3<i64>>()
    .map_err(PyErr::from)
}

/// Every problem of an expert-map JSON (strict: co-located copies are problems); empty = valid.
#[pyfunction]
#[pyo3(signature = (path, experts=None, ranks=None, max_input_bytes=eplb_runtime::fsio::DEFAULT_INPUT_LIMIT))]
pub(crate) fn validate_map(
    py: Python<'_>,
    path: &str,
    experts: Option<usize>,
    ranks: Option<usize>,
    max_input_bytes: u64,
) -> PyResult<Vec<String>> {
    let mut opts = ReadOptions::strict();
    if let Some(n) = experts {
        opts = opts.experts(dim_u16("experts", n)?);
    }
    if let Some(r) = ranks {
        opts = opts.ranks(dim_u16("ranks", r)?);
    }
    let bytes = read_file(py, path, max_input_bytes)?;
    guarded(py, move || {
        let report = check_map_json(&bytes, &opts);
        let mut out: Vec<String> = report.errors.iter().map(|e| e.to_string()).collect();
        if report.truncated {
            out.push("more problems not listed".into());
        }
        Ok(out)
    })
}

/// The expert-map JSON of `placement`, as vLLM-Ascend's recorder writes it.
#[pyfunction]
pub(crate) fn map_json(py: Python<'_>, placement: &Bound<'_, PyAny>) -> PyResult<String> {
    let (shape, v) = placement_arg(placement, None)?;
    // A pure conversion of an in-memory placement: milliseconds at the largest shapes.
    guarded_short(py, || {
        let p = Placement::new(shape, &v)?;
        Ok(to_json(&p))
    })
}

/// Writes the expert-map JSON of `placement` to `path` as `eplb plan --out` does
/// (`eplb_runtime::fsio::write_atomic`): a regular file is replaced atomically keeping its
/// permissions, a symbolic link is followed to its file, a FIFO or a character device is written
/// through, anything else is refused (`EplbError`); an I/O failure is the `OSError` subclass
/// of its kind (`FileNotFoundError` for a missing directory, `PermissionError`, ...).
#[pyfunction]
pub(crate) fn write_map(
    py: Python<'_>,
    path: PathBuf,
    placement: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let (shape, v) = placement_arg(placement, None)?;
    let shown = path.display().to_string();
    let written = guarded(py, move || {
        let p = Placement::new(shape, &v)?;
        Ok(eplb_runtime::fsio::write_atomic(
            &path,
            to_json(&p).as_bytes(),
        ))
    })?;
    written.map_err(|e| {
        let refused = e
            .get_ref()
            .and_then(|r| r.downcast_ref::<eplb_runtime::fsio::WriteRefused>());
        match refused {
            Some(r) => err(format!("{shown}: {r}")),
            None => PyErr::from(std::io::Error::new(e.kind(), format!("{shown}: {e}"))),
        }
    })
}
