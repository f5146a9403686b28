//! Rust-side checks of the C ABI on a small shape (the golden DeepSeek-V3 cases run from C, in
//! `cargo xtask aicpu`).
#![allow(clippy::indexing_slicing, clippy::unwrap_used)]

use super::*;

const L: u16 = 3;
const N: u16 = 8;
const R: u16 = 4;
const S: u16 = 3;

struct Bufs {
    current: Vec<u16>,
    loads: Vec<f64>,
    out: Vec<u16>,
    changed: Vec<u8>,
    before: Vec<f64>,
    after: Vec<f64>,
    scratch: Vec<u64>,
    state: Vec<u64>,
}

fn bufs(policy: u32) -> Bufs {
    let p = usize::from(L * R * S);
    let current = (0..p).map(|i| (i % usize::from(N)) as u16).collect();
    let loads = (0..usize::from(L * N))
        .map(|i| ((i * 37) % 11) as f64 + 0.5)
        .collect();
    Bufs {
        current,
        loads,
        out: vec![0; p],
        changed: vec![7; usize::from(L)],
        before: vec![0.0; usize::from(L)],
        after: vec![0.0; usize::from(L)],
        scratch: vec![0; eplb_aicpu_scratch_len(L, N, R, S, 0, 0, policy) as usize],
        state: vec![0; eplb_aicpu_state_len(L, N, R, S, 0, 0, policy) as usize],
    }
}

fn args(b: &mut Bufs, policy: u32) -> EplbAicpuArgs {
    EplbAicpuArgs {
        layers: L,
        experts: N,
        ranks: R,
        slots_per_rank: S,
        policy,
        seed: 3,
        current: b.current.as_ptr(),
        current_len: b.current.len() as u64,
        loads: b.loads.as_ptr(),
        loads_len: b.loads.len() as u64,
        out_placement: b.out.as_mut_ptr(),
        out_placement_len: b.out.len() as u64,
        out_changed: b.changed.as_mut_ptr(),
        out_changed_len: b.changed.len() as u64,
        out_par_before: b.before.as_mut_ptr(),
        out_par_before_len: b.before.len() as u64,
        out_par_after: b.after.as_mut_ptr(),
        out_par_after_len: b.after.len() as u64,
        scratch: b.scratch.as_mut_ptr(),
        scratch_len: b.scratch.len() as u64,
        state: b.state.as_mut_ptr(),
        state_len: b.state.len() as u64,
        ..EplbAicpuArgs::new()
    }
}

fn call(a: &mut EplbAicpuArgs) -> u32 {
    // SAFETY: every pointer in `a` comes from a live Vec of the stated length (or is null).
    unsafe { eplb_aicpu_rebalance(ptr::from_mut(a).cast()) }
}

#[test]
fn every_policy_matches_the_rust_api() {
    for policy in 0..=5 {
        let mut b = bufs(policy);
        let mut a = args(&mut b, policy);
        assert_eq!(
            call(&mut a),
            EPLB_AICPU_OK,
            "policy {policy}: {:?}",
            a.result
        );

        let shape = Shape::new(L, N, R, S).unwrap();
        let mut p = AnyPolicy::new(policy_kind(policy).unwrap());
        let mut scratch = vec![0; eplb_policies::scratch_len(&p, &shape)];
        let mut state = vec![0; p.state_len(&shape)];
        let (mut out, mut changed) = (vec![0; b.out.len()], vec![false; usize::from(L)]);
        let (mut before, mut after) = (vec![0.0; usize::from(L)], vec![0.0; usize::from(L)]);
        let cur = Placement::new(shape, &b.current).unwrap();
        let input = Input::new(cur, &b.loads, None, 3).unwrap();
        let summary = eplb_policies::rebalance(
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
        )
        .unwrap();
        assert_eq!(b.out, out, "policy {policy}");
        let flags: Vec<u8> = changed.iter().map(|&c| u8::from(c)).collect();
        assert_eq!(b.changed, flags);
        assert_eq!(b.before, before);
        assert_eq!(b.after, after);
        assert_eq!(b.state, state);
        assert_eq!(a.result.moves, summary.moves as u64);
        assert_eq!(a.result.par_mean_after, summary.after.mean);
    }
}

#[test]
fn bad_arguments_give_their_status() {
    assert_eq!(
        // SAFETY: null is a documented input.
        unsafe { eplb_aicpu_rebalance(ptr::null_mut()) },
        EPLB_AICPU_E_NULL_ARGS
    );
    let mut b = bufs(EPLB_AICPU_POLICY_FLASHLB);
    type Case = (&'static str, fn(&mut EplbAicpuArgs), u32, u32);
    let cases: [Case; 8] = [
        ("version", |a| a.version = 0, EPLB_AICPU_E_VERSION, 0),
        (
            "null loads",
            |a| a.loads = ptr::null(),
            EPLB_AICPU_E_NULL_POINTER,
            EPLB_AICPU_FIELD_LOADS,
        ),
        (
            "short out",
            |a| a.out_placement_len -= 1,
            EPLB_AICPU_E_TOO_SHORT,
            EPLB_AICPU_FIELD_OUT_PLACEMENT,
        ),
        (
            "shape",
            |a| a.slots_per_rank = 9,
            EPLB_AICPU_E_SHAPE,
            EPLB_AICPU_FIELD_SHAPE,
        ),
        (
            "policy",
            |a| a.policy = 9,
            EPLB_AICPU_E_POLICY,
            EPLB_AICPU_FIELD_POLICY,
        ),
        (
            "scratch",
            |a| a.scratch_len -= 1,
            EPLB_AICPU_E_SCRATCH,
            EPLB_AICPU_FIELD_SCRATCH,
        ),
        (
            "state",
            |a| a.state_len -= 1,
            EPLB_AICPU_E_STATE,
            EPLB_AICPU_FIELD_STATE,
        ),
        (
            "overlap",
            |a| a.out_par_after = a.out_par_before,
            EPLB_AICPU_E_OVERLAP,
            EPLB_AICPU_FIELD_OUT_PAR_BEFORE,
        ),
    ];
    for (what, edit, status, field) in cases {
        let mut a = args(&mut b, EPLB_AICPU_POLICY_FLASHLB);
        edit(&mut a);
        assert_eq!(call(&mut a), status, "{what}");
        assert_eq!(a.result.field, field, "{what}");
    }
    b.loads[5] = f64::NAN;
    let mut a = args(&mut b, EPLB_AICPU_POLICY_FLASHLB);
    assert_eq!(call(&mut a), EPLB_AICPU_E_LOAD);
    assert_eq!(a.result.detail, 5);
}

#[test]
fn sizing_is_zero_on_invalid_input() {
    assert_eq!(eplb_aicpu_scratch_len(0, N, R, S, 0, 0, 1), 0);
    assert_eq!(eplb_aicpu_scratch_len(L, N, R, S, 0, 0, 6), 0);
    assert_eq!(eplb_aicpu_state_len(L, N, R, S, 3, 0, 3), 0);
    assert!(eplb_aicpu_scratch_len(L, N, R, S, 0, 0, 1) > 0);
    assert!(eplb_aicpu_state_len(L, N, R, S, 0, 0, 3) > 0);
    assert_eq!(eplb_aicpu_abi_version(), EPLB_AICPU_ABI_VERSION);
}
