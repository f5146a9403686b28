//! One transport suite, two backends: the in-process host transport, and (feature `ascend`) the
//! HCCL transport over the fake CANN, loaded through the production loader. Ranks are threads;
//! layers of DeepSeek-V3 shape (256 experts, 32 ranks x 9 slots, or 8 ranks x 36 slots) are
//! rebalanced several times, and every slot of every rank is checked byte for byte after every
//! commit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use eplb_core::Shape;
use eplb_runtime::transfer::plan_layer;
use eplb_runtime::transport::Transport;
use eplb_runtime::transport::host::{HostTransport, HostWorld, canonical_expert_bytes};

/// A transport whose live slots a test can read.
trait Endpoint: Transport + 'static {
    fn read_slot(&self, layer: usize, slot: usize) -> Vec<u8>;
}

impl Endpoint for HostTransport {
    fn read_slot(&self, layer: usize, slot: usize) -> Vec<u8> {
        self.slot(layer, slot).unwrap().to_vec()
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    layers: u16,
    experts: u16,
    ranks: u16,
    slots: u16,
    /// Not a multiple of 64, so slot padding is exercised.
    bytes: usize,
    steps: usize,
}

const DSV3_EP32: Case = Case {
    layers: 1,
    experts: 256,
    ranks: 32,
    slots: 9,
    bytes: 40,
    steps: 5,
};

const DSV3_EP8: Case = Case {
    layers: 2,
    experts: 256,
    ranks: 8,
    slots: 36,
    bytes: 72,
    steps: 4,
};

impl Case {
    fn shape(&self) -> Shape {
        Shape::new(self.layers, self.experts, self.ranks, self.slots).unwrap()
    }

    fn initial(&self) -> Vec<u16> {
        common::default_layout(&self.shape())
    }

    /// `[L][S]` rows of `rank` in `placement`.
    fn rows(&self, placement: &[u16], rank: usize) -> Vec<Vec<u16>> {
        common::rank_rows(&self.shape(), placement, rank)
    }

    /// A sequence of valid placements: each step swaps experts between ranks, re-points
    /// redundant copies and moves experts between slots of one rank.
    fn placements(&self) -> Vec<Vec<u16>> {
        let (r, s) = (usize::from(self.ranks), usize::from(self.slots));
        let per = r * s;
        let mut x: u64 = 0x5DEE_CE66_D1CE_F00D;
        let mut rnd = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let mut cur = self.initial();
        let mut out = vec![cur.clone()];
        for _ in 0..self.steps {
            for layer in cur.chunks_exact_mut(per) {
                for _ in 0..per / 2 {
                    let (a, b) = (rnd(per), rnd(per));
                    let (ra, rb) = (a / s, b / s);
                    let (ea, eb) = (layer[a], layer[b]);
                    match rnd(3) {
                        // Swap across ranks when neither rank then holds a copy twice.
                        0 if ra != rb
                            && !layer[rb * s..(rb + 1) * s].contains(&ea)
                            && !layer[ra * s..(ra + 1) * s].contains(&eb) =>
                        {
                            layer.swap(a, b);
                        }
                        // Re-point a redundant copy to an expert rank `ra` lacks.
                        1 if layer.iter().filter(|&&e| e == ea).count() > 1
                            && !layer[ra * s..(ra + 1) * s].contains(&eb) =>
                        {
                            layer[a] = eb;
                        }
                        // Local move inside rank `ra`.
                        2 => {
                            let c = ra * s + rnd(s);
                            layer.swap(a, c);
                        }
                        _ => {}
                    }
                }
            }
            eplb_core::Placement::new(self.shape(), &cur).unwrap();
            out.push(cur.clone());
        }
        out
    }
}

fn check_rank<T: Endpoint>(case: &Case, t: &T, placement: &[u16], layer: usize, when: &str) {
    let rows = case.rows(placement, t.rank());
    for (slot, &e) in rows[layer].iter().enumerate() {
        assert_eq!(
            t.read_slot(layer, slot),
            canonical_expert_bytes(layer, e, case.bytes),
            "{when}: rank {} layer {layer} slot {slot} does not hold expert {e}",
            t.rank()
        );
    }
}

/// Drives every rank through every step, layer by layer, checking bytes after every commit and
/// the collectives along the way. Returns each rank's number of commits.
fn run_suite<T: Endpoint>(case: Case, endpoints: Vec<T>) -> Vec<usize> {
    let placements = Arc::new(case.placements());
    let shape = case.shape();
    let per = shape.slots_per_layer();
    let threads: Vec<_> = endpoints
        .into_iter()
        .map(|mut t| {
            let placements = Arc::clone(&placements);
            std::thread::spawn(move || {
                let rank = t.rank();
                let ranks = t.ranks();
                let mut commits = 0;
                for l in 0..shape.layers() {
                    check_rank(&case, &t, &placements[0], l, "initial");
                }
                for (step, pair) in placements.windows(2).enumerate() {
                    // A collective per step: everyone's (rank, step).
                    let mut all = vec![0u64; 2 * ranks];
                    t.all_gather(&[rank as u64, step as u64], &mut all).unwrap();
                    for (r, c) in all.chunks_exact(2).enumerate() {
                        assert_eq!(c, [r as u64, step as u64]);
                    }
                    for l in 0..shape.layers() {
                        let (old, new) = (
                            &pair[0][l * per..(l + 1) * per],
                            &pair[1][l * per..(l + 1) * per],
                        );
                        let mut lp = plan_layer(&shape, l, old, new).unwrap();
                        let plan = lp.ranks.swap_remove(rank);
                        let ok = t.launch(&plan).and_then(|()| t.wait(&plan));
                        if let Err(e) = &ok {
                            panic!("rank {rank} step {step} layer {l}: {e}");
                        }
                        assert!(t.all_agree(ok.is_ok()).unwrap());
                        t.commit(&plan).unwrap();
                        commits += 1;
                        check_rank(&case, &t, &pair[1], l, &format!("step {step}"));
                    }
                }
                assert!(t.all_agree(true).unwrap());
                assert!(!t.all_agree(rank != 0).unwrap(), "one false vote must win");
                commits
            })
        })
        .collect();
    threads.into_iter().map(|h| h.join().unwrap()).collect()
}

fn host_endpoints(case: &Case) -> Vec<HostTransport> {
    let world = HostWorld::new(usize::from(case.ranks), Duration::from_secs(10));
    let initial = case.initial();
    (0..usize::from(case.ranks))
        .map(|r| HostTransport::new(Arc::clone(&world), r, &case.rows(&initial, r), case.bytes))
        .collect()
}

#[test]
fn host_transport_dsv3_ep32() {
    let commits = run_suite(DSV3_EP32, host_endpoints(&DSV3_EP32));
    assert!(commits.iter().all(|&c| c == DSV3_EP32.steps));
}

#[test]
fn host_transport_dsv3_ep8() {
    let commits = run_suite(DSV3_EP8, host_endpoints(&DSV3_EP8));
    assert!(commits.iter().all(|&c| c == 2 * DSV3_EP8.steps));
}

#[test]
fn placements_really_move_experts() {
    for case in [DSV3_EP32, DSV3_EP8] {
        let p = case.placements();
        let shape = case.shape();
        let per = shape.slots_per_layer();
        for pair in p.windows(2) {
            let plan = plan_layer(&shape, 0, &pair[0][..per], &pair[1][..per]).unwrap();
            assert!(
                plan.transfers.len() > 10,
                "{case:?}: {} transfers",
                plan.transfers.len()
            );
            assert!(
                plan.ranks.iter().any(|r| r
                    .install
                    .iter()
                    .any(|s| matches!(s, eplb_runtime::transfer::SlotSource::Local { .. }))),
                "{case:?}: no local move"
            );
        }
    }
}

#[cfg(feature = "ascend")]
mod hccl {
    use super::*;
    use eplb_ascend_sys::fake::{self, FakeCann};
    use eplb_ascend_sys::{Cann, Runtime};
    use eplb_runtime::transport::hccl::{HcclTransport, SlotLayout, local_world};

    impl Endpoint for HcclTransport {
        fn read_slot(&self, layer: usize, slot: usize) -> Vec<u8> {
            self.slot(layer, slot).unwrap()
        }
    }

    pub(super) fn runtime() -> (Runtime, FakeCann) {
        let dir = fake::dir().expect("the fake CANN is built for tests");
        let rt = Runtime::init(Cann::load_dir(dir).unwrap()).unwrap();
        let ctl = FakeCann::open(dir).unwrap();
        ctl.set_timeout(Duration::from_millis(2000));
        (rt, ctl)
    }

    pub(super) fn hccl_endpoints(case: &Case, device_base: i32) -> Vec<HcclTransport> {
        let (rt, _ctl) = runtime();
        endpoints_on(&rt, case, device_base)
    }

    fn endpoints_on(rt: &Runtime, case: &Case, device_base: i32) -> Vec<HcclTransport> {
        let layout = SlotLayout {
            layers: usize::from(case.layers),
            slots_per_rank: usize::from(case.slots),
            expert_bytes: case.bytes,
        };
        let mut ts = local_world(
            rt,
            usize::from(case.ranks),
            layout,
            device_base,
            Duration::from_secs(10),
        )
        .unwrap();
        let initial = case.initial();
        for t in &mut ts {
            for (l, row) in case.rows(&initial, t.rank()).iter().enumerate() {
                for (slot, &e) in row.iter().enumerate() {
                    t.load_slot(l, slot, &canonical_expert_bytes(l, e, case.bytes))
                        .unwrap();
                }
            }
        }
        ts
    }

    #[test]
    fn hccl_transport_dsv3_ep32() {
        let commits = run_suite(DSV3_EP32, hccl_endpoints(&DSV3_EP32, 0));
        assert!(commits.iter().all(|&c| c == DSV3_EP32.steps));
    }

    #[test]
    fn hccl_transport_dsv3_ep8() {
        let commits = run_suite(DSV3_EP8, hccl_endpoints(&DSV3_EP8, 100));
        assert!(commits.iter().all(|&c| c == 2 * DSV3_EP8.steps));
    }

    /// Opt-in: the same suite on a real CANN install and real NPUs. Set `EPLB_ASCEND_REAL` to
    /// the number of ranks (one NPU each, devices `EPLB_ASCEND_DEVICE_BASE..`, default 0);
    /// CANN is found as in production (`ASCEND_HOME_PATH`, ...). Without it this test only
    /// says so.
    #[test]
    fn real_cann_when_enabled() {
        let Some(ranks) = std::env::var("EPLB_ASCEND_REAL")
            .ok()
            .and_then(|v| v.parse::<u16>().ok())
        else {
            eprintln!("real-CANN suite not run: set EPLB_ASCEND_REAL=<ranks> on an Ascend host");
            return;
        };
        let base = std::env::var("EPLB_ASCEND_DEVICE_BASE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let cann = Cann::load_standard().unwrap_or_else(|e| panic!("{e}"));
        let rt = Runtime::init(cann).unwrap();
        let case = Case {
            layers: 2,
            experts: 16 * ranks,
            ranks,
            slots: 18,
            bytes: 1 << 20,
            steps: 3,
        };
        let commits = run_suite(case, endpoints_on(&rt, &case, base));
        assert!(commits.iter().all(|&c| c == 2 * case.steps));
    }
}
