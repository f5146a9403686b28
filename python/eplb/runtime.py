"""The whole eplb runtime inside a PyTorch engine: :class:`Runtime`, one per EP rank.

The Rust runtime's controller drives the cycle (heat intervals and stage filter, the planner on
its own Rust thread with digest agreement, the layer-by-layer exchange with its vote, the
pay-off gate, recovery from one-sided faults, elastic membership, metrics, heat recording,
record and static modes); this module only executes its transport primitives over
torch.distributed: collectives on the process group, a layer's weights moved with
``batch_isend_irecv`` into receive buffers and copied into the slots only after every live rank
voted yes. ``docs/torch.md`` shows an engine how to wire it.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from ._native import EplbError, NativeRuntime, startup_placement

__all__ = ["Runtime", "initial_placement"]

log = logging.getLogger("eplb.runtime")

#: Words of a collective's first round: the length and up to this many words. The rank
#: machine's agreements are 5 words long, so they take one all-gather; longer gathers (the heat)
#: take a second one. The lengths are compared first, so ranks at different steps fail the
#: collective together instead of hanging in mismatched gathers.
_HEAD = 5


def _torch() -> Any:
    import torch

    return torch


def _dist() -> Any:
    import torch.distributed as dist

    return dist


class _TorchTransport:
    """The transport primitives the Rust controller calls (with the GIL), over a
    torch.distributed process group whose ranks are the live EP ranks in ascending order."""

    def __init__(
        self,
        rank: int,
        ranks: int,
        experts: int,
        group: Any,
        weights: list[list[Any]],
        device: Any,
        timeout: Optional[float],
    ) -> None:
        torch = _torch()
        dist = _dist()
        self.rank = rank
        self.ranks = ranks
        self.experts = experts
        self.group = group
        self.weights = weights
        self.device = device
        self.timeout = timeout
        backend = str(dist.get_backend(group)).lower()
        # NCCL and HCCL run collectives on device tensors only; gloo on CPU tensors.
        self.coll_device = device if backend in ("nccl", "hccl") else torch.device("cpu")
        self.live: list[int] = list(range(ranks))
        self.group_rank = {q: q for q in self.live}
        self.pending_groups: dict[tuple[int, ...], Any] = {}
        self.backup: dict[tuple[int, int], list[Any]] = {}
        # Per layer: receive buffers (index -> one tensor per weight), and the launched works.
        self.buffers: dict[int, dict[int, list[Any]]] = {}
        self.works: dict[int, list[Any]] = {}
        self.send_works: list[Any] = []
        self.launched_at: dict[int, float] = {}
        self.counters = {
            "bytes_sent": 0,
            "bytes_received": 0,
            "bytes_loaded": 0,
            "exchanges": 0,
            "exchange_seconds": 0.0,
            "last_exchange_seconds": 0.0,
            "wait_seconds": 0.0,
        }
        self._p2p_group_peer = "group_peer" in inspect.signature(dist.P2POp.__init__).parameters

    # --- collectives ---------------------------------------------------------------------

    def _gather(self, words: np.ndarray) -> np.ndarray:
        torch = _torch()
        dist = _dist()
        t = torch.from_numpy(np.ascontiguousarray(words).view(np.int64))
        if t.device != self.coll_device:
            t = t.to(self.coll_device)
        n = t.numel()
        out = torch.empty(len(self.live) * n, dtype=torch.int64, device=self.coll_device)
        dist.all_gather_into_tensor(out, t, group=self.group)
        return np.ascontiguousarray(out.cpu().numpy()).view(np.uint64).reshape(-1, n)

    def all_gather(self, local: np.ndarray) -> np.ndarray:
        n = int(local.size)
        head = np.zeros(1 + _HEAD, dtype=np.uint64)
        head[0] = n
        k = min(n, _HEAD)
        head[1 : 1 + k] = local[:k]
        rows = self._gather(head)
        lens = rows[:, 0]
        if (lens != n).any():
            raise RuntimeError(
                f"all_gather: the live ranks {self.live} contribute {lens.tolist()} words: "
                "they are at different steps"
            )
        if n <= _HEAD:
            return np.ascontiguousarray(rows[:, 1 : 1 + n]).reshape(-1)
        return self._gather(local).reshape(-1)

    def set_live(self, ranks: list[int]) -> None:
        ranks = sorted(int(q) for q in ranks)
        if ranks == self.live:
            return
        group = self.pending_groups.pop(tuple(ranks), None)
        if group is None:
            raise RuntimeError(
                f"rank {self.rank}: no process group was handed over for the live ranks {ranks} "
                "(pass group= to remove_ranks/add_ranks)"
            )
        dist = _dist()
        size, me = dist.get_world_size(group), dist.get_rank(group)
        if size != len(ranks) or me != ranks.index(self.rank):
            raise RuntimeError(
                f"rank {self.rank}: the group handed over for the live ranks {ranks} has "
                f"{size} ranks and this process is its rank {me} (expected {len(ranks)} and "
                f"{ranks.index(self.rank)}: the live EP ranks in ascending order)"
            )
        self.group = group
        self.live = ranks
        self.group_rank = {q: i for i, q in enumerate(ranks)}
        self.pending_groups.clear()

    def gather_on(self, group: Any, size: int, words: np.ndarray) -> np.ndarray:
        """``words`` of every rank of ``group`` (``size`` ranks), ``[size, len(words)]``."""
        torch = _torch()
        dist = _dist()
        t = torch.from_numpy(np.ascontiguousarray(words).view(np.int64)).to(self.coll_device)
        out = torch.empty(size * t.numel(), dtype=torch.int64, device=self.coll_device)
        dist.all_gather_into_tensor(out, t, group=group)
        return np.ascontiguousarray(out.cpu().numpy()).view(np.uint64).reshape(size, -1)

    def replace_group(self, group: Any) -> None:
        dist = _dist()
        size, me = dist.get_world_size(group), dist.get_rank(group)
        if size != len(self.live) or me != self.live.index(self.rank):
            raise EplbError(
                f"rank {self.rank}: the group has {size} ranks and this process is its rank {me}; "
                f"the live EP ranks are {self.live} (expected {len(self.live)} ranks, this one at "
                f"{self.live.index(self.rank)})"
            )
        self.group = group
        self.works.clear()
        self.send_works = []

    # --- one layer's exchange ------------------------------------------------------------

    def _op(self, fn: Any, tensor: Any, peer: int, tag: int) -> Any:
        dist = _dist()
        g = self.group_rank[peer]
        if self._p2p_group_peer:
            return dist.P2POp(fn, tensor, group=self.group, tag=tag, group_peer=g)
        return dist.P2POp(fn, tensor, dist.get_global_rank(self.group, g), self.group, tag)

    def _tag(self, plan: Any, expert: int, i: int) -> int:
        """The message's tag: its layer, expert and weight tensor, and the cycle (modulo what
        fits in 31 bits), so that a receive left posted by a timed-out exchange never takes a
        later cycle's message (gloo matches by tag; NCCL ignores tags and matches by order)."""
        t = len(self.weights[plan.layer])
        span = len(self.weights) * self.experts * t
        cycles = max(1, (2**31 - 1) // span)
        return (plan.cycle % cycles) * span + (plan.layer * self.experts + expert) * t + i

    def _sends(self, plan: Any) -> list[Any]:
        dist = _dist()
        ws = self.weights[plan.layer]
        ops = []
        for peer, expert, slot in plan.sends:
            for i, w in enumerate(ws):
                src = w[slot]
                if not src.is_contiguous():
                    src = src.contiguous()
                ops.append(self._op(dist.isend, src, peer, self._tag(plan, expert, i)))
                self.counters["bytes_sent"] += src.numel() * src.element_size()
        return ops

    def launch(self, plan: Any) -> None:
        torch = _torch()
        dist = _dist()
        layer = plan.layer
        self._reap()
        ws = self.weights[layer]
        bufs = self.buffers.setdefault(layer, {})
        ops = self._sends(plan)
        for peer, expert, buf in plan.recvs:
            dst = [torch.empty_like(w[0]) for w in ws]
            bufs[buf] = dst
            for i, d in enumerate(dst):
                ops.append(self._op(dist.irecv, d, peer, self._tag(plan, expert, i)))
                self.counters["bytes_received"] += d.numel() * d.element_size()
        self.launched_at[layer] = time.perf_counter()
        self.works[layer] = dist.batch_isend_irecv(ops) if ops else []

    def launch_sends(self, plan: Any) -> None:
        dist = _dist()
        ops = self._sends(plan)
        if ops:
            self.send_works.extend(dist.batch_isend_irecv(ops))

    def _wait_work(self, w: Any) -> None:
        if self.timeout is None:
            w.wait()
        else:
            import datetime

            w.wait(timeout=datetime.timedelta(seconds=self.timeout))

    def _reap(self) -> None:
        self.send_works = [w for w in self.send_works if not w.is_completed()]

    def wait(self, plan: Any) -> None:
        layer = plan.layer
        works = self.works.pop(layer, [])
        t0 = time.perf_counter()
        for w in works:
            self._wait_work(w)
        for w in self.send_works:
            self._wait_work(w)
        self.send_works = []
        now = time.perf_counter()
        self.counters["wait_seconds"] += now - t0
        took = now - self.launched_at.pop(layer, now)
        self.counters["exchanges"] += 1
        self.counters["exchange_seconds"] += took
        self.counters["last_exchange_seconds"] = took

    def load(self, plan: Any) -> None:
        layer = plan.layer
        ws = self.weights[layer]
        bufs = self.buffers.setdefault(layer, {})
        for expert, buf in plan.loads:
            src = self.backup.get((layer, expert))
            if src is None:
                raise KeyError(
                    f"rank {self.rank}: layer {layer} expert {expert} has no copy on a live rank "
                    "and no host copy was registered (Runtime.register_backup)"
                )
            bufs[buf] = [
                s.to(device=w.device, dtype=w.dtype).reshape(w.shape[1:]).clone()
                for s, w in zip(src, ws)
            ]
            self.counters["bytes_loaded"] += sum(s.numel() * s.element_size() for s in src)

    def commit(self, plan: Any) -> None:
        layer = plan.layer
        ws = self.weights[layer]
        bufs = self.buffers.get(layer, {})
        install = plan.install
        # Local moves read a snapshot, so a permutation within this rank is right.
        snap: dict[int, list[Any]] = {}
        for kind, idx in install:
            if kind == 1 and idx not in snap:
                snap[idx] = [w[idx].clone() for w in ws]
        for kind, idx in install:
            if kind in (2, 3) and idx not in bufs:
                raise RuntimeError(
                    f"rank {self.rank}: layer {layer}: receive buffer {idx} holds nothing"
                )
        for slot, (kind, idx) in enumerate(install):
            if kind == 0:
                continue
            src = snap[idx] if kind == 1 else bufs[idx]
            for w, s in zip(ws, src):
                w[slot].copy_(s)
        self.buffers.pop(layer, None)

    def abort(self, plan: Any) -> None:
        self.buffers.pop(plan.layer, None)
        self.works.pop(plan.layer, None)
        self.launched_at.pop(plan.layer, None)


def _joiner(
    placement: Any, live: Optional[Sequence[int]], rank: Optional[int], ws: list[list[Any]],
    group: Any,
) -> tuple[int, int, np.ndarray, list[int]]:
    """A rank that comes back: its EP rank, the number of EP ranks (the placement's width over
    this rank's slots), the placement as an int64 array, and its peers' live ranks."""
    dist = _dist()
    if placement is None or live is None:
        raise EplbError(
            "placement and live go together: a rank that comes back is given both (the peers' "
            "placement() and live())"
        )
    p = np.asarray(placement)
    if p.ndim != 2:
        raise EplbError(
            f"placement: expected [layers, ranks * slots] (the peers' placement()), got shape "
            f"{list(p.shape)}"
        )
    slots = int(ws[0][0].shape[0])
    if slots <= 0 or p.shape[1] % slots:
        raise EplbError(
            f"placement: {p.shape[1]} slots per layer is not a multiple of this rank's {slots} "
            "slots (the weights' first dimension)"
        )
    ranks = p.shape[1] // slots
    peers = sorted(int(q) for q in live)
    if rank is None:
        missing = [q for q in range(ranks) if q not in peers]
        if len(missing) != 1:
            raise EplbError(
                f"rank: the live ranks {peers} of {ranks} leave {missing} out; pass rank= (this "
                "process's EP rank)"
            )
        rank = missing[0]
    rank = int(rank)
    if not 0 <= rank < ranks:
        raise EplbError(f"rank {rank} is not below the number of ranks {ranks}")
    if rank in peers:
        raise EplbError(
            f"live: {peers} holds rank {rank}, the one that joins (hand over the peers' live "
            "ranks, without it)"
        )
    new = sorted(peers + [rank])
    size, me = dist.get_world_size(group), dist.get_rank(group)
    if size != len(new) or me != new.index(rank):
        raise EplbError(
            f"rank {rank}: the group has {size} ranks and this process is its rank {me}; the "
            f"live EP ranks after the join are {new} (expected {len(new)} ranks, this one at "
            f"{new.index(rank)})"
        )
    return rank, ranks, np.ascontiguousarray(p, dtype=np.int64), peers


def _config_arg(config: Any) -> tuple[str, bool]:
    if isinstance(config, dict):
        return json.dumps(config), False
    if isinstance(config, (str, os.PathLike)):
        return os.fspath(config), True
    raise EplbError(
        f"config: expected an eplb_config dict or the path of a JSON file, got "
        f"{type(config).__name__}"
    )


def _check_weights(weights: Any, layers: int) -> tuple[list[list[Any]], Any, int]:
    """The weights as lists, their one device, and one expert's bytes."""
    torch = _torch()
    if not isinstance(weights, (list, tuple)) or len(weights) != layers:
        got = len(weights) if isinstance(weights, (list, tuple)) else type(weights).__name__
        raise EplbError(f"weights: expected a list of {layers} MoE layers, got {got}")
    out: list[list[Any]] = []
    device = None
    per_layer = None
    for l, tensors in enumerate(weights):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if not isinstance(tensors, (list, tuple)) or not tensors:
            raise EplbError(f"weights: layer {l}: expected a non-empty list of tensors")
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise EplbError(
                    f"weights: layer {l} tensor {i}: expected a torch tensor, got "
                    f"{type(t).__name__}"
                )
            if t.dim() < 1:
                raise EplbError(f"weights: layer {l} tensor {i}: a scalar has no slot dimension")
            if device is None:
                device = t.device
            elif t.device != device:
                raise EplbError(
                    f"weights: layer {l} tensor {i} is on {t.device}, the others on {device}: "
                    "every expert weight must be on one device"
                )
        shapes = [(tuple(t.shape[1:]), t.dtype) for t in tensors]
        if per_layer is None:
            per_layer = shapes
        elif shapes != per_layer:
            raise EplbError(
                f"weights: layer {l}: tensors {shapes} differ from layer 0's {per_layer} "
                "(every MoE layer holds the same tensors)"
            )
        out.append(list(tensors))
    first = out[0]
    expert_bytes = sum(t[0].numel() * t.element_size() for t in first)
    return out, device, expert_bytes


def initial_placement(
    config: Union[dict[str, Any], str, "os.PathLike[str]"],
    *,
    layers: int,
    experts: int,
    ranks: int,
    ranks_per_node: Optional[int] = None,
) -> np.ndarray:
    """The placement every rank starts from under ``config``, ``[layers, ranks * slots]``:
    the default layout with the configured redundancy, or the map at ``expert_map_path``. An
    engine loads rank ``r``'s slots ``[r * slots, (r + 1) * slots)`` of each layer from it
    before it builds the :class:`Runtime`."""
    text, is_path = _config_arg(config)
    return startup_placement(
        text, is_path, layers=int(layers), experts=int(experts), ranks=int(ranks),
        ranks_per_node=ranks_per_node,
    )


class Runtime:
    """The eplb runtime of one EP rank inside a PyTorch engine.

    ``config`` is an ``eplb_config`` (a dict, or the path of a JSON file) with the keys, defaults
    and checks of the Rust runtime and ``eplb check-config`` (the ``DYNAMIC_EPLB`` environment
    guard included); ``layers`` and ``experts`` are the model's MoE layers and logical experts;
    ``weights`` holds this rank's expert weights: per MoE layer a list of tensors whose first
    dimension is this rank's slots (e.g. ``w13`` and ``w2``), any dtype, all on one device;
    ``group`` is the torch.distributed process group of the EP ranks (``None``: the default
    group), its rank ``i`` being EP rank ``i``. Collectives and transfers time out with the group
    (create it with ``timeout=``); ``timeout`` (seconds) bounds the waits of a layer's exchange.

    Construction checks the config, the weights and the group, then runs one handshake
    collective: every rank must start from the same shape and placement. Any mismatch raises
    :class:`eplb.EplbError`.

    A rank that comes back (a restarted process, elastic EP) passes ``placement``: the
    ``[layers, ranks * slots]`` array its peers' :meth:`placement` returns at the iteration it
    joins (the engine hands it over), and ``live``: the peers' :meth:`live` ranks, without this
    one; ``rank``: its EP rank (by default the one EP rank missing from ``live``). ``group`` is
    then the process group of the new live set (``live`` and this rank, EP order). It starts
    from that placement with empty rows of its own (nothing is routed to its slots until a walk
    fills them), runs no construction handshake (its peers are not constructing), and every
    rank of the new set, this one included, calls :meth:`add_ranks` at the same iteration, where
    the handshake runs on the new group. ``docs/torch.md`` shows the whole sequence.
    """

    def __init__(
        self,
        config: Union[dict[str, Any], str, "os.PathLike[str]"],
        *,
        layers: int,
        experts: int,
        weights: Sequence[Sequence[Any]],
        group: Any = None,
        ranks_per_node: Optional[int] = None,
        max_num_seqs: int = 256,
        speculative_tokens: int = 0,
        tp_size: int = 1,
        timeout: Optional[float] = None,
        placement: Any = None,
        live: Optional[Sequence[int]] = None,
        rank: Optional[int] = None,
    ) -> None:
        dist = _dist()
        if not dist.is_available() or not dist.is_initialized():
            raise EplbError("torch.distributed is not initialized (init_process_group first)")
        if group is None:
            group = dist.group.WORLD
        text, is_path = _config_arg(config)
        ws, device, expert_bytes = _check_weights(weights, int(layers))
        peers: Optional[list[int]] = None
        if placement is not None or live is not None:
            rank, ranks, placement, peers = _joiner(placement, live, rank, ws, group)
        else:
            ranks = dist.get_world_size(group)
            rank = dist.get_rank(group)
            if rank < 0:
                raise EplbError("this process is not a member of the group")
        self._transport = _TorchTransport(rank, ranks, int(experts), group, ws, device, timeout)
        if peers is not None:
            # The group spans the new live set; the controller adopts it at add_ranks.
            self._transport.live = sorted(peers + [rank])
            self._transport.group_rank = {q: i for i, q in enumerate(self._transport.live)}
        self._native = NativeRuntime(
            text,
            is_path,
            layers=int(layers),
            experts=int(experts),
            ranks=ranks,
            rank=rank,
            transport=self._transport,
            expert_bytes=int(expert_bytes),
            ranks_per_node=ranks_per_node,
            max_num_seqs=int(max_num_seqs),
            speculative_tokens=int(speculative_tokens),
            tp_size=int(tp_size),
            placement=placement,
            live=peers,
        )
        try:
            _, _, _, slots = self._native.shape_info
            for l, tensors in enumerate(ws):
                for i, t in enumerate(tensors):
                    if t.shape[0] != slots:
                        raise EplbError(
                            f"weights: layer {l} tensor {i} has {t.shape[0]} slots in its first "
                            f"dimension; the config gives this rank {slots} (experts {experts} "
                            f"+ redundant over {ranks} ranks)"
                        )
            self._layout = (int(expert_bytes), len(ws[0]))
            if peers is None:
                self._handshake()
        except BaseException:
            self._native.close()
            raise
        self._slots = slots
        self._proposed = list(range(ranks)) if peers is None else sorted(peers)

    def _handshake(self, group: Any = None, size: Optional[int] = None) -> None:
        """Every rank of ``group`` (default: this runtime's, at construction) holds the same
        shape, placement and weight layout; an ``EplbError`` on every rank otherwise."""
        layers, experts, ranks, slots = self._native.shape_info
        expert_bytes, tensors = self._layout
        mine = np.array(
            [layers, experts, ranks, slots, self._native.placement_hash(), expert_bytes, tensors],
            dtype=np.uint64,
        )
        what = "start-up" if group is None else "join"
        try:
            if group is None:
                rows = self._transport.all_gather(mine).reshape(ranks, -1)
            else:
                rows = self._transport.gather_on(group, size or 0, mine)
        except Exception as e:
            raise EplbError(
                f"rank {self._transport.rank}: the {what} handshake failed ({e}); a rank did "
                "not start (its own error says why) or the group is not the EP group"
            ) from e
        bad = [q for q in range(rows.shape[0]) if not (rows[q] == mine).all()]
        if bad:
            raise EplbError(
                f"rank {self._transport.rank}: the {what} handshake: group ranks {bad} hold "
                "another shape, placement or weight layout (layers, experts, ranks, slots, "
                f"placement hash, expert bytes, tensors): {rows[bad[0]].tolist()} against this "
                f"rank's {mine.tolist()}"
            )

    # --- the serving path ----------------------------------------------------------------

    def before_forward(self) -> None:
        """Before a forward: launches the due layer's exchange, if any."""
        self._native.before_forward()

    def after_forward(self, slot_counts: Any, padded_tokens: int) -> None:
        """After a forward: this rank's tokens per local slot for the iteration (``[layers,
        slots]`` integers, a torch tensor or a numpy array) and the batch's padded token count.
        With nothing due it does no collective and never waits for the planner."""
        if type(slot_counts) is not np.ndarray:
            slot_counts = _to_numpy(slot_counts)
        self._native.after_forward(slot_counts, int(padded_tokens))

    def placement(self) -> np.ndarray:
        """The placement every live rank holds: ``[layers, ranks * slots]`` expert ids
        (-1: an empty slot of a rank that left)."""
        return self._native.placement()

    def log2phy(self, layer: int) -> np.ndarray:
        """``[experts]``: the physical slot ``rank * slots + slot`` this rank routes each
        logical expert of ``layer`` to (-1: no live copy)."""
        return self._native.log2phy(int(layer))

    def expert_map(self, layer: int) -> np.ndarray:
        """``[experts]``: this rank's local slot of each logical expert of ``layer``, or -1."""
        return self._native.expert_map(int(layer))

    @property
    def events(self) -> dict[str, Any]:
        """What the last ``after_forward`` led to (``committed``, ``plan_taken``, ...)."""
        return self._native.last_events()

    # --- membership ----------------------------------------------------------------------

    def remove_ranks(self, ranks: Sequence[int], *, group: Any) -> None:
        """Removes ``ranks`` (they died or are drained). Call it on every survivor at the same
        iteration, before its ``after_forward``, with ``group``: a process group of the
        survivors whose rank ``i`` is the ``i``-th surviving EP rank (torch.distributed cannot
        shrink a group; ``docs/torch.md`` shows how to make it)."""
        gone = sorted(int(q) for q in ranks)
        live = [q for q in self._proposed if q not in gone]
        self._native.remove_ranks(gone)
        self._transport.pending_groups[tuple(live)] = group
        self._proposed = live

    def add_ranks(self, ranks: Sequence[int], *, group: Any) -> None:
        """Adds ``ranks`` back; ``group`` spans the new live set (EP rank order). Call it on
        every rank of the new set at the same iteration, before its ``after_forward``: the
        peers and each rank that comes back (built with ``placement=`` and ``live=``). It first
        runs the join handshake on ``group`` (every rank holds the same shape, placement and
        weight layout; an ``EplbError`` on every rank otherwise, and nothing changes)."""
        back = sorted(int(q) for q in ranks)
        live = sorted(set(self._proposed) | set(back))
        dist = _dist()
        size, me = dist.get_world_size(group), dist.get_rank(group)
        mine = self._transport.rank
        if size != len(live) or me != live.index(mine):
            raise EplbError(
                f"rank {mine}: add_ranks: the group has {size} ranks and this process is its "
                f"rank {me}; the new live EP ranks are {live} (expected {len(live)} ranks, this "
                f"one at {live.index(mine)})"
            )
        self._handshake(group, size)
        self._native.add_ranks(back)
        self._transport.pending_groups[tuple(live)] = group
        self._proposed = live

    def set_group(self, group: Any) -> None:
        """Replaces the process group of the current live ranks (same ranks, EP order): after a
        collective timed out, a backend may leave the group unusable (gloo and NCCL do); the
        engine builds a new one, hands it over on every live rank between iterations, then
        calls :meth:`resume` if balancing was suspended."""
        self._transport.replace_group(group)

    def register_backup(self, layer: int, expert: int, tensors: Sequence[Any]) -> None:
        """A host copy of one expert (one tensor per weight, without the slot dimension), loaded
        when the expert lost every live copy."""
        layers = self._transport.weights
        if not 0 <= int(layer) < len(layers):
            raise EplbError(
                f"register_backup: layer {layer} is out of range (0..{len(layers)})"
            )
        ws = layers[int(layer)]
        if len(tensors) != len(ws) or any(
            tuple(t.shape) != tuple(w.shape[1:]) for t, w in zip(tensors, ws)
        ):
            raise EplbError(
                f"register_backup: layer {layer} expert {expert}: expected tensors of shapes "
                f"{[tuple(w.shape[1:]) for w in ws]}, got {[tuple(t.shape) for t in tensors]}"
            )
        self._transport.backup[(int(layer), int(expert))] = list(tensors)

    def live(self) -> list[int]:
        """The live EP ranks."""
        return self._native.live()

    def resume(self) -> None:
        """Resumes balancing after a suspension (once the engine's collectives work again)."""
        self._native.resume()

    # --- state ---------------------------------------------------------------------------

    @property
    def health(self) -> str:
        """``"running"``, ``"suspended"`` or ``"diverged"``."""
        return self._native.health

    @property
    def is_updating(self) -> bool:
        """Whether a layer walk is under way."""
        return self._native.is_updating

    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def mode(self) -> str:
        """``off``, ``static``, ``dynamic`` or ``record``."""
        return self._native.mode

    @property
    def slots_per_rank(self) -> int:
        return self._slots

    @property
    def stats(self) -> dict[str, Any]:
        """The counters: ``cycles`` (the cycle number: heat snapshots taken), ``plans``
        (plans taken), ``layers_committed``,
        ``layers_aborted``, ``moves`` (expert copies the committed layers changed, over every
        rank), the rank machine's other counters, and this rank's transfer counters
        (``bytes_sent``, ``bytes_received``, ``bytes_loaded``, ``exchanges``,
        ``exchange_seconds``: launch to completion, overlapping the forwards;
        ``last_exchange_seconds``; ``wait_seconds``: what the serving thread blocked in the
        exchanges' waits)."""
        d = self._native.stats()
        d.update(self._transport.counters)
        return d

    def metrics_text(self) -> str:
        """This rank's Prometheus metrics as text (empty when ``eplb_metrics`` is off)."""
        return self._native.metrics_text()

    def record_iteration_ms(self, ms: float) -> None:
        """The measured time of the step that just ran (heat recordings carry it)."""
        self._native.record_iteration_ms(float(ms))

    def wait_for_plan(self, timeout: float = 60.0) -> bool:
        """Blocks until the planner answered this rank's outstanding cycle (``True``) or
        ``timeout`` seconds passed. For tests and offline replays that must take each plan at
        the iteration it is due (as ``eplb simulate`` does); a serving engine never calls it."""
        return self._native.wait_for_plan(float(timeout))

    def close(self) -> None:
        """Stops balancing and the planner thread; an exchange in flight is aborted."""
        self._native.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _to_numpy(x: Any) -> np.ndarray:
    detach: Optional[Callable[[], Any]] = getattr(x, "detach", None)
    if detach is not None:
        return detach().cpu().numpy()
    return np.asarray(x)
