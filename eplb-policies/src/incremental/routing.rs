//! The log2phy routing-share model: which ranks hold an expert (a bitset per expert) and the
//! share of its tokens each holder receives.

pub(super) fn holds(mask: &[u64], mw: usize, e: usize, r: usize) -> bool {
    mask.get(e * mw + r / 64)
        .is_some_and(|m| m & (1u64 << (r % 64)) != 0)
}

pub(super) fn set_holder(mask: &mut [u64], mw: usize, e: usize, r: usize, on: bool) {
    if let Some(m) = mask.get_mut(e * mw + r / 64) {
        if on {
            *m |= 1u64 << (r % 64);
        } else {
            *m &= !(1u64 << (r % 64));
        }
    }
}

/// Holder counts whose shares are tabulated.
pub(super) const TAB_D: usize = 8;

/// The rank count, its reciprocal, and the shares of up to `TAB_D` holders, tabulated: the
/// search asks for thousands of shares per step.
#[derive(Clone, Copy)]
pub(super) struct Ranks {
    pub(super) n: usize,
    pub(super) inv: f64,
    /// `tab[d (d - 1) / 2 + j]`: the share of holder `j` among `d`.
    pub(super) tab: [f64; TAB_D * (TAB_D + 1) / 2],
}

impl Ranks {
    pub(super) fn new(n: usize) -> Self {
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
    pub(super) fn compute(&self, d: usize, j: usize) -> f64 {
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
pub(super) fn share(r: &Ranks, d: usize, j: usize) -> f64 {
    if d <= TAB_D
        && j < d
        && let Some(&x) = r.tab.get(d * (d.wrapping_sub(1)) / 2 + j)
    {
        return x;
    }
    r.compute(d, j)
}

/// The current share of expert `e` on holder `rank` (0 if it does not hold it).
pub(super) fn share_of(mask: &[u64], mw: usize, r: &Ranks, e: usize, rank: usize) -> f64 {
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

/// The ranks holding expert `e`, ascending, from its bitset words.
pub(super) fn ranks_holding(mask: &[u64], mw: usize, e: usize) -> impl Iterator<Item = usize> + '_ {
    let words = mask.get(e * mw..(e + 1) * mw).unwrap_or(&[]);
    words.iter().enumerate().flat_map(|(wi, &m)| {
        let mut bits = m;
        core::iter::from_fn(move || {
            (bits != 0).then(|| {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                wi * 64 + b
            })
        })
    })
}

/// Holders of expert `e` below `rank`.
pub(super) fn below(mask: &[u64], mw: usize, e: usize, rank: usize) -> usize {
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
pub(super) fn shared_holder(
    mask: &[u64],
    mw: usize,
    a: usize,
    b: usize,
    p: usize,
    q: usize,
) -> bool {
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

/// One planned change of holders: expert `e` leaves `remove` and/or gains `add`.
#[derive(Clone, Copy)]
pub(super) struct Change {
    pub(super) e: usize,
    pub(super) remove: Option<usize>,
    pub(super) add: Option<usize>,
}

/// A change of one expert's holders at a partner `q`, with the step's heaviest rank `p`: what
/// the other holders' effect is tabulated for ([`super::Work::effect`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Shift {
    /// The expert leaves `q` (the partner's expert under a replicate).
    Leave,
    /// The expert moves from `q` to `p` (the partner's expert in a swap).
    ToP,
    /// The expert gains `q` (the mover of a replicate).
    Join,
    /// The expert moves from `p` to `q` (the mover of a swap).
    FromP,
}

impl Shift {
    /// Whether the change is the second expert of a move (the partner's, held by `q`).
    pub(super) fn as_b(self) -> bool {
        matches!(self, Shift::Leave | Shift::ToP)
    }

    /// The change of expert `e`'s holders.
    #[cfg(test)]
    pub(super) fn change(self, e: usize, q: usize, p: usize) -> Change {
        let (remove, add) = match self {
            Shift::Leave => (Some(q), None),
            Shift::ToP => (Some(q), Some(p)),
            Shift::Join => (None, Some(q)),
            Shift::FromP => (Some(p), Some(q)),
        };
        Change { e, remove, add }
    }
}

/// Calls `f(rank, ds)` for every holder of `c.e` (before or after) whose log2phy share changes
/// by `ds != 0` when the expert loses `c.remove` and/or gains `c.add`.
pub(super) fn share_changes(
    mask: &[u64],
    mw: usize,
    rr: &Ranks,
    c: Change,
    mut f: impl FnMut(usize, f64),
) {
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
