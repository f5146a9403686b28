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
use std::path::PathBuf;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use eplb_core::{Placement, Shape};
use eplb_policies::flashlb::FlashLb;
use eplb_policies::swift::SwiftBalance;
use eplb_policies::{Input, Policy, Samples};
use serde_json::Value;

struct Case {
    name: &'static str,
    shape: Shape,
    current: Vec<u16>,
    loads: Vec<f64>,
}

fn flat(v: &Value, out: &mut Vec<f64>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| flat(x, out)),
        x => out.push(x.as_f64().expect("number")),
    }
}

fn golden(name: &'static str) -> Case {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/golden")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let raw: Value = serde_json::from_str(&text).unwrap();
    let sh = &raw["shape"];
    let get = |k: &str| sh[k].as_u64().unwrap() as u16;
    let (r, nodes) = (get("num_ranks"), get("num_nodes"));
    let shape = Shape::with_topology(
        get("num_layers"),
        get("num_experts"),
        r,
        get("slots_per_rank"),
        r / nodes,
        get("num_groups"),
    )
    .unwrap();
    let (mut current, mut loads) = (Vec::new(), Vec::new());
    flat(&raw["input"]["current_placement"], &mut current);
    flat(&raw["input"]["loads"], &mut loads);
    Case {
        name,
        shape,
        current: current.into_iter().map(|x| x as u16).collect(),
        loads,
    }
}

fn cases() -> Vec<Case> {
    [
        "dsv3_prefill_ep32",
        "dsv3_decode_ep32",
        "dsv3_prefill_ep64",
        "dsv3_decode_ep64",
    ]
    .into_iter()
    .map(golden)
    .collect()
}

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
    for case in cases() {
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
