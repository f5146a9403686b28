"""vLLM: our policies behind ``EPLB_POLICIES["default"]``.

``register()`` is the ``vllm.general_plugins`` entry point (every vLLM process calls it). When
``EPLB_POLICY`` names a policy (parameters as JSON in ``EPLB_POLICY_PARAMS``), it checks the
signature of upstream's ``rebalance_experts`` and, if it is the one this adapter implements,
puts :class:`Policy` in its place; users keep ``--eplb-config.policy default``. It then gives
vLLM-Ascend's MRv1 factory the same treatment (:mod:`eplb.integrations.vllm_ascend`).
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

import numpy as np

from .. import _api
from .._check import PreconditionError
from .._native import EplbError
from .._tensor import to_numpy, to_torch
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


class ShapeError(PreconditionError):
    """Sizes that do not divide: the package's one precondition error (an EplbError and an
    AssertionError, as vLLM's default raises)."""


class Policy:
    """vLLM's policy contract: ``rebalance_experts`` is a classmethod returning ``phy2log``
    ``[L, num_replicas]`` as a CPU int64 torch tensor. The policy and parameters are class
    attributes set by :func:`register` (or :func:`configure`)."""

    policy_name = "deepseek"
    policy_params: dict = {}
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
        try:
            w = to_numpy(weight)
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
        except ShapeError:
            raise  # vLLM's own policy asserts the same: the engine's configuration is wrong
        except Exception as e:  # noqa: BLE001 - a rebalance must not end the engine's loop
            if old_global_expert_indices is None:
                raise
            logger.error(
                "eplb: %s policy failed (%s: %s); the placement is kept this rearrangement",
                cls.policy_name, type(e).__name__, e,
            )
            return old_global_expert_indices

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
        return phy2log


def configure(policy: str, params: Optional[dict] = None) -> None:
    """Selects the policy :class:`Policy` runs (validated; raises EplbError)."""
    name = _common.canonical(policy)
    params = _common.check_params(name, params or {})
    Policy.policy_name = name
    Policy.policy_params = params
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
