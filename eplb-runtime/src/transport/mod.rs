//! The weight-transfer backend behind a trait: the in-process [`host`] transport here, the HCCL
//! transport behind the `ascend` feature.
//!
//! Every rank owns one endpoint. Collectives ([`Transport::all_gather`],
//! [`Transport::all_agree`]) must be called by every rank in the same order. One layer's
//! exchange is split in three so that it overlaps a forward: [`Transport::launch`] before the
//! forward, [`Transport::wait`] after it, then [`Transport::commit`] (or [`Transport::abort`]) once
//! every rank agreed that its exchange succeeded.

use std::fmt;

use crate::transfer::RankPlan;

#[cfg(feature = "ascend")]
pub mod hccl;
pub mod host;

/// A transport failure. Keeps the vendor code and message where there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportError {
    /// The operation did not complete in time.
    Timeout {
        /// What timed out.
        what: String,
    },
    /// The backend reported a failure.
    Failed {
        /// What failed.
        what: String,
        /// Vendor error code (0 when there is none).
        code: i32,
    },
    /// Peers disagree on the protocol (wrong layer, expert or size in a message).
    Protocol {
        /// What was wrong.
        what: String,
    },
    /// A buffer or index does not fit this endpoint.
    Invalid {
        /// What was wrong.
        what: String,
    },
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::Timeout { what } => write!(f, "{what}: timed out"),
            TransportError::Failed { what, code } => write!(f, "{what}: failed (code {code})"),
            TransportError::Protocol { what } => write!(f, "protocol mismatch: {what}"),
            TransportError::Invalid { what } => write!(f, "invalid transport use: {what}"),
        }
    }
}

impl std::error::Error for TransportError {}

/// One rank's endpoint of the weight-transfer backend.
pub trait Transport: Send {
    /// This rank.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn ranks(&self) -> usize;

    /// Gathers every rank's `local` (all the same length) into `out`, rank-major
    /// (`out.len() == ranks * local.len()`).
    fn all_gather(&mut self, local: &[u64], out: &mut [u64]) -> Result<(), TransportError>;

    /// `true` iff every rank passed `true`.
    fn all_agree(&mut self, flag: bool) -> Result<bool, TransportError>;

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
