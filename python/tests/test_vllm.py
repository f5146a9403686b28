"""eplb.integrations.vllm against our stand-in of vLLM 0.33's policy registry and call sites
(written from the documented interface: research/python-integration.md §3)."""

from __future__ import annotations

import importlib.metadata
import logging
import threading
import types

import numpy as np
import pytest

import eplb
from conftest import (DSV3_CASES, FakeTensor, bf16_tensor, even_par, golden, install_modules,
                      tensor_device, tensor_dtype)
from eplb.integrations import vllm as adapter


class StandInDefault:
    """Upstream's default policy as far as the registry is concerned: a class with the
    classmethod contract."""

    calls = 0

    @classmethod
    def rebalance_experts(
        cls, weight, num_replicas, num_groups, num_nodes, num_ranks, old_global_expert_indices=None
    ):
        cls.calls += 1
        raise AssertionError("upstream's policy should not run when eplb's is selected")


@pytest.fixture
def vllm_registry(monkeypatch, fake_torch):
    mod = types.ModuleType("vllm.distributed.eplb.policy")
    mod.EPLB_POLICIES = {"default": StandInDefault}
    install_modules(monkeypatch, {"vllm.distributed.eplb.policy": mod})
    for k in ("policy_name", "policy_params", "upstream", "gate"):
        monkeypatch.setattr(adapter.Policy, k, getattr(adapter.Policy, k))
    monkeypatch.delenv("EPLB_PAYOFF_GATE", raising=False)
    adapter.Policy._cache.clear()
    monkeypatch.delenv("EPLB_POLICY", raising=False)
    monkeypatch.delenv("EPLB_POLICY_PARAMS", raising=False)
    return mod.EPLB_POLICIES


def rearrange(registry, weight, num_replicas, num_groups, num_nodes, num_ranks, old=None):
    """Our stand-in of vLLM's call site: six positional arguments on the registry's entry, then
    the checks vLLM's commit path relies on, and compute_logical_maps' semantics."""
    policy = registry["default"]
    phy2log = policy.rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks, old)
    assert isinstance(phy2log, FakeTensor), type(phy2log)
    assert tensor_device(phy2log) == "cpu" and tensor_dtype(phy2log) == np.int64
    p = phy2log.numpy()
    layers, experts = weight.shape
    assert p.shape == (layers, num_replicas)
    assert ((p >= 0) & (p < experts)).all()
    logcnt = np.zeros((layers, experts), dtype=np.int64)
    for l in range(layers):
        np.add.at(logcnt[l], p[l], 1)
    assert (logcnt >= 1).all(), "every logical expert needs a replica"
    return p


@pytest.mark.parametrize("name", DSV3_CASES)
def test_deepseek_is_as_balanced_as_vllms_default(vllm_registry, monkeypatch, name):
    monkeypatch.setenv("EPLB_POLICY", "deepseek")
    adapter.register()
    assert vllm_registry["default"] is adapter.Policy
    c = golden(name)
    w = FakeTensor(c.loads, device="cuda:0")
    p = rearrange(vllm_registry, w, c.replicas, c.groups, c.nodes, c.ranks)
    # vLLM's default policy gives the golden deepseek_hier placement (checks
    # float64_implementations_agree in the golden file); ours must be within 0.1% mean PAR.
    ref = np.array(c.expected["deepseek_hier"]["placement"])
    ours = even_par(p.reshape(c.current.shape), c.loads).mean()
    theirs = even_par(ref.reshape(c.current.shape), c.loads).mean()
    assert ours <= theirs * 1.001
    assert StandInDefault.calls == 0


@pytest.mark.parametrize("name", DSV3_CASES)
def test_deepseek_on_integer_counts_is_as_balanced(vllm_registry, monkeypatch, name):
    """vLLM hands int64 token counts, where ties are frequent: the balance must still match the
    float64 reference placement's within 0.1% mean PAR."""
    monkeypatch.setenv("EPLB_POLICY", "deepseek")
    adapter.register()
    c = golden(name)
    counts = np.rint(c.loads).astype(np.int64)
    p = rearrange(vllm_registry, FakeTensor(counts), c.replicas, c.groups, c.nodes, c.ranks)
    ref = np.array(c.expected["deepseek_hier"]["placement"])
    ours = even_par(p.reshape(c.current.shape), counts.astype(np.float64)).mean()
    theirs = even_par(ref.reshape(c.current.shape), counts.astype(np.float64)).mean()
    assert ours <= theirs * 1.001


@pytest.mark.parametrize("policy", eplb.POLICIES)
def test_all_zero_weights_work(vllm_registry, monkeypatch, policy):
    monkeypatch.setenv("EPLB_POLICY", policy)
    adapter.register()
    w = FakeTensor(np.zeros((4, 16), dtype=np.int64))
    rearrange(vllm_registry, w, 24, 1, 1, 4)
    old = FakeTensor(np.tile((np.arange(24) % 16), (4, 1)))
    rearrange(vllm_registry, w, 24, 1, 1, 4, old)


def test_old_indices_with_holes_and_another_size(vllm_registry, monkeypatch):
    monkeypatch.setenv("EPLB_POLICY", "incremental")
    monkeypatch.setenv("EPLB_POLICY_PARAMS", '{"partners": 3}')
    adapter.register()
    assert adapter.Policy.policy_params == {"partners": 3}
    c = golden("esft_law_ep8")
    w = FakeTensor(c.loads.astype(np.int64))
    old = c.current.reshape(c.layers, -1).copy()
    good = rearrange(vllm_registry, w, c.replicas, 1, 1, c.ranks, FakeTensor(old))
    holes = old.copy()
    holes[:, -3:] = -1  # elastic scale-up: empty slots
    p = rearrange(vllm_registry, w, c.replicas, 1, 1, c.ranks, FakeTensor(holes))
    assert p.shape == good.shape
    bigger = np.concatenate([old, old[:, :8]], axis=1)  # another old size: start from the layout
    rearrange(vllm_registry, w, c.replicas, 1, 1, c.ranks, FakeTensor(bigger))


def test_incremental_keeps_the_current_placement_when_balanced(vllm_registry, monkeypatch):
    monkeypatch.setenv("EPLB_POLICY", "incremental")
    adapter.register()
    c = golden("dsv3_decode_ep32")
    first = rearrange(vllm_registry, FakeTensor(c.loads), c.replicas, 1, 1, c.ranks,
                      FakeTensor(c.current.reshape(c.layers, -1)))
    moved = (first.reshape(c.current.shape) != c.current).any(axis=2).sum()
    assert moved < c.layers * c.ranks, "incremental starts from the current placement"


def test_state_is_kept_per_shape(vllm_registry, monkeypatch):
    """A main model and an MTP drafter (another shape) interleave; each keeps its own state."""
    monkeypatch.setenv("EPLB_POLICY", "flashlb")
    adapter.register()
    main, mtp = golden("dsv3_decode_ep32"), golden("esft_law_ep8")

    def call(c):
        return rearrange(vllm_registry, FakeTensor(c.loads), c.replicas, 1, 1, c.ranks,
                         FakeTensor(c.current.reshape(c.layers, -1)))

    interleaved = [call(main), call(mtp), call(main), call(mtp)]
    alone = {}
    for c in (main, mtp):
        p = eplb.Policy("flashlb", layers=c.layers, experts=c.experts, ranks=c.ranks,
                        redundant=c.redundant)
        alone[c.name] = [p.rebalance(c.loads, c.current).placement.reshape(c.layers, -1)
                         for _ in range(2)]
    np.testing.assert_array_equal(interleaved[0], alone[main.name][0])
    np.testing.assert_array_equal(interleaved[2], alone[main.name][1])
    np.testing.assert_array_equal(interleaved[1], alone[mtp.name][0])
    np.testing.assert_array_equal(interleaved[3], alone[mtp.name][1])


def test_callable_from_a_non_main_thread(vllm_registry, monkeypatch):
    monkeypatch.setenv("EPLB_POLICY", "swift")
    adapter.register()
    c = golden("dsv3_prefill_ep32")
    out, errors = [], []

    def worker():  # vLLM's async EPLB thread
        try:
            out.append(rearrange(vllm_registry, FakeTensor(c.loads), c.replicas, 1, 1, c.ranks,
                                 FakeTensor(c.current.reshape(c.layers, -1))))
        except BaseException as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert not errors, errors
    main = rearrange(vllm_registry, FakeTensor(c.loads), c.replicas, 1, 1, c.ranks,
                     FakeTensor(c.current.reshape(c.layers, -1)))
    np.testing.assert_array_equal(out[0], main)


def test_sizes_that_do_not_divide_never_raise_into_vllm(vllm_registry, monkeypatch, caplog):
    """vLLM's own policy asserts on them as ours refuses them; the adapter raises neither: the
    engine's current table comes back, with one log line."""
    monkeypatch.setenv("EPLB_POLICY", "default")
    adapter.register()
    w = FakeTensor(np.ones((2, 8), dtype=np.int64))
    with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
        out = vllm_registry["default"].rebalance_experts(w, 10, 1, 1, 4)
    np.testing.assert_array_equal(out.numpy(), np.tile(np.arange(10) % 8, (2, 1)))
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert "not a multiple of num_ranks" in errors[0] and "failed too (AssertionError" in errors[0]


def test_changed_signature_leaves_upstream_and_warns(vllm_registry, monkeypatch, caplog):
    class NewUpstream:
        @classmethod
        def rebalance_experts(cls, context, state):
            return None

    vllm_registry["default"] = NewUpstream
    monkeypatch.setenv("EPLB_POLICY", "incremental")
    with caplog.at_level(logging.WARNING, logger="vllm.eplb_rs"):
        adapter.register()
    assert vllm_registry["default"] is NewUpstream
    assert "keeping vLLM's own EPLB policy" in caplog.text


def test_no_selection_leaves_upstream(vllm_registry):
    adapter.register()
    assert vllm_registry["default"] is StandInDefault


def test_bad_selection_leaves_upstream_and_logs(vllm_registry, monkeypatch, caplog):
    monkeypatch.setenv("EPLB_POLICY", "incremental")
    monkeypatch.setenv("EPLB_POLICY_PARAMS", '{"partners": 0}')
    with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
        adapter.register()
    assert vllm_registry["default"] is StandInDefault
    assert "`partners` = 0 is out of range" in caplog.text
    monkeypatch.setenv("EPLB_POLICY", "fastest")
    monkeypatch.delenv("EPLB_POLICY_PARAMS")
    with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
        adapter.register()
    assert vllm_registry["default"] is StandInDefault
    assert "unknown policy `fastest`" in caplog.text


def test_register_twice_is_idempotent(vllm_registry, monkeypatch):
    monkeypatch.setenv("EPLB_POLICY", "default")
    adapter.register()
    monkeypatch.setenv("EPLB_POLICY", "swift")
    adapter.register()
    assert vllm_registry["default"] is adapter.Policy
    assert adapter.Policy.policy_name == "swift"
    assert adapter.Policy.upstream is StandInDefault


def test_entry_points_are_declared():
    eps = importlib.metadata.entry_points()
    group = eps.select(group="vllm.general_plugins") if hasattr(eps, "select") else eps.get(
        "vllm.general_plugins", [])
    assert any(ep.value == "eplb.integrations.vllm:register" for ep in group)
    group = eps.select(group="sglang.srt.plugins") if hasattr(eps, "select") else eps.get(
        "sglang.srt.plugins", [])
    assert any(ep.value == "eplb.integrations.sglang:register" for ep in group)


def test_importing_the_adapters_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, eplb, eplb.integrations.vllm, eplb.integrations.vllm_ascend, "
            "eplb.integrations.sglang, eplb.deepseek; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_failing_plan_keeps_the_engines_placement(vllm_registry, monkeypatch, caplog):
    monkeypatch.setenv("EPLB_POLICY", "incremental")
    adapter.register()
    c = golden("esft_law_ep8")
    bad = c.loads.copy()
    bad[0, 3] = np.nan
    old = FakeTensor(c.current.reshape(c.layers, -1))
    with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
        out = vllm_registry["default"].rebalance_experts(
            FakeTensor(bad), c.replicas, 1, 1, c.ranks, old
        )
    assert out is old
    assert "the placement is kept this rearrangement" in caplog.text


class WorkingUpstream:
    """vLLM's own policy, as far as the fallback is concerned: a recognisable valid plan."""

    calls = 0

    @classmethod
    def rebalance_experts(
        cls, weight, num_replicas, num_groups, num_nodes, num_ranks, old_global_expert_indices=None
    ):
        cls.calls += 1
        layers, experts = weight.shape
        return FakeTensor(np.tile(np.arange(num_replicas)[::-1] % experts, (layers, 1)))


def _bad_weights(c):
    nan = c.loads.copy()
    nan[0, 3] = np.nan
    return {
        "NaN loads": FakeTensor(nan),
        "complex loads": FakeTensor(c.loads.astype(np.complex64)),
        "loads [1, L, N]": FakeTensor(c.loads[None]),
    }


@pytest.mark.parametrize("first", [True, False], ids=["first call", "later call"])
def test_a_failure_falls_back_to_vllms_own_policy(vllm_registry, monkeypatch, caplog, first):
    """First rearrangement (no previous placement) as later ones: our failure is one log line
    and vLLM's own policy, which the adapter kept when it replaced it, plans."""
    vllm_registry["default"] = WorkingUpstream
    monkeypatch.setenv("EPLB_POLICY", "incremental")
    adapter.register()
    assert adapter.Policy.upstream is WorkingUpstream
    c = golden("esft_law_ep8")
    old = None if first else FakeTensor(c.current.reshape(c.layers, -1))
    for what, w in _bad_weights(c).items():
        if what == "loads [1, L, N]":
            continue  # vLLM's own policy cannot read it either (below)
        WorkingUpstream.calls = 0
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
            out = vllm_registry["default"].rebalance_experts(w, c.replicas, 1, 1, c.ranks, old)
        assert WorkingUpstream.calls == 1, what
        np.testing.assert_array_equal(
            out.numpy(), np.tile(np.arange(c.replicas)[::-1] % c.experts, (c.layers, 1)))
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, (what, errors)
        assert "vLLM's own policy plans this rearrangement" in errors[0], what


def test_bfloat16_loads_are_planned_by_our_policy(vllm_registry, monkeypatch, caplog):
    """vLLM's own policy reads the loads through ``.float()``; so does the adapter: a bfloat16
    tensor is planned by our policy exactly as its float32 values are, with no fallback."""
    vllm_registry["default"] = WorkingUpstream
    monkeypatch.setenv("EPLB_POLICY", "default")
    adapter.register()
    c = golden("esft_law_ep8")
    old = FakeTensor(c.current.reshape(c.layers, -1))
    WorkingUpstream.calls = 0
    with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
        bf16 = vllm_registry["default"].rebalance_experts(
            bf16_tensor(c.loads), c.replicas, 1, 1, c.ranks, old)
        f32 = vllm_registry["default"].rebalance_experts(
            bf16_tensor(c.loads).float(), c.replicas, 1, 1, c.ranks, old)
    assert WorkingUpstream.calls == 0
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    np.testing.assert_array_equal(bf16.numpy(), f32.numpy())
    assert (bf16.numpy() != c.current.reshape(c.layers, -1)).any()  # it planned


@pytest.mark.parametrize("first", [True, False], ids=["first call", "later call"])
def test_when_vllms_own_policy_fails_too_the_current_table_comes_back(
        vllm_registry, monkeypatch, caplog, first):
    vllm_registry["default"] = WorkingUpstream
    monkeypatch.setenv("EPLB_POLICY", "default")
    adapter.register()
    c = golden("esft_law_ep8")
    old = None if first else FakeTensor(c.current.reshape(c.layers, -1))
    w = _bad_weights(c)["loads [1, L, N]"]  # WorkingUpstream cannot unpack a 3-d shape
    with caplog.at_level(logging.ERROR, logger="vllm.eplb_rs"):
        out = vllm_registry["default"].rebalance_experts(w, c.replicas, 1, 1, c.ranks, old)
    if first:  # vLLM's initial map: slot p holds expert p mod N
        np.testing.assert_array_equal(out.numpy(), np.tile(np.arange(c.replicas) % c.experts, (1, 1)))
    else:
        assert out is old
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert "failed too" in errors[0] and "the placement is kept this rearrangement" in errors[0]


def _skewed_case():
    layers, ranks, slots, experts = 4, 4, 6, 16
    old = np.tile(np.arange(ranks * slots) % experts, (layers, 1))
    loads = np.ones((layers, experts), dtype=np.int64) * 10
    loads[:, [3, 9]] = 4000
    return old, loads, ranks


@pytest.mark.parametrize("policy", ["default", "deepseek"])
@pytest.mark.parametrize("gate, moves", [
    ('{"tokens_per_rank": 0.0001}', False),  # almost no token per rank: a move saves ~nothing
    ('{"hardware": "950DT", "tokens_per_rank": 100000}', True),
])
def test_the_payoff_gate_keeps_layers_that_do_not_pay(vllm_registry, monkeypatch, caplog, policy,
                                                       gate, moves):
    old, loads, ranks = _skewed_case()
    monkeypatch.setenv("EPLB_POLICY", policy)
    adapter.register()
    free = rearrange(vllm_registry, FakeTensor(loads), old.shape[1], 1, 1, ranks, FakeTensor(old))
    assert (free != old).any(axis=1).all()  # without the gate every layer moves
    monkeypatch.setenv("EPLB_PAYOFF_GATE", gate)
    with caplog.at_level(logging.INFO, logger="vllm.eplb_rs"):
        adapter.register()
        gated = rearrange(vllm_registry, FakeTensor(loads), old.shape[1], 1, 1, ranks,
                          FakeTensor(old))
    assert "eplb_payoff_gate: on" in caplog.text
    if moves:
        np.testing.assert_array_equal(gated, free)
        assert "0 of 4 changed layers kept on their placement, 4 moved" in caplog.text
    else:
        np.testing.assert_array_equal(gated, old)
        assert "4 of 4 changed layers kept on their placement, 0 moved" in caplog.text


@pytest.mark.parametrize("value, message", [
    ("{nope", "EPLB_PAYOFF_GATE: not JSON"),
    ('{"model": "gpt-5"}', 'EPLB_PAYOFF_GATE: eplb_config.eplb_payoff_gate: model: unknown model '
                           '"gpt-5"; expected one of deepseek-v3'),
    ("3", "EPLB_PAYOFF_GATE: eplb_config.eplb_payoff_gate: expected a boolean or an object, got 3"),
])
def test_a_bad_gate_is_logged_once_and_the_policy_runs_without_it(vllm_registry, monkeypatch,
                                                                 caplog, value, message):
    old, loads, ranks = _skewed_case()
    monkeypatch.setenv("EPLB_POLICY", "default")
    monkeypatch.setenv("EPLB_PAYOFF_GATE", value)
    with caplog.at_level(logging.INFO, logger="vllm.eplb_rs"):
        adapter.register()
        for _ in range(2):
            out = rearrange(vllm_registry, FakeTensor(loads), old.shape[1], 1, 1, ranks,
                            FakeTensor(old))
            assert (out != old).any(axis=1).all()
    assert vllm_registry["default"] is adapter.Policy and adapter.Policy.gate is None
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"eplb: {message}")
    assert errors[0].endswith("; vLLM runs eplb's policy without the pay-off gate")


def _intra_gpu_moves(old: np.ndarray, new: np.ndarray, ranks: int) -> int:
    """Copies within a GPU for nothing: an expert the GPU holds before and after, but not in its
    first old slot."""
    moves = 0
    for o_l, n_l in zip(old.reshape(old.shape[0], ranks, -1), new.reshape(new.shape[0], ranks, -1)):
        for o, n in zip(o_l.tolist(), n_l.tolist()):
            for e in set(o) & set(n):
                if n[o.index(e)] != e:
                    moves += 1
    return moves


@pytest.mark.parametrize("policy", ["deepseek", "default", "swift", "incremental", "flashlb"])
def test_every_policy_keeps_the_engines_slots(vllm_registry, monkeypatch, policy):
    monkeypatch.setenv("EPLB_POLICY", policy)
    adapter.register()
    rng = np.random.default_rng(3)
    weight = rng.integers(1, 200, size=(4, 12))
    old = np.stack([rng.permutation(np.arange(16) % 12) for _ in range(4)])
    p = rearrange(vllm_registry, FakeTensor(weight), 16, 4, 2, 8, FakeTensor(old))
    assert _intra_gpu_moves(old, p, 8) == 0
    # The same plan without the old placement: only the slot order within GPUs differs.
    monkeypatch.setattr(adapter.Policy, "_cache", adapter._common.PolicyCache())
    free = rearrange(vllm_registry, FakeTensor(weight), 16, 4, 2, 8, None if policy == "deepseek" else FakeTensor(old))
    if policy == "deepseek":
        for a, b in zip(p.reshape(4, 8, 2), free.reshape(4, 8, 2)):
            assert sorted(map(sorted, a.tolist())) == sorted(map(sorted, b.tolist()))


@pytest.mark.parametrize(
    "ranks, old, new",
    [
        (2, [[0, 1, 2, 3, 4, 5, 6, 7]], [[1, 5, 0, 4, 6, 2, 7, 3]]),
        (2, [[0, 1, 0, 2, 3, 4, 5, 6, 1, 2]], [[0, 5, 4, 0, 1, 6, 2, 3, 2, 1]]),
        (3, [[0, 1, 2, 3] * 3], [[0] * 8 + [1, 2, 3, 0]]),
        (2, [[0, -1, 2, 3, 1, -1]], [[2, 0, 4, 1, 3, 5]]),  # empty old slots
    ],
)
def test_preserve_intragpu_slots_as_vllms_class_offers_it(ranks, old, new):
    old, new = np.array(old), np.array(new)
    post = adapter.Policy.preserve_intragpu_slots(new, ranks, old)
    assert isinstance(post, np.ndarray) and post.shape == new.shape
    slots = new.shape[1] // ranks
    for g in range(ranks):
        o, n, q = (a[0, g * slots:(g + 1) * slots].tolist() for a in (old, new, post))
        assert sorted(q) == sorted(n)  # nothing lost, nothing added
        for e in set(o) & set(n):
            assert q[o.index(e)] == e  # a kept expert stays in its first old slot
    assert _intra_gpu_moves(old, post, ranks) == 0
    # Another size: unchanged.
    assert adapter.Policy.preserve_intragpu_slots(new, ranks + 5, old) is new


@pytest.mark.parametrize("policy", ["default", "swift", "incremental", "flashlb"])
def test_a_plan_without_a_current_placement_replicates_by_heat(vllm_registry, monkeypatch, policy):
    """vLLM's first rearrangement (and its tests) pass no current placement. The id-order
    layout gives the redundant copies to the lowest ids; a plan from it must still give the
    hottest expert of a rising layer its copies, and balance as well as DeepSeek's within 3%."""
    monkeypatch.setenv("EPLB_POLICY", policy)
    adapter.register()
    weight = np.array([[210, 140, 90, 60, 30, 10], [10, 30, 60, 90, 140, 210]])
    p = rearrange(vllm_registry, FakeTensor(weight), 10, 3, 1, 2)
    for layer in range(2):
        assert (p[layer] == weight[layer].argmax()).sum() >= 2, (layer, p[layer])
    ours = even_par(p.reshape(2, 2, 5), weight.astype(float)).mean()
    ds = eplb.rebalance_experts(weight, 10, 3, 1, 2)[0]
    assert ours <= even_par(ds.reshape(2, 2, 5), weight.astype(float)).mean() * 1.03
