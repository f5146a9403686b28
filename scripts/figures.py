#!/usr/bin/env python3
"""The figures README.md and BENCHMARKS.md quote, regenerated from one place.

    python3 scripts/figures.py --eplb target/release/eplb --write   # rewrite the marked parts
    python3 scripts/figures.py --eplb target/debug/eplb --check     # the gate: equal, or exit 1

Each figure lives between two markers in a Markdown file,
``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->``; ``--write`` replaces what is between
them with what this script computes, ``--check`` (a step of `cargo xtask docs`, in the gate)
fails with a diff when they differ. Only deterministic figures are generated (placement
quality: PAR, fetches; the `eplb advise` transcript of the vendored trace, whose numbers come
from the time model, not a clock); timings are measured by hand and written outside the markers
(`BENCHMARKS.md` says how).

Inputs: Zipf heat made here (the generator of `BENCHMARKS.md`, "The incremental policy at wide
EP"), the golden DeepSeek-V3 cases of `../shared/data/golden` (their loads, the default layout;
upstream FlashLB's PAR is the golden file's own `vllm_ascend_flashlb` metric), the vendored
ESFT trace `data/esft_chain.json`, the DeepSeek-V3 drift series
`../shared/data/series/dsv3_drift_perm.json` (the dynamic loop: `eplb simulate --json`) and the
published rows of `../shared/research/dynamic-anchors.md` (upstream FlashLB and the clairvoyant
cycle in that loop, which `eplb simulate` does not compute).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT.parent / "shared" / "data" / "golden"
SERIES = ROOT.parent / "shared" / "data" / "series"
ANCHORS = ROOT.parent / "shared" / "research" / "dynamic-anchors.md"

#: Zipf shapes: (name, layers, experts, ranks); X = R.
ZIPF = [
    ("DeepSeek-V3 58x256, EP32", "dsv3", 58, 256, 32),
    ("DeepSeek-V3 58x256, EP64", "dsv3", 58, 256, 64),
    ("DeepSeek-V3 58x256, EP128", "dsv3", 58, 256, 128),
    ("DeepSeek-V3 58x256, EP256", "dsv3", 58, 256, 256),
    ("Kimi-K2 61x384, EP384", "kimi", 61, 384, 384),
]
GOLDEN_CASES = ["dsv3_prefill_ep32", "dsv3_decode_ep32", "dsv3_prefill_ep64", "dsv3_decode_ep64",
                "dsv3_drift_ep32"]
#: The dynamic loop of `BENCHMARKS.md`, "Every policy in the dynamic loop, next to the anchors":
#: (label, series name, trace, ranks = redundant experts, the anchors' section id).
DYNAMIC = [
    ("esft_chain R8 X8", "ESFT", ROOT / "data" / "esft_chain.json", 8, "esft_chain_r8x8"),
    ("esft_chain R16 X16", "ESFT", ROOT / "data" / "esft_chain.json", 16, "esft_chain_r16x16"),
    ("dsv3_drift_perm R32 X32", "DeepSeek-V3 drift", SERIES / "dsv3_drift_perm.json", 32,
     "dsv3_drift_r32x32_perm"),
    ("dsv3_drift_perm R64 X64", "DeepSeek-V3 drift", SERIES / "dsv3_drift_perm.json", 64,
     "dsv3_drift_r64x64_perm"),
]
#: The loop's cadence: a new placement from every 10 windows of heat, active one window later.
SIMULATE = ["--heat-interval", "10", "--algo-interval", "1", "--json"]
ADVISE = ["advise", "--trace", "data/esft_chain.json", "--ranks", "8", "--policies",
          "flashlb,incremental", "--heat-intervals", "10,20", "--algo-intervals", "1",
          "--config-out", "eplb_config.json"]


def zipf(layers: int, experts: int, path: Path) -> None:
    """`BENCHMARKS.md`'s Zipf heat (exponent 1, a seeded permutation per layer)."""
    rng = random.Random(19)
    rows = []
    for _ in range(layers):
        perm = list(range(experts))
        rng.shuffle(perm)
        row = [0] * experts
        for k, e in enumerate(perm):
            row[e] = int(1e6 / (k + 1) ** 1.0)
        rows.append(row)
    path.write_text(json.dumps(rows))


def plan(eplb: str, loads: Path, ranks: int, policy: str) -> tuple:
    """Mean PAR after (even split, as `eplb plan --json` reports) and fetches of one call."""
    out = subprocess.run(
        [eplb, "plan", "--loads", str(loads), "--ranks", str(ranks), "--redundant", str(ranks),
         "--policy", policy, "--json"],
        capture_output=True, text=True, check=True,
    )
    r = json.loads(out.stdout)
    pa = r["par_after"]
    return sum(pa) / len(pa), r["moves"]


def simulate(eplb: str, trace: Path, ranks: int, policy: str) -> dict:
    """The figures of one `eplb simulate --json` run of the dynamic loop."""
    if not trace.is_file():
        raise SystemExit(f"error: missing {trace} (the figures read ../shared)")
    out = subprocess.run(
        [eplb, "simulate", "--trace", str(trace), "--ranks", str(ranks), "--redundant", str(ranks),
         "--policy", policy, *SIMULATE],
        capture_output=True, text=True, check=True,
    )
    r = json.loads(out.stdout)
    return {
        "par": r["mean_par_from_first_activation"],
        "fetches": r["moves_total"],
        "colocated": r["same_rank_duplicate_rows_max"],
        "changes": r["changes"],
    }


def anchor_par(section: str, row: str) -> float:
    """The published `mean PAR w>=11` of the row starting with `row` in the section of
    `dynamic-anchors.md` whose heading ends with (`section`)."""
    if not ANCHORS.is_file():
        raise SystemExit(f"error: missing {ANCHORS} (the figures read ../shared)")
    lines = ANCHORS.read_text().splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith("### ") and line.endswith(f"(`{section}`)")), None)
    if start is None:
        raise SystemExit(f"error: no section `{section}` in {ANCHORS}")
    column = None
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None and "mean PAR w>=11" in cells:
            column = cells.index("mean PAR w>=11")
        elif column is not None and cells[0].startswith(row):
            return float(cells[column])
    raise SystemExit(f"error: no row '{row}' with a 'mean PAR w>=11' in section `{section}` of "
                     f"{ANCHORS}")


def compute(eplb: str) -> dict:
    """Every generated part, by marker name."""
    tmp = Path(tempfile.mkdtemp(prefix="eplb-figures-"))
    try:
        return _compute(eplb, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _compute(eplb: str, tmp: Path) -> dict:
    for name, layers, experts in (("dsv3", 58, 256), ("kimi", 61, 384)):
        zipf(layers, experts, tmp / f"{name}.json")
    zipf_rows = {}
    for label, heat, _, _, ranks in ZIPF:
        zipf_rows[label] = {p: plan(eplb, tmp / f"{heat}.json", ranks, p)
                            for p in ("flashlb", "deepseek", "incremental")}
    golden_rows = {}
    for case in GOLDEN_CASES:
        path = GOLDEN / f"{case}.json"
        if not path.is_file():
            raise SystemExit(f"error: missing {path} (the figures read ../shared)")
        doc = json.loads(path.read_text())
        loads = tmp / f"{case}.json"
        loads.write_text(json.dumps(doc["input"]["loads"]))
        ranks = doc["input"]["num_ranks"]
        par = doc["expected"]["vllm_ascend_flashlb"]["metrics"]["par"]
        golden_rows[case] = {
            "upstream": sum(par) / len(par),
            "flashlb": plan(eplb, loads, ranks, "flashlb"),
            "incremental": plan(eplb, loads, ranks, "incremental"),
        }
    # The eight loop runs take most of the time (about 40 s with the gate's debug binary): two at
    # once, one per core; each run is deterministic and lands under its own key.
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {(label, policy): pool.submit(simulate, eplb, trace, ranks, policy)
                for label, _, trace, ranks, _ in DYNAMIC for policy in ("incremental", "flashlb")}
        dynamic_rows = {
            label: {
                "series": series,
                "ranks": ranks,
                "incremental": runs[label, "incremental"].result(),
                "flashlb": runs[label, "flashlb"].result(),
                "upstream": anchor_par(section, "vllm-ascend FlashLB"),
                "clairvoyant": anchor_par(section, "clairvoyant cycle"),
            }
            for label, series, _, ranks, section in DYNAMIC
        }
    work = tmp / "advise"
    work.mkdir()
    (work / "data").symlink_to(ROOT / "data")
    adv = subprocess.run([eplb, *ADVISE], cwd=work, capture_output=True, text=True, check=True)
    # Block parts stand on lines of their own between the markers; the sentence is inline.
    parts = {
        "policy-tables": "\n" + policy_tables(zipf_rows, golden_rows) + "\n",
        "readme-standing": readme_standing(zipf_rows, golden_rows),
        "dynamic-table": "\n" + dynamic_table(dynamic_rows) + "\n",
        "readme-dynamic": readme_dynamic(dynamic_rows),
        "readme-advise": "\n```text\n$ eplb " + " ".join(ADVISE[:9]) + " \\\n    "
        + " ".join(ADVISE[9:]) + "\n" + adv.stdout + "```\n",
    }
    return parts


def f4(x: float) -> str:
    return f"{x:.4f}"


def span(xs) -> str:
    lo, hi = f4(min(xs)), f4(max(xs))
    return lo if lo == hi else f"{lo}-{hi}"


def policy_tables(zipf_rows: dict, golden_rows: dict) -> str:
    out = [
        "One `eplb plan --loads F --ranks R --redundant R --policy P --json` call from the default",
        "layout; PAR is the mean over layers of `par_after` (even split over the copies), fetches",
        "are `moves`. Zipf heat as generated in \"The incremental policy at wide EP\" (below);",
        "`incremental` is `eplb plan`'s default (`cold_start = 1` from the default layout).",
        "",
        "| shape | flashlb PAR, fetches | deepseek PAR, fetches | incremental PAR, fetches |",
        "| --- | --- | --- | --- |",
    ]
    for label, row in zipf_rows.items():
        cells = [f"{f4(row[p][0])}, {row[p][1]:,}" for p in ("flashlb", "deepseek", "incremental")]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out += [
        "",
        "The golden DeepSeek-V3 cases (`../shared/data/golden`, their `input.loads`, default layout;",
        "upstream FlashLB's PAR is the golden file's `vllm_ascend_flashlb` metric):",
        "",
        "| case | vLLM-Ascend FlashLB PAR | flashlb (ours) PAR, fetches | incremental PAR, fetches |",
        "| --- | --- | --- | --- |",
    ]
    for case, row in golden_rows.items():
        out.append(
            f"| {case} | {f4(row['upstream'])} | {f4(row['flashlb'][0])}, {row['flashlb'][1]:,} | "
            f"{f4(row['incremental'][0])}, {row['incremental'][1]:,} |"
        )
    return "\n".join(out)


def readme_standing(zipf_rows: dict, golden_rows: dict) -> str:
    ep32 = zipf_rows["DeepSeek-V3 58x256, EP32"]
    ep384 = zipf_rows["Kimi-K2 61x384, EP384"]
    labels = list(zipf_rows)
    # The first shape from which on the incremental policy balances better than FlashLB.
    first = next((i for i in range(len(labels))
                  if all(zipf_rows[k]["incremental"][0] < zipf_rows[k]["flashlb"][0]
                         for k in labels[i:])), None)
    ep = lambda label: label.rsplit(" ", 1)[-1]  # noqa: E731
    if first == 0:
        who = "; it balances better than FlashLB on every shape"
    elif first is None:
        who = "; FlashLB balances better on every shape"
    else:
        who = (f"; FlashLB balances slightly better up to {ep(labels[first - 1])}, the incremental "
               f"policy from {ep(labels[first])} on")
    inc_g = [r["incremental"][0] for r in golden_rows.values()]
    fl_g = [r["flashlb"][0] for r in golden_rows.values()]
    up_g = [r["upstream"] for r in golden_rows.values()]
    fewer = all(r["incremental"][1] < r["flashlb"][1] for r in zipf_rows.values())
    return (
        f"From the default layout one call on Zipf heat reaches PAR {f4(ep32['incremental'][0])} "
        f"at DeepSeek-V3 EP32 (our FlashLB: {f4(ep32['flashlb'][0])}) and "
        f"{f4(ep384['incremental'][0])} at Kimi-K2 EP384 (FlashLB: {f4(ep384['flashlb'][0])})"
        + who
        + (", always with fewer fetches" if fewer else "")
        + f". On the golden DeepSeek-V3 cases it reaches {span(inc_g)} and our FlashLB, "
        f"polished since issue 28, {span(fl_g)}, against upstream FlashLB's {span(up_g)} "
        "(`BENCHMARKS.md`, \"Figures the README quotes\")."
    )


def dynamic_table(rows: dict) -> str:
    out = [
        "`eplb simulate --trace T --ranks R --redundant R --policy P --heat-interval 10",
        "--algo-interval 1 --json`, T the vendored `data/esft_chain.json` or",
        "`../shared/data/series/dsv3_drift_perm.json`. PAR is `mean_par_from_first_activation`",
        "(mean PAR w>=11), fetches `moves_total`, co-located `same_rank_duplicate_rows_max` (the",
        "most rows of one layer holding two copies of an expert on one rank). vLLM-Ascend's FlashLB",
        "and the clairvoyant cycle (each placement solved on the windows it serves) are the",
        "published rows of `../shared/research/dynamic-anchors.md` (`eplb simulate` runs neither).",
        "",
        "| case | incremental PAR, fetches, co-located | flashlb (ours) PAR, fetches, co-located "
        "| incremental fetches / flashlb's | vLLM-Ascend FlashLB PAR | clairvoyant cycle PAR |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for label, r in rows.items():
        inc, fl = r["incremental"], r["flashlb"]
        out.append(
            f"| {label} | {f4(inc['par'])}, {inc['fetches']:,}, {inc['colocated']} | "
            f"{f4(fl['par'])}, {fl['fetches']:,}, {fl['colocated']} | "
            f"{pct(inc['fetches'] / fl['fetches'])} | {f4(r['upstream'])} | {f4(r['clairvoyant'])} |"
        )
    return "\n".join(out)


def pct(x: float) -> str:
    return f"{round(100 * x)}%"


def readme_dynamic(rows: dict) -> str:
    """The README's sentence on the dynamic loop; every claim in it is tested here."""
    series = list(dict.fromkeys(r["series"] for r in rows.values()))
    better = lambda r: (r["incremental"]["par"] < r["flashlb"]["par"]  # noqa: E731
                        and r["incremental"]["par"] < r["upstream"])
    wins = [s for s in series if all(better(r) for r in rows.values() if r["series"] == s)]
    if wins == series:
        where = f"on the {' and '.join(series)} series"
    elif wins:
        where = (f"on the {' and '.join(wins)} series (not on every case of the "
                 f"{' and '.join(s for s in series if s not in wins)} series)")
    else:
        where = None
    # More than half-way from FlashLB (ours and upstream's) to the clairvoyant cycle, or past it.
    nearer = all(r["incremental"]["par"] < (fl + r["clairvoyant"]) / 2
                 for r in rows.values() for fl in (r["flashlb"]["par"], r["upstream"]))
    below = [label for label, r in rows.items() if r["incremental"]["par"] < r["clairvoyant"]]
    ratios = [r["incremental"]["fetches"] / r["flashlb"]["fetches"] for r in rows.values()]
    lo, hi = pct(min(ratios)), pct(max(ratios))
    colocated = max(r["incremental"]["colocated"] for r in rows.values())
    pars = "; ".join(
        f"{s} " + ", ".join(f"EP{r['ranks']} {f4(r['incremental']['par'])} / "
                            f"{f4(r['flashlb']['par'])}"
                            for r in rows.values() if r["series"] == s)
        for s in series
    )
    head = ("in the dynamic loop our `incremental` policy "
            + (f"balances better than vLLM-Ascend's FlashLB (its published rows and our "
               f"re-implementation) {where}" if where else
               "does not balance better than vLLM-Ascend's FlashLB on any series"))
    return (
        head
        + f" (mean PAR from the first activation, ours / our FlashLB: {pars})"
        + (", more than half-way from FlashLB to the clairvoyant cycle" if nearer else "")
        + (f" (below it on {', '.join(below)})" if nearer and below else "")
        + f", with {lo if lo == hi else lo[:-1] + '-' + hi} of our FlashLB's weight fetches, and "
        + ("never co-locates replicas" if colocated == 0
           else f"co-locates replicas in up to {colocated} rows of a layer")
        + " (`BENCHMARKS.md`, \"Figures the README quotes\")."
    )


MARK = re.compile(r"(<!-- figures:(?P<name>[a-z0-9-]+) -->)(?P<body>.*?)(<!-- /figures:(?P=name) -->)", re.S)


def render(text: str, parts: dict) -> tuple:
    """`text` with every marked part replaced; and the names found."""
    found = []

    def sub(m):
        name = m.group("name")
        found.append(name)
        if name not in parts:
            raise SystemExit(f"error: unknown figures marker {name}")
        return m.group(1) + parts[name] + m.group(4)

    return MARK.sub(sub, text), found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eplb", required=True)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = ap.parse_args()
    parts = compute(str(Path(args.eplb).resolve()))
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md"]
    seen = set()
    stale = []
    for f in files:
        old = f.read_text()
        new, found = render(old, parts)
        seen.update(found)
        if new != old:
            if args.write:
                f.write_text(new)
                print(f"wrote {f.relative_to(ROOT)}")
            else:
                stale.append(f)
                sys.stdout.writelines(difflib.unified_diff(
                    old.splitlines(True), new.splitlines(True),
                    f"{f.relative_to(ROOT)} (as committed)", f"{f.relative_to(ROOT)} (regenerated)"))
    missing = set(parts) - seen
    if missing:
        print(f"error: no marker for {sorted(missing)} in README.md or BENCHMARKS.md", file=sys.stderr)
        return 1
    if stale:
        print(f"error: figures out of date in {', '.join(str(f.relative_to(ROOT)) for f in stale)}; "
              "run python3 scripts/figures.py --eplb target/release/eplb --write", file=sys.stderr)
        return 1
    if args.check:
        print(f"figures: {len(parts)} parts up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
