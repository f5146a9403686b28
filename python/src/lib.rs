//! `eplb._native`: the Rust side of the Python package `eplb`.
//!
//! Numpy in, numpy out. Every entry point checks its arrays (dtype, number of dimensions,
//! sizes), copies them into Rust buffers, releases the GIL for the Rust call
//! ([`Python::detach`]), catches any panic, and maps every error to `eplb.EplbError` (a
//! `ValueError`) carrying the Rust message, which names the layer, rank and expert where it can.
//!
//! Nothing here keeps a thread, a global or a clock: results are a pure function of the inputs
//! and the policy's settings and state, so every rank of an engine computes the same placement.
#![forbid(unsafe_code)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Mutex;

use eplb_core::metrics::{self, Routing};
use eplb_core::{Layout, Placement, Shape};
use eplb_map::map::{ReadOptions, check_map_json, read_map_json, to_json};
use eplb_policies::{AnyPolicy, Input, PolicyKind, Samples};
use eplb_runtime::config::deployment::QuantType;
use eplb_runtime::planner::PolicyHost;
use eplb_sim::cost::{CostSpec, Link, ModelPreset};
use eplb_sim::json as sim_json;
use eplb_sim::replay::{check_params, parse_sim_policy};
use eplb_sim::time::TimeSpec;
use eplb_sim::{Initial, Replay, SimConfig, SimError};
use numpy::ndarray::{ArrayD, ArrayViewD};
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArray3, PyArrayDyn, PyArrayMethods};
use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt};

create_exception!(
    eplb,
    EplbError,
    PyValueError,
    "An error of eplb: bad input (dtype, shape, values, sizes), an unknown policy or parameter, \
     or a failed Rust call. The message is the Rust error's, naming layer, rank and expert."
);

fn err(msg: impl Into<String>) -> PyErr {
    EplbError::new_err(msg.into())
}

/// Runs `f` without the GIL; a panic becomes an `EplbError` instead of crossing into Python.
fn guarded<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, String> + Send) -> PyResult<T> {
    let r = py.detach(|| catch_unwind(AssertUnwindSafe(f)));
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(err(e)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            Err(err(format!(
                "internal error (a Rust panic, please report): {what}"
            )))
        }
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn untyped<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    what: &str,
) -> PyResult<&'a Bound<'py, PyUntypedArray>> {
    obj.cast::<PyUntypedArray>().map_err(|_| {
        err(format!(
            "{what}: expected a numpy array, got {}",
            type_name(obj)
        ))
    })
}

fn dtype_name(a: &Bound<'_, PyUntypedArray>) -> String {
    a.dtype().to_string()
}

fn check_ndim(what: &str, a: &Bound<'_, PyUntypedArray>, allowed: &[usize]) -> PyResult<()> {
    if allowed.contains(&a.ndim()) {
        return Ok(());
    }
    let want: Vec<String> = allowed.iter().map(|d| d.to_string()).collect();
    Err(err(format!(
        "{what}: expected {} dimensions, got {} (shape {:?})",
        want.join(" or "),
        a.ndim(),
        a.shape()
    )))
}

fn collect<T: Copy, U>(v: ArrayViewD<'_, T>, f: impl Fn(T) -> U) -> Vec<U> {
    // Logical (row-major) order whatever the strides: non-contiguous views are copied here.
    v.iter().map(|&x| f(x)).collect()
}

/// A numeric array read as `f64` in row-major order: `(shape, values)`.
/// Accepted dtypes: int32, int64, float32, float64 (any strides).
fn read_loads(
    obj: &Bound<'_, PyAny>,
    what: &str,
    ndims: &[usize],
) -> PyResult<(Vec<usize>, Vec<f64>)> {
    let a = untyped(obj, what)?;
    check_ndim(what, a, ndims)?;
    let shape = a.shape().to_vec();
    let values = if let Ok(x) = obj.cast::<PyArrayDyn<f64>>() {
        collect(x.readonly().as_array(), |v| v)
    } else if let Ok(x) = obj.cast::<PyArrayDyn<f32>>() {
        collect(x.readonly().as_array(), f64::from)
    } else if let Ok(x) = obj.cast::<PyArrayDyn<i64>>() {
        collect(x.readonly().as_array(), |v| v as f64)
    } else if let Ok(x) = obj.cast::<PyArrayDyn<i32>>() {
        collect(x.readonly().as_array(), f64::from)
    } else {
        return Err(err(format!(
            "{what}: dtype {} is not supported (expected int32, int64, float32 or float64)",
            dtype_name(a)
        )));
    };
    Ok((shape, values))
}

/// An integer array read as `i64` in row-major order: `(shape, values)`.
fn read_ids(
    obj: &Bound<'_, PyAny>,
    what: &str,
    ndims: &[usize],
) -> PyResult<(Vec<usize>, Vec<i64>)> {
    let a = untyped(obj, what)?;
    check_ndim(what, a, ndims)?;
    let shape = a.shape().to_vec();
    macro_rules! try_int {
        ($($t:ty),*) => {
            $(if let Ok(x) = obj.cast::<PyArrayDyn<$t>>() {
                return Ok((shape, collect(x.readonly().as_array(), |v| v as i64)));
            })*
        };
    }
    try_int!(i64, i32, i16, i8, u8, u16, u32);
    if let Ok(x) = obj.cast::<PyArrayDyn<u64>>() {
        let v = collect(x.readonly().as_array(), |v| i64::try_from(v).unwrap_or(-1));
        return Ok((shape, v));
    }
    Err(err(format!(
        "{what}: dtype {} is not supported (expected an integer dtype)",
        dtype_name(a)
    )))
}

fn dim_u16(what: &str, v: usize) -> PyResult<u16> {
    u16::try_from(v).map_err(|_| err(format!("{what} = {v} is too large (at most 65535)")))
}

/// `[L][R][S]` ids from `ids` (shape `[L,R,S]` or `[L,R*S]`), each checked to be in `0..N`.
fn placement_ids(what: &str, shape: &Shape, dims: &[usize], ids: &[i64]) -> PyResult<Vec<u16>> {
    let (l, r, s) = (shape.layers(), shape.ranks(), shape.slots_per_rank());
    let ok = match dims {
        [a, b, c] => (*a, *b, *c) == (l, r, s),
        [a, b] => (*a, *b) == (l, r * s),
        _ => false,
    };
    if !ok {
        return Err(err(format!(
            "{what}: shape {dims:?} does not match [L={l}, R={r}, S={s}] (or [L, R*S = {}])",
            r * s
        )));
    }
    let n = shape.experts() as i64;
    let mut out = Vec::with_capacity(ids.len());
    for (i, &e) in ids.iter().enumerate() {
        if !(0..n).contains(&e) {
            let (layer, rest) = (i / (r * s), i % (r * s));
            return Err(err(format!(
                "{what}: layer {layer}, rank {}, slot {}: expert id {e} is outside 0..{n}",
                rest / s,
                rest % s
            )));
        }
        out.push(e as u16);
    }
    Ok(out)
}

/// A policy parameter's value: a Python int or float (not a bool).
fn param_f64(key: &str, v: &Bound<'_, PyAny>) -> PyResult<f64> {
    if v.is_instance_of::<PyBool>() {
        return Err(err(format!(
            "parameter `{key}`: expected a number, got a bool"
        )));
    }
    if v.is_instance_of::<PyInt>() {
        let x: i64 = v
            .extract()
            .map_err(|_| err(format!("parameter `{key}`: integer out of range")))?;
        return Ok(x as f64);
    }
    if v.is_instance_of::<PyFloat>() {
        return v
            .extract::<f64>()
            .map_err(|_| err(format!("parameter `{key}`: not a float")));
    }
    // numpy scalars and other numbers.
    v.extract::<f64>().map_err(|_| {
        err(format!(
            "parameter `{key}`: expected a number, got {}",
            type_name(v)
        ))
    })
}

/// The names of the parameters `kind` takes, in order (the Rust parser's table).
fn param_names(kind: PolicyKind) -> Vec<&'static str> {
    kind.params().iter().map(|p| p.name).collect()
}

fn build_policy(kind: PolicyKind, params: Option<&Bound<'_, PyDict>>) -> PyResult<AnyPolicy> {
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
                return Err(err(e.to_string()));
            }
            let x = param_f64(key, v)?;
            policy.set_param(key, x).map_err(|e| err(e.to_string()))?;
        }
    }
    Ok(policy)
}

fn parse_kind(name: &str) -> PyResult<PolicyKind> {
    name.parse::<PolicyKind>().map_err(|_| {
        err(format!(
            "unknown policy `{name}` (expected one of random, default, swift, flashlb, \
             incremental, deepseek or 0..4)"
        ))
    })
}

fn make_shape(
    layers: usize,
    experts: usize,
    ranks: usize,
    redundant: usize,
    ranks_per_node: Option<usize>,
    groups: Option<usize>,
) -> PyResult<Shape> {
    let (l, n, r) = (
        dim_u16("layers", layers)?,
        dim_u16("experts", experts)?,
        dim_u16("ranks", ranks)?,
    );
    let x = u32::try_from(redundant)
        .map_err(|_| err(format!("redundant = {redundant} is too large")))?;
    let rpn = dim_u16("ranks_per_node", ranks_per_node.unwrap_or(ranks))?;
    let g = dim_u16("groups", groups.unwrap_or(1))?;
    Shape::from_redundant(l, n, r, x)
        .and_then(|s| s.topology(rpn, g))
        .map_err(|e| err(e.to_string()))
}

/// One policy on one shape, with its state (FlashLB's history, the incremental policy's
/// estimates) kept between calls. Calls on one object are serialised by a lock.
#[pyclass(frozen, module = "eplb._native")]
struct NativePolicy {
    shape: Shape,
    seed: u64,
    kind: PolicyKind,
    /// The policy with its buffers and state (`None` until the first call, and after `reset`):
    /// the runtime's [`PolicyHost`], which keeps the state of the last call that succeeded.
    inner: Mutex<Option<PolicyHost<AnyPolicy>>>,
    template: AnyPolicy,
}

/// What one native `rebalance` returns to Python.
type Rebalanced<'py> = (
    Bound<'py, PyArray3<i64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<bool>>,
    Bound<'py, PyArray1<i64>>,
    (f64, f64, f64, f64, usize, f64),
);

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
            inner: Mutex::new(None),
            template,
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
            inner: Mutex::new(state),
            template: self.template.clone(),
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
    ) -> PyResult<Rebalanced<'py>> {
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
                    .map_err(|e| err(e.to_string()))?;
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
        let seed = self.seed;
        let (placement, before, after, changed, moves, summary) = guarded(py, || {
            let mut guard = self
                .inner
                .lock()
                .map_err(|_| "the policy's lock was poisoned by an earlier failure".to_string())?;
            let host = guard
                .get_or_insert_with(|| PolicyHost::new(Box::new(self.template.clone()), shape));
            let cur = Placement::new(shape, &current_v).map_err(|e| format!("current: {e}"))?;
            let smp = match &samples_v {
                Some((t, v)) => {
                    Some(Samples::new(&shape, *t, v).map_err(|e| format!("samples: {e}"))?)
                }
                None => None,
            };
            let input = Input::new(cur, &loads_v, smp, seed).map_err(|e| e.to_string())?;
            // Taken at once when it succeeds; a failure leaves the state as it was.
            let plan = host
                .plan_and_take(0, &input)
                .map_err(|e| format!("{}: {e}", self.kind.name()))?;
            let (placement, changed, before, after, summary) = (
                plan.placement,
                plan.changed,
                plan.par_before,
                plan.par_after,
                plan.summary,
            );
            let rust_s = plan.elapsed.as_secs_f64();
            let per = shape.slots_per_layer();
            let moves: Vec<i64> = current_v
                .chunks_exact(per)
                .zip(placement.chunks_exact(per))
                .map(|(o, nw)| metrics::moves(o, nw, shape.slots_per_rank()) as i64)
                .collect();
            Ok((placement, before, after, changed, moves, (summary, rust_s)))
        })?;
        let (summary, rust_s) = summary;
        let (r, s) = (shape.ranks(), shape.slots_per_rank());
        let p: Vec<i64> = placement.iter().map(|&e| i64::from(e)).collect();
        let p = ArrayD::from_shape_vec(vec![l, r, s], p)
            .map_err(|e| err(e.to_string()))?
            .into_pyarray(py)
            .cast_into::<PyArray3<i64>>()
            .map_err(|e| err(e.to_string()))?;
        Ok((
            p,
            PyArray1::from_vec(py, before),
            PyArray1::from_vec(py, after),
            PyArray1::from_vec(py, changed),
            PyArray1::from_vec(py, moves),
            (
                summary.before.mean,
                summary.before.max,
                summary.after.mean,
                summary.after.max,
                summary.colocated_rows,
                rust_s,
            ),
        ))
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
fn rebalance_experts<'py>(
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
    let placement = guarded(py, || {
        let mut host = PolicyHost::new(Box::new(AnyPolicy::new(PolicyKind::DeepSeek)), shape);
        let mut current = vec![0u16; shape.placement_len()];
        Layout::default()
            .fill(&shape, &mut current)
            .map_err(|e| e.to_string())?;
        let cur = Placement::new(shape, &current).map_err(|e| e.to_string())?;
        let input = Input::new(cur, &w, None, 0).map_err(|e| format!("weight: {e}"))?;
        let placement = host
            .plan_and_take(0, &input)
            .map_err(|e| format!("deepseek: {e}"))?
            .placement;
        Ok(placement)
    })?;
    let p = num_replicas;
    let width = p - n + 1;
    let mut phy2log = Vec::with_capacity(l * p);
    let mut log2phy = vec![-1i64; l * n * width];
    let mut logcnt = vec![0i64; l * n];
    for (layer, row) in placement.chunks_exact(p).enumerate() {
        for (slot, &e) in row.iter().enumerate() {
            let e = usize::from(e);
            phy2log.push(e as i64);
            let c = &mut logcnt[layer * n + e];
            // Replicas in ascending physical id (as vLLM and SGLang derive them).
            log2phy[(layer * n + e) * width + *c as usize] = slot as i64;
            *c += 1;
        }
    }
    let to3 = |v: Vec<i64>, d: [usize; 3]| -> PyResult<Bound<'py, PyArray3<i64>>> {
        ArrayD::from_shape_vec(d.to_vec(), v)
            .map_err(|e| err(e.to_string()))?
            .into_pyarray(py)
            .cast_into::<PyArray3<i64>>()
            .map_err(|e| err(e.to_string()))
    };
    let to2 = |v: Vec<i64>, d: [usize; 2]| -> PyResult<Bound<'py, PyArray2<i64>>> {
        ArrayD::from_shape_vec(d.to_vec(), v)
            .map_err(|e| err(e.to_string()))?
            .into_pyarray(py)
            .cast_into::<PyArray2<i64>>()
            .map_err(|e| err(e.to_string()))
    };
    Ok((
        to2(phy2log, [l, p])?,
        to3(log2phy, [l, n, width])?,
        to2(logcnt, [l, n])?,
    ))
}

/// A placement `[L,R,S]` of any integer dtype: its shape (with `N` = the largest id + 1 unless
/// given) and its ids.
fn placement_arg(obj: &Bound<'_, PyAny>, experts: Option<usize>) -> PyResult<(Shape, Vec<u16>)> {
    let (dims, ids) = read_ids(obj, "placement", &[3])?;
    let (l, r, s) = (dims[0], dims[1], dims[2]);
    let n = match experts {
        Some(n) => n,
        None => ids
            .iter()
            .copied()
            .max()
            .map_or(0, |m| (m.max(-1) + 1) as usize),
    };
    let shape = Shape::new(
        dim_u16("layers", l)?,
        dim_u16("experts", n)?,
        dim_u16("ranks", r)?,
        dim_u16("slots per rank", s)?,
    )
    .map_err(|e| err(format!("placement: {e}")))?;
    let v = placement_ids("placement", &shape, &dims, &ids)?;
    Placement::new(shape, &v).map_err(|e| err(format!("placement: {e}")))?;
    Ok((shape, v))
}

/// Per-layer PAR of `placement` under `loads`, and its mean and max.
#[pyfunction]
#[pyo3(signature = (placement, loads, routing="even"))]
fn hotness<'py>(
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
    let (per, h) = guarded(py, || {
        let p = Placement::new(shape, &v).map_err(|e| e.to_string())?;
        let mut scratch = vec![0u32; metrics::scratch_len(&shape)];
        let mut ranks = vec![0.0; shape.ranks()];
        let mut per = vec![0.0; shape.layers()];
        let h = metrics::hotness(&p, &w, routing, &mut scratch, &mut ranks, &mut per)
            .map_err(|e| e.to_string())?;
        Ok((per, h))
    })?;
    Ok((PyArray1::from_vec(py, per), h.mean, h.max))
}

/// Reads `path` through the CLI's bounded reader with the GIL released: a regular file of at
/// most `limit` bytes (a FIFO or a device is refused without being opened, so
/// `/dev/zero` cannot grow without bound and a FIFO cannot block). I/O errors raise Python's own
/// `OSError` subclasses (`FileNotFoundError`, `PermissionError`, ...) naming the path; the rest
/// raise `EplbError`.
fn read_file(py: Python<'_>, path: &str, limit: u64) -> PyResult<Vec<u8>> {
    let p = std::path::PathBuf::from(path);
    match py.detach(|| eplb_runtime::fsio::read_bounded(&p, limit)) {
        Ok(bytes) => Ok(bytes),
        Err(eplb_runtime::fsio::ReadError::Io(e)) => Err(os_error(&e, path)),
        Err(other) => Err(err(format!("{path}: {other}"))),
    }
}

/// The Python `OSError` subclass of `e` (by its kind), with errno, message and file name.
fn os_error(e: &std::io::Error, path: &str) -> PyErr {
    use pyo3::exceptions::{PyFileNotFoundError, PyIsADirectoryError, PyOSError, PyPermissionError};
    use std::io::ErrorKind;
    // Rust's text ends in " (os error N)"; Python's `strerror` is the text alone.
    let text = e.to_string();
    let strerror = match text.rfind(" (os error ") {
        Some(at) => text.get(..at).unwrap_or(&text).to_owned(),
        None => text,
    };
    let args = (e.raw_os_error().unwrap_or(0), strerror, path.to_owned());
    match e.kind() {
        ErrorKind::NotFound => PyFileNotFoundError::new_err(args),
        ErrorKind::PermissionDenied => PyPermissionError::new_err(args),
        ErrorKind::IsADirectory => PyIsADirectoryError::new_err(args),
        _ => PyOSError::new_err(args),
    }
}

/// Reads a vLLM-Ascend expert-map JSON (co-located copies accepted) into `[L,R,S]` int64.
#[pyfunction]
#[pyo3(signature = (path, max_input_bytes = eplb_runtime::fsio::DEFAULT_INPUT_LIMIT))]
fn read_map<'py>(
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
    .map_err(|e| err(e.to_string()))?
    .into_pyarray(py)
    .cast_into::<PyArray3<i64>>()
    .map_err(|e| err(e.to_string()))
}

/// Every problem of an expert-map JSON (strict: co-located copies are problems); empty = valid.
#[pyfunction]
#[pyo3(signature = (path, experts=None, ranks=None, max_input_bytes=eplb_runtime::fsio::DEFAULT_INPUT_LIMIT))]
fn validate_map(
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
fn map_json(py: Python<'_>, placement: &Bound<'_, PyAny>) -> PyResult<String> {
    let (shape, v) = placement_arg(placement, None)?;
    guarded(py, || {
        let p = Placement::new(shape, &v).map_err(|e| e.to_string())?;
        Ok(to_json(&p))
    })
}

/// Writes the expert-map JSON of `placement` to `path` as `eplb plan --out` does
/// (`eplb_runtime::fsio::write_atomic`): a regular file is replaced atomically keeping its
/// permissions, a symbolic link is followed to its file, a FIFO or a character device is written
/// through, anything else is refused (`EplbError`); an I/O failure is the `OSError` subclass
/// of its kind (`FileNotFoundError` for a missing directory, `PermissionError`, ...).
#[pyfunction]
fn write_map(py: Python<'_>, path: PathBuf, placement: &Bound<'_, PyAny>) -> PyResult<()> {
    let (shape, v) = placement_arg(placement, None)?;
    let shown = path.display().to_string();
    let written = guarded(py, move || {
        let p = Placement::new(shape, &v).map_err(|e| e.to_string())?;
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

/// `eplb simulate --json` in this process with typed settings (GIL released): the JSON text
/// of the object the command prints (the very bytes, so no float is re-rounded). Unset cost
/// settings take the command's defaults (the trace's model, else DeepSeek-V3 W8A8; 10 Gbit/s).
/// Also the warnings the command prints on standard error (without `warning: `).
#[pyfunction]
#[pyo3(signature = (
    trace, ranks, redundant, policy, heat_interval, algo_interval, *,
    ranks_per_node = None, groups = None, initial = "default".to_owned(),
    routing = "log2phy".to_owned(), seed = 0, params = Vec::new(), placements_log = None,
    model = None, hidden = None, intermediate = None, quant = None, fused_mc2 = false,
    link = None, max_input_bytes = eplb_runtime::fsio::DEFAULT_INPUT_LIMIT,
    hardware = None, role = None, tokens_per_rank = None, payoff_gate = false,
))]
#[allow(clippy::too_many_arguments)]
fn simulate(
    py: Python<'_>,
    trace: PathBuf,
    ranks: u16,
    redundant: u32,
    policy: String,
    heat_interval: u32,
    algo_interval: u32,
    ranks_per_node: Option<u16>,
    groups: Option<u16>,
    initial: String,
    routing: String,
    seed: u64,
    params: Vec<(String, f64)>,
    placements_log: Option<PathBuf>,
    model: Option<String>,
    hidden: Option<u64>,
    intermediate: Option<u64>,
    quant: Option<String>,
    fused_mc2: bool,
    link: Option<String>,
    max_input_bytes: u64,
    hardware: Option<String>,
    role: Option<String>,
    tokens_per_rank: Option<f64>,
    payoff_gate: bool,
) -> PyResult<(String, Vec<String>)> {
    guarded(py, move || -> Result<(String, Vec<String>), String> {
        let mut warnings = Vec::new();
        if ranks == 0 {
            return Err("ranks must be at least 1".to_owned());
        }
        let policy = parse_sim_policy(&policy).map_err(|e| e.to_string())?;
        check_params(policy, &params).map_err(|e| e.to_string())?;
        let initial: Initial = initial.parse().map_err(|e: SimError| e.to_string())?;
        let routing: Routing = routing
            .parse()
            .map_err(|e| format!("routing `{routing}`: {e}"))?;
        fn named<T: std::str::FromStr>(v: Option<String>, flag: &str) -> Result<Option<T>, String>
        where
            T::Err: std::fmt::Display,
        {
            v.map(|s| s.parse::<T>().map_err(|e| format!("{flag} {s}: {e}")))
                .transpose()
        }
        let cost = CostSpec {
            model: named::<ModelPreset>(model, "model")?,
            hidden,
            intermediate,
            quant: named::<QuantType>(quant, "quant")?,
            fused_mc2,
            link: named::<Link>(link, "link")?,
        };
        cost.resolve()?;
        let time = TimeSpec {
            hardware,
            role: role
                .map(|r| eplb_sim::time::parse_role(&r))
                .transpose()
                .map_err(|e| e.to_string())?,
            tokens_per_rank,
            ..TimeSpec::default()
        };
        time.check().map_err(|e| e.to_string())?;
        if let Some(log) = &placements_log {
            eplb_runtime::fsio::refuse_overwrite_input(log, &[trace.as_path()])
                .map_err(|e| e.to_string())?;
        }
        let source = trace.display().to_string();
        let bytes = eplb_runtime::fsio::read_bounded(&trace, max_input_bytes)
            .map_err(|e| format!("{source}: {e}"))?;
        let replay = Replay::load(&bytes, &source, &cost).map_err(|e| e.to_string())?;
        for w in &replay.warnings {
            warnings.push(format!("{source}: {w}"));
        }
        if let Some(w) = replay.short_trace_warning(heat_interval, algo_interval) {
            warnings.push(format!("{source}: {w}"));
        }
        let cfg = SimConfig {
            ranks,
            redundant,
            ranks_per_node,
            groups,
            policy,
            heat_interval,
            algo_interval,
            initial,
            routing,
            seed,
            expert_bytes: 64,
            payoff_gate: None,
        };
        let basis = time
            .resolve(&replay.basis, ranks_per_node)
            .map_err(|e| e.to_string())?;
        let cfg = SimConfig {
            payoff_gate: payoff_gate.then(|| basis.gate(&cfg)),
            ..cfg
        };
        let run = replay
            .run(&cfg, &params, &mut |_, _| {})
            .map_err(|e| e.to_string())?;
        if let Some(path) = &placements_log {
            sim_json::write_placements_log(
                path,
                &run.result,
                policy.name(),
                replay.name.as_deref(),
            )
            .map_err(|e| e.to_string())?;
        }
        if let Some(warning) = run.check_plans().map_err(|e| e.to_string())? {
            warnings.push(warning);
        }
        let figures = eplb_sim::time::estimate(&replay.trace, &run, &cfg, &basis, None)
            .map_err(|e| e.to_string())?;
        let mut v = sim_json::run_json(&run, &replay.basis, policy.name(), routing);
        figures.add_json(&mut v, &basis);
        for w in &warnings {
            log::warn!("eplb: {w}");
        }
        Ok((v.to_string(), warnings))
    })
}

/// Policy names and the parameters each takes.
#[pyfunction]
fn policy_params() -> Vec<(&'static str, Vec<&'static str>)> {
    PolicyKind::ALL
        .iter()
        .map(|&k| (k.name(), param_names(k)))
        .collect()
}

/// Raises a Rust panic inside the guarded call (tests that a panic becomes `EplbError`).
#[pyfunction]
fn _panic_for_test(py: Python<'_>) -> PyResult<()> {
    guarded(py, || -> Result<(), String> {
        panic!("deliberate test panic")
    })
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("EplbError", m.py().get_type::<EplbError>())?;
    m.add_class::<NativePolicy>()?;
    m.add_function(wrap_pyfunction!(rebalance_experts, m)?)?;
    m.add_function(wrap_pyfunction!(hotness, m)?)?;
    m.add_function(wrap_pyfunction!(read_map, m)?)?;
    m.add_function(wrap_pyfunction!(validate_map, m)?)?;
    m.add_function(wrap_pyfunction!(map_json, m)?)?;
    m.add_function(wrap_pyfunction!(write_map, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(policy_params, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
