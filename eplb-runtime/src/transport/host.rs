//! The in-process host transport: `R` ranks in one process, each with real byte buffers for its
//! slots and `S` spare receive buffers.
//!
//! Used by the simulator and the tests. Collectives meet in a shared [`HostWorld`] in numbered
//! rounds; a rank that gives up on a round closes it (and every earlier one) for every rank, and
//! a rank that missed a closed round (it came late, or never entered it) joins the first open
//! one, so the rounds realign after a one-sided timeout (the rank machines' tagged words tell
//! whether the ranks that meet there are at one step); point-to-point
//! messages go through per-pair mailboxes in posting order (each message carries its layer and
//! expert, which the receiver checks). Faults can be injected per (layer, rank): the exchange
//! fails, or its receives time out, or its loads fail ([`HostWorld::fail_loads`]).
//!
//! Membership: the world numbers its live sets in the order the ranks first adopt them
//! (generations; generation 0 is every rank), and a round is keyed by (generation, sequence
//! number in it). [`Transport::set_live`] moves an endpoint to the first later generation of that
//! set, or opens a new one, at sequence 0; a round completes when every rank of its generation has
//! contributed, so a rank that left and never calls again blocks nobody, and a rank that joins
//! meets its peers at the start of the new generation whatever it missed before. The floor is
//! per generation. [`Transport::load`] is the "host backup": it writes the canonical bytes of
//! the expert ([`canonical_expert_bytes`] or [`canonical_payload_bytes`], what a checkpoint holds)
//! into the receive buffer.
//!
//! A slot is one contiguous blob: either `expert_bytes` opaque bytes ([`HostTransport::new`]) or
//! the concatenated tensors of an [`ExpertPayload`] ([`HostTransport::with_payload`]): weights,
//! scales and offsets of one expert travel in one message and are installed by one copy, so a
//! commit never installs weights without their scales.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use eplb_core::LiveSet;

use super::{Op, Site, Transport, TransportError};
use crate::payload::ExpertPayload;
use crate::transfer::{RankPlan, SlotSource};

/// A round's key: (membership generation, sequence number in it).
type Key = (u64, u64);

/// An injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The rank's wait for this layer reports a failure.
    Fail,
    /// The rank's receives for this layer never complete: its wait times out.
    Timeout,
}

#[derive(Debug)]
struct Message {
    layer: usize,
    expert: u16,
    bytes: Vec<u8>,
    /// The sender's next collective (generation, sequence) when it launched: an abort after a
    /// vote drops only messages sent before that vote, never a peer's retry sent after it.
    sent_at: Key,
}

#[derive(Debug, Default)]
struct Round {
    parts: BTreeMap<usize, Vec<u64>>,
    read: usize,
}

#[derive(Debug)]
struct State {
    rounds: BTreeMap<Key, Round>,
    /// The lowest round any rank of the floor's generation may still enter: one past the last
    /// round some rank gave up on. A rank that missed rounds (it timed out alone, or skipped a
    /// collective its peers entered) joins at the floor, so the ranks' rounds realign after a
    /// one-sided timeout.
    floor: Key,
    /// The live set of each membership generation (`None`: every rank), in the order the ranks
    /// first adopted them; generation 0 is every rank.
    gens: Vec<Option<LiveSet>>,
    mail: BTreeMap<(usize, usize), VecDeque<Message>>,
    faults: BTreeMap<(usize, usize), Fault>,
    /// (layer, rank) whose loads fail.
    load_faults: BTreeSet<(usize, usize)>,
}

/// Whether generation set `g` (`None`: every rank) is `live`.
fn same_set(g: Option<&LiveSet>, live: &LiveSet) -> bool {
    g.map_or(live.is_all(), |g| g == live)
}

/// The meeting point of the ranks of one process.
#[derive(Debug)]
pub struct HostWorld {
    ranks: usize,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

impl HostWorld {
    /// A world of `ranks` ranks whose collectives give up after `timeout` (a layer exchange's
    /// wait after half of it).
    pub fn new(ranks: usize, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            ranks,
            timeout,
            state: Mutex::new(State {
                rounds: BTreeMap::new(),
                floor: (0, 0),
                gens: vec![None],
                mail: BTreeMap::new(),
                faults: BTreeMap::new(),
                load_faults: BTreeSet::new(),
            }),
            cv: Condvar::new(),
        })
    }

    /// Injects `fault` into the exchange of `layer` on `rank` (every later cycle too, until
    /// cleared).
    pub fn inject(&self, layer: usize, rank: usize, fault: Fault) {
        self.lock().faults.insert((layer, rank), fault);
    }

    /// Makes every [`Transport::load`] of `layer` on `rank` fail (the host backup has no copy),
    /// until cleared.
    pub fn fail_loads(&self, layer: usize, rank: usize) {
        self.lock().load_faults.insert((layer, rank));
    }

    /// Removes every injected fault (load failures included).
    pub fn clear_faults(&self) {
        let mut st = self.lock();
        st.faults.clear();
        st.load_faults.clear();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The deterministic content of expert `expert` of layer `layer`, `len` bytes: what a checkpoint
/// loader would have put in its slot. Tests compare slots against it.
pub fn canonical_expert_bytes(layer: usize, expert: u16, len: usize) -> Vec<u8> {
    // XOR, not OR, with the constant: OR would set bit 32 for every layer, so layers 0 and 1
    // would share their bytes.
    let mut x = ((layer as u64) << 32 | u64::from(expert)) ^ 0x9E37_79B9_0000_0000;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The deterministic content of tensor `name` of expert `expert` of layer `layer`, `len` bytes:
/// what a checkpoint loader would have put there. Differs between tensors of one expert.
pub fn canonical_tensor_bytes(layer: usize, expert: u16, name: &str, len: usize) -> Vec<u8> {
    // FNV-1a of the name, folded into the seed of the expert's stream.
    let h = eplb_core::fnv1a(name.bytes().map(u64::from));
    let mut x = (layer as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ u64::from(expert)
            .wrapping_add(1)
            .wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ h;
    if x == 0 {
        x = 1;
    }
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The canonical blob of expert `expert` of layer `layer` under `payload`: each tensor's
/// [`canonical_tensor_bytes`] at its offset.
pub fn canonical_payload_bytes(layer: usize, expert: u16, payload: &ExpertPayload) -> Vec<u8> {
    let mut blob = Vec::with_capacity(payload.total_bytes());
    for t in payload.tensors() {
        blob.extend(canonical_tensor_bytes(layer, expert, t.name(), t.bytes()));
    }
    blob
}

/// One rank's endpoint of a [`HostWorld`], holding that rank's expert weights.
#[derive(Debug)]
pub struct HostTransport {
    world: Arc<HostWorld>,
    rank: usize,
    /// This endpoint's membership generation (an index into the world's `gens`).
    generation: u64,
    /// Its live set (`None`: every rank).
    live: Option<LiveSet>,
    seq: u64,
    expert_bytes: usize,
    /// The tensors of a slot, when built with [`HostTransport::with_payload`].
    payload: Option<ExpertPayload>,
    /// `[L][S]` live slots.
    slots: Vec<Vec<Vec<u8>>>,
    /// `S` receive buffers.
    buffers: Vec<Vec<u8>>,
    /// The layer whose loads filled receive buffers, and those buffers.
    loaded: Option<(usize, Vec<u16>)>,
}

impl HostTransport {
    /// Rank `rank`'s endpoint, its slots loaded with the canonical bytes of `rows` (`[L][S]`, this
    /// rank's experts per layer), each expert `expert_bytes` long.
    pub fn new(world: Arc<HostWorld>, rank: usize, rows: &[Vec<u16>], expert_bytes: usize) -> Self {
        Self::loaded(world, rank, rows, expert_bytes, None, |l, e| {
            canonical_expert_bytes(l, e, expert_bytes)
        })
    }

    /// Rank `rank`'s endpoint whose slots are blobs of `payload`'s tensors, loaded with the
    /// [`canonical_payload_bytes`] of `rows` (`[L][S]`, this rank's experts per layer). An
    /// expert's tensors move in one message and are installed together.
    pub fn with_payload(
        world: Arc<HostWorld>,
        rank: usize,
        rows: &[Vec<u16>],
        payload: &ExpertPayload,
    ) -> Self {
        Self::loaded(
            world,
            rank,
            rows,
            payload.total_bytes(),
            Some(payload.clone()),
            |l, e| canonical_payload_bytes(l, e, payload),
        )
    }

    /// An endpoint whose slot `(l, s)` holds `bytes_of(l, rows[l][s])`, every expert
    /// `expert_bytes` long.
    fn loaded(
        world: Arc<HostWorld>,
        rank: usize,
        rows: &[Vec<u16>],
        expert_bytes: usize,
        payload: Option<ExpertPayload>,
        bytes_of: impl Fn(usize, u16) -> Vec<u8>,
    ) -> Self {
        let s = rows.first().map_or(0, Vec::len);
        let slots = rows
            .iter()
            .enumerate()
            .map(|(l, row)| row.iter().map(|&e| bytes_of(l, e)).collect())
            .collect();
        Self {
            world,
            rank,
            generation: 0,
            live: None,
            seq: 0,
            expert_bytes,
            payload,
            slots,
            buffers: vec![vec![0; expert_bytes]; s],
            loaded: None,
        }
    }

    /// The bytes of a live slot.
    pub fn slot(&self, layer: usize, slot: usize) -> Option<&[u8]> {
        self.slots.get(layer)?.get(slot).map(Vec::as_slice)
    }

    /// Bytes of one slot (one expert).
    pub fn expert_bytes(&self) -> usize {
        self.expert_bytes
    }

    /// The payload of a slot, when built with [`HostTransport::with_payload`].
    pub fn payload(&self) -> Option<&ExpertPayload> {
        self.payload.as_ref()
    }

    /// The bytes of tensor `name` in a live slot (needs a payload).
    pub fn slot_tensor(&self, layer: usize, slot: usize, name: &str) -> Option<&[u8]> {
        let t = self.payload.as_ref()?.tensor(name)?;
        self.slot(layer, slot)?.get(t.range())
    }

    /// Live ranks (every rank until [`Transport::set_live`]).
    fn live_count(&self) -> usize {
        self.live.as_ref().map_or(self.world.ranks, LiveSet::count)
    }

    fn is_live(&self, rank: usize) -> bool {
        self.live
            .as_ref()
            .map_or(rank < self.world.ranks, |l| l.contains(rank))
    }

    /// The round this endpoint's next collective enters: its own next one, or the floor of its
    /// generation when that is later.
    fn next_key(&self, st: &State) -> Key {
        if st.floor.0 == self.generation {
            (self.generation, self.seq.max(st.floor.1))
        } else {
            (self.generation, self.seq)
        }
    }

    fn collective(&mut self, op: Op, local: &[u64]) -> Result<Vec<Vec<u64>>, TransportError> {
        let world = Arc::clone(&self.world);
        let need = self.live_count();
        let mut st = world.lock();
        // A round some rank gave up on is closed: a rank that missed it (it was late, or never
        // entered it) joins the first open round of its generation, where its peers meet it
        // (their words tell the rank machines whether they are at one step).
        let key = self.next_key(&st);
        let seq = key.1;
        let at = Site::new(op, self.rank).seq(seq);
        self.seq = seq + 1;
        st.rounds
            .entry(key)
            .or_default()
            .parts
            .insert(self.rank, local.to_vec());
        world.cv.notify_all();
        let deadline = Deadline::after(world.timeout);
        loop {
            let arrived = st.rounds.get(&key).map_or(0, |r| r.parts.len());
            if arrived >= need {
                break;
            }
            let Some(left) = deadline.left() else {
                // Withdraw, so that no rank can complete this round without us: a collective
                // fails on every rank or on none.
                if let Some(round) = st.rounds.get_mut(&key) {
                    round.parts.remove(&self.rank);
                    if round.parts.is_empty() {
                        st.rounds.remove(&key);
                    }
                }
                // Close this round (and any before it) for every rank: a peer that never came
                // enters the next one, where the ranks meet again.
                st.floor = st.floor.max((self.generation, seq + 1));
                let floor = st.floor;
                st.rounds.retain(|&k, r| k >= floor || r.read > 0);
                return Err(TransportError::Timeout {
                    at,
                    detail: String::new(),
                });
            };
            st = world
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let round = st.rounds.get_mut(&key).ok_or(TransportError::Protocol {
            at,
            detail: "the round vanished".into(),
        })?;
        if round.parts.len() != need {
            return Err(TransportError::Protocol {
                at,
                detail: format!(
                    "{} ranks met in a round of {need} live ranks",
                    round.parts.len()
                ),
            });
        }
        let parts: Vec<Vec<u64>> = round.parts.values().cloned().collect();
        round.read += 1;
        if round.read == need {
            st.rounds.remove(&key);
        }
        Ok(parts)
    }

    fn check_layer(&self, op: Op, layer: usize) -> Result<(), TransportError> {
        if layer < self.slots.len() {
            Ok(())
        } else {
            Err(TransportError::Invalid {
                at: Site::new(op, self.rank).layer(layer),
                detail: format!("{} layers", self.slots.len()),
            })
        }
    }
}

impl Transport for HostTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.world.ranks
    }

    fn all_gather(&mut self, local: &[u64], out: &mut [u64]) -> Result<(), TransportError> {
        let need = local.len().saturating_mul(self.live_count());
        if out.len() != need {
            return Err(TransportError::Invalid {
                at: Site::new(Op::AllGather, self.rank),
                detail: format!(
                    "the output holds {} values, needs {need} ({} live ranks)",
                    out.len(),
                    self.live_count()
                ),
            });
        }
        let parts = self.collective(Op::AllGather, local)?;
        for (chunk, part) in out.chunks_exact_mut(local.len().max(1)).zip(&parts) {
            if part.len() != chunk.len() {
                return Err(TransportError::Protocol {
                    at: Site::new(Op::AllGather, self.rank),
                    detail: "the contributions differ in length".into(),
                });
            }
            chunk.copy_from_slice(part);
        }
        Ok(())
    }

    fn set_live(&mut self, live: &LiveSet) -> Result<(), TransportError> {
        let at = Site::new(Op::SetLive, self.rank);
        if live.ranks() != self.world.ranks {
            return Err(TransportError::Invalid {
                at,
                detail: format!(
                    "a live set of {} ranks for a world of {}",
                    live.ranks(),
                    self.world.ranks
                ),
            });
        }
        if !live.contains(self.rank) {
            return Err(TransportError::Invalid {
                at,
                detail: format!("this rank is not in the live set {live:?}"),
            });
        }
        let mut st = self.world.lock();
        let latest = st.gens.len().saturating_sub(1) as u64;
        // The first later generation of this set (peers that got there first), else a new one;
        // a call that changes nothing (this set, and no later generation) keeps the sequence.
        let found = st
            .gens
            .iter()
            .enumerate()
            .skip(self.generation as usize + 1)
            .find(|(_, g)| same_set(g.as_ref(), live))
            .map(|(g, _)| g as u64);
        let generation = match found {
            Some(g) => g,
            None if self.generation == latest && same_set(self.live.as_ref(), live) => {
                return Ok(());
            }
            None => {
                st.gens.push(Some(*live));
                latest + 1
            }
        };
        self.generation = generation;
        self.seq = 0;
        self.live = Some(*live);
        Ok(())
    }

    fn live(&self) -> Option<LiveSet> {
        self.live.or_else(|| LiveSet::all(self.world.ranks).ok())
    }

    fn load(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.check_layer(Op::Load, plan.layer)?;
        let at = Site::new(Op::Load, self.rank).layer(plan.layer);
        self.loaded = None;
        let fails = self
            .world
            .lock()
            .load_faults
            .contains(&(plan.layer, self.rank));
        let mut filled = Vec::with_capacity(plan.loads.len());
        for op in &plan.loads {
            if fails {
                return Err(TransportError::Failed {
                    at: at.expert(op.expert),
                    code: -1,
                    detail: "injected: the host backup has no copy of the expert".into(),
                });
            }
            let bytes = match &self.payload {
                Some(p) => canonical_payload_bytes(plan.layer, op.expert, p),
                None => canonical_expert_bytes(plan.layer, op.expert, self.expert_bytes),
            };
            let n = self.buffers.len();
            let buf = self
                .buffers
                .get_mut(usize::from(op.buffer))
                .filter(|_| !filled.contains(&op.buffer))
                .ok_or_else(|| TransportError::Invalid {
                    at: at.expert(op.expert),
                    detail: format!(
                        "receive buffer {} reused or out of range ({n} buffers)",
                        op.buffer
                    ),
                })?;
            buf.copy_from_slice(&bytes);
            filled.push(op.buffer);
        }
        self.loaded = Some((plan.layer, filled));
        Ok(())
    }

    fn launch_sends(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        // A launch here only sends; receives happen in `wait`.
        self.launch(plan)
    }

    fn atomic_collectives(&self) -> bool {
        // A rank that times out withdraws its part, so no rank completes a round without it.
        true
    }

    fn all_agree(&mut self, flag: bool) -> Result<bool, TransportError> {
        let parts = self.collective(Op::AllAgree, &[u64::from(flag)])?;
        Ok(parts.iter().all(|p| p.first() == Some(&1)))
    }

    fn launch(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.check_layer(Op::Launch, plan.layer)?;
        if let Some(op) = plan
            .sends
            .iter()
            .find(|o| !self.is_live(usize::from(o.peer)))
        {
            return Err(TransportError::Invalid {
                at: Site::new(Op::Launch, self.rank)
                    .layer(plan.layer)
                    .message(op.peer, op.expert),
                detail: "a send to a rank that is not live".into(),
            });
        }
        let mut st = self.world.lock();
        let sent_at = self.next_key(&st);
        for op in &plan.sends {
            let bytes = self
                .slots
                .get(plan.layer)
                .and_then(|l| l.get(usize::from(op.slot)))
                .cloned()
                .ok_or_else(|| TransportError::Invalid {
                    at: Site::new(Op::Launch, self.rank)
                        .layer(plan.layer)
                        .message(op.peer, op.expert),
                    detail: format!("send from slot {} out of range", op.slot),
                })?;
            st.mail
                .entry((self.rank, usize::from(op.peer)))
                .or_default()
                .push_back(Message {
                    layer: plan.layer,
                    expert: op.expert,
                    bytes,
                    sent_at,
                });
        }
        self.world.cv.notify_all();
        Ok(())
    }

    fn wait(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.check_layer(Op::Wait, plan.layer)?;
        let at = Site::new(Op::Wait, self.rank).layer(plan.layer);
        let world = Arc::clone(&self.world);
        let fault = world.lock().faults.get(&(plan.layer, self.rank)).copied();
        match fault {
            Some(Fault::Fail) => {
                return Err(TransportError::Failed {
                    at,
                    code: -1,
                    detail: "injected".into(),
                });
            }
            Some(Fault::Timeout) => {
                // As a receive that never arrives: the exchange deadline (half the timeout).
                std::thread::sleep(world.timeout / 2);
                return Err(TransportError::Timeout {
                    at,
                    detail: String::new(),
                });
            }
            None => {}
        }
        if let Some(op) = plan
            .recvs
            .iter()
            .find(|o| !self.is_live(usize::from(o.peer)))
        {
            return Err(TransportError::Invalid {
                at: at.message(op.peer, op.expert),
                detail: "a receive from a rank that is not live".into(),
            });
        }
        if plan.recvs.len() > self.buffers.len() {
            return Err(TransportError::Invalid {
                at,
                detail: format!(
                    "{} receives but only {} buffers",
                    plan.recvs.len(),
                    self.buffers.len()
                ),
            });
        }
        // An exchange gives up at half the collective timeout: a rank whose receive hangs then
        // still enters the layer's vote before its peers give up on it there (the HCCL
        // transport's collectives likewise wait longer than its point-to-point receives).
        let deadline = Deadline::after(world.timeout / 2);
        let mut st = world.lock();
        for op in &plan.recvs {
            let key = (usize::from(op.peer), self.rank);
            let msg = loop {
                if let Some(m) = st.mail.get_mut(&key).and_then(VecDeque::pop_front) {
                    if m.layer < plan.layer {
                        continue; // left over from an aborted exchange
                    }
                    break m;
                }
                let Some(left) = deadline.left() else {
                    return Err(TransportError::Timeout {
                        at: at.message(op.peer, op.expert),
                        detail: String::new(),
                    });
                };
                st = world
                    .cv
                    .wait_timeout(st, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            };
            if msg.layer != plan.layer || msg.expert != op.expert {
                return Err(TransportError::Protocol {
                    at: at.message(op.peer, op.expert),
                    detail: format!("got layer {} expert {}", msg.layer, msg.expert),
                });
            }
            if msg.bytes.len() != self.expert_bytes {
                return Err(TransportError::Protocol {
                    at: at.message(op.peer, op.expert),
                    detail: format!(
                        "{} bytes arrived, an expert has {}",
                        msg.bytes.len(),
                        self.expert_bytes
                    ),
                });
            }
            if let Some(buf) = self.buffers.get_mut(usize::from(op.buffer)) {
                buf.copy_from_slice(&msg.bytes);
            }
        }
        Ok(())
    }

    fn commit(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.check_layer(Op::Commit, plan.layer)?;
        let Some(live) = self.slots.get_mut(plan.layer) else {
            return Ok(());
        };
        if plan.install.len() != live.len() {
            return Err(TransportError::Invalid {
                at: Site::new(Op::Commit, self.rank).layer(plan.layer),
                detail: format!(
                    "an install plan for {} slots, the layer has {}",
                    plan.install.len(),
                    live.len()
                ),
            });
        }
        // Every loaded slot's buffer must hold this layer's load: never install stale bytes.
        for src in &plan.install {
            if let SlotSource::Loaded { buffer } = *src {
                let ok = self
                    .loaded
                    .as_ref()
                    .is_some_and(|(l, bufs)| *l == plan.layer && bufs.contains(&buffer));
                if !ok {
                    return Err(TransportError::Invalid {
                        at: Site::new(Op::Commit, self.rank).layer(plan.layer),
                        detail: format!("receive buffer {buffer} was not loaded (call load first)"),
                    });
                }
            }
        }
        let old = live.clone();
        for (slot, src) in live.iter_mut().zip(&plan.install) {
            match *src {
                SlotSource::Unchanged => {}
                SlotSource::Local { from_slot } => {
                    if let Some(b) = old.get(usize::from(from_slot)) {
                        slot.copy_from_slice(b);
                    }
                }
                SlotSource::Received { buffer } | SlotSource::Loaded { buffer } => {
                    if let Some(b) = self.buffers.get(usize::from(buffer)) {
                        slot.copy_from_slice(b);
                    }
                }
            }
        }
        self.loaded = None;
        Ok(())
    }

    fn abort(&mut self, plan: &RankPlan) {
        if self.loaded.as_ref().is_some_and(|(l, _)| *l == plan.layer) {
            self.loaded = None;
        }
        // Only what was sent before this rank's last collective (the vote that failed): a peer
        // that aborted first may already have launched its retry of the same layer.
        let mut st = self.world.lock();
        let now = self.next_key(&st);
        for op in &plan.recvs {
            if let Some(q) = st.mail.get_mut(&(usize::from(op.peer), self.rank)) {
                q.retain(|m| m.layer != plan.layer || m.sent_at >= now);
            }
        }
    }
}

/// A point in time `timeout` from now; a timeout too long for [`Instant`] (such as
/// `Duration::MAX`) never expires instead of overflowing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Option<Instant>,
    timeout: Duration,
}

impl Deadline {
    /// `timeout` from now.
    pub(crate) fn after(timeout: Duration) -> Self {
        Self {
            at: Instant::now().checked_add(timeout),
            timeout,
        }
    }

    /// The time left, or `None` once the deadline has passed.
    pub(crate) fn left(&self) -> Option<Duration> {
        match self.at {
            None => Some(self.timeout),
            Some(at) => at
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero()),
        }
    }
}
