//! The `eplb` binary: subcommands, `--json` keys, exit codes and `error: ...` messages.

mod common;

use std::process::Command;

use common::{eplb, eplb_plan, fails_with, shared, stderr, stdout, tmp};

#[test]
fn plan_writes_a_map_that_validates_and_prints_the_json_keys() {
    let dir = tmp("plan");
    let out = dir.join("map.json");
    let o = eplb_plan(
        &shared("data/traces/sglang_dsv3_prefill_in1024.json"),
        "32",
        "32",
        "default",
        &["--out", out.to_str().unwrap(), "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in [
        "policy",
        "layers",
        "par_before",
        "par_after",
        "lower_bound",
        "moves",
        "elapsed_us",
    ] {
        assert!(v.get(k).is_some(), "missing key {k} in {v}");
    }
    assert_eq!(v["policy"], "default");
    assert_eq!(v["layers"], 58);
    assert_eq!(v["par_after"].as_array().unwrap().len(), 58);
    let after: f64 = v["par_after"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .sum();
    assert!(after / 58.0 < 1.02);
    let o = eplb(&[
        "validate",
        out.to_str().unwrap(),
        "--experts",
        "256",
        "--ranks",
        "32",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The written map is a valid --current for the next plan, which then moves little.
    let o = eplb_plan(
        &shared("data/traces/sglang_dsv3_prefill_in1024.json"),
        "32",
        "32",
        "swift",
        &["--current", out.to_str().unwrap(), "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn deepseek_plan_with_colocated_copies_warns_and_validate_rejects_it() {
    let dir = tmp("dup");
    let out = dir.join("map.json");
    let o = eplb(&[
        "plan",
        "--loads",
        &shared("data/traces/sglang_dsv3_decode_in1000out1000.json"),
        "--ranks",
        "64",
        "--redundant",
        "64",
        "--ranks-per-node",
        "8",
        "--groups",
        "8",
        "--policy",
        "deepseek",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("warning:"), "{}", stderr(&o));
    let o = eplb(&["validate", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("error:"), "{}", stderr(&o));
    let o = eplb(&["validate", out.to_str().unwrap(), "--allow-duplicates"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn simulate_json_has_every_metric_key() {
    let o = eplb(&[
        "simulate",
        "--trace",
        &shared("data/series/esft_chain.json"),
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
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in [
        "mean_par",
        "p99_par",
        "max_par",
        "mean_par_from_first_activation",
        "p99_par_from_first_activation",
        "changes",
        "moves_total",
        "moves_per_change",
        "slot_writes_total",
        "same_rank_duplicate_rows_max",
        "policy_time_ms_mean",
        "policy_time_ms_max",
    ] {
        assert!(v.get(k).is_some(), "missing key {k}");
    }
    // vLLM-Ascend DefaultEplb's published row (dynamic-anchors.md, esft_chain_r8x8).
    assert!((v["mean_par"].as_f64().unwrap() - 1.2513).abs() < 5e-5);
    assert_eq!(v["changes"], 17);
}

#[test]
fn placements_log_is_written() {
    let dir = tmp("log");
    let log = dir.join("p.json");
    let o = eplb(&[
        "simulate",
        "--trace",
        &shared("data/series/esft_chain.json"),
        "--ranks",
        "8",
        "--redundant",
        "8",
        "--policy",
        "swift",
        "--heat-interval",
        "10",
        "--algo-interval",
        "1",
        "--placements-log",
        log.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&log).unwrap()).unwrap();
    assert_eq!(v["format"], "eplb-placements/v1");
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 18);
    assert_eq!(entries[0]["active_from_window"], 0);
    assert_eq!(entries[1]["active_from_window"], 11);
    assert_eq!(entries[2]["active_from_window"], 22);
    assert_eq!(entries[1]["placement"].as_array().unwrap().len(), 26);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn hotness_prints_the_numbers() {
    let o = eplb(&[
        "hotness",
        "--map",
        &shared("data/golden/asc_maps.json").replace("asc_maps.json", "missing.json"),
        "--loads",
        &shared("data/traces/sglang_dsv3_prefill_in1024.json"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).starts_with("error: "), "{}", stderr(&o));
    let dir = tmp("hot");
    let map = dir.join("m.json");
    let o = eplb_plan(
        &shared("data/traces/sglang_dsv3_prefill_in1024.json"),
        "32",
        "32",
        "default",
        &["--out", map.to_str().unwrap()],
    );
    assert!(o.status.success());
    let o = eplb(&[
        "hotness",
        "--map",
        map.to_str().unwrap(),
        "--loads",
        &shared("data/traces/sglang_dsv3_prefill_in1024.json"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("[Expert Hotness] current: mean=1.00"), "{out}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn check_config_reports_every_problem_and_the_env_guard() {
    let dir = tmp("cfg");
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"eplb_config": {"dynamic_epbl": true, "expert_heat_collection_interval": 0}}"#,
    )
    .unwrap();
    let o = eplb(&["check-config", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("dynamic_eplb"), "{e}");
    assert!(e.contains("expert_heat_collection_interval"), "{e}");
    let dynamic = dir.join("dyn.json");
    std::fs::write(
        &dynamic,
        r#"{"dynamic_eplb": true, "num_redundant_experts": 2}"#,
    )
    .unwrap();
    let o = eplb(&["check-config", dynamic.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "env guard must fail without DYNAMIC_EPLB"
    );
    assert!(stderr(&o).contains("DYNAMIC_EPLB"), "{}", stderr(&o));
    let o = Command::new(env!("CARGO_BIN_EXE_eplb"))
        .args([
            "check-config",
            dynamic.to_str().unwrap(),
            "--experts",
            "8",
            "--ranks",
            "3",
        ])
        .env("DYNAMIC_EPLB", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("nearest valid"), "{}", stderr(&o));
    let o = Command::new(env!("CARGO_BIN_EXE_eplb"))
        .args([
            "check-config",
            dynamic.to_str().unwrap(),
            "--experts",
            "8",
            "--ranks",
            "2",
        ])
        .env("DYNAMIC_EPLB", "TRUE")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("dynamic"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn usage_errors_exit_2_and_bad_input_exits_1() {
    let o = eplb(&["simulate", "--ranks", "8"]);
    assert_eq!(o.status.code(), Some(2));
    let o = eplb(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
    let o = eplb_plan("/nonexistent.json", "8", "8", "default", &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).starts_with("error: "));
    let o = eplb_plan(
        &shared("data/traces/sglang_dsv3_prefill_in1024.json"),
        "32",
        "31",
        "default",
        &[],
    );
    fails_with(&o, 1, "nearest valid redundant counts: 0 or 32");
    let o = eplb_plan(
        &shared("data/traces/sglang_dsv3_prefill_in1024.json"),
        "32",
        "32",
        "fastest",
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("unknown policy"), "{}", stderr(&o));
}

#[test]
fn param_sets_the_policy_and_names_a_bad_key() {
    let loads = shared("data/traces/sglang_dsv3_prefill_in1024.json");
    let moves = |extra: &[&str]| {
        let mut args = vec!["--json"];
        args.extend_from_slice(extra);
        let o = eplb_plan(&loads, "32", "32", "incremental", &args);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["moves"].as_u64().unwrap()
    };
    let free = moves(&[]);
    assert!(free > 10, "{free}");
    assert!(moves(&["--param", "max_fetches=10"]) <= 10);
    assert_eq!(
        moves(&["--param", "max_fetches=10", "--param", "min_gain=100"]),
        0
    );
    for (arg, want) in [
        (
            "min_gainz=1",
            "unknown parameter `min_gainz` for policy `incremental`",
        ),
        ("max_fetches=-1", "`max_fetches` = -1 is out of range"),
        ("max_fetches", "expected KEY=VALUE"),
    ] {
        let o = eplb_plan(&loads, "32", "32", "incremental", &["--param", arg]);
        assert_ne!(o.status.code(), Some(0), "{arg}");
        assert!(stderr(&o).contains(want), "{arg}: {}", stderr(&o));
    }
    let o = eplb_plan(&loads, "32", "32", "flashlb", &["--param", "min_gain=0.1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(
            "error: --param: unknown parameter `min_gain` for policy `flashlb` (it takes: none)"
        ),
        "{}",
        stderr(&o)
    );

    let sim = |policy: &str, extra: &[&str]| {
        let mut args = vec![
            "simulate",
            "--trace",
            "",
            "--ranks",
            "8",
            "--redundant",
            "8",
            "--policy",
            policy,
            "--heat-interval",
            "10",
            "--algo-interval",
            "1",
            "--json",
        ];
        let trace = shared("data/series/esft_chain.json");
        args[2] = &trace;
        args.extend_from_slice(extra);
        eplb(&args)
    };
    let o = sim("incremental", &["--param", "max_fetches=0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["moves_total"], 0);
    let o = sim("incremental", &["--param", "max_fetches=4"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let capped = v["moves_total"].as_u64().unwrap();
    assert!(capped > 0 && capped <= 4 * v["changes"].as_u64().unwrap());
    let o = sim("static", &["--param", "z=1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("policy `static` takes no parameters"));
}

#[test]
fn a_one_shot_incremental_plan_from_the_default_layout_rebuilds_to_flashlb_balance() {
    let dir = tmp("one-shot");
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(shared("data/golden/dsv3_prefill_ep32.json")).unwrap(),
    )
    .unwrap();
    let loads = dir.join("loads.json");
    std::fs::write(&loads, golden["input"]["loads"].to_string()).unwrap();
    let loads = loads.to_str().unwrap();
    let plan = |policy: &str, extra: &[&str]| {
        let mut args = vec!["--json"];
        args.extend_from_slice(extra);
        let o = eplb_plan(loads, "32", "32", policy, &args);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let par = v["par_after"].as_array().unwrap();
        let mean = par.iter().map(|x| x.as_f64().unwrap()).sum::<f64>() / par.len() as f64;
        (mean, v["moves"].as_u64().unwrap())
    };
    let (flash_par, flash_moves) = plan("flashlb", &[]);
    let (par, moves) = plan("incremental", &[]);
    assert!(par <= 1.01 * flash_par, "{par} vs flashlb {flash_par}");
    assert!(moves < flash_moves, "{moves} vs flashlb {flash_moves}");
    // The loop's threshold, asked for, keeps the search's frugal plan.
    let (loop_par, loop_moves) = plan("incremental", &["--param", "cold_start=5"]);
    assert!(loop_moves < moves / 2, "{loop_moves} vs {moves}");
    assert!(loop_par > par, "{loop_par} vs {par}");

    // The text output says so.
    let said = |extra: &[&str]| stdout(&eplb_plan(loads, "32", "32", "incremental", extra));
    assert!(said(&[]).contains("every layer rebuilt (cold_start=1"));
    assert!(!said(&["--param", "cold_start=5"]).contains("every layer rebuilt"));

    // The default layout given as a file is the same cold start; any other placement is not.
    let map = |name: &str, extra: &[&str]| {
        let out = dir.join(name);
        let mut args = vec!["--out", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = eplb_plan(loads, "32", "32", "incremental", &args);
        assert!(o.status.success(), "{}", stderr(&o));
        out.to_str().unwrap().to_owned()
    };
    let default = map("default.json", &["--param", "max_fetches=0"]);
    assert_eq!(plan("incremental", &["--current", &default]), (par, moves));
    let built = map("built.json", &[]);
    let (next_par, next_moves) = plan("incremental", &["--current", &built]);
    assert!(next_moves < moves / 10, "{next_moves} after {moves}");
    // The search values log2phy routing, not the even split `par_after` measures, so it may
    // trade a little of it; it keeps the rebuild's lead over the frugal plan.
    assert!(
        next_par < loop_par,
        "{next_par} after {par}, frugal {loop_par}"
    );
}

/// `simulate --payoff-gate`: on the shared ESFT series, every policy's total estimated time
/// (MoE time plus stalls, as the net saving against static) is lower with the gate than
/// without, and it fetches fewer copies.
#[test]
fn the_payoff_gate_lowers_every_policys_estimated_time_on_the_esft_series() {
    let trace = shared("data/series/esft_chain.json");
    let run = |policy: &str, gate: bool| -> serde_json::Value {
        let mut args = vec![
            "simulate",
            "--trace",
            &trace,
            "--ranks",
            "8",
            "--redundant",
            "8",
            "--policy",
            policy,
            "--heat-interval",
            "10",
            "--algo-interval",
            "1",
            "--json",
        ];
        if gate {
            args.push("--payoff-gate");
        }
        let o = eplb(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(stdout(&o).trim()).unwrap()
    };
    for policy in ["default", "swift", "flashlb", "incremental", "deepseek"] {
        let (off, on) = (run(policy, false), run(policy, true));
        let net = |v: &serde_json::Value| v["est_net_saving_pct"].as_f64().unwrap();
        let moves = |v: &serde_json::Value| v["moves_total"].as_u64().unwrap();
        assert!(
            net(&on) > net(&off),
            "{policy}: gated {} vs {}",
            net(&on),
            net(&off)
        );
        assert!(
            moves(&on) < moves(&off),
            "{policy}: gated {} vs {} moves",
            moves(&on),
            moves(&off)
        );
        assert!(
            on["est_stall_ms_total"].as_f64() < off["est_stall_ms_total"].as_f64(),
            "{policy}"
        );
    }
}

/// `eplb check-config` prints the pay-off gate with its calibration file, and a calibration
/// file it cannot use is an `error:` naming the key, exit 1.
#[test]
fn check_config_prints_the_gates_calibration_and_names_a_bad_one() {
    let dir = tmp("cfg-gate-calibration");
    let calib = dir.join("calib.json");
    std::fs::write(
        &calib,
        r#"{"format": "eplb-calibration/v1", "multipliers":
            {"host": 1.5, "backbone": 1, "gemm": 1, "link": 1, "latency": 1}}"#,
    )
    .unwrap();
    let cfg = |calibration: &std::path::Path| {
        let p = dir.join("cfg.json");
        std::fs::write(
            &p,
            serde_json::json!({
                "dynamic_eplb": true,
                "eplb_payoff_gate": {"calibration": calibration.to_str().unwrap()},
            })
            .to_string(),
        )
        .unwrap();
        Command::new(env!("CARGO_BIN_EXE_eplb"))
            .args(["check-config", p.to_str().unwrap()])
            .env("DYNAMIC_EPLB", "1")
            .output()
            .unwrap()
    };
    let o = cfg(&calib);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("eplb_payoff_gate: on (")
            && stdout(&o).contains(&format!("calibration {})", calib.display())),
        "{}",
        stdout(&o)
    );
    let o = cfg(&dir.join("missing.json"));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with("error: ")
            && stderr(&o).contains("eplb_config.eplb_payoff_gate.calibration: ")
            && stderr(&o).contains("missing.json"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(dir).unwrap();
}
