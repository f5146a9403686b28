"""EPLB_TRACE_DIR: the adapters record the engine's heat as an eplb-trace/v1 file in the line
layout, safely, bounded, without ever raising into the engine; the CLI replays it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import FakeTensor, golden
from eplb.integrations import _record
from eplb.integrations import vllm as vllm_adapter
from eplb.integrations import vllm_ascend as ascend_adapter


@pytest.fixture
def trace_dir(tmp_path, monkeypatch):
    d = tmp_path / "traces"
    monkeypatch.setenv("EPLB_TRACE_DIR", str(d))
    monkeypatch.delenv("EPLB_TRACE_MAX_BYTES", raising=False)
    _record._forget_for_tests()
    yield d
    _record._forget_for_tests()


def read_lines(path: Path):
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    windows = [json.loads(x)["counts"] for x in lines[1:]]
    return header, np.array(windows)


def test_each_call_appends_its_windows_with_a_header(trace_dir):
    rng = np.random.default_rng(0)
    first = rng.integers(0, 500, size=(3, 8))
    second = rng.integers(0, 500, size=(2, 3, 8))
    p1 = _record.record("vllm", first)
    p2 = _record.record("vllm", second)
    assert p1 == p2 and Path(p1).parent == trace_dir
    assert Path(p1).name == f"vllm-{os.getpid()}-3x8.eplb-trace.jsonl"
    header, windows = read_lines(Path(p1))
    assert header["format"] == "eplb-trace/v1" and header["layout"] == "lines"
    assert header["model"] == {"num_moe_layers": 3, "num_experts": 8}
    assert header["engine"]["name"] == "vllm" and "counts" not in header
    np.testing.assert_array_equal(windows, np.concatenate([first[None], second]))
    # Another shape (an MTP drafter): another file.
    assert _record.record("vllm", np.ones((1, 4))) != p1


def test_adapters_record_what_the_engine_hands_them(trace_dir, fake_torch):
    c = golden("esft_law_ep8")
    vllm_adapter.configure("default")
    weight = c.loads.astype(np.int64)
    vllm_adapter.Policy.rebalance_experts(FakeTensor(weight), c.replicas, 1, 1, c.ranks)
    (vfile,) = trace_dir.glob("vllm-*.jsonl")
    np.testing.assert_array_equal(read_lines(vfile)[1], weight[None])

    table = c.current
    windows = np.stack([ascend_adapter.fold(table, w, c.experts) for w in [np.ones(table.shape)] * 2])
    workload = np.stack([np.ones(table.shape, dtype=np.int64) * (k + 1) for k in range(2)])
    ascend_adapter.Policy("default", policy_type=3).rebalance_experts(FakeTensor(table), FakeTensor(workload))
    (afile,) = trace_dir.glob("vllm-ascend-*.jsonl")
    got = read_lines(afile)[1]
    assert got.shape == (2, c.layers, c.experts)
    np.testing.assert_array_equal(got[1], 2 * windows[1])


def test_a_crash_mid_write_leaves_a_readable_file_that_the_cli_replays(trace_dir):
    eplb_bin = os.environ.get("EPLB_BIN")
    if not eplb_bin or not Path(eplb_bin).exists():
        pytest.skip("EPLB_BIN (the eplb CLI) is not set; cargo xtask python sets it")
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 300, size=(30, 2, 16))
    for w in counts:
        path = Path(_record.record("sglang", w[None]))
    with open(path, "ab") as f:
        f.write(b'{"counts":[[1,2,3')  # a writer cut off mid-line
    twin = trace_dir / "twin.json"  # the same windows as a one-object trace
    twin.write_text(json.dumps({"format": "eplb-trace/v1", "counts": counts.tolist()}))

    def simulate(trace):
        out = subprocess.run(
            [eplb_bin, "simulate", "--trace", str(trace), "--ranks", "4", "--redundant", "0",
             "--policy", "default", "--heat-interval", "4", "--algo-interval", "1", "--json"],
            capture_output=True, text=True,
        )
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        return {k: v for k, v in doc.items() if "time_ms" not in k and k != "trace"}

    assert simulate(path) == simulate(twin)


def test_the_size_cap_stops_recording_with_one_log_line(trace_dir, monkeypatch, caplog):
    monkeypatch.setenv("EPLB_TRACE_MAX_BYTES", "600")
    with caplog.at_level(logging.WARNING, logger="eplb.record"):
        for _ in range(10):
            _record.record("sglang", np.ones((1, 2, 16), dtype=np.int64))
    (f,) = trace_dir.glob("*.jsonl")
    assert f.stat().st_size <= 600
    assert caplog.text.count("reached its size cap") == 1
    assert len(read_lines(f)[1]) >= 1


def test_recording_never_raises(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("EPLB_TRACE_DIR", str(blocker))
    _record._forget_for_tests()
    with caplog.at_level(logging.WARNING, logger="eplb.record"):
        assert _record.record("vllm", np.ones((2, 4))) is None
        assert _record.record("vllm", np.full((2, 4), np.nan)) is None
        assert _record.record("vllm", np.ones((2, 2, 2, 2))) is None
    assert "cannot record heat" in caplog.text
    assert "not finite counts" in caplog.text
    _record._forget_for_tests()


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("EPLB_TRACE_DIR", raising=False)
    assert _record.record("vllm", np.ones((2, 4))) is None


def test_windows_carry_the_reported_iteration_times(trace_dir):
    from eplb.integrations import record_iteration_ms

    counts = np.arange(24).reshape(3, 8)
    # No report: no field.
    path = Path(_record.record("vllm", counts))
    # Two reports, and values that are ignored: the next call's windows carry their mean.
    record_iteration_ms(20.0)
    record_iteration_ms(float("nan"))
    record_iteration_ms(-3)
    record_iteration_ms("x")
    record_iteration_ms(30)
    _record.record("vllm", np.stack([counts, counts]))
    # Taken once: the next call has none again; an explicit value wins over reports.
    _record.record("vllm", counts)
    record_iteration_ms(99.0)
    _record.record("vllm", counts, iteration_ms=12.5)
    lines = [json.loads(x) for x in path.read_text().splitlines()[1:]]
    assert [w.get("iteration_ms") for w in lines] == [None, 25.0, 25.0, None, 12.5]
    assert all(w["counts"] == counts.tolist() for w in lines)


def test_without_the_variable_iteration_times_are_not_kept(tmp_path, monkeypatch):
    monkeypatch.delenv("EPLB_TRACE_DIR", raising=False)
    _record._forget_for_tests()
    _record.record_iteration_ms(10.0)
    assert _record._pending == [0.0, 0]


class _FillingDisk:
    """``os.write`` on a disk with ``room`` bytes left: a write takes what fits, then fails with
    ENOSPC (as a full file system does)."""

    def __init__(self, room: int):
        self.room = room
        self.calls_after_full = 0
        self.full = False
        self.real = os.write

    def __call__(self, fd, data):
        if self.full:
            self.calls_after_full += 1
        if self.room <= 0:
            self.full = True
            raise OSError(28, "No space left on device")
        n = self.real(fd, bytes(data)[: self.room])
        self.room -= n
        return n


def test_a_failed_write_leaves_whole_lines_logs_once_and_never_raises(trace_dir, monkeypatch, caplog):
    window = np.arange(32, dtype=np.int64).reshape(1, 2, 16)
    path = Path(_record.record("sglang", window))
    whole = path.read_bytes()
    line = len(whole) - whole.index(b"\n") - 1
    disk = _FillingDisk(line + line // 2)  # one more window and half of the next
    monkeypatch.setattr(os, "write", disk)
    with caplog.at_level(logging.WARNING, logger="eplb.record"):
        for _ in range(5):
            _record.record("sglang", window)  # never raises
    monkeypatch.undo()
    data = path.read_bytes()
    assert data.endswith(b"\n") and data.startswith(whole)
    header, windows = read_lines(path)
    assert windows.shape == (2, 2, 16)
    assert disk.calls_after_full == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, caplog.text
    assert "No space left on device" in errors[0].getMessage()
    assert "keeps its whole lines" in errors[0].getMessage()


def test_a_file_with_no_window_is_removed_when_the_disk_is_full(trace_dir, monkeypatch, caplog):
    # The header fits, the first window does not.
    monkeypatch.setattr(os, "write", _FillingDisk(400))
    with caplog.at_level(logging.WARNING, logger="eplb.record"):
        assert _record.record("vllm", np.ones((4, 64))) is None
        assert _record.record("vllm", np.ones((4, 64))) is None
    # Not even the header fits.
    monkeypatch.setattr(os, "write", _FillingDisk(10))
    with caplog.at_level(logging.WARNING, logger="eplb.record"):
        assert _record.record("sglang", np.ones((4, 64))) is None
    monkeypatch.undo()
    assert list(trace_dir.iterdir()) == []
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2, caplog.text
    assert "held no window yet and is removed" in errors[0]
    assert "cannot record heat" in errors[1]


# In a private mount namespace over a 64 KiB tmpfs: record until the disk is full, then copy the
# files and the log lines out (the tmpfs goes with the namespace).
_FILL_SCRIPT = r"""
import json, logging, os, shutil, sys
import numpy as np
from eplb.integrations import _record

fs, out = sys.argv[1], sys.argv[2]
os.environ["EPLB_TRACE_DIR"] = fs
lines = []
class Keep(logging.Handler):
    def emit(self, r):
        lines.append(f"{r.levelname} {r.getMessage()}")
logging.getLogger("eplb.record").addHandler(Keep())
logging.getLogger("eplb.record").setLevel(logging.INFO)
rng = np.random.default_rng(7)
for _ in range(60):
    _record.record("sglang", rng.integers(0, 100000, size=(1, 4, 64)))
for name in os.listdir(fs):
    shutil.copy(os.path.join(fs, name), os.path.join(out, name))
with open(os.path.join(out, "log.txt"), "w") as f:
    f.write("\n".join(lines))
"""


def _can_mount(d: Path):
    try:
        probe = subprocess.run(
            ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=4k tmpfs "$1"', "sh", str(d)],
            capture_output=True, text=True,
        )
    except OSError as e:
        return f"cannot run unshare: {e}"
    return None if probe.returncode == 0 else probe.stderr.strip()


def test_a_recording_on_a_full_tmpfs_keeps_whole_lines_and_replays(tmp_path):
    import sys

    fs, out = tmp_path / "fs", tmp_path / "out"
    fs.mkdir()
    out.mkdir()
    why = _can_mount(fs)
    if why is not None:
        pytest.skip(f"needs a tmpfs in a private mount namespace (`unshare -m`, as root): {why}")
    run = subprocess.run(
        ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$1" && shift && exec "$@"',
         "sh", str(fs), sys.executable, "-c", _FILL_SCRIPT, str(fs), str(out)],
        capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert list(fs.iterdir()) == []  # the tmpfs stayed in the namespace
    (trace,) = out.glob("*.jsonl")
    data = trace.read_bytes()
    assert 32 * 1024 < len(data) < 64 * 1024, len(data)
    assert data.endswith(b"\n"), "a partial last line is left"
    header, windows = read_lines(trace)
    assert windows.shape[1:] == (4, 64) and 10 <= len(windows) < 60
    log = (out / "log.txt").read_text().splitlines()
    errors = [x for x in log if x.startswith("ERROR")]
    assert len(errors) == 1, log
    assert "No space left on device" in errors[0] and "keeps its whole lines" in errors[0]

    eplb_bin = os.environ.get("EPLB_BIN")
    if not eplb_bin or not Path(eplb_bin).exists():
        pytest.skip("EPLB_BIN (the eplb CLI) is not set; cargo xtask python sets it")
    sim = subprocess.run(
        [eplb_bin, "simulate", "--trace", str(trace), "--ranks", "8", "--redundant", "8",
         "--policy", "flashlb", "--heat-interval", "2", "--algo-interval", "1", "--json"],
        capture_output=True, text=True,
    )
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["cycles"] >= 1
