//! Seeded random swaps between ranks (type 0), for testing the update path.
//!
//! # Algorithm
//!
//! Start from the current placement. For each layer in order, draw up to `4 K` candidate swaps
//! and apply the first `K` valid ones (`K` = [`Random::with_swaps`], by default `R`): a
//! candidate is two distinct ranks `a`, `b` and a slot on each; it is valid when the two
//! experts differ, `b` does not hold the expert of `a`'s slot and `a` does not hold the expert
//! of `b`'s slot. A valid swap keeps every expert's copy count and never co-locates, so the
//! output is a valid, servable placement whenever the current one is.
//!
//! The generator is SplitMix64 seeded with [`Input::seed`], one stream for the whole call
//! (layers in order); a draw below `n` is the high half of a 64x64-bit product. The output is
//! therefore the same on every platform for the same input and seed.
//!
//! # Complexity
//!
//! `O(L K S)` time, no scratch.
//!
//! # Differences from the reference
//!
//! vLLM-Ascend's type 0 ignores its seed and swaps the last slot of ranks 3 and 1 in every layer
//! (`research/vllm-ascend-eplb.md` §3.1), which needs four ranks and may co-locate copies. Ours
//! draws seeded swaps and keeps the placement servable. A current placement with co-located
//! copies is rejected with the core's [`ColocatedCopies`](eplb_core::Error::ColocatedCopies)
//! error instead of being passed on.

use eplb_core::Shape;

use crate::params::{self, ParamError, ParamInfo};
use crate::{Error, Input, Policy, PolicyKind};

/// SplitMix64 (Steele, Lea, Flood 2014).
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A draw in `0..n` (`n >= 1`).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

/// The parameters of [`Random::set`].
pub const PARAMS: [ParamInfo; 1] = [ParamInfo {
    name: "swaps",
    range: "an integer >= 0",
}];

/// Seeded random swaps between ranks (type 0). See the module documentation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Random {
    swaps: Option<usize>,
}

impl Random {
    /// `R` swaps per layer.
    pub fn new() -> Self {
        Self { swaps: None }
    }

    /// `swaps` swaps per layer.
    pub fn with_swaps(swaps: usize) -> Self {
        Self { swaps: Some(swaps) }
    }

    /// Sets the parameter `key` (only `swaps`, an integer `>= 0`) to `value`.
    pub fn set<'k>(&mut self, key: &'k str, value: f64) -> Result<(), ParamError<'k>> {
        let info = params::find(&PARAMS, PolicyKind::Random, key)?;
        self.swaps = Some(params::whole(info, value, 0.0)?);
        Ok(())
    }

    fn swaps(&self, shape: &Shape) -> usize {
        self.swaps.unwrap_or(shape.ranks())
    }
}

impl Policy for Random {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Random
    }

    fn scratch_len(&self, _shape: &Shape) -> usize {
        0
    }

    fn place(
        &mut self,
        input: &Input<'_>,
        _scratch: &mut [u64],
        _state: &mut [u64],
        out: &mut [u16],
    ) -> Result<(), Error> {
        let shape = *input.shape();
        let current = input.current();
        crate::policy::check_out_len(&shape, out)?;
        current.check_servable()?;
        out.copy_from_slice(current.as_slice());
        let (r, s) = (shape.ranks(), shape.slots_per_rank());
        if r < 2 {
            return Ok(());
        }
        let k = self.swaps(&shape);
        let mut rng = SplitMix64(input.seed());
        for layer in out.chunks_exact_mut(shape.slots_per_layer()) {
            let mut done = 0;
            for _ in 0..k.saturating_mul(4) {
                if done == k {
                    break;
                }
                let a = rng.below(r);
                let mut b = rng.below(r - 1);
                if b >= a {
                    b += 1;
                }
                let (i, j) = (rng.below(s), rng.below(s));
                if swap(layer, s, a, i, b, j) {
                    done += 1;
                }
            }
        }
        Ok(())
    }
}

/// Swaps slot `i` of rank `a` with slot `j` of rank `b` when that keeps both rows free of
/// duplicates and changes something.
fn swap(layer: &mut [u16], s: usize, a: usize, i: usize, b: usize, j: usize) -> bool {
    let (ia, ib) = (a * s + i, b * s + j);
    let (Some(&x), Some(&y)) = (layer.get(ia), layer.get(ib)) else {
        return false;
    };
    let (Some(row_a), Some(row_b)) = (layer.get(a * s..a * s + s), layer.get(b * s..b * s + s))
    else {
        return false;
    };
    if x == y || row_b.contains(&x) || row_a.contains(&y) {
        return false;
    }
    layer.swap(ia, ib);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::rebalance_owned;
    use eplb_core::{Layout, Placement};
    use std::vec;
    use std::vec::Vec;

    fn run(shape: Shape, seed: u64) -> Vec<u16> {
        let mut current = vec![0u16; shape.placement_len()];
        Layout::default().fill(&shape, &mut current).unwrap();
        let loads: Vec<f64> = (0..shape.loads_len()).map(|i| i as f64).collect();
        rebalance_owned(&mut Random::new(), shape, &current, &loads, seed, &mut [])
            .unwrap()
            .0
    }

    #[test]
    fn seeded_and_valid() {
        let shape = Shape::new(3, 16, 4, 5).unwrap();
        let a = run(shape, 7);
        assert_eq!(a, run(shape, 7));
        assert_ne!(a, run(shape, 8));
        let p = Placement::new(shape, &a).unwrap();
        assert!(p.check_servable().is_ok());
    }

    #[test]
    fn splitmix_known_values() {
        // First outputs of SplitMix64 seeded with 0.
        let mut g = SplitMix64(0);
        assert_eq!(g.next(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(g.next(), 0x6e78_9e6a_a1b9_65f4);
        let mut g = SplitMix64(1);
        assert!((0..1000).all(|_| g.below(3) < 3));
    }

    #[test]
    fn one_rank_keeps_the_placement() {
        let shape = Shape::new(1, 4, 1, 4).unwrap();
        let out = run(shape, 3);
        assert_eq!(out, [0, 1, 2, 3]);
    }
}
