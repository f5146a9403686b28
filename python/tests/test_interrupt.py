"""Ctrl-C interrupts a long call within about a second: the Rust call runs on a worker thread
while the calling thread wakes every 50 ms to run Python's signal handlers (issue 37, class 2).

Each test starts a child process that makes one long call (several seconds here), sends it
SIGINT half a second in, and asserts that the child got ``KeyboardInterrupt`` within 1.5 s of
the signal. Without the guard's wake-ups, the interrupt is raised only when the call returns."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import shared_file

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")

#: The child: sets up, prints "start", makes the call, prints how it ended.
CHILD = """
import sys, time
import numpy as np
import eplb
{setup}
print("start", flush=True)
t0 = time.monotonic()
try:
    {call}
    print(f"finished after {{time.monotonic() - t0:.2f}} s", flush=True)
except KeyboardInterrupt:
    print(f"interrupted after {{time.monotonic() - t0:.2f}} s", flush=True)
"""


def interrupt(setup: str, call: str, tmp_path, after: str = "") -> tuple[list[str], float]:
    """Runs the child (with `after` run after the call), sends SIGINT 0.5 s after its call
    started; returns its lines after "start" and the seconds from the signal to its exit."""
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(setup=textwrap.dedent(setup), call=call) + after)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "start", line + proc.stderr.read() if proc.stderr else line
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = out.strip().splitlines()
    assert lines, err
    return lines, took


def test_ctrl_c_interrupts_a_long_rebalance(tmp_path):
    # incremental from the default layout on 600 layers of 2048 experts: about 10 s of Rust on
    # the gate's machine (and little memory, unlike flashlb's history at this size).
    setup = """
    rng = np.random.default_rng(0)
    loads = rng.random((600, 2048)) * 100
    policy = eplb.Policy("incremental", layers=600, experts=2048, ranks=64, redundant=256)
    """
    (last,), took = interrupt(setup, "policy.rebalance(loads)", tmp_path)
    assert last.startswith("interrupted"), last
    assert took < 1.5, f"KeyboardInterrupt {took:.2f} s after SIGINT ({last})"


def test_ctrl_c_interrupts_a_long_simulate(tmp_path):
    # The law trace repeated 60 times (3960 windows), flashlb planning every window.
    trace = json.loads(shared_file("data/traces/esft_dsv2lite_law.json").read_text())
    trace["counts"] = trace["counts"] * 60
    trace["window_tokens"] = trace["window_tokens"] * 60
    trace["num_windows"] = len(trace["counts"])
    big = tmp_path / "big.json"
    big.write_text(json.dumps(trace))
    call = (f"eplb.simulate({str(big)!r}, ranks=8, redundant=8, policy='flashlb', "
            "heat_interval=1, algo_interval=1)")
    (last,), took = interrupt("", call, tmp_path)
    assert last.startswith("interrupted"), last
    assert took < 1.5, f"KeyboardInterrupt {took:.2f} s after SIGINT ({last})"


def test_an_interrupted_rebalance_leaves_the_policy_state_as_it_was(tmp_path):
    # incremental keeps load estimates between calls: after an interrupted call on `a`, the
    # policy answers `b` as a fresh one does (the interrupted plan was not taken). The next call
    # waits for the interrupted one to finish in the background.
    setup = """
    rng = np.random.default_rng(0)
    shape = dict(layers=240, experts=2048, ranks=64, redundant=256)
    a, b = rng.random((240, 2048)) * 100, rng.random((240, 2048)) * 100
    policy = eplb.Policy("incremental", **shape)
    """
    script_end = """
after = policy.rebalance(b).placement
fresh = eplb.Policy("incremental", **shape).rebalance(b).placement
print("same as fresh" if (after == fresh).all() else "state advanced", flush=True)
"""
    (ended, state), took = interrupt(setup, "policy.rebalance(a)", tmp_path, after=script_end)
    assert ended.startswith("interrupted"), ended
    assert state == "same as fresh", state
