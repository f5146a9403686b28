//! The weight-transfer backend behind a trait: the in-process [`host`] transport here, the HCCL
//! transport behind the `ascend` feature.
//!
//! Every rank owns one endpoint. Collectives ([`Transport::all_gather`],
//! [`Transport::all_agree`]) must be called by every live rank in the same order. One layer's
//! exchange is split in three so that it overlaps a forward: [`Transport::launch`] before the
//! forward, [`Transport::wait`] after it, then [`Transport::commit`] (or [`Transport::abort`]) once
//! every rank agreed that its exchange succeeded.
//!
//! **Elastic membership.** An endpoint starts with every rank live. When ranks leave or join, the
//! live ranks agree on the new set (with collectives over the old one) and each calls
//! [`Transport::set_live`] at the same point of its collective sequence; from then on the
//! collectives run over the live ranks only (a rank that left and never calls again blocks
//! nobody), and [`Transport::ranks`] still counts every rank. The layer plans of that membership
//! never send to or receive from a rank outside it (its rows are [`eplb_core::EMPTY`]); an expert
//! that lost its last copy is filled into a receive buffer by [`Transport::load`] (from storage or
//! a host backup) before the exchange, and installed by `commit` like a received one. A failed
//! load is voted like a failed exchange: every rank then aborts and keeps the layer as it was.

use std::fmt;

use eplb_core::LiveSet;

use crate::transfer::RankPlan;

#[cfg(feature = "ascend")]
pub mod hccl;
pub mod host;

/// The transport operation a failure happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`Transport::all_gather`].
    AllGather,
    /// [`Transport::all_agree`].
    AllAgree,
    /// [`Transport::launch`] or [`Transport::launch_sends`].
    Launch,
    /// [`Transport::wait`].
    Wait,
    /// [`Transport::commit`].
    Commit,
    /// [`Transport::abort`].
    Abort,
    /// Setting the endpoint up or tearing it down.
    Setup,
    /// [`Transport::set_live`].
    SetLive,
    /// [`Transport::load`].
    Load,
}

impl Op {
    /// The method's name (`all_gather`, `wait`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Op::AllGather => "all_gather",
            Op::AllAgree => "all_agree",
            Op::Launch => "launch",
            Op::Wait => "wait",
            Op::Commit => "commit",
            Op::Abort => "abort",
            Op::Setup => "setup",
            Op::SetLive => "set_live",
            Op::Load => "load",
        }
    }
}

/// Where a transport failure happened: the operation and the rank, and where they apply the
/// layer, the peer rank, the expert and the collective's sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Site {
    /// The operation.
    pub op: Op,
    /// The rank that saw the failure.
    pub rank: usize,
    /// The layer of an exchange.
    pub layer: Option<usize>,
    /// The peer rank a message came from or went to.
    pub peer: Option<u16>,
    /// The expert a message carried.
    pub expert: Option<u16>,
    /// The collective's sequence number on this endpoint.
    pub seq: Option<u64>,
}

impl Site {
    /// `op` on `rank`, nothing more known.
    pub fn new(op: Op, rank: usize) -> Self {
        Self {
            op,
            rank,
            layer: None,
            peer: None,
            expert: None,
            seq: None,
        }
    }

    /// With the layer.
    pub fn layer(self, layer: usize) -> Self {
        Self {
            layer: Some(layer),
            ..self
        }
    }

    /// With the peer and the expert of one message.
    pub fn message(self, peer: u16, expert: u16) -> Self {
        Self {
            peer: Some(peer),
            expert: Some(expert),
            ..self
        }
    }

    /// With the expert (of a load, which has no peer).
    pub fn expert(self, expert: u16) -> Self {
        Self {
            expert: Some(expert),
            ..self
        }
    }

    /// With the collective's sequence number.
    pub fn seq(self, seq: u64) -> Self {
        Self {
            seq: Some(seq),
            ..self
        }
    }
}

impl fmt::Display for Site {
    /// `rank 3: layer 5 wait (expert 7 from rank 2)`, `rank 0: all_gather #12`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}: ", self.rank)?;
        if let Some(l) = self.layer {
            write!(f, "layer {l} ")?;
        }
        f.write_str(self.op.name())?;
        if let Some(s) = self.seq {
            write!(f, " #{s}")?;
        }
        match (self.expert, self.peer) {
            (Some(e), Some(p)) => write!(f, " (expert {e}, rank {p})"),
            (None, Some(p)) => write!(f, " (rank {p})"),
            (Some(e), None) => write!(f, " (expert {e})"),
            (None, None) => Ok(()),
        }
    }
}

/// A transport failure: where ([`Site`]), and the vendor code and message where there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportError {
    /// The operation did not complete in time.
    Timeout {
        /// Where.
        at: Site,
        /// The backend's description, if it gave one (empty otherwise).
        detail: String,
    },
    /// The backend reported a failure.
    Failed {
        /// Where.
        at: Site,
        /// Vendor error code (0 when there is none).
        code: i32,
        /// The backend's description.
        detail: String,
    },
    /// Peers disagree on the protocol (wrong layer, expert or size in a message).
    Protocol {
        /// Where.
        at: Site,
        /// What was expected and what arrived.
        detail: String,
    },
    /// A buffer or index does not fit this endpoint (the caller's bug).
    Invalid {
        /// Where.
        at: Site,
        /// What does not fit.
        detail: String,
    },
}

impl TransportError {
    /// Where the failure happened.
    pub fn site(&self) -> &Site {
        match self {
            TransportError::Timeout { at, .. }
            | TransportError::Failed { at, .. }
            | TransportError::Protocol { at, .. }
            | TransportError::Invalid { at, .. } => at,
        }
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::Timeout { at, detail } if detail.is_empty() => {
                write!(f, "{at}: timed out")
            }
            TransportError::Timeout { at, detail } => write!(f, "{at}: timed out: {detail}"),
            TransportError::Failed { at, code, detail } => {
                write!(f, "{at}: failed (code {code}): {detail}")
            }
            TransportError::Protocol { at, detail } => {
                write!(f, "{at}: protocol mismatch: {detail}")
            }
            TransportError::Invalid { at, detail } => {
                write!(f, "{at}: invalid transport use: {detail}")
            }
        }
    }
}

impl std::error::Error for TransportError {}

/// One rank's endpoint of the weight-transfer backend.
pub trait Transport: Send {
    /// This rank.
    fn rank(&self) -> usize;

    /// Number of ranks, `R`: every rank of the world, gone ones included.
    fn ranks(&self) -> usize;

    /// Gathers every live rank's `local` (all the same length) into `out`, rank-major over the
    /// live ranks in ascending order (`out.len() == live * local.len()`, `live` = every rank
    /// until [`Transport::set_live`] says otherwise).
    fn all_gather(&mut self, local: &[u64], out: &mut [u64]) -> Result<(), TransportError>;

    /// `true` iff every live rank passed `true`.
    fn all_agree(&mut self, flag: bool) -> Result<bool, TransportError>;

    /// From now on the collectives run over `live` only. `live` draws from [`Transport::ranks`]
    /// ranks and holds this rank ([`TransportError::Invalid`] otherwise); every rank of `live`
    /// calls it at the same point of its collective sequence (a rank that joins calls it before
    /// its first collective with the others). It changes nothing else: a plan of that membership
    /// sends to and receives from live ranks only. The default refuses
    /// ([`TransportError::Invalid`]): the transport cannot change its membership.
    fn set_live(&mut self, live: &LiveSet) -> Result<(), TransportError> {
        let _ = live;
        Err(TransportError::Invalid {
            at: Site::new(Op::SetLive, self.rank()),
            detail: "this transport cannot change its membership".into(),
        })
    }

    /// The ranks the collectives run over, or `None` when this transport does not track
    /// membership (then every rank is live).
    fn live(&self) -> Option<LiveSet> {
        None
    }

    /// Fills the receive buffers of `plan.loads` from storage or a host backup (experts that no
    /// rank holds). Called before [`Transport::launch`] of the same layer; `commit` then installs
    /// them ([`crate::transfer::SlotSource::Loaded`]), `abort` forgets them. A failure names
    /// [`Op::Load`], the rank, the layer and the expert; live slots are never touched. The default
    /// refuses ([`TransportError::Invalid`]): there is no backup to load from.
    fn load(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        Err(TransportError::Invalid {
            at: Site::new(Op::Load, self.rank()).layer(plan.layer),
            detail: "this transport has no storage or host backup to load experts from".into(),
        })
    }

    /// Whether a collective fails on every rank or on none. Backends that cannot promise it
    /// (a rank may see a timeout after its peers saw success) keep the default `false`, and the
    /// rank machine then resolves an unknown vote outcome with its peers.
    fn atomic_collectives(&self) -> bool {
        false
    }

    /// Starts this rank's sends and receives of one layer. Receives land in spare buffers,
    /// never in live slots.
    fn launch(&mut self, plan: &RankPlan) -> Result<(), TransportError>;

    /// Sends this rank's part of `plan`'s layer and receives nothing, leaving the receive buffers
    /// as they are (a rank whose previous layer's outcome is unknown keeps that layer's data).
    /// The default sends nothing: the peers' receives from this rank then time out.
    fn launch_sends(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        let _ = plan;
        Ok(())
    }

    /// Waits for the launched exchange of `plan`'s layer.
    fn wait(&mut self, plan: &RankPlan) -> Result<(), TransportError>;

    /// Installs the layer: every slot gets its new content (kept, moved locally or received).
    fn commit(&mut self, plan: &RankPlan) -> Result<(), TransportError>;

    /// Forgets a failed exchange of `plan`'s layer; live slots stay as they were.
    fn abort(&mut self, plan: &RankPlan);
}
