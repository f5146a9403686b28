//! `after_forward` with nothing due, N times (for callgrind): `ctrl_loop N`.
use std::sync::Arc;
use std::time::Duration;

use eplb_core::{HeatStage, Layout, ReplicaChoice, Shape, StageClassifier};
use eplb_runtime::controller::{Controller, ControllerConfig, RunMode};
use eplb_runtime::planner::Planner;
use eplb_runtime::transport::host::{HostTransport, HostWorld};

fn main() {
    let n: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let shape = Shape::with_topology(58, 256, 32, 9, 8, 8).unwrap();
    let mut initial = vec![0u16; shape.placement_len()];
    Layout::Default.fill(&shape, &mut initial).unwrap();
    let world = HostWorld::new(32, Duration::from_secs(1));
    let rows: Vec<Vec<u16>> = initial
        .chunks_exact(shape.slots_per_layer())
        .map(|l| l[..9].to_vec())
        .collect();
    let transport = HostTransport::new(world, 0, &rows, 8);
    let planner = Arc::new(Planner::spawn(Box::new(eplb_policies::Static), shape));
    let cfg = ControllerConfig {
        machine: eplb_runtime::controller::MachineConfig {
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
    let mut ctrl = Controller::new(shape, initial, cfg, transport, planner).unwrap();
    let counts: Vec<u32> = (0..58 * 9).map(|i| (i * 37 % 101) as u32).collect();
    let t = std::time::Instant::now();
    for _ in 0..n {
        ctrl.before_forward();
        std::hint::black_box(
            ctrl.after_forward(std::hint::black_box(&counts), 300)
                .unwrap(),
        );
    }
    println!(
        "{:.1} ns per iteration",
        t.elapsed().as_nanos() as f64 / n as f64
    );
}
