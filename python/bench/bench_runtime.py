"""Benchmarks of `eplb.runtime.Runtime` over torch.distributed (gloo, 2 CPU processes), side by
side in one run (BENCHMARKS.md, "The runtime inside a PyTorch engine"):

1. `after_forward` with nothing due (heat collection), from Python, next to an empty Python
   method call with the same arguments; counts as a numpy array and as a torch tensor.
2. A layer's exchange (launch in `before_forward`, wait in `after_forward`, no forward in
   between) next to a plain `batch_isend_irecv` of the same number of tensors of the same shapes
   on the same group (preallocated), run right after each layer's exchange: alternating.

Usage: python bench/bench_runtime.py [--calls N] [--mb-per-expert X]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

import numpy as np


def hot_path(rt, calls: int) -> dict:
    import torch

    layers, slots = 58, rt.slots_per_rank
    counts = np.random.default_rng(0).integers(0, 50, (layers, slots)).astype(np.int64)
    tensor = torch.from_numpy(counts.copy())

    class Engine:
        def noop(self, slot_counts, padded_tokens):
            pass

    e = Engine()
    out = {}
    for rep in range(3):
        for name, fn, arg in (
            ("empty method", e.noop, counts),
            ("after_forward (numpy)", rt.after_forward, counts),
            ("after_forward (torch)", rt.after_forward, tensor),
        ):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(arg, 64)
            dt = (time.perf_counter() - t0) / calls * 1e6
            out.setdefault(name, []).append(dt)
    return out


def exchange(rank: int, mb: float, rounds: int) -> dict:
    import torch
    import torch.distributed as dist

    from eplb.runtime import Runtime, initial_placement

    layers, experts = 4, 16
    cfg = {
        "dynamic_eplb": True,
        "num_redundant_experts": 2,
        "expert_heat_collection_interval": 2,
        "algorithm_execution_interval": 1,
        "eplb_policy_type": "swift",
    }
    start = initial_placement(cfg, layers=layers, experts=experts, ranks=2)
    slots = start.shape[1] // 2
    # Two tensors per expert (w13 and w2), `mb` MB together.
    n = int(mb * 1e6 / 4 / 3)
    shapes = [(2, n), (n,)]
    weights = [
        [torch.randn((slots, *s)) for s in shapes] for _ in range(layers)
    ]
    rt = Runtime(cfg, layers=layers, experts=experts, weights=weights)
    t = rt._transport
    log: list[tuple[int, int, float]] = []
    real_launch, real_wait = t.launch, t.wait
    state: dict = {}

    def launch(plan):
        state["t0"] = time.perf_counter()
        state["n"] = (len(plan.sends), len(plan.recvs))
        real_launch(plan)

    peer = 1 - rank
    src = [torch.randn(s) for s in shapes]
    plain: list[float] = []

    def plain_exchange(sends: int, recvs: int) -> float:
        """The same messages, plain: preallocated tensors, one batch_isend_irecv, wait all."""
        bufs = [[torch.empty(s) for s in shapes] for _ in range(recvs)]
        ops = []
        for _ in range(sends):
            ops += [dist.P2POp(dist.isend, x, peer) for x in src]
        for b in bufs:
            ops += [dist.P2POp(dist.irecv, x, peer) for x in b]
        t0 = time.perf_counter()
        for w in dist.batch_isend_irecv(ops) if ops else []:
            w.wait()
        return time.perf_counter() - t0

    def wait(plan):
        real_wait(plan)
        log.append((*state["n"], time.perf_counter() - state["t0"]))
        # Right after each layer's exchange, on both ranks (both wait for the same layer).
        plain.append(plain_exchange(*state["n"]))

    t.launch, t.wait = launch, wait
    # Heat on rank 0's experts, then on rank 1's: every cycle moves experts both ways.
    rng = np.random.default_rng(1)
    for it in range(rounds):
        hot = (it // 8) % 2
        c = rng.integers(0, 5, (layers, slots)).astype(np.int64)
        if rank == hot:
            c *= 40
        rt.wait_for_plan(30)
        rt.before_forward()
        rt.after_forward(c, int(c.sum()))
    rt.close()
    per = 4 * (2 * n + n)
    moved = sum((s + r) * per for s, r, _ in log)
    return {
        "layers": len(log),
        "bytes": moved,
        "runtime_s": sum(x[2] for x in log),
        "plain_s": sum(plain),
        "mb_per_expert": per / 1e6,
    }


def worker(rank: int, store: str, a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from eplb.runtime import Runtime, initial_placement

    torch.set_num_threads(1)
    os.environ["DYNAMIC_EPLB"] = "true"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    # 1. The hot path, DeepSeek-V3's 58 layers x 9 slots per rank, heat collection only.
    cfg = {"dynamic_eplb": True, "num_redundant_experts": 2,
           "expert_heat_collection_interval": 10**6, "algorithm_execution_interval": 1}
    start = initial_placement(cfg, layers=58, experts=16, ranks=2)
    slots = start.shape[1] // 2
    w = [[torch.zeros((slots, 4))] for _ in range(58)]
    rt = Runtime(cfg, layers=58, experts=16, weights=w)
    hp = hot_path(rt, a.calls)
    rt.close()
    dist.barrier()
    ex = [exchange(rank, a.mb_per_expert, 64) for _ in range(a.repeats)]
    if rank == 0:
        print(f"torch {torch.__version__}, gloo, 2 processes, {a.calls} calls per measurement")
        for name, v in hp.items():
            print(f"{name:>24}: {' / '.join(f'{x:.2f}' for x in v)} us per call")
        for i, e in enumerate(ex):
            gbps_rt = e["bytes"] / e["runtime_s"] / 1e9
            gbps_plain = e["bytes"] / e["plain_s"] / 1e9
            print(
                f"exchange run {i + 1}: {e['layers']} layer exchanges, {e['bytes'] / 1e6:.0f} MB "
                f"on rank 0 ({e['mb_per_expert']:.1f} MB per expert): runtime "
                f"{gbps_rt:.2f} GB/s, plain batch_isend_irecv {gbps_plain:.2f} GB/s "
                f"({100 * gbps_rt / gbps_plain:.0f}%)"
            )
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=100_000)
    p.add_argument("--mb-per-expert", type=float, default=4.0)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(os.path.join(tmp, "store"), a), nprocs=2, join=True)


if __name__ == "__main__":
    main()
