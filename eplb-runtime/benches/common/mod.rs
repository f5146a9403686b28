//! The controller of the serving-thread measurements (the criterion bench and the
//! `ctrl_loop` example for callgrind): rank 0 of the DeepSeek-V3 shape (58 layers, 256
//! experts, 32 ranks x 9 slots) over the host transport, collecting heat without ever reaching
//! a snapshot, and its per-slot counts.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use eplb_core::{HeatStage, Layout, ReplicaChoice, Shape, StageClassifier};
use eplb_runtime::controller::{Controller, ControllerConfig, MachineConfig, RunMode};
use eplb_runtime::planner::Planner;
use eplb_runtime::transport::host::{HostTransport, HostWorld};

/// Rank 0's controller with heat stage `stage` (no transfer is ever due).
pub fn dsv3_controller(stage: HeatStage) -> Controller<HostTransport> {
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
            // Never reaches the snapshot inside a measurement: pure collection.
            heat_interval: u32::MAX,
            algo_interval: 50,
            stage,
            classifier: StageClassifier::new(256, 1),
            mode: RunMode::Dynamic,
            seed: 0,
            max_collective_failures: 3,
            atomic_collectives: true,
        },
        replica_choice: ReplicaChoice::Plain,
    };
    Controller::new(
        eplb_core::Placement::new(shape, &initial).unwrap(),
        cfg,
        transport,
        planner,
    )
    .unwrap()
}

/// Per-slot counts `[L][S]` of one iteration.
pub fn counts() -> Vec<u32> {
    (0..58 * 9).map(|i| (i * 37 % 101) as u32).collect()
}

/// [`dsv3_controller`] with eplb's metrics registered (per-layer series on) and updated on
/// every cycle event: the hot path with metrics on.
pub fn dsv3_controller_with_metrics(
    stage: HeatStage,
) -> (
    Controller<HostTransport>,
    prometheus_client::registry::Registry,
) {
    let mut c = dsv3_controller(stage);
    let mut registry = prometheus_client::registry::Registry::default();
    let settings = eplb_runtime::metrics::MetricsSettings {
        per_layer: true,
        ..Default::default()
    };
    let m = eplb_runtime::metrics::Metrics::register(&mut registry, &settings, 58);
    c.set_metrics(m, 8);
    (c, registry)
}
