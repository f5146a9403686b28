#!/usr/bin/env python3
"""Fingerprints of `eplb simulate --placements-log` on the shared series, every policy.

Usage: scripts/sim_fingerprints.py EPLB_BINARY [--quick]

A fingerprint is FNV-1a 64 of the placements-log bytes with every `"policy_time_s"` member
removed (the policy's wall time is the one non-deterministic number in the log). Prints one line
per case: `series R X extra-options policy fingerprint seconds`. `--quick` runs only the cases
that `eplb-cli/tests/sim_fingerprints.rs` recomputes.
"""
import os, re, subprocess, sys, tempfile, time

SERIES = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "series")
POLICIES = ["static", "random", "default", "swift", "flashlb", "incremental", "deepseek"]
STRIP = re.compile(rb',"policy_time_s":[-0-9.eE+]+')


def cases(quick):
    out = []
    for series, r in [("esft_chain", 8), ("esft_chain", 16), ("dsv3_drift_perm", 32), ("dsv3_drift_perm", 64)]:
        if quick and series != "esft_chain":
            continue
        for p in POLICIES:
            out.append((series, r, "", p))
        if series == "dsv3_drift_perm":
            out.append((series, r, "--ranks-per-node 8 --groups 8", "deepseek"))
    for extra in ["--routing even", "--initial random:7", "--heat-interval 3 --algo-interval 2", "--seed 5"]:
        for p in POLICIES:
            out.append(("esft_chain", 8, extra, p))
    return out


def fnv(b):
    h = 0xCBF29CE484222325
    for x in b:
        h ^= x
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    exe = sys.argv[1]
    quick = "--quick" in sys.argv
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "p.json")
        for series, r, extra, p in cases(quick):
            args = [exe, "simulate", "--trace", os.path.join(SERIES, series + ".json"), "--ranks", str(r),
                    "--redundant", str(r), "--policy", p, "--placements-log", log]
            if "--heat-interval" not in extra:
                args += ["--heat-interval", "10", "--algo-interval", "1"]
            args += extra.split()
            t = time.time()
            subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
            dt = time.time() - t
            data = STRIP.sub(b"", open(log, "rb").read())
            print(f"{series} {r} {r} [{extra}] {p} {fnv(data):016x} {dt:.2f}", flush=True)


main()
