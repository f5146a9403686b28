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
//!    `load(p) - min_gain * mean * fetches`; so every move pays, the sorted load vector
//!    falls lexicographically, and the search stops by itself. A per-layer budget
//!    (`max_fetch_fraction`) and a per-call budget (`max_fetches`) cap the fetches. A layer
//!    whose heaviest rank cannot be lowered enough is left as it is.
//!
//! **Cold start** (`cold_start`, default 5). A layer whose heaviest rank carries more than
//! `cold_start` times the mean rank load (the start-up layout under skewed heat, or a placement the
//! traffic has left far behind) is rebuilt constructively (`construct.rs`): replica counts go
//! greedily to the largest estimated load per copy and, with two slots per rank, are then refined
//! against the packing (there the counts with the smallest largest copy are not the ones that pack
//! best); the copies are packed heaviest first onto the lightest rank with room that does not hold
//! the expert (a rank that holds it now is taken when within 2% of the mean of the lightest and not
//! above the heaviest so far, which costs no fetch); swaps between the heaviest packed rank and
//! lighter ones, and copies shifted to its experts where the counts bound it, then take it to
//! within 0.1% of the mean where they can; and the packed ranks are matched to the current ranks by
//! shared experts (greedy by levels, then augmenting paths), so that few slots change. The rebuild
//! is taken if it lowers the heaviest rank's load within the fetch budgets; a rebuilt layer is left
//! as built for this call (the search polishes it from the next call on), any other layer goes to
//! the search; and a layer the search leaves stalled above 1.2 times the mean is rebuilt from where
//! it started when the rebuild's heaviest rank is at least 10% lower (single moves cannot repair a
//! hot expert that needs several more copies at once: on Zipf heat at EP32 the search stops at PAR
//! 1.42). Past 5 times the mean, single moves repair a layer badly (on Zipf heat the search stops
//! at PAR 1.28-1.31 at EP256-EP384 and takes 0.3-0.7 s), while the rebuild lands better balanced
//! than FlashLB in 25-50 ms with fewer fetches; below it, in the serving loop, the search's moves,
//! each paying per fetch, fetch less than rebuilds (dsv3_drift_perm R64: `cold_start=2.5` fetched
//! 20% more, 4 fetched 1.6% more, for 0.03-0.15% better balance; at 5 no layer of the tuning or
//! validation loops is rebuilt, nor left stalled, so their placements are unchanged).
//! `cold_start=1` rebuilds every layer, for a one-shot plan from the default layout (what `eplb
//! plan` uses there unless told otherwise): better balanced than FlashLB (on the golden DeepSeek-V3
//! cases 0.1% above the mean against its 0.5-1.6%; on Zipf heat at EP128-EP384 0.2-3% lower) in a
//! few milliseconds, with fewer fetches (`BENCHMARKS.md`, "The incremental policy at wide EP").
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
//! The other holders of a moved expert (their largest new load and value) are tabulated once
//! per step and expert, for every position of the partner among its holders at once: a
//! holder's new share depends on the partner only by whether the partner is below it, so a
//! prefix and a suffix maximum over the holders give all positions in `O(d)` (`O(d T)` for
//! the values), and a candidate reads them in `O(1)` instead of walking the `d` holders.
//! The slot terms these checks and the filter below read (each slot's index among its
//! expert's holders, its share and load, its rank's load and spread without it, the other
//! holders' largest new load when it leaves) are kept per rank across the steps of a layer
//! (`partners.rs`): a move changes the loads of the ranks it touches and the holders of its
//! two experts, so only their slots and those of the experts with another copy on a touched
//! rank are recomputed, and each step gathers the table in partner order, with the few
//! entries that depend on the heaviest rank (its own experts' other holders) applied then.
//! Before those checks, one branch-free pass per mover over the partner slots drops every slot
//! that cannot beat the bar: on each side a move's value is bounded from below by the sum of a
//! term of the mover and a term of the slot (the load it brings or leaves, and the triangle
//! bound on the spread), so the pass compares four precomputed slot terms with four thresholds
//! (three for a replicate), 64 slots at a time into a bitset (vectorized), and the checks
//! visit the set bits.
//! It only drops moves that the checks would reject, so the result is the same. The rank
//! order is kept by insertion from the last step.
//!
//! **The bound.** With `B` the layer's fetch budget (`min(max_fetch_fraction R S,
//! max_fetches)`), `K <= R - 1` partners, `M <= min(movers, S)` movers and `D <= R` the most
//! copies of an expert, each accepted move fetches at least once, so a layer takes at most
//! `min(4 R S, B + 1)` steps, each `O(R^2 + R S (S + T) + M K S D)` (the rank order, the
//! tables of the other holders' effect, the partner table when a move leaves all of it stale,
//! the slot filter and the exact checks; only a candidate whose two experts share a third
//! holder still walks the holders). One call is therefore
//! `O(L (T N + min(4 R S, B + 1) (R^2 + R S (S + T) + M K S D)))`, or instead
//! `O(N log N + S^2 R^2)` for a layer the cold start rebuilds (`construct.rs`); at most
//! `O(L (T N + (R S)^2 (R S + T)))` in the worst case (`M <= S`, `K, D <= R`), so the supported
//! range of [`crate::check_range`] (`R <= 2048`, `R S <= 4096`) is refused up front by
//! [`crate::rebalance`] and [`crate::buffer_lens`] before any work. The typical cost is far
//! below the worst case: the filter leaves few slots per mover and most experts have one copy,
//! so a cold call of the search grows about `R^0.7` to `R^1.9` per doubling at `N = R`
//! (`BENCHMARKS.md`, "The incremental policy at wide EP").
//!
//! # Memory
//!
//! Scratch: per-expert estimates, sums and holder bitsets, `(64 + 8) x N` centered samples,
//! per-rank loads, sums and centered loads, per-slot caches and filter terms, the per-holder
//! tables of the other holders' effect, and the cold start's counts, packed ranks and matching:
//! `O(N (82 + R/64) + R (93 + 25 S))` words. State: a header, `L x N` estimates, `L` history
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

use crate::arena::{Arena, Words};
use crate::params::{self, ParamError, ParamInfo};
use crate::{Error, Input, Policy, PolicyKind};

mod construct;
mod estimate;
mod partners;
mod routing;
mod search;
#[cfg(test)]
mod tests;
mod variance;
mod work;

use construct::construct;
use estimate::{estimate, workload_spread};
use partners::{gather, partner_slot, refresh, stale_after, stale_all};
use routing::*;
use search::*;
use variance::*;
use work::Work;

/// Tuning of [`Incremental`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// `min_gain`: a move must lower the heaviest rank by at least this fraction of the mean
    /// rank load per weight fetch; a move that gains less per fetch is not taken. (The
    /// rebuilds of the cold start are governed by `cold_start` alone: with a high `min_gain`
    /// the search takes no move and leaves far layers stalled, which are then rebuilt; add
    /// `cold_start = inf` to change nothing.)
    pub min_gain: f64,
    /// `max_fetches`: at most this many weight fetches per call, over all layers (planned in
    /// order, so the first layers are served first). The default, `usize::MAX`, sets no cap.
    pub max_fetches: usize,
    /// At most this fraction of a layer's slots is fetched per cycle.
    pub max_fetch_fraction: f64,
    /// `cold_start`: a layer whose heaviest rank carries more than this multiple of the mean
    /// rank load is rebuilt constructively (replica counts refined against the packing, LPT
    /// packing, swaps and count shifts from the heaviest packed rank, matched to the current
    /// ranks) when that lowers its heaviest rank within the fetch budgets; the search polishes
    /// a rebuilt layer from the next call on. `1` rebuilds every layer (a one-shot plan; what
    /// `eplb plan` uses from the default layout); the default, 5, only layers single moves
    /// repair badly; infinity never rebuilds.
    pub cold_start: f64,
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
    /// H=10, A=1 (`BENCHMARKS.md`): a layer is rebuilt past 5 times the mean (no layer of
    /// those loops is; at 4, one R64 call is, with 1.6% more fetches), a move must gain 1% of
    /// the mean rank load per fetch, ranks
    /// are valued at mean + 1.6 sd of their per-window load (the windows' spread plus half the
    /// spread of the last 8 cycles' workloads), and every other rank is tried as a partner:
    /// the best move per fetch is often a replicate over a spare copy, and spare copies sit on
    /// any rank (with only the 15 lightest ranks, DeepSeek-V3 at R=64 balanced worse and
    /// fetched 12% more).
    fn default() -> Self {
        Self {
            min_gain: 0.01,
            max_fetches: usize::MAX,
            max_fetch_fraction: 1.0,
            cold_start: 5.0,
            partners: usize::MAX,
            shift_threshold: 2.5,
            history_windows: 30.0,
            z: 1.6,
            movers: 16,
            workload_weight: 0.5,
        }
    }
}

/// The parameters of [`Params::set`], in order.
pub const PARAMS: [ParamInfo; 10] = [
    ParamInfo {
        name: "min_gain",
        range: ">= 0",
    },
    ParamInfo {
        name: "max_fetches",
        range: "an integer >= 0",
    },
    ParamInfo {
        name: "max_fetch_fraction",
        range: "in (0, 1]",
    },
    ParamInfo {
        name: "cold_start",
        range: ">= 1, or inf (never)",
    },
    ParamInfo {
        name: "partners",
        range: "an integer >= 1",
    },
    ParamInfo {
        name: "movers",
        range: "an integer >= 1",
    },
    ParamInfo {
        name: "shift_threshold",
        range: ">= 0",
    },
    ParamInfo {
        name: "history_windows",
        range: ">= 0",
    },
    ParamInfo {
        name: "workload_weight",
        range: ">= 0",
    },
    ParamInfo {
        name: "z",
        range: ">= 0",
    },
];

impl Params {
    /// Sets the parameter `key` (one of [`PARAMS`], named as the field) to `value`, checking
    /// its range.
    pub fn set<'k>(&mut self, key: &'k str, value: f64) -> Result<(), ParamError<'k>> {
        let info = params::find(&PARAMS, PolicyKind::Incremental, key)?;
        let at_least_0 = |v: f64| params::real(info, v, v >= 0.0);
        match info.name {
            "min_gain" => self.min_gain = at_least_0(value)?,
            "max_fetches" => self.max_fetches = params::whole(info, value, 0.0)?,
            "max_fetch_fraction" => {
                self.max_fetch_fraction = params::real(info, value, value > 0.0 && value <= 1.0)?
            }
            "cold_start" => {
                self.cold_start = if value == f64::INFINITY {
                    value
                } else {
                    params::real(info, value, value >= 1.0)?
                }
            }
            "partners" => self.partners = params::whole(info, value, 1.0)?,
            "movers" => self.movers = params::whole(info, value, 1.0)?,
            "shift_threshold" => self.shift_threshold = at_least_0(value)?,
            "history_windows" => self.history_windows = at_least_0(value)?,
            "workload_weight" => self.workload_weight = at_least_0(value)?,
            _ => self.z = at_least_0(value)?,
        }
        Ok(())
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

    /// The parameters, to change ([`Params::set`]).
    pub fn params_mut(&mut self) -> &mut Params {
        &mut self.params
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

impl Policy for Incremental {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Incremental
    }

    fn scratch_len(&self, shape: &Shape) -> usize {
        Work::words(shape).get()
    }

    fn state_len(&self, shape: &Shape) -> usize {
        // Checked: saturates, see [`Words`].
        let loads = Words(shape.layers()) * Words(shape.experts());
        (loads + 2 + shape.layers() + PAST * loads + shape.layers()).get()
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
        let mut fetches_left = self.params.max_fetches;
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
            search(&shape, &self.params, &mut w, row, fetches_left);
            // An expert that left a rank and came back sits in its old slot again.
            let s = shape.slots_per_rank();
            let old = current
                .as_slice()
                .get(l * per..(l + 1) * per)
                .unwrap_or(&[]);
            for (o, nrow) in old.chunks_exact(s).zip(row.chunks_exact_mut(s)) {
                crate::common::keep_slots(o, nrow, w.keep)?;
            }
            // The search counted at least the slots that changed, so this stays within the cap.
            let fetched = old.iter().zip(row.iter()).filter(|(a, b)| a != b).count();
            fetches_left = fetches_left.saturating_sub(fetched);
        }
        Ok(())
    }
}
