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
