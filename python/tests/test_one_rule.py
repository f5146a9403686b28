"""One rule per number (issue 37, class 1): ``eplb.simulate`` refuses the same absurd values as
the CLI and the ``eplb_config`` reader, with the same words (``eplb_core::settings``)."""

from __future__ import annotations

import os
import subprocess

import pytest

import eplb
from conftest import shared_file

TOKENS = ("tokens per rank must be a number in (0, 1048576], got 1e300 (no batch puts more than "
          "2^20 tokens on one rank in one iteration)")
HEAT = ("heat interval must be an integer in 1..=4294967295, got -1 (zero never completes a "
        "cycle)")
REDUNDANT = ("redundant experts must be an integer in 0..=65535, got 70000 (a layer's slots are "
             "numbered in 16 bits)")
LINK = ("link must be a rate in [1e6, 1e15] bytes/s (8 Mbit/s to 8 Pbit/s), got 1.25e-292 "
        "(beyond any link or memory)")

CASES = [
    (dict(tokens_per_rank=1e300), TOKENS, ["--tokens-per-rank", "1e300"]),
    (dict(heat_interval=-1), HEAT, ["--heat-interval", "-1"]),
    (dict(redundant=70000), REDUNDANT, ["--redundant", "70000"]),
    (dict(link="1e-300gbps"), LINK, ["--link", "1e-300gbps"]),
]


@pytest.mark.parametrize("override,message,flags", CASES)
def test_simulate_refuses_what_the_cli_refuses_with_the_same_words(override, message, flags):
    trace = shared_file("data/traces/esft_dsv2lite_law.json")
    opts = dict(ranks=8, redundant=8, policy="swift", heat_interval=10, algo_interval=1)
    opts.update(override)
    with pytest.raises(eplb.EplbError) as e:
        eplb.simulate(trace, **opts)
    assert message in str(e.value)
    eplb_bin = os.environ.get("EPLB_BIN")
    if eplb_bin:
        args = [eplb_bin, "simulate", "--trace", str(trace), "--ranks", "8", "--policy", "swift"]
        for flag, value in (("--redundant", "8"), ("--heat-interval", "10"),
                            ("--algo-interval", "1")):
            if flag not in flags:
                args += [flag, value]
        p = subprocess.run(args + flags, capture_output=True, text=True)
        assert p.returncode != 0
        assert message in p.stderr
