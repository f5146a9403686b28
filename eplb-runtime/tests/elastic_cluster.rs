//! Elastic membership end to end: eight controllers as threads over the host transport, weights
//! checked byte for byte. A rank stops answering mid-walk; its peers time out and suspend, the
//! engine removes it, the survivors agree, reroute, reload the experts it held alone (from the
//! transport's backup), and balance again; later it comes back, receives its weights from its
//! peers, and serves. For every policy.

mod common;

use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use eplb_core::{EMPTY, HeatStage, LiveSet, Phase, Placement, ReplicaChoice, StageClassifier};
use eplb_policies::PolicyKind;
use eplb_runtime::controller::{Controller, ControllerConfig, MachineConfig, RunMode};
use eplb_runtime::planner::Planner;
use eplb_runtime::policies::policy_for;
use eplb_runtime::rank::Health;
use eplb_runtime::transport::host::{HostTransport, HostWorld, canonical_expert_bytes};

const R: usize = 8;
const BYTES: usize = 16;
const DEAD: usize = 5;
/// The survivors are told at this iteration that `DEAD` is gone.
const REMOVE_AT: usize = 60;
/// ... and that it is back at this one.
const ADD_AT: usize = 130;
const END: usize = 220;
/// A second rank stops answering at this iteration (during the first recovery).
const SECOND_AT: usize = REMOVE_AT + 3;

fn cfg() -> ControllerConfig {
    ControllerConfig {
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
    }
}

/// Every slot of this rank holds the canonical bytes of its expert; the expert map points at
/// them; no routing entry points at a rank outside the live set.
fn check_weights(c: &Controller<HostTransport>) {
    let shape = *c.shape();
    let (s, per) = (shape.slots_per_rank(), shape.slots_per_layer());
    let rank = c.rank();
    for l in 0..shape.layers() {
        let row = &c.placement()[l * per + rank * s..l * per + (rank + 1) * s];
        for (slot, &e) in row.iter().enumerate() {
            if e == EMPTY {
                continue;
            }
            assert_eq!(
                c.transport().slot(l, slot).unwrap(),
                canonical_expert_bytes(l, e, BYTES).as_slice(),
                "rank {rank} layer {l} slot {slot} does not hold expert {e}"
            );
        }
        for &phy in c.log2phy(l) {
            if phy == eplb_core::NO_COPY {
                continue;
            }
            let holder = phy as usize / s;
            assert!(
                c.live().contains(holder),
                "rank {rank} layer {l}: routes to rank {holder}, not live"
            );
            assert_ne!(c.placement()[l * per + phy as usize], EMPTY);
        }
    }
}

/// Counts of one forward: skewed, none on an EMPTY slot.
fn counts(c: &Controller<HostTransport>, it: usize) -> Vec<u32> {
    let shape = *c.shape();
    let (s, per) = (shape.slots_per_rank(), shape.slots_per_layer());
    let mut out = common::slot_counts(&shape, c.placement(), c.rank(), it, 40, 0);
    for l in 0..shape.layers() {
        for slot in 0..s {
            if c.placement()[l * per + c.rank() * s + slot] == EMPTY {
                out[l * s + slot] = 0;
            }
        }
    }
    out
}

struct Seen {
    rank: usize,
    placement: Vec<u16>,
    lost_after_recovery: usize,
    lost_at_remove: usize,
    loads: u64,
    plans_after_remove: u64,
    health: Health,
    membership_changes: u64,
}

/// What the engine hands a returning rank: the placement and live set its peers hold.
type Handover = (Vec<u16>, LiveSet);

/// When the rank stops answering.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Death {
    /// While a layer walk is under way (its peers' votes and receives time out).
    MidWalk,
    /// At the heat snapshot (its peers' heat gather times out).
    MidGather,
    /// Between cycles, after a plan was walked (its peers notice at the next gather).
    BetweenCycles,
}

impl Death {
    fn now(self, c: &Controller<HostTransport>) -> bool {
        let phase = c.cycle().phase();
        match self {
            Death::MidWalk => c.is_updating(),
            Death::MidGather => phase == (Phase::Collecting { counted: 3 }),
            Death::BetweenCycles => {
                c.stats().layers_committed > 0
                    && !c.is_updating()
                    && phase == (Phase::Collecting { counted: 1 })
            }
        }
    }
}

fn run(kind: PolicyKind, death: Death, second: Option<usize>) {
    common::debug_log();
    let shape = common::small_shape();
    let initial = common::default_layout(&shape);
    let world = HostWorld::new(R, Duration::from_millis(150));
    // What the engine hands the returning rank: the placement its peers hold when it is let in.
    let handover: Arc<Mutex<Option<Handover>>> = Arc::new(Mutex::new(None));
    // The engine's own forward keeps the ranks' iterations in step (its all-to-all): a barrier
    // per iteration. The dead rank's engine slot is held by the returning rank from ADD_AT on.
    let step = Arc::new(Barrier::new(R));
    let mut threads = Vec::new();
    for rank in 0..R {
        let step = Arc::clone(&step);
        let rows = common::rank_rows(&shape, &initial, rank);
        let transport = HostTransport::new(Arc::clone(&world), rank, &rows, BYTES);
        let planner = Arc::new(Planner::spawn(policy_for(kind), shape));
        let mut c = Controller::new(
            eplb_core::Placement::new(shape, &initial.clone()).unwrap(),
            cfg(),
            transport,
            planner,
        )
        .unwrap();
        let handover = Arc::clone(&handover);
        threads.push(std::thread::spawn(move || {
            let mut lost_after_recovery = usize::MAX;
            let mut plans_at_remove = 0;
            let mut lost_at_remove = 0;
            let mut dead = false;
            for it in 0..END {
                step.wait();
                if rank == DEAD && it == ADD_AT {
                    // The engine's slot passes to the returning rank from the next step on.
                    return None;
                }
                let gone = rank == DEAD || (Some(rank) == second && it >= SECOND_AT);
                if gone && (dead || death.now(&c) || it >= REMOVE_AT / 2) {
                    // Stops answering (at the latest half-way to its removal); its slot in the
                    // engine's step stays taken (until the returning rank takes it).
                    dead = true;
                    continue;
                }
                if it == REMOVE_AT {
                    plans_at_remove = c.stats().plans_taken;
                    c.remove_ranks(&[DEAD]).unwrap();
                }
                if let Some(r2) = second
                    && it == SECOND_AT + 4
                {
                    // A second failure during the recovery: removed a few steps later.
                    c.remove_ranks(&[r2]).unwrap();
                }
                if it == REMOVE_AT + 1 {
                    lost_at_remove = c.machine().lost_count();
                }
                if it == ADD_AT - 5 {
                    lost_after_recovery = c.machine().lost_count();
                }
                if it == ADD_AT {
                    if rank == 0 {
                        *handover.lock().unwrap() = Some((c.placement().to_vec(), *c.live()));
                    }
                    c.add_ranks(&[DEAD]).unwrap();
                }
                c.before_forward();
                let n = counts(&c, it);
                let ev = c.after_forward(&n, 64).unwrap();
                if std::env::var("EPLB_DEBUG").is_ok()
                    && (ev.suspended || ev.membership || ev.failed.is_some())
                {
                    eprintln!("rank {rank} it {it}: {ev:?} {:?}", c.stats());
                }
                check_weights(&c);
            }
            if dead {
                return None;
            }
            Some(Seen {
                rank,
                placement: c.placement().to_vec(),
                lost_after_recovery,
                lost_at_remove,
                loads: c.stats().loads,
                plans_after_remove: c.stats().plans_taken - plans_at_remove,
                health: c.health(),
                membership_changes: c.stats().membership_changes,
            })
        }));
    }
    // The returning rank: a new process for rank DEAD, with empty slots, let in at ADD_AT.
    let world2 = Arc::clone(&world);
    let handover2 = Arc::clone(&handover);
    let step2 = Arc::clone(&step);
    let joiner = std::thread::spawn(move || {
        // Let in at ADD_AT (rank 0 hands the placement over after that step's barrier).
        let (p, without) = loop {
            if let Some(h) = handover2.lock().unwrap().clone() {
                break h;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let rows = common::rank_rows(&shape, &p, DEAD);
        assert!(rows.iter().flatten().all(|&e| e == EMPTY));
        let transport = HostTransport::new(world2, DEAD, &rows, BYTES);
        let planner = Arc::new(Planner::spawn(policy_for(kind), shape));
        let mut c = Controller::new(
            eplb_core::Placement::with_live(shape, &p, &without).unwrap(),
            cfg(),
            transport,
            planner,
        )
        .unwrap();
        c.add_ranks(&[DEAD]).unwrap();
        for it in ADD_AT..END {
            if it > ADD_AT {
                step2.wait();
            }
            c.before_forward();
            let n = counts(&c, it);
            let ev = c.after_forward(&n, 64).unwrap();
            if std::env::var("EPLB_DEBUG").is_ok()
                && (ev.suspended || ev.membership || ev.failed.is_some())
            {
                eprintln!("joiner it {it}: {ev:?} {:?}", c.stats());
            }
            check_weights(&c);
        }
        (c.placement().to_vec(), c.health())
    });
    let seen: Vec<Seen> = threads
        .into_iter()
        .filter_map(|t| t.join().unwrap())
        .collect();
    let (joined, joined_health) = joiner.join().unwrap();
    let gone = 1 + usize::from(second.is_some());
    assert_eq!(
        seen.len(),
        R - gone,
        "{kind:?}: only the dead ranks stopped"
    );
    for s in &seen {
        assert_eq!(
            s.placement, seen[0].placement,
            "{kind:?}: rank {} disagrees",
            s.rank
        );
        assert_eq!(s.health, Health::Running, "{kind:?}: rank {}", s.rank);
        assert_eq!(
            s.membership_changes,
            1 + gone as u64,
            "{kind:?}: rank {}",
            s.rank
        );
        assert_eq!(
            s.lost_after_recovery, 0,
            "{kind:?}: rank {}: experts still lost",
            s.rank
        );
        assert!(
            s.plans_after_remove >= 3,
            "{kind:?}: rank {}: balancing stopped",
            s.rank
        );
    }
    if seen[0].lost_at_remove > 0 {
        assert!(
            seen.iter().map(|s| s.loads).sum::<u64>() > 0,
            "{kind:?}: nothing reloaded"
        );
    }
    eprintln!(
        "{kind:?}: {} expert copies lost at the removal, {} layer loads",
        seen[0].lost_at_remove,
        seen.iter().map(|s| s.loads).sum::<u64>()
    );
    assert_eq!(
        joined, seen[0].placement,
        "{kind:?}: the returning rank disagrees"
    );
    assert_eq!(joined_health, Health::Running);
    // The returning rank holds weights again; with every rank back, a full placement.
    let s = shape.slots_per_rank();
    assert!(
        joined
            .chunks_exact(shape.slots_per_layer())
            .all(|l| l[DEAD * s..(DEAD + 1) * s].iter().all(|&e| e != EMPTY)),
        "{kind:?}: the returning rank's slots are not all filled"
    );
    if second.is_none() {
        Placement::new(shape, &joined).unwrap();
    }
}

#[test]
fn a_rank_dies_mid_walk_is_removed_and_comes_back_for_every_policy() {
    for kind in [
        PolicyKind::Random,
        PolicyKind::Default,
        PolicyKind::Swift,
        PolicyKind::FlashLb,
        PolicyKind::Incremental,
        PolicyKind::DeepSeek,
    ] {
        if std::env::var("EPLB_ONLY").is_ok_and(|only| only != kind.name()) {
            continue;
        }
        run(kind, Death::MidWalk, None);
    }
}

#[test]
fn a_rank_dies_mid_gather_or_between_cycles() {
    for kind in [
        PolicyKind::Default,
        PolicyKind::Incremental,
        PolicyKind::FlashLb,
    ] {
        run(kind, Death::MidGather, None);
        run(kind, Death::BetweenCycles, None);
    }
}

#[test]
fn a_second_rank_dies_during_the_recovery() {
    for kind in [PolicyKind::Swift, PolicyKind::DeepSeek] {
        run(kind, Death::MidWalk, Some(2));
    }
}

#[test]
fn two_remove_ranks_calls_in_one_iteration_on_the_controllers_remove_both() {
    const GONE: [usize; 2] = [2, 5];
    const AT: usize = 20;
    let shape = common::small_shape();
    let initial = common::default_layout(&shape);
    let world = HostWorld::new(R, Duration::from_millis(150));
    let step = Arc::new(Barrier::new(R));
    let mut threads = Vec::new();
    for rank in 0..R {
        let step = Arc::clone(&step);
        let rows = common::rank_rows(&shape, &initial, rank);
        let transport = HostTransport::new(Arc::clone(&world), rank, &rows, BYTES);
        let planner = Arc::new(Planner::spawn(policy_for(PolicyKind::Default), shape));
        let mut c = Controller::new(
            eplb_core::Placement::new(shape, &initial.clone()).unwrap(),
            cfg(),
            transport,
            planner,
        )
        .unwrap();
        threads.push(std::thread::spawn(move || {
            for it in 0..AT + 40 {
                step.wait();
                if GONE.contains(&rank) && it >= AT {
                    continue; // stopped answering
                }
                if it == AT {
                    c.remove_ranks(&[GONE[0]]).unwrap();
                    c.remove_ranks(&[GONE[1]]).unwrap();
                }
                c.before_forward();
                let n = counts(&c, it);
                c.after_forward(&n, 64).unwrap();
                check_weights(&c);
            }
            (!GONE.contains(&rank)).then(|| (*c.live(), c.stats(), c.health()))
        }));
    }
    let mut both = LiveSet::all(R).unwrap();
    for g in GONE {
        both.remove(g).unwrap();
    }
    for (rank, t) in threads.into_iter().enumerate() {
        let Some((live, stats, health)) = t.join().unwrap() else {
            continue;
        };
        assert_eq!(live, both, "rank {rank}: both ranks gone");
        assert_eq!(stats.membership_changes, 1, "rank {rank}: one change");
        assert_eq!(health, Health::Running, "rank {rank}");
    }
}
