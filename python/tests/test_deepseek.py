"""eplb.deepseek: DeepSeek's signature, torch or numpy in, the same kind out."""

from __future__ import annotations

import numpy as np

from conftest import FakeTensor, golden
from eplb import deepseek


def test_numpy_in_numpy_out_readme_vector():
    c = golden("deepseek_readme")
    phy2log, log2phy, logcnt = deepseek.rebalance_experts(c.loads, 16, 4, 2, 8)
    assert all(isinstance(a, np.ndarray) for a in (phy2log, log2phy, logcnt))
    np.testing.assert_array_equal(phy2log, c.exact("deepseek_hier"))
    np.testing.assert_array_equal(phy2log, c.reference["readme_phy2log"])  # DeepSeek's README
    assert logcnt.shape == (2, 12) and (logcnt.sum(axis=1) == 16).all()
    assert log2phy.shape == (2, 12, 5)


def test_torch_in_torch_out(fake_torch):
    c = golden("dsv3_prefill_ep64")
    w = FakeTensor(c.loads.astype(np.float32))
    phy2log, log2phy, logcnt = deepseek.rebalance_experts(w, c.replicas, c.groups, c.nodes, c.ranks)
    assert all(isinstance(a, FakeTensor) for a in (phy2log, log2phy, logcnt))
    assert phy2log.dtype == np.int64
    np.testing.assert_array_equal(phy2log.numpy(), c.exact("deepseek_hier"))
    p = phy2log.numpy()
    for l in range(c.layers):
        for e in range(c.experts):
            ids = np.flatnonzero(p[l] == e)
            assert logcnt.numpy()[l, e] == len(ids)
            assert set(log2phy.numpy()[l, e, : len(ids)]) == set(ids)
