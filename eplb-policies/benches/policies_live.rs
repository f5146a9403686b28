//! Criterion benchmarks of planning over the live ranks (elastic EP): every policy on the
//! DeepSeek-V3 EP32 decode golden input (58 layers x 256 experts, 32 ranks x 9 slots), once with
//! every rank live (`rebalance`) and once with ranks 5 and 17 gone (`rebalance` of a placement with a live set: their
//! slots `EMPTY`, the experts they held alone reloaded). One measurement is one call over all
//! 58 layers, single thread, buffers allocated once outside the loop.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::hint::black_box;

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use eplb_core::live::retire;
use eplb_core::{LiveSet, Placement};
use eplb_policies::{AnyPolicy, Error, Input, Output, PolicyKind, buffer_lens, rebalance};

fn live_vs_full(c: &mut Criterion) {
    let case = common::golden("dsv3_decode_ep32");
    let shape = case.shape;
    let l = shape.layers();
    let mut live = LiveSet::all(shape.ranks()).unwrap();
    live.remove(5).unwrap();
    live.remove(17).unwrap();
    let mut retired = case.current.clone();
    retire(&shape, &live, &mut retired).unwrap();
    for kind in PolicyKind::ALL {
        let mut policy = AnyPolicy::new(kind);
        let lens = buffer_lens(&policy, &shape).unwrap();
        let full = buffer_lens(&policy, &shape).unwrap();
        let mut scratch = vec![0u64; lens.scratch.max(full.scratch)];
        let mut state = vec![0u64; lens.state.max(full.state)];
        let mut out = vec![0u16; shape.placement_len()];
        let (mut changed, mut before, mut after) = (vec![false; l], vec![0.0; l], vec![0.0; l]);
        let input = Input::new(
            Placement::new(shape, &case.current).unwrap(),
            &case.loads,
            None,
            0,
        )
        .unwrap();
        c.bench_function(&format!("full/{}", kind.name()), |b| {
            b.iter(|| {
                state.fill(0);
                let out = Output {
                    placement: &mut out,
                    changed: &mut changed,
                    par_before: &mut before,
                    par_after: &mut after,
                };
                black_box(rebalance(
                    &mut policy,
                    black_box(&input),
                    &mut scratch,
                    &mut state,
                    out,
                ))
                .unwrap();
            })
        });
        let input = eplb_core::Placement::with_live(shape, &retired, &live)
            .map_err(Error::from)
            .and_then(|p| Input::new(p, &case.loads, None, 0))
            .unwrap();
        c.bench_function(&format!("live_30_of_32/{}", kind.name()), |b| {
            b.iter(|| {
                state.fill(0);
                let out = Output {
                    placement: &mut out,
                    changed: &mut changed,
                    par_before: &mut before,
                    par_after: &mut after,
                };
                black_box(rebalance(
                    &mut policy,
                    black_box(&input),
                    &mut scratch,
                    &mut state,
                    out,
                ))
                .unwrap();
            })
        });
    }
}

criterion_group! {
    name = live;
    config = Criterion::default().sample_size(10);
    targets = live_vs_full
}
criterion_main!(live);
