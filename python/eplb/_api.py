"""The numpy API over `eplb._native`."""

from __future__ import annotations

import os
import warnings
from typing import Any, NamedTuple, Optional

import numpy as np

from . import _native
from ._check import MAX_SEED, PreconditionError, flag, integer, number, optional_integer
from ._check import path as path_arg
from ._native import EplbError, Rebalance
from ._tensor import integer_array, is_tensor, like, numeric_array


def policy_params() -> dict:
    """``{policy name: [parameter names]}``: what ``Policy(name, **params)`` accepts."""
    return {name: list(params) for name, params in _native.policy_params()}


#: Canonical policy names, as the Rust policies list them (numbers 0..4 select random, default,
#: swift, flashlb, incremental).
POLICIES = tuple(policy_params())


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
    # A torch tensor of any dtype and device goes through `.float()` (bfloat16 has no numpy
    # dtype), as DeepSeek's `weight.float()`; numpy of another numeric dtype becomes float32.
    if is_tensor(weight):
        if hasattr(weight, "detach"):
            weight = weight.detach()
        if hasattr(weight, "float"):
            weight = weight.float()
    w = numeric_array(weight, "weight", other=np.float32, error=PreconditionError)
    try:
        phy2log, log2phy, logcnt = _native.rebalance_experts(w, *counts)
    except EplbError as e:
        raise PreconditionError(str(e)) from None
    width = max(1, int(logcnt.max())) if logcnt.size else 1
    log2phy = np.ascontiguousarray(log2phy[:, :, :width])
    return tuple(like(a, weight) for a in (phy2log, log2phy, logcnt))


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
        """A new placement from ``loads`` (``[L, N]``, any numeric dtype, finite and ``>= 0``),
        the ``current`` placement (``[L, R, S]`` or ``[L, R*S]``, any integer dtype; default:
        vLLM-Ascend's default layout) and, for flashlb, per-window ``samples`` (``[T, L, N]``,
        any numeric dtype). Arrays may be numpy (either byte order), torch tensors (any dtype,
        bfloat16 included, any device) or nested lists. The Rust call runs without the GIL;
        Ctrl-C interrupts it (the policy's state stays as it was)."""
        loads = numeric_array(loads, "loads")
        if current is not None:
            current = integer_array(current, "current")
        if samples is not None:
            samples = numeric_array(samples, "samples")
        return self._get().rebalance(loads, current, samples)

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
    if not isinstance(routing, str):
        raise EplbError(f"routing = {routing!r}: expected `even` or `log2phy`")
    par, mean, mx = _native.hotness(
        integer_array(placement, "placement"), numeric_array(loads, "loads"), routing
    )
    return Hotness(par, mean, mx)


def read_map(path, max_input_bytes: int = 1 << 30) -> np.ndarray:
    """A vLLM-Ascend expert-map JSON as ``[L, R, S]`` int64 (co-located copies accepted). As the
    CLI, it reads only a regular file of at most ``max_input_bytes`` (default 1 GiB)."""
    return _native.read_map(
        path_arg(path, "path"), integer(max_input_bytes, "max_input_bytes", hi=2**63 - 1)
    )


def validate_map(path, experts: Optional[int] = None, ranks: Optional[int] = None,
                 max_input_bytes: int = 1 << 30) -> list:
    """Every problem of an expert-map JSON as ``eplb validate`` lists them (co-located copies are
    problems); an empty list means valid. Reads only a regular file of at most
    ``max_input_bytes`` (default 1 GiB)."""
    experts = optional_integer(experts, "experts", lo=1)
    ranks = optional_integer(ranks, "ranks", lo=1)
    limit = integer(max_input_bytes, "max_input_bytes", hi=2**63 - 1)
    return _native.validate_map(path_arg(path, "path"), experts, ranks, limit)


def write_map(path, placement) -> None:
    """Writes ``placement`` (``[L, R, S]``) as an expert-map JSON, byte-identical to
    vLLM-Ascend's recorder, as ``eplb plan --out`` writes it: a regular file is replaced
    atomically (a temporary file in the same directory, fsync, rename; the file keeps its
    permissions), a symbolic link is followed to the file it names (the link stays), a FIFO or a
    character device such as ``/dev/null`` is written through, never replaced; anything else
    raises :class:`EplbError`."""
    _native.write_map(path_arg(path, "path"), integer_array(placement, "placement"))


_SIMULATE_OPTIONS = frozenset({
    "ranks", "redundant", "policy", "heat_interval", "algo_interval", "ranks_per_node", "groups",
    "initial", "routing", "seed", "params", "placements_log", "model", "hidden", "intermediate",
    "quant", "fused_mc2", "link", "max_input_bytes", "hardware", "role", "tokens_per_rank",
    "payoff_gate",
})


#: simulate's counts that have one rule each (`eplb_core::settings`): only checked to be
#: integers here (of the native layer's i64); their range is the rule's, applied by the native
#: layer with the CLI's words.
_SIMULATE_RULED = {
    k: (-(2**63), 2**63 - 1) for k in ("ranks", "redundant", "heat_interval", "algo_interval")
}
#: simulate's other integer options and their largest values (the native layer's types).
_SIMULATE_COUNTS = {
    "ranks_per_node": 2**16 - 1,
    "groups": 2**16 - 1,
    "seed": MAX_SEED,
    "hidden": 2**64 - 1,
    "intermediate": 2**64 - 1,
    "max_input_bytes": 2**64 - 1,
}
#: simulate's options that name something.
_SIMULATE_NAMES = ("policy", "initial", "routing", "model", "quant", "link", "hardware", "role")


def _param(key, value) -> float:
    """One of simulate's ``params``: a number (not a bool or a string), as ``Policy``'s."""
    msg = f"simulate: --param {key}={value}: parameter `{key}`: `{value}` is not a number"
    try:
        return number(value, str(key))
    except EplbError:
        raise EplbError(msg) from None


def simulate(trace, **options) -> dict:
    """``eplb simulate --json`` on ``trace``: the same dict the CLI prints.

    Options are the CLI's, with underscores: ``ranks``, ``redundant``, ``policy``,
    ``heat_interval``, ``algo_interval`` (required), ``ranks_per_node``, ``groups``,
    ``initial``, ``routing``, ``seed``, ``params`` (a dict), ``placements_log``, ``model``,
    ``hidden``, ``intermediate``, ``quant``, ``fused_mc2``, ``link``, ``max_input_bytes``,
    ``hardware``, ``role``, ``tokens_per_rank``, ``payoff_gate`` (the time model's; the result carries its
    ``est_*`` keys and ``time_model``, as the CLI's).
    They go to the simulator library (``eplb-sim``) as typed arguments, in this process, on one
    worker thread, without the GIL; Ctrl-C stops the replay at its next window. Errors raise
    :class:`EplbError` with the CLI's message; what the CLI prints as ``warning: ...`` (a trace
    shorter than one cycle, failed plans) is a :class:`RuntimeWarning`. Counts are integers,
    ``params`` values and ``tokens_per_rank`` numbers, ``fused_mc2`` and ``payoff_gate`` bools,
    names strings, paths str or ``os.PathLike``: anything else is an :class:`EplbError`.
    """
    unknown = sorted(set(options) - _SIMULATE_OPTIONS)
    if unknown:
        raise EplbError(f"simulate: unexpected argument `{unknown[0]}`; expected one of "
                        f"{', '.join(sorted(_SIMULATE_OPTIONS))}")
    missing = [k for k in ("ranks", "redundant", "policy", "heat_interval", "algo_interval")
               if options.get(k) is None]
    if missing:
        raise EplbError(f"simulate: missing required argument `{missing[0]}`")
    kw = {k: v for k, v in options.items() if v is not None}
    params = kw.get("params") or {}
    if not isinstance(params, dict):
        raise EplbError(f"simulate: params = {params!r}: expected a dict of parameter values")
    kw["params"] = [(str(k), _param(k, v)) for k, v in params.items()]
    if isinstance(kw["policy"], int) and not isinstance(kw["policy"], bool):
        kw["policy"] = str(kw["policy"])  # 0..4, as `Policy(4, ...)` and `--policy 4`
    for key, (lo, hi) in _SIMULATE_RULED.items():
        if key in kw:
            kw[key] = integer(kw[key], f"simulate: {key}", lo=lo, hi=hi)
    for key, hi in _SIMULATE_COUNTS.items():
        if key in kw:
            kw[key] = integer(kw[key], f"simulate: {key}", hi=hi)
    for key in _SIMULATE_NAMES:
        if key in kw and not isinstance(kw[key], str):
            raise EplbError(f"simulate: {key} = {kw[key]!r} is not a string")
    for key in ("fused_mc2", "payoff_gate"):
        if key in kw:
            kw[key] = flag(kw[key], f"simulate: {key}")
    if "tokens_per_rank" in kw:
        kw["tokens_per_rank"] = number(kw["tokens_per_rank"], "simulate: tokens_per_rank")
    if "placements_log" in kw:
        kw["placements_log"] = path_arg(kw["placements_log"], "simulate: placements_log")
    trace = path_arg(trace, "simulate: trace")
    args = [kw.pop(k) for k in ("ranks", "redundant", "policy", "heat_interval", "algo_interval")]
    try:
        result, warned = _native.simulate(trace, *args, **kw)
    except EplbError as e:
        raise EplbError(f"simulate: {e}") from None
    except (TypeError, OverflowError) as e:
        raise EplbError(f"simulate: {e}") from None
    for w in warned:
        warnings.warn(f"eplb.simulate: {w}", RuntimeWarning, stacklevel=2)
    return result
