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
