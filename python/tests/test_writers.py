"""Issue 27 in Python: ``eplb.write_map`` writes as ``eplb plan --out`` does (never replacing a
device, a FIFO or a symbolic link, keeping a replaced file's permissions), the readers are
bounded, and a trace shorter than one cycle is a warning."""

from __future__ import annotations

import os
import stat
import threading

import numpy as np
import pytest

import eplb
from conftest import shared_file

# 2 layers, 2 ranks, 5 slots: experts 0..7 and two copies.
PLACEMENT = np.array(
    [[[0, 1, 2, 3, 4], [5, 6, 7, 0, 1]], [[0, 1, 2, 3, 4], [5, 6, 7, 2, 3]]], dtype=np.int64
)


def test_write_map_to_dev_null_keeps_the_device():
    eplb.write_map("/dev/null", PLACEMENT)
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_write_map_through_a_symlink_replaces_its_file_and_keeps_the_link(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    target = real / "map.json"
    target.write_text("old")
    os.chmod(target, 0o644)
    link = tmp_path / "link.json"
    link.symlink_to("real/map.json")
    eplb.write_map(link, PLACEMENT)
    assert link.is_symlink() and os.readlink(link) == "real/map.json"
    np.testing.assert_array_equal(eplb.read_map(target), PLACEMENT)
    # The file keeps its permissions (a temporary file is private until renamed).
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert sorted(p.name for p in real.iterdir()) == ["map.json"]


def test_write_map_to_a_fifo_writes_through(tmp_path):
    fifo = tmp_path / "map.fifo"
    os.mkfifo(fifo)
    got = {}

    def read():
        with open(fifo, "rb") as f:
            got["bytes"] = f.read()

    t = threading.Thread(target=read)
    t.start()
    eplb.write_map(fifo, PLACEMENT)
    t.join(10)
    assert b'"layer_list"' in got["bytes"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_write_map_refuses_a_directory(tmp_path):
    with pytest.raises(eplb.EplbError, match="a directory"):
        eplb.write_map(tmp_path, PLACEMENT)
    assert tmp_path.is_dir()
    # An I/O failure stays an OSError of its kind, as before.
    with pytest.raises(FileNotFoundError, match="missing"):
        eplb.write_map(tmp_path / "missing" / "map.json", PLACEMENT)


def test_readers_are_bounded(tmp_path):
    for reader in (eplb.read_map, eplb.validate_map):
        with pytest.raises(eplb.EplbError, match="not a regular file"):
            reader("/dev/zero")
    path = tmp_path / "map.json"
    eplb.write_map(path, PLACEMENT)
    size = path.stat().st_size
    with pytest.raises(eplb.EplbError, match=f"{size} bytes is over the input size limit"):
        eplb.read_map(path, max_input_bytes=size - 1)
    with pytest.raises(eplb.EplbError, match="over the input size limit"):
        eplb.validate_map(path, max_input_bytes=size - 1)
    np.testing.assert_array_equal(eplb.read_map(path, max_input_bytes=size), PLACEMENT)


def test_simulate_warns_about_a_trace_shorter_than_one_cycle():
    trace = shared_file("data/traces/mixtral8x7b_gsm8k_decode.json")
    with pytest.warns(RuntimeWarning, match="the trace has 9 windows, fewer than one cycle"):
        r = eplb.simulate(trace, ranks=2, redundant=2, policy="default", heat_interval=10,
                          algo_interval=1)
    assert r["mean_par_from_first_activation"] is None
    assert r["est_net_saving_pct"] is None
