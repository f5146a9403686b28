"""What the adapters share: the selection (``EPLB_POLICY``/``EPLB_POLICY_PARAMS``), a
per-process cache of policies keyed by shape, and the repair of a current placement."""

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
from .._native import EplbError

ENV_POLICY = "EPLB_POLICY"
ENV_PARAMS = "EPLB_POLICY_PARAMS"


def canonical(name) -> str:
    """The canonical policy name of ``name`` (a name or 0..4); raises EplbError."""
    s = str(name).strip()
    numbers = {"0": "random", "1": "default", "2": "swift", "3": "flashlb", "4": "incremental"}
    s = numbers.get(s, s)
    if s not in policy_params():
        raise EplbError(
            f"unknown policy `{name}` (expected one of {', '.join(policy_params())} or 0..4)"
        )
    return s


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
