//! Elastic membership: which ranks serve ([`LiveSet`]), the [`EMPTY`] slot of a rank that is gone
//! or not yet filled, and what a placement loses when ranks go ([`lost_experts`]).
//!
//! A placement after a membership change may hold [`EMPTY`] slots: every slot of a rank that left
//! (the routing-only step writes them, [`retire`]), and every slot of a rank that joined until its
//! weights arrive. Such a placement is the same [`Placement`](crate::Placement), built with its
//! live set ([`Placement::with_live`](crate::Placement::with_live)): ids below `N` or [`EMPTY`],
//! and no id on a rank outside the live set. An expert whose every copy was on a rank that left
//! has no copy at all until it is reloaded; [`LayerPlacement::log2phy`] routes it to
//! [`NO_COPY`].
//!
//! [`LayerPlacement::log2phy`]: crate::LayerPlacement::log2phy

use crate::error::check_len;
pub use crate::placement::NO_COPY;
use crate::{Error, Shape, fnv1a};

/// A slot that holds no expert: its rank is gone, or joined and has not received its weights.
/// Expert ids are below `N <= u16::MAX`, so no expert has this id.
pub const EMPTY: u16 = u16::MAX;

/// The most ranks a [`LiveSet`] holds (the policies' limit, `eplb_policies::MAX_RANKS`).
pub const MAX_LIVE_RANKS: usize = 2048;

const WORDS: usize = MAX_LIVE_RANKS / 64;

/// The set of live ranks among `R`: a fixed-size bitset (256 bytes, no allocation).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LiveSet {
    ranks: u16,
    bits: [u64; WORDS],
}

impl core::fmt::Debug for LiveSet {
    /// `LiveSet(7 of 8, gone [3])`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "LiveSet({} of {}, gone [", self.count(), self.ranks)?;
        let mut first = true;
        for r in (0..self.ranks()).filter(|&r| !self.contains(r)) {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{r}")?;
        }
        f.write_str("])")
    }
}

impl LiveSet {
    /// Every one of `ranks` ranks live.
    pub fn all(ranks: usize) -> Result<Self, Error> {
        let mut s = Self::none(ranks)?;
        for r in 0..ranks {
            s.set(r, true);
        }
        Ok(s)
    }

    /// None of `ranks` ranks live (a start for [`LiveSet::insert`]).
    pub fn none(ranks: usize) -> Result<Self, Error> {
        if ranks == 0 {
            return Err(Error::ZeroDimension { what: "ranks" });
        }
        if ranks > MAX_LIVE_RANKS {
            return Err(Error::Index {
                what: "ranks of a live set",
                index: ranks,
                bound: MAX_LIVE_RANKS + 1,
            });
        }
        Ok(Self {
            ranks: ranks as u16,
            bits: [0; WORDS],
        })
    }

    /// The live set of `flags` (`[R]`, `true` = live).
    pub fn from_flags(flags: &[bool]) -> Result<Self, Error> {
        let mut s = Self::none(flags.len())?;
        for (r, &f) in flags.iter().enumerate() {
            s.set(r, f);
        }
        Ok(s)
    }

    /// `R`, the ranks the set is drawn from.
    pub fn ranks(&self) -> usize {
        usize::from(self.ranks)
    }

    /// Live ranks.
    pub fn count(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether every rank is live.
    pub fn is_all(&self) -> bool {
        self.count() == self.ranks()
    }

    /// Whether `rank` is live (`false` out of range).
    pub fn contains(&self, rank: usize) -> bool {
        rank < self.ranks()
            && self
                .bits
                .get(rank / 64)
                .is_some_and(|w| w & (1 << (rank % 64)) != 0)
    }

    /// Marks `rank` live; an error out of range.
    pub fn insert(&mut self, rank: usize) -> Result<(), Error> {
        self.check(rank)?;
        self.set(rank, true);
        Ok(())
    }

    /// Marks `rank` gone; an error out of range.
    pub fn remove(&mut self, rank: usize) -> Result<(), Error> {
        self.check(rank)?;
        self.set(rank, false);
        Ok(())
    }

    /// This set with `gone` removed; an error names a rank out of range.
    pub fn without(mut self, gone: &[usize]) -> Result<Self, Error> {
        for &r in gone {
            self.remove(r)?;
        }
        Ok(self)
    }

    /// This set with `back` added; an error names a rank out of range.
    pub fn with(mut self, back: &[usize]) -> Result<Self, Error> {
        for &r in back {
            self.insert(r)?;
        }
        Ok(self)
    }

    /// The live ranks in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.ranks()).filter(|&r| self.contains(r))
    }

    /// The position of `rank` among the live ranks (its index in a gather over them), or `None`
    /// when it is not live.
    pub fn position(&self, rank: usize) -> Option<usize> {
        if !self.contains(rank) {
            return None;
        }
        let full = rank / 64;
        let head: usize = self
            .bits
            .get(..full)
            .map_or(0, |ws| ws.iter().map(|w| w.count_ones() as usize).sum());
        let part = self.bits.get(full).map_or(0, |w| {
            (w & ((1u64 << (rank % 64)) - 1)).count_ones() as usize
        });
        Some(head + part)
    }

    /// A digest of the set (`R` and its bits), the word the ranks agree on.
    pub fn digest(&self) -> u64 {
        fnv1a(core::iter::once(u64::from(self.ranks)).chain(self.bits.iter().copied()))
    }

    fn check(&self, rank: usize) -> Result<(), Error> {
        if rank < self.ranks() {
            Ok(())
        } else {
            Err(Error::Index {
                what: "rank",
                index: rank,
                bound: self.ranks(),
            })
        }
    }

    fn set(&mut self, rank: usize, on: bool) {
        if rank >= self.ranks() {
            return;
        }
        if let Some(w) = self.bits.get_mut(rank / 64) {
            if on {
                *w |= 1 << (rank % 64);
            } else {
                *w &= !(1 << (rank % 64));
            }
        }
    }
}

/// The live set's checks: drawn from the shape's `R` ranks, at least one live.
pub(crate) fn check_live(shape: &Shape, live: &LiveSet) -> Result<(), Error> {
    check_len("live set ranks", shape.ranks(), live.ranks())?;
    if live.count() == 0 {
        return Err(Error::ZeroDimension { what: "live ranks" });
    }
    Ok(())
}

/// The routing-only step of a membership change: every slot of a rank outside `live` becomes
/// [`EMPTY`] in `slots` (`[L][R][S]`). Returns the number of slots emptied.
pub fn retire(shape: &Shape, live: &LiveSet, slots: &mut [u16]) -> Result<usize, Error> {
    check_live(shape, live)?;
    check_len("placement [L][R][S]", shape.placement_len(), slots.len())?;
    let s_len = shape.slots_per_rank();
    let mut emptied = 0;
    for (i, row) in slots.chunks_exact_mut(s_len).enumerate() {
        if live.contains(i % shape.ranks()) {
            continue;
        }
        for s in row.iter_mut().filter(|s| **s != EMPTY) {
            *s = EMPTY;
            emptied += 1;
        }
    }
    Ok(emptied)
}

/// How many experts of one layer (`[R][S]`) have no copy on a rank of `live`: the count of
/// [`lost_experts`] without its `[N]` buffer (a 4096-bit stack set, one pass per 4096 experts).
pub fn count_lost(shape: &Shape, layer: &[u16], live: &LiveSet) -> Result<usize, Error> {
    check_live(shape, live)?;
    check_len(
        "placement layer [R][S]",
        shape.slots_per_layer(),
        layer.len(),
    )?;
    const CHUNK: usize = 4096;
    let (n, s) = (shape.experts(), shape.slots_per_rank());
    let mut lost = 0;
    let mut base = 0;
    while base < n {
        let mut seen = [0u64; CHUNK / 64];
        for (r, row) in layer.chunks_exact(s).enumerate() {
            if !live.contains(r) {
                continue;
            }
            for &e in row {
                let e = usize::from(e);
                if e >= base
                    && e < base + CHUNK
                    && e < n
                    && let Some(w) = seen.get_mut((e - base) / 64)
                {
                    *w |= 1 << ((e - base) % 64);
                }
            }
        }
        let held: usize = seen.iter().map(|w| w.count_ones() as usize).sum();
        lost += n.min(base + CHUNK) - base - held;
        base += CHUNK;
    }
    Ok(lost)
}

/// Marks in `lost` (`[N]`) the experts of one layer (`[R][S]`) that have no copy on a rank of
/// `live` (a dead rank's slots and [`EMPTY`] slots count for nothing); returns how many.
pub fn lost_experts(
    shape: &Shape,
    layer: &[u16],
    live: &LiveSet,
    lost: &mut [bool],
) -> Result<usize, Error> {
    check_live(shape, live)?;
    check_len(
        "placement layer [R][S]",
        shape.slots_per_layer(),
        layer.len(),
    )?;
    check_len("lost experts [N]", shape.experts(), lost.len())?;
    lost.fill(true);
    for (r, row) in layer.chunks_exact(shape.slots_per_rank()).enumerate() {
        if !live.contains(r) {
            continue;
        }
        for &e in row {
            if let Some(l) = lost.get_mut(usize::from(e)) {
                *l = false;
            }
        }
    }
    Ok(lost.iter().filter(|&&l| l).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_live_ranks_below() {
        let mut s = LiveSet::all(130).unwrap();
        s.remove(3).unwrap();
        s.remove(64).unwrap();
        assert_eq!(s.count(), 128);
        assert_eq!(s.position(2), Some(2));
        assert_eq!(s.position(3), None);
        assert_eq!(s.position(4), Some(3));
        assert_eq!(s.position(65), Some(63));
        assert_eq!(s.position(129), Some(127));
        assert_eq!(s.iter().nth(3), Some(4));
        assert!(s.insert(130).is_err());
        assert!(LiveSet::all(MAX_LIVE_RANKS + 1).is_err());
        assert!(LiveSet::none(0).is_err());
        assert_ne!(s.digest(), LiveSet::all(130).unwrap().digest());
        assert_eq!(std::format!("{s:?}"), "LiveSet(128 of 130, gone [3, 64])");
    }

    #[test]
    fn retire_empties_dead_rows_and_lost_experts_follow() {
        // 1 layer, 4 experts, 3 ranks x 2 slots; expert 3 only on rank 1.
        let shape = Shape::new(1, 4, 3, 2).unwrap();
        let mut p = [0u16, 1, 2, 3, 0, 1];
        let mut live = LiveSet::all(3).unwrap();
        live.remove(1).unwrap();
        let mut lost = [false; 4];
        assert_eq!(lost_experts(&shape, &p, &live, &mut lost).unwrap(), 2);
        assert_eq!(count_lost(&shape, &p, &live).unwrap(), 2);
        assert_eq!(live, LiveSet::all(3).unwrap().without(&[1]).unwrap());
        assert_eq!(live.with(&[1]).unwrap(), LiveSet::all(3).unwrap());
        assert!(live.without(&[3]).is_err());
        assert_eq!(lost, [false, false, true, true]);
        assert_eq!(retire(&shape, &live, &mut p).unwrap(), 2);
        assert_eq!(p, [0, 1, EMPTY, EMPTY, 0, 1]);
        crate::Placement::with_live(shape, &p, &live).unwrap();
        // A dead rank holding an expert is refused; so is an id >= N.
        assert!(crate::Placement::with_live(shape, &[0, 1, 2, EMPTY, 0, 1], &live).is_err());
        assert!(crate::Placement::with_live(shape, &[0, 9, EMPTY, EMPTY, 0, 1], &live).is_err());
        let nobody = LiveSet::none(3).unwrap();
        assert!(retire(&shape, &nobody, &mut p).is_err());
    }

    #[test]
    fn log2phy_skips_empty_slots_and_marks_lost_experts() {
        let shape = Shape::new(1, 4, 3, 2).unwrap();
        let p = [0u16, 1, EMPTY, EMPTY, 1, 0];
        // Rank 1 gone: experts 2 and 3 lost; 0 and 1 on rank 0 and rank 2.
        assert!(matches!(
            crate::LayerPlacement::new(shape, 0, &p).unwrap_err(),
            Error::ExpertOutOfRange { .. }
        ));
        let mut live = LiveSet::all(3).unwrap();
        live.remove(1).unwrap();
        let layer = crate::LayerPlacement::with_live(shape, 0, &p, &live).unwrap();
        let mut out = [0u32; 4];
        layer
            .log2phy(0, crate::ReplicaChoice::Plain, &mut out)
            .unwrap();
        // Rank 0 routes to the first holder of each: expert 0 at rank 0 slot 0, 1 at rank 0 slot 1.
        assert_eq!(out, [0, 1, NO_COPY, NO_COPY]);
        layer
            .log2phy(1, crate::ReplicaChoice::Plain, &mut out)
            .unwrap();
        // Rank 1 picks replica 1 % 2 = 1: rank 2's copies (slot 5 holds 0, slot 4 holds 1).
        assert_eq!(out, [5, 4, NO_COPY, NO_COPY]);
    }
}
