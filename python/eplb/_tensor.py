"""Moving engine tensors to numpy and back, and the two array checkers every public function
uses: :func:`numeric_array` (loads: any numeric dtype, either byte order, torch tensors of any
dtype including bfloat16) and :func:`integer_array` (placements: any integer dtype, either byte
order). torch is imported only when a result must become a torch tensor, i.e. only when the
engine handed us one."""

from __future__ import annotations

import numpy as np


def is_numpy(x) -> bool:
    return isinstance(x, np.ndarray)


def is_tensor(x) -> bool:
    """Whether `x` is a torch tensor (or looks like one), without importing torch."""
    return not isinstance(x, np.ndarray) and hasattr(x, "dim") and hasattr(x, "numpy")


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


def _as_array(x, what: str) -> np.ndarray:
    """`x` (a numpy array, a torch tensor, nested lists or tuples) as a numpy array in the
    machine's byte order; anything else is an :class:`EplbError` naming `what`."""
    from ._native import EplbError

    if isinstance(x, np.ndarray):
        a = x
    elif is_tensor(x):
        t = x.detach() if hasattr(x, "detach") else x
        if getattr(t, "is_floating_point", lambda: False)() and hasattr(t, "float"):
            # bfloat16 (and any floating dtype) has no numpy twin everywhere: as DeepSeek's
            # `weight.float()`.
            t = t.float()
        try:
            a = to_numpy(t)
        except TypeError:
            if not hasattr(t, "float"):
                raise
            a = to_numpy(t.float())
    elif isinstance(x, (list, tuple)):
        a = from_nested(x, what)
    else:
        raise EplbError(f"{what}: expected a numpy array, a torch tensor or nested lists, got "
                        f"{type(x).__name__}")
    return native_order(a)


#: The load dtypes the native layer reads as they are.
_NATIVE_LOADS = (np.int32, np.int64, np.float32, np.float64)


def numeric_array(x, what: str, other=np.float64, error=None) -> np.ndarray:
    """Loads: `x` as a numpy array the native layer reads. Any numeric dtype (bool, integers,
    floats of any width) in either byte order, a torch tensor of any dtype and device (a
    floating one through ``.float()``, so bfloat16 too), or nested lists (a ragged one is an
    :class:`EplbError`, or `error`). int32/int64/float32/float64 pass as they are; other dtypes
    become `other` (float64: exact for every integer up to 2**53)."""
    from ._native import EplbError

    a = _as_array(x, what)
    if a.dtype.type in _NATIVE_LOADS:
        return a
    if a.dtype.kind not in "biuf":
        raise (error or EplbError)(f"{what}: dtype {a.dtype} is not a number type")
    return a.astype(other)


def integer_array(x, what: str) -> np.ndarray:
    """Expert ids: `x` as a numpy array of an integer dtype (any width, signed or not, either
    byte order), from numpy, a torch integer tensor or nested lists. A float or bool array is an
    :class:`EplbError` (an id is not rounded)."""
    from ._native import EplbError

    a = _as_array(x, what)
    if a.dtype.kind not in "iu":
        if a.size == 0 and a.dtype.kind == "f":
            return a.astype(np.int64)  # `[]` and `[[]]` are float64 to numpy
        raise EplbError(f"{what}: dtype {a.dtype} is not supported (expected an integer dtype)")
    return a


def to_torch(arr: np.ndarray):
    """A CPU torch tensor sharing `arr`'s memory (torch imported here, lazily)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(arr))


def like(arr: np.ndarray, template):
    """`arr` as the kind of `template`: numpy stays numpy, anything else becomes torch."""
    return arr if isinstance(template, np.ndarray) or not hasattr(template, "dim") else to_torch(arr)
