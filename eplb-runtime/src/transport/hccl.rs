//! The HCCL transport: expert weights in device memory, moved with HCCL (feature `ascend`).
//!
//! Each rank owns one [`HcclTransport`]: a stream and its device buffers
//! ([`Workspace`]) and an HCCL communicator. Live slots are device
//! buffers (one per layer, `S` slots of `expert_bytes` each, 64-byte aligned). One layer's
//! exchange is one `HcclBatchSendRecv` per rank: the experts this rank sends to one peer are
//! packed into one block (so each direction to each peer carries one buffer, as HCCL requires),
//! sent as `UINT8` so any weight type works; receives land in a spare receive arena, never in
//! live slots. Every block starts with a small header (layer, ranks, expert ids, expert size)
//! that the receiver checks, so a stale or misrouted block is a protocol error, never wrong
//! weights.
//!
//! [`Transport::commit`] first copies the old content of every slot it touches into a staging
//! area, then installs (local moves read from staging, received experts from the arena); if an
//! install copy fails, the staged content is put back. [`Transport::wait`] and
//! [`Transport::abort`] never touch live slots. `all_gather` is `HcclAllGather` of `u64`s;
//! `all_agree` an all-gather of one flag per rank.
//!
//! Every wait is bounded: an exchange by [`HcclConfig::timeout`], a collective by twice that;
//! after a failed wait the stream is drained again before the next use of its buffers.
//!
//! Elastic membership needs no new HCCL call. `HcclAllGather` runs over the whole communicator,
//! so once [`Transport::set_live`] has been called the gather is point to point instead: one
//! `HcclBatchSendRecv` per collective in which each live rank sends its words (one block, `UINT64`)
//! to every other live rank and receives theirs into its place of the rank-major output. It stays
//! point to point even when every rank is live again: a rank that was gone may have missed
//! collectives, and a point-to-point round needs no shared collective count (HCCL matches sends
//! and receives per pair, in posting order; `research/cann-hccl.md`, `HcclBatchSendRecv`).
//! The communicator itself is kept: on real HCCL a dead peer can leave it unusable (its async
//! error then fails every call, reported as such), which needs a new communicator, not this.
//! [`Transport::load`] copies experts from a host backup the engine registers
//! ([`HcclTransport::set_backup`]) into a load arena (host to device, the synchronous ACL copy
//! of [`HcclTransport::load_slot`]); `commit` installs them like received ones.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use eplb_core::LiveSet;

pub use eplb_ascend_sys as sys;
use sys::types::HcclDataType;
use sys::{BufferId, Comm, ErrorKind, P2p, P2pKind, Region, RootInfo, Runtime, Workspace};

use super::{Op, Site, Transport, TransportError};
use crate::transfer::{RankPlan, SlotSource};

/// Alignment of every slot and packed block (on-chip device copies want 64-byte addresses).
const ALIGN: usize = 64;
const MAGIC: [u8; 4] = *b"EPLB";
const VERSION: u32 = 1;
const HEADER_FIXED: usize = 32;

fn round_up(x: usize) -> Option<usize> {
    x.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}

fn header_len(experts: usize) -> usize {
    round_up(HEADER_FIXED + 2 * experts).unwrap_or(usize::MAX)
}

/// Settings of one rank's endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HcclConfig {
    /// The device (NPU) of this rank.
    pub device: i32,
    /// Limit of a layer's exchange wait. Collectives wait twice as long: a rank whose exchange
    /// failed at once reaches the next agreement while its peers still wait the exchange out,
    /// and must still meet them there.
    pub timeout: Duration,
}

impl HcclConfig {
    /// `device` with a 30 s timeout.
    pub fn new(device: i32) -> Self {
        Self {
            device,
            timeout: Duration::from_secs(30),
        }
    }
}

/// The shape of one rank's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLayout {
    /// MoE layers (`L`).
    pub layers: usize,
    /// Slots per rank (`S`).
    pub slots_per_rank: usize,
    /// Bytes of one expert's weights (every tensor of the expert, packed).
    pub expert_bytes: usize,
}

#[derive(Debug, Default)]
struct Arena {
    buf: Option<BufferId>,
    cap: usize,
}

#[derive(Debug)]
struct RecvBlock {
    peer: u16,
    offset: usize,
    experts: Vec<u16>,
}

#[derive(Debug)]
struct InFlight {
    layer: usize,
    blocks: Vec<RecvBlock>,
    /// Per receive buffer index: offset of the expert in the receive arena.
    recv_at: Vec<Option<usize>>,
    waited: bool,
}

/// The engine's host backup of expert weights: `(layer, expert, out)` fills `out` (one expert's
/// `expert_bytes`) and returns `true`, or returns `false` when it has no copy (the load failed).
pub type Backup = Box<dyn FnMut(usize, u16, &mut [u8]) -> bool + Send>;

#[derive(Debug)]
struct Loaded {
    layer: usize,
    buffers: Vec<u16>,
}

/// One rank's HCCL endpoint, holding that rank's expert weights in device memory.
pub struct HcclTransport {
    // Field order is drop order: the workspace drains its stream and frees its buffers before
    // the communicator is destroyed.
    ws: Workspace,
    comm: Comm,
    rank: usize,
    ranks: usize,
    layout: SlotLayout,
    stride: usize,
    layers: Vec<BufferId>,
    staging: BufferId,
    send: Arena,
    recv: Arena,
    gather_send: Arena,
    gather_recv: Arena,
    in_flight: Option<InFlight>,
    timeout: Duration,
    /// The live ranks once [`Transport::set_live`] was called (collectives then go point to
    /// point); `None` before (every rank, `HcclAllGather`).
    live: Option<LiveSet>,
    backup: Option<Backup>,
    /// `S` load buffers, `stride` apart (buffer `i` at `i * stride`).
    load_arena: Arena,
    loaded: Option<Loaded>,
}

impl fmt::Debug for HcclTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HcclTransport")
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .field("layout", &self.layout)
            .field("in_flight", &self.in_flight.as_ref().map(|i| i.layer))
            .field("live", &self.live)
            .field("backup", &self.backup.is_some())
            .field("loaded", &self.loaded)
            .finish_non_exhaustive()
    }
}

/// The error of a failed CANN call at `at`; `what` names the step (may be empty).
fn failed(at: Site, what: &str, e: &sys::Error) -> TransportError {
    let detail = if what.is_empty() {
        e.to_string()
    } else {
        format!("{what}: {e}")
    };
    if e.kind() == ErrorKind::Timeout {
        TransportError::Timeout { at, detail }
    } else {
        TransportError::Failed {
            at,
            code: e.code(),
            detail,
        }
    }
}

fn invalid(at: Site, detail: String) -> TransportError {
    TransportError::Invalid { at, detail }
}

/// Groups ops ordered by peer into `(peer, ops)`; `Err` names the first op out of order.
fn by_peer<T: Copy>(
    ops: &[T],
    key: impl Fn(&T) -> (u16, u16),
) -> Result<Vec<(u16, Vec<T>)>, usize> {
    let mut out: Vec<(u16, Vec<T>)> = Vec::new();
    let mut last: Option<(u16, u16)> = None;
    for (i, op) in ops.iter().enumerate() {
        let k = key(op);
        if last.is_some_and(|l| l >= k) {
            return Err(i);
        }
        last = Some(k);
        match out.last_mut() {
            Some((p, v)) if *p == k.0 => v.push(*op),
            _ => out.push((k.0, vec![*op])),
        }
    }
    Ok(out)
}

impl HcclTransport {
    /// Rank `rank`'s endpoint of a world of `ranks`, joined through `root` (made by the root
    /// rank with [`RootInfo::generate`] and shipped to every rank). Blocks until every rank has
    /// joined. The slots are allocated but hold no weights yet: load them with
    /// [`HcclTransport::load_slot`].
    pub fn new(
        rt: &Runtime,
        root: &RootInfo,
        rank: usize,
        ranks: usize,
        layout: SlotLayout,
        cfg: HcclConfig,
    ) -> Result<Self, TransportError> {
        if ranks == 0 || rank >= ranks || ranks > usize::from(u16::MAX) {
            return Err(invalid(
                Site::new(Op::Setup, rank),
                format!("rank {rank} of {ranks} ranks"),
            ));
        }
        let at = Site::new(Op::Setup, rank);
        if layout.layers == 0 || layout.slots_per_rank == 0 || layout.expert_bytes == 0 {
            return Err(invalid(at, format!("empty slot layout {layout:?}")));
        }
        let stride = round_up(layout.expert_bytes)
            .ok_or_else(|| invalid(at, "expert size overflows".into()))?;
        let layer_len = stride
            .checked_mul(layout.slots_per_rank)
            .ok_or_else(|| invalid(at, "layer size overflows".into()))?;
        let mut ws = Workspace::new(rt, cfg.device).map_err(|e| failed(at, "", &e))?;
        ws.set_drain_timeout(Some(cfg.timeout));
        let comm = Comm::init_root_info(rt, cfg.device, ranks as u32, rank as u32, root)
            .map_err(|e| failed(at, "joining the HCCL world", &e))?;
        let mut layers = Vec::with_capacity(layout.layers);
        for _ in 0..layout.layers {
            layers.push(ws.alloc(layer_len).map_err(|e| failed(at, "slots", &e))?);
        }
        let staging = ws.alloc(layer_len).map_err(|e| failed(at, "staging", &e))?;
        Ok(Self {
            ws,
            comm,
            rank,
            ranks,
            layout,
            stride,
            layers,
            staging,
            send: Arena::default(),
            recv: Arena::default(),
            gather_send: Arena::default(),
            gather_recv: Arena::default(),
            in_flight: None,
            timeout: cfg.timeout,
            live: None,
            backup: None,
            load_arena: Arena::default(),
            loaded: None,
        })
    }

    /// Registers the host backup that [`Transport::load`] copies lost experts from (replacing any
    /// earlier one).
    pub fn set_backup(&mut self, backup: Backup) {
        self.backup = Some(backup);
    }

    /// Live ranks (every rank until [`Transport::set_live`]).
    fn live_count(&self) -> usize {
        self.live.as_ref().map_or(self.ranks, LiveSet::count)
    }

    fn is_live(&self, rank: usize) -> bool {
        self.live
            .as_ref()
            .map_or(rank < self.ranks, |l| l.contains(rank))
    }

    /// The slot layout.
    pub fn layout(&self) -> SlotLayout {
        self.layout
    }

    fn slot_region(&self, layer: usize, slot: usize) -> Result<Region, TransportError> {
        let buf = self
            .layers
            .get(layer)
            .ok_or_else(|| invalid(self.slot_site(layer), "out of range".into()))?;
        if slot >= self.layout.slots_per_rank {
            return Err(invalid(
                self.slot_site(layer),
                format!("slot {slot} out of range"),
            ));
        }
        Ok(Region::new(
            *buf,
            slot * self.stride,
            self.layout.expert_bytes,
        ))
    }

    /// Where a slot access on `layer` fails (loading, reading or staging a slot).
    fn slot_site(&self, layer: usize) -> Site {
        Site::new(Op::Setup, self.rank).layer(layer)
    }

    fn staging_region(&self, slot: usize) -> Region {
        Region::new(self.staging, slot * self.stride, self.layout.expert_bytes)
    }

    /// Writes an expert's weights into a live slot (host to device), e.g. at start-up.
    pub fn load_slot(
        &mut self,
        layer: usize,
        slot: usize,
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        let r = self.slot_region(layer, slot)?;
        if bytes.len() != r.len {
            return Err(invalid(
                self.slot_site(layer),
                format!(
                    "slot {slot}: {} bytes for an expert of {}",
                    bytes.len(),
                    r.len
                ),
            ));
        }
        self.ws
            .write(r, bytes)
            .map_err(|e| failed(self.slot_site(layer), &format!("loading slot {slot}"), &e))
    }

    /// The bytes of a live slot (device to host).
    pub fn slot(&self, layer: usize, slot: usize) -> Result<Vec<u8>, TransportError> {
        let r = self.slot_region(layer, slot)?;
        let mut out = vec![0u8; r.len];
        self.ws
            .read(r, &mut out)
            .map_err(|e| failed(self.slot_site(layer), &format!("reading slot {slot}"), &e))?;
        Ok(out)
    }

    fn ensure(
        ws: &mut Workspace,
        arena: &mut Arena,
        len: usize,
        t: Duration,
    ) -> Result<BufferId, sys::Error> {
        match arena.buf {
            Some(b) if arena.cap >= len => return Ok(b),
            Some(b) => {
                ws.free(b, Some(t))?;
                arena.buf = None;
                arena.cap = 0;
            }
            None => {}
        }
        let cap = len.max(ALIGN);
        let b = ws.alloc(cap)?;
        arena.buf = Some(b);
        arena.cap = cap;
        Ok(b)
    }

    fn header(&self, layer: usize, src: u16, dst: u16, experts: &[u16]) -> Vec<u8> {
        let mut h = vec![0u8; header_len(experts.len())];
        let mut put = |at: usize, bytes: &[u8]| {
            if let Some(d) = h.get_mut(at..at + bytes.len()) {
                d.copy_from_slice(bytes);
            }
        };
        put(0, &MAGIC);
        put(4, &VERSION.to_le_bytes());
        put(8, &(layer as u32).to_le_bytes());
        put(12, &src.to_le_bytes());
        put(14, &dst.to_le_bytes());
        put(16, &(experts.len() as u32).to_le_bytes());
        put(24, &(self.layout.expert_bytes as u64).to_le_bytes());
        for (i, e) in experts.iter().enumerate() {
            put(HEADER_FIXED + 2 * i, &e.to_le_bytes());
        }
        h
    }

    fn collective(&mut self, op: Op, local: &[u64]) -> Result<Vec<u64>, TransportError> {
        let at = Site::new(op, self.rank);
        // HCCL cannot gather nothing; an empty contribution still takes part (one dummy value)
        // so that every rank issues the same collectives in the same order.
        let send: Vec<u8> = if local.is_empty() {
            vec![0; 8]
        } else {
            local.iter().flat_map(|v| v.to_le_bytes()).collect()
        };
        let recv_len = send.len() * self.live_count();
        let t = self.timeout;
        let s = Self::ensure(&mut self.ws, &mut self.gather_send, send.len(), t)
            .map_err(|e| failed(at, "", &e))?;
        let r = Self::ensure(&mut self.ws, &mut self.gather_recv, recv_len, t)
            .map_err(|e| failed(at, "", &e))?;
        let (sr, rr) = (Region::new(s, 0, send.len()), Region::new(r, 0, recv_len));
        self.ws.write(sr, &send).map_err(|e| failed(at, "", &e))?;
        match self.live {
            None => self
                .ws
                .all_gather(&mut self.comm, sr, rr, HcclDataType::UINT64)
                .map_err(|e| failed(at, "", &e))?,
            Some(live) => {
                // Point to point over the live ranks: this rank's words go to its own place
                // directly, to every live peer as one block, and each peer's land in its place.
                let n = send.len();
                let me = live
                    .position(self.rank)
                    .ok_or_else(|| invalid(at, "this rank is not live".into()))?;
                self.ws
                    .write(Region::new(r, me * n, n), &send)
                    .map_err(|e| failed(at, "", &e))?;
                let mut items = Vec::with_capacity(2 * live.count());
                for (i, peer) in live.iter().enumerate() {
                    if peer == self.rank {
                        continue;
                    }
                    let peer = peer as u32;
                    items.push(P2p {
                        kind: P2pKind::Send,
                        peer,
                        region: sr,
                        dtype: HcclDataType::UINT64,
                    });
                    items.push(P2p {
                        kind: P2pKind::Recv,
                        peer,
                        region: Region::new(r, i * n, n),
                        dtype: HcclDataType::UINT64,
                    });
                }
                self.ws
                    .batch_send_recv(&mut self.comm, &items)
                    .map_err(|e| failed(at, "", &e))?;
            }
        }
        self.sync(at, self.timeout.saturating_mul(2))?;
        let mut bytes = vec![0u8; recv_len];
        self.ws
            .read(rr, &mut bytes)
            .map_err(|e| failed(at, "", &e))?;
        let all: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                u64::from_le_bytes(a)
            })
            .collect();
        if local.is_empty() {
            return Ok(Vec::new());
        }
        Ok(all)
    }

    /// Synchronizes the stream with the timeout; a failure carries the communicator's async
    /// error too.
    fn sync(&mut self, at: Site, timeout: Duration) -> Result<(), TransportError> {
        match self.ws.synchronize(Some(timeout)) {
            Ok(()) => Ok(()),
            Err(e) => {
                let mut err = failed(at, "", &e);
                if let Some(a) = self.comm.async_error() {
                    match &mut err {
                        TransportError::Timeout { detail, .. }
                        | TransportError::Failed { detail, .. } => {
                            detail.push_str(&format!(" (HCCL: {a})"));
                        }
                        _ => {}
                    }
                }
                Err(err)
            }
        }
    }

    fn launch_inner(&mut self, plan: &RankPlan) -> Result<InFlight, TransportError> {
        let layer = plan.layer;
        let at = Site::new(Op::Launch, self.rank).layer(layer);
        if layer >= self.layout.layers {
            return Err(invalid(at, "out of range".into()));
        }
        let me = self.rank as u16;
        let peer_ok = |p: u16| p != me && self.is_live(usize::from(p));
        let sends = by_peer(&plan.sends, |o| (o.peer, o.expert))
            .map_err(|i| invalid(at, format!("send #{i} out of (peer, expert) order")))?;
        let recvs = by_peer(&plan.recvs, |o| (o.peer, o.expert))
            .map_err(|i| invalid(at, format!("receive #{i} out of (peer, expert) order")))?;
        if plan.recvs.len() > self.layout.slots_per_rank {
            return Err(invalid(
                at,
                format!(
                    "{} receives but only {} receive slots",
                    plan.recvs.len(),
                    self.layout.slots_per_rank
                ),
            ));
        }
        let e = self.layout.expert_bytes;
        let stride = self.stride;
        let block = |n: usize| header_len(n).saturating_add(n.saturating_mul(stride));
        // Lay the blocks out.
        let mut send_plan = Vec::with_capacity(sends.len());
        let mut off = 0usize;
        for (peer, ops) in &sends {
            if !peer_ok(*peer) {
                return Err(invalid(
                    at,
                    format!("send to rank {peer} (self, gone or out of range)"),
                ));
            }
            for op in ops {
                self.slot_region(layer, usize::from(op.slot))?;
            }
            send_plan.push((*peer, off, ops));
            off = off.saturating_add(block(ops.len()));
        }
        let send_len = off;
        let mut recv_at = vec![None; self.layout.slots_per_rank];
        let mut blocks = Vec::with_capacity(recvs.len());
        off = 0;
        for (peer, ops) in &recvs {
            if !peer_ok(*peer) {
                return Err(invalid(
                    at,
                    format!("receive from rank {peer} (self, gone or out of range)"),
                ));
            }
            let h = header_len(ops.len());
            for (k, op) in ops.iter().enumerate() {
                match recv_at.get_mut(usize::from(op.buffer)) {
                    Some(at @ None) => *at = Some(off + h + k * stride),
                    _ => {
                        return Err(invalid(
                            at,
                            format!("receive buffer {} reused or out of range", op.buffer),
                        ));
                    }
                }
            }
            blocks.push(RecvBlock {
                peer: *peer,
                offset: off,
                experts: ops.iter().map(|o| o.expert).collect(),
            });
            off = off.saturating_add(block(ops.len()));
        }
        let recv_len = off;
        let t = self.timeout;
        let err = |e: sys::Error| failed(at, "", &e);
        let mut items = Vec::with_capacity(sends.len() + recvs.len());
        // Headers first (synchronous writes), then the packing copies, then the exchange.
        if send_len > 0 {
            let sbuf = Self::ensure(&mut self.ws, &mut self.send, send_len, t).map_err(err)?;
            for (peer, off, ops) in &send_plan {
                let experts: Vec<u16> = ops.iter().map(|o| o.expert).collect();
                let hdr = self.header(layer, me, *peer, &experts);
                self.ws
                    .write(Region::new(sbuf, *off, hdr.len()), &hdr)
                    .map_err(err)?;
            }
        }
        let rbuf = if recv_len > 0 {
            let rbuf = Self::ensure(&mut self.ws, &mut self.recv, recv_len, t).map_err(err)?;
            for b in &blocks {
                // Zero the header: a receive that never lands cannot pass for a stale one.
                let zeros = vec![0u8; header_len(b.experts.len())];
                self.ws
                    .write(Region::new(rbuf, b.offset, zeros.len()), &zeros)
                    .map_err(err)?;
            }
            Some(rbuf)
        } else {
            None
        };
        if let Some(sbuf) = self.send.buf.filter(|_| send_len > 0) {
            for (peer, off, ops) in &send_plan {
                let h = header_len(ops.len());
                for (k, op) in ops.iter().enumerate() {
                    let src = self.slot_region(layer, usize::from(op.slot))?;
                    self.ws
                        .copy(Region::new(sbuf, off + h + k * stride, e), src)
                        .map_err(err)?;
                }
                items.push(P2p {
                    kind: P2pKind::Send,
                    peer: u32::from(*peer),
                    region: Region::new(sbuf, *off, block(ops.len())),
                    dtype: HcclDataType::UINT8,
                });
            }
        }
        if let Some(rbuf) = rbuf {
            for b in &blocks {
                items.push(P2p {
                    kind: P2pKind::Recv,
                    peer: u32::from(b.peer),
                    region: Region::new(rbuf, b.offset, block(b.experts.len())),
                    dtype: HcclDataType::UINT8,
                });
            }
        }
        self.ws
            .batch_send_recv(&mut self.comm, &items)
            .map_err(err)?;
        Ok(InFlight {
            layer,
            blocks,
            recv_at,
            waited: false,
        })
    }

    fn check_headers(&self, fl: &InFlight) -> Result<(), TransportError> {
        let Some(rbuf) = self.recv.buf else {
            return if fl.blocks.is_empty() {
                Ok(())
            } else {
                Err(invalid(
                    Site::new(Op::Wait, self.rank).layer(fl.layer),
                    "receive arena missing".into(),
                ))
            };
        };
        for b in &fl.blocks {
            let at = Site {
                peer: Some(b.peer),
                ..Site::new(Op::Wait, self.rank).layer(fl.layer)
            };
            let want = self.header(fl.layer, b.peer, self.rank as u16, &b.experts);
            let mut got = vec![0u8; want.len()];
            self.ws
                .read(Region::new(rbuf, b.offset, got.len()), &mut got)
                .map_err(|e| failed(at, "", &e))?;
            if got != want {
                let layer = got.get(8..12).map(|s| {
                    let mut a = [0u8; 4];
                    a.copy_from_slice(s);
                    u32::from_le_bytes(a)
                });
                return Err(TransportError::Protocol {
                    at,
                    detail: format!(
                        "the block's header does not match the plan (experts {:?}; got layer {layer:?}, \
                         magic ok: {})",
                        b.experts,
                        got.get(..4) == Some(&MAGIC[..])
                    ),
                });
            }
        }
        Ok(())
    }

    fn commit_inner(&mut self, plan: &RankPlan, fl: &InFlight) -> Result<(), TransportError> {
        let layer = plan.layer;
        let at = Site::new(Op::Commit, self.rank).layer(layer);
        let s = self.layout.slots_per_rank;
        if plan.install.len() != s {
            return Err(invalid(
                at,
                format!(
                    "install plan for {} slots, the rank has {s}",
                    plan.install.len()
                ),
            ));
        }
        // Where each changed slot's new content comes from, checked before anything moves.
        let mut moves = Vec::new();
        let mut stage = vec![false; s];
        for (slot, src) in plan.install.iter().enumerate() {
            let from = match *src {
                SlotSource::Unchanged => continue,
                SlotSource::Local { from_slot } => {
                    let f = usize::from(from_slot);
                    if f >= s {
                        return Err(invalid(at, format!("local move from slot {f}")));
                    }
                    if let Some(x) = stage.get_mut(f) {
                        *x = true;
                    }
                    self.staging_region(f)
                }
                SlotSource::Received { buffer } => {
                    let offset = fl
                        .recv_at
                        .get(usize::from(buffer))
                        .copied()
                        .flatten()
                        .ok_or_else(|| {
                            invalid(at, format!("receive buffer {buffer} was not received"))
                        })?;
                    let rbuf = self
                        .recv
                        .buf
                        .ok_or_else(|| invalid(at, "receive arena missing".into()))?;
                    Region::new(rbuf, offset, self.layout.expert_bytes)
                }
                SlotSource::Loaded { buffer } => {
                    let loaded = self
                        .loaded
                        .as_ref()
                        .is_some_and(|l| l.layer == layer && l.buffers.contains(&buffer));
                    let lbuf = self.load_arena.buf.filter(|_| loaded).ok_or_else(|| {
                        invalid(
                            at,
                            format!("receive buffer {buffer} was not loaded (call load first)"),
                        )
                    })?;
                    Region::new(
                        lbuf,
                        usize::from(buffer) * self.stride,
                        self.layout.expert_bytes,
                    )
                }
            };
            if let Some(x) = stage.get_mut(slot) {
                *x = true;
            }
            moves.push((slot, from));
        }
        if moves.is_empty() {
            return Ok(());
        }
        // 1. Stage the old content of every slot that changes or is a local source.
        let staged: Result<(), sys::Error> = (|| {
            for (slot, _) in stage.iter().enumerate().filter(|(_, s)| **s) {
                let live = self
                    .slot_region(layer, slot)
                    .map_err(|e| sys::Error::Invalid {
                        what: e.to_string(),
                    })?;
                self.ws.copy(self.staging_region(slot), live)?;
            }
            self.ws.synchronize(Some(self.timeout))
        })();
        staged.map_err(|e| failed(at, "staging (nothing installed)", &e))?;
        // 2. Install.
        let installed: Result<(), sys::Error> = (|| {
            for (slot, from) in &moves {
                let live = self
                    .slot_region(layer, *slot)
                    .map_err(|e| sys::Error::Invalid {
                        what: e.to_string(),
                    })?;
                self.ws.copy(live, *from)?;
            }
            self.ws.synchronize(Some(self.timeout))
        })();
        let Err(e) = installed else {
            return Ok(());
        };
        // 3. Put the old layer back.
        let restored: Result<(), sys::Error> = (|| {
            for (slot, _) in &moves {
                let live = self
                    .slot_region(layer, *slot)
                    .map_err(|e| sys::Error::Invalid {
                        what: e.to_string(),
                    })?;
                self.ws.copy(live, self.staging_region(*slot))?;
            }
            self.ws.synchronize(Some(self.timeout))
        })();
        match restored {
            Ok(()) => Err(failed(at, "the old layer is restored", &e)),
            Err(r) => Err(failed(
                at,
                &format!(
                    "restoring the old layer failed too ({r}); the layer may be half-installed"
                ),
                &e,
            )),
        }
    }
}

impl Transport for HcclTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn all_gather(&mut self, local: &[u64], out: &mut [u64]) -> Result<(), TransportError> {
        let live = self.live_count();
        if Some(out.len()) != local.len().checked_mul(live) {
            return Err(invalid(
                Site::new(Op::AllGather, self.rank),
                format!(
                    "the output holds {} values, needs {} ({live} live ranks)",
                    out.len(),
                    local.len().saturating_mul(live)
                ),
            ));
        }
        let all = self.collective(Op::AllGather, local)?;
        if all.len() != out.len() {
            return Err(TransportError::Protocol {
                at: Site::new(Op::AllGather, self.rank),
                detail: "the gather returned the wrong length".into(),
            });
        }
        out.copy_from_slice(&all);
        Ok(())
    }

    fn all_agree(&mut self, flag: bool) -> Result<bool, TransportError> {
        let all = self.collective(Op::AllAgree, &[u64::from(flag)])?;
        Ok(all.len() == self.live_count() && all.iter().all(|&v| v == 1))
    }

    fn set_live(&mut self, live: &LiveSet) -> Result<(), TransportError> {
        let at = Site::new(Op::SetLive, self.rank);
        if live.ranks() != self.ranks {
            return Err(invalid(
                at,
                format!(
                    "a live set of {} ranks for a world of {}",
                    live.ranks(),
                    self.ranks
                ),
            ));
        }
        if !live.contains(self.rank) {
            return Err(invalid(
                at,
                format!("this rank is not in the live set {live:?}"),
            ));
        }
        self.live = Some(*live);
        Ok(())
    }

    fn live(&self) -> Option<LiveSet> {
        self.live.or_else(|| LiveSet::all(self.ranks).ok())
    }

    fn load(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        let layer = plan.layer;
        let at = Site::new(Op::Load, self.rank).layer(layer);
        if layer >= self.layout.layers {
            return Err(invalid(at, "out of range".into()));
        }
        self.loaded = None;
        let s = self.layout.slots_per_rank;
        for (i, op) in plan.loads.iter().enumerate() {
            if usize::from(op.buffer) >= s
                || plan.loads.iter().take(i).any(|o| o.buffer == op.buffer)
            {
                return Err(invalid(
                    at.expert(op.expert),
                    format!("receive buffer {} reused or out of range", op.buffer),
                ));
            }
        }
        let mut buffers = Vec::with_capacity(plan.loads.len());
        if !plan.loads.is_empty() {
            let Some(backup) = self.backup.as_mut() else {
                return Err(invalid(
                    at,
                    "no host backup registered (HcclTransport::set_backup)".into(),
                ));
            };
            let len = self
                .stride
                .checked_mul(s)
                .ok_or_else(|| invalid(at, "load arena size overflows".into()))?;
            let abuf = Self::ensure(&mut self.ws, &mut self.load_arena, len, self.timeout)
                .map_err(|e| failed(at, "load arena", &e))?;
            let mut host = vec![0u8; self.layout.expert_bytes];
            for op in &plan.loads {
                let at = at.expert(op.expert);
                host.fill(0);
                if !backup(layer, op.expert, &mut host) {
                    return Err(TransportError::Failed {
                        at,
                        code: 0,
                        detail: "the host backup has no copy of the expert".into(),
                    });
                }
                let r = Region::new(
                    abuf,
                    usize::from(op.buffer) * self.stride,
                    self.layout.expert_bytes,
                );
                self.ws
                    .write(r, &host)
                    .map_err(|e| failed(at, "copying to the device", &e))?;
                buffers.push(op.buffer);
            }
        }
        self.loaded = Some(Loaded { layer, buffers });
        Ok(())
    }

    fn launch(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        if let Some(fl) = &self.in_flight {
            return Err(invalid(
                Site::new(Op::Launch, self.rank).layer(plan.layer),
                format!("launched while layer {} is in flight", fl.layer),
            ));
        }
        let fl = self.launch_inner(plan)?;
        self.in_flight = Some(fl);
        Ok(())
    }

    fn wait(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        let at = Site::new(Op::Wait, self.rank).layer(plan.layer);
        match &self.in_flight {
            Some(fl) if fl.layer == plan.layer => {}
            _ => return Err(invalid(at, "nothing launched".into())),
        }
        self.sync(at, self.timeout)?;
        let Some(fl) = self.in_flight.take() else {
            return Err(invalid(at, "nothing launched".into()));
        };
        let checked = self.check_headers(&fl);
        self.in_flight = Some(InFlight {
            waited: checked.is_ok(),
            ..fl
        });
        checked
    }

    fn commit(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        let at = Site::new(Op::Commit, self.rank).layer(plan.layer);
        let fl = match self.in_flight.take() {
            Some(fl) if fl.layer == plan.layer && fl.waited => fl,
            other => {
                self.in_flight = other;
                return Err(invalid(at, "the exchange was not waited for".into()));
            }
        };
        let done = self.commit_inner(plan, &fl);
        if done.is_err() {
            // The old layer is live again and the received data still in the arena: keep the
            // exchange, so that the install can be tried again (or the exchange aborted).
            self.in_flight = Some(fl);
        } else {
            self.loaded = None;
        }
        done
    }

    fn abort(&mut self, plan: &RankPlan) {
        // Live slots were never touched; forget the exchange and the layer's loads. A stream
        // that still holds work is drained before its buffers are used again.
        self.in_flight = None;
        if self.loaded.as_ref().is_some_and(|l| l.layer == plan.layer) {
            self.loaded = None;
        }
    }
}

/// Makes `ranks` endpoints in this process, one per thread, on devices
/// `device_base .. device_base + ranks` (for tests and single-host demos).
pub fn local_world(
    rt: &Runtime,
    ranks: usize,
    layout: SlotLayout,
    device_base: i32,
    timeout: Duration,
) -> Result<Vec<HcclTransport>, TransportError> {
    let root = RootInfo::generate(rt, device_base)
        .map_err(|e| failed(Site::new(Op::Setup, 0), "generating the root info", &e))?;
    let root = Arc::new(root);
    let handles: Vec<_> = (0..ranks)
        .map(|rank| {
            let (rt, root) = (rt.clone(), Arc::clone(&root));
            std::thread::spawn(move || {
                let cfg = HcclConfig {
                    device: device_base + rank as i32,
                    timeout,
                };
                HcclTransport::new(&rt, &root, rank, ranks, layout, cfg)
            })
        })
        .collect();
    let mut out = Vec::with_capacity(ranks);
    for (rank, h) in handles.into_iter().enumerate() {
        let t = h.join().map_err(|_| TransportError::Failed {
            at: Site::new(Op::Setup, rank),
            code: 0,
            detail: "the rank's thread panicked while joining".into(),
        })??;
        out.push(t);
    }
    Ok(out)
}
