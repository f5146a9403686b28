//! [`MachineError`]: a bad call into the machine or its driver.

use std::fmt;

use eplb_core::Error;

/// A bad call into the machine or its driver (the caller's bug), never a runtime condition.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum MachineError {
    /// A shape or placement problem.
    Core(Error),
    /// A buffer has the wrong length.
    Len {
        /// Which buffer.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Given length.
        got: usize,
    },
    /// A collective reply of the wrong kind, or one nobody asked for.
    Reply {
        /// The reply the machine waits for.
        expected: &'static str,
        /// The reply it got.
        got: &'static str,
    },
    /// A membership change whose live set does not hold this rank, or is drawn from another
    /// number of ranks.
    NotMember {
        /// This rank.
        rank: usize,
        /// Live ranks in the set.
        live: usize,
        /// Ranks the set is drawn from.
        ranks: usize,
    },
    /// A membership change to fewer live slots than experts: some expert could have no copy.
    TooFewLiveSlots {
        /// Live ranks.
        live: usize,
        /// Slots per rank.
        slots_per_rank: usize,
        /// Logical experts.
        experts: usize,
    },
    /// A membership call while this rank's words on another proposed set are in flight (the
    /// members gather asked for and not answered): the call cannot join that agreement and
    /// changes nothing; call it again once the gather is answered.
    MembershipInFlight {
        /// This rank.
        rank: usize,
        /// The lowest rank whose membership the call would change against the set being agreed.
        changes: usize,
        /// Live ranks in the set being agreed.
        agreeing: usize,
        /// Ranks the sets are drawn from.
        ranks: usize,
    },
    /// The transport endpoint does not match the shape.
    Endpoint {
        /// The endpoint's rank.
        rank: usize,
        /// The endpoint's world size.
        ranks: usize,
        /// Ranks in the shape.
        shape_ranks: usize,
    },
}

impl fmt::Display for MachineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MachineError::Core(e) => e.fmt(f),
            MachineError::Len {
                what,
                expected,
                got,
            } => write!(f, "{what}: expected {expected} values, got {got}"),
            MachineError::Reply { expected, got } => {
                write!(f, "collective reply: expected {expected}, got {got}")
            }
            MachineError::NotMember { rank, live, ranks } => write!(
                f,
                "membership: rank {rank} is not in the live set ({live} of {ranks} ranks; the set \
                 must be drawn from the shape's ranks and hold this rank)"
            ),
            MachineError::TooFewLiveSlots {
                live,
                slots_per_rank,
                experts,
            } => write!(
                f,
                "membership: {live} live ranks x {slots_per_rank} slots cannot hold {experts} \
                 experts"
            ),
            MachineError::MembershipInFlight {
                rank,
                changes,
                agreeing,
                ranks,
            } => write!(
                f,
                "membership: rank {rank} has its words on a set of {agreeing} of {ranks} ranks in \
                 flight; a call that changes rank {changes} cannot join that agreement until its \
                 gather is answered"
            ),
            MachineError::Endpoint {
                rank,
                ranks,
                shape_ranks,
            } => write!(
                f,
                "transport: endpoint is rank {rank} of {ranks}, the shape has {shape_ranks} ranks"
            ),
        }
    }
}

impl std::error::Error for MachineError {}

impl From<Error> for MachineError {
    fn from(e: Error) -> Self {
        MachineError::Core(e)
    }
}

pub(super) fn check(what: &'static str, expected: usize, got: usize) -> Result<(), MachineError> {
    if expected == got {
        Ok(())
    } else {
        Err(MachineError::Len {
            what,
            expected,
            got,
        })
    }
}
