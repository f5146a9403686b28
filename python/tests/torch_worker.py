"""One rank of the torch runtime tests (`test_runtime_torch.py` spawns N of them): a stack of MoE
layers whose expert weights are real tensors, routing replayed from an `eplb-trace/v1` trace
through `log2phy`, over gloo on the CPU. Checks after every iteration and writes what it saw to
`<out>/rank<r>.json`.

Usage: python torch_worker.py SPEC.json RANK [join]

With `join`, the process is rank RANK coming back after it was killed: it waits for the
survivors' hand-over (`<out>/handover.json`: their placement, live ranks, window and cycle
start), joins the new world they form (`<store>.2`) and serves from there.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import time
import traceback
import zlib

import numpy as np
import torch
import torch.distributed as dist

import eplb
from eplb.runtime import Runtime

SHAPES = [((2, 3), torch.float32), ((3, 2), torch.bfloat16)]


def reference(layer: int, expert: int) -> list[torch.Tensor]:
    """The weights of one expert, as a checkpoint holds them."""
    out = []
    for i, (shape, dtype) in enumerate(SHAPES):
        g = torch.Generator().manual_seed(layer * 100_003 + expert * 7 + i)
        out.append(torch.randn(shape, generator=g).to(dtype))
    return out


def build_weights(placement: np.ndarray, rank: int, slots: int) -> list[list[torch.Tensor]]:
    layers = placement.shape[0]
    ws = []
    for l in range(layers):
        row = placement[l, rank * slots : (rank + 1) * slots]
        tensors = []
        for i, (shape, dtype) in enumerate(SHAPES):
            t = torch.empty((slots, *shape), dtype=dtype)
            for s, e in enumerate(row):
                t[s].copy_(reference(l, int(e))[i])
            tensors.append(t)
        ws.append(tensors)
    return ws


class Replay:
    def __init__(self, spec: dict, rank: int) -> None:
        self.spec = spec
        self.rank = rank
        self.out: dict = {"rank": rank, "iterations": 0, "hashes": [], "log": [], "errors": []}
        self.refs = {}

    def ref(self, l: int, e: int) -> list[torch.Tensor]:
        k = (l, e)
        if k not in self.refs:
            self.refs[k] = reference(l, e)
        return self.refs[k]

    def check(
        self, rt: Runtime, weights: list[list[torch.Tensor]], it: int, strict: bool = False
    ) -> None:
        """Every slot holds the expert its placement row names; log2phy names a slot holding
        that expert."""
        p = rt.placement()
        s = rt.slots_per_rank
        live = rt.live()
        for l in range(p.shape[0]):
            row = p[l, self.rank * s : (self.rank + 1) * s]
            for slot, e in enumerate(row):
                if e < 0:
                    continue
                for w, r in zip(weights[l], self.ref(l, int(e))):
                    if not torch.equal(w[slot], r):
                        raise AssertionError(
                            f"iteration {it}: layer {l} slot {slot} does not hold expert {e}"
                        )
            l2p = rt.log2phy(l)
            for e, phys in enumerate(l2p):
                if phys < 0:
                    # Only between a rank's removal and the load of its lost experts.
                    if "removed_at" not in self.out or strict:
                        raise AssertionError(f"iteration {it}: layer {l} expert {e} has no copy")
                    self.out["unserved"] = self.out.get("unserved", 0) + 1
                    continue
                if p[l, phys] != e or phys // s not in live:
                    raise AssertionError(
                        f"iteration {it}: layer {l} log2phy[{e}] = {phys} holds {p[l, phys]}"
                    )
            em = rt.expert_map(l)
            for e, slot in enumerate(em):
                if slot >= 0 and row[slot] != e:
                    raise AssertionError(f"iteration {it}: layer {l} expert_map[{e}] = {slot}")

    def route(self, rt: Runtime, group, window: np.ndarray, ranks: list[int]) -> np.ndarray:
        """This rank's tokens per local slot: every live rank's share of each expert's tokens
        goes through that rank's log2phy; the counts per physical slot are summed over the
        group (what the all-to-all does to the tokens)."""
        layers, experts = window.shape
        s = rt.slots_per_rank
        phys = np.zeros((layers, rt.placement().shape[1]), dtype=np.int64)
        n = len(ranks)
        me = ranks.index(self.rank)
        share = window // n + (np.arange(n)[:, None, None] < window % n)[me]
        for l in range(layers):
            l2p = rt.log2phy(l)
            served = l2p >= 0  # an expert with no live copy (until it is loaded) is unserved
            np.add.at(phys[l], l2p[served], share[l][served])
        t = torch.from_numpy(phys)
        dist.all_reduce(t, group=group)
        phys = t.numpy()
        return np.ascontiguousarray(phys[:, self.rank * s : (self.rank + 1) * s])


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    rank = int(sys.argv[2])
    joining = sys.argv[3:] == ["join"]
    world = spec["procs"]
    os.environ["DYNAMIC_EPLB"] = "true"
    rep = Replay(spec, rank)
    out_path = os.path.join(spec["out"], f"rank{rank}.json")
    try:
        if joining:
            join(spec, rank, rep)
        else:
            timeout = datetime.timedelta(seconds=spec.get("timeout", 20))
            dist.init_process_group(
                "gloo", init_method=f"file://{spec['store']}", rank=rank, world_size=world,
                timeout=timeout,
            )
            run(spec, rank, rep)
    except Exception as e:  # written for the test to read
        rep.out["errors"].append(f"{type(e).__name__}: {e}")
        rep.out["traceback"] = traceback.format_exc()
    with open(out_path + ".tmp", "w") as f:
        json.dump(rep.out, f)
    os.replace(out_path + ".tmp", out_path)
    sys.stdout.flush()
    os._exit(0)


def run(spec: dict, rank: int, rep: Replay) -> None:
    trace = json.loads(open(spec["trace"]).read())
    counts = np.array(trace["counts"], dtype=np.int64)
    windows, layers, experts = counts.shape
    world = spec["procs"]
    cfg = spec["config"]
    slots = (experts + cfg.get("num_redundant_experts", 0)) // world
    try:
        initial = default_layout(cfg, layers, experts, world)
    except eplb.EplbError as e:
        # The engine's own loader disagrees with the config (a bad-input case): load the
        # contiguous layout and let the runtime refuse it.
        rep.out["layout_error"] = str(e)
        initial = np.tile(np.arange(experts), (layers, 1))
        slots = experts // world
    weights = build_weights(initial, rank, slots)
    bad = spec.get("bad", {}).get(str(rank))
    if bad == "first_dim":
        weights[1][0] = torch.zeros((slots + 1, *SHAPES[0][0]), dtype=SHAPES[0][1])
    elif bad == "mixed_devices":
        weights[2][1] = torch.empty(weights[2][1].shape, dtype=SHAPES[1][1], device="meta")
    t0 = time.monotonic()
    try:
        rt = Runtime(cfg, layers=layers, experts=experts, weights=weights, timeout=spec.get("timeout", 20))
    except eplb.EplbError as e:
        rep.out["construct_error"] = str(e)
        rep.out["construct_seconds"] = time.monotonic() - t0
        return
    rep.out["mode"] = rt.mode
    for l in range(layers):
        for e in range(experts):
            rt.register_backup(l, e, rep.ref(l, e))
    fault = spec.get("fault")
    if fault and fault["rank"] == rank:
        arm_fault(rt, fault, rep)
    serve(spec, rank, rep, rt, counts, slots, dist.group.WORLD, list(range(world)), 0, 0, 0)


def new_world(spec: dict, rank: int) -> None:
    """The world of the ranks after a join: a process group cannot take in a new process, so
    the survivors leave theirs and every rank of the new set forms a new one (a new store)."""
    timeout = datetime.timedelta(seconds=spec.get("timeout", 20))
    dist.init_process_group(
        "gloo", init_method=f"file://{spec['store']}.2", rank=rank, world_size=spec["procs"],
        timeout=timeout,
    )


def join(spec: dict, rank: int, rep: Replay) -> None:
    """Rank `rank` comes back: the peers' placement and live ranks from the hand-over, a new
    world, a runtime built from them, add_ranks with every peer, then serving."""
    trace = json.loads(open(spec["trace"]).read())
    counts = np.array(trace["counts"], dtype=np.int64)
    _, layers, experts = counts.shape
    cfg = spec["config"]
    path = os.path.join(spec["out"], "handover.json")
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError("no hand-over from the survivors")
        time.sleep(0.01)
    h = json.loads(open(path).read())
    placement = np.array(h["placement"], dtype=np.int64)
    slots = placement.shape[1] // spec["procs"]
    # Its slots hold nothing yet (the placement's rows of this rank are empty).
    weights = [
        [torch.zeros((slots, *shape), dtype=dtype) for shape, dtype in SHAPES]
        for _ in range(layers)
    ]
    new_world(spec, rank)
    rt = Runtime(
        cfg, layers=layers, experts=experts, weights=weights, placement=placement,
        live=h["live"], timeout=spec.get("timeout", 20),
    )
    for l in range(layers):
        for e in range(experts):
            rt.register_backup(l, e, rep.ref(l, e))
    spec = dict(spec, kill=None)  # the kill is behind; this process serves to the end
    rep.out["joined_at"] = h["it"]
    rep.out["first_it"] = h["it"]
    rep.out["health_at_join"] = rt.health
    rep.out["live_at_join"] = rt.live()
    rt.add_ranks([rank], group=dist.group.WORLD)
    serve(
        spec, rank, rep, rt, counts, slots, dist.group.WORLD, list(range(spec["procs"])),
        h["window"], h["it"], h["cycle_start"],
    )


def serve(
    spec: dict, rank: int, rep: Replay, rt: Runtime, counts: np.ndarray, slots: int, group,
    ranks: list[int], first_window: int, it: int, cycle_start: int,
) -> None:
    windows, layers, _ = counts.shape
    cfg = spec["config"]
    h, a = cfg.get("expert_heat_collection_interval", 1), cfg.get("algorithm_execution_interval", 1)
    kill = spec.get("kill")
    killed_at = None
    driving = True
    zeros = np.zeros((layers, slots), dtype=np.int64)
    for w in range(first_window, windows):
        if driving and w == cycle_start and w + h + a >= windows and spec.get("sim_stop", True):
            driving = False
        if not driving:
            break
        if spec.get("rejoin") and rejoin_due(rt, rep):
            # The parent started a new process for the dead rank: hand it this iteration's
            # placement and live set, form the new world with it, and let it in.
            gone = [q for q in range(spec["procs"]) if q not in ranks]
            if rank == ranks[0]:
                path = os.path.join(spec["out"], "handover.json")
                doc = {
                    "window": w, "it": it, "cycle_start": cycle_start,
                    "placement": rt.placement().tolist(), "live": rt.live(),
                }
                with open(path + ".tmp", "w") as f:
                    json.dump(doc, f)
                os.replace(path + ".tmp", path)
            dist.destroy_process_group()
            new_world(spec, rank)
            group, ranks = dist.group.WORLD, list(range(spec["procs"]))
            rt.add_ranks(gone, group=group)
            rep.out["joined_at"] = it
        if spec.get("regroup_at") == w:
            # The engine's group timed out and was rebuilt: hand over a new one (same ranks).
            # Every rank creates the same groups in the same order (torch's rule).
            alone = dist.new_group(ranks=[1])
            if rank == 1:
                try:
                    rt.set_group(alone)
                except eplb.EplbError as e:
                    rep.out["regroup_error"] = str(e)
            group = dist.new_group(ranks=ranks)
            rt.set_group(group)
            rep.out["regrouped_at"] = rep.out["iterations"]
        mine = rep.route(rt, group, counts[w], ranks)
        if spec.get("bad_counts") and rank == 1 and w == 3:
            wrong_ones = (
                mine[:, :-1],  # a slot short
                mine.astype(np.float32),  # not integers
                mine[None],  # three dimensions
                -mine - 1,  # negative
                torch.from_numpy(mine[:-1]),  # a torch tensor a layer short
            )
            for wrong in wrong_ones:
                try:
                    rt.after_forward(wrong, 0)
                except eplb.EplbError as e:
                    rep.out.setdefault("count_errors", []).append(str(e))
        forward(rt, mine, int(mine.sum()))
        taken = rt.events["plan_taken"] is not None
        it = step_done(rt, rep, it)
        while rt.is_updating:
            forward(rt, zeros, 0)
            it = step_done(rt, rep, it)
            if kill and killed_at is None and should_die(rt, kill, rep):
                killed_at = it
                if rank == kill["rank"]:
                    os.kill(os.getpid(), signal.SIGKILL)
                rep.out["mid_walk"] = rt.is_updating
                group, ranks = survive(spec, rt, rank, kill)
                rep.out["removed_at"] = it
        if taken:
            rep.out["log"].append(
                {"active_from_window": w + 1, "placement": rt.placement().tolist()}
            )
            cycle_start = w + 1
    rep.check(rt, rt._transport.weights, it, strict=True)
    rep.out["stats"] = rt.stats
    rep.out["health"] = rt.health
    rep.out["live"] = rt.live()
    rep.out["placement"] = rt.placement().tolist()
    rep.out["metrics"] = rt.metrics_text()
    rt.close()


def forward(rt: Runtime, counts: np.ndarray, tokens: int) -> None:
    rt.wait_for_plan(30.0)
    rt.before_forward()
    rt.after_forward(counts, tokens)


def step_done(rt: Runtime, rep: Replay, it: int) -> int:
    rep.check(rt, rt._transport.weights, it)
    rep.out["hashes"].append(zlib.crc32(rt.placement().tobytes()))
    if "removed_at" in rep.out and "lost" not in rep.out:
        # The first forward after the removal agreed on the new set and rerouted.
        layers = rt.placement().shape[0]
        rep.out["lost"] = int(sum((rt.log2phy(l) < 0).sum() for l in range(layers)))
    rep.out.setdefault("collectives", []).append(rt.stats["collectives"])
    ev = rt.events
    if ev["committed"] is not None:
        rep.out.setdefault("commits", []).append([it, ev["committed"]])
    if ev["plan_taken"] is not None:
        rep.out.setdefault("plans", []).append(it)
    rep.out["iterations"] = it + 1
    return it + 1


def rejoin_due(rt: Runtime, rep: Replay) -> bool:
    """Between cycles, once the survivors took a plan after the removal (every rank sees the
    same events at the same iteration)."""
    if "removed_at" not in rep.out or "joined_at" in rep.out or rt.is_updating:
        return False
    return any(p > rep.out["removed_at"] for p in rep.out.get("plans", []))


def should_die(rt: Runtime, kill: dict, rep: Replay) -> bool:
    """Mid-walk of the cycle `kill["cycle"]`: right after its `kill["after_commits"]`-th layer
    committed (every rank sees the same events at the same iteration)."""
    plans = rep.out.get("plans", [])
    if len(plans) < kill["cycle"]:
        return False
    start = plans[kill["cycle"] - 1]
    done = [c for c in rep.out.get("commits", []) if c[0] >= start]
    return len(done) == kill["after_commits"] and rt.events["committed"] is not None


def survive(spec: dict, rt: Runtime, rank: int, kill: dict):
    """The engine's health check: the test's parent process writes a notice once it has seen
    the rank die; the survivors wait for it, build a group of the survivors and remove it."""
    notice = os.path.join(spec["out"], "dead")
    deadline = time.monotonic() + 60
    while not os.path.exists(notice):
        if time.monotonic() > deadline:
            raise TimeoutError("no notice of the killed rank")
        time.sleep(0.01)
    gone = int(open(notice).read())
    survivors = [q for q in range(spec["procs"]) if q != gone]
    group = dist.new_group(
        ranks=survivors,
        timeout=datetime.timedelta(seconds=spec.get("timeout", 20)),
        use_local_synchronization=True,
    )
    rt.remove_ranks([gone], group=group)
    return group, survivors


def arm_fault(rt: Runtime, fault: dict, rep: Replay) -> None:
    """Rank `fault["rank"]` fails once: a collective that ran raises here, or a layer's
    exchange fails after its transfers completed (a one-sided fault)."""
    t = rt._transport
    state = {"n": 0, "hit": False}
    if fault["op"] == "all_gather":
        real = t.all_gather

        def all_gather(local):
            got = real(local)
            state["n"] += 1
            if not state["hit"] and state["n"] >= fault["after"] and local.size == fault.get("words", local.size):
                state["hit"] = True
                rep.out["fault_hit"] = state["n"]
                rep.out["fault_iteration"] = rep.out["iterations"]
                raise RuntimeError("injected: this rank's collective failed")
            return got

        t.all_gather = all_gather
    else:
        real_wait = t.wait

        def wait(plan):
            real_wait(plan)
            state["n"] += 1
            if not state["hit"] and state["n"] >= fault["after"]:
                state["hit"] = True
                rep.out["fault_hit"] = state["n"]
                rep.out["fault_iteration"] = rep.out["iterations"]
                raise RuntimeError("injected: this rank's exchange failed")

        t.wait = wait


def default_layout(cfg: dict, layers: int, experts: int, ranks: int) -> np.ndarray:
    """The start-up placement the runtime computes, by which the weights are loaded."""
    from eplb.runtime import initial_placement

    return initial_placement(cfg, layers=layers, experts=experts, ranks=ranks)


if __name__ == "__main__":
    main()
