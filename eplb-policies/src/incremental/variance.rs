//! The variance algebra: a rank's value `load + z * sd` and its exact update in `O(1)` when
//! the shares of two experts on it change (module documentation, "Complexity").

use super::*;

/// Whether a rank with mean load `mu` and centered loads of norm at least `norm_lb` (a lower
/// bound, possibly negative) may be valued below `bar`: a necessary condition, without a square
/// root.
/// `kz` is `z^2 / (T - 1)` (0 with fewer than two windows).
pub(super) fn below_bar(mu: f64, norm_lb: f64, bar: f64, kz: f64) -> bool {
    if mu >= bar {
        return false;
    }
    if norm_lb <= 0.0 {
        return true;
    }
    let d = bar - mu;
    kz * norm_lb * norm_lb < d * d
}

/// A rank's value: predicted per-window load plus `z` standard deviations.
pub(super) fn value(load: f64, var: f64, z: f64) -> f64 {
    load + z * libm::sqrt(var.max(0.0))
}

impl<'a> Work<'a> {
    /// Records in `dmu` and `da`/`db` (by `which`) the load and share changes of `c` on every
    /// rank, and the touched ranks.
    pub(super) fn change(&mut self, mw: usize, c: Change, which: bool, nt: &mut usize) {
        let we = self.est.get(c.e).copied().unwrap_or(0.0);
        share_changes(self.mask, mw, &self.rr, c, |rank, ds| {
            let first_touch = self.da.get(rank).is_some_and(|&x| x == 0.0)
                && self.db.get(rank).is_some_and(|&x| x == 0.0);
            if first_touch && let Some(t) = self.touched.get_mut(*nt) {
                *t = rank as u16;
                *nt += 1;
            }
            if let Some(x) = self.dmu.get_mut(rank) {
                *x += we * ds;
            }
            let buf = if which { &mut *self.db } else { &mut *self.da };
            if let Some(x) = buf.get_mut(rank) {
                *x += ds;
            }
        });
    }

    /// The holders of expert `e` other than `p` and `q` whose share changes when `e` loses
    /// `remove` and/or gains `add`: their largest new load, and with `values` their largest new
    /// value (`f64::MIN` when there is none). `as_b` evaluates the change as the second expert of
    /// a move, bit for bit as [`score`] does. The search reads it from [`Work::effect`]'s tables;
    /// tests check every table entry against it.
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn others(
        &self,
        mw: usize,
        c: Change,
        (p, q): (usize, usize),
        as_b: bool,
        z: f64,
        values: bool,
    ) -> (f64, f64) {
        let we = self.est.get(c.e).copied().unwrap_or(0.0);
        let (mut mu_max, mut val_max) = (f64::MIN, f64::MIN);
        share_changes(self.mask, mw, &self.rr, c, |rank, ds| {
            if rank == p || rank == q {
                return;
            }
            let mu = self.load.get(rank).copied().unwrap_or(0.0) + we * ds;
            mu_max = mu_max.max(mu);
            if values {
                let var = if as_b {
                    self.var_with(rank, 0, 0.0, c.e, ds)
                } else {
                    self.var_with(rank, c.e, ds, 0, 0.0)
                };
                val_max = val_max.max(value(mu, var, z));
            }
        });
        (mu_max, val_max)
    }

    /// What [`Work::others`] finds for the change `sh` of expert `e` at partner `q` (the other
    /// holders' largest new load, or with `values` their largest new value), from the step's
    /// table of `e` and `sh` ([`Work::sweep`], built on first use): `O(1)` instead of a walk
    /// over the holders. `p` is the step's heaviest rank `hp`; `m` is `q`'s position among the
    /// holders of `e`, the holders below it (`spos` or `abl`); `_q` itself is read only by the
    /// tests' cross-check.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn effect(
        &mut self,
        mw: usize,
        sh: Shift,
        e: usize,
        (hp, _q, m): (usize, usize, usize),
        z: f64,
        values: bool,
    ) -> f64 {
        #[cfg(test)]
        assert_eq!(
            m,
            below(self.mask, mw, e, _q),
            "position of {_q} among {e}'s holders"
        );
        let (k, at) = match sh {
            Shift::Join | Shift::FromP => (usize::from(sh == Shift::FromP) * 2, m),
            Shift::Leave | Shift::ToP => (
                usize::from(sh == Shift::ToP) * 2,
                self.hoff.get(e).map_or(0, |&o| o as usize) + m,
            ),
        };
        let k = k + usize::from(values);
        let flag = 1u16 << k;
        let mover = matches!(sh, Shift::Join | Shift::FromP);
        let done = if mover {
            self.a_built & flag != 0
        } else {
            self.built.get(e).is_some_and(|&f| f & flag != 0)
        };
        if !done {
            let out = core::mem::take(self.table(mover, k));
            let from = if mover { 0 } else { at - m };
            if let Some(o) = out.get_mut(from..) {
                self.sweep(mw, e, sh, hp, z, values, o);
            }
            *self.table(mover, k) = out;
            if mover {
                self.a_built |= flag;
            } else if let Some(f) = self.built.get_mut(e) {
                *f |= flag;
            }
        }
        let x = self.table(mover, k).get(at).copied().unwrap_or(f64::MAX);
        #[cfg(test)]
        {
            let direct = self.others(mw, sh.change(e, _q, hp), (hp, _q), sh.as_b(), z, values);
            let direct = if values { direct.1 } else { direct.0 };
            assert_eq!(
                x.to_bits(),
                direct.to_bits(),
                "{sh:?} of {e} at {_q}, p {hp}"
            );
        }
        x
    }

    /// The holders of expert `e` in rank order, into `hr[..d]`, and with `d >= 2` holders the
    /// other holders' largest new load when `e` leaves each of them, into `hv[..d]`, leaving out
    /// the rank `skip` (the step's heaviest rank, or `usize::MAX`) and the holders whose share
    /// does not change (`f64::MIN` where none is left); returns `d`. One pass forward takes
    /// both of a holder's effects (the leaving holder above it: its share among `d - 1` at its
    /// index; below it: at the index before), the prefix maximum of the first in `hv` and the
    /// second in `hb` for the suffix maximum on the way back: `O(d)` for every holder at once.
    pub(super) fn leave_sweep(&mut self, mw: usize, e: usize, skip: usize) -> usize {
        let mut d = 0;
        for (rank, x) in ranks_holding(self.mask, mw, e).zip(self.hr.iter_mut()) {
            *x = rank as u16;
            d += 1;
        }
        if d < 2 {
            return d;
        }
        let rr = &self.rr;
        let we = self.est.get(e).copied().unwrap_or(0.0);
        let load = &*self.load;
        let moved = |rank: usize, ds: f64| {
            if rank == skip || ds == 0.0 {
                f64::MIN
            } else {
                load.get(rank).copied().unwrap_or(0.0) + we * ds
            }
        };
        let (mut run, mut s_new_before) = (f64::MIN, 0.0);
        let holders = self
            .hr
            .iter()
            .zip(self.hv.iter_mut())
            .zip(self.hb.iter_mut());
        for (j, ((&rank, x), h)) in holders.take(d).enumerate() {
            let rank = usize::from(rank);
            let (s_old, s_new) = (share(rr, d, j), share(rr, d - 1, j));
            *x = run;
            if j + 1 < d {
                run = run.max(moved(rank, s_new - s_old));
            }
            if j > 0 {
                *h = moved(rank, s_new_before - s_old);
            }
            s_new_before = s_new;
        }
        let mut run = f64::MIN;
        for (j, (x, &h)) in self
            .hv
            .iter_mut()
            .zip(self.hb.iter())
            .take(d)
            .enumerate()
            .rev()
        {
            *x = x.max(run);
            if j > 0 {
                run = run.max(h);
            }
        }
        d
    }

    /// The table `k` (load, value; leave or to-p for the partner's experts, join or from-p
    /// for the mover) of [`Work::effect`].
    fn table(&mut self, mover: bool, k: usize) -> &mut &'a mut [f64] {
        match (mover, k) {
            (false, 0) => &mut self.lv_mu,
            (false, 1) => &mut self.lv_val,
            (false, 2) => &mut self.tp_mu,
            (false, _) => &mut self.tp_val,
            (true, 0) => &mut self.jn_mu,
            (true, 1) => &mut self.jn_val,
            (true, 2) => &mut self.fp_mu,
            (true, _) => &mut self.fp_val,
        }
    }

    /// Writes to `out` what [`Work::others`] finds for the change `sh` of expert `e` at every
    /// position of the partner `q` among its holders: `out[j]` for `q` the `j`-th holder
    /// (`Leave`, `ToP`), or for `q` above `j` holders (`Join`, `FromP`, up to `out[d]`).
    /// A holder's new index depends on `q` only by whether `q` is below it, so each holder has
    /// one effect for `q` above it and one for `q` below, and a prefix maximum of the first and
    /// a suffix maximum of the second give every position in one pass each way: `O(d)` (times
    /// `T` for the values) for all `d` positions instead of for each.
    #[allow(clippy::too_many_arguments)]
    fn sweep(
        &self,
        mw: usize,
        e: usize,
        sh: Shift,
        hp: usize,
        z: f64,
        values: bool,
        out: &mut [f64],
    ) {
        let rr = &self.rr;
        let words = self.mask.get(e * mw..(e + 1) * mw).unwrap_or(&[]);
        let d: usize = words.iter().map(|m| m.count_ones() as usize).sum();
        let d_new = match sh {
            Shift::Leave => d.wrapping_sub(1),
            Shift::Join => d + 1,
            Shift::ToP | Shift::FromP => d,
        };
        let we = self.est.get(e).copied().unwrap_or(0.0);
        // The effect on holder j at `rank`, with `q` below it (`up`) or above it.
        let effect = |rank: usize, j: usize, up: bool| {
            if rank == hp {
                return f64::MIN;
            }
            let (up, past_p) = (usize::from(up), usize::from(rank > hp));
            let j_new = match sh {
                Shift::Leave => j.wrapping_sub(up),
                Shift::ToP => (j + past_p).wrapping_sub(up),
                Shift::Join => j + up,
                Shift::FromP => (j + up).wrapping_sub(past_p),
            };
            let ds = share(rr, d_new, j_new) - share(rr, d, j);
            if ds == 0.0 {
                return f64::MIN;
            }
            let mu = self.load.get(rank).copied().unwrap_or(0.0) + we * ds;
            if !values {
                return mu;
            }
            let var = if sh.as_b() {
                self.var_with(rank, 0, 0.0, e, ds)
            } else {
                self.var_with(rank, e, ds, 0, 0.0)
            };
            value(mu, var, z)
        };
        // `q` a holder: holder j's position is j itself, and holders above it see it below.
        let holds_q = sh.as_b();
        let mut run = f64::MIN;
        let mut j = 0usize;
        for (wi, &m) in words.iter().enumerate() {
            let mut bits = m;
            while bits != 0 {
                let rank = wi * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(x) = out.get_mut(j) {
                    *x = run;
                }
                if !(holds_q && j + 1 == d) {
                    run = run.max(effect(rank, j, false));
                }
                j += 1;
            }
        }
        if !holds_q && let Some(x) = out.get_mut(d) {
            *x = run;
        }
        let mut run = f64::MIN;
        for (wi, &m) in words.iter().enumerate().rev() {
            let mut bits = m;
            while bits != 0 {
                let b = 63 - bits.leading_zeros() as usize;
                bits &= !(1u64 << b);
                let rank = wi * 64 + b;
                j = j.saturating_sub(1);
                if holds_q {
                    if let Some(x) = out.get_mut(j) {
                        *x = x.max(run);
                    }
                    if j > 0 {
                        run = run.max(effect(rank, j, true));
                    }
                } else {
                    run = run.max(effect(rank, j, true));
                    if let Some(x) = out.get_mut(j) {
                        *x = x.max(run);
                    }
                }
            }
        }
    }

    /// The new value of touched rank `rank` under the recorded deltas for experts `a`, `b`.
    pub(super) fn new_value(&self, rank: usize, a: usize, b: usize, z: f64) -> f64 {
        let mu = self.load.get(rank).copied().unwrap_or(0.0)
            + self.dmu.get(rank).copied().unwrap_or(0.0);
        let (sa, sb) = (
            self.da.get(rank).copied().unwrap_or(0.0),
            self.db.get(rank).copied().unwrap_or(0.0),
        );
        mu + z * libm::sqrt(self.var_with(rank, a, sa, b, sb))
    }

    /// Per-window variance of `rank` after its shares of `a` and `b` change by `sa`, `sb`.
    pub(super) fn var_with(&self, rank: usize, a: usize, sa: f64, b: usize, sb: f64) -> f64 {
        if self.t < 2 {
            return 0.0;
        }
        let y = self
            .y
            .get(rank * self.stride..rank * self.stride + self.t)
            .unwrap_or(&[]);
        let mut ss = 0.0;
        for (i, &yi) in y.iter().enumerate() {
            let xa = self.xc.get(a * self.stride + i).copied().unwrap_or(0.0);
            let xb = self.xc.get(b * self.stride + i).copied().unwrap_or(0.0);
            let v = yi + sa * xa + sb * xb;
            ss += v * v;
        }
        ss / (self.t - 1) as f64
    }

    /// Clears the deltas of the touched ranks; with `apply`, adds them to the rank state first
    /// and renews their values.
    pub(super) fn settle(&mut self, nt: usize, a: usize, b: usize, apply: bool, z: f64) {
        for ti in 0..nt {
            let rank = usize::from(self.touched.get(ti).copied().unwrap_or(0));
            let (dm, sa, sb) = (
                self.dmu.get(rank).copied().unwrap_or(0.0),
                self.da.get(rank).copied().unwrap_or(0.0),
                self.db.get(rank).copied().unwrap_or(0.0),
            );
            if apply {
                if let Some(x) = self.load.get_mut(rank) {
                    *x += dm;
                }
                let t = self.t;
                if let Some(y) = self.y.get_mut(rank * self.stride..rank * self.stride + t) {
                    for (i, yi) in y.iter_mut().enumerate() {
                        *yi += sa * self.xc.get(a * self.stride + i).copied().unwrap_or(0.0)
                            + sb * self.xc.get(b * self.stride + i).copied().unwrap_or(0.0);
                    }
                }
                self.renew_value(rank, z);
            }
            for buf in [&mut *self.dmu, &mut *self.da, &mut *self.db] {
                if let Some(x) = buf.get_mut(rank) {
                    *x = 0.0;
                }
            }
        }
    }

    /// Recomputes the value of `rank` from its load and centered samples.
    pub(super) fn renew_value(&mut self, rank: usize, z: f64) {
        let t = self.t;
        let ss: f64 = self
            .y
            .get(rank * self.stride..rank * self.stride + t)
            .unwrap_or(&[])
            .iter()
            .map(|v| v * v)
            .sum();
        if let Some(x) = self.syy.get_mut(rank) {
            *x = ss;
        }
        let var = if t < 2 { 0.0 } else { ss / (t - 1) as f64 };
        let v = value(self.load.get(rank).copied().unwrap_or(0.0), var, z);
        if let Some(x) = self.val.get_mut(rank) {
            *x = v;
        }
        let s = self.s;
        for c in [&mut *self.cq, &mut *self.nu] {
            if let Some(x) = c.get_mut(rank * s..(rank + 1) * s) {
                x.fill(f64::NAN);
            }
        }
    }

    /// The norm of rank `q`'s centered loads without its share `sh` of expert `e` in slot
    /// `slot` (`[R][S]` index), cached until the rank changes.
    pub(super) fn nu_of(&mut self, q: usize, e: usize, slot: usize, sh: f64) -> f64 {
        match self.nu.get(slot).copied() {
            Some(x) if !x.is_nan() => x,
            _ => {
                let c = self.cq_of(q, e, slot);
                let syy = self.syy.get(q).copied().unwrap_or(0.0);
                let g = self.gd.get(e).copied().unwrap_or(0.0);
                let x = libm::sqrt((syy - 2.0 * sh * c + sh * sh * g).max(0.0));
                if let Some(v) = self.nu.get_mut(slot) {
                    *v = x;
                }
                x
            }
        }
    }

    /// `sum_i y_i x_i` of rank `rank`'s centered loads and expert `e`'s centered samples.
    pub(super) fn dot_y(&self, rank: usize, e: usize) -> f64 {
        let t = self.t;
        let y = self
            .y
            .get(rank * self.stride..rank * self.stride + t)
            .unwrap_or(&[]);
        let x = self
            .xc
            .get(e * self.stride..e * self.stride + t)
            .unwrap_or(&[]);
        y.iter().zip(x).map(|(a, b)| a * b).sum()
    }

    /// `sum_i x_i x'_i` of two experts' centered samples.
    pub(super) fn dot_x(&self, e: usize, f: usize) -> f64 {
        let t = self.t;
        let x = self
            .xc
            .get(e * self.stride..e * self.stride + t)
            .unwrap_or(&[]);
        let y = self
            .xc
            .get(f * self.stride..f * self.stride + t)
            .unwrap_or(&[]);
        x.iter().zip(y).map(|(a, b)| a * b).sum()
    }

    /// The heaviest rank's `sum_i y_i x_i` with expert `e`, computed once per step.
    pub(super) fn cp_of(&mut self, hp: usize, e: usize) -> f64 {
        match self.cp.get(e).copied() {
            Some(x) if !x.is_nan() => x,
            _ => {
                let x = self.dot_y(hp, e);
                if let Some(c) = self.cp.get_mut(e) {
                    *c = x;
                }
                x
            }
        }
    }

    /// The partner's `sum_i y_i x_i` with the expert in partner slot `slot`, once per step.
    pub(super) fn cq_of(&mut self, q: usize, e: usize, slot: usize) -> f64 {
        match self.cq.get(slot).copied() {
            Some(x) if !x.is_nan() => x,
            _ => {
                let x = self.dot_y(q, e);
                if let Some(c) = self.cq.get_mut(slot) {
                    *c = x;
                }
                x
            }
        }
    }

    /// Per-window variance of a rank with `sum y^2 = syy` after its shares of experts `a`, `b`
    /// change by `sa`, `sb`, from the cross sums `cya`, `cyb` (rank with expert), the experts'
    /// `gaa`, `gbb` and `gab`: `O(1)` instead of a pass over the windows.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn var_of(
        &self,
        syy: f64,
        (cya, cyb): (f64, f64),
        (gaa, gbb, gab): (f64, f64, f64),
        sa: f64,
        sb: f64,
    ) -> f64 {
        if self.t < 2 {
            return 0.0;
        }
        let ss =
            syy + 2.0 * (sa * cya + sb * cyb) + sa * sa * gaa + sb * sb * gbb + 2.0 * sa * sb * gab;
        ss / (self.t - 1) as f64
    }

    /// Records a move: `swap` trades `a` (on `hp`) and `b` (on `q`); otherwise `a` gets a copy on
    /// `q` in place of `b`'s. Returns the touched-rank count.
    pub(super) fn record(
        &mut self,
        mw: usize,
        a: usize,
        b: usize,
        hp: usize,
        q: usize,
        swap: bool,
    ) -> usize {
        let mut nt = 0;
        let (ca, cb) = if swap {
            (
                Change {
                    e: a,
                    remove: Some(hp),
                    add: Some(q),
                },
                Change {
                    e: b,
                    remove: Some(q),
                    add: Some(hp),
                },
            )
        } else {
            (
                Change {
                    e: a,
                    remove: None,
                    add: Some(q),
                },
                Change {
                    e: b,
                    remove: Some(q),
                    add: None,
                },
            )
        };
        self.change(mw, ca, false, &mut nt);
        self.change(mw, cb, true, &mut nt);
        nt
    }
}
