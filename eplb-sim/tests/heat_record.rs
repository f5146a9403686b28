//! Issue 29: the runtime records the heat it gathers (`eplb_heat_record_path` on rank 0 of an
//! 8-rank controller cluster over the host transport, fed the demo trace), and the recording
//! replays in `eplb simulate` (`Replay::load`, which `simulate`, `report` and `advise` share) to
//! exactly the windows it was recorded from.

use eplb_runtime::config::EplbConfig;
use eplb_runtime::startup::ModelInfo;
use eplb_sim::cluster::{ClusterSpec, run_cluster};
use eplb_sim::cost::CostSpec;
use eplb_sim::{Initial, Replay, SimConfig, SimPolicy};

const H: usize = 4;

fn demo_trace() -> Replay {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/esft_chain.json");
    let bytes = std::fs::read(path).unwrap();
    Replay::load(&bytes, path, &CostSpec::default()).unwrap()
}

#[test]
fn a_recording_of_the_demo_trace_replays_to_the_windows_it_was_recorded_from() {
    let demo = demo_trace();
    let t = &demo.trace;
    let dir = std::env::temp_dir().join(format!("eplb-heat-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("heat.jsonl");
    let _ = std::fs::remove_file(&path);
    let cfg_json = serde_json::json!({
        "dynamic_eplb": true,
        "expert_heat_collection_interval": H,
        "algorithm_execution_interval": 2,
        "num_redundant_experts": 8,
        "eplb_policy_type": "flashlb",
        "eplb_heat_record_path": path.to_str().unwrap(),
    });
    let cfg = EplbConfig::from_value(&cfg_json, &[("DYNAMIC_EPLB", "true")]).unwrap();
    let model = ModelInfo {
        layers: t.layers as u16,
        experts: t.experts as u16,
        ranks: 8,
        ranks_per_node: 8,
        groups: 1,
        max_num_seqs: 256,
        speculative_tokens: 0,
        tp_size: 1,
    };
    let spec = ClusterSpec {
        ranks: 8,
        expert_bytes: 16,
        metrics_expert_bytes: 16,
        passes: 1,
        pace: None,
        resume_after: None,
    };
    let run = run_cluster(t, &cfg, &model, &spec, None).unwrap();
    assert!(
        run.plans_taken.iter().any(|&(_, k)| k > 0),
        "no plan moved anything: {:?}",
        run.plans_taken
    );

    let bytes = std::fs::read(&path).unwrap();
    let header: serde_json::Value =
        serde_json::from_slice(bytes.split(|&b| b == b'\n').next().unwrap()).unwrap();
    assert_eq!(header["format"], "eplb-trace/v1");
    assert_eq!(header["model"]["num_moe_layers"], 26);
    assert_eq!(header["model"]["num_experts"], 64);
    assert_eq!(header["topology"]["ranks"], 8);
    assert_eq!(header["topology"]["slots_per_rank"], 9);
    assert_eq!(
        header["intervals"]["expert_heat_collection_interval"],
        H as u64
    );
    assert_eq!(header["intervals"]["iterations_per_window"], 1);
    assert_eq!(
        *bytes.last().unwrap(),
        b'\n',
        "the file ends with a whole line"
    );

    // What `eplb simulate --trace` reads.
    let rec = Replay::load(&bytes, "heat.jsonl", &CostSpec::default()).unwrap();
    assert_eq!((rec.trace.layers, rec.trace.experts), (t.layers, t.experts));
    assert_eq!(rec.trace.windows % H, 0);
    let cycles = rec.trace.windows / H;
    assert!(cycles >= 3, "{cycles} cycles recorded");
    // Cycle 1 counts iterations 0..H; cycle k + 1 the H iterations after cycle k ended.
    let starts: Vec<usize> = std::iter::once(0)
        .chain(run.cycles_done.iter().map(|&i| i + 1))
        .take(cycles)
        .collect();
    assert_eq!(starts.len(), cycles, "cycles done: {:?}", run.cycles_done);
    let ln = t.layers * t.experts;
    let mut expected = Vec::new();
    for &s in &starts {
        expected.extend_from_slice(&t.counts[s * ln..(s + H) * ln]);
    }
    assert_eq!(rec.trace.counts.len(), expected.len());
    for (k, (got, want)) in rec
        .trace
        .counts
        .chunks_exact(ln)
        .zip(expected.chunks_exact(ln))
        .enumerate()
    {
        assert_eq!(
            got,
            want,
            "recorded window {k} (cycle {}) differs",
            k / H + 1
        );
    }

    // It replays: `eplb simulate` over the recording.
    let sim = SimConfig {
        ranks: 8,
        redundant: 8,
        ranks_per_node: None,
        groups: None,
        policy: SimPolicy::Policy(eplb_policies::PolicyKind::FlashLb),
        heat_interval: H as u32,
        algo_interval: 2,
        initial: Initial::Default,
        routing: eplb_core::metrics::Routing::Log2Phy,
        seed: 0,
        expert_bytes: 0,
        payoff_gate: None,
        events: Vec::new(),
    };
    let out = rec.run(&sim, &[], &mut |_, _| {}).unwrap();
    assert_eq!(out.result.par.len(), rec.trace.windows * t.layers);
    let _ = std::fs::remove_dir_all(&dir);
}
