"""Moving engine tensors to numpy and back. torch is imported only when a result must become a
torch tensor, i.e. only when the engine handed us one."""

from __future__ import annotations

import numpy as np


def is_numpy(x) -> bool:
    return isinstance(x, np.ndarray)


def to_numpy(x) -> np.ndarray:
    """A CPU numpy view (or copy) of `x`: a numpy array, a torch tensor on any device, or a
    nested list. Zero-copy for contiguous CPU tensors."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "numpy") and hasattr(x, "dim"):
        if hasattr(x, "detach"):
            x = x.detach()
        if hasattr(x, "cpu"):
            x = x.cpu()
        return np.asarray(x.numpy())
    return np.asarray(x)


def to_torch(arr: np.ndarray):
    """A CPU torch tensor sharing `arr`'s memory (torch imported here, lazily)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(arr))


def like(arr: np.ndarray, template):
    """`arr` as the kind of `template`: numpy stays numpy, anything else becomes torch."""
    return arr if isinstance(template, np.ndarray) or not hasattr(template, "dim") else to_torch(arr)
