"""Recording the engine's heat for replay: with ``EPLB_TRACE_DIR`` set, each adapter appends the
loads the engine hands it at every call to an ``eplb-trace/v1`` file there, in the line layout
(a header line, then one window per line) that ``eplb simulate``, ``eplb report`` and
``eplb advise`` replay like any trace.

One file per process, engine and model shape: ``<engine>-<pid>-<L>x<N>.eplb-trace.jsonl``. Each
append is one ``write`` of whole lines to a file opened with ``O_APPEND``, so a crash leaves at
most a partial last line, which the reader ignores. ``EPLB_TRACE_MAX_BYTES`` (default 1 GiB)
caps each file: the window that would cross it is not written, and one log line says so.
Recording never raises into the engine: a failure is logged once and recording stops for that
file. A write that fails (a full disk, an I/O error) leaves the file as whole lines only: it is
cut back to the end of its last whole line, or removed when it holds no window yet, so every
file left behind replays with ``eplb simulate``.

The engine may also report its measured step times: :func:`record_iteration_ms` after each
iteration (TPOT in decode, one prefill iteration), or ``iteration_ms=`` to :func:`record`. The
windows the next :func:`record` call appends then carry the mean of the times reported since the
previous call as their optional ``iteration_ms`` (ms), which makes the recording an input of
``eplb calibrate --measured``. Without reports, windows are written as before.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from typing import Optional

import numpy as np

logger = logging.getLogger("eplb.record")

ENV_DIR = "EPLB_TRACE_DIR"
ENV_MAX_BYTES = "EPLB_TRACE_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 30
FORMAT = "eplb-trace/v1"

#: What one window is, per engine (the header's ``window`` field).
WINDOWS = {
    "vllm": "the expert load window vLLM handed to one rearrangement (its sum)",
    "vllm-ascend": "one heat window of vLLM-Ascend's planner (per-window loads when given, "
    "else the sum it handed over), folded through the engine's placement",
    "sglang": "one forward step of SGLang's expert distribution recorder",
}

#: The distribution whose version names each engine in the header.
DISTRIBUTIONS = {"vllm": "vllm", "vllm-ascend": "vllm-ascend", "sglang": "sglang"}

_lock = threading.Lock()
_files: dict = {}
#: The iteration times reported since the last recorded call: ``[sum ms, count]``.
_pending = [0.0, 0]


def _engine_version(engine: str) -> Optional[str]:
    try:
        import importlib.metadata

        return importlib.metadata.version(DISTRIBUTIONS.get(engine, engine))
    except Exception:  # noqa: BLE001 - the engine may not be installed as a distribution
        return None


class _Trace:
    """One open trace file."""

    def __init__(self, path: str, max_bytes: int):
        self.path = path
        self.max_bytes = max_bytes
        self.fd: Optional[int] = None
        #: The file's length in whole lines: what a failed write is cut back to.
        self.size = 0
        #: Windows written.
        self.windows = 0
        self.stopped = False

    def open(self, header: dict) -> None:
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o666)
        try:
            self._write((json.dumps(header, separators=(",", ":")) + "\n").encode())
        except OSError:
            # Not even the header fits: no file is left (this call created it).
            self._close(remove=True)
            raise

    def _write(self, data: bytes) -> None:
        assert self.fd is not None
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        self.size += len(data)

    def _close(self, remove: bool) -> Optional[OSError]:
        """Closes the file (and removes it); returns the first error, if any."""
        err: Optional[OSError] = None
        if self.fd is not None:
            try:
                if remove:
                    os.unlink(self.path)
            except OSError as e:
                err = e
            try:
                os.close(self.fd)
            except OSError as e:
                err = err or e
            self.fd = None
        return err

    def _fail(self, error: OSError) -> None:
        """Stops recording after a failed write: the file is cut back to its last whole line
        (or removed when it holds no window), and one error line says so."""
        self.stopped = True
        if self.windows == 0:
            err = self._close(remove=True)
            kept = (f"it held no window yet and could not be removed ({err})" if err
                    else "it held no window yet and is removed")
        else:
            try:
                assert self.fd is not None
                os.ftruncate(self.fd, self.size)
                kept = f"it keeps its whole lines ({self.size} bytes) and replays as a trace"
            except OSError as e:
                kept = f"its partial last line could not be cut away ({e}); trace readers ignore it"
            self._close(remove=False)
        logger.error("eplb: recording to %s stopped: %s; %s; the engine is not affected",
                     self.path, error, kept)

    def append(self, windows: np.ndarray, iteration_ms: Optional[float] = None) -> None:
        if self.stopped:
            return
        extra = {} if iteration_ms is None else {"iteration_ms": iteration_ms}
        lines = b"".join(
            (json.dumps(dict(extra, counts=w.tolist()), separators=(",", ":")) + "\n").encode()
            for w in windows
        )
        if self.size + len(lines) > self.max_bytes:
            self.stopped = True
            logger.warning(
                "eplb: %s reached its size cap of %d bytes (%s); recording stops for it",
                self.path, self.max_bytes, ENV_MAX_BYTES,
            )
            return
        try:
            self._write(lines)
        except OSError as e:
            self._fail(e)
            return
        self.windows += len(windows)


def _max_bytes() -> int:
    raw = os.environ.get(ENV_MAX_BYTES, "").strip()
    try:
        value = int(raw) if raw else DEFAULT_MAX_BYTES
    except ValueError:
        logger.warning("eplb: %s=%r is not an integer; using %d", ENV_MAX_BYTES, raw, DEFAULT_MAX_BYTES)
        return DEFAULT_MAX_BYTES
    return max(value, 0)


def _as_counts(loads) -> Optional[np.ndarray]:
    """``[W, L, N]`` non-negative int64 windows from ``[L, N]`` or ``[W, L, N]`` loads, or None
    when they are not finite non-negative numbers."""
    a = np.asarray(loads)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or a.dtype.kind not in "biuf" or a.size == 0:
        return None
    a = a.astype(np.float64)
    if not np.isfinite(a).all() or (a < 0).any():
        return None
    return np.rint(a).astype(np.int64)


def _positive_ms(ms) -> Optional[float]:
    """``ms`` as a finite float > 0, or None."""
    try:
        x = float(ms)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0.0 else None


def record_iteration_ms(ms) -> None:
    """Reports the engine's measured time of the iteration that just ran (the whole step, ms),
    when ``EPLB_TRACE_DIR`` is set: the windows the next :func:`record` call appends carry the
    mean of the times reported since the previous call as ``iteration_ms``. A time that is not
    a finite number > 0 is ignored. Never raises."""
    if not os.environ.get(ENV_DIR, "").strip():
        return
    x = _positive_ms(ms)
    if x is None:
        logger.debug("eplb: iteration time %r ignored (not a finite number > 0)", ms)
        return
    with _lock:
        _pending[0] += x
        _pending[1] += 1


def _take_pending() -> Optional[float]:
    """The mean of the reported iteration times, and forgets them (call with ``_lock`` held)."""
    total, n = _pending
    _pending[0], _pending[1] = 0.0, 0
    return total / n if n else None


def record(
    engine: str, loads, *, model: Optional[dict] = None, iteration_ms=None
) -> Optional[str]:
    """Appends ``loads`` (``[L, N]`` or ``[W, L, N]``, the engine's per-expert counts) to this
    process's trace for ``engine`` and the loads' shape, when ``EPLB_TRACE_DIR`` is set. Each
    window carries ``iteration_ms`` when given (a finite number > 0, ms), else the mean of the
    times :func:`record_iteration_ms` reported since the previous call, if any. Returns the
    file's path (None when not recording, or when this call stopped it). Never raises."""
    directory = os.environ.get(ENV_DIR, "").strip()
    if not directory:
        return None
    try:
        counts = _as_counts(loads)
        if counts is None:
            logger.warning("eplb: %s loads of shape %s are not finite counts >= 0; not recorded",
                           engine, np.shape(loads))
            return None
        _, layers, experts = counts.shape
        key = (engine, os.getpid(), layers, experts)
        with _lock:
            trace = _files.get(key)
            if trace is None:
                name = f"{engine}-{os.getpid()}-{layers}x{experts}"
                trace = _Trace(os.path.join(directory, name + ".eplb-trace.jsonl"), _max_bytes())
                _files[key] = trace
                header = {
                    "format": FORMAT,
                    "layout": "lines",
                    "name": name,
                    "model": dict(model or {}, num_moe_layers=layers, num_experts=experts),
                    "unit": "routed (token, expert) assignments, as the engine counted them",
                    "window": WINDOWS.get(engine, "one call of the engine's adapter"),
                    "engine": {"name": engine, "version": _engine_version(engine)},
                    "per_rank_origin": None,
                }
                try:
                    os.makedirs(directory, exist_ok=True)
                    trace.open(header)
                except OSError as e:
                    trace.stopped = True
                    logger.error("eplb: cannot record heat to %s (%s); recording is off for it",
                                 trace.path, e)
                    return None
                logger.info("eplb: recording %s's heat to %s", engine, trace.path)
            pending = _take_pending()
            if trace.stopped:
                return None
            given = None if iteration_ms is None else _positive_ms(iteration_ms)
            trace.append(counts, given if given is not None else pending)
            return None if trace.stopped else trace.path
    except Exception as e:  # noqa: BLE001 - recording must never break the engine
        logger.error("eplb: recording %s's heat failed (%s: %s)", engine, type(e).__name__, e)
        return None


def _forget_for_tests() -> None:
    """Closes and forgets every open trace (tests only)."""
    with _lock:
        for t in _files.values():
            if t.fd is not None:
                os.close(t.fd)
        _files.clear()
        _pending[0], _pending[1] = 0.0, 0


if hasattr(os, "register_at_fork"):
    # A forked child (vLLM-Ascend's planner process) starts its own files under its own pid.
    def _reinit_in_child() -> None:
        global _lock
        _lock = threading.Lock()
        for t in _files.values():
            if t.fd is not None:
                try:
                    os.close(t.fd)  # the child's copy of the parent's descriptor
                except OSError:
                    pass
        _files.clear()
        _pending[0], _pending[1] = 0.0, 0

    os.register_at_fork(after_in_child=_reinit_in_child)
