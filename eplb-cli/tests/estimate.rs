//! `eplb estimate`: the `--json` contract, the topology it prints, the band, PAR, and clear
//! errors on bad input.

mod common;

use common::{eplb, stderr, stdout, tmp};
use serde_json::Value;

/// `estimate` with DeepSeek-V3 on 32 H800s, decode, 128 tokens per rank, unless `extra`
/// sets one of those flags itself.
fn est(extra: &[&str]) -> std::process::Output {
    let mut v = vec!["estimate"];
    for (k, d) in [
        ("--model", "deepseek-v3"),
        ("--hardware", "h800"),
        ("--ranks", "32"),
        ("--role", "decode"),
        ("--tokens-per-rank", "128"),
    ] {
        if !extra.contains(&k) {
            v.extend_from_slice(&[k, d]);
        }
    }
    v.extend_from_slice(extra);
    eplb(&v)
}

fn json(extra: &[&str]) -> Value {
    let mut e = extra.to_vec();
    e.push("--json");
    let out = est(&e);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"))
}

#[test]
fn json_has_the_parts_the_band_and_the_topology() {
    let v = json(&[]);
    for k in [
        "iteration_ms",
        "moe_ms",
        "attention_ms",
        "a2a_ms",
        "other_ms",
        "iteration_ms_low",
        "iteration_ms_high",
    ] {
        assert!(f(&v, k) > 0.0, "{k}: {v}");
    }
    assert!(f(&v, "iteration_ms_low") < f(&v, "iteration_ms"));
    assert!(f(&v, "iteration_ms") < f(&v, "iteration_ms_high"));
    // Without overlap the parts add up to the step.
    let parts = f(&v, "moe_ms") + f(&v, "attention_ms") + f(&v, "other_ms");
    assert!((parts - f(&v, "iteration_ms")).abs() < 1e-6 * parts, "{v}");
    let t = &v["topology"];
    assert_eq!(t["ranks_per_node"], 8);
    assert_eq!(t["ranks_per_node_source"], "hardware preset");
    assert_eq!(t["nodes"], 4);
    assert_eq!(t["inter_node_link"], "scale-out");
    assert_eq!(t["a2a_kernel"], "low-latency");
    // The text says which topology it assumed.
    let text = stdout(&est(&[]));
    assert!(
        text.contains("32 ranks = 4 node(s) of 8 (hardware preset: set --ranks-per-node)"),
        "{text}"
    );
}

#[test]
fn skew_overlap_and_topology_move_the_step() {
    let base = json(&[]);
    let skew = json(&["--par", "2"]);
    assert!(f(&skew, "moe_ms") > f(&base, "moe_ms"));
    assert_eq!(f(&skew, "attention_ms"), f(&base, "attention_ms"));
    let one_node = json(&["--ranks-per-node", "32"]);
    assert!(f(&one_node, "a2a_ms") < f(&base, "a2a_ms"));
    assert_eq!(one_node["topology"]["ranks_per_node_source"], "given");
    let pf = |o: &str| {
        json(&[
            "--role",
            "prefill",
            "--tokens-per-rank",
            "16384",
            "--overlap",
            o,
        ])
    };
    let (none, two) = (pf("none"), pf("two-batch"));
    assert!(f(&two, "iteration_ms") < f(&none, "iteration_ms"));
    assert!(f(&two, "hidden_by_overlap_ms") > 0.0);
    let longer = json(&["--context-tokens", "16384"]);
    assert!(f(&longer, "attention_ms") > f(&base, "attention_ms"));
    // The A3 SuperPoD: 16 dies per node, other nodes over UB.
    let a3 = json(&["--hardware", "a3"]);
    assert_eq!(a3["topology"]["ranks_per_node"], 16);
    assert_eq!(a3["topology"]["inter_node_link"], "scale-up domain");
    assert_eq!(a3["topology"]["a2a_kernel"], "mc2");
}

#[test]
fn a_calibration_file_scales_the_terms_and_narrows_the_band() {
    let dir = tmp("estimate-calib");
    let path = dir.join("calib.json");
    std::fs::write(
        &path,
        r#"{"format": "eplb-calibration/v1", "multipliers": {"host": 1, "backbone": 2, "gemm": 1, "link": 1, "latency": 1}}"#,
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let base = json(&[]);
    let cal = json(&["--calibration", p]);
    assert!((f(&cal, "attention_ms") / f(&base, "attention_ms") - 2.0).abs() < 1e-9);
    let band = |v: &Value| f(v, "iteration_ms_high") / f(v, "iteration_ms_low");
    assert!(band(&cal) < band(&base));
    assert_eq!(cal["time_model"]["calibration"]["source"], p);
}

#[test]
fn bad_input_is_an_error_with_a_nonzero_exit() {
    let dir = tmp("estimate-bad");
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"format": "eplb-calibration/v1", "multipliers": {"host": -1}}"#,
    )
    .unwrap();
    for (args, want) in [
        (vec!["--par", "0.5"], "--par"),
        (vec!["--par", "nan"], "--par"),
        (vec!["--ranks-per-node", "5"], "--ranks-per-node"),
        (vec!["--context-tokens=-5"], "--context-tokens"),
        (vec!["--hardware", "tpu"], "unknown hardware"),
        (vec!["--overlap", "three"], "unknown overlap"),
        (vec!["--calibration", bad.to_str().unwrap()], "multipliers"),
        (vec!["--calibration", "/nonexistent/c.json"], "c.json"),
    ] {
        let out = est(&args);
        assert!(!out.status.success(), "{args:?}");
        let e = stderr(&out);
        assert!(
            e.starts_with("error: ") && e.contains(want),
            "{args:?}: {e}"
        );
    }
    let out = eplb(&["estimate", "--model", "deepseek-v3"]);
    assert!(!out.status.success());
}
