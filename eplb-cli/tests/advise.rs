//! `eplb advise`: the same output on 1 and 2 threads, the `--json` contract, `--config-out`
//! that `check-config` accepts, and clear errors.

mod common;

use common::{eplb, eplb_with, shared, stderr, stdout, tmp};
use serde_json::Value;

const SERIES: &str = "data/series/esft_chain.json";

fn args<'a>(trace: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "advise",
        "--trace",
        trace,
        "--ranks",
        "8",
        "--policies",
        "swift,incremental",
        "--heat-intervals",
        "10,20",
        "--algo-intervals",
        "1",
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn one_and_two_threads_print_the_same_and_json_keeps_its_keys() {
    let trace = shared(SERIES);
    let one = eplb(&args(&trace, &["--threads", "1"]));
    let two = eplb(&args(&trace, &["--threads", "2"]));
    assert!(one.status.success(), "{}", stderr(&one));
    assert_eq!(stdout(&one), stdout(&two));
    let text = stdout(&one);
    let last = text.lines().last().unwrap();
    assert!(
        last.starts_with("enable: policy ") || last.starts_with("do not enable: "),
        "{text}"
    );
    // 2 policies x 2 H x 1 A x 2 X (0 and 8) = 8 rows and a header.
    assert_eq!(
        text.lines().filter(|l| l.contains("ms  ")).count(),
        8,
        "{text}"
    );

    let j1 = eplb(&args(&trace, &["--threads", "1", "--json"]));
    let j2 = eplb(&args(&trace, &["--threads", "2", "--json"]));
    assert_eq!(j1.stdout, j2.stdout);
    let v: Value = serde_json::from_slice(&j1.stdout).unwrap();
    for k in [
        "recommended",
        "recommendation",
        "threshold_pct",
        "baseline",
        "table",
        "eplb_config",
        "time_model",
    ] {
        assert!(v.get(k).is_some(), "{k}");
    }
    assert!(v["recommended"].is_boolean());
    assert_eq!(v["recommendation"].as_str(), Some(last));
    let table = v["table"].as_array().unwrap();
    assert_eq!(table.len(), 8);
    let pct: Vec<f64> = table
        .iter()
        .map(|r| r["est_net_saving_pct"].as_f64().unwrap())
        .collect();
    assert!(pct.windows(2).all(|p| p[0] >= p[1]), "ranked: {pct:?}");
    assert_eq!(v["time_model"]["model"], "deepseek-v2-lite");
    assert_eq!(v["baseline"]["redundant"], 0);
    if v["recommended"] == true {
        let best = &table[0];
        let cfg = &v["eplb_config"];
        assert_eq!(cfg["dynamic_eplb"], true);
        assert_eq!(cfg["num_redundant_experts"], best["redundant"]);
        assert_eq!(
            cfg["expert_heat_collection_interval"],
            best["heat_interval"]
        );
        assert_eq!(cfg["algorithm_execution_interval"], best["algo_interval"]);
    }
}

#[test]
fn config_out_passes_check_config() {
    let trace = shared(SERIES);
    let dir = tmp("advise-config");
    let out = dir.join("eplb_config.json");
    let out_s = out.to_str().unwrap();
    // Prefill at 4096 tokens per rank: well above every threshold, so EPLB is recommended.
    let o = eplb(&args(
        &trace,
        &[
            "--role",
            "prefill",
            "--tokens-per-rank",
            "4096",
            "--config-out",
            out_s,
            "--json",
        ],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["recommended"], true, "{v}");
    let written: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(written, v["eplb_config"]);
    let o = eplb_with(
        &["check-config", out_s, "--experts", "64", "--ranks", "8"],
        true,
    );
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_settings_are_clear_errors() {
    let trace = shared(SERIES);
    let o = eplb(&args(&trace, &["--hardware", "tpu"]));
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("a2, a3, 950pr, 950dt, h100, h200, b200"),
        "{}",
        stderr(&o)
    );
    let o = eplb(&args(&trace, &["--role", "both"]));
    assert_eq!(o.status.code(), Some(2));
    let o = eplb(&args(&trace, &["--hw-param", "speed=1"]));
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).starts_with("error: "), "{}", stderr(&o));
    assert!(stderr(&o).contains("flops_bf16"), "{}", stderr(&o));
    // --config-out never overwrites the trace.
    let o = eplb(&args(&trace, &["--config-out", &trace]));
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).starts_with("error: "), "{}", stderr(&o));
    // A grid with no setting inside the trace.
    let o = eplb(&[
        "advise",
        "--trace",
        &trace,
        "--ranks",
        "8",
        "--heat-intervals",
        "100000",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("H + A"), "{}", stderr(&o));
}

/// Issue 37, class 3: when no setting can be estimated, `advise` fails and writes nothing.
#[test]
fn nothing_to_estimate_is_an_error_and_writes_no_config() {
    let trace = shared(SERIES);
    let dir = tmp("advise-nothing");
    let out = dir.join("eplb_config.json");
    // 64 + 1 experts do not divide over 8 ranks: every setting fails.
    let o = eplb(&args(
        &trace,
        &[
            "--redundant-list",
            "1",
            "--config-out",
            out.to_str().unwrap(),
        ],
    ));
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).starts_with("error: advise: no setting could be estimated"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    assert!(!out.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 37, class 3: `--engine vllm-ascend` writes vLLM-Ascend's words for a recommended
/// `incremental` (a type it knows and the plugin's setting that serves ours), states the env
/// guard, and a row or flag the engine cannot run is refused.
#[test]
fn engine_vllm_ascend_speaks_vllm_ascend() {
    let trace = shared(SERIES);
    let dir = tmp("advise-engine");
    let out = dir.join("additional_config.json");
    let out_s = out.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut v = vec![
            "advise",
            "--trace",
            &trace,
            "--ranks",
            "8",
            "--policies",
            "incremental",
            "--heat-intervals",
            "10",
            "--algo-intervals",
            "1",
            "--redundant-list",
            "8",
            "--role",
            "prefill",
            "--tokens-per-rank",
            "4096",
        ];
        v.extend_from_slice(extra);
        eplb(&v)
    };
    let o = run(&["--engine", "vllm-ascend", "--config-out", out_s, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["recommended"], true, "{v}");
    let written: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(written, v["engine_config"]["document"]);
    assert_eq!(v["engine_config"]["env"]["DYNAMIC_EPLB"], "true");
    let t = written["eplb_config"]["eplb_policy_type"].as_u64().unwrap();
    assert!((1..=3).contains(&t), "{written}");
    assert_eq!(written["eplb_rs"]["policy"], "incremental");
    // The default engine keeps today's document: eplb's own policy number.
    assert_eq!(v["eplb_config"]["eplb_policy_type"], 4);

    let o = run(&["--engine", "vllm", "--payoff-gate"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("only eplb's runtime runs the pay-off gate"));
    let o = run(&["--engine", "vllm-ascend", "--policies", "deepseek"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with("error: --policies deepseek"),
        "{}",
        stderr(&o)
    );
    let o = run(&["--engine", "trtllm"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("eplb, vllm, vllm-ascend, sglang"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 37, class 3: a gated candidate's `eplb_config` names the gate's model, hardware, role
/// and tokens per rank (not `true`, which the runtime reads as its defaults), and passes
/// `check-config` with the env guard the output states.
#[test]
fn a_gated_config_names_its_time_model_and_passes_check_config() {
    let trace = shared(SERIES);
    let dir = tmp("advise-gated");
    let out = dir.join("cand.json");
    let o = eplb(&[
        "advise",
        "--trace",
        &trace,
        "--ranks",
        "8",
        "--policies",
        "incremental",
        "--heat-intervals",
        "10",
        "--algo-intervals",
        "1",
        "--redundant-list",
        "8",
        "--role",
        "decode",
        "--tokens-per-rank",
        "1024",
        "--hardware",
        "a2",
        "--payoff-gate",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["table"][0]["payoff_gate"], true, "{v}");
    let cand = &v["candidate_eplb_config"];
    let g = &cand["eplb_payoff_gate"];
    assert_eq!(g["model"], "deepseek-v2-lite", "{cand}");
    assert_eq!(g["hardware"], "a2");
    assert_eq!(g["role"], "decode");
    assert_eq!(g["tokens_per_rank"], 1024.0);
    std::fs::write(&out, cand.to_string()).unwrap();
    let o = eplb_with(&["check-config", out.to_str().unwrap()], true);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o)
            .contains("model deepseek-v2-lite, hardware a2, role decode, tokens_per_rank 1024"),
        "{}",
        stdout(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
