"""Times every policy through the Python package on the DeepSeek-V3 golden cases.

One Python process. For each case and policy: the best of ``--reps`` calls of the whole Python
call (numpy in, conversion to Rust buffers, the Rust call with the GIL released, conversion of
the results back to numpy), the Rust policy call alone as measured inside the binding
(``Rebalance.rust_seconds``), the difference (the binding's overhead), the mean PAR, and the
ratio of the published peer time (``research/peer-anchors.md``) to ours. With ``--cli``, the
same cases also go through ``eplb plan --json`` and its ``elapsed_us`` is reported.

Usage (from the project root, with the wheel installed):

    python python/bench/bench_policies.py [--reps 5] [--cli target/release/eplb] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import eplb

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT.parent / "shared" / "data" / "golden"

CASES = [
    ("dsv3_prefill_ep32", "EP32 prefill"),
    ("dsv3_decode_ep32", "EP32 decode"),
    ("dsv3_prefill_ep64", "EP64/320 prefill"),
    ("dsv3_decode_ep64", "EP64/320 decode"),
]

# Published peer times (ms), peer-anchors.md, same case order; the fastest upstream
# implementation of the same algorithm.
PEERS = {
    "deepseek (hier)": ("vllm_hier", [51, 47, 70, 55]),
    "deepseek (global)": ("vllm_global", [58, 51, 62, 69]),
    "default": ("vllm_ascend_default", [208, 275, 445, 358]),
    "swift": ("vllm_ascend_swift", [269, 315, 928, 664]),
    "flashlb": ("vllm_ascend_flashlb", [446, 741, 927, 940]),
    "incremental": ("vllm_ascend_flashlb", [446, 741, 927, 940]),
    "random": (None, None),
}


def load(name):
    path = GOLDEN / f"{name}.json"
    if not path.is_file():
        sys.exit(f"error: {path} is missing (the benchmark reads ../shared relative to the project root)")
    g = json.loads(path.read_text())
    sh = g["shape"]
    return dict(
        layers=sh["num_layers"],
        experts=sh["num_experts"],
        ranks=sh["num_ranks"],
        redundant=sh["num_redundant"],
        groups=sh["num_groups"],
        nodes=sh["num_nodes"],
        loads=np.array(g["input"]["loads"], dtype=np.float64),
        current=np.array(g["input"]["current_placement"], dtype=np.int64),
    )


def make(label, c):
    if label == "deepseek (hier)":
        return eplb.Policy("deepseek", layers=c["layers"], experts=c["experts"], ranks=c["ranks"],
                           redundant=c["redundant"], ranks_per_node=c["ranks"] // c["nodes"],
                           groups=c["groups"])
    name = "deepseek" if label == "deepseek (global)" else label
    return eplb.Policy(name, layers=c["layers"], experts=c["experts"], ranks=c["ranks"],
                       redundant=c["redundant"])


def bench(label, c, reps):
    best_wall, best_rust, last = float("inf"), float("inf"), None
    for _ in range(reps):
        p = make(label, c)  # a fresh state each call: the first-call time, as the peers'
        t0 = time.perf_counter()
        r = p.rebalance(c["loads"], c["current"])
        wall = time.perf_counter() - t0
        best_wall = min(best_wall, wall)
        best_rust = min(best_rust, r.rust_seconds)
        last = r
    return best_wall, best_rust, last


def bench_deepseek_contract(c, reps):
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        eplb.rebalance_experts(c["loads"], c["experts"] + c["redundant"],
                               c["groups"], c["nodes"], c["ranks"])
        best = min(best, time.perf_counter() - t0)
    return best


def cli_elapsed(cli, label, c, reps):
    if label.startswith("deepseek"):
        policy = "deepseek"
    else:
        policy = label
    with tempfile.TemporaryDirectory() as d:
        loads = os.path.join(d, "loads.json")
        with open(loads, "w") as f:
            json.dump(c["loads"].tolist(), f)
        cur = os.path.join(d, "current.json")
        eplb.write_map(cur, c["current"])
        args = [cli, "plan", "--loads", loads, "--ranks", str(c["ranks"]), "--redundant",
                str(c["redundant"]), "--policy", policy, "--current", cur, "--json"]
        if label == "deepseek (hier)":
            args += ["--ranks-per-node", str(c["ranks"] // c["nodes"]), "--groups", str(c["groups"])]
        best = float("inf")
        for _ in range(reps):
            out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
            best = min(best, json.loads(out.strip().splitlines()[-1])["elapsed_us"] / 1e6)
        return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cli", help="the eplb binary, to report `eplb plan --json` elapsed_us too")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    cases = [(load(n), t) for n, t in CASES]
    rows = []
    for label in PEERS:
        for i, (c, title) in enumerate(cases):
            wall, rust, r = bench(label, c, a.reps)
            peer, times = PEERS[label]
            ratio = times[i] / (wall * 1e3) if times else None
            cli = cli_elapsed(a.cli, label, c, a.reps) if a.cli else None
            rows.append((label, title, wall, rust, r.par_after_mean, peer, times[i] if times else None,
                         ratio, cli))
    contract = [bench_deepseek_contract(c, a.reps) for c, _ in cases]

    print(f"eplb {eplb.__version__}, Python {sys.version.split()[0]}, numpy {np.__version__}, "
          f"best of {a.reps}, one process")
    if a.markdown:
        print("\n| policy | case | Python call (ms) | Rust call (ms) | overhead (ms) | mean PAR "
              "| peer | peer (ms) | peer / ours |" + (" `eplb plan` elapsed (ms) |" if a.cli else ""))
        print("|---|---|---|---|---|---|---|---|---|" + ("---|" if a.cli else ""))
    for label, title, wall, rust, par, peer, pt, ratio, cli in rows:
        peer_s = peer or "-"
        pt_s = f"{pt}" if pt else "-"
        ratio_s = f"{ratio:.0f}x" if ratio else "-"
        cli_s = f" {cli * 1e3:.2f} |" if cli is not None else ""
        if a.markdown:
            print(f"| {label} | {title} | {wall * 1e3:.2f} | {rust * 1e3:.2f} | "
                  f"{(wall - rust) * 1e3:.2f} | {par:.4f} | {peer_s} | {pt_s} | {ratio_s} |{cli_s}")
        else:
            print(f"{label:18} {title:17} python {wall * 1e3:8.2f} ms  rust {rust * 1e3:8.2f} ms  "
                  f"overhead {(wall - rust) * 1e3:6.2f} ms  PAR {par:.4f}  {peer_s} {pt_s} ms  "
                  f"{ratio_s}" + (f"  cli {cli * 1e3:.2f} ms" if cli is not None else ""))
    print("\neplb.rebalance_experts (DeepSeek contract, incl. log2phy/logcnt):",
          ", ".join(f"{t}: {s * 1e3:.2f} ms" for (_, t), s in zip(cases, contract)))


if __name__ == "__main__":
    main()
