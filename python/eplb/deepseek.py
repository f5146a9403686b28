"""A drop-in for DeepSeek's ``eplb.py``: ``rebalance_experts(weight, num_replicas, num_groups,
num_nodes, num_gpus)`` on torch tensors or numpy arrays, returning the same kind. The same
function is ``eplb.rebalance_experts``, so DeepSeek's README (``import eplb;
eplb.rebalance_experts(weight, 16, 4, 2, 8)``) runs unchanged with this package.

Results are DeepSeek's algorithm (our ``deepseek`` policy, exact on the golden vectors), element
for element: ``log2phy`` is as wide as the largest copy count and lists each expert's replicas in
the order DeepSeek's replication created them (the first copy, then each extra copy as it was
chosen; not ascending in the physical id). Arithmetic is float64, as vLLM's and SGLang's ports;
DeepSeek's torch code sums in float32 and may decide a near-tie the other way (the golden vectors
list where). A failed precondition raises ``eplb.PreconditionError``, which is both an
``EplbError`` and an ``AssertionError``.
"""

from __future__ import annotations

from ._api import rebalance_experts

__all__ = ["rebalance_experts"]
