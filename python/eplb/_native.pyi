"""Type stubs of ``eplb._native``, the Rust extension (``python/src``). The public API is
``eplb`` itself; these are what it and the adapters call. ``_panic_for_test`` exists only in
the test build (cargo feature ``test-panic``) and is left out here. ``python -m mypy.stubtest
eplb._native`` (run by ``cargo xtask python``) checks them against the built module."""

from os import PathLike
from typing import Any, Optional, Union, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "EplbError",
    "NativePolicy",
    "NativeRuntime",
    "ExchangePlan",
    "startup_placement",
    "Rebalance",
    "rebalance_experts",
    "hotness",
    "read_map",
    "validate_map",
    "map_json",
    "write_map",
    "simulate",
    "policy_params",
    "keep_slots",
    "fold_slot_loads",
    "derive_maps",
    "repair_current",
    "policy_name",
    "PayoffGate",
    "__version__",
]

__version__: str

_Path = Union[str, PathLike[str]]
_I64 = npt.NDArray[np.int64]
_F64 = npt.NDArray[np.float64]

class EplbError(ValueError): ...

@final
class NativePolicy:
    def __new__(
        cls,
        name: str,
        layers: int,
        experts: int,
        ranks: int,
        redundant: int,
        ranks_per_node: Optional[int] = None,
        groups: Optional[int] = None,
        seed: int = 0,
        params: Optional[dict[str, Any]] = None,
    ) -> NativePolicy: ...
    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, int, int, int, int, int]: ...
    def fork_copy(self) -> NativePolicy: ...
    def reset(self) -> None: ...
    def rebalance(
        self,
        loads: npt.ArrayLike,
        current: Optional[npt.ArrayLike] = None,
        samples: Optional[npt.ArrayLike] = None,
    ) -> Rebalance: ...

@final
class Rebalance:
    """What ``Policy.rebalance`` returns (read-only; pickles and copies)."""

    def __new__(
        cls,
        placement: _I64,
        par_before: _F64,
        par_after: _F64,
        changed: npt.NDArray[np.bool_],
        moves: _I64,
        par_before_mean: float,
        par_before_max: float,
        par_after_mean: float,
        par_after_max: float,
        colocated_rows: int,
        rust_seconds: float,
    ) -> Rebalance: ...
    def __getnewargs__(
        self,
    ) -> tuple[
        _I64, _F64, _F64, npt.NDArray[np.bool_], _I64, float, float, float, float, int, float
    ]: ...
    @property
    def placement(self) -> _I64: ...
    @property
    def par_before(self) -> _F64: ...
    @property
    def par_after(self) -> _F64: ...
    @property
    def changed(self) -> npt.NDArray[np.bool_]: ...
    @property
    def moves(self) -> _I64: ...
    @property
    def par_before_mean(self) -> float: ...
    @property
    def par_before_max(self) -> float: ...
    @property
    def par_after_mean(self) -> float: ...
    @property
    def par_after_max(self) -> float: ...
    @property
    def colocated_rows(self) -> int: ...
    @property
    def rust_seconds(self) -> float: ...
    @property
    def moves_total(self) -> int: ...

def rebalance_experts(
    weight: npt.ArrayLike, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[_I64, _I64, _I64]: ...
def hotness(
    placement: npt.ArrayLike, loads: npt.ArrayLike, routing: str = "even"
) -> tuple[_F64, float, float]: ...
def read_map(path: str, max_input_bytes: int = ...) -> _I64: ...
def validate_map(
    path: str,
    experts: Optional[int] = None,
    ranks: Optional[int] = None,
    max_input_bytes: int = ...,
) -> list[str]: ...
def map_json(placement: npt.ArrayLike) -> str: ...
def write_map(path: _Path, placement: npt.ArrayLike) -> None: ...
def simulate(
    trace: _Path,
    ranks: int,
    redundant: int,
    policy: str,
    heat_interval: int,
    algo_interval: int,
    *,
    ranks_per_node: Optional[int] = None,
    groups: Optional[int] = None,
    initial: str = ...,  # "default"
    routing: str = ...,  # "log2phy"
    seed: int = 0,
    params: list[tuple[str, float]] = ...,
    placements_log: Optional[_Path] = None,
    model: Optional[str] = None,
    hidden: Optional[int] = None,
    intermediate: Optional[int] = None,
    quant: Optional[str] = None,
    fused_mc2: bool = False,
    link: Optional[str] = None,
    max_input_bytes: int = ...,
    hardware: Optional[str] = None,
    role: Optional[str] = None,
    tokens_per_rank: Optional[float] = None,
    payoff_gate: bool = False,
) -> tuple[dict[str, Any], list[str]]: ...
def policy_params() -> list[tuple[str, list[str]]]: ...
def keep_slots(old: npt.ArrayLike, new: npt.ArrayLike, ranks: Optional[int] = None) -> _I64: ...
def fold_slot_loads(table: npt.ArrayLike, slot_loads: npt.ArrayLike, experts: int) -> _F64: ...
def derive_maps(phy2log: npt.ArrayLike, experts: int) -> tuple[_I64, _I64]: ...
def repair_current(
    current: npt.ArrayLike, layers: int, experts: int, ranks: int, slots: int
) -> Optional[_I64]: ...
def policy_name(name: str) -> str: ...
@final
class PayoffGate:
    def __new__(cls, text: str, source: str) -> PayoffGate: ...
    @property
    def text(self) -> str: ...
    @property
    def on(self) -> bool: ...
    @property
    def summary(self) -> str: ...
    def apply(
        self,
        current: npt.ArrayLike,
        plan: npt.ArrayLike,
        loads: npt.ArrayLike,
        ranks_per_node: Optional[int] = None,
        iterations: Optional[int] = None,
    ) -> tuple[_I64, npt.NDArray[np.bool_], tuple[int, int, float, float, float]]: ...

@final
class ExchangePlan:
    @property
    def layer(self) -> int: ...
    @property
    def sends(self) -> list[tuple[int, int, int]]: ...
    @property
    def recvs(self) -> list[tuple[int, int, int]]: ...
    @property
    def loads(self) -> list[tuple[int, int]]: ...
    @property
    def install(self) -> list[tuple[int, int]]: ...
    @property
    def new_row(self) -> list[int]: ...
    @property
    def cycle(self) -> int: ...

@final
class NativeRuntime:
    def __new__(
        cls,
        config: str,
        config_is_path: bool,
        *,
        layers: int,
        experts: int,
        ranks: int,
        rank: int,
        transport: Any,
        expert_bytes: int,
        ranks_per_node: Optional[int] = None,
        groups: int = 1,
        max_num_seqs: int = 256,
        speculative_tokens: int = 0,
        tp_size: int = 1,
        placement: Optional[Any] = None,
        live: Optional[list[int]] = None,
    ) -> NativeRuntime: ...
    @property
    def mode(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def shape_info(self) -> tuple[int, int, int, int]: ...
    def placement_hash(self) -> int: ...
    def before_forward(self) -> None: ...
    def after_forward(self, slot_counts: Any, padded_tokens: int) -> None: ...
    def last_events(self) -> dict[str, Any]: ...
    def placement(self) -> _I64: ...
    def log2phy(self, layer: int) -> _I64: ...
    def expert_map(self, layer: int) -> npt.NDArray[np.int32]: ...
    def remove_ranks(self, ranks: list[int]) -> None: ...
    def add_ranks(self, ranks: list[int]) -> None: ...
    def resume(self) -> None: ...
    def live(self) -> list[int]: ...
    @property
    def health(self) -> str: ...
    @property
    def is_updating(self) -> bool: ...
    def stats(self) -> dict[str, Any]: ...
    def metrics_text(self) -> str: ...
    def record_iteration_ms(self, ms: float) -> None: ...
    def wait_for_plan(self, timeout_s: float) -> bool: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...

def startup_placement(
    config: str,
    config_is_path: bool,
    *,
    layers: int,
    experts: int,
    ranks: int,
    ranks_per_node: Optional[int] = None,
    groups: int = 1,
) -> _I64: ...
