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
