//! DeepSeek's open-source EPLB (`eplb.py`), exact in float64.
//!
//! # Algorithm
//!
//! Per layer, with `G` expert groups, `M` nodes, `R` ranks and `S` slots per rank
//! (`research/peers.md` §1.1, `data/golden/README.md` "What exact means"):
//!
//! 1. **Mode.** Hierarchical when `G % M == 0` (`M = R / ranks_per_node`); it then needs
//!    `N % G == 0`, else [`Error::Topology`]. Otherwise global: the same routine with one group
//!    and one node.
//! 2. **Groups to nodes.** The weight of group `g` is the f64 sum of the loads of experts
//!    `g*N/G ..`, in id order. Balanced packing (below) puts `G/M` groups on each node.
//! 3. **Renumbering.** Experts are renumbered node-major: a node's groups become contiguous, in
//!    the order they entered the node's pack.
//! 4. **Replication within a node.** Each of the node's `N/M` experts starts with one copy;
//!    each of the `R*S/M - N/M` extra slots goes to `argmax_e w_e / c_e` (f64 division, first
//!    index on ties). Only the experts whose single copy ranks among the top `extra` can ever
//!    win (their first copies alone outrank any other expert), so they are selected with
//!    `select_nth_unstable` and the argmax is a binary max-heap over them. The physical order
//!    is the node's experts, then the extra copies in the order they were chosen.
//! 5. **Copies to ranks.** Each copy weighs `w_e / c_e` with the final count; balanced packing
//!    puts `S` copies on each of the node's `R/M` ranks. Slot `rank * S + position in pack`.
//!
//! **Balanced packing** (`n` items into `m` packs of `n/m`): when `n/m == 1` item `i` goes to
//! pack `i`. Otherwise the items are visited by weight, descending, with a stable order (equal
//! weights keep index order), and each goes to the non-full pack with the smallest f64 weight,
//! the lowest index on ties (a min tournament tree over the packs). A pack's weight is the sum of
//! its items in insertion order.
//!
//! # Complexity
//!
//! Per layer `O(G log G + N + X log X + P log P)` time with `X = R*S - N` extra copies and
//! `P = R*S` copies (the sort of each node's copies dominates; each packing step is one climb
//! of a tournament tree, `O(log R)`); scratch `O(N + R*S/M + R)` words, a pure function of the
//! shape ([`Policy::scratch_len`]).
//!
//! # Differences from the reference
//!
//! - Float64 throughout, as vLLM's and SGLang's ports and the golden vectors' definition;
//!   DeepSeek's torch code sums pack loads in float32 and may decide near-ties the other way.
//! - Equal weights are ordered by index (a stable sort); torch's sort does not promise it.
//! - Group weights are summed sequentially (numpy sums pairwise); this changes values only in
//!   the last bits, far below the decision margins of the golden cases.
//! - The current placement is ignored, as upstream; co-located copies of one expert on a rank
//!   are produced as upstream ([`Policy::colocates`] is `true`).
//! - [`Policy::place`] produces `phy2log`; [`DeepSeek::place_ranked`] also gives each slot's
//!   replica rank (DeepSeek's `phyrank`), from which `log2phy` follows in DeepSeek's order.

use eplb_core::Shape;

use crate::arena::{Arena, Words};
use crate::{Error, Input, Policy, PolicyKind};

/// "No pack" in the tournament tree.
pub(crate) const NONE: u16 = u16::MAX;

/// An order key for a non-negative `f64`: `-0.0` maps like `0.0`, larger values to larger keys.
pub(crate) fn weight_bits(w: f64) -> u64 {
    if w == 0.0 { 0 } else { w.to_bits() }
}

/// Words of [`carve_keys`] for `n` keys.
pub(crate) fn key_words(n: usize) -> usize {
    2 * n + 1
}

/// `n` `u128` sort keys (a key sorts as one integer, faster than a pair), aligned inside
/// [`key_words`] words.
pub(crate) fn carve_keys<'a>(arena: &mut Arena<'a>, n: usize) -> Result<&'a mut [u128], Error> {
    let words = arena.words(key_words(n))?;
    let (_, keys, _) = bytemuck::pod_align_to_mut::<u64, u128>(words);
    let got = keys.len();
    keys.get_mut(..n).ok_or(Error::Scratch {
        needed: key_words(n),
        got: 2 * got,
    })
}

/// Words of a [`MinTree`] over up to `n` boxes.
pub(crate) fn tree_words(n: usize) -> usize {
    tree_words_checked(Words(n)).get()
}

/// [`key_words`] in checked arithmetic.
pub(crate) fn key_words_checked(n: Words) -> Words {
    2 * n + 1
}

/// [`tree_words`] in checked arithmetic.
pub(crate) fn tree_words_checked(n: Words) -> Words {
    key_words_checked(2 * n.next_power_of_two())
}

/// A min tournament tree over boxes `0..n`: the root is the eligible box with the smallest
/// weight, the lowest index on ties (as a scan of the boxes in order with strict `<`). A node
/// is the integer key `weight bits << 16 | index` of its winner (`u128::MAX` for none), so one
/// level of an update is one integer `min`.
pub(crate) struct MinTree<'a> {
    t: &'a mut [u128],
    base: usize,
}

const EMPTY_KEY: u128 = u128::MAX;

fn box_key(b: usize, weight: f64) -> u128 {
    u128::from(weight_bits(weight)) << 16 | b as u128
}

impl<'a> MinTree<'a> {
    /// Carves a tree for up to `n` boxes (`n < u16::MAX`) out of `arena`.
    pub(crate) fn carve(arena: &mut Arena<'a>, n: usize) -> Result<Self, Error> {
        Ok(Self {
            t: carve_keys(arena, 2 * n.max(1).next_power_of_two())?,
            base: 1,
        })
    }

    /// Rebuilds the tree over `n` boxes with the given weights and eligibility.
    pub(crate) fn reset(
        &mut self,
        n: usize,
        weights: &[f64],
        eligible: impl Fn(usize) -> bool,
    ) -> Result<(), Error> {
        let base = n.max(1).next_power_of_two();
        if 2 * base > self.t.len() {
            return Err(Error::Scratch {
                needed: tree_words(n),
                got: key_words(self.t.len()),
            });
        }
        self.base = base;
        for (b, leaf) in self.t.iter_mut().skip(base).take(base).enumerate() {
            *leaf = match weights.get(b) {
                Some(&x) if b < n && eligible(b) => box_key(b, x),
                _ => EMPTY_KEY,
            };
        }
        for i in (1..base).rev() {
            let m = match (self.t.get(2 * i), self.t.get(2 * i + 1)) {
                (Some(&l), Some(&r)) => l.min(r),
                _ => EMPTY_KEY,
            };
            if let Some(x) = self.t.get_mut(i) {
                *x = m;
            }
        }
        Ok(())
    }

    /// Sets box `b`'s weight and eligibility and refreshes its path, carrying the winner up
    /// and comparing it with each sibling.
    pub(crate) fn set(&mut self, b: usize, weight: f64, eligible: bool) {
        if b >= self.base {
            return;
        }
        let mut cur = if eligible {
            box_key(b, weight)
        } else {
            EMPTY_KEY
        };
        let mut i = self.base + b;
        loop {
            if let Some(x) = self.t.get_mut(i) {
                *x = cur;
            }
            if i <= 1 {
                return;
            }
            let sib = self.t.get(i ^ 1).copied().unwrap_or(EMPTY_KEY);
            // Branch-free `min` (the outcome is unpredictable).
            let mask = 0u128.wrapping_sub(u128::from(sib < cur));
            cur = (sib & mask) | (cur & !mask);
            i /= 2;
        }
    }

    /// The eligible box with the smallest weight (lowest index on ties).
    pub(crate) fn min(&self) -> Option<usize> {
        match self.t.get(1).copied() {
            Some(k) if k != EMPTY_KEY => Some((k & 0xffff) as usize),
            _ => None,
        }
    }
}

/// Buffers of one balanced packing.
struct Packing<'a> {
    keys: &'a mut [u128],
    pack_w: &'a mut [f64],
    pack_n: &'a mut [u32],
    tree: MinTree<'a>,
}

impl Packing<'_> {
    /// Packs `w` (`n` items) into `packs` packs of `n / packs` items: writes each item's pack and
    /// position in it.
    fn pack(
        &mut self,
        w: &[f64],
        packs: usize,
        pack_of: &mut [u16],
        rank_of: &mut [u16],
    ) -> Result<(), Error> {
        let n = w.len();
        let per = n / packs.max(1);
        if per == 1 {
            for (i, (p, r)) in pack_of.iter_mut().zip(rank_of.iter_mut()).enumerate() {
                *p = i as u16;
                *r = 0;
            }
            return Ok(());
        }
        let have = self.keys.len();
        let keys = self.keys.get_mut(..n).ok_or(Error::Scratch {
            needed: 2 * n,
            got: 2 * have,
        })?;
        for (i, (k, &x)) in keys.iter_mut().zip(w).enumerate() {
            *k = u128::from(!weight_bits(x)) << 64 | i as u128;
        }
        keys.sort_unstable();
        let pack_w = self.pack_w.get_mut(..packs).unwrap_or_default();
        let pack_n = self.pack_n.get_mut(..packs).unwrap_or_default();
        pack_w.fill(0.0);
        pack_n.fill(0);
        // First round: while the items so far weigh more than zero, item `j` goes to the empty
        // pack `j` (the lightest non-full one, the lowest index among the zero weights), so
        // the tree is built once after it.
        let mut first = 0;
        for (p, k) in keys.iter().enumerate().take(packs) {
            let i = *k as u64 as usize;
            let (Some(pw), Some(pn), Some(&x)) = (pack_w.get_mut(p), pack_n.get_mut(p), w.get(i))
            else {
                break;
            };
            if let (Some(po), Some(ro)) = (pack_of.get_mut(i), rank_of.get_mut(i)) {
                *po = p as u16;
                *ro = 0;
            }
            *pw = x;
            *pn = 1;
            first += 1;
            if x <= 0.0 {
                break;
            }
        }
        let tree = &mut self.tree;
        tree.reset(packs, pack_w, |p| {
            pack_n.get(p).is_some_and(|&c| (c as usize) < per)
        })?;
        for k in keys.iter().skip(first) {
            let i = *k as u64 as usize;
            let (Some(p), Some(&x)) = (tree.min(), w.get(i)) else {
                return Err(Error::NoPlacement {
                    layer: 0,
                    why: "balanced packing ran out of packs",
                });
            };
            let (Some(pw), Some(pn)) = (pack_w.get_mut(p), pack_n.get_mut(p)) else {
                continue;
            };
            if let (Some(po), Some(ro)) = (pack_of.get_mut(i), rank_of.get_mut(i)) {
                *po = p as u16;
                *ro = *pn as u16;
            }
            *pw += x;
            *pn += 1;
            tree.set(p, *pw, (*pn as usize) < per);
        }
        Ok(())
    }
}

/// The dimensions of one run: the hierarchical ones, or the global ones (one group, one node).
#[derive(Debug, Clone, Copy)]
struct Topo {
    n: usize,
    groups: usize,
    nodes: usize,
    /// Ranks per node.
    rpn: usize,
    /// Slots per rank.
    s: usize,
}

impl Topo {
    fn of(shape: &Shape) -> Result<Self, Error> {
        let (n, g, m) = (shape.experts(), shape.groups(), shape.nodes());
        if g.is_multiple_of(m) {
            if !n.is_multiple_of(g) {
                return Err(Error::Topology {
                    what: "hierarchical DeepSeek EPLB needs experts divisible by expert groups",
                    value: g,
                });
            }
            Ok(Self {
                n,
                groups: g,
                nodes: m,
                rpn: shape.ranks_per_node(),
                s: shape.slots_per_rank(),
            })
        } else {
            Ok(Self::global(shape))
        }
    }

    fn global(shape: &Shape) -> Self {
        Self {
            n: shape.experts(),
            groups: 1,
            nodes: 1,
            rpn: shape.ranks(),
            s: shape.slots_per_rank(),
        }
    }

    /// Experts per node.
    fn epn(&self) -> usize {
        self.n / self.nodes
    }
    /// Slots per node.
    fn spn(&self) -> usize {
        self.rpn * self.s
    }
    /// Packs of the larger packing.
    fn packs(&self) -> usize {
        self.nodes.max(self.rpn)
    }
    fn items(&self) -> usize {
        self.groups.max(self.spn())
    }

    /// Scratch words of one call (checked: saturates, see [`Words`]).
    fn words(&self) -> Words {
        let spn = Words(self.rpn) * Words(self.s);
        let (g, n, e, k) = (
            Words(self.groups),
            Words(self.n),
            Words(self.epn()),
            Words(self.packs()),
        );
        let p = spn;
        let items = if self.groups > spn.get() { g } else { spn };
        key_words_checked(items)
            + g.f64s()
            + 2 * g.u16s()
            + n.u16s()
            + 2 * e.f64s()
            + e.u32s()
            + e.u16s()
            + p.u16s()
            + p.f64s()
            + 2 * p.u16s()
            + k.f64s()
            + k.u32s()
            + tree_words_checked(k)
    }
}

/// Per-call buffers, carved from the scratch.
struct Bufs<'a> {
    packing: Packing<'a>,
    group_w: &'a mut [f64],
    group_pack: &'a mut [u16],
    group_rank: &'a mut [u16],
    mlog2log: &'a mut [u16],
    node_w: &'a mut [f64],
    value: &'a mut [f64],
    count: &'a mut [u32],
    heap: &'a mut [u16],
    phy: &'a mut [u16],
    copy_w: &'a mut [f64],
    copy_pack: &'a mut [u16],
    copy_rank: &'a mut [u16],
}

impl<'a> Bufs<'a> {
    fn carve(arena: &mut Arena<'a>, t: &Topo) -> Result<Self, Error> {
        let (g, n, e, p, k) = (t.groups, t.n, t.epn(), t.spn(), t.packs());
        let keys = carve_keys(arena, t.items())?;
        Ok(Self {
            group_w: arena.f64s(g)?,
            group_pack: arena.u16s(g)?,
            group_rank: arena.u16s(g)?,
            mlog2log: arena.u16s(n)?,
            node_w: arena.f64s(e)?,
            value: arena.f64s(e)?,
            count: arena.u32s(e)?,
            heap: arena.u16s(e)?,
            phy: arena.u16s(p)?,
            copy_w: arena.f64s(p)?,
            copy_pack: arena.u16s(p)?,
            copy_rank: arena.u16s(p)?,
            packing: Packing {
                keys,
                pack_w: arena.f64s(k)?,
                pack_n: arena.u32s(k)?,
                tree: MinTree::carve(arena, k)?,
            },
        })
    }
}

/// `true` when heap entry `a` should sit above `b`: larger value, lower index on ties.
fn above(a: u16, b: u16, value: &[f64]) -> bool {
    match (value.get(usize::from(a)), value.get(usize::from(b))) {
        (Some(va), Some(vb)) => va > vb || (va == vb && a < b),
        _ => false,
    }
}

fn sift_down(heap: &mut [u16], mut i: usize, value: &[f64]) {
    let n = heap.len();
    loop {
        let (l, r) = (2 * i + 1, 2 * i + 2);
        let mut best = i;
        let at = |j: usize| heap.get(j).copied().unwrap_or(NONE);
        if l < n && above(at(l), at(best), value) {
            best = l;
        }
        if r < n && above(at(r), at(best), value) {
            best = r;
        }
        if best == i {
            return;
        }
        heap.swap(i, best);
        i = best;
    }
}

/// DeepSeek's `replicate_experts` for one node: `phy[..slots]` gets the node-local expert of
/// each physical copy (the experts first, then the extras in the order chosen), `count` the
/// copies of each expert.
fn replicate(
    w: &[f64],
    keys: &mut [u128],
    value: &mut [f64],
    count: &mut [u32],
    heap: &mut [u16],
    phy: &mut [u16],
) -> Result<(), Error> {
    let e = w.len();
    for (((v, c), &x), p) in value
        .iter_mut()
        .zip(count.iter_mut())
        .zip(w)
        .zip(phy.iter_mut())
    {
        *c = 1;
        *v = x;
        *p = 0;
    }
    let (orig, extra) = phy.split_at_mut(e.min(phy.len()));
    for (i, p) in orig.iter_mut().enumerate() {
        *p = i as u16;
    }
    if extra.is_empty() {
        return Ok(());
    }
    // Only the top `extra` experts by (weight desc, index asc) can gain a copy: their first
    // copies alone outrank any other expert's.
    let cand = extra.len().min(e);
    let have = keys.len();
    let keys = keys.get_mut(..e).ok_or(Error::Scratch {
        needed: key_words(e),
        got: key_words(have),
    })?;
    for (i, (k, &x)) in keys.iter_mut().zip(w).enumerate() {
        *k = u128::from(!weight_bits(x)) << 64 | i as u128;
    }
    if cand < e {
        keys.select_nth_unstable(cand - 1);
    }
    let heap = heap.get_mut(..cand).unwrap_or_default();
    for (h, k) in heap.iter_mut().zip(keys.iter()) {
        *h = *k as u64 as u16;
    }
    for i in (0..cand / 2).rev() {
        sift_down(heap, i, value);
    }
    for p in extra.iter_mut() {
        let Some(&top) = heap.first() else {
            return Err(Error::NoPlacement {
                layer: 0,
                why: "no expert to replicate",
            });
        };
        *p = top;
        let t = usize::from(top);
        if let (Some(c), Some(v), Some(&x)) = (count.get_mut(t), value.get_mut(t), w.get(t)) {
            *c += 1;
            *v = x / f64::from(*c);
        }
        sift_down(heap, 0, value);
    }
    Ok(())
}

/// One layer: writes `phy2log` (`[R*S]`) for loads `w` (`[N]`) and, when given, each slot's
/// replica rank (`[R*S]`, see [`DeepSeek::place_ranked`]).
fn layer(
    t: &Topo,
    w: &[f64],
    b: &mut Bufs<'_>,
    out: &mut [u16],
    mut ranks: Option<&mut [u16]>,
) -> Result<(), Error> {
    let gs = t.n / t.groups;
    let gpn = t.groups / t.nodes;
    for (gw, chunk) in b.group_w.iter_mut().zip(w.chunks_exact(gs.max(1))) {
        *gw = chunk.iter().fold(0.0, |a, &x| a + x);
    }
    b.packing
        .pack(b.group_w, t.nodes, b.group_pack, b.group_rank)?;
    for (g, (&p, &r)) in b.group_pack.iter().zip(b.group_rank.iter()).enumerate() {
        let base = (usize::from(p) * gpn + usize::from(r)) * gs;
        if let Some(dst) = b.mlog2log.get_mut(base..base + gs) {
            for (o, d) in dst.iter_mut().enumerate() {
                *d = (g * gs + o) as u16;
            }
        }
    }
    let (epn, spn) = (t.epn(), t.spn());
    for (node, (m2l, node_out)) in b
        .mlog2log
        .chunks_exact(epn)
        .zip(out.chunks_exact_mut(spn))
        .enumerate()
    {
        for (nw, &id) in b.node_w.iter_mut().zip(m2l) {
            *nw = w.get(usize::from(id)).copied().unwrap_or(0.0);
        }
        replicate(b.node_w, b.packing.keys, b.value, b.count, b.heap, b.phy)?;
        for (cw, &m) in b.copy_w.iter_mut().zip(b.phy.iter()) {
            let m = usize::from(m);
            let (x, c) = (
                b.node_w.get(m).copied().unwrap_or(0.0),
                b.count.get(m).copied().unwrap_or(1),
            );
            *cw = x / f64::from(c);
        }
        b.packing.pack(b.copy_w, t.rpn, b.copy_pack, b.copy_rank)?;
        for ((&m, &p), &r) in b.phy.iter().zip(b.copy_pack.iter()).zip(b.copy_rank.iter()) {
            let slot = usize::from(p) * t.s + usize::from(r);
            if let (Some(o), Some(&id)) = (node_out.get_mut(slot), m2l.get(usize::from(m))) {
                *o = id;
            }
        }
        if let Some(rk) = ranks.as_deref_mut() {
            // The copies in physical order are the expert's first copy, then its extra copies
            // in the order they were chosen: a copy's replica rank is the number of copies of
            // its expert before it. `count` (the final counts) is spent; it counts them again.
            let node_ranks = rk.get_mut(node * spn..(node + 1) * spn).unwrap_or_default();
            b.count.fill(0);
            for ((&m, &p), &r) in b.phy.iter().zip(b.copy_pack.iter()).zip(b.copy_rank.iter()) {
                let slot = usize::from(p) * t.s + usize::from(r);
                if let (Some(o), Some(c)) =
                    (node_ranks.get_mut(slot), b.count.get_mut(usize::from(m)))
                {
                    *o = *c as u16;
                    *c += 1;
                }
            }
        }
    }
    Ok(())
}

/// DeepSeek's EPLB: hierarchical when the groups divide into the nodes, otherwise global.
/// Ignores the current placement; may co-locate copies (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct DeepSeek;

impl DeepSeek {
    /// The policy.
    pub fn new() -> Self {
        Self
    }

    /// Whether `shape` runs hierarchically (`groups % nodes == 0`).
    pub fn is_hierarchical(shape: &Shape) -> bool {
        shape.groups().is_multiple_of(shape.nodes())
    }

    /// [`Policy::place`], and with `ranks` (`[L][R*S]`) each slot's replica rank as DeepSeek's
    /// `rebalance_experts` numbers it (`phyrank`): 0 for an expert's first copy, then 1, 2, ...
    /// for its extra copies in the order replication chose them. DeepSeek's `log2phy[l][e][k]`
    /// is the slot whose replica rank is `k`; it is not ascending in the slot in general, since
    /// the packing puts a later copy on a lower rank when that rank is lighter. Allocates
    /// nothing; scratch as [`Policy::scratch_len`]; a `ranks` of another length than `out` is
    /// [`Error::Core`] (a length error).
    pub fn place_ranked(
        &self,
        input: &Input<'_>,
        scratch: &mut [u64],
        out: &mut [u16],
        mut ranks: Option<&mut [u16]>,
    ) -> Result<(), Error> {
        let shape = *input.shape();
        let t = Topo::of(&shape)?;
        crate::policy::check_out_len(&shape, out)?;
        if let Some(rk) = ranks.as_deref()
            && rk.len() != shape.placement_len()
        {
            return Err(eplb_core::Error::Length {
                what: "replica ranks [L][R][S]",
                expected: shape.placement_len(),
                got: rk.len(),
            }
            .into());
        }
        let mut arena = Arena::new(scratch);
        let mut bufs = Bufs::carve(&mut arena, &t)?;
        let per = shape.slots_per_layer();
        for (l, o) in out.chunks_exact_mut(per).enumerate() {
            let rk = ranks
                .as_deref_mut()
                .and_then(|r| r.get_mut(l * per..(l + 1) * per));
            layer(&t, input.layer_loads(l), &mut bufs, o, rk).map_err(|e| match e {
                Error::NoPlacement { why, .. } => Error::NoPlacement {
                    layer: l as u16,
                    why,
                },
                e => e,
            })?;
        }
        Ok(())
    }
}

impl Policy for DeepSeek {
    fn kind(&self) -> PolicyKind {
        PolicyKind::DeepSeek
    }

    fn scratch_len(&self, shape: &Shape) -> usize {
        Topo::of(shape)
            .unwrap_or_else(|_| Topo::global(shape))
            .words()
            .get()
    }

    fn colocates(&self) -> bool {
        true
    }

    fn check_shape(&self, shape: &Shape) -> Result<(), Error> {
        Topo::of(shape).map(|_| ())
    }

    fn place(
        &mut self,
        input: &Input<'_>,
        scratch: &mut [u64],
        _state: &mut [u64],
        out: &mut [u16],
    ) -> Result<(), Error> {
        self.place_ranked(input, scratch, out, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::rebalance_owned;
    use eplb_core::{Layout, Placement};
    use std::vec;
    use std::vec::Vec;

    fn run(shape: Shape, loads: &[f64]) -> Result<Vec<u16>, Error> {
        let mut current = vec![0u16; shape.placement_len()];
        Layout::default().fill(&shape, &mut current)?;
        Ok(rebalance_owned(&mut DeepSeek, shape, &current, loads, 0, &mut [])?.0)
    }

    #[test]
    fn readme_example() {
        let shape = Shape::with_topology(2, 12, 8, 2, 4, 4).unwrap();
        let loads: Vec<f64> = [
            90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86, 20, 107, 104, 64, 19, 197, 187, 157,
            172, 86, 16, 27,
        ]
        .iter()
        .map(|&x| f64::from(x))
        .collect();
        let out = run(shape, &loads).unwrap();
        assert_eq!(
            out,
            [
                5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1, 7, 10, 6, 8, 6, 11, 8, 9, 2, 4,
                5, 1, 5, 0, 3, 1
            ]
        );
    }

    #[test]
    fn topology_errors_and_global_fallback() {
        // 3 groups on 3 nodes but 8 experts: not a multiple.
        let shape = Shape::with_topology(1, 8, 6, 2, 2, 3).unwrap();
        let loads = [1.0; 8];
        assert!(matches!(run(shape, &loads), Err(Error::Topology { .. })));
        // 3 groups on 2 nodes: global.
        let shape = Shape::with_topology(1, 9, 4, 3, 2, 3).unwrap();
        assert!(!DeepSeek::is_hierarchical(&shape));
        let loads: Vec<f64> = (0..9).map(f64::from).collect();
        assert!(run(shape, &loads).is_ok());
    }

    #[test]
    fn small_scratch_is_an_error() {
        let shape = Shape::new(1, 8, 4, 3).unwrap();
        let mut current = vec![0u16; shape.placement_len()];
        Layout::default().fill(&shape, &mut current).unwrap();
        let loads = [1.0; 8];
        let input = Input::new(Placement::new(shape, &current).unwrap(), &loads, None, 0).unwrap();
        let mut p = DeepSeek;
        let need = p.scratch_len(&shape);
        let mut scratch = vec![0u64; need - 1];
        let mut out = vec![0u16; shape.placement_len()];
        assert!(matches!(
            p.place(&input, &mut scratch, &mut [], &mut out),
            Err(Error::Scratch { .. })
        ));
        let mut scratch = vec![0u64; need];
        assert!(p.place(&input, &mut scratch, &mut [], &mut out).is_ok());
    }

    /// A tiny deterministic generator for the reference comparisons.
    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state >> 33
    }

    /// Balanced packing as written in `eplb.py`: stable descending sort, linear scan for the
    /// lightest non-full pack (first on ties).
    fn naive_pack(w: &[f64], packs: usize) -> (Vec<u16>, Vec<u16>) {
        let per = w.len() / packs;
        if per == 1 {
            return ((0..w.len() as u16).collect(), vec![0; w.len()]);
        }
        let mut idx: Vec<usize> = (0..w.len()).collect();
        idx.sort_by(|&a, &b| w[b].partial_cmp(&w[a]).unwrap());
        let (mut pw, mut pn) = (vec![0.0; packs], vec![0usize; packs]);
        let (mut po, mut ro) = (vec![0u16; w.len()], vec![0u16; w.len()]);
        for i in idx {
            let p = (0..packs)
                .filter(|&p| pn[p] < per)
                .fold(None, |best: Option<usize>, p| match best {
                    Some(b) if pw[b] <= pw[p] => Some(b),
                    _ => Some(p),
                })
                .unwrap();
            po[i] = p as u16;
            ro[i] = pn[p] as u16;
            pw[p] += w[i];
            pn[p] += 1;
        }
        (po, ro)
    }

    /// `replicate_experts` as written: argmax of `w / c` (first on ties) for each extra slot.
    fn naive_replicate(w: &[f64], slots: usize) -> Vec<u16> {
        let mut c = vec![1u32; w.len()];
        let mut phy: Vec<u16> = (0..w.len() as u16).collect();
        for _ in w.len()..slots {
            let mut best = 0;
            for e in 1..w.len() {
                if w[e] / f64::from(c[e]) > w[best] / f64::from(c[best]) {
                    best = e;
                }
            }
            c[best] += 1;
            phy.push(best as u16);
        }
        phy
    }

    #[test]
    fn pack_and_replicate_match_the_reference_with_ties() {
        let mut st = 7u64;
        for round in 0..400 {
            let packs = 1 + (lcg(&mut st) % 9) as usize;
            let per = 1 + (lcg(&mut st) % 5) as usize;
            let n = packs * per;
            // Small integers (many ties and zeros), or spread values.
            let w: Vec<f64> = (0..n)
                .map(|_| {
                    if round % 2 == 0 {
                        (lcg(&mut st) % 4) as f64
                    } else {
                        (lcg(&mut st) % 1000) as f64 / 7.0
                    }
                })
                .collect();
            let mut buf = vec![0u64; key_words(n) + 2 * packs + tree_words(packs)];
            let mut arena = Arena::new(&mut buf);
            let mut packing = Packing {
                keys: carve_keys(&mut arena, n).unwrap(),
                pack_w: arena.f64s(packs).unwrap(),
                pack_n: arena.u32s(packs).unwrap(),
                tree: MinTree::carve(&mut arena, packs).unwrap(),
            };
            let (mut po, mut ro) = (vec![0u16; n], vec![0u16; n]);
            packing.pack(&w, packs, &mut po, &mut ro).unwrap();
            assert_eq!((po, ro), naive_pack(&w, packs), "pack {w:?} into {packs}");

            let extra = (lcg(&mut st) % 12) as usize;
            let slots = n + extra;
            let (mut value, mut count) = (vec![0.0; n], vec![0u32; n]);
            let (mut heap, mut phy) = (vec![0u16; n], vec![0u16; slots]);
            let mut keys = vec![0u128; n];
            replicate(&w, &mut keys, &mut value, &mut count, &mut heap, &mut phy).unwrap();
            assert_eq!(
                phy,
                naive_replicate(&w, slots),
                "replicate {w:?} to {slots}"
            );
        }
    }

    /// DeepSeek's global policy on one layer as written, with `phyrank`: replicate, number
    /// each expert's copies in creation order, pack the copies by `w / count`.
    fn naive_global(w: &[f64], ranks: usize, s: usize) -> (Vec<u16>, Vec<u16>) {
        let phy = naive_replicate(w, ranks * s);
        let mut count = vec![0u32; w.len()];
        let mut rank = Vec::new();
        for &m in &phy {
            rank.push(count[usize::from(m)] as u16);
            count[usize::from(m)] += 1;
        }
        let cw: Vec<f64> = phy
            .iter()
            .map(|&m| w[usize::from(m)] / f64::from(count[usize::from(m)]))
            .collect();
        let (po, ro) = naive_pack(&cw, ranks);
        let (mut out, mut out_rank) = (vec![0u16; ranks * s], vec![0u16; ranks * s]);
        for i in 0..phy.len() {
            let slot = usize::from(po[i]) * s + usize::from(ro[i]);
            out[slot] = phy[i];
            out_rank[slot] = rank[i];
        }
        (out, out_rank)
    }

    #[test]
    fn replica_ranks_are_deepseeks_creation_order() {
        let mut st = 11u64;
        let mut later_copy_on_a_lower_slot = false;
        for round in 0..300 {
            let ranks = 1 + (lcg(&mut st) % 8) as usize;
            let s = 1 + (lcg(&mut st) % 4) as usize;
            // At least S experts (a rank holds distinct slots' worth), at most R * S.
            let n = s + (lcg(&mut st) % ((ranks - 1) * s + 1) as u64) as usize;
            let w: Vec<f64> = (0..n)
                .map(|_| {
                    if round % 2 == 0 {
                        (lcg(&mut st) % 4) as f64
                    } else {
                        (lcg(&mut st) % 1000) as f64 / 7.0
                    }
                })
                .collect();
            let shape = Shape::new(1, n as u16, ranks as u16, s as u16).unwrap();
            let mut current = vec![0u16; shape.placement_len()];
            Layout::default().fill(&shape, &mut current).unwrap();
            let input = Input::new(Placement::new(shape, &current).unwrap(), &w, None, 0).unwrap();
            let p = DeepSeek;
            let mut scratch = vec![0u64; p.scratch_len(&shape)];
            let (mut out, mut rk) = (vec![0u16; ranks * s], vec![0u16; ranks * s]);
            p.place_ranked(&input, &mut scratch, &mut out, Some(&mut rk))
                .unwrap();
            let want = naive_global(&w, ranks, s);
            assert_eq!((&out, &rk), (&want.0, &want.1), "{w:?} on {ranks} x {s}");
            // Without ranks, the same placement.
            let mut plain = vec![0u16; ranks * s];
            p.place_ranked(&input, &mut scratch, &mut plain, None)
                .unwrap();
            assert_eq!(plain, out);
            for e in 0..n as u16 {
                let slots: Vec<usize> = (0..out.len()).filter(|&j| out[j] == e).collect();
                if slots.windows(2).any(|ab| rk[ab[0]] > rk[ab[1]]) {
                    later_copy_on_a_lower_slot = true;
                }
            }
        }
        assert!(
            later_copy_on_a_lower_slot,
            "the cases include a later copy on a lower slot (ascending slots are not the order)"
        );
        let shape = Shape::new(1, 4, 2, 2).unwrap();
        let current = [0, 1, 2, 3];
        let input =
            Input::new(Placement::new(shape, &current).unwrap(), &[1.0; 4], None, 0).unwrap();
        let mut scratch = vec![0u64; DeepSeek.scratch_len(&shape)];
        let (mut out, mut rk) = ([0u16; 4], [0u16; 3]);
        assert!(matches!(
            DeepSeek.place_ranked(&input, &mut scratch, &mut out, Some(&mut rk)),
            Err(Error::Core(eplb_core::Error::Length { .. }))
        ));
    }

    #[test]
    fn min_tree_prefers_lowest_index_on_ties() {
        let w = [3.0, 1.0, 1.0, 2.0, 1.0];
        let mut buf = vec![0u64; tree_words(5)];
        let mut arena = Arena::new(&mut buf);
        let mut t = MinTree::carve(&mut arena, 5).unwrap();
        t.reset(5, &w, |_| true).unwrap();
        assert_eq!(t.min(), Some(1));
        t.set(1, 1.0, false);
        assert_eq!(t.min(), Some(2));
        t.set(2, 1.0, false);
        t.set(4, 1.0, false);
        assert_eq!(t.min(), Some(3));
        t.set(0, 0.5, true);
        assert_eq!(t.min(), Some(0));
        t.set(4, f64::INFINITY, true);
        for b in 0..4 {
            t.set(b, 0.0, false);
        }
        assert_eq!(t.min(), Some(4));
        t.set(4, 0.0, false);
        assert_eq!(t.min(), None);
        assert!(t.reset(9, &w, |_| true).is_err());
    }
}
