//! Issue 27 on the rank machine alone: a fault on one rank only (a collective that fails there
//! while its peers read every word, or one word that arrives corrupted there, or an install that
//! fails there) in every collective, and `resume()` mid-walk. Eight machines in lock step on one
//! thread ([`LocalWorld`], strict: a rank that leaves its peers' step fails the drive), each
//! with its own policy host, as deployed. Then item 5: seeded random fault schedules over many
//! cycles with every policy, on a lenient collective that answers ranks out of step as a real
//! transport would.

mod common;

use eplb_core::{HeatStage, Phase, Shape, StageClassifier};
use eplb_policies::PolicyKind;
use eplb_runtime::planner::{PolicyHost, policy_input};
use eplb_runtime::policies::policy_for;
use eplb_runtime::rank::{
    DriveError, Entered, Gather, Health, LocalCollective, LocalFault, LocalHooks, LocalWorld,
    MachineConfig, PlanAnswer, PlanInput, RankMachine, RunMode,
};

const H: u32 = 4;
const A: u32 = 2;
/// The rank the single faults hit.
const K: usize = 3;

fn cfg() -> MachineConfig {
    MachineConfig {
        heat_interval: H,
        algo_interval: A,
        stage: HeatStage::All,
        classifier: StageClassifier::new(1, 0),
        mode: RunMode::Dynamic,
        seed: 11,
        max_collective_failures: 3,
        atomic_collectives: false,
    }
}

/// Where a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Heat,
    Ready,
    Digest,
    Vote,
    Placement,
    /// The install of a layer (not a collective): fails once on the rank.
    Commit,
}

const TARGETS: [Target; 6] = [
    Target::Heat,
    Target::Ready,
    Target::Digest,
    Target::Vote,
    Target::Placement,
    Target::Commit,
];

fn target_of(e: Entered) -> Option<Target> {
    match e {
        Entered::AllGather { of, .. } => Some(match of {
            Gather::Heat => Target::Heat,
            Gather::Ready => Target::Ready,
            Gather::Digest => Target::Digest,
            Gather::Vote { .. } => Target::Vote,
            Gather::Placement => Target::Placement,
            Gather::Members => return None,
        }),
        Entered::AllAnd => None,
    }
}

/// Eight rank machines, a policy host each, one collective ([`LocalWorld`]).
struct World {
    shape: Shape,
    machines: Vec<RankMachine>,
    hosts: Vec<PolicyHost>,
    net: LocalWorld,
    it: usize,
    /// Faults waiting for their rank to enter their collective (or install a layer).
    armed: Vec<(usize, Target, LocalFault)>,
    /// Faults that hit.
    hits: usize,
}

/// The world's planners and fault hooks for one drive.
struct Hooks<'a> {
    shape: Shape,
    hosts: &'a mut [PolicyHost],
    armed: &'a mut Vec<(usize, Target, LocalFault)>,
    hits: &'a mut usize,
    answer: Option<eplb_runtime::planner::Plan>,
}

impl LocalHooks for Hooks<'_> {
    type Error = DriveError;

    fn submit(&mut self, r: usize, input: &PlanInput<'_>) -> Result<PlanAnswer<'_>, DriveError> {
        let samples = Some((input.windows, input.samples));
        let plan = policy_input(
            &self.shape,
            input.current,
            input.live,
            input.loads,
            samples,
            input.seed,
        )
        .and_then(|i| self.hosts[r].plan(input.cycle, &i));
        self.answer = plan.ok();
        Ok(match &self.answer {
            Some(p) => PlanAnswer::Plan(p),
            None => PlanAnswer::Failed,
        })
    }

    fn settle(&mut self, r: usize, cycle: u64, taken: bool, resync: bool) {
        self.hosts[r].settle(cycle, taken, resync);
    }

    fn commit(&mut self, r: usize, _layer: u16) -> bool {
        let armed = self
            .armed
            .iter()
            .position(|&(k, t, _)| k == r && t == Target::Commit);
        if let Some(i) = armed {
            self.armed.remove(i);
            *self.hits += 1;
        }
        armed.is_none()
    }

    fn before_answer(&mut self, net: &mut LocalCollective) {
        if let Some(i) = self
            .armed
            .iter()
            .position(|&(rank, target, _)| net.entered(rank).and_then(target_of) == Some(target))
        {
            let (rank, _, fault) = self.armed.remove(i);
            net.inject(rank, fault);
            *self.hits += 1;
        }
    }
}

impl World {
    fn new(kind: PolicyKind, lenient: bool) -> Self {
        let shape = common::small_shape();
        let p = common::default_layout(&shape);
        let machines: Vec<RankMachine> = (0..shape.ranks())
            .map(|r| {
                RankMachine::new(r, eplb_core::Placement::new(shape, &p).unwrap(), cfg()).unwrap()
            })
            .collect();
        let mut net = LocalWorld::new(&machines);
        net.net_mut().set_lenient(lenient);
        Self {
            hosts: (0..shape.ranks())
                .map(|_| PolicyHost::new(policy_for(kind), shape))
                .collect(),
            net,
            shape,
            machines,
            it: 0,
            armed: Vec::new(),
            hits: 0,
        }
    }

    /// One forward on every rank, then every action until all are idle.
    fn iterate(&mut self) -> Result<(), DriveError> {
        let shape = self.shape;
        for (r, m) in self.machines.iter_mut().enumerate() {
            // The hot experts drift, so that plans keep changing.
            let counts = common::slot_counts(&shape, m.placement(), r, self.it, 40, self.it / 9);
            self.net.forward(m, &counts, 64).unwrap();
        }
        self.it += 1;
        let mut hooks = Hooks {
            shape,
            hosts: &mut self.hosts,
            armed: &mut self.armed,
            hits: &mut self.hits,
            answer: None,
        };
        self.net.drive(&mut self.machines, &mut hooks)
    }

    fn run(&mut self, iterations: usize) {
        for _ in 0..iterations {
            if let Err(e) = self.iterate() {
                for m in &self.machines {
                    eprintln!(
                        "rank {}: {:?} {:?} cycle {} {:?}",
                        m.rank(),
                        m.health(),
                        m.cycle().phase(),
                        m.cycle_number(),
                        m.stats()
                    );
                }
                panic!("iteration {}: {e}", self.it);
            }
        }
    }

    /// Runs until the armed fault hit (at most `bound` iterations); whether it did.
    fn run_until_hit(&mut self, bound: usize) -> bool {
        let hits = self.hits;
        for _ in 0..bound {
            if self.hits > hits {
                return true;
            }
            self.run(1);
        }
        self.hits > hits
    }

    /// Runs until no rank is in a layer walk (at most `bound` iterations).
    fn run_until_quiet(&mut self, bound: usize) {
        for _ in 0..bound {
            if self.machines.iter().all(|m| !m.is_updating()) {
                return;
            }
            self.run(1);
        }
    }

    fn committed(&self) -> Vec<u64> {
        self.machines
            .iter()
            .map(|m| m.stats().layers_committed)
            .collect()
    }

    fn plans(&self) -> Vec<u64> {
        self.machines
            .iter()
            .map(|m| m.stats().plans_taken)
            .collect()
    }

    /// Every rank balances, on one placement and one cycle number.
    fn assert_in_step(&self, what: &str) {
        let (p0, c0) = (
            self.machines[0].placement(),
            self.machines[0].cycle_number(),
        );
        for m in &self.machines {
            assert_eq!(m.health(), Health::Running, "{what}: rank {}", m.rank());
            assert!(
                m.placement() == p0,
                "{what}: rank {} holds another placement",
                m.rank()
            );
            assert_eq!(m.cycle_number(), c0, "{what}: rank {}", m.rank());
        }
    }

    fn resume_all(&mut self) {
        self.machines
            .iter_mut()
            .for_each(RankMachine::handle_resume);
    }
}

/// Cycles take at most `H + A + L + 1` iterations on this shape.
const CYCLE: usize = (H + A) as usize + 4 + 1;

/// One fault on rank `K`, in lock step: it hits, every rank stays at one step (the strict
/// collective would fail the drive otherwise), and after a few cycles every rank balances on one
/// placement and has committed again.
fn one_fault(kind: PolicyKind, target: Target, fault: LocalFault) -> World {
    let what = format!("{kind} {target:?} {fault:?}");
    let mut w = World::new(kind, false);
    w.run(2 * CYCLE);
    w.run_until_quiet(CYCLE);
    w.assert_in_step(&format!("{what}, before"));
    w.armed = vec![(K, target, fault)];
    assert!(w.run_until_hit(4 * CYCLE), "{what}: the fault never hit");
    let at = w.committed();
    w.run(4 * CYCLE);
    w.run_until_quiet(CYCLE);
    w.assert_in_step(&what);
    for (r, (now, then)) in w.committed().iter().zip(&at).enumerate() {
        assert!(now > then, "{what}: rank {r} never committed again");
    }
    w
}

#[test]
fn a_heat_gather_failing_on_one_rank_keeps_every_rank_at_one_cycle() {
    // Was: cycle counters [1,1,1,0,1,1,1,1] for good, and a false divergence after resume.
    let mut w = World::new(PolicyKind::Random, false);
    w.run(2 * CYCLE);
    w.run_until_quiet(CYCLE);
    let failures = w.machines[0].stats().plan_failures;
    w.armed = vec![(K, Target::Heat, LocalFault::Fail)];
    assert!(w.run_until_hit(2 * CYCLE));
    let cycles: Vec<u64> = w.machines.iter().map(RankMachine::cycle_number).collect();
    assert!(cycles.iter().all(|&c| c == cycles[0]), "{cycles:?}");
    // Rank K had no plan: every rank dropped that cycle at its digest.
    w.run(CYCLE);
    for m in &w.machines {
        assert_eq!(m.stats().plan_failures, failures + 1, "rank {}", m.rank());
    }
    let at = w.committed();
    w.run(3 * CYCLE);
    w.run_until_quiet(CYCLE);
    w.assert_in_step("heat gather");
    assert!(w.committed().iter().zip(&at).all(|(n, t)| n > t));
    // A resume now finds one placement: no divergence.
    w.resume_all();
    w.run(3 * CYCLE);
    w.run_until_quiet(CYCLE);
    w.assert_in_step("heat gather, resumed");
}

#[test]
fn a_heat_word_corrupted_on_one_rank_drops_the_cycle_everywhere() {
    // Rank K folds other heat, so its plan differs: every rank sees the digests differ.
    let w = one_fault(PolicyKind::Default, Target::Heat, LocalFault::Corrupt);
    for m in &w.machines {
        assert_eq!(m.stats().digest_mismatches, 1, "rank {}", m.rank());
    }
}

#[test]
fn a_readiness_flag_failing_or_corrupted_on_one_rank_recovers() {
    for fault in [LocalFault::Fail, LocalFault::Corrupt] {
        let w = one_fault(PolicyKind::Random, Target::Ready, fault);
        assert_eq!(w.machines[K].stats().collective_failures, 1, "{fault:?}");
    }
}

#[test]
fn a_digest_failing_or_corrupted_on_one_rank_recovers() {
    for fault in [LocalFault::Fail, LocalFault::Corrupt] {
        let w = one_fault(PolicyKind::Random, Target::Digest, fault);
        assert_eq!(w.machines[K].stats().collective_failures, 1, "{fault:?}");
        assert!(w.machines.iter().all(|m| m.stats().digest_mismatches == 0));
    }
}

#[test]
fn a_layer_vote_failing_or_corrupted_on_one_rank_recovers() {
    for fault in [LocalFault::Fail, LocalFault::Corrupt] {
        let w = one_fault(PolicyKind::Random, Target::Vote, fault);
        assert_eq!(w.machines[K].stats().collective_failures, 1, "{fault:?}");
    }
}

#[test]
fn a_placement_check_failing_or_corrupted_on_one_rank_recovers() {
    for fault in [LocalFault::Fail, LocalFault::Corrupt] {
        let w = one_fault(PolicyKind::Random, Target::Placement, fault);
        assert_eq!(w.machines[K].stats().collective_failures, 1, "{fault:?}");
        assert!(w.machines.iter().all(|m| m.stats().resyncs == 0));
    }
}

#[test]
fn a_failed_install_on_one_rank_is_tried_again_not_served_on() {
    let w = one_fault(PolicyKind::Random, Target::Commit, LocalFault::Fail);
    assert_eq!(w.machines[K].stats().commit_failures, 1);
    assert!(w.machines.iter().all(|m| m.stats().layers_failed == 0));
}

#[test]
fn a_vote_unknown_on_one_rank_and_its_placement_check_failing_there_is_repaired() {
    // The last vote of a walk fails on rank K, then its placement check fails there too: rank K
    // holds the layer open into the next cycle; the next readiness flag sees the placements
    // differ, every rank drops the cycle and checks at once, and rank K commits the kept layer.
    let mut w = World::new(PolicyKind::Random, false);
    w.run(2 * CYCLE);
    w.run_until_quiet(CYCLE);
    let per = w.shape.slots_per_layer();
    let mut repaired = false;
    for _ in 0..20 * CYCLE {
        // The walk's last layer is in flight: its vote comes after this forward.
        let m0 = &w.machines[0];
        let last = (0..w.shape.layers())
            .rev()
            .find(|&l| m0.plan()[l * per..(l + 1) * per] != m0.placement()[l * per..(l + 1) * per]);
        let at_last = matches!(m0.cycle().phase(), Phase::Updating { layer } if Some(usize::from(layer)) == last);
        if !at_last {
            w.run(1);
            continue;
        }
        // The check follows the last vote in the same iteration.
        w.armed = vec![
            (K, Target::Vote, LocalFault::Fail),
            (K, Target::Placement, LocalFault::Fail),
        ];
        w.run(1);
        assert!(
            w.armed.is_empty(),
            "the last vote or the check did not come"
        );
        repaired = w.machines[K].placement() != w.machines[0].placement();
        break;
    }
    assert!(repaired, "never held a layer open past its placement check");
    w.armed.clear();
    w.run(3 * CYCLE);
    w.run_until_quiet(CYCLE);
    w.assert_in_step("kept layer");
    assert!(w.machines.iter().all(|m| m.stats().resyncs >= 1));
}

#[test]
fn resume_mid_walk_on_every_rank_resynchronizes_and_balances_again() {
    let mut w = World::new(PolicyKind::Random, false);
    w.run(2 * CYCLE);
    for _ in 0..3 * CYCLE {
        if w.machines[0].is_updating() {
            break;
        }
        w.run(1);
    }
    assert!(w.machines.iter().all(RankMachine::is_updating));
    w.resume_all();
    let at = w.committed();
    w.run(4 * CYCLE);
    w.run_until_quiet(CYCLE);
    w.assert_in_step("resume mid-walk");
    assert!(w.committed().iter().zip(&at).all(|(n, t)| n > t));
}

#[test]
fn a_rank_suspended_mid_walk_and_resume_on_every_rank_resynchronize() {
    // Rank K's votes fail three times in a row (one side only): it holds the first layer open,
    // votes no on the next ones, and suspends mid-walk while its peers are still walking. The
    // engine resumes every rank right then: every rank drops the walk, they check their
    // placements, K installs the layer it kept, and they balance on.
    let mut w = World::new(PolicyKind::Random, false);
    w.run(2 * CYCLE);
    w.run_until_quiet(CYCLE);
    w.armed = vec![(K, Target::Vote, LocalFault::Fail); 3];
    for _ in 0..4 * CYCLE {
        if w.machines[K].health() != Health::Running {
            break;
        }
        w.run(1);
    }
    assert_eq!(w.machines[K].health(), Health::Suspended { failures: 3 });
    assert!(w.armed.is_empty());
    assert!(
        w.machines
            .iter()
            .any(|m| m.placement() != w.machines[K].placement()),
        "rank K should hold a layer open"
    );
    assert!(
        w.machines
            .iter()
            .all(|m| m.rank() == K || (m.health() == Health::Running && m.is_updating())),
        "the peers should be mid-walk"
    );
    w.resume_all();
    let at = w.committed();
    w.run(4 * CYCLE);
    w.run_until_quiet(CYCLE);
    w.assert_in_step("suspended mid-walk, resumed");
    assert!(w.committed().iter().zip(&at).all(|(n, t)| n > t));
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Item 5: seeded random fault schedules, 8 ranks, every policy. Each fault: which rank, which
/// collective (or install), fail or corrupt, after how many iterations. After every fault the
/// ranks settle within two cycles into one of two states: every rank balancing on one placement,
/// or every rank suspended; suspended ranks are resumed, and then they balance (take plans, and
/// commit, over the schedule) again.
#[test]
fn random_fault_schedules_never_leave_ranks_on_different_placements() {
    // More with EPLB_FAULT_SEEDS=N (the gate runs 6).
    let seeds: u64 = std::env::var("EPLB_FAULT_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    const FAULTS: usize = 12;
    let (mut schedules, mut faults, mut suspensions) = (0, 0, 0);
    for kind in PolicyKind::ALL {
        let mut moved = 0;
        for seed in 0..seeds {
            let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ kind as u64);
            let mut w = World::new(kind, true);
            w.run(CYCLE);
            let start = w.committed()[0];
            for f in 0..FAULTS {
                let what = format!("{kind} seed {seed} fault {f}");
                w.run(rng.below(CYCLE));
                // One to three faults at once, each on its own rank and collective.
                for _ in 0..1 + rng.below(3) {
                    let target = TARGETS[rng.below(TARGETS.len())];
                    let fault = if target == Target::Commit || rng.below(2) == 0 {
                        LocalFault::Fail
                    } else {
                        LocalFault::Corrupt
                    };
                    w.armed.push((rng.below(8), target, fault));
                }
                let armed = w.armed.clone();
                for _ in 0..2 * CYCLE {
                    if w.armed.is_empty() {
                        break;
                    }
                    w.run(1);
                }
                w.armed.clear();
                w.run(2 * CYCLE);
                w.run_until_quiet(2 * CYCLE);
                let running = w
                    .machines
                    .iter()
                    .filter(|m| m.health() == Health::Running)
                    .count();
                if running < w.machines.len() {
                    assert_eq!(
                        running, 0,
                        "{what} ({armed:?}): some ranks balance, some are suspended"
                    );
                    suspensions += 1;
                    w.resume_all();
                    let plans = w.plans();
                    w.run(2 * CYCLE);
                    w.run_until_quiet(2 * CYCLE);
                    if !w.plans().iter().zip(&plans).all(|(n, t)| n > t) {
                        for m in &w.machines {
                            eprintln!(
                                "rank {}: {:?} {:?} cycle {} upd {} {:?}",
                                m.rank(),
                                m.health(),
                                m.cycle().phase(),
                                m.cycle_number(),
                                m.is_updating(),
                                m.stats()
                            );
                        }
                    }
                    assert!(
                        w.plans().iter().zip(&plans).all(|(n, t)| n > t),
                        "{what}: no plan taken after resume"
                    );
                }
                w.assert_in_step(&format!("{what} ({armed:?})"));
            }
            faults += w.hits;
            schedules += 1;
            moved += w.committed()[0] - start;
        }
        if kind != PolicyKind::Swift && kind != PolicyKind::FlashLb {
            assert!(moved > 0, "{kind}: nothing committed under faults");
        }
    }
    println!(
        "fault schedules: {schedules} (6 policies x {seeds} seeds x {FAULTS} episodes of 1-3 \
         faults), faults hit: {faults}, suspensions resumed: {suspensions}, ranks left on different placements: 0"
    );
    assert!(faults >= schedules * FAULTS / 2, "{faults} faults hit");
}
