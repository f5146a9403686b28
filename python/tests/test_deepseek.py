"""eplb.deepseek: DeepSeek's signature, torch or numpy in, the same kind out."""

from __future__ import annotations

import numpy as np
import pytest

import eplb
from conftest import FakeTensor, bf16_tensor, golden, tensor_dtype
from eplb import deepseek


def test_numpy_in_numpy_out_readme_vector():
    c = golden("deepseek_readme")
    phy2log, log2phy, logcnt = deepseek.rebalance_experts(c.loads, 16, 4, 2, 8)
    assert all(isinstance(a, np.ndarray) for a in (phy2log, log2phy, logcnt))
    np.testing.assert_array_equal(phy2log, c.exact("deepseek_hier"))
    np.testing.assert_array_equal(phy2log, c.reference["readme_phy2log"])  # DeepSeek's README
    assert logcnt.shape == (2, 12) and (logcnt.sum(axis=1) == 16).all()
    assert log2phy.shape == (2, 12, logcnt.max())


def test_torch_in_torch_out(fake_torch):
    c = golden("dsv3_prefill_ep64")
    w = FakeTensor(c.loads.astype(np.float32))
    phy2log, log2phy, logcnt = deepseek.rebalance_experts(w, c.replicas, c.groups, c.nodes, c.ranks)
    assert all(isinstance(a, FakeTensor) for a in (phy2log, log2phy, logcnt))
    assert tensor_dtype(phy2log) == np.int64
    np.testing.assert_array_equal(phy2log.numpy(), c.exact("deepseek_hier"))
    p = phy2log.numpy()
    for l in range(c.layers):
        for e in range(c.experts):
            ids = np.flatnonzero(p[l] == e)
            assert logcnt.numpy()[l, e] == len(ids)
            assert set(log2phy.numpy()[l, e, : len(ids)]) == set(ids)


def test_readme_example_runs_unchanged_on_the_top_level_name(fake_torch):
    """DeepSeek's README: ``import eplb; eplb.rebalance_experts(weight, 16, 4, 2, 8)`` on a torch
    tensor of ints, with this package installed under the same name."""
    import eplb

    c = golden("deepseek_readme")
    weight = FakeTensor(c.loads.astype(np.int64))
    phy2log, log2phy, logcnt = eplb.rebalance_experts(weight, 16, 4, 2, 8)
    assert all(isinstance(a, FakeTensor) for a in (phy2log, log2phy, logcnt))
    np.testing.assert_array_equal(phy2log.numpy(), c.reference["readme_phy2log"])
    # DeepSeek's log2phy is as wide as the largest copy count.
    assert log2phy.shape == (2, 12, logcnt.numpy().max())


@pytest.mark.parametrize("dtype", [np.float16, np.int16, np.uint8, np.bool_, np.uint16, np.uint32])
def test_every_dtype_deepseek_takes_after_float(dtype, fake_torch):
    c = golden("deepseek_readme")  # loads below 256: exact in every dtype here but bool
    w = c.loads.astype(dtype)
    want = eplb.rebalance_experts(w.astype(np.float32), 16, 4, 2, 8)
    got = eplb.rebalance_experts(w, 16, 4, 2, 8)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    # The same through a tensor whose dtype numpy lacks.
    t = eplb.rebalance_experts(bf16_tensor(c.loads), 16, 4, 2, 8)
    np.testing.assert_array_equal(t[0].numpy(), c.reference["readme_phy2log"])


@pytest.mark.parametrize("dtype", [">f8", ">f4", ">i4", ">i8", "<f8", ">f2", ">u2"])
def test_any_byte_order_is_read_as_its_values(dtype):
    c = golden("deepseek_readme")
    want = eplb.rebalance_experts(c.loads.astype(np.float64), 16, 4, 2, 8)
    got = eplb.rebalance_experts(c.loads.astype(dtype), 16, 4, 2, 8)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_a_ragged_list_is_an_eplb_error():
    with pytest.raises(eplb.EplbError, match="weight: not a rectangular array"):
        eplb.rebalance_experts([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0]], 4, 1, 1, 4)


@pytest.mark.parametrize(
    "args, match",
    [
        ((13, 1, 1, 4), "not a multiple of num_gpus"),
        ((4, 1, 1, 4), "below the 12 logical experts"),
        ((16, 5, 1, 8), "do not split into num_groups = 5"),
        ((16, 0, 1, 8), "num_groups = 0 is out of range"),
        ((16.5, 4, 2, 8), "num_replicas = 16.5 is not an integer"),
        ((2**70, 4, 2, 8), "num_replicas = .* is out of range"),
    ],
)
def test_failed_preconditions_are_eplb_errors_and_assertion_errors(args, match):
    c = golden("deepseek_readme")
    with pytest.raises(AssertionError, match=match) as e:
        eplb.rebalance_experts(c.loads, *args)
    assert isinstance(e.value, eplb.EplbError)
    assert isinstance(e.value, eplb.PreconditionError)
    with pytest.raises(eplb.PreconditionError, match="not a number type"):
        eplb.rebalance_experts(np.array([["a", "b"]]), 2, 1, 1, 1)


# --- DeepSeek's rebalance_experts, restated in float64 --------------------------------------------
# Written from DeepSeek's documented interface (its README: ``phy2log, log2phy, logcnt``) and the
# algorithm as ../shared/data/golden/README.md states it ("What exact means"), not from its code.
# ``log2phy[l][e][k]`` is the slot of ``e``'s replica ``k``, replicas numbered in the order
# replication created them (the first copy 0, then each extra copy as it was chosen), and the
# tensor is as wide as the largest copy count.


def _pack(weights, packs):
    """Balanced packing: visit by weight descending (stable), each item into the lightest
    non-full pack (the first on ties); ``(pack, position in pack)`` per item."""
    n = len(weights)
    per = n // packs
    if per == 1:
        return list(range(n)), [0] * n
    order = sorted(range(n), key=lambda i: -weights[i])
    load, size = [0.0] * packs, [0] * packs
    pack, pos = [0] * n, [0] * n
    for i in order:
        p = min((q for q in range(packs) if size[q] < per), key=lambda q: load[q])
        pack[i], pos[i] = p, size[p]
        load[p] += weights[i]
        size[p] += 1
    return pack, pos


def _replicate(w, slots):
    """One copy each, then every extra slot to the first argmax of ``w / count``; returns the
    copies (experts first, extras in the order chosen), their replica numbers and the counts."""
    phy, num, count = list(range(len(w))), [0] * len(w), [1] * len(w)
    for _ in range(len(w), slots):
        e = max(range(len(w)), key=lambda i: w[i] / count[i])
        phy.append(e)
        num.append(count[e])
        count[e] += 1
    return phy, num, count


def deepseek_reference(weight, num_replicas, num_groups, num_nodes, num_gpus):
    weight = np.asarray(weight, dtype=np.float64)
    layers, n = weight.shape
    if num_groups % num_nodes != 0:
        num_groups, num_nodes = 1, 1
    gs, gpn = n // num_groups, num_groups // num_nodes
    epn, spn = n // num_nodes, num_replicas // num_nodes
    rpn, s = num_gpus // num_nodes, num_replicas // num_gpus
    phy2log = np.zeros((layers, num_replicas), dtype=np.int64)
    phyrank = np.zeros((layers, num_replicas), dtype=np.int64)
    for l in range(layers):
        w = [float(x) for x in weight[l]]
        group_w = [sum(w[g * gs:(g + 1) * gs]) for g in range(num_groups)]
        gpack, gpos = _pack(group_w, num_nodes)
        mlog2log = [0] * n
        for g in range(num_groups):
            base = (gpack[g] * gpn + gpos[g]) * gs
            for o in range(gs):
                mlog2log[base + o] = g * gs + o
        for node in range(num_nodes):
            m2l = mlog2log[node * epn:(node + 1) * epn]
            nw = [w[i] for i in m2l]
            phy, num, count = _replicate(nw, spn)
            pack, pos = _pack([nw[m] / count[m] for m in phy], rpn)
            for i, m in enumerate(phy):
                slot = node * spn + pack[i] * s + pos[i]
                phy2log[l, slot] = m2l[m]
                phyrank[l, slot] = num[i]
    logcnt = np.stack([np.bincount(row, minlength=n) for row in phy2log]).astype(np.int64)
    width = int(logcnt.max())
    log2phy = np.full((layers, n, width), -1, dtype=np.int64)
    for l in range(layers):
        for slot in range(num_replicas):
            log2phy[l, phy2log[l, slot], phyrank[l, slot]] = slot
    return phy2log, log2phy, logcnt


def test_the_reference_is_deepseeks_readme():
    c = golden("deepseek_readme")
    phy2log, _, logcnt = deepseek_reference(c.loads, 16, 4, 2, 8)
    np.testing.assert_array_equal(phy2log, c.reference["readme_phy2log"])
    assert (logcnt.sum(axis=1) == 16).all()


@pytest.mark.parametrize(
    "name, groups, nodes",
    [("deepseek_readme", 4, 2), ("deepseek_readme", 4, 3), ("flashlb_toy_tiefree", 1, 1),
     ("dsv3_prefill_ep32", None, None), ("dsv3_decode_ep64", None, None),
     ("esft_law_ep8", None, None), ("esft_intent_ep16", None, None), ("dsv3_decode_ep32", 1, 1)],
)
def test_the_tuple_is_deepseeks_element_for_element(name, groups, nodes):
    """phy2log, log2phy (its width and the order of each expert's replicas: the order DeepSeek
    created them, which is not ascending in the slot) and logcnt, as DeepSeek's rebalance_experts
    returns them."""
    c = golden(name)
    g = c.groups if groups is None else groups
    m = c.nodes if nodes is None else nodes
    got = eplb.rebalance_experts(c.loads, c.replicas, g, m, c.ranks)
    want = deepseek_reference(c.loads, c.replicas, g, m, c.ranks)
    for what, a, b in zip(("phy2log", "log2phy", "logcnt"), got, want):
        assert a.dtype == np.int64, what
        np.testing.assert_array_equal(a, b, err_msg=what)
    if c.exact("deepseek_hier") is not None and (g, m) == (c.groups, c.nodes):
        np.testing.assert_array_equal(got[0], c.exact("deepseek_hier"))


def test_replicas_are_in_creation_order_not_slot_order():
    """A case where DeepSeek lists an expert's later replica at a lower slot than its first
    copy (the packing put it on a lighter rank): ascending slots would differ."""
    c = golden("dsv3_prefill_ep32")
    _, log2phy, logcnt = eplb.rebalance_experts(c.loads, c.replicas, c.groups, c.nodes, c.ranks)
    rows = [(l, e) for l in range(c.layers) for e in range(c.experts) if logcnt[l, e] > 1]
    assert rows
    assert any((np.diff(log2phy[l, e, : logcnt[l, e]]) < 0).any() for l, e in rows)
