//! Issue 17 at the `eplb` binary: bounded input (class 1), output errors (2), atomic and safe
//! writes (7), strict readers (8).

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{eplb, fails_with, plan_args, shared, stderr, stdout, tmp};

const MIXTRAL: &str = "data/traces/mixtral8x7b_gsm8k_decode.json";

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_eplb"));
    c.env_remove("DYNAMIC_EPLB").env_remove("EXPERT_MAP_RECORD");
    c
}

/// A small `[L][N]` loads file (2 layers, 8 experts).
fn loads_file(dir: &Path) -> PathBuf {
    let p = dir.join("loads.json");
    std::fs::write(&p, "[[9,1,1,1,5,1,1,1],[1,1,7,1,1,1,1,3]]").unwrap();
    p
}

/// Every command with `input` in the position of each of its input files.
fn commands_reading(input: &str, dir: &Path) -> Vec<Vec<String>> {
    let loads = loads_file(dir);
    let map = dir.join("map.json");
    let o = bin()
        .args(["plan", "--loads", loads.to_str().unwrap()])
        .args(["--ranks", "2", "--redundant", "0", "--policy", "default"])
        .args(["--out", map.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (l, m) = (loads.to_str().unwrap(), map.to_str().unwrap());
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let plan = [
        "plan",
        "--ranks",
        "2",
        "--redundant",
        "0",
        "--policy",
        "default",
    ];
    let with = |extra: &[&str]| {
        let mut x = v(&plan);
        x.extend(v(extra));
        x
    };
    vec![
        with(&["--loads", input]),
        with(&["--loads", l, "--current", input]),
        v(&["validate", input]),
        v(&["check-config", input]),
        v(&["hotness", "--map", input, "--loads", l]),
        v(&["hotness", "--map", m, "--loads", input]),
        v(&[
            "simulate",
            "--trace",
            input,
            "--ranks",
            "2",
            "--redundant",
            "0",
            "--policy",
            "default",
            "--heat-interval",
            "1",
            "--algo-interval",
            "1",
        ]),
    ]
}

#[test]
fn endless_and_special_files_are_refused_at_once() {
    let dir = tmp("special");
    let fifo = dir.join("fifo");
    let _ = std::fs::remove_file(&fifo);
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let d = dir.display().to_string();
    for (input, what) in [
        ("/dev/zero", "a character device"),
        ("/dev/urandom", "a character device"),
        (fifo.to_str().unwrap(), "a FIFO"),
        (d.as_str(), "a directory"),
    ] {
        for args in commands_reading(input, &dir) {
            let started = Instant::now();
            let o = bin().args(&args).stdin(Stdio::null()).output().unwrap();
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{args:?} took {:?}",
                started.elapsed()
            );
            assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
            let e = stderr(&o);
            assert!(e.starts_with(&format!("error: {input}: ")), "{args:?}: {e}");
            assert!(
                e.contains(&format!("not a regular file ({what})")),
                "{args:?}: {e}"
            );
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_input_size_limit_is_a_flag_with_a_documented_default() {
    let dir = tmp("limit");
    let loads = loads_file(&dir);
    let size = std::fs::metadata(&loads).unwrap().len();
    let l = loads.to_str().unwrap();
    let base = [
        "plan",
        "--loads",
        l,
        "--ranks",
        "2",
        "--redundant",
        "0",
        "--policy",
        "default",
    ];
    let o = bin()
        .args(base)
        .args(["--max-input-bytes", &(size - 1).to_string()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!(
            "error: {l}: {size} bytes is over the input size limit of {} bytes (--max-input-bytes)\n",
            size - 1
        )
    );
    let o = bin()
        .args(base)
        .args(["--max-input-bytes", &size.to_string()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let help = stdout(&eplb(&["plan", "--help"]));
    assert!(help.contains("--max-input-bytes"), "{help}");
    assert!(help.contains("default 1 GiB"), "{help}");
    assert!(help.contains("[default: 1073741824]"), "{help}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Every command that prints, in its human and `--json` forms.
fn printing_commands(dir: &Path) -> Vec<Vec<String>> {
    let loads = loads_file(dir);
    let map = dir.join("map.json");
    let cfg = dir.join("cfg.json");
    std::fs::write(&cfg, "{\"eplb_config\": {}}").unwrap();
    let (l, m) = (loads.to_str().unwrap(), map.to_str().unwrap());
    let trace = shared(MIXTRAL);
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let plan = v(&[
        "plan",
        "--loads",
        l,
        "--ranks",
        "2",
        "--redundant",
        "0",
        "--policy",
        "default",
        "--out",
        m,
    ]);
    let o = bin().args(&plan).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let sim = v(&[
        "simulate",
        "--trace",
        &trace,
        "--ranks",
        "2",
        "--redundant",
        "2",
        "--policy",
        "default",
        "--heat-interval",
        "2",
        "--algo-interval",
        "1",
    ]);
    let json = |mut x: Vec<String>| {
        x.push("--json".into());
        x
    };
    vec![
        plan.clone(),
        json(plan),
        sim.clone(),
        json(sim),
        v(&["validate", m]),
        v(&["check-config", cfg.to_str().unwrap()]),
        v(&["hotness", "--map", m, "--loads", l]),
        v(&["--help"]),
    ]
}

#[test]
fn a_closed_pipe_ends_every_command_quietly() {
    let dir = tmp("epipe");
    for args in printing_commands(&dir) {
        let mut child = bin()
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Close the read end before the command prints.
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "{args:?}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_full_disk_on_stdout_is_an_error() {
    let dir = tmp("full");
    for args in printing_commands(&dir) {
        let o = bin()
            .args(&args)
            .stdout(File::create("/dev/full").unwrap())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).ends_with("error: stdout: No space left on device (os error 28)\n"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_output_path_equal_to_an_input_is_refused() {
    let dir = tmp("same");
    let loads = loads_file(&dir);
    let before = std::fs::read(&loads).unwrap();
    let l = loads.to_str().unwrap();
    // The same file under another spelling.
    let again = dir.join(".").join("loads.json");
    let o = eplb(&[
        "plan",
        "--loads",
        l,
        "--ranks",
        "2",
        "--redundant",
        "0",
        "--policy",
        "default",
        "--out",
        again.to_str().unwrap(),
    ]);
    fails_with(&o, 1, "the output is the input file");
    let map = dir.join("map.json");
    let m = map.to_str().unwrap();
    let plan = |extra: &[&str]| {
        let mut a = vec![
            "plan",
            "--loads",
            l,
            "--ranks",
            "2",
            "--redundant",
            "0",
            "--policy",
            "default",
        ];
        a.extend_from_slice(extra);
        eplb(&a)
    };
    assert!(plan(&["--out", m]).status.success());
    let o = plan(&["--current", m, "--out", m]);
    fails_with(&o, 1, "the output is the input file");
    let trace = dir.join("trace.json");
    std::fs::copy(shared(MIXTRAL), &trace).unwrap();
    let t = trace.to_str().unwrap();
    let o = eplb(&[
        "simulate",
        "--trace",
        t,
        "--ranks",
        "2",
        "--redundant",
        "2",
        "--policy",
        "default",
        "--heat-interval",
        "2",
        "--algo-interval",
        "1",
        "--placements-log",
        t,
    ]);
    fails_with(&o, 1, "the output is the input file");
    assert_eq!(std::fs::read(&loads).unwrap(), before);
    assert_eq!(
        std::fs::read(&trace).unwrap(),
        std::fs::read(shared(MIXTRAL)).unwrap()
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_reader_never_sees_a_partial_map_while_plan_rewrites_it() {
    let dir = tmp("atomic");
    let loads = loads_file(&dir);
    let map = dir.join("map.json");
    let run = |seed: u32| {
        bin()
            .args(["plan", "--loads", loads.to_str().unwrap()])
            .args(["--ranks", "2", "--redundant", "2", "--policy", "random"])
            .args(["--seed", &seed.to_string(), "--out", map.to_str().unwrap()])
            .output()
            .unwrap()
    };
    assert!(run(0).status.success());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (map, stop) = (map.clone(), std::sync::Arc::clone(&stop));
        std::thread::spawn(move || {
            let (mut reads, mut bad) = (0, 0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let bytes = std::fs::read(&map).unwrap();
                reads += 1;
                if serde_json::from_slice::<serde_json::Value>(&bytes).is_err() {
                    bad += 1;
                }
            }
            (reads, bad)
        })
    };
    for seed in 1..40 {
        assert!(run(seed).status.success());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reads, bad) = reader.join().unwrap();
    assert!(reads > 0);
    assert_eq!(bad, 0, "{bad} of {reads} reads saw a partial map");
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names.iter().all(|n| !n.ends_with(".tmp")),
        "temporary files left: {names:?}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn extreme_shapes_are_refused_before_memory_is_taken() {
    let dir = tmp("extreme");
    let loads = dir.join("tiny.json");
    std::fs::write(&loads, "[[1, 2]]").unwrap();
    let l = loads.to_str().unwrap();
    for policy in [
        "flashlb",
        "default",
        "deepseek",
        "incremental",
        "swift",
        "random",
    ] {
        let started = Instant::now();
        let o = eplb(&plan_args(l, "65535", "65533", policy));
        assert!(started.elapsed() < Duration::from_secs(10), "{policy}");
        assert_eq!(o.status.code(), Some(1), "{policy}: {}", stderr(&o));
        assert_eq!(
            stderr(&o),
            format!("error: policy {policy}: ranks: 65535 is over the supported limit of 2048\n")
        );
    }
    let eight = loads_file(&dir);
    let o = eplb(&plan_args(eight.to_str().unwrap(), "1024", "8184", "swift"));
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: policy swift: slots per layer (ranks x slots per rank): 8192 is over the supported limit of 4096\n"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn every_policy_plans_from_a_colocated_current_map() {
    let dir = tmp("coloc");
    let map = dir.join("current.json");
    let m = map.to_str().unwrap();
    let trace = shared("data/traces/sglang_dsv3_decode_in1000out1000.json");
    let mut args = plan_args(&trace, "64", "64", "deepseek");
    args.extend(["--ranks-per-node", "8", "--groups", "8", "--out", m]);
    let o = eplb(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("holds an expert twice"),
        "{}",
        stderr(&o)
    );
    for policy in [
        "random",
        "default",
        "swift",
        "flashlb",
        "incremental",
        "deepseek",
    ] {
        let out = dir.join(format!("{policy}.json"));
        let mut args = plan_args(&trace, "64", "64", policy);
        args.extend(["--current", m, "--out", out.to_str().unwrap(), "--json"]);
        let o = eplb(&args);
        assert!(o.status.success(), "{policy}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.starts_with(&format!("warning: {m}: "))
                && e.contains("layer ")
                && e.contains(" device "),
            "{policy}: {e}"
        );
        if policy != "deepseek" {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["colocated_rows"], 0, "{policy}");
            // Strict validation: no co-located copies.
            let o = eplb(&["validate", out.to_str().unwrap()]);
            assert!(o.status.success(), "{policy}: {}", stderr(&o));
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

fn simulate_args<'a>(trace: &'a str, policy: &'a str) -> Vec<&'a str> {
    vec![
        "simulate",
        "--trace",
        trace,
        "--ranks",
        "8",
        "--redundant",
        "8",
        "--policy",
        policy,
        "--heat-interval",
        "2",
        "--algo-interval",
        "1",
    ]
}

#[test]
fn simulate_refuses_a_topology_plan_refuses() {
    let trace = shared("data/traces/esft_dsv2lite_law.json");
    let mut args = simulate_args(&trace, "deepseek");
    args.extend(["--groups", "6", "--json"]);
    let o = eplb(&args);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert_eq!(stdout(&o), "");
    assert_eq!(
        stderr(&o),
        "error: policy deepseek: hierarchical DeepSeek EPLB needs experts divisible by expert groups (got 6)\n"
    );
    // A run whose plans succeed reports zero failures.
    let mut args = simulate_args(&trace, "deepseek");
    args.push("--json");
    let o = eplb(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["plan_failures"], 0);
    assert!(v["cycles"].as_u64().unwrap() > 0);
}

#[test]
fn simulate_refuses_counts_that_do_not_fit_u32() {
    let dir = tmp("u32");
    let trace = dir.join("big.json");
    std::fs::write(
        &trace,
        r#"{"format": "eplb-trace/v1", "counts": [[[1, 2, 3, 4]], [[5, 4294967296, 7, 8]], [[1, 1, 1, 1]]]}"#,
    )
    .unwrap();
    let t = trace.to_str().unwrap();
    let o = eplb(&[
        "simulate",
        "--trace",
        t,
        "--ranks",
        "2",
        "--redundant",
        "0",
        "--policy",
        "default",
        "--heat-interval",
        "1",
        "--algo-interval",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(1));
    // A trace that names no model is priced as DeepSeek-V3, and says so first.
    let e = stderr(&o);
    let (warning, error) = e.split_once('\n').unwrap();
    assert!(
        warning.starts_with("warning: ") && warning.contains("deepseek-v3"),
        "{e}"
    );
    assert_eq!(
        error,
        "error: trace window 1, layer 0, expert 1: count 4294967296 does not fit a per-iteration u32 counter (at most 4294967295)\n"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn strict_readers_refuse_duplicate_keys_and_keep_serde_reasons() {
    let dir = tmp("strict");
    let w = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    // check-config: the second "dynamic_eplb" would silently win.
    let cfg = w(
        "dup.json",
        r#"{"eplb_config": {"dynamic_eplb": true, "dynamic_eplb": false}}"#,
    );
    let o = eplb(&["check-config", &cfg]);
    fails_with(&o, 1, "duplicate key \"dynamic_eplb\"");
    // validate (strict) and the lenient --current reader.
    let map = w(
        "dupmap.json",
        r#"{"moe_layer_count": 1, "moe_layer_count": 1, "layer_list": [{"layer_id": 0, "device_count": 1, "device_list": [{"device_id": 0, "device_expert": [0, 1]}]}]}"#,
    );
    let o = eplb(&["validate", &map]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!("error: {map}: line 1, column 43: duplicate key \"moe_layer_count\"\n")
    );
    // A UTF-8 byte order mark is skipped.
    let good = r#"{"moe_layer_count": 1, "layer_list": [{"layer_id": 0, "device_count": 1, "device_list": [{"device_id": 0, "device_expert": [0, 1]}]}]}"#;
    let bom = w("bom.json", &format!("\u{feff}{good}"));
    let o = eplb(&["validate", &bom]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bomcfg = w("bomcfg.json", "\u{feff}{\"eplb_config\": {}}");
    let o = eplb(&["check-config", &bomcfg]);
    assert!(o.status.success(), "{}", stderr(&o));
    // serde's reasons: number out of range, nesting too deep.
    let huge = w("huge.json", "[[1e999, 2]]");
    let o = eplb(&plan_args(&huge, "1", "0", "default"));
    fails_with(&o, 1, "JSON syntax error: number out of range");
    let deep = w(
        "deep.json",
        &format!("{}{}", "[".repeat(200), "]".repeat(200)),
    );
    let o = eplb(&["validate", &deep]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("nesting too deep"), "{}", stderr(&o));
    let o = eplb(&[
        "check-config",
        &w(
            "huge_cfg.json",
            r#"{"eplb_config": {"num_redundant_experts": 1e999}}"#,
        ),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("number out of range"), "{}", stderr(&o));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn degenerate_options_get_their_own_message() {
    let dir = tmp("degenerate");
    let loads = loads_file(&dir);
    let l = loads.to_str().unwrap();
    // --ranks everywhere follows its one rule (eplb_core::settings::ranks).
    for args in [
        vec!["validate", l, "--ranks", "0"],
        vec!["check-config", l, "--ranks", "0"],
        vec![
            "plan",
            "--loads",
            l,
            "--ranks",
            "0",
            "--redundant",
            "0",
            "--policy",
            "swift",
        ],
    ] {
        let o = eplb(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            stderr(&o).contains("invalid value '0'")
                && stderr(&o).contains(
                    "ranks must be an integer in 1..=65535, got 0 (ranks are numbered in 16 bits)"
                ),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    for args in [
        vec!["validate", l, "--experts", "0"],
        vec!["check-config", l, "--experts", "0"],
    ] {
        let o = eplb(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            stderr(&o).contains("invalid value '0'")
                && stderr(&o).contains("0 is not in 1..=65535"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    let mut args = plan_args(l, "2", "0", "default");
    args.extend(["--link", "1e-300gbps"]);
    let o = eplb(&args);
    fails_with(
        &o,
        2,
        "link \"1e-300gbps\": link must be a rate in [1e6, 1e15] bytes/s (8 Mbit/s to 8 Pbit/s), got 1.25e-292",
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_config_naming_a_fifo_or_a_device_as_its_map_is_refused_at_once() {
    let dir = tmp("cfgfifo");
    let fifo = dir.join("map.json");
    let _ = std::fs::remove_file(&fifo);
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let zero = dir.join("zero.json");
    let _ = std::fs::remove_file(&zero);
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    for map in [fifo.to_str().unwrap(), zero.to_str().unwrap()] {
        let cfg = dir.join("cfg.json");
        std::fs::write(
            &cfg,
            format!("{{\"eplb_config\": {{\"expert_map_path\": {map:?}}}}}"),
        )
        .unwrap();
        let started = Instant::now();
        let o = eplb(&["check-config", cfg.to_str().unwrap()]);
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_closed_stderr_never_panics() {
    let dir = tmp("stderr");
    let loads = loads_file(&dir);
    let l = loads.to_str().unwrap();
    // An error, and a warning followed by output, with both streams closed early.
    for (args, code) in [
        (plan_args("/dev/zero", "2", "0", "default"), 1),
        (plan_args(l, "2", "0", "default"), 0),
    ] {
        let mut child = bin()
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        drop(child.stderr.take());
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(code), "{args:?}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
