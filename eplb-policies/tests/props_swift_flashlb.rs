//! Properties of `swift` and `flashlb` on random shapes, placements and loads: a valid,
//! servable placement (every expert present, every slot filled, no expert twice on a rank),
//! PAR never below the lower bound, determinism (same input, seed and state give the same
//! output and the same state), and kept experts keeping their slot.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use eplb_core::metrics;
use eplb_core::{Layout, Placement, Shape};
use eplb_policies::flashlb::FlashLb;
use eplb_policies::swift::SwiftBalance;
use eplb_policies::{Input, Output, Policy, Samples, rebalance, scratch_len};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    shape: Shape,
    loads: Vec<f64>,
    /// Per-window loads `[T][L][N]` (T may be 0: no samples).
    windows: usize,
    window_loads: Vec<f64>,
    shuffle: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (1u16..=3, 1u16..=40, 1u16..=9)
        .prop_flat_map(|(l, n, r)| {
            let s_min = n.div_ceil(r).max(1);
            (Just((l, n, r)), s_min..=n.min(s_min + 3), 0usize..=4)
        })
        .prop_flat_map(|((l, n, r), s, t)| {
            let shape = Shape::new(l, n, r, s).unwrap();
            let load = prop_oneof![
                3 => (0u32..5).prop_map(f64::from),
                4 => 0.0f64..1000.0,
                1 => 1e4f64..1e6,
            ];
            (
                Just((shape, t)),
                prop::collection::vec(load.clone(), shape.loads_len()),
                prop::collection::vec(load, t * shape.loads_len()),
                any::<u64>(),
            )
        })
        .prop_map(|((shape, windows), loads, window_loads, shuffle)| Case {
            shape,
            loads,
            windows,
            window_loads,
            shuffle,
        })
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The default layout with seeded slot swaps that keep it servable.
fn current(c: &Case) -> Vec<u16> {
    let s = c.shape.slots_per_rank();
    let per_layer = c.shape.slots_per_layer();
    let mut p = vec![0u16; c.shape.placement_len()];
    Layout::default().fill(&c.shape, &mut p).unwrap();
    let mut x = c.shuffle;
    for layer in p.chunks_exact_mut(per_layer) {
        for _ in 0..4 * per_layer {
            let a = (splitmix(&mut x) % per_layer as u64) as usize;
            let b = (splitmix(&mut x) % per_layer as u64) as usize;
            let (ra, rb) = (a / s, b / s);
            let ok = ra == rb
                || (!layer[rb * s..rb * s + s].contains(&layer[a])
                    && !layer[ra * s..ra * s + s].contains(&layer[b]));
            if ok {
                layer.swap(a, b);
            }
        }
    }
    p
}

struct Run {
    out: Vec<u16>,
    par: Vec<f64>,
    state: Vec<u64>,
}

fn run<P: Policy>(policy: &mut P, c: &Case, cur: &[u16], state: Vec<u64>) -> Run {
    let shape = c.shape;
    let samples =
        (c.windows > 0).then(|| Samples::new(&shape, c.windows, &c.window_loads).unwrap());
    let input = Input::new(Placement::new(shape, cur).unwrap(), &c.loads, samples, 7).unwrap();
    let mut scratch = vec![0u64; scratch_len(policy, &shape)];
    let mut state = state;
    let l = shape.layers();
    let mut out = vec![0u16; shape.placement_len()];
    let (mut ch, mut pb, mut pa) = (vec![false; l], vec![0.0; l], vec![0.0; l]);
    let summary = rebalance(
        policy,
        &input,
        &mut scratch,
        &mut state,
        Output {
            placement: &mut out,
            changed: &mut ch,
            par_before: &mut pb,
            par_after: &mut pa,
        },
    )
    .unwrap();
    assert_eq!(summary.colocated_rows, 0);
    Run {
        out,
        par: pa,
        state,
    }
}

fn check(c: &Case, cur: &[u16], r: &Run) {
    let shape = c.shape;
    let p = Placement::new(shape, &r.out).unwrap();
    p.check_servable().unwrap();
    let n = shape.experts();
    let mut copies = vec![0u16; n];
    for (l, par) in r.par.iter().enumerate() {
        let lb =
            metrics::lower_bound_par(&shape, &c.loads[l * n..(l + 1) * n], &mut copies).unwrap();
        assert!(*par >= lb - 1e-9, "layer {l}: PAR {par} < lower bound {lb}");
    }
    let s = shape.slots_per_rank();
    for (old, new) in cur.chunks_exact(s).zip(r.out.chunks_exact(s)) {
        for (j, e) in new.iter().enumerate() {
            if let Some(k) = old.iter().position(|o| o == e) {
                assert_eq!(
                    k, j,
                    "expert {e} moved from slot {k} to {j} on its rank: {old:?} -> {new:?}"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn swift_properties(c in case()) {
        let cur = current(&c);
        let a = run(&mut SwiftBalance::new(), &c, &cur, vec![]);
        check(&c, &cur, &a);
        let b = run(&mut SwiftBalance::new(), &c, &cur, vec![]);
        prop_assert_eq!(&a.out, &b.out);
        let q = run(&mut SwiftBalance::upstream(), &c, &cur, vec![]);
        check(&c, &cur, &q);
    }

    #[test]
    fn flashlb_properties(c in case()) {
        let cur = current(&c);
        let fresh = vec![0u64; FlashLb::new().state_len(&c.shape)];
        let a = run(&mut FlashLb::new(), &c, &cur, fresh.clone());
        check(&c, &cur, &a);
        let b = run(&mut FlashLb::new(), &c, &cur, fresh);
        prop_assert_eq!(&a.out, &b.out);
        prop_assert_eq!(&a.state, &b.state);
        // A second call from the kept state (history, ring), twice: valid and deterministic.
        let a2 = run(&mut FlashLb::new(), &c, &a.out, a.state.clone());
        check(&c, &a.out, &a2);
        let b2 = run(&mut FlashLb::new(), &c, &a.out, a.state);
        prop_assert_eq!(&a2.out, &b2.out);
        prop_assert_eq!(&a2.state, &b2.state);
    }
}
