//! The rank machine driven on one thread, `R` machines at once, with an in-memory collective and
//! a bounded driver loop that fails on livelock (quinn's `drive_bounded`).

mod common;

use eplb_core::{HeatStage, Phase, Shape, StageClassifier};
use eplb_runtime::rank::{
    Action, Collective, DriveError, Gather, Health, LocalHooks, LocalWorld, MachineConfig,
    PlanAnswer, PlanInput, RankMachine, Reply, RunMode,
};

const H: u32 = 5;
const A: u32 = 2;

fn cfg() -> MachineConfig {
    MachineConfig {
        heat_interval: H,
        algo_interval: A,
        stage: HeatStage::All,
        classifier: StageClassifier::new(1, 0),
        mode: RunMode::Dynamic,
        seed: 0,
        max_collective_failures: 3,
        atomic_collectives: false,
    }
}

/// A per-rank planner: `(rank, cycle, current) -> Some(new)`, or `None` for a failure.
type PlanFn = Box<dyn FnMut(usize, u64, &[u16]) -> Option<Vec<u16>>>;

/// `R` machines, a planner per rank (`plan(rank, cycle, current) -> Some(new)` or `None` for a
/// failure) and the one-thread driver's in-memory collective (failing while
/// `net.set_failing(true)`).
struct Cluster {
    machines: Vec<RankMachine>,
    plan: PlanFn,
    net: LocalWorld,
    settles: Vec<(usize, u64, bool, bool)>,
}

/// The cluster's planner and hooks for one drive.
struct Hooks<'a> {
    plan: &'a mut PlanFn,
    settles: &'a mut Vec<(usize, u64, bool, bool)>,
    shape: Shape,
    answer: Option<eplb_runtime::planner::Plan>,
}

impl LocalHooks for Hooks<'_> {
    type Error = DriveError;

    fn submit(&mut self, r: usize, input: &PlanInput<'_>) -> Result<PlanAnswer<'_>, DriveError> {
        let new = (self.plan)(r, input.cycle, input.current);
        self.answer = new.and_then(|p| common::plan_of(self.shape, input.cycle, input.current, &p));
        Ok(match &self.answer {
            Some(p) => PlanAnswer::Plan(p),
            None => PlanAnswer::Failed,
        })
    }

    fn settle(&mut self, r: usize, cycle: u64, taken: bool, resync: bool) {
        self.settles.push((r, cycle, taken, resync));
    }

    fn collective(&mut self, _r: usize, c: &Collective<'_>) {
        if let Collective::AllGather {
            of: Gather::Heat,
            send,
        } = c
        {
            assert!(!send.is_empty());
        }
    }
}

impl Cluster {
    fn new(plan: PlanFn) -> Self {
        let shape = common::small_shape();
        let p = common::default_layout(&shape);
        let machines: Vec<RankMachine> = (0..shape.ranks())
            .map(|r| {
                RankMachine::new(r, eplb_core::Placement::new(shape, &p).unwrap(), cfg()).unwrap()
            })
            .collect();
        Self {
            net: LocalWorld::new(&machines),
            machines,
            plan,
            settles: Vec::new(),
        }
    }

    /// One forward on every rank, then every action until all are idle (a livelock fails).
    fn iterate(&mut self) {
        let counts: Vec<u32> = (0..self.machines[0].shape().layers()
            * self.machines[0].shape().slots_per_rank())
            .map(|i| (i % 7) as u32 + 1)
            .collect();
        for m in self.machines.iter_mut() {
            self.net.forward(m, &counts, 0).unwrap();
        }
        let mut hooks = Hooks {
            plan: &mut self.plan,
            settles: &mut self.settles,
            shape: *self.machines[0].shape(),
            answer: None,
        };
        self.net.drive(&mut self.machines, &mut hooks).unwrap();
    }

    fn collectives(&self) -> u64 {
        self.machines.iter().map(|m| m.stats().collectives).sum()
    }
}

/// Reverses every rank row of the layers `0..k` (a change every rank can serve).
fn shuffle(current: &[u16], shape: &Shape, k: usize) -> Vec<u16> {
    let mut p = current.to_vec();
    let per = shape.slots_per_layer();
    for layer in p.chunks_exact_mut(per).take(k) {
        layer.reverse();
    }
    p
}

#[test]
fn no_collective_while_collecting_planning_or_between_cycles() {
    let shape = common::small_shape();
    let mut c = Cluster::new(Box::new(move |_, _, cur| Some(shuffle(cur, &shape, 2))));
    let mut busy = 0;
    for _ in 0..200 {
        let phase = c.machines[0].cycle().phase();
        let before = c.collectives();
        c.iterate();
        let ran = c.collectives() - before;
        let quiet = match phase {
            Phase::Collecting { counted } => counted + 1 < H,
            Phase::Planning { waited } => waited + 1 < A,
            Phase::Due | Phase::Updating { .. } => false,
        };
        if quiet {
            assert_eq!(ran, 0, "a collective in {phase:?}");
        }
        busy += usize::from(ran > 0);
    }
    let m = c.machines[0].stats();
    assert!(m.layers_committed >= 2 * 10, "{m:?}");
    // Each cycle: the snapshot (gather), the due iteration (ready + digest) and one iteration
    // per changed layer (its vote): collectives on 4 of its H + A + 2 = 9 iterations.
    assert!(busy <= 200 * 4 / 9 + 4, "{busy} busy iterations");
    // Finish the cycle under way; then per rank and cycle exactly 1 gather + 1 readiness flag
    // + 1 digest + 2 layer votes + 1 placement check.
    while c.machines[0].cycle().phase() != (Phase::Collecting { counted: 0 }) {
        c.iterate();
    }
    let m = c.machines[0].stats();
    assert_eq!(m.collectives, 6 * m.plans_taken);
    let p0 = c.machines[0].placement().to_vec();
    assert!(c.machines.iter().all(|m| m.placement() == p0));
}

#[test]
fn a_digest_mismatch_abandons_the_cycle_on_every_rank_and_resyncs_the_policy() {
    let shape = common::small_shape();
    // Rank 2 plans otherwise in cycle 1 only.
    let mut c = Cluster::new(Box::new(move |r, cycle, cur| {
        Some(shuffle(
            cur,
            &shape,
            if r == 2 && cycle == 1 { 1 } else { 2 },
        ))
    }));
    let start = c.machines[0].placement().to_vec();
    for _ in 0..(H + A) {
        c.iterate();
    }
    for m in &c.machines {
        assert_eq!(m.stats().digest_mismatches, 1);
        assert_eq!(m.stats().layers_committed, 0);
        assert_eq!(m.placement(), start.as_slice());
    }
    assert!(
        c.settles
            .iter()
            .all(|&(_, cycle, taken, resync)| cycle == 1 && !taken && resync)
    );
    assert_eq!(c.settles.len(), shape.ranks());
    // The next cycle agrees and moves.
    for _ in 0..(H + A + 3) {
        c.iterate();
    }
    let p0 = c.machines[0].placement().to_vec();
    assert_ne!(p0, start);
    assert!(
        c.machines
            .iter()
            .all(|m| m.placement() == p0 && m.stats().layers_committed == 2)
    );
}

#[test]
fn a_plan_failing_on_one_rank_is_dropped_everywhere() {
    let shape = common::small_shape();
    let mut c = Cluster::new(Box::new(move |r, cycle, cur| {
        (r != 3 || cycle != 1).then(|| shuffle(cur, &shape, 2))
    }));
    for _ in 0..(H + A) {
        c.iterate();
    }
    assert!(c.machines.iter().all(|m| m.stats().plan_failures == 1));
    assert!(
        c.settles
            .iter()
            .all(|&(_, _, taken, resync)| !taken && !resync)
    );
    for _ in 0..(H + A + 3) {
        c.iterate();
    }
    assert!(c.machines.iter().all(|m| m.stats().layers_committed == 2));
}

#[test]
fn consecutive_collective_failures_suspend_until_the_engine_resumes() {
    let shape = common::small_shape();
    let mut c = Cluster::new(Box::new(move |_, _, cur| Some(shuffle(cur, &shape, 2))));
    c.net.net_mut().set_failing(true);
    for _ in 0..3 * H {
        c.iterate();
    }
    for m in &c.machines {
        assert_eq!(m.health(), Health::Suspended { failures: 3 });
        assert_eq!(m.stats().collective_failures, 3);
    }
    let before = c.collectives();
    for _ in 0..500 {
        c.iterate();
    }
    assert_eq!(
        c.collectives(),
        before,
        "a suspended machine asks for no collective"
    );
    c.net.net_mut().set_failing(false);
    c.machines.iter_mut().for_each(RankMachine::handle_resume);
    for _ in 0..(H + A + 3) {
        c.iterate();
    }
    for m in &c.machines {
        assert_eq!(m.health(), Health::Running);
        assert_eq!(m.stats().layers_committed, 2);
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let shape = common::small_shape();
    let p = common::default_layout(&shape);
    assert!(RankMachine::new(8, eplb_core::Placement::new(shape, &p).unwrap(), cfg()).is_err());
    assert!(eplb_core::Placement::new(shape, &p[1..]).is_err());
    let mut m = RankMachine::new(0, eplb_core::Placement::new(shape, &p).unwrap(), cfg()).unwrap();
    let e = m.handle_forward(&[1, 2, 3], 0).unwrap_err();
    assert!(e.to_string().contains("expected 12 values, got 3"), "{e}");
    // The gathered heat of the wrong length is an error naming it, not a panic.
    let counts = vec![1; shape.layers() * shape.slots_per_rank()];
    for _ in 0..H {
        m.handle_forward(&counts, 0).unwrap();
    }
    assert!(matches!(
        m.poll(),
        Some(Action::Collective(Collective::AllGather {
            of: Gather::Heat,
            ..
        }))
    ));
    let e = m
        .handle_collective(Some(Reply::Words(&[0; 3])))
        .unwrap_err();
    assert!(e.to_string().contains("gathered slot heat"), "{e}");
    // ... and counts as a failed collective; a reply nobody asked for is an error too.
    assert_eq!(m.stats().collective_failures, 1);
    let e = m.handle_collective(Some(Reply::Flag(true))).unwrap_err();
    assert!(e.to_string().contains("none was asked for"), "{e}");
}
