"""SGLang: ``--eplb-algorithm eplb_rs:<policy>`` runs our policies.

``eplb_rs:deepseek``, ``eplb_rs:deepseek_hierarchical`` and ``eplb_rs:auto`` mean what SGLang's
``deepseek``, ``deepseek_hierarchical`` and ``auto`` mean (DeepSeek's global policy, its
hierarchical one, and SGLang's choice between them), computed by our ``deepseek`` policy.

``register()`` is the ``sglang.srt.plugins`` entry point. It registers two AROUND hooks with
SGLang's ``HookRegistry``: on ``compute_algorithm`` (our names resolve to themselves, every other
name goes to SGLang) and on ``rebalance_experts`` (our names are served by
:func:`rebalance_experts`, every other algorithm by SGLang's dispatcher).

``EPLB_PAYOFF_GATE`` (the JSON of the runtime's ``eplb_payoff_gate``) turns the pay-off gate on
for the ``eplb_rs:`` algorithms: a layer whose move does not pay over
``eplb_rebalance_num_iterations`` keeps its rows of the current placement (the global
expert-location metadata's). A bad setting is logged once at :func:`register` and the algorithms
run without the gate.
"""

from __future__ import annotations

import logging

import numpy as np

from .. import _api
from .. import _native
from .._native import EplbError
from .._tensor import numeric_array, to_numpy, to_torch
from . import _common, _record

logger = logging.getLogger("sglang.eplb_rs")

PREFIX = "eplb_rs:"
ALGORITHMS = "sglang.srt.eplb.eplb_algorithms"
EXPECTED = {
    "compute_algorithm": ["raw_algorithm", "num_groups", "num_nodes"],
    "rebalance_experts": [
        "tokens_per_expert",
        "num_physical_experts",
        "num_local_physical_experts",
        "num_groups",
        "num_nodes",
        "algorithm",
    ],
}

_cache = _common.PolicyCache()
#: The pay-off gate (``EPLB_PAYOFF_GATE``, read by :func:`register`), or None.
_gate = None
#: SGLang's default ``eplb_rebalance_num_iterations``: the forward passes a placement serves,
#: over which the pay-off gate weighs a move.
REBALANCE_INTERVAL = 1000


#: SGLang's own names for DeepSeek's algorithm, mirrored under our prefix with SGLang's meaning:
#: ``deepseek`` is the global policy, ``deepseek_hierarchical`` the hierarchical one, and ``auto``
#: chooses as SGLang's ``compute_algorithm`` does (hierarchical when the groups divide into the
#: nodes).
DEEPSEEK_MODES = ("deepseek", "deepseek_hierarchical", "auto")


def ours(algorithm):
    """The ``(policy, params)`` of an ``eplb_rs:<policy>`` algorithm (or of what our
    ``compute_algorithm`` hook returned for it), else None. ``policy`` is one of our policies or
    one of :data:`DEEPSEEK_MODES`. Parameters come from ``EPLB_POLICY_PARAMS`` (JSON)."""
    raw = getattr(algorithm, "value", algorithm)
    if not isinstance(raw, str) or not raw.startswith(PREFIX):
        return None
    suffix = raw[len(PREFIX):].strip()
    if suffix in DEEPSEEK_MODES:
        return suffix, _common.check_params("deepseek", _common.params_from_env())
    name = _common.canonical(suffix)
    return name, _common.check_params(name, _common.params_from_env())


def deepseek_hierarchical(mode: str, num_groups, num_nodes: int) -> bool:
    """Whether SGLang's algorithm ``mode`` (one of :data:`DEEPSEEK_MODES`) is the hierarchical
    policy for these groups and nodes; raises EplbError when ``deepseek_hierarchical`` cannot be
    (SGLang asserts the same)."""
    if mode == "deepseek":
        return False
    fits = num_groups is not None and int(num_groups) % int(num_nodes) == 0
    if mode == "auto":
        return fits
    if not fits:
        raise EplbError(
            f"deepseek_hierarchical needs expert groups that divide into the nodes: "
            f"num_groups = {num_groups}, num_nodes = {num_nodes}"
        )
    return True


def derive_maps(phy2log: np.ndarray, experts: int):
    """``(log2phy [L, N, P-N+1] -1 padded, logcnt [L, N])`` from ``phy2log [L, P]``: each expert's
    physical ids in ascending order, as SGLang derives them from a mapping (native)."""
    return _native.derive_maps(np.asarray(phy2log), experts)


def _server_args():
    """SGLang's global server arguments, or None when they are not set or not importable."""
    try:
        from sglang.srt.server_args import get_global_server_args

        return get_global_server_args()
    except Exception:  # noqa: BLE001
        return None


def _rebalance_interval() -> int:
    """The forward passes between rebalances: SGLang's ``eplb_rebalance_num_iterations``, else
    its default :data:`REBALANCE_INTERVAL`."""
    n = getattr(_server_args(), "eplb_rebalance_num_iterations", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else REBALANCE_INTERVAL


def _current_phy2log():
    try:
        from sglang.srt.eplb.expert_location import get_global_expert_location_metadata

        meta = get_global_expert_location_metadata()
        return None if meta is None else to_numpy(meta.physical_to_logical_map_cpu)
    except Exception:
        return None


def rebalance_experts(
    tokens_per_expert,
    num_physical_experts,
    num_local_physical_experts,
    num_groups,
    num_nodes,
    algorithm,
):
    """SGLang's algorithm contract: per-step counts ``[T, L, E]`` (any device) in,
    ``(phy2log [L, P], log2phy [L, E, P-E+1], logcnt [L, E])`` CPU int64 torch tensors out.
    The deepseek modes list each expert's replicas in ``log2phy`` as DeepSeek's algorithm
    (and SGLang's copy of it) does, in the order they were created; the other policies in
    ascending physical id."""
    chosen = ours(algorithm)
    if chosen is None:
        raise EplbError(f"algorithm {algorithm!r} is not an {PREFIX}<policy> algorithm")
    phy2log, log2phy, logcnt = plan(
        numeric_array(tokens_per_expert, "tokens_per_expert"),
        int(num_physical_experts),
        int(num_local_physical_experts),
        num_groups,
        int(num_nodes),
        chosen,
    )
    return to_torch(phy2log), to_torch(log2phy), to_torch(logcnt)


def plan(tokens, num_physical, num_local, num_groups, num_nodes, chosen, current=None):
    """The numpy core of :func:`rebalance_experts`."""
    name, params = chosen
    t = np.asarray(tokens)
    if t.ndim == 2:
        t = t[None]
    if t.ndim != 3:
        raise EplbError(f"tokens_per_expert: expected [T, L, E], got shape {t.shape}")
    _record.record("sglang", t)
    if num_local < 1 or num_physical % num_local != 0:
        raise EplbError(
            f"num_physical_experts = {num_physical} is not a multiple of "
            f"num_local_physical_experts = {num_local}"
        )
    ranks = num_physical // num_local
    weight = t.sum(axis=0, dtype=np.int64) if t.dtype.kind in "iu" else t.sum(axis=0)
    layers, experts = weight.shape
    if current is None:
        current = _current_phy2log()
    nodes_divide = num_nodes >= 1 and ranks % num_nodes == 0
    gate = dict(ranks=ranks, ranks_per_node=ranks // num_nodes if nodes_divide else None,
                iterations=_rebalance_interval())
    if name in DEEPSEEK_MODES:
        # SGLang's global policy is DeepSeek's hierarchical one over one group and one node.
        if deepseek_hierarchical(name, num_groups, num_nodes):
            groups, nodes = int(num_groups), int(num_nodes)
        else:
            groups, nodes = 1, 1
        phy2log, log2phy, logcnt = _api.rebalance_experts(weight, num_physical, groups, nodes, ranks)
        # DeepSeek's log2phy (replicas in the order they were created), -1 padded to P-N+1.
        width = num_physical - experts + 1
        padded = np.full((layers, experts, width), -1, dtype=np.int64)
        padded[:, :, : log2phy.shape[2]] = log2phy
        gated = _common.gate_plan(_gate, logger, current, phy2log, weight, **gate)
        kept = (gated != phy2log).any(axis=1)
        if kept.any():
            # Layers the gate kept on their placement: the maps of their current rows.
            l2p, cnt = derive_maps(gated[kept], experts)
            padded[kept], logcnt[kept] = l2p, cnt
        return gated, padded, logcnt
    policy = _cache.get(
        name, params, layers=layers, experts=experts, ranks=ranks,
        redundant=num_physical - experts,
    )
    cur = _common.repair_current(current, layers, experts, ranks, num_local)
    samples = _windows(t) if name == "flashlb" else None
    phy2log = policy.rebalance(weight, cur, samples).placement.reshape(layers, num_physical)
    phy2log = _common.gate_plan(_gate, logger, current, phy2log, weight, **gate)
    log2phy, logcnt = derive_maps(phy2log, experts)
    return phy2log, log2phy, logcnt


#: FlashLB keeps 64 samples per layer; SGLang records one row per forward step (1000 by default).
MAX_SAMPLES = 64


def _windows(t: np.ndarray) -> np.ndarray:
    """Per-step counts ``[T, L, E]`` as at most :data:`MAX_SAMPLES` windows of consecutive steps
    (summed, oldest first), FlashLB's samples."""
    if t.shape[0] <= MAX_SAMPLES:
        return t
    return np.stack([c.sum(axis=0) for c in np.array_split(t, MAX_SAMPLES, axis=0)])


def _around_compute_algorithm(original_fn, *args, **kwargs):
    """Our names resolve to themselves, unchecked: SGLang calls this at every rebalance, which
    must not raise, so an unknown policy or a bad parameter is reported (once per rebalance) by
    the ``rebalance_experts`` hook, which then hands the plan to SGLang's own algorithm."""
    raw = args[0] if args else kwargs.get("raw_algorithm")
    if isinstance(raw, str) and raw.startswith(PREFIX):
        return raw
    return original_fn(*args, **kwargs)


def _around_rebalance_experts(original_fn, *args, **kwargs):
    """Never raises into SGLang for an ``eplb_rs:`` algorithm, on the first rebalance as on any
    later one: when our policy fails (or its setting is bad), SGLang's own ``deepseek`` algorithm
    plans this rebalance; when that fails too, the current placement comes back (the global
    expert-location metadata's, else SGLang's trivial one: slot ``i`` holds expert ``i mod E``).
    One log line says which."""
    algorithm = args[5] if len(args) > 5 else kwargs.get("algorithm")
    raw = getattr(algorithm, "value", algorithm)
    if not (isinstance(raw, str) and raw.startswith(PREFIX)):
        return original_fn(*args, **kwargs)
    try:
        return rebalance_experts(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - a rebalance must not end SGLang's loop
        what = f"eplb: {raw} failed ({type(e).__name__}: {e})"
    fallback = _sglang_deepseek(original_fn)
    if fallback is not None:
        args = list(args)
        if len(args) > 5:
            args[5] = fallback
        else:
            kwargs["algorithm"] = fallback
        try:
            out = original_fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            what += f"; SGLang's own deepseek algorithm failed too ({type(e).__name__}: {e})"
        else:
            logger.error("%s; SGLang's own deepseek algorithm plans this rebalance", what)
            return out
    else:
        what += "; SGLang's own deepseek algorithm cannot be found"
    logger.error("%s; the placement is kept this rebalance", what)
    return _current_maps(*args, **kwargs)


def _current_maps(tokens_per_expert=None, num_physical_experts=None, *_args, **kwargs):
    """``(phy2log, log2phy, logcnt)`` of the current placement as CPU int64 torch tensors (numpy
    when torch is absent): the global metadata's ``phy2log`` when it fits, else SGLang's trivial
    placement. Sizes it cannot read become 1."""
    tokens = kwargs.get("tokens_per_expert", tokens_per_expert)
    shape = tuple(getattr(tokens, "shape", ()) or ())
    layers = int(shape[-2]) if len(shape) >= 2 else 1
    experts = max(1, int(shape[-1])) if shape else 1
    try:
        p = max(experts, int(kwargs.get("num_physical_experts", num_physical_experts)))
    except (TypeError, ValueError, OverflowError):
        p = experts
    current = _current_phy2log()
    ok = current is not None and current.shape == (layers, p) and current.dtype.kind in "iu"
    phy2log = (np.asarray(current, dtype=np.int64) if ok
               else np.tile(np.arange(p, dtype=np.int64) % experts, (layers, 1)))
    try:
        maps = (phy2log, *derive_maps(phy2log, experts))
    except EplbError:
        phy2log = np.tile(np.arange(p, dtype=np.int64) % experts, (layers, 1))
        maps = (phy2log, *derive_maps(phy2log, experts))
    try:
        return tuple(to_torch(a) for a in maps)
    except Exception:  # noqa: BLE001 - no torch: numpy is the best left
        return maps


def _sglang_deepseek(original_fn):
    """SGLang's ``EplbAlgorithm.deepseek``, or None when it cannot be found."""
    try:
        import importlib

        return importlib.import_module(ALGORITHMS).EplbAlgorithm.deepseek
    except Exception:  # noqa: BLE001
        return None


def register() -> bool:
    """The ``sglang.srt.plugins`` entry point; True when both hooks were registered."""
    try:
        import importlib

        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        algos = importlib.import_module(ALGORITHMS)
    except Exception as e:
        logger.warning("eplb: SGLang's plugin hooks or EPLB algorithms are not importable (%s); "
                       "eplb_rs algorithms are unavailable", e)
        return False
    for fn, want in EXPECTED.items():
        got = _common.signature_names(getattr(algos, fn, None))
        if got != want:
            logger.warning(
                "eplb: SGLang's %s.%s has the signature %s, not %s; eplb_rs algorithms are not "
                "registered and SGLang keeps its own", ALGORITHMS, fn, got, want,
            )
            return False
    global _gate
    _gate = _common.install_gate(logger, "SGLang", _common.gate_from_env)
    raw = getattr(_server_args(), "eplb_algorithm", None)
    if isinstance(raw, str) and raw.startswith(PREFIX):
        try:
            ours(raw)
        except EplbError as e:
            logger.error("eplb: --eplb-algorithm %s: %s; every rebalance falls back to SGLang's own "
                         "deepseek algorithm", raw, e)
    HookRegistry.register(f"{ALGORITHMS}.compute_algorithm", _around_compute_algorithm, HookType.AROUND)
    HookRegistry.register(f"{ALGORITHMS}.rebalance_experts", _around_rebalance_experts, HookType.AROUND)
    logger.info("eplb: SGLang --eplb-algorithm %s<policy> registered", PREFIX)
    return True
