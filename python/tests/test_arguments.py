"""One rule per kind of argument, for every public function and class (issue 37, class 2):

- a count is an integer: a bool, a str or None is refused with EplbError;
- a number (a policy parameter, ``tokens_per_rank``) is an int or a float, not a bool or a str;
- a switch (``fused_mc2``, ``payoff_gate``) is True or False;
- loads are any numeric dtype in either byte order, or a torch tensor of any dtype (bfloat16
  through ``.float()``), or nested lists; a ragged list raises EplbError;
- expert ids (placements) are any integer dtype in either byte order, from numpy, torch or lists.
"""

from __future__ import annotations

import numpy as np
import pytest

import eplb
from conftest import FakeTensor, bf16_tensor, shared_file

LAW = "data/traces/esft_dsv2lite_law.json"
SIM = dict(ranks=8, redundant=8, policy="swift", heat_interval=10, algo_interval=5)


def small(name="swift", **kw):
    return eplb.Policy(name, layers=2, experts=8, ranks=4, redundant=4, **kw)


def loads_2x8():
    return np.array([[9, 1, 4, 7, 2, 8, 3, 5], [1, 1, 6, 2, 9, 3, 7, 4]], dtype=np.float64)


# --- counts, numbers and switches ---------------------------------------------------------------


@pytest.mark.parametrize("bad", [True, False, "8", None, 8.0])
@pytest.mark.parametrize("key", ["ranks", "redundant", "heat_interval", "algo_interval"])
def test_simulate_refuses_a_count_that_is_not_an_integer(key, bad):
    trace = shared_file(LAW)
    with pytest.raises(eplb.EplbError, match=key):
        eplb.simulate(trace, **{**SIM, key: bad})


@pytest.mark.parametrize("key", ["ranks_per_node", "groups", "seed", "hidden", "intermediate",
                                 "max_input_bytes"])
@pytest.mark.parametrize("bad", [True, "4", 4.0])
def test_simulate_refuses_an_optional_count_that_is_not_an_integer(key, bad):
    with pytest.raises(eplb.EplbError, match=key):
        eplb.simulate(shared_file(LAW), **{**SIM, key: bad})


def test_simulate_accepts_numpy_integers_and_a_policy_number():
    trace = shared_file(LAW)
    a = eplb.simulate(trace, **SIM)
    b = eplb.simulate(trace, **{**SIM, "ranks": np.int64(8), "redundant": np.uint16(8),
                                "policy": 2})  # 2 is swift, as `--policy 2`
    timing = {"policy_time_ms_mean", "policy_time_ms_max"}
    assert {k: v for k, v in a.items() if k not in timing} == {
        k: v for k, v in b.items() if k not in timing
    }


@pytest.mark.parametrize("bad", [True, "3", None, [3]])
def test_simulate_refuses_a_parameter_that_is_not_a_number(bad):
    # As Policy(..., swaps=True) does: a bool or a string is not a parameter value.
    with pytest.raises(eplb.EplbError, match="parameter `swaps`"):
        eplb.simulate(shared_file(LAW), **{**SIM, "policy": "random", "params": {"swaps": bad}})
    with pytest.raises(eplb.EplbError, match="swaps"):
        small("random", swaps=bad)


@pytest.mark.parametrize("bad", [True, "2048", [2048]])
def test_simulate_refuses_tokens_per_rank_that_is_not_a_number(bad):
    with pytest.raises(eplb.EplbError, match="tokens_per_rank"):
        eplb.simulate(shared_file(LAW), **SIM, tokens_per_rank=bad)


@pytest.mark.parametrize("key", ["fused_mc2", "payoff_gate"])
@pytest.mark.parametrize("bad", [1, "yes", 0.0])
def test_simulate_refuses_a_switch_that_is_not_a_bool(key, bad):
    with pytest.raises(eplb.EplbError, match=key):
        eplb.simulate(shared_file(LAW), **SIM, **{key: bad})


@pytest.mark.parametrize("key", ["policy", "initial", "routing", "model", "quant", "link",
                                 "hardware", "role"])
def test_simulate_refuses_a_name_that_is_not_a_string(key):
    with pytest.raises(eplb.EplbError, match=key):
        eplb.simulate(shared_file(LAW), **{**SIM, key: ["x"]})


@pytest.mark.parametrize("bad", [True, "4", 4.0])
def test_policy_refuses_a_count_that_is_not_an_integer(bad):
    for key in ("layers", "experts", "ranks", "redundant", "ranks_per_node", "groups", "seed"):
        kw = dict(layers=2, experts=8, ranks=4, redundant=4)
        with pytest.raises(eplb.EplbError, match=key):
            eplb.Policy("swift", **{**kw, key: bad})


@pytest.mark.parametrize("bad", [True, "8", None])
def test_map_functions_refuse_a_count_that_is_not_an_integer(bad, tmp_path):
    path = tmp_path / "map.json"
    eplb.write_map(path, small().rebalance(loads_2x8()).placement)
    with pytest.raises(eplb.EplbError, match="max_input_bytes"):
        eplb.read_map(path, max_input_bytes=bad)
    if bad is not None:  # None is the default of these two
        with pytest.raises(eplb.EplbError, match="experts"):
            eplb.validate_map(path, experts=bad)
        with pytest.raises(eplb.EplbError, match="ranks"):
            eplb.validate_map(path, ranks=bad)


@pytest.mark.parametrize("bad", [None, 1, b"even"])
def test_hotness_refuses_a_routing_that_is_not_a_string(bad):
    r = small().rebalance(loads_2x8())
    with pytest.raises(eplb.EplbError, match="routing"):
        eplb.hotness(r.placement, loads_2x8(), routing=bad)


# --- loads: any numeric dtype, either byte order, torch of any dtype ----------------------------

LOAD_DTYPES = [np.float16, np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_,
               ">f8", ">f4", ">i8", ">i4", "<f8", "<i2"]


@pytest.mark.parametrize("dtype", LOAD_DTYPES)
def test_rebalance_reads_loads_of_any_numeric_dtype_and_byte_order(dtype):
    loads = loads_2x8()
    if np.dtype(dtype).kind == "b":
        loads = loads > 4
    want = small().rebalance(loads.astype(np.float64))
    got = small().rebalance(loads.astype(dtype))
    np.testing.assert_array_equal(got.placement, want.placement)
    np.testing.assert_array_equal(got.par_after, want.par_after)
    # samples (flashlb) by the same rule
    s = np.stack([loads, loads]).astype(np.float64)
    want = small("flashlb").rebalance(loads.astype(np.float64), samples=s)
    got = small("flashlb").rebalance(loads.astype(dtype), samples=s.astype(dtype))
    np.testing.assert_array_equal(got.placement, want.placement)


@pytest.mark.parametrize("dtype", LOAD_DTYPES)
def test_hotness_reads_loads_of_any_numeric_dtype_and_byte_order(dtype):
    loads = loads_2x8()
    if np.dtype(dtype).kind == "b":
        loads = loads > 4
    p = small().rebalance(loads_2x8()).placement
    want = eplb.hotness(p, loads.astype(np.float64))
    got = eplb.hotness(p, loads.astype(dtype))
    np.testing.assert_array_equal(got.par, want.par)


@pytest.mark.parametrize("dtype", [np.complex64, object, "<U1", "M8[s]"])
def test_loads_of_a_dtype_that_is_not_a_number_are_refused(dtype):
    loads = np.ones((2, 8)).astype(dtype)
    with pytest.raises(eplb.EplbError, match="loads: dtype"):
        small().rebalance(loads)
    with pytest.raises(eplb.EplbError, match="loads: dtype"):
        eplb.hotness(small().rebalance(loads_2x8()).placement, loads)


def test_torch_loads_of_any_floating_dtype_bfloat16_included():
    loads = loads_2x8()  # small integers: exact in bfloat16
    want = small().rebalance(loads)
    for t in (bf16_tensor(loads), FakeTensor(loads.astype(np.float32)),
              FakeTensor(loads.astype(np.int64))):
        got = small().rebalance(t)
        np.testing.assert_array_equal(got.placement, want.placement)
        h = eplb.hotness(FakeTensor(want.placement), t)
        np.testing.assert_array_equal(h.par, want.par_after)


# --- expert ids: any integer dtype, either byte order ---------------------------------------------


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                                   np.uint64, ">i8", ">i4", ">u2", ">i2"])
def test_placements_of_any_integer_dtype_and_byte_order(dtype, tmp_path):
    loads = loads_2x8()
    cur = small().rebalance(loads).placement
    want = small("incremental", cold_start=1).rebalance(loads[::-1].copy(), cur)
    got = small("incremental", cold_start=1).rebalance(loads[::-1].copy(), cur.astype(dtype))
    np.testing.assert_array_equal(got.placement, want.placement)
    np.testing.assert_array_equal(eplb.hotness(cur.astype(dtype), loads).par,
                                  eplb.hotness(cur, loads).par)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    eplb.write_map(a, cur)
    eplb.write_map(b, cur.astype(dtype))
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.bool_])
def test_placements_of_a_non_integer_dtype_are_refused(dtype, tmp_path):
    cur = small().rebalance(loads_2x8()).placement.astype(dtype)
    for call in (lambda: small().rebalance(loads_2x8(), cur),
                 lambda: eplb.hotness(cur, loads_2x8()),
                 lambda: eplb.write_map(tmp_path / "m.json", cur)):
        with pytest.raises(eplb.EplbError, match="integer dtype"):
            call()


# --- ragged lists and non-arrays ---------------------------------------------------------------


RAGGED = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3]]


def test_a_ragged_list_is_an_eplb_error_everywhere(tmp_path):
    p = small().rebalance(loads_2x8()).placement
    ragged_ids = [[[0, 1], [2, 3]], [[4, 5], [6]]]
    calls = {
        "loads": lambda: small().rebalance(RAGGED),
        "samples": lambda: small("flashlb").rebalance(loads_2x8(), samples=[RAGGED, RAGGED]),
        "current": lambda: small().rebalance(loads_2x8(), ragged_ids),
        "hotness loads": lambda: eplb.hotness(p, RAGGED),
        "hotness placement": lambda: eplb.hotness(ragged_ids, loads_2x8()),
        "write_map": lambda: eplb.write_map(tmp_path / "m.json", ragged_ids),
        "rebalance_experts": lambda: eplb.rebalance_experts(RAGGED, 8, 1, 1, 4),
    }
    for what, call in calls.items():
        with pytest.raises(eplb.EplbError, match="not a rectangular array"):
            call()


@pytest.mark.parametrize("bad", [None, "loads", 3, True, {"a": 1}])
def test_a_non_array_is_an_eplb_error_everywhere(bad, tmp_path):
    p = small().rebalance(loads_2x8()).placement
    for call in (lambda: small().rebalance(bad),
                 lambda: eplb.hotness(p, bad),
                 lambda: eplb.hotness(bad, loads_2x8()),
                 lambda: eplb.write_map(tmp_path / "m.json", bad)):
        with pytest.raises(eplb.EplbError):
            call()


# --- numpy bools and paths ---------------------------------------------------------------------


def test_a_numpy_bool_is_neither_a_count_nor_a_number():
    with pytest.raises(eplb.EplbError, match="layers = .* is not an integer"):
        eplb.Policy("swift", layers=np.True_, experts=8, ranks=4, redundant=4)
    with pytest.raises(eplb.EplbError, match="`swaps`: expected a number, got a bool"):
        small("random", swaps=np.True_)
    with pytest.raises(eplb.EplbError, match="parameter `swaps`"):
        eplb.simulate(shared_file(LAW),
                      **{**SIM, "policy": "random", "params": {"swaps": np.True_}})
    with pytest.raises(eplb.EplbError, match="ranks"):
        eplb.simulate(shared_file(LAW), **{**SIM, "ranks": np.True_})


@pytest.mark.parametrize("bad", [None, 3, b"map.json", ["map.json"]])
def test_a_path_that_is_not_a_str_or_path_like_is_an_eplb_error(bad):
    p = small().rebalance(loads_2x8()).placement
    for call in (lambda: eplb.read_map(bad), lambda: eplb.validate_map(bad),
                 lambda: eplb.write_map(bad, p), lambda: eplb.simulate(bad, **SIM),
                 lambda: eplb.simulate(shared_file(LAW), **SIM, placements_log=bad or 3)):
        with pytest.raises(eplb.EplbError, match="is not a path"):
            call()
