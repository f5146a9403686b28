"""Moving engine tensors to numpy and back. torch is imported only when a result must become a
torch tensor, i.e. only when the engine handed us one."""

from __future__ import annotations

import numpy as np


def is_numpy(x) -> bool:
    return isinstance(x, np.ndarray)


def to_numpy(x) -> np.ndarray:
    """A CPU numpy view (or copy) of `x`: a numpy array, a torch tensor on any device, or a
    nested list. Zero-copy for contiguous CPU tensors. A ragged nested list is an
    :class:`EplbError`."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "numpy") and hasattr(x, "dim"):
        if hasattr(x, "detach"):
            x = x.detach()
        if hasattr(x, "cpu"):
            x = x.cpu()
        return np.asarray(x.numpy())
    return from_nested(x, "input")


def from_nested(x, what: str) -> np.ndarray:
    """`np.asarray(x)`, with a ragged nested list (rows of different lengths) an
    :class:`EplbError` naming `what` instead of numpy's ``ValueError``."""
    from ._native import EplbError

    try:
        return np.asarray(x)
    except ValueError as e:
        raise EplbError(f"{what}: not a rectangular array ({e})") from None


def native_order(a: np.ndarray) -> np.ndarray:
    """`a` in the machine's byte order (a copy only when it is not already)."""
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def to_torch(arr: np.ndarray):
    """A CPU torch tensor sharing `arr`'s memory (torch imported here, lazily)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(arr))


def like(arr: np.ndarray, template):
    """`arr` as the kind of `template`: numpy stays numpy, anything else becomes torch."""
    return arr if isinstance(template, np.ndarray) or not hasattr(template, "dim") else to_torch(arr)
