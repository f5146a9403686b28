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

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = deepseek_default_random, incremental
}
criterion_main!(benches);
