"""A drop-in for DeepSeek's ``eplb.py``: ``rebalance_experts(weight, num_replicas, num_groups,
num_nodes, num_gpus)`` on torch tensors or numpy arrays, returning the same kind.

Results are DeepSeek's algorithm in float64 (our ``deepseek`` policy, exact on the golden
vectors). ``log2phy`` lists each expert's replicas in ascending physical id; DeepSeek's torch code
lists them in the order the replicas were created, so rows may be permuted (same set).
"""

from __future__ import annotations

from . import _api
from ._tensor import like, to_numpy


def rebalance_experts(weight, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int):
    """``(phy2log [L, P], log2phy [L, N, P-N+1], logcnt [L, N])``, int64, as DeepSeek's."""
    w = to_numpy(weight)
    out = _api.rebalance_experts(w, num_replicas, num_groups, num_nodes, num_gpus)
    return tuple(like(a, weight) for a in out)


__all__ = ["rebalance_experts"]
