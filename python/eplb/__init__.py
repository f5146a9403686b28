"""eplb: Expert Parallelism Load Balancer policies, in Rust, for Python serving engines.

Numpy in, numpy out; the Rust call releases the GIL; every error is an :class:`EplbError`
(a ``ValueError``) carrying the Rust message. Engine adapters live in
``eplb.integrations.{vllm, vllm_ascend, sglang}``; ``eplb.deepseek`` is a drop-in for
DeepSeek's ``eplb.py``; ``eplb.runtime.Runtime`` runs the whole Rust runtime inside a
torch.distributed engine (``docs/torch.md``).
"""

try:
    from ._native import EplbError, __version__
except ImportError as _e:  # pragma: no cover - only on a source tree without the build
    raise ImportError(
        f"eplb's native module is missing from {__path__[0]}: this is the source tree, not the "
        "installed package (install with `pip install ./python` and import it from elsewhere)"
    ) from _e
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
from ._check import PreconditionError

__all__ = [
    "EplbError",
    "POLICIES",
    "PreconditionError",
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
