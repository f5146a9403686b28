//! Elastic membership on the rank machine alone: eight machines in lock step over an in-memory
//! collective, a policy host per rank (every policy), a rank that stops answering between
//! cycles, mid-gather and mid-walk, a second failure during the recovery, and a rank that comes
//! back. After every iteration the live ranks hold one placement, no live rank routes a token to
//! a rank that left, and once the recovery's plan is walked every expert is served again.

mod common;

use eplb_core::{
    EMPTY, HeatStage, LayerPlacement, LiveSet, NO_COPY, Placement, ReplicaChoice, Shape,
    StageClassifier,
};
use eplb_policies::PolicyKind;
use eplb_runtime::planner::{PlanRequest, PolicyHost};
use eplb_runtime::policies::policy_for;
use eplb_runtime::rank::{
    Action, DriveError, Health, LocalHooks, LocalWorld, MachineConfig, PlanAnswer, PlanInput,
    PlannerAction, RankMachine, RunMode,
};

const H: u32 = 4;
const A: u32 = 2;
const POLICIES: [PolicyKind; 6] = [
    PolicyKind::Random,
    PolicyKind::Default,
    PolicyKind::Swift,
    PolicyKind::FlashLb,
    PolicyKind::Incremental,
    PolicyKind::DeepSeek,
];

fn cfg() -> MachineConfig {
    MachineConfig {
        heat_interval: H,
        algo_interval: A,
        stage: HeatStage::All,
        classifier: StageClassifier::new(1, 0),
        mode: RunMode::Dynamic,
        seed: 7,
        max_collective_failures: 3,
        atomic_collectives: false,
    }
}

/// `R` machines (a rank that stopped answering is no longer driven), a policy host each, one
/// lenient collective (a rank that does not enter makes its peers' collective fail, as a
/// timeout would).
struct Cluster {
    shape: Shape,
    kind: PolicyKind,
    machines: Vec<RankMachine>,
    hosts: Vec<PolicyHost>,
    /// The driver; a dead rank is not driven.
    net: LocalWorld,
    /// Loads asked for, per rank; `fail_loads` makes them fail.
    loads_asked: Vec<u64>,
    fail_loads: bool,
    reroutes: Vec<u64>,
    iter: usize,
}

/// The cluster's planners and hooks for one drive.
struct Hooks<'a> {
    kind: PolicyKind,
    hosts: &'a mut [PolicyHost],
    loads_asked: &'a mut [u64],
    fail_loads: bool,
    reroutes: &'a mut [u64],
    answer: Option<eplb_runtime::planner::Plan>,
}

impl LocalHooks for Hooks<'_> {
    type Error = DriveError;

    fn submit(&mut self, r: usize, input: &PlanInput<'_>) -> Result<PlanAnswer<'_>, DriveError> {
        let req = PlanRequest {
            cycle: input.cycle,
            current: input.current.to_vec(),
            live: *input.live,
            loads: input.loads.to_vec(),
            samples: Some((input.windows, input.samples.to_vec())),
            seed: input.seed,
        };
        let cycle = req.cycle;
        match self.hosts[r].plan_request(&req) {
            Ok(p) => Ok(PlanAnswer::Plan(self.answer.insert(p))),
            Err(e) => panic!("{:?}: rank {r}: cycle {cycle}: {e}", self.kind),
        }
    }

    fn settle(&mut self, r: usize, cycle: u64, taken: bool, resync: bool) {
        self.hosts[r].settle(cycle, taken, resync);
    }

    fn load(&mut self, r: usize, _layer: u16) -> bool {
        self.loads_asked[r] += 1;
        !self.fail_loads
    }

    fn reroute(&mut self, r: usize) {
        self.reroutes[r] += 1;
    }
}

impl Cluster {
    fn new(kind: PolicyKind) -> Self {
        let shape = common::small_shape();
        let p = common::default_layout(&shape);
        let machines: Vec<RankMachine> = (0..shape.ranks())
            .map(|r| {
                RankMachine::new(r, eplb_core::Placement::new(shape, &p).unwrap(), cfg()).unwrap()
            })
            .collect();
        let mut net = LocalWorld::new(&machines);
        net.net_mut().set_lenient(true);
        Self {
            shape,
            kind,
            hosts: (0..shape.ranks())
                .map(|_| PolicyHost::new(policy_for(kind), shape))
                .collect(),
            net,
            machines,
            loads_asked: vec![0; shape.ranks()],
            fail_loads: false,
            reroutes: vec![0; shape.ranks()],
            iter: 0,
        }
    }

    /// Skewed per-slot counts of `rank` under its live placement; an EMPTY slot gets none.
    fn counts(&self, rank: usize) -> Vec<u32> {
        let (s, per) = (self.shape.slots_per_rank(), self.shape.slots_per_layer());
        let p = self.machines[rank].placement();
        let mut out = Vec::new();
        for l in 0..self.shape.layers() {
            for slot in 0..s {
                let e = p[l * per + rank * s + slot];
                out.push(if e == EMPTY {
                    0
                } else if (usize::from(e) + l).is_multiple_of(5) {
                    40
                } else {
                    3 + (self.iter % 3) as u32
                });
            }
        }
        out
    }

    /// One forward on every driven rank, then every action until all are idle; then checks
    /// that the live ranks hold one placement and route nothing to a rank outside their set.
    fn iterate(&mut self) {
        self.iter += 1;
        for r in 0..self.machines.len() {
            if !self.net.is_driven(r) {
                continue;
            }
            let counts = self.counts(r);
            self.net.forward(&mut self.machines[r], &counts, 0).unwrap();
        }
        let mut hooks = Hooks {
            kind: self.kind,
            hosts: &mut self.hosts,
            loads_asked: &mut self.loads_asked,
            fail_loads: self.fail_loads,
            reroutes: &mut self.reroutes,
            answer: None,
        };
        // A dead rank's machine is frozen: the world answers the driven machines only.
        let settled = self.net.drive(&mut self.machines, &mut hooks);
        assert!(
            settled.is_ok(),
            "livelock: still exchanging after 16 collectives: {settled:?}"
        );
        self.check_one_placement();
    }

    fn live_ranks(&self) -> Vec<usize> {
        (0..self.machines.len())
            .filter(|&r| self.net.is_driven(r))
            .collect()
    }

    /// No pair of live ranks serves on different placements, and no live rank routes a token to
    /// a slot of a rank outside the agreed set.
    fn check_one_placement(&self) {
        let ranks = self.live_ranks();
        let first = &self.machines[ranks[0]];
        for &r in &ranks {
            let m = &self.machines[r];
            if !m.live().contains(r) {
                continue; // a rank that waits to join serves nothing yet
            }
            assert_eq!(
                m.placement(),
                first.placement(),
                "{:?}: iteration {}: rank {r} serves on another placement than rank {}",
                self.kind,
                self.iter,
                ranks[0]
            );
            let live = m.live();
            let (per, s) = (self.shape.slots_per_layer(), self.shape.slots_per_rank());
            let mut out = vec![0u32; self.shape.experts()];
            for (l, rows) in m.placement().chunks_exact(per).enumerate() {
                let lp = LayerPlacement::with_live(self.shape, l, rows, live).unwrap();
                lp.log2phy(r, ReplicaChoice::Plain, &mut out).unwrap();
                for (e, &phy) in out.iter().enumerate() {
                    if phy == NO_COPY {
                        continue;
                    }
                    let holder = phy as usize / s;
                    assert!(
                        live.contains(holder) && rows[phy as usize] == e as u16,
                        "{:?}: rank {r} routes expert {e} of layer {l} to rank {holder}",
                        self.kind
                    );
                }
            }
        }
    }

    /// Iterates until every live machine is idle between cycles (at most `limit` iterations).
    fn run(&mut self, iterations: usize) {
        for _ in 0..iterations {
            self.iterate();
        }
    }

    /// Every live rank is told the live set at the same iteration.
    fn membership(&mut self, live: LiveSet) {
        for r in self.live_ranks() {
            self.machines[r].handle_membership(live).unwrap();
        }
    }

    /// The rank stops answering (its machine is no longer driven).
    fn kill(&mut self, rank: usize) {
        self.net.set_driven(rank, false);
    }

    fn lost(&self) -> usize {
        self.machines[self.live_ranks()[0]].lost_count()
    }
}

fn without(ranks: usize, gone: &[usize]) -> LiveSet {
    let mut l = LiveSet::all(ranks).unwrap();
    for &g in gone {
        l.remove(g).unwrap();
    }
    l
}

/// The rank whose death loses the most experts of the default layout (its copies are the only
/// ones of some experts).
fn victim(shape: &Shape) -> usize {
    let p = common::default_layout(shape);
    (0..shape.ranks())
        .max_by_key(|&r| {
            let mut lost = vec![false; shape.experts()];
            p.chunks_exact(shape.slots_per_layer())
                .map(|layer| {
                    eplb_core::live::lost_experts(
                        shape,
                        layer,
                        &without(shape.ranks(), &[r]),
                        &mut lost,
                    )
                    .unwrap()
                })
                .sum::<usize>()
        })
        .unwrap()
}

#[test]
fn between_cycles_the_survivors_agree_reroute_reload_and_balance_again_for_every_policy() {
    for kind in POLICIES {
        let mut c = Cluster::new(kind);
        let shape = c.shape;
        let dead = victim(&shape);
        // Two cycles as usual.
        c.run(2 * (H + A + 6) as usize);
        // The rank stops answering; the engine tells the survivors at once.
        c.kill(dead);
        let live = without(shape.ranks(), &[dead]);
        c.membership(live);
        c.iterate();
        for r in c.live_ranks() {
            let m = &c.machines[r];
            assert_eq!(*m.live(), live, "{kind:?}: rank {r}");
            assert_eq!(m.stats().membership_changes, 1, "{kind:?}: rank {r}");
            assert_eq!(c.reroutes[r], 1, "{kind:?}: rank {r} rerouted once");
            // The routing-only step: the dead rank's slots are empty, nothing else moved.
            let s = shape.slots_per_rank();
            for layer in m.placement().chunks_exact(shape.slots_per_layer()) {
                assert!(layer[dead * s..(dead + 1) * s].iter().all(|&e| e == EMPTY));
            }
        }
        let lost_at_failure = c.lost();
        assert!(
            lost_at_failure > 0,
            "{kind:?}: the victim held some only copies"
        );
        // Within one cycle (plus its walk) every expert is served again and the lost ones were
        // loaded through the engine's answer.
        c.run((H + A) as usize + 2 * shape.layers() + 2);
        assert_eq!(c.lost(), 0, "{kind:?}: every expert has a live copy again");
        let loads: u64 = c.loads_asked.iter().sum();
        assert!(loads > 0, "{kind:?}: the lost experts were loaded");
        for r in c.live_ranks() {
            let m = &c.machines[r];
            assert_eq!(m.health(), Health::Running, "{kind:?}: rank {r}");
            assert!(m.stats().layers_committed > 0, "{kind:?}: rank {r}");
            assert_eq!(m.stats().load_failures, 0);
        }
        // And it keeps balancing over the survivors.
        let before = c.machines[c.live_ranks()[0]].stats().plans_taken;
        c.run(2 * (H + A + 6) as usize);
        assert!(
            c.machines[c.live_ranks()[0]].stats().plans_taken >= before + 2,
            "{kind:?}"
        );
        assert_eq!(c.lost(), 0, "{kind:?}");
    }
}

#[test]
fn a_failed_load_keeps_the_layer_everywhere_and_the_next_cycle_reloads() {
    let mut c = Cluster::new(PolicyKind::Default);
    let shape = c.shape;
    let dead = victim(&shape);
    c.run((H + A + 6) as usize);
    c.kill(dead);
    c.membership(without(shape.ranks(), &[dead]));
    c.iterate();
    let lost = c.lost();
    assert!(lost > 0);
    c.fail_loads = true;
    c.run((H + A) as usize + 2 * shape.layers() + 2);
    // Every layer that needed a load kept its rows on every rank (the loop checks they agree).
    assert_eq!(
        c.lost(),
        lost,
        "nothing lost was installed without its load"
    );
    let failures: u64 = c.machines.iter().map(|m| m.stats().load_failures).sum();
    assert!(failures > 0);
    c.fail_loads = false;
    c.run(2 * ((H + A) as usize + 2 * shape.layers() + 2));
    assert_eq!(c.lost(), 0);
}

#[test]
fn a_rank_that_stops_mid_gather_or_mid_walk_then_a_second_failure_during_recovery() {
    for kind in [
        PolicyKind::Default,
        PolicyKind::Incremental,
        PolicyKind::FlashLb,
    ] {
        let mut c = Cluster::new(kind);
        let shape = c.shape;
        // Mid-walk: run until a layer walk is under way, then rank 6 stops answering. Its peers'
        // next collective times out.
        let mut guard = 0;
        while !c.machines[0].is_updating() {
            c.iterate();
            guard += 1;
            assert!(guard < 100, "{kind:?}: no walk started");
        }
        c.kill(6);
        c.iterate();
        c.membership(without(shape.ranks(), &[6]));
        c.iterate();
        // A second rank stops before the recovery's plan: mid-gather (at the next snapshot).
        let mut guard = 0;
        while c.machines[0].cycle().phase() != (eplb_core::Phase::Collecting { counted: H - 1 }) {
            c.iterate();
            guard += 1;
            assert!(guard < 100, "{kind:?}: no snapshot");
        }
        c.kill(2);
        c.iterate(); // the heat gather times out on the survivors
        c.membership(without(shape.ranks(), &[2, 6]));
        c.run(2 * ((H + A) as usize + 2 * shape.layers() + 2));
        assert_eq!(c.lost(), 0, "{kind:?}");
        for r in c.live_ranks() {
            let m = &c.machines[r];
            assert_eq!(m.stats().membership_changes, 2, "{kind:?}: rank {r}");
            assert_eq!(m.health(), Health::Running, "{kind:?}: rank {r}");
            assert_eq!(m.live().count(), 6);
        }
    }
}

#[test]
fn a_returning_rank_gets_its_weights_from_its_peers_before_it_serves() {
    for kind in POLICIES {
        let mut c = Cluster::new(kind);
        let shape = c.shape;
        let dead = 3;
        c.run((H + A + 6) as usize);
        c.kill(dead);
        let without3 = without(shape.ranks(), &[dead]);
        c.membership(without3);
        c.run((H + A) as usize + 2 * shape.layers() + 2);
        assert_eq!(c.lost(), 0, "{kind:?}");
        // Rank 3 restarts from the survivors' placement (its rows empty) and waits to join.
        let survivors = c.machines[0].placement().to_vec();
        c.machines[dead] = RankMachine::new(
            dead,
            eplb_core::Placement::with_live(shape, &survivors, &without3).unwrap(),
            cfg(),
        )
        .unwrap();
        c.hosts[dead] = PolicyHost::new(policy_for(kind), shape);
        c.net.set_driven(dead, true);
        c.iterate(); // it does nothing until told
        assert_eq!(c.machines[dead].stats().collectives, 0);
        // The engine hands it the placement its peers hold when it is let in (they may have
        // walked a layer meanwhile).
        let survivors = c.machines[0].placement().to_vec();
        c.machines[dead] = RankMachine::new(
            dead,
            eplb_core::Placement::with_live(shape, &survivors, &without3).unwrap(),
            cfg(),
        )
        .unwrap();
        // Every rank, the returning one too, is told the full set.
        let all = LiveSet::all(shape.ranks()).unwrap();
        c.membership(all);
        c.iterate();
        assert_eq!(*c.machines[dead].live(), all, "{kind:?}");
        // Until a walk fills its rows, it holds nothing (so nothing is routed to it).
        let s = shape.slots_per_rank();
        let rows = |c: &Cluster| {
            c.machines[0]
                .placement()
                .chunks_exact(shape.slots_per_layer())
                .map(|l| l[dead * s..(dead + 1) * s].to_vec())
                .collect::<Vec<_>>()
        };
        assert!(rows(&c).iter().flatten().all(|&e| e == EMPTY), "{kind:?}");
        c.run(2 * ((H + A) as usize + 2 * shape.layers() + 2));
        // Filled from its peers: a full, strictly valid placement again, on every rank.
        assert!(
            rows(&c).iter().flatten().all(|&e| e != EMPTY),
            "{kind:?}: {:?} {:?} {:?}",
            rows(&c),
            c.machines[dead].stats(),
            c.machines[0].stats()
        );
        let p = c.machines[dead].placement().to_vec();
        Placement::new(shape, &p).unwrap();
        assert!(c.machines.iter().all(|m| m.placement() == p.as_slice()));
        assert_eq!(c.machines[dead].stats().load_failures, 0);
    }
}

#[test]
fn ranks_told_different_sets_adopt_nothing_and_say_so() {
    use eplb_runtime::rank::{AGREE_WORDS, Collective, Gather, Reply, agree_tag, seal};
    let shape = common::small_shape();
    let p = common::default_layout(&shape);
    let mut m = RankMachine::new(0, eplb_core::Placement::new(shape, &p).unwrap(), cfg()).unwrap();
    let mine = without(shape.ranks(), &[7]);
    let theirs = without(shape.ranks(), &[6, 7]);
    m.handle_membership(mine).unwrap();
    assert!(matches!(m.poll(), Some(Action::Members { live }) if *live == mine));
    let sent = match m.poll() {
        Some(Action::Collective(Collective::AllGather {
            of: Gather::Members,
            send,
        })) => send.to_vec(),
        other => panic!("expected the members gather, got {other:?}"),
    };
    assert_eq!(sent[1], mine.digest());
    // Seven words: rank 3 says another set.
    let mut words = Vec::new();
    for r in 0..7 {
        let digest = if r == 3 {
            theirs.digest()
        } else {
            mine.digest()
        };
        let w = [sent[0], digest, 0, sent[3]];
        words.extend_from_slice(&w);
        words.push(seal(w));
    }
    assert_eq!(words.len(), 7 * AGREE_WORDS);
    m.handle_collective(Some(Reply::Words(&words))).unwrap();
    assert_eq!(m.stats().membership_changes, 0);
    assert_eq!(m.stats().membership_refused, 1);
    assert!(matches!(m.health(), Health::Suspended { .. }));
    assert_eq!(m.placement(), p.as_slice(), "nothing retired");
    assert_eq!(*m.live(), LiveSet::all(8).unwrap());
    // The same words with rank 3 agreeing: adopted, and the dead rank's slots are empty.
    m.handle_membership(mine).unwrap();
    let _ = m.poll();
    let sent = match m.poll() {
        Some(Action::Collective(Collective::AllGather { send, .. })) => send.to_vec(),
        other => panic!("expected the members gather, got {other:?}"),
    };
    let mut words = Vec::new();
    for _ in 0..7 {
        let w = [sent[0], mine.digest(), 0, sent[3]];
        words.extend_from_slice(&w);
        words.push(seal(w));
    }
    assert_eq!(agree_tag(Gather::Members, 0), sent[0]);
    m.handle_collective(Some(Reply::Words(&words))).unwrap();
    assert_eq!(m.stats().membership_changes, 1);
    assert_eq!(*m.live(), mine);
    let s = shape.slots_per_rank();
    assert!(
        m.placement()
            .chunks_exact(shape.slots_per_layer())
            .all(|l| l[7 * s..8 * s].iter().all(|&e| e == EMPTY))
    );
    assert!(matches!(
        m.poll(),
        Some(Action::Planner(PlannerAction::Settle { resync: true, .. }))
    ));
    assert!(matches!(m.poll(), Some(Action::Reroute)));
    // A bad set is refused up front.
    assert!(m.handle_membership(without(shape.ranks(), &[0])).is_err());
    assert!(m.handle_membership(LiveSet::all(4).unwrap()).is_err());
    // 16 experts need at least 6 ranks of 3 slots.
    assert!(
        m.handle_membership(without(shape.ranks(), &[1, 2, 3]))
            .unwrap_err()
            .to_string()
            .contains("cannot hold 16 experts")
    );
}

/// Every live rank routes nothing to a rank of `gone`, and holds no slot there.
fn routes_to_none_of(c: &Cluster, gone: &[usize]) {
    let shape = c.shape;
    let (per, s) = (shape.slots_per_layer(), shape.slots_per_rank());
    let mut out = vec![0u32; shape.experts()];
    for r in c.live_ranks() {
        let m = &c.machines[r];
        for (l, rows) in m.placement().chunks_exact(per).enumerate() {
            for &g in gone {
                assert!(rows[g * s..(g + 1) * s].iter().all(|&e| e == EMPTY));
            }
            let lp = LayerPlacement::with_live(shape, l, rows, m.live()).unwrap();
            lp.log2phy(r, ReplicaChoice::Plain, &mut out).unwrap();
            for &phy in out.iter().filter(|&&p| p != NO_COPY) {
                let holder = phy as usize / s;
                assert!(
                    !gone.contains(&holder),
                    "rank {r} routes to rank {holder} of layer {l}"
                );
            }
        }
    }
}

#[test]
fn two_remove_ranks_calls_in_one_iteration_end_with_both_ranks_gone_routing_to_neither() {
    let mut c = Cluster::new(PolicyKind::Default);
    let shape = c.shape;
    c.run((H + A + 6) as usize);
    c.kill(2);
    c.kill(5);
    for r in c.live_ranks() {
        c.machines[r].remove_ranks(&[2]).unwrap();
        c.machines[r].remove_ranks(&[5]).unwrap();
    }
    c.iterate();
    let both = without(shape.ranks(), &[2, 5]);
    for r in c.live_ranks() {
        let m = &c.machines[r];
        assert_eq!(*m.live(), both, "rank {r}");
        assert_eq!(*m.collective_ranks(), both, "rank {r}");
        assert_eq!(m.stats().membership_changes, 1, "rank {r}: one change");
        assert_eq!(m.stats().membership_refused, 0, "rank {r}");
        assert_eq!(c.reroutes[r], 1, "rank {r} rerouted once");
    }
    routes_to_none_of(&c, &[2, 5]);
    // The next cycle plans over the six and reloads what was lost; still nothing goes to them.
    c.run((H + A) as usize + 2 * shape.layers() + 2);
    assert_eq!(c.lost(), 0);
    routes_to_none_of(&c, &[2, 5]);
    for r in c.live_ranks() {
        assert_eq!(c.machines[r].health(), Health::Running, "rank {r}");
    }
}

#[test]
fn remove_then_add_of_the_same_rank_is_no_change_of_members() {
    let mut c = Cluster::new(PolicyKind::Default);
    let shape = c.shape;
    c.run((H + A + 6) as usize);
    let before = c.machines[0].placement().to_vec();
    // Each call goes to the ranks of its set: the removal to every rank but 4, the addition to
    // every rank.
    for r in c.live_ranks() {
        if r != 4 {
            c.machines[r].remove_ranks(&[4]).unwrap();
        }
        c.machines[r].add_ranks(&[4]).unwrap();
    }
    c.iterate();
    let all = LiveSet::all(shape.ranks()).unwrap();
    for r in c.live_ranks() {
        let m = &c.machines[r];
        assert_eq!(*m.live(), all, "rank {r}");
        assert_eq!(
            m.placement(),
            before.as_slice(),
            "rank {r}: no slot retired"
        );
        assert_eq!(m.lost_count(), 0);
    }
    // Across iterations while a change is agreed: remove 7, announce, then remove 6 too; the
    // change starts over with both (announced again), and is agreed as one.
    let p = common::default_layout(&shape);
    let mut m = RankMachine::new(0, eplb_core::Placement::new(shape, &p).unwrap(), cfg()).unwrap();
    m.remove_ranks(&[7]).unwrap();
    let seven = without(shape.ranks(), &[7]);
    assert!(matches!(m.poll(), Some(Action::Members { live }) if *live == seven));
    m.remove_ranks(&[6]).unwrap();
    let both = without(shape.ranks(), &[6, 7]);
    assert!(matches!(m.poll(), Some(Action::Members { live }) if *live == both));
    m.add_ranks(&[7]).unwrap();
    let six = without(shape.ranks(), &[6]);
    assert!(matches!(m.poll(), Some(Action::Members { live }) if *live == six));
    match m.poll() {
        Some(Action::Collective(eplb_runtime::rank::Collective::AllGather { send, .. })) => {
            assert_eq!(send[1], six.digest());
        }
        other => panic!("expected the members gather, got {other:?}"),
    }
}

#[test]
fn a_refused_membership_call_leaves_the_machine_as_before() {
    use eplb_runtime::rank::{Collective, Gather, MachineError, Reply, seal};
    let shape = common::small_shape();
    // Lock step: a pending removal, then a call whose combined effect is too few slots.
    let mut c = Cluster::new(PolicyKind::Default);
    c.run((H + A + 6) as usize);
    c.kill(7);
    for r in c.live_ranks() {
        c.machines[r].remove_ranks(&[7]).unwrap();
        // Combined with the removal under way, four ranks of three slots for 16 experts.
        let err = c.machines[r].remove_ranks(&[1, 2, 3]).unwrap_err();
        if [1, 2, 3].contains(&r) {
            assert!(matches!(err, MachineError::NotMember { .. }), "{err}");
        } else {
            assert!(
                matches!(err, MachineError::TooFewLiveSlots { live: 4, .. }),
                "{err}"
            );
        }
    }
    c.iterate();
    for r in c.live_ranks() {
        assert_eq!(
            *c.machines[r].live(),
            without(shape.ranks(), &[7]),
            "rank {r}"
        );
    }
    // One machine with its members words in flight: another set cannot join them.
    let p = common::default_layout(&shape);
    let mut m = RankMachine::new(0, eplb_core::Placement::new(shape, &p).unwrap(), cfg()).unwrap();
    m.remove_ranks(&[7]).unwrap();
    let _ = m.poll();
    let sent = match m.poll() {
        Some(Action::Collective(Collective::AllGather {
            of: Gather::Members,
            send,
        })) => send.to_vec(),
        other => panic!("expected the members gather, got {other:?}"),
    };
    let seen = |m: &RankMachine| {
        (
            m.stats(),
            *m.live(),
            *m.collective_ranks(),
            m.is_changing_membership(),
            m.health(),
            m.cycle_number(),
            m.placement().to_vec(),
        )
    };
    let before = seen(&m);
    let err = m.remove_ranks(&[6]).unwrap_err();
    assert_eq!(
        err,
        MachineError::MembershipInFlight {
            rank: 0,
            changes: 6,
            agreeing: 7,
            ranks: 8
        }
    );
    assert!(err.to_string().contains("changes rank 6"), "{err}");
    assert!(matches!(
        m.add_ranks(&[7]),
        Err(MachineError::MembershipInFlight { changes: 7, .. })
    ));
    assert!(matches!(
        m.handle_membership(LiveSet::all(8).unwrap()),
        Err(MachineError::MembershipInFlight { .. })
    ));
    // The set in flight again is the same call: nothing to change.
    m.handle_membership(without(shape.ranks(), &[7])).unwrap();
    assert_eq!(seen(&m), before);
    assert!(m.poll().is_none(), "still waiting for the gather");
    // The gather answers: the set in flight is adopted, as if nothing had been asked.
    let mut words = Vec::new();
    for _ in 0..7 {
        let w = [sent[0], sent[1], 0, sent[3]];
        words.extend_from_slice(&w);
        words.push(seal(w));
    }
    m.handle_collective(Some(Reply::Words(&words))).unwrap();
    assert_eq!(*m.live(), without(shape.ranks(), &[7]));
    assert_eq!(m.stats().membership_changes, 1);
    // Now the removal composes with the agreed set.
    m.remove_ranks(&[6]).unwrap();
    assert!(m.is_changing_membership());
}
