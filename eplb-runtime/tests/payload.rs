//! Expert payloads: the tensor table and sizes per quant type and model, and every quant type's
//! payload moved by the real controllers over the host transport: after every commit, every
//! tensor (weights and scales) of every slot holds the canonical bytes of the expert the
//! placement names, so weights and scales arrive together, byte-exact. (The cost estimate is
//! `eplb-sim`'s.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use eplb_core::{HeatStage, ReplicaChoice, StageClassifier};
use eplb_policies::PolicyKind;
use eplb_runtime::config::deployment::QuantType;
use eplb_runtime::controller::{Controller, ControllerConfig, MachineConfig, RunMode};
use eplb_runtime::payload::{Element, ExpertPayload, ModelDims, PayloadError};
use eplb_runtime::planner::Planner;
use eplb_runtime::policies::policy_for;
use eplb_runtime::transport::host::{
    HostTransport, HostWorld, canonical_expert_bytes, canonical_payload_bytes,
    canonical_tensor_bytes,
};

const MIB: usize = 1024 * 1024;

/// DeepSeek-V3/R1's expert: `H = 7168`, `I = 2048`.
const DSV3: ModelDims = ModelDims {
    hidden: 7168,
    intermediate: 2048,
};
/// Qwen3-235B-A22B's expert: `H = 4096`, `I = 1536`.
const QWEN3_235B: ModelDims = ModelDims {
    hidden: 4096,
    intermediate: 1536,
};
/// Qwen3-30B-A3B's expert: `H = 2048`, `I = 768`.
const QWEN3_30B: ModelDims = ModelDims {
    hidden: 2048,
    intermediate: 768,
};

fn table(p: &ExpertPayload) -> Vec<(&str, Element, usize, usize)> {
    p.tensors()
        .iter()
        .map(|t| (t.name(), t.element(), t.bytes(), t.offset()))
        .collect()
}

#[test]
fn seed_sizes_of_the_w8a8_presets() {
    // (model, weights, fp32 scales): research/seed-usage-rules.md.
    for (m, weights, scales) in [
        (DSV3, 42 * MIB, 44 * 1024),
        (QWEN3_235B, 18 * MIB, 28 * 1024),
        (QWEN3_30B, 9 * MIB / 2, 14 * 1024),
    ] {
        let p = ExpertPayload::for_quant(m, QuantType::W8A8, false).unwrap();
        let w: usize = p
            .tensors()
            .iter()
            .filter(|t| t.element() == Element::Int8)
            .map(|t| t.bytes())
            .sum();
        assert_eq!(w, weights, "{m:?}");
        assert_eq!(p.total_bytes() - w, scales, "{m:?}");
    }
    assert_eq!(
        ExpertPayload::for_quant(DSV3, QuantType::W8A8, false)
            .unwrap()
            .total_bytes(),
        44_085_248
    );
}

#[test]
fn deepseek_tensor_tables() {
    let d = DSV3;
    let (w13, w2) = (2 * 2048 * 7168, 7168 * 2048);
    let p = |q, f| ExpertPayload::for_quant(d, q, f).unwrap();
    assert_eq!(
        table(&p(QuantType::None, false)),
        vec![
            ("w13_weight", Element::Bf16, 2 * w13, 0),
            ("w2_weight", Element::Bf16, 2 * w2, 2 * w13),
        ]
    );
    assert_eq!(
        table(&p(QuantType::None, true)),
        vec![
            ("w13_weight_list", Element::Bf16, 2 * w13, 0),
            ("w2_weight_list", Element::Bf16, 2 * w2, 2 * w13),
        ]
    );
    let w8 = vec![
        ("w13_weight_list", Element::Int8, w13, 0),
        ("w2_weight_list", Element::Int8, w2, w13),
        (
            "w13_weight_scale_fp32_list",
            Element::Fp32,
            4 * 4096,
            w13 + w2,
        ),
        (
            "w2_weight_scale_list",
            Element::Fp32,
            4 * 7168,
            w13 + w2 + 16384,
        ),
    ];
    assert_eq!(table(&p(QuantType::W8A8, false)), w8);
    assert_eq!(table(&p(QuantType::W8A8Dynamic, false)), w8);
    let mut fused = w8.clone();
    fused.push((
        "fused_w1_scale_list",
        Element::Fp32,
        4 * 4096,
        w13 + w2 + 45056,
    ));
    fused.push((
        "fused_w2_scale_list",
        Element::Fp32,
        4 * 7168,
        w13 + w2 + 45056 + 16384,
    ));
    assert_eq!(table(&p(QuantType::W8A8, true)), fused);
    assert_eq!(
        table(&p(QuantType::W4A8, true)),
        vec![
            ("w13_weight_list", Element::Int4, w13 / 2, 0),
            ("w2_weight_list", Element::Int4, w2 / 2, w13 / 2),
            (
                "w13_weight_scale_list",
                Element::Fp32,
                16384,
                (w13 + w2) / 2
            ),
            (
                "w2_weight_scale_list",
                Element::Fp32,
                28672,
                (w13 + w2) / 2 + 16384
            ),
            (
                "w13_scale_bias_list",
                Element::Fp32,
                16384,
                (w13 + w2) / 2 + 45056
            ),
            (
                "w2_scale_bias_list",
                Element::Fp32,
                28672,
                (w13 + w2) / 2 + 45056 + 16384
            ),
        ]
    );
    // MX: one e8m0 scale per 32 elements along the reduction dimension.
    let (s13, s2) = (4096 * (7168 / 32), 7168 * (2048 / 32));
    assert_eq!(
        table(&p(QuantType::Mxfp4, false)),
        vec![
            ("w13_weight", Element::Fp4, w13 / 2, 0),
            ("w2_weight", Element::Fp4, w2 / 2, w13 / 2),
            ("w13_weight_scale", Element::E8m0, s13, (w13 + w2) / 2),
            ("w2_weight_scale", Element::E8m0, s2, (w13 + w2) / 2 + s13),
        ]
    );
    assert_eq!(
        table(&p(QuantType::Mxfp8, false)),
        vec![
            ("w13_weight", Element::Fp8, w13, 0),
            ("w2_weight", Element::Fp8, w2, w13),
            ("w13_weight_scale", Element::E8m0, s13, w13 + w2),
            ("w2_weight_scale", Element::E8m0, s2, w13 + w2 + s13),
        ]
    );
    assert_eq!(p(QuantType::Mxfp4, false).total_bytes(), 23_396_352);
}

#[test]
fn unsupported_types_have_no_payload_and_bad_tables_are_errors() {
    let d = QWEN3_30B;
    for (q, f) in [
        (QuantType::W4A8, false),
        (QuantType::W4A8Mxfp4, false),
        (QuantType::W4A16, true),
        (QuantType::W4A16Mxfp4, false),
    ] {
        assert_eq!(
            ExpertPayload::for_quant(d, q, f),
            Err(PayloadError::Unsupported {
                quant: q,
                fused_mc2: f
            })
        );
    }
    assert_eq!(
        ExpertPayload::for_quant(d, QuantType::W4A16, false)
            .unwrap_err()
            .to_string(),
        "EPLB moves no expert payload for quant type W4A16 without fused MC2 (not supported by EPLB)"
    );
    let zero = ModelDims {
        hidden: 0,
        intermediate: 8,
    };
    assert_eq!(
        ExpertPayload::for_quant(zero, QuantType::W8A8, false)
            .unwrap_err()
            .to_string(),
        "model dimension hidden must be at least 1"
    );
    let huge = ModelDims {
        hidden: u64::MAX / 2,
        intermediate: u64::MAX / 2,
    };
    assert!(matches!(
        ExpertPayload::for_quant(huge, QuantType::W8A8, false),
        Err(PayloadError::Overflow { .. })
    ));
    assert_eq!(
        ExpertPayload::from_bytes(Vec::<(&str, usize)>::new()),
        Err(PayloadError::Empty)
    );
    assert_eq!(
        ExpertPayload::from_bytes([("w", 4), ("w", 4)])
            .unwrap_err()
            .to_string(),
        "expert payload: tensor \"w\" listed twice"
    );
    assert_eq!(
        ExpertPayload::from_bytes([("w", 4), ("s", 0)])
            .unwrap_err()
            .to_string(),
        "expert payload: tensor \"s\" has no bytes"
    );
    assert!(matches!(
        ExpertPayload::from_bytes([("a", usize::MAX), ("b", 1)]),
        Err(PayloadError::Overflow { .. })
    ));
    let p = ExpertPayload::from_bytes([("w", 5), ("s", 3)]).unwrap();
    let blob: Vec<u8> = (0..8).collect();
    let parts = p.split(&blob).unwrap();
    assert_eq!(parts[0].1, &[0, 1, 2, 3, 4]);
    assert_eq!(parts[1].1, &[5, 6, 7]);
    assert!(p.split(&blob[..7]).is_none());
    assert_eq!(p.tensor("s").unwrap().range(), 5..8);
}

#[test]
fn canonical_bytes_differ_per_tensor_and_expert() {
    let p = ExpertPayload::from_bytes([("w13", 64), ("w13_scale", 64)]).unwrap();
    let a = canonical_payload_bytes(0, 1, &p);
    assert_eq!(a.len(), 128);
    assert_ne!(a[..64], a[64..]);
    assert_eq!(a[..64], canonical_tensor_bytes(0, 1, "w13", 64)[..]);
    assert_ne!(a, canonical_payload_bytes(0, 2, &p));
    assert_ne!(a, canonical_payload_bytes(1, 1, &p));
    // The opaque form differs per layer too.
    assert_eq!(canonical_expert_bytes(0, 1, 8).len(), 8);
    assert_ne!(
        canonical_expert_bytes(0, 1, 8),
        canonical_expert_bytes(1, 1, 8)
    );
}

const R: usize = 8;

/// Every tensor of every slot holds the canonical bytes of the expert the placement names,
/// and the expert map points at a slot holding that expert's whole payload.
fn check_tensors(c: &Controller<HostTransport>, payload: &ExpertPayload) -> usize {
    let shape = *c.shape();
    let (s, per) = (shape.slots_per_rank(), shape.slots_per_layer());
    let rank = c.rank();
    let mut checked = 0;
    for l in 0..shape.layers() {
        let row = &c.placement()[l * per + rank * s..l * per + (rank + 1) * s];
        for (slot, &e) in row.iter().enumerate() {
            for t in payload.tensors() {
                assert_eq!(
                    c.transport().slot_tensor(l, slot, t.name()).unwrap(),
                    canonical_tensor_bytes(l, e, t.name(), t.bytes()).as_slice(),
                    "rank {rank} layer {l} slot {slot}: tensor {} is not expert {e}'s",
                    t.name()
                );
                checked += 1;
            }
        }
        for (e, &slot) in c.expert_map(l).iter().enumerate() {
            if slot >= 0 {
                assert_eq!(
                    c.transport().slot(l, slot as usize).unwrap(),
                    canonical_payload_bytes(l, e as u16, payload).as_slice(),
                    "rank {rank} layer {l}: the map sends expert {e} to slot {slot}"
                );
            }
        }
    }
    checked
}

/// Runs the dynamic cycle on R rank threads with `payload` slots; returns (layers committed,
/// tensors checked) of rank 0.
fn run_payload(payload: &ExpertPayload, kind: PolicyKind, iters: usize) -> (u64, usize) {
    let shape = common::small_shape();
    let initial = common::default_layout(&shape);
    let world = HostWorld::new(R, Duration::from_secs(5));
    let planner = Arc::new(Planner::spawn(policy_for(kind), shape));
    let cfg = ControllerConfig {
        machine: MachineConfig {
            heat_interval: 4,
            algo_interval: 2,
            stage: HeatStage::All,
            classifier: StageClassifier::new(8, 0),
            mode: RunMode::Dynamic,
            seed: 11,
            max_collective_failures: 3,
            atomic_collectives: true,
        },
        replica_choice: ReplicaChoice::Plain,
    };
    let threads: Vec<_> = (0..R)
        .map(|rank| {
            let rows = common::rank_rows(&shape, &initial, rank);
            let transport = HostTransport::with_payload(Arc::clone(&world), rank, &rows, payload);
            assert_eq!(transport.expert_bytes(), payload.total_bytes());
            assert_eq!(transport.payload(), Some(payload));
            let mut c = Controller::new(
                eplb_core::Placement::new(shape, &initial.clone()).unwrap(),
                cfg,
                transport,
                Arc::clone(&planner),
            )
            .unwrap();
            let payload = payload.clone();
            std::thread::spawn(move || {
                let mut checked = check_tensors(&c, &payload);
                // At least `iters` iterations, and on until 2 plans were taken: a loaded
                // machine makes plans late. Every rank sees the same plan count, so all stop
                // together.
                let mut it = 0;
                while it < iters || (c.stats().plans_taken < 2 && it < 20 * iters) {
                    c.before_forward();
                    let counts = common::slot_counts(&shape, c.placement(), rank, it, 50, it / 12);
                    let rep = c.after_forward(&counts, 64).unwrap();
                    if rep.committed.is_some() {
                        checked += check_tensors(&c, &payload);
                    }
                    if rep.plan_late {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    it += 1;
                }
                (c.placement().to_vec(), c.stats(), checked)
            })
        })
        .collect();
    let out: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for o in &out[1..] {
        assert_eq!(o.0, out[0].0, "ranks disagree on the placement");
    }
    let st = out[0].1;
    assert_eq!(st.layers_failed, 0);
    assert_eq!(st.plan_failures, 0);
    (st.layers_committed, out[0].2)
}

#[test]
fn every_quant_type_moves_weights_and_scales_together_byte_exact() {
    // Small dimensions (H = 64, I = 32) keep the blobs small; the layout is the real one.
    let dims = ModelDims {
        hidden: 64,
        intermediate: 32,
    };
    let mut runs = 0;
    for q in QuantType::ALL {
        for fused in [false, true] {
            let Ok(payload) = ExpertPayload::for_quant(dims, q, fused) else {
                continue;
            };
            // Policies that move experts every cycle, alternating.
            let kind = if runs % 2 == 0 {
                PolicyKind::Random
            } else {
                PolicyKind::Default
            };
            let (committed, checked) = run_payload(&payload, kind, 40);
            assert!(committed > 0, "{q} fused={fused}: nothing was committed");
            assert!(checked > 0);
            runs += 1;
        }
    }
    // none x2, W8A8 x2, W8A8-Dynamic x2, W4A8 fused, MXFP4 x2, MXFP8 x2.
    assert_eq!(runs, 11);
}
