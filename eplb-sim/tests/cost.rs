//! The cost estimate: expert copies fetched, the busiest rank's bytes, and the time at the
//! seed's links.

use eplb_core::Shape;
use eplb_core::time::ModelSpec;
use eplb_runtime::config::deployment::QuantType;
use eplb_sim::cost::{CostError, CostSpec, Link, move_cost, sequence_cost};

#[test]
fn move_cost_counts_fetched_copies_and_the_busiest_rank() {
    // 1 layer, 4 experts, 2 ranks x 3 slots.
    let shape = Shape::new(1, 4, 2, 3).unwrap();
    let old = [0, 1, 2, 3, 0, 1];
    // Rank 0 fetches 3 (from rank 1); rank 1 fetches 2 (from rank 0) and keeps 0, 1... drops 3.
    let new = [0, 1, 3, 2, 0, 1];
    let c = move_cost(&shape, &old, &new, 1000).unwrap();
    assert_eq!(c.transfers(), 2);
    assert_eq!(c.bytes_moved(), 2000);
    assert_eq!(c.bytes_per_layer(), vec![2000]);
    // Each rank sends one and receives one: 1000 bytes on the busiest link.
    assert_eq!(c.layers[0].max_rank_bytes, 1000);
    let link = "8gbps".parse::<Link>().unwrap();
    assert!((c.transfer_ms(&link) - 0.001).abs() < 1e-12);
    assert_eq!(
        eplb_core::metrics::moves(&old, &new, 3),
        c.transfers(),
        "the cost counts what metrics::moves counts"
    );
    // Unchanged placement: nothing.
    let same = move_cost(&shape, &old, &old, 1000).unwrap();
    assert_eq!(same.bytes_moved(), 0);
    assert_eq!(same.transfer_ms(&link), 0.0);
    // A sequence of three placements: two steps.
    let steps = sequence_cost(&shape, [&old[..], &new[..], &old[..]], 10).unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[1].bytes_moved(), 20);
    assert!(move_cost(&shape, &old, &new[..5], 1).is_err());
}

#[test]
fn one_deepseek_w8a8_expert_at_the_seed_links() {
    let basis = CostSpec::default().resolve().unwrap();
    assert_eq!(basis.defaulted, vec!["model", "quant", "link"]);
    assert_eq!(basis.payload.total_bytes(), 44_085_248);
    let bytes = basis.payload.total_bytes() as u64;
    // About 35 ms at 10 Gbit/s, about 0.8 ms over HCCS (research/seed-usage-rules.md).
    let ten = basis.link.ms(bytes);
    assert!((ten - 35.268).abs() < 0.01, "{ten}");
    let hccs = Link::hccs().ms(bytes);
    assert!((hccs - 0.787).abs() < 0.01, "{hccs}");
    assert!((Link::roce().ms(bytes) - 1.763).abs() < 0.01);
    assert!(
        basis.describe().starts_with(
            "payload: DeepSeek-V3/R1 (H=7168, I=2048) W8A8, 42.04 MiB per expert (44085248 bytes, 4 tensors); link 10gbps (10 Gbit/s per rank) [default model, quant, link"
        ),
        "{}",
        basis.describe()
    );
    let spec = CostSpec {
        hidden: Some(7168),
        ..CostSpec::default()
    };
    assert_eq!(spec.resolve().unwrap_err(), CostError::SizesApart);
    let spec = CostSpec {
        model: Some(ModelSpec::QWEN3_30B),
        quant: Some(QuantType::W4A8),
        ..CostSpec::default()
    };
    assert!(
        spec.resolve()
            .unwrap_err()
            .to_string()
            .contains("W4A8 without fused MC2")
    );
}
