//! The `eplb` binary on deployments: `check-config` errors and warnings (file and flags), and
//! the cost keys and lines of `plan` and `simulate`.

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::{eplb_plan, eplb_with as eplb, fails_with, shared, stderr, stdout};

/// Writes `text` to a fresh file and returns its path.
fn file(name: &str, text: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("eplb-depcli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn w4a16_on_950dt_exits_1_with_the_reason() {
    let p = file(
        "950dt.json",
        r#"{"eplb_config": {"dynamic_eplb": true, "num_redundant_experts": 16},
            "deployment": {"hardware": "950DT", "quant_type": "W4A16", "role": "decode"}}"#,
    );
    let o = eplb(&["check-config", p.to_str().unwrap()], true);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.starts_with(&format!(
            "error: {}: deployment: EPLB does not support quant_type W4A16 without fused MC2 on 950DT (W4A8MXFP4, W4A16 and W4A16MXFP4 are explicitly unsupported on the 950 products",
            p.display()
        )),
        "{e}"
    );
    assert!(e.contains("MXFP4 and MXFP8 on 950PR/950DT"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(stdout(&o).is_empty());

    // The same facts as flags, over a file without a deployment.
    let bare = file("bare.json", r#"{"dynamic_eplb": true}"#);
    let o = eplb(
        &[
            "check-config",
            bare.to_str().unwrap(),
            "--hardware",
            "950DT",
            "--quant",
            "W4A16",
        ],
        true,
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("W4A16 without fused MC2 on 950DT"));

    // A flag fixes the file: MXFP8 is supported on 950DT.
    let o = eplb(
        &["check-config", p.to_str().unwrap(), "--quant", "mxfp8"],
        true,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("deployment facts: hardware 950DT, quant_type MXFP8, role decode"),
        "{}",
        stdout(&o)
    );

    // With EPLB off the combination is only a warning.
    let off = file(
        "off.json",
        r#"{"deployment": {"hardware": "950DT", "quant_type": "W4A16"}}"#,
    );
    let o = eplb(&["check-config", off.to_str().unwrap()], false);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with("warning: deployment: EPLB does not support quant_type W4A16"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("(EPLB is off now; enabling it would be an error)"));
}

#[test]
fn a3_decode_with_8_experts_per_die_exits_0_with_the_warning() {
    let want = "warning: deployment: decode node with experts_per_die = 8 (at most 8; 16 on 950DT): EPLB is not recommended, its gain and its cost are comparable here; benchmark first";
    let p = file(
        "a3.json",
        r#"{"eplb_config": {"dynamic_eplb": true, "num_redundant_experts": 0},
            "deployment": {"hardware": "A3", "quant_type": "W8A8", "role": "decode",
                           "experts_per_die": 8}}"#,
    );
    let o = eplb(
        &[
            "check-config",
            p.to_str().unwrap(),
            "--experts",
            "256",
            "--ranks",
            "32",
        ],
        true,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stderr(&o).trim_end(), want);
    let out = stdout(&o);
    assert!(out.contains("mode: dynamic"), "{out}");
    assert!(out.contains("\ndeployment: given\n"), "{out}");
    assert!(
        out.contains(
            "deployment facts: hardware A3, quant_type W8A8, role decode, experts_per_die 8"
        ),
        "{out}"
    );

    // The same from flags alone.
    let bare = file("bare2.json", r#"{"eplb_config": {"dynamic_eplb": true}}"#);
    let o = eplb(
        &[
            "check-config",
            bare.to_str().unwrap(),
            "--hardware",
            "A3",
            "--role",
            "decode",
            "--experts-per-die",
            "8",
            "--tokens-per-die",
            "64",
            "--input-len",
            "3000",
        ],
        true,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains(want), "{e}");
    assert!(e.contains("warning: deployment: decode node with tokens_per_die = 64 (below 128)"));
    assert!(e.contains(
        "warning: deployment: input_len = 3000 (above 1024 tokens): start with eplb_config.eplb_heat_collection_stage = \"prefill\""
    ));
    assert_eq!(e.lines().count(), 3, "{e}");
}

#[test]
fn bad_deployment_values_are_errors() {
    let p = file(
        "bad.json",
        r#"{"deployment": {"hardware": "A4", "experts_per_die": "8", "colour": 1}}"#,
    );
    let o = eplb(&["check-config", p.to_str().unwrap()], false);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("deployment: unknown key \"colour\""), "{e}");
    assert!(
        e.contains("deployment.hardware: unknown hardware \"A4\""),
        "{e}"
    );
    assert!(
        e.contains("deployment.experts_per_die: expected an integer, got \"8\""),
        "{e}"
    );
    // A bad flag is a usage error.
    let ok = file("ok.json", "{}");
    let o = eplb(
        &["check-config", ok.to_str().unwrap(), "--hardware", "B200"],
        false,
    );
    fails_with(&o, 2, "unknown hardware \"B200\"");
}

fn plan(extra: &[&str]) -> Output {
    let loads = shared("data/traces/sglang_dsv3_prefill_in1024.json");
    eplb_plan(&loads, "32", "32", "default", extra)
}

#[test]
fn plan_reports_bytes_and_transfer_time() {
    let o = plan(&["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The existing keys stay.
    for k in [
        "policy",
        "layers",
        "par_before",
        "par_after",
        "lower_bound",
        "moves",
        "elapsed_us",
    ] {
        assert!(v.get(k).is_some(), "missing key {k}");
    }
    let moves = v["moves"].as_u64().unwrap();
    assert!(moves > 0);
    // Default payload: DeepSeek-V3 W8A8, 44085248 bytes per expert, 10 Gbit/s.
    assert_eq!(v["payload"]["expert_bytes"], 44_085_248);
    assert_eq!(v["payload"]["model"], "DeepSeek-V3/R1");
    assert_eq!(v["payload"]["quant_type"], "W8A8");
    assert_eq!(
        v["payload"]["defaulted"],
        serde_json::json!(["model", "quant", "link"])
    );
    assert_eq!(v["payload"]["tensors"].as_array().unwrap().len(), 4);
    assert_eq!(v["link"]["name"], "10gbps");
    assert_eq!(v["bytes_moved"].as_u64().unwrap(), moves * 44_085_248);
    let per_layer: Vec<u64> = v["bytes_per_layer"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(per_layer.len() as u64, v["layers"].as_u64().unwrap());
    assert_eq!(per_layer.iter().sum::<u64>(), moves * 44_085_248);
    let ms = v["transfer_ms"].as_f64().unwrap();
    let max_layer = v["transfer_ms_max_layer"].as_f64().unwrap();
    // At least one expert per changed layer on the busiest link, at most everything serial.
    assert!(ms >= max_layer && max_layer >= 35.0, "{ms} {max_layer}");
    assert!(ms <= moves as f64 * 35.27 + 1e-6, "{ms}");

    // A faster link, another model: proportionally less.
    let o = plan(&[
        "--json",
        "--model",
        "qwen3-30b",
        "--quant",
        "mxfp8",
        "--link",
        "hccs",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let w: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(w["payload"]["model"], "Qwen3-30B-A3B");
    assert_eq!(w["payload"]["defaulted"], serde_json::json!([]));
    assert_eq!(w["link"]["gbit_per_s"], 448.0);
    let b = w["payload"]["expert_bytes"].as_u64().unwrap();
    assert_eq!(b, 3 * 2048 * 768 + 1536 * 64 + 2048 * 24);
    assert_eq!(w["bytes_moved"].as_u64().unwrap(), moves * b);

    // Human output: a payload line saying what was defaulted and a cost line.
    let o = plan(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("payload: DeepSeek-V3/R1 (H=7168, I=2048) W8A8, 42.04 MiB per expert (44085248 bytes, 4 tensors); link 10gbps (10 Gbit/s per rank) [default model, quant, link: set --model/--quant/--link]"),
        "{out}"
    );
    assert!(
        out.contains(&format!("cost: {moves} expert copies, ")),
        "{out}"
    );
    assert!(out.contains("at 10gbps: about "), "{out}");

    // Custom dimensions, and the errors.
    let o = plan(&[
        "--json",
        "--hidden",
        "1024",
        "--intermediate",
        "512",
        "--quant",
        "W4A8",
        "--fused-mc2",
        "--link",
        "25gbps",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(c["payload"]["model"], "custom");
    assert_eq!(c["payload"]["fused_mc2"], true);
    assert_eq!(
        c["payload"]["expert_bytes"],
        3 * 1024 * 512 / 2 + 2 * 4 * (1024 + 1024)
    );
    let o = plan(&["--quant", "W4A16"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("W4A16"), "{}", stderr(&o));
    let o = plan(&[
        "--model",
        "qwen3-30b",
        "--hidden",
        "10",
        "--intermediate",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let o = plan(&["--link", "fast"]);
    fails_with(&o, 2, "unknown link \"fast\"");
}

#[test]
fn simulate_reports_bytes_per_cycle() {
    let trace = shared("data/series/esft_chain.json");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "simulate",
            "--trace",
            &trace,
            "--ranks",
            "8",
            "--redundant",
            "8",
            "--policy",
            "default",
            "--heat-interval",
            "10",
            "--algo-interval",
            "1",
        ];
        args.extend_from_slice(extra);
        eplb(&args, false)
    };
    let o = run(&["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in [
        "mean_par",
        "changes",
        "moves_total",
        "moves_per_change",
        "slot_writes_total",
        "policy_time_ms_mean",
    ] {
        assert!(v.get(k).is_some(), "missing key {k}");
    }
    let moves = v["moves_total"].as_u64().unwrap();
    let cycles = v["cycles"].as_u64().unwrap();
    assert!(moves > 0 && cycles > 0);
    let total = v["bytes_moved_total"].as_u64().unwrap();
    // The ESFT trace names DeepSeek-V2-Lite: H = 2048, I = 1408, bf16 (3 * H * I * 2 bytes).
    assert_eq!(total, moves * 17_301_504);
    let per_cycle = v["bytes_per_cycle_mean"].as_f64().unwrap();
    assert!((per_cycle - total as f64 / cycles as f64).abs() < 1.0);
    let ms = v["transfer_ms_per_cycle_mean"].as_f64().unwrap();
    assert!(ms > 0.0 && ms <= v["transfer_ms_per_cycle_max"].as_f64().unwrap());
    assert_eq!(v["payload"]["quant_type"], "none");
    assert_eq!(v["payload"]["model"], "DeepSeek-V2-Lite (from the trace)");
    assert_eq!(v["link"]["name"], "10gbps");

    let o = run(&["--link", "roce", "--quant", "W8A8", "--fused-mc2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains(
            "payload: DeepSeek-V2-Lite (from the trace) (H=2048, I=1408) W8A8 fused MC2, "
        ),
        "{out}"
    );
    assert!(
        out.contains("6 tensors); link roce (200 Gbit/s per rank)\n"),
        "{out}"
    );
    assert!(
        out.contains(&format!(" moved over {cycles} cycles (")),
        "{out}"
    );
    assert!(out.contains("at roce: about "), "{out}");
}
