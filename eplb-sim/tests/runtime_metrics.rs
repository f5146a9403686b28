//! Issue 29: the metrics an 8-rank controller cluster (host transport, the demo trace) exports
//! agree with the machines' own counters, per rank, and per-layer series come only when asked.

use eplb_runtime::config::EplbConfig;
use eplb_runtime::metrics::encode_text;
use eplb_runtime::startup::ModelInfo;
use eplb_sim::cluster::{ClusterSpec, run_cluster};
use eplb_sim::cost::CostSpec;
use eplb_sim::{Replay, SimTrace};
use prometheus_client::registry::Registry;

const R: usize = 8;

fn demo() -> SimTrace {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/esft_chain.json");
    let bytes = std::fs::read(path).unwrap();
    Replay::load(&bytes, path, &CostSpec::default())
        .unwrap()
        .trace
}

fn run(metrics: serde_json::Value) -> (String, eplb_sim::cluster::ClusterRun) {
    let t = demo();
    let cfg = EplbConfig::from_value(
        &serde_json::json!({
            "dynamic_eplb": true,
            "expert_heat_collection_interval": 4,
            "algorithm_execution_interval": 2,
            "num_redundant_experts": 8,
            "eplb_policy_type": "default",
            "eplb_metrics": metrics,
        }),
        &[("DYNAMIC_EPLB", "true")],
    )
    .unwrap();
    let model = ModelInfo {
        layers: t.layers as u16,
        experts: t.experts as u16,
        ranks: R as u16,
        ranks_per_node: R as u16,
        groups: 1,
        max_num_seqs: 256,
        speculative_tokens: 0,
        tp_size: 1,
    };
    let spec = ClusterSpec {
        ranks: R as u16,
        expert_bytes: 16,
        metrics_expert_bytes: 1000,
        passes: 1,
        pace: None,
        resume_after: None,
    };
    let mut registry = Registry::default();
    let run = run_cluster(&t, &cfg, &model, &spec, Some(&mut registry)).unwrap();
    (encode_text(&registry).unwrap(), run)
}

fn value(text: &str, name: &str, labels: &str) -> f64 {
    let key = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .unwrap_or_else(|| panic!("no {key} in\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn every_ranks_metrics_agree_with_its_counters() {
    let (text, run) = run(serde_json::json!({"per_layer": true}));
    let walks = run.plans_taken.iter().filter(|&&(_, k)| k > 0).count() as f64;
    assert!(walks >= 2.0, "{:?}", run.plans_taken);
    let copies0 = value(&text, "eplb_expert_copies_moved_total", "rank=\"0\"");
    assert!(copies0 > 0.0);
    for (r, s) in run.stats.iter().enumerate() {
        let rank = format!("rank=\"{r}\"");
        let v = |name: &str| value(&text, name, &rank);
        assert_eq!(v("eplb_cycles_total"), s.plans_taken as f64);
        assert_eq!(v("eplb_layers_moved_total"), s.layers_committed as f64);
        assert_eq!(v("eplb_layers_aborted_total"), s.layers_failed as f64);
        assert_eq!(v("eplb_plans_late_total"), s.late_iterations as f64);
        assert_eq!(
            v("eplb_collectives_failed_total"),
            s.collective_failures as f64
        );
        assert_eq!(
            v("eplb_planner_duration_seconds_count"),
            s.plans_taken as f64
        );
        // Every walk taken ended inside the run but perhaps the last.
        let w = v("eplb_walk_duration_seconds_count");
        assert!(w == walks || w + 1.0 == walks, "{w} walks of {walks}");
        assert_eq!(v("eplb_rearrangements_total"), w);
        // The cluster's copies, counted alike on every rank, at 1000 bytes each.
        assert_eq!(v("eplb_expert_copies_moved_total"), copies0);
        assert_eq!(v("eplb_moved_bytes_total"), copies0 * 1000.0);
        assert_eq!(
            value(&text, "eplb_health", &format!("{rank},state=\"running\"")),
            1.0
        );
        let after = value(
            &text,
            "eplb_balancedness_min",
            &format!("{rank},when=\"after\""),
        );
        let before = value(
            &text,
            "eplb_balancedness_min",
            &format!("{rank},when=\"before\""),
        );
        assert!(0.0 < before && before <= 1.0 && 0.0 < after && after <= 1.0);
        // Per-layer series: 2 L balancedness and L copies, summing to the total.
        let prefix = format!("eplb_layer_balancedness{{{rank},layer=");
        assert_eq!(
            text.lines().filter(|l| l.starts_with(&prefix)).count(),
            2 * 26
        );
        let prefix = format!("eplb_layer_expert_copies_moved_total{{{rank},layer=");
        let per_layer: f64 = text
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum();
        assert_eq!(per_layer, copies0);
    }
    assert_eq!(text.matches("# HELP eplb_cycles_total ").count(), 1);
}

#[test]
fn metrics_off_register_nothing_and_per_layer_is_opt_in() {
    let (off, _) = run(serde_json::json!(false));
    assert!(!off.contains("eplb_"), "{off}");
    let (default, _) = run(serde_json::json!(true));
    assert!(default.contains("eplb_cycles_total{rank=\"7\"}"));
    assert!(!default.contains("eplb_layer_"));
}
