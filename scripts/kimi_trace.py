#!/usr/bin/env python3
"""A Kimi-K2-shaped synthetic eplb-trace/v1 (61 MoE layers x 384 experts, top-8, 100 windows of
16384 tokens) for the simulator's scale benchmark. Deterministic (seed 1): each layer has a
Zipf-like expert popularity (exponent 0.9, a per-layer random order), which drifts to a new
order at windows 25, 50 and 75; each window's count of an expert is its expected share of the
16384 x 8 assignments times a Gaussian factor (1 + 0.1 z), rounded, the rest given to the most
popular expert so that a window sums to 16384 x 8 (no numpy needed).

Usage: scripts/kimi_trace.py OUT.json
"""
import json, random, sys

L, N, T, TOKENS, TOPK = 61, 384, 100, 16384, 8


def main():
    rng = random.Random(1)
    counts = []
    orders = None
    for w in range(T):
        if w % 25 == 0:
            orders = []
            for _ in range(L):
                o = list(range(N))
                rng.shuffle(o)
                orders.append(o)
        win = []
        for l in range(L):
            weights = [0.0] * N
            for rank, e in enumerate(orders[l]):
                weights[e] = 1.0 / (rank + 1) ** 0.9
            total = sum(weights)
            c = [max(0, round(TOKENS * TOPK * x / total * (1 + 0.1 * rng.gauss(0, 1)))) for x in weights]
            # The window holds exactly TOKENS x TOPK assignments: the rounding rest goes to the
            # most popular expert.
            c[orders[l][0]] += TOKENS * TOPK - sum(c)
            win.append(c)
        counts.append(win)
    doc = {
        "format": "eplb-trace/v1",
        "name": "kimi_k2_synthetic",
        "model": {"name": "Kimi-K2-shaped (synthetic)", "num_moe_layers": L, "num_experts": N, "top_k": TOPK},
        "phase": "mixed",
        "workload": "synthetic: Zipf(0.9) popularity per layer, reordered at windows 25, 50, 75",
        "unit": "number of (token, routed expert) assignments",
        "num_windows": T,
        "window": f"{TOKENS} tokens",
        "window_tokens": [TOKENS] * T,
        "counts": counts,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, separators=(",", ":"))


main()
