//! The cold start: a layer far from balance is rebuilt constructively (the local search
//! polishes it from the next call on). Five phases, each on the even split of an expert's
//! estimated load over its copies:
//!
//! 1. **Counts.** One copy each, then each spare slot to the expert with the largest load per
//!    copy (from a heap).
//! 2. **Refinement**, with two slots per rank. The counts that minimise the largest copy are
//!    not the ones that pack best there: a rank holds one hot copy and one cold expert, and the
//!    sizes must complement each other. Each round takes the experts of the larger copies of
//!    the [`RECEIVERS`] heaviest pairs and tries giving each one more copy taken from each of
//!    the [`DONORS`] experts whose copies grow least by losing one; the best move that lowers
//!    the heaviest pair is taken, for at most [`ROUNDS`] rounds. A move is valued in `O(N)`
//!    without packing: with two slots, the packing below pairs the `k`-th largest copy with
//!    the `k`-th smallest.
//! 3. **Packing**, longest processing time first: experts by load per copy, heaviest first;
//!    each copy to the lightest rank that has room and does not hold the expert (a min-heap
//!    of the ranks with room; the ranks that took a copy of the expert sit out until its
//!    copies are placed). In the final packing a rank that holds the expert now is taken
//!    instead when it is at most [`STICK`] of the mean heavier, which costs no fetch.
//! 4. **Swaps and count shifts.** While the heaviest packed rank is more than [`POLISHED`]
//!    above the mean, the swap of one of its copies with a smaller copy on one of the
//!    [`SWAP_RANKS`] lightest ranks that lowers the larger of the two loads most (and holds no
//!    expert twice) is made; the ranks are scanned lightest first, up to the first whose
//!    midpoint with the heaviest is no better than the best swap so far. When no swap helps,
//!    the counts bound the heaviest rank: a copy of an expert `f` with one to spare, on a rank
//!    that does not hold the heaviest rank's expert `e`, becomes a copy of `e`, so all of
//!    `e`'s copies shrink and `f`'s grow; the shift whose heaviest rank afterwards (bounded
//!    from above by each expert's two heaviest holders) is lowest is made if that is below
//!    the heaviest now, and the swaps go on. The packing alone leaves DeepSeek-V3's shapes
//!    1.8-3.4% above the mean at 5 and 9 slots per rank, the swaps take them to 0.1%; at 2 and
//!    3 slots only the shifts let the swaps move (EP128 1.087 -> 1.067, EP256 1.098 -> 1.089).
//! 5. **Matching** of the packed ranks to the current ranks, by shared experts: first every
//!    packed rank that can keep all `S` of its experts on a free current rank, then `S - 1`,
//!    and so on, heaviest packed rank first at each level, each to the free current rank
//!    sharing most (ties to the lower rank, found among the holders of its experts). Then each
//!    packed rank left without a sharing rank looks for an augmenting path (breadth first):
//!    it takes a sharing rank whose packed rank moves, keeping as many experts, to another,
//!    and so on until a free one; each path keeps one more expert. The rest take the remaining
//!    ranks in order. So few slots change.
//!
//! Cost per layer, with `H <= R` the most current holders of an expert: `O(A log N)` for the
//! counts (`A = R S - N` spare slots); `O(ROUNDS RECEIVERS DONORS N)` for the refinement;
//! `O(N log N + R S (log R + H))` for the packing; for the swaps and shifts at most
//! `SWAP_WORK R S` slot pairs looked at, plus `O(R)` to re-sort the packed ranks after each of
//! at most `R S` steps; `O(S^2 R H)` for the greedy matching (each packed rank counts its
//! shared experts per current rank over its experts' holders, once per level) and at most
//! `AUGMENT_WORK R S` candidate checks of `O(S)` for the augmenting paths. So a rebuilt layer
//! costs `O(N log N + R^2 S + S^2 R H)`, at most `O(N log N + S^2 R^2)`.

use super::*;

/// How much heavier (as a fraction of the mean rank load) a rank that holds an expert now may
/// be than the lightest one and still take the expert's copy, which then costs no fetch.
const STICK: f64 = 0.02;
/// The swaps stop when the heaviest packed rank is within this fraction of the mean load.
const POLISHED: f64 = 0.001;
/// The lightest packed ranks a swap is looked for on (the cost of a swap step at wide EP).
const SWAP_RANKS: usize = 64;
/// Slot pairs the swaps and count shifts may look at, per slot of the layer: a bound on their
/// cost (the DeepSeek-V3 and Kimi-K2 shapes of `BENCHMARKS.md` use at most 15% of it).
const SWAP_WORK: usize = 1024;
/// Rounds of the count refinement.
const ROUNDS: usize = 24;
/// Receivers tried per round: the experts of the larger copies of the heaviest pairs.
const RECEIVERS: usize = 3;
/// Donors tried per receiver: the experts whose load per copy grows least when they lose one.
const DONORS: usize = 8;
/// Candidate checks the matching's augmenting paths may make, per slot of the layer.
const AUGMENT_WORK: usize = 16;
/// No rank (a free heap position).
const NONE: u16 = u16::MAX;

/// Rebuilds `row` (one layer, `[R][S]`, whose holders `layer_state` left in `w.mask`) as a
/// balanced target matched to it, if that lowers the heaviest rank's estimated load and costs
/// at most `budget` fetches (`mean`: the layer's mean rank load, from `layer_state`). Returns
/// the fetches (slots changed), or `None` with `row` untouched.
pub(super) fn construct(
    shape: &Shape,
    w: &mut Work<'_>,
    row: &mut [u16],
    (mean, budget): (f64, usize),
) -> Option<usize> {
    let (n, r, s) = (shape.experts(), shape.ranks(), shape.slots_per_rank());
    let mw = mask_words(shape);
    counts(w, n, r, (r * s).checked_sub(n)?)?;
    order_by_copy(w, n)?;
    if s == 2 {
        refine(w, n, r)?;
    }
    pack(w, r, s, Some((mw, STICK * mean)))?;
    swaps(w, r, s)?;

    let target_max = w.c_load.iter().fold(0.0f64, |m, &x| m.max(x));
    let current_max = w.load.iter().fold(0.0f64, |m, &x| m.max(x));
    if target_max >= current_max {
        return None;
    }
    let fetches = matching(w, s, mw)?;
    if fetches > budget {
        return None;
    }
    for t in 0..r {
        let q = usize::from(*w.c_map.get(t)?);
        let (src, dst) = (
            w.c_tgt.get(t * s..(t + 1) * s)?,
            row.get_mut(q * s..(q + 1) * s)?,
        );
        dst.copy_from_slice(src);
    }
    Some(fetches)
}

/// The estimated load of each copy of `e` with `cnt` copies.
fn per_copy(est: &[f64], cnt: &[u16], e: usize) -> f64 {
    est.get(e).copied().unwrap_or(0.0) / f64::from(cnt.get(e).copied().unwrap_or(1).max(1))
}

/// Phase 1: `w.c_cnt`, one copy each and `spare` more, each to the expert with the largest
/// load per copy (ties to the lower expert), at most `r` copies each (a heap keyed by minus
/// the load per copy, in `w.c_u`). `None` if the spare slots cannot all be given.
fn counts(w: &mut Work<'_>, n: usize, r: usize, spare: usize) -> Option<()> {
    let (est, cnt, heap, key) = (&*w.est, &mut *w.c_cnt, &mut *w.c_ord, &mut *w.c_u);
    cnt.fill(1);
    let mut len = 0;
    for e in 0..n {
        *key.get_mut(e)? = -per_copy(est, cnt, e);
        if r > 1 {
            crate::heap::push(heap, &mut len, e as u16, key);
        }
    }
    for _ in 0..spare {
        let e = usize::from(crate::heap::pop(heap, &mut len, key)?);
        *cnt.get_mut(e)? += 1;
        if usize::from(*cnt.get(e)?) < r {
            *key.get_mut(e)? = -per_copy(est, cnt, e);
            crate::heap::push(heap, &mut len, e as u16, key);
        }
    }
    Some(())
}

/// Phase 2, for two slots per rank: moves copies between experts while that lowers the
/// heaviest pair (see the module documentation). Leaves the refined counts in `w.c_cnt`, with
/// `w.c_u` and `w.c_ord` to match.
///
/// With two slots, longest processing time first pairs the `k`-th largest copy with the
/// `k`-th smallest (the first `R` copies open one rank each; each later copy goes to the
/// lightest open rank, which holds the smallest of them), so a move is valued in `O(N)` by
/// that pairing over the experts' runs of equal copies, without packing, and a walk stops at
/// the first pair that reaches the best so far.
fn refine(w: &mut Work<'_>, n: usize, r: usize) -> Option<()> {
    for _ in 0..ROUNDS {
        let mut best = heaviest_pair(w, r, f64::INFINITY)?;
        let mut pick = None;
        for e in receivers(w, r)?.into_iter().flatten() {
            if usize::from(*w.c_cnt.get(e)?) >= r {
                continue;
            }
            for f in donors(w, n, e).into_iter().flatten() {
                shift_copy(w, e, f)?;
                let max = heaviest_pair(w, r, best);
                shift_copy(w, f, e)?;
                if let Some(m) = max.filter(|&m| m < best) {
                    best = m;
                    pick = Some((e, f));
                }
            }
        }
        let Some((e, f)) = pick else { break };
        shift_copy(w, e, f)?;
    }
    Some(())
}

/// Calls `visit(value, e)` for each run of pairs when the `2R` copies of `w.c_cnt` are paired
/// largest with smallest (in `w.c_ord` order), with `e` the expert of the larger copies,
/// until `visit` returns `true`.
fn pairs(w: &Work<'_>, r: usize, mut visit: impl FnMut(f64, usize) -> bool) -> Option<()> {
    let (ord, cnt, u) = (&*w.c_ord, &*w.c_cnt, &*w.c_u);
    let run = |k: usize| -> Option<(usize, f64, usize)> {
        let e = usize::from(*ord.get(k)?);
        Some((e, *u.get(e)?, usize::from(*cnt.get(e)?)))
    };
    let (mut hi, mut lo) = (0, ord.len().checked_sub(1)?);
    let (mut eh, mut uh, mut left_h) = run(hi)?;
    let (_, mut ul, mut left_l) = run(lo)?;
    let mut pairs = r;
    while pairs > 0 {
        while left_h == 0 {
            hi += 1;
            (eh, uh, left_h) = run(hi)?;
        }
        while left_l == 0 {
            lo = lo.checked_sub(1)?;
            (_, ul, left_l) = run(lo)?;
        }
        if visit(uh + ul, eh) {
            return Some(());
        }
        let m = left_h.min(left_l).min(pairs);
        left_h -= m;
        left_l -= m;
        pairs -= m;
    }
    Some(())
}

/// The heaviest pair, or the first pair found at `bar` or above.
fn heaviest_pair(w: &Work<'_>, r: usize, bar: f64) -> Option<f64> {
    let mut max = f64::MIN;
    pairs(w, r, |v, _| {
        max = max.max(v);
        max >= bar
    })?;
    Some(max)
}

/// The experts of the larger copies of the [`RECEIVERS`] heaviest pairs with distinct such
/// experts, heaviest first (an expert once, at its heaviest pair).
fn receivers(w: &Work<'_>, r: usize) -> Option<[Option<usize>; RECEIVERS]> {
    let mut top: [(f64, Option<usize>); RECEIVERS] = [(f64::MIN, None); RECEIVERS];
    pairs(w, r, |v, eh| {
        let Some(last) = top.last() else { return true };
        if v <= last.0 && !top.iter().any(|&(_, e)| e == Some(eh)) {
            return false;
        }
        if let Some(k) = top.iter().position(|&(x, e)| e == Some(eh) || v > x) {
            // Drop `eh`'s later entry, or the last, and insert at `k`.
            let end = top
                .iter()
                .skip(k)
                .position(|&(_, e)| e == Some(eh))
                .map_or(RECEIVERS - 1, |j| k + j);
            if top.get(k).is_some_and(|&(x, e)| e != Some(eh) || v > x) {
                top.copy_within(k..end, k + 1);
                if let Some(t) = top.get_mut(k) {
                    *t = (v, Some(eh));
                }
            }
        }
        false
    })?;
    Some(top.map(|(_, e)| e))
}

/// Gives `e` one more copy, taken from `f`, and keeps `w.c_u` and `w.c_ord` to match.
fn shift_copy(w: &mut Work<'_>, e: usize, f: usize) -> Option<()> {
    *w.c_cnt.get_mut(f)? = w.c_cnt.get(f)?.checked_sub(1)?;
    *w.c_cnt.get_mut(e)? += 1;
    for x in [e, f] {
        *w.c_u.get_mut(x)? = per_copy(w.est, w.c_cnt, x);
        reposition(w, x)?;
    }
    Some(())
}

/// The [`DONORS`] experts other than `e` with at least two copies whose load per copy grows
/// least when they lose one (ascending; ties to the lower expert).
fn donors(w: &Work<'_>, n: usize, e: usize) -> [Option<usize>; DONORS] {
    let mut out = [None; DONORS];
    let grown = |f: usize| {
        let c = w.c_cnt.get(f).copied().unwrap_or(1);
        w.est.get(f).copied().unwrap_or(0.0) / f64::from(c.saturating_sub(1).max(1))
    };
    for f in 0..n {
        if f == e || w.c_cnt.get(f).copied().unwrap_or(0) < 2 {
            continue;
        }
        let g = grown(f);
        // Insert into the sorted list, dropping the last.
        let mut k = DONORS;
        while k > 0
            && out
                .get(k - 1)
                .copied()
                .flatten()
                .is_none_or(|x| grown(x) > g)
        {
            k -= 1;
        }
        if k < DONORS {
            out.copy_within(k..DONORS - 1, k + 1);
            if let Some(x) = out.get_mut(k) {
                *x = Some(f);
            }
        }
    }
    out
}

/// `w.c_u`, the load per copy of each expert, `w.c_ord`, the experts by it, heaviest first
/// (ties to the lower expert), and their positions `w.c_at`, from scratch.
fn order_by_copy(w: &mut Work<'_>, n: usize) -> Option<()> {
    let (est, cnt, u, ord) = (&*w.est, &*w.c_cnt, &mut *w.c_u, &mut *w.c_ord);
    for e in 0..n {
        *u.get_mut(e)? = per_copy(est, cnt, e);
    }
    for (k, o) in ord.iter_mut().enumerate() {
        *o = k as u16;
    }
    let u = &*u;
    ord.sort_unstable_by(|&x, &y| {
        if first(u, x, y) {
            core::cmp::Ordering::Less
        } else if first(u, y, x) {
            core::cmp::Ordering::Greater
        } else {
            core::cmp::Ordering::Equal
        }
    });
    for (k, &e) in ord.iter().enumerate() {
        *w.c_at.get_mut(usize::from(e))? = k as u16;
    }
    Some(())
}

/// Moves expert `x`, whose key in `w.c_u` changed, to its place in `w.c_ord` (positions in
/// `w.c_at`).
fn reposition(w: &mut Work<'_>, x: usize) -> Option<()> {
    let (u, ord, at) = (&*w.c_u, &mut *w.c_ord, &mut *w.c_at);
    let mut k = usize::from(*at.get(x)?);
    let xs = x as u16;
    while k > 0 && first(u, xs, *ord.get(k - 1)?) {
        let y = *ord.get(k - 1)?;
        *ord.get_mut(k)? = y;
        *at.get_mut(usize::from(y))? = k as u16;
        k -= 1;
    }
    while k + 1 < ord.len() && first(u, *ord.get(k + 1)?, xs) {
        let y = *ord.get(k + 1)?;
        *ord.get_mut(k)? = y;
        *at.get_mut(usize::from(y))? = k as u16;
        k += 1;
    }
    *ord.get_mut(k)? = xs;
    *at.get_mut(x)? = k as u16;
    Some(())
}

/// Whether expert `x` goes before `y` in `w.c_ord`: more load per copy, ties to the lower.
fn first(u: &[f64], x: u16, y: u16) -> bool {
    let (ux, uy) = (
        u.get(usize::from(x)).copied().unwrap_or(0.0),
        u.get(usize::from(y)).copied().unwrap_or(0.0),
    );
    ux.total_cmp(&uy).then(y.cmp(&x)).is_gt()
}

/// Phase 3: packs `w.c_cnt` copies into `w.c_tgt` (`[R][S]`, packed rank-major), with the
/// packed ranks' loads in `w.c_load`; with `stick = Some((mw, tol))` a rank that holds the
/// expert now (in `w.mask`) takes its copy when within `tol` of the lightest. Returns the
/// heaviest packed rank's load, or `None` when some copy finds no rank.
fn pack(w: &mut Work<'_>, r: usize, s: usize, stick: Option<(usize, f64)>) -> Option<f64> {
    let (cnt, u, ord) = (&*w.c_cnt, &*w.c_u, &*w.c_ord);
    let (load, fill, heap, pos, held) = (
        &mut *w.c_load,
        &mut *w.c_fill,
        &mut *w.c_heap,
        &mut *w.c_pos,
        &mut *w.c_hold,
    );
    load.fill(0.0);
    fill.fill(0);
    // A min-heap of the ranks with room, by load (ties to the lower rank), with positions.
    for (k, (h, p)) in heap.iter_mut().zip(pos.iter_mut()).enumerate() {
        *h = k as u16;
        *p = k as u16;
    }
    let mut len = r;
    let mut top = 0.0f64;
    for &e in ord.iter() {
        let e = usize::from(e);
        let ue = u.get(e).copied().unwrap_or(0.0);
        let mut nheld = 0;
        for _ in 0..cnt.get(e).copied().unwrap_or(0) {
            let lightest = usize::from(*heap.first().filter(|_| len > 0)?);
            let mut q = lightest;
            if let Some((mw, tol)) = stick {
                // A current holder with room, within `tol` of the lightest and not above the
                // heaviest rank so far once it takes the copy: no fetch.
                let ll = load.get(lightest).copied().unwrap_or(0.0);
                let mut bar = (ll + tol).min(top.max(ll + ue) - ue);
                for h in ranks_holding(w.mask, mw, e) {
                    let lh = load.get(h).copied().unwrap_or(f64::INFINITY);
                    if pos.get(h).is_some_and(|&p| p != NONE) && lh < bar {
                        bar = lh;
                        q = h;
                    }
                }
            }
            top = top.max(load.get(q).copied().unwrap_or(0.0) + ue);
            // Take q out of the heap; it sits out until e's copies are placed.
            let at = usize::from(*pos.get(q)?);
            len -= 1;
            heap.swap(at, len);
            *pos.get_mut(usize::from(*heap.get(at)?))? = at as u16;
            *pos.get_mut(q)? = NONE;
            if at < len {
                fix(heap, pos, len, at, load);
            }
            let k = usize::from(*fill.get(q)?);
            *w.c_tgt.get_mut(q * s + k)? = e as u16;
            *fill.get_mut(q)? += 1;
            *load.get_mut(q)? += ue;
            if usize::from(*fill.get(q)?) < s {
                *held.get_mut(nheld)? = q as u16;
                nheld += 1;
            }
        }
        for &q in held.get(..nheld)? {
            *heap.get_mut(len)? = q;
            *pos.get_mut(usize::from(q))? = len as u16;
            len += 1;
            fix(heap, pos, len, len - 1, load);
        }
    }
    Some(load.iter().fold(0.0f64, |m, &x| m.max(x)))
}

/// Phase 4: swaps copies of `w.c_tgt` between the heaviest packed rank and a lighter one, the
/// best swap each time, and shifts a copy to an expert of the heaviest rank when no swap helps
/// (module documentation), until the heaviest is within [`POLISHED`] of the mean or neither
/// lowers it; at most `R S` steps. Keeps `w.c_load`, `w.c_cnt` and `w.c_u`; sorts the packed
/// ranks by load in `w.c_rord`, which the matching then resets.
fn swaps(w: &mut Work<'_>, r: usize, s: usize) -> Option<()> {
    let mean = w.c_load.iter().sum::<f64>() / r as f64;
    sort_packed(w, r)?;
    // Slot pairs the swaps and shifts may look at, in all.
    let mut work = SWAP_WORK * r * s;
    for _ in 0..r * s {
        let h = usize::from(*w.c_rord.last()?);
        let lh = *w.c_load.get(h)?;
        if lh <= mean * (1.0 + POLISHED) || work == 0 {
            break;
        }
        if let Some((i, t, j)) = best_swap(w, h, s, &mut work) {
            let (tgt, load, u) = (&mut *w.c_tgt, &mut *w.c_load, &*w.c_u);
            let (a, b) = (*tgt.get(h * s + i)?, *tgt.get(t * s + j)?);
            let d = *u.get(usize::from(a))? - *u.get(usize::from(b))?;
            *tgt.get_mut(h * s + i)? = b;
            *tgt.get_mut(t * s + j)? = a;
            *load.get_mut(h)? -= d;
            *load.get_mut(t)? += d;
            resort_packed(w, r, t)?;
        } else if work >= 3 * r * s * s && shift(w, r, s, h)? {
            work -= 3 * r * s * s;
            sort_packed(w, r)?;
        } else {
            break;
        }
    }
    Some(())
}

/// The packed ranks by load, lightest first (ties to the lower rank), in `w.c_rord`.
fn sort_packed(w: &mut Work<'_>, r: usize) -> Option<()> {
    let (load, ord) = (&*w.c_load, &mut *w.c_rord);
    for (k, o) in ord.iter_mut().take(r).enumerate() {
        *o = k as u16;
    }
    ord.sort_unstable_by(|&x, &y| {
        let l = |k: u16| load.get(usize::from(k)).copied().unwrap_or(0.0);
        l(x).total_cmp(&l(y)).then(x.cmp(&y))
    });
    Some(())
}

/// [`sort_packed`] again after a swap lowered the heaviest rank (last) and raised rank `t`:
/// each moves by insertion.
fn resort_packed(w: &mut Work<'_>, r: usize, t: usize) -> Option<()> {
    let (load, ord) = (&*w.c_load, &mut *w.c_rord);
    let before = |x: u16, y: u16| lighter(load, x, y);
    let mut m = r.checked_sub(1)?;
    while m > 0 && before(*ord.get(m)?, *ord.get(m - 1)?) {
        ord.swap(m, m - 1);
        m -= 1;
    }
    let mut m = ord.iter().position(|&k| usize::from(k) == t)?;
    while m + 1 < r && before(*ord.get(m + 1)?, *ord.get(m)?) {
        ord.swap(m, m + 1);
        m += 1;
    }
    Some(())
}

/// The swap of a copy of the heaviest packed rank `h` with a smaller copy on a lighter rank
/// that lowers the larger of the two loads most: `(slot of h, rank, slot)`. Lighter ranks are
/// scanned lightest first, until one whose midpoint with `h` is no better than the best.
fn best_swap(w: &Work<'_>, h: usize, s: usize, work: &mut usize) -> Option<(usize, usize, usize)> {
    let (tgt, load, u, ord) = (&*w.c_tgt, &*w.c_load, &*w.c_u, &*w.c_rord);
    let lh = *load.get(h)?;
    let (mut bar, mut pick) = (lh, None);
    let hrow = tgt.get(h * s..(h + 1) * s)?;
    for &t in ord.iter().take(SWAP_RANKS) {
        let t = usize::from(t);
        let lt = *load.get(t)?;
        // No swap with t (or a heavier rank) can take the pair below the middle.
        if t == h || 0.5 * (lh + lt) >= bar || *work < s * s {
            break;
        }
        *work -= s * s;
        let trow = tgt.get(t * s..(t + 1) * s)?;
        for (i, &a) in hrow.iter().enumerate() {
            let ua = u.get(usize::from(a)).copied().unwrap_or(0.0);
            for (j, &b) in trow.iter().enumerate() {
                let d = ua - u.get(usize::from(b)).copied().unwrap_or(f64::INFINITY);
                // (A swap that would hold an expert twice is rare: checked last.)
                if d > 0.0 && (lh - d).max(lt + d) < bar && !trow.contains(&a) && !hrow.contains(&b)
                {
                    bar = (lh - d).max(lt + d);
                    pick = Some((i, t, j));
                }
            }
        }
    }
    pick
}

/// Shifts one copy to an expert `e` of the heaviest packed rank `h` from an expert `f` with a
/// copy to spare: `f`'s copy on a rank `t` that does not hold `e` becomes a copy of `e`, so
/// every copy of `e` shrinks and every copy of `f` grows. Takes the shift whose heaviest rank
/// afterwards, bounded from above, is lowest, if below `h`'s load. Whether it shifted.
fn shift(w: &mut Work<'_>, r: usize, s: usize, h: usize) -> Option<bool> {
    let lh = *w.c_load.get(h)?;
    // Per expert, its heaviest and second heaviest holder's load, and the heaviest holder.
    {
        let (tgt, load, top, arg) = (&*w.c_tgt, &*w.c_load, &mut *w.c_top, &mut *w.c_arg);
        top.fill(f64::MIN);
        for (k, &e) in tgt.iter().enumerate().take(r * s) {
            let (e, t) = (usize::from(e), k / s);
            let l = *load.get(t)?;
            let (t1, t2) = (*top.get(2 * e)?, *top.get(2 * e + 1)?);
            if l > t1 {
                *top.get_mut(2 * e + 1)? = t1;
                *top.get_mut(2 * e)? = l;
                *arg.get_mut(e)? = t as u16;
            } else if l > t2 {
                *top.get_mut(2 * e + 1)? = l;
            }
        }
    }
    let (tgt, load, u, cnt, ord, on_e) = (
        &*w.c_tgt,
        &*w.c_load,
        &*w.c_u,
        &*w.c_cnt,
        &*w.c_rord,
        &mut *w.c_hold,
    );
    let (top, arg, est) = (&*w.c_top, &*w.c_arg, &*w.est);
    // The best shift: (bound on the heaviest rank after it, e, rank t, slot of t).
    let mut best: Option<(f64, u16, usize, usize)> = None;
    for &e in tgt.get(h * s..(h + 1) * s)? {
        let ce = *cnt.get(usize::from(e))?;
        if usize::from(ce) >= r {
            continue;
        }
        let we = *est.get(usize::from(e))?;
        let (ue, ue_new) = (*u.get(usize::from(e))?, we / f64::from(ce + 1));
        // The holders of e, and the heaviest of them after e's copies shrink.
        on_e.fill(0);
        let mut e_after = f64::MIN;
        for (k, &x) in tgt.iter().enumerate().take(r * s) {
            if x == e {
                *on_e.get_mut(k / s)? = 1;
                e_after = e_after.max(*load.get(k / s)? - (ue - ue_new));
            }
        }
        // The heaviest rank that does not hold e, at its load now (f's holders' growth and
        // the receiving rank are counted per shift below).
        let mut rest = f64::MIN;
        for &k in ord.iter().rev() {
            if *on_e.get(usize::from(k))? == 0 {
                rest = *load.get(usize::from(k))?;
                break;
            }
        }
        let floor = e_after.max(rest);
        if floor >= best.map_or(lh, |b| b.0) {
            continue;
        }
        for (k, &f) in tgt.iter().enumerate().take(r * s) {
            let (fi, t) = (usize::from(f), k / s);
            let cf = *cnt.get(fi)?;
            if f == e || cf < 2 || *on_e.get(t)? != 0 {
                continue;
            }
            let (wf, uf) = (*est.get(fi)?, *u.get(fi)?);
            let grow = wf / f64::from(cf - 1) - uf;
            // f's other holders grow (an upper bound where one also holds e); t trades f's
            // copy for e's.
            let others = if usize::from(*arg.get(fi)?) == t {
                *top.get(2 * fi + 1)?
            } else {
                *top.get(2 * fi)?
            };
            let after = floor.max(others + grow).max(*load.get(t)? - uf + ue_new);
            if after < best.map_or(lh, |b| b.0) {
                best = Some((after, e, t, k % s));
            }
        }
    }
    let Some((_, e, t, j)) = best else {
        return Some(false);
    };
    let f = usize::from(*w.c_tgt.get(t * s + j)?);
    *w.c_tgt.get_mut(t * s + j)? = e;
    let e = usize::from(e);
    *w.c_cnt.get_mut(e)? += 1;
    *w.c_cnt.get_mut(f)? -= 1;
    for x in [e, f] {
        *w.c_u.get_mut(x)? = per_copy(w.est, w.c_cnt, x);
    }
    let (tgt, load, u) = (&*w.c_tgt, &mut *w.c_load, &*w.c_u);
    load.fill(0.0);
    for (k, &x) in tgt.iter().enumerate().take(r * s) {
        *load.get_mut(k / s)? += *u.get(usize::from(x))?;
    }
    Some(true)
}

/// Whether rank `a` goes before rank `b` in the packing heap: lighter, ties to the lower rank.
fn lighter(load: &[f64], a: u16, b: u16) -> bool {
    let l = |x: u16| load.get(usize::from(x)).copied().unwrap_or(f64::INFINITY);
    l(a).total_cmp(&l(b)).then(a.cmp(&b)).is_lt()
}

/// Restores the heap order around position `at` (up, then down), keeping `pos`.
fn fix(heap: &mut [u16], pos: &mut [u16], len: usize, mut at: usize, load: &[f64]) {
    while at > 0 {
        let up = (at - 1) / 2;
        let (Some(&x), Some(&y)) = (heap.get(at), heap.get(up)) else {
            return;
        };
        if !lighter(load, x, y) {
            break;
        }
        heap.swap(at, up);
        set_pos(pos, heap, at);
        set_pos(pos, heap, up);
        at = up;
    }
    loop {
        let (l, rt) = (2 * at + 1, 2 * at + 2);
        let mut m = at;
        for c in [l, rt] {
            if c < len
                && let (Some(&x), Some(&y)) = (heap.get(c), heap.get(m))
                && lighter(load, x, y)
            {
                m = c;
            }
        }
        if m == at {
            return;
        }
        heap.swap(at, m);
        set_pos(pos, heap, at);
        set_pos(pos, heap, m);
        at = m;
    }
}

fn set_pos(pos: &mut [u16], heap: &[u16], at: usize) {
    if let Some(&x) = heap.get(at)
        && let Some(p) = pos.get_mut(usize::from(x))
    {
        *p = at as u16;
    }
}

/// Phase 5: maps each packed rank `t` to a current rank `w.c_map[t]` (module documentation).
/// Returns the fetches: the packed experts the matched rank does not hold now.
fn matching(w: &mut Work<'_>, s: usize, mw: usize) -> Option<usize> {
    let tl = &*w.c_load;
    let m = Match {
        mask: w.mask,
        tgt: w.c_tgt,
        mw,
        s,
    };
    let (tord, map, owner, keep) = (
        &mut *w.c_rord,
        &mut *w.c_map,
        &mut *w.c_fill,
        &mut *w.c_keep,
    );
    for (k, o) in tord.iter_mut().enumerate() {
        *o = k as u16;
    }
    tord.sort_unstable_by(|&x, &y| {
        let load = |k: u16| tl.get(usize::from(k)).copied().unwrap_or(0.0);
        load(y).total_cmp(&load(x)).then(x.cmp(&y))
    });
    map.fill(NONE);
    owner.fill(NONE);
    keep.fill(0);
    // Greedy by levels: the packed ranks that keep all S experts first.
    let (shared, touched) = (&mut *w.c_pos, &mut *w.c_hold);
    shared.fill(0);
    for level in (1..=s).rev() {
        for &t in tord.iter() {
            let t = usize::from(t);
            if *map.get(t)? != NONE {
                continue;
            }
            // The free current rank sharing most (ties to the lower rank).
            let (mut pick, mut most) = (None, 0usize);
            let n = m.count_shared(t, shared, touched)?;
            for &q in touched.get(..n)? {
                let q = usize::from(q);
                let c = usize::from(core::mem::take(shared.get_mut(q)?));
                let free = owner.get(q).is_some_and(|&o| o == NONE);
                if free && (c > most || (c == most && pick.is_some_and(|p| q < p))) {
                    most = c;
                    pick = Some(q);
                }
            }
            if let Some(q) = pick.filter(|_| most >= level) {
                *owner.get_mut(q)? = t as u16;
                *map.get_mut(t)? = q as u16;
                *keep.get_mut(t)? = most as u16;
            }
        }
    }
    // Augmenting paths: a packed rank left without a sharing rank takes one from a packed rank
    // that moves, without keeping fewer, to another (breadth first; each path gains a keep).
    // The searches share a budget of candidate checks, so the bound stays O(R S^2 H).
    let (queue, seen, prev) = (&mut *w.c_hold, &mut *w.c_pos, &mut *w.c_heap);
    seen.fill(0);
    let mut stamp = 0u16;
    let mut work = AUGMENT_WORK * tord.len() * s;
    for &t0 in tord.iter() {
        let t0 = usize::from(t0);
        if *map.get(t0)? != NONE {
            continue;
        }
        if work == 0 {
            break;
        }
        stamp = stamp.checked_add(1)?;
        *queue.first_mut()? = t0 as u16;
        *seen.get_mut(t0)? = stamp;
        let (mut head, mut tail) = (0, 1);
        let mut found = None;
        while head < tail && found.is_none() {
            let t = usize::from(*queue.get(head)?);
            head += 1;
            let need = usize::from(*keep.get(t)?).max(1);
            let at = *map.get(t)?;
            m.candidates(t, |q, shared| {
                if work == 0 {
                    return true;
                }
                work -= 1;
                if shared < need || usize::from(at) == q {
                    return false;
                }
                let Some(&o) = owner.get(q) else { return false };
                if o == NONE {
                    found = Some((t, q));
                    return true;
                }
                let o = usize::from(o);
                if seen.get(o).is_some_and(|&x| x != stamp)
                    && let (Some(x), Some(p), Some(slot)) =
                        (seen.get_mut(o), prev.get_mut(o), queue.get_mut(tail))
                {
                    *x = stamp;
                    *p = t as u16;
                    *slot = o as u16;
                    tail += 1;
                }
                false
            })?;
        }
        // Walk the path back: each packed rank takes the rank it reached, its old one goes on.
        if let Some((mut t, mut q)) = found {
            loop {
                let old = *map.get(t)?;
                *map.get_mut(t)? = q as u16;
                *owner.get_mut(q)? = t as u16;
                *keep.get_mut(t)? = m.shared(t, q) as u16;
                if t == t0 {
                    break;
                }
                q = usize::from(old);
                t = usize::from(*prev.get(t)?);
            }
        }
    }
    // The rest, heaviest first, to the free ranks in order.
    let mut next = 0;
    for &t in tord.iter() {
        let t = usize::from(t);
        if *map.get(t)? != NONE {
            continue;
        }
        while *owner.get(next)? != NONE {
            next += 1;
        }
        *owner.get_mut(next)? = t as u16;
        *map.get_mut(t)? = next as u16;
    }
    Some(keep.iter().map(|&k| s - usize::from(k).min(s)).sum())
}

/// The packed ranks and the current holders, for the matching.
struct Match<'m> {
    mask: &'m [u64],
    tgt: &'m [u16],
    mw: usize,
    s: usize,
}

impl Match<'_> {
    /// The experts of packed rank `t` that current rank `q` holds.
    fn shared(&self, t: usize, q: usize) -> usize {
        let experts = self.tgt.get(t * self.s..(t + 1) * self.s).unwrap_or(&[]);
        experts
            .iter()
            .filter(|&&x| holds(self.mask, self.mw, usize::from(x), q))
            .count()
    }

    /// Counts in `shared[q]` (all zero on entry) the experts of packed rank `t` that each
    /// current rank `q` holds, and lists those ranks in `touched`: returns how many.
    fn count_shared(&self, t: usize, shared: &mut [u16], touched: &mut [u16]) -> Option<usize> {
        let (mut n, mut fits) = (0, true);
        self.holders(t, |q| {
            let Some(c) = shared.get_mut(q) else {
                fits = false;
                return true;
            };
            if *c == 0 {
                let Some(x) = touched.get_mut(n) else {
                    fits = false;
                    return true;
                };
                *x = q as u16;
                n += 1;
            }
            *c += 1;
            false
        })?;
        fits.then_some(n)
    }

    /// Calls `f(q, shared)` for each current rank `q` holding an expert of packed rank `t`
    /// (once per such expert), until `f` returns `true`.
    fn candidates(&self, t: usize, mut f: impl FnMut(usize, usize) -> bool) -> Option<()> {
        self.holders(t, |q| f(q, self.shared(t, q)))
    }

    /// Calls `f(q)` for each current rank `q` holding an expert of packed rank `t` (once per
    /// such expert), until `f` returns `true`.
    fn holders(&self, t: usize, mut f: impl FnMut(usize) -> bool) -> Option<()> {
        for &e in self.tgt.get(t * self.s..(t + 1) * self.s)? {
            let e = usize::from(e);
            for q in ranks_holding(self.mask, self.mw, e) {
                if f(q) {
                    return Some(());
                }
            }
        }
        Some(())
    }
}
