//! Elastic membership on both transports: 4 ranks as threads; rank 2 stops calling, the other
//! three `set_live` and their collectives complete among them; a layer whose rank-2 row is EMPTY
//! moves to a placement that loads the experts only rank 2 held; a failed load is voted down and
//! aborted with the slots as they were; rank 2 comes back (`set_live` to all four on every rank),
//! gathers with the others and receives a new row from its peers. Every slot is checked byte for
//! byte. The HCCL half runs over the fake CANN (feature `ascend`, as `cargo xtask test` does).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use eplb_core::{EMPTY, LiveSet, Shape};
use eplb_runtime::transfer::{RankPlan, SlotSource, plan_layer};
use eplb_runtime::transport::host::{HostTransport, HostWorld, canonical_expert_bytes};
use eplb_runtime::transport::{Op, Transport, TransportError};

const R: usize = 4;
const S: usize = 3;
const L: usize = 2;
const N: u16 = 8;
/// Not a multiple of 64, so the HCCL slot padding is exercised.
const BYTES: usize = 40;
const GONE: usize = 2;
/// Every blocking call's limit; a collective that completes returned before it.
const TIMEOUT: Duration = Duration::from_secs(5);
const E: u16 = EMPTY;

fn shape() -> Shape {
    Shape::new(L as u16, N, R as u16, S as u16).unwrap()
}

/// `[R][S]` rows, the same in every layer.
fn placement(rows: [[u16; S]; R]) -> Vec<u16> {
    let layer: Vec<u16> = rows.iter().flatten().copied().collect();
    layer.repeat(L)
}

/// All four ranks; experts 6 and 7 live only on rank 2.
fn initial() -> Vec<u16> {
    placement([[0, 1, 2], [3, 4, 5], [6, 7, 0], [1, 2, 3]])
}

/// Rank 2 gone (its rows EMPTY, routing-only).
fn retired() -> Vec<u16> {
    placement([[0, 1, 2], [3, 4, 5], [E, E, E], [1, 2, 3]])
}

/// The survivors' new placement: 6 and 7 are loaded (6 on ranks 0 and 3, 7 on rank 1); rank 0
/// receives 5 from rank 1.
fn survivors() -> Vec<u16> {
    placement([[0, 6, 5], [3, 4, 7], [E, E, E], [1, 2, 6]])
}

/// Rank 2 back, receiving 7, 4 and 0 from its peers.
fn rejoined() -> Vec<u16> {
    placement([[0, 6, 5], [3, 4, 7], [7, 4, 0], [1, 2, 6]])
}

fn layer_of(p: &[u16], l: usize) -> &[u16] {
    let per = shape().slots_per_layer();
    &p[l * per..(l + 1) * per]
}

fn row_of(p: &[u16], l: usize, rank: usize) -> &[u16] {
    &layer_of(p, l)[rank * S..(rank + 1) * S]
}

fn live(ranks: &[usize]) -> LiveSet {
    let mut s = LiveSet::none(R).unwrap();
    for &r in ranks {
        s.insert(r).unwrap();
    }
    s
}

/// A transport whose live slots a test can read.
trait Endpoint: Transport + 'static {
    fn read_slot(&self, layer: usize, slot: usize) -> Vec<u8>;
}

impl Endpoint for HostTransport {
    fn read_slot(&self, layer: usize, slot: usize) -> Vec<u8> {
        self.slot(layer, slot).unwrap().to_vec()
    }
}

/// Makes the loads of (layer, rank) fail (`true`) or succeed again (`false`).
type LoadFault = Arc<dyn Fn(usize, usize, bool) + Send + Sync>;

/// Every slot of `rank`'s row in `p` (EMPTY ones skipped) holds its expert's canonical bytes.
fn check<T: Endpoint>(t: &T, p: &[u16], l: usize, when: &str) {
    for (slot, &e) in row_of(p, l, t.rank()).iter().enumerate() {
        if e == EMPTY {
            continue;
        }
        assert_eq!(
            t.read_slot(l, slot),
            canonical_expert_bytes(l, e, BYTES),
            "{when}: rank {} layer {l} slot {slot} does not hold expert {e}",
            t.rank()
        );
    }
}

fn plan(old: &[u16], new: &[u16], l: usize, rank: usize) -> RankPlan {
    let mut lp = plan_layer(&shape(), l, layer_of(old, l), layer_of(new, l)).unwrap();
    lp.ranks.swap_remove(rank)
}

/// One layer's exchange among the live ranks: load, launch, wait, a vote, then commit or abort.
/// Returns this rank's own error (load or exchange) and the vote.
fn exchange<T: Endpoint>(t: &mut T, p: &RankPlan) -> (Option<TransportError>, bool) {
    let loaded = t.load(p);
    // Launch even after a failed load: the peers' receives from this rank must complete.
    let moved = t.launch(p).and_then(|()| t.wait(p));
    let mine = loaded.err().or(moved.err());
    let all = t.all_agree(mine.is_none()).unwrap();
    if all {
        t.commit(p).unwrap();
    } else {
        t.abort(p);
    }
    (mine, all)
}

/// The whole script on one rank.
fn script<T: Endpoint>(mut t: T, back: &Barrier, fault: &LoadFault) {
    let me = t.rank();
    assert_eq!(t.ranks(), R);
    for l in 0..L {
        check(&t, &initial(), l, "initial");
    }
    // 1. Everyone.
    let mut out = vec![0u64; 2 * R];
    t.all_gather(&[me as u64, 100], &mut out).unwrap();
    assert_eq!(out, [0, 100, 1, 100, 2, 100, 3, 100]);
    assert!(t.all_agree(true).unwrap());
    if me == GONE {
        // 2. Rank 2 stops calling until the survivors are done.
        back.wait();
        // A rank outside the live set cannot adopt it.
        let err = t.set_live(&live(&[0, 1, 3])).unwrap_err();
        assert!(matches!(err, TransportError::Invalid { .. }), "{err}");
    } else {
        // 3. The survivors agree among themselves, without waiting for rank 2.
        let s = live(&[0, 1, 3]);
        t.set_live(&s).unwrap();
        assert_eq!(t.live(), Some(s));
        assert_eq!(t.ranks(), R);
        let started = Instant::now();
        let mut out = vec![0u64; 2 * 3];
        t.all_gather(&[me as u64, 200], &mut out).unwrap();
        assert_eq!(
            out,
            [0, 200, 1, 200, 3, 200],
            "rank-major over the live ranks"
        );
        assert!(t.all_agree(true).unwrap());
        assert!(!t.all_agree(me != 1).unwrap(), "one false vote must win");
        let mut wrong = vec![0u64; 2 * R];
        let err = t.all_gather(&[0, 0], &mut wrong).unwrap_err();
        assert!(matches!(err, TransportError::Invalid { .. }), "{err}");
        assert!(
            started.elapsed() < TIMEOUT,
            "a collective waited for rank 2"
        );

        // 4. Layer 0: experts 6 and 7 are loaded, 5 moves from rank 1 to rank 0.
        let p0 = plan(&retired(), &survivors(), 0, me);
        assert!(p0.sends.iter().all(|o| usize::from(o.peer) != GONE));
        assert!(p0.recvs.iter().all(|o| usize::from(o.peer) != GONE));
        let lost: Vec<u16> = p0.loads.iter().map(|ld| ld.expert).collect();
        assert_eq!(
            lost,
            match me {
                0 | 3 => vec![6],
                _ => vec![7],
            }
        );
        let (mine, all) = exchange(&mut t, &p0);
        assert!(mine.is_none() && all, "rank {me}: {mine:?}");
        check(&t, &survivors(), 0, "layer 0 after the loads");

        // 5. Layer 1: rank 3's load fails; every survivor aborts and keeps the layer.
        let p1 = plan(&retired(), &survivors(), 1, me);
        if me == 3 {
            fault(1, 3, true);
        }
        t.all_agree(true).unwrap(); // the fault is armed before anyone loads
        let (mine, all) = exchange(&mut t, &p1);
        assert!(!all, "a failed load must fail the vote");
        if me == 3 {
            fault(1, 3, false);
            let err = mine.expect("rank 3's load fails");
            assert!(matches!(err, TransportError::Failed { .. }), "{err}");
            let at = err.site();
            assert_eq!(
                (at.op, at.rank, at.layer, at.expert),
                (Op::Load, 3, Some(1), Some(6))
            );
            assert!(err.to_string().contains("layer 1 load"), "{err}");
        } else {
            assert!(mine.is_none(), "rank {me}: {mine:?}");
        }
        check(&t, &initial(), 1, "layer 1 after the aborted load");
        // A commit of a loaded slot without a load installs nothing.
        if p1
            .install
            .iter()
            .any(|s| matches!(s, SlotSource::Loaded { .. }))
        {
            assert!(t.commit(&p1).is_err());
            check(&t, &initial(), 1, "layer 1 after a refused commit");
        }
        // The retry succeeds.
        let (mine, all) = exchange(&mut t, &p1);
        assert!(mine.is_none() && all, "rank {me}: {mine:?}");
        check(&t, &survivors(), 1, "layer 1 after the retry");
        back.wait();
    }

    // 6. Rank 2 rejoins: every rank sets all four live, the joiner included.
    let all = LiveSet::all(R).unwrap();
    t.set_live(&all).unwrap();
    assert_eq!(t.live(), Some(all));
    let mut out = vec![0u64; 2 * R];
    t.all_gather(&[me as u64, 300], &mut out).unwrap();
    assert_eq!(out, [0, 300, 1, 300, 2, 300, 3, 300]);
    assert!(t.all_agree(true).unwrap());
    // Its EMPTY row fills from its peers.
    let p = plan(&survivors(), &rejoined(), 0, me);
    if me == GONE {
        assert_eq!(p.recvs.len(), S);
        assert!(p.loads.is_empty());
    }
    let (mine, all) = exchange(&mut t, &p);
    assert!(mine.is_none() && all, "rank {me}: {mine:?}");
    check(&t, &rejoined(), 0, "layer 0 after the rejoin");
    check(&t, &survivors(), 1, "layer 1 after the rejoin");
}

fn run<T: Endpoint>(endpoints: Vec<T>, fault: LoadFault) {
    let back = Arc::new(Barrier::new(R));
    let threads: Vec<_> = endpoints
        .into_iter()
        .map(|t| {
            let (back, fault) = (Arc::clone(&back), Arc::clone(&fault));
            std::thread::spawn(move || script(t, &back, &fault))
        })
        .collect();
    for h in threads {
        h.join().unwrap();
    }
}

#[test]
fn host_transport_rank_leaves_loses_experts_and_rejoins() {
    let world = HostWorld::new(R, TIMEOUT);
    let p = initial();
    let eps = (0..R)
        .map(|r| {
            let rows = (0..L)
                .map(|l| row_of(&p, l, r).to_vec())
                .collect::<Vec<_>>();
            HostTransport::new(Arc::clone(&world), r, &rows, BYTES)
        })
        .collect();
    let w = Arc::clone(&world);
    run(
        eps,
        Arc::new(move |l, r, on| {
            if on {
                w.fail_loads(l, r);
            } else {
                w.clear_faults();
            }
        }),
    );
}

#[test]
fn host_survivors_time_out_on_the_gone_rank_then_shrink() {
    // Rank 2 is gone from the start: the survivors' first gather over all four times out (and
    // closes that round); after `set_live` they meet at once, and a survivor that then times out
    // alone (rank 3 skips one collective) realigns with its peers at the floor of the generation.
    let world = HostWorld::new(R, Duration::from_millis(1000));
    let rows = vec![vec![0u16, 1, 2]; L];
    let threads: Vec<_> = [0usize, 1, 3]
        .into_iter()
        .map(|r| {
            let mut t = HostTransport::new(Arc::clone(&world), r, &rows, BYTES);
            std::thread::spawn(move || {
                let mut out = vec![0u64; R];
                let err = t.all_gather(&[r as u64], &mut out).unwrap_err();
                assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
                t.set_live(&live(&[0, 1, 3])).unwrap();
                let mut out = vec![0u64; 3];
                t.all_gather(&[r as u64], &mut out).unwrap();
                assert_eq!(out, [0, 1, 3]);
                if r == 3 {
                    // Skips one collective its peers enter: they time out (after 1 s), it does
                    // not; it comes back while they wait in the next round (until 2 s).
                    std::thread::sleep(Duration::from_millis(1400));
                } else {
                    assert!(t.all_agree(true).is_err());
                }
                // Everyone meets again at the floor.
                t.all_gather(&[10 + r as u64], &mut out).unwrap();
                assert_eq!(out, [10, 11, 13]);
            })
        })
        .collect();
    for h in threads {
        h.join().unwrap();
    }
}

#[test]
fn host_transport_refuses_bad_live_sets_sends_to_gone_ranks_and_unloaded_commits() {
    let world = HostWorld::new(R, TIMEOUT);
    let rows = vec![vec![0u16, 1, 2]; L];
    let mut t = HostTransport::new(world, 1, &rows, BYTES);
    assert_eq!(t.live(), Some(LiveSet::all(R).unwrap()));
    for bad in [live(&[0, 2]), LiveSet::all(R + 1).unwrap()] {
        let err = t.set_live(&bad).unwrap_err();
        assert!(matches!(err, TransportError::Invalid { .. }), "{err}");
        assert_eq!(err.site().op, Op::SetLive);
    }
    // A send to a rank outside the live set is refused before anything moves.
    t.set_live(&live(&[0, 1])).unwrap();
    let shape = Shape::new(1, 4, 2, 2).unwrap();
    let mut lp = plan_layer(&shape, 0, &[0, 1, 2, 3], &[0, 1, 2, 3]).unwrap();
    let mut p = lp.ranks.swap_remove(1);
    p.sends.push(eplb_runtime::transfer::SendOp {
        peer: 3,
        expert: 2,
        slot: 0,
    });
    assert!(t.launch(&p).is_err());
    // A plan that loads expert 3 (no rank holds it) cannot commit before its load.
    let shape = Shape::new(1, 4, 2, 3).unwrap();
    let mut lp = plan_layer(&shape, 0, &[E, E, E, 0, 1, 2], &[E, E, E, 0, 3, 2]).unwrap();
    let p = lp.ranks.swap_remove(1);
    assert_eq!(p.install[1], SlotSource::Loaded { buffer: 0 });
    let err = t.commit(&p).unwrap_err();
    assert!(err.to_string().contains("not loaded"), "{err}");
    assert_eq!(t.read_slot(0, 1), canonical_expert_bytes(0, 1, BYTES));
    t.load(&p).unwrap();
    t.commit(&p).unwrap();
    assert_eq!(t.read_slot(0, 1), canonical_expert_bytes(0, 3, BYTES));
}

#[cfg(feature = "ascend")]
mod hccl {
    use super::*;
    use eplb_ascend_sys::fake::{self, FakeCann};
    use eplb_ascend_sys::{Cann, Runtime};
    use eplb_runtime::transport::hccl::{HcclTransport, SlotLayout, local_world};
    use std::sync::Mutex;

    impl Endpoint for HcclTransport {
        fn read_slot(&self, layer: usize, slot: usize) -> Vec<u8> {
            self.slot(layer, slot).unwrap()
        }
    }

    #[test]
    fn hccl_transport_rank_leaves_loses_experts_and_rejoins() {
        let dir = fake::dir().expect("the fake CANN is built for tests");
        let rt = Runtime::init(Cann::load_dir(dir).unwrap()).unwrap();
        let ctl = FakeCann::open(dir).unwrap();
        ctl.set_timeout(Duration::from_millis(2000));
        let layout = SlotLayout {
            layers: L,
            slots_per_rank: S,
            expert_bytes: BYTES,
        };
        let mut eps = local_world(&rt, R, layout, 0, TIMEOUT).unwrap();
        // The host backup: every expert's canonical bytes, except where a test fault says no.
        let failing: Arc<Mutex<Option<(usize, usize)>>> = Arc::default();
        let p = initial();
        for t in &mut eps {
            let r = t.rank();
            for l in 0..L {
                for (slot, &e) in row_of(&p, l, r).iter().enumerate() {
                    t.load_slot(l, slot, &canonical_expert_bytes(l, e, BYTES))
                        .unwrap();
                }
            }
            let failing = Arc::clone(&failing);
            t.set_backup(Box::new(move |l, e, out| {
                if *failing.lock().unwrap() == Some((l, r)) {
                    return false;
                }
                out.copy_from_slice(&canonical_expert_bytes(l, e, out.len()));
                true
            }));
        }
        run(
            eps,
            Arc::new(move |l, r, on| {
                *failing.lock().unwrap() = on.then_some((l, r));
            }),
        );
    }
}
