//! Policies: `NativePolicy` (one policy on one shape, with its state, behind the runtime's
//! `PolicyHost`), DeepSeek's `rebalance_experts` contract, and the policies' parameter names.

use std::sync::{Arc, Mutex};

use eplb_core::metrics;
use eplb_core::{Layout, Placement, Shape};
use eplb_policies::deepseek::DeepSeek;
use eplb_policies::{AnyPolicy, Input, Policy, PolicyKind, Samples, Summary};
use eplb_runtime::planner::PolicyHost;
use numpy::ndarray::ArrayD;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArray3, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{make_shape, param_f64, placement_ids, read_ids, read_loads};
use crate::errors::{Error, err, guarded, guarded_cancel};

/// The names of the parameters `kind` takes, in order (the Rust parser's table).
pub(crate) fn param_names(kind: PolicyKind) -> Vec<&'static str> {
    kind.params().iter().map(|p| p.name).collect()
}

pub(crate) fn build_policy(
    kind: PolicyKind,
    params: Option<&Bound<'_, PyDict>>,
) -> PyResult<AnyPolicy> {
    let mut policy = AnyPolicy::new(kind);
    if let Some(d) = params {
        let mut items: Vec<(String, Bound<'_, PyAny>)> = Vec::new();
        for (k, v) in d.iter() {
            let key: String = k
                .extract()
                .map_err(|_| err("parameter names must be strings"))?;
            items.push((key, v));
        }
        // Sorted, so that the first error reported does not depend on the dict's order.
        items.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, v) in &items {
            // The name first: an unknown one is reported as such whatever its value.
            if !kind.params().iter().any(|p| p.name == key.as_str()) {
                let e = eplb_policies::ParamError::Unknown { policy: kind, key };
                return Err(Error::from(e).into());
            }
            let x = param_f64(key, v)?;
            policy.set_param(key, x).map_err(Error::from)?;
        }
    }
    Ok(policy)
}

pub(crate) fn parse_kind(name: &str) -> PyResult<PolicyKind> {
    name.parse::<PolicyKind>().map_err(|_| {
        err(format!(
            "unknown policy `{name}` (expected one of random, default, swift, flashlb, \
             incremental, deepseek or 0..4)"
        ))
    })
}

/// One policy on one shape, with its state (FlashLB's history, the incremental policy's
/// estimates) kept between calls. Calls on one object are serialised by a lock.
#[pyclass(frozen, module = "eplb._native")]
pub(crate) struct NativePolicy {
    shape: Shape,
    seed: u64,
    kind: PolicyKind,
    /// The policy with its buffers and state (`None` until the first call, and after `reset`):
    /// the runtime's [`PolicyHost`], which keeps the state of the last call that succeeded.
    /// Shared with the worker thread of a call (an interrupted call may still be running).
    inner: Arc<Mutex<Option<PolicyHost<AnyPolicy>>>>,
    template: Arc<AnyPolicy>,
}

/// What `Policy.rebalance` returns (`eplb.Rebalance`): the new placement and, per layer,
/// the PAR before and after, the moves and whether the layer changed; their means and maxima;
/// the rows holding an expert twice; the Rust policy call's wall time. Read-only.
#[pyclass(frozen, module = "eplb", name = "Rebalance")]
pub(crate) struct Rebalance {
    /// `[L, R, S]` int64: the new placement.
    #[pyo3(get)]
    placement: Py<PyArray3<i64>>,
    /// `[L]` float64: each layer's PAR under the loads, with the current placement.
    #[pyo3(get)]
    par_before: Py<PyArray1<f64>>,
    /// `[L]` float64: each layer's PAR under the loads, with the new placement.
    #[pyo3(get)]
    par_after: Py<PyArray1<f64>>,
    /// `[L]` bool: the layers whose placement changed.
    #[pyo3(get)]
    changed: Py<PyArray1<bool>>,
    /// `[L]` int64: the experts each layer must fetch (copies new to their rank).
    #[pyo3(get)]
    moves: Py<PyArray1<i64>>,
    /// The mean over layers of `par_before`.
    #[pyo3(get)]
    par_before_mean: f64,
    /// The largest of `par_before`.
    #[pyo3(get)]
    par_before_max: f64,
    /// The mean over layers of `par_after`.
    #[pyo3(get)]
    par_after_mean: f64,
    /// The largest of `par_after`.
    #[pyo3(get)]
    par_after_max: f64,
    /// Rows (layer, rank) of the new placement holding an expert twice (only `deepseek`).
    #[pyo3(get)]
    colocated_rows: usize,
    /// The wall time of the Rust policy call alone, in seconds (without the conversions).
    #[pyo3(get)]
    rust_seconds: f64,
    /// The sum of `moves`.
    #[pyo3(get)]
    moves_total: i64,
    /// The number of layers whose placement changed.
    changed_layers: usize,
    /// The number of layers.
    layers: usize,
}

#[pymethods]
impl Rebalance {
    /// The pickle's constructor (and a copy's): the fields as `__getnewargs__` lists them; the
    /// per-layer arrays must have one entry per layer of `placement`.
    #[new]
    #[pyo3(signature = (placement, par_before, par_after, changed, moves, par_before_mean, par_before_max, par_after_mean, par_after_max, colocated_rows, rust_seconds))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        placement: Bound<'_, PyArray3<i64>>,
        par_before: Bound<'_, PyArray1<f64>>,
        par_after: Bound<'_, PyArray1<f64>>,
        changed: Bound<'_, PyArray1<bool>>,
        moves: Bound<'_, PyArray1<i64>>,
        par_before_mean: f64,
        par_before_max: f64,
        par_after_mean: f64,
        par_after_max: f64,
        colocated_rows: usize,
        rust_seconds: f64,
    ) -> PyResult<Self> {
        let layers = placement.shape()[0];
        for (what, len) in [
            ("par_before", par_before.len()),
            ("par_after", par_after.len()),
            ("changed", changed.len()),
            ("moves", moves.len()),
        ] {
            if len != layers {
                return Err(err(format!(
                    "Rebalance: {what} has {len} entries, the placement {layers} layers"
                )));
            }
        }
        let changed_layers = changed.readonly().as_array().iter().filter(|&&c| c).count();
        let moves_total = moves.readonly().as_array().iter().sum();
        Ok(Self {
            placement: placement.unbind(),
            par_before: par_before.unbind(),
            par_after: par_after.unbind(),
            changed: changed.unbind(),
            moves: moves.unbind(),
            par_before_mean,
            par_before_max,
            par_after_mean,
            par_after_max,
            colocated_rows,
            rust_seconds,
            moves_total,
            changed_layers,
            layers,
        })
    }

    /// The arguments of `Rebalance(...)` that rebuild this one (pickle, `copy`).
    #[allow(clippy::type_complexity)]
    fn __getnewargs__<'py>(
        &self,
        py: Python<'py>,
    ) -> (
        Bound<'py, PyArray3<i64>>,
        Bound<'py, PyArray1<f64>>,
        Bound<'py, PyArray1<f64>>,
        Bound<'py, PyArray1<bool>>,
        Bound<'py, PyArray1<i64>>,
        f64,
        f64,
        f64,
        f64,
        usize,
        f64,
    ) {
        (
            self.placement.bind(py).clone(),
            self.par_before.bind(py).clone(),
            self.par_after.bind(py).clone(),
            self.changed.bind(py).clone(),
            self.moves.bind(py).clone(),
            self.par_before_mean,
            self.par_before_max,
            self.par_after_mean,
            self.par_after_max,
            self.colocated_rows,
            self.rust_seconds,
        )
    }

    fn __repr__(&self) -> String {
        format!(
            "Rebalance(layers={}, changed={}, moves={}, par {:.4} -> {:.4})",
            self.layers,
            self.changed_layers,
            self.moves_total,
            self.par_before_mean,
            self.par_after_mean
        )
    }
}

/// What the worker of one `rebalance` hands back.
struct Planned {
    placement: Vec<u16>,
    before: Vec<f64>,
    after: Vec<f64>,
    changed: Vec<bool>,
    moves: Vec<i64>,
    summary: Summary,
    rust_seconds: f64,
}

#[pymethods]
impl NativePolicy {
    #[new]
    #[pyo3(signature = (name, layers, experts, ranks, redundant, ranks_per_node=None, groups=None, seed=0, params=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: &str,
        layers: usize,
        experts: usize,
        ranks: usize,
        redundant: usize,
        ranks_per_node: Option<usize>,
        groups: Option<usize>,
        seed: u64,
        params: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let kind = parse_kind(name)?;
        let template = build_policy(kind, params)?;
        let shape = make_shape(layers, experts, ranks, redundant, ranks_per_node, groups)?;
        if kind == PolicyKind::DeepSeek {
            // Checked here rather than at the first call: hierarchical needs N % G == 0.
            let hier = shape.groups().is_multiple_of(shape.nodes());
            if hier && !shape.experts().is_multiple_of(shape.groups()) {
                return Err(err(format!(
                    "deepseek: {} experts do not split into {} groups",
                    shape.experts(),
                    shape.groups()
                )));
            }
        }
        Ok(Self {
            shape,
            seed,
            kind,
            inner: Arc::new(Mutex::new(None)),
            template: Arc::new(template),
        })
    }

    /// The canonical policy name.
    #[getter]
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// `(layers, experts, ranks, slots_per_rank, ranks_per_node, groups)`.
    #[getter]
    fn shape(&self) -> (usize, usize, usize, usize, usize, usize) {
        let s = self.shape;
        (
            s.layers(),
            s.experts(),
            s.ranks(),
            s.slots_per_rank(),
            s.ranks_per_node(),
            s.groups(),
        )
    }

    /// A copy for a forked child: the same settings and a copy of the state, or a fresh state
    /// when a call was running at the fork (its lock can never be released in the child).
    fn fork_copy(&self) -> Self {
        let state = match self.inner.try_lock() {
            Ok(g) => g.clone(),
            Err(_) => None,
        };
        Self {
            shape: self.shape,
            seed: self.seed,
            kind: self.kind,
            inner: Arc::new(Mutex::new(state)),
            template: Arc::clone(&self.template),
        }
    }

    /// Forgets the state (the next call starts fresh).
    fn reset(&self) {
        if let Ok(mut g) = self.inner.lock() {
            *g = None;
        }
    }

    #[pyo3(signature = (loads, current=None, samples=None))]
    fn rebalance<'py>(
        &self,
        py: Python<'py>,
        loads: &Bound<'py, PyAny>,
        current: Option<&Bound<'py, PyAny>>,
        samples: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Rebalance> {
        let shape = self.shape;
        let (l, n) = (shape.layers(), shape.experts());
        let (ldims, loads_v) = read_loads(loads, "loads", &[2])?;
        if ldims != [l, n] {
            return Err(err(format!(
                "loads: shape {ldims:?} does not match [L={l}, N={n}]"
            )));
        }
        let current_v = match current {
            Some(c) => {
                let (dims, ids) = read_ids(c, "current", &[2, 3])?;
                placement_ids("current", &shape, &dims, &ids)?
            }
            None => {
                let mut v = vec![0u16; shape.placement_len()];
                Layout::default()
                    .fill(&shape, &mut v)
                    .map_err(Error::from)?;
                v
            }
        };
        let samples_v = match samples {
            Some(s) => {
                let (dims, v) = read_loads(s, "samples", &[3])?;
                if dims[1..] != [l, n] || dims[0] == 0 {
                    return Err(err(format!(
                        "samples: shape {dims:?} does not match [T >= 1, L={l}, N={n}]"
                    )));
                }
                Some((dims[0], v))
            }
            None => None,
        };
        let (seed, kind) = (self.seed, self.kind);
        let (inner, template) = (Arc::clone(&self.inner), Arc::clone(&self.template));
        let planned = guarded_cancel(py, move |cancel| {
            let mut guard = inner
                .lock()
                .map_err(|_| "the policy's lock was poisoned by an earlier failure")?;
            let host = guard.get_or_insert_with(|| {
                PolicyHost::new(Box::new(AnyPolicy::clone(&template)), shape)
            });
            let cur = Placement::new(shape, &current_v).map_err(|e| format!("current: {e}"))?;
            let smp = match &samples_v {
                Some((t, v)) => {
                    Some(Samples::new(&shape, *t, v).map_err(|e| format!("samples: {e}"))?)
                }
                None => None,
            };
            let input = Input::new(cur, &loads_v, smp, seed)?;
            let outcome = host.plan(0, &input);
            // The state advances only when the plan succeeded and the caller still waits for it
            // (an interrupted call leaves the state as it was).
            host.settle(0, outcome.is_ok() && !cancel.is_set(), false);
            let plan = outcome.map_err(|e| format!("{}: {e}", kind.name()))?;
            let per = shape.slots_per_layer();
            let moves = current_v
                .chunks_exact(per)
                .zip(plan.placement().chunks_exact(per))
                .map(|(o, nw)| metrics::moves(o, nw, shape.slots_per_rank()) as i64)
                .collect();
            Ok(Planned {
                changed: plan.changed().to_vec(),
                before: plan.par_before().to_vec(),
                after: plan.par_after().to_vec(),
                summary: *plan.summary(),
                rust_seconds: plan.elapsed().as_secs_f64(),
                moves,
                placement: plan.into_placement(),
            })
        })?;
        let (r, s) = (shape.ranks(), shape.slots_per_rank());
        let p: Vec<i64> = planned.placement.iter().map(|&e| i64::from(e)).collect();
        let placement = ArrayD::from_shape_vec(vec![l, r, s], p)
            .map_err(Error::from)?
            .into_pyarray(py)
            .cast_into::<PyArray3<i64>>()?;
        let Planned {
            before,
            after,
            changed,
            moves,
            summary,
            rust_seconds,
            ..
        } = planned;
        Ok(Rebalance {
            placement: placement.unbind(),
            par_before: PyArray1::from_vec(py, before).unbind(),
            par_after: PyArray1::from_vec(py, after).unbind(),
            changed_layers: changed.iter().filter(|&&c| c).count(),
            changed: PyArray1::from_vec(py, changed).unbind(),
            moves_total: moves.iter().sum(),
            moves: PyArray1::from_vec(py, moves).unbind(),
            par_before_mean: summary.before.mean,
            par_before_max: summary.before.max,
            par_after_mean: summary.after.mean,
            par_after_max: summary.after.max,
            colocated_rows: summary.colocated_rows,
            rust_seconds,
            layers: l,
        })
    }
}

/// `(phy2log, log2phy, logcnt)`.
type DeepSeekMaps<'py> = (
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray3<i64>>,
    Bound<'py, PyArray2<i64>>,
);

/// DeepSeek's `rebalance_experts` contract: `(phy2log [L,P], log2phy [L,N,P-N+1], logcnt [L,N])`.
#[pyfunction]
pub(crate) fn rebalance_experts<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    num_replicas: usize,
    num_groups: usize,
    num_nodes: usize,
    num_gpus: usize,
) -> PyResult<DeepSeekMaps<'py>> {
    let (dims, w) = read_loads(weight, "weight", &[2])?;
    let (l, n) = (dims[0], dims[1]);
    if num_gpus == 0 || num_nodes == 0 || num_groups == 0 {
        return Err(err(format!(
            "num_gpus = {num_gpus}, num_nodes = {num_nodes} and num_groups = {num_groups} must be at least 1"
        )));
    }
    if !num_replicas.is_multiple_of(num_gpus) {
        return Err(err(format!(
            "num_replicas = {num_replicas} is not a multiple of num_gpus = {num_gpus}"
        )));
    }
    if num_replicas < n {
        return Err(err(format!(
            "num_replicas = {num_replicas} is below the {n} logical experts"
        )));
    }
    // DeepSeek: hierarchical when the groups divide into the nodes, else global.
    let (rpn, groups) = if num_groups.is_multiple_of(num_nodes) {
        if !num_gpus.is_multiple_of(num_nodes) {
            return Err(err(format!(
                "num_gpus = {num_gpus} is not a multiple of num_nodes = {num_nodes}"
            )));
        }
        if !n.is_multiple_of(num_groups) {
            return Err(err(format!(
                "{n} experts do not split into num_groups = {num_groups}"
            )));
        }
        (num_gpus / num_nodes, num_groups)
    } else {
        (num_gpus, 1)
    };
    let shape = make_shape(l, n, num_gpus, num_replicas - n, Some(rpn), Some(groups))?;
    // The placement and each slot's replica rank (DeepSeek's `phyrank`), so that `log2phy`
    // lists an expert's replicas in the order DeepSeek's does: the order they were created.
    let (placement, ranks) = guarded(py, move || {
        let policy = DeepSeek::new();
        policy
            .check_shape(&shape)
            .map_err(|e| format!("deepseek: {e}"))?;
        let mut current = vec![0u16; shape.placement_len()];
        Layout::default().fill(&shape, &mut current)?;
        let cur = Placement::new(shape, &current)?;
        let input = Input::new(cur, &w, None, 0).map_err(|e| format!("weight: {e}"))?;
        let mut scratch = vec![0u64; policy.scratch_len(&shape)];
        let mut placement = vec![0u16; shape.placement_len()];
        let mut ranks = vec![0u16; shape.placement_len()];
        policy
            .place_ranked(&input, &mut scratch, &mut placement, Some(&mut ranks))
            .map_err(|e| format!("deepseek: {e}"))?;
        Ok((placement, ranks))
    })?;
    let p = num_replicas;
    let width = p - n + 1;
    let mut phy2log = Vec::with_capacity(l * p);
    let mut log2phy = vec![-1i64; l * n * width];
    let mut logcnt = vec![0i64; l * n];
    for (layer, (row, rank_row)) in placement
        .chunks_exact(p)
        .zip(ranks.chunks_exact(p))
        .enumerate()
    {
        for (slot, (&e, &k)) in row.iter().zip(rank_row).enumerate() {
            let (e, k) = (usize::from(e), usize::from(k));
            phy2log.push(e as i64);
            logcnt[layer * n + e] += 1;
            // Replica `k` of `e` (DeepSeek's `log2phy.scatter_` at `phy2log * width + phyrank`).
            if let Some(x) = log2phy.get_mut((layer * n + e) * width + k) {
                *x = slot as i64;
            }
        }
    }
    let to3 = |v: Vec<i64>, d: [usize; 3]| -> PyResult<Bound<'py, PyArray3<i64>>> {
        ArrayD::from_shape_vec(d.to_vec(), v)
            .map_err(Error::from)?
            .into_pyarray(py)
            .cast_into::<PyArray3<i64>>()
            .map_err(PyErr::from)
    };
    let to2 = |v: Vec<i64>, d: [usize; 2]| -> PyResult<Bound<'py, PyArray2<i64>>> {
        ArrayD::from_shape_vec(d.to_vec(), v)
            .map_err(Error::from)?
            .into_pyarray(py)
            .cast_into::<PyArray2<i64>>()
            .map_err(PyErr::from)
    };
    Ok((
        to2(phy2log, [l, p])?,
        to3(log2phy, [l, n, width])?,
        to2(logcnt, [l, n])?,
    ))
}

/// Policy names and the parameters each takes.
#[pyfunction]
pub(crate) fn policy_params() -> Vec<(&'static str, Vec<&'static str>)> {
    PolicyKind::ALL
        .iter()
        .map(|&k| (k.name(), param_names(k)))
        .collect()
}
