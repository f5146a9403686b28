//! The load model: the per-window estimate with the shift test and history blend, and the
//! workload spread of the last cycles.

use super::*;

/// Fills `w.est` (per-window load estimate), `w.var` and the centered samples `w.xc` for layer
/// `l`, and updates the layer's history.
pub(super) fn estimate(
    input: &Input<'_>,
    l: usize,
    p: &Params,
    w: &mut Work<'_>,
    hist: &mut [f64],
    hist_n: &mut f64,
) {
    let samples = input.samples();
    let all = samples.map_or(1, |s| s.windows()).max(1);
    // At most MAX_WINDOWS of the most recent windows.
    let first = all.saturating_sub(MAX_WINDOWS);
    let t = all - first;
    let sample = |i: usize| -> &[f64] {
        match samples {
            Some(s) => s.get(first + i, l),
            None => input.layer_loads(l),
        }
    };
    let n = w.est.len();
    let k = if t >= 4 { (t / 3).max(2) } else { 0 };
    w.est.fill(0.0);
    w.old.fill(0.0);
    w.rec.fill(0.0);
    w.var.fill(0.0);
    for i in 0..t {
        let recent = i >= t - k;
        for (e, &v) in sample(i).iter().enumerate() {
            if let (Some(a), Some(o), Some(r)) =
                (w.est.get_mut(e), w.old.get_mut(e), w.rec.get_mut(e))
            {
                *a += v;
                if recent {
                    *r += v;
                } else {
                    *o += v;
                }
            }
        }
    }
    let tf = t as f64;
    for a in w.est.iter_mut() {
        *a /= tf;
    }
    if t > 1 {
        for i in 0..t {
            for ((v, &x), &m) in w.var.iter_mut().zip(sample(i)).zip(w.est.iter()) {
                *v += (x - m) * (x - m);
            }
        }
        for v in w.var.iter_mut() {
            *v /= tf - 1.0;
        }
    } else {
        for (v, &m) in w.var.iter_mut().zip(w.est.iter()) {
            *v = m;
        }
    }
    let floor = w.est.iter().sum::<f64>() / (n.max(1) as f64) * 1e-3 + 1e-9;
    let mut shifted = false;
    if k > 0 {
        let (kf, of) = (k as f64, (t - k) as f64);
        let mut z2 = 0.0;
        for ((&o, &r), &v) in w.old.iter().zip(w.rec.iter()).zip(w.var.iter()) {
            let d = r / kf - o / of;
            z2 += d * d / ((v + floor) * (1.0 / kf + 1.0 / of));
        }
        shifted = z2 / (n.max(1) as f64) > p.shift_threshold;
    }
    // The windows the spread is measured on: the recent ones after a shift.
    let from = if shifted { t - k } else { 0 };
    w.t = t - from;
    if shifted {
        let kf = k as f64;
        for (a, &r) in w.est.iter_mut().zip(w.rec.iter()) {
            *a = r / kf;
        }
    }
    // Expert-major `[N][stride]`, so a rank's variance reads each expert's rows contiguously.
    let stride = w.stride;
    for i in 0..w.t {
        for (e, (&v, &m)) in sample(from + i).iter().zip(w.est.iter()).enumerate() {
            if let Some(x) = w.xc.get_mut(e * stride + i) {
                *x = v - m;
            }
        }
    }
    let n_now = w.t as f64;
    // Blend with the history unless this interval shifted or differs from it.
    let mut use_hist = !shifted && *hist_n > 0.0;
    if use_hist {
        let mut z2 = 0.0;
        for ((&a, &h), &v) in w.est.iter().zip(hist.iter()).zip(w.var.iter()) {
            let d = a - h;
            z2 += d * d / ((v + floor) * (1.0 / n_now + 1.0 / *hist_n));
        }
        use_hist = z2 / (n.max(1) as f64) <= p.shift_threshold;
    }
    if use_hist {
        let hn = hist_n.min(p.history_windows);
        for (a, &h) in w.est.iter_mut().zip(hist.iter()) {
            *a = (*a * n_now + h * hn) / (n_now + hn);
        }
        *hist_n = (n_now + hn).min(p.history_windows);
    } else {
        *hist_n = n_now;
    }
    hist.copy_from_slice(w.est);
}

/// Adds the spread between workloads to each rank's per-window spread: the load shares of the
/// last `PAST` cycles, scaled to this cycle's total, become extra rows of the centered samples,
/// weighted so that they add `workload_weight` times their mean squared deviation to each
/// rank's variance. A rank holding experts that were hot together in an earlier workload is
/// then valued as riskier, so the placement also hedges the traffic mixes seen before. Then this
/// cycle's shares join the ring. `meta` packs the count (low half) and the next position.
pub(super) fn workload_spread(p: &Params, w: &mut Work<'_>, past: &mut [f64], meta: &mut u64) {
    let n = w.est.len();
    let total: f64 = w.est.iter().sum();
    if total <= 0.0 || n == 0 {
        return;
    }
    let count = (*meta & 0xffff_ffff) as usize;
    let next = (*meta >> 32) as usize;
    let (count, next) = (count.min(PAST), next % PAST);
    if p.workload_weight > 0.0 && count > 0 {
        let tw = w.t;
        let big_t = tw + count;
        let tm1 = (big_t - 1) as f64;
        let kw = if tw >= 2 {
            libm::sqrt(tm1 / (tw - 1) as f64)
        } else {
            1.0
        };
        let kp = libm::sqrt(p.workload_weight * tm1 / count as f64);
        for (e, col) in w.xc.chunks_exact_mut(w.stride).take(n).enumerate() {
            let m = w.est.get(e).copied().unwrap_or(0.0);
            for x in col.iter_mut().take(tw) {
                *x *= kw;
            }
            for c in 0..count {
                let sh = past.get(c * n + e).copied().unwrap_or(0.0);
                if let Some(x) = col.get_mut(tw + c) {
                    *x = kp * (sh * total - m);
                }
            }
        }
        w.t = big_t;
    }
    if let Some(slot) = past.get_mut(next * n..(next + 1) * n) {
        for (x, &m) in slot.iter_mut().zip(w.est.iter()) {
            *x = m / total;
        }
    }
    *meta = (((next + 1) % PAST) as u64) << 32 | (count + 1).min(PAST) as u64;
}
