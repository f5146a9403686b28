//! `eplb_sim::advise` on the shipped real SGLang DeepSeek-V3 traces
//! (`../shared/data/traces/sglang_dsv3_*.json`, one aggregate window each): the seed's rules
//! and DeepSeek's own prefill deployment come out of the time model (`docs/time-model.md`,
//! "The seed's usage rules, from the model").

use eplb_core::metrics::Routing;
use eplb_core::time::Role;
use eplb_core::time::step::Overlap;
use eplb_policies::PolicyKind;
use eplb_sim::advise::{Advice, Grid, Verdict, advise};
use eplb_sim::cost::CostSpec;
use eplb_sim::time::TimeSpec;
use eplb_sim::{Initial, Replay, SimConfig, SimPolicy};

fn trace(name: &str) -> Replay {
    let path = format!(
        "{}/../../shared/data/traces/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let bytes = std::fs::read(&path).unwrap();
    Replay::load(&bytes, name, &CostSpec::default()).unwrap()
}

fn base(ranks: u16, ranks_per_node: Option<u16>) -> SimConfig {
    SimConfig {
        ranks,
        redundant: 0,
        ranks_per_node,
        groups: None,
        policy: SimPolicy::Static,
        heat_interval: 1,
        algo_interval: 1,
        initial: Initial::Default,
        routing: Routing::Log2Phy,
        seed: 0,
        expert_bytes: 64,
        payoff_gate: None,
        events: Vec::new(),
    }
}

/// A small grid (the default one takes a minute per call in a debug build).
fn grid(ranks: u16) -> Grid {
    Grid {
        policies: vec![PolicyKind::DeepSeek, PolicyKind::FlashLb],
        heat_intervals: vec![50],
        algo_intervals: vec![1],
        redundant: vec![0, u32::from(ranks)],
        payoff_gate: vec![false],
    }
}

fn run(replay: &Replay, cfg: &SimConfig, spec: &TimeSpec) -> Advice {
    advise(replay, cfg, spec, &grid(cfg.ranks), 2, &|_, _| {}).unwrap()
}

/// The seed: decode "with a per-die load below 128 tokens" is not recommended. On every
/// shipped real decode trace, on the seed's hardware (A3, EP32, its preset topology: 16 dies
/// per node in a SuperPoD), 32 tokens per die is never "enable", and 128 tokens per die is
/// never "do not enable".
#[test]
fn real_decode_traces_below_128_tokens_per_die_are_not_enabled() {
    for name in [
        "sglang_dsv3_decode_in1000out1000",
        "sglang_dsv3_decode_in1800out100",
        "sglang_dsv3_decode_in2000out100",
    ] {
        let r = trace(name);
        let spec = |t: f64| TimeSpec {
            role: Some(Role::Decode),
            tokens_per_rank: Some(t),
            ..TimeSpec::default()
        };
        let low = run(&r, &base(32, None), &spec(32.0));
        assert_ne!(
            low.verdict,
            Verdict::Enable,
            "{name}: {}",
            low.recommendation()
        );
        assert_eq!(
            low.eplb_config(),
            serde_json::json!({"dynamic_eplb": false})
        );
        let high = run(&r, &base(32, None), &spec(128.0));
        assert_ne!(
            high.verdict,
            Verdict::DoNotEnable,
            "{name}: {}",
            high.recommendation()
        );
        assert!(high.saving_pct.1 > low.saving_pct.1, "{name}");
        // The band is reported from the ids as given, permuted and drifting.
        assert!(low.permuted_saving_pct.is_some() && low.drift_saving_pct.is_some());
    }
}

/// DeepSeek-V3 prefill at EP32 with 16K tokens per GPU (4 nodes of 8 H800, 4K prompts,
/// two-batch overlap), where DeepSeek and SGLang run EPLB: "enable", on the shipped prefill
/// trace, with the band's low end above the threshold.
#[test]
fn deepseek_prefill_ep32_16k_tokens_per_gpu_is_enabled() {
    let r = trace("sglang_dsv3_prefill_in2048");
    let spec = TimeSpec {
        hardware: Some("h800".to_owned()),
        role: Some(Role::Prefill),
        tokens_per_rank: Some(16384.0),
        prompt_tokens: Some(4096.0),
        overlap: Some(Overlap::TwoBatch),
        ..TimeSpec::default()
    };
    let a = run(&r, &base(32, Some(8)), &spec);
    assert_eq!(a.verdict, Verdict::Enable, "{}", a.recommendation());
    // Research note §7 row 11 (LMSYS "SGLang (Default)", 50,302 tok/s per node: 2.61 s per
    // iteration, whole forward, no EPLB): the static baseline on this trace stays under it
    // and within 1.5x of it.
    let static_ms = a.baseline_ms;
    assert!((2610.0 / 1.5..=2610.0).contains(&static_ms), "{static_ms}");
    // Row 12 (EPLB saves 397 ms per iteration, 15.2 %): a documented miss. The model's best
    // setting saves about 3.6x that (the static baseline matches, the balanced step is 0.56 of
    // DeepSeek's measured one: row 10); asserted inside the band around the miss.
    let saved = static_ms - a.rows[0].step_ms;
    let ratio = saved / 397.0;
    assert!(
        (2.5..5.0).contains(&ratio),
        "saving {saved} ms, ratio {ratio}"
    );
    assert!(a.saving_pct.0 >= eplb_sim::advise::MIN_SAVING_PCT);
    assert_eq!(a.to_json()["topology"]["nodes"], 4);
    assert_eq!(a.to_json()["topology"]["inter_node_link"], "scale-out");
}
