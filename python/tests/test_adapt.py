"""The native helpers the adapters are glue over (slot keeping, folding, map derivation,
placement repair), against plain numpy statements of what they must do, on seeded random
inputs."""

from __future__ import annotations

import numpy as np
import pytest

import eplb
from eplb import _native

RNG = np.random.default_rng(11)


def random_placement(layers, experts, ranks, slots, rng=RNG):
    out = np.empty((layers, ranks, slots), dtype=np.int64)
    for l in range(layers):
        ids = np.concatenate([np.arange(experts), rng.integers(0, experts, ranks * slots - experts)])
        out[l] = rng.permutation(ids).reshape(ranks, slots)
    return out


@pytest.mark.parametrize("lead", [(), (5,)])
def test_fold_sends_every_slot_load_to_its_expert(lead):
    table = random_placement(3, 10, 4, 3)
    loads = RNG.integers(0, 100, size=lead + table.shape).astype(np.int64)
    got = _native.fold_slot_loads(table, loads, 10)
    want = np.zeros(lead + (3, 10))
    for idx in np.ndindex(*lead) if lead else [()]:
        for l in range(3):
            np.add.at(want[idx + (l,)], table[l].ravel(), loads[idx + (l,)].ravel())
    np.testing.assert_array_equal(got, want)
    with pytest.raises(eplb.EplbError, match="does not end in the table's"):
        _native.fold_slot_loads(table, loads[..., :2], 10)
    with pytest.raises(eplb.EplbError, match="layer 0, rank 0, slot 0: expert 10"):
        bad = table.copy()
        bad[0, 0, 0] = 10
        _native.fold_slot_loads(bad, loads, 10)


def test_derive_maps_lists_each_experts_slots_in_order():
    p = random_placement(4, 12, 4, 4).reshape(4, 16)
    log2phy, logcnt = _native.derive_maps(p, 12)
    assert log2phy.shape == (4, 12, 5) and logcnt.shape == (4, 12)
    for l in range(4):
        for e in range(12):
            ids = np.flatnonzero(p[l] == e)
            assert logcnt[l, e] == len(ids)
            np.testing.assert_array_equal(log2phy[l, e, : len(ids)], ids)
            assert (log2phy[l, e, len(ids):] == -1).all()


def test_repair_current_keeps_what_is_valid_and_fills_the_rest():
    for _ in range(20):
        cur = random_placement(2, 9, 3, 4)
        broken = cur.copy()
        broken[0, 1, 2] = -1
        broken[1, 2, 0] = broken[1, 2, 1]  # a second copy on one rank
        broken[1, 0, 3] = 99  # out of range
        fixed = _native.repair_current(broken, 2, 9, 3, 4)
        for l in range(2):
            assert set(fixed[l].ravel()) == set(range(9)), "every expert has a copy"
            for r in range(3):
                assert len(set(fixed[l, r])) == 4, "no expert twice on a rank"
        # Kept: every in-range entry that is the first of its expert on its rank.
        keep = np.zeros(broken.shape, dtype=bool)
        for l, r, s in np.ndindex(*broken.shape):
            e = broken[l, r, s]
            keep[l, r, s] = 0 <= e < 9 and e not in broken[l, r, :s]
        np.testing.assert_array_equal(fixed[keep], broken[keep])
    assert _native.repair_current(np.zeros((2, 5), np.int64), 2, 9, 3, 4) is None  # another size


def test_keep_slots_keeps_kept_experts_in_their_first_old_slot():
    for _ in range(20):
        old = random_placement(2, 8, 4, 3)
        new = random_placement(2, 8, 4, 3)
        out = _native.keep_slots(old, new)
        for l in range(2):
            for r in range(4):
                o, n, q = old[l, r].tolist(), new[l, r].tolist(), out[l, r].tolist()
                assert sorted(q) == sorted(n)
                for e in set(o) & set(n):
                    assert q[o.index(e)] == e


# --- the pay-off gate's setting: the runtime's parser, eplb check-config's messages ---------------

BAD_GATES = [
    {"model": "gpt-5"},
    {"hardwar": "A3"},
    {"role": "serve", "tokens_per_rank": -1},
    {"calibration": "/nonexistent/calib.json"},
    3,
    "on",
]


@pytest.mark.parametrize("value", BAD_GATES, ids=[str(v) for v in BAD_GATES])
def test_a_bad_gate_setting_has_check_configs_messages(tmp_path, value):
    import json
    import os
    import subprocess

    from eplb.integrations import _common

    with pytest.raises(eplb.EplbError) as e:
        _common.gate_from(json.dumps(value), "EPLB_PAYOFF_GATE")
    ours = str(e.value)
    assert ours.startswith("EPLB_PAYOFF_GATE: eplb_config.eplb_payoff_gate")
    eplb_bin = os.environ.get("EPLB_BIN")
    if not eplb_bin:
        pytest.skip("EPLB_BIN (the eplb CLI) not given; cargo xtask test sets it")
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"eplb_config": {"eplb_payoff_gate": value}}))
    out = subprocess.run([eplb_bin, "check-config", str(cfg)], capture_output=True, text=True)
    assert out.returncode != 0
    prefix = f"error: {cfg}: "
    cli = [line[len(prefix):] for line in out.stderr.splitlines() if line.startswith(prefix)]
    assert cli and ours == "EPLB_PAYOFF_GATE: " + "; ".join(cli)


@pytest.mark.parametrize("value, on", [("true", True), ("false", False), ("", False),
                                       ('{"hardware": "H100", "role": "prefill"}', True)])
def test_a_good_gate_setting(value, on):
    from eplb.integrations import _common

    gate = _common.gate_from(value, "EPLB_PAYOFF_GATE")
    assert (gate is not None) == on
    if on:
        assert gate.summary.startswith("eplb_payoff_gate: on (")


def test_policy_names_and_numbers_come_from_the_rust_parser():
    from eplb.integrations import _common

    assert eplb.POLICIES == ("random", "default", "swift", "flashlb", "incremental", "deepseek")
    assert [_common.canonical(n) for n in ("0", "1", "2", "3", "4", " swift ")] == [
        "random", "default", "swift", "flashlb", "incremental", "swift"]
    for name in eplb.POLICIES:
        assert _common.canonical(name) == name
    for bad in ("5", "Swift", "fastest"):
        with pytest.raises(eplb.EplbError, match=f"unknown policy `{bad}`"):
            _common.canonical(bad)
