"""The fixed cost of one call through the binding, on inputs so small that the Rust work is
negligible: ``eplb.hotness`` and ``Policy("random").rebalance`` on one layer of 8 experts.
Reports the best and the median of ``--calls`` calls, in microseconds.

Usage (from the project root, with the wheel installed):

    python python/bench/bench_call_overhead.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import eplb


def best_and_median(f, calls: int) -> tuple[float, float]:
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[0] * 1e6, times[len(times) // 2] * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    policy = eplb.Policy("random", layers=1, experts=8, ranks=4, redundant=0)
    loads = np.ones((1, 8))
    placement = policy.rebalance(loads).placement
    for what, f in (("hotness", lambda: eplb.hotness(placement, loads)),
                    ("Policy.rebalance", lambda: policy.rebalance(loads))):
        best, median = best_and_median(f, args.calls)
        print(f"{what}, 1 layer x 8 experts: best {best:.1f} us, median {median:.1f} us")


if __name__ == "__main__":
    main()
