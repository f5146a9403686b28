//! End-to-end cycles through the real controllers and the HCCL transport over the fake CANN:
//! 8 ranks as threads, weights checked byte for byte after every iteration, and faults injected
//! into the fake (a failed exchange call, a hung receive, a failed install copy). A failed or hung
//! transfer never leaves a rank with a half-updated layer or a map that points to the wrong
//! weights.
#![cfg(feature = "ascend")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use eplb_ascend_sys::fake::{self, FakeCann};
use eplb_ascend_sys::{Cann, Runtime};
use eplb_core::{HeatStage, Layout, ReplicaChoice, Shape, StageClassifier};
use eplb_policies::PolicyKind;
use eplb_runtime::controller::{
    Controller, ControllerConfig, MachineConfig, MachineStats, RunMode,
};
use eplb_runtime::planner::Planner;
use eplb_runtime::policies::policy_for;
use eplb_runtime::transfer::plan_layer;
use eplb_runtime::transport::Transport;
use eplb_runtime::transport::hccl::{HcclTransport, SlotLayout, local_world};
use eplb_runtime::transport::host::canonical_expert_bytes;

const R: usize = 8;
const S: usize = 3;
const BYTES: usize = 40;
/// How long the fake's blocking calls wait for peers.
const FAKE_TIMEOUT: Duration = Duration::from_millis(500);

fn shape() -> Shape {
    Shape::new(4, 16, R as u16, S as u16).unwrap()
}

fn initial() -> Vec<u16> {
    let shape = shape();
    let mut p = vec![0u16; shape.placement_len()];
    Layout::Default.fill(&shape, &mut p).unwrap();
    p
}

fn runtime() -> (Runtime, FakeCann) {
    let dir = fake::dir().expect("the fake CANN is built for tests");
    let rt = Runtime::init(Cann::load_dir(dir).unwrap()).unwrap();
    let ctl = FakeCann::open(dir).unwrap();
    ctl.set_timeout(FAKE_TIMEOUT);
    (rt, ctl)
}

/// R endpoints on devices `base..`, slots loaded with the canonical bytes of `placement`.
fn endpoints(rt: &Runtime, base: i32, placement: &[u16]) -> Vec<HcclTransport> {
    let shape = shape();
    let layout = SlotLayout {
        layers: shape.layers(),
        slots_per_rank: S,
        expert_bytes: BYTES,
    };
    let mut ts = local_world(rt, R, layout, base, Duration::from_secs(5)).unwrap();
    for t in &mut ts {
        let r = t.rank();
        for l in 0..shape.layers() {
            for slot in 0..S {
                let e = placement[l * shape.slots_per_layer() + r * S + slot];
                t.load_slot(l, slot, &canonical_expert_bytes(l, e, BYTES))
                    .unwrap();
            }
        }
    }
    ts
}

/// Every slot holds the expert the live placement says, and the expert map points at it.
fn check_weights(c: &Controller<HcclTransport>) {
    let shape = *c.shape();
    let per = shape.slots_per_layer();
    let rank = c.rank();
    for l in 0..shape.layers() {
        let row = &c.placement()[l * per + rank * S..l * per + (rank + 1) * S];
        let live: Vec<Vec<u8>> = (0..S).map(|s| c.transport().slot(l, s).unwrap()).collect();
        for (slot, &e) in row.iter().enumerate() {
            assert_eq!(
                live[slot],
                canonical_expert_bytes(l, e, BYTES),
                "rank {rank} layer {l} slot {slot} does not hold expert {e}"
            );
        }
        for (e, &slot) in c.expert_map(l).iter().enumerate() {
            if slot >= 0 {
                assert_eq!(
                    live[slot as usize],
                    canonical_expert_bytes(l, e as u16, BYTES),
                    "rank {rank} layer {l}: the map sends expert {e} to slot {slot}"
                );
            }
        }
    }
}

struct Outcome {
    placement: Vec<u16>,
    stats: MachineStats,
    commits: Vec<u16>,
    failed: Vec<u16>,
}

/// Runs `iters` iterations of the real controllers on R rank threads; `inject` is called once the
/// endpoints exist (devices `base..base + R`).
fn run(base: i32, iters: usize, inject: &dyn Fn(&FakeCann)) -> Vec<Outcome> {
    let (rt, ctl) = runtime();
    let shape = shape();
    let init = initial();
    let transports = endpoints(&rt, base, &init);
    inject(&ctl);
    let planner = Arc::new(Planner::spawn(policy_for(PolicyKind::Default), shape));
    let cfg = ControllerConfig {
        machine: MachineConfig {
            heat_interval: 4,
            algo_interval: 2,
            stage: HeatStage::All,
            classifier: StageClassifier::new(8, 0),
            mode: RunMode::Dynamic,
            seed: 7,
            max_collective_failures: 3,
            atomic_collectives: true,
        },
        replica_choice: ReplicaChoice::Plain,
    };
    let threads: Vec<_> = transports
        .into_iter()
        .map(|t| {
            let rank = t.rank();
            let mut c = Controller::new(
                eplb_core::Placement::new(shape, &init.clone()).unwrap(),
                cfg,
                t,
                Arc::clone(&planner),
            )
            .unwrap();
            std::thread::spawn(move || {
                let (mut commits, mut failed) = (Vec::new(), Vec::new());
                check_weights(&c);
                for it in 0..iters {
                    c.before_forward();
                    let counts = common::slot_counts(&shape, c.placement(), rank, it, 40, 0);
                    let rep = c.after_forward(&counts, 64).unwrap();
                    commits.extend(rep.committed);
                    failed.extend(rep.failed);
                    check_weights(&c);
                    if rep.plan_late {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                Outcome {
                    placement: c.placement().to_vec(),
                    stats: c.stats(),
                    commits,
                    failed,
                }
            })
        })
        .collect();
    let out: Vec<Outcome> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    ctl.clear(None);
    for o in &out[1..] {
        assert_eq!(
            o.placement, out[0].placement,
            "ranks disagree on the placement"
        );
        assert_eq!(
            o.commits, out[0].commits,
            "ranks committed different layers"
        );
        assert_eq!(o.failed, out[0].failed, "ranks failed different layers");
    }
    out
}

#[test]
fn controllers_move_weights_byte_exact_over_hccl() {
    let out = run(200, 40, &|_| {});
    let st = out[0].stats;
    assert!(st.plans_taken >= 3, "{st:?}");
    assert!(st.layers_committed > 0, "nothing moved: {st:?}");
    assert_eq!(st.layers_failed, 0);
    assert_ne!(out[0].placement, initial());
}

#[test]
fn a_failed_exchange_call_keeps_the_old_layer_everywhere() {
    // Rank 3's first HcclBatchSendRecv fails at once (HCCL_E_INTERNAL): its peers' transfers to
    // and from it time out; every rank keeps that layer; later layers still move.
    let out = run(300, 40, &|ctl| {
        ctl.fail("HcclBatchSendRecv", Some(303), 1, 1, 4).unwrap();
    });
    let st = out[0].stats;
    assert_eq!(st.layers_failed, 1, "{st:?}");
    assert_eq!(st.collective_failures, 0, "{st:?}");
    assert!(st.layers_committed > 0, "{st:?}");
}

#[test]
fn a_hung_receive_keeps_the_old_layer_everywhere() {
    // Rank 5's first exchange loses its incoming data and hangs until the timeout.
    let out = run(400, 40, &|ctl| {
        ctl.hang("HcclBatchSendRecv", Some(405), 1, 1).unwrap();
    });
    let st = out[0].stats;
    assert_eq!(st.layers_failed, 1, "{st:?}");
    assert_eq!(st.collective_failures, 0, "{st:?}");
    assert!(st.layers_committed > 0, "{st:?}");
}

#[test]
fn a_failed_install_copy_restores_the_old_layer() {
    // On rank 0 (device 700), fail the first install copy of its commit: its layer must come
    // back whole. Rank 0 stages its changed slots (3 copies) and then installs.
    let (rt, ctl) = runtime();
    let shape = shape();
    let init = initial();
    let per = shape.slots_per_layer();
    let mut next = init.clone();
    for r in 0..R {
        let from = (r + 1) % R;
        next[per + r * S..per + (r + 1) * S]
            .copy_from_slice(&init[per + from * S..per + (from + 1) * S]);
    }
    let plan = plan_layer(&shape, 1, &init[per..2 * per], &next[per..2 * per]).unwrap();
    let ts = endpoints(&rt, 700, &init);
    let barrier = Arc::new(std::sync::Barrier::new(R + 1));
    let hs: Vec<_> = ts
        .into_iter()
        .map(|mut t| {
            let rp = plan.ranks[t.rank()].clone();
            let (barrier, init, next) = (Arc::clone(&barrier), init.clone(), next.clone());
            std::thread::spawn(move || {
                t.launch(&rp).unwrap();
                t.wait(&rp).unwrap();
                assert!(t.all_agree(true).unwrap());
                barrier.wait(); // the fault is injected here
                barrier.wait();
                let res = t.commit(&rp);
                let committed = res.is_ok();
                let want = if committed { &next } else { &init };
                for slot in 0..S {
                    let e = want[per + t.rank() * S + slot];
                    assert_eq!(
                        t.slot(1, slot).unwrap(),
                        canonical_expert_bytes(1, e, BYTES),
                        "rank {} slot {slot} (commit: {res:?})",
                        t.rank()
                    );
                }
                (t.rank(), res.err().map(|e| e.to_string()))
            })
        })
        .collect();
    barrier.wait();
    let changed = plan.ranks[0]
        .install
        .iter()
        .filter(|s| **s != eplb_runtime::transfer::SlotSource::Unchanged)
        .count();
    assert!(changed > 0);
    ctl.fail(
        "aclrtMemcpyAsync",
        Some(700),
        changed as u32 + 1,
        1,
        507_000,
    )
    .unwrap();
    barrier.wait();
    let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    ctl.clear(Some(700));
    for (rank, err) in out {
        if rank == 0 {
            let e = err.expect("rank 0's commit must fail");
            assert!(e.contains("old layer is restored"), "{e}");
        } else {
            assert_eq!(err, None, "rank {rank}");
        }
    }
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    let (rt, _ctl) = runtime();
    let init = initial();
    let shape = shape();
    let per = shape.slots_per_layer();
    let mut ts = endpoints(&rt, 800, &init);
    let plan = plan_layer(&shape, 2, &init[2 * per..3 * per], &init[2 * per..3 * per]).unwrap();
    let t = &mut ts[0];
    let rp = plan.ranks[0].clone();
    assert!(t.wait(&rp).is_err(), "wait before launch");
    assert!(t.commit(&rp).is_err(), "commit before wait");
    let mut bad = rp.clone();
    bad.layer = 99;
    assert!(t.launch(&bad).is_err());
    assert!(t.slot(4, 0).is_err() && t.slot(0, S).is_err());
    assert!(t.load_slot(0, 0, &[0; 3]).is_err());
    let mut out = vec![0u64; 3];
    assert!(
        t.all_gather(&[1], &mut out).is_err(),
        "output of the wrong length"
    );
    // The empty plan goes through launch/wait/commit without touching anything.
    t.launch(&rp).unwrap();
    t.wait(&rp).unwrap();
    t.commit(&rp).unwrap();
    t.abort(&rp);
}

#[test]
fn endpoints_move_between_threads() {
    fn assert_send<T: Send>() {}
    assert_send::<HcclTransport>();
    assert_send::<eplb_ascend_sys::Comm>();
    assert_send::<eplb_ascend_sys::Workspace>();
}
