//! vLLM-Ascend's DefaultEplb (type 1), exact on tie-free inputs and on the upstream tie rules.
//!
//! # Algorithm
//!
//! Per layer (`research/vllm-ascend-eplb.md` §3.2), with `N` experts, `R` ranks ("boxes"),
//! `S` slots per rank and `X = R*S - N` redundant copies:
//!
//! 1. **Logical load.** `w_e` is the caller's logical load. Upstream sums the slot loads of
//!    `e`'s copies rank-major; the planner folds measured slot heat the same way, and a golden
//!    case's loads are that fold, so the numbers are the same.
//! 2. **Replication.** A list of `(expert, weight)`, in id order. `X` times: sort it by weight,
//!    descending, with `np.argsort(kind="stable")[::-1]` (equal weights: the *later* list
//!    position first); the top expert, with `c` copies, gets one more and its weight becomes
//!    `(w * c) / (c + 1)`; the list keeps the sorted order. Because only the top changes, each
//!    round re-sorts in `O(log N)` plus a shift (and an `O(N)` pass only while equal weights
//!    exist); a full sort is needed only on the fix below.
//! 3. **Pre-placed copies.** For expert ids ascending, each extra copy goes to box `0, 1, 2, ..`
//!    (one running index), carrying the expert's final weight.
//! 4. **Greedy packing.** The list, sorted once more by the same rule, is visited in order; each
//!    expert goes to the box with the smallest weight among the boxes with room that do not hold
//!    it (strict `<`: the lowest index on ties). A min tournament tree over the boxes gives the
//!    lightest box with room; only when that box holds the expert are the boxes holding it (a
//!    bitset `[R][N]`) masked out for one query. Box weights are summed in insertion order. A
//!    box's row is its pre-placed copies, then its experts in insertion order.
//! 5. **Local-constraint exchange** ([`common::keep_slots`](crate::common::keep_slots)): box `i`
//!    is rank `i`; an expert the rank already held keeps its old slot.
//!
//! # Complexity
//!
//! Per layer `O(N log N + X N + N log R + R S^2)` time, where the `X N` term is a scan and a
//! `memmove` of at most `N` entries per replication round (plus an `O(N)` pass per round only
//! while equal weights exist, and a full re-sort on the copy cap below). Scratch
//! `O(N + R + S + R N / 64)` words, a pure function of the shape.
//!
//! # Fixes and differences from the reference
//!
//! - **Fix: no fall-back to the last box** (upstream quirk §9.7). When every box with room
//!   already holds the expert `e`, upstream appends it to the last box anyway (a co-located
//!   copy, or a box over capacity). We *repair by a swap* instead: let `b` be the lightest box
//!   with room (all of them hold `e`); among the full boxes `b2` that do not hold `e` and the
//!   experts `f` of `b2` that `b` does not hold, take the pair minimising the larger of the two
//!   new box weights (lowest `b2`, then lowest slot, on ties); move `f` to `b` and put `e` in
//!   `f`'s slot. Such a pair always exists while `e` has fewer than `R` copies (`b2` holds `S`
//!   experts, `b` at most `S - 1`, one of them `e`), which the next fix guarantees; otherwise the
//!   layer would be [`Error::NoPlacement`]. Upstream's output in this case is invalid (the
//!   planner reverts the layer), so exactness on valid outputs is unaffected.
//! - **Fix: at most `R` copies per expert.** Replication skips an expert that already has one
//!   copy per rank (the first such in sort order is passed over, then the list is fully
//!   re-sorted by the same rule); upstream would give it an `(R+1)`-th copy that cannot be placed.
//! - **Extension: `X > R`.** Upstream raises; we continue the running index of step 3 modulo `R`,
//!   which is upstream's rule whenever `X <= R`.
//! - The "before/after", `changed` and priority outputs are [`rebalance`](crate::rebalance)'s
//!   job (per-layer PAR and changed flags); upstream's 5 % gate is ignored there too.

use eplb_core::Shape;

use crate::arena::Arena;
use crate::arena::Words;
use crate::common::keep_slots;
use crate::deepseek::{MinTree, carve_keys, key_words_checked, tree_words_checked, weight_bits};
use crate::{Error, Input, Policy, PolicyKind};

/// Per-call buffers, carved from the scratch.
struct Bufs<'a> {
    /// Current weight of each expert in the list.
    wt: &'a mut [f64],
    /// Copies of each expert.
    copies: &'a mut [u32],
    /// `[R][ceil(N/64)]` bits: which box holds which expert.
    holds: Holds<'a>,
    /// The list order (expert ids).
    order: &'a mut [u16],
    /// The weights in list order (`wt[order[i]]`), for the scans.
    ow: &'a mut [f64],
    /// Sort keys.
    keys: &'a mut [u128],
    box_w: &'a mut [f64],
    box_n: &'a mut [u32],
    tree: MinTree<'a>,
    keep: &'a mut [u16],
}

/// Scratch words of one call (checked: saturates, see [`Words`]).
fn words(shape: &Shape) -> Words {
    let (n, r, s) = (
        Words(shape.experts()),
        Words(shape.ranks()),
        Words(shape.slots_per_rank()),
    );
    2 * n.f64s()
        + n.u32s()
        + r * n.div_ceil(64)
        + n.u16s()
        + key_words_checked(n)
        + r.f64s()
        + r.u32s()
        + tree_words_checked(r)
        + (2 * s).u16s()
}

impl<'a> Bufs<'a> {
    fn carve(arena: &mut Arena<'a>, shape: &Shape) -> Result<Self, Error> {
        let (n, r, s) = (shape.experts(), shape.ranks(), shape.slots_per_rank());
        Ok(Self {
            wt: arena.f64s(n)?,
            copies: arena.u32s(n)?,
            holds: Holds {
                per_box: n.div_ceil(64),
                bits: arena.words(r * n.div_ceil(64))?,
            },
            order: arena.u16s(n)?,
            ow: arena.f64s(n)?,
            keys: carve_keys(arena, n)?,
            box_w: arena.f64s(r)?,
            box_n: arena.u32s(r)?,
            tree: MinTree::carve(arena, r)?,
            keep: arena.u16s(2 * s)?,
        })
    }
}

/// Sorts `order` by weight descending, equal weights by list position descending
/// (`np.argsort(kind="stable")[::-1]`). Returns the number of adjacent equal-weight pairs.
fn full_sort(order: &mut [u16], ow: &mut [f64], wt: &[f64], keys: &mut [u128]) -> usize {
    let keys = match keys.get_mut(..order.len()) {
        Some(k) => k,
        None => return 0,
    };
    for (pos, (k, &id)) in keys.iter_mut().zip(order.iter()).enumerate() {
        let w = wt.get(usize::from(id)).copied().unwrap_or(0.0);
        *k = u128::from(!weight_bits(w)) << 64 | u128::from(!((pos as u64) << 16 | u64::from(id)));
    }
    keys.sort_unstable();
    for ((o, x), k) in order.iter_mut().zip(ow.iter_mut()).zip(keys.iter()) {
        *o = (!(*k as u64) & 0xffff) as u16;
        *x = weight_of(wt, *o);
    }
    equal_pairs(ow)
}

fn weight_of(wt: &[f64], id: u16) -> f64 {
    wt.get(usize::from(id)).copied().unwrap_or(0.0)
}

fn equal_pairs(ow: &[f64]) -> usize {
    ow.windows(2)
        .filter(|p| match p {
            [a, b] => a == b,
            _ => false,
        })
        .count()
}

/// Reverses every run of equal weights in `order` (sorted descending, weights `ow`); `ow`
/// itself is unchanged by it.
fn reverse_runs(order: &mut [u16], ow: &[f64]) {
    let mut i = 0;
    while let Some(&w) = ow.get(i) {
        let len = ow
            .get(i..)
            .unwrap_or_default()
            .iter()
            .take_while(|&&x| x == w)
            .count()
            .max(1);
        if let Some(run) = order.get_mut(i..i + len) {
            run.reverse();
        }
        i += len;
    }
}

/// The replication phase: `X` rounds of "sort, then the top gains a copy". On return `order` is
/// the final sort (the packing order) and `copies` the new copy counts.
fn replicate(b: &mut Bufs<'_>, x: usize, ranks: usize) {
    let cap = u32::try_from(ranks).unwrap_or(u32::MAX);
    for (i, o) in b.order.iter_mut().enumerate() {
        *o = i as u16;
    }
    let mut eq = full_sort(b.order, b.ow, b.wt, b.keys);
    for _ in 0..x {
        // The list is sorted; find the expert that gains a copy.
        let fast = b
            .order
            .first()
            .is_some_and(|&t| b.copies.get(usize::from(t)).is_some_and(|&c| c < cap));
        let pos = if fast {
            0
        } else {
            match b
                .order
                .iter()
                .position(|&t| b.copies.get(usize::from(t)).is_some_and(|&c| c < cap))
            {
                Some(p) => p,
                None => return,
            }
        };
        let Some(&top) = b.order.get(pos) else { return };
        let t = usize::from(top);
        let (Some(w), Some(c)) = (b.wt.get_mut(t), b.copies.get_mut(t)) else {
            return;
        };
        let old = *w;
        *w = (*w * f64::from(*c)) / f64::from(*c + 1);
        *c += 1;
        let new = *w;
        if !fast {
            eq = full_sort(b.order, b.ow, b.wt, b.keys);
            continue;
        }
        if b.ow.get(1).is_some_and(|&n| n == old) {
            eq = eq.saturating_sub(1);
        }
        // Re-sort: the rest is sorted; its equal runs flip, and `top` (position 0) goes last
        // among the weights >= its new one.
        let rest = b.order.get_mut(1..).unwrap_or_default();
        let rest_w = b.ow.get(1..).unwrap_or_default();
        if eq > 0 {
            reverse_runs(rest, rest_w);
        }
        let q = rest_w.iter().take_while(|&&x| x >= new).count();
        b.order.copy_within(1..q + 1, 0);
        b.ow.copy_within(1..q + 1, 0);
        if let (Some(o), Some(x)) = (b.order.get_mut(q), b.ow.get_mut(q)) {
            *o = top;
            *x = new;
        }
        if q > 0 && b.ow.get(q - 1).is_some_and(|&p| p == new) {
            eq += 1;
        }
    }
}

/// Which box holds which expert, one bit each.
struct Holds<'a> {
    per_box: usize,
    bits: &'a mut [u64],
}

impl Holds<'_> {
    fn get(&self, bx: usize, e: u16) -> bool {
        let e = usize::from(e);
        self.bits
            .get(bx * self.per_box + e / 64)
            .is_some_and(|w| w >> (e % 64) & 1 == 1)
    }

    fn put(&mut self, bx: usize, e: u16, on: bool) {
        let e = usize::from(e);
        if let Some(w) = self.bits.get_mut(bx * self.per_box + e / 64) {
            if on {
                *w |= 1 << (e % 64);
            } else {
                *w &= !(1 << (e % 64));
            }
        }
    }
}

/// The boxes' state during packing: rows (`[R][S]`, filled left to right), counts, weights.
struct Boxes<'a, 'b> {
    s: usize,
    rows: &'b mut [u16],
    n: &'b mut [u32],
    w: &'b mut [f64],
    holds: &'b mut Holds<'a>,
}

impl Boxes<'_, '_> {
    fn weight(&self, bx: usize) -> f64 {
        self.w.get(bx).copied().unwrap_or(0.0)
    }

    fn room(&self, bx: usize) -> bool {
        self.n.get(bx).is_some_and(|&k| (k as usize) < self.s)
    }

    fn len(&self, bx: usize) -> usize {
        self.n.get(bx).map_or(0, |&k| k as usize)
    }

    /// Appends `e` (weight `we`) to box `bx`.
    fn push(&mut self, bx: usize, e: u16, we: f64) {
        let (Some(bw), Some(bn)) = (self.w.get_mut(bx), self.n.get_mut(bx)) else {
            return;
        };
        if let Some(o) = self.rows.get_mut(bx * self.s + *bn as usize) {
            *o = e;
        }
        *bw += we;
        *bn += 1;
        self.holds.put(bx, e, true);
    }

    /// The fix "no fall-back to the last box": every box with room holds `e`, so let `b` be the
    /// lightest of them; among the (full) boxes `b2` without `e` and their experts `f` that `b`
    /// does not hold, take the pair minimising the larger of the two new box weights (lowest
    /// `b2`, then lowest slot, on ties), move `f` to `b` and put `e` in `f`'s slot. Returns the
    /// two boxes changed, or `None` when no pair exists (impossible while `e` has fewer than
    /// `R` copies: `b2` has `S` experts, `b` at most `S - 1` of which one is `e`).
    fn repair(&mut self, e: u16, b: usize, wt: &[f64]) -> Option<(usize, usize)> {
        let s = self.s;
        let we = weight_of(wt, e);
        let wb = self.weight(b);
        let mut best: Option<(f64, usize, usize)> = None;
        for (b2, row) in self.rows.chunks_exact(s).enumerate() {
            if b2 == b || self.holds.get(b2, e) {
                continue;
            }
            let w2 = self.weight(b2);
            for (slot, &f) in row.iter().enumerate().take(self.len(b2)) {
                if self.holds.get(b, f) {
                    continue;
                }
                let wf = weight_of(wt, f);
                let cost = (wb + wf).max(w2 - wf + we);
                if best.is_none_or(|(c, _, _)| cost < c) {
                    best = Some((cost, b2, slot));
                }
            }
        }
        let (_, b2, slot) = best?;
        let f = *self.rows.get(b2 * s + slot)?;
        let wf = weight_of(wt, f);
        *self.rows.get_mut(b2 * s + slot)? = e;
        self.holds.put(b2, f, false);
        self.holds.put(b2, e, true);
        let w2 = self.w.get_mut(b2)?;
        *w2 = *w2 - wf + we;
        self.push(b, f, wf);
        Some((b, b2))
    }
}

/// One layer: `cur` is the current `[R][S]` layer, `w` the logical loads, `out` the new layer.
fn layer(
    shape: &Shape,
    index: usize,
    cur: &[u16],
    w: &[f64],
    b: &mut Bufs<'_>,
    out: &mut [u16],
) -> Result<(), Error> {
    let (r, s) = (shape.ranks(), shape.slots_per_rank());
    let x = shape.redundant();
    // 1. Logical loads, as given.
    for ((wt, c), &load) in b.wt.iter_mut().zip(b.copies.iter_mut()).zip(w) {
        *wt = load;
        *c = 1;
    }
    // 2. Replication.
    replicate(b, x, r);
    // 3. Pre-placed copies.
    b.box_w.fill(0.0);
    b.box_n.fill(0);
    b.holds.bits.fill(0);
    let mut bx = Boxes {
        s,
        rows: &mut *out,
        n: b.box_n,
        w: b.box_w,
        holds: &mut b.holds,
    };
    let mut idx: usize = 0;
    for (e, &c) in b.copies.iter().enumerate() {
        for _ in 1..c {
            bx.push(idx % r, e as u16, weight_of(b.wt, e as u16));
            idx += 1;
        }
    }
    // 4. Greedy packing.
    b.tree.reset(r, bx.w, |i| bx.room(i))?;
    let tree = &mut b.tree;
    for &e in b.order.iter() {
        let mut chosen = tree.min();
        if chosen.is_some_and(|c| bx.holds.get(c, e)) {
            for i in (0..r).filter(|&i| bx.holds.get(i, e)) {
                tree.set(i, 0.0, false);
            }
            chosen = tree.min();
            for i in (0..r).filter(|&i| bx.holds.get(i, e)) {
                tree.set(i, bx.weight(i), bx.room(i));
            }
        }
        match chosen {
            Some(c) => {
                bx.push(c, e, weight_of(b.wt, e));
                tree.set(c, bx.weight(c), bx.room(c));
            }
            None => {
                let swapped = tree.min().and_then(|c| bx.repair(e, c, b.wt));
                let Some((b1, b2)) = swapped else {
                    return Err(Error::NoPlacement {
                        layer: index as u16,
                        why: "every box with room holds the expert and no swap frees one",
                    });
                };
                log::debug!("default: layer {index}: expert {e} placed by a swap");
                tree.set(b1, bx.weight(b1), bx.room(b1));
                tree.set(b2, bx.weight(b2), bx.room(b2));
            }
        }
    }
    // 5. Kept experts keep their slot.
    for (old, new) in cur.chunks_exact(s).zip(out.chunks_exact_mut(s)) {
        keep_slots(old, new, b.keep)?;
    }
    Ok(())
}

/// vLLM-Ascend's DefaultEplb (type 1) with the fixes of the module documentation.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultEplb;

impl DefaultEplb {
    /// The policy.
    pub fn new() -> Self {
        Self
    }
}

impl Policy for DefaultEplb {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Default
    }

    fn scratch_len(&self, shape: &Shape) -> usize {
        words(shape).get()
    }

    fn place(
        &mut self,
        input: &Input<'_>,
        scratch: &mut [u64],
        _state: &mut [u64],
        out: &mut [u16],
    ) -> Result<(), Error> {
        let shape = *input.shape();
        let per_layer = shape.slots_per_layer();
        crate::policy::check_out_len(&shape, out)?;
        let mut arena = Arena::new(scratch);
        let mut bufs = Bufs::carve(&mut arena, &shape)?;
        let current = input.current().as_slice();
        for (l, (cur, o)) in current
            .chunks_exact(per_layer)
            .zip(out.chunks_exact_mut(per_layer))
            .enumerate()
        {
            let w = input.layer_loads(l);
            // No heat, no change (as the other policies): the upstream would reshuffle a
            // layer without load for no gain.
            if w.iter().all(|&x| x == 0.0) {
                o.copy_from_slice(cur);
                continue;
            }
            layer(&shape, l, cur, w, &mut bufs, o)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::rebalance_owned;
    use eplb_core::Placement;
    use std::vec;
    use std::vec::Vec;

    fn run(shape: Shape, current: &[u16], loads: &[f64]) -> Result<Vec<u16>, Error> {
        Ok(rebalance_owned(&mut DefaultEplb, shape, current, loads, 0, &mut [])?.0)
    }

    /// DefaultEplb as written upstream, for one layer; `None` where upstream would fall back
    /// to the last box or give an expert more than `R` copies.
    fn naive(r: usize, s: usize, cur: &[u16], w: &[f64]) -> Option<Vec<u16>> {
        let n = w.len();
        let x = r * s - n;
        let mut list: Vec<(u16, f64)> = (0..n as u16).zip(w.iter().copied()).collect();
        let mut red = vec![0usize; n];
        // np.argsort(kind="stable")[::-1]: ascending stable, reversed.
        let sort = |l: &mut Vec<(u16, f64)>| {
            let mut idx: Vec<usize> = (0..l.len()).collect();
            idx.sort_by(|&a, &b| l[a].1.partial_cmp(&l[b].1).unwrap());
            idx.reverse();
            *l = idx.iter().map(|&i| l[i]).collect();
        };
        for _ in 0..x {
            sort(&mut list);
            let (e, wt) = list[0];
            let c = red[usize::from(e)] + 1;
            red[usize::from(e)] += 1;
            list[0] = (e, (wt * c as f64) / (c + 1) as f64);
        }
        if red.iter().any(|&k| k + 1 > r) {
            return None;
        }
        let avg = |e: usize| list.iter().find(|p| usize::from(p.0) == e).unwrap().1;
        let mut boxes: Vec<Vec<u16>> = vec![Vec::new(); r];
        let mut bw = vec![0.0; r];
        let mut idx = 0;
        for (e, &k) in red.iter().enumerate() {
            for _ in 0..k {
                boxes[idx].push(e as u16);
                bw[idx] += avg(e);
                idx += 1;
            }
        }
        sort(&mut list);
        for &(e, wt) in &list {
            let mut best: Option<usize> = None;
            for (i, bx) in boxes.iter().enumerate() {
                if bx.contains(&e) || bx.len() >= s {
                    continue;
                }
                if best.is_none_or(|b| bw[i] < bw[b]) {
                    best = Some(i);
                }
            }
            let b = best?;
            boxes[b].push(e);
            bw[b] += wt;
        }
        let mut out = Vec::new();
        let mut tmp = vec![0u16; 2 * s];
        for (old, row) in cur.chunks_exact(s).zip(boxes.iter_mut()) {
            keep_slots(old, row, &mut tmp).unwrap();
            out.extend_from_slice(row);
        }
        Some(out)
    }

    #[test]
    fn matches_the_upstream_reference_with_ties() {
        let mut st = 11u64;
        let mut next = || {
            st = st
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            st >> 33
        };
        let mut compared = 0;
        for round in 0..600 {
            let r = 1 + (next() % 8) as usize;
            let n = 1 + (next() % 16) as usize;
            let s = n.div_ceil(r) + (next() % 2) as usize;
            if s > n || r * s - n > r {
                continue;
            }
            let shape = Shape::new(1, n as u16, r as u16, s as u16).unwrap();
            let mut current = vec![0u16; shape.placement_len()];
            eplb_core::Layout::default()
                .fill(&shape, &mut current)
                .unwrap();
            let loads: Vec<f64> = (0..n)
                .map(|_| {
                    if round % 2 == 0 {
                        (next() % 4) as f64
                    } else {
                        (next() % 1000) as f64 / 3.0
                    }
                })
                .collect();
            let Some(want) = naive(r, s, &current, &loads) else {
                continue;
            };
            let got = run(shape, &current, &loads).unwrap();
            assert_eq!(got, want, "R={r} S={s} loads {loads:?}");
            compared += 1;
        }
        assert!(compared > 200, "{compared}");
    }

    #[test]
    fn spec_vector_3_6() {
        let shape = Shape::new(1, 10, 4, 3).unwrap();
        let current = [0, 1, 2, 3, 4, 5, 6, 7, 0, 8, 9, 1];
        let loads = [160.0, 80.0, 10.0, 5.0, 5.0, 5.0, 300.0, 20.0, 1.0, 2.0];
        let out = run(shape, &current, &loads).unwrap();
        assert_eq!(out, [0, 7, 2, 3, 6, 5, 6, 4, 9, 8, 0, 1]);
    }

    #[test]
    fn small_scratch_is_an_error() {
        let shape = Shape::new(1, 8, 4, 3).unwrap();
        let current = [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3];
        let loads = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let input = Input::new(Placement::new(shape, &current).unwrap(), &loads, None, 0).unwrap();
        let mut p = DefaultEplb;
        let need = p.scratch_len(&shape);
        let mut out = vec![0u16; shape.placement_len()];
        let mut scratch = vec![0u64; need - 1];
        assert!(matches!(
            p.place(&input, &mut scratch, &mut [], &mut out),
            Err(Error::Scratch { .. })
        ));
        let mut scratch = vec![0u64; need];
        assert!(p.place(&input, &mut scratch, &mut [], &mut out).is_ok());
    }

    #[test]
    fn one_hot_expert_is_capped_at_one_copy_per_rank() {
        // Upstream would give expert 0 a fifth copy on four ranks.
        let shape = Shape::new(1, 4, 4, 2).unwrap();
        let current = [0, 1, 2, 3, 0, 1, 2, 3];
        let loads = [1000.0, 1.0, 1.0, 1.0];
        let out = run(shape, &current, &loads).unwrap();
        assert_eq!(out.iter().filter(|&&e| e == 0).count(), 4);
    }

    #[test]
    fn ties_follow_the_upstream_order() {
        // All equal: the later list position wins each round.
        let shape = Shape::new(1, 4, 2, 3).unwrap();
        let current = [0, 1, 2, 3, 0, 1];
        let loads = [4.0, 4.0, 4.0, 4.0];
        let out = run(shape, &current, &loads).unwrap();
        let p = Placement::new(shape, &out).unwrap();
        assert!(p.check_servable().is_ok());
    }

    #[test]
    fn repair_swaps_instead_of_colocating() {
        // Boxes of 2; box 1 holds [7] and is the only one with room, and 7 comes next.
        let wt = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let mut bits = [0u64; 3];
        let mut holds = Holds {
            per_box: 1,
            bits: &mut bits,
        };
        let mut rows = [0u16; 6];
        let (mut n, mut w) = ([0u32; 3], [0.0; 3]);
        let mut bx = Boxes {
            s: 2,
            rows: &mut rows,
            n: &mut n,
            w: &mut w,
            holds: &mut holds,
        };
        for (b, e) in [(0, 0u16), (0, 1), (1, 7), (2, 2), (2, 3)] {
            bx.push(b, e, wt[usize::from(e)]);
        }
        assert_eq!(bx.repair(7, 1, &wt), Some((1, 0)));
        // f = 0 (cost max(8 + 1, 3 - 1 + 8) = 10, ties with f = 1; the first slot wins).
        assert_eq!(rows, [7, 1, 7, 0, 2, 3]);
        assert_eq!(n, [2, 2, 2]);
        assert_eq!(w, [10.0, 9.0, 7.0]);
    }
}
