//! The one error type of `eplb-core`.

use core::fmt;

/// Everything that can be wrong with an input to `eplb-core`.
///
/// Every variant says what is wrong and where (layer, rank, slot, expert).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A dimension of a shape is zero.
    ZeroDimension {
        /// Which dimension (`layers`, `experts`, ...).
        what: &'static str,
    },
    /// `ranks * slots_per_rank < experts`: not every expert can have a slot.
    TooFewSlots {
        /// EP ranks.
        ranks: u16,
        /// Slots per rank.
        slots_per_rank: u16,
        /// Logical experts.
        experts: u16,
    },
    /// More slots per rank than experts: a rank would have to hold an expert twice.
    TooManySlotsPerRank {
        /// Slots per rank.
        slots_per_rank: u16,
        /// Logical experts.
        experts: u16,
    },
    /// `ranks_per_node` does not divide `ranks`.
    RanksPerNode {
        /// Ranks per node.
        ranks_per_node: u16,
        /// EP ranks.
        ranks: u16,
    },
    /// More expert groups than experts.
    Groups {
        /// Expert groups.
        groups: u16,
        /// Logical experts.
        experts: u16,
    },
    /// Physical ids `rank * S + slot` would not fit the `int32` of the wire format.
    PhysicalIdsOverflow {
        /// EP ranks.
        ranks: u16,
        /// Slots per rank.
        slots_per_rank: u16,
    },
    /// `N + X` is not a multiple of `R`, so the slots per rank would not be whole.
    RedundancyNotDivisible {
        /// Logical experts.
        experts: u16,
        /// Redundant experts asked for.
        redundant: u32,
        /// EP ranks.
        ranks: u16,
    },
    /// A slice has the wrong length.
    Length {
        /// What the slice holds.
        what: &'static str,
        /// Length required by the shape.
        expected: usize,
        /// Length given.
        got: usize,
    },
    /// A layer, rank, slot or expert index is out of range.
    Index {
        /// Which kind of index.
        what: &'static str,
        /// The index given.
        index: usize,
        /// The exclusive upper bound.
        bound: usize,
    },
    /// A placement holds an expert id `>= N`.
    ExpertOutOfRange {
        /// Layer.
        layer: u16,
        /// Rank.
        rank: u16,
        /// Slot on that rank.
        slot: u16,
        /// The offending id.
        expert: u16,
        /// Number of logical experts.
        experts: u16,
    },
    /// A logical expert has no slot in a layer.
    MissingExpert {
        /// Layer.
        layer: u16,
        /// The expert that no rank holds.
        expert: u16,
    },
    /// A rank outside the live set holds an expert (its slots must be
    /// [`EMPTY`](crate::EMPTY)).
    NotLive {
        /// Layer.
        layer: u16,
        /// The rank that is not live.
        rank: u16,
        /// Slot on that rank.
        slot: u16,
        /// The expert it holds.
        expert: u16,
    },
    /// The same expert sits twice on one rank (structurally valid, not servable).
    ColocatedCopies {
        /// Layer.
        layer: u16,
        /// Rank.
        rank: u16,
        /// The expert held twice.
        expert: u16,
    },
    /// An interval of the cycle is zero (vLLM-Ascend would hang).
    ZeroInterval {
        /// `heat_interval` or `algo_interval`.
        what: &'static str,
    },
    /// A load is negative, NaN or infinite.
    BadLoad {
        /// Layer.
        layer: u16,
        /// Expert (or slot index, for per-slot loads).
        index: usize,
    },
    /// A counter would overflow.
    Overflow {
        /// What overflowed.
        what: &'static str,
    },
    /// A per-slot load of the time model is negative, NaN or infinite.
    BadSlotLoad {
        /// Layer.
        layer: u16,
        /// Rank.
        rank: u16,
        /// Slot on that rank.
        slot: u16,
    },
    /// A number of the time model (hardware, model, tokens, bytes, times) is out of range.
    BadParameter {
        /// Which number (`hardware HBM bandwidth`, `tokens per rank`, ...).
        what: &'static str,
        /// What it must be (`a finite number > 0`, ...).
        requirement: &'static str,
    },
    /// A numeric setting out of its physical range ([`crate::settings`]).
    Setting(crate::settings::SettingError),
}

impl From<crate::settings::SettingError> for Error {
    fn from(e: crate::settings::SettingError) -> Self {
        Error::Setting(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::ZeroDimension { what } => write!(f, "{what} must be at least 1, got 0"),
            Error::TooFewSlots {
                ranks,
                slots_per_rank,
                experts,
            } => write!(
                f,
                "{ranks} ranks x {slots_per_rank} slots = {} slots cannot hold {experts} experts",
                u32::from(ranks) * u32::from(slots_per_rank)
            ),
            Error::TooManySlotsPerRank {
                slots_per_rank,
                experts,
            } => write!(
                f,
                "{slots_per_rank} slots per rank exceed the {experts} experts: a rank would hold an expert twice"
            ),
            Error::RanksPerNode {
                ranks_per_node,
                ranks,
            } => write!(
                f,
                "ranks per node {ranks_per_node} does not divide the {ranks} ranks"
            ),
            Error::Groups { groups, experts } => {
                write!(f, "{groups} expert groups exceed the {experts} experts")
            }
            Error::PhysicalIdsOverflow {
                ranks,
                slots_per_rank,
            } => write!(
                f,
                "{ranks} ranks x {slots_per_rank} slots overflow the int32 physical expert id"
            ),
            Error::RedundancyNotDivisible {
                experts,
                redundant,
                ranks,
            } => {
                let r = u32::from(ranks);
                let rem = (u32::from(experts) + redundant) % r;
                write!(
                    f,
                    "{experts} experts + {redundant} redundant is not a multiple of {ranks} ranks; nearest valid redundant counts: "
                )?;
                if redundant >= rem {
                    write!(f, "{} or ", redundant - rem)?;
                }
                write!(f, "{}", redundant + (r - rem))
            }
            Error::Length {
                what,
                expected,
                got,
            } => write!(f, "{what}: expected {expected} values, got {got}"),
            Error::Index { what, index, bound } => {
                write!(f, "{what} {index} out of range (must be below {bound})")
            }
            Error::ExpertOutOfRange {
                layer,
                rank,
                slot,
                expert,
                experts,
            } => write!(
                f,
                "layer {layer}, rank {rank}, slot {slot}: expert {expert} out of range (must be below {experts})"
            ),
            Error::MissingExpert { layer, expert } => {
                write!(f, "layer {layer}: expert {expert} is on no rank")
            }
            Error::NotLive {
                layer,
                rank,
                slot,
                expert,
            } => write!(
                f,
                "layer {layer}, rank {rank}, slot {slot}: rank {rank} is not live but holds expert {expert}"
            ),
            Error::ColocatedCopies {
                layer,
                rank,
                expert,
            } => write!(
                f,
                "layer {layer}, rank {rank}: expert {expert} is held twice on the same rank"
            ),
            Error::ZeroInterval { what } => {
                write!(
                    f,
                    "{what} must be at least 1, got 0 (zero never completes a cycle)"
                )
            }
            Error::BadLoad { layer, index } => write!(
                f,
                "layer {layer}, index {index}: load must be a finite number >= 0"
            ),
            Error::Overflow { what } => write!(f, "{what} overflows"),
            Error::BadSlotLoad { layer, rank, slot } => write!(
                f,
                "layer {layer}, rank {rank}, slot {slot}: slot load must be a finite number >= 0"
            ),
            Error::BadParameter { what, requirement } => {
                write!(f, "time model: {what} must be {requirement}")
            }
            Error::Setting(e) => write!(f, "{e}"),
        }
    }
}

impl core::error::Error for Error {}

/// `Ok` when `got == expected`, else [`Error::Length`] naming `what`.
pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), Error> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::Length {
            what,
            expected,
            got,
        })
    }
}
