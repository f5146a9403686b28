"""`eplb.runtime.Runtime` inside real torch.distributed processes (gloo, CPU): N processes run
`torch_worker.py`, a stack of MoE layers with real expert tensors, routing a trace through
`log2phy`, checked after every iteration (slots byte-equal to each expert's reference tensors,
`log2phy` and the expert map naming slots that hold the expert). Compared with `eplb simulate
--placements-log`; one-sided faults; a rank SIGKILLed mid-walk; bad input.

Needs torch (the cached torch venv of `.ci/run`, `cargo xtask python` with
`$EPLB_TORCH_PYTHON`); skipped with a warning where torch cannot be imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

try:
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    HAVE_TORCH = hasattr(torch, "distributed") and torch.distributed.is_available()
except ImportError:  # pragma: no cover - only without torch
    HAVE_TORCH = False

if not HAVE_TORCH or os.environ.get("EPLB_TEST_TORCH") == "stub":
    warnings.warn(
        "torch (with torch.distributed) cannot be imported here: the runtime tests over "
        "torch.distributed are skipped (cargo xtask python runs them in the torch venv)",
        stacklevel=1,
    )
    pytestmark = pytest.mark.skip(reason="needs real torch with torch.distributed")

HERE = Path(__file__).resolve().parent
WORKER = HERE / "torch_worker.py"
LAYERS, EXPERTS, WINDOWS = 4, 16, 48
H, A = 6, 2


def make_trace(path: Path, windows: int = WINDOWS, seed: int = 7) -> Path:
    """A trace whose hot experts shift every 16 windows, per layer its own."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((windows, LAYERS, EXPERTS), dtype=np.int64)
    for w in range(windows):
        phase = w // 16
        for l in range(LAYERS):
            perm = np.random.default_rng(1000 * l + phase).permutation(EXPERTS)
            weights = 1.0 / (1.0 + np.arange(EXPERTS)) ** 1.2
            lam = 400 * weights[np.argsort(perm)]
            counts[w, l] = rng.poisson(lam)
    doc = {
        "format": "eplb-trace/v1",
        "name": "torch_runtime_test",
        "num_windows": windows,
        "counts": counts.tolist(),
    }
    path.write_text(json.dumps(doc))
    return path


def config(redundant: int, **extra) -> dict:
    cfg = {
        "dynamic_eplb": True,
        "num_redundant_experts": redundant,
        "expert_heat_collection_interval": H,
        "algorithm_execution_interval": A,
        "eplb_policy_type": "swift",
    }
    cfg.update(extra)
    return cfg


def spawn(tmp: Path, procs: int, spec: dict, *, kill_watch: bool = False, limit: float = 150):
    """Runs `procs` workers on `spec`; returns each rank's output (None for a killed rank)."""
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    spec = dict(spec, procs=procs, out=str(out), store=str(tmp / "store"))
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    ps = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(spec_path), str(r)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(procs)
    ]
    deadline = time.monotonic() + limit
    logs = {}
    dead = None
    try:
        pending = set(range(procs))
        while pending:
            for r in list(pending):
                rc = ps[r].poll()
                if rc is None:
                    continue
                pending.discard(r)
                logs[r] = ps[r].stdout.read().decode(errors="replace")
                if rc < 0 and kill_watch and dead is None:
                    # The engine's health check: tell the survivors which rank died.
                    dead = r
                    (out / "dead.tmp").write_text(str(r))
                    os.replace(out / "dead.tmp", out / "dead")
            if time.monotonic() > deadline:
                raise AssertionError(f"ranks {sorted(pending)} still running after {limit} s")
            time.sleep(0.02)
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for r in range(procs):
        f = out / f"rank{r}.json"
        if r == dead:
            results.append(None)
            continue
        assert f.is_file(), f"rank {r} wrote no result; its output:\n{logs.get(r, '')[-3000:]}"
        results.append(json.loads(f.read_text()))
    return results


def assert_clean(results):
    for r, res in enumerate(results):
        if res is None:
            continue
        assert not res["errors"], f"rank {r}: {res['errors']}\n{res.get('traceback', '')}"
        assert "construct_error" not in res, f"rank {r}: {res['construct_error']}"


def assert_same_placements(results):
    live = [res for res in results if res is not None]
    first = live[0]
    for res in live[1:]:
        assert res["hashes"] == first["hashes"], f"rank {res['rank']} held another placement"
        assert res["placement"] == first["placement"]


def simulate_log(tmp: Path, trace: Path, ranks: int, redundant: int) -> list[dict]:
    eplb_bin = os.environ.get("EPLB_BIN")
    if not eplb_bin:
        pytest.skip("EPLB_BIN (the eplb CLI) not given; cargo xtask python sets it")
    log = tmp / "placements.json"
    subprocess.run(
        [eplb_bin, "simulate", "--trace", str(trace), "--ranks", str(ranks), "--redundant",
         str(redundant), "--heat-interval", str(H), "--algo-interval", str(A), "--policy",
         "swift", "--seed", "0", "--placements-log", str(log)],
        check=True,
        capture_output=True,
    )
    return json.loads(log.read_text())["entries"]


@pytest.mark.parametrize("procs", [4, 8])
def test_every_iteration_slots_hold_their_experts_and_the_simulator_agrees(tmp_path, procs):
    redundant = procs
    trace = make_trace(tmp_path / "trace.json")
    rec = tmp_path / "heat.jsonl"
    cfg = config(redundant, eplb_heat_record_path=str(rec))
    results = spawn(tmp_path, procs, {"trace": str(trace), "config": cfg})
    assert_clean(results)
    assert_same_placements(results)
    stats = results[0]["stats"]
    assert stats["plans"] >= 4 and stats["layers_committed"] >= 4 and stats["moves"] > 0, stats
    assert results[0]["health"] == "running"
    # The simulator's placements, cycle by cycle, are the processes' placements.
    entries = simulate_log(tmp_path, trace, procs, redundant)
    sim = [(e["active_from_window"], np.array(e["placement"]).reshape(LAYERS, -1).tolist())
           for e in entries[1:]]
    real = [(e["active_from_window"], e["placement"]) for e in results[0]["log"]]
    assert len(sim) >= 4
    assert real == sim
    # Metrics and heat recording work through this path.
    assert "eplb_" in results[0]["metrics"]
    assert rec.is_file() and rec.stat().st_size > 0
