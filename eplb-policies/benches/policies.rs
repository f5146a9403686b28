//! Criterion benchmarks of the policies on the DeepSeek-V3 golden inputs (58 layers x 256
//! experts): EP32 (288 slots, 4 nodes, 8 groups) and EP64 (320 slots, 8 nodes, 8 groups).
//!
//! One measurement is one `Policy::place` call over all 58 layers, single thread, with the
//! scratch allocated once outside the loop. Each engineer's policies sit in their own function
//! below; add a function and list it in `criterion_group!` to add more.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::hint::black_box;

mod common;

use common::{Case, dsv3_cases};
use criterion::{Criterion, criterion_group, criterion_main};
use eplb_core::{Placement, Shape};
use eplb_policies::deepseek::DeepSeek;
use eplb_policies::default::DefaultEplb;
use eplb_policies::random::Random;
use eplb_policies::{Input, Policy};

/// Benchmarks `policy.place` on `case` (with `shape`, which may differ in topology) as
/// `<label>/<case>`.
pub fn bench_place<P: Policy>(
    c: &mut Criterion,
    label: &str,
    mut policy: P,
    case: &Case,
    shape: Shape,
) {
    let current = Placement::new(shape, &case.current).unwrap();
    let input = Input::new(current, &case.loads, None, 0).unwrap();
    let mut scratch = vec![0u64; policy.scratch_len(&shape)];
    let mut state = vec![0u64; policy.state_len(&shape)];
    let mut out = vec![0u16; shape.placement_len()];
    c.bench_function(&format!("{label}/{}", case.name), |b| {
        b.iter(|| {
            policy
                .place(black_box(&input), &mut scratch, &mut state, &mut out)
                .unwrap();
            black_box(&out);
        })
    });
}

// ---- deepseek, default, random -------------------------------------------------------------

fn deepseek_default_random(c: &mut Criterion) {
    for case in dsv3_cases() {
        bench_place(c, "deepseek_hier", DeepSeek, &case, case.shape);
        let global = case.shape.topology(case.shape.ranks() as u16, 1).unwrap();
        bench_place(c, "deepseek_global", DeepSeek, &case, global);
        bench_place(c, "default", DefaultEplb, &case, case.shape);
        bench_place(c, "random", Random::new(), &case, case.shape);
    }
}

// ---- end of deepseek, default, random ------------------------------------------------------

// ---- incremental ----------------------------------------------------------------------------

/// The incremental policy from the start-up layout (a full re-placement: its worst case, fresh
/// state every call) and in steady state (from its own plan, same heat).
fn incremental(c: &mut Criterion) {
    use eplb_policies::incremental::Incremental;
    for case in dsv3_cases() {
        let shape = case.shape;
        let mut policy = Incremental::new();
        let mut scratch = vec![0u64; policy.scratch_len(&shape)];
        let mut state = vec![0u64; policy.state_len(&shape)];
        let mut out = vec![0u16; shape.placement_len()];
        let input = Input::new(
            Placement::new(shape, &case.current).unwrap(),
            &case.loads,
            None,
            0,
        )
        .unwrap();
        c.bench_function(&format!("incremental_first/{}", case.name), |b| {
            b.iter(|| {
                state.fill(0);
                policy
                    .place(black_box(&input), &mut scratch, &mut state, &mut out)
                    .unwrap();
                black_box(&out);
            })
        });
        // The first plan again, so that the steady input exists when a filter skipped the
        // benchmark above.
        state.fill(0);
        policy
            .place(&input, &mut scratch, &mut state, &mut out)
            .unwrap();
        let planned = out.clone();
        let input = Input::new(
            Placement::new(shape, &planned).unwrap(),
            &case.loads,
            None,
            0,
        )
        .unwrap();
        c.bench_function(&format!("incremental_steady/{}", case.name), |b| {
            b.iter(|| {
                policy
                    .place(black_box(&input), &mut scratch, &mut state, &mut out)
                    .unwrap();
                black_box(&out);
            })
        });
    }
}

/// Synthetic Zipf heat `[L][N]` (exponent 1): in each layer, the experts in a seeded
/// permutation get `1e6 / (k + 1)` tokens.
fn zipf(layers: usize, experts: usize) -> Vec<f64> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut loads = Vec::with_capacity(layers * experts);
    for _ in 0..layers {
        let mut perm: Vec<usize> = (0..experts).collect();
        for i in (1..experts).rev() {
            perm.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        let mut row = vec![0.0; experts];
        for (k, &e) in perm.iter().enumerate() {
            row[e] = (1e6 / (k + 1) as f64).floor();
        }
        loads.extend(row);
    }
    loads
}

/// One cold call (default layout, fresh state) per wide-EP size of issue 19: DeepSeek-V3
/// 58x256 at EP32/X32 and EP256/X256, Kimi-K2 61x384 at EP384/X384, on Zipf heat: the
/// incremental policy by default (`cold_start` 5), with every layer rebuilt (`cold_start=1`),
/// with the search alone (no rebuild), and FlashLB.
fn wide_ep(c: &mut Criterion) {
    use eplb_policies::flashlb::FlashLb;
    use eplb_policies::incremental::{Incremental, Params};
    let (mut rebuild, mut search) = (Params::default(), Params::default());
    rebuild.set("cold_start", 1.0).unwrap();
    search.set("cold_start", f64::INFINITY).unwrap();
    for (name, l, n, r, x) in [
        ("dsv3_ep32", 58, 256, 32, 32),
        ("dsv3_ep256", 58, 256, 256, 256),
        ("kimi_ep384", 61, 384, 384, 384),
    ] {
        let shape = Shape::new(l, n, r, (n + x) / r).unwrap();
        let mut current = vec![0u16; shape.placement_len()];
        eplb_core::Layout::Default
            .fill(&shape, &mut current)
            .unwrap();
        let case = Case {
            name,
            shape,
            current,
            loads: zipf(l.into(), n.into()),
        };
        bench_cold(c, "wide_incremental", Incremental::new(), &case);
        bench_cold(
            c,
            "wide_incremental_cold",
            Incremental::with_params(rebuild),
            &case,
        );
        bench_cold(
            c,
            "wide_incremental_search",
            Incremental::with_params(search),
            &case,
        );
        bench_cold(c, "wide_flashlb", FlashLb::new(), &case);
    }
}

/// [`bench_place`] with the state cleared before each call (a cold call).
fn bench_cold<P: Policy>(c: &mut Criterion, label: &str, mut policy: P, case: &Case) {
    let shape = case.shape;
    let current = Placement::new(shape, &case.current).unwrap();
    let input = Input::new(current, &case.loads, None, 0).unwrap();
    let mut scratch = vec![0u64; policy.scratch_len(&shape)];
    let mut state = vec![0u64; policy.state_len(&shape)];
    let mut out = vec![0u16; shape.placement_len()];
    c.bench_function(&format!("{label}/{}", case.name), |b| {
        b.iter(|| {
            state.fill(0);
            policy
                .place(black_box(&input), &mut scratch, &mut state, &mut out)
                .unwrap();
            black_box(&out);
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = deepseek_default_random, incremental
}
criterion_group! {
    name = wide;
    config = Criterion::default().sample_size(10);
    targets = wide_ep
}
criterion_main!(benches, wide);
