"""The numpy API over `eplb._native`."""

from __future__ import annotations

import os
import warnings
from typing import Any, NamedTuple, Optional

import numpy as np

from . import _native
from ._check import MAX_SEED, PreconditionError, integer, optional_integer
from ._native import EplbError
from ._tensor import from_nested, like, native_order, to_numpy

def policy_params() -> dict:
    """``{policy name: [parameter names]}``: what ``Policy(name, **params)`` accepts."""
    return {name: list(params) for name, params in _native.policy_params()}


#: Canonical policy names, as the Rust policies list them (numbers 0..4 select random, default,
#: swift, flashlb, incremental).
POLICIES = tuple(policy_params())


def _array(x, what: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (list, tuple)):
        return from_nested(x, what)
    raise EplbError(f"{what}: expected a numpy array, got {type(x).__name__}")


#: The load dtypes the native layer reads as they are; any other numeric dtype becomes float32
#: first, as DeepSeek's ``weight.float()`` does.
_NATIVE_LOAD_DTYPES = (np.int32, np.int64, np.float32, np.float64)


def _deepseek_weight(weight) -> np.ndarray:
    """``weight`` as a numpy array the native layer reads: a torch tensor of any dtype and device
    goes through ``.float()`` (bfloat16 has no numpy dtype), a numpy array of another numeric
    dtype (float16, int16, uint8, bool, ...) becomes float32, one in the other byte order is
    swapped to the machine's, and a ragged nested list is an :class:`EplbError`."""
    if hasattr(weight, "dim") and not isinstance(weight, np.ndarray):
        if hasattr(weight, "detach"):
            weight = weight.detach()
        if hasattr(weight, "float"):
            weight = weight.float()
        w = to_numpy(weight)
    else:
        w = from_nested(weight, "weight")
    w = native_order(w)
    if w.dtype.type in _NATIVE_LOAD_DTYPES:
        return w
    if w.dtype.kind not in "biuf":
        raise PreconditionError(f"weight: dtype {w.dtype} is not a number type")
    return w.astype(np.float32)


def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus):
    """DeepSeek's ``eplb.rebalance_experts``, as a drop-in (our ``deepseek`` policy).

    ``weight`` is ``[L, N]``: a torch tensor (any dtype, any device) or a numpy array (any
    numeric dtype) or nested lists. Returns ``(phy2log [L, P], log2phy [L, N, M] padded with -1,
    logcnt [L, N])``, int64, of the input's kind (torch in, CPU torch out; else numpy), ``M``
    the largest copy count, as DeepSeek's. Hierarchical when ``num_groups % num_nodes == 0``,
    else global, as DeepSeek's. ``log2phy`` lists each expert's replicas in the order DeepSeek's
    replication created them, as DeepSeek's does. A failed precondition raises
    :class:`PreconditionError`, both an :class:`EplbError` and an ``AssertionError``.
    """
    counts = [
        integer(v, what, lo=1, error=PreconditionError)
        for v, what in (
            (num_replicas, "num_replicas"),
            (num_groups, "num_groups"),
            (num_nodes, "num_nodes"),
            (num_gpus, "num_gpus"),
        )
    ]
    w = _deepseek_weight(weight)
    try:
        phy2log, log2phy, logcnt = _native.rebalance_experts(w, *counts)
    except EplbError as e:
        raise PreconditionError(str(e)) from None
    width = max(1, int(logcnt.max())) if logcnt.size else 1
    log2phy = np.ascontiguousarray(log2phy[:, :, :width])
    return tuple(like(a, weight) for a in (phy2log, log2phy, logcnt))


class Rebalance:
    """What :meth:`Policy.rebalance` returns.

    ``placement`` is ``[L, R, S]`` int64; ``par_before``, ``par_after`` (float64), ``moves``
    (int64: experts each layer must fetch) and ``changed`` (bool) are per layer. The means and
    maxima over layers, and ``colocated_rows`` (rows holding an expert twice; only ``deepseek``
    produces them), are plain numbers. ``rust_seconds`` is the wall time of the Rust policy
    call alone (without the conversions), for measuring the binding's overhead.
    """

    __slots__ = (
        "placement",
        "par_before",
        "par_after",
        "changed",
        "moves",
        "par_before_mean",
        "par_before_max",
        "par_after_mean",
        "par_after_max",
        "colocated_rows",
        "rust_seconds",
    )

    def __init__(self, raw):
        placement, before, after, changed, moves, summary = raw
        self.placement = placement
        self.par_before = before
        self.par_after = after
        self.changed = changed
        self.moves = moves
        (
            self.par_before_mean,
            self.par_before_max,
            self.par_after_mean,
            self.par_after_max,
            self.colocated_rows,
            self.rust_seconds,
        ) = summary

    @property
    def moves_total(self) -> int:
        return int(self.moves.sum())

    def __repr__(self) -> str:
        return (
            f"Rebalance(layers={len(self.changed)}, changed={int(self.changed.sum())}, "
            f"moves={self.moves_total}, par {self.par_before_mean:.4f} -> {self.par_after_mean:.4f})"
        )


class Policy:
    """One policy on one shape; stateful policies (flashlb, incremental) keep their state here.

    ``name`` is random, default, swift, flashlb, incremental, deepseek or 0..4. ``**params`` are
    the policy's parameters (:func:`policy_params`); an unknown one or an out-of-range value
    raises :class:`EplbError` naming it. The object starts no thread, works after ``fork``
    (the child goes on with a copy of the state), and pickles as its settings: the unpickled
    object starts from a fresh state.
    """

    def __init__(
        self,
        name,
        *,
        layers: int,
        experts: int,
        ranks: int,
        redundant: int,
        ranks_per_node: Optional[int] = None,
        groups: Optional[int] = None,
        seed: int = 0,
        **params: Any,
    ):
        self._settings = dict(
            name=str(name),
            layers=integer(layers, "layers"),
            experts=integer(experts, "experts"),
            ranks=integer(ranks, "ranks"),
            redundant=integer(redundant, "redundant"),
            ranks_per_node=optional_integer(ranks_per_node, "ranks_per_node", lo=1),
            groups=optional_integer(groups, "groups", lo=1),
            seed=integer(seed, "seed", hi=MAX_SEED),
            params=dict(params),
        )
        self._native = self._build()
        self._pid = os.getpid()

    def _build(self):
        s = self._settings
        return _native.NativePolicy(
            s["name"],
            s["layers"],
            s["experts"],
            s["ranks"],
            s["redundant"],
            s["ranks_per_node"],
            s["groups"],
            s["seed"],
            s["params"],
        )

    @property
    def name(self) -> str:
        return self._get().name

    @property
    def settings(self) -> dict:
        return dict(self._settings, params=dict(self._settings["params"]))

    @property
    def slots_per_rank(self) -> int:
        return self._get().shape[3]

    def _get(self):
        if self._native is None:
            self._native = self._build()
            self._pid = os.getpid()
        elif self._pid != os.getpid():
            # A forked child: go on with a copy whose lock no thread of the parent can hold.
            self._native = self._native.fork_copy()
            self._pid = os.getpid()
        return self._native

    def reset(self) -> None:
        """Forgets the state: the next call starts fresh."""
        self._get().reset()

    def rebalance(self, loads, current=None, samples=None) -> Rebalance:
        """A new placement from ``loads`` (``[L, N]``, int32/int64/float32/float64, finite and
        ``>= 0``), the ``current`` placement (``[L, R, S]`` or ``[L, R*S]``, any integer dtype;
        default: vLLM-Ascend's default layout) and, for flashlb, per-window ``samples``
        (``[T, L, N]``). The GIL is released during the Rust call."""
        loads = _array(loads, "loads")
        if current is not None:
            current = _array(current, "current")
        if samples is not None:
            samples = _array(samples, "samples")
        return Rebalance(self._get().rebalance(loads, current, samples))

    def __reduce__(self):
        return (_rebuild, (self.settings,))

    def __repr__(self) -> str:
        s = self._settings
        extra = "".join(f", {k}={v!r}" for k, v in sorted(s["params"].items()))
        return (
            f"eplb.Policy({s['name']!r}, layers={s['layers']}, experts={s['experts']}, "
            f"ranks={s['ranks']}, redundant={s['redundant']}{extra})"
        )


def _rebuild(settings: dict) -> Policy:
    p = Policy.__new__(Policy)
    p._settings = settings
    p._native = None  # built at first use: nothing native crosses a pickle
    p._pid = os.getpid()
    return p


class Hotness(NamedTuple):
    """Per-layer PAR of a placement under some loads, with its mean and max."""

    par: np.ndarray
    mean: float
    max: float


def hotness(placement, loads, routing: str = "even") -> Hotness:
    """PAR per layer of ``placement`` (``[L, R, S]``) under ``loads`` (``[L, N]``): each expert's
    load split evenly over its copies (``routing="even"``) or routed as vLLM-Ascend's static
    ``log2phy`` does (``"log2phy"``)."""
    par, mean, mx = _native.hotness(_array(placement, "placement"), _array(loads, "loads"), routing)
    return Hotness(par, mean, mx)


def read_map(path, max_input_bytes: int = 1 << 30) -> np.ndarray:
    """A vLLM-Ascend expert-map JSON as ``[L, R, S]`` int64 (co-located copies accepted). As the
    CLI, it reads only a regular file of at most ``max_input_bytes`` (default 1 GiB)."""
    return _native.read_map(os.fspath(path), integer(max_input_bytes, "max_input_bytes", hi=2**63 - 1))


def validate_map(path, experts: Optional[int] = None, ranks: Optional[int] = None,
                 max_input_bytes: int = 1 << 30) -> list:
    """Every problem of an expert-map JSON as ``eplb validate`` lists them (co-located copies are
    problems); an empty list means valid. Reads only a regular file of at most
    ``max_input_bytes`` (default 1 GiB)."""
    experts = optional_integer(experts, "experts", lo=1)
    ranks = optional_integer(ranks, "ranks", lo=1)
    limit = integer(max_input_bytes, "max_input_bytes", hi=2**63 - 1)
    return _native.validate_map(os.fspath(path), experts, ranks, limit)


def write_map(path, placement) -> None:
    """Writes ``placement`` (``[L, R, S]``) as an expert-map JSON, byte-identical to
    vLLM-Ascend's recorder, as ``eplb plan --out`` writes it: a regular file is replaced
    atomically (a temporary file in the same directory, fsync, rename; the file keeps its
    permissions), a symbolic link is followed to the file it names (the link stays), a FIFO or a
    character device such as ``/dev/null`` is written through, never replaced; anything else
    raises :class:`EplbError`."""
    _native.write_map(os.fspath(path), _array(placement, "placement"))


_SIMULATE_OPTIONS = frozenset({
    "ranks", "redundant", "policy", "heat_interval", "algo_interval", "ranks_per_node", "groups",
    "initial", "routing", "seed", "params", "placements_log", "model", "hidden", "intermediate",
    "quant", "fused_mc2", "link", "max_input_bytes", "hardware", "role", "tokens_per_rank",
    "payoff_gate",
})


def simulate(trace, **options) -> dict:
    """``eplb simulate --json`` on ``trace``: the same dict the CLI prints.

    Options are the CLI's, with underscores: ``ranks``, ``redundant``, ``policy``,
    ``heat_interval``, ``algo_interval`` (required), ``ranks_per_node``, ``groups``,
    ``initial``, ``routing``, ``seed``, ``params`` (a dict), ``placements_log``, ``model``,
    ``hidden``, ``intermediate``, ``quant``, ``fused_mc2``, ``link``, ``max_input_bytes``,
    ``hardware``, ``role``, ``tokens_per_rank``, ``payoff_gate`` (the time model's; the result carries its
    ``est_*`` keys and ``time_model``, as the CLI's).
    They go to the simulator library (``eplb-sim``) as typed arguments, in this process, on one
    thread, with the GIL released. Errors raise :class:`EplbError` with the CLI's message; what
    the CLI prints as ``warning: ...`` (a trace shorter than one cycle, failed plans) is a
    :class:`RuntimeWarning`.
    """
    unknown = sorted(set(options) - _SIMULATE_OPTIONS)
    if unknown:
        raise EplbError(f"simulate: unexpected argument `{unknown[0]}`; expected one of "
                        f"{', '.join(sorted(_SIMULATE_OPTIONS))}")
    missing = [k for k in ("ranks", "redundant", "policy", "heat_interval", "algo_interval")
               if options.get(k) is None]
    if missing:
        raise EplbError(f"simulate: missing required argument `{missing[0]}`")
    kw = dict(options)
    params = []
    for k, v in dict(kw.get("params") or {}).items():
        try:
            params.append((str(k), float(v)))
        except (TypeError, ValueError):
            raise EplbError(f"simulate: --param {k}={v}: parameter `{k}`: `{v}` is not a number") from None
    kw["params"] = params
    for key in ("placements_log",):
        if kw.get(key) is not None:
            kw[key] = os.fspath(kw[key])
    if kw.get("tokens_per_rank") is not None:
        kw["tokens_per_rank"] = float(kw["tokens_per_rank"])
    for key in ("initial", "routing", "policy", "model", "quant", "link", "hardware", "role"):
        if kw.get(key) is not None:
            kw[key] = str(kw[key])
    kw = {k: v for k, v in kw.items() if v is not None}
    args = [kw.pop(k) for k in ("ranks", "redundant", "policy", "heat_interval", "algo_interval")]
    try:
        result, warned = _native.simulate(os.fspath(trace), *args, **kw)
    except EplbError as e:
        raise EplbError(f"simulate: {e}") from None
    except (TypeError, OverflowError) as e:
        raise EplbError(f"simulate: {e}") from None
    for w in warned:
        warnings.warn(f"eplb.simulate: {w}", RuntimeWarning, stacklevel=2)
    return result
