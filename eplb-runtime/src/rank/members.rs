//! Elastic membership: the engine tells every member which ranks serve from now on
//! ([`RankMachine::handle_membership`]), the members agree on the set unanimously, then take
//! one routing-only step, and later cycles plan over the live ranks only.
//!
//! The steps, each at most one per poll and none while an answer is outstanding:
//!
//! 1. **Announce**: the cycle under way is dropped (as on resume), and [`Action::Members`] tells
//!    the driver to run the collectives over the proposed set from now on (the transport learns
//!    the set).
//! 2. **Agree**: a [`Gather::Members`] over the proposed set, `a` the set's digest, `live` the
//!    rank's placement hash. Unanimous (every word sound, at that step, with this rank's digest):
//!    every rank adopts the set. A failure here is read as the rank's own word says (adopt). After
//!    an adoption the ranks check their placements over the new set (it settles a layer held
//!    open from before the change, and catches a rank on another placement). Words of another
//!    step or another set: the ranks were not told the same thing; nothing is adopted, and
//!    balancing is suspended on this rank until the engine resumes it or tells it a set again.
//! 3. **Reroute**: the slots of every rank outside the set become [`EMPTY`] in the live
//!    placement and the plan ([`eplb_core::live::retire`]), and [`Action::Reroute`] asks the
//!    driver to rebuild its routing tables from [`RankMachine::placement`]: no token goes to a
//!    rank that left, no weight moves; an expert whose every copy was there has no copy
//!    ([`NO_COPY`](eplb_core::NO_COPY) in `log2phy`) until a plan reloads it. A rank that joined
//!    holds [`EMPTY`] rows, so no token goes to it until a layer walk fills them.
//!
//! The next cycle gathers the heat over the live ranks, plans over them (the policy's
//! `rebalance_live`: dead ranks' slots stay [`EMPTY`], lost experts get slots) and walks the
//! layers as usual; a layer whose new rows on this rank hold an expert that no live rank holds
//! asks the driver to load it first ([`LayerAction::Load`]); after a failed load the rank still
//! exchanges the layer (its peers' sends and receives stay matched) but votes no on it, and the
//! layer keeps its rows everywhere.

use eplb_core::live::{EMPTY, LiveSet, count_lost, retire};

use super::agree::{AGREE_WORDS, Heard, Task, placement_hash};
use super::{Action, Gather, Health, MachineError, RankMachine};

/// Where a membership change stands on this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MemberStep {
    /// Nothing to do.
    Idle,
    /// Tell the driver the proposed set ([`Action::Members`]).
    Announce,
    /// Gather the members' words over the proposed set.
    Agree,
    /// The set is adopted: ask the driver to reroute ([`Action::Reroute`]).
    Reroute,
}

impl RankMachine {
    /// The engine changes the membership: from now on the ranks of `live` serve (it holds this
    /// rank). Called on every rank of `live` at the same iteration, whatever each rank's state,
    /// mid-walk too (a second change during a recovery starts over). The cycle under way is
    /// dropped; the ranks agree on the set, reroute (a routing-only step), and the next cycles
    /// plan over the live ranks (`ARCHITECTURE.md`, "Membership changes").
    ///
    /// Errors (nothing changes): `live` drawn from another number of ranks, not holding this
    /// rank, or with too few slots for every expert (`live * S < N`).
    pub fn handle_membership(&mut self, live: LiveSet) -> Result<(), MachineError> {
        if live.ranks() != self.shape.ranks() || !live.contains(self.rank) {
            return Err(MachineError::NotMember {
                rank: self.rank,
                live: live.count(),
                ranks: live.ranks(),
            });
        }
        if live.count() * self.shape.slots_per_rank() < self.shape.experts() {
            return Err(MachineError::TooFewLiveSlots {
                live: live.count(),
                slots_per_rank: self.shape.slots_per_rank(),
                experts: self.shape.experts(),
            });
        }
        log::warn!(
            "eplb rank {}: membership change proposed: {live:?} (was {:?}); the cycle under way \
             is dropped and the ranks agree on the set",
            self.rank,
            self.live
        );
        self.restart();
        self.proposed = live;
        self.members = MemberStep::Announce;
        Ok(())
    }

    /// [`RankMachine::handle_membership`] with `gone` removed from the agreed live set.
    pub fn remove_ranks(&mut self, gone: &[usize]) -> Result<(), MachineError> {
        self.handle_membership(self.live.without(gone)?)
    }

    /// [`RankMachine::handle_membership`] with `back` added to the agreed live set.
    pub fn add_ranks(&mut self, back: &[usize]) -> Result<(), MachineError> {
        self.handle_membership(self.live.with(back)?)
    }

    /// The ranks that serve (agreed).
    pub fn live(&self) -> &LiveSet {
        &self.live
    }

    /// The ranks the collectives run over (the agreed set, or a proposed one being agreed).
    pub fn collective_ranks(&self) -> &LiveSet {
        &self.net
    }

    /// How many ranks the collectives run over ([`RankMachine::collective_ranks`]'s count, kept:
    /// a driver sizes every gather's reply with it).
    pub fn collective_count(&self) -> usize {
        self.net_count
    }

    /// Whether a membership change is under way on this rank (announced, not yet rerouted).
    pub fn is_changing_membership(&self) -> bool {
        self.members != MemberStep::Idle
    }

    /// The membership step's action, if one is due.
    pub(super) fn poll_members(&mut self) -> Option<Action<'_>> {
        match self.members {
            MemberStep::Idle => None,
            MemberStep::Announce => {
                self.members = MemberStep::Agree;
                self.net = self.proposed;
                self.net_count = self.net.count();
                Some(Action::Members { live: &self.net })
            }
            MemberStep::Agree => {
                let digest = self.proposed.digest();
                let live = placement_hash(&self.placement);
                Some(self.gather_words(Gather::Members, digest, 0, live))
            }
            MemberStep::Reroute => {
                self.members = MemberStep::Idle;
                Some(Action::Reroute)
            }
        }
    }

    /// The members' words answered, or failed here.
    pub(super) fn on_members(&mut self, all: Option<&[u64]>) {
        let digest = self.proposed.digest();
        let adopt = match self.hear(all, Gather::Members) {
            Heard::Unknown { .. } => {
                self.collective_done(false, "membership agreement", false);
                true
            }
            Heard::OutOfStep => false,
            Heard::InStep(words) => {
                self.collective_done(true, "membership agreement", false);
                let chunks = || words.chunks_exact(AGREE_WORDS);
                let unanimous = chunks().all(|w| w.get(1) == Some(&digest));
                // A rank that joined adopts the highest cycle of its peers.
                let top = chunks()
                    .filter_map(|w| w.first().map(|&t| t >> 24))
                    .max()
                    .unwrap_or(self.cycle_no);
                if unanimous && top > self.cycle_no {
                    self.cycle_no = top;
                }
                unanimous
            }
        };
        if !adopt {
            self.stats.membership_refused += 1;
            self.members = MemberStep::Idle;
            self.health = Health::Suspended {
                failures: self.consecutive_failures.max(1),
            };
            log::error!(
                "eplb rank {}: the ranks were told different live sets (mine {:?}); nothing is \
                 adopted and balancing is suspended until the engine resumes it or tells every \
                 rank the same set",
                self.rank,
                self.proposed
            );
            return;
        }
        self.adopt_members();
        // Compare the placements over the new set at once: it settles a layer some rank holds
        // open from before the change (its vote's outcome unknown there), and catches a rank
        // on another placement.
        self.agree.check = true;
    }

    /// Adopts the proposed set: retires the slots of ranks outside it and asks for the reroute.
    fn adopt_members(&mut self) {
        let before = self.live;
        self.live = self.proposed;
        self.net = self.proposed;
        self.net_count = self.net.count();
        let emptied = retire(&self.shape, &self.live, &mut self.placement).unwrap_or(0);
        self.plan.copy_from_slice(&self.placement);
        // A layer held open keeps its new rows for the check: without the ranks that left.
        if self.walk.kept.is_some()
            && let Ok(one) = self.shape.with_layers(1)
        {
            let _ = retire(&one, &self.live, &mut self.kept);
        }
        let lost = self.lost_count();
        self.stats.membership_changes += 1;
        self.events.membership = true;
        self.members = MemberStep::Reroute;
        // The policy's state was built for the old set: every rank restarts it alike.
        self.agree.task = Task::Settle {
            taken: false,
            record: false,
            resync: true,
        };
        log::warn!(
            "eplb rank {}: the ranks agreed on {:?} (was {before:?}): {emptied} slots emptied, \
             {lost} expert copies lost over all layers until a plan reloads them; routing now \
             skips the ranks that left",
            self.rank,
            self.live
        );
    }

    /// Experts (summed over layers) with no copy on a live rank of the live placement.
    pub fn lost_count(&self) -> usize {
        self.placement
            .chunks_exact(self.shape.slots_per_layer())
            .map(|layer| count_lost(&self.shape, layer, &self.live).unwrap_or(0))
            .sum()
    }

    /// Whether this rank's new rows of `layer` hold an expert that no live rank holds now: it
    /// must be loaded from storage before the exchange ([`LayerAction::Load`](super::LayerAction::Load)).
    pub(super) fn needs_load(&self, layer: u16) -> bool {
        let (per, s) = (self.shape.slots_per_layer(), self.shape.slots_per_rank());
        let l = usize::from(layer);
        let (Some(old), Some(new)) = (
            self.placement.get(l * per..(l + 1) * per),
            self.plan
                .get(l * per + self.rank * s..l * per + (self.rank + 1) * s),
        ) else {
            return false;
        };
        new.iter().any(|&e| e != EMPTY && !old.contains(&e))
    }
}
