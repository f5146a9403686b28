//! Rank loads, peak-to-average ratio (PAR), the hotness numbers and the lower bound.

use crate::placement::check_len;
use crate::{Error, LayerPlacement, Placement, Shape};

/// How an expert's tokens are split over its replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// Each of the `c_e` slots of `e` gets `w_e / c_e` (vLLM's and SGLang's hash dispatch, and
    /// the assumption of vLLM-Ascend's hotness log).
    Even,
    /// vLLM-Ascend's static `log2phy` choice: tokens originate evenly over the `R` source ranks,
    /// source `q` sends all of `e` to its `q mod d`-th distinct holder, so holder `j` receives
    /// `m_j / R` with `m_j = floor((R - 1 - j) / d) + 1`; a second slot on one rank gets nothing.
    #[default]
    Log2Phy,
}

impl Routing {
    /// The command-line name: `even` or `log2phy`.
    pub fn name(self) -> &'static str {
        match self {
            Routing::Even => "even",
            Routing::Log2Phy => "log2phy",
        }
    }
}

/// A routing name that is neither `even` nor `log2phy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownRouting;

impl core::fmt::Display for UnknownRouting {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("unknown routing; expected `even` or `log2phy`")
    }
}

impl core::error::Error for UnknownRouting {}

impl core::str::FromStr for Routing {
    type Err = UnknownRouting;

    /// `even` or `log2phy` (exactly, as the command line and `simulate --json` spell them).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "even" => Ok(Routing::Even),
            "log2phy" => Ok(Routing::Log2Phy),
            _ => Err(UnknownRouting),
        }
    }
}

/// The routing share of `log2phy`, used by the metrics, the policies' scoring and the
/// simulator alike: of the `ranks` source ranks, how many send an expert's tokens to its `j`-th
/// distinct holder (ranks ascending) when it has `holders` of them: `m_j = floor((R - 1 - j) /
/// d) + 1` (`j` is clamped to `R - 1`; 0 when there are no ranks or no holders). Holder `j`
/// receives the fraction `m_j / R`.
pub const fn log2phy_sources(ranks: usize, holders: usize, j: usize) -> usize {
    if ranks == 0 || holders == 0 {
        return 0;
    }
    let j = if j < ranks { j } else { ranks - 1 };
    (ranks - 1 - j) / holders + 1
}

/// Scratch length (in `u32`) that [`rank_loads`] and [`hotness`] need: `2 * N`.
pub const fn scratch_len(shape: &Shape) -> usize {
    2 * shape.experts()
}

/// Checks that every load is finite and non-negative.
pub fn check_loads(layer: usize, loads: &[f64]) -> Result<(), Error> {
    match loads.iter().position(|w| !(w.is_finite() && *w >= 0.0)) {
        Some(index) => Err(Error::BadLoad {
            layer: layer as u16,
            index,
        }),
        None => Ok(()),
    }
}

/// Writes the load of every rank (`[R]`) of one layer under `routing`, given logical loads `[N]`.
/// `scratch` needs [`scratch_len`] values.
pub fn rank_loads(
    layer: &LayerPlacement<'_>,
    loads: &[f64],
    routing: Routing,
    scratch: &mut [u32],
    out: &mut [f64],
) -> Result<(), Error> {
    let shape = *layer.shape();
    let (n, r) = (shape.experts(), shape.ranks());
    check_len("logical loads [N]", n, loads.len())?;
    check_len("rank loads [R]", r, out.len())?;
    check_len("metrics scratch [2N]", 2 * n, scratch.len())?;
    check_loads(layer.index(), loads)?;
    let (count, seen) = scratch.split_at_mut(n);
    count.fill(0);
    seen.fill(0);
    count_holders(layer, routing, count);
    match routing {
        Routing::Even => {
            for (o, row) in out.iter_mut().zip(layer.rows()) {
                *o = row
                    .iter()
                    .map(|&e| {
                        let e = usize::from(e);
                        let c = count.get(e).copied().unwrap_or(1).max(1);
                        loads.get(e).copied().unwrap_or(0.0) / f64::from(c)
                    })
                    .sum();
            }
        }
        Routing::Log2Phy => {
            let rf = r as f64;
            for (o, row) in out.iter_mut().zip(layer.rows()) {
                let mut sum = 0.0;
                for (s, &e) in row.iter().enumerate() {
                    if !is_first_in_row(row, s) {
                        continue;
                    }
                    let e = usize::from(e);
                    let (Some(&d), Some(j), Some(&w)) =
                        (count.get(e), seen.get_mut(e), loads.get(e))
                    else {
                        continue;
                    };
                    let m = log2phy_sources(r, d.max(1) as usize, *j as usize);
                    *j += 1;
                    sum += w * m as f64 / rf;
                }
                *o = sum;
            }
        }
    }
    Ok(())
}

/// Writes the load of every slot (`[R][S]`) of one layer under `routing`, given logical loads
/// `[N]`: the per-slot form of [`rank_loads`] (a rank's slots sum to its load). Under
/// `log2phy` a second copy of an expert on one rank gets nothing. `scratch` needs
/// [`scratch_len`] values.
pub fn slot_loads(
    layer: &LayerPlacement<'_>,
    loads: &[f64],
    routing: Routing,
    scratch: &mut [u32],
    out: &mut [f64],
) -> Result<(), Error> {
    let shape = *layer.shape();
    let (n, r) = (shape.experts(), shape.ranks());
    check_len("logical loads [N]", n, loads.len())?;
    check_len("slot loads [R][S]", shape.slots_per_layer(), out.len())?;
    check_len("metrics scratch [2N]", 2 * n, scratch.len())?;
    check_loads(layer.index(), loads)?;
    let (count, seen) = scratch.split_at_mut(n);
    count.fill(0);
    seen.fill(0);
    out.fill(0.0);
    let s_per = shape.slots_per_rank().max(1);
    count_holders(layer, routing, count);
    match routing {
        Routing::Even => {
            for (o, &e) in out.iter_mut().zip(layer.as_slice()) {
                let e = usize::from(e);
                let c = count.get(e).copied().unwrap_or(1).max(1);
                *o = loads.get(e).copied().unwrap_or(0.0) / f64::from(c);
            }
        }
        Routing::Log2Phy => {
            let rf = r as f64;
            for (orow, row) in out.chunks_exact_mut(s_per).zip(layer.rows()) {
                for (s, (o, &e)) in orow.iter_mut().zip(row).enumerate() {
                    if !is_first_in_row(row, s) {
                        continue;
                    }
                    let e = usize::from(e);
                    let (Some(&d), Some(j), Some(&w)) =
                        (count.get(e), seen.get_mut(e), loads.get(e))
                    else {
                        continue;
                    };
                    let m = log2phy_sources(r, d.max(1) as usize, *j as usize);
                    *j += 1;
                    *o = w * m as f64 / rf;
                }
            }
        }
    }
    Ok(())
}

/// Writes each expert's number of copies the routing splits its tokens over into `count`
/// (`[N]`, zeroed): every slot under `even`, every distinct holding rank under `log2phy`.
fn count_holders(layer: &LayerPlacement<'_>, routing: Routing, count: &mut [u32]) {
    match routing {
        Routing::Even => {
            for &e in layer.as_slice() {
                if let Some(c) = count.get_mut(usize::from(e)) {
                    *c += 1;
                }
            }
        }
        Routing::Log2Phy => {
            for row in layer.rows() {
                for (s, &e) in row.iter().enumerate() {
                    if is_first_in_row(row, s)
                        && let Some(c) = count.get_mut(usize::from(e))
                    {
                        *c += 1;
                    }
                }
            }
        }
    }
}

fn is_first_in_row(row: &[u16], s: usize) -> bool {
    match (row.get(s), row.get(..s)) {
        (Some(e), Some(before)) => !before.contains(e),
        _ => false,
    }
}

/// Peak-to-average ratio `max / mean` of rank loads. A layer with no load is perfectly balanced:
/// 1.0, never NaN.
pub fn par(rank_loads: &[f64]) -> f64 {
    let total: f64 = rank_loads.iter().sum();
    if rank_loads.is_empty() || total <= 0.0 || !total.is_finite() {
        return 1.0;
    }
    let max = rank_loads.iter().copied().fold(f64::MIN, f64::max);
    max / (total / rank_loads.len() as f64)
}

/// PAR of one layer under `routing`. `scratch` needs [`scratch_len`] values, `rank_buf` `R`.
pub fn layer_par(
    layer: &LayerPlacement<'_>,
    loads: &[f64],
    routing: Routing,
    scratch: &mut [u32],
    rank_buf: &mut [f64],
) -> Result<f64, Error> {
    rank_loads(layer, loads, routing, scratch, rank_buf)?;
    Ok(par(rank_buf))
}

/// Mean and max of per-layer PAR: the numbers of vLLM-Ascend's `[Expert Hotness]` log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hotness {
    /// Mean PAR over layers.
    pub mean: f64,
    /// Max PAR over layers.
    pub max: f64,
}

/// Per-layer PAR of `placement` under `loads` (`[L][N]`), written to `per_layer` (`[L]`), and the
/// mean and max over layers. `scratch` needs [`scratch_len`] values, `rank_buf` `R`.
pub fn hotness(
    placement: &Placement<'_>,
    loads: &[f64],
    routing: Routing,
    scratch: &mut [u32],
    rank_buf: &mut [f64],
    per_layer: &mut [f64],
) -> Result<Hotness, Error> {
    let shape = placement.shape();
    check_len("logical loads [L][N]", shape.loads_len(), loads.len())?;
    check_len("per-layer PAR [L]", shape.layers(), per_layer.len())?;
    let mut sum = 0.0;
    let mut max = 1.0f64;
    for ((layer, w), p) in placement
        .layers()
        .zip(loads.chunks_exact(shape.experts()))
        .zip(per_layer.iter_mut())
    {
        *p = layer_par(&layer, w, routing, scratch, rank_buf)?;
        sum += *p;
        max = max.max(*p);
    }
    Ok(Hotness {
        mean: sum / shape.layers() as f64,
        max,
    })
}

/// The per-layer lower bound on PAR for any placement and any split (`research/peers.md` §4):
/// `max(W/R, m*) / (W/R)`, where `m*` is the smallest possible max per-copy load with at most one
/// copy per rank and `R * S` copies in all, found exactly by greedy apportionment (each extra copy
/// goes to the uncapped expert with the largest `w_e / c_e`). `copies` is scratch of `N` values.
/// A layer with no load gives 1.0. `O(X * N)`.
pub fn lower_bound_par(shape: &Shape, loads: &[f64], copies: &mut [u16]) -> Result<f64, Error> {
    let (n, r) = (shape.experts(), shape.ranks());
    check_len("logical loads [N]", n, loads.len())?;
    check_len("lower-bound scratch [N]", n, copies.len())?;
    check_loads(0, loads)?;
    let total: f64 = loads.iter().sum();
    if total <= 0.0 {
        return Ok(1.0);
    }
    copies.fill(1);
    let cap = r.min(usize::from(u16::MAX)) as u16;
    for _ in 0..shape.redundant() {
        let mut best: Option<(usize, f64)> = None;
        for (e, (&w, &c)) in loads.iter().zip(copies.iter()).enumerate() {
            if c >= cap {
                continue;
            }
            let u = w / f64::from(c);
            if best.is_none_or(|(_, b)| u > b) {
                best = Some((e, u));
            }
        }
        match best.and_then(|(e, _)| copies.get_mut(e)) {
            Some(c) => *c += 1,
            None => break,
        }
    }
    let m_star = loads
        .iter()
        .zip(copies.iter())
        .map(|(&w, &c)| w / f64::from(c.max(1)))
        .fold(0.0f64, f64::max);
    let avg = total / r as f64;
    Ok(avg.max(m_star) / avg)
}

/// Weight fetches from `old` to `new` (both `[..][R][S]` rows of `slots_per_rank` ids): for each
/// row, the distinct ids of the new row that the old row does not hold. Slot-only reshuffles
/// within a rank count 0; a duplicate in the new row counts once; an
/// [`EMPTY`](crate::EMPTY) slot (no expert) fetches nothing. Ragged input counts only the whole
/// rows both hold.
pub fn moves(old: &[u16], new: &[u16], slots_per_rank: usize) -> usize {
    if slots_per_rank == 0 {
        return 0;
    }
    old.chunks_exact(slots_per_rank)
        .zip(new.chunks_exact(slots_per_rank))
        .map(|(o, n)| {
            n.iter()
                .enumerate()
                .filter(|&(i, e)| *e != crate::EMPTY && is_first_in_row(n, i) && !o.contains(e))
                .count()
        })
        .sum()
}

/// Slots whose content differs between `old` and `new` (intra-rank moves included).
pub fn slot_writes(old: &[u16], new: &[u16]) -> usize {
    old.iter().zip(new).filter(|(a, b)| a != b).count()
}
