//! What the engine adapters share, in Rust: slot keeping, folding slot loads into expert loads,
//! the logical maps of a `phy2log`, and the repair of an engine's current placement. The
//! adapters (`eplb.integrations`) are glue over these.

use numpy::ndarray::ArrayD;
use numpy::{IntoPyArray, PyArray2, PyArray3, PyArrayDyn};
use pyo3::prelude::*;

use crate::convert::{read_ids, read_loads};
use crate::errors::{err, guarded};

/// `[L, R, S]` from a `[L, R, S]` or `[L, R*S]` integer array, with the shape's three sizes.
fn rows_of(what: &str, dims: &[usize], ranks: Option<usize>) -> PyResult<(usize, usize, usize)> {
    match (dims, ranks) {
        ([l, r, s], _) => Ok((*l, *r, *s)),
        ([l, p], Some(r)) if r > 0 && p % r == 0 => Ok((*l, r, p / r)),
        _ => Err(err(format!(
            "{what}: expected [L, R, S] (or [L, R*S] with the rank count), got shape {dims:?}"
        ))),
    }
}

/// One rank's row of `new` reordered so that every expert the rank keeps stays in its old slot
/// (one old slot per copy the new row has, old slots in order), the other new entries filling
/// the remaining slots in their order. The multiset of the row is the new one's.
fn keep_row(old: &[i64], new: &[i64], out: &mut [i64]) {
    let mut used = vec![false; new.len()];
    let mut placed = vec![false; old.len()];
    for (s, &e) in old.iter().enumerate() {
        if let Some(j) = (0..new.len()).find(|&j| !used[j] && new[j] == e) {
            used[j] = true;
            placed[s] = true;
            out[s] = e;
        }
    }
    let mut rest = new.iter().zip(&used).filter(|(_, u)| !**u).map(|(e, _)| *e);
    for (s, done) in placed.iter().enumerate() {
        if !done {
            out[s] = rest.next().unwrap_or(-1);
        }
    }
}

/// `new` (`[L, R, S]`, or `[L, R*S]` with `ranks`) with each rank's row reordered so that an
/// expert the rank keeps stays in its old slot (one old slot per copy the new row has); the
/// same shape as `new`. `old` may hold -1 (an empty slot) and copies of one expert on a rank.
#[pyfunction]
#[pyo3(signature = (old, new, ranks=None))]
pub(crate) fn keep_slots<'py>(
    py: Python<'py>,
    old: &Bound<'py, PyAny>,
    new: &Bound<'py, PyAny>,
    ranks: Option<usize>,
) -> PyResult<Bound<'py, PyArrayDyn<i64>>> {
    let (odims, o) = read_ids(old, "old", &[2, 3])?;
    let (ndims, n) = read_ids(new, "new", &[2, 3])?;
    if odims != ndims {
        return Err(err(format!(
            "old: shape {odims:?} is not the new placement's {ndims:?}"
        )));
    }
    let (_, _, s) = rows_of("new", &ndims, ranks)?;
    let out = guarded(py, move || {
        let mut out = vec![-1i64; n.len()];
        if s > 0 {
            for ((orow, nrow), row) in o
                .chunks_exact(s)
                .zip(n.chunks_exact(s))
                .zip(out.chunks_exact_mut(s))
            {
                keep_row(orow, nrow, row);
            }
        }
        Ok(out)
    })?;
    ArrayD::from_shape_vec(ndims, out)
        .map_err(|e| err(e.to_string()))
        .map(|a| a.into_pyarray(py))
}

/// Expert loads `[..., L, N]` (float64) from slot loads `[..., L, R, S]` through `table`
/// (`[L, R, S]`): every slot's load goes to the expert the table puts there.
#[pyfunction]
pub(crate) fn fold_slot_loads<'py>(
    py: Python<'py>,
    table: &Bound<'py, PyAny>,
    slot_loads: &Bound<'py, PyAny>,
    experts: usize,
) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
    let (tdims, t) = read_ids(table, "table", &[3])?;
    let (ldims, v) = read_loads(slot_loads, "slot_loads", &[3, 4])?;
    if ldims[ldims.len() - 3..] != tdims[..] {
        return Err(err(format!(
            "slot_loads: shape {ldims:?} does not end in the table's {tdims:?}"
        )));
    }
    if let Some((i, &e)) = t
        .iter()
        .enumerate()
        .find(|(_, e)| **e < 0 || **e as usize >= experts)
    {
        let (r, s) = (tdims[1], tdims[2]);
        return Err(err(format!(
            "table: layer {}, rank {}, slot {}: expert {e} is not in 0..{experts}",
            i / (r * s),
            i / s % r,
            i % s
        )));
    }
    let layers = tdims[0];
    let per_layer = tdims[1] * tdims[2];
    let lead: Vec<usize> = ldims[..ldims.len() - 3].to_vec();
    let out = guarded(py, move || {
        let windows = v.len() / (layers * per_layer).max(1);
        let mut out = vec![0f64; windows * layers * experts];
        for w in 0..windows {
            for l in 0..layers {
                let ids = &t[l * per_layer..(l + 1) * per_layer];
                let src = &v[(w * layers + l) * per_layer..(w * layers + l + 1) * per_layer];
                let dst = &mut out[(w * layers + l) * experts..(w * layers + l + 1) * experts];
                for (&e, &x) in ids.iter().zip(src) {
                    dst[e as usize] += x;
                }
            }
        }
        Ok(out)
    })?;
    let mut dims = lead;
    dims.extend([layers, experts]);
    ArrayD::from_shape_vec(dims, out)
        .map_err(|e| err(e.to_string()))
        .map(|a| a.into_pyarray(py))
}

/// `(log2phy, logcnt)`.
type LogicalMaps<'py> = (Bound<'py, PyArray3<i64>>, Bound<'py, PyArray2<i64>>);

/// `(log2phy [L, N, P-N+1] padded with -1, logcnt [L, N])` from `phy2log [L, P]`: each
/// expert's physical ids in ascending order; an entry of -1 (an empty slot) is skipped.
#[pyfunction]
pub(crate) fn derive_maps<'py>(
    py: Python<'py>,
    phy2log: &Bound<'py, PyAny>,
    experts: usize,
) -> PyResult<LogicalMaps<'py>> {
    let (dims, v) = read_ids(phy2log, "phy2log", &[2])?;
    let (layers, p) = (dims[0], dims[1]);
    if experts == 0 || p < experts {
        return Err(err(format!(
            "phy2log: {p} physical slots cannot hold {experts} experts"
        )));
    }
    let width = p - experts + 1;
    let mut log2phy = vec![-1i64; layers * experts * width];
    let mut logcnt = vec![0i64; layers * experts];
    for l in 0..layers {
        for (slot, &e) in v[l * p..(l + 1) * p].iter().enumerate() {
            if e == -1 {
                continue;
            }
            if e < 0 || e as usize >= experts {
                return Err(err(format!(
                    "phy2log: layer {l}, slot {slot}: expert {e} is not in 0..{experts}"
                )));
            }
            let e = e as usize;
            let k = logcnt[l * experts + e] as usize;
            if k >= width {
                return Err(err(format!(
                    "phy2log: layer {l}: expert {e} has more than {width} copies"
                )));
            }
            log2phy[(l * experts + e) * width + k] = slot as i64;
            logcnt[l * experts + e] += 1;
        }
    }
    let a = ArrayD::from_shape_vec(vec![layers, experts, width], log2phy)
        .map_err(|e| err(e.to_string()))?
        .into_pyarray(py)
        .cast_into::<PyArray3<i64>>()
        .map_err(|e| err(e.to_string()))?;
    let c = ArrayD::from_shape_vec(vec![layers, experts], logcnt)
        .map_err(|e| err(e.to_string()))?
        .into_pyarray(py)
        .cast_into::<PyArray2<i64>>()
        .map_err(|e| err(e.to_string()))?;
    Ok((a, c))
}

/// A valid `[L, R, S]` placement from an engine's current one (`[L, R, S]` or `[L, R*S]`), or
/// `None` when it cannot be used (another size; more experts missing than free slots).
///
/// Entries that are -1 (empty slots under elastic scale-up), out of range, or a second copy on
/// the same rank become free slots; free slots get the missing experts first (ascending id, in
/// slot order), then the lowest id the rank does not hold yet. Deterministic.
#[pyfunction]
pub(crate) fn repair_current<'py>(
    py: Python<'py>,
    current: &Bound<'py, PyAny>,
    layers: usize,
    experts: usize,
    ranks: usize,
    slots: usize,
) -> PyResult<Option<Bound<'py, PyArray3<i64>>>> {
    let Ok((dims, mut v)) = read_ids(current, "current", &[2, 3]) else {
        return Ok(None);
    };
    let fits = dims == [layers, ranks, slots] || dims == [layers, ranks * slots];
    if !fits || slots > experts {
        return Ok(None);
    }
    let per = ranks * slots;
    for l in 0..layers {
        let layer = &mut v[l * per..(l + 1) * per];
        let mut seen = vec![false; experts];
        let mut holes = Vec::new();
        for r in 0..ranks {
            for s in 0..slots {
                let i = r * slots + s;
                let e = layer[i];
                let dup = layer[r * slots..i].contains(&e);
                if e >= 0 && (e as usize) < experts && !dup {
                    seen[e as usize] = true;
                } else {
                    layer[i] = -1;
                    holes.push((r, s));
                }
            }
        }
        let missing: Vec<i64> = (0..experts)
            .filter(|&e| !seen[e])
            .map(|e| e as i64)
            .collect();
        if missing.len() > holes.len() {
            return Ok(None);
        }
        for (&(r, s), &e) in holes.iter().zip(&missing) {
            layer[r * slots + s] = e;
        }
        for &(r, s) in &holes[missing.len()..] {
            let row = &layer[r * slots..(r + 1) * slots];
            let free = (0..experts as i64).find(|e| !row.contains(e));
            layer[r * slots + s] = free.unwrap_or(-1);
        }
    }
    let a = ArrayD::from_shape_vec(vec![layers, ranks, slots], v)
        .map_err(|e| err(e.to_string()))?
        .into_pyarray(py)
        .cast_into::<PyArray3<i64>>()
        .map_err(|e| err(e.to_string()))?;
    Ok(Some(a))
}
