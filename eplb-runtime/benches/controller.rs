//! The controller's per-iteration overhead on the serving thread when no transfer is due
//! (collecting heat), on the DeepSeek-V3 shape (58 layers, 256 experts, 32 ranks x 9 slots).
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use eplb_core::{HeatStage, Layout, ReplicaChoice, Shape, StageClassifier};
use eplb_runtime::controller::{Controller, ControllerConfig, MachineConfig, RunMode};
use eplb_runtime::planner::Planner;
use eplb_runtime::transport::host::{HostTransport, HostWorld};

fn bench(c: &mut Criterion) {
    let shape = Shape::with_topology(58, 256, 32, 9, 8, 8).unwrap();
    let mut initial = vec![0u16; shape.placement_len()];
    Layout::Default.fill(&shape, &mut initial).unwrap();
    // A one-rank world with the same per-rank work: rank 0 of the DeepSeek-V3 layout.
    let world = HostWorld::new(32, Duration::from_secs(1));
    let rows: Vec<Vec<u16>> = initial
        .chunks_exact(shape.slots_per_layer())
        .map(|l| l[..9].to_vec())
        .collect();
    let transport = HostTransport::new(world, 0, &rows, 8);
    let planner = Arc::new(Planner::spawn(Box::new(eplb_policies::Static), shape));
    let cfg = ControllerConfig {
        machine: MachineConfig {
            // Never reaches the snapshot inside the benchmark: pure collection.
            heat_interval: u32::MAX,
            algo_interval: 50,
            stage: HeatStage::All,
            classifier: StageClassifier::new(256, 1),
            mode: RunMode::Dynamic,
            seed: 0,
            max_collective_failures: 3,
            atomic_collectives: true,
        },
        replica_choice: ReplicaChoice::Plain,
    };
    let mut filtered_cfg = cfg;
    filtered_cfg.machine.stage = HeatStage::Prefill;
    let mut ctrl =
        Controller::new(shape, initial.clone(), cfg, transport, Arc::clone(&planner)).unwrap();
    let world = HostWorld::new(32, Duration::from_secs(1));
    let transport = HostTransport::new(world, 0, &rows, 8);
    let mut filtered = Controller::new(shape, initial, filtered_cfg, transport, planner).unwrap();
    let counts: Vec<u32> = (0..58 * 9).map(|i| (i * 37 % 101) as u32).collect();
    c.bench_function(
        "controller iteration, collecting (58 layers x 9 slots)",
        |b| {
            b.iter(|| {
                ctrl.before_forward();
                black_box(ctrl.after_forward(black_box(&counts), 300).unwrap());
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
