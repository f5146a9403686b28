//! End-to-end cycles through the controllers and the host transport: 8 ranks as threads, several
//! cycles, every policy; weights checked byte for byte after every commit.

mod common;

use std::sync::Arc;
use std::time::Duration;

use eplb_core::{HeatStage, ReplicaChoice, Shape, StageClassifier};
use eplb_policies::{Error as PolicyError, Input, Policy, PolicyKind};
use eplb_runtime::controller::{
    Controller, ControllerConfig, MachineConfig, MachineStats, RunMode,
};
use eplb_runtime::planner::Planner;
use eplb_runtime::policies::policy_for;
use eplb_runtime::rank::Health;
use eplb_runtime::transport::host::{Fault, HostTransport, HostWorld, canonical_expert_bytes};
use eplb_runtime::transport::{Op, Site};

const R: usize = 8;
const BYTES: usize = 32;

fn cfg(mode: RunMode, stage: HeatStage) -> ControllerConfig {
    ControllerConfig {
        machine: MachineConfig {
            heat_interval: 4,
            algo_interval: 2,
            stage,
            classifier: StageClassifier::new(8, 0),
            mode,
            seed: 7,
            max_collective_failures: 3,
            // Taken from the transport.
            atomic_collectives: true,
        },
        replica_choice: ReplicaChoice::Plain,
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
    stats: MachineStats,
    commits: Vec<u16>,
}

/// Runs `iters` iterations on R rank threads. `planner_per_rank`: each rank gets its own
/// planner (as in a real deployment) instead of one shared.
fn run(
    make: &dyn Fn(usize) -> Box<dyn Policy + Send>,
    mode: RunMode,
    stage: HeatStage,
    iters: usize,
    planner_per_rank: bool,
    faults: &[(usize, usize, Fault)],
) -> Vec<Outcome> {
    let shape = common::small_shape();
    let initial = common::default_layout(&shape);
    let world = HostWorld::new(R, Duration::from_millis(300));
    for &(l, r, f) in faults {
        world.inject(l, r, f);
    }
    let shared = Arc::new(Planner::spawn(make(0), shape));
    let threads: Vec<_> = (0..R)
        .map(|rank| {
            let rows = common::rank_rows(&shape, &initial, rank);
            let transport = HostTransport::new(Arc::clone(&world), rank, &rows, BYTES);
            let planner = if planner_per_rank {
                Arc::new(Planner::spawn(make(rank), shape))
            } else {
                Arc::clone(&shared)
            };
            let mut c = Controller::new(
                eplb_core::Placement::new(shape, &initial.clone()).unwrap(),
                cfg(mode, stage),
                transport,
                planner,
            )
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

/// A planner thread running the default policy on `shape`.
fn default_planner(shape: Shape) -> Arc<Planner> {
    Arc::new(Planner::spawn(policy_for(PolicyKind::Default), shape))
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
            &|_| policy_for(kind),
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
        &|_| policy_for(PolicyKind::Default),
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
            &|_| policy_for(PolicyKind::Default),
            RunMode::Dynamic,
            HeatStage::All,
            40,
            false,
            &[(0, 3, fault)],
        );
        assert_agree(&out);
        let shape = common::small_shape();
        let initial = common::default_layout(&shape);
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
            "{fault:?}: other layers should move: {:?}",
            out.iter().map(|o| o.stats).collect::<Vec<_>>()
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
        &|_| Box::new(Panics),
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
    let initial = common::default_layout(&shape);
    assert_eq!(out[0].placement, initial);
}

#[test]
fn filter_that_never_matches_never_plans() {
    // Batches are 64 or 4 padded tokens with a threshold of 8: "prefill" matches half of them;
    // with a threshold this high, nothing is prefill.
    let shape = common::small_shape();
    let initial = common::default_layout(&shape);
    let world = HostWorld::new(1, Duration::from_millis(100));
    let one = Shape::new(4, 16, 1, 16).unwrap();
    let one_initial = common::default_layout(&one);
    let rows = common::rank_rows(&one, &one_initial, 0);
    let t = HostTransport::new(world, 0, &rows, BYTES);
    let planner = default_planner(one);
    let mut config = cfg(RunMode::Dynamic, HeatStage::Prefill);
    config.machine.classifier = StageClassifier::new(1_000_000, 0);
    let mut c = Controller::new(
        eplb_core::Placement::new(one, &one_initial).unwrap(),
        config,
        t,
        Arc::clone(&planner),
    )
    .unwrap();
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
    let initial = common::default_layout(&shape);
    let world = HostWorld::new(R, Duration::from_millis(300));
    let planner = default_planner(shape);
    let threads: Vec<_> = (0..R)
        .map(|rank| {
            let rows = common::rank_rows(&shape, &initial, rank);
            let t = HostTransport::new(Arc::clone(&world), rank, &rows, BYTES);
            let mut c = Controller::new(
                eplb_core::Placement::new(shape, &initial.clone()).unwrap(),
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

/// A policy that plans as `inner` does after `hook` has seen the call's number (from 0): the
/// hook can fail the call or delay it.
struct Hooked<F> {
    inner: Box<dyn Policy + Send>,
    calls: usize,
    hook: F,
}

impl<F: FnMut(usize) -> Result<(), PolicyError> + Send> Hooked<F> {
    fn boxed(inner: Box<dyn Policy + Send>, hook: F) -> Box<dyn Policy + Send>
    where
        F: 'static,
    {
        Box::new(Self {
            inner,
            calls: 0,
            hook,
        })
    }
}

impl<F: FnMut(usize) -> Result<(), PolicyError> + Send> Policy for Hooked<F> {
    fn kind(&self) -> PolicyKind {
        self.inner.kind()
    }
    fn scratch_len(&self, shape: &Shape) -> usize {
        self.inner.scratch_len(shape)
    }
    fn state_len(&self, shape: &Shape) -> usize {
        self.inner.state_len(shape)
    }
    fn colocates(&self) -> bool {
        self.inner.colocates()
    }
    fn place(
        &mut self,
        input: &Input<'_>,
        scratch: &mut [u64],
        state: &mut [u64],
        out: &mut [u16],
    ) -> Result<(), PolicyError> {
        let call = self.calls;
        self.calls += 1;
        (self.hook)(call)?;
        self.inner.place(input, scratch, state, out)
    }
}

#[test]
fn one_ranks_planner_failing_once_never_makes_ranks_diverge() {
    // Issue 16, item 5: per-rank planners as deployed; rank 3's fails its first plan. Every rank
    // drops that cycle, every policy state stays where it was, and the later cycles agree.
    for kind in PolicyKind::ALL {
        let out = run(
            &|rank| {
                let p = policy_for(kind);
                if rank == 3 {
                    // Fails its first call.
                    Hooked::boxed(p, |call| match call {
                        0 => Err(PolicyError::Core(eplb_core::Error::ZeroDimension {
                            what: "injected failure",
                        })),
                        _ => Ok(()),
                    })
                } else {
                    p
                }
            },
            RunMode::Dynamic,
            HeatStage::All,
            80,
            true,
            &[],
        );
        assert_agree(&out);
        for (rank, o) in out.iter().enumerate() {
            let st = o.stats;
            assert_eq!(st.plan_failures, 1, "{kind} rank {rank}: {st:?}");
            assert_eq!(st.digest_mismatches, 0, "{kind} rank {rank}: {st:?}");
            assert_eq!(st.collective_failures, 0, "{kind} rank {rank}: {st:?}");
            assert_eq!(st.layers_failed, 0, "{kind} rank {rank}: {st:?}");
            assert!(st.plans_taken >= 3, "{kind} rank {rank}: {st:?}");
        }
        if kind != PolicyKind::Swift && kind != PolicyKind::FlashLb {
            assert!(out[0].stats.layers_committed > 0, "{kind}: nothing moved");
        }
    }
}

#[test]
fn a_plan_late_on_another_rank_each_cycle_never_stalls_or_diverges() {
    for kind in [PolicyKind::Incremental, PolicyKind::FlashLb] {
        let out = run(
            &|rank| {
                // Every 4th call, from `rank % 4`, first sleeps: with one planner per rank,
                // the plan is late on a different rank each cycle.
                let offset = rank % 4;
                Hooked::boxed(policy_for(kind), move |call| {
                    if call % 4 == offset {
                        std::thread::sleep(Duration::from_millis(40));
                    }
                    Ok(())
                })
            },
            RunMode::Dynamic,
            HeatStage::All,
            200,
            true,
            &[],
        );
        assert_agree(&out);
        let st = out[0].stats;
        assert!(st.plans_taken >= 5, "{kind}: {st:?}");
        assert!(st.late_iterations > 0, "{kind}: never late: {st:?}");
        assert_eq!(st.digest_mismatches, 0, "{kind}: {st:?}");
        assert_eq!(st.plan_failures, 0, "{kind}: {st:?}");
        assert_eq!(st.collective_failures, 0, "{kind}: {st:?}");
    }
}

#[test]
fn a_rank_that_stops_mid_exchange_leaves_its_peers_serving_then_suspended() {
    // Rank 5 launches its first layer exchange and never answers again. Its peers time out (300
    // ms per collective), keep the old placement of that layer, and after 3 consecutive failed
    // collectives suspend balancing: no more collectives, `after_forward` reports it. They
    // resume only when told to, and suspend again while rank 5 stays away.
    const DEAD: usize = 5;
    let shape = common::small_shape();
    let initial = common::default_layout(&shape);
    let world = HostWorld::new(R, Duration::from_millis(300));
    let planner = default_planner(shape);
    let threads: Vec<_> = (0..R)
        .map(|rank| {
            let rows = common::rank_rows(&shape, &initial, rank);
            let transport = HostTransport::new(Arc::clone(&world), rank, &rows, BYTES);
            let mut cc = cfg(RunMode::Dynamic, HeatStage::All);
            cc.machine.max_collective_failures = 3;
            let mut c = Controller::new(
                eplb_core::Placement::new(shape, &initial.clone()).unwrap(),
                cc,
                transport,
                Arc::clone(&planner),
            )
            .unwrap();
            std::thread::spawn(move || {
                let mut before_launch = None;
                let mut suspended_at = None;
                let mut collectives_when_suspended = 0;
                for it in 0..400 {
                    if it == 200 {
                        assert!(c.health() != Health::Running, "rank {rank}: not suspended");
                        c.resume();
                    }
                    let updating = c.is_updating();
                    if updating && before_launch.is_none() {
                        before_launch = Some(c.placement().to_vec());
                    }
                    c.before_forward();
                    if rank == DEAD && updating {
                        return (
                            rank,
                            c.placement().to_vec(),
                            c.stats(),
                            before_launch,
                            None,
                            0,
                        );
                    }
                    let counts = common::slot_counts(&shape, c.placement(), rank, it, 40, 0);
                    let rep = c.after_forward(&counts, 64).unwrap();
                    if rep.suspended && suspended_at.is_none() {
                        suspended_at = Some(it);
                        collectives_when_suspended = c.stats().collectives;
                    }
                    if it < 200 && suspended_at.is_some() {
                        assert_eq!(
                            c.stats().collectives,
                            collectives_when_suspended,
                            "rank {rank}: a collective while suspended"
                        );
                    }
                }
                check_weights(&c);
                (
                    rank,
                    c.placement().to_vec(),
                    c.stats(),
                    before_launch,
                    suspended_at,
                    c.stats().collective_failures,
                )
            })
        })
        .collect();
    let out: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let survivors: Vec<_> = out.iter().filter(|o| o.0 != DEAD).collect();
    let dead = out.iter().find(|o| o.0 == DEAD).unwrap();
    for s in &survivors {
        assert_eq!(s.1, survivors[0].1, "survivors disagree on the placement");
        assert_eq!(
            s.1, dead.1,
            "rank {}: a layer moved without rank {DEAD}",
            s.0
        );
        assert!(s.4.is_some(), "rank {}: never suspended", s.0);
        // 3 failures, suspended; resumed; 3 more, suspended again.
        assert_eq!(s.5, 6, "rank {}: {:?}", s.0, s.2);
        assert!(s.2.layers_failed >= 1, "rank {}: {:?}", s.0, s.2);
    }
}

#[test]
fn one_call_builds_each_ranks_controller_from_the_config() {
    // Dynamic: each rank gets the default layout, its own planner with the configured policy,
    // and moves weights. Record: rank 0 writes the expert map, nothing moves.
    use eplb_runtime::config::EplbConfig;
    use eplb_runtime::startup::ModelInfo;
    let model = ModelInfo {
        layers: 4,
        experts: 16,
        ranks: R as u16,
        ranks_per_node: R as u16,
        groups: 1,
        max_num_seqs: 8,
        speculative_tokens: 0,
        tp_size: 1,
    };
    let dir = common::tmp("from-config");
    let map = dir.join("recorded.json");
    let env = std::collections::BTreeMap::from([
        ("DYNAMIC_EPLB".to_string(), "true".to_string()),
        ("EXPERT_MAP_RECORD".to_string(), "true".to_string()),
    ]);
    for record in [false, true] {
        let text = if record {
            format!(
                r#"{{"expert_map_record_path": {:?}, "num_redundant_experts": 8,
                    "expert_heat_collection_interval": 4, "algorithm_execution_interval": 2,
                    "eplb_policy_type": "default"}}"#,
                map.display().to_string()
            )
        } else {
            r#"{"dynamic_eplb": true, "num_redundant_experts": 8,
                "expert_heat_collection_interval": 4, "algorithm_execution_interval": 2,
                "eplb_policy_type": "default"}"#
                .to_string()
        };
        let cfg = EplbConfig::from_json_str(&text, &env).unwrap();
        let shape = common::small_shape();
        let initial = common::default_layout(&shape);
        let world = HostWorld::new(R, Duration::from_millis(300));
        let threads: Vec<_> = (0..R)
            .map(|rank| {
                let rows = common::rank_rows(&shape, &initial, rank);
                let t = HostTransport::new(Arc::clone(&world), rank, &rows, BYTES);
                let mut c = eplb_runtime::startup::controller(&cfg, &model, t).unwrap();
                assert_eq!(*c.shape(), shape);
                std::thread::spawn(move || {
                    let mut it = 0;
                    while it < 40 || (c.stats().plans_taken < 2 && it < 2000) {
                        c.before_forward();
                        let counts = common::slot_counts(&shape, c.placement(), rank, it, 40, 0);
                        let rep = c.after_forward(&counts, 64).unwrap();
                        if rep.plan_late {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        it += 1;
                    }
                    check_weights(&c);
                    (c.placement().to_vec(), c.stats())
                })
            })
            .collect();
        let out: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for o in &out {
            assert_eq!(o.0, out[0].0);
            assert!(o.1.plans_taken >= 2, "{:?}", o.1);
        }
        if record {
            assert_eq!(out[0].0, initial, "record mode moved a weight");
            assert!(map.is_file(), "rank 0 wrote no expert map");
        } else {
            assert!(out[0].1.layers_committed > 0, "{:?}", out[0].1);
        }
    }
    // A mode that runs no controller is an error that says so.
    let off = EplbConfig::default();
    let t = HostTransport::new(HostWorld::new(1, Duration::from_millis(10)), 0, &[], BYTES);
    let err = eplb_runtime::startup::controller(&off, &model, t)
        .unwrap_err()
        .to_string();
    assert!(err.contains("runs no controller"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A host endpoint whose collectives are not atomic: with `fail`, this rank's first layer vote
/// (the first agreement gather after a launch) succeeds for its peers but reports a timeout here.
struct OneSided {
    inner: HostTransport,
    fail: bool,
    armed: bool,
    done: bool,
}

impl eplb_runtime::transport::Transport for OneSided {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn ranks(&self) -> usize {
        self.inner.ranks()
    }
    fn all_gather(
        &mut self,
        local: &[u64],
        out: &mut [u64],
    ) -> Result<(), eplb_runtime::transport::TransportError> {
        let r = self.inner.all_gather(local, out);
        if self.fail && self.armed && !self.done && local.len() == eplb_runtime::rank::AGREE_WORDS {
            self.done = true;
            return Err(eplb_runtime::transport::TransportError::Timeout {
                at: Site::new(Op::AllGather, self.inner.rank()),
                detail: "layer vote (injected, one side only)".into(),
            });
        }
        r
    }
    fn all_agree(&mut self, flag: bool) -> Result<bool, eplb_runtime::transport::TransportError> {
        self.inner.all_agree(flag)
    }
    fn launch(
        &mut self,
        plan: &eplb_runtime::transfer::RankPlan,
    ) -> Result<(), eplb_runtime::transport::TransportError> {
        self.armed = true;
        self.inner.launch(plan)
    }
    fn launch_sends(
        &mut self,
        plan: &eplb_runtime::transfer::RankPlan,
    ) -> Result<(), eplb_runtime::transport::TransportError> {
        self.inner.launch_sends(plan)
    }
    fn wait(
        &mut self,
        plan: &eplb_runtime::transfer::RankPlan,
    ) -> Result<(), eplb_runtime::transport::TransportError> {
        self.inner.wait(plan)
    }
    fn commit(
        &mut self,
        plan: &eplb_runtime::transfer::RankPlan,
    ) -> Result<(), eplb_runtime::transport::TransportError> {
        self.inner.commit(plan)
    }
    fn abort(&mut self, plan: &eplb_runtime::transfer::RankPlan) {
        self.inner.abort(plan)
    }
}

#[test]
fn a_vote_failing_on_one_side_only_never_makes_ranks_diverge() {
    // Rank 3's first layer vote times out on rank 3 alone, after its peers saw every rank say
    // yes and committed. Rank 3 keeps the exchange, learns at the next vote that its peers
    // committed, and commits too: every rank ends on one placement, and every slot holds it.
    let shape = common::small_shape();
    let initial = common::default_layout(&shape);
    let world = HostWorld::new(R, Duration::from_millis(300));
    let planner = default_planner(shape);
    let threads: Vec<_> = (0..R)
        .map(|rank| {
            let rows = common::rank_rows(&shape, &initial, rank);
            let t = OneSided {
                inner: HostTransport::new(Arc::clone(&world), rank, &rows, BYTES),
                fail: rank == 3,
                armed: false,
                done: false,
            };
            let mut c = Controller::new(
                eplb_core::Placement::new(shape, &initial.clone()).unwrap(),
                cfg(RunMode::Dynamic, HeatStage::All),
                t,
                Arc::clone(&planner),
            )
            .unwrap();
            std::thread::spawn(move || {
                let mut it = 0;
                while it < 60 || (c.stats().plans_taken < 3 && it < 1200) {
                    c.before_forward();
                    let counts = common::slot_counts(&shape, c.placement(), rank, it, 40, 0);
                    let rep = c.after_forward(&counts, 64).unwrap();
                    if rep.plan_late {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    it += 1;
                }
                let (s, per) = (shape.slots_per_rank(), shape.slots_per_layer());
                for l in 0..shape.layers() {
                    let row = &c.placement()[l * per + rank * s..l * per + (rank + 1) * s];
                    for (slot, &e) in row.iter().enumerate() {
                        assert_eq!(
                            c.transport().inner.slot(l, slot).unwrap(),
                            canonical_expert_bytes(l, e, BYTES).as_slice(),
                            "rank {rank} layer {l} slot {slot} does not hold expert {e}"
                        );
                    }
                }
                (c.placement().to_vec(), c.stats(), c.health())
            })
        })
        .collect();
    let out: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (rank, o) in out.iter().enumerate() {
        assert_eq!(o.0, out[0].0, "rank {rank} holds another placement");
        assert_eq!(o.2, Health::Running, "rank {rank}: {:?}", o.1);
        assert!(o.1.layers_committed > 0, "rank {rank}: {:?}", o.1);
    }
    assert_eq!(out[3].1.collective_failures, 1, "{:?}", out[3].1);
    assert!(out.iter().all(|o| o.1.digest_mismatches == 0));
}

#[test]
fn the_engines_iteration_times_reach_the_heat_recording() {
    use eplb_runtime::heat_record::{DEFAULT_MAX_BYTES, HeatRecorder, RecordMeta};
    let one = Shape::new(4, 16, 1, 16).unwrap();
    let initial = common::default_layout(&one);
    let world = HostWorld::new(1, Duration::from_millis(100));
    let rows = common::rank_rows(&one, &initial, 0);
    let t = HostTransport::new(world, 0, &rows, BYTES);
    let mut c = Controller::new(
        eplb_core::Placement::new(one, &initial).unwrap(),
        cfg(RunMode::Dynamic, HeatStage::All),
        t,
        default_planner(one),
    )
    .unwrap();
    // Reported before a recorder is set: ignored.
    c.record_iteration_ms(1_000.0);
    let dir = std::env::temp_dir().join(format!("eplb-iter-ms-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("timed.jsonl");
    let _ = std::fs::remove_file(&path);
    let meta = RecordMeta {
        shape: one,
        heat_interval: 4,
        algo_interval: 2,
    };
    c.set_heat_recorder(HeatRecorder::open(&path, DEFAULT_MAX_BYTES, meta).unwrap());
    for it in 0..40u64 {
        c.before_forward();
        // 20 ms and 30 ms alternately (a mean of 25 over every cycle of 6 iterations), and
        // values that must be ignored.
        c.record_iteration_ms(if it % 2 == 0 { 20.0 } else { 30.0 });
        c.record_iteration_ms(f64::NAN);
        c.record_iteration_ms(-1.0);
        c.after_forward(&vec![3; 64], 64).unwrap();
    }
    drop(c);
    let text = std::fs::read_to_string(&path).unwrap();
    let windows: Vec<serde_json::Value> = text
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(windows.len() >= 2, "{text}");
    for w in &windows {
        assert_eq!(w["iteration_ms"], 25.0, "{w}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
