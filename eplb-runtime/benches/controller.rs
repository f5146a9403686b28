//! The controller's per-iteration overhead on the serving thread when no transfer is due
//! (collecting heat), on the DeepSeek-V3 shape (58 layers, 256 experts, 32 ranks x 9 slots).
#![allow(missing_docs)]

mod common;

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use eplb_core::HeatStage;

fn bench(c: &mut Criterion) {
    let mut ctrl = common::dsv3_controller(HeatStage::All);
    let mut filtered = common::dsv3_controller(HeatStage::Prefill);
    let (mut observed, _registry) = common::dsv3_controller_with_metrics(HeatStage::All);
    let counts = common::counts();
    c.bench_function(
        "controller iteration, collecting (58 layers x 9 slots)",
        |b| {
            b.iter(|| {
                ctrl.before_forward();
                black_box(ctrl.after_forward(black_box(&counts), 300).unwrap());
            })
        },
    );
    c.bench_function(
        "controller iteration, collecting, metrics on (58 layers x 9 slots)",
        |b| {
            b.iter(|| {
                observed.before_forward();
                black_box(observed.after_forward(black_box(&counts), 300).unwrap());
            })
        },
    );
    c.bench_function("controller iteration, stage filtered out", |b| {
        b.iter(|| {
            filtered.before_forward();
            // 1 padded token: a decode batch, which the prefill filter skips.
            black_box(filtered.after_forward(black_box(&counts), 1).unwrap());
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
