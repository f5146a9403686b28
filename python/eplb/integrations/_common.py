"""What the adapters share: the selection (``EPLB_POLICY``/``EPLB_POLICY_PARAMS``), the pay-off
gate (``EPLB_PAYOFF_GATE``), a per-process cache of policies keyed by shape, and the repair of a
current placement."""

from __future__ import annotations

import inspect
import json
import os
import threading
import weakref
from typing import Optional, Tuple

import numpy as np

from .. import _native
from .._api import Policy, policy_params
from .._native import EplbError, PayoffGate

ENV_POLICY = "EPLB_POLICY"
ENV_PARAMS = "EPLB_POLICY_PARAMS"
ENV_GATE = "EPLB_PAYOFF_GATE"


def canonical(name) -> str:
    """The canonical policy name of ``name`` (a name or 0..4, as the Rust parser reads it);
    raises EplbError."""
    return _native.policy_name(str(name))


def check_params(policy: str, params: dict) -> dict:
    """Raises EplbError for a parameter ``policy`` does not take or an out-of-range value (the
    Rust checks, run on a tiny shape), so that a bad setting fails when the engine starts, not in
    its planner."""
    if not isinstance(params, dict):
        raise EplbError(f"policy parameters must be an object, got {type(params).__name__}")
    takes = policy_params()[policy]
    for k in sorted(params):
        if k not in takes:
            raise EplbError(
                f"unknown parameter `{k}` for policy `{policy}` (it takes: {', '.join(takes) or 'none'})"
            )
    Policy(policy, layers=1, experts=4, ranks=2, redundant=0, **params)
    return dict(params)


def params_from_env(environ=None) -> dict:
    """The parameters in ``EPLB_POLICY_PARAMS`` (a JSON object; empty when unset)."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_PARAMS, "").strip()
    try:
        return json.loads(raw) if raw else {}
    except ValueError as e:
        raise EplbError(f"{ENV_PARAMS} is not JSON: {e}") from None


def from_env(environ=None) -> Optional[Tuple[str, dict]]:
    """``(policy, params)`` from ``EPLB_POLICY`` and ``EPLB_POLICY_PARAMS`` (JSON), or None when
    ``EPLB_POLICY`` is unset or empty. Raises EplbError on a bad value."""
    env = os.environ if environ is None else environ
    name = env.get(ENV_POLICY, "").strip()
    if not name:
        return None
    params = params_from_env(env)
    policy = canonical(name)
    return policy, check_params(policy, params)


def signature_names(fn) -> Optional[list]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


class PolicyCache:
    """One :class:`eplb.Policy` per shape, per process (a main model and an MTP drafter call with
    different shapes, and a stateful policy must not mix their histories). Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._policies = {}
        if hasattr(os, "register_at_fork"):
            # A thread of the parent may hold the lock at the fork; the child gets a new one.
            ref = weakref.ref(self)

            def reinit():
                cache = ref()
                if cache is not None:
                    cache._lock = threading.Lock()

            os.register_at_fork(after_in_child=reinit)

    def get(self, name: str, params: dict, **shape) -> Policy:
        key = (name, json.dumps(params, sort_keys=True), tuple(sorted(shape.items())))
        with self._lock:
            p = self._policies.get(key)
            if p is None:
                p = Policy(name, **shape, **params)
                self._policies[key] = p
            return p

    def clear(self):
        with self._lock:
            self._policies.clear()


def repair_current(old, layers: int, experts: int, ranks: int, slots: int) -> Optional[np.ndarray]:
    """A valid ``[L, R, S]`` placement from an engine's old ``phy2log`` (``[L, R*S]``), or None
    when it cannot be used (another size; more experts missing than free slots).

    Entries that are -1 (empty slots under elastic scale-up), out of range, or a second copy on
    the same rank become free slots; free slots get the missing experts first (ascending id, in
    slot order), then the lowest id the rank does not hold yet. Deterministic (native).
    """
    if old is None:
        return None
    a = np.asarray(old)
    if a.dtype.kind not in "iu":
        return None
    return _native.repair_current(a, layers, experts, ranks, slots)


def keep_slots(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``new`` (``[L, R, S]``) with each rank's row reordered so that an expert the rank keeps
    stays in its old slot (vLLM-Ascend's planner reverts a layer otherwise; vLLM copies within a
    GPU for nothing). Same multiset per row: an expert the old row holds twice keeps one old
    slot per copy the new row has, so no expert of ``new`` is lost (native)."""
    return _native.keep_slots(np.asarray(old), np.asarray(new))


def one_shot(cache: "PolicyCache", name: str, params: dict, loads: np.ndarray, **shape):
    """``(policy, start)`` for a plan with no usable current placement (an engine's first call,
    another rank count). The incremental policies would polish the id-order layout, whose replica
    counts ignore the heat: incremental rebuilds every layer (``cold_start = 1`` unless set, as
    ``eplb plan`` does from the default layout) and swift starts from the default policy's
    placement; the others plan from the layout as they always do (``start`` None)."""
    if name == "incremental" and "cold_start" not in params:
        return cache.get(name, dict(params, cold_start=1), **shape), None
    policy = cache.get(name, params, **shape)
    if name == "swift":
        return policy, cache.get("default", {}, **shape).rebalance(loads).placement
    return policy, None


def gate_from(text, source: str) -> Optional[PayoffGate]:
    """The pay-off gate of ``text``, the JSON of an ``eplb_payoff_gate`` setting (``true``, or an
    object of ``model``, ``hardware``, ``role``, ``tokens_per_rank``, ``calibration``), or None
    when it is empty or ``false``. The setting is checked by the runtime's config parser, so a
    bad one raises :class:`EplbError` with the message ``eplb check-config`` prints, after
    ``source`` (where it came from)."""
    text = "" if text is None else str(text).strip()
    if not text:
        return None
    gate = PayoffGate(text, source)
    return gate if gate.on else None


def gate_from_env(environ=None) -> Optional[PayoffGate]:
    """The pay-off gate of ``EPLB_PAYOFF_GATE`` (:func:`gate_from`); raises EplbError."""
    env = os.environ if environ is None else environ
    return gate_from(env.get(ENV_GATE, ""), ENV_GATE)


def install_gate(logger, engine: str, read) -> Optional[PayoffGate]:
    """``read()`` (a gate or None), at install time: an unusable setting is logged once, as an
    error naming it, and the adapter runs without the gate (the engine keeps our policy)."""
    try:
        gate = read()
    except EplbError as e:
        logger.error("eplb: %s; %s runs eplb's policy without the pay-off gate", e, engine)
        return None
    if gate is not None:
        logger.info("eplb: %s (%s)", gate.summary, engine)
    return gate


def gate_plan(gate: Optional[PayoffGate], logger, current, plan, loads, *, ranks: int,
              ranks_per_node: Optional[int] = None, iterations: Optional[int] = None):
    """``plan`` with the pay-off gate applied against the engine's ``current`` placement: a
    changed layer whose move does not pay keeps its current rows, so the engine moves fewer
    weights; the log says how many layers were kept. ``plan`` and ``current`` are ``[L, R, S]``
    or ``[L, R*S]``; the result has ``plan``'s shape.

    No gate, no current placement, or one that is not ``plan``'s size or does not hold every
    expert once per rank (elastic EP, empty slots): the plan as it is (the runtime does not gate
    a plan after a membership change either). A gate that fails is logged and the plan goes
    ungated."""
    if gate is None or current is None:
        return plan
    new = np.asarray(plan)
    cur = np.asarray(current)
    w = np.asarray(loads)
    if cur.shape != new.shape or new.ndim not in (2, 3) or w.ndim != 2 or ranks < 1:
        return plan
    layers, experts = w.shape
    slots = new[0].size // ranks if layers else 0
    if layers == 0 or slots * ranks != new[0].size or cur.dtype.kind not in "iu":
        return plan
    shape3 = (layers, ranks, slots)
    repaired = repair_current(cur, layers, experts, ranks, slots)
    if repaired is None or not np.array_equal(repaired, cur.reshape(shape3)):
        return plan
    try:
        gated, _, (changed, moved, saving, forgone, _stall) = gate.apply(
            repaired, new.reshape(shape3), w, ranks_per_node, iterations
        )
    except EplbError as e:
        logger.error("eplb: %s; this plan goes without the pay-off gate", e)
        return plan
    if changed:
        logger.info(
            "eplb: pay-off gate: %d of %d changed layers kept on their placement, %d moved "
            "(saving %.3f%% of the step; %.3f%% forgone)",
            changed - moved, changed, moved, 100 * saving, 100 * forgone,
        )
    return gated.reshape(new.shape)
