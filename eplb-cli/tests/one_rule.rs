//! One rule per number (issue 37, class 1): the same absurd value is refused by every surface
//! that takes it (the CLI's flags, `check-config` reading an `eplb_config`, the runtime's
//! reader), each time with the rule's own message (`eplb_core::settings`), after the surface's
//! own prefix.

mod common;

use common::{eplb, eplb_with, shared, stderr, stdout, tmp};
use eplb_core::settings;
use eplb_runtime::config::EplbConfig;

const SERIES: &str = "data/series/esft_chain.json";

fn simulate(trace: &str, extra: &[&str]) -> std::process::Output {
    let mut v = vec![
        "simulate", "--trace", trace, "--ranks", "8", "--policy", "swift",
    ];
    for (flag, default) in [
        ("--redundant", "0"),
        ("--heat-interval", "10"),
        ("--algo-interval", "1"),
    ] {
        if !extra.contains(&flag) {
            v.extend([flag, default]);
        }
    }
    v.extend_from_slice(extra);
    eplb(&v)
}

fn advise(trace: &str, extra: &[&str]) -> std::process::Output {
    let mut v = vec![
        "advise",
        "--trace",
        trace,
        "--ranks",
        "8",
        "--policies",
        "swift",
    ];
    v.extend_from_slice(extra);
    eplb(&v)
}

/// `check-config` on `inner` (with the env guard) and the runtime's reader on the same text.
fn config(name: &str, inner: &str) -> (std::process::Output, Vec<String>) {
    let dir = tmp(name);
    let path = dir.join("c.json");
    std::fs::write(&path, inner).unwrap();
    let o = eplb_with(&["check-config", path.to_str().unwrap()], true);
    let guard = [("DYNAMIC_EPLB", "1")];
    let runtime = match EplbConfig::from_json_str(inner, &guard) {
        Ok(_) => Vec::new(),
        Err(e) => e.messages(),
    };
    std::fs::remove_dir_all(&dir).unwrap();
    (o, runtime)
}

/// Exit code `code` and a standard error of one line, `error: ...` ending with `PREFIX: MSG`.
fn refused(o: &std::process::Output, code: i32, prefix: &str, msg: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(code), "{e}");
    let want = format!("{prefix}: {msg}");
    assert!(
        e.lines()
            .any(|l| l.starts_with("error: ") && l.ends_with(&want)),
        "want a line ending with {want:?}, got {e}"
    );
    assert!(stdout(o).is_empty(), "{}", stdout(o));
}

#[test]
fn tokens_per_rank_1e300_is_refused_alike_everywhere() {
    let msg = settings::tokens_per_rank(1e300).unwrap_err().to_string();
    assert!(msg.contains("got 1e300"), "{msg}");
    let trace = shared(SERIES);
    refused(
        &simulate(&trace, &["--tokens-per-rank", "1e300"]),
        1,
        "--tokens-per-rank",
        &msg,
    );
    refused(
        &advise(&trace, &["--tokens-per-rank", "1e300"]),
        1,
        "--tokens-per-rank",
        &msg,
    );
    refused(
        &eplb(&[
            "estimate",
            "--model",
            "deepseek-v3",
            "--hardware",
            "a3",
            "--role",
            "decode",
            "--ranks",
            "32",
            "--tokens-per-rank",
            "1e300",
        ]),
        1,
        "--tokens-per-rank",
        &msg,
    );
    let (o, runtime) = config(
        "rule-tokens",
        r#"{"dynamic_eplb": true, "eplb_payoff_gate": {"tokens_per_rank": 1e300}}"#,
    );
    let prefix = "eplb_config.eplb_payoff_gate.tokens_per_rank";
    refused(&o, 1, prefix, &msg);
    assert_eq!(runtime, vec![format!("{prefix}: {msg}")]);
    // The deployment's tokens per die stand in for the gate's tokens per rank: the same rule,
    // when check-config builds the gate as start-up does.
    let (o, _) = config(
        "rule-tokens-die",
        r#"{"eplb_config": {"dynamic_eplb": true, "eplb_payoff_gate": true}, "deployment": {"tokens_per_die": 0}}"#,
    );
    refused(
        &o,
        1,
        "eplb_payoff_gate",
        &settings::tokens_per_rank(0.0).unwrap_err().to_string(),
    );
    // Just inside the rule: accepted everywhere.
    let (o, runtime) = config(
        "rule-tokens-ok",
        r#"{"dynamic_eplb": true, "eplb_payoff_gate": {"tokens_per_rank": 1048576}}"#,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(runtime.is_empty(), "{runtime:?}");
    assert!(stdout(&o).contains("pay-off gate it builds: model deepseek-v3"));
}

#[test]
fn a_link_of_1e_minus_300_gbps_is_refused_alike_everywhere() {
    let msg = settings::bytes_per_s("link", 1e-300 * 1e9 / 8.0)
        .unwrap_err()
        .to_string();
    let trace = shared(SERIES);
    let prefix = "link \"1e-300gbps\"";
    // A usage error where clap reads the flag (exit 2), with the rule's words.
    let o = simulate(&trace, &["--link", "1e-300gbps"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(&format!("{prefix}: {msg}")),
        "{}",
        stderr(&o)
    );
    let o = advise(&trace, &["--link", "1e-300gbps"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(&format!("{prefix}: {msg}")),
        "{}",
        stderr(&o)
    );
    // The hardware's own links follow the same bounds.
    let msg = settings::bytes_per_s("hardware inter-node bandwidth", 1.25e-292)
        .unwrap_err()
        .to_string();
    refused(
        &simulate(&trace, &["--hw-param", "inter_node_bytes_per_s=1.25e-292"]),
        1,
        "--hw-param inter_node_bytes_per_s=1.25e-292",
        &msg,
    );
}

#[test]
fn a_negative_interval_is_refused_alike_everywhere() {
    let msg = settings::heat_interval(-1).unwrap_err().to_string();
    let trace = shared(SERIES);
    refused(
        &simulate(&trace, &["--heat-interval", "-1"]),
        1,
        "--heat-interval",
        &msg,
    );
    refused(
        &advise(&trace, &["--heat-intervals", "10,-1"]),
        1,
        "--heat-intervals",
        &msg,
    );
    let (o, runtime) = config(
        "rule-interval",
        r#"{"dynamic_eplb": true, "expert_heat_collection_interval": -1}"#,
    );
    let prefix = "eplb_config.expert_heat_collection_interval";
    refused(&o, 1, prefix, &msg);
    assert_eq!(runtime, vec![format!("{prefix}: {msg}")]);
    let msg = settings::algo_interval(0).unwrap_err().to_string();
    refused(
        &simulate(&trace, &["--algo-interval", "0"]),
        1,
        "--algo-interval",
        &msg,
    );
    refused(
        &advise(&trace, &["--algo-intervals", "0"]),
        1,
        "--algo-intervals",
        &msg,
    );
}

#[test]
fn redundancy_beyond_any_model_is_refused_alike_everywhere() {
    let msg = settings::redundant_experts(70_000).unwrap_err().to_string();
    let trace = shared(SERIES);
    refused(
        &simulate(&trace, &["--redundant", "70000"]),
        1,
        "--redundant",
        &msg,
    );
    refused(
        &advise(&trace, &["--redundant-list", "70000"]),
        1,
        "--redundant-list",
        &msg,
    );
    let (o, runtime) = config(
        "rule-redundant",
        r#"{"dynamic_eplb": true, "num_redundant_experts": 70000}"#,
    );
    let prefix = "eplb_config.num_redundant_experts";
    refused(&o, 1, prefix, &msg);
    assert_eq!(runtime, vec![format!("{prefix}: {msg}")]);
}

#[test]
fn check_config_prints_the_gate_it_builds() {
    let dir = tmp("rule-gate");
    let path = dir.join("c.json");
    std::fs::write(
        &path,
        r#"{"eplb_config": {"dynamic_eplb": true, "expert_heat_collection_interval": 20, "algorithm_execution_interval": 5, "eplb_payoff_gate": {"model": "deepseek-v2-lite", "hardware": "a2", "tokens_per_rank": 2048}}, "deployment": {"role": "prefill"}}"#,
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let o = eplb_with(
        &["check-config", p, "--ranks", "16", "--ranks-per-node", "8"],
        true,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let line = stdout(&o)
        .lines()
        .find(|l| l.starts_with("pay-off gate it builds: "))
        .unwrap()
        .to_owned();
    assert!(
        line.starts_with(
            "pay-off gate it builds: model deepseek-v2-lite (none, 17301504 bytes per expert), hardware a2, role prefill, tokens per rank 2048, over 25 iterations; on 16 ranks the rest of the step is "
        ),
        "{line}"
    );
    let o = eplb_with(&["check-config", p, "--json", "--ranks", "16"], true);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["mode"], "dynamic");
    let g = &v["payoff_gate"];
    assert_eq!(g["model"], "deepseek-v2-lite");
    assert_eq!(g["hardware"], "a2");
    assert_eq!(g["role"], "prefill");
    assert_eq!(g["tokens_per_rank"], 2048.0);
    assert_eq!(g["quant_type"], "none");
    assert_eq!(g["iterations"], 25);
    assert!(g["step_other_ms"].as_f64().unwrap() > 0.0, "{g}");
    // No gate: null.
    std::fs::write(&path, r#"{"dynamic_eplb": true}"#).unwrap();
    let o = eplb_with(&["check-config", p, "--json"], true);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["payoff_gate"].is_null(), "{v}");
    std::fs::remove_dir_all(&dir).unwrap();
}
