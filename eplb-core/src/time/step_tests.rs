use super::step::*;
use super::{Dtype, Hardware, ModelSpec, Role, TimeModel};
use crate::Error;

fn model(hw: Hardware, role: Role, tokens: f64) -> StepModel {
    let mut spec = ModelSpec::DEEPSEEK_V3;
    spec.dtype = Dtype::Fp8;
    let mut tm = TimeModel::new(hw, spec, role, 44e6);
    tm.tokens_per_rank = tokens;
    StepModel::new(tm, role)
}

#[test]
fn the_latency_is_never_multiplied_by_the_skew() {
    for role in Role::ALL {
        let m = model(Hardware::H800, role, 256.0);
        let a = m.moe_layer_par(32, 1.0).unwrap();
        let b = m.moe_layer_par(32, 3.0).unwrap();
        assert_eq!(a.a2a_latency_ms, b.a2a_latency_ms);
        assert!(a.a2a_latency_ms > 0.0);
        assert!(b.a2a_bw_ms > a.a2a_bw_ms, "{role:?}: {a:?} {b:?}");
        assert!(b.gemm_ms > a.gemm_ms, "{role:?}");
    }
}

#[test]
fn decode_gemm_follows_the_active_experts_and_the_hottest_copy() {
    let m = model(Hardware::H800, Role::Decode, 8.0);
    // 4 slots per rank on 2 ranks: one rank holds a single hot copy, the other spreads.
    let hot = [64.0, 0.0, 0.0, 0.0, 16.0, 16.0, 16.0, 16.0];
    let t = m.moe_layer(0, 2, 4, &hot).unwrap();
    // The spread rank reads four experts' weights: it is the busiest in decode.
    assert_eq!(t.busiest_rank, 1);
    assert!((t.active_copies - 4.0).abs() < 0.1, "{t:?}");
    // Prefill with many tokens: the hot copy's rows dominate.
    let p = model(Hardware::H800, Role::Prefill, 65536.0);
    let hot = [96.0, 0.0, 0.0, 0.0, 8.0, 8.0, 8.0, 8.0];
    let t = p.moe_layer(0, 2, 4, &hot).unwrap();
    assert_eq!(t.busiest_rank, 0);
}

#[test]
fn prefill_crosses_to_each_destination_node_once_and_respects_the_node_limit() {
    let m = model(Hardware::H800, Role::Prefill, 4096.0);
    let mut free = m;
    free.arch.node_limit = 0;
    // EP64 = 8 nodes: a token reaches 8 (1 - (7/8)^8) = 5.2 nodes unlimited, 4 when limited.
    let a = m.moe_layer_par(64, 1.0).unwrap().a2a_bw_ms;
    let b = free.moe_layer_par(64, 1.0).unwrap().a2a_bw_ms;
    assert!((b / a - 5.25 / 4.0).abs() < 0.05, "{a} {b}");
    let payload = dispatch_payload(7168, Dtype::Fp8) + combine_payload(7168);
    let want = 4096.0 * 4.0 * 7.0 / 8.0 * payload / 50e9 * 1e3;
    assert!((a - want).abs() / want < 1e-9, "{a} {want}");
    // Fewer bytes than one message per pair (the low-latency kernel).
    let d = model(Hardware::H800, Role::Decode, 4096.0);
    assert!(d.moe_layer_par(64, 1.0).unwrap().a2a_bw_ms > 1.5 * a);
}

#[test]
fn two_batch_overlap_hides_communication_and_pays_twice_the_latency() {
    let mut m = model(Hardware::H800, Role::Prefill, 16384.0);
    let none = m.step_par(32, 1.0).unwrap();
    m.overlap = Overlap::TwoBatch;
    let two = m.step_par(32, 1.0).unwrap();
    assert!(two.iteration_ms < none.iteration_ms);
    assert!(two.hidden_ms > 0.0 && none.hidden_ms == 0.0);
    assert!((two.a2a_latency_ms - 2.0 * none.a2a_latency_ms).abs() < 1e-9);
    let parts = none.moe_ms + none.attention_ms + none.other_ms;
    assert!((parts - none.iteration_ms).abs() < 1e-6 * parts);
}

#[test]
fn fused_mc2_overlaps_the_transfer_with_the_gemm() {
    let mut m = model(Hardware::A3, Role::Decode, 128.0);
    assert!(m.topology.fused_mc2);
    let fused = m.step_par(32, 1.0).unwrap();
    m.topology.fused_mc2 = false;
    let plain = m.step_par(32, 1.0).unwrap();
    assert!(fused.iteration_ms < plain.iteration_ms);
    assert_eq!(fused.moe_ms, plain.moe_ms);
}

#[test]
fn the_a3_superpod_reaches_other_nodes_over_ub_not_roce() {
    let m = model(Hardware::A3, Role::Decode, 128.0);
    assert_eq!(m.topology.ranks_per_node, 16);
    assert_eq!(m.topology.domain_ranks, 768);
    assert!(m.inter_node_bytes_per_s(64) > 4.0 * Hardware::A3.inter_node_bytes_per_s);
    let h = model(Hardware::H100, Role::Decode, 128.0);
    assert_eq!(
        h.inter_node_bytes_per_s(64),
        Hardware::H100.inter_node_bytes_per_s
    );
    // One link for moves and all-to-all: a crossing exchange uses the same link.
    let ms = m.exchange_ms(1e9, true, 64);
    assert!((ms - 1e9 / m.inter_node_bytes_per_s(64) * 1e3).abs() < 1e-9);
}

#[test]
fn terms_recompose_and_the_band_brackets_the_centre() {
    let m = model(Hardware::H800, Role::Decode, 128.0);
    let loads: std::vec::Vec<f64> = (0..3 * 32 * 8).map(|i| f64::from(i % 17 + 1)).collect();
    let mut terms = std::vec![MoeTerms::default(); 3];
    let st = m.step(32, 8, &loads, &mut terms).unwrap();
    let again = m.step_from_terms(&terms, &Calibration::PRESET).unwrap();
    assert_eq!(st, again);
    let (fast, slow) = Calibration::PRESET.band(false);
    let lo = m.step_from_terms(&terms, &fast).unwrap();
    let hi = m.step_from_terms(&terms, &slow).unwrap();
    assert!(lo.iteration_ms < st.iteration_ms && st.iteration_ms < hi.iteration_ms);
    let (cf, cs) = Calibration::PRESET.band(true);
    let clo = m.step_from_terms(&terms, &cf).unwrap();
    let chi = m.step_from_terms(&terms, &cs).unwrap();
    assert!(chi.iteration_ms - clo.iteration_ms < hi.iteration_ms - lo.iteration_ms);
    // Three trace layers stand for the model's 58.
    let one = m.step(32, 8, &loads[..256], &mut []).unwrap();
    assert!(one.iteration_ms > 0.0);
}

#[test]
fn bad_inputs_are_named_errors() {
    let m = model(Hardware::H800, Role::Decode, 128.0);
    assert!(matches!(
        m.moe_layer_par(32, 0.5),
        Err(Error::BadParameter { .. })
    ));
    assert!(matches!(
        m.moe_layer_par(32, f64::NAN),
        Err(Error::BadParameter { .. })
    ));
    assert!(matches!(
        m.moe_layer_par(0, 1.0),
        Err(Error::ZeroDimension { .. })
    ));
    let mut bad = m;
    bad.requests_per_rank = f64::NAN;
    assert!(bad.step_par(8, 1.0).is_err());
    let mut bad = m;
    bad.topology.link_efficiency = 1.5;
    assert!(bad.check().is_err());
    let mut bad = m;
    bad.calibration.gemm = -1.0;
    assert!(bad.check().is_err());
    assert!(matches!(
        m.moe_layer(3, 2, 2, &[1.0, f64::NAN, 0.0, 0.0]),
        Err(Error::BadSlotLoad {
            layer: 3,
            rank: 0,
            slot: 1
        })
    ));
    assert!(m.step(2, 2, &[1.0; 5], &mut []).is_err());
    assert_eq!(Overlap::from_name("TBO"), Some(Overlap::TwoBatch));
    assert_eq!(Overlap::from_name("x"), None);
}

#[test]
fn every_model_preset_has_an_architecture() {
    for m in ModelSpec::ALL {
        let a = Arch::for_model(&m);
        assert!(a.layers >= m.moe_layers, "{}", m.name);
        assert!(a.attention_params(m.hidden) > 0.0);
        let tm = TimeModel::new(Hardware::H100, m, Role::Decode, 1e6);
        let st = StepModel::new(tm, Role::Decode).step_par(8, 1.0).unwrap();
        assert!(
            st.attention_ms > 0.0 && st.iteration_ms > st.moe_ms,
            "{}",
            m.name
        );
    }
}

/// Prefill's normal kernels send a token once per distinct destination node and forward it once
/// per distinct destination GPU: a second hot expert on a node a token already reaches adds
/// no scale-out bytes, so expert-level skew reaches the scale-out leg only through the busiest
/// node's distinct tokens, which saturate.
#[test]
fn prefill_skew_reaches_the_scale_out_link_through_distinct_tokens() {
    let mut m = model(Hardware::H800, Role::Prefill, 4096.0);
    // The scale-out leg alone (a scale-up link that never binds).
    m.time.hardware.intra_node_bytes_per_s = 1e15;
    // EP16 = 2 nodes of 8, one slot per rank; all loads as shares.
    let balanced = [1.0; 16];
    let mut hot_node = [1.0; 16];
    for w in &mut hot_node[..8] {
        *w = 3.0;
    }
    let a = m.moe_layer(0, 16, 1, &balanced).unwrap();
    let b = m.moe_layer(0, 16, 1, &hot_node).unwrap();
    // Node 0 carries 1.5x the mean node's pairs; its distinct tokens barely grow (a token
    // reaches a node of 8 such copies almost surely either way).
    let ratio = b.a2a_bw_ms / a.a2a_bw_ms;
    assert!(ratio > 1.0 && ratio < 1.01, "{ratio}");
    // The balanced figure: a token reaches each copy with probability k / 16 = 1/2, a node
    // (8 copies) with 1 - (1/2)^8, the other node half the time for remote sends.
    let payload = dispatch_payload(7168, Dtype::Fp8) + combine_payload(7168);
    let node = 1.0 - 0.5f64.powi(8);
    let want = 4096.0 * 0.5 * 2.0 * node * payload / 50e9 * 1e3;
    assert!(
        (a.a2a_bw_ms - want).abs() / want < 1e-9,
        "{} {want}",
        a.a2a_bw_ms
    );
    // The per-PAR form agrees with the per-slot form on a balanced layer.
    let mut spec = ModelSpec::DEEPSEEK_V3;
    spec.dtype = Dtype::Fp8;
    let mut tm = TimeModel::new(Hardware::H800, spec, Role::Prefill, 44e6);
    tm.tokens_per_rank = 4096.0;
    let p = StepModel::new(tm, Role::Prefill);
    // The scale-up leg follows the busiest GPU's distinct tokens: 1 - (31/32)^8 of all.
    let gpu = 1.0 - (31.0f64 / 32.0).powi(8);
    let intra = 4096.0 * 32.0 * gpu * 7.0 / 8.0 * payload / (200e9 * 0.75) * 1e3;
    let mut nv = p;
    nv.time.hardware.inter_node_bytes_per_s = 1e15;
    let got = nv.moe_layer_par(32, 1.0).unwrap().a2a_bw_ms;
    assert!((got - intra).abs() / intra < 1e-9, "{got} {intra}");
    let by_par = p.moe_layer_par(32, 1.0).unwrap();
    let by_slot = p.moe_layer(0, 32, 8, &[1.0; 256]).unwrap();
    assert!((by_par.a2a_bw_ms - by_slot.a2a_bw_ms).abs() < 1e-9 * by_par.a2a_bw_ms);
}

/// The element-wise kernels stream their bytes at the attention kernel's share of HBM, or cost
/// the launch floor when they are too small to fill it (decode at a few tokens).
#[test]
fn element_wise_kernels_stream_their_bytes_or_cost_the_launch_floor() {
    let p = model(Hardware::H800, Role::Prefill, 16384.0);
    let (moe, dense) = p.arch.elementwise_bytes(&p.time.model, Role::Prefill);
    // DeepSeek-V3 fp8 prefill: about 0.8 MB per token per MoE layer.
    assert!((700e3..900e3).contains(&moe), "{moe}");
    assert!(dense > 0.0 && dense < moe);
    let b = p.backbone().unwrap();
    let want = moe * 16384.0 / (ATTENTION_MEMORY_EFFICIENCY * Hardware::H800.hbm_bytes_per_s) * 1e3;
    assert!((b.moe_layer_elementwise_ms - want).abs() < 1e-9 * want);
    let (decode_moe, _) = p.arch.elementwise_bytes(&p.time.model, Role::Decode);
    assert!(decode_moe < moe, "no permutation in decode");
    let d = model(Hardware::H800, Role::Decode, 8.0);
    assert_eq!(
        d.backbone().unwrap().moe_layer_elementwise_ms,
        Hardware::H800.layer_overhead_ms
    );
}

/// While the normal kernels run beside the other micro-batch they hold SMs: prefill compute
/// under two-batch overlap runs on `1 - comm_sm_share` of the GPU; decode's low-latency
/// kernels hold none.
#[test]
fn two_batch_prefill_compute_keeps_the_sms_the_normal_kernels_leave() {
    let mut m = model(Hardware::H800, Role::Prefill, 16384.0);
    m.overlap = Overlap::TwoBatch;
    assert!((m.overlapped_compute_share() - 108.0 / 132.0).abs() < 1e-12);
    let with = m.step_par(32, 1.0).unwrap();
    m.topology.comm_sm_share = 0.0;
    let without = m.step_par(32, 1.0).unwrap();
    assert!(with.iteration_ms > without.iteration_ms);
    let mut d = model(Hardware::H800, Role::Decode, 128.0);
    d.overlap = Overlap::TwoBatch;
    assert_eq!(d.overlapped_compute_share(), 1.0);
    m.topology.comm_sm_share = 1.0;
    assert!(m.check().is_err());
}
