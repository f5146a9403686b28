"""eplb: Expert Parallelism Load Balancer policies, in Rust, for Python serving engines.

Numpy in, numpy out; the Rust call releases the GIL; every error is an :class:`EplbError`
(a ``ValueError``) carrying the Rust message. Engine adapters live in
``eplb.integrations.{vllm, vllm_ascend, sglang}``; ``eplb.deepseek`` is a drop-in for
DeepSeek's ``eplb.py``.
"""

from ._native import EplbError, __version__
from ._api import (
    POLICIES,
    Hotness,
    Policy,
    Rebalance,
    hotness,
    policy_params,
    read_map,
    rebalance_experts,
    simulate,
    validate_map,
    write_map,
)

__all__ = [
    "EplbError",
    "POLICIES",
    "Hotness",
    "Policy",
    "Rebalance",
    "hotness",
    "policy_params",
    "read_map",
    "rebalance_experts",
    "simulate",
    "validate_map",
    "write_map",
    "__version__",
]
