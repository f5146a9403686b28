//! Issue 17 at the library level: durations from the caller never panic (class 9).

use std::sync::Arc;
use std::time::Duration;

use eplb_core::Shape;
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
    let planner = Planner::spawn(policy_for(PolicyKind::Default), shape);
    let current = common::default_layout(&shape);
    planner.submit(PlanRequest {
        cycle: 1,
        current,
        live: eplb_core::LiveSet::all(shape.ranks()).unwrap(),
        loads: vec![4.0, 3.0, 2.0, 1.0],
        samples: None,
        seed: 0,
    });
    let got = planner.wait_result(1, Duration::MAX).expect("a result");
    assert!(got.is_ok(), "{got:?}");
    // A cycle never submitted: a zero wait returns at once.
    assert!(planner.wait_result(9, Duration::ZERO).is_none());
}

mod common;

use eplb_core::Placement;
use eplb_runtime::planner::{PolicyHost, plan_once};

/// Loads `[L][N]` summed over a trace's windows.
fn summed(rel: &str) -> (usize, usize, Vec<f64>) {
    let bytes = std::fs::read(common::shared(rel)).unwrap();
    let heat = eplb_map::heat::load_heat(&bytes, None).unwrap();
    (heat.layers(), heat.experts(), heat.summed())
}

#[test]
fn a_dynamic_cycle_from_a_deepseek_map_plans_with_every_policy() {
    let (l, n, loads) = summed("data/traces/sglang_dsv3_decode_in1000out1000.json");
    let shape = Shape::from_redundant(l as u16, n as u16, 64, 64)
        .unwrap()
        .topology(8, 8)
        .unwrap();
    let initial = common::default_layout(&shape);
    let req = |current: Vec<u16>| PlanRequest {
        cycle: 1,
        current,
        live: eplb_core::LiveSet::all(shape.ranks()).unwrap(),
        loads: loads.clone(),
        samples: None,
        seed: 3,
    };
    // The static start: DeepSeek's map, with co-located copies.
    let mut ds = PolicyHost::new(policy_for(PolicyKind::DeepSeek), shape);
    let start = plan_once(&mut ds, &req(initial)).unwrap().into_placement();
    assert!(Placement::new(shape, &start).unwrap().colocated_rows() > 0);
    // Then a dynamic cycle through the planner thread, as the controller runs it.
    for kind in PolicyKind::ALL {
        let planner = Planner::spawn(policy_for(kind), shape);
        planner.submit(req(start.clone()));
        let got = planner.wait_result(1, Duration::from_secs(120)).unwrap();
        let plan = got
            .as_ref()
            .as_ref()
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        if kind != PolicyKind::DeepSeek {
            assert_eq!(plan.summary().colocated_rows, 0, "{kind:?}");
            Placement::new(shape, plan.placement())
                .unwrap()
                .check_servable()
                .unwrap();
        }
    }
}
