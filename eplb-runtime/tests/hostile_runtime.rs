//! Issue 17 at the library level: durations from the caller never panic (class 9).

use std::sync::Arc;
use std::time::Duration;

use eplb_core::{Layout, Shape};
use eplb_policies::PolicyKind;
use eplb_runtime::planner::{PlanRequest, Planner};
use eplb_runtime::policies::policy_for;
use eplb_runtime::transport::Transport;
use eplb_runtime::transport::host::{HostTransport, HostWorld};

#[test]
fn a_host_world_with_duration_max_runs_collectives() {
    let world = HostWorld::new(2, Duration::MAX);
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            let world = Arc::clone(&world);
            std::thread::spawn(move || {
                let mut t = HostTransport::new(world, rank, &[vec![0u16, 1]], 8);
                let mut out = vec![0u64; 2];
                t.all_gather(&[rank as u64 + 7], &mut out).unwrap();
                (out, t.all_agree(true).unwrap())
            })
        })
        .collect();
    for th in threads {
        assert_eq!(th.join().unwrap(), (vec![7, 8], true));
    }
}

#[test]
fn the_planner_waits_with_duration_max() {
    let shape = Shape::new(1, 4, 2, 2).unwrap();
    let planner = Planner::spawn(policy_for(PolicyKind::Default).unwrap(), shape);
    let mut current = vec![0u16; shape.placement_len()];
    Layout::Default.fill(&shape, &mut current).unwrap();
    planner.submit(PlanRequest {
        cycle: 1,
        current,
        loads: vec![4.0, 3.0, 2.0, 1.0],
        samples: None,
        seed: 0,
    });
    let got = planner.wait_result(1, Duration::MAX).expect("a result");
    assert!(got.is_ok(), "{got:?}");
    // A cycle never submitted: a zero wait returns at once.
    assert!(planner.wait_result(9, Duration::ZERO).is_none());
}
