//! The local search from the current placement (module documentation, "Algorithm" step 3).

use super::*;

#[cfg(test)]
std::thread_local! {
    /// Turns the slot filter off on this thread, so tests can check that it changes nothing.
    pub(super) static UNFILTERED: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Whether the slot filter runs (always, outside this module's tests).
pub(super) fn filtering() -> bool {
    #[cfg(test)]
    {
        !UNFILTERED.with(core::cell::Cell::get)
    }
    #[cfg(not(test))]
    {
        true
    }
}

/// A candidate move of one search step, from the heaviest rank `p` to partner `q`.
#[derive(Clone, Copy)]
pub(super) struct Candidate {
    /// How much it lowers `p`'s value (the bar every touched rank must end below) per fetch.
    gain: f64,
    /// The slot of `p` whose expert moves (a swap) or is copied (a replicate).
    i: usize,
    /// The partner rank.
    q: usize,
    /// The slot of `q` that is overwritten (a swap sends its expert to `p`'s slot `i`).
    j: usize,
    /// Weight fetches: 1 for a replicate, 2 for a swap.
    fetches: usize,
    /// A swap (else a replicate over a copy that has another holder).
    swap: bool,
}

/// The local search on one layer `row` (`[R][S]`), in place, in named phases: the layer's
/// state ([`layer_state`]), then per step the rank order, the partner table (kept per rank and
/// refreshed where the last move changed it, [`refresh`], then gathered in partner order,
/// [`gather`]), the movers ([`movers_by_load`]), the best move ([`best_move`]) and its
/// application ([`apply`]), until no move pays or the budget is spent ([`descend`]). A
/// layer past `cold_start` times the mean is rebuilt instead ([`construct`]), and so is one
/// the search leaves stalled far from balance when the rebuild is clearly better.
pub(super) fn search(
    shape: &Shape,
    p: &Params,
    w: &mut Work<'_>,
    row: &mut [u16],
    fetches_left: usize,
) {
    let (r, s) = (shape.ranks(), shape.slots_per_rank());
    if r < 2 {
        return;
    }
    let Some(mean) = layer_state(shape, p.z, w, row) else {
        return;
    };
    let budget = ((p.max_fetch_fraction * (r * s) as f64) as usize)
        .max(2)
        .min(fetches_left);
    let partners = p.partners.clamp(1, r - 1);
    let kz = if w.t < 2 {
        0.0
    } else {
        p.z * p.z / (w.t - 1) as f64
    };
    // z over the root of T - 1: the spread term of a value per unit of centered-load norm.
    let zp = libm::sqrt(kz);
    // The cold start: a layer far from balance is rebuilt; the search polishes it from the
    // next call on.
    let heaviest = w.load.iter().fold(0.0f64, |m, &x| m.max(x));
    if heaviest > p.cold_start * mean && construct(shape, w, row, (mean, budget)).is_some() {
        return;
    }
    // A layer the search leaves stalled far from balance (single moves cannot repair it) is
    // rebuilt from where it started, when the rebuild is clearly better.
    let rescue = p.cold_start.is_finite() && w.c_old.len() == row.len();
    if rescue {
        w.c_old.copy_from_slice(row);
    }
    descend(shape, p, w, row, (mean, budget, partners, kz, zp));
    let stalled = w.load.iter().fold(0.0f64, |m, &x| m.max(x));
    if rescue && stalled > STALLED * mean && w.c_res.len() == row.len() {
        w.c_res.copy_from_slice(row);
        row.copy_from_slice(w.c_old);
        let rebuilt = layer_state(shape, p.z, w, row).is_some()
            && construct(shape, w, row, (mean, budget)).is_some()
            && w.c_load.iter().fold(0.0f64, |m, &x| m.max(x)) * CLEARLY < stalled;
        if !rebuilt {
            row.copy_from_slice(w.c_res);
        }
    }
}

/// A layer whose heaviest rank the search leaves above this multiple of the mean is stalled.
const STALLED: f64 = 1.2;
/// A stalled layer is rebuilt when the rebuild's heaviest rank is lower by this factor.
const CLEARLY: f64 = 1.1;

/// Phase 2 to 5, step after step: the moves that pay, until none does or the budget is spent.
fn descend(
    shape: &Shape,
    p: &Params,
    w: &mut Work<'_>,
    row: &mut [u16],
    (mean, budget, partners, kz, zp): (f64, usize, usize, f64, f64),
) {
    let (r, s) = (shape.ranks(), shape.slots_per_rank());
    let mut fetched = 0usize;
    let ranks = w.rr;
    // Each accepted move lowers the sorted value vector; the cap is a safety net.
    let mut first = true;
    stale_all(w);
    for _ in 0..4 * r * s {
        sort_ranks(w, first);
        first = false;
        let Some(&heavy) = w.order.last() else { return };
        let hp = usize::from(heavy);
        let st = Step {
            rr: &ranks,
            s,
            mw: mask_words(shape),
            partners,
            hp,
            lp: w.val.get(hp).copied().unwrap_or(0.0),
            lp_mu: w.load.get(hp).copied().unwrap_or(0.0),
            syy_p: w.syy.get(hp).copied().unwrap_or(0.0),
            floor_gain: p.min_gain * mean,
            mean,
            kz,
            zp,
            budget,
            fetched,
        };
        w.cp.fill(f64::NAN);
        refresh(w, row, st.mw, zp);
        gather(w, row, &st);
        let (slots, ns) = movers_by_load(w, row, hp, s);
        let movers = slots.get(..ns.min(p.movers.max(1))).unwrap_or(&[]);
        let Some(best) = best_move(w, row, p, &st, movers) else {
            return;
        };
        if !apply(w, row, p.z, &st, best) {
            return;
        }
        fetched += best.fetches;
    }
}

/// What a step knows: the layer's sizes and budget, and the heaviest rank `hp`.
#[derive(Clone, Copy)]
pub(super) struct Step<'r> {
    /// The rank count and its tabulated shares (a copy of `w.rr`, borrowed: the phases ask
    /// for shares while they change `w`).
    pub(super) rr: &'r Ranks,
    /// Slots per rank.
    pub(super) s: usize,
    /// Bitset words per expert.
    pub(super) mw: usize,
    /// The lightest ranks tried as partners.
    pub(super) partners: usize,
    /// The heaviest rank, its value, its load and the sum of its squared centered loads.
    pub(super) hp: usize,
    pub(super) lp: f64,
    pub(super) lp_mu: f64,
    pub(super) syy_p: f64,
    /// The least gain per fetch a move must bring (`min_gain` times the mean rank load).
    pub(super) floor_gain: f64,
    /// The mean rank load.
    pub(super) mean: f64,
    /// `z^2 / (T - 1)`, and its root: the spread term per unit of centered-load norm.
    pub(super) kz: f64,
    pub(super) zp: f64,
    /// The layer's fetch budget and the fetches taken so far.
    pub(super) budget: usize,
    pub(super) fetched: usize,
}

/// Phase 1, once per layer: the holder bitsets and copy counts of `row`, the rank loads and
/// centered per-window rank loads under log2phy, the rank values and the experts' sums.
/// Returns the mean rank load, or `None` for a layer without load.
fn layer_state(shape: &Shape, z: f64, w: &mut Work<'_>, row: &[u16]) -> Option<f64> {
    let (r, s, n) = (shape.ranks(), shape.slots_per_rank(), shape.experts());
    let ranks = w.rr;
    let rr = &ranks;
    let mw = mask_words(shape);

    w.mask.fill(0);
    w.copies.fill(0);
    for (rank, rr) in row.chunks_exact(s).enumerate() {
        for &e in rr {
            let e = usize::from(e);
            if !holds(w.mask, mw, e, rank) {
                set_holder(w.mask, mw, e, rank, true);
                if let Some(c) = w.copies.get_mut(e) {
                    *c += 1;
                }
            }
        }
    }
    // Rank loads and centered per-window rank loads under log2phy.
    w.load.fill(0.0);
    w.y.fill(0.0);
    w.dmu.fill(0.0);
    w.da.fill(0.0);
    w.db.fill(0.0);
    let (t, stride) = (w.t, w.stride);
    for e in 0..n {
        let we = w.est.get(e).copied().unwrap_or(0.0);
        let words = w.mask.get(e * mw..(e + 1) * mw).unwrap_or(&[]);
        let d: usize = words.iter().map(|m| m.count_ones() as usize).sum();
        for (j, rank) in ranks_holding(w.mask, mw, e).enumerate() {
            let sh = share(rr, d, j);
            if let Some(x) = w.load.get_mut(rank) {
                *x += we * sh;
            }
            if let Some(y) = w.y.get_mut(rank * stride..rank * stride + t) {
                for (i, yi) in y.iter_mut().enumerate() {
                    *yi += sh * w.xc.get(e * stride + i).copied().unwrap_or(0.0);
                }
            }
        }
    }
    let total: f64 = w.load.iter().sum();
    if total <= 0.0 {
        return None;
    }
    let mean = total / r as f64;
    for rank in 0..r {
        w.renew_value(rank, z);
    }
    for e in 0..n {
        let g = w.dot_x(e, e);
        if let Some(x) = w.gd.get_mut(e) {
            *x = g;
        }
        if let Some(x) = w.nx.get_mut(e) {
            *x = libm::sqrt(g.max(0.0));
        }
    }
    Some(mean)
}

/// Phase 3: the heaviest rank's slots by expert load, heaviest first (the first `S`, at
/// most 64, entries).
fn movers_by_load(w: &Work<'_>, row: &[u16], hp: usize, s: usize) -> ([u16; 64], usize) {
    let mut slots = [0u16; 64];
    let ns = s.min(slots.len());
    for (k, x) in slots.iter_mut().take(ns).enumerate() {
        *x = k as u16;
    }
    if let Some(sl) = slots.get_mut(..ns) {
        let est = &*w.est;
        let load_of = |k: u16| {
            row.get(hp * s + usize::from(k))
                .and_then(|&e| est.get(usize::from(e)))
                .copied()
                .unwrap_or(0.0)
        };
        sl.sort_unstable_by(|&x, &y| load_of(y).total_cmp(&load_of(x)).then(x.cmp(&y)));
    }
    (slots, ns)
}

/// Phase 4: the move of one of `movers` (slots of the heaviest rank) with a partner slot that
/// lowers the heaviest rank most per fetch, if one pays.
fn best_move(
    w: &mut Work<'_>,
    row: &[u16],
    p: &Params,
    st: &Step<'_>,
    movers: &[u16],
) -> Option<Candidate> {
    let Step {
        s,
        mw,
        hp,
        lp,
        lp_mu,
        syy_p,
        floor_gain,
        ..
    } = *st;
    let rr = st.rr;
    let mut best: Option<Candidate> = None;

    let need_of = |best: &Option<Candidate>| best.map_or(floor_gain, |c| c.gain.max(floor_gain));
    for &i in movers {
        let i = usize::from(i);
        let Some(&a) = row.get(hp * s + i) else { break };
        let a = usize::from(a);
        let wa = w.est.get(a).copied().unwrap_or(0.0);
        if wa <= 0.0 {
            continue;
        }
        let ca = usize::from(w.copies.get(a).copied().unwrap_or(1)).max(1);
        let spa = share_of(w.mask, mw, rr, a, hp);
        // No move of a can take p below what it holds without a: skip a when that is not
        // below the bar of the cheapest move.
        if lp_mu - wa * spa >= lp - need_of(&best) {
            continue;
        }
        let a_min_new = share(rr, ca + 1, ca);
        let a_below_p = below(w.mask, mw, a, hp);
        let gaa = w.gd.get(a).copied().unwrap_or(0.0);
        let cpa = w.cp_of(hp, a);
        let nxa = w.nx.get(a).copied().unwrap_or(0.0);
        w.a_built = 0;
        let mut n_below = 0u16;
        for (rank, x) in w.abl.iter_mut().enumerate() {
            *x = n_below;
            n_below += u16::from(holds(w.mask, mw, a, rank));
        }
        // The norm of p's centered loads without a (what a swap leaves before b comes).
        let nv = libm::sqrt((syy_p - 2.0 * spa * cpa + spa * spa * gaa).max(0.0));
        // p's change, load and value after a replicate of a, by the side of the partner
        // (exact without b on p, which the slots check).
        let mut rep_p = [(0.0, f64::MIN, f64::MIN); 2];
        for (side, x) in rep_p.iter_mut().enumerate() {
            let ds = share(rr, ca + 1, a_below_p + side) - spa;
            if ds != 0.0 {
                let mu = lp_mu + wa * ds;
                let var = w.var_of(syy_p, (cpa, 0.0), (gaa, 0.0, 0.0), ds, 0.0);
                *x = (ds, mu, value(mu, var, p.z));
            }
        }
        let m = Mover {
            i,
            a,
            wa,
            ca,
            spa,
            a_min_new,
            gaa,
            cpa,
            nxa,
            nv,
            rep_p,
        };
        // The slot filter: every move of a over a partner slot is bounded from below by
        // sums of a term of a and a term of the slot (the loads, and the triangle
        // inequality on the spreads, on each side), so one pass over the slots drops the
        // ones that cannot beat the bar; the rest go through the checks below, in order.
        let exempt = if ca >= 2 {
            exempt_shared(w, row, st, a)
        } else {
            0
        };
        let nsurv = filter_slots(w, st, &m, need_of(&best));
        restore_exempt(w, exempt);
        let mut si = 0usize;
        while si < nsurv {
            let qi = w.surv.get(si).map_or(0, |&k| k >> 16);
            let group = si;
            while si < nsurv && w.surv.get(si).map_or(0, |&k| k >> 16) == qi {
                si += 1;
            }
            let qi = qi as usize;
            let Some(&q) = w.order.get(qi) else { break };
            let q = usize::from(q);
            partner_moves(w, row, p, st, &m, (qi, q, group, si), &mut best);
        }
    }
    best
}

/// One mover of a step: slot `i` of the heaviest rank `p`, its expert `a`, and what every
/// move of `a` shares.
#[derive(Clone, Copy)]
struct Mover {
    /// The slot of `p` and its expert.
    i: usize,
    a: usize,
    /// `a`'s estimated load, its copies and its share on `p`.
    wa: f64,
    ca: usize,
    spa: f64,
    /// The share of `a`'s new holder after a replicate, as its last holder.
    a_min_new: f64,
    /// `sum x_a^2`, `sum y_p x_a` and the norm of `a`'s centered samples.
    gaa: f64,
    cpa: f64,
    nxa: f64,
    /// The norm of `p`'s centered loads without `a`.
    nv: f64,
    /// `p`'s share change, load and value after a replicate of `a`, by the partner's side.
    rep_p: [(f64, f64, f64); 2],
}

/// A replicate over a spare copy of `b` leaves `b`'s other holders at their leave load
/// (`rep_mu`), which must end below the bar, unless a rank holds `b` and the mover `a` both
/// (the heaviest rank, or another holder of `a`): there `a`'s change may offset `b`'s, and the
/// checks score the move whole. So for a mover with other copies, the slots of the experts on
/// `a`'s holders get no leave-load term in the filter (`-inf`, their values saved in
/// `w.ex_slot` / `w.ex_val`); returns how many were set aside.
fn exempt_shared(w: &mut Work<'_>, row: &[u16], st: &Step<'_>, a: usize) -> usize {
    let (s, mw, hp, partners) = (st.s, st.mw, st.hp, st.partners);
    // Each expert once: a stamp per mover (the marks start cleared with each call's scratch,
    // whatever the caller left in it).
    if w.ex_stamp == 0 || w.ex_stamp == u32::MAX {
        w.ex_mark.fill(0);
        w.ex_stamp = 0;
    }
    w.ex_stamp += 1;
    let mask = &*w.mask;
    let mut n = 0usize;
    for h in ranks_holding(mask, mw, a) {
        for &e in row.get(h * s..(h + 1) * s).unwrap_or(&[]) {
            let e = usize::from(e);
            match w.ex_mark.get_mut(e) {
                Some(x) if *x != w.ex_stamp => *x = w.ex_stamp,
                _ => continue,
            }
            for g in ranks_holding(mask, mw, e) {
                let Some(slot) = partner_slot(w.opos, row, (s, hp, partners), g, e) else {
                    continue;
                };
                if let (Some(x), Some(ks), Some(kv)) = (
                    w.rep_mu.get_mut(slot),
                    w.ex_slot.get_mut(n),
                    w.ex_val.get_mut(n),
                ) {
                    (*ks, *kv) = (slot as u32, *x);
                    *x = f64::NEG_INFINITY;
                    n += 1;
                }
            }
        }
    }
    n
}

/// Puts back the `n` leave loads [`exempt_shared`] set aside, last first.
fn restore_exempt(w: &mut Work<'_>, n: usize) {
    for k in (0..n).rev() {
        let (Some(&slot), Some(&v)) = (w.ex_slot.get(k), w.ex_val.get(k)) else {
            continue;
        };
        if let Some(x) = w.rep_mu.get_mut(slot as usize) {
            *x = v;
        }
    }
}

/// The slot filter of one mover: writes to `w.surv` the partner slots that may beat the bar of
/// a move gaining `need` per fetch, in partner order (the partner's position in the high 16
/// bits, the slot in the low 16), and returns their count.
fn filter_slots(w: &mut Work<'_>, st: &Step<'_>, m: &Mover, need: f64) -> usize {
    let Step {
        s,
        partners,
        lp,
        lp_mu,
        mean,
        zp,
        ..
    } = *st;
    let Mover {
        wa,
        ca,
        spa,
        a_min_new,
        nxa,
        nv,
        rep_p,
        ..
    } = *m;
    let rr = st.rr;
    let (bar1, bar2) = (lp - need, lp - 2.0 * need);
    // Rounding must not drop a candidate that the exact checks accept.
    let slack = if filtering() {
        1e-9 * (lp.abs() + mean.abs())
    } else {
        f64::INFINITY
    };
    let keep_p = lp_mu - wa * spa;
    let (a_min, a_max) = (share(rr, ca, ca - 1), share(rr, ca, 0));
    let a_max_new = share(rr, ca + 1, 0);
    let t_m = bar2 - keep_p + slack;
    let t_kap = bar2 - keep_p - zp * nv + slack;
    let t_u = bar2 - wa * a_min + slack;
    let t_rho = bar2 - wa * a_min + zp * a_max * nxa + slack;
    let r_u = bar1 - wa * a_min_new + slack;
    let r_rho = bar1 - wa * a_min_new + zp * a_max_new * nxa + slack;
    let r_mu = bar1 + slack;
    let len = partners * s;
    // A replicate leaves p at its value after the replicate on the partner's
    // side, unless the slot's expert is on p too.
    let vp_min = rep_p.iter().fold(f64::INFINITY, |m, x| m.min(x.2));
    let rep_src = if vp_min < bar1 + slack {
        &*w.f_rep
    } else {
        &*w.f_rep_onp
    };
    fn part(t: &[f64], at: core::ops::Range<usize>) -> &[f64] {
        t.get(at).unwrap_or(&[])
    }
    // Two passes per 64 slots: the tests, branch-free into a bitset (the compiler vectorizes
    // it), then the passing slots, by their set bits.
    let mut n_s = 0usize;
    for base in (0..len).step_by(64) {
        let at = base..len.min(base + 64);
        let part = |t| part(t, at.clone());
        let terms = part(w.f_u)
            .iter()
            .zip(part(rep_src))
            .zip(part(w.f_rho))
            .zip(part(w.f_m))
            .zip(part(w.f_kap))
            .zip(part(w.rep_mu));
        let mut bits = 0u64;
        for (i, (((((&u, &ur), &rho), &m), &kap), &rmu)) in terms.enumerate() {
            let swap = (m < t_m) & (kap < t_kap) & (u < t_u) & (rho < t_rho);
            let rep = (ur < r_u) & (rho < r_rho) & (rmu < r_mu);
            bits |= u64::from(swap | rep) << i;
        }
        while bits != 0 {
            let k = base + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let Some(x) = w.surv.get_mut(n_s) {
                let qi = k / s;
                *x = ((qi as u32) << 16) | (k - qi * s) as u32;
            }
            n_s += 1;
        }
    }
    n_s.min(len)
}

/// The moves of one mover with partner `q` (the `qi`-th partner) over the surviving slots
/// `w.surv[group..si]`: replicates and swaps, each checked by loads, then bounds, then exactly;
/// the best so far is kept in `best`.
fn partner_moves(
    w: &mut Work<'_>,
    row: &[u16],
    p: &Params,
    st: &Step<'_>,
    m: &Mover,
    (qi, q, group, si): (usize, usize, usize, usize),
    best: &mut Option<Candidate>,
) {
    let Step {
        s,
        mw,
        hp,
        lp,
        lp_mu,
        floor_gain,
        mean,
        kz,
        budget,
        fetched,
        syy_p,
        ..
    } = *st;
    let Mover {
        i,
        a,
        wa,
        ca,
        spa,
        a_min_new,
        gaa,
        cpa,
        nxa,
        nv,
        rep_p,
        ..
    } = *m;
    let rr = st.rr;
    let need_of = |best: &Option<Candidate>| best.map_or(floor_gain, |c| c.gain.max(floor_gain));
    if q == hp || holds(w.mask, mw, a, q) {
        return;
    }
    // Loads bound every move of a with q from below: q gains its exact share of a
    // and gives up at most its largest (spare) slot load; p keeps its exact load
    // after a replicate, and gains at least the least load of q's experts in a swap.
    let need = need_of(best);
    let lq = w.load.get(q).copied().unwrap_or(0.0);
    let a_below_q = usize::from(w.abl.get(q).copied().unwrap_or(0));
    let side = usize::from(q < hp);
    let (dp, mp_rep, vp_rep) = rep_p.get(side).copied().unwrap_or((0.0, 0.0, 0.0));
    let sq_rep = share(rr, ca + 1, a_below_q);
    let rep_ok = fetched < budget && {
        let qrep = if ca == 1 { &*w.prep_strict } else { &*w.prep }
            .get(qi)
            .copied()
            .unwrap_or(f64::MIN);
        qrep > f64::MIN && lq + wa * sq_rep - qrep < lp - need && (dp == 0.0 || mp_rep < lp - need)
    };
    let sq_swap = share(rr, ca, a_below_q - usize::from(hp < q));
    let swap_ok = fetched + 2 <= budget && {
        let qmax = w.pmax.get(qi).copied().unwrap_or(0.0);
        let pmin = w.pminp.get(qi).copied().unwrap_or(0.0);
        lq + wa * sq_swap - qmax < lp - 2.0 * need && lp_mu - wa * spa + pmin < lp - 2.0 * need
    };
    if !rep_ok && !swap_ok {
        return;
    }
    let syy_q = w.syy.get(q).copied().unwrap_or(0.0);
    let mut cqa = f64::NAN;
    // The other holders of a after a replicate onto q / a swap to q (lazy, from the mover's
    // tables).
    // A single copy of a has no holder but p: nothing to evaluate.
    let none = if ca == 1 { f64::MIN } else { f64::NAN };
    let (mut oa_rep_mu, mut oa_rep_val) = (none, none);
    let (mut oa_swap_mu, mut oa_swap_val) = (none, none);
    for js in group..si {
        let j = w.surv.get(js).map_or(0, |&k| (k & 0xffff) as usize);
        let Some(&b) = row.get(q * s + j) else { break };
        let b = usize::from(b);
        if b == a {
            continue;
        }
        let slot = qi * s + j;
        let cb = usize::from(w.copies.get(b).copied().unwrap_or(1)).max(1);
        let jb = usize::from(w.spos.get(q * s + j).copied().unwrap_or(0));
        let wb = w.est.get(b).copied().unwrap_or(0.0);
        let sqb = w.psh.get(slot).copied().unwrap_or(0.0);
        let b_on_p = holds(w.mask, mw, b, hp);
        let mut gab = f64::NAN;
        // Replicate a onto q over a spare copy of b (1 fetch): p's value is exact
        // per side (without b on p), q gains its share of a and loses all of b.
        let rmu = w.rep_mu.get(slot).copied().unwrap_or(f64::MAX);
        if rep_ok && cb >= 2 && fetched < budget && (ca >= 2 || rmu < lp - need_of(best)) {
            let bar = lp - need_of(best);
            let vp = if b_on_p { f64::MIN } else { vp_rep };
            let quick = (lp_mu - wa * spa)
                .max(lq + wa * a_min_new - wb * sqb)
                .max(vp);
            if quick < bar {
                if !b_on_p && !shared_holder(w.mask, mw, a, b, hp, q) {
                    let mp = if dp == 0.0 { f64::MIN } else { mp_rep };
                    let mq = lq + (wa * sq_rep + wb * -sqb);
                    if mp.max(mq) < bar && oa_rep_mu.is_nan() {
                        oa_rep_mu = w.effect(mw, Shift::Join, a, (hp, q, a_below_q), p.z, false);
                    }
                    let ok = mp.max(mq).max(oa_rep_mu) < bar
                        && rmu < bar
                        && below_bar(mq, w.nu_of(q, b, q * s + j, sqb) - sq_rep * nxa, bar, kz);
                    if ok {
                        if cqa.is_nan() {
                            cqa = w.dot_y(q, a);
                        }
                        if gab.is_nan() {
                            gab = w.dot_x(a, b);
                        }
                        let gbb = w.gd.get(b).copied().unwrap_or(0.0);
                        let cqb = w.cq_of(q, b, q * s + j);
                        let var = w.var_of(syy_q, (cqa, cqb), (gaa, gbb, gab), sq_rep, -sqb);
                        let mut worst = vp.max(value(mq, var, p.z));
                        if worst < bar {
                            if oa_rep_val.is_nan() {
                                oa_rep_val =
                                    w.effect(mw, Shift::Join, a, (hp, q, a_below_q), p.z, true);
                            }
                            worst = worst.max(oa_rep_val);
                        }
                        if worst < bar {
                            worst =
                                worst.max(w.effect(mw, Shift::Leave, b, (hp, q, jb), p.z, true));
                        }
                        offer(worst, lp, floor_gain, 1, (i, q, j, false), best);
                    }
                } else {
                    let nt = w.record(mw, a, b, hp, q, false);
                    score(w, nt, a, b, lp, mean, p, 1, (i, q, j, false), best);
                }
            }
        }
        // Swap a and b (2 fetches).
        if !(swap_ok && !b_on_p && fetched + 2 <= budget) {
            continue;
        }
        let bar = lp - 2.0 * need_of(best);
        let nxb = w.nx.get(b).copied().unwrap_or(0.0);
        if ca == 1 && cb == 1 {
            // Single copies: only p and q change, by whole experts.
            let (mp, mq) = (lp_mu - wa + wb, lq + wa - wb);
            // The triangle inequality bounds both spreads from below: p keeps at
            // least |p without a| - |b|, q at least |q without b| - |a|.
            if mp.max(mq) < bar
                && below_bar(mp, nv - nxb, bar, kz)
                && below_bar(mq, w.nu_of(q, b, q * s + j, sqb) - nxa, bar, kz)
            {
                if gab.is_nan() {
                    gab = w.dot_x(a, b);
                }
                let gbb = w.gd.get(b).copied().unwrap_or(0.0);
                let cpb = w.cp_of(hp, b);
                let var = w.var_of(syy_p, (cpa, cpb), (gaa, gbb, gab), -1.0, 1.0);
                let vp = value(mp, var, p.z);
                if vp < bar {
                    if cqa.is_nan() {
                        cqa = w.dot_y(q, a);
                    }
                    let cqb = w.cq_of(q, b, q * s + j);
                    let var = w.var_of(syy_q, (cqa, cqb), (gaa, gbb, gab), 1.0, -1.0);
                    let worst = vp.max(value(mq, var, p.z));
                    if worst < bar {
                        *best = Some(Candidate {
                            gain: (lp - worst) / 2.0,
                            i,
                            q,
                            j,
                            fetches: 2,
                            swap: true,
                        });
                    }
                }
            }
            continue;
        }
        // p loses at most its share of a and gains at least the last holder's share
        // of b; q the other way round.
        let b_min = share(rr, cb, cb - 1);
        let a_min = share(rr, ca, ca - 1);
        let quick = (lp_mu - wa * spa + wb * b_min).max(lq - wb * sqb + wa * a_min);
        if quick >= bar {
            continue;
        }
        if shared_holder(w.mask, mw, a, b, hp, q) {
            let nt = w.record(mw, a, b, hp, q, true);
            score(w, nt, a, b, lp, mean, p, 2, (i, q, j, true), best);
            continue;
        }
        let sbp = share(rr, cb, below(w.mask, mw, b, hp) - usize::from(q < hp));
        let mp = lp_mu + (wa * -spa + wb * sbp);
        let mq = lq + (wa * sq_swap + wb * -sqb);
        if mp.max(mq) >= bar {
            continue;
        }
        if oa_swap_mu.is_nan() {
            oa_swap_mu = w.effect(mw, Shift::FromP, a, (hp, q, a_below_q), p.z, false);
        }
        if oa_swap_mu >= bar
            || w.effect(mw, Shift::ToP, b, (hp, q, jb), p.z, false) >= bar
            || !below_bar(mp, nv - sbp * nxb, bar, kz)
            || !below_bar(mq, w.nu_of(q, b, q * s + j, sqb) - sq_swap * nxa, bar, kz)
        {
            continue;
        }
        if gab.is_nan() {
            gab = w.dot_x(a, b);
        }
        let gbb = w.gd.get(b).copied().unwrap_or(0.0);
        let cpb = w.cp_of(hp, b);
        let var = w.var_of(syy_p, (cpa, cpb), (gaa, gbb, gab), -spa, sbp);
        let mut worst = value(mp, var, p.z);
        if worst < bar {
            if cqa.is_nan() {
                cqa = w.dot_y(q, a);
            }
            let cqb = w.cq_of(q, b, q * s + j);
            let var = w.var_of(syy_q, (cqa, cqb), (gaa, gbb, gab), sq_swap, -sqb);
            worst = worst.max(value(mq, var, p.z));
        }
        if worst < bar {
            if oa_swap_val.is_nan() {
                oa_swap_val = w.effect(mw, Shift::FromP, a, (hp, q, a_below_q), p.z, true);
            }
            worst = worst.max(oa_swap_val);
        }
        if worst < bar {
            worst = worst.max(w.effect(mw, Shift::ToP, b, (hp, q, jb), p.z, true));
        }
        offer(worst, lp, floor_gain, 2, (i, q, j, true), best);
    }
}

/// Phase 5: applies `c` to `row` and to the layer's state. `false` if its slots are missing.
fn apply(w: &mut Work<'_>, row: &mut [u16], z: f64, st: &Step<'_>, c: Candidate) -> bool {
    let (s, mw, hp) = (st.s, st.mw, st.hp);
    let Candidate { i, q, j, swap, .. } = c;

    let (Some(&a), Some(&b)) = (row.get(hp * s + i), row.get(q * s + j)) else {
        return false;
    };
    let (a, b) = (usize::from(a), usize::from(b));
    let nt = w.record(mw, a, b, hp, q, swap);
    w.settle(nt, a, b, true, z);
    if swap {
        set_holder(w.mask, mw, a, hp, false);
        set_holder(w.mask, mw, b, hp, true);
        if let Some(x) = row.get_mut(hp * s + i) {
            *x = b as u16;
        }
    } else {
        if let Some(c) = w.copies.get_mut(a) {
            *c += 1;
        }
        if let Some(c) = w.copies.get_mut(b) {
            *c -= 1;
        }
    }
    set_holder(w.mask, mw, b, q, false);
    set_holder(w.mask, mw, a, q, true);
    if let Some(x) = row.get_mut(q * s + j) {
        *x = a as u16;
    }
    stale_after(w, row, mw, (a, b), nt);
    true
}

/// Orders `w.order` by rank value, ascending (ties by rank): from scratch when `fresh`, else by
/// insertion from the last order, which a move leaves nearly sorted (it changes a few values).
pub(super) fn sort_ranks(w: &mut Work<'_>, fresh: bool) {
    let val = &*w.val;
    let key = |x: u16| val.get(usize::from(x)).copied().unwrap_or(0.0);
    let before = |x: u16, y: u16| key(x).total_cmp(&key(y)).then(x.cmp(&y)).is_lt();
    if fresh {
        for (i, o) in w.order.iter_mut().enumerate() {
            *o = i as u16;
        }
        w.order
            .sort_unstable_by(|&x, &y| key(x).total_cmp(&key(y)).then(x.cmp(&y)));
        return;
    }
    for i in 1..w.order.len() {
        let mut k = i;
        while k > 0 {
            let (Some(&x), Some(&y)) = (w.order.get(k - 1), w.order.get(k)) else {
                break;
            };
            if !before(y, x) {
                break;
            }
            w.order.swap(k - 1, k);
            k -= 1;
        }
    }
}

/// Keeps a move whose worst touched rank ends at `worst` in `best` if it pays at least the floor
/// and more per fetch than what `best` holds.
pub(super) fn offer(
    worst: f64,
    lp: f64,
    floor_gain: f64,
    cost: usize,
    (i, q, j, swap): (usize, usize, usize, bool),
    best: &mut Option<Candidate>,
) {
    let gain = (lp - worst) / cost as f64;
    if gain < floor_gain {
        return;
    }
    if best.is_none_or(|c| gain > c.gain) {
        *best = Some(Candidate {
            gain,
            i,
            q,
            j,
            fetches: cost,
            swap,
        });
    }
}

/// Scores the move whose deltas `record` left in `w`, clears them, and keeps it in `best` if
/// it pays more per fetch than what `best` holds.
#[allow(clippy::too_many_arguments)]
pub(super) fn score(
    w: &mut Work<'_>,
    nt: usize,
    a: usize,
    b: usize,
    lp: f64,
    mean: f64,
    p: &Params,
    cost: usize,
    (i, q, j, swap): (usize, usize, usize, bool),
    best: &mut Option<Candidate>,
) {
    // The move must bring every rank it touches below this.
    let needed = best.map_or(p.min_gain * mean, |c| c.gain.max(p.min_gain * mean));
    let bar = lp - needed * cost as f64;
    // Loads alone bound the values from below: most candidates fail on them cheaply.
    let mut worst = f64::MIN;
    let mut pruned = false;
    for ti in 0..nt {
        let rank = usize::from(w.touched.get(ti).copied().unwrap_or(0));
        let mu = w.load.get(rank).copied().unwrap_or(0.0) + w.dmu.get(rank).copied().unwrap_or(0.0);
        if mu >= bar {
            pruned = true;
            break;
        }
    }
    if !pruned {
        for ti in 0..nt {
            let rank = usize::from(w.touched.get(ti).copied().unwrap_or(0));
            worst = worst.max(w.new_value(rank, a, b, p.z));
            if worst >= bar {
                pruned = true;
                break;
            }
        }
    }
    w.settle(nt, a, b, false, p.z);
    if nt == 0 || pruned {
        return;
    }
    let gain = (lp - worst) / cost as f64;
    if gain < p.min_gain * mean {
        return;
    }
    if best.is_none_or(|c| gain > c.gain) {
        *best = Some(Candidate {
            gain,
            i,
            q,
            j,
            fetches: cost,
            swap,
        });
    }
}
