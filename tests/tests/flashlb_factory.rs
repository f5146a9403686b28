//! A stand-in for vLLM-Ascend's `tests/ut/eplb/core/policy/test_policy_factory.py`
//! (`test_flashlb_rebalance_experts`), written from the test's documented inputs: FlashLB (type
//! 3) gets a 58-layer EP32 table of 256 experts in 9 slots per rank and 100 windows of per-slot
//! heat, and the mean over layers of the new placement's PAR on the summed heat must be at most
//! 1.1. Run with `--nocapture` for the figures (`BENCHMARKS.md`, "FlashLB parity (issue 28)").
//!
//! What the upstream test feeds, and what this one feeds instead:
//!
//! - the table (`generate_layered_experts`): per layer, the ids `0..255` plus 32 uniform
//!   random ids, shuffled and cut into 32 ranks of 9 slots; so a rank may hold an expert twice;
//! - the heat: `[100, 58, 32, 9]` per-slot counts `long(u^10 * 999 + 1)`, `u` uniform in
//!   `[0, 1)`: most slots see 1 token a window, a few up to 999;
//! - the score (`EplbWorker._compute_imbalance`): each expert's heat is the sum of its slots'
//!   heat over the 100 windows under the *given* table, split evenly over its copies in the new
//!   placement; a layer's PAR is its largest rank load over the mean; the score is the mean PAR.
//!
//! Upstream draws with torch's generator seeded 42; we draw the same distributions with
//! SplitMix64, so the numbers are comparable in kind, not equal. Several seeds are run so that
//! a change is judged by more than one draw.

use eplb_core::{Placement, Shape};
use eplb_policies::flashlb::FlashLb;
use eplb_policies::{Input, Samples};
use eplb_tests::{even_pars, rebalance_fresh};

const LAYERS: usize = 58;
const EXPERTS: usize = 256;
const RANKS: usize = 32;
const SLOTS: usize = 9;
const WINDOWS: usize = 100;

/// SplitMix64 (Steele, Lea, Flood 2014).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The factory test's input drawn from `seed`: the table `[L][R*S]`, the per-window logical
/// samples `[T][L][N]` (folded through the table) and their sum `[L][N]`.
struct Case {
    shape: Shape,
    table: Vec<u16>,
    samples: Vec<f64>,
    loads: Vec<f64>,
}

fn factory_case(seed: u64) -> Case {
    let shape = Shape::new(LAYERS as u16, EXPERTS as u16, RANKS as u16, SLOTS as u16).unwrap();
    let mut rng = Rng(seed);
    let p = RANKS * SLOTS;
    let mut table = Vec::with_capacity(LAYERS * p);
    for _ in 0..LAYERS {
        let mut layer: Vec<u16> = (0..EXPERTS as u16).collect();
        layer.extend((0..p - EXPERTS).map(|_| rng.below(EXPERTS) as u16));
        for i in (1..p).rev() {
            layer.swap(i, rng.below(i + 1));
        }
        table.extend(layer);
    }
    let mut samples = vec![0.0; WINDOWS * LAYERS * EXPERTS];
    let mut loads = vec![0.0; LAYERS * EXPERTS];
    for t in 0..WINDOWS {
        for l in 0..LAYERS {
            for j in 0..p {
                let heat = (rng.unit().powi(10) * 999.0 + 1.0).floor();
                let e = usize::from(table[l * p + j]);
                samples[(t * LAYERS + l) * EXPERTS + e] += heat;
                loads[l * EXPERTS + e] += heat;
            }
        }
    }
    Case {
        shape,
        table,
        samples,
        loads,
    }
}

/// FlashLB's factory-test score on the case drawn from `seed`.
fn flashlb_score(seed: u64) -> f64 {
    let c = factory_case(seed);
    let samples = Samples::new(&c.shape, WINDOWS, &c.samples).unwrap();
    let current = Placement::new(c.shape, &c.table).unwrap();
    let input = Input::new(current, &c.loads, Some(samples), 0).unwrap();
    let r = rebalance_fresh(&mut FlashLb::new(), &input, "factory");
    assert_eq!(
        r.summary.colocated_rows, 0,
        "seed {seed}: co-located copies"
    );
    let par = even_pars(c.shape, &r.placement, &c.loads);
    par.iter().sum::<f64>() / par.len() as f64
}

/// Upstream FlashLB's score on the upstream test's own input (issue 28; the bound is 1.1).
const UPSTREAM_SCORE: f64 = 1.0998;

/// Seeds of the stand-in: 42 as upstream's, then a few more draws.
const SEEDS: [u64; 5] = [42, 1, 2, 3, 4];

#[test]
fn flashlb_meets_the_factory_test_bound() {
    let mut scores = Vec::new();
    for seed in SEEDS {
        let s = flashlb_score(seed);
        eprintln!("factory stand-in seed {seed:>2}: FlashLB mean PAR {s:.4}");
        scores.push(s);
    }
    let mean = scores.iter().sum::<f64>() / scores.len() as f64;
    eprintln!(
        "factory stand-in mean over {} seeds: {mean:.4}",
        SEEDS.len()
    );
    // The test's bound is 1.1; upstream's FlashLB scores 1.0998 on its input (issue 28).
    for (seed, s) in SEEDS.iter().zip(&scores) {
        assert!(
            *s <= UPSTREAM_SCORE,
            "seed {seed}: mean PAR {s} above upstream's {UPSTREAM_SCORE} (bound 1.1)"
        );
    }
}
