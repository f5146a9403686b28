"""Argument checks shared by the API: Python values in, plain ints out, or an :class:`EplbError`
that names the argument (never an ``OverflowError`` or ``TypeError`` from the native layer)."""

from __future__ import annotations

import operator
import os

from ._native import EplbError

#: The largest count the native layer takes for a size (layers, experts, ranks, replicas, ...).
MAX_COUNT = 2**32 - 1
#: The largest seed (an unsigned 64-bit integer).
MAX_SEED = 2**64 - 1


def integer(value, what: str, lo: int = 0, hi: int = MAX_COUNT, error=EplbError) -> int:
    """``value`` as an int in ``lo..=hi``. Accepts Python and numpy integers and integer 0-d
    tensors (anything with ``__index__``); refuses bools, floats (``1.5`` is not truncated, and
    ``2.0`` is not an integer either) and strings."""
    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):
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


def number(value, what: str, error=EplbError) -> float:
    """``value`` as a float: Python and numpy integers and floats (anything with ``__float__``).
    Refuses bools (Python's and numpy's), strings and ``None``, as :func:`integer` does for
    counts (``float("2")`` and ``float(True)`` would pass them); the message is the native
    layer's for a policy parameter."""
    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):
        raise error(f"{what}: expected a number, got a bool")
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise error(f"{what}: expected a number, got {type(value).__name__}")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise error(f"{what}: expected a number, got {value!r}") from None


def path(value, what: str, error=EplbError) -> str:
    """``value`` as a path string: a ``str`` or an ``os.PathLike`` of one. Anything else (None,
    bytes, a number) is an :class:`EplbError` naming `what`, not ``os.fspath``'s TypeError."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        p = os.fspath(value)
        if isinstance(p, str):
            return p
    raise error(f"{what} = {value!r} is not a path (a str or an os.PathLike)")


def flag(value, what: str, error=EplbError) -> bool:
    """``value`` as a bool: ``True``/``False`` (or a numpy bool). Refuses ``0``, ``1``,
    strings and ``None``: a switch is not guessed from a truthy value."""
    if isinstance(value, bool):
        return value
    try:
        import numpy as np

        if isinstance(value, np.bool_):
            return bool(value)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    raise error(f"{what} = {value!r} is not a bool (True or False)")


class PreconditionError(EplbError, AssertionError):
    """A failed precondition of DeepSeek's ``rebalance_experts`` contract: both an
    :class:`EplbError` (as every error of this package) and an ``AssertionError`` (as DeepSeek's
    ``eplb.py`` raises it), so code written for either catches it."""
