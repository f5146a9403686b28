//! Elastic membership over the HCCL transport and the fake CANN: eight controllers as threads,
//! weights checked byte for byte after every iteration. A rank stops answering (mid-walk, or
//! between cycles); its peers time out and suspend, the engine removes it, the survivors agree
//! (point-to-point gathers over the live ranks), reroute, reload the experts it held alone from
//! the engine's host backup ([`HcclTransport::set_backup`]) and balance again.
//!
//! **The way back.** A rank that *restarts* cannot rejoin: `HcclCommInitRootInfo` joins a whole
//! world at once (every rank of `nRanks` blocks until all joined), and the fake refuses a rank
//! that joins a world twice (`HCCL_E_PARA`, "rank .. joined twice"), as real HCCL has no call that
//! re-admits one rank into a live communicator. The survivors would need a new communicator,
//! which the transport does not do (and their weights live in the old endpoints' workspaces).
//! [`a_restarted_rank_cannot_rejoin_its_communicator`] pins that down. What is tested instead is
//! a rank that *stalled* and comes back with the endpoint it kept (its communicator still
//! usable, as in the fake): it is rebuilt with [`Controller::new_elastic`] from the placement
//! and live set rank 0 hands over, its slots overwritten with zeros first (so nothing it held
//! can pass for a received expert), every rank calls `add_ranks`, and its weights arrive from its
//! peers.
#![cfg(feature = "ascend")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use eplb_ascend_sys::fake::{self, FakeCann};
use eplb_ascend_sys::{Cann, RootInfo, Runtime};
use eplb_core::{EMPTY, HeatStage, Layout, LiveSet, NO_COPY, Phase, Placement, ReplicaChoice};
use eplb_core::{Shape, StageClassifier};
use eplb_policies::PolicyKind;
use eplb_runtime::controller::{Controller, ControllerConfig, MachineConfig, RunMode};
use eplb_runtime::planner::Planner;
use eplb_runtime::policies::policy_for;
use eplb_runtime::rank::Health;
use eplb_runtime::transport::Transport;
use eplb_runtime::transport::hccl::{HcclConfig, HcclTransport, SlotLayout, local_world};
use eplb_runtime::transport::host::canonical_expert_bytes;

const R: usize = 8;
const S: usize = 3;
const BYTES: usize = 40;
const DEAD: usize = 5;
/// The survivors are told at this iteration that `DEAD` is gone.
const REMOVE_AT: usize = 40;
/// ... and that it is back at this one.
const ADD_AT: usize = 90;
const END: usize = 140;
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

fn layout() -> SlotLayout {
    SlotLayout {
        layers: shape().layers(),
        slots_per_rank: S,
        expert_bytes: BYTES,
    }
}

fn runtime() -> (Runtime, FakeCann) {
    let dir = fake::dir().expect("the fake CANN is built for tests");
    let rt = Runtime::init(Cann::load_dir(dir).unwrap()).unwrap();
    let ctl = FakeCann::open(dir).unwrap();
    ctl.set_timeout(FAKE_TIMEOUT);
    (rt, ctl)
}

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

/// Every non-EMPTY slot of this rank holds the canonical bytes of its expert, the expert map
/// points at them, and no routing entry points at a rank outside the live set.
fn check_weights(c: &Controller<HcclTransport>) {
    let shape = *c.shape();
    let per = shape.slots_per_layer();
    let rank = c.rank();
    for l in 0..shape.layers() {
        let row = &c.placement()[l * per + rank * S..l * per + (rank + 1) * S];
        let live: Vec<Vec<u8>> = (0..S).map(|s| c.transport().slot(l, s).unwrap()).collect();
        for (slot, &e) in row.iter().enumerate() {
            if e == EMPTY {
                continue;
            }
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
        for &phy in c.log2phy(l) {
            if phy == NO_COPY {
                continue;
            }
            let holder = phy as usize / S;
            assert!(
                c.live().contains(holder),
                "rank {rank} layer {l}: routes to rank {holder}, not live"
            );
            assert_ne!(c.placement()[l * per + phy as usize], EMPTY);
        }
    }
}

/// Counts of one forward: skewed, none on an EMPTY slot.
fn counts(c: &Controller<HcclTransport>, it: usize) -> Vec<u32> {
    let shape = *c.shape();
    let per = shape.slots_per_layer();
    let mut out = common::slot_counts(&shape, c.placement(), c.rank(), it, 40, 0);
    for l in 0..shape.layers() {
        for slot in 0..S {
            if c.placement()[l * per + c.rank() * S + slot] == EMPTY {
                out[l * S + slot] = 0;
            }
        }
    }
    out
}

/// Experts this rank had to load when its rows went from `before` to `after`: per layer, the
/// distinct experts of its new row that no rank held before (what `plan_layer` loads).
fn reloads(shape: &Shape, rank: usize, before: &[u16], after: &[u16]) -> u64 {
    let per = shape.slots_per_layer();
    let mut n = 0;
    for (old, new) in before.chunks_exact(per).zip(after.chunks_exact(per)) {
        if old == new {
            continue;
        }
        let row = &new[rank * S..(rank + 1) * S];
        for (i, &e) in row.iter().enumerate() {
            if e != EMPTY && !row[..i].contains(&e) && !old.contains(&e) {
                n += 1;
            }
        }
    }
    n
}

/// Experts of `layer` with no copy in `placement`.
fn lost_in(shape: &Shape, placement: &[u16], layer: usize) -> usize {
    let per = shape.slots_per_layer();
    let rows = &placement[layer * per..(layer + 1) * per];
    (0..shape.experts() as u16)
        .filter(|e| !rows.contains(e))
        .count()
}

/// When the rank stops answering.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Death {
    /// While a layer walk is under way (its peers' exchanges and votes time out).
    MidWalk,
    /// Between cycles, after a plan was walked (its peers notice at the next gather).
    BetweenCycles,
}

impl Death {
    fn now(self, c: &Controller<HcclTransport>) -> bool {
        match self {
            Death::MidWalk => c.is_updating(),
            Death::BetweenCycles => {
                c.stats().layers_committed > 0
                    && !c.is_updating()
                    && c.cycle().phase() == (Phase::Collecting { counted: 1 })
            }
        }
    }
}

/// The backup of one rank: counts what it was asked for.
#[derive(Default)]
struct BackupCalls {
    /// Calls that returned the expert.
    ok: AtomicU64,
    /// Calls that returned `false`.
    refused: AtomicU64,
    /// Successful calls for the layer that fails once (see `Scenario::refuse`).
    ok_on_refused_layer: AtomicU64,
}

/// The layer the backup has no copy of (in the `refuse` case), while `REFUSING` is on.
struct Refusal {
    layer: AtomicUsize,
    on: AtomicBool,
}

#[derive(Debug, Clone, Copy)]
struct Scenario {
    death: Death,
    /// The stalled rank comes back at `ADD_AT`.
    comeback: bool,
    /// The backup has no copy of one layer's lost experts until that layer's first failed walk.
    refuse: bool,
    /// Fake devices `base..base + R` (distinct per test: tests run in parallel).
    base: i32,
    /// The policy every rank's planner runs.
    policy: PolicyKind,
}

struct Seen {
    rank: usize,
    placement: Vec<u16>,
    lost_after_recovery: usize,
    lost_at_remove: usize,
    loads: u64,
    load_failures: u64,
    expected_reloads: u64,
    plans_after_remove: u64,
    health: Health,
    membership_changes: u64,
    /// The refused layer's rows were the same on this rank before and after the forward where
    /// its walk failed (`None`: no such forward).
    refused_layer_kept: Option<bool>,
}

type Handover = (Vec<u16>, LiveSet);

fn run(sc: Scenario) {
    common::debug_log();
    let (rt, ctl) = runtime();
    let shape = shape();
    let init = initial();
    let mut transports = local_world(&rt, R, layout(), sc.base, Duration::from_secs(5)).unwrap();
    let calls: Vec<Arc<BackupCalls>> = (0..R).map(|_| Arc::default()).collect();
    let refusal = Arc::new(Refusal {
        layer: AtomicUsize::new(usize::MAX),
        on: AtomicBool::new(sc.refuse),
    });
    for t in &mut transports {
        let r = t.rank();
        for l in 0..shape.layers() {
            for slot in 0..S {
                let e = init[l * shape.slots_per_layer() + r * S + slot];
                t.load_slot(l, slot, &canonical_expert_bytes(l, e, BYTES))
                    .unwrap();
            }
        }
        let (calls, refusal) = (Arc::clone(&calls[r]), Arc::clone(&refusal));
        t.set_backup(Box::new(move |layer, expert, out: &mut [u8]| {
            if refusal.on.load(Ordering::SeqCst) && refusal.layer.load(Ordering::SeqCst) == layer {
                calls.refused.fetch_add(1, Ordering::SeqCst);
                return false;
            }
            out.copy_from_slice(&canonical_expert_bytes(layer, expert, BYTES));
            calls.ok.fetch_add(1, Ordering::SeqCst);
            if refusal.layer.load(Ordering::SeqCst) == layer {
                calls.ok_on_refused_layer.fetch_add(1, Ordering::SeqCst);
            }
            true
        }));
    }
    let planner = Arc::new(Planner::spawn(policy_for(sc.policy), shape));
    let handover: Arc<Mutex<Option<Handover>>> = Arc::new(Mutex::new(None));
    // The engine's own forward keeps the ranks in step: a barrier per iteration.
    let step = Arc::new(Barrier::new(R));
    let threads: Vec<_> = transports
        .into_iter()
        .map(|t| {
            let rank = t.rank();
            let mut c = Controller::new(
                eplb_core::Placement::new(shape, &init.clone()).unwrap(),
                cfg(),
                t,
                Arc::clone(&planner),
            )
            .unwrap();
            let (step, handover, refusal) = (
                Arc::clone(&step),
                Arc::clone(&handover),
                Arc::clone(&refusal),
            );
            let planner = Arc::clone(&planner);
            std::thread::spawn(move || {
                let mut plans_at_remove = 0;
                let (mut lost_at_remove, mut lost_after_recovery) = (0, usize::MAX);
                let mut expected_reloads = 0;
                let mut refused_layer_kept = None;
                let mut dead = false;
                let mut joined_at = None;
                for it in 0..END {
                    step.wait();
                    if rank == DEAD && it == ADD_AT && sc.comeback {
                        // The stalled rank comes back over the endpoint it kept, knowing nothing
                        // but what rank 0 hands over; its slots are wiped first.
                        let (p, live) = loop {
                            if let Some(h) = handover.lock().unwrap().clone() {
                                break h;
                            }
                            std::thread::sleep(Duration::from_millis(1));
                        };
                        assert!(
                            common::rank_rows(&shape, &p, DEAD)
                                .iter()
                                .flatten()
                                .all(|&e| e == EMPTY)
                        );
                        let mut t = c.into_transport();
                        for l in 0..shape.layers() {
                            for slot in 0..S {
                                t.load_slot(l, slot, &[0u8; BYTES]).unwrap();
                            }
                        }
                        c = Controller::new(
                            eplb_core::Placement::with_live(shape, &p, &live).unwrap(),
                            cfg(),
                            t,
                            Arc::clone(&planner),
                        )
                        .unwrap();
                        c.add_ranks(&[DEAD]).unwrap();
                        dead = false;
                        joined_at = Some(it);
                    }
                    if rank == DEAD
                        && joined_at.is_none()
                        && (dead || sc.death.now(&c) || it >= REMOVE_AT / 2)
                    {
                        // Stops answering (at the latest half-way to its removal); its slot
                        // in the engine's step stays taken.
                        dead = true;
                        continue;
                    }
                    if it == REMOVE_AT {
                        plans_at_remove = c.stats().plans_taken;
                        c.remove_ranks(&[DEAD]).unwrap();
                    }
                    if it == REMOVE_AT + 1 {
                        lost_at_remove = c.machine().lost_count();
                        if rank == 0 && sc.refuse {
                            // The first layer that lost every copy of an expert.
                            let l = (0..shape.layers())
                                .find(|&l| lost_in(&shape, c.placement(), l) > 0)
                                .expect("the removal loses some expert");
                            refusal.layer.store(l, Ordering::SeqCst);
                        }
                    }
                    if it == ADD_AT - 5 {
                        lost_after_recovery = c.machine().lost_count();
                    }
                    if it == ADD_AT && sc.comeback && rank != DEAD {
                        if rank == 0 {
                            *handover.lock().unwrap() = Some((c.placement().to_vec(), *c.live()));
                        }
                        c.add_ranks(&[DEAD]).unwrap();
                    }
                    let before = c.placement().to_vec();
                    c.before_forward();
                    let n = counts(&c, it);
                    let ev = c.after_forward(&n, 64).unwrap();
                    if std::env::var("EPLB_DEBUG").is_ok()
                        && (ev.suspended || ev.membership || ev.failed.is_some())
                    {
                        eprintln!("rank {rank} it {it}: {ev:?} {:?}", c.stats());
                    }
                    expected_reloads += reloads(&shape, rank, &before, c.placement());
                    let refused = refusal.layer.load(Ordering::SeqCst);
                    if sc.refuse && ev.failed == Some(refused as u16) {
                        let per = shape.slots_per_layer();
                        let rows = refused * per..(refused + 1) * per;
                        refused_layer_kept = Some(
                            before[rows.clone()] == c.placement()[rows.clone()]
                                && lost_in(&shape, c.placement(), refused) > 0,
                        );
                        // The backup has the layer again from now on.
                        refusal.on.store(false, Ordering::SeqCst);
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
                    load_failures: c.stats().load_failures,
                    expected_reloads,
                    plans_after_remove: c.stats().plans_taken - plans_at_remove,
                    health: c.health(),
                    membership_changes: c.stats().membership_changes,
                    refused_layer_kept,
                })
            })
        })
        .collect();
    let seen: Vec<Seen> = threads
        .into_iter()
        .filter_map(|t| t.join().unwrap())
        .collect();
    ctl.clear(None);
    let what = format!("{sc:?}");
    assert_eq!(
        seen.len(),
        if sc.comeback { R } else { R - 1 },
        "{what}: only the dead rank stopped"
    );
    let survivors = || seen.iter().filter(|s| s.rank != DEAD);
    for s in &seen {
        assert_eq!(
            s.placement, seen[0].placement,
            "{what}: rank {} disagrees",
            s.rank
        );
        assert_eq!(s.health, Health::Running, "{what}: rank {}", s.rank);
        // Every call of the backup that returned the expert fed a committed layer.
        let c = &calls[s.rank];
        assert_eq!(
            c.ok.load(Ordering::SeqCst),
            s.expected_reloads,
            "{what}: rank {}: backup calls vs experts reloaded",
            s.rank
        );
    }
    for s in survivors() {
        assert_eq!(
            s.membership_changes,
            1 + u64::from(sc.comeback),
            "{what}: rank {}",
            s.rank
        );
        assert_eq!(
            s.lost_after_recovery, 0,
            "{what}: rank {}: experts still lost",
            s.rank
        );
        assert!(
            s.plans_after_remove >= 3,
            "{what}: rank {}: balancing stopped",
            s.rank
        );
    }
    let lost = seen[0].lost_at_remove;
    assert!(
        lost > 0,
        "{what}: the removal lost nothing; the test proves nothing"
    );
    let loads: u64 = seen.iter().map(|s| s.loads).sum();
    let ok_calls: u64 = calls.iter().map(|c| c.ok.load(Ordering::SeqCst)).sum();
    assert!(
        loads > 0 && ok_calls >= lost as u64,
        "{what}: {loads} layer loads, {ok_calls} experts"
    );
    eprintln!(
        "{what}: {lost} expert copies lost at the removal, {loads} layer loads, {ok_calls} experts loaded"
    );
    if sc.refuse {
        let refused: u64 = calls.iter().map(|c| c.refused.load(Ordering::SeqCst)).sum();
        let failures: u64 = seen.iter().map(|s| s.load_failures).sum();
        assert!(refused > 0, "{what}: the backup never refused");
        assert_eq!(refused, failures, "{what}: refusals vs load failures");
        for s in &seen {
            assert_eq!(
                s.refused_layer_kept,
                Some(true),
                "{what}: rank {}: the refused layer did not keep its rows",
                s.rank
            );
        }
        // ... and a later cycle reloaded it.
        let again: u64 = calls
            .iter()
            .map(|c| c.ok_on_refused_layer.load(Ordering::SeqCst))
            .sum();
        assert!(again > 0, "{what}: the refused layer was never reloaded");
    }
    if sc.comeback {
        Placement::new(shape, &seen[0].placement).unwrap();
        assert!(
            common::rank_rows(&shape, &seen[0].placement, DEAD)
                .iter()
                .flatten()
                .all(|&e| e != EMPTY),
            "{what}: the returning rank's slots are not all filled"
        );
    }
}

#[test]
fn a_rank_dies_mid_walk_is_removed_and_its_stalled_endpoint_comes_back() {
    for (i, policy) in PolicyKind::ALL.into_iter().enumerate() {
        run(Scenario {
            death: Death::MidWalk,
            comeback: true,
            refuse: false,
            base: 1000 + 10 * i as i32,
            policy,
        });
    }
}

#[test]
fn a_rank_dies_between_cycles_is_removed_and_its_stalled_endpoint_comes_back() {
    run(Scenario {
        death: Death::BetweenCycles,
        comeback: true,
        refuse: false,
        base: 1100,
        policy: PolicyKind::Default,
    });
}

#[test]
fn a_backup_without_the_expert_keeps_the_layer_and_the_next_cycle_reloads_it() {
    run(Scenario {
        death: Death::BetweenCycles,
        comeback: false,
        refuse: true,
        base: 1200,
        policy: PolicyKind::Default,
    });
}

#[test]
fn a_restarted_rank_cannot_rejoin_its_communicator() {
    // HCCL has no call that re-admits one rank into a live communicator, and the fake refuses a
    // second join of the same rank. If this starts to pass, the restart case can be tested.
    let (rt, _ctl) = runtime();
    let base = 1300;
    let root = Arc::new(RootInfo::generate(&rt, base).unwrap());
    let hs: Vec<_> = (0..R)
        .map(|rank| {
            let (rt, root) = (rt.clone(), Arc::clone(&root));
            std::thread::spawn(move || {
                let cfg = HcclConfig {
                    device: base + rank as i32,
                    timeout: Duration::from_secs(5),
                };
                HcclTransport::new(&rt, &root, rank, R, layout(), cfg).unwrap()
            })
        })
        .collect();
    let mut ts: Vec<HcclTransport> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    // Rank DEAD's process dies: its endpoint (communicator, workspace) is gone.
    drop(ts.remove(DEAD));
    let cfg = HcclConfig {
        device: base + 20,
        timeout: Duration::from_secs(5),
    };
    let again = HcclTransport::new(&rt, &root, DEAD, R, layout(), cfg);
    let e = again
        .expect_err("the fake let a rank join its world twice")
        .to_string();
    assert!(e.contains("joined twice"), "{e}");
}
