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
import re
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


def config(redundant: int, policy: str = "swift", **extra) -> dict:
    cfg = {
        "dynamic_eplb": True,
        "num_redundant_experts": redundant,
        "expert_heat_collection_interval": H,
        "algorithm_execution_interval": A,
        "eplb_policy_type": policy,
    }
    cfg.update(extra)
    return cfg


def spawn(
    tmp: Path, procs: int, spec: dict, *, kill_watch: bool = False, rejoin: bool = False,
    limit: float = 150,
):
    """Runs `procs` workers on `spec`; returns each rank's output (None for a killed rank; with
    `rejoin`, a new process for the killed rank joins the survivors and its output is there)."""
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
                    if rejoin:
                        # The engine restarts the rank: a fresh process, told it joins.
                        logs[f"{r} (killed)"] = logs.pop(r)
                        ps[r] = subprocess.Popen(
                            [sys.executable, str(WORKER), str(spec_path), str(r), "join"],
                            env=env,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                        )
                        pending.add(r)
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
        if r == dead and not rejoin:
            results.append(None)
            continue
        assert f.is_file(), f"rank {r} wrote no result; its output:\n{logs.get(r, '')[-3000:]}"
        res = json.loads(f.read_text())
        res["output"] = logs.get(r, "")
        results.append(res)
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


def simulate_log(tmp: Path, trace: Path, ranks: int, redundant: int, policy: str) -> list[dict]:
    eplb_bin = os.environ.get("EPLB_BIN")
    if not eplb_bin:
        pytest.skip("EPLB_BIN (the eplb CLI) not given; cargo xtask python sets it")
    log = tmp / "placements.json"
    subprocess.run(
        [eplb_bin, "simulate", "--trace", str(trace), "--ranks", str(ranks), "--redundant",
         str(redundant), "--heat-interval", str(H), "--algo-interval", str(A), "--policy",
         policy, "--seed", "0", "--placements-log", str(log)],
        check=True,
        capture_output=True,
    )
    return json.loads(log.read_text())["entries"]


@pytest.mark.parametrize(("procs", "policy"), [(4, "swift"), (8, "swift"), (4, "random")])
def test_every_iteration_slots_hold_their_experts_and_the_simulator_agrees(
    tmp_path, procs, policy
):
    # swift keeps a kept expert's slot; random moves experts within a rank too (local moves).
    redundant = procs
    trace = make_trace(tmp_path / "trace.json")
    rec = tmp_path / "heat.jsonl"
    cfg = config(redundant, policy, eplb_heat_record_path=str(rec))
    results = spawn(tmp_path, procs, {"trace": str(trace), "config": cfg})
    assert_clean(results)
    assert_same_placements(results)
    stats = results[0]["stats"]
    assert stats["plans"] >= 4 and stats["layers_committed"] >= 4 and stats["moves"] > 0, stats
    assert results[0]["health"] == "running"
    # With nothing due an iteration runs no collective: none while the first heat window
    # fills, and most iterations none at all.
    per_iteration = np.diff([0] + results[0]["collectives"])
    assert (per_iteration[: H - 1] == 0).all(), per_iteration[:H]
    assert (per_iteration == 0).sum() >= len(per_iteration) // 2, per_iteration
    # The simulator's placements, cycle by cycle, are the processes' placements.
    entries = simulate_log(tmp_path, trace, procs, redundant, policy)
    sim = [(e["active_from_window"], np.array(e["placement"]).reshape(LAYERS, -1).tolist())
           for e in entries[1:]]
    real = [(e["active_from_window"], e["placement"]) for e in results[0]["log"]]
    assert len(sim) >= 4
    assert real == sim
    # Metrics and heat recording work through this path.
    assert "eplb_" in results[0]["metrics"]
    lines = rec.read_text().splitlines()
    assert json.loads(lines[0])["format"] == "eplb-trace/v1"
    assert len(lines) - 1 >= stats["plans"], "a recorded window per cycle"


@pytest.mark.parametrize(
    "fault",
    [
        # A heat gather (long) that ran everywhere fails on rank 2 only.
        {"rank": 2, "op": "all_gather", "after": 1},
        # An agreement (5 words) fails on rank 1 only, later in the run.
        {"rank": 1, "op": "all_gather", "after": 12, "words": 5},
        # Rank 3's exchange of a layer fails after its transfers completed.
        {"rank": 3, "op": "wait", "after": 2},
    ],
    ids=["heat-gather", "agreement", "exchange"],
)
def test_a_one_sided_fault_ends_on_one_placement_and_balancing_goes_on(tmp_path, fault):
    trace = make_trace(tmp_path / "trace.json")
    spec = {"trace": str(trace), "config": config(4), "fault": fault, "timeout": 4}
    results = spawn(tmp_path, 4, spec)
    assert_clean(results)
    assert_same_placements(results)
    hit = results[fault["rank"]]
    assert "fault_hit" in hit, "the fault never hit"
    for res in results:
        assert res["health"] == "running"
    # Balancing went on after the fault: plans taken and layers committed after it.
    stats = [r["stats"] for r in results]
    if fault["op"] == "wait":
        assert min(s["layers_aborted"] for s in stats) >= 1, stats
        # The exception became a transport failure naming the rank, the layer and the
        # operation, in the engine's log.
        out = hit["output"]
        want = r"eplb rank 3: layer \d+ wait: RuntimeError: injected: this rank's exchange failed"
        assert re.search(want, out), out[-2000:]
    else:
        assert stats[fault["rank"]]["collective_failures"] >= 1, stats
    at = hit["fault_iteration"]
    for res in results:
        assert any(it > at for it, _ in res.get("commits", [])), "no layer moved after the fault"
        assert any(it > at for it in res.get("plans", [])), "no plan taken after the fault"


def test_a_rank_killed_mid_walk_is_removed_and_the_survivors_serve_every_expert(tmp_path):
    # Rank 2 is SIGKILLed right after the first layer of the second cycle's walk committed.
    # The parent sees it die and tells the survivors (an engine's health check); they build a
    # group of the survivors, call remove_ranks with it, load the lost experts from the host
    # copies and balance over the three live ranks.
    trace = make_trace(tmp_path / "trace.json", windows=64)
    kill = {"rank": 2, "cycle": 2, "after_commits": 1}
    spec = {"trace": str(trace), "config": config(8), "kill": kill, "timeout": 10}
    results = spawn(tmp_path, 4, spec, kill_watch=True)
    assert results[2] is None
    assert_clean(results)
    assert_same_placements(results)
    survivors = [r for r in results if r is not None]
    for res in survivors:
        assert res["mid_walk"], "the rank was not killed in the middle of a walk"
        assert res["live"] == [0, 1, 3]
        assert res["health"] == "running"
        at = res["removed_at"]
        assert any(it > at for it in res.get("plans", [])), "no plan after the removal"
        assert any(it > at for it, _ in res.get("commits", [])), "no layer moved after it"
        # The dead rank's slots are empty; every expert has a live copy again.
        p = np.array(res["placement"])
        s = p.shape[1] // 4
        assert (p[:, 2 * s : 3 * s] == -1).all()
        for layer in p:
            assert set(layer[layer >= 0].tolist()) == set(range(EXPERTS))
    stats = [r["stats"] for r in survivors]
    if survivors[0]["lost"] > 0:
        assert sum(s["loads"] for s in stats) >= 1, stats
    assert stats[0]["membership_changes"] >= 1


def test_a_killed_rank_comes_back_in_a_new_process_and_balancing_goes_on_over_four(tmp_path):
    # Rank 2 is SIGKILLed mid-walk; the survivors remove it and balance over three ranks. Then
    # the parent (the engine) starts a new process for rank 2; once the survivors took a plan
    # after the removal they hand it their placement and live ranks, leave their process groups
    # and form a new world of four with it; it builds its runtime from the hand-over (empty
    # rows of its own) and all four call add_ranks at the same iteration. Every rank checks
    # after every iteration that its slots hold the experts its rows name (byte-equal) and that
    # log2phy names only live slots holding the expert.
    trace = make_trace(tmp_path / "trace.json", windows=80)
    kill = {"rank": 2, "cycle": 2, "after_commits": 1}
    spec = {"trace": str(trace), "config": config(8), "kill": kill, "timeout": 10,
            "rejoin": True}
    results = spawn(tmp_path, 4, spec, kill_watch=True, rejoin=True)
    assert_clean(results)
    joiner = results[2]
    assert joiner["live_at_join"] == [0, 1, 3]
    assert joiner["health_at_join"] == "running"
    at = joiner["joined_at"]
    for r, res in enumerate(results):
        assert res["live"] == [0, 1, 2, 3], f"rank {r}"
        assert res["health"] == "running", f"rank {r}"
        assert res["joined_at"] == at, f"rank {r} let the rank in at another iteration"
        assert any(it > at for it in res.get("plans", [])), f"rank {r}: no plan after the join"
        assert any(it > at for it, _ in res.get("commits", [])), f"rank {r}: nothing moved"
        # Every live rank holds the same placement at every iteration after the join.
        assert res["hashes"][-len(joiner["hashes"]):] == joiner["hashes"], f"rank {r}"
        assert res["placement"] == joiner["placement"], f"rank {r}"
    # The joiner's slots were filled by the walks after the join.
    p = np.array(joiner["placement"])
    s = p.shape[1] // 4
    assert (p[:, 2 * s : 3 * s] >= 0).all(), p[:, 2 * s : 3 * s]
    for layer in p:
        assert set(layer.tolist()) == set(range(EXPERTS))
    # Its counters: it took the peers' cycle number and saw one membership change.
    js, ps = joiner["stats"], results[0]["stats"]
    assert js["cycles"] == ps["cycles"], (js, ps)
    assert js["membership_changes"] == 1, js
    assert ps["membership_changes"] == 2, ps
    assert js["bytes_received"] > 0, js


def test_bad_counts_raise_on_the_rank_that_got_them_and_a_new_group_carries_on(tmp_path):
    trace = make_trace(tmp_path / "trace.json", windows=48)
    spec = {"trace": str(trace), "config": config(2), "bad_counts": True, "timeout": 10,
            "regroup_at": 9}
    results = spawn(tmp_path, 2, spec)
    assert_clean(results)
    assert_same_placements(results)
    errors = results[1]["count_errors"]
    assert len(errors) == 5, errors
    assert "expected shape [4, 9]" in errors[0]
    assert "dtype float32" in errors[1]
    assert "expected shape" in errors[2]
    assert "is not a count" in errors[3]
    assert "expected shape [4, 9]" in errors[4]
    assert "count_errors" not in results[0]
    assert results[0]["stats"]["plans"] >= 2
    # A group of the wrong size is refused; the new group of the same ranks carries on.
    assert "the live EP ranks are [0, 1]" in results[1]["regroup_error"]
    at = results[0]["regrouped_at"]
    for res in results:
        assert any(it > at for it in res.get("plans", [])), "no plan after the new group"
        assert any(it > at for it, _ in res.get("commits", [])), "no layer moved after it"


@pytest.mark.parametrize("case", ["first_dim", "mixed_devices", "group_size"])
def test_bad_construction_raises_eplb_error_and_no_rank_hangs(tmp_path, case):
    trace = make_trace(tmp_path / "trace.json", windows=24)
    timeout = 5
    cfg = config(2)
    spec = {"trace": str(trace), "config": cfg, "timeout": timeout}
    if case == "group_size":
        # A map for 4 ranks, started on a group of 2.
        import eplb

        rows = np.stack([np.arange(EXPERTS).reshape(4, 4)] * LAYERS)
        eplb.write_map(tmp_path / "map.json", rows)
        spec["config"] = dict(cfg, expert_map_path=str(tmp_path / "map.json"))
        spec["config"].pop("num_redundant_experts")
    else:
        spec["bad"] = {"1" if case == "first_dim" else "0": case}
    started = time.monotonic()
    results = spawn(tmp_path, 2, spec, limit=60)
    errors = [r.get("construct_error") for r in results]
    assert all(errors), results
    if case == "first_dim":
        assert "layer 1 tensor 0 has 10 slots" in errors[1], errors
        assert "handshake" in errors[0], errors
    elif case == "mixed_devices":
        assert "layer 2 tensor 1 is on meta" in errors[0], errors
        assert "handshake" in errors[1], errors
    else:
        assert all("map.json" in e and "4" in e for e in errors), errors
        assert all("map.json" in r["layout_error"] for r in results)
    for r in results:
        assert r["construct_seconds"] < timeout + 3, r
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("mode", ["record", "static", "payoff_gate"])
def test_record_static_and_gated_modes_run_through_the_same_path(tmp_path, mode):
    import eplb

    trace = make_trace(tmp_path / "trace.json", windows=24)
    cfg = config(2)
    if mode == "record":
        cfg["expert_map_record_path"] = str(tmp_path / "record.json")
    elif mode == "static":
        rows = np.stack([np.random.default_rng(l).permutation(EXPERTS).reshape(2, 8)
                         for l in range(LAYERS)])
        eplb.write_map(tmp_path / "map.json", rows)
        cfg = {"expert_map_path": str(tmp_path / "map.json")}
    else:
        cfg["eplb_payoff_gate"] = True
    results = spawn(tmp_path, 2, {"trace": str(trace), "config": cfg, "sim_stop": False})
    assert_clean(results)
    assert_same_placements(results)
    res = results[0]
    stats = res["stats"]
    if mode == "record":
        assert res["mode"] == "record"
        assert stats["plans"] >= 2 and stats["moves"] == 0 and stats["layers_committed"] == 0
        assert len(set(res["hashes"])) == 1, "record mode moved a weight"
        recorded = eplb.read_map(str(tmp_path / "record.json"))
        assert recorded.shape[:2] == (LAYERS, 2)
    elif mode == "static":
        assert res["mode"] == "static"
        assert stats["plans"] == 0 and stats["collectives"] == 0
        assert np.array(res["placement"]).tolist() == rows.reshape(LAYERS, -1).tolist()
    else:
        assert res["mode"] == "dynamic" and stats["plans"] >= 2
        assert "eplb_" in res["metrics"]
