"""eplb.integrations.sglang against our stand-in of SGLang 0.5.23's plugin HookRegistry, its
algorithm lookup and its caller (written from the documented interface:
research/python-integration.md §4)."""

from __future__ import annotations

import enum
import logging
import sys
import types

import numpy as np
import pytest

import eplb
from conftest import DSV3_CASES, FakeTensor, even_par, golden, install_modules, tensor_device, tensor_dtype
from eplb.integrations import sglang as adapter

ALGOS = adapter.ALGORITHMS


class HookType(enum.Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


class HookRegistry:
    """AROUND hooks are called as hook(original_fn, *args, **kwargs)."""

    hooks = []

    @classmethod
    def register(cls, target, hook, hook_type):
        cls.hooks.append((target, hook, hook_type))

    @classmethod
    def apply_hooks(cls):
        for target, hook, hook_type in cls.hooks:
            mod_name, attr = target.rsplit(".", 1)
            mod = sys.modules[mod_name]
            original = getattr(mod, attr)
            assert hook_type is HookType.AROUND

            def wrapped(*a, _h=hook, _o=original, **k):
                return _h(_o, *a, **k)

            setattr(mod, attr, wrapped)
        cls.hooks = []


class EplbAlgorithm(enum.Enum):
    deepseek = "deepseek"
    deepseek_hierarchical = "deepseek_hierarchical"


@pytest.fixture
def sglang(monkeypatch, fake_torch):
    algos = types.ModuleType(ALGOS)
    algos.EplbAlgorithm = EplbAlgorithm
    calls = {"upstream": 0}

    def compute_algorithm(raw_algorithm, num_groups, num_nodes):
        if raw_algorithm == "auto":
            if num_groups is not None and num_groups % num_nodes == 0:
                return EplbAlgorithm.deepseek_hierarchical
            return EplbAlgorithm.deepseek
        return EplbAlgorithm[raw_algorithm]

    def rebalance_experts(tokens_per_expert, num_physical_experts, num_local_physical_experts,
                          num_groups, num_nodes, algorithm):
        calls["upstream"] += 1
        return "upstream", algorithm

    algos.compute_algorithm = compute_algorithm
    algos.rebalance_experts = rebalance_experts
    registry = types.ModuleType("sglang.srt.plugins.hook_registry")
    registry.HookRegistry = HookRegistry
    registry.HookType = HookType
    HookRegistry.hooks = []
    install_modules(monkeypatch, {ALGOS: algos, "sglang.srt.plugins.hook_registry": registry})
    monkeypatch.delenv("EPLB_POLICY_PARAMS", raising=False)
    monkeypatch.delenv("EPLB_PAYOFF_GATE", raising=False)
    monkeypatch.setattr(adapter, "_gate", None)
    adapter._cache.clear()
    algos.calls = calls
    return algos


def init_by_eplb(algos, tokens, num_physical, num_local, num_groups, num_nodes, raw):
    """Our stand-in of ExpertLocationMetadata.init_by_eplb: the lookup by attribute at call
    time, then the triple's checks (as init_by_mapping derives the logical maps)."""
    algorithm = algos.compute_algorithm(raw, num_groups, num_nodes)
    phy2log, log2phy, logcnt = algos.rebalance_experts(
        tokens, num_physical, num_local, num_groups, num_nodes, algorithm
    )
    for t in (phy2log, log2phy, logcnt):
        assert isinstance(t, FakeTensor) and tensor_device(t) == "cpu" and tensor_dtype(t) == np.int64
    p, l2p, cnt = phy2log.numpy(), log2phy.numpy(), logcnt.numpy()
    layers, experts = tokens.shape[1], tokens.shape[2]
    assert p.shape == (layers, num_physical)
    for l in range(layers):
        for e in range(experts):
            ids = np.flatnonzero(p[l] == e)
            assert cnt[l, e] == len(ids) >= 1
            row = l2p[l, e]
            np.testing.assert_array_equal(np.sort(row[: len(ids)]), ids)
            assert (row[len(ids):] == -1).all()
    return p


def _deepseek_through_hooks(sglang, c, raw):
    tokens = FakeTensor(c.loads[None].astype(np.float64), device="cuda:3")
    return init_by_eplb(sglang, tokens, c.replicas, c.slots, c.groups, c.nodes, raw)


def _as_balanced(c, p, peer):
    """Exactly the peer's placement where the golden case has it exactly, else a mean PAR
    within 0.1% of the peer's."""
    exact = c.exact(peer)
    if exact is not None:
        np.testing.assert_array_equal(p, exact.reshape(p.shape))
        return
    ref = np.array(c.expected[peer]["placement"])
    ours_par = even_par(p.reshape(c.current.shape), c.loads).mean()
    ref_par = even_par(ref.reshape(c.current.shape), c.loads).mean()
    assert abs(ours_par - ref_par) <= ref_par * 0.001, (ours_par, ref_par)


@pytest.mark.parametrize("name", DSV3_CASES + ["deepseek_readme", "esft_intent_ep16"])
def test_sglangs_deepseek_names_mean_sglangs_algorithms(sglang, name):
    """``deepseek`` is DeepSeek's global policy (also where the groups divide into the nodes),
    ``deepseek_hierarchical`` the hierarchical one, ``auto`` SGLang's choice."""
    assert adapter.register()
    HookRegistry.apply_hooks()
    c = golden(name)
    assert c.groups % c.nodes == 0 and c.nodes > 1  # cases where the two policies differ
    _as_balanced(c, _deepseek_through_hooks(sglang, c, "eplb_rs:deepseek"), "deepseek_global")
    hier = _deepseek_through_hooks(sglang, c, "eplb_rs:deepseek_hierarchical")
    _as_balanced(c, hier, "deepseek_hier")
    np.testing.assert_array_equal(_deepseek_through_hooks(sglang, c, "eplb_rs:auto"), hier)
    assert sglang.calls["upstream"] == 0


def test_auto_without_groups_is_global_and_hierarchical_needs_them(sglang):
    c = golden("dsv3_decode_ep32")
    tokens = c.loads[None]
    glob = adapter.plan(tokens, c.replicas, c.slots, None, c.nodes, adapter.ours("eplb_rs:auto"))[0]
    np.testing.assert_array_equal(glob, c.exact("deepseek_global").reshape(glob.shape))
    with pytest.raises(eplb.EplbError, match="deepseek_hierarchical needs expert groups"):
        adapter.plan(tokens, c.replicas, c.slots, 3, c.nodes,
                     adapter.ours("eplb_rs:deepseek_hierarchical"))


@pytest.mark.parametrize("policy", ["incremental", "flashlb", "swift", "default", "random", "4"])
def test_every_policy_through_the_hooks(sglang, policy):
    adapter.register()
    HookRegistry.apply_hooks()
    c = golden("esft_law_ep8")
    tokens = FakeTensor(c.windows[-12:].astype(np.int32), device="cuda:0")
    p = init_by_eplb(sglang, tokens, c.replicas, c.slots, None, 1, f"eplb_rs:{policy}")
    if policy not in ("random",):
        assert even_par(p.reshape(c.current.shape), c.windows[-12:].sum(0)).mean() < 1.5


def test_current_placement_from_the_global_metadata(sglang, monkeypatch):
    c = golden("dsv3_drift_ep32")
    meta = types.SimpleNamespace(physical_to_logical_map_cpu=FakeTensor(c.current.reshape(c.layers, -1)))
    loc = types.ModuleType("sglang.srt.eplb.expert_location")
    loc.get_global_expert_location_metadata = lambda: meta
    install_modules(monkeypatch, {"sglang.srt.eplb.expert_location": loc})
    adapter.register()
    HookRegistry.apply_hooks()
    tokens = FakeTensor(c.loads[None].astype(np.int64))
    p = init_by_eplb(sglang, tokens, c.replicas, c.slots, None, 1, "eplb_rs:incremental")
    want = eplb.Policy("incremental", layers=c.layers, experts=c.experts, ranks=c.ranks,
                       redundant=c.redundant).rebalance(c.loads, c.current).placement
    np.testing.assert_array_equal(p, want.reshape(c.layers, -1))


def test_params_from_the_environment(sglang, monkeypatch):
    monkeypatch.setenv("EPLB_POLICY_PARAMS", '{"max_fetch_fraction": 0.01}')
    adapter.register()
    HookRegistry.apply_hooks()
    c = golden("dsv3_decode_ep64")
    tokens = FakeTensor(c.loads[None])
    cur = FakeTensor(c.current.reshape(c.layers, -1))
    tight = adapter.plan(tokens.numpy(), c.replicas, c.slots, None, 1,
                         adapter.ours("eplb_rs:incremental"), cur.numpy())[0]
    monkeypatch.delenv("EPLB_POLICY_PARAMS")
    loose = adapter.plan(tokens.numpy(), c.replicas, c.slots, None, 1,
                         adapter.ours("eplb_rs:incremental"), cur.numpy())[0]
    moved = lambda p: (p.reshape(c.current.shape) != c.current).sum()  # noqa: E731
    assert moved(tight) < moved(loose)


def test_other_algorithms_stay_sglangs(sglang):
    adapter.register()
    HookRegistry.apply_hooks()
    tokens = FakeTensor(np.ones((1, 2, 8), dtype=np.int32))
    assert sglang.compute_algorithm("auto", 4, 2) is EplbAlgorithm.deepseek_hierarchical
    assert sglang.compute_algorithm("auto", None, 2) is EplbAlgorithm.deepseek
    with pytest.raises(KeyError):
        sglang.compute_algorithm("nope", 1, 1)
    out = sglang.rebalance_experts(tokens, 12, 3, 1, 1, EplbAlgorithm.deepseek)
    assert out == ("upstream", EplbAlgorithm.deepseek)
    assert sglang.calls["upstream"] == 1


def test_an_unknown_policy_never_raises_into_sglang(sglang, caplog):
    """compute_algorithm runs at every rebalance: our names resolve unchecked, and the
    rebalance hook reports an unknown one and hands the plan to SGLang's own algorithm."""
    adapter.register()
    HookRegistry.apply_hooks()
    assert sglang.compute_algorithm("eplb_rs:fastest", 1, 1) == "eplb_rs:fastest"
    with pytest.raises(eplb.EplbError, match="unknown policy `fastest`"):
        adapter.ours("eplb_rs:fastest")
    with caplog.at_level(logging.ERROR, logger="sglang.eplb_rs"):
        out = sglang.rebalance_experts(FakeTensor(np.ones((1, 2, 8))), 12, 4, None, 1,
                                       "eplb_rs:fastest")
    assert out == ("upstream", EplbAlgorithm.deepseek)
    assert "unknown policy `fastest`" in caplog.text


def test_changed_signature_is_left_alone(sglang, caplog):
    def compute_algorithm(raw_algorithm, num_groups, num_nodes, extra):
        return None

    sglang.compute_algorithm = compute_algorithm
    with caplog.at_level(logging.WARNING, logger="sglang.eplb_rs"):
        assert not adapter.register()
    assert HookRegistry.hooks == []
    assert "SGLang keeps its own" in caplog.text


def test_without_sglang_register_says_so(caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)
    with caplog.at_level(logging.WARNING, logger="sglang.eplb_rs"):
        assert not adapter.register()
    assert "not importable" in caplog.text


def test_many_steps_become_at_most_64_flashlb_windows(sglang):
    adapter.register()
    HookRegistry.apply_hooks()
    rng = np.random.default_rng(0)
    steps = rng.integers(0, 50, size=(1000, 3, 16)).astype(np.int32)
    w = adapter._windows(steps)
    assert w.shape == (64, 3, 16)
    np.testing.assert_array_equal(w.sum(axis=0), steps.sum(axis=0))
    init_by_eplb(sglang, FakeTensor(steps), 24, 6, None, 1, "eplb_rs:flashlb")


def test_a_failing_plan_falls_back_to_sglangs_deepseek(sglang, caplog):
    adapter.register()
    HookRegistry.apply_hooks()
    counts = np.ones((1, 2, 8))
    counts[0, 1, 5] = np.nan  # our policies refuse NaN loads
    bad = FakeTensor(counts)
    with caplog.at_level(logging.ERROR, logger="sglang.eplb_rs"):
        out = sglang.rebalance_experts(bad, 12, 4, None, 1, "eplb_rs:incremental")
    assert out == ("upstream", EplbAlgorithm.deepseek)
    assert "SGLang's own deepseek algorithm plans this rebalance" in caplog.text


@pytest.mark.parametrize("mode, hier", [("deepseek", False), ("deepseek_hierarchical", True)])
def test_deepseek_modes_return_deepseeks_log2phy(sglang, mode, hier):
    """SGLang uses log2phy of the triple: the deepseek modes list each expert's replicas in the
    order DeepSeek's algorithm created them, as SGLang's copy of it does (padded to P-E+1)."""
    from test_deepseek import deepseek_reference

    c = golden("dsv3_prefill_ep32")
    groups, nodes = (c.groups, c.nodes) if hier else (1, 1)
    phy2log, log2phy, logcnt = adapter.plan(
        c.loads[None], c.replicas, c.slots, c.groups, c.nodes, adapter.ours(f"eplb_rs:{mode}"))
    want = deepseek_reference(c.loads, c.replicas, groups, nodes, c.ranks)
    np.testing.assert_array_equal(phy2log, want[0])
    assert log2phy.shape == (c.layers, c.experts, c.replicas - c.experts + 1)
    np.testing.assert_array_equal(log2phy[:, :, : want[1].shape[2]], want[1])
    assert (log2phy[:, :, want[1].shape[2]:] == -1).all()
    np.testing.assert_array_equal(logcnt, want[2])


class _Metadata:
    def __init__(self, phy2log):
        self.physical_to_logical_map_cpu = FakeTensor(np.asarray(phy2log, dtype=np.int64))


def _with_current(monkeypatch, phy2log):
    mod = types.ModuleType("sglang.srt.eplb.expert_location")
    meta = None if phy2log is None else _Metadata(phy2log)
    mod.get_global_expert_location_metadata = lambda: meta
    install_modules(monkeypatch, {"sglang.srt.eplb.expert_location": mod})


@pytest.mark.parametrize("first", [True, False])
def test_when_sglangs_deepseek_fails_too_the_current_placement_comes_back(
        sglang, monkeypatch, caplog, first):
    """Never raises, first rebalance included: ours fails (NaN), SGLang's deepseek fails too;
    the current placement comes back (SGLang's trivial one when there is none yet)."""
    def failing(tokens_per_expert, num_physical_experts, num_local_physical_experts, num_groups,
                num_nodes, algorithm):
        raise RuntimeError("upstream broke")

    sglang.rebalance_experts = failing
    adapter.register()
    HookRegistry.apply_hooks()
    counts = np.ones((1, 2, 8))
    counts[0, 1, 5] = np.nan
    current = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3], [7, 6, 5, 4, 3, 2, 1, 0, 7, 6, 5, 4]])
    _with_current(monkeypatch, None if first else current)
    with caplog.at_level(logging.ERROR, logger="sglang.eplb_rs"):
        out = init_by_eplb(sglang, FakeTensor(counts), 12, 4, None, 1, "eplb_rs:incremental")
    want = np.tile(np.arange(12) % 8, (2, 1)) if first else current
    np.testing.assert_array_equal(out, want)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "failed too (RuntimeError: upstream broke)" in errors[0].getMessage()
    assert "the placement is kept this rebalance" in errors[0].getMessage()


def test_a_bad_setting_at_rebalance_falls_back_instead_of_raising(sglang, monkeypatch, caplog):
    adapter.register()
    HookRegistry.apply_hooks()
    monkeypatch.setenv("EPLB_POLICY_PARAMS", '{"partners": 0}')
    with caplog.at_level(logging.ERROR, logger="sglang.eplb_rs"):
        out = sglang.rebalance_experts(FakeTensor(np.ones((1, 2, 8))), 12, 4, None, 1,
                                       "eplb_rs:incremental")
    assert out == ("upstream", EplbAlgorithm.deepseek)
    assert "`partners` = 0 is out of range" in caplog.text


def _skewed(layers=4, experts=16, hot=(3, 9)):
    loads = np.ones((layers, experts), dtype=np.int64) * 10
    loads[:, list(hot)] = 4000
    return loads


@pytest.mark.parametrize("gate, moves", [
    ('{"tokens_per_rank": 0.0001}', False),  # almost no token per rank: a move saves ~nothing
    ('{"hardware": "950DT", "tokens_per_rank": 100000}', True),
])
def test_the_payoff_gate_keeps_layers_that_do_not_pay(sglang, monkeypatch, caplog, gate, moves):
    current = np.tile(np.arange(24) % 16, (4, 1))
    _with_current(monkeypatch, current)
    monkeypatch.setattr(adapter, "_gate", None)
    free = adapter.plan(_skewed()[None], 24, 6, None, 1, adapter.ours("eplb_rs:default"))[0]
    monkeypatch.setenv("EPLB_PAYOFF_GATE", gate)
    with caplog.at_level(logging.INFO, logger="sglang.eplb_rs"):
        adapter.register()
    assert "eplb_payoff_gate: on" in caplog.text
    HookRegistry.apply_hooks()
    tokens = FakeTensor(_skewed()[None])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sglang.eplb_rs"):
        gated = init_by_eplb(sglang, tokens, 24, 6, None, 1, "eplb_rs:default")
    assert (free != current).any(axis=1).all()  # without the gate every layer moves
    if moves:
        np.testing.assert_array_equal(gated, free)
        assert "0 of 4 changed layers kept" in caplog.text
    else:
        np.testing.assert_array_equal(gated, current)
        assert "4 of 4 changed layers kept" in caplog.text


def _with_server_args(monkeypatch, **args):
    mod = types.ModuleType("sglang.srt.server_args")
    ns = types.SimpleNamespace(**args)
    mod.get_global_server_args = lambda: ns
    install_modules(monkeypatch, {"sglang.srt.server_args": mod})


@pytest.mark.parametrize("interval, moves", [(None, True), (1000, True), (10, False)])
def test_the_gate_weighs_a_move_over_sglangs_rebalance_interval(sglang, monkeypatch, interval,
                                                                moves):
    """A small saving pays back over 1000 forward passes (SGLang's default) but not over 10."""
    current = np.tile(np.arange(24) % 16, (4, 1))
    _with_current(monkeypatch, current)
    if interval is not None:
        _with_server_args(monkeypatch, eplb_rebalance_num_iterations=interval)
    monkeypatch.setenv("EPLB_PAYOFF_GATE", '{"hardware": "A2", "tokens_per_rank": 0.001}')
    adapter.register()
    HookRegistry.apply_hooks()
    out = init_by_eplb(sglang, FakeTensor(_skewed()[None]), 24, 6, None, 1, "eplb_rs:default")
    assert (out != current).any(axis=1).all() == moves
    assert (out == current).all() == (not moves)


def test_a_bad_algorithm_name_is_logged_at_register(sglang, monkeypatch, caplog):
    _with_server_args(monkeypatch, eplb_algorithm="eplb_rs:fastest")
    with caplog.at_level(logging.ERROR, logger="sglang.eplb_rs"):
        assert adapter.register()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["eplb: --eplb-algorithm eplb_rs:fastest: unknown policy `fastest` (expected "
                      "one of random, default, swift, flashlb, incremental, deepseek or 0..4); "
                      "every rebalance falls back to SGLang's own deepseek algorithm"]
