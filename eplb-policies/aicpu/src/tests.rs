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

// ---- ABI version 1 and the pay-off gate (version 2) ----

use eplb_core::time::Role;
use eplb_runtime::planner::PolicyHost;

/// The gate block of `model` with a horizon of `h + a` iterations.
fn gate_block(model: &TimeModel, routing: Routing, h: u32, a: u32) -> EplbAicpuGate {
    let (hw, m) = (&model.hardware, &model.model);
    EplbAicpuGate {
        flops_bf16: hw.flops_bf16,
        flops_8bit: hw.flops_8bit,
        flops_fp4: hw.flops_fp4,
        hbm_bytes_per_s: hw.hbm_bytes_per_s,
        intra_node_bytes_per_s: hw.intra_node_bytes_per_s,
        inter_node_bytes_per_s: hw.inter_node_bytes_per_s,
        layer_overhead_ms: hw.layer_overhead_ms,
        collective_ms: hw.collective_ms,
        hidden: m.hidden,
        intermediate: m.intermediate,
        experts: m.experts,
        top_k: m.top_k,
        moe_layers: m.moe_layers,
        shared_experts: m.shared_experts,
        dtype: match m.dtype {
            Dtype::Bf16 => EPLB_AICPU_DTYPE_BF16,
            Dtype::Int8 => EPLB_AICPU_DTYPE_INT8,
            Dtype::Fp8 => EPLB_AICPU_DTYPE_FP8,
            Dtype::Fp4 => EPLB_AICPU_DTYPE_FP4,
        },
        routing: match routing {
            Routing::Log2Phy => EPLB_AICPU_ROUTING_LOG2PHY,
            Routing::Even => EPLB_AICPU_ROUTING_EVEN,
        },
        tokens_per_rank: model.tokens_per_rank,
        expert_bytes: model.expert_bytes,
        heat_interval: h,
        algo_interval: a,
    }
}

/// A small DeepSeek-V3-like model on A3 (top-2 of the shape's 8 experts), decode.
fn small_model(expert_bytes: f64) -> TimeModel {
    let mut spec = ModelSpec::DEEPSEEK_V3;
    spec.experts = N;
    spec.top_k = 2;
    spec.moe_layers = L;
    TimeModel::new(Hardware::A3, spec, Role::Decode, expert_bytes)
}

/// Buffers sized for the gate on.
fn gated_bufs(policy: u32) -> Bufs {
    let mut b = bufs(policy);
    b.scratch = vec![0; eplb_aicpu_scratch_len_v2(L, N, R, S, 0, 0, policy, 1) as usize];
    b.state = vec![0; eplb_aicpu_state_len_v2(L, N, R, S, 0, 0, policy, 1) as usize];
    b
}

fn gated_args(b: &mut Bufs, policy: u32, gate: EplbAicpuGate) -> EplbAicpuArgs {
    EplbAicpuArgs {
        payoff_gate: 1,
        gate,
        ..args(b, policy)
    }
}

#[test]
fn a_version_1_block_behaves_as_before_and_touches_nothing_beyond_it() {
    for policy in 0..=5 {
        // Version 2 with the gate off: the reference (it equals the Rust API, test above).
        let mut b2 = bufs(policy);
        let mut a2 = args(&mut b2, policy);
        assert_eq!(call(&mut a2), EPLB_AICPU_OK, "policy {policy}");
        assert_eq!(a2.gate_result, EplbAicpuGateResult::default());

        let mut b1 = bufs(policy);
        let mut a1 = args(&mut b1, policy);
        a1.version = 1;
        a1.struct_size = EPLB_AICPU_ARGS_V1_SIZE;
        // What lies beyond a version 1 block is neither read (a gate flag of 7 would be an
        // error) nor written.
        a1.payoff_gate = 7;
        a1.gate.hbm_bytes_per_s = f64::NAN;
        let canary = EplbAicpuGateResult {
            changed_layers: 0xDEAD,
            ..EplbAicpuGateResult::default()
        };
        a1.gate_result = canary;
        assert_eq!(
            call(&mut a1),
            EPLB_AICPU_OK,
            "policy {policy}: {:?}",
            a1.result
        );
        assert_eq!(a1.gate_result, canary);
        assert_eq!(a1.payoff_gate, 7);
        assert_eq!(a1.result, a2.result, "policy {policy}");
        assert_eq!((b1.out, b1.changed), (b2.out, b2.changed));
        assert_eq!((b1.before, b1.after), (b2.before, b2.after));
        assert_eq!(b1.state, b2.state);
    }
    // The sizing functions of version 1 are the version 2 ones with the gate off.
    for policy in 0..=5 {
        assert_eq!(
            eplb_aicpu_scratch_len(L, N, R, S, 0, 0, policy),
            eplb_aicpu_scratch_len_v2(L, N, R, S, 0, 0, policy, 0)
        );
        assert_eq!(
            eplb_aicpu_state_len(L, N, R, S, 0, 0, policy),
            eplb_aicpu_state_len_v2(L, N, R, S, 0, 0, policy, 0)
        );
        assert_eq!(
            eplb_aicpu_state_len_v2(L, N, R, S, 0, 0, policy, 1),
            eplb_aicpu_state_len(L, N, R, S, 0, 0, policy) + u64::from(L)
        );
    }
    // A mismatched version and size is refused, with nothing written.
    let mut b = bufs(1);
    for (version, size) in [
        (1, 408),
        (2, EPLB_AICPU_ARGS_V1_SIZE),
        (3, 408),
        (2, 432),
        (4, 432),
        (0, 248),
    ] {
        let mut a = args(&mut b, 1);
        (a.version, a.struct_size) = (version, size);
        a.result.detail = 99;
        assert_eq!(call(&mut a), EPLB_AICPU_E_VERSION, "({version}, {size})");
        assert_eq!(a.result.detail, 99);
    }
}

/// Runs `cycles` gated calls through the C ABI and through the runtime's `PolicyHost` with the
/// same gate on the same inputs (each cycle from the last one's placement, loads changing), and
/// checks they agree in every output, ages included. Returns the layers held over all cycles.
fn gated_equals_the_runtime(policy: u32, model: TimeModel, h: u32, a: u32, cycles: u64) -> usize {
    let shape = Shape::new(L, N, R, S).unwrap();
    let gate = Gate {
        model,
        iterations: u64::from(h) + u64::from(a),
        routing: Routing::Log2Phy,
        step_other_ms: 0.0,
    };
    let mut host: PolicyHost<AnyPolicy> = PolicyHost::new(
        Box::new(AnyPolicy::new(policy_kind(policy).unwrap())),
        shape,
    );
    host.set_gate(Some(gate));
    let mut b = gated_bufs(policy);
    let policy_words = b.state.len() - usize::from(L);
    let mut held = 0;
    for cycle in 0..cycles {
        // Loads that shift every cycle: a hot expert per layer that moves around.
        for (i, w) in b.loads.iter_mut().enumerate() {
            let (layer, e) = (i / usize::from(N), i % usize::from(N));
            let hot = (layer + cycle as usize) % usize::from(N);
            *w = if e == hot {
                40.0
            } else {
                1.0 + (e * 7 % 5) as f64
            };
        }
        let mut args = gated_args(&mut b, policy, gate_block(&model, Routing::Log2Phy, h, a));
        args.seed = 3 + cycle;
        assert_eq!(
            call(&mut args),
            EPLB_AICPU_OK,
            "policy {policy}: {:?}",
            args.result
        );

        let cur = Placement::new(shape, &b.current).unwrap();
        let input = Input::new(cur, &b.loads, None, 3 + cycle).unwrap();
        let plan = host.plan_and_take(cycle, &input).unwrap();
        let what = format!("policy {policy} cycle {cycle}");
        assert_eq!(b.out, plan.placement(), "{what}");
        let flags: Vec<u8> = plan.changed().iter().map(|&c| u8::from(c)).collect();
        assert_eq!(b.changed, flags, "{what}");
        assert_eq!(b.before, plan.par_before(), "{what}");
        assert_eq!(b.after, plan.par_after(), "{what}");
        assert_eq!(&b.state[..policy_words], host.state(), "{what}");
        let ages: Vec<u64> = host
            .gate_ages()
            .unwrap()
            .iter()
            .map(|&x| u64::from(x))
            .collect();
        assert_eq!(&b.state[policy_words..], ages, "{what}: ages");
        let s = plan.summary();
        assert_eq!(
            args.result.changed_layers as usize, s.changed_layers,
            "{what}"
        );
        assert_eq!(args.result.moves as usize, s.moves, "{what}");
        assert_eq!(
            args.result.colocated_rows as usize, s.colocated_rows,
            "{what}"
        );
        assert_eq!(
            (args.result.par_mean_after, args.result.par_max_after),
            (s.after.mean, s.after.max),
            "{what}"
        );
        let g = *plan.gate().unwrap();
        let r = args.gate_result;
        assert_eq!(
            (r.changed_layers as usize, r.moved_layers as usize),
            (g.changed, g.moved),
            "{what}"
        );
        assert_eq!(r.held_layers as usize, g.changed - g.moved, "{what}");
        assert_eq!(
            (r.saving_ms_per_iter, r.stall_ms, r.forgone_ms_per_iter),
            (g.saving_ms_per_iter, g.stall_ms, g.forgone_ms_per_iter),
            "{what}"
        );
        held += r.held_layers as usize;
        b.current.copy_from_slice(&b.out);
    }
    held
}

#[test]
fn the_gated_call_equals_the_runtimes_policy_host_over_several_cycles() {
    // A generous horizon (most changes pay) and a short one with heavy experts (some do not).
    let mut held = 0;
    for policy in 0..=5 {
        gated_equals_the_runtime(policy, small_model(44e6), 600, 50, 4);
        held += gated_equals_the_runtime(policy, small_model(2e9), 1, 0, 4);
    }
    assert!(held > 0, "no layer was held back");
}

#[test]
fn the_gated_call_equals_the_core_gate_on_the_policys_plan() {
    let shape = Shape::new(L, N, R, S).unwrap();
    let model = small_model(2e9);
    let gate = Gate {
        model,
        iterations: 1,
        routing: Routing::Log2Phy,
        step_other_ms: 0.0,
    };
    for policy in 0..=5 {
        // The policy alone (gate off), then the core gate on its plan.
        let mut b = bufs(policy);
        let mut a = args(&mut b, policy);
        assert_eq!(call(&mut a), EPLB_AICPU_OK);
        let mut plan = b.out.clone();
        let (f, u) = gate::scratch_len(&shape);
        let (mut fs, mut us, mut moved) = (vec![0.0; f], vec![0u32; u], vec![false; 3]);
        let sum = gate
            .apply(
                &shape,
                &b.current,
                &mut plan,
                &b.loads,
                gate::Scratch {
                    floats: &mut fs,
                    words: &mut us,
                    ages: &[],
                },
                &mut moved,
            )
            .unwrap();
        // The AICPU with the gate on.
        let mut g = gated_bufs(policy);
        let mut a = gated_args(&mut g, policy, gate_block(&model, Routing::Log2Phy, 1, 0));
        assert_eq!(call(&mut a), EPLB_AICPU_OK);
        assert_eq!(g.out, plan, "policy {policy}");
        let flags: Vec<u8> = moved.iter().map(|&m| u8::from(m)).collect();
        assert_eq!(g.changed, flags, "policy {policy}");
        assert_eq!(a.gate_result.moved_layers as usize, sum.moved);
        assert_eq!(a.gate_result.stall_ms, sum.stall_ms);
    }
}

#[test]
fn a_layer_whose_move_does_not_pay_keeps_its_rows() {
    // Layer 0 is skewed on experts 0 and 1, layers 1 and 2 barely; the policy changes all
    // three. Over a horizon of 3 iterations, a move that saves (almost) nothing per iteration
    // cannot pay back the stall of its exchange (at least the per-layer vote).
    let policy = EPLB_AICPU_POLICY_DEFAULT;
    let loads: Vec<f64> = (0..usize::from(L * N))
        .map(|i| match (i / usize::from(N), i % usize::from(N)) {
            (0, 0 | 1) => 1000.0,
            (0, _) => 1.0,
            (_, 0) => 10.02,
            _ => 10.0,
        })
        .collect();
    // Without the gate.
    let mut off = bufs(policy);
    off.loads.clone_from(&loads);
    let mut a = args(&mut off, policy);
    assert_eq!(call(&mut a), EPLB_AICPU_OK);
    let ungated = a.result;
    // With it. Prefill: compute-bound, so the time follows the busiest rank's tokens.
    let mut b = gated_bufs(policy);
    b.loads.clone_from(&loads);
    let mut model = small_model(44e6);
    model.tokens_per_rank = Role::Prefill.default_tokens_per_rank();
    let mut a = gated_args(&mut b, policy, gate_block(&model, Routing::Log2Phy, 2, 1));
    assert_eq!(call(&mut a), EPLB_AICPU_OK, "{:?}", a.result);
    let r = a.gate_result;
    assert_eq!(r.changed_layers, ungated.changed_layers);
    assert!(r.moved_layers >= 1 && r.held_layers >= 1, "{r:?}");
    assert_eq!(a.result.changed_layers, r.moved_layers);
    assert!(a.result.moves < ungated.moves);
    let per = usize::from(R * S);
    let mut held = 0;
    for layer in 0..usize::from(L) {
        let rows = layer * per..(layer + 1) * per;
        if b.changed[layer] == 0 {
            // Held: the policy had changed it, the gate gave its current rows back.
            assert_eq!(off.changed[layer], 1, "layer {layer}");
            assert_ne!(off.out[rows.clone()], b.current[rows.clone()]);
            assert_eq!(b.out[rows.clone()], b.current[rows], "layer {layer}");
            assert_eq!(b.after[layer], b.before[layer], "layer {layer}");
            held += 1;
        } else {
            // Moved: the policy's rows.
            assert_eq!(b.out[rows.clone()], off.out[rows], "layer {layer}");
            assert_eq!(b.after[layer], off.after[layer], "layer {layer}");
        }
    }
    assert_eq!(held, r.held_layers);
    // The ages: 1 for a moved layer, 2 for a held one (a fresh state reads as 1).
    let ages = &b.state[b.state.len() - usize::from(L)..];
    let want: Vec<u64> = b
        .changed
        .iter()
        .map(|&c| if c == 1 { 1 } else { 2 })
        .collect();
    assert_eq!(ages, want);
}

#[test]
fn bad_gate_inputs_name_their_field() {
    let policy = EPLB_AICPU_POLICY_DEFAULT;
    let ok = gate_block(&small_model(44e6), Routing::Log2Phy, 600, 50);
    type Edit = fn(&mut EplbAicpuGate);
    let cases: [(&str, Edit, u32); 17] = [
        (
            "bf16 NaN",
            |g| g.flops_bf16 = f64::NAN,
            EPLB_AICPU_FIELD_GATE_FLOPS_BF16,
        ),
        (
            "8-bit 0",
            |g| g.flops_8bit = 0.0,
            EPLB_AICPU_FIELD_GATE_FLOPS_8BIT,
        ),
        (
            "fp4 -1",
            |g| g.flops_fp4 = -1.0,
            EPLB_AICPU_FIELD_GATE_FLOPS_FP4,
        ),
        (
            "hbm 0",
            |g| g.hbm_bytes_per_s = 0.0,
            EPLB_AICPU_FIELD_GATE_HBM,
        ),
        (
            "intra -1",
            |g| g.intra_node_bytes_per_s = -1.0,
            EPLB_AICPU_FIELD_GATE_INTRA_NODE,
        ),
        (
            "inter 0",
            |g| g.inter_node_bytes_per_s = 0.0,
            EPLB_AICPU_FIELD_GATE_INTER_NODE,
        ),
        (
            "overhead inf",
            |g| g.layer_overhead_ms = f64::INFINITY,
            EPLB_AICPU_FIELD_GATE_LAYER_OVERHEAD,
        ),
        (
            "collective -0.5",
            |g| g.collective_ms = -0.5,
            EPLB_AICPU_FIELD_GATE_COLLECTIVE,
        ),
        ("hidden 0", |g| g.hidden = 0, EPLB_AICPU_FIELD_GATE_HIDDEN),
        (
            "intermediate 0",
            |g| g.intermediate = 0,
            EPLB_AICPU_FIELD_GATE_INTERMEDIATE,
        ),
        ("top-k 0", |g| g.top_k = 0, EPLB_AICPU_FIELD_GATE_TOP_K),
        (
            "top-k > N",
            |g| g.top_k = N + 1,
            EPLB_AICPU_FIELD_GATE_TOP_K,
        ),
        ("dtype 4", |g| g.dtype = 4, EPLB_AICPU_FIELD_GATE_DTYPE),
        (
            "routing 2",
            |g| g.routing = 2,
            EPLB_AICPU_FIELD_GATE_ROUTING,
        ),
        (
            "tokens NaN",
            |g| g.tokens_per_rank = f64::NAN,
            EPLB_AICPU_FIELD_GATE_TOKENS_PER_RANK,
        ),
        (
            "bytes -1",
            |g| g.expert_bytes = -1.0,
            EPLB_AICPU_FIELD_GATE_EXPERT_BYTES,
        ),
        (
            "intervals 0",
            |g| (g.heat_interval, g.algo_interval) = (0, 0),
            EPLB_AICPU_FIELD_GATE_INTERVALS,
        ),
    ];
    let mut b = gated_bufs(policy);
    for (what, edit, field) in cases {
        let mut g = ok;
        edit(&mut g);
        let mut a = gated_args(&mut b, policy, g);
        a.gate_result.stall_ms = 1.0;
        assert_eq!(call(&mut a), EPLB_AICPU_E_GATE, "{what}");
        assert_eq!(a.result.field, field, "{what}");
        assert_eq!(a.gate_result, EplbAicpuGateResult::default(), "{what}");
    }
    // A double's detail is its bits.
    let mut g = ok;
    g.hbm_bytes_per_s = -2.5;
    let mut a = gated_args(&mut b, policy, g);
    assert_eq!(call(&mut a), EPLB_AICPU_E_GATE);
    assert_eq!(f64::from_bits(a.result.detail), -2.5);
    // The flag itself.
    let mut a = gated_args(&mut b, policy, ok);
    a.payoff_gate = 2;
    assert_eq!(call(&mut a), EPLB_AICPU_E_GATE);
    assert_eq!(
        (a.result.field, a.result.detail),
        (EPLB_AICPU_FIELD_PAYOFF_GATE, 2)
    );
    // Zeros in `experts` and `moe_layers` take the shape's; fp4 0 and zero times are valid.
    let mut g = ok;
    (g.experts, g.moe_layers, g.flops_fp4) = (0, 0, 0.0);
    (g.layer_overhead_ms, g.collective_ms, g.expert_bytes) = (0.0, 0.0, 0.0);
    let mut a = gated_args(&mut b, policy, g);
    assert_eq!(call(&mut a), EPLB_AICPU_OK, "{:?}", a.result);
    // The gate-off sizes are too small with the gate on.
    let mut small = bufs(policy);
    let mut a = gated_args(&mut small, policy, ok);
    assert_eq!(call(&mut a), EPLB_AICPU_E_SCRATCH);
    assert_eq!(
        a.result.detail,
        eplb_aicpu_scratch_len_v2(L, N, R, S, 0, 0, policy, 1)
    );
    assert_eq!(eplb_aicpu_scratch_len_v2(L, N, R, S, 0, 0, policy, 2), 0);
}

/// Rank `dead` gone: `bufs`'s placement (expert `i % N` at slot `i`) with that rank's slots
/// EMPTY, buffers sized for a live set, and the live flags. For rank 1, experts 4 and 5 lose
/// their only copy in layers 0 and 2.
fn live_bufs(policy: u32, dead: usize) -> (Bufs, Vec<u8>) {
    let mut b = bufs(policy);
    let s = usize::from(S);
    for layer in b.current.chunks_exact_mut(usize::from(R * S)) {
        layer[dead * s..(dead + 1) * s].fill(EPLB_AICPU_EMPTY);
    }
    b.scratch = vec![0; eplb_aicpu_scratch_len_v3(L, N, R, S, 0, 0, policy, 0, 1) as usize];
    b.state = vec![0; eplb_aicpu_state_len_v3(L, N, R, S, 0, 0, policy, 0, 1) as usize];
    let mut live = vec![1u8; usize::from(R)];
    live[dead] = 0;
    (b, live)
}

#[test]
fn a_live_set_plans_over_the_live_ranks_as_the_rust_api() {
    let shape = Shape::new(L, N, R, S).unwrap();
    for policy in 0..=5 {
        let (mut b, flags) = live_bufs(policy, 1);
        let mut a = args(&mut b, policy);
        a.live = flags.as_ptr();
        a.live_len = flags.len() as u64;
        a.reloads = 0xDEAD;
        assert_eq!(
            call(&mut a),
            EPLB_AICPU_OK,
            "policy {policy}: {:?}",
            a.result
        );

        let mut p = AnyPolicy::new(policy_kind(policy).unwrap());
        let lens = eplb_policies::buffer_lens(&p, &shape).unwrap();
        assert_eq!(lens.scratch as u64, a.scratch_len);
        assert_eq!(
            eplb_aicpu_scratch_len_v3(L, N, R, S, 0, 0, policy, 0, 0),
            eplb_aicpu_scratch_len_v2(L, N, R, S, 0, 0, policy, 0)
        );
        let (mut scratch, mut state) = (vec![0; lens.scratch], vec![0; lens.state]);
        let (mut out, mut changed) = (vec![0; b.out.len()], vec![false; usize::from(L)]);
        let (mut before, mut after) = (vec![0.0; usize::from(L)], vec![0.0; usize::from(L)]);
        let live = eplb_policies::LiveSet::from_flags(&[true, false, true, true]).unwrap();
        let input = eplb_policies::Input::new(
            eplb_core::Placement::with_live(shape, &b.current, &live).unwrap(),
            &b.loads,
            None,
            3,
        )
        .unwrap();
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
        assert_eq!((b.before, b.after), (before, after));
        assert_eq!(b.state, state);
        assert_eq!(a.result.moves, summary.moves as u64);
        assert_eq!(a.reloads, summary.reloads as u64);
        // Experts 4 and 5 had their only copy on rank 1 in layers 0 and 2: reloaded.
        assert!(a.reloads >= 4, "policy {policy}: {}", a.reloads);
        for layer in out.chunks_exact(usize::from(R * S)) {
            assert!(layer[3..6].iter().all(|&e| e == EPLB_AICPU_EMPTY));
            for e in 0..N {
                assert!(layer.contains(&e), "policy {policy}: expert {e} lost");
            }
        }
    }
}

#[test]
fn bad_live_sets_give_their_status() {
    let (mut b, mut flags) = live_bufs(EPLB_AICPU_POLICY_DEFAULT, 1);
    let mut a = args(&mut b, EPLB_AICPU_POLICY_DEFAULT);
    let with = |a: &mut EplbAicpuArgs, f: &[u8]| {
        a.live = f.as_ptr();
        a.live_len = f.len() as u64;
    };
    // A byte other than 0 or 1.
    flags[2] = 2;
    with(&mut a, &flags);
    assert_eq!(call(&mut a), EPLB_AICPU_E_LIVE);
    assert_eq!(
        (a.result.field, a.result.detail),
        (EPLB_AICPU_FIELD_LIVE, 2)
    );
    assert_eq!(a.reloads, 0);
    // Too few live ranks: 2 x 3 slots < 8 experts (ranks 1 and 2 gone).
    flags[2] = 0;
    with(&mut a, &flags);
    assert_eq!(call(&mut a), EPLB_AICPU_E_LIVE);
    assert_eq!(a.result.detail, 2);
    // A dead rank still holding experts: the current placement is refused (layer 0).
    flags[2] = 1;
    let mut full = bufs(EPLB_AICPU_POLICY_DEFAULT);
    full.scratch = b.scratch.clone();
    let mut a2 = args(&mut full, EPLB_AICPU_POLICY_DEFAULT);
    with(&mut a2, &flags);
    assert_eq!(call(&mut a2), EPLB_AICPU_E_PLACEMENT);
    assert_eq!(a2.result.field, EPLB_AICPU_FIELD_CURRENT);
    // A short mask.
    with(&mut a, &flags[..3]);
    assert_eq!(call(&mut a), EPLB_AICPU_E_TOO_SHORT);
    assert_eq!(a.result.field, EPLB_AICPU_FIELD_LIVE);
    // EMPTY without a live set: not a valid placement.
    let mut a3 = args(&mut b, EPLB_AICPU_POLICY_DEFAULT);
    assert_eq!(call(&mut a3), EPLB_AICPU_E_PLACEMENT);
    // The gate and a live set do not combine.
    let mut a4 = args(&mut b, EPLB_AICPU_POLICY_DEFAULT);
    with(&mut a4, &flags);
    a4.payoff_gate = 1;
    a4.gate = gate_block(&small_model(1e6), Routing::Log2Phy, 10, 1);
    assert_eq!(call(&mut a4), EPLB_AICPU_E_LIVE);
    assert_eq!(a4.result.field, EPLB_AICPU_FIELD_PAYOFF_GATE);
    assert_eq!(eplb_aicpu_scratch_len_v3(L, N, R, S, 0, 0, 1, 1, 1), 0);
    assert_eq!(eplb_aicpu_scratch_len_v3(L, N, R, S, 0, 0, 1, 0, 2), 0);
    // One sizing serves every live set (`eplb_policies::scratch_len`): a scratch of the
    // version 2 size is the live path's too.
    let whole = eplb_aicpu_scratch_len_v2(L, N, R, S, 0, 0, 1, 0);
    let live = eplb_aicpu_scratch_len_v3(L, N, R, S, 0, 0, 1, 0, 1);
    assert_eq!(live, whole);
}

#[test]
fn a_version_2_block_behaves_as_before_and_touches_nothing_beyond_it() {
    for policy in 0..=5 {
        let mut b3 = bufs(policy);
        let mut a3 = args(&mut b3, policy);
        assert_eq!(call(&mut a3), EPLB_AICPU_OK, "policy {policy}");
        assert_eq!(a3.reloads, 0);
        let mut b2 = bufs(policy);
        let mut a2 = args(&mut b2, policy);
        a2.version = 2;
        a2.struct_size = EPLB_AICPU_ARGS_V2_SIZE;
        // Beyond a version 2 block: a bad live mask pointer is never read, reloads never written.
        a2.live = ptr::dangling();
        a2.live_len = 1;
        a2.reloads = 0xBEEF;
        assert_eq!(
            call(&mut a2),
            EPLB_AICPU_OK,
            "policy {policy}: {:?}",
            a2.result
        );
        assert_eq!(a2.reloads, 0xBEEF);
        assert_eq!(a2.result, a3.result);
        assert_eq!((b2.out, b2.changed), (b3.out, b3.changed));
        assert_eq!(b2.state, b3.state);
    }
}
