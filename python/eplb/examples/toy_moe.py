"""A toy MoE engine on CPU processes over gloo, balanced by :class:`eplb.runtime.Runtime`.

``python -m eplb.examples.toy_moe --procs 4 --trace data/esft_chain.json``

Every process is one EP rank holding a stack of MoE layers whose expert weights are real
tensors (``w13`` and ``w2`` per slot, as engines keep them). Each trace window is one forward:
every rank's share of the window's tokens is routed through its ``log2phy``, the counts per
physical slot are summed over the group (what the all-to-all does to the tokens), each rank runs
its experts on (a capped number of) its tokens, and reports its tokens per local slot to
``after_forward``. Rank 0 prints, per cycle: the PAR (busiest rank's tokens over the mean,
averaged over the layers) of the cycle's windows, the expert copies moved, the bytes moved
over every rank, the time the serving thread blocked waiting for the exchanges (they overlap
the forwards) and an estimate of the transfer time at ``--link-gbps`` (the busiest rank's bytes
over the link).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m eplb.examples.toy_moe", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--procs", type=int, default=4, help="EP ranks (CPU processes)")
    p.add_argument("--trace", required=True, help="an eplb-trace/v1 trace")
    p.add_argument("--redundant", type=int, default=None, help="redundant experts (--procs)")
    p.add_argument("--heat-interval", type=int, default=16, help="heat windows per cycle")
    p.add_argument("--algo-interval", type=int, default=2, help="windows the planner gets")
    p.add_argument("--policy", default="swift", help="eplb policy (swift, flashlb, default, ...)")
    p.add_argument("--hidden", type=int, default=32, help="hidden size of the toy experts")
    p.add_argument("--intermediate", type=int, default=64, help="intermediate size")
    p.add_argument("--tokens-cap", type=int, default=4, help="tokens a slot computes per forward")
    p.add_argument("--link-gbps", type=float, default=10.0, help="link of the estimate, Gbit/s")
    p.add_argument("--windows", type=int, default=None, help="replay only the first windows")
    return p.parse_args(argv)


def _expert(layer: int, expert: int, hidden: int, inter: int) -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(layer * 1_000_003 + expert)
    w13 = torch.randn((2 * inter, hidden), generator=g) / hidden**0.5
    w2 = torch.randn((hidden, inter), generator=g) / inter**0.5
    return [w13, w2]


def _rank(rank: int, a: argparse.Namespace, store: str, counts: np.ndarray) -> None:
    import torch
    import torch.distributed as dist

    from eplb.runtime import Runtime, initial_placement

    torch.set_num_threads(1)
    os.environ.setdefault("DYNAMIC_EPLB", "true")
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=a.procs,
        timeout=datetime.timedelta(seconds=60),
    )
    windows, layers, experts = counts.shape
    redundant = a.procs if a.redundant is None else a.redundant
    cfg = {
        "dynamic_eplb": True,
        "num_redundant_experts": redundant,
        "expert_heat_collection_interval": a.heat_interval,
        "algorithm_execution_interval": a.algo_interval,
        "eplb_policy_type": a.policy,
    }
    start = initial_placement(cfg, layers=layers, experts=experts, ranks=a.procs)
    slots = start.shape[1] // a.procs
    weights = []
    for l in range(layers):
        w13 = torch.empty((slots, 2 * a.intermediate, a.hidden))
        w2 = torch.empty((slots, a.hidden, a.intermediate))
        for s, e in enumerate(start[l, rank * slots : (rank + 1) * slots]):
            ref = _expert(l, int(e), a.hidden, a.intermediate)
            w13[s].copy_(ref[0])
            w2[s].copy_(ref[1])
        weights.append([w13, w2])
    rt = Runtime(cfg, layers=layers, experts=experts, weights=weights)
    n = a.procs
    me_share = lambda w: w // n + (np.arange(n)[:, None, None] < w % n)[rank]  # noqa: E731
    pars: list[float] = []
    last = dict(rt.stats)
    cycle = 0
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(rank)
    if rank == 0:
        print(
            f"toy_moe: {n} ranks, {layers} MoE layers x {experts} experts, {slots} slots per "
            f"rank, {windows} windows, policy {a.policy}, H={a.heat_interval} A={a.algo_interval}"
        )
        print(f"{'cycle':>5} {'windows':>9} {'PAR':>6} {'moves':>6} {'bytes moved':>12} "
              f"{'wait ms':>8} {'est. ms':>8}")
    first_window = 0
    for w in range(windows):
        # Route this rank's share of the window through log2phy; sum over the group.
        share = me_share(counts[w])
        phys = np.zeros((layers, n * slots), dtype=np.int64)
        for l in range(layers):
            l2p = rt.log2phy(l)
            np.add.at(phys[l], l2p, share[l])
        t = torch.from_numpy(phys)
        dist.all_reduce(t)
        phys = t.numpy()
        per_rank = phys.reshape(layers, n, slots).sum(axis=2)
        pars.append(float(np.mean(per_rank.max(axis=1) / np.maximum(per_rank.mean(axis=1), 1e-9))))
        mine = np.ascontiguousarray(phys[:, rank * slots : (rank + 1) * slots])
        rt.before_forward()
        # The experts' forward on (a few of) their tokens.
        with torch.no_grad():
            for l in range(layers):
                w13, w2 = weights[l]
                for slot in np.nonzero(mine[l])[0].tolist():
                    tokens = min(int(mine[l, slot]), a.tokens_cap)
                    x = torch.randn((tokens, a.hidden), generator=gen)
                    gate, up = (x @ w13[slot].T).split(a.intermediate, dim=1)
                    h = torch.nn.functional.silu(gate) * up
                    _ = h @ w2[slot].T
        rt.after_forward(mine, int(mine.sum()))
        if rt.events["cycle_done"]:
            cycle += 1
            now = rt.stats
            got = now["bytes_received"] + now["bytes_loaded"]
            got -= last["bytes_received"] + last["bytes_loaded"]
            moved = torch.tensor([got], dtype=torch.int64)
            per_rank_bytes = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
            dist.all_gather(per_rank_bytes, moved)
            total = int(sum(int(b) for b in per_rank_bytes))
            busiest = max(int(b) for b in per_rank_bytes)
            waited = (now["wait_seconds"] - last["wait_seconds"]) * 1e3
            # Each rank receives its experts in parallel: the busiest rank's bytes over the link.
            est = busiest * 8 / (a.link_gbps * 1e9) * 1e3
            if rank == 0:
                print(f"{cycle:>5} {first_window:>4}-{w:<4} {np.mean(pars[first_window:]):>6.3f} "
                      f"{now['moves'] - last['moves']:>6} {total:>12} {waited:>8.2f} {est:>8.3f}")
            last = dict(now)
            first_window = w + 1
    stats = rt.stats
    if rank == 0:
        print(
            f"done in {time.perf_counter() - t0:.1f} s: {stats['plans']} plans, "
            f"{stats['layers_committed']} layers committed, {stats['layers_aborted']} aborted, "
            f"{stats['moves']} expert copies moved; mean PAR {np.mean(pars):.3f} "
            f"(first cycle {np.mean(pars[: a.heat_interval + a.algo_interval]):.3f}, "
            f"last 32 windows {np.mean(pars[-32:]):.3f}); health {rt.health}"
        )
        sys.stdout.flush()
    rt.close()
    dist.barrier()
    dist.destroy_process_group()


def _entry(rank: int, a: argparse.Namespace, store: str, counts: np.ndarray) -> None:
    _rank(rank, a, store, counts)


def main(argv: list[str] | None = None) -> None:
    a = _args(argv)
    import torch.multiprocessing as mp

    with open(a.trace) as f:
        doc = json.load(f)
    counts = np.array(doc["counts"], dtype=np.int64)
    if a.windows is not None:
        counts = counts[: a.windows]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_entry, args=(a, os.path.join(tmp, "store"), counts), nprocs=a.procs, join=True)


if __name__ == "__main__":
    main()
