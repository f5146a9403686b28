"""A drop-in for DeepSeek's ``eplb.py``: ``rebalance_experts(weight, num_replicas, num_groups,
num_nodes, num_gpus)`` on torch tensors or numpy arrays, returning the same kind. The same
function is ``eplb.rebalance_experts``, so DeepSeek's README (``import eplb;
eplb.rebalance_experts(weight, 16, 4, 2, 8)``) runs unchanged with this package.

Results are DeepSeek's algorithm (our ``deepseek`` policy, exact on the golden vectors).
``log2phy`` is as wide as the largest copy count and lists each expert's replicas in ascending
physical id; DeepSeek's torch code lists them in the order the replicas were created, so rows may
be permuted (same set). A failed precondition raises ``eplb.PreconditionError``, which is both an
``EplbError`` and an ``AssertionError``.
"""

from __future__ import annotations

from ._api import rebalance_experts

__all__ = ["rebalance_experts"]
