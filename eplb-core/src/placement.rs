//! Placements `[L][R][S]` over caller-owned slices, and what derives from them per layer and
//! rank: the expert map and `log2phy`.

pub(crate) use crate::error::check_len;
use crate::live::check_live;
use crate::{EMPTY, Error, LiveSet, Shape};

/// Expert, rank and slot ids are `u16`.
pub type ExpertId = u16;

/// The expert map's "not on this rank", as on the wire (`int32`).
pub const NOT_HERE: i32 = -1;

/// `log2phy`'s entry for an expert with no copy on any live rank: only in a placement after a
/// membership change, where it is lost until it is reloaded (`live`).
pub const NO_COPY: u32 = u32::MAX;

/// Flag used while building `log2phy` in place; physical ids are below `i32::MAX` (see [`Shape`]).
const FOUND: u32 = 1 << 31;

/// How a rank chooses among the `k` replicas of an expert when it builds `log2phy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplicaChoice {
    /// vLLM-Ascend's default: replica `ep_rank % k` (replicas in ascending rank order).
    #[default]
    Plain,
    /// The TP/DP-aware rotation of vLLM-Ascend PR #9239 with this TP size:
    /// `(ep_rank % tp + ep_rank / tp + e) % k`. A TP size of 0 or 1 behaves as [`Plain`](Self::Plain).
    TpRotation(u16),
}

impl ReplicaChoice {
    /// The index (in ascending rank order) of the replica that `ep_rank` routes expert `e` to.
    pub fn index(self, ep_rank: usize, expert: usize, copies: usize) -> usize {
        if copies == 0 {
            return 0;
        }
        match self {
            ReplicaChoice::TpRotation(tp) if tp > 1 => {
                let tp = usize::from(tp);
                (ep_rank % tp + ep_rank / tp + expert) % copies
            }
            _ => ep_rank % copies,
        }
    }
}

/// A structurally valid placement of all layers: a view of a caller's `[L][R][S]` slice, with
/// the ranks that serve.
///
/// Membership is a property of the placement. [`Placement::new`] is a placement of a static
/// deployment (every rank serves, every slot holds an expert); [`Placement::with_live`] is the
/// same placement type after a membership change, where a slot may be [`EMPTY`] (no expert
/// here: its rank is gone, or joined and waits for its weights). One validator
/// ([`validate_layer`]) checks both:
///
/// - the slice has `L * R * S` ids, every id is below `N` or (with a live set) [`EMPTY`];
/// - a rank outside the live set holds only [`EMPTY`] slots;
/// - a layer with no [`EMPTY`] slot holds every expert (an expert can be lost, with no copy,
///   only where a rank left or has not been filled yet).
///
/// Co-located copies (an expert twice on one rank) are allowed here and counted by
/// [`Placement::colocated_rows`]; [`Placement::check_servable`] rejects them.
///
/// [`EMPTY`]: crate::EMPTY
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    shape: Shape,
    slots: &'a [ExpertId],
    /// The ranks that serve; `None`: every rank, and no slot is [`EMPTY`].
    live: Option<&'a LiveSet>,
    /// Every rank serves and every slot holds an expert (the common case, and the policies'
    /// fast path).
    whole: bool,
}

impl<'a> Placement<'a> {
    /// Validates `slots` against `shape` as a placement of a static deployment (every rank
    /// serves, every slot holds an expert) and wraps it.
    pub fn new(shape: Shape, slots: &'a [ExpertId]) -> Result<Self, Error> {
        validate(&shape, slots, None)?;
        Ok(Self {
            shape,
            slots,
            live: None,
            whole: true,
        })
    }

    /// Validates `slots` against `shape` as the placement the ranks of `live` hold (after a
    /// membership change: [`EMPTY`] slots allowed, none but [`EMPTY`]
    /// on a rank outside `live`, an expert may have no copy) and wraps it. With every rank
    /// live and no [`EMPTY`] slot it is [`Placement::new`]'s placement.
    pub fn with_live(
        shape: Shape,
        slots: &'a [ExpertId],
        live: &'a LiveSet,
    ) -> Result<Self, Error> {
        let empty = validate(&shape, slots, Some(live))?;
        Ok(Self {
            shape,
            slots,
            live: Some(live),
            whole: !empty && live.is_all(),
        })
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The whole `[L][R][S]` slice.
    pub fn as_slice(&self) -> &'a [ExpertId] {
        self.slots
    }

    /// The ranks that serve, when not every rank does or the placement was built with a live
    /// set ([`Placement::with_live`]); `None`: every rank serves.
    pub fn live(&self) -> Option<&'a LiveSet> {
        self.live
    }

    /// The number of ranks that serve.
    pub fn live_count(&self) -> usize {
        self.live.map_or(self.shape.ranks(), LiveSet::count)
    }

    /// Whether `rank` serves.
    pub fn is_live(&self, rank: usize) -> bool {
        match self.live {
            Some(l) => l.contains(rank),
            None => rank < self.shape.ranks(),
        }
    }

    /// Whether every rank serves and every slot holds an expert: the placement of a static
    /// deployment, whatever constructor built it.
    pub fn is_whole(&self) -> bool {
        self.whole
    }

    /// One layer, or `None` when `layer >= L`.
    pub fn layer(&self, layer: usize) -> Option<LayerPlacement<'a>> {
        let n = self.shape.slots_per_layer();
        let start = layer.checked_mul(n)?;
        let slots = self.slots.get(start..start.checked_add(n)?)?;
        Some(LayerPlacement {
            shape: self.shape,
            layer,
            slots,
        })
    }

    /// One layer, or an index error.
    pub fn try_layer(&self, layer: usize) -> Result<LayerPlacement<'a>, Error> {
        self.layer(layer).ok_or(Error::Index {
            what: "layer",
            index: layer,
            bound: self.shape.layers(),
        })
    }

    /// All layers in order.
    pub fn layers(&self) -> impl Iterator<Item = LayerPlacement<'a>> + 'a {
        let shape = self.shape;
        self.slots
            .chunks_exact(shape.slots_per_layer())
            .enumerate()
            .map(move |(layer, slots)| LayerPlacement {
                shape,
                layer,
                slots,
            })
    }

    /// Number of `(layer, rank)` rows that hold some expert twice.
    pub fn colocated_rows(&self) -> usize {
        self.layers().map(|l| l.colocated_rows()).sum()
    }

    /// `Ok` when no rank holds an expert twice in any layer; otherwise the first such place.
    pub fn check_servable(&self) -> Result<(), Error> {
        self.layers().try_for_each(|l| l.check_servable())
    }
}

/// One layer of a placement: `[R][S]`.
#[derive(Debug, Clone, Copy)]
pub struct LayerPlacement<'a> {
    shape: Shape,
    layer: usize,
    slots: &'a [ExpertId],
}

impl<'a> LayerPlacement<'a> {
    /// Validates one layer `[R][S]` on its own as a layer of a static deployment
    /// ([`Placement::new`]'s rules); `layer` is used in errors.
    pub fn new(shape: Shape, layer: usize, slots: &'a [ExpertId]) -> Result<Self, Error> {
        validate_layer(&shape, layer, slots, None)?;
        Ok(Self {
            shape,
            layer,
            slots,
        })
    }

    /// Validates one layer `[R][S]` as a layer of the placement the ranks of `live` hold
    /// ([`Placement::with_live`]'s rules); every method reads [`EMPTY`] as no expert.
    pub fn with_live(
        shape: Shape,
        layer: usize,
        slots: &'a [ExpertId],
        live: &LiveSet,
    ) -> Result<Self, Error> {
        check_live(&shape, live)?;
        validate_layer(&shape, layer, slots, Some(live))?;
        Ok(Self {
            shape,
            layer,
            slots,
        })
    }

    /// The layer index.
    pub fn index(&self) -> usize {
        self.layer
    }

    /// The `[R][S]` slice.
    pub fn as_slice(&self) -> &'a [ExpertId] {
        self.slots
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The `S` ids of one rank, or an empty slice when `rank >= R`.
    pub fn rank(&self, rank: usize) -> &'a [ExpertId] {
        let s = self.shape.slots_per_rank();
        rank.checked_mul(s)
            .and_then(|a| self.slots.get(a..a.checked_add(s)?))
            .unwrap_or(&[])
    }

    /// The ranks in order, each as its `S` ids.
    pub fn rows(&self) -> core::slice::ChunksExact<'a, ExpertId> {
        self.slots.chunks_exact(self.shape.slots_per_rank())
    }

    /// Number of ranks whose row holds some expert twice.
    pub fn colocated_rows(&self) -> usize {
        self.rows()
            .filter(|row| first_duplicate(row).is_some())
            .count()
    }

    /// `Ok` when no rank holds an expert twice; otherwise the first rank (and expert).
    pub fn check_servable(&self) -> Result<(), Error> {
        for (r, row) in self.rows().enumerate() {
            if let Some(expert) = first_duplicate(row) {
                return Err(Error::ColocatedCopies {
                    layer: self.layer as u16,
                    rank: r as u16,
                    expert,
                });
            }
        }
        Ok(())
    }

    /// Writes the expert map of `rank` into `out` (`[N]`): the local slot of each logical expert,
    /// or [`NOT_HERE`]. When a rank holds an expert twice the last slot wins, as in vLLM-Ascend.
    pub fn expert_map(&self, rank: usize, out: &mut [i32]) -> Result<(), Error> {
        self.check_rank(rank)?;
        check_len("expert map [N]", self.shape.experts(), out.len())?;
        out.fill(NOT_HERE);
        for (s, &e) in self.rank(rank).iter().enumerate() {
            if let Some(o) = out.get_mut(usize::from(e)) {
                *o = s as i32;
            }
        }
        Ok(())
    }

    /// Writes `log2phy` of `rank` into `out` (`[N]`): the physical id `holder * S + slot` this
    /// rank routes each logical expert to, chosen among the distinct holders in ascending rank
    /// order by `choice` (the slot is the holder's last slot of that expert, as its expert map
    /// keeps). An expert with no copy (only in an elastic placement, whose [`EMPTY`] slots
    /// hold nothing) gets [`NO_COPY`]. `O(R * S^2 + N)`, no scratch.
    ///
    /// [`EMPTY`]: crate::EMPTY
    pub fn log2phy(
        &self,
        rank: usize,
        choice: ReplicaChoice,
        out: &mut [u32],
    ) -> Result<(), Error> {
        self.check_rank(rank)?;
        check_len("log2phy [N]", self.shape.experts(), out.len())?;
        let s_len = self.shape.slots_per_rank();
        // Pass 1: distinct holders per expert.
        out.fill(0);
        for row in self.rows() {
            for (s, &e) in row.iter().enumerate() {
                if is_last_in_row(row, s)
                    && let Some(o) = out.get_mut(usize::from(e))
                {
                    *o = o.saturating_add(1);
                }
            }
        }
        // Pass 2: the replica index to pick, as a countdown; an expert without a copy (an
        // elastic placement's lost expert) is marked found already, as `NO_COPY`.
        for (e, o) in out.iter_mut().enumerate() {
            *o = if *o == 0 {
                NO_COPY
            } else {
                choice.index(rank, e, *o as usize) as u32
            };
        }
        // Pass 3: walk holders in ascending rank order.
        for (h, row) in self.rows().enumerate() {
            for (s, &e) in row.iter().enumerate() {
                if !is_last_in_row(row, s) {
                    continue;
                }
                if let Some(o) = out.get_mut(usize::from(e)) {
                    if *o & FOUND != 0 {
                        continue;
                    }
                    if *o == 0 {
                        *o = FOUND | (h * s_len + s) as u32;
                    } else {
                        *o -= 1;
                    }
                }
            }
        }
        for o in out.iter_mut().filter(|o| **o != NO_COPY) {
            *o &= !FOUND;
        }
        Ok(())
    }

    /// Writes the number of slots of each logical expert into `out` (`[N]`), co-located copies
    /// included.
    pub fn copies(&self, out: &mut [u16]) -> Result<(), Error> {
        check_len("copies [N]", self.shape.experts(), out.len())?;
        out.fill(0);
        for &e in self.slots {
            if let Some(o) = out.get_mut(usize::from(e)) {
                *o = o.saturating_add(1);
            }
        }
        Ok(())
    }

    /// Whether `rank` holds `expert` in some slot.
    pub fn holds(&self, rank: usize, expert: ExpertId) -> bool {
        self.rank(rank).contains(&expert)
    }

    fn check_rank(&self, rank: usize) -> Result<(), Error> {
        if rank >= self.shape.ranks() {
            return Err(Error::Index {
                what: "rank",
                index: rank,
                bound: self.shape.ranks(),
            });
        }
        Ok(())
    }
}

/// `true` when `row[s]` is the last slot of its expert in `row`.
fn is_last_in_row(row: &[ExpertId], s: usize) -> bool {
    match (row.get(s), row.get(s + 1..)) {
        (Some(e), Some(rest)) => !rest.contains(e),
        _ => false,
    }
}

/// The first expert that appears twice in `row`, if any ([`EMPTY`] slots hold no expert).
pub fn first_duplicate(row: &[ExpertId]) -> Option<ExpertId> {
    row.iter()
        .enumerate()
        .find(|&(i, e)| *e != EMPTY && row.get(i + 1..).is_some_and(|rest| rest.contains(e)))
        .map(|(_, &e)| e)
}

/// The one validator of a placement `[L][R][S]` (see [`Placement`]); returns whether some slot
/// is [`EMPTY`].
fn validate(shape: &Shape, slots: &[ExpertId], live: Option<&LiveSet>) -> Result<bool, Error> {
    if let Some(live) = live {
        check_live(shape, live)?;
    }
    check_len("placement [L][R][S]", shape.placement_len(), slots.len())?;
    let mut empty = false;
    for (l, layer) in slots.chunks_exact(shape.slots_per_layer()).enumerate() {
        empty |= validate_layer(shape, l, layer, live)?;
    }
    Ok(empty)
}

/// Checks one layer `[R][S]` (the rules of [`Placement`]): length; every id below `N`, or
/// [`EMPTY`] when a live set is given; only [`EMPTY`] on a rank outside `live`; every expert
/// present unless some slot is [`EMPTY`]. Returns whether some slot is [`EMPTY`]. Uses a
/// 4096-bit stack bitset, scanning the layer once per 4096 experts.
pub fn validate_layer(
    shape: &Shape,
    layer: usize,
    slots: &[ExpertId],
    live: Option<&LiveSet>,
) -> Result<bool, Error> {
    check_len(
        "placement layer [R][S]",
        shape.slots_per_layer(),
        slots.len(),
    )?;
    let n = shape.experts();
    let s_len = shape.slots_per_rank();
    let mut empty = false;
    for (i, &e) in slots.iter().enumerate() {
        let rank = i / s_len;
        if e == EMPTY && live.is_some() {
            empty = true;
            continue;
        }
        if usize::from(e) >= n {
            return Err(Error::ExpertOutOfRange {
                layer: layer as u16,
                rank: rank as u16,
                slot: (i % s_len) as u16,
                expert: e,
                experts: n as u16,
            });
        }
        if live.is_some_and(|l| !l.contains(rank)) {
            return Err(Error::NotLive {
                layer: layer as u16,
                rank: rank as u16,
                slot: (i % s_len) as u16,
                expert: e,
            });
        }
    }
    if empty {
        return Ok(true);
    }
    const CHUNK: usize = 4096;
    let mut base = 0;
    while base < n {
        let mut seen = [0u64; CHUNK / 64];
        for &e in slots {
            let e = usize::from(e);
            if e >= base && e < base + CHUNK {
                let bit = e - base;
                if let Some(w) = seen.get_mut(bit / 64) {
                    *w |= 1 << (bit % 64);
                }
            }
        }
        for e in base..n.min(base + CHUNK) {
            let bit = e - base;
            if seen
                .get(bit / 64)
                .is_none_or(|w| w & (1 << (bit % 64)) == 0)
            {
                return Err(Error::MissingExpert {
                    layer: layer as u16,
                    expert: e as u16,
                });
            }
        }
        base += CHUNK;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn rejects_out_of_range_and_missing() {
        let shape = Shape::new(1, 4, 2, 3).unwrap();
        assert_eq!(
            Placement::new(shape, &[0, 1, 2, 3, 9, 0]).unwrap_err(),
            Error::ExpertOutOfRange {
                layer: 0,
                rank: 1,
                slot: 1,
                expert: 9,
                experts: 4
            }
        );
        assert_eq!(
            Placement::new(shape, &[0, 1, 2, 0, 1, 2]).unwrap_err(),
            Error::MissingExpert {
                layer: 0,
                expert: 3
            }
        );
        assert!(matches!(
            Placement::new(shape, &[0, 1, 2, 3]).unwrap_err(),
            Error::Length { .. }
        ));
    }

    #[test]
    fn colocated_is_structural_but_not_servable() {
        let shape = Shape::new(2, 4, 2, 3).unwrap();
        let p = Placement::new(shape, &[0, 1, 2, 3, 0, 1, 0, 0, 1, 2, 3, 3]).unwrap();
        assert_eq!(p.colocated_rows(), 2);
        assert_eq!(
            p.check_servable().unwrap_err(),
            Error::ColocatedCopies {
                layer: 1,
                rank: 0,
                expert: 0
            }
        );
    }

    #[test]
    fn many_experts_use_several_bitset_chunks() {
        let n: u16 = 5000;
        let shape = Shape::new(1, n, 2, n).unwrap();
        let mut v: Vec<u16> = (0..n).chain((0..n).rev()).collect();
        assert!(Placement::new(shape, &v).is_ok());
        v[4999] = 0;
        v[5000] = 0;
        assert_eq!(
            Placement::new(shape, &v).unwrap_err(),
            Error::MissingExpert {
                layer: 0,
                expert: 4999
            }
        );
    }

    #[test]
    fn one_validator_reads_empty_as_no_expert_only_with_a_live_set() {
        use crate::{EMPTY, LiveSet};
        // 1 layer, 4 experts, 3 ranks x 2 slots.
        let shape = Shape::new(1, 4, 3, 2).unwrap();
        let all = LiveSet::all(3).unwrap();
        let whole = [0u16, 1, 2, 3, 1, 0];
        // The same placement through both constructors: whole either way.
        assert!(Placement::new(shape, &whole).unwrap().is_whole());
        let p = Placement::with_live(shape, &whole, &all).unwrap();
        assert!(p.is_whole());
        assert_eq!(p.live_count(), 3);
        // A static deployment's placement has no EMPTY slot.
        let joined = [0u16, 1, 2, 3, EMPTY, EMPTY];
        assert!(matches!(
            Placement::new(shape, &joined).unwrap_err(),
            Error::ExpertOutOfRange { expert: EMPTY, .. }
        ));
        // Every rank live, one waiting for its weights: valid, not whole.
        let p = Placement::with_live(shape, &joined, &all).unwrap();
        assert!(!p.is_whole());
        assert_eq!(
            p.colocated_rows(),
            0,
            "two EMPTY slots are not a co-located copy"
        );
        // A layer with no EMPTY slot must hold every expert, even with a live set.
        assert_eq!(
            Placement::with_live(shape, &[0, 1, 2, 0, 1, 2], &all).unwrap_err(),
            Error::MissingExpert {
                layer: 0,
                expert: 3
            }
        );
        // Rank 1 gone: experts 2 and 3 lost, allowed; an id on the dead rank is not.
        let gone = all.without(&[1]).unwrap();
        let lost = [0u16, 1, EMPTY, EMPTY, 1, 0];
        let p = Placement::with_live(shape, &lost, &gone).unwrap();
        assert!(!p.is_whole());
        assert!(!p.is_live(1) && p.is_live(2));
        assert_eq!(
            Placement::with_live(shape, &[0, 1, 2, EMPTY, 1, 0], &gone).unwrap_err(),
            Error::NotLive {
                layer: 0,
                rank: 1,
                slot: 0,
                expert: 2
            }
        );
        // A live set of another size is refused.
        assert!(Placement::with_live(shape, &whole, &LiveSet::all(4).unwrap()).is_err());
    }
}
