"""The arguments of a rank that comes back (`placement=`, `live=`), checked by the native
runtime before anything starts: what is wrong and where (layer, rank, slot)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eplb import EplbError
from eplb._native import NativeRuntime
from eplb.runtime import initial_placement

LAYERS, EXPERTS, RANKS = 2, 8, 4
CFG = {"dynamic_eplb": True, "num_redundant_experts": 4}


@pytest.fixture(autouse=True)
def dynamic_env(monkeypatch):
    monkeypatch.setenv("DYNAMIC_EPLB", "true")


class Quiet:
    """A transport that is never called (construction runs no collective)."""


def peers_placement() -> np.ndarray:
    """The start-up placement with rank 2's rows retired (-1), as the peers hold it."""
    p = initial_placement(CFG, layers=LAYERS, experts=EXPERTS, ranks=RANKS).astype(np.int64)
    s = p.shape[1] // RANKS
    p[:, 2 * s : 3 * s] = -1
    return p


def joiner(monkeypatch, cfg=CFG, **kw):
    return NativeRuntime(
        json.dumps(cfg), False, layers=LAYERS, experts=EXPERTS, ranks=RANKS, rank=2,
        transport=Quiet(), expert_bytes=64, **kw,
    )


def test_a_joiner_starts_from_its_peers_placement_with_empty_rows(monkeypatch):
    p = peers_placement()
    rt = joiner(monkeypatch, placement=p, live=[0, 1, 3])
    try:
        assert (rt.placement() == p).all()
        assert rt.live() == [0, 1, 3]
        assert rt.health == "running"
        s = p.shape[1] // RANKS
        for l in range(LAYERS):
            # Nothing is routed to its own slots, and its expert map is empty.
            assert not ((rt.log2phy(l) >= 2 * s) & (rt.log2phy(l) < 3 * s)).any()
            assert (rt.expert_map(l) == -1).all()
        assert rt.stats()["cycles"] == 0
    finally:
        rt.close()


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"live": [0, 1, 2, 3]}, "rank 2 joins, but the live set it was handed holds it"),
        ({"live": [0, 1, 7]}, "live: rank 7 is not below the number of ranks 4"),
        ({"placement": "shape"}, "placement: shape \\[2, 6\\], expected \\[2, 12\\]"),
        ({"placement": "value"}, "placement: layer 1, rank 3, slot 2: 9 is neither an expert id"),
        ({"placement": "kept"}, "layer 0, rank 2, slot 0: rank 2 is not live but holds expert"),
        ({"live": None}, "placement and live go together"),
    ],
)
def test_a_bad_hand_over_is_refused(monkeypatch, kw, message):
    p = peers_placement()
    args = {"placement": p, "live": [0, 1, 3]}
    args.update(kw)
    if kw.get("placement") == "shape":
        args["placement"] = p[:, :6]
    elif kw.get("placement") == "value":
        args["placement"] = p.copy()
        args["placement"][1, 11] = 9
    elif kw.get("placement") == "kept":
        # The joiner's own rows are not empty: not what peers without it hold.
        args["placement"] = initial_placement(CFG, layers=LAYERS, experts=EXPERTS, ranks=RANKS)
    with pytest.raises(EplbError, match=message):
        joiner(monkeypatch, **args)


def test_a_static_deployment_has_no_joiner(monkeypatch):
    cfg = {"dynamic_eplb": False}
    p = initial_placement(cfg, layers=LAYERS, experts=EXPERTS, ranks=RANKS)
    with pytest.raises(EplbError, match="a rank joins only in a dynamic mode"):
        joiner(monkeypatch, cfg=cfg, placement=p, live=[0, 1, 3])
