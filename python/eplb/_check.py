"""Argument checks shared by the API: Python values in, plain ints out, or an :class:`EplbError`
that names the argument (never an ``OverflowError`` or ``TypeError`` from the native layer)."""

from __future__ import annotations

import operator

from ._native import EplbError

#: The largest count the native layer takes for a size (layers, experts, ranks, replicas, ...).
MAX_COUNT = 2**32 - 1
#: The largest seed (an unsigned 64-bit integer).
MAX_SEED = 2**64 - 1


def integer(value, what: str, lo: int = 0, hi: int = MAX_COUNT, error=EplbError) -> int:
    """``value`` as an int in ``lo..=hi``. Accepts Python and numpy integers and integer 0-d
    tensors (anything with ``__index__``); refuses bools, floats (``1.5`` is not truncated, and
    ``2.0`` is not an integer either) and strings."""
    if isinstance(value, bool):
        raise error(f"{what} = {value!r} is not an integer")
    try:
        v = operator.index(value)
    except TypeError:
        raise error(f"{what} = {value!r} is not an integer") from None
    if v < lo or v > hi:
        raise error(f"{what} = {v} is out of range ({lo}..={hi})")
    return v


def optional_integer(value, what: str, lo: int = 0, hi: int = MAX_COUNT, error=EplbError):
    """``None`` stays ``None``; anything else is :func:`integer`."""
    return None if value is None else integer(value, what, lo, hi, error)


class PreconditionError(EplbError, AssertionError):
    """A failed precondition of DeepSeek's ``rebalance_experts`` contract: both an
    :class:`EplbError` (as every error of this package) and an ``AssertionError`` (as DeepSeek's
    ``eplb.py`` raises it), so code written for either catches it."""
