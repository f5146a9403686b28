//! What the engine adapters share, in Rust: slot keeping, folding slot loads into expert loads,
//! the logical maps of a `phy2log`, the repair of an engine's current placement, policy names,
//! and the pay-off gate (the runtime's setting and gate). The adapters (`eplb.integrations`)
//! are glue over these.

use eplb_runtime::config::EplbConfig;
use eplb_runtime::startup::{ModelInfo, payoff_gate};
use numpy::ndarray::ArrayD;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArray3, PyArrayDyn};
use pyo3::prelude::*;

use crate::convert::{make_shape, placement_ids, read_ids, read_loads};
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

/// The canonical name of a policy given by name or number (`0..4`), read from the Rust
/// parser (`PolicyKind`'s `FromStr`), so the adapters keep no table of their own.
#[pyfunction]
pub(crate) fn policy_name(name: &str) -> PyResult<&'static str> {
    crate::policy::parse_kind(name.trim()).map(|k| k.name())
}

/// What one [`PayoffGate::apply`] returns: the gated plan, which layers move, and
/// `(changed, moved, saving share, forgone share, stall ms)`.
type Gated<'py> = (
    Bound<'py, PyArray3<i64>>,
    Bound<'py, PyArray1<bool>>,
    (usize, usize, f64, f64, f64),
);

/// An engine adapter's pay-off gate: the `eplb_payoff_gate` setting, checked by the runtime's
/// config parser (the messages of `eplb check-config`), and applied with the runtime's gate
/// (`eplb_runtime::startup::payoff_gate`, `eplb_core::time::gate::Gate::apply`).
#[pyclass(frozen, module = "eplb._native")]
pub(crate) struct PayoffGate {
    cfg: EplbConfig,
    text: String,
}

#[pymethods]
impl PayoffGate {
    /// `text` is the JSON value of `eplb_payoff_gate` (`true`, `false` or an object); `source`
    /// names where it came from in error messages (`EPLB_PAYOFF_GATE`, ...).
    #[new]
    fn new(text: &str, source: &str) -> PyResult<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| err(format!("{source}: not JSON ({e})")))?;
        let doc = serde_json::json!({ "eplb_payoff_gate": value });
        let env = std::collections::BTreeMap::<String, String>::new();
        let cfg = EplbConfig::from_value(&doc, &env)
            .map_err(|e| err(format!("{source}: {}", e.messages().join("; "))))?;
        Ok(Self {
            cfg,
            text: text.to_owned(),
        })
    }

    /// The JSON text it was built from.
    #[getter]
    fn text(&self) -> &str {
        &self.text
    }

    /// Whether the gate is on (`false` turns it off).
    #[getter]
    fn on(&self) -> bool {
        self.cfg.payoff_gate().is_some()
    }

    /// The setting as `eplb check-config` summarises it (`eplb_payoff_gate: on (model ...)`),
    /// or `eplb_payoff_gate: off`.
    #[getter]
    fn summary(&self) -> String {
        self.cfg
            .summary()
            .lines()
            .find(|l| l.starts_with("eplb_payoff_gate:"))
            .map_or_else(|| "eplb_payoff_gate: off".to_owned(), str::to_owned)
    }

    /// The gate applied to `plan` (`[L, R, S]`) against `current` (`[L, R, S]`, every expert
    /// held) under the logical `loads` (`[L, N]`): a changed layer whose move does not pay
    /// over `iterations` (default: the config's heat plus algorithm interval) gets its
    /// `current` rows back. `ranks_per_node` (default: all ranks on one node) decides which
    /// copies cross nodes. Every layer is one cycle old (no ages are kept between calls).
    #[pyo3(signature = (current, plan, loads, ranks_per_node=None, iterations=None))]
    fn apply<'py>(
        &self,
        py: Python<'py>,
        current: &Bound<'py, PyAny>,
        plan: &Bound<'py, PyAny>,
        loads: &Bound<'py, PyAny>,
        ranks_per_node: Option<usize>,
        iterations: Option<u64>,
    ) -> PyResult<Gated<'py>> {
        let (cdims, cur) = read_ids(current, "current", &[3])?;
        let (pdims, new) = read_ids(plan, "plan", &[3])?;
        let (ldims, w) = read_loads(loads, "loads", &[2])?;
        if cdims != pdims {
            return Err(err(format!(
                "plan: shape {pdims:?} is not the current placement's {cdims:?}"
            )));
        }
        let (l, r, s) = (cdims[0], cdims[1], cdims[2]);
        if ldims[0] != l {
            return Err(err(format!(
                "loads: shape {ldims:?} does not have the placement's {l} layers"
            )));
        }
        let n = ldims[1];
        let redundant = (r * s).checked_sub(n).ok_or_else(|| {
            err(format!(
                "loads: {n} experts do not fit in {r} ranks x {s} slots"
            ))
        })?;
        let rpn = ranks_per_node.filter(|&g| g > 0 && r.is_multiple_of(g));
        let shape = make_shape(l, n, r, redundant, rpn, None)?;
        let cur = placement_ids("current", &shape, &cdims, &cur)?;
        let mut new = placement_ids("plan", &shape, &pdims, &new)?;
        let model = ModelInfo {
            layers: shape.layers() as u16,
            experts: shape.experts() as u16,
            ranks: shape.ranks() as u16,
            ranks_per_node: shape.ranks_per_node() as u16,
            groups: 1,
            max_num_seqs: 0,
            speculative_tokens: 0,
            tp_size: 0,
        };
        let gate = payoff_gate(&self.cfg, &model).map_err(|e| err(e.to_string()))?;
        let Some(mut gate) = gate else {
            return Err(err("eplb_payoff_gate is off"));
        };
        if let Some(it) = iterations {
            gate.iterations = it;
        }
        let (moved, sum, new) = guarded(py, move || {
            let (f, u) = eplb_core::time::gate::scratch_len(&shape);
            let (mut floats, mut words) = (vec![0.0; f], vec![0u32; u]);
            let mut moved = vec![false; shape.layers()];
            let sum = gate
                .apply(
                    &shape,
                    &cur,
                    &mut new,
                    &w,
                    eplb_core::time::gate::Scratch {
                        floats: &mut floats,
                        words: &mut words,
                        ages: &[],
                    },
                    &mut moved,
                )
                .map_err(|e| format!("eplb_payoff_gate: {e}"))?;
            Ok((moved, sum, new))
        })?;
        let p: Vec<i64> = new.iter().map(|&e| i64::from(e)).collect();
        let p = ArrayD::from_shape_vec(vec![l, r, s], p)
            .map_err(|e| err(e.to_string()))?
            .into_pyarray(py)
            .cast_into::<PyArray3<i64>>()
            .map_err(|e| err(e.to_string()))?;
        Ok((
            p,
            PyArray1::from_vec(py, moved),
            (
                sum.changed,
                sum.moved,
                sum.saving_share(),
                sum.forgone_share(),
                sum.stall_ms,
            ),
        ))
    }
}
