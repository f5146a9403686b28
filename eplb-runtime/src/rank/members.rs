//! Elastic membership: the engine tells every member which ranks serve from now on
//! ([`RankMachine::handle_membership`](super::RankMachine::handle_membership)), the members agree on the set unanimously, then take
//! one routing-only step, and later cycles plan over the live ranks only.
//!
//! **Calls compose.** Any sequence of [`remove_ranks`](super::RankMachine::remove_ranks),
//! [`add_ranks`](super::RankMachine::add_ranks) and
//! [`handle_membership`](super::RankMachine::handle_membership) calls, in one iteration or across
//! iterations while a change is still being agreed, means one call with their combined effect: a
//! removal or an addition applies to the set under agreement (the proposed one while a change is
//! under way, else the agreed one), a whole set replaces it, and the change starts over from the
//! announcement with the combined set. A call made while this rank's membership words are in
//! flight (asked for, not yet answered) cannot join them: it is refused
//! ([`MachineError::MembershipInFlight`]) and changes nothing, as is any refused call.
//!
//! The steps, each at most one per poll and none while an answer is outstanding:
//!
//! 1. **Announce**: the cycle under way is dropped (as on resume), and [`Action::Members`](super::Action::Members) tells
//!    the driver to run the collectives over the proposed set from now on (the transport learns
//!    the set).
//! 2. **Agree**: a [`Gather::Members`](super::Gather::Members) over the proposed set, `a` the set's digest, `live` the
//!    rank's placement hash. Unanimous (every word sound, at that step, with this rank's digest):
//!    every rank adopts the set. A failure here is read as the rank's own word says (adopt). After
//!    an adoption the ranks check their placements over the new set (it settles a layer held
//!    open from before the change, and catches a rank on another placement). Words of another
//!    step or another set: the ranks were not told the same thing; nothing is adopted, and
//!    balancing is suspended on this rank until the engine resumes it or tells it a set again.
//! 3. **Reroute**: the slots of every rank outside the set become [`EMPTY`] in the live
//!    placement and the plan ([`eplb_core::live::retire`]), and [`Action::Reroute`](super::Action::Reroute) asks the
//!    driver to rebuild its routing tables from [`RankMachine::placement`](super::RankMachine::placement): no token goes to a
//!    rank that left, no weight moves; an expert whose every copy was there has no copy
//!    ([`NO_COPY`](eplb_core::NO_COPY) in `log2phy`) until a plan reloads it. A rank that joined
//!    holds [`EMPTY`] rows, so no token goes to it until a layer walk fills them.
//!
//! The next cycle gathers the heat over the live ranks, plans over them (the policy's
//! `rebalance_live`: dead ranks' slots stay [`EMPTY`], lost experts get slots) and walks the
//! layers as usual; a layer whose new rows on this rank hold an expert that no live rank holds
//! asks the driver to load it first ([`LayerAction::Load`](super::LayerAction::Load)); after a failed load the rank still
//! exchanges the layer (its peers' sends and receives stay matched) but votes no on it, and the
//! layer keeps its rows everywhere.

use eplb_core::Shape;
use eplb_core::live::{EMPTY, LiveSet, count_lost};

use super::error::MachineError;
use super::wire::{self, Heard};

/// Where a membership change stands on this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemberStep {
    /// Nothing to do.
    Idle,
    /// Tell the driver the proposed set.
    Announce,
    /// Gather the members' words over the proposed set.
    Agree,
    /// The set is adopted: ask the driver to reroute.
    Reroute,
}

/// What the membership step asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MemberPoll {
    /// Tell the driver the set the collectives run over ([`Members::net`]).
    Announce,
    /// Gather the members' words: `digest` of the proposed set.
    Agree { digest: u64 },
    /// Ask the driver to rebuild its routing tables.
    Reroute,
}

/// What the members' words decide.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Adopt {
    /// Every rank was told this rank's set: it is adopted ([`Members::adopt`] next); `cycle` is
    /// the highest cycle among the words (a rank that joined adopts its peers').
    Adopt { cycle: Option<u64> },
    /// The ranks were told different sets: nothing is adopted.
    Refuse,
}

/// The membership room: the agreed set, the set the collectives run over, the proposed set and
/// the step of a change under way.
#[derive(Debug, Clone)]
pub(super) struct Members {
    /// The ranks that serve (agreed).
    live: LiveSet,
    /// The ranks the collectives run over: `live`, or a proposed set being agreed.
    net: LiveSet,
    /// `net.count()`, kept (a driver asks it before every poll).
    net_count: usize,
    /// The set a membership change proposes.
    proposed: LiveSet,
    step: MemberStep,
}

impl Members {
    pub(super) fn new(live: LiveSet) -> Self {
        Self {
            live,
            net: live,
            net_count: live.count(),
            proposed: live,
            step: MemberStep::Idle,
        }
    }

    /// The ranks that serve (agreed).
    pub(super) fn live(&self) -> &LiveSet {
        &self.live
    }

    /// The ranks the collectives run over.
    pub(super) fn net(&self) -> &LiveSet {
        &self.net
    }

    /// How many ranks the collectives run over.
    pub(super) fn net_count(&self) -> usize {
        self.net_count
    }

    /// Whether a change is under way (announced, not yet rerouted).
    pub(super) fn is_changing(&self) -> bool {
        self.step != MemberStep::Idle
    }

    /// Whether `rank` is live, or is being let in by a change under way.
    pub(super) fn takes_part(&self, rank: usize) -> bool {
        self.live.contains(rank) || (self.step != MemberStep::Idle && self.proposed.contains(rank))
    }

    /// The set a call composes with: the proposed set while a change is under way, else the
    /// agreed one.
    pub(super) fn target(&self) -> LiveSet {
        if self.is_changing() {
            self.proposed
        } else {
            self.live
        }
    }

    /// Checks that `live` can be proposed by `rank` of `shape`; `in_flight`: this rank's
    /// membership words are out and unanswered (a new set cannot join them). Changes nothing.
    pub(super) fn check(
        &self,
        shape: &Shape,
        rank: usize,
        live: &LiveSet,
        in_flight: bool,
    ) -> Result<(), MachineError> {
        if live.ranks() != shape.ranks() || !live.contains(rank) {
            return Err(MachineError::NotMember {
                rank,
                live: live.count(),
                ranks: live.ranks(),
            });
        }
        if live.count() * shape.slots_per_rank() < shape.experts() {
            return Err(MachineError::TooFewLiveSlots {
                live: live.count(),
                slots_per_rank: shape.slots_per_rank(),
                experts: shape.experts(),
            });
        }
        if in_flight && *live != self.proposed {
            let changes = (0..live.ranks())
                .find(|&r| live.contains(r) != self.proposed.contains(r))
                .unwrap_or_default();
            return Err(MachineError::MembershipInFlight {
                rank,
                changes,
                agreeing: self.proposed.count(),
                ranks: live.ranks(),
            });
        }
        Ok(())
    }

    /// Proposes `live` (checked): the change starts over from its announcement.
    pub(super) fn propose(&mut self, live: LiveSet) {
        self.proposed = live;
        self.step = MemberStep::Announce;
    }

    /// The membership step's next action, if one is due.
    pub(super) fn poll(&mut self) -> Option<MemberPoll> {
        match self.step {
            MemberStep::Idle => None,
            MemberStep::Announce => {
                self.step = MemberStep::Agree;
                self.net = self.proposed;
                self.net_count = self.net.count();
                Some(MemberPoll::Announce)
            }
            MemberStep::Agree => Some(MemberPoll::Agree {
                digest: self.proposed.digest(),
            }),
            MemberStep::Reroute => {
                self.step = MemberStep::Idle;
                Some(MemberPoll::Reroute)
            }
        }
    }

    /// The members' words as this rank heard them: unanimous (every word sound, at that step,
    /// with this rank's digest) or failed here (read as this rank's own word says) adopts; words
    /// of another step or another set refuse (the change ends here).
    pub(super) fn on_words(&mut self, heard: Heard<'_>) -> Adopt {
        let digest = self.proposed.digest();
        let verdict = match heard {
            Heard::Unknown { .. } => Adopt::Adopt { cycle: None },
            Heard::OutOfStep => Adopt::Refuse,
            Heard::InStep(words) => {
                if wire::ranks(words).all(|w| w.get(1) == Some(&digest)) {
                    Adopt::Adopt {
                        cycle: wire::top_cycle(words),
                    }
                } else {
                    Adopt::Refuse
                }
            }
        };
        if verdict == Adopt::Refuse {
            self.step = MemberStep::Idle;
        }
        verdict
    }

    /// The proposed set, refused or under way (for the logs).
    pub(super) fn proposed(&self) -> &LiveSet {
        &self.proposed
    }

    /// Adopts the proposed set (the reroute is asked for next); returns the set before.
    pub(super) fn adopt(&mut self) -> LiveSet {
        let before = self.live;
        self.live = self.proposed;
        self.net = self.proposed;
        self.net_count = self.net.count();
        self.step = MemberStep::Reroute;
        before
    }
}

/// Experts (summed over layers) with no copy on a rank of `live` in `placement` (`[L][R][S]`).
pub(super) fn lost_count(shape: &Shape, placement: &[u16], live: &LiveSet) -> usize {
    placement
        .chunks_exact(shape.slots_per_layer())
        .map(|layer| count_lost(shape, layer, live).unwrap_or(0))
        .sum()
}

/// Whether `rank`'s new rows of `layer` in `plan` hold an expert that no live rank holds in
/// `placement`: it must be loaded from storage before the exchange.
pub(super) fn needs_load(
    shape: &Shape,
    rank: usize,
    placement: &[u16],
    plan: &[u16],
    layer: u16,
) -> bool {
    let (per, s) = (shape.slots_per_layer(), shape.slots_per_rank());
    let l = usize::from(layer);
    let (Some(old), Some(new)) = (
        placement.get(l * per..(l + 1) * per),
        plan.get(l * per + rank * s..l * per + (rank + 1) * s),
    ) else {
        return false;
    };
    new.iter().any(|&e| e != EMPTY && !old.contains(&e))
}
