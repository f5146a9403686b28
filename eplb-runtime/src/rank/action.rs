//! What the machine asks of its driver ([`Action`] and its parts) and what comes back from a
//! collective ([`Reply`]).

use std::fmt;

use eplb_core::LiveSet;

#[cfg(doc)]
use super::{AGREE_WORDS, FAILED_PLAN, RankMachine, agree_tag, outcome, seal};

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
    /// A membership change: run every collective from now on over `live` only (the transport
    /// learns the set); no answer.
    Members {
        /// The ranks the collectives run over.
        live: &'a LiveSet,
    },
    /// The ranks agreed on a new live set: rebuild the routing tables (`log2phy`, expert maps)
    /// from [`RankMachine::placement`], whose slots of the ranks that left are
    /// [`EMPTY`](eplb_core::EMPTY), so that no token goes to them; no weight moves. No answer.
    Reroute,
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
    /// All-reduce `flag` with a logical AND (one byte each way); answer [`Reply::Flag`]. The
    /// machine asks for none (its readiness flag is the tagged [`Gather::Ready`]); drivers and
    /// [`LocalCollective`](super::LocalCollective) still serve it.
    AllAnd {
        /// This rank's flag.
        flag: bool,
    },
}

/// What an [`Collective::AllGather`] gathers.
///
/// Every gather but the heat's is an agreement of [`AGREE_WORDS`] words per rank, `[tag, a, b,
/// live, check]`: `tag` names the cycle, the step and the layer it belongs to ([`agree_tag`]),
/// `a` and `b` are the step's own words (below), `live` is the hash of the rank's live
/// placement where the step compares it (the readiness flag and the placement check; 0
/// elsewhere), and `check` seals the four ([`seal`]). A rank that reads a word failing its check
/// treats the gather as failed here; a rank that reads another step's or cycle's tag knows the
/// ranks are out of step and resynchronizes (see [`RankMachine::handle_collective`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gather {
    /// This rank's slot heat, `[T][L][S]` token counts. Untagged: a rank whose heat gather failed
    /// says so in its next word (its plan is [`FAILED_PLAN`]), so that every rank drops the cycle
    /// at the same step.
    Heat,
    /// The plan is due: `a` is 1 if this rank has this cycle's plan (ready or failed), `live` its
    /// placement hash. Every flag set: the digest follows at once; otherwise every rank asks
    /// again after the next iteration.
    Ready,
    /// `a`: the placement hash of the plan ([`FAILED_PLAN`] when the plan failed here).
    Digest,
    /// The vote on `layer`'s exchange: `a` my exchange succeeded (1) or not (0), `b` my outcome of
    /// the previous vote ([`outcome`]). The layer commits iff every rank's `a` is 1 and every tag
    /// is this vote's. `b` lets a rank whose previous vote failed locally learn what its peers
    /// did.
    Vote {
        /// The layer.
        layer: u16,
    },
    /// A membership change: `a` is the digest of the proposed live set, `live` the rank's
    /// placement hash; gathered over the proposed set. The set is adopted only when every word
    /// carries this rank's digest ([`RankMachine::handle_membership`]).
    Members,
    /// At the end of a layer walk, after a resynchronization and on resume: `live` is the hash of
    /// the rank's live placement. The ranks adopt the highest cycle among the tags; a rank on
    /// another placement than the majority's repairs it (commits the layer it kept, or drops
    /// it) or stops balancing ([`Health::Diverged`](super::Health::Diverged)).
    Placement,
}

impl fmt::Display for Gather {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gather::Heat => f.write_str("heat gather"),
            Gather::Ready => f.write_str("plan-ready agreement"),
            Gather::Digest => f.write_str("digest agreement"),
            Gather::Vote { layer } => write!(f, "layer {layer} vote"),
            Gather::Members => f.write_str("membership agreement"),
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
    /// The live placement the heat was measured on, `[L][R][S]` (the slots of ranks outside
    /// `live` are [`EMPTY`](eplb_core::EMPTY)).
    pub current: &'a [u16],
    /// The ranks that serve: the plan may use only them.
    pub live: &'a LiveSet,
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
    /// Before `layer`'s exchange: load this rank's new experts of `layer` that no live rank
    /// holds (they lost every copy when ranks left) from storage or a host backup into receive
    /// buffers; answer [`RankMachine::handle_loaded`]. A failed load makes this rank vote no on
    /// the layer, which then keeps its rows on every rank.
    Load {
        /// The layer.
        layer: u16,
    },
}

/// The name of a gather's reply buffer, for errors.
pub(super) fn gather_what(of: Gather) -> &'static str {
    match of {
        Gather::Heat => "gathered slot heat [R][T][L][S]",
        Gather::Ready => "gathered plan-ready words [R][5]",
        Gather::Digest => "gathered plan digests [R][5]",
        Gather::Vote { .. } => "gathered layer votes [R][5]",
        Gather::Members => "gathered membership words [R'][5]",
        Gather::Placement => "gathered placement digests [R][5]",
    }
}
