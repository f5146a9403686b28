//! The one error type of `eplb-policies`.

use core::fmt;

/// Everything that can go wrong in a policy call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A shape, placement or load problem found by `eplb-core`.
    Core(eplb_core::Error),
    /// The scratch buffer is too small.
    Scratch {
        /// Words needed.
        needed: usize,
        /// Words given.
        got: usize,
    },
    /// The state buffer is too small.
    State {
        /// Words needed.
        needed: usize,
        /// Words given.
        got: usize,
    },
    /// The policy needs per-window samples and none were given.
    SamplesRequired {
        /// The policy's name.
        policy: &'static str,
    },
    /// The topology does not suit the policy (for example `N % groups != 0` for the
    /// hierarchical DeepSeek policy).
    Topology {
        /// What is wrong.
        what: &'static str,
        /// The offending value.
        value: usize,
    },
    /// The policy produced no valid placement for a layer.
    NoPlacement {
        /// Layer.
        layer: u16,
        /// Why.
        why: &'static str,
    },
    /// The policy produced an invalid placement (a bug; the old placement should be kept).
    InvalidOutput(eplb_core::Error),
    /// An unknown policy name or number.
    UnknownPolicy,
    /// The shape is outside the supported range, or the policy's buffers would exceed the
    /// limit ([`crate::MAX_RANKS`], [`crate::MAX_SLOTS_PER_LAYER`],
    /// [`crate::MAX_BUFFER_BYTES`]).
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// How much the shape needs.
        needed: usize,
        /// The limit.
        limit: usize,
    },
    /// Too few live ranks to hold every expert once: `live * slots_per_rank < experts` (or no
    /// live rank, or more than `ranks`).
    TooFewLiveRanks {
        /// Live ranks.
        live: usize,
        /// Ranks of the full shape.
        ranks: usize,
        /// Slots per rank.
        slots_per_rank: usize,
        /// Logical experts.
        experts: usize,
    },
}

impl From<eplb_core::Error> for Error {
    fn from(e: eplb_core::Error) -> Self {
        Error::Core(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Core(e) => e.fmt(f),
            Error::Scratch { needed, got } => {
                write!(f, "scratch too small: {needed} words needed, {got} given")
            }
            Error::State { needed, got } => {
                write!(f, "policy state too small: {needed} words needed, {got} given")
            }
            Error::SamplesRequired { policy } => {
                write!(f, "policy {policy} needs per-window heat samples")
            }
            Error::Topology { what, value } => write!(f, "{what} (got {value})"),
            Error::NoPlacement { layer, why } => {
                write!(f, "layer {layer}: no valid placement: {why}")
            }
            Error::InvalidOutput(e) => write!(f, "policy produced an invalid placement: {e}"),
            Error::TooLarge {
                what,
                needed,
                limit,
            } => write!(f, "{what}: {needed} is over the supported limit of {limit}"),
            Error::TooFewLiveRanks {
                live,
                ranks,
                slots_per_rank,
                experts,
            } => write!(
                f,
                "{live} live ranks of {ranks} with {slots_per_rank} slots each cannot hold {experts} experts"
            ),
            Error::UnknownPolicy => f.write_str(
                "unknown policy: expected 0..4 or one of random, default, swift, flashlb, incremental, deepseek",
            ),
        }
    }
}

impl core::error::Error for Error {}
