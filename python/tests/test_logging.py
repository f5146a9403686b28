"""The Rust crates' log lines reach Python's `logging`, under the `eplb` logger (named after
the Rust module: `eplb_runtime::config` logs to `eplb.runtime.config`), from the calling thread
and from the runtime's background threads (the heat recorder's writer), and at the levels the
Python logger lets through."""

from __future__ import annotations

import json
import logging

import numpy as np

from eplb._native import NativeRuntime
from eplb.runtime import initial_placement

LAYERS, EXPERTS = 2, 8


def test_a_config_warning_reaches_the_eplb_logger(caplog):
    cfg = {"dynamic_eplb": False, "num_redundant_experts": 2}
    with caplog.at_level(logging.WARNING, logger="eplb"):
        initial_placement(cfg, layers=LAYERS, experts=EXPERTS, ranks=2)
    hits = [r for r in caplog.records if "num_redundant_experts = 2 is ignored" in r.getMessage()]
    assert len(hits) == 1, caplog.text
    assert hits[0].name == "eplb.runtime.config"
    assert hits[0].levelno == logging.WARNING


def test_a_record_below_the_loggers_level_is_dropped(caplog):
    cfg = {"dynamic_eplb": False, "num_redundant_experts": 2}
    with caplog.at_level(logging.ERROR, logger="eplb"):
        initial_placement(cfg, layers=LAYERS, experts=EXPERTS, ranks=2)
    assert "is ignored" not in caplog.text
    # Back at WARNING, the same call logs again (the level is read again, not kept).
    with caplog.at_level(logging.WARNING, logger="eplb"):
        initial_placement(cfg, layers=LAYERS, experts=EXPERTS, ranks=2)
    assert "is ignored" in caplog.text


class TwinRanks:
    """The transport of rank 0 of two whose peer says what it says: a gather returns this
    rank's words twice; the exchanges move nothing (no weights here)."""

    def all_gather(self, words):
        w = np.ascontiguousarray(words, dtype=np.uint64)
        return np.concatenate([w, w])

    def set_live(self, ranks):
        pass

    def launch(self, plan):
        pass

    def launch_sends(self, plan):
        pass

    def wait(self, plan):
        pass

    def load(self, plan):
        pass

    def commit(self, plan):
        pass

    def abort(self, plan):
        pass


def test_the_heat_recorders_thread_logs_its_stop_line(tmp_path, caplog, monkeypatch):
    """The writer thread hits the size cap and logs; the line reaches Python by the time
    `close()` (which joins that thread) returns."""
    monkeypatch.setenv("DYNAMIC_EPLB", "true")
    path = tmp_path / "heat.jsonl"
    cfg = {
        "dynamic_eplb": True,
        "num_redundant_experts": 0,
        "expert_heat_collection_interval": 2,
        "algorithm_execution_interval": 1,
        "eplb_heat_record_path": str(path),
        "eplb_heat_record_max_bytes": 1,
    }
    with caplog.at_level(logging.WARNING, logger="eplb"):
        rt = NativeRuntime(
            json.dumps(cfg), False, layers=LAYERS, experts=EXPERTS, ranks=2, rank=0,
            transport=TwinRanks(), expert_bytes=64,
        )
        _, _, _, slots = rt.shape_info
        counts = np.arange(LAYERS * slots, dtype=np.int64).reshape(LAYERS, slots) + 1
        for _ in range(8):
            rt.before_forward()
            rt.after_forward(counts, 64)
            rt.wait_for_plan(10.0)
        rt.close()
    hits = [r for r in caplog.records if "stopped at its size cap of 1 bytes" in r.getMessage()]
    assert len(hits) == 1, caplog.text
    assert hits[0].name == "eplb.runtime.heat_record"
    assert hits[0].levelno == logging.WARNING
