use std::vec;
use std::vec::Vec;

use eplb_core::Layout;

use super::*;
use crate::{AnyPolicy, PolicyKind, buffer_lens, rebalance, scratch_len};

/// The new placement and everything `rebalance` over a live set reported.
#[derive(Debug, Clone, PartialEq)]
struct Run {
    placement: Vec<u16>,
    changed: Vec<bool>,
    par_before: Vec<f64>,
    par_after: Vec<f64>,
    summary: Summary,
}

fn run_live(policy: &mut AnyPolicy, input: &Input<'_>, state: &mut [u64]) -> Result<Run, Error> {
    let shape = *input.shape();
    let lens = buffer_lens(policy, &shape)?;
    assert!(state.len() >= lens.state);
    let mut scratch = vec![0u64; lens.scratch];
    let l = shape.layers();
    let mut placement = vec![0u16; shape.placement_len()];
    let (mut changed, mut par_before, mut par_after) = (vec![false; l], vec![0.0; l], vec![0.0; l]);
    let summary = rebalance(
        policy,
        input,
        &mut scratch,
        state,
        Output {
            placement: &mut placement,
            changed: &mut changed,
            par_before: &mut par_before,
            par_after: &mut par_after,
        },
    )?;
    Ok(Run {
        placement,
        changed,
        par_before,
        par_after,
        summary,
    })
}

fn run_full(
    policy: &mut AnyPolicy,
    shape: Shape,
    current: &[u16],
    loads: &[f64],
    seed: u64,
    state: &mut [u64],
) -> Run {
    let input = Input::new(Placement::new(shape, current).unwrap(), loads, None, seed).unwrap();
    let mut scratch = vec![0u64; scratch_len(policy, &shape)];
    let l = shape.layers();
    let mut placement = vec![0u16; shape.placement_len()];
    let (mut changed, mut par_before, mut par_after) = (vec![false; l], vec![0.0; l], vec![0.0; l]);
    let summary = rebalance(
        policy,
        &input,
        &mut scratch,
        state,
        Output {
            placement: &mut placement,
            changed: &mut changed,
            par_before: &mut par_before,
            par_after: &mut par_after,
        },
    )
    .unwrap();
    Run {
        placement,
        changed,
        par_before,
        par_after,
        summary,
    }
}

/// (rank, expert) copies in `new` of the experts without a copy on a live rank of `current`.
fn expected_reloads(shape: &Shape, live: &LiveSet, current: &[u16], new: &[u16]) -> usize {
    let (per, s) = (shape.slots_per_layer(), shape.slots_per_rank());
    let mut total = 0;
    for (old, new) in current.chunks_exact(per).zip(new.chunks_exact(per)) {
        let mut lost = vec![false; shape.experts()];
        lost_experts(shape, old, live, &mut lost).unwrap();
        for row in new.chunks_exact(s) {
            let mut seen = vec![false; shape.experts()];
            for &e in row {
                if e != EMPTY && lost[usize::from(e)] && !seen[usize::from(e)] {
                    seen[usize::from(e)] = true;
                    total += 1;
                }
            }
        }
    }
    total
}

/// The properties every live plan has; returns the number of lost (layer, expert) pairs.
fn check_plan(kind: PolicyKind, input: &Input<'_>, run: &Run) -> usize {
    let shape = *input.shape();
    let all = LiveSet::all(shape.ranks()).unwrap();
    let live = input.current().live().unwrap_or(&all);
    let (per, s) = (shape.slots_per_layer(), shape.slots_per_rank());
    Placement::with_live(shape, &run.placement, live).unwrap();
    let mut lost_total = 0;
    for (l, (old, new)) in input
        .current()
        .as_slice()
        .chunks_exact(per)
        .zip(run.placement.chunks_exact(per))
        .enumerate()
    {
        let mut lost = vec![false; shape.experts()];
        lost_total += lost_experts(&shape, old, live, &mut lost).unwrap();
        // Every expert has a copy on a live rank.
        assert_eq!(
            lost_experts(&shape, new, live, &mut lost).unwrap(),
            0,
            "{kind}: layer {l} loses an expert"
        );
        for (r, row) in new.chunks_exact(s).enumerate() {
            if live.contains(r) {
                assert!(!row.contains(&EMPTY), "{kind}: live rank {r} keeps EMPTY");
                if kind != PolicyKind::DeepSeek {
                    assert_eq!(
                        eplb_core::placement::first_duplicate(row),
                        None,
                        "{kind}: layer {l} rank {r} co-located"
                    );
                }
            } else {
                assert!(row.iter().all(|&e| e == EMPTY), "{kind}: dead rank {r}");
            }
        }
        assert_eq!(run.changed[l], old != new);
    }
    assert_eq!(
        run.summary.reloads,
        expected_reloads(&shape, live, input.current().as_slice(), &run.placement)
    );
    assert!(
        run.summary.reloads >= lost_total,
        "{kind}: a lost expert not reloaded"
    );
    assert_eq!(
        run.summary.moves,
        eplb_core::metrics::moves(input.current().as_slice(), &run.placement, s)
    );
    lost_total
}

/// 2 layers, 8 experts, 5 ranks x 3 slots. Expert 7 only on rank 1 (both layers); expert 3 on
/// ranks 1 and 3 in layer 0.
fn small() -> (Shape, Vec<u16>, Vec<f64>) {
    let shape = Shape::new(2, 8, 5, 3).unwrap();
    #[rustfmt::skip]
    let current = vec![
        0, 1, 2,  3, 4, 7,  5, 6, 0,  1, 2, 3,  4, 5, 6,
        6, 5, 4,  3, 2, 7,  1, 0, 6,  5, 4, 3,  2, 1, 0,
    ];
    let loads: Vec<f64> = (0..16).map(|i| f64::from((i * 37) % 11 + 1)).collect();
    (shape, current, loads)
}

fn live_without(ranks: usize, dead: &[usize]) -> LiveSet {
    let mut live = LiveSet::all(ranks).unwrap();
    for &d in dead {
        live.remove(d).unwrap();
    }
    live
}

/// One dead rank, then two (rank 1 holds the only copy of expert 7), then a joined rank (an
/// all-EMPTY live row), for `kind`.
fn dead_ranks_for(kind: PolicyKind) {
    let (shape, full, loads) = small();
    for dead in [&[1][..], &[1, 3], &[4, 1]] {
        let live = live_without(5, dead);
        let mut current = full.clone();
        eplb_core::live::retire(&shape, &live, &mut current).unwrap();
        let input = eplb_core::Placement::with_live(shape, &current, &live)
            .map_err(Error::from)
            .and_then(|p| Input::new(p, &loads, None, 7))
            .unwrap();
        let mut policy = AnyPolicy::new(kind);
        let mut state = vec![0u64; buffer_lens(&policy, &shape).unwrap().state];
        let run = run_live(&mut policy, &input, &mut state).unwrap();
        let lost = check_plan(kind, &input, &run);
        assert!(lost >= 2, "{kind} {dead:?}: expert 7 lost in both layers");
        // Expert 7 lives on a live rank again.
        for layer in run.placement.chunks_exact(shape.slots_per_layer()) {
            let at = layer.iter().position(|&e| e == 7).unwrap();
            assert!(live.contains(at / 3));
        }
        // Deterministic.
        let mut policy = AnyPolicy::new(kind);
        let mut state = vec![0u64; buffer_lens(&policy, &shape).unwrap().state];
        assert_eq!(run_live(&mut policy, &input, &mut state).unwrap(), run);
    }
    // Rank 1 gone, rank 2 joined (live, all EMPTY): rank 2 is filled.
    let live = live_without(5, &[1]);
    let mut current = full.clone();
    eplb_core::live::retire(&shape, &live, &mut current).unwrap();
    for layer in current.chunks_exact_mut(shape.slots_per_layer()) {
        layer[6..9].fill(EMPTY);
    }
    let input = eplb_core::Placement::with_live(shape, &current, &live)
        .map_err(Error::from)
        .and_then(|p| Input::new(p, &loads, None, 7))
        .unwrap();
    let mut policy = AnyPolicy::new(kind);
    let mut state = vec![0u64; buffer_lens(&policy, &shape).unwrap().state];
    let run = run_live(&mut policy, &input, &mut state).unwrap();
    check_plan(kind, &input, &run);
    for layer in run.placement.chunks_exact(shape.slots_per_layer()) {
        assert!(
            !layer[6..9].contains(&EMPTY),
            "{kind}: joined rank not filled"
        );
    }
}

#[test]
fn random_plans_over_live_ranks() {
    dead_ranks_for(PolicyKind::Random);
}

#[test]
fn default_plans_over_live_ranks() {
    dead_ranks_for(PolicyKind::Default);
}

#[test]
fn swift_plans_over_live_ranks() {
    dead_ranks_for(PolicyKind::Swift);
}

#[test]
fn flashlb_plans_over_live_ranks() {
    dead_ranks_for(PolicyKind::FlashLb);
}

#[test]
fn incremental_plans_over_live_ranks() {
    dead_ranks_for(PolicyKind::Incremental);
}

#[test]
fn deepseek_plans_over_live_ranks() {
    dead_ranks_for(PolicyKind::DeepSeek);
}

#[test]
fn all_live_is_rebalance_bit_for_bit() {
    for shape in [
        Shape::new(2, 8, 5, 3).unwrap(),
        Shape::with_topology(3, 32, 8, 5, 4, 4).unwrap(),
        Shape::with_topology(2, 16, 4, 4, 2, 2).unwrap(),
    ] {
        let mut current = vec![0u16; shape.placement_len()];
        Layout::Default.fill(&shape, &mut current).unwrap();
        let loads: Vec<f64> = (0..shape.loads_len())
            .map(|i| ((i * 7919) % 101) as f64 + 0.5)
            .collect();
        let live = LiveSet::all(shape.ranks()).unwrap();
        for kind in PolicyKind::ALL.into_iter().chain([PolicyKind::Static]) {
            let mut a = AnyPolicy::new(kind);
            let mut b = AnyPolicy::new(kind);
            let state_len = buffer_lens(&a, &shape).unwrap().state;
            assert_eq!(state_len, a.state_len(&shape));
            let (mut sa, mut sb) = (vec![0u64; state_len], vec![0u64; state_len]);
            let mut cur = current.clone();
            // Twice, the second from the first's output with the warm state.
            for _ in 0..2 {
                let full = run_full(&mut a, shape, &cur, &loads, 3, &mut sa);
                let input = eplb_core::Placement::with_live(shape, &cur, &live)
                    .map_err(Error::from)
                    .and_then(|p| Input::new(p, &loads, None, 3))
                    .unwrap();
                let live_run = run_live(&mut b, &input, &mut sb).unwrap();
                assert_eq!(full.placement, live_run.placement, "{kind} {shape:?}");
                assert_eq!(full.changed, live_run.changed, "{kind}");
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&full.par_before), bits(&live_run.par_before), "{kind}");
                assert_eq!(bits(&full.par_after), bits(&live_run.par_after), "{kind}");
                assert_eq!(full.summary, live_run.summary, "{kind}");
                assert_eq!(live_run.summary.reloads, 0);
                assert_eq!(sa, sb, "{kind}: states differ");
                cur = full.placement;
            }
        }
    }
}

#[test]
fn a_full_shape_state_is_fresh_on_the_compact_shape() {
    let (shape, full, loads) = small();
    let live = live_without(5, &[1]);
    let mut current = full.clone();
    eplb_core::live::retire(&shape, &live, &mut current).unwrap();
    let input = eplb_core::Placement::with_live(shape, &current, &live)
        .map_err(Error::from)
        .and_then(|p| Input::new(p, &loads, None, 1))
        .unwrap();
    for kind in [PolicyKind::FlashLb, PolicyKind::Incremental] {
        let mut p = AnyPolicy::new(kind);
        let len = buffer_lens(&p, &shape).unwrap().state;
        // A warm state of the full shape (two cycles), and a fresh one.
        let mut warm = vec![0u64; len];
        let other: Vec<f64> = loads.iter().rev().map(|x| x * 3.0).collect();
        let r = run_full(&mut p, shape, &full, &other, 1, &mut warm);
        run_full(&mut p, shape, &r.placement, &other, 1, &mut warm);
        let mut fresh = vec![0u64; len];
        let a = run_live(&mut AnyPolicy::new(kind), &input, &mut warm).unwrap();
        let b = run_live(&mut AnyPolicy::new(kind), &input, &mut fresh).unwrap();
        assert_eq!(a, b, "{kind}");
        assert_eq!(warm, fresh, "{kind}");
    }
}

#[test]
fn servable_current_fills_lost_then_empty_slots() {
    // 4 experts, 2 live ranks x 2 slots (compact): the rank that held 2 and 3 was dropped,
    // the other joined empty.
    let mut lay = [0u16, 1, EMPTY, EMPTY];
    let loads = [1.0, 2.0, 5.0, 3.0];
    let (mut copies, mut mark) = ([0u32; 4], [0u32; 4]);
    make_servable(&mut lay, 2, &loads, &mut copies, &mut mark);
    // Lost 2 and 3 take the EMPTY slots, lowest first.
    assert_eq!(lay, [0, 1, 2, 3]);
    // No EMPTY slot: a lost expert takes the last slot of the most-copied expert's highest rank.
    let mut lay = [0u16, 1, 0, 2, 1, 0];
    let loads = [4.0, 1.0, 1.0, 9.0];
    make_servable(&mut lay, 2, &loads, &mut copies, &mut mark);
    assert_eq!(lay, [0, 1, 0, 2, 1, 3]);
    // Ties on copies: the lowest load per copy gives way (1 and 2 tie below 0: the lower id).
    let mut lay = [0u16, 1, 1, 0, 2, 2];
    let loads = [4.0, 1.0, 1.0, 9.0];
    make_servable(&mut lay, 2, &loads, &mut copies, &mut mark);
    assert_eq!(lay, [0, 1, 3, 0, 2, 2]);
    // Remaining EMPTY slots: the highest load per copy the rank lacks.
    let mut lay = [0u16, 1, 2, 3, EMPTY, EMPTY];
    let loads = [1.0, 8.0, 2.0, 6.0];
    make_servable(&mut lay, 2, &loads, &mut copies, &mut mark);
    assert_eq!(lay, [0, 1, 2, 3, 1, 3]);
}

#[test]
fn bad_live_inputs_are_typed_errors() {
    let (shape, full, loads) = small();
    // A dead rank that still holds experts.
    let live = live_without(5, &[1]);
    assert!(matches!(
        eplb_core::Placement::with_live(shape, &full, &live)
            .map_err(Error::from)
            .and_then(|p| Input::new(p, &loads, None, 0)),
        Err(Error::Core(eplb_core::Error::NotLive { rank: 1, .. }))
    ));
    // Too few live ranks: 2 x 3 slots < 8 experts.
    let live = live_without(5, &[0, 1, 2]);
    let mut current = full.clone();
    eplb_core::live::retire(&shape, &live, &mut current).unwrap();
    let err = eplb_core::Placement::with_live(shape, &current, &live)
        .map_err(Error::from)
        .and_then(|p| Input::new(p, &loads, None, 0))
        .unwrap_err();
    assert_eq!(
        err,
        Error::TooFewLiveRanks {
            live: 2,
            ranks: 5,
            slots_per_rank: 3,
            experts: 8
        }
    );
    assert_eq!(
        std::format!("{err}"),
        "2 live ranks of 5 with 3 slots each cannot hold 8 experts"
    );
    // A live set over another number of ranks.
    let live = LiveSet::all(4).unwrap();
    assert!(
        eplb_core::Placement::with_live(shape, &full, &live)
            .map_err(Error::from)
            .and_then(|p| Input::new(p, &loads, None, 0))
            .is_err()
    );
    // Loads of the wrong length.
    let live = LiveSet::all(5).unwrap();
    assert!(
        eplb_core::Placement::with_live(shape, &full, &live)
            .map_err(Error::from)
            .and_then(|p| Input::new(p, &loads[1..], None, 0))
            .is_err()
    );
    // Scratch too small: an error, and the output is the current placement.
    let live = live_without(5, &[1]);
    let mut current = full.clone();
    eplb_core::live::retire(&shape, &live, &mut current).unwrap();
    let input = eplb_core::Placement::with_live(shape, &current, &live)
        .map_err(Error::from)
        .and_then(|p| Input::new(p, &loads, None, 0))
        .unwrap();
    let mut p = AnyPolicy::new(PolicyKind::Default);
    let mut out = vec![0u16; shape.placement_len()];
    let (mut c, mut b, mut a) = ([false; 2], [0.0; 2], [0.0; 2]);
    let mut small_scratch = vec![0u64; 3];
    let err = rebalance(
        &mut p,
        &input,
        &mut small_scratch,
        &mut [],
        Output {
            placement: &mut out,
            changed: &mut c,
            par_before: &mut b,
            par_after: &mut a,
        },
    );
    assert!(matches!(err, Err(Error::Scratch { .. })));
    assert_eq!(out, current);
    // A too-small state for a stateful policy: the error restores the current placement.
    let mut p = AnyPolicy::new(PolicyKind::FlashLb);
    let mut scratch = vec![0u64; scratch_len(&p, &shape)];
    out.fill(0);
    let err = rebalance(
        &mut p,
        &input,
        &mut scratch,
        &mut [0u64; 1],
        Output {
            placement: &mut out,
            changed: &mut c,
            par_before: &mut b,
            par_after: &mut a,
        },
    );
    assert!(matches!(err, Err(Error::State { .. })));
    assert_eq!(out, current);
}

#[test]
fn compact_shapes_keep_what_still_fits() {
    let shape = Shape::with_topology(1, 64, 16, 8, 4, 8).unwrap();
    assert_eq!(compact_shape(&shape, 16).unwrap(), shape);
    // 12 ranks: 4 per node still divides, 3 nodes; 8 groups % 3 != 0, kept (DeepSeek global).
    let c = compact_shape(&shape, 12).unwrap();
    assert_eq!((c.ranks(), c.ranks_per_node(), c.groups()), (12, 4, 8));
    // 15 ranks: one node of 15.
    let c = compact_shape(&shape, 15).unwrap();
    assert_eq!((c.ranks(), c.ranks_per_node(), c.groups()), (15, 15, 8));
    // 4 groups do not divide 30 experts: fine on 3 nodes (DeepSeek global), but one node would
    // make them hierarchical and invalid, so the compact shape has one group.
    let odd = Shape::with_topology(1, 30, 6, 6, 2, 4).unwrap();
    assert_eq!(compact_shape(&odd, 6).unwrap(), odd);
    let c = compact_shape(&odd, 5).unwrap();
    assert_eq!((c.ranks(), c.ranks_per_node(), c.groups()), (5, 5, 1));
    assert!(matches!(
        compact_shape(&odd, 4),
        Err(Error::TooFewLiveRanks { live: 4, .. })
    ));
    assert!(compact_shape(&odd, 7).is_err());
    assert!(compact_shape(&shape, 7).is_err());
    assert!(compact_shape(&shape, 0).is_err());
    // Every live count a shape allows gets a compact shape DeepSeek accepts.
    let ds = crate::deepseek::DeepSeek::new();
    for live in 8..=16 {
        let c = compact_shape(&shape, live).unwrap();
        ds.check_shape(&c).unwrap();
    }
    // Scratch for any live set covers each compact shape's need.
    let p = AnyPolicy::new(PolicyKind::Incremental);
    let all = scratch_len(&p, &shape);
    for live in 8..=16 {
        let c = compact_shape(&shape, live).unwrap();
        assert!(compact_scratch(&p, &c) <= all);
    }
}
