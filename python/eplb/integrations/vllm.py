"""vLLM: our policies behind ``EPLB_POLICIES["default"]``.

``register()`` is the ``vllm.general_plugins`` entry point (every vLLM process calls it). When
``EPLB_POLICY`` names a policy (parameters as JSON in ``EPLB_POLICY_PARAMS``), it checks the
signature of upstream's ``rebalance_experts`` and, if it is the one this adapter implements,
puts :class:`Policy` in its place; users keep ``--eplb-config.policy default``. It then gives
vLLM-Ascend's MRv1 factory the same treatment (:mod:`eplb.integrations.vllm_ascend`).

``EPLB_PAYOFF_GATE`` (the JSON of the runtime's ``eplb_payoff_gate``) turns the pay-off gate on:
a layer whose move does not pay over ``step_interval`` keeps its rows. A bad setting is logged
once at :func:`register` and the policy runs without the gate.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

import numpy as np

from .. import _api, _native
from .._check import PreconditionError
from .._native import EplbError
from .._tensor import numeric_array, to_numpy, to_torch
from . import _common, _record

logger = logging.getLogger("vllm.eplb_rs")

#: The parameters of upstream's ``AbstractEplbPolicy.rebalance_experts`` (vLLM 0.33).
EXPECTED_SIGNATURE = [
    "weight",
    "num_replicas",
    "num_groups",
    "num_nodes",
    "num_ranks",
    "old_global_expert_indices",
]

_MARK = "__eplb_rs__"
_lock = threading.Lock()

#: vLLM's default ``eplb_config.step_interval``: the steps a placement serves, over which the
#: pay-off gate weighs a move.
STEP_INTERVAL = 3000


class ShapeError(PreconditionError):
    """Sizes that do not divide: the package's one precondition error (an EplbError and an
    AssertionError, as vLLM's default raises)."""


class Policy:
    """vLLM's policy contract: ``rebalance_experts`` is a classmethod returning ``phy2log``
    ``[L, num_replicas]`` as a CPU int64 torch tensor. The policy and parameters are class
    attributes set by :func:`register` (or :func:`configure`)."""

    policy_name = "deepseek"
    policy_params: dict = {}
    #: The pay-off gate (``EPLB_PAYOFF_GATE``), or None.
    gate: Optional[_native.PayoffGate] = None
    _cache = _common.PolicyCache()
    #: The engine's own policy class this one replaced (set by :func:`register`).
    upstream: Optional[type] = None

    @classmethod
    def rebalance_experts(
        cls,
        weight,
        num_replicas,
        num_groups,
        num_nodes,
        num_ranks,
        old_global_expert_indices=None,
    ):
        """Never raises into vLLM, on its first rearrangement (no previous placement) as on any
        later one: when our policy fails (NaN loads, a
        tensor of the wrong rank, loads that are not numbers, sizes that do not divide, ...), vLLM's own policy (the one
        :func:`register` replaced) plans this rearrangement; when that fails too, the engine's
        current table comes back (``old_global_expert_indices``, or on the first call vLLM's
        initial map: slot ``p`` holds expert ``p mod N``). One log line says which."""
        try:
            # Loads of any numeric dtype; a floating tensor (bfloat16 too) through `.float()`,
            # as vLLM's own policy reads them.
            w = numeric_array(weight, "weight")
            _record.record("vllm", w)
            phy2log = cls.plan(
                w,
                int(num_replicas),
                int(num_groups),
                int(num_nodes),
                int(num_ranks),
                None if old_global_expert_indices is None else to_numpy(old_global_expert_indices),
            )
            return to_torch(phy2log)
        except Exception as e:  # noqa: BLE001 - a rebalance must not end the engine's loop
            return cls._fall_back(
                e, weight, num_replicas, num_groups, num_nodes, num_ranks, old_global_expert_indices
            )

    @classmethod
    def _fall_back(cls, error, weight, num_replicas, num_groups, num_nodes, num_ranks, old):
        what = f"eplb: {cls.policy_name} policy failed ({type(error).__name__}: {error})"
        upstream = cls.upstream
        if upstream is not None:
            try:
                out = upstream.rebalance_experts(
                    weight, num_replicas, num_groups, num_nodes, num_ranks, old
                )
            except Exception as e:  # noqa: BLE001
                what += f"; vLLM's own policy failed too ({type(e).__name__}: {e})"
            else:
                logger.error("%s; vLLM's own policy plans this rearrangement", what)
                return out
        table = old if old is not None else _initial_table(weight, num_replicas)
        logger.error("%s; the placement is kept this rearrangement", what)
        return table

    @classmethod
    def preserve_intragpu_slots(cls, phy2log, num_ranks, old_phy2log):
        """vLLM's post-processing, for every policy: per rank and layer, an expert the rank
        keeps stays in its old slot (one old slot per copy it keeps), the incoming experts take
        the other slots in their order, so nothing is copied within a rank for nothing. The
        multiset of each rank's row is the new one's. ``phy2log`` comes back unchanged when
        the sizes differ (another rank count or slots per rank). numpy or torch in, the same
        kind out."""
        new = to_numpy(phy2log)
        old = to_numpy(old_phy2log)
        ranks = int(num_ranks)
        if (
            new.ndim != 2
            or old.shape != new.shape
            or ranks <= 0
            or new.shape[1] % ranks != 0
        ):
            return phy2log
        layers, p = new.shape
        shape = (layers, ranks, p // ranks)
        kept = _common.keep_slots(old.reshape(shape), new.reshape(shape)).reshape(layers, p)
        return kept if isinstance(phy2log, np.ndarray) else to_torch(kept)

    @classmethod
    def plan(cls, weight, num_replicas, num_groups, num_nodes, num_ranks, old=None) -> np.ndarray:
        """The numpy core of :meth:`rebalance_experts`: ``phy2log [L, P]`` int64."""
        w = np.asarray(weight)
        if w.ndim != 2:
            raise EplbError(f"weight: expected [layers, experts], got shape {w.shape}")
        layers, experts = w.shape
        if num_ranks < 1 or num_replicas % num_ranks != 0:
            raise ShapeError(
                f"num_replicas = {num_replicas} is not a multiple of num_ranks = {num_ranks}"
            )
        if cls.policy_name == "deepseek":
            phy2log = _api.rebalance_experts(w, num_replicas, num_groups, num_nodes, num_ranks)[0]
        else:
            slots = num_replicas // num_ranks
            policy = cls._cache.get(
                cls.policy_name,
                cls.policy_params,
                layers=layers,
                experts=experts,
                ranks=num_ranks,
                redundant=num_replicas - experts,
            )
            current = _common.repair_current(old, layers, experts, num_ranks, slots)
            if current is None:
                policy, current = _common.one_shot(
                    cls._cache, cls.policy_name, cls.policy_params, w,
                    layers=layers, experts=experts, ranks=num_ranks,
                    redundant=num_replicas - experts,
                )
            phy2log = policy.rebalance(w, current).placement.reshape(layers, num_replicas)
        if old is not None:
            phy2log = cls.preserve_intragpu_slots(phy2log, num_ranks, np.asarray(old))
            nodes_divide = num_nodes >= 1 and num_ranks % num_nodes == 0
            phy2log = _common.gate_plan(
                cls.gate, logger, old, phy2log, w, ranks=num_ranks,
                ranks_per_node=num_ranks // num_nodes if nodes_divide else None,
                iterations=STEP_INTERVAL,
            )
        return phy2log


def _initial_table(weight, num_replicas):
    """vLLM's initial ``phy2log`` ``[L, P]`` (slot ``p`` holds expert ``p mod N``), as a CPU
    int64 torch tensor (numpy when torch is absent): the engine's table before its first
    rearrangement. Sizes it cannot read become 1."""
    shape = tuple(getattr(weight, "shape", ()) or ())
    layers = int(shape[0]) if len(shape) >= 2 else 1
    experts = max(1, int(shape[-1])) if shape else 1
    try:
        p = max(1, int(num_replicas))
    except (TypeError, ValueError, OverflowError):
        p = experts
    table = np.tile(np.arange(p, dtype=np.int64) % experts, (layers, 1))
    try:
        return to_torch(table)
    except Exception:  # noqa: BLE001 - no torch: numpy is the best left
        return table


def configure(policy: str, params: Optional[dict] = None, gate: Optional[str] = None) -> None:
    """Selects the policy :class:`Policy` runs and its pay-off gate (``gate``: the JSON of an
    ``eplb_payoff_gate`` setting, None for none); validated, raises EplbError."""
    name = _common.canonical(policy)
    params = _common.check_params(name, params or {})
    payoff = _common.gate_from(gate, "payoff gate")
    Policy.policy_name = name
    Policy.policy_params = params
    Policy.gate = payoff
    Policy._cache.clear()


def _patch_vllm(policy: str, params: dict) -> bool:
    try:
        from vllm.distributed.eplb import policy as vllm_policy
    except Exception as e:  # vLLM absent or another layout: nothing to do here
        logger.debug("eplb: vLLM's EPLB policy registry is not importable (%s)", e)
        return False
    registry = getattr(vllm_policy, "EPLB_POLICIES", None)
    if not isinstance(registry, dict) or "default" not in registry:
        logger.warning(
            "eplb: vllm.distributed.eplb.policy has no EPLB_POLICIES['default']; "
            "keeping vLLM's own EPLB policy"
        )
        return False
    current = registry["default"]
    if getattr(current, _MARK, False):
        configure(policy, params)
        Policy.gate = _common.install_gate(logger, "vLLM", _common.gate_from_env)
        return True
    names = _common.signature_names(getattr(current, "rebalance_experts", None))
    if names != EXPECTED_SIGNATURE:
        logger.warning(
            "eplb: vLLM's %s.rebalance_experts has the signature %s, not %s; keeping vLLM's own "
            "EPLB policy (EPLB_POLICY=%s is not applied)",
            getattr(current, "__name__", current),
            names,
            EXPECTED_SIGNATURE,
            policy,
        )
        return False
    configure(policy, params)
    Policy.gate = _common.install_gate(logger, "vLLM", _common.gate_from_env)
    Policy.upstream = current
    registry["default"] = Policy
    logger.info(
        "eplb: vLLM EPLB policy 'default' now runs eplb's %s policy (params %s)", policy, params
    )
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point."""
    with _lock:
        try:
            selection = _common.from_env()
        except EplbError as e:
            logger.error("eplb: %s; keeping the engine's own EPLB policy", e)
            selection = None
        if selection is not None:
            try:
                _patch_vllm(*selection)
            except EplbError as e:
                logger.error("eplb: %s; keeping vLLM's own EPLB policy", e)
        from . import vllm_ascend

        vllm_ascend.register()


setattr(Policy, _MARK, True)
