"""eplb.integrations.vllm_ascend against our stand-in of vLLM-Ascend 0.23's MRv1 policy factory
and planner (written from the documented interface: research/python-integration.md §2). The
test reimplements the planner's per-layer guard and asserts that no layer would be reverted."""

from __future__ import annotations

import logging
import os
import pickle
import types

import numpy as np
import pytest

import eplb
from conftest import DSV3_CASES, FakeTensor, bf16_tensor, even_par, golden, install_modules
from eplb.integrations import vllm_ascend as adapter


class StandInUpstreamPolicy:
    def __init__(self, policy_type):
        self.policy_type = policy_type

    def rebalance_experts(self, current_expert_table, expert_workload):
        return 0, [], current_expert_table


class Env:
    def __init__(self):
        self.warm_ups = 0
        self.additional_config = {}


@pytest.fixture
def ascend(monkeypatch, fake_torch):
    env = Env()
    factory = types.ModuleType(adapter.FACTORY_MODULE)
    flashlb = types.ModuleType(adapter.FLASHLB_MODULE)

    def warm_up():
        env.warm_ups += 1

    flashlb.warm_up = warm_up

    class PolicyFactory:
        @staticmethod
        def generate_policy(policy_type):
            if policy_type == 3:
                # The factory looks the module up by name each time, as upstream's does.
                import sys

                sys.modules[adapter.FLASHLB_MODULE].warm_up()
            return StandInUpstreamPolicy(policy_type)

    factory.PolicyFactory = PolicyFactory
    config = types.ModuleType("vllm_ascend.ascend_config")
    config.get_ascend_config = lambda: types.SimpleNamespace(
        vllm_config=types.SimpleNamespace(additional_config=env.additional_config)
    )
    install_modules(
        monkeypatch,
        {
            adapter.FACTORY_MODULE: factory,
            adapter.FLASHLB_MODULE: flashlb,
            "vllm_ascend.ascend_config": config,
        },
    )
    monkeypatch.delenv("EPLB_POLICY", raising=False)
    monkeypatch.delenv("EPLB_POLICY_PARAMS", raising=False)
    env.factory = PolicyFactory
    env.flashlb = flashlb
    return env


def guard(old: np.ndarray, new: np.ndarray) -> list:
    """The layers vLLM-Ascend's planner would revert: an expert lost, an expert twice on one
    rank, or a kept expert that changed slot on its rank."""
    reverted = []
    layers, ranks, slots = old.shape
    for l in range(layers):
        bad = set(old[l].ravel().tolist()) - set(new[l].ravel().tolist())
        for r in range(ranks):
            row_o, row_n = old[l, r].tolist(), new[l, r].tolist()
            if len(set(row_n)) != len(row_n):
                bad.add("dup")
            for s, e in enumerate(row_n):
                if e in row_o and row_o.index(e) != s:
                    bad.add("slot")
        if bad:
            reverted.append(l)
    return reverted


def do_update(policy, table: np.ndarray, workload):
    """Our stand-in of the planner's use: only element 2 of the triple is used."""
    changed, priority, new = policy.rebalance_experts(FakeTensor(table), workload)
    new = new.numpy() if isinstance(new, FakeTensor) else np.asarray(new)
    assert new.shape == table.shape
    return changed, priority, new


def slot_loads(c):
    counts = np.stack([np.bincount(c.current[l].ravel(), minlength=c.experts) for l in range(c.layers)])
    per_copy = c.loads / counts
    return np.stack([per_copy[l][c.current[l]] for l in range(c.layers)]).round().astype(np.int64)


@pytest.mark.parametrize("name", DSV3_CASES + ["esft_law_ep8"])
@pytest.mark.parametrize("policy", ["default", "swift", "incremental", "flashlb", "random"])
def test_types_1_and_2_no_layer_reverted(ascend, name, policy):
    ascend.additional_config["eplb_rs"] = {"policy": policy, "params": {}}
    assert adapter.register()
    c = golden(name)
    for policy_type in (1, 2):
        p = ascend.factory.generate_policy(policy_type)
        assert isinstance(p, adapter.Policy) and p.policy == policy
        load = FakeTensor(slot_loads(c))
        changed, priority, new = do_update(p, c.current, load)
        assert guard(c.current, new) == []
        assert new.dtype == np.int64
        if policy != "random":
            assert even_par(new, c.loads).mean() <= even_par(c.current, c.loads).mean()
        layer_changed = (new != c.current).reshape(c.layers, -1).any(axis=1)
        assert changed == int(layer_changed.any())
        assert sorted(np.asarray(priority).tolist()) == np.flatnonzero(layer_changed).tolist()
    assert ascend.warm_ups == 0


@pytest.mark.parametrize("policy", ["flashlb", "incremental", "default"])
def test_type_3_multi_stage_loads_and_no_warm_up(ascend, policy, monkeypatch):
    monkeypatch.setenv("EPLB_POLICY", policy)
    assert adapter.register()
    c = golden("esft_intent_ep16")
    p = ascend.factory.generate_policy(3)
    assert isinstance(p, adapter.Policy)
    assert ascend.warm_ups == 0
    ascend.flashlb.warm_up()  # the planner's start-up call: now a no-op
    assert ascend.warm_ups == 0
    # [L, R, H, S] int32 as gathered, handed over as a permuted [H, L, R, S] view.
    h = 8
    counts = np.stack([np.bincount(c.current[l].ravel(), minlength=c.experts) for l in range(c.layers)])
    win = c.windows[-h:]
    per_slot = np.stack([(win[:, l] / counts[l])[:, c.current[l]] for l in range(c.layers)])
    gathered = np.ascontiguousarray(per_slot.transpose(0, 2, 1, 3)).round().astype(np.int32)
    workload = FakeTensor(gathered).permute(2, 0, 1, 3)
    assert not workload.is_contiguous() and workload.shape == (h, c.layers, c.ranks, c.slots)
    _, _, new = do_update(p, c.current, workload)
    assert guard(c.current, new) == []


def test_no_selection_defers_to_upstream(ascend):
    assert adapter.register()
    p = ascend.factory.generate_policy(1)
    assert isinstance(p, StandInUpstreamPolicy)
    p = ascend.factory.generate_policy(3)
    assert isinstance(p, StandInUpstreamPolicy) and ascend.warm_ups == 1


def test_deepseek_is_refused_with_a_warning(ascend, caplog):
    ascend.additional_config["eplb_rs"] = {"policy": "deepseek"}
    adapter.register()
    with caplog.at_level(logging.WARNING, logger="vllm.eplb_rs"):
        p = ascend.factory.generate_policy(1)
    assert isinstance(p, StandInUpstreamPolicy)
    assert "two copies of an expert on one NPU" in caplog.text


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"policy": "incremental", "params": {"bogus": 1}}, "unknown parameter `bogus`"),
        ({"policy": "nope"}, "unknown policy `nope`"),
        ({"policy": "swift", "extra": 1}, "unknown key `extra`"),
        ("swift", "must be"),
    ],
)
def test_bad_config_keeps_upstream_and_logs(ascend, caplog, cfg, message):
    ascend.additional_config["eplb_rs"] = cfg
    adapter.register()
    with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
        p = ascend.factory.generate_policy(2)
    assert isinstance(p, StandInUpstreamPolicy)
    assert message in caplog.text


def test_changed_factory_signature_is_left_alone(ascend, caplog):
    original = ascend.factory.generate_policy

    def generate_policy(policy_type, config):
        return original(policy_type)

    ascend.factory.generate_policy = staticmethod(generate_policy)
    with caplog.at_level(logging.WARNING, logger="vllm.eplb_rs"):
        assert not adapter.register()
    assert ascend.factory.generate_policy is generate_policy
    assert "keeping vLLM-Ascend's own EPLB policies" in caplog.text


def test_register_is_idempotent_and_called_by_the_vllm_entry_point(ascend, monkeypatch):
    from eplb.integrations import vllm

    vllm.register()
    first = ascend.factory.generate_policy
    assert getattr(first, "__eplb_rs__", False)
    vllm.register()
    assert ascend.factory.generate_policy is first


def test_policy_pickles_and_works_after_fork(ascend):
    ascend.additional_config["eplb_rs"] = {"policy": "incremental", "params": {"movers": 8}}
    adapter.register()
    p = ascend.factory.generate_policy(2)
    c = golden("dsv3_decode_ep32")
    load = FakeTensor(slot_loads(c))
    _, _, want = do_update(p, c.current, load)
    q = pickle.loads(pickle.dumps(p))
    assert q.params == {"movers": 8}
    _, _, got = do_update(q, c.current, load)
    np.testing.assert_array_equal(got, want)
    if not hasattr(os, "fork"):
        return
    fresh = pickle.loads(pickle.dumps(p))
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _, _, child = do_update(fresh, c.current, load)
            os.write(wfd, b"1" if np.array_equal(child, want) else b"0")
        finally:
            os._exit(0)
    os.close(wfd)
    assert os.read(rfd, 1) == b"1"
    os.waitpid(pid, 0)


def test_keep_slots():
    old = np.array([[[0, 1, 2], [3, 4, 5]]])
    new = np.array([[[2, 6, 0], [5, 3, 7]]])
    out = adapter.keep_slots(old, new)
    np.testing.assert_array_equal(out, [[[0, 6, 2], [3, 7, 5]]])
    for r in range(2):
        assert set(out[0, r].tolist()) == set(new[0, r].tolist())


def test_a_failing_call_keeps_the_table_and_logs(ascend, caplog):
    ascend.additional_config["eplb_rs"] = {"policy": "swift"}
    adapter.register()
    p = ascend.factory.generate_policy(2)
    c = golden("esft_law_ep8")
    bad = slot_loads(c)
    bad[3, 1, 2] = -5  # a negative load: the planner loop must go on
    with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
        changed, priority, new = do_update(p, c.current, FakeTensor(bad))
    assert changed == 0 and len(priority) == 0
    np.testing.assert_array_equal(new, c.current)
    # vLLM-Ascend's own policy of the type (the stand-in keeps the table) plans the cycle.
    assert "layer 3" in caplog.text and "vLLM-Ascend's own policy 2 plans this cycle" in caplog.text


def test_out_of_range_params_fail_at_selection(ascend, caplog):
    ascend.additional_config["eplb_rs"] = {"policy": "incremental", "params": {"movers": 0}}
    adapter.register()
    with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
        p = ascend.factory.generate_policy(2)
    assert isinstance(p, StandInUpstreamPolicy)
    assert "`movers` = 0 is out of range" in caplog.text


def _bad_inputs(c):
    table = c.current
    sl = slot_loads(c)
    layers, ranks, slots = table.shape
    return {
        "workload [L, R, S-1]": (table, sl[:, :, :-1]),
        "workload [H, L+1, R, S]": (table, np.zeros((2, layers + 1, ranks, slots), np.int32)),
        "workload [R, S]": (table, sl[0]),
        "float table": (table.astype(np.float64), sl),
        "negative id": (np.where(table == 0, -1, table), sl),
        "complex workload": (table, sl.astype(np.complex64)),
        "string workload": (table, sl.astype(str)),
        "NaN workload": (table, np.where(sl == sl.max(), np.nan, sl.astype(np.float64))),
    }


@pytest.mark.parametrize("policy", ["default", "swift", "incremental", "flashlb"])
def test_no_input_raises_into_the_engines_loop(ascend, policy, caplog):
    c = golden("esft_law_ep8")
    p = adapter.Policy(policy)
    for what, (table, workload) in _bad_inputs(c).items():
        t = FakeTensor(table)
        with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
            changed, priority, new = p.rebalance_experts(t, workload)
        assert changed == 0 and len(priority) == 0, what
        assert new is t, what  # the engine's own table, untouched
        assert "vLLM-Ascend's own policy 1 plans this cycle" in caplog.text, what
        caplog.clear()


def test_bfloat16_workload_is_planned_by_our_policy(ascend, caplog):
    """A bfloat16 workload tensor is read through ``.float()``, as vLLM-Ascend's own policies
    read it: our policy plans it exactly as its float32 values, with no fallback."""
    c = golden("esft_law_ep8")
    p = adapter.Policy("swift")
    sl = slot_loads(c)
    with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
        a = p.rebalance_experts(FakeTensor(c.current), bf16_tensor(sl))
        b = p.rebalance_experts(FakeTensor(c.current), bf16_tensor(sl).float())
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert a[0] == 1 and b[0] == 1  # it planned a change
    np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b[1]))
    np.testing.assert_array_equal(a[2].numpy(), b[2].numpy())


def test_when_the_own_policy_fails_too_the_table_is_kept(ascend, caplog):
    class Broken:
        def rebalance_experts(self, current_expert_table, expert_workload):
            raise RuntimeError("upstream broke")

    ascend.factory.generate_policy = staticmethod(lambda policy_type: Broken())
    ascend.additional_config["eplb_rs"] = {"policy": "swift"}
    adapter.register()
    p = ascend.factory.generate_policy(2)
    assert isinstance(p, adapter.Policy)
    c = golden("esft_law_ep8")
    t = FakeTensor(c.current)
    with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
        changed, priority, new = p.rebalance_experts(
            t, FakeTensor(slot_loads(c).astype(np.complex64)))
    assert changed == 0 and len(priority) == 0 and new is t
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert "failed too (RuntimeError: upstream broke)" in errors[0]
    assert "the placement is kept this cycle" in errors[0]


def _skewed_case():
    layers, ranks, slots, experts = 4, 4, 6, 16
    table = np.tile(np.arange(ranks * slots) % experts, (layers, 1)).reshape(layers, ranks, slots)
    loads = np.ones((layers, experts), dtype=np.int64) * 10
    loads[:, [3, 9]] = 4000
    counts = np.stack([np.bincount(table[l].ravel(), minlength=experts) for l in range(layers)])
    sl = np.stack([(loads[l] // counts[l])[table[l]] for l in range(layers)])
    return table, sl


@pytest.mark.parametrize("source", ["config", "env"])
@pytest.mark.parametrize("gate, moves", [
    ({"tokens_per_rank": 0.0001}, False),  # almost no token per rank: a move saves ~nothing
    ({"hardware": "950DT", "tokens_per_rank": 100000}, True),
])
def test_the_payoff_gate_keeps_layers_that_do_not_pay(ascend, monkeypatch, caplog, source, gate,
                                                       moves):
    import json

    table, sl = _skewed_case()
    free = adapter.Policy("default").rebalance_experts(FakeTensor(table), FakeTensor(sl))
    assert free[0] == 1 and len(free[1]) == 4  # without the gate every layer moves
    ascend.additional_config["eplb_rs"] = {"policy": "default"}
    if source == "config":
        ascend.additional_config["eplb_rs"]["payoff_gate"] = gate
    else:
        monkeypatch.setenv("EPLB_PAYOFF_GATE", json.dumps(gate))
    adapter.register()
    with caplog.at_level(logging.INFO, logger="vllm.eplb_rs"):
        p = ascend.factory.generate_policy(1)
        p = pickle.loads(pickle.dumps(p))  # the planner process gets a copy
        changed, priority, new = do_update(p, table, FakeTensor(sl))
    assert "eplb_payoff_gate: on" in caplog.text
    if moves:
        np.testing.assert_array_equal(new, free[2].numpy() if hasattr(free[2], "numpy") else free[2])
        assert "0 of 4 changed layers kept" in caplog.text
    else:
        assert changed == 0 and len(priority) == 0
        np.testing.assert_array_equal(new, table)
        assert "4 of 4 changed layers kept" in caplog.text


def test_a_bad_gate_is_logged_once_and_the_policy_runs_without_it(ascend, caplog):
    table, sl = _skewed_case()
    ascend.additional_config["eplb_rs"] = {"policy": "default", "payoff_gate": {"hardwar": "A3"}}
    adapter.register()
    with caplog.at_level(logging.INFO, logger="vllm.eplb_rs"):
        p = ascend.factory.generate_policy(1)
        changed, _, new = do_update(p, table, FakeTensor(sl))
    assert isinstance(p, adapter.Policy) and changed == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        'eplb: additional_config["eplb_rs"]["payoff_gate"]: eplb_config.eplb_payoff_gate: '
        'unknown key "hardwar"; expected one of model, hardware, role, tokens_per_rank, '
        'calibration (did you mean "hardware"?); vLLM-Ascend runs eplb\'s policy without the '
        'pay-off gate'
    ]


def test_colocated_input_loses_no_expert_and_passes_the_guard(ascend):
    # Rank 0 holds expert 0 twice; experts 0..3 all have a copy.
    table = np.array([[[0, 0, 1], [2, 1, 3]]], dtype=np.int64)
    workload = np.array([[[50, 50, 10], [5, 10, 1]]], dtype=np.int64)
    for policy in ("default", "swift", "incremental", "flashlb"):
        changed, _, new = do_update(adapter.Policy(policy), table, workload)
        assert adapter.guard(new, 4) is None, (policy, new)
        assert guard(table, new) == [], (policy, new)
        assert changed == 1  # the co-located copy is replaced


def test_keep_slots_keeps_every_copy_of_the_new_row():
    old = np.array([[[0, 0, 1], [2, 1, 0]]])
    new = np.array([[[0, 3, 1], [2, 1, 0]]])
    out = adapter.keep_slots(old, new)
    np.testing.assert_array_equal(out, new)
    assert sorted(out[0, 0].tolist()) == [0, 1, 3]


@pytest.mark.parametrize("intervals, moves", [(None, True), ((600, 50), True), ((0, 10), False)])
def test_the_gate_weighs_a_move_over_the_heat_and_algorithm_intervals(ascend, intervals, moves):
    """A small saving pays back over 650 iterations (the defaults) but not over 10."""
    table, sl = _skewed_case()
    ascend.additional_config["eplb_rs"] = {
        "policy": "default", "payoff_gate": {"hardware": "A2", "tokens_per_rank": 0.001}}
    if intervals is not None:
        ascend.additional_config["eplb_config"] = {
            "expert_heat_collection_interval": intervals[0],
            "algorithm_execution_interval": intervals[1]}
    adapter.register()
    p = pickle.loads(pickle.dumps(ascend.factory.generate_policy(1)))
    assert p.gate_iterations == (650 if intervals is None else sum(intervals))
    changed, _, new = do_update(p, table, FakeTensor(sl))
    assert changed == int(moves)
    assert (new == table).all() == (not moves)
