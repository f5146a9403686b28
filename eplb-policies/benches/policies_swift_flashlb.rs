//! Criterion benchmarks of SwiftBalance and FlashLB on the DeepSeek-V3 golden inputs (58 layers
//! x 256 experts; EP32 = 288 slots on 32 ranks, EP64 = 320 slots on 64 ranks).
//!
//! One measurement is one `Policy::place` call over all 58 layers, single thread, scratch
//! allocated once. FlashLB starts every measured call from a fresh (zeroed) state, so every
//! layer is planned; it is measured with the summed loads as its one sample (what the golden
//! cases give it) and with 10 and 64 synthetic windows (the loads times a deterministic
//! +-20 % ripple per window and expert).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::hint::black_box;

mod common;

use common::{Case, dsv3_cases};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use eplb_core::Placement;
use eplb_policies::flashlb::FlashLb;
use eplb_policies::swift::SwiftBalance;
use eplb_policies::{Input, Policy, Samples};

/// `t` windows `[T][L][N]`: window `k` is `loads / t * (1 + 0.2 * sin(k * 1.7 + i * 0.37))`.
fn windows(loads: &[f64], t: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(t * loads.len());
    for k in 0..t {
        for (i, &w) in loads.iter().enumerate() {
            let ripple = 1.0 + 0.2 * ((k as f64) * 1.7 + (i as f64) * 0.37).sin();
            out.push((w / t as f64 * ripple).round());
        }
    }
    out
}

fn bench<P: Policy>(c: &mut Criterion, label: &str, mut policy: P, case: &Case, t: usize) {
    let shape = case.shape;
    let w = windows(&case.loads, t);
    let samples = (t > 0).then(|| Samples::new(&shape, t, &w).unwrap());
    let current = Placement::new(shape, &case.current).unwrap();
    let input = Input::new(current, &case.loads, samples, 0).unwrap();
    let mut scratch = vec![0u64; policy.scratch_len(&shape)];
    let mut out = vec![0u16; shape.placement_len()];
    let state_len = policy.state_len(&shape);
    c.bench_function(&format!("{label}/{}", case.name), |b| {
        b.iter_batched_ref(
            || vec![0u64; state_len],
            |state| {
                policy
                    .place(black_box(&input), &mut scratch, state, &mut out)
                    .unwrap();
                black_box(&out);
            },
            BatchSize::LargeInput,
        )
    });
}

fn swift_flashlb(c: &mut Criterion) {
    for case in dsv3_cases() {
        bench(c, "swift", SwiftBalance::new(), &case, 0);
        bench(c, "flashlb", FlashLb::new(), &case, 0);
        bench(c, "flashlb_10w", FlashLb::new(), &case, 10);
        bench(c, "flashlb_64w", FlashLb::new(), &case, 64);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = swift_flashlb
}
criterion_main!(benches);
