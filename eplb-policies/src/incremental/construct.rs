//! The cold start: a layer far from balance is first rebuilt constructively, then the local
//! search polishes it. Replica counts go greedily to the expert with the largest estimated load
//! per copy; the copies are packed longest-processing-time first (heaviest copy to the lightest
//! rank that has room and does not hold the expert); the packed ranks are then matched to the
//! current ranks, heaviest first, each to the free current rank it shares the most experts
//! with, so that few slots change.
//!
//! Cost per layer: `O((R S - N) N)` for the counts, `O(N log N + R S R)` for the packing and
//! `O(R^2 S)` for the matching.

use super::*;

/// How much heavier (as a fraction of the mean rank load) a rank that holds an expert now may
/// be than the lightest one and still take the expert's copy, which then costs no fetch.
const STICK: f64 = 0.01;

/// Rebuilds `row` (one layer, `[R][S]`, whose holders `layer_state` left in `w.mask`) as a
/// balanced target matched to it, if that lowers the heaviest rank's estimated load and costs
/// at most `budget` fetches. Returns the fetches (slots changed), or `None` with `row`
/// untouched.
pub(super) fn construct(
    shape: &Shape,
    w: &mut Work<'_>,
    row: &mut [u16],
    budget: usize,
) -> Option<usize> {
    let (n, r, s) = (shape.experts(), shape.ranks(), shape.slots_per_rank());
    let mw = mask_words(shape);
    let est = &*w.est;
    let mean = est.iter().sum::<f64>() / r.max(1) as f64;
    let per_copy = |cnt: &[u16], e: usize| {
        est.get(e).copied().unwrap_or(0.0) / f64::from(cnt.get(e).copied().unwrap_or(1).max(1))
    };
    // Replica counts: one copy each, then each spare slot to the largest load per copy.
    let cnt = &mut *w.c_cnt;
    cnt.fill(1);
    for _ in 0..(r * s).checked_sub(n)? {
        let mut pick = None;
        let mut most = f64::MIN;
        for e in 0..n {
            if usize::from(cnt.get(e).copied().unwrap_or(0)) >= r {
                continue;
            }
            let v = per_copy(cnt, e);
            if v > most {
                most = v;
                pick = Some(e);
            }
        }
        *cnt.get_mut(pick?)? += 1;
    }
    // Packing: experts by load per copy, heaviest first; each copy to the lightest rank with
    // room that does not hold the expert yet (ties to the lower rank).
    let ord = &mut *w.c_ord;
    for (k, o) in ord.iter_mut().enumerate() {
        *o = k as u16;
    }
    ord.sort_unstable_by(|&x, &y| {
        let (x, y) = (usize::from(x), usize::from(y));
        per_copy(cnt, y)
            .total_cmp(&per_copy(cnt, x))
            .then(x.cmp(&y))
    });
    let (tl, fill, last, tgt) = (
        &mut *w.c_load,
        &mut *w.c_fill,
        &mut *w.c_last,
        &mut *w.c_tgt,
    );
    tl.fill(0.0);
    fill.fill(0);
    last.fill(u16::MAX);
    for &e in ord.iter() {
        let u = per_copy(cnt, usize::from(e));
        for _ in 0..cnt.get(usize::from(e)).copied().unwrap_or(0) {
            let mut pick = None;
            let mut lo = f64::INFINITY;
            for q in 0..r {
                let room = usize::from(fill.get(q).copied().unwrap_or(u16::MAX)) < s;
                let load = tl.get(q).copied().unwrap_or(f64::INFINITY);
                if room && last.get(q) != Some(&e) && load < lo {
                    lo = load;
                    pick = Some(q);
                }
            }
            // A rank that holds the expert now, if it is nearly as light: no fetch.
            let mut stay = None;
            let mut lo_stay = lo + STICK * mean;
            for q in 0..r {
                let room = usize::from(fill.get(q).copied().unwrap_or(u16::MAX)) < s;
                let load = tl.get(q).copied().unwrap_or(f64::INFINITY);
                if room
                    && last.get(q) != Some(&e)
                    && load <= lo_stay
                    && holds(w.mask, mw, usize::from(e), q)
                {
                    lo_stay = load;
                    stay = Some(q);
                }
            }
            let q = stay.or(pick)?;
            let k = usize::from(*fill.get(q)?);
            *tgt.get_mut(q * s + k)? = e;
            *fill.get_mut(q)? += 1;
            *tl.get_mut(q)? += u;
            *last.get_mut(q)? = e;
        }
    }
    let target_max = tl.iter().fold(0.0f64, |m, &x| m.max(x));
    let current_max = w.load.iter().fold(0.0f64, |m, &x| m.max(x));
    if target_max >= current_max {
        return None;
    }
    // Matching: target ranks by load, heaviest first, each to the free current rank holding
    // most of its experts (ties to the lower rank).
    let (tord, map) = (&mut *w.c_rord, &mut *w.c_map);
    for (k, o) in tord.iter_mut().enumerate() {
        *o = k as u16;
    }
    tord.sort_unstable_by(|&x, &y| {
        let load = |k: u16| tl.get(usize::from(k)).copied().unwrap_or(0.0);
        load(y).total_cmp(&load(x)).then(x.cmp(&y))
    });
    // `last` marks the current ranks already taken.
    last.fill(0);
    let mut fetches = 0usize;
    for &t in tord.iter() {
        let t = usize::from(t);
        let experts = tgt.get(t * s..(t + 1) * s)?;
        let mut pick = None;
        let mut most = 0usize;
        for q in 0..r {
            if last.get(q) != Some(&0) {
                continue;
            }
            let shared = experts
                .iter()
                .filter(|&&e| holds(w.mask, mw, usize::from(e), q))
                .count();
            if pick.is_none() || shared > most {
                most = shared;
                pick = Some(q);
                if shared == s {
                    break;
                }
            }
        }
        let q = pick?;
        *last.get_mut(q)? = 1;
        *map.get_mut(t)? = q as u16;
        fetches += s - most;
    }
    if fetches > budget {
        return None;
    }
    for t in 0..r {
        let q = usize::from(*map.get(t)?);
        let (src, dst) = (
            tgt.get(t * s..(t + 1) * s)?,
            row.get_mut(q * s..(q + 1) * s)?,
        );
        dst.copy_from_slice(src);
    }
    Some(fetches)
}
