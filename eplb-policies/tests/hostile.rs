//! Issue 17 at the checked entry: sizes are checked before memory is taken (class 3), any
//! structurally valid current placement is accepted (class 4), no heat means no change (10).

use eplb_core::{Layout, Placement, Shape};
use eplb_policies::{
    AnyPolicy, Error, Input, MAX_BUFFER_BYTES, MAX_RANKS, MAX_SLOTS_PER_LAYER, Output, Policy,
    PolicyKind, buffer_lens, rebalance, scratch_len,
};

fn run(
    kind: PolicyKind,
    shape: Shape,
    current: &[u16],
    loads: &[f64],
) -> Result<(Vec<u16>, usize), Error> {
    let mut p = AnyPolicy::new(kind);
    let lens = buffer_lens(&p, &shape)?;
    let mut scratch = vec![0u64; lens.scratch];
    let mut state = vec![0u64; lens.state];
    let cur = Placement::new(shape, current)?;
    let input = Input::new(cur, loads, None, 7)?;
    let l = shape.layers();
    let mut out = vec![0u16; shape.placement_len()];
    let (mut changed, mut before, mut after) = (vec![false; l], vec![0.0; l], vec![0.0; l]);
    let sum = rebalance(
        &mut p,
        &input,
        &mut scratch,
        &mut state,
        Output {
            placement: &mut out,
            changed: &mut changed,
            par_before: &mut before,
            par_after: &mut after,
        },
    )?;
    Ok((out, sum.colocated_rows))
}

#[test]
fn a_colocated_current_placement_is_read_by_every_policy() {
    // Two layers, 8 experts, 4 ranks x 4 slots; rows holding an expert twice, as DeepSeek
    // writes them.
    let shape = Shape::new(2, 8, 4, 4).unwrap();
    #[rustfmt::skip]
    let current: Vec<u16> = vec![
        0, 0, 1, 2,   3, 3, 4, 5,   6, 7, 0, 1,   2, 3, 4, 5,
        7, 7, 7, 0,   1, 2, 3, 4,   5, 6, 0, 1,   2, 3, 4, 6,
    ];
    assert_eq!(Placement::new(shape, &current).unwrap().colocated_rows(), 3);
    let loads: Vec<f64> = (0..16).map(|i| (1 + (i * 37) % 11) as f64 * 10.0).collect();
    for kind in PolicyKind::ALL {
        let (out, colocated) =
            run(kind, shape, &current, &loads).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        let p = Placement::new(shape, &out).unwrap();
        if !AnyPolicy::new(kind).colocates() {
            assert_eq!(colocated, 0, "{kind:?}: {out:?}");
            p.check_servable()
                .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        }
    }
}

#[test]
fn default_moves_nothing_without_heat() {
    let shape = Shape::new(2, 16, 4, 5).unwrap();
    let mut current = vec![0u16; shape.placement_len()];
    Layout::Default.fill(&shape, &mut current).unwrap();
    let zeros = vec![0.0; shape.loads_len()];
    // Random shuffles by design, DeepSeek ignores the current placement, FlashLB decides on
    // its samples' history.
    for kind in [
        PolicyKind::Default,
        PolicyKind::Incremental,
        PolicyKind::Swift,
    ] {
        let (out, _) = run(kind, shape, &current, &zeros).unwrap();
        assert_eq!(out, current, "{kind:?}");
    }
}

#[test]
fn shapes_beyond_the_supported_range_are_refused_before_allocation() {
    // 65535 ranks with 20 bytes of loads made FlashLB ask for 34 GB and abort.
    let wide = Shape::new(1, 2, 65535, 1).unwrap();
    for kind in PolicyKind::ALL {
        let e = buffer_lens(&AnyPolicy::new(kind), &wide).unwrap_err();
        assert_eq!(
            e,
            Error::TooLarge {
                what: "ranks",
                needed: 65535,
                limit: MAX_RANKS
            }
        );
        assert_eq!(
            e.to_string(),
            "ranks: 65535 is over the supported limit of 2048"
        );
    }
    let slots = Shape::new(1, 8, 1024, 8).unwrap();
    let e = buffer_lens(&AnyPolicy::new(PolicyKind::Swift), &slots).unwrap_err();
    assert_eq!(
        e,
        Error::TooLarge {
            what: "slots per layer (ranks x slots per rank)",
            needed: 8192,
            limit: MAX_SLOTS_PER_LAYER
        }
    );
    // In range, but FlashLB's per-layer history for 65535 layers is over the byte limit.
    let deep = Shape::new(65535, 4096, 1024, 4).unwrap();
    let flash = AnyPolicy::new(PolicyKind::FlashLb);
    match buffer_lens(&flash, &deep).unwrap_err() {
        Error::TooLarge {
            what: "scratch and state bytes",
            needed,
            limit,
        } => {
            assert_eq!(limit, MAX_BUFFER_BYTES);
            assert_eq!(
                needed,
                8 * (scratch_len(&flash, &deep) + flash.state_len(&deep))
            );
            assert!(needed > MAX_BUFFER_BYTES);
        }
        e => panic!("{e:?}"),
    }
    // The checked call refuses the range too, whatever buffers it is given.
    let mut current = vec![0u16; wide.placement_len()];
    Layout::Default.fill(&wide, &mut current).unwrap();
    let loads = [1.0, 2.0];
    let input = Input::new(Placement::new(wide, &current).unwrap(), &loads, None, 0).unwrap();
    let mut out = vec![0u16; wide.placement_len()];
    let (mut c, mut b, mut a) = ([false], [0.0], [0.0]);
    let e = rebalance(
        &mut AnyPolicy::new(PolicyKind::Default),
        &input,
        &mut [],
        &mut [],
        Output {
            placement: &mut out,
            changed: &mut c,
            par_before: &mut b,
            par_after: &mut a,
        },
    )
    .unwrap_err();
    assert!(matches!(e, Error::TooLarge { what: "ranks", .. }), "{e}");
}

#[test]
fn a_topology_the_policy_cannot_serve_is_refused_up_front() {
    let shape = Shape::new(1, 64, 8, 8).unwrap().topology(8, 6).unwrap();
    let e = buffer_lens(&AnyPolicy::new(PolicyKind::DeepSeek), &shape).unwrap_err();
    assert_eq!(
        e.to_string(),
        "hierarchical DeepSeek EPLB needs experts divisible by expert groups (got 6)"
    );
    assert!(buffer_lens(&AnyPolicy::new(PolicyKind::Default), &shape).is_ok());
}
