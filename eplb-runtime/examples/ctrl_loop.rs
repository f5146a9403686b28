//! `after_forward` with nothing due, `N` times, for callgrind: the bench's controller
//! (`benches/common`) without criterion. `cargo run --release -p eplb-runtime --example
//! ctrl_loop -- N [metrics]` (`metrics`: with eplb's metrics registered and observed).
#![allow(missing_docs)]

#[path = "../benches/common/mod.rs"]
mod common;

use eplb_core::HeatStage;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let with_metrics = std::env::args().nth(2).as_deref() == Some("metrics");
    let (mut ctrl, _registry) = if with_metrics {
        let (c, r) = common::dsv3_controller_with_metrics(HeatStage::All);
        (c, Some(r))
    } else {
        (common::dsv3_controller(HeatStage::All), None)
    };
    let counts = common::counts();
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
