//! `Advice::engine_config` (issue 37, class 3): the configuration written for a recommended
//! row makes the deployed runtime gate as `advise` estimated, every engine gets its own words,
//! and a row an engine cannot run is refused.

mod common;

use common::{anchor_cfg, shared};
use eplb_core::metrics::Routing;
use eplb_core::time::Role;
use eplb_policies::PolicyKind;
use eplb_runtime::config::EplbConfig;
use eplb_runtime::startup::{ModelInfo, payoff_gate};
use eplb_sim::advise::{Advice, Engine, Grid, advise};
use eplb_sim::cost::CostSpec;
use eplb_sim::time::TimeSpec;
use eplb_sim::{Replay, SimConfig, SimPolicy};

const RANKS: u16 = 8;

fn esft() -> Replay {
    let path = shared("data/series/esft_chain.json");
    let bytes = std::fs::read(&path).unwrap();
    Replay::load(&bytes, &path, &CostSpec::default()).unwrap()
}

fn spec() -> TimeSpec {
    TimeSpec {
        hardware: Some("a2".to_owned()),
        role: Some(Role::Prefill),
        tokens_per_rank: Some(4096.0),
        ..TimeSpec::default()
    }
}

fn run(replay: &Replay, spec: &TimeSpec, policy: PolicyKind, gate: bool) -> Advice {
    let grid = Grid {
        policies: vec![policy],
        heat_intervals: vec![10],
        algo_intervals: vec![1],
        redundant: vec![8],
        payoff_gate: vec![gate],
    };
    let base = anchor_cfg(RANKS, 0, SimPolicy::Static);
    advise(replay, &base, spec, &grid, 1, &|_, _| {}).unwrap()
}

#[test]
fn a_gated_row_deploys_the_gate_advise_estimated() {
    let replay = esft();
    let spec = spec();
    let a = run(&replay, &spec, PolicyKind::Incremental, true);
    assert!(a.recommended, "{}", a.recommendation());
    let row = a.winner().unwrap().setting;
    assert!(row.payoff_gate);
    let written = a
        .engine_config(Engine::Eplb, &spec, &replay.basis, Routing::Log2Phy)
        .unwrap();
    // The env guard is stated, and the document passes the runtime's reader with it.
    assert_eq!(written.env, vec![("DYNAMIC_EPLB", "1".to_owned())]);
    let guard = [("DYNAMIC_EPLB", "1")];
    let cfg = EplbConfig::from_value(&written.document, &guard).unwrap();
    assert!(EplbConfig::from_value(&written.document, &[("X", "1")]).is_err());
    let g = &written.document["eplb_config"]["eplb_payoff_gate"];
    assert_eq!(g["model"], "deepseek-v2-lite", "{g}");
    assert_eq!(g["hardware"], "a2");
    assert_eq!(g["role"], "prefill");
    assert_eq!(g["tokens_per_rank"], 4096.0);
    assert_eq!(written.document["deployment"]["quant_type"], "none");

    // The runtime's gate is the simulator's gate of the row: model, hardware, role, tokens per
    // rank, expert bytes, the cycle and the rest of the step.
    let info = ModelInfo {
        layers: replay.trace.layers as u16,
        experts: replay.trace.experts as u16,
        ranks: RANKS,
        ranks_per_node: RANKS,
        groups: 1,
        max_num_seqs: 256,
        speculative_tokens: 0,
        tp_size: 1,
    };
    let deployed = payoff_gate(&cfg, &info).unwrap().unwrap();
    let sim_cfg = SimConfig {
        policy: SimPolicy::Policy(row.policy),
        redundant: row.redundant,
        heat_interval: row.heat_interval,
        algo_interval: row.algo_interval,
        ..anchor_cfg(RANKS, 0, SimPolicy::Static)
    };
    let estimated = a.time.gate(&sim_cfg).unwrap();
    assert_eq!(deployed, estimated);
    assert_eq!(cfg.heat_interval(), row.heat_interval);
    assert_eq!(cfg.algo_interval(), row.algo_interval);
    assert_eq!(cfg.num_redundant_experts(), row.redundant);
    assert_eq!(cfg.policy(), row.policy);
}

#[test]
fn a_gate_the_config_cannot_express_is_refused() {
    let replay = esft();
    let mut spec = spec();
    spec.context_tokens = Some(1000.0);
    spec.hw_params = vec![("host_ms".to_owned(), 1.0)];
    let a = run(&replay, &spec, PolicyKind::Incremental, true);
    assert!(a.recommended, "{}", a.recommendation());
    let e = a
        .engine_config(Engine::Eplb, &spec, &replay.basis, Routing::Log2Phy)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--hw-param host_ms=1") && e.contains("--context-tokens"),
        "{e}"
    );
    // Other engines run no gate at all.
    let e = a
        .engine_config(Engine::Vllm, &spec, &replay.basis, Routing::Log2Phy)
        .unwrap_err()
        .to_string();
    assert!(e.contains("pay-off gate"), "{e}");
}

#[test]
fn every_engine_gets_its_own_words_for_incremental() {
    let replay = esft();
    let spec = spec();
    let a = run(&replay, &spec, PolicyKind::Incremental, false);
    assert!(a.recommended, "{}", a.recommendation());
    let cfg = |e| {
        a.engine_config(e, &spec, &replay.basis, Routing::Log2Phy)
            .unwrap()
    };
    // eplb's runtime: its own policy number.
    let eplb = cfg(Engine::Eplb);
    assert_eq!(eplb.document["eplb_policy_type"], 4);
    // vLLM-Ascend knows types 0..3 only (4 would run its Random policy): a type that chooses
    // the load format, and the plugin's setting that names our policy.
    let va = cfg(Engine::VllmAscend);
    let t = va.document["eplb_config"]["eplb_policy_type"]
        .as_u64()
        .unwrap();
    assert!(t <= 3 && t != 0, "{}", va.document);
    assert_eq!(va.document["eplb_rs"]["policy"], "incremental");
    assert_eq!(va.document["eplb_config"]["num_redundant_experts"], 8);
    assert_eq!(va.env, vec![("DYNAMIC_EPLB", "true".to_owned())]);
    // vLLM: the policy through the plugin's variable; its config keeps `default`.
    let v = cfg(Engine::Vllm);
    assert_eq!(v.document["eplb_config"]["policy"], "default");
    assert_eq!(v.document["eplb_config"]["step_interval"], 11);
    assert_eq!(v.env, vec![("EPLB_POLICY", "incremental".to_owned())]);
    assert!(!v.notes.is_empty());
    // SGLang: the plugin's algorithm name.
    let s = cfg(Engine::Sglang);
    assert_eq!(s.document["eplb_algorithm"], "eplb_rs:incremental");
    assert!(
        s.flags
            .as_deref()
            .unwrap()
            .contains("--eplb-algorithm eplb_rs:incremental")
    );
    // deepseek co-locates copies, which vLLM-Ascend's planner rejects.
    assert!(!Engine::VllmAscend.runs(PolicyKind::DeepSeek));
    assert!(Engine::Eplb.runs(PolicyKind::DeepSeek));
    assert_eq!(Engine::from_name("vllm_ascend"), Some(Engine::VllmAscend));
}

#[test]
fn a_grid_where_nothing_can_be_estimated_is_an_error() {
    let replay = esft();
    let grid = Grid {
        policies: vec![PolicyKind::Swift],
        heat_intervals: vec![10],
        algo_intervals: vec![1],
        // 64 + 1 experts do not divide over 8 ranks.
        redundant: vec![1],
        payoff_gate: vec![false],
    };
    let base = anchor_cfg(RANKS, 0, SimPolicy::Static);
    let e = advise(&replay, &base, &spec(), &grid, 1, &|_, _| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("advise: no setting could be estimated"),
        "{e}"
    );
}
