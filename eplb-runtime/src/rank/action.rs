//! What the machine asks of its driver ([`Action`] and its parts) and what comes back from a
//! collective ([`Reply`]).

use std::fmt;

#[cfg(doc)]
use super::{FAILED_PLAN, RankMachine, outcome};

/// One thing the driver must do.
#[must_use = "every action must be executed and, where the table says so, answered"]
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action<'a> {
    /// A collective over every rank; answer with [`RankMachine::handle_collective`].
    Collective(Collective<'a>),
    /// A request or a settlement for the planner.
    Planner(PlannerAction<'a>),
    /// A step of one layer's exchange.
    Layer(LayerAction),
    /// Record mode: hand [`RankMachine::plan`] to the record sink.
    Record {
        /// The cycle.
        cycle: u64,
    },
}

/// A collective, entered by every rank in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective<'a> {
    /// All-gather `send` from every rank into a rank-major buffer of `ranks * send.len()` words;
    /// answer [`Reply::Words`].
    AllGather {
        /// What the words are.
        of: Gather,
        /// This rank's words.
        send: &'a [u64],
    },
    /// All-reduce `flag` ("I have this cycle's plan, ready or failed") with a logical AND (one
    /// byte each way); answer [`Reply::Flag`]. If some rank has no answer yet, every rank asks
    /// again after the next iteration.
    AllAnd {
        /// This rank's flag.
        flag: bool,
    },
}

/// What an [`Collective::AllGather`] gathers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gather {
    /// This rank's slot heat, `[T][L][S]` token counts.
    Heat,
    /// `[cycle, placement hash of the plan]` (hash [`FAILED_PLAN`] when the plan failed here).
    Digest,
    /// The vote on `layer`'s exchange: `[my exchange succeeded (1) or not (0), my outcome of the
    /// previous vote` ([`outcome`])`]`. The layer commits iff every rank's word 0 is 1. Word 1
    /// lets a rank whose previous vote failed locally learn what its peers did.
    Vote {
        /// The layer.
        layer: u16,
    },
    /// At the end of a layer walk (and on resume): `[cycle, hash of the live placement]`. A rank
    /// that did not learn the outcome of a layer vote (its collective failed after its peers'
    /// succeeded) learns it here.
    Placement,
}

impl fmt::Display for Gather {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gather::Heat => f.write_str("heat gather"),
            Gather::Digest => f.write_str("digest agreement"),
            Gather::Vote { layer } => write!(f, "layer {layer} vote"),
            Gather::Placement => f.write_str("placement check"),
        }
    }
}

/// A collective's reply on this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// The AND over every rank of [`Collective::AllAnd`].
    Flag(bool),
    /// Every rank's words of [`Collective::AllGather`], rank-major.
    Words(&'a [u64]),
}

/// What the planner is asked for one cycle, borrowed from the machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanInput<'a> {
    /// The cycle number (1, 2, ... on every rank alike).
    pub cycle: u64,
    /// Seed for randomised policies.
    pub seed: u64,
    /// The live placement the heat was measured on, `[L][R][S]`.
    pub current: &'a [u16],
    /// `T`: heat windows in `samples`.
    pub windows: usize,
    /// Logical loads `[L][N]`, summed over the heat interval.
    pub loads: &'a [f64],
    /// Per-window logical loads `[T][L][N]`, oldest first.
    pub samples: &'a [f64],
}

/// The planner's side of a cycle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PlannerAction<'a> {
    /// Ask the planner for a plan; answer with [`RankMachine::handle_plan`] any time later.
    Submit(PlanInput<'a>),
    /// Every rank took cycle `cycle` (`taken`) or it was abandoned: the planner advances the
    /// policy's state to the one after the cycle, or rolls it back to the one before. With
    /// `resync` (the ranks held different plans, so their policy states may differ) every rank
    /// restarts the policy from its initial state.
    Settle {
        /// The cycle.
        cycle: u64,
        /// Whether every rank took it.
        taken: bool,
        /// Restart the policy state from scratch.
        resync: bool,
    },
}

/// A step of one layer's exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerAction {
    /// Before the next forward, start this rank's exchange of `layer` from
    /// [`RankMachine::placement`] to [`RankMachine::plan`]; report with
    /// [`RankMachine::handle_exchanged`] after the forward.
    Launch {
        /// The layer.
        layer: u16,
    },
    /// Send this rank's part of `layer`'s exchange but receive nothing (a previous layer's
    /// received data is still kept, its outcome unknown here); no answer. The machine votes no
    /// on this layer after the forward, so that the peers' receives complete and the walk stays
    /// in step.
    SendOnly {
        /// The layer.
        layer: u16,
    },
    /// Every rank's exchange succeeded: install `layer`, then call
    /// [`RankMachine::handle_committed`].
    Commit {
        /// The layer.
        layer: u16,
    },
    /// The exchange failed somewhere: forget it; the live slots stay as they were.
    Abort {
        /// The layer.
        layer: u16,
    },
}

/// The name of a gather's reply buffer, for errors.
pub(super) fn gather_what(of: Gather) -> &'static str {
    match of {
        Gather::Heat => "gathered slot heat [R][T][L][S]",
        Gather::Digest => "gathered plan digests [R][2]",
        Gather::Vote { .. } => "gathered layer votes [R][2]",
        Gather::Placement => "gathered placement digests [R][2]",
    }
}
