//! Incremental (type 4, ours): plans from the current placement and takes only the moves that pay.
//!
//! # Algorithm
//!
//! Per layer:
//!
//! 1. **Load model.** From the per-window samples of the heat interval (or the summed loads as
//!    one sample) it estimates each expert's per-window load. A shift test compares the recent
//!    third of the windows with the older ones, scaled by the per-window variance (a mean squared
//!    z-score over the experts); after a shift only the recent windows count. Without a shift,
//!    the estimate is blended with the previous cycles' estimate kept in the policy state (up to
//!    `history_windows` windows of history), unless that one differs significantly too. So noisy
//!    stationary traffic is averaged over many windows, and a shift is followed at once.
//! 2. **Routing-aware rank loads.** The predicted load of each rank follows vLLM-Ascend's
//!    `log2phy` rule exactly: holder `j` (in ascending rank order) of an expert with `d` distinct
//!    holders receives `(floor((R - 1 - j) / d) + 1) / R` of its tokens. A rank's value is its
//!    predicted per-window load plus `z` times the standard deviation of its per-window load
//!    over the heat interval's windows, computed exactly from the windows (so the covariance of
//!    experts that rise and fall together counts): PAR is measured per window, and a rank that
//!    holds experts which peak together peaks more often. The spread also counts the last 8
//!    cycles' workloads (their load shares as extra rows, weighted by `workload_weight`): a rank
//!    whose experts were hot together in an earlier traffic mix is valued as riskier, so the
//!    placement hedges a mix that returns.
//! 3. **Local search from the current placement.** Repeatedly take the heaviest rank `p` and
//!    look for the move that lowers it most per weight fetch, against the `K` lightest ranks `q`
//!    (by default every other rank):
//!    *swap* an expert of `p` with one of `q` (2 fetches), or *replicate* an expert of `p` onto
//!    `q` over a copy of an expert that has another copy elsewhere (1 fetch; this is how replica
//!    counts follow the heat). A move is taken only if no rank it touches ends above
//!    `load(p) - gain_per_fetch * mean * fetches`; so every move pays, the sorted load vector
//!    falls lexicographically, and the search stops by itself. A per-layer budget caps the
//!    fetches. A layer whose heaviest rank cannot be lowered enough is left as it is.
//!
//! Moves overwrite slots in place, so every kept expert keeps its slot, and a copy is never
//! placed on a rank that already holds the expert: the output never co-locates copies (the
//! current placement must not either).
//!
//! # Complexity
//!
//! Per accepted move `O(S^2 K (1 + d))` candidates with `d` the copies of the experts involved
//! (1 for most), plus `O(R log R)` to order the ranks; the estimate is `O(T N)` per layer. A
//! candidate is first bounded by loads alone (a rank's value is at least its load), then by the
//! triangle inequality on the spreads, and only then valued exactly. The exact value is `O(1)`:
//! a rank's variance after its shares of `a` and `b` change by `sa`, `sb` is
//! `(Syy + 2 sa Sya + 2 sb Syb + sa^2 Saa + sb^2 Sbb + 2 sa sb Sab) / (T - 1)`, from the rank's
//! sum of squares (kept per rank), its cross sums with the two experts (cached per step and per
//! slot until the rank changes) and the experts' sums (`Saa` per layer, `Sab` per candidate).
//! The other holders of a moved expert are evaluated once per step and slot.
//! Before those checks, one branch-free pass per mover over the partner slots drops every slot
//! that cannot beat the bar: on each side a move's value is bounded from below by the sum of a
//! term of the mover and a term of the slot (the load it brings or leaves, and the triangle
//! bound on the spread), so the pass compares four precomputed slot terms with four thresholds
//! (three for a replicate). It only drops moves that the checks would reject, so the result is
//! the same. The rank order is kept by insertion from the last step.
//!
//! # Memory
//!
//! Scratch: per-expert estimates, sums and holder bitsets, `(64 + 8) x N` centered samples,
//! per-rank loads, sums and centered loads, per-slot caches and filter terms:
//! `O(N (79 + R/64) + R (81 + 14 S))` words. State: a header, `L x N` estimates, `L` history
//! counts, and the last 8 cycles' shares, `8 x L x N` (about 950 KB for DeepSeek-V3).
//!
//! # Differences from the published policies
//!
//! No published policy plans from the current placement with a cost per move: DeepSeek,
//! DefaultEplb and FlashLB re-solve from scratch (FlashLB then maps rows to ranks to save
//! moves), SwiftBalance swaps within a fixed budget but balances an even-split model and
//! re-decides every redundant slot each cycle.

use eplb_core::Shape;

use eplb_core::heat::MAX_WINDOWS;

/// Past cycles' load shares kept per layer (the workload spread).
const PAST: usize = 8;
/// Rows of the per-window spread: the windows, then the past cycles.
const ROWS: usize = MAX_WINDOWS + PAST;

use crate::arena::{Arena, words_f64, words_u16, words_u32};
use crate::{Error, Input, Policy, PolicyKind};

/// Tuning of [`Incremental`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// A move must lower the heaviest rank by at least this fraction of the mean rank load per
    /// weight fetch.
    pub gain_per_fetch: f64,
    /// At most this fraction of a layer's slots is fetched per cycle.
    pub max_fetch_fraction: f64,
    /// Lightest ranks considered as partners of the heaviest one (at most `R - 1`; the default,
    /// `usize::MAX`, tries every other rank). The search time grows linearly with it: a smaller
    /// value trades balance and fetches for time (`BENCHMARKS.md`).
    pub partners: usize,
    /// Mean squared z-score above which the recent windows are taken as a shift.
    pub shift_threshold: f64,
    /// Windows of history blended into the estimate while nothing shifts.
    pub history_windows: f64,
    /// Weight of the spread between the last cycles' workloads in a rank's variance (0: none).
    pub workload_weight: f64,
    /// Experts of the heaviest rank considered per step (its heaviest ones).
    pub movers: usize,
    /// Weight of a rank's per-window standard deviation in its value `mean + z * sd`: the
    /// per-window maximum is what PAR measures, and noisy hot experts raise it.
    pub z: f64,
}

impl Default for Params {
    /// Tuned on `esft_chain` (R8/X8, R16/X16) and `dsv3_drift_perm` (R32/X32, R64/X64) with
    /// H=10, A=1 (`BENCHMARKS.md`): a move must gain 1% of the mean rank load per fetch, ranks
    /// are valued at mean + 1.6 sd of their per-window load (the windows' spread plus half the
    /// spread of the last 8 cycles' workloads), and every other rank is tried as a partner:
    /// the best move per fetch is often a replicate over a spare copy, and spare copies sit on
    /// any rank (with only the 15 lightest ranks, DeepSeek-V3 at R=64 balanced worse and
    /// fetched 12% more).
    fn default() -> Self {
        Self {
            gain_per_fetch: 0.01,
            max_fetch_fraction: 1.0,
            partners: usize::MAX,
            shift_threshold: 2.5,
            history_windows: 30.0,
            z: 1.6,
            movers: 16,
            workload_weight: 0.5,
        }
    }
}

/// The incremental policy (type 4). See the module documentation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Incremental {
    params: Params,
}

impl Incremental {
    /// With the default parameters.
    pub fn new() -> Self {
        Self::default()
    }

    /// With `params`.
    pub fn with_params(params: Params) -> Self {
        Self { params }
    }

    /// The parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }
}

const STATE_MAGIC: u64 = 0x4550_4c42_494e_4331; // "EPLBINC1"

fn fingerprint(shape: &Shape) -> u64 {
    (shape.layers() as u64) << 48
        ^ (shape.experts() as u64) << 32
        ^ (shape.ranks() as u64) << 16
        ^ shape.slots_per_rank() as u64
}

fn mask_words(shape: &Shape) -> usize {
    shape.ranks().div_ceil(64)
}

/// Per-layer working buffers.
struct Work<'a> {
    /// Predicted per-window load per expert.
    est: &'a mut [f64],
    old: &'a mut [f64],
    rec: &'a mut [f64],
    /// Per-window variance per expert (for the shift tests).
    var: &'a mut [f64],
    /// Centered per-window samples, expert-major `[N][stride]`: `T <= MAX_WINDOWS` window rows,
    /// then the past cycles' deviations.
    xc: &'a mut [f64],
    /// Rows in `xc` and `y`.
    t: usize,
    /// Row stride of `xc` and `y` for this layer (at most `ROWS`): the rows this layer can use,
    /// so the samples stay dense in cache.
    stride: usize,
    /// Predicted load per rank.
    load: &'a mut [f64],
    /// Centered per-window load per rank `[R][stride]`.
    y: &'a mut [f64],
    /// Per-candidate deltas per rank: load, share of expert a, share of expert b.
    dmu: &'a mut [f64],
    da: &'a mut [f64],
    db: &'a mut [f64],
    /// Rank values, for ordering.
    val: &'a mut [f64],
    /// Per rank, the sum of its squared centered loads `sum_i y_i^2`.
    syy: &'a mut [f64],
    /// Per expert, `sum_i x_i^2` of its centered samples.
    gd: &'a mut [f64],
    /// Per step, `sum_i y_i x_i` of the heaviest rank and each expert it may trade with (NaN
    /// until needed).
    cp: &'a mut [f64],
    /// Per slot `[R][S]`, `sum_i y_i x_i` of the rank and the slot's expert, and the norm of
    /// the rank's centered loads without that expert (NaN until needed; reset when the rank
    /// changes).
    cq: &'a mut [f64],
    nu: &'a mut [f64],
    /// Per expert, the norm of its centered samples, `sqrt(gd)`.
    nx: &'a mut [f64],
    /// Slots per rank.
    s: usize,
    /// The rank count and its tabulated shares.
    rr: Ranks,
    /// Per step: the share of each partner slot's expert on its rank (`[partners][S]`).
    psh: &'a mut [f64],
    /// Per step: each partner's largest slot load (`[partners]`).
    pmax: &'a mut [f64],
    /// Per step: each partner's largest load in a slot whose expert has another copy
    /// (`f64::MIN` without one).
    prep: &'a mut [f64],
    /// Per step: the least load any of a partner's experts brings to another rank.
    pminp: &'a mut [f64],
    /// Per step: `prep` over the slots a replicate of a single-copy expert may take.
    prep_strict: &'a mut [f64],
    /// Per step, per partner slot `[partners][S]`, the effect on the other holders of the slot's
    /// expert when it leaves the partner (`rep_*`, a replicate over it) or moves to the heaviest
    /// rank (`swap_*`): their largest new load and value. NaN until needed.
    rep_mu: &'a mut [f64],
    rep_val: &'a mut [f64],
    swap_mu: &'a mut [f64],
    swap_val: &'a mut [f64],
    /// Per step, per partner slot `[partners][S]`, the terms of the slot filter: the partner's
    /// load without the slot's expert (`f_u`; `f_rep` is the same, or infinity where the expert
    /// has no other copy), `f_u` plus the triangle bound on its spread (`f_rho`), the least
    /// load the expert brings to the heaviest rank (`f_m`) and that minus the most spread it
    /// can take off it (`f_kap`).
    f_u: &'a mut [f64],
    f_rep: &'a mut [f64],
    /// `f_rep` where the slot's expert also sits on the heaviest rank, infinity elsewhere.
    f_rep_onp: &'a mut [f64],
    f_rho: &'a mut [f64],
    f_m: &'a mut [f64],
    f_kap: &'a mut [f64],
    /// Per mover, the partner slots that pass the filter, in partner order.
    surv: &'a mut [u32],
    mask: &'a mut [u64],
    copies: &'a mut [u16],
    touched: &'a mut [u16],
    order: &'a mut [u16],
    /// Scratch of `common::keep_slots`.
    keep: &'a mut [u16],
}

impl<'a> Work<'a> {
    fn carve(arena: &mut Arena<'a>, shape: &Shape) -> Result<Self, Error> {
        let (n, r) = (shape.experts(), shape.ranks());
        Ok(Self {
            est: arena.f64s(n)?,
            old: arena.f64s(n)?,
            rec: arena.f64s(n)?,
            var: arena.f64s(n)?,
            xc: arena.f64s(ROWS * n)?,
            t: 0,
            stride: ROWS,
            load: arena.f64s(r)?,
            y: arena.f64s(r * ROWS)?,
            dmu: arena.f64s(r)?,
            da: arena.f64s(r)?,
            db: arena.f64s(r)?,
            val: arena.f64s(r)?,
            syy: arena.f64s(r)?,
            gd: arena.f64s(n)?,
            cp: arena.f64s(n)?,
            cq: arena.f64s(r * shape.slots_per_rank())?,
            nu: arena.f64s(r * shape.slots_per_rank())?,
            nx: arena.f64s(n)?,
            s: shape.slots_per_rank(),
            rr: Ranks::new(shape.ranks()),
            psh: arena.f64s(r * shape.slots_per_rank())?,
            pmax: arena.f64s(r)?,
            prep: arena.f64s(r)?,
            pminp: arena.f64s(r)?,
            prep_strict: arena.f64s(r)?,
            rep_mu: arena.f64s(r * shape.slots_per_rank())?,
            rep_val: arena.f64s(r * shape.slots_per_rank())?,
            swap_mu: arena.f64s(r * shape.slots_per_rank())?,
            swap_val: arena.f64s(r * shape.slots_per_rank())?,
            f_u: arena.f64s(r * shape.slots_per_rank())?,
            f_rep: arena.f64s(r * shape.slots_per_rank())?,
            f_rep_onp: arena.f64s(r * shape.slots_per_rank())?,
            f_rho: arena.f64s(r * shape.slots_per_rank())?,
            f_m: arena.f64s(r * shape.slots_per_rank())?,
            f_kap: arena.f64s(r * shape.slots_per_rank())?,
            surv: arena.u32s(r * shape.slots_per_rank() + 1)?,
            mask: arena.words(n * mask_words(shape))?,
            copies: arena.u16s(n)?,
            touched: arena.u16s(2 * r + 4)?,
            order: arena.u16s(r)?,
            keep: arena.u16s(2 * shape.slots_per_rank())?,
        })
    }

    fn words(shape: &Shape) -> usize {
        let (n, r) = (shape.experts(), shape.ranks());
        7 * words_f64(n)
            + words_f64(ROWS * n)
            + 9 * words_f64(r)
            + 13 * words_f64(r * shape.slots_per_rank())
            + words_u32(r * shape.slots_per_rank() + 1)
            + words_f64(r)
            + words_f64(r * ROWS)
            + n * mask_words(shape)
            + words_u16(n)
            + words_u16(2 * r + 4)
            + words_u16(r)
            + words_u16(2 * shape.slots_per_rank())
    }
}

impl Policy for Incremental {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Incremental
    }

    fn scratch_len(&self, shape: &Shape) -> usize {
        Work::words(shape)
    }

    fn state_len(&self, shape: &Shape) -> usize {
        2 + shape.loads_len() + shape.layers() + PAST * shape.loads_len() + shape.layers()
    }

    fn place(
        &mut self,
        input: &Input<'_>,
        scratch: &mut [u64],
        state: &mut [u64],
        out: &mut [u16],
    ) -> Result<(), Error> {
        let shape = *input.shape();
        let current = input.current();
        crate::policy::check_out_len(&shape, out)?;
        current.check_servable()?;
        let needed = self.state_len(&shape);
        let Some(state) = state.get_mut(..needed) else {
            return Err(Error::State {
                needed,
                got: state.len(),
            });
        };
        let (header, rest) = state.split_at_mut(2);
        let fresh =
            header.first() != Some(&STATE_MAGIC) || header.get(1) != Some(&fingerprint(&shape));
        if fresh {
            rest.fill(0);
            if let [m, f] = header {
                *m = STATE_MAGIC;
                *f = fingerprint(&shape);
            }
        }
        let (hist_est, rest) = rest.split_at_mut(shape.loads_len());
        let (hist_n, rest) = rest.split_at_mut(shape.layers());
        let (past, past_meta) = rest.split_at_mut(PAST * shape.loads_len());
        let hist_est: &mut [f64] = bytemuck::cast_slice_mut(hist_est);
        let hist_n: &mut [f64] = bytemuck::cast_slice_mut(hist_n);
        let past: &mut [f64] = bytemuck::cast_slice_mut(past);

        out.copy_from_slice(current.as_slice());
        let mut arena = Arena::new(scratch);
        let mut w = Work::carve(&mut arena, &shape)?;
        let (n, per) = (shape.experts(), shape.slots_per_layer());
        for (l, row) in out.chunks_exact_mut(per).enumerate() {
            let (Some(he), Some(hn), Some(pa), Some(pm)) = (
                hist_est.get_mut(l * n..(l + 1) * n),
                hist_n.get_mut(l),
                past.get_mut(l * PAST * n..(l + 1) * PAST * n),
                past_meta.get_mut(l),
            ) else {
                continue;
            };
            let windows = input
                .samples()
                .map_or(1, |s| s.windows())
                .clamp(1, MAX_WINDOWS);
            let past_rows = if self.params.workload_weight > 0.0 {
                ((*pm & 0xffff_ffff) as usize).min(PAST)
            } else {
                0
            };
            w.stride = windows + past_rows;
            estimate(input, l, &self.params, &mut w, he, hn);
            workload_spread(&self.params, &mut w, pa, pm);
            search(&shape, &self.params, &mut w, row);
            // An expert that left a rank and came back sits in its old slot again.
            let s = shape.slots_per_rank();
            let old = current
                .as_slice()
                .get(l * per..(l + 1) * per)
                .unwrap_or(&[]);
            for (o, nrow) in old.chunks_exact(s).zip(row.chunks_exact_mut(s)) {
                crate::common::keep_slots(o, nrow, w.keep)?;
            }
        }
        Ok(())
    }
}

/// Fills `w.est` (per-window load estimate), `w.var` and the centered samples `w.xc` for layer
/// `l`, and updates the layer's history.
fn estimate(
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
fn workload_spread(p: &Params, w: &mut Work<'_>, past: &mut [f64], meta: &mut u64) {
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

fn holds(mask: &[u64], mw: usize, e: usize, r: usize) -> bool {
    mask.get(e * mw + r / 64)
        .is_some_and(|m| m & (1u64 << (r % 64)) != 0)
}

fn set_holder(mask: &mut [u64], mw: usize, e: usize, r: usize, on: bool) {
    if let Some(m) = mask.get_mut(e * mw + r / 64) {
        if on {
            *m |= 1u64 << (r % 64);
        } else {
            *m &= !(1u64 << (r % 64));
        }
    }
}

#[cfg(test)]
std::thread_local! {
    /// Turns the slot filter off on this thread, so tests can check that it changes nothing.
    static UNFILTERED: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Whether the slot filter runs (always, outside this module's tests).
fn filtering() -> bool {
    #[cfg(test)]
    {
        !UNFILTERED.with(core::cell::Cell::get)
    }
    #[cfg(not(test))]
    {
        true
    }
}

/// Holder counts whose shares are tabulated.
const TAB_D: usize = 8;

/// The rank count, its reciprocal, and the shares of up to `TAB_D` holders, tabulated: the
/// search asks for thousands of shares per step.
#[derive(Clone, Copy)]
struct Ranks {
    n: usize,
    inv: f64,
    /// `tab[d (d - 1) / 2 + j]`: the share of holder `j` among `d`.
    tab: [f64; TAB_D * (TAB_D + 1) / 2],
}

impl Ranks {
    fn new(n: usize) -> Self {
        let mut r = Self {
            n,
            inv: 1.0 / n.max(1) as f64,
            tab: [0.0; TAB_D * (TAB_D + 1) / 2],
        };
        for d in 1..=TAB_D {
            for j in 0..d {
                let v = r.compute(d, j);
                if let Some(x) = r.tab.get_mut(d * (d - 1) / 2 + j) {
                    *x = v;
                }
            }
        }
        r
    }

    /// `(floor((r - 1 - j) / d) + 1) / r`.
    fn compute(&self, d: usize, j: usize) -> f64 {
        let r = self.n;
        if d == 0 || r == 0 {
            return 0.0;
        }
        let m = eplb_core::metrics::log2phy_sources(r, d, j);
        // Through i64: a direct conversion (usize to f64 is not one instruction on x86_64).
        m as i64 as f64 * self.inv
    }
}

/// Share of holder `j` among `d` holders on `r` ranks: `(floor((r - 1 - j) / d) + 1) / r`.
#[inline(always)]
fn share(r: &Ranks, d: usize, j: usize) -> f64 {
    if d <= TAB_D
        && j < d
        && let Some(&x) = r.tab.get(d * (d.wrapping_sub(1)) / 2 + j)
    {
        return x;
    }
    r.compute(d, j)
}

/// The current share of expert `e` on holder `rank` (0 if it does not hold it).
fn share_of(mask: &[u64], mw: usize, r: &Ranks, e: usize, rank: usize) -> f64 {
    let words = mask.get(e * mw..(e + 1) * mw).unwrap_or(&[]);
    let (wi, bit) = (rank / 64, rank % 64);
    if words.get(wi).is_none_or(|m| m & (1u64 << bit) == 0) {
        return 0.0;
    }
    let d: usize = words.iter().map(|m| m.count_ones() as usize).sum();
    let below: usize = words
        .iter()
        .take(wi)
        .map(|m| m.count_ones() as usize)
        .sum::<usize>()
        + words
            .get(wi)
            .map_or(0, |m| (m & ((1u64 << bit) - 1)).count_ones() as usize);
    share(r, d, below)
}

/// Holders of expert `e` below `rank`.
fn below(mask: &[u64], mw: usize, e: usize, rank: usize) -> usize {
    let words = mask.get(e * mw..(e + 1) * mw).unwrap_or(&[]);
    let (wi, bit) = (rank / 64, rank % 64);
    words
        .iter()
        .take(wi)
        .map(|m| m.count_ones() as usize)
        .sum::<usize>()
        + words
            .get(wi)
            .map_or(0, |m| (m & ((1u64 << bit) - 1)).count_ones() as usize)
}

/// Whether a rank other than `p` and `q` holds both `a` and `b`.
fn shared_holder(mask: &[u64], mw: usize, a: usize, b: usize, p: usize, q: usize) -> bool {
    let wa = mask.get(a * mw..(a + 1) * mw).unwrap_or(&[]);
    let wb = mask.get(b * mw..(b + 1) * mw).unwrap_or(&[]);
    wa.iter().zip(wb).enumerate().any(|(wi, (&x, &y))| {
        let mut m = x & y;
        for rank in [p, q] {
            if rank / 64 == wi {
                m &= !(1u64 << (rank % 64));
            }
        }
        m != 0
    })
}

/// Whether a rank with mean load `mu` and centered loads of norm at least `norm_lb` (a lower
/// bound, possibly negative) may be valued below `bar`: a necessary condition, without a square
/// root.
/// `kz` is `z^2 / (T - 1)` (0 with fewer than two windows).
fn below_bar(mu: f64, norm_lb: f64, bar: f64, kz: f64) -> bool {
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
fn value(load: f64, var: f64, z: f64) -> f64 {
    load + z * libm::sqrt(var.max(0.0))
}

/// One planned change of holders: expert `e` leaves `remove` and/or gains `add`.
#[derive(Clone, Copy)]
struct Change {
    e: usize,
    remove: Option<usize>,
    add: Option<usize>,
}

/// Calls `f(rank, ds)` for every holder of `c.e` (before or after) whose log2phy share changes
/// by `ds != 0` when the expert loses `c.remove` and/or gains `c.add`.
fn share_changes(mask: &[u64], mw: usize, rr: &Ranks, c: Change, mut f: impl FnMut(usize, f64)) {
    let words = mask.get(c.e * mw..(c.e + 1) * mw).unwrap_or(&[]);
    let d_old: usize = words.iter().map(|m| m.count_ones() as usize).sum();
    let d_new = d_old - usize::from(c.remove.is_some()) + usize::from(c.add.is_some());
    let (mut j_old, mut j_new) = (0usize, 0usize);
    for (wi, &m) in words.iter().enumerate() {
        let mut bits = m;
        if let Some(a) = c.add
            && a / 64 == wi
        {
            bits |= 1u64 << (a % 64);
        }
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let rank = wi * 64 + b;
            let in_old = m & (1u64 << b) != 0;
            let in_new = (in_old && c.remove != Some(rank)) || c.add == Some(rank);
            let before = if in_old { share(rr, d_old, j_old) } else { 0.0 };
            let after = if in_new { share(rr, d_new, j_new) } else { 0.0 };
            j_old += usize::from(in_old);
            j_new += usize::from(in_new);
            let ds = after - before;
            if ds != 0.0 {
                f(rank, ds);
            }
        }
    }
}

impl Work<'_> {
    /// Records in `dmu` and `da`/`db` (by `which`) the load and share changes of `c` on every
    /// rank, and the touched ranks.
    fn change(&mut self, mw: usize, c: Change, which: bool, nt: &mut usize) {
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
    /// a move, bit for bit as [`score`] does.
    #[allow(clippy::too_many_arguments)]
    fn others(
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

    /// The new value of touched rank `rank` under the recorded deltas for experts `a`, `b`.
    fn new_value(&self, rank: usize, a: usize, b: usize, z: f64) -> f64 {
        let mu = self.load.get(rank).copied().unwrap_or(0.0)
            + self.dmu.get(rank).copied().unwrap_or(0.0);
        let (sa, sb) = (
            self.da.get(rank).copied().unwrap_or(0.0),
            self.db.get(rank).copied().unwrap_or(0.0),
        );
        mu + z * libm::sqrt(self.var_with(rank, a, sa, b, sb))
    }

    /// Per-window variance of `rank` after its shares of `a` and `b` change by `sa`, `sb`.
    fn var_with(&self, rank: usize, a: usize, sa: f64, b: usize, sb: f64) -> f64 {
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
    fn settle(&mut self, nt: usize, a: usize, b: usize, apply: bool, z: f64) {
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
    fn renew_value(&mut self, rank: usize, z: f64) {
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
    fn nu_of(&mut self, q: usize, e: usize, slot: usize, sh: f64) -> f64 {
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
    fn dot_y(&self, rank: usize, e: usize) -> f64 {
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
    fn dot_x(&self, e: usize, f: usize) -> f64 {
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
    fn cp_of(&mut self, hp: usize, e: usize) -> f64 {
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
    fn cq_of(&mut self, q: usize, e: usize, slot: usize) -> f64 {
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
    fn var_of(
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
    fn record(&mut self, mw: usize, a: usize, b: usize, hp: usize, q: usize, swap: bool) -> usize {
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

/// A candidate move: gain per fetch, slot `i` of the heaviest rank, partner `q`, its slot `j`,
/// fetches, swap or replicate.
type Candidate = (f64, usize, usize, usize, usize, bool);

/// The local search on one layer `row` (`[R][S]`), in place.
fn search(shape: &Shape, p: &Params, w: &mut Work<'_>, row: &mut [u16]) {
    let (r, s, n) = (shape.ranks(), shape.slots_per_rank(), shape.experts());
    let ranks = w.rr;
    let rr = &ranks;
    let mw = mask_words(shape);
    if r < 2 {
        return;
    }
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
        let mut j = 0;
        for (wi, &m) in words.iter().enumerate() {
            let mut bits = m;
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let rank = wi * 64 + b;
                let sh = share(rr, d, j);
                if let Some(x) = w.load.get_mut(rank) {
                    *x += we * sh;
                }
                if let Some(y) = w.y.get_mut(rank * stride..rank * stride + t) {
                    for (i, yi) in y.iter_mut().enumerate() {
                        *yi += sh * w.xc.get(e * stride + i).copied().unwrap_or(0.0);
                    }
                }
                j += 1;
            }
        }
    }
    let total: f64 = w.load.iter().sum();
    if total <= 0.0 {
        return;
    }
    let mean = total / r as f64;
    for rank in 0..r {
        w.renew_value(rank, p.z);
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
    let budget = ((p.max_fetch_fraction * (r * s) as f64) as usize).max(2);
    let partners = p.partners.clamp(1, r - 1);
    let kz = if w.t < 2 {
        0.0
    } else {
        p.z * p.z / (w.t - 1) as f64
    };
    // z over the root of T - 1: the spread term of a value per unit of centered-load norm.
    let zp = libm::sqrt(kz);
    let mut fetched = 0usize;
    // Each accepted move lowers the sorted value vector; the cap is a safety net.
    let mut first = true;
    for _ in 0..4 * r * s {
        sort_ranks(w, first);
        first = false;
        let Some(&heavy) = w.order.last() else { return };
        let hp = usize::from(heavy);
        let lp = w.val.get(hp).copied().unwrap_or(0.0);
        let lp_mu = w.load.get(hp).copied().unwrap_or(0.0);
        let floor_gain = p.gain_per_fetch * mean;
        let syy_p = w.syy.get(hp).copied().unwrap_or(0.0);
        w.cp.fill(f64::NAN);
        let mut best: Option<Candidate> = None;
        // The partners' slots, once per step: each expert's share on its rank, the rank's
        // largest slot load (of any expert, and of one with another copy), and the least load
        // any of its experts would bring to p. The other holders' effects are filled on demand.
        for qi in 0..partners {
            let q = usize::from(w.order.get(qi).copied().unwrap_or(0));
            let lq = w.load.get(q).copied().unwrap_or(0.0);
            let (mut pmax, mut prep, mut pmin) = (f64::MIN, f64::MIN, f64::MAX);
            let mut prep_strict = f64::MIN;
            for j in 0..s {
                let slot = qi * s + j;
                let b = usize::from(row.get(q * s + j).copied().unwrap_or(0));
                let sh = share_of(w.mask, mw, rr, b, q);
                let wb = w.est.get(b).copied().unwrap_or(0.0);
                let cb = usize::from(w.copies.get(b).copied().unwrap_or(1)).max(1);
                let give = sh * wb;
                pmax = pmax.max(give);
                // The other holders of b when it leaves q: their largest new load. With a
                // single copy of a no rank but p holds a, so that load bounds every replicate
                // over this slot, and a slot it rules out is no target.
                let rmu = if cb >= 2 {
                    let leave = Change {
                        e: b,
                        remove: Some(q),
                        add: None,
                    };
                    w.others(mw, leave, (hp, q), true, p.z, false).0
                } else {
                    f64::MAX
                };
                if cb >= 2 {
                    prep = prep.max(give);
                    if rmu < lp - floor_gain {
                        prep_strict = prep_strict.max(give);
                    }
                }
                // The least load b brings to another rank (as its last holder).
                let m = wb * share(rr, cb, cb - 1);
                pmin = pmin.min(m);
                if let Some(x) = w.psh.get_mut(slot) {
                    *x = sh;
                }
                for c in [&mut *w.rep_val, &mut *w.swap_mu, &mut *w.swap_val] {
                    if let Some(x) = c.get_mut(slot) {
                        *x = f64::NAN;
                    }
                }
                if let Some(x) = w.rep_mu.get_mut(slot) {
                    *x = rmu;
                }
                let nu = w.nu_of(q, b, q * s + j, sh);
                let nxb = w.nx.get(b).copied().unwrap_or(0.0);
                let u = lq - give;
                for (buf, v) in [
                    (&mut *w.f_u, u),
                    (&mut *w.f_rep, if cb >= 2 { u } else { f64::INFINITY }),
                    (
                        &mut *w.f_rep_onp,
                        if cb >= 2 && holds(w.mask, mw, b, hp) {
                            u
                        } else {
                            f64::INFINITY
                        },
                    ),
                    (&mut *w.f_rho, u + zp * nu),
                    (&mut *w.f_m, m),
                    (&mut *w.f_kap, m - zp * share(rr, cb, 0) * nxb),
                ] {
                    if let Some(x) = buf.get_mut(slot) {
                        *x = v;
                    }
                }
            }
            for (buf, v) in [
                (&mut *w.pmax, pmax),
                (&mut *w.prep, prep),
                (&mut *w.prep_strict, prep_strict),
                (&mut *w.pminp, pmin),
            ] {
                if let Some(x) = buf.get_mut(qi) {
                    *x = v;
                }
            }
        }
        // The heaviest rank's slots by expert load, heaviest first.
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
        let need_of = |best: &Option<Candidate>| best.map_or(floor_gain, |c| c.0.max(floor_gain));
        for &i in slots.iter().take(ns.min(p.movers.max(1))) {
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
            // The slot filter: every move of a over a partner slot is bounded from below by
            // sums of a term of a and a term of the slot (the loads, and the triangle
            // inequality on the spreads, on each side), so one pass over the slots drops the
            // ones that cannot beat the bar; the rest go through the checks below, in order.
            let nsurv = {
                let need = need_of(&best);
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
                let r_mu = if ca >= 2 { f64::INFINITY } else { bar1 + slack };
                let len = partners * s;
                // A replicate leaves p at its value after the replicate on the partner's
                // side, unless the slot's expert is on p too.
                let vp_min = rep_p.iter().fold(f64::INFINITY, |m, x| m.min(x.2));
                let rep_src = if vp_min < bar1 + slack {
                    &*w.f_rep
                } else {
                    &*w.f_rep_onp
                };
                let mut n_s = 0usize;
                let terms = w
                    .f_u
                    .iter()
                    .zip(rep_src.iter())
                    .zip(w.f_rho.iter())
                    .zip(w.f_m.iter())
                    .zip(w.f_kap.iter())
                    .zip(w.rep_mu.iter())
                    .take(len);
                // Branch-free: every slot is written, and the count moves on when it passes
                // (`surv` has room for one more than the slots).
                for (k, (((((&u, &ur), &rho), &m), &kap), &rmu)) in terms.enumerate() {
                    let swap = (m < t_m) & (kap < t_kap) & (u < t_u) & (rho < t_rho);
                    let rep = (ur < r_u) & (rho < r_rho) & (rmu < r_mu);
                    if let Some(x) = w.surv.get_mut(n_s) {
                        *x = k as u32;
                    }
                    n_s += usize::from(swap | rep);
                }
                n_s.min(len)
            };
            let mut si = 0usize;
            while si < nsurv {
                let qi = w.surv.get(si).map_or(0, |&k| k as usize) / s;
                let group = si;
                while si < nsurv && w.surv.get(si).map_or(0, |&k| k as usize) / s == qi {
                    si += 1;
                }
                let Some(&q) = w.order.get(qi) else { break };
                let q = usize::from(q);
                if q == hp || holds(w.mask, mw, a, q) {
                    continue;
                }
                // Loads bound every move of a with q from below: q gains its exact share of a
                // and gives up at most its largest (spare) slot load; p keeps its exact load
                // after a replicate, and gains at least the least load of q's experts in a swap.
                let need = need_of(&best);
                let lq = w.load.get(q).copied().unwrap_or(0.0);
                let a_below_q = below(w.mask, mw, a, q);
                let side = usize::from(q < hp);
                let (dp, mp_rep, vp_rep) = rep_p.get(side).copied().unwrap_or((0.0, 0.0, 0.0));
                let sq_rep = share(rr, ca + 1, a_below_q);
                let rep_ok = fetched < budget && {
                    let qrep = if ca == 1 { &*w.prep_strict } else { &*w.prep }
                        .get(qi)
                        .copied()
                        .unwrap_or(f64::MIN);
                    qrep > f64::MIN
                        && lq + wa * sq_rep - qrep < lp - need
                        && (dp == 0.0 || mp_rep < lp - need)
                };
                let sq_swap = share(rr, ca, a_below_q - usize::from(hp < q));
                let swap_ok = fetched + 2 <= budget && {
                    let qmax = w.pmax.get(qi).copied().unwrap_or(0.0);
                    let pmin = w.pminp.get(qi).copied().unwrap_or(0.0);
                    lq + wa * sq_swap - qmax < lp - 2.0 * need
                        && lp_mu - wa * spa + pmin < lp - 2.0 * need
                };
                if !rep_ok && !swap_ok {
                    continue;
                }
                let syy_q = w.syy.get(q).copied().unwrap_or(0.0);
                let mut cqa = f64::NAN;
                // The other holders of a after a replicate onto q / a swap to q (lazy).
                let ca_rep = Change {
                    e: a,
                    remove: None,
                    add: Some(q),
                };
                let ca_swap = Change {
                    e: a,
                    remove: Some(hp),
                    add: Some(q),
                };
                // A single copy of a has no holder but p: nothing to evaluate.
                let none = if ca == 1 { f64::MIN } else { f64::NAN };
                let (mut oa_rep_mu, mut oa_rep_val) = (none, none);
                let (mut oa_swap_mu, mut oa_swap_val) = (none, none);
                for js in group..si {
                    let j = w.surv.get(js).map_or(0, |&k| k as usize) % s;
                    let Some(&b) = row.get(q * s + j) else { break };
                    let b = usize::from(b);
                    if b == a {
                        continue;
                    }
                    let slot = qi * s + j;
                    let cb = usize::from(w.copies.get(b).copied().unwrap_or(1)).max(1);
                    let wb = w.est.get(b).copied().unwrap_or(0.0);
                    let sqb = w.psh.get(slot).copied().unwrap_or(0.0);
                    let b_on_p = holds(w.mask, mw, b, hp);
                    let mut gab = f64::NAN;
                    // Replicate a onto q over a spare copy of b (1 fetch): p's value is exact
                    // per side (without b on p), q gains its share of a and loses all of b.
                    let rmu = w.rep_mu.get(slot).copied().unwrap_or(f64::MAX);
                    if rep_ok
                        && cb >= 2
                        && fetched < budget
                        && (ca >= 2 || rmu < lp - need_of(&best))
                    {
                        let bar = lp - need_of(&best);
                        let vp = if b_on_p { f64::MIN } else { vp_rep };
                        let quick = (lp_mu - wa * spa)
                            .max(lq + wa * a_min_new - wb * sqb)
                            .max(vp);
                        if quick < bar {
                            if !b_on_p && !shared_holder(w.mask, mw, a, b, hp, q) {
                                let mp = if dp == 0.0 { f64::MIN } else { mp_rep };
                                let mq = lq + (wa * sq_rep + wb * -sqb);
                                let cb_rep = Change {
                                    e: b,
                                    remove: Some(q),
                                    add: None,
                                };
                                if mp.max(mq) < bar && oa_rep_mu.is_nan() {
                                    oa_rep_mu = w.others(mw, ca_rep, (hp, q), false, p.z, false).0;
                                }
                                let ok = mp.max(mq).max(oa_rep_mu) < bar
                                    && rmu < bar
                                    && below_bar(
                                        mq,
                                        w.nu_of(q, b, q * s + j, sqb) - sq_rep * nxa,
                                        bar,
                                        kz,
                                    );
                                if ok {
                                    if cqa.is_nan() {
                                        cqa = w.dot_y(q, a);
                                    }
                                    if gab.is_nan() {
                                        gab = w.dot_x(a, b);
                                    }
                                    let gbb = w.gd.get(b).copied().unwrap_or(0.0);
                                    let cqb = w.cq_of(q, b, q * s + j);
                                    let var =
                                        w.var_of(syy_q, (cqa, cqb), (gaa, gbb, gab), sq_rep, -sqb);
                                    let mut worst = vp.max(value(mq, var, p.z));
                                    if worst < bar {
                                        if oa_rep_val.is_nan() {
                                            oa_rep_val =
                                                w.others(mw, ca_rep, (hp, q), false, p.z, true).1;
                                        }
                                        worst = worst.max(oa_rep_val);
                                    }
                                    if worst < bar {
                                        worst = worst.max(cached(
                                            w,
                                            Cache::RepVal,
                                            slot,
                                            (mw, cb_rep, (hp, q), p.z),
                                        ));
                                    }
                                    offer(worst, lp, floor_gain, 1, (i, q, j, false), &mut best);
                                }
                            } else {
                                let nt = w.record(mw, a, b, hp, q, false);
                                score(w, nt, a, b, lp, mean, p, 1, (i, q, j, false), &mut best);
                            }
                        }
                    }
                    // Swap a and b (2 fetches).
                    if !(swap_ok && !b_on_p && fetched + 2 <= budget) {
                        continue;
                    }
                    let bar = lp - 2.0 * need_of(&best);
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
                                    best = Some(((lp - worst) / 2.0, i, q, j, 2, true));
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
                        score(w, nt, a, b, lp, mean, p, 2, (i, q, j, true), &mut best);
                        continue;
                    }
                    let sbp = share(rr, cb, below(w.mask, mw, b, hp) - usize::from(q < hp));
                    let mp = lp_mu + (wa * -spa + wb * sbp);
                    let mq = lq + (wa * sq_swap + wb * -sqb);
                    if mp.max(mq) >= bar {
                        continue;
                    }
                    if oa_swap_mu.is_nan() {
                        oa_swap_mu = w.others(mw, ca_swap, (hp, q), false, p.z, false).0;
                    }
                    let cb_swap = Change {
                        e: b,
                        remove: Some(q),
                        add: Some(hp),
                    };
                    if oa_swap_mu >= bar
                        || cached(w, Cache::SwapMu, slot, (mw, cb_swap, (hp, q), p.z)) >= bar
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
                            oa_swap_val = w.others(mw, ca_swap, (hp, q), false, p.z, true).1;
                        }
                        worst = worst.max(oa_swap_val);
                    }
                    if worst < bar {
                        worst =
                            worst.max(cached(w, Cache::SwapVal, slot, (mw, cb_swap, (hp, q), p.z)));
                    }
                    offer(worst, lp, floor_gain, 2, (i, q, j, true), &mut best);
                }
            }
        }
        let Some((_, i, q, j, cost, swap)) = best else {
            return;
        };
        let (Some(&a), Some(&b)) = (row.get(hp * s + i), row.get(q * s + j)) else {
            return;
        };
        let (a, b) = (usize::from(a), usize::from(b));
        let nt = w.record(mw, a, b, hp, q, swap);
        w.settle(nt, a, b, true, p.z);
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
        fetched += cost;
    }
}

/// Orders `w.order` by rank value, ascending (ties by rank): from scratch when `fresh`, else by
/// insertion from the last order, which a move leaves nearly sorted (it changes a few values).
fn sort_ranks(w: &mut Work<'_>, fresh: bool) {
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

/// Which per-slot cache of the other holders' effect: after a replicate over the slot or a
/// swap of it, their largest new load or value.
#[derive(Clone, Copy)]
enum Cache {
    RepVal,
    SwapMu,
    SwapVal,
}

/// The other holders' effect for `slot` from the `which` cache, computed once per step.
fn cached(
    w: &mut Work<'_>,
    which: Cache,
    slot: usize,
    (mw, c, pq, z): (usize, Change, (usize, usize), f64),
) -> f64 {
    let values = !matches!(which, Cache::SwapMu);
    let get = |w: &Work<'_>| match which {
        Cache::RepVal => w.rep_val.get(slot).copied(),
        Cache::SwapMu => w.swap_mu.get(slot).copied(),
        Cache::SwapVal => w.swap_val.get(slot).copied(),
    };
    if let Some(x) = get(w)
        && !x.is_nan()
    {
        return x;
    }
    let (mu, val) = w.others(mw, c, pq, true, z, values);
    let x = if values { val } else { mu };
    let dst = match which {
        Cache::RepVal => w.rep_val.get_mut(slot),
        Cache::SwapMu => w.swap_mu.get_mut(slot),
        Cache::SwapVal => w.swap_val.get_mut(slot),
    };
    if let Some(v) = dst {
        *v = x;
    }
    x
}

/// Keeps a move whose worst touched rank ends at `worst` in `best` if it pays at least the floor
/// and more per fetch than what `best` holds.
fn offer(
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
    if best.is_none_or(|c| gain > c.0) {
        *best = Some((gain, i, q, j, cost, swap));
    }
}

/// Scores the move whose deltas `record` left in `w`, clears them, and keeps it in `best` if
/// it pays more per fetch than what `best` holds.
#[allow(clippy::too_many_arguments)]
fn score(
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
    let needed = best.map_or(p.gain_per_fetch * mean, |c| {
        c.0.max(p.gain_per_fetch * mean)
    });
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
    if gain < p.gain_per_fetch * mean {
        return;
    }
    if best.is_none_or(|c| gain > c.0) {
        *best = Some((gain, i, q, j, cost, swap));
    }
}

#[cfg(test)]
mod tests {
    use std::vec;

    use super::*;

    #[test]
    fn tabulated_shares_match_the_log2phy_formula() {
        for n in [1usize, 2, 3, 7, 8, 16, 63, 64, 257] {
            let r = Ranks::new(n);
            for d in 1..=TAB_D + 4 {
                for j in 0..d.min(n) {
                    let want = ((n - 1 - j) / d + 1) as f64 / n as f64;
                    let got = share(&r, d, j);
                    assert!(
                        (got - want).abs() <= 1e-15,
                        "n {n} d {d} j {j}: {got} {want}"
                    );
                }
            }
        }
    }

    /// Runs `cycles` cycles of the policy from a permuted default layout with replicas, on
    /// pseudo-random per-window loads with a few hot experts, and returns every output.
    fn outputs(shape: Shape, windows: usize, cycles: usize, seed: u64) -> vec::Vec<u16> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut current = vec![0u16; shape.placement_len()];
        eplb_core::Layout::Default
            .fill(&shape, &mut current)
            .unwrap();
        let mut policy = Incremental::new();
        let mut scratch = vec![0u64; policy.scratch_len(&shape)];
        let mut state = vec![0u64; policy.state_len(&shape)];
        let mut all = vec::Vec::new();
        for _ in 0..cycles {
            let n = shape.experts();
            let hot: vec::Vec<f64> = (0..shape.loads_len())
                .map(|i| {
                    if i % n < 3 || next() % 7 == 0 {
                        8.0
                    } else {
                        1.0
                    }
                })
                .collect();
            let samples: vec::Vec<f64> = (0..windows * shape.loads_len())
                .map(|i| hot[i % shape.loads_len()] * (next() % 100) as f64)
                .collect();
            let loads: vec::Vec<f64> = (0..shape.loads_len())
                .map(|i| {
                    (0..windows)
                        .map(|t| samples[t * shape.loads_len() + i])
                        .sum()
                })
                .collect();
            let sm = crate::Samples::new(&shape, windows, &samples).unwrap();
            let placement = eplb_core::Placement::new(shape, &current).unwrap();
            let input = Input::new(placement, &loads, Some(sm), 1).unwrap();
            let mut out = vec![0u16; shape.placement_len()];
            policy
                .place(&input, &mut scratch, &mut state, &mut out)
                .unwrap();
            all.extend_from_slice(&out);
            current = out;
        }
        all
    }

    #[test]
    fn the_slot_filter_changes_no_placement() {
        // Shapes with and without replicas, rank counts across one bitset word, one window and
        // many.
        let shapes = [
            (24, 4, 7, 10),
            (40, 8, 6, 6),
            (64, 16, 5, 10),
            (30, 70, 1, 3),
        ];
        for (k, &(n, r, s, t)) in shapes.iter().enumerate() {
            let shape = Shape::new(2, n, r, s).unwrap();
            for seed in 0..4u64 {
                let seed = seed * 0x9e37_79b9 + k as u64 + 7;
                let fast = outputs(shape, t, 4, seed);
                UNFILTERED.with(|c| c.set(true));
                let full = outputs(shape, t, 4, seed);
                UNFILTERED.with(|c| c.set(false));
                assert_eq!(fast, full, "N {n} R {r} S {s} T {t} seed {seed}");
            }
        }
    }

    #[test]
    fn closed_form_variance_matches_the_direct_sum() {
        let shape = Shape::new(1, 6, 3, 3).unwrap();
        let mut scratch = vec![0u64; Work::words(&shape)];
        let mut arena = Arena::new(&mut scratch);
        let mut w = Work::carve(&mut arena, &shape).unwrap();
        w.t = 7;
        w.stride = 9;
        // Deterministic pseudo-random centered samples and rank loads.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 2001) as f64 - 1000.0
        };
        for v in w.xc.iter_mut() {
            *v = next();
        }
        for v in w.y.iter_mut() {
            *v = next();
        }
        for rank in 0..3 {
            w.renew_value(rank, 1.0);
        }
        for rank in 0..3 {
            for (a, b, sa, sb) in [(0, 1, 0.5, -1.0), (2, 5, -1.0, 1.0), (3, 3, 0.25, 0.0)] {
                let direct = w.var_with(rank, a, sa, b, sb);
                let syy = w.syy[rank];
                let (cya, cyb) = (w.dot_y(rank, a), w.dot_y(rank, b));
                let g = (w.dot_x(a, a), w.dot_x(b, b), w.dot_x(a, b));
                let closed = w.var_of(syy, (cya, cyb), g, sa, sb);
                assert!(
                    (direct - closed).abs() <= 1e-9 * direct.abs().max(1.0),
                    "rank {rank} a {a} b {b}: {direct} {closed}"
                );
            }
        }
    }
}
