//! Heat: the per-slot ring a rank counts into, over caller storage, and the fold of every
//! rank's gathered ring through the placement into logical heat.
//!
//! Forms, once each: u64 `[W][L][S]` (one rank's ring, [`HeatRing`]) → u64 `[R][T][L][S]` (the
//! gather, rank-major) → f64 `[T][L][N]` (`samples`) → f64 `[L][N]` (`loads`, the sum over `T`)
//! ([`fold_slot_heat`]).

use crate::placement::check_len;
use crate::{Error, Placement, Shape};

/// The most windows the ring keeps per cycle (FlashLB's sample count).
pub const MAX_WINDOWS: usize = 64;

/// The ring size and window width used for a heat interval of `h` iterations: at most
/// [`MAX_WINDOWS`] windows, each summing `ceil(h / windows)` iterations. The one place the
/// window count is computed.
pub fn layout_for_interval(h: u32) -> Result<(usize, u32), Error> {
    if h == 0 {
        return Err(Error::ZeroInterval {
            what: "heat interval",
        });
    }
    let w = (h as usize).min(MAX_WINDOWS);
    Ok((w, h.div_ceil(w as u32)))
}

/// Storage needed for a ring of `windows` windows of `shape`: `windows * L * S` words
/// (`windows` from [`layout_for_interval`]).
pub const fn ring_len(shape: &Shape, windows: usize) -> usize {
    windows * shape.layers() * shape.slots_per_rank()
}

/// One rank's per-slot heat ring `[W][L][S]` of token counts, over caller storage `B` (a
/// `&mut [u64]`, or any owner of a `[u64]` such as a `Vec<u64>` in std code).
///
/// Counted iteration `k` of a cycle goes to window `k / per` (`W` and `per` from
/// [`layout_for_interval`], so `W * per >= h`: a cycle's `h` counted iterations fit without
/// wrapping). [`HeatRing::held`] is what the rank sends in the heat gather; [`HeatRing::reset`]
/// starts the next cycle.
#[derive(Debug, Clone)]
pub struct HeatRing<B> {
    per: u32,
    counted: u32,
    /// `W`.
    capacity: usize,
    /// `L * S`: the words of one window.
    words: usize,
    storage: B,
}

impl<B: AsRef<[u64]> + AsMut<[u64]>> HeatRing<B> {
    /// A ring for a heat interval of `heat_interval` iterations over `storage` (exactly
    /// [`ring_len`] words for the interval's window count; zeroed here).
    pub fn new(shape: &Shape, heat_interval: u32, mut storage: B) -> Result<Self, Error> {
        let (w, per) = layout_for_interval(heat_interval)?;
        check_len(
            "heat ring [W][L][S]",
            ring_len(shape, w),
            storage.as_ref().len(),
        )?;
        storage.as_mut().fill(0);
        Ok(Self {
            per,
            counted: 0,
            capacity: w,
            words: shape.layers() * shape.slots_per_rank(),
            storage,
        })
    }

    /// Iterations summed per window.
    pub fn per_window(&self) -> u32 {
        self.per
    }

    /// Windows the ring holds, `W`.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Iterations counted since the last reset.
    pub fn counted(&self) -> u32 {
        self.counted
    }

    /// Windows counted into so far, `T = ceil(counted / per)`.
    pub fn windows(&self) -> usize {
        self.counted.div_ceil(self.per) as usize
    }

    /// Adds one counted iteration's per-slot counts `[L][S]` into window `counted / per`.
    ///
    /// Errors: `counts` of the wrong length; more counted iterations than the ring's `W * per`
    /// (nothing is added then).
    pub fn add(&mut self, counts: &[u32]) -> Result<(), Error> {
        check_len("slot counts [L][S]", self.words, counts.len())?;
        let overflow = Error::Overflow {
            what: "heat ring [W][L][S] (iterations counted past its windows)",
        };
        let next = self.counted.checked_add(1).ok_or(overflow)?;
        let b = (self.counted / self.per) as usize;
        if b >= self.capacity {
            return Err(overflow);
        }
        let start = b * self.words;
        let window = self
            .storage
            .as_mut()
            .get_mut(start..start + self.words)
            .ok_or(overflow)?;
        for (h, &c) in window.iter_mut().zip(counts) {
            *h = h.saturating_add(u64::from(c));
        }
        self.counted = next;
        Ok(())
    }

    /// The windows counted so far, `[T][L][S]`: what the rank sends in the heat gather.
    pub fn held(&self) -> &[u64] {
        self.storage
            .as_ref()
            .get(..self.windows() * self.words)
            .unwrap_or(&[])
    }

    /// Forgets the counted iterations, zeroing only the windows counted into.
    pub fn reset(&mut self) {
        let n = self.windows() * self.words;
        if let Some(d) = self.storage.as_mut().get_mut(..n) {
            d.fill(0);
        }
        self.counted = 0;
    }

    /// The whole storage, `[W][L][S]`.
    pub fn as_slice(&self) -> &[u64] {
        self.storage.as_ref()
    }
}

/// Adds `values[i]` into `out[ids[i]]` for every slot `i` of one placement row: the fold of
/// per-slot heat into logical experts. Pairs stop at the shorter of `ids` and `values`; an id
/// outside `out` is skipped (a validated placement holds ids below `N` or [`EMPTY`](crate::EMPTY)).
pub fn fold_row(ids: &[u16], values: impl IntoIterator<Item = f64>, out: &mut [f64]) {
    for (&e, v) in ids.iter().zip(values) {
        if let Some(o) = out.get_mut(usize::from(e)) {
            *o += v;
        }
    }
}

/// Folds the gathered slot heat of the ranks that serve `gathered` (`[R'][T][L][S]`,
/// rank-major in ascending rank order, `R'` = `placement.live_count()`, `T = windows`: what a
/// gather over the live ranks returns) through `placement` (the placement it was counted on,
/// validated) into logical per-window heat `samples` (`[T][L][N]`) and its sum over the windows
/// `loads` (`[L][N]`). [`EMPTY`](crate::EMPTY) slots fold nothing. Both outputs are overwritten;
/// on an error neither is touched.
///
/// Errors: a slice of the wrong length (which one, expected and given lengths); sizes that
/// overflow `usize`.
pub fn fold_slot_heat(
    placement: &Placement<'_>,
    windows: usize,
    gathered: &[u64],
    samples: &mut [f64],
    loads: &mut [f64],
) -> Result<(), Error> {
    let shape = placement.shape();
    let (l, s, n) = (shape.layers(), shape.slots_per_rank(), shape.experts());
    let overflow = Error::Overflow {
        what: "heat windows [T]",
    };
    let part = windows.checked_mul(l * s).ok_or(overflow)?;
    check_len(
        "gathered slot heat of the live ranks [R'][T][L][S]",
        part.checked_mul(placement.live_count()).ok_or(overflow)?,
        gathered.len(),
    )?;
    check_len(
        "heat samples [T][L][N]",
        windows.checked_mul(l * n).ok_or(overflow)?,
        samples.len(),
    )?;
    check_len("heat loads [L][N]", l * n, loads.len())?;
    fold_chunks(
        shape,
        placement.as_slice(),
        part,
        gathered,
        (0..shape.ranks()).filter(|&r| placement.is_live(r)),
        samples,
        loads,
    );
    Ok(())
}

/// The fold of [`fold_slot_heat`] once every length is checked: chunk `i` of `gathered` is the
/// heat of rank `ranks[i]`.
fn fold_chunks(
    shape: &Shape,
    placement: &[u16],
    part: usize,
    gathered: &[u64],
    ranks: impl Iterator<Item = usize>,
    samples: &mut [f64],
    loads: &mut [f64],
) {
    let (l, s, n) = (shape.layers(), shape.slots_per_rank(), shape.experts());
    let per_layer = shape.slots_per_layer();
    samples.fill(0.0);
    loads.fill(0.0);
    if part == 0 || s == 0 || n == 0 || l == 0 {
        return;
    }
    for (rank, chunk) in ranks.zip(gathered.chunks_exact(part)) {
        let lo = rank * s;
        for (win, out) in chunk
            .chunks_exact(l * s)
            .zip(samples.chunks_exact_mut(l * n))
        {
            for ((row, out), layer) in win
                .chunks_exact(s)
                .zip(out.chunks_exact_mut(n))
                .zip(placement.chunks_exact(per_layer))
            {
                let ids = layer.get(lo..lo + s).unwrap_or(&[]);
                fold_row(ids, row.iter().map(|&c| c as f64), out);
            }
        }
    }
    for win in samples.chunks_exact(l * n) {
        for (a, &b) in loads.iter_mut().zip(win) {
            *a += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn ring_buckets_by_k_over_per_and_refuses_past_its_windows() {
        // h = 130: W = 64, per = 3, so W * per = 192 >= 130.
        let shape = Shape::new(2, 4, 2, 2).unwrap();
        let (w, per) = layout_for_interval(130).unwrap();
        assert_eq!((w, per), (64, 3));
        let mut storage = vec![7u64; ring_len(&shape, w)];
        let mut ring = HeatRing::new(&shape, 130, storage.as_mut_slice()).unwrap();
        assert!(ring.as_slice().iter().all(|&x| x == 0));
        for k in 0..(w as u32 * per) {
            ring.add(&[k, 1, 0, 2]).unwrap();
            assert_eq!(ring.windows(), (k / per + 1) as usize);
        }
        assert_eq!(ring.held().len(), w * 4);
        // Window b holds iterations 3b, 3b+1, 3b+2.
        for b in 0..w {
            let want: u64 = (0..per).map(|j| u64::from(b as u32 * per + j)).sum();
            assert_eq!(ring.held()[b * 4..b * 4 + 4], [want, 3, 0, 6]);
        }
        assert_eq!(
            ring.add(&[1, 1, 1, 1]),
            Err(Error::Overflow {
                what: "heat ring [W][L][S] (iterations counted past its windows)"
            })
        );
        assert_eq!(
            ring.add(&[1, 1, 1]),
            Err(Error::Length {
                what: "slot counts [L][S]",
                expected: 4,
                got: 3
            })
        );
        ring.reset();
        assert_eq!(
            (ring.counted(), ring.windows(), ring.held().len()),
            (0, 0, 0)
        );
        assert!(ring.as_slice().iter().all(|&x| x == 0));
    }

    #[test]
    fn ring_rejects_wrong_storage_and_zero_interval() {
        let shape = Shape::new(2, 4, 2, 2).unwrap();
        let mut short = vec![0u64; 3];
        assert_eq!(
            HeatRing::new(&shape, 10, short.as_mut_slice()).unwrap_err(),
            Error::Length {
                what: "heat ring [W][L][S]",
                expected: 40,
                got: 3
            }
        );
        assert!(matches!(
            HeatRing::new(&shape, 0, Vec::new()),
            Err(Error::ZeroInterval { .. })
        ));
    }

    #[test]
    fn fold_maps_slots_to_experts_and_sums_windows() {
        // L = 1, N = 3, R = 2, S = 2: rank 0 holds [0, 1], rank 1 holds [2, 0].
        let shape = Shape::new(1, 3, 2, 2).unwrap();
        let placement = [0u16, 1, 2, 0];
        let placement = Placement::new(shape, &placement).unwrap();
        // [R][T][L][S], T = 2.
        let gathered = [1u64, 2, 3, 4, 10, 20, 30, 40];
        let mut samples = [9.0; 6];
        let mut loads = [9.0; 3];
        fold_slot_heat(&placement, 2, &gathered, &mut samples, &mut loads).unwrap();
        assert_eq!(samples, [1.0 + 20.0, 2.0, 10.0, 3.0 + 40.0, 4.0, 30.0]);
        assert_eq!(loads, [21.0 + 43.0, 6.0, 40.0]);
    }

    #[test]
    fn fold_names_bad_input_and_leaves_outputs() {
        let shape = Shape::new(2, 3, 2, 2).unwrap();
        let slots = [0u16, 1, 2, 0, 0, 1, 2, 1];
        let placement = Placement::new(shape, &slots).unwrap();
        let gathered = [0u64; 8];
        let mut samples = [9.0; 6];
        let mut loads = [9.0; 6];
        assert_eq!(
            fold_slot_heat(&placement, 1, &gathered[..7], &mut samples, &mut loads),
            Err(Error::Length {
                what: "gathered slot heat of the live ranks [R'][T][L][S]",
                expected: 8,
                got: 7
            })
        );
        assert_eq!(
            fold_slot_heat(&placement, 1, &gathered, &mut samples[..5], &mut loads),
            Err(Error::Length {
                what: "heat samples [T][L][N]",
                expected: 6,
                got: 5
            })
        );
        assert!(samples.iter().chain(&loads).all(|&x| x == 9.0));
        assert!(matches!(
            fold_slot_heat(&placement, usize::MAX, &gathered, &mut samples, &mut loads),
            Err(Error::Overflow { .. })
        ));
        // T = 0: nothing gathered, everything zero.
        fold_slot_heat(&placement, 0, &[], &mut [], &mut loads).unwrap();
        assert!(loads.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn live_fold_equals_the_full_fold_with_the_dead_rank_silent() {
        // 1 layer, 4 experts, 3 ranks x 2 slots; rank 1 gone (its slots EMPTY).
        let shape = Shape::new(1, 4, 3, 2).unwrap();
        let full = [0u16, 1, 2, 3, 3, 2];
        let full = Placement::new(shape, &full).unwrap();
        let elastic = [0u16, 1, crate::EMPTY, crate::EMPTY, 3, 2];
        let mut live = crate::LiveSet::all(3).unwrap();
        live.remove(1).unwrap();
        let elastic = Placement::with_live(shape, &elastic, &live).unwrap();
        let (mut s1, mut l1) = (vec![0.0; 4], vec![0.0; 4]);
        fold_slot_heat(&full, 1, &[5, 6, 0, 0, 7, 8], &mut s1, &mut l1).unwrap();
        let (mut s2, mut l2) = (vec![0.0; 4], vec![0.0; 4]);
        fold_slot_heat(&elastic, 1, &[5, 6, 7, 8], &mut s2, &mut l2).unwrap();
        assert_eq!((s1, l1.clone()), (s2.clone(), l2));
        assert_eq!(s2, vec![5.0, 6.0, 8.0, 7.0]);
        // The gather must hold the live ranks' words only.
        assert!(fold_slot_heat(&elastic, 1, &[5, 6, 0, 0, 7, 8], &mut s2, &mut l1).is_err());
    }
}
