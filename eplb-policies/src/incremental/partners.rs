//! The partner table of a search step (module documentation, "Complexity"): per slot, what the
//! slot filter and the exact checks read of its expert and its rank. The table is kept by rank
//! across the steps of a layer and refreshed only where the last move changed it
//! ([`stale_after`], [`refresh`]), then gathered in partner order for the step's heaviest rank
//! ([`gather`]).
//!
//! A slot's terms depend on its rank's load and centered loads, on its expert's holders and, for
//! the other holders' largest new load when the expert leaves, on those holders' loads. A move
//! changes the loads of the ranks it touches and the holders of its two experts, so only their
//! slots and the slots of the experts with another copy on a touched rank go stale: a few ranks
//! per step instead of every partner. What depends on the heaviest rank (the other holders
//! without it, and whether it holds the slot's expert) concerns only the holders of its own
//! experts and is applied while gathering.

use super::search::Step;
use super::*;

/// Marks the whole table stale: the next refresh rebuilds it (a layer's first step).
pub(super) fn stale_all(w: &mut Work<'_>) {
    w.kdirty.fill(1);
    w.edirty.fill(1);
}

/// Marks what the move just applied changed, from the layer after it: the slots of the `nt`
/// ranks in `w.touched` and of every holder of `a` and `b`, and the leave loads of `a`, `b` and
/// of every expert with another copy on a touched rank.
pub(super) fn stale_after(
    w: &mut Work<'_>,
    row: &[u16],
    mw: usize,
    (a, b): (usize, usize),
    nt: usize,
) {
    let s = w.s;
    for e in [a, b] {
        if let Some(x) = w.edirty.get_mut(e) {
            *x = 1;
        }
        for rank in ranks_holding(w.mask, mw, e) {
            if let Some(x) = w.kdirty.get_mut(rank) {
                *x = 1;
            }
        }
    }
    for ti in 0..nt {
        let t = usize::from(w.touched.get(ti).copied().unwrap_or(0));
        if let Some(x) = w.kdirty.get_mut(t) {
            *x = 1;
        }
        for &e in row.get(t * s..(t + 1) * s).unwrap_or(&[]) {
            let e = usize::from(e);
            if w.copies.get(e).is_some_and(|&c| c >= 2)
                && let Some(x) = w.edirty.get_mut(e)
            {
                *x = 1;
            }
        }
    }
}

/// The slot of rank `rank` that holds expert `e` (`[R][S]` index), if any.
pub(super) fn slot_of(row: &[u16], s: usize, rank: usize, e: usize) -> Option<usize> {
    let slots = row.get(rank * s..(rank + 1) * s)?;
    slots
        .iter()
        .position(|&x| usize::from(x) == e)
        .map(|j| rank * s + j)
}

/// The partner-order slot (`[partners][S]`) of expert `e` on rank `rank`, if `rank` is one of
/// the step's partners (positions in `opos`, the heaviest rank `hp` never) and holds `e`.
pub(super) fn partner_slot(
    opos: &[u16],
    row: &[u16],
    (s, hp, partners): (usize, usize, usize),
    rank: usize,
    e: usize,
) -> Option<usize> {
    let qi = usize::from(opos.get(rank).copied().unwrap_or(u16::MAX));
    if rank == hp || qi >= partners {
        return None;
    }
    slot_of(row, s, rank, e).map(|k| qi * s + (k - rank * s))
}

/// Brings the table up to date: per stale expert, each of its slots' index among its holders
/// and the other holders' largest new load when it leaves that slot; then per stale rank, its
/// slots' share, load given up and filter terms, and its largest and least slot loads.
pub(super) fn refresh(w: &mut Work<'_>, row: &[u16], mw: usize, zp: f64) {
    let s = w.s;
    let ranks = w.rr;
    let rr = &ranks;
    for e in 0..w.edirty.len() {
        if w.edirty.get(e).is_none_or(|&x| x == 0) {
            continue;
        }
        if let Some(x) = w.edirty.get_mut(e) {
            *x = 0;
        }
        let d = w.leave_sweep(mw, e, usize::MAX);
        for j in 0..d {
            let h = usize::from(w.hr.get(j).copied().unwrap_or(0));
            let Some(k) = slot_of(row, s, h, e) else {
                continue;
            };
            if let Some(x) = w.spos.get_mut(k) {
                *x = j as u16;
            }
            if let Some(x) = w.k_rmu.get_mut(k) {
                *x = if d >= 2 {
                    w.hv.get(j).copied().unwrap_or(f64::MAX)
                } else {
                    f64::MAX
                };
            }
        }
    }
    for q in 0..w.kdirty.len() {
        if w.kdirty.get(q).is_none_or(|&x| x == 0) {
            continue;
        }
        if let Some(x) = w.kdirty.get_mut(q) {
            *x = 0;
        }
        let lq = w.load.get(q).copied().unwrap_or(0.0);
        let (mut pmax, mut prep, mut pmin) = (f64::MIN, f64::MIN, f64::MAX);
        for j in 0..s {
            let k = q * s + j;
            let b = usize::from(row.get(k).copied().unwrap_or(0));
            let wb = w.est.get(b).copied().unwrap_or(0.0);
            let cb = usize::from(w.copies.get(b).copied().unwrap_or(1)).max(1);
            let jb = usize::from(w.spos.get(k).copied().unwrap_or(0));
            let sh = share(rr, cb, jb);
            let give = sh * wb;
            pmax = pmax.max(give);
            if cb >= 2 {
                prep = prep.max(give);
            }
            // The least load b brings to another rank (as its last holder).
            let m = wb * share(rr, cb, cb - 1);
            pmin = pmin.min(m);
            let nu = w.nu_of(q, b, k, sh);
            let nxb = w.nx.get(b).copied().unwrap_or(0.0);
            let u = lq - give;
            for (buf, v) in [
                (&mut *w.k_sh, sh),
                (&mut *w.k_give, give),
                (&mut *w.k_u, u),
                (&mut *w.k_rep, if cb >= 2 { u } else { f64::INFINITY }),
                (&mut *w.k_rho, u + zp * nu),
                (&mut *w.k_m, m),
                (&mut *w.k_kap, m - zp * share(rr, cb, 0) * nxb),
            ] {
                if let Some(x) = buf.get_mut(k) {
                    *x = v;
                }
            }
        }
        for (buf, v) in [
            (&mut *w.q_pmax, pmax),
            (&mut *w.q_prep, prep),
            (&mut *w.q_pmin, pmin),
        ] {
            if let Some(x) = buf.get_mut(q) {
                *x = v;
            }
        }
    }
    #[cfg(test)]
    check_table(w, row, mw, zp);
}

/// Gathers the table in partner order for the step (`[partners][S]`, the buffers the filter and
/// the checks read): the heaviest rank's experts' other holders get their leave loads without
/// it; then per partner its largest load over the slots a replicate of a single-copy expert may
/// take. Also resets the step's per-expert tables of the other holders' effect.
pub(super) fn gather(w: &mut Work<'_>, row: &[u16], st: &Step<'_>) {
    let (s, mw, hp, partners) = (st.s, st.mw, st.hp, st.partners);
    let mut off = 0u32;
    for (h, &c) in w.hoff.iter_mut().zip(w.copies.iter()) {
        *h = off;
        off = off.saturating_add(u32::from(c));
    }
    w.built.fill(0);
    w.opos.fill(u16::MAX);
    fn copy(to: &mut [f64], from: &[f64], (to_at, from_at, s): (usize, usize, usize)) {
        if let (Some(t), Some(f)) = (to.get_mut(to_at..to_at + s), from.get(from_at..from_at + s)) {
            t.copy_from_slice(f);
        }
    }
    for qi in 0..partners {
        let q = usize::from(w.order.get(qi).copied().unwrap_or(0));
        if let Some(x) = w.opos.get_mut(q) {
            *x = qi as u16;
        }
        for (to, from) in [
            (&mut *w.pmax, &*w.q_pmax),
            (&mut *w.prep, &*w.q_prep),
            (&mut *w.pminp, &*w.q_pmin),
        ] {
            if let (Some(x), Some(&v)) = (to.get_mut(qi), from.get(q)) {
                *x = v;
            }
        }
        let at = (qi * s, q * s, s);
        copy(w.psh, w.k_sh, at);
        copy(w.f_u, w.k_u, at);
        copy(w.f_rep, w.k_rep, at);
        copy(w.f_rho, w.k_rho, at);
        copy(w.f_m, w.k_m, at);
        copy(w.f_kap, w.k_kap, at);
        copy(w.rep_mu, w.k_rmu, at);
    }
    if let Some(x) = w.f_rep_onp.get_mut(..partners * s) {
        x.fill(f64::INFINITY);
    }
    // The heaviest rank's experts with other copies: their other holders without it, and the
    // replicate term over a copy of an expert it holds.
    for i in 0..s {
        let e = usize::from(row.get(hp * s + i).copied().unwrap_or(0));
        if w.copies.get(e).is_none_or(|&c| c < 2) {
            continue;
        }
        let d = w.leave_sweep(mw, e, hp);
        for j in 0..d {
            let h = usize::from(w.hr.get(j).copied().unwrap_or(0));
            let Some(slot) = partner_slot(w.opos, row, (s, hp, partners), h, e) else {
                continue;
            };
            let lv = w.hv.get(j).copied().unwrap_or(f64::MAX);
            let u = w.f_u.get(slot).copied().unwrap_or(0.0);
            if let Some(x) = w.rep_mu.get_mut(slot) {
                *x = lv;
            }
            if let Some(x) = w.f_rep_onp.get_mut(slot) {
                *x = u;
            }
        }
    }
    // Per partner, its largest load over the spare copies whose other holders stay below the
    // bar of the least gain (branch-free; the loads are finite).
    let strict_bar = st.lp - st.floor_gain;
    let len = partners * s;
    let (rep, rmu) = (
        w.f_rep.get(..len).unwrap_or(&[]),
        w.rep_mu.get(..len).unwrap_or(&[]),
    );
    let slots = rep.chunks_exact(s).zip(rmu.chunks_exact(s));
    for (((rep, rmu), &q), x) in slots.zip(w.order.iter()).zip(w.prep_strict.iter_mut()) {
        let q = usize::from(q);
        let give = w.k_give.get(q * s..(q + 1) * s).unwrap_or(&[]);
        let mut strict = f64::MIN;
        for ((&rep, &rmu), &give) in rep.iter().zip(rmu).zip(give) {
            let v = if (rep < f64::INFINITY) & (rmu < strict_bar) {
                give
            } else {
                f64::MIN
            };
            strict = if v > strict { v } else { strict };
        }
        *x = strict;
    }
    #[cfg(test)]
    for qi in 0..partners {
        let mut strict = f64::MIN;
        for j in 0..s {
            let q = usize::from(w.order[qi]);
            let (k, slot) = (q * s + j, qi * s + j);
            let b = usize::from(row[k]);
            let cb = usize::from(w.copies[b]).max(1);
            assert_eq!(
                w.psh[slot].to_bits(),
                share_of(w.mask, mw, st.rr, b, q).to_bits()
            );
            let jb = usize::from(w.spos[k]);
            let direct = if cb >= 2 {
                w.effect(mw, Shift::Leave, b, (hp, q, jb), 0.0, false)
            } else {
                f64::MAX
            };
            assert_eq!(
                w.rep_mu[slot].to_bits(),
                direct.to_bits(),
                "leave load of {b} at {q}"
            );
            let onp = if cb >= 2 && holds(w.mask, mw, b, hp) {
                w.f_u[slot]
            } else {
                f64::INFINITY
            };
            assert_eq!(w.f_rep_onp[slot].to_bits(), onp.to_bits());
            let rep = if cb >= 2 { w.f_u[slot] } else { f64::INFINITY };
            assert_eq!(w.f_rep[slot].to_bits(), rep.to_bits());
            if cb >= 2 && w.rep_mu[slot] < st.lp - st.floor_gain {
                strict = strict.max(share_of(w.mask, mw, st.rr, b, q) * w.est[b]);
            }
        }
        assert_eq!(
            w.prep_strict[qi].to_bits(),
            strict.to_bits(),
            "partner {qi}"
        );
    }
}

/// Tests: every entry of the kept table equals its value computed afresh from the layer.
#[cfg(test)]
fn check_table(w: &mut Work<'_>, row: &[u16], mw: usize, zp: f64) {
    let s = w.s;
    let ranks = w.rr;
    let rr = &ranks;
    for (k, &b) in row.iter().enumerate() {
        let (q, b) = (k / s, usize::from(b));
        let cb = usize::from(w.copies.get(b).copied().unwrap_or(1)).max(1);
        assert_eq!(usize::from(w.spos[k]), below(w.mask, mw, b, q), "slot {k}");
        let sh = share_of(w.mask, mw, rr, b, q);
        let wb = w.est[b];
        let give = sh * wb;
        let rmu = if cb >= 2 {
            w.others(
                mw,
                Change {
                    e: b,
                    remove: Some(q),
                    add: None,
                },
                (q, q),
                false,
                0.0,
                false,
            )
            .0
        } else {
            f64::MAX
        };
        let c = w.dot_y(q, b);
        let nu = libm::sqrt((w.syy[q] - 2.0 * sh * c + sh * sh * w.gd[b]).max(0.0));
        let u = w.load[q] - give;
        let m = wb * share(rr, cb, cb - 1);
        let want = [
            sh,
            give,
            u,
            u + zp * nu,
            m,
            m - zp * share(rr, cb, 0) * w.nx[b],
            rmu,
        ];
        let have = [
            w.k_sh[k],
            w.k_give[k],
            w.k_u[k],
            w.k_rho[k],
            w.k_m[k],
            w.k_kap[k],
            w.k_rmu[k],
        ];
        for (t, (x, y)) in want.iter().zip(&have).enumerate() {
            assert_eq!(x.to_bits(), y.to_bits(), "slot {k}, term {t}: {x} vs {y}");
        }
    }
}
