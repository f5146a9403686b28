//! End-to-end cycles through the controllers and the host transport: 8 ranks as threads, several
//! cycles, every policy; weights checked byte for byte after every commit.

mod common;

use std::sync::Arc;
use std::time::Duration;

use eplb_core::{HeatStage, Layout, ReplicaChoice, Shape, StageClassifier};
use eplb_policies::{Error as PolicyError, Input, Policy, PolicyKind};
use eplb_runtime::controller::{Controller, ControllerConfig, ControllerStats, RunMode};
use eplb_runtime::planner::Planner;
use eplb_runtime::policies::policy_for;
use eplb_runtime::transport::host::{Fault, HostTransport, HostWorld, canonical_expert_bytes};

const R: usize = 8;
const BYTES: usize = 32;

fn cfg(mode: RunMode, stage: HeatStage) -> ControllerConfig {
    ControllerConfig {
        heat_interval: 4,
        algo_interval: 2,
        stage,
        classifier: StageClassifier::new(8, 0),
        mode,
        seed: 7,
        replica_choice: ReplicaChoice::Plain,
        max_collective_failures: 3,
    }
}

/// Checks that every slot holds the canonical bytes of the expert the placement says, and that
/// the expert map points at it.
fn check_weights(c: &Controller<HostTransport>) {
    let shape = *c.shape();
    let (s, per) = (shape.slots_per_rank(), shape.slots_per_layer());
    let rank = c.rank();
    for l in 0..shape.layers() {
        let row = &c.placement()[l * per + rank * s..l * per + (rank + 1) * s];
        for (slot, &e) in row.iter().enumerate() {
            assert_eq!(
                c.transport().slot(l, slot).unwrap(),
                canonical_expert_bytes(l, e, BYTES).as_slice(),
                "rank {rank} layer {l} slot {slot} does not hold expert {e}"
            );
        }
        for (e, &slot) in c.expert_map(l).iter().enumerate() {
            if slot >= 0 {
                assert_eq!(
                    c.transport().slot(l, slot as usize).unwrap(),
                    canonical_expert_bytes(l, e as u16, BYTES).as_slice()
                );
            }
        }
    }
}

struct Outcome {
    placement: Vec<u16>,
    stats: ControllerStats,
    commits: Vec<usize>,
}

/// Runs `iters` iterations on R rank threads. `planner_per_rank`: each rank gets its own
/// planner (as in a real deployment) instead of one shared.
fn run(
    make: &dyn Fn() -> Box<dyn Policy + Send>,
    mode: RunMode,
    stage: HeatStage,
    iters: usize,
    planner_per_rank: bool,
    faults: &[(usize, usize, Fault)],
) -> Vec<Outcome> {
    let shape = common::small_shape();
    let mut initial = vec![0u16; shape.placement_len()];
    Layout::Default.fill(&shape, &mut initial).unwrap();
    let world = HostWorld::new(R, Duration::from_millis(300));
    for &(l, r, f) in faults {
        world.inject(l, r, f);
    }
    let shared = Arc::new(Planner::spawn(make(), shape));
    let threads: Vec<_> = (0..R)
        .map(|rank| {
            let rows: Vec<Vec<u16>> = initial
                .chunks_exact(shape.slots_per_layer())
                .map(|l| l[rank * 3..rank * 3 + 3].to_vec())
                .collect();
            let transport = HostTransport::new(Arc::clone(&world), rank, &rows, BYTES);
            let planner = if planner_per_rank {
                Arc::new(Planner::spawn(make(), shape))
            } else {
                Arc::clone(&shared)
            };
            let mut c =
                Controller::new(shape, initial.clone(), cfg(mode, stage), transport, planner)
                    .unwrap();
            std::thread::spawn(move || {
                let mut commits = Vec::new();
                // At least `iters` iterations, and on until 3 plans were taken (a slow planner,
                // e.g. one whose panic prints a backtrace, makes plans late). Every rank sees the
                // same plan count (the ranks agree on readiness), so all stop together.
                let mut it = 0;
                while it < iters || (c.stats().plans_taken < 3 && it < 20 * iters) {
                    c.before_forward();
                    let counts = common::slot_counts(&shape, c.placement(), rank, it, 40, 0);
                    // Alternate prefill-sized and decode-sized batches.
                    let padded = if it % 2 == 0 { 64 } else { 4 };
                    let rep = c.after_forward(&counts, padded).unwrap();
                    if let Some(l) = rep.committed {
                        commits.push(l);
                    }
                    check_weights(&c);
                    // Give the planner thread a moment now and then, as real forwards would.
                    if rep.plan_late {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    it += 1;
                }
                Outcome {
                    placement: c.placement().to_vec(),
                    stats: c.stats(),
                    commits,
                }
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn assert_agree(out: &[Outcome]) {
    for o in &out[1..] {
        assert_eq!(
            o.placement, out[0].placement,
            "ranks disagree on the placement"
        );
        assert_eq!(
            o.commits, out[0].commits,
            "ranks committed different layers"
        );
    }
}

#[test]
fn every_policy_moves_weights_byte_exact() {
    for kind in PolicyKind::ALL {
        let out = run(
            &|| policy_for(kind).unwrap(),
            RunMode::Dynamic,
            HeatStage::All,
            60,
            false,
            &[],
        );
        assert_agree(&out);
        let st = out[0].stats;
        assert!(st.plans_taken >= 3, "{kind}: {st:?}");
        assert_eq!(st.layers_failed, 0, "{kind}");
        assert_eq!(st.plan_failures, 0, "{kind}");
        if kind != PolicyKind::Swift && kind != PolicyKind::FlashLb {
            assert!(st.layers_committed > 0, "{kind}: nothing moved: {st:?}");
        }
    }
}

#[test]
fn ranks_with_their_own_planners_agree() {
    let out = run(
        &|| policy_for(PolicyKind::Default).unwrap(),
        RunMode::Dynamic,
        HeatStage::All,
        50,
        true,
        &[],
    );
    assert_agree(&out);
    assert!(out[0].stats.layers_committed > 0);
}

#[test]
fn failed_or_timed_out_exchange_keeps_the_old_layer_everywhere() {
    for fault in [Fault::Fail, Fault::Timeout] {
        // Layer 0 fails on rank 3 every cycle; other layers move.
        let out = run(
            &|| policy_for(PolicyKind::Default).unwrap(),
            RunMode::Dynamic,
            HeatStage::All,
            40,
            false,
            &[(0, 3, fault)],
        );
        assert_agree(&out);
        let shape = common::small_shape();
        let mut initial = vec![0u16; shape.placement_len()];
        Layout::Default.fill(&shape, &mut initial).unwrap();
        let per = shape.slots_per_layer();
        assert_eq!(
            &out[0].placement[..per],
            &initial[..per],
            "{fault:?}: layer 0 moved"
        );
        assert!(out[0].stats.layers_failed > 0, "{fault:?}");
        assert!(!out[0].commits.contains(&0));
        assert!(
            out[0].stats.layers_committed > 0,
            "{fault:?}: other layers should move"
        );
    }
}

/// A policy that panics: the planner reports it, nothing changes, serving goes on.
struct Panics;

impl Policy for Panics {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Random
    }
    fn scratch_len(&self, _shape: &Shape) -> usize {
        0
    }
    fn place(
        &mut self,
        _input: &Input<'_>,
        _scratch: &mut [u64],
        _state: &mut [u64],
        _out: &mut [u16],
    ) -> Result<(), PolicyError> {
        panic!("policy bug");
    }
}

#[test]
fn panicking_policy_changes_nothing() {
    let out = run(
        &|| Box::new(Panics),
        RunMode::Dynamic,
        HeatStage::All,
        40,
        false,
        &[],
    );
    assert_agree(&out);
    let st = out[0].stats;
    assert!(st.plan_failures >= 2, "{st:?}");
    assert_eq!(st.layers_committed, 0);
    let shape = common::small_shape();
    let mut initial = vec![0u16; shape.placement_len()];
    Layout::Default.fill(&shape, &mut initial).unwrap();
    assert_eq!(out[0].placement, initial);
}

#[test]
fn filter_that_never_matches_never_plans() {
    // Batches are 64 or 4 padded tokens with a threshold of 8: "prefill" matches half of them;
    // with a threshold this high, nothing is prefill.
    let shape = common::small_shape();
    let mut initial = vec![0u16; shape.placement_len()];
    Layout::Default.fill(&shape, &mut initial).unwrap();
    let world = HostWorld::new(1, Duration::from_millis(100));
    let one = Shape::new(4, 16, 1, 16).unwrap();
    let mut one_initial = vec![0u16; one.placement_len()];
    Layout::Default.fill(&one, &mut one_initial).unwrap();
    let rows: Vec<Vec<u16>> = one_initial.chunks_exact(16).map(<[u16]>::to_vec).collect();
    let t = HostTransport::new(world, 0, &rows, BYTES);
    let planner = Arc::new(Planner::spawn(
        policy_for(PolicyKind::Default).unwrap(),
        one,
    ));
    let mut config = cfg(RunMode::Dynamic, HeatStage::Prefill);
    config.classifier = StageClassifier::new(1_000_000, 0);
    let mut c = Controller::new(one, one_initial, config, t, Arc::clone(&planner)).unwrap();
    for it in 0..500 {
        c.before_forward();
        let rep = c.after_forward(&vec![3; 64], 64 + it).unwrap();
        assert!(!rep.snapshot && rep.plan_taken.is_none());
    }
    assert_eq!(planner.stats().plans, 0);
    let _ = (shape, initial);
}

#[test]
fn record_mode_never_moves_a_weight() {
    let recorded = Arc::new(std::sync::Mutex::new(Vec::<Vec<u16>>::new()));
    let shape = common::small_shape();
    let mut initial = vec![0u16; shape.placement_len()];
    Layout::Default.fill(&shape, &mut initial).unwrap();
    let world = HostWorld::new(R, Duration::from_millis(300));
    let planner = Arc::new(Planner::spawn(
        policy_for(PolicyKind::Default).unwrap(),
        shape,
    ));
    let threads: Vec<_> = (0..R)
        .map(|rank| {
            let rows: Vec<Vec<u16>> = initial
                .chunks_exact(shape.slots_per_layer())
                .map(|l| l[rank * 3..rank * 3 + 3].to_vec())
                .collect();
            let t = HostTransport::new(Arc::clone(&world), rank, &rows, BYTES);
            let mut c = Controller::new(
                shape,
                initial.clone(),
                cfg(RunMode::Record, HeatStage::All),
                t,
                Arc::clone(&planner),
            )
            .unwrap();
            if rank == 0 {
                let rec = Arc::clone(&recorded);
                c.set_record_sink(Box::new(move |_, p| {
                    rec.lock().unwrap().push(p.to_vec());
                    Ok(())
                }));
            }
            std::thread::spawn(move || {
                // At least 60 iterations, and on until 3 plans were taken (all ranks alike).
                let mut it = 0;
                while it < 60 || (c.stats().plans_taken < 3 && it < 2000) {
                    c.before_forward();
                    let counts = common::slot_counts(&shape, c.placement(), rank, it, 40, 0);
                    let rep = c.after_forward(&counts, 64).unwrap();
                    assert!(rep.committed.is_none());
                    check_weights(&c);
                    if rep.plan_late {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    it += 1;
                }
                (c.placement().to_vec(), c.stats())
            })
        })
        .collect();
    for t in threads {
        let (p, st) = t.join().unwrap();
        assert_eq!(p, initial, "record mode changed the live placement");
        assert_eq!(st.layers_committed, 0);
        assert!(st.plans_taken >= 3);
    }
    let rec = recorded.lock().unwrap();
    assert!(rec.len() >= 3);
    // Every recorded plan was made against the live (initial) placement, so with the same heat
    // pattern they agree; and they differ from it (the heat is skewed).
    assert!(rec.iter().all(|p| *p != initial));
}
