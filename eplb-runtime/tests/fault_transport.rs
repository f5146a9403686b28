//! Issue 27 through the real controllers: 8 ranks as threads, each with its own planner thread,
//! over the host transport and (feature `ascend`) the HCCL transport on the fake CANN. A wrapper
//! endpoint injects one fault on one rank: a collective that fails there after its peers read
//! every word, one that rank never enters (a one-sided timeout: the host's rounds must
//! realign), a word that arrives corrupted there, or an install that fails there. Every run
//! ends with every rank balancing on one placement, every slot holding what the placement says,
//! and layers committed after the fault. Then `resume()` mid-walk through the controllers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eplb_core::{HeatStage, ReplicaChoice, Shape, StageClassifier};
use eplb_policies::PolicyKind;
use eplb_runtime::controller::{Controller, ControllerConfig, MachineConfig, RunMode};
use eplb_runtime::planner::Planner;
use eplb_runtime::policies::policy_for;
use eplb_runtime::rank::{AGREE_WORDS, Gather, Health, tag_gather};
use eplb_runtime::transfer::RankPlan;
use eplb_runtime::transport::host::{HostTransport, HostWorld, canonical_expert_bytes};
use eplb_runtime::transport::{Op, Site, Transport, TransportError};

const R: usize = 8;
const BYTES: usize = 32;
/// The rank the fault hits.
const K: usize = 3;
/// The host world's collective timeout, and how late a late rank is: after its peers gave up
/// on the collective, before they give up on the next one.
const TIMEOUT: Duration = Duration::from_millis(400);
const LATE: Duration = Duration::from_millis(560);

/// Where the fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Heat,
    Ready,
    Digest,
    Vote,
    Placement,
    Commit,
}

const COLLECTIVES: [Target; 5] = [
    Target::Heat,
    Target::Ready,
    Target::Digest,
    Target::Vote,
    Target::Placement,
];

/// How it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The collective runs, then reports a timeout on this rank only.
    Fail,
    /// This rank never enters the collective and reports a timeout (its peers time out too).
    Skip,
    /// This rank enters the collective after its peers gave up on it (a slow rank: a one-sided
    /// timeout).
    Late,
    /// The collective runs and reports success, one peer word arrives changed.
    Corrupt,
}

fn target_of(local: &[u64]) -> Target {
    if local.len() != AGREE_WORDS {
        return Target::Heat;
    }
    match local.first().and_then(|&t| tag_gather(t)).map(|(g, _)| g) {
        Some(Gather::Ready) => Target::Ready,
        Some(Gather::Digest) => Target::Digest,
        Some(Gather::Vote { .. }) => Target::Vote,
        Some(Gather::Placement) => Target::Placement,
        _ => Target::Heat,
    }
}

/// The one fault of a run: rank `K`, `target`, `mode`, at the first such collective (or install)
/// after the rank's `after`-th collective.
#[derive(Debug)]
struct Plan {
    target: Target,
    mode: Mode,
    after: usize,
    /// How late a late rank is.
    late: Duration,
    /// Collectives in a row the fault hits (the first of the target's kind, then any).
    times: usize,
    hit: AtomicUsize,
}

/// An endpoint that injects `plan` on rank `K`; its collectives are not atomic.
struct Faulty<T> {
    inner: T,
    plan: Arc<Plan>,
    collectives: usize,
}

impl<T: Transport> Faulty<T> {
    fn arm(&mut self, target: Target) -> Option<Mode> {
        let p = &self.plan;
        let hit = p.hit.load(Ordering::SeqCst);
        let due = self.inner.rank() == K
            && hit < p.times
            && (hit > 0 || (p.target == target && self.collectives >= p.after));
        if due {
            p.hit.store(hit + 1, Ordering::SeqCst);
            Some(p.mode)
        } else {
            None
        }
    }

    fn timeout(&self, op: Op) -> TransportError {
        TransportError::Timeout {
            at: Site::new(op, self.inner.rank()),
            detail: "injected, this rank only".into(),
        }
    }
}

impl<T: Transport> Transport for Faulty<T> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn ranks(&self) -> usize {
        self.inner.ranks()
    }
    fn all_gather(&mut self, local: &[u64], out: &mut [u64]) -> Result<(), TransportError> {
        self.collectives += 1;
        match self.arm(target_of(local)) {
            None => self.inner.all_gather(local, out),
            Some(Mode::Skip) => Err(self.timeout(Op::AllGather)),
            Some(Mode::Late) => {
                std::thread::sleep(self.plan.late);
                self.inner.all_gather(local, out)
            }
            Some(Mode::Fail) => {
                self.inner.all_gather(local, out)?;
                Err(self.timeout(Op::AllGather))
            }
            Some(Mode::Corrupt) => {
                self.inner.all_gather(local, out)?;
                let peer = (self.rank() + 1) % R;
                if let Some(w) = out.get_mut(peer * local.len() + 1.min(local.len() - 1)) {
                    *w ^= 0x0101_0000_0000_0001;
                }
                Ok(())
            }
        }
    }
    fn all_agree(&mut self, flag: bool) -> Result<bool, TransportError> {
        self.inner.all_agree(flag)
    }
    fn atomic_collectives(&self) -> bool {
        false
    }
    fn launch(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.inner.launch(plan)
    }
    fn launch_sends(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.inner.launch_sends(plan)
    }
    fn wait(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        self.inner.wait(plan)
    }
    fn commit(&mut self, plan: &RankPlan) -> Result<(), TransportError> {
        if self.arm(Target::Commit).is_some() {
            return Err(TransportError::Failed {
                at: Site::new(Op::Commit, self.rank()).layer(plan.layer),
                code: -1,
                detail: "injected install failure".into(),
            });
        }
        self.inner.commit(plan)
    }
    fn abort(&mut self, plan: &RankPlan) {
        self.inner.abort(plan)
    }
}

/// A transport whose live slots a test can read.
trait Slots: Transport + 'static {
    fn read_slot(&self, layer: usize, slot: usize) -> Vec<u8>;
}

impl Slots for HostTransport {
    fn read_slot(&self, layer: usize, slot: usize) -> Vec<u8> {
        self.slot(layer, slot).unwrap().to_vec()
    }
}

/// Every slot holds the expert the live placement says, and the expert map points at it.
fn check_weights<T: Slots>(c: &Controller<Faulty<T>>) {
    let shape = *c.shape();
    let (s, per) = (shape.slots_per_rank(), shape.slots_per_layer());
    let rank = c.rank();
    for l in 0..shape.layers() {
        let row = &c.placement()[l * per + rank * s..l * per + (rank + 1) * s];
        for (slot, &e) in row.iter().enumerate() {
            assert_eq!(
                c.transport().inner.read_slot(l, slot),
                canonical_expert_bytes(l, e, BYTES),
                "rank {rank} layer {l} slot {slot} does not hold expert {e}"
            );
        }
        for (e, &slot) in c.expert_map(l).iter().enumerate() {
            if slot >= 0 {
                assert_eq!(
                    c.transport().inner.read_slot(l, slot as usize),
                    canonical_expert_bytes(l, e as u16, BYTES),
                    "rank {rank} layer {l}: the map sends expert {e} to slot {slot}"
                );
            }
        }
    }
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
            atomic_collectives: false,
        },
        replica_choice: ReplicaChoice::Plain,
    }
}

/// What one rank ended with.
struct Outcome {
    placement: Vec<u16>,
    health: Health,
    cycle: u64,
    /// Layers committed after the fault (and the resume, if any).
    late_commits: u64,
    collective_failures: u64,
}

/// When the engine calls `resume()` on every rank.
#[derive(Debug, Clone, Copy)]
enum Resume {
    Never,
    /// In the first layer walk from this iteration on.
    MidWalk(usize),
    /// Before this iteration.
    At(usize),
}

/// One run at a time: the runs measure time-outs, and 16 threads each on a 2-core machine are
/// enough.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `iters` iterations of 8 controllers over `transports` (rank order) with `plan`.
fn run<T: Slots>(
    transports: Vec<T>,
    plan: &Arc<Plan>,
    iters: usize,
    resume: Resume,
) -> Vec<Outcome> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let shape = common::small_shape();
    let initial = common::default_layout(&shape);
    let mid_walk = Arc::new(Mutex::new(Vec::new()));
    // A forward needs every rank (the MoE all-to-all): the ranks run iterations in step.
    let forward = Arc::new(std::sync::Barrier::new(R));
    let threads: Vec<_> = transports
        .into_iter()
        .map(|t| {
            let rank = t.rank();
            let planner = Arc::new(Planner::spawn(policy_for(PolicyKind::Random), shape));
            let t = Faulty {
                inner: t,
                plan: Arc::clone(plan),
                collectives: 0,
            };
            let mut c = Controller::new(
                eplb_core::Placement::new(shape, &initial.clone()).unwrap(),
                cfg(),
                t,
                planner,
            )
            .unwrap();
            let mid_walk = Arc::clone(&mid_walk);
            let forward = Arc::clone(&forward);
            let plan = Arc::clone(plan);
            std::thread::spawn(move || {
                let (mut late_commits, mut resumed) = (0, false);
                for it in 0..iters {
                    // The first walk from `resume_at` on: every rank is in it at the same
                    // iteration (they agree on the walk).
                    let now = match resume {
                        Resume::Never => false,
                        Resume::MidWalk(at) => it >= at && c.is_updating(),
                        Resume::At(at) => it == at,
                    };
                    if now && !resumed {
                        resumed = true;
                        mid_walk.lock().unwrap().push(it);
                        c.resume();
                    }
                    c.before_forward();
                    forward.wait();
                    let counts = common::slot_counts(&shape, c.placement(), rank, it, 40, it / 9);
                    let rep = c.after_forward(&counts, 64).unwrap();
                    let after = plan.hit.load(Ordering::SeqCst) >= plan.times
                        && (resumed || matches!(resume, Resume::Never));
                    if rep.committed.is_some() && after {
                        late_commits += 1;
                    }
                    check_weights(&c);
                    if rep.plan_late {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                // Finish a walk under way (every rank alike: they agree on the walk).
                let mut more = 0;
                while c.is_updating() && more < 20 {
                    c.before_forward();
                    let counts = common::slot_counts(&shape, c.placement(), rank, iters, 40, 0);
                    c.after_forward(&counts, 64).unwrap();
                    more += 1;
                }
                check_weights(&c);
                Outcome {
                    placement: c.placement().to_vec(),
                    health: c.health(),
                    cycle: c.machine().cycle_number(),
                    late_commits,
                    collective_failures: c.stats().collective_failures,
                }
            })
        })
        .collect();
    let out: Vec<Outcome> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    if let Resume::MidWalk(_) = resume {
        let at = mid_walk.lock().unwrap();
        assert!(
            at.len() == R && at.iter().all(|&i| i == at[0]),
            "resume() mid-walk at iterations {at:?}"
        );
    }
    out
}

fn assert_recovered(out: &[Outcome], what: &str) {
    for (r, o) in out.iter().enumerate() {
        assert_eq!(o.health, Health::Running, "{what}: rank {r}");
        assert_eq!(
            o.placement, out[0].placement,
            "{what}: rank {r} holds another placement"
        );
        assert_eq!(o.cycle, out[0].cycle, "{what}: rank {r}");
        assert!(o.late_commits > 0, "{what}: rank {r} stopped committing");
    }
}

fn host_world(timeout: Duration) -> Vec<HostTransport> {
    let shape: Shape = common::small_shape();
    let initial = common::default_layout(&shape);
    let world = HostWorld::new(R, timeout);
    (0..R)
        .map(|rank| {
            let rows = common::rank_rows(&shape, &initial, rank);
            HostTransport::new(Arc::clone(&world), rank, &rows, BYTES)
        })
        .collect()
}

fn plan(target: Target, mode: Mode) -> Arc<Plan> {
    Arc::new(Plan {
        target,
        mode,
        after: 12,
        late: LATE,
        times: 1,
        hit: AtomicUsize::new(0),
    })
}

#[test]
fn every_one_sided_fault_on_the_host_transport_recovers() {
    let mut cases: Vec<(Target, Mode)> = COLLECTIVES
        .iter()
        .flat_map(|&t| {
            [
                (t, Mode::Fail),
                (t, Mode::Late),
                (t, Mode::Skip),
                (t, Mode::Corrupt),
            ]
        })
        .collect();
    cases.push((Target::Commit, Mode::Fail));
    for (target, mode) in cases {
        let what = format!("host {target:?} {mode:?}");
        let p = plan(target, mode);
        let out = run(host_world(TIMEOUT), &p, 90, Resume::Never);
        assert_eq!(
            p.hit.load(Ordering::SeqCst),
            1,
            "{what}: the fault never hit"
        );
        assert_recovered(&out, &what);
        assert!(
            out[K].collective_failures <= 2,
            "{what}: {}",
            out[K].collective_failures
        );
    }
}

#[test]
fn a_readiness_flag_never_entered_by_one_rank_realigns_the_host_rounds() {
    // Was: 7 of 8 ranks Suspended after resume, for good. Rank K skips its readiness flag; its
    // peers time out there; the rounds realign at once, and every rank balances on.
    let p = plan(Target::Ready, Mode::Skip);
    let out = run(host_world(TIMEOUT), &p, 90, Resume::Never);
    assert_recovered(&out, "ready skip");
    // The peers saw it as a timeout, as words out of step, or (when rank K's own plan was late,
    // so that it asked again at the next iteration, as they did) not at all.
    assert!(out[K].collective_failures >= 1);
}

#[test]
fn a_rank_late_three_times_suspends_every_rank_and_resume_realigns_the_host_rounds() {
    // Rank K is late for three collectives in a row (its readiness flag and the two after it):
    // its peers give up on each, it finds each closed, and every rank suspends (each knows).
    // Then resume() on every rank: the host rounds and the machines realign, and every rank
    // balances again.
    let p = Arc::new(Plan {
        target: Target::Ready,
        mode: Mode::Late,
        after: 12,
        late: LATE,
        times: 3,
        hit: AtomicUsize::new(0),
    });
    let out = run(host_world(TIMEOUT), &p, 90, Resume::At(45));
    assert_eq!(p.hit.load(Ordering::SeqCst), 3);
    assert_recovered(&out, "late thrice, resumed");
    for o in &out {
        assert!(o.collective_failures >= 3, "{}", o.collective_failures);
    }
}

#[test]
fn resume_mid_walk_through_the_controllers_balances_again() {
    let p = plan(Target::Commit, Mode::Fail);
    // No fault; resume() on every rank in the middle of the walk of the third cycle.
    p.hit.store(1, Ordering::SeqCst);
    let out = run(host_world(TIMEOUT), &p, 90, Resume::MidWalk(25));
    assert_recovered(&out, "resume mid-walk");
}

#[cfg(feature = "ascend")]
mod hccl {
    use super::*;
    use eplb_ascend_sys::fake::{self, FakeCann};
    use eplb_ascend_sys::{Cann, Runtime};
    use eplb_runtime::transport::hccl::{HcclTransport, SlotLayout, local_world};

    impl Slots for HcclTransport {
        fn read_slot(&self, layer: usize, slot: usize) -> Vec<u8> {
            self.slot(layer, slot).unwrap()
        }
    }

    fn endpoints(rt: &Runtime, base: i32) -> Vec<HcclTransport> {
        let shape = common::small_shape();
        let initial = common::default_layout(&shape);
        let s = shape.slots_per_rank();
        let layout = SlotLayout {
            layers: shape.layers(),
            slots_per_rank: s,
            expert_bytes: BYTES,
        };
        let mut ts = local_world(rt, R, layout, base, Duration::from_secs(5)).unwrap();
        for t in &mut ts {
            let r = t.rank();
            for l in 0..shape.layers() {
                for slot in 0..s {
                    let e = initial[l * shape.slots_per_layer() + r * s + slot];
                    t.load_slot(l, slot, &canonical_expert_bytes(l, e, BYTES))
                        .unwrap();
                }
            }
        }
        ts
    }

    #[test]
    fn every_one_sided_fault_on_the_fake_hccl_recovers() {
        let dir = fake::dir().expect("the fake CANN is built for tests");
        let rt = Runtime::init(Cann::load_dir(dir).unwrap()).unwrap();
        let ctl = FakeCann::open(dir).unwrap();
        ctl.set_timeout(Duration::from_millis(500));
        let mut cases: Vec<(Target, Mode)> = COLLECTIVES
            .iter()
            .flat_map(|&t| [(t, Mode::Fail), (t, Mode::Corrupt)])
            .collect();
        cases.push((Target::Commit, Mode::Fail));
        for (i, (target, mode)) in cases.into_iter().enumerate() {
            let what = format!("hccl {target:?} {mode:?}");
            let p = plan(target, mode);
            let out = run(endpoints(&rt, 1000 + 10 * i as i32), &p, 70, Resume::Never);
            assert_eq!(
                p.hit.load(Ordering::SeqCst),
                1,
                "{what}: the fault never hit"
            );
            assert_recovered(&out, &what);
        }
        // resume() mid-walk on every rank.
        let p = plan(Target::Commit, Mode::Fail);
        p.hit.store(1, Ordering::SeqCst);
        let out = run(endpoints(&rt, 1200), &p, 70, Resume::MidWalk(25));
        assert_recovered(&out, "hccl resume mid-walk");
    }
}
