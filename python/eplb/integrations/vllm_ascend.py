"""vLLM-Ascend (MRv1): our policies behind ``PolicyFactory.generate_policy``.

Called from :func:`eplb.integrations.vllm.register` (vLLM-Ascend workers load the
``vllm.general_plugins`` group too). When ``vllm_ascend`` is importable, the factory's
``generate_policy(policy_type)`` is wrapped: if the user selected a policy, with
``additional_config["eplb_rs"] = {"policy": ..., "params": {...}}`` or with ``EPLB_POLICY``,
the wrapper returns :class:`Policy` for the configured ``eplb_policy_type``, which keeps choosing
the load format (1 and 2: ``[L, R, S]`` int64 slot loads; 3: ``[H, L, R, S]`` int32 per-window
slot loads, and FlashLB's numba warm-up is then skipped). Without a selection it defers to the
original factory.

The pay-off gate: ``additional_config["eplb_rs"]["payoff_gate"]`` (the value of the runtime's
``eplb_payoff_gate``), else ``EPLB_PAYOFF_GATE`` holding the same JSON. A bad setting is logged
once when the policy is made and the policy runs without the gate. The gate weighs a move over
``expert_heat_collection_interval + algorithm_execution_interval`` (``eplb_config``).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Optional

import numpy as np

from .._check import integer
from .. import _native
from .._native import EplbError
from .._tensor import like, numeric_array, to_numpy
from . import _common, _record
from ._common import keep_slots  # noqa: F401 - part of this module's API

logger = logging.getLogger("vllm.eplb_rs")

FACTORY_MODULE = "vllm_ascend.eplb.core.policy.policy_factory"
FLASHLB_MODULE = "vllm_ascend.eplb.core.policy.policy_flashlb"
CONFIG_KEY = "eplb_rs"
_MARK = "__eplb_rs__"
_lock = threading.Lock()


def guard(table: np.ndarray, experts: int) -> Optional[str]:
    """What vLLM-Ascend's planner would reject in a new ``[L, R, S]`` table (an expert twice on
    one rank, an id out of range, an expert with no copy), or None when it passes."""
    layers, ranks, _ = table.shape
    if table.size and (table.min() < 0 or table.max() >= experts):
        return f"an expert id outside 0..{experts - 1}"
    srt = np.sort(table, axis=2)
    dup = np.argwhere((srt[:, :, 1:] == srt[:, :, :-1]).any(axis=2))
    if len(dup):
        l, r = dup[0]
        return f"layer {l}, rank {r} holds an expert twice"
    for l in range(layers):
        missing = np.setdiff1d(np.arange(experts), table[l])
        if missing.size:
            return f"layer {l} has no copy of expert {int(missing[0])}"
    return None


def fold(table: np.ndarray, slot_loads: np.ndarray, experts: int) -> np.ndarray:
    """Logical loads ``[..., L, N]`` from slot loads ``[..., L, R, S]`` through ``table`` (native)."""
    loads = np.asarray(slot_loads)
    if loads.dtype not in (np.int32, np.int64, np.float32, np.float64):
        loads = loads.astype(np.float64)
    return _native.fold_slot_loads(np.asarray(table), loads, experts)


class Policy:
    """vLLM-Ascend's ``EplbPolicy`` contract: ``rebalance_experts(current_expert_table,
    expert_workload)`` returns ``(changed, priority, new_table)``. One native policy per shape;
    picklable (the planner may run under ``forkserver``) and fork-safe."""

    def __init__(self, policy: str, params: Optional[dict] = None, policy_type: int = 1,
                 gate: Optional[str] = None):
        self.policy = _common.canonical(policy)
        self.params = _common.check_params(self.policy, params or {})
        self.policy_type = int(policy_type)
        #: The pay-off gate's setting (JSON text; None: no gate) and the gate.
        self.gate = gate
        try:
            self._gate = _common.gate_from(gate, "payoff gate")
        except EplbError as e:  # a calibration file gone since the setting was checked
            logger.error("eplb: %s; the %s policy runs without the pay-off gate", e, self.policy)
            self._gate = None
        #: The iterations the gate weighs a move over (None: the runtime's default, 600 + 50).
        self.gate_iterations: Optional[int] = None
        self.new_ep_size: Optional[int] = None
        self._cache: Optional[_common.PolicyCache] = None
        #: vLLM-Ascend's own policy of this type, built at the first fallback (not pickled).
        self._upstream = None

    def __getstate__(self):
        return {
            "policy": self.policy,
            "params": self.params,
            "policy_type": self.policy_type,
            "new_ep_size": self.new_ep_size,
            "gate": self.gate,
            "gate_iterations": self.gate_iterations,
        }

    def __setstate__(self, state):
        self.__init__(state["policy"], state["params"], state["policy_type"], state.get("gate"))
        self.new_ep_size = state.get("new_ep_size")
        self.gate_iterations = state.get("gate_iterations")

    def set_new_ep_size(self, new_ep_size) -> None:
        """Plans the next tables for ``new_ep_size`` ranks (elastic EP, as vLLM-Ascend's
        policies offer it): same slots per rank, every expert on the new ranks; ``None`` goes
        back to the current table's rank count. A size that is not a positive integer is
        logged and ignored (nothing raises into the engine)."""
        if new_ep_size is None:
            self.new_ep_size = None
            return
        try:
            self.new_ep_size = integer(new_ep_size, "new_ep_size", lo=1)
        except EplbError as e:
            logger.error("eplb: %s; the EP size stays %s", e, self.new_ep_size or "the table's")

    def rebalance_experts(self, current_expert_table, expert_workload):
        """Never raises: an exception would end vLLM-Ascend's planner loop and leave the worker
        waiting forever. On any failure (bad shapes or dtypes, a table the planner would
        reject, a policy error) vLLM-Ascend's own policy for this ``eplb_policy_type`` (the
        one the factory gave before it was wrapped) plans this cycle; when that fails too, the
        current table comes back unchanged. One log line says which."""
        try:
            table = np.asarray(to_numpy(current_expert_table))
            new = self.plan(table, numeric_array(expert_workload, "expert_workload"))
            if new.shape != table.shape:  # another EP size: every layer is new
                changed_layers = np.ones(new.shape[0], dtype=bool)
            else:
                changed_layers = (new != table.astype(np.int64)).reshape(new.shape[0], -1).any(axis=1)
            priority = np.flatnonzero(changed_layers)
            return int(changed_layers.any()), priority, like(new, current_expert_table)
        except Exception as e:  # noqa: BLE001 - the engine's loop must go on
            return self._fall_back(e, current_expert_table, expert_workload)

    def _fall_back(self, error, current_expert_table, expert_workload):
        what = f"eplb: {self.policy} policy failed ({type(error).__name__}: {error})"
        try:
            upstream = self._upstream
            if upstream is None:
                upstream = self._upstream = upstream_policy(self.policy_type)
            if upstream is None:
                raise LookupError("vLLM-Ascend's policy factory is not importable")
            if self.new_ep_size is not None and hasattr(upstream, "set_new_ep_size"):
                upstream.set_new_ep_size(self.new_ep_size)
            out = upstream.rebalance_experts(current_expert_table, expert_workload)
        except Exception as e:  # noqa: BLE001
            what += f"; vLLM-Ascend's own policy {self.policy_type} failed too ({type(e).__name__}: {e})"
        else:
            logger.error("%s; vLLM-Ascend's own policy %s plans this cycle", what, self.policy_type)
            return out
        logger.error("%s; the placement is kept this cycle", what)
        return 0, np.zeros(0, dtype=np.int64), current_expert_table

    def plan(self, table: np.ndarray, workload: np.ndarray) -> np.ndarray:
        """The numpy core: a new ``[L, R, S]`` int64 table that passes the planner's guard, or
        an EplbError saying why there is none."""
        cache = self._cache
        if cache is None:
            cache = self._cache = _common.PolicyCache()
        if table.ndim != 3:
            raise EplbError(f"current_expert_table: expected [L, R, S], got shape {table.shape}")
        if table.dtype.kind not in "iu":
            raise EplbError(f"current_expert_table: expected integer ids, got dtype {table.dtype}")
        if table.size and table.min() < 0:
            raise EplbError("current_expert_table: a negative expert id")
        if workload.ndim not in (3, 4):
            raise EplbError(
                f"expert_workload: expected [L, R, S] or [H, L, R, S], got shape {workload.shape}"
            )
        if workload.shape[-3:] != table.shape:
            raise EplbError(
                f"expert_workload: shape {workload.shape} does not end in the table's {table.shape}"
            )
        if workload.dtype.kind not in "iuf":
            raise EplbError(f"expert_workload: expected numbers, got dtype {workload.dtype}")
        layers, ranks, slots = table.shape
        experts = 0 if table.size == 0 else int(table.max()) + 1
        # A table holding an expert twice on one rank (co-located input) is repaired first, so
        # that the policy plans from, and keeps slots against, a placement the guard accepts.
        current = _common.repair_current(table, layers, experts, ranks, slots)
        if current is None:
            raise EplbError("current_expert_table: cannot be repaired into a valid placement")
        if workload.ndim == 4:
            samples = fold(table, workload, experts)
            loads = samples.sum(axis=0)
        else:
            samples = None
            loads = fold(table, workload, experts)
        _record.record("vllm-ascend", samples if samples is not None else loads)
        shape = dict(layers=layers, experts=experts, ranks=ranks, redundant=ranks * slots - experts)
        target = self.new_ep_size if self.new_ep_size is not None else ranks
        if target != ranks:
            # Another rank count: nothing of the current placement can be kept in place.
            if target * slots < experts:
                raise EplbError(
                    f"new_ep_size = {target} ranks x {slots} slots cannot hold {experts} experts"
                )
            shape.update(ranks=target, redundant=target * slots - experts)
            policy, start = _common.one_shot(cache, self.policy, self.params, loads, **shape)
            r = policy.rebalance(loads, start, samples if self.policy == "flashlb" else None)
            new = r.placement
        else:
            policy = cache.get(self.policy, self.params, **shape)
            r = policy.rebalance(loads, current, samples if self.policy == "flashlb" else None)
            new = keep_slots(current, r.placement)
            new = _common.gate_plan(self._gate, logger, current, new, loads, ranks=ranks,
                                    iterations=self.gate_iterations)
        why = guard(new, experts)
        if why is not None:
            raise EplbError(f"the new table would be rejected: {why}")
        return new


def selection():
    """``(policy, params)`` from ``additional_config["eplb_rs"]``, else from ``EPLB_POLICY``, or
    None. Raises EplbError on a bad setting."""
    cfg = _additional_config().get(CONFIG_KEY)
    if cfg is not None:
        if not isinstance(cfg, dict) or "policy" not in cfg:
            raise EplbError(
                f'additional_config["{CONFIG_KEY}"] must be {{"policy": ..., "params": {{...}}}}'
            )
        unknown = sorted(set(cfg) - {"policy", "params", "payoff_gate"})
        if unknown:
            raise EplbError(f'additional_config["{CONFIG_KEY}"]: unknown key `{unknown[0]}`')
        name = _common.canonical(cfg["policy"])
        return name, _common.check_params(name, cfg.get("params") or {})
    return _common.from_env()


def upstream_policy(policy_type):
    """vLLM-Ascend's own policy for ``policy_type``: what ``PolicyFactory.generate_policy``
    gave before :func:`register` wrapped it (None when the factory is not importable)."""
    import importlib

    try:
        factory = importlib.import_module(FACTORY_MODULE).PolicyFactory
    except Exception:  # noqa: BLE001
        return None
    generate = factory.generate_policy
    if getattr(generate, _MARK, False):
        generate = generate.__wrapped__
    return generate(policy_type)


def _additional_config() -> dict:
    try:
        from vllm_ascend.ascend_config import get_ascend_config

        extra = getattr(get_ascend_config().vllm_config, "additional_config", None) or {}
    except Exception:
        extra = {}
    return extra if isinstance(extra, dict) else {}


def cycle_iterations() -> int:
    """The iterations a placement serves: vLLM-Ascend's ``expert_heat_collection_interval``
    plus ``algorithm_execution_interval`` (``additional_config["eplb_config"]``; defaults 600
    and 50), at least 1."""
    cfg = _additional_config().get("eplb_config")
    cfg = cfg if isinstance(cfg, dict) else {}

    def value(key, default):
        v = cfg.get(key, default)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else default

    return max(1, value("expert_heat_collection_interval", 600)
               + value("algorithm_execution_interval", 50))


def gate_selection():
    """The pay-off gate of ``additional_config["eplb_rs"]["payoff_gate"]`` (the value of the
    runtime's ``eplb_payoff_gate``), else of ``EPLB_PAYOFF_GATE``, or None. Raises EplbError
    with ``eplb check-config``'s message on a bad setting."""
    cfg = _additional_config().get(CONFIG_KEY)
    if isinstance(cfg, dict) and "payoff_gate" in cfg:
        return _common.gate_from(
            json.dumps(cfg["payoff_gate"]), f'additional_config["{CONFIG_KEY}"]["payoff_gate"]'
        )
    return _common.gate_from_env()


def _skip_warm_up(*_args, **_kwargs):
    logger.info("eplb: FlashLB's numba warm-up skipped (eplb's policy serves this type)")


_skip_warm_up.__eplb_rs__ = True  # type: ignore[attr-defined]


def register() -> bool:
    """Wraps ``PolicyFactory.generate_policy`` when vLLM-Ascend is importable; True if wrapped."""
    with _lock:
        try:
            import importlib

            factory_mod = importlib.import_module(FACTORY_MODULE)
        except Exception as e:
            logger.debug("eplb: vLLM-Ascend's policy factory is not importable (%s)", e)
            return False
        factory = getattr(factory_mod, "PolicyFactory", None)
        original = getattr(factory, "generate_policy", None)
        if original is None:
            logger.warning("eplb: %s has no PolicyFactory.generate_policy; not patched", FACTORY_MODULE)
            return False
        if getattr(original, _MARK, False):
            return True
        names = _common.signature_names(original)
        if names != ["policy_type"]:
            logger.warning(
                "eplb: vLLM-Ascend's PolicyFactory.generate_policy has the signature %s, not "
                "['policy_type']; keeping vLLM-Ascend's own EPLB policies",
                names,
            )
            return False

        def generate_policy(policy_type):
            try:
                chosen = selection()
            except EplbError as e:
                logger.error("eplb: %s; keeping vLLM-Ascend's own policy %s", e, policy_type)
                return original(policy_type)
            if chosen is None:
                return original(policy_type)
            name, params = chosen
            if name == "deepseek":
                logger.warning(
                    "eplb: the deepseek policy may put two copies of an expert on one NPU, which "
                    "vLLM-Ascend's planner rejects; keeping vLLM-Ascend's own policy %s",
                    policy_type,
                )
                return original(policy_type)
            if int(policy_type) == 3:
                _disable_flashlb_warm_up()
            logger.info(
                "eplb: vLLM-Ascend eplb_policy_type %s now runs eplb's %s policy (params %s)",
                policy_type,
                name,
                params,
            )
            gate = _common.install_gate(logger, "vLLM-Ascend", gate_selection)
            p = Policy(name, params, policy_type, gate.text if gate is not None else None)
            p.gate_iterations = cycle_iterations()
            return p

        generate_policy.__eplb_rs__ = True  # type: ignore[attr-defined]
        generate_policy.__wrapped__ = original  # type: ignore[attr-defined]
        factory.generate_policy = staticmethod(generate_policy)  # type: ignore[union-attr]
        logger.info("eplb: vLLM-Ascend's PolicyFactory.generate_policy wrapped")
        return True


def _disable_flashlb_warm_up() -> None:
    try:
        import importlib

        mod = importlib.import_module(FLASHLB_MODULE)
    except Exception as e:
        logger.debug("eplb: %s not importable (%s); no warm-up to skip", FLASHLB_MODULE, e)
        return
    if callable(getattr(mod, "warm_up", None)) and not getattr(mod.warm_up, _MARK, False):
        mod.warm_up = _skip_warm_up  # type: ignore[attr-defined]
