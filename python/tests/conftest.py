"""Shared fixtures: the golden vectors (../shared/data/golden, relative to the project root) and a
tiny stand-in for torch, so that the adapters run without torch."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"

GOLDEN_CASES = [
    "deepseek_readme",
    "flashlb_toy",
    "flashlb_toy_tiefree",
    "asc_spec_3_6",
    "asc_spec_3_6_flashlb",
    "dsv3_prefill_ep32",
    "dsv3_decode_ep32",
    "dsv3_decode_ep64",
    "dsv3_prefill_ep64",
    "dsv3_drift_ep32",
    "esft_law_ep8",
    "esft_intent_ep16",
]
DSV3_CASES = [c for c in GOLDEN_CASES if c.startswith("dsv3_")]


def shared_file(rel: str) -> Path:
    p = SHARED / rel
    if not p.is_file():
        raise FileNotFoundError(
            f"required test input {p} is missing (tests read ../shared relative to the project root)"
        )
    return p


class Case:
    """One golden case, as numpy arrays."""

    def __init__(self, name: str):
        raw = json.loads(shared_file(f"data/golden/{name}.json").read_text())
        assert raw["schema"] == "eplb-golden/v1", name
        sh = raw["shape"]
        self.name = name
        self.layers, self.experts = sh["num_layers"], sh["num_experts"]
        self.ranks, self.slots = sh["num_ranks"], sh["slots_per_rank"]
        self.groups, self.nodes = sh["num_groups"], sh["num_nodes"]
        self.replicas = self.ranks * self.slots
        self.redundant = self.replicas - self.experts
        inp = raw["input"]
        self.current = np.array(inp["current_placement"], dtype=np.int64)
        flat = self.current.reshape(self.layers, -1)
        self.windows = None
        if "window_loads" in inp:
            self.windows = np.array(inp["window_loads"], dtype=np.float64)
        elif "window_slot_loads" in inp:
            ws = np.array(inp["window_slot_loads"], dtype=np.float64)
            self.windows = np.stack([self._fold(flat, w.reshape(self.layers, -1)) for w in ws])
        if "loads" in inp:
            self.loads = np.array(inp["loads"], dtype=np.float64)
        elif "slot_loads" in inp:
            sl = np.array(inp["slot_loads"], dtype=np.float64).reshape(self.layers, -1)
            self.loads = self._fold(flat, sl)
        else:
            self.loads = self.windows.sum(axis=0)
        self.lower_bound = np.array(raw["lower_bound"]["par"])
        self.expected = raw["expected"]
        self.reference = raw.get("reference", {})

    def _fold(self, flat, slot_loads):
        out = np.zeros((self.layers, self.experts))
        for l in range(self.layers):
            np.add.at(out[l], flat[l], slot_loads[l])
        return out

    def exact(self, peer: str):
        e = self.expected.get(peer, {})
        if e.get("match") == "exact" and "placement" in e:
            return np.array(e["placement"], dtype=np.int64)
        return None

    def metric(self, peer: str):
        e = self.expected.get(peer, {})
        if "placement" not in e:
            return None
        return e["metrics"]["par_mean"], e.get("tolerance", {}).get("par_mean_rel", 0.0)


_cases = {}


def golden(name: str) -> Case:
    if name not in _cases:
        _cases[name] = Case(name)
    return _cases[name]


def even_par(placement, loads) -> np.ndarray:
    """Per-layer PAR with each expert's load split evenly over its copies (golden README)."""
    p = np.asarray(placement)
    layers = p.shape[0]
    ranks = p.shape[1] if p.ndim == 3 else None
    flat = p.reshape(layers, -1)
    out = np.zeros(layers)
    for l in range(layers):
        cnt = np.bincount(flat[l], minlength=loads.shape[1])
        per_copy = loads[l] / cnt
        rl = per_copy[flat[l]].reshape(ranks if ranks else -1, -1).sum(axis=1)
        out[l] = rl.max() / rl.mean() if rl.mean() > 0 else 1.0
    return out


# --- a tiny torch stand-in, or real torch --------------------------------------------------------

#: ``EPLB_TEST_TORCH=real`` (set by ``cargo xtask python`` in the torch venv that ``.ci/run``
#: installs): the adapter tests run against real torch tensors (on the CPU) instead of the
#: stand-in below.
REAL_TORCH = os.environ.get("EPLB_TEST_TORCH") == "real"


class _StandInTensor:
    """What the adapters use of a torch tensor: .cpu(), .numpy(), .detach(), .dim(), .shape,
    .dtype, .device, .permute(); .numpy() refuses a tensor that is not on the CPU, as torch does."""

    def __init__(self, arr, device="cpu"):
        self._a = np.asarray(arr)
        self.device = device

    def cpu(self):
        return _StandInTensor(self._a, "cpu")

    def to(self, device):
        return _StandInTensor(self._a, device)

    def numpy(self):
        if self.device != "cpu":
            raise TypeError(f"can't convert {self.device} device type tensor to numpy")
        return self._a

    def detach(self):
        return self

    def dim(self):
        return self._a.ndim

    def permute(self, *dims):
        return _StandInTensor(self._a.transpose(dims), self.device)

    def is_contiguous(self):
        return self._a.flags["C_CONTIGUOUS"]

    @property
    def shape(self):
        return self._a.shape

    @property
    def dtype(self):
        return self._a.dtype

    def tolist(self):
        return self._a.tolist()


class _Bf16StandIn(_StandInTensor):
    """A tensor whose dtype numpy has not (bfloat16): ``.numpy()`` fails until ``.float()``."""

    def cpu(self):
        return self

    def numpy(self):
        raise TypeError("Got unsupported ScalarType BFloat16")

    def float(self):
        return _StandInTensor(self._a.astype(np.float32), self.device)


def _fake_torch_module():
    m = types.ModuleType("torch")
    m.Tensor = _StandInTensor
    m.from_numpy = lambda a: _StandInTensor(a)
    m.tensor = lambda data, dtype=None: _StandInTensor(np.asarray(data, dtype=dtype))
    m.int64, m.int32, m.float32 = np.int64, np.int32, np.float32
    m.__eplb_fake__ = True
    return m


if REAL_TORCH:
    import torch as _torch

    class _IsTensor(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, _torch.Tensor)

    class FakeTensor(metaclass=_IsTensor):
        """Real mode: a real torch tensor on the CPU (the only device here: a test's device
        name is not used)."""

        def __new__(cls, arr, device="cpu"):
            return _torch.from_numpy(np.ascontiguousarray(np.asarray(arr)))

    def bf16_tensor(arr):
        """A real bfloat16 tensor."""
        return _torch.from_numpy(np.asarray(arr, dtype=np.float32)).to(_torch.bfloat16)

    @pytest.fixture
    def fake_torch():
        return _torch

else:
    FakeTensor = _StandInTensor

    def bf16_tensor(arr):
        """A tensor of a dtype numpy lacks (the stand-in's bfloat16)."""
        return _Bf16StandIn(arr)

    @pytest.fixture
    def fake_torch(monkeypatch):
        mod = _fake_torch_module()
        monkeypatch.setitem(sys.modules, "torch", mod)
        return mod


def tensor_dtype(t) -> np.dtype:
    """The numpy dtype of a tensor (stand-in or real)."""
    return np.dtype(t.numpy().dtype)


def tensor_device(t) -> str:
    """The device of a tensor as a string (``"cpu"``)."""
    return str(t.device)


def install_modules(monkeypatch, modules: dict):
    """Puts stand-in modules (``{dotted name: module}``) and their parent packages into
    ``sys.modules`` for one test."""
    for name, mod in modules.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in sys.modules or not getattr(sys.modules[parent], "__eplb_standin__", False):
                pkg = types.ModuleType(parent)
                pkg.__path__ = []
                pkg.__eplb_standin__ = True
                monkeypatch.setitem(sys.modules, parent, pkg)
        mod.__eplb_standin__ = True
        monkeypatch.setitem(sys.modules, name, mod)
        parent = sys.modules[".".join(parts[:-1])] if len(parts) > 1 else None
        if parent is not None:
            monkeypatch.setattr(parent, parts[-1], mod, raising=False)
