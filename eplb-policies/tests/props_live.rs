//! Properties of `rebalance` over a live set for every policy on random shapes, loads, placements and live
//! sets: the new placement is a valid placement of the live set, dead ranks hold only EMPTY, live ranks no
//! EMPTY, every expert has a copy on a live rank, no co-located copies except DeepSeek's,
//! `reloads` counts the copies of the lost experts, and the same input twice gives the same
//! output.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use eplb_core::live::{EMPTY, LiveSet, lost_experts, retire};
use eplb_core::{Layout, Placement, Shape};
use eplb_policies::{AnyPolicy, Error, Input, Output, PolicyKind, Summary, buffer_lens, rebalance};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    shape: Shape,
    loads: Vec<f64>,
    /// Seed of the swaps applied to the default layout to make the current placement.
    shuffle: u64,
    /// `[R]`: live ranks (at least enough for `N`).
    live: Vec<bool>,
    /// `[R]`: live ranks whose row starts all EMPTY (joined).
    joined: Vec<bool>,
    seed: u64,
}

fn divisors(n: u16) -> Vec<u16> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

fn case() -> impl Strategy<Value = Case> {
    (1u16..=2, 1u16..=24, 2u16..=8)
        .prop_flat_map(|(l, n, r)| {
            let s_min = n.div_ceil(r).max(1);
            (Just((l, n, r)), s_min..=n.min(s_min + 3))
        })
        .prop_flat_map(|((l, n, r), s)| {
            (
                Just((l, n, r, s)),
                prop::sample::select(divisors(r)),
                1u16..=n.min(4),
            )
        })
        .prop_flat_map(|((l, n, r, s), rpn, g)| {
            let shape = Shape::with_topology(l, n, r, s, rpn, g).unwrap();
            let load = prop_oneof![
                3 => (0u32..4).prop_map(f64::from),
                3 => 0.0f64..100.0,
                1 => 1e3f64..1e5,
            ];
            let min_live = usize::from(n.div_ceil(s));
            (
                Just(shape),
                prop::collection::vec(load, shape.loads_len()),
                any::<u64>(),
                prop::sample::subsequence(
                    (0..usize::from(r)).collect::<Vec<_>>(),
                    min_live..=usize::from(r),
                ),
                prop::collection::vec(prop::bool::weighted(0.15), usize::from(r)),
                any::<u64>(),
            )
        })
        .prop_map(|(shape, loads, shuffle, live_ranks, joined, seed)| {
            let mut live = vec![false; shape.ranks()];
            for r in live_ranks {
                live[r] = true;
            }
            Case {
                shape,
                loads,
                shuffle,
                live,
                joined,
                seed,
            }
        })
}

/// The default layout, shuffled by swaps between ranks (which keep it servable).
fn current_of(c: &Case) -> Vec<u16> {
    let shape = c.shape;
    let mut cur = vec![0u16; shape.placement_len()];
    Layout::Default.fill(&shape, &mut cur).unwrap();
    let mut x = c.shuffle | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (s, per) = (shape.slots_per_rank(), shape.slots_per_layer());
    for layer in cur.chunks_exact_mut(per) {
        for _ in 0..per {
            let a = (next() % per as u64) as usize;
            let b = (next() % per as u64) as usize;
            let (ra, rb) = (a / s, b / s);
            let row = |r: usize, l: &[u16]| l[r * s..(r + 1) * s].to_vec();
            if ra != rb
                && !row(ra, layer).contains(&layer[b])
                && !row(rb, layer).contains(&layer[a])
            {
                layer.swap(a, b);
            }
        }
    }
    cur
}

/// `None` when the full shape is outside the policy's limits (DeepSeek hierarchical with
/// `N % groups != 0`).
fn run(kind: PolicyKind, input: &Input<'_>) -> Option<(Vec<u16>, Vec<bool>, Summary)> {
    let shape = *input.shape();
    let mut p = AnyPolicy::new(kind);
    let lens = buffer_lens(&p, &shape).ok()?;
    let (mut scratch, mut state) = (vec![0u64; lens.scratch], vec![0u64; lens.state]);
    let l = shape.layers();
    let mut out = vec![0u16; shape.placement_len()];
    let (mut ch, mut pb, mut pa) = (vec![false; l], vec![0.0; l], vec![0.0; l]);
    let summary = rebalance(
        &mut p,
        input,
        &mut scratch,
        &mut state,
        Output {
            placement: &mut out,
            changed: &mut ch,
            par_before: &mut pb,
            par_after: &mut pa,
        },
    )
    .unwrap_or_else(|e| panic!("{kind} on {shape:?}: {e}"));
    for (b, a) in pb.iter().zip(&pa) {
        assert!(b.is_finite() && a.is_finite() && *a >= 1.0 - 1e-9);
    }
    Some((out, ch, summary))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_policy_plans_over_any_live_set(c in case()) {
        let shape = c.shape;
        let live = LiveSet::from_flags(&c.live).unwrap();
        let mut current = current_of(&c);
        retire(&shape, &live, &mut current).unwrap();
        let (s, per) = (shape.slots_per_rank(), shape.slots_per_layer());
        for layer in current.chunks_exact_mut(per) {
            for (r, row) in layer.chunks_exact_mut(s).enumerate() {
                if c.joined[r] {
                    row.fill(EMPTY);
                }
            }
        }
        let input = eplb_core::Placement::with_live(shape, &current, &live).map_err(Error::from).and_then(|p| Input::new(p, &c.loads, None, c.seed)).unwrap();
        for kind in PolicyKind::ALL {
            let Some((out, changed, summary)) = run(kind, &input) else {
                prop_assert_eq!(kind, PolicyKind::DeepSeek);
                continue;
            };
            Placement::with_live(shape, &out, &live).unwrap();
            let mut reloads = 0;
            for (l, (old, new)) in current.chunks_exact(per).zip(out.chunks_exact(per)).enumerate() {
                let mut lost = vec![false; shape.experts()];
                lost_experts(&shape, old, &live, &mut lost).unwrap();
                let mut none = vec![false; shape.experts()];
                prop_assert_eq!(lost_experts(&shape, new, &live, &mut none).unwrap(), 0, "{} layer {}", kind, l);
                prop_assert_eq!(changed[l], old != new);
                for (r, row) in new.chunks_exact(s).enumerate() {
                    if live.contains(r) {
                        prop_assert!(!row.contains(&EMPTY), "{} rank {} keeps EMPTY", kind, r);
                        if kind != PolicyKind::DeepSeek {
                            prop_assert_eq!(eplb_core::placement::first_duplicate(row), None, "{}", kind);
                        }
                    } else {
                        prop_assert!(row.iter().all(|&e| e == EMPTY));
                    }
                    for (j, &e) in row.iter().enumerate() {
                        if e != EMPTY && lost[usize::from(e)] && !row[..j].contains(&e) {
                            reloads += 1;
                        }
                    }
                }
            }
            prop_assert_eq!(summary.reloads, reloads, "{}", kind);
            prop_assert_eq!(summary.moves, eplb_core::metrics::moves(&current, &out, s));
            // Deterministic.
            let again = run(kind, &input).unwrap();
            prop_assert_eq!(&again.0, &out, "{} not deterministic", kind);
            prop_assert_eq!(again.2, summary);
        }
    }
}
