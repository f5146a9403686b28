//! `rebalance` over a live set allocates nothing, for every policy, on the DeepSeek-V3 EP32 shape with two
//! dead ranks and a joined one (one test per crate: the counting allocator is process-wide).

#[allow(dead_code)] // only the counting allocator is used here
mod common;

use eplb_core::live::{EMPTY, LiveSet, retire};
use eplb_core::{Layout, Shape};
use eplb_policies::{AnyPolicy, Error, Input, Output, PolicyKind, buffer_lens, rebalance};

#[test]
fn rebalance_over_a_live_set_does_not_allocate() {
    let shape = Shape::with_topology(58, 256, 32, 9, 8, 8).unwrap();
    let mut current = vec![0u16; shape.placement_len()];
    Layout::Default.fill(&shape, &mut current).unwrap();
    let mut live = LiveSet::all(32).unwrap();
    live.remove(3).unwrap();
    live.remove(17).unwrap();
    retire(&shape, &live, &mut current).unwrap();
    // Rank 20 joined: its row is EMPTY.
    for layer in current.chunks_exact_mut(shape.slots_per_layer()) {
        layer[20 * 9..21 * 9].fill(EMPTY);
    }
    let loads: Vec<f64> = (0..shape.loads_len())
        .map(|i| ((i * 7919) % 1009) as f64 + 0.5)
        .collect();
    let input = eplb_core::Placement::with_live(shape, &current, &live)
        .map_err(Error::from)
        .and_then(|p| Input::new(p, &loads, None, 42))
        .unwrap();
    let l = shape.layers();
    for kind in PolicyKind::ALL {
        let mut policy = AnyPolicy::new(kind);
        let lens = buffer_lens(&policy, &shape).unwrap();
        let (mut scratch, mut state) = (vec![0u64; lens.scratch], vec![0u64; lens.state]);
        let mut out = vec![0u16; shape.placement_len()];
        let (mut ch, mut pb, mut pa) = (vec![false; l], vec![0.0; l], vec![0.0; l]);
        for _ in 0..2 {
            let (n, summary) = common::allocations(|| {
                rebalance(
                    &mut policy,
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
            });
            let summary = summary.unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert!(summary.reloads > 0, "{kind}: nothing reloaded");
            assert_eq!(n, 0, "{kind}: rebalance over a live set allocated");
        }
    }
}
