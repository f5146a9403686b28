//! `NativeRuntime`: the Rust runtime's controller of one rank, driven from Python over a
//! transport written in Python (`eplb.runtime`'s torch.distributed transport).
//!
//! The controller is the one the Rust runtime builds ([`eplb_runtime::startup::controller`]:
//! the start-up placement, the rank machine, its own planner thread, the pay-off gate, heat
//! recording and record mode), over [`PyTransport`], which implements
//! [`eplb_runtime::transport::Transport`] by calling methods of a Python object. The cycle is not
//! written a second time: Python only executes the transport's primitives.
//!
//! The GIL: every method of [`NativeRuntime`] runs with the GIL held, because the transport's
//! callbacks need it; the planner thread is pure Rust and never takes it. A Python exception in a
//! callback becomes a [`TransportError`] naming the operation, the rank and the layer, which the
//! rank machine treats as a one-sided fault. A Rust panic is caught and raised as `EplbError`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use eplb_core::{EMPTY, LayerPlacement, LiveSet, Placement, ReplicaChoice, Shape};
use eplb_runtime::config::{EplbConfig, Mode, ProcessEnv};
use eplb_runtime::controller::{Controller, Events, Health};
use eplb_runtime::startup::{ModelInfo, attach_metrics, controller, joining_controller, startup};
use eplb_runtime::transfer::{RankPlan, SlotSource};
use eplb_runtime::transport::{Op, Site, Transport, TransportError};
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use prometheus_client::registry::Registry;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{dtype_name, untyped};
use crate::errors::{err, guarded_held};

/// One rank's part of one layer's exchange, as the transport's callbacks receive it
/// (`eplb_runtime::transfer::RankPlan`).
#[pyclass(frozen, module = "eplb._native")]
pub(crate) struct ExchangePlan {
    /// The MoE layer.
    #[pyo3(get)]
    layer: usize,
    /// Sends `(peer, expert, slot)`: the expert in live slot `slot` goes to EP rank `peer`;
    /// ordered by (peer, expert).
    #[pyo3(get)]
    sends: Vec<(u16, u16, u16)>,
    /// Receives `(peer, expert, buffer)`: `expert` from EP rank `peer` lands in receive buffer
    /// `buffer`; ordered by (peer, expert).
    #[pyo3(get)]
    recvs: Vec<(u16, u16, u16)>,
    /// Loads `(expert, buffer)` of experts no live rank holds (from the host backup).
    #[pyo3(get)]
    loads: Vec<(u16, u16)>,
    /// Per slot, where its new content comes from at commit: `(kind, index)` with kind 0 the
    /// slot keeps its content, 1 a local move from slot `index`, 2 received into buffer
    /// `index`, 3 loaded into buffer `index`.
    #[pyo3(get)]
    install: Vec<(u8, u16)>,
    /// The rank's new row `[S]` (-1: an empty slot).
    #[pyo3(get)]
    new_row: Vec<i32>,
    /// The cycle the exchange belongs to (the same on every rank in step): transports that
    /// match messages by tag put it in the tag, so that a receive left posted by a timed-out
    /// attempt never takes a later cycle's message.
    #[pyo3(get)]
    cycle: u64,
}

#[pymethods]
impl ExchangePlan {
    fn __repr__(&self) -> String {
        format!(
            "ExchangePlan(layer={}, sends={:?}, recvs={:?}, loads={:?}, install={:?})",
            self.layer, self.sends, self.recvs, self.loads, self.install
        )
    }
}

impl ExchangePlan {
    fn of(p: &RankPlan, cycle: u64) -> Self {
        Self {
            cycle,
            layer: p.layer,
            sends: p.sends.iter().map(|s| (s.peer, s.expert, s.slot)).collect(),
            recvs: p
                .recvs
                .iter()
                .map(|r| (r.peer, r.expert, r.buffer))
                .collect(),
            loads: p.loads.iter().map(|l| (l.expert, l.buffer)).collect(),
            install: p
                .install
                .iter()
                .map(|s| match *s {
                    SlotSource::Unchanged => (0, 0),
                    SlotSource::Local { from_slot } => (1, from_slot),
                    SlotSource::Received { buffer } => (2, buffer),
                    SlotSource::Loaded { buffer } => (3, buffer),
                })
                .collect(),
            new_row: p
                .new_row
                .iter()
                .map(|&e| if e == EMPTY { -1 } else { i32::from(e) })
                .collect(),
        }
    }
}

/// The transport endpoint whose primitives are methods of a Python object: `all_gather(words)`
/// (a uint64 numpy array in, the live ranks' words rank-major out), `launch(plan)`,
/// `launch_sends(plan)`, `wait(plan)`, `commit(plan)`, `abort(plan)`, `load(plan)`,
/// `set_live(ranks)`. Collectives are not atomic.
pub(crate) struct PyTransport {
    obj: Py<PyAny>,
    rank: usize,
    ranks: usize,
    live: Option<LiveSet>,
    seq: u64,
    /// The controller's cycle number, set by [`NativeRuntime`] before each call into it.
    cycle: Arc<AtomicU64>,
}

impl PyTransport {
    /// Calls `name(args)` on the Python object; an exception becomes a failure at `at`
    /// (a timeout when the exception says so).
    fn call(&self, at: Site, name: &str, arg: Py<PyAny>) -> Result<Py<PyAny>, TransportError> {
        Python::attach(|py| {
            self.obj
                .bind(py)
                .call_method1(name, (arg,))
                .map(Bound::unbind)
                .map_err(|e| failure(py, at, &e))
        })
    }

    fn plan_call(&self, op: Op, name: &str, plan: &RankPlan) -> Result<(), TransportError> {
        let at = Site::new(op, self.rank).layer(plan.layer);
        let cycle = self.cycle.load(Ordering::Relaxed);
        let p = Python::attach(|py| Py::new(py, ExchangePlan::of(plan, cycle)).map(Py::into_any))
            .map_err(|e| TransportError::Invalid {
            at,
            detail: e.to_string(),
        })?;
        self.call(at, name, p).map(|_| ())
    }

    fn live_count(&self) -> usize {
        self.live.as_ref().map_or(self.ranks, LiveSet::count)
    }
}

/// A Python exception of a callback as a transport failure: a timeout when it is Python's
/// `TimeoutError` or its message says it timed out (torch.distributed's wording), else a
/// failure with the exception's type and message.
fn failure(py: Python<'_>, at: Site, e: &PyErr) -> TransportError {
    let kind = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    let detail = format!("{kind}: {}", e.value(py));
    // The engine's log sees it at once, with the Python exception (the Rust runtime's own line
    // about the fault follows, through `crate::logs`, when the call returns).
    let _ = py
        .import("logging")
        .and_then(|m| m.call_method1("getLogger", ("eplb.runtime",)))
        .and_then(|l| l.call_method1("warning", (format!("eplb {at}: {detail}"),)));
    let lower = detail.to_ascii_lowercase();
    if e.is_instance_of::<pyo3::exceptions::PyTimeoutError>(py)
        || lower.contains("timed out")
        || lower.contains("timeout")
    {
        TransportError::Timeout { at, detail }
    } else {
        TransportError::Failed {
            at,
            code: 0,
            detail,
        }
    }
}

impl Transport for PyTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn all_gather(&mut self, local: &[u64], out: &mut [u64]) -> Result<(), TransportError> {
        let at = Site::new(Op::AllGather, self.rank).seq(self.seq);
        self.seq += 1;
        let need = local.len().saturating_mul(self.live_count());
        if out.len() != need {
            return Err(TransportError::Invalid {
                at,
                detail: format!("the output holds {} words, needs {need}", out.len()),
            });
        }
        Python::attach(|py| {
            let arr = PyArray1::from_slice(py, local);
            let got = self
                .obj
                .bind(py)
                .call_method1("all_gather", (arr,))
                .map_err(|e| failure(py, at, &e))?;
            let got = got
                .cast::<PyArray1<u64>>()
                .map_err(|_| TransportError::Protocol {
                    at,
                    detail: "all_gather did not return a uint64 numpy array".into(),
                })?;
            let view = got.readonly();
            let words = view.as_slice().map_err(|_| TransportError::Protocol {
                at,
                detail: "all_gather returned a non-contiguous array".into(),
            })?;
            if words.len() != out.len() {
                return Err(TransportError::Protocol {
                    at,
                    detail: format!(
                        "all_gather returned {} words, expected {}",
                        words.len(),
                        out.len()
                    ),
                });
            }
            out.copy_from_slice(words);
            Ok(())
        })
    }

    fn all_agree(&mut self, flag: bool) -> Result<bool, TransportError> {
        let n = self.live_count();
        let mut out = vec![0u64; n];
        self.all_gather(&[u64::from(flag)], &mut out)?;
        Ok(out.iter().all(|&w| w == 1))
    }

    fn set_live(&mut self, live: &LiveSet) -> Result<(), TransportError> {
        let at = Site::new(Op::SetLive, self.rank);
        if !live.contains(self.rank) {
            return Err(TransportError::Invalid {
                at,
                detail: "the live set does not hold this rank".into(),
            });
        }
        let ranks: Vec<usize> = live.iter().collect();
        let arg = Python::attach(|py| {
            ranks
                .into_pyobject(py)
                .map(|l| l.into_any().unbind())
                .map_err(|e| TransportError::Invalid {
                    at,
                    detail: e.to_string(),
                })
        })?;
        self.call(at, "set_live", arg)?;
        self.live = Some(*live);
        Ok(())
    }

    fn live(&self) -> Option<LiveSet> {
        self.live
    }

    fn load(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.plan_call(Op::Load, "load", plan)
    }

    fn launch(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.plan_call(Op::Launch, "launch", plan)
    }

    fn launch_sends(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.plan_call(Op::Launch, "launch_sends", plan)
    }

    fn wait(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.plan_call(Op::Wait, "wait", plan)
    }

    fn commit(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.plan_call(Op::Commit, "commit", plan)
    }

    fn abort(&mut self, plan: &RankPlan) {
        // An abort cannot fail the machine; the Python side logs its own errors.
        let _ = self.plan_call(Op::Abort, "abort", plan);
    }
}

/// A static (or off) deployment: the start-up placement, served as it is.
struct Fixed {
    shape: Shape,
    placement: Vec<u16>,
    expert_map: Vec<i32>,
    log2phy: Vec<u32>,
}

enum Engine {
    Dynamic(Box<Controller<PyTransport>>),
    Fixed(Fixed),
    Closed,
}

/// The placement handed to a rank that comes back, `[layers, ranks * slots]` (-1: an empty
/// slot), as `shape`'s ids.
fn join_placement(shape: &Shape, dims: &[usize], ids: &[i64]) -> PyResult<Vec<u16>> {
    let (l, per, n) = (shape.layers(), shape.slots_per_layer(), shape.experts());
    if dims != [l, per] {
        return Err(err(format!(
            "placement: shape {dims:?}, expected [{l}, {per}] ([layers, ranks * slots]: what \
             the peers' placement() returns)"
        )));
    }
    let s = shape.slots_per_rank();
    ids.iter()
        .enumerate()
        .map(|(i, &e)| match e {
            -1 => Ok(EMPTY),
            e if (0..n as i64).contains(&e) => Ok(e as u16),
            e => Err(err(format!(
                "placement: layer {}, rank {}, slot {}: {e} is neither an expert id (0..{n}) \
                 nor -1 (an empty slot)",
                i / per,
                i % per / s,
                i % s
            ))),
        })
        .collect()
}

/// The peers' live ranks handed to a rank that comes back.
fn live_set(shape: &Shape, ranks: &[usize]) -> PyResult<LiveSet> {
    let r = shape.ranks();
    if let Some(&q) = ranks.iter().find(|&&q| q >= r) {
        return Err(err(format!(
            "live: rank {q} is not below the number of ranks {r}"
        )));
    }
    LiveSet::none(r)
        .and_then(|l| l.with(ranks))
        .map_err(|e| err(format!("live: {e}")))
}

/// The runtime of one rank (`eplb.runtime.Runtime` wraps it).
#[pyclass(module = "eplb._native", unsendable)]
pub(crate) struct NativeRuntime {
    engine: Engine,
    rank: usize,
    mode: Mode,
    registry: Option<Registry>,
    counts: Vec<u32>,
    events: Events,
    /// The placement as of the last event (moves are counted against it).
    seen: Vec<u16>,
    /// The controller's cycle number, shared with the transport.
    cycle: Arc<AtomicU64>,
    moves: u64,
}

/// The `eplb_config` of `config`: a JSON text, or a file's path when `config_is_path` (read as
/// the runtime and `eplb check-config` read it, env guards from the process environment).
fn read_config(config: &str, config_is_path: bool) -> PyResult<EplbConfig> {
    if config_is_path {
        EplbConfig::from_file(&PathBuf::from(config), &ProcessEnv, None)
    } else {
        EplbConfig::from_json_str(config, &ProcessEnv)
    }
    .map_err(|e| err(format!("eplb_config: {e}")))
}

fn fixed(shape: Shape, placement: Vec<u16>, rank: usize) -> PyResult<Fixed> {
    let (n, per) = (shape.experts(), shape.slots_per_layer());
    let mut expert_map = vec![0i32; shape.layers() * n];
    let mut log2phy = vec![0u32; shape.layers() * n];
    for l in 0..shape.layers() {
        let rows = placement
            .get(l * per..(l + 1) * per)
            .ok_or_else(|| err(format!("layer {l}: the placement is short")))?;
        let lp = LayerPlacement::new(shape, l, rows).map_err(|e| err(e.to_string()))?;
        if let Some(m) = expert_map.get_mut(l * n..(l + 1) * n) {
            lp.expert_map(rank, m).map_err(|e| err(e.to_string()))?;
        }
        if let Some(m) = log2phy.get_mut(l * n..(l + 1) * n) {
            lp.log2phy(rank, ReplicaChoice::Plain, m)
                .map_err(|e| err(e.to_string()))?;
        }
    }
    Ok(Fixed {
        shape,
        placement,
        expert_map,
        log2phy,
    })
}

fn health_name(h: Health) -> &'static str {
    match h {
        Health::Running => "running",
        Health::Suspended { .. } => "suspended",
        Health::Diverged => "diverged",
    }
}

impl NativeRuntime {
    fn shape(&self) -> PyResult<Shape> {
        match &self.engine {
            Engine::Dynamic(c) => Ok(*c.shape()),
            Engine::Fixed(f) => Ok(f.shape),
            Engine::Closed => Err(err("the runtime is closed")),
        }
    }

    fn dynamic(&mut self) -> PyResult<&mut Controller<PyTransport>> {
        match &mut self.engine {
            Engine::Dynamic(c) => Ok(c),
            Engine::Fixed(_) => Err(err(format!(
                "mode {} runs no controller (no balancing, no membership changes)",
                self.mode
            ))),
            Engine::Closed => Err(err("the runtime is closed")),
        }
    }

    fn layer_range(&self, layer: usize) -> PyResult<(Shape, std::ops::Range<usize>)> {
        let shape = self.shape()?;
        if layer >= shape.layers() {
            return Err(err(format!(
                "layer {layer} is out of range (the model has {} MoE layers)",
                shape.layers()
            )));
        }
        let n = shape.experts();
        Ok((shape, layer * n..(layer + 1) * n))
    }

    /// Reads `[L][S]` counts of any integer dtype into `self.counts`.
    fn read_counts(&mut self, obj: &Bound<'_, PyAny>, shape: &Shape) -> PyResult<()> {
        let what = "slot_counts";
        let a = untyped(obj, what)?;
        let (l, s) = (shape.layers(), shape.slots_per_rank());
        if a.shape() != [l, s] {
            return Err(err(format!(
                "{what}: expected shape [{l}, {s}] ([layers, slots per rank]), got {:?}",
                a.shape()
            )));
        }
        self.counts.clear();
        macro_rules! read {
            ($($t:ty),*) => {
                $(if let Ok(x) = obj.cast::<PyArray2<$t>>() {
                    let v = x.readonly();
                    for (i, &c) in v.as_array().iter().enumerate() {
                        let c = u32::try_from(c).map_err(|_| {
                            err(format!(
                                "{what}: layer {} slot {}: {c} is not a count (0..=4294967295)",
                                i / s.max(1),
                                i % s.max(1)
                            ))
                        })?;
                        self.counts.push(c);
                    }
                    return Ok(());
                })*
            };
        }
        read!(i64, i32, u32, u64, i16, u16, i8, u8);
        Err(err(format!(
            "{what}: dtype {} is not supported (expected an integer dtype)",
            dtype_name(a)
        )))
    }

    fn note_events(&mut self, ev: Events) {
        let Engine::Dynamic(c) = &self.engine else {
            return;
        };
        let shape = *c.shape();
        let per = shape.slots_per_layer();
        if let Some(l) = ev.committed {
            let range = usize::from(l) * per..(usize::from(l) + 1) * per;
            if let (Some(old), Some(new)) = (self.seen.get(range.clone()), c.placement().get(range))
            {
                self.moves +=
                    eplb_runtime::metrics::layer_copies_moved(old, new, shape.slots_per_rank());
            }
        }
        if ev.committed.is_some() || ev.membership || ev.cycle_done || ev.suspended {
            self.seen.clear();
            self.seen.extend_from_slice(c.placement());
        }
        self.events = ev;
    }
}

#[pymethods]
impl NativeRuntime {
    /// The runtime of EP rank `rank` of `ranks`, as `config` (a JSON text, or a file's path
    /// when `config_is_path`) says, over the Python transport object `transport`.
    #[new]
    #[pyo3(signature = (
        config, config_is_path, *, layers, experts, ranks, rank, transport, expert_bytes,
        ranks_per_node = None, groups = 1, max_num_seqs = 256, speculative_tokens = 0,
        tp_size = 1, placement = None, live = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        config: &str,
        config_is_path: bool,
        layers: u16,
        experts: u16,
        ranks: u16,
        rank: usize,
        transport: Py<PyAny>,
        expert_bytes: u64,
        ranks_per_node: Option<u16>,
        groups: u16,
        max_num_seqs: u32,
        speculative_tokens: u32,
        tp_size: u16,
        placement: Option<&Bound<'_, PyAny>>,
        live: Option<Vec<usize>>,
    ) -> PyResult<Self> {
        crate::logs::begin(py);
        let join = match (placement, live) {
            (None, None) => None,
            (Some(p), Some(l)) => Some((crate::convert::read_ids(p, "placement", &[2])?, l)),
            _ => {
                return Err(err(
                    "placement and live go together: a rank that comes back is given both \
                     (the peers' placement and live ranks)",
                ));
            }
        };
        let made = guarded_held(|| {
            let cfg = read_config(config, config_is_path)?;
            if usize::from(ranks) <= rank {
                return Err(err(format!(
                    "rank {rank} is not below the number of ranks {ranks}"
                )));
            }
            let model = ModelInfo {
                layers,
                experts,
                ranks,
                ranks_per_node: ranks_per_node.unwrap_or(ranks),
                groups,
                max_num_seqs,
                speculative_tokens,
                tp_size,
            };
            let mode = cfg.mode();
            let mut registry = None;
            let cycle = Arc::new(AtomicU64::new(0));
            let engine = match mode {
                Mode::Dynamic | Mode::Record => {
                    let t = PyTransport {
                        obj: transport,
                        rank,
                        ranks: usize::from(ranks),
                        live: None,
                        seq: 0,
                        cycle: Arc::clone(&cycle),
                    };
                    let mut c = match &join {
                        None => controller(&cfg, &model, t),
                        Some(((dims, ids), live)) => {
                            let (shape, _) =
                                startup(&cfg, &model).map_err(|e| err(e.to_string()))?;
                            let p = join_placement(&shape, dims, ids)?;
                            let live = live_set(&shape, live)?;
                            joining_controller(&cfg, &model, t, &p, &live)
                        }
                    }
                    .map_err(|e| err(e.to_string()))?;
                    let mut reg = Registry::default();
                    if attach_metrics(&mut c, &cfg, &mut reg, expert_bytes).is_some() {
                        registry = Some(reg);
                    }
                    Engine::Dynamic(Box::new(c))
                }
                _ if join.is_some() => {
                    return Err(err(format!(
                        "placement/live: a rank joins only in a dynamic mode (this config's \
                         mode is {mode}, where every rank serves the start-up placement)"
                    )));
                }
                _ => {
                    let (shape, placement) =
                        startup(&cfg, &model).map_err(|e| err(e.to_string()))?;
                    Placement::new(shape, &placement).map_err(|e| err(e.to_string()))?;
                    Engine::Fixed(fixed(shape, placement, rank)?)
                }
            };
            let seen = match &engine {
                Engine::Dynamic(c) => c.placement().to_vec(),
                _ => Vec::new(),
            };
            Ok(Self {
                engine,
                rank,
                mode,
                registry,
                counts: Vec::new(),
                events: Events::default(),
                seen,
                cycle,
                moves: 0,
            })
        });
        crate::logs::flush(py);
        made
    }

    /// The run mode: `off`, `static`, `dynamic` or `record`.
    #[getter]
    fn mode(&self) -> String {
        self.mode.to_string()
    }

    /// This EP rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// `(layers, experts, ranks, slots_per_rank)`.
    #[getter]
    fn shape_info(&self) -> PyResult<(usize, usize, usize, usize)> {
        let s = self.shape()?;
        Ok((s.layers(), s.experts(), s.ranks(), s.slots_per_rank()))
    }

    /// A hash of this rank's placement (the start-up handshake compares it).
    fn placement_hash(&self) -> PyResult<u64> {
        let p: &[u16] = match &self.engine {
            Engine::Dynamic(c) => c.placement(),
            Engine::Fixed(f) => &f.placement,
            Engine::Closed => return Err(err("the runtime is closed")),
        };
        Ok(eplb_core::fnv1a(p.iter().map(|&e| u64::from(e))))
    }

    /// Before a forward: launches the due layer's exchange, if any.
    fn before_forward(&mut self, py: Python<'_>) -> PyResult<()> {
        crate::logs::begin(py);
        let mut r = Ok(());
        if let Engine::Dynamic(c) = &mut self.engine {
            self.cycle
                .store(c.machine().cycle_number(), Ordering::Relaxed);
            r = guarded_held(|| {
                c.before_forward();
                Ok(())
            });
        }
        crate::logs::flush(py);
        r
    }

    /// After a forward: this rank's tokens per local slot `[layers, slots]` (an integer numpy
    /// array) and the batch's padded token count.
    fn after_forward(
        &mut self,
        py: Python<'_>,
        slot_counts: &Bound<'_, PyAny>,
        padded_tokens: u64,
    ) -> PyResult<()> {
        let shape = self.shape()?;
        self.read_counts(slot_counts, &shape)?;
        let Engine::Dynamic(c) = &mut self.engine else {
            return Ok(());
        };
        let counts = &self.counts;
        crate::logs::begin(py);
        self.cycle
            .store(c.machine().cycle_number(), Ordering::Relaxed);
        let ev = guarded_held(|| {
            c.after_forward(counts, padded_tokens)
                .map_err(|e| err(format!("rank {}: {e}", c.rank())))
        });
        crate::logs::flush(py);
        self.note_events(ev?);
        Ok(())
    }

    /// What the last `after_forward` led to.
    fn last_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let e = &self.events;
        d.set_item("committed", e.committed)?;
        d.set_item("failed", e.failed)?;
        d.set_item("snapshot", e.snapshot)?;
        d.set_item("plan_taken", e.plan_taken)?;
        d.set_item("plan_late", e.plan_late)?;
        d.set_item("cycle_done", e.cycle_done)?;
        d.set_item("suspended", e.suspended)?;
        d.set_item("membership", e.membership)?;
        Ok(d)
    }

    /// The placement every live rank holds, `[layers, ranks * slots]` (-1: an empty slot).
    fn placement<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<i64>>> {
        let shape = self.shape()?;
        let p: &[u16] = match &self.engine {
            Engine::Dynamic(c) => c.placement(),
            Engine::Fixed(f) => &f.placement,
            Engine::Closed => return Err(err("the runtime is closed")),
        };
        let v: Vec<i64> = p
            .iter()
            .map(|&e| if e == EMPTY { -1 } else { i64::from(e) })
            .collect();
        PyArray1::from_vec(py, v)
            .reshape([shape.layers(), shape.slots_per_layer()])
            .map_err(|e| err(e.to_string()))
    }

    /// This rank's `log2phy` of `layer` (`[experts]`: the physical slot `rank * S + slot` each
    /// logical expert is routed to; -1 when no live rank holds it).
    fn log2phy<'py>(&self, py: Python<'py>, layer: usize) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let (_, range) = self.layer_range(layer)?;
        let m: &[u32] = match &self.engine {
            Engine::Dynamic(c) => c.log2phy(layer),
            Engine::Fixed(f) => f.log2phy.get(range).unwrap_or(&[]),
            Engine::Closed => return Err(err("the runtime is closed")),
        };
        let v: Vec<i64> = m
            .iter()
            .map(|&x| {
                if x == eplb_core::placement::NO_COPY {
                    -1
                } else {
                    i64::from(x)
                }
            })
            .collect();
        Ok(PyArray1::from_vec(py, v))
    }

    /// This rank's expert map of `layer` (`[experts]`: the local slot of each logical expert,
    /// or -1).
    fn expert_map<'py>(
        &self,
        py: Python<'py>,
        layer: usize,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let (_, range) = self.layer_range(layer)?;
        let m: &[i32] = match &self.engine {
            Engine::Dynamic(c) => c.expert_map(layer),
            Engine::Fixed(f) => f.expert_map.get(range).unwrap_or(&[]),
            Engine::Closed => return Err(err("the runtime is closed")),
        };
        Ok(PyArray1::from_slice(py, m))
    }

    /// Removes `ranks` from the live set (call on every survivor at the same iteration).
    fn remove_ranks(&mut self, py: Python<'_>, ranks: Vec<usize>) -> PyResult<()> {
        let c = self.dynamic()?;
        crate::logs::begin(py);
        let r = guarded_held(|| c.remove_ranks(&ranks).map_err(|e| err(e.to_string())));
        crate::logs::flush(py);
        r
    }

    /// Adds `ranks` back to the live set (call on every rank of the new set at the same
    /// iteration).
    fn add_ranks(&mut self, py: Python<'_>, ranks: Vec<usize>) -> PyResult<()> {
        let c = self.dynamic()?;
        crate::logs::begin(py);
        let r = guarded_held(|| c.add_ranks(&ranks).map_err(|e| err(e.to_string())));
        crate::logs::flush(py);
        r
    }

    /// Resumes balancing after a suspension.
    fn resume(&mut self) -> PyResult<()> {
        let c = self.dynamic()?;
        c.resume();
        Ok(())
    }

    /// The live EP ranks.
    fn live(&self) -> PyResult<Vec<usize>> {
        match &self.engine {
            Engine::Dynamic(c) => Ok(c.live().iter().collect()),
            Engine::Fixed(f) => Ok((0..f.shape.ranks()).collect()),
            Engine::Closed => Err(err("the runtime is closed")),
        }
    }

    /// `running`, `suspended` or `diverged` (`running` in a static mode).
    #[getter]
    fn health(&self) -> PyResult<&'static str> {
        match &self.engine {
            Engine::Dynamic(c) => Ok(health_name(c.health())),
            Engine::Fixed(_) => Ok("running"),
            Engine::Closed => Err(err("the runtime is closed")),
        }
    }

    /// Whether a layer update is under way.
    #[getter]
    fn is_updating(&self) -> bool {
        matches!(&self.engine, Engine::Dynamic(c) if c.is_updating())
    }

    /// The counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("moves", self.moves)?;
        let (s, cycles) = match &self.engine {
            Engine::Dynamic(c) => (c.stats(), c.machine().cycle_number()),
            _ => (Default::default(), 0),
        };
        d.set_item("cycles", cycles)?;
        d.set_item("plans", s.plans_taken)?;
        d.set_item("layers_committed", s.layers_committed)?;
        d.set_item("layers_aborted", s.layers_failed)?;
        d.set_item("late_iterations", s.late_iterations)?;
        d.set_item("plan_failures", s.plan_failures)?;
        d.set_item("digest_mismatches", s.digest_mismatches)?;
        d.set_item("collectives", s.collectives)?;
        d.set_item("collective_failures", s.collective_failures)?;
        d.set_item("resyncs", s.resyncs)?;
        d.set_item("commit_failures", s.commit_failures)?;
        d.set_item("membership_changes", s.membership_changes)?;
        d.set_item("membership_refused", s.membership_refused)?;
        d.set_item("loads", s.loads)?;
        d.set_item("load_failures", s.load_failures)?;
        Ok(d)
    }

    /// The Prometheus text exposition of this rank's metrics (empty when `eplb_metrics` turns
    /// them off or the mode runs no controller).
    fn metrics_text(&self) -> PyResult<String> {
        match &self.registry {
            Some(r) => eplb_runtime::metrics::encode_text(r).map_err(|e| err(e.to_string())),
            None => Ok(String::new()),
        }
    }

    /// The engine's measured step time, ms (heat recordings carry it).
    fn record_iteration_ms(&mut self, ms: f64) {
        if let Engine::Dynamic(c) = &mut self.engine {
            c.record_iteration_ms(ms);
        }
    }

    /// Blocks (GIL released) until the planner answered this rank's outstanding cycle, at
    /// most `timeout_s` seconds; `True` when no answer is outstanding. For tests and replays.
    fn wait_for_plan(&self, py: Python<'_>, timeout_s: f64) -> PyResult<bool> {
        let Engine::Dynamic(c) = &self.engine else {
            return Ok(true);
        };
        let t = Duration::try_from_secs_f64(timeout_s.max(0.0))
            .map_err(|e| err(format!("timeout_s: {e}")))?;
        let Some(cycle) = c.awaited_cycle() else {
            return Ok(true);
        };
        let planner = std::sync::Arc::clone(c.planner());
        crate::logs::begin(py);
        let answered = py.detach(move || planner.wait_result(cycle, t).is_some());
        crate::logs::flush(py);
        Ok(answered)
    }

    /// Stops balancing and the planner thread; an exchange in flight is aborted.
    fn close(&mut self, py: Python<'_>) {
        crate::logs::begin(py);
        if let Engine::Dynamic(c) = std::mem::replace(&mut self.engine, Engine::Closed) {
            // Joins the planner thread and the heat recorder's writer with the GIL held: they
            // never wait for it (their log records queue, `crate::logs`).
            let _ = catch_unwind(AssertUnwindSafe(move || drop(c.into_transport())));
        }
        crate::logs::flush(py);
    }

    /// Whether `close()` ran.
    #[getter]
    fn closed(&self) -> bool {
        matches!(self.engine, Engine::Closed)
    }
}

/// The placement a rank starts from under `config` (a JSON text, or a file's path when
/// `config_is_path`), `[layers, ranks * slots]`: what an engine loads its expert weights by
/// before it builds the runtime.
#[pyfunction]
#[pyo3(signature = (config, config_is_path, *, layers, experts, ranks, ranks_per_node = None, groups = 1))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn startup_placement<'py>(
    py: Python<'py>,
    config: &str,
    config_is_path: bool,
    layers: u16,
    experts: u16,
    ranks: u16,
    ranks_per_node: Option<u16>,
    groups: u16,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    crate::logs::begin(py);
    let made = guarded_held(|| {
        let cfg = read_config(config, config_is_path)?;
        let model = ModelInfo {
            layers,
            experts,
            ranks,
            ranks_per_node: ranks_per_node.unwrap_or(ranks),
            groups,
            max_num_seqs: 256,
            speculative_tokens: 0,
            tp_size: 1,
        };
        startup(&cfg, &model).map_err(|e| err(e.to_string()))
    });
    crate::logs::flush(py);
    let (shape, p) = made?;
    let v: Vec<i64> = p.iter().map(|&e| i64::from(e)).collect();
    PyArray1::from_vec(py, v)
        .reshape([shape.layers(), shape.slots_per_layer()])
        .map_err(|e| err(e.to_string()))
}
