//! Issue 27 at the `eplb` binary: every writer replaces only regular files (a symbolic link is
//! followed, a FIFO or a device written through), refuses its own inputs, and leaves no
//! temporary file when interrupted; every reader refuses an oversized input before parsing; a
//! trace shorter than one cycle is said so.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{eplb, fails_with, shared, stderr, stdout, tmp};

const MIXTRAL: &str = "data/traces/mixtral8x7b_gsm8k_decode.json";

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_eplb"));
    c.env_remove("DYNAMIC_EPLB")
        .env_remove("EXPERT_MAP_RECORD")
        .env_remove("EPLB_TEST_HOLD_WRITE");
    c
}

/// A small `[L][N]` loads file (2 layers, 8 experts).
fn loads_file(dir: &Path) -> PathBuf {
    let p = dir.join("loads.json");
    std::fs::write(&p, "[[9,1,1,1,5,1,1,1],[1,1,7,1,1,1,1,3]]").unwrap();
    p
}

fn plan_to(loads: &Path, out: &str) -> Vec<String> {
    [
        "plan",
        "--loads",
        loads.to_str().unwrap(),
        "--ranks",
        "2",
        "--redundant",
        "2",
        "--policy",
        "default",
        "--out",
        out,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The names in `dir` ending in `.tmp`.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

#[test]
fn dev_null_and_dev_stdout_are_written_through_never_replaced() {
    let dir = tmp("devnull");
    let loads = loads_file(&dir);
    let o = bin().args(plan_to(&loads, "/dev/null")).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let ft = std::fs::symlink_metadata("/dev/null").unwrap().file_type();
    assert!(ft.is_char_device(), "/dev/null is now {ft:?}");
    // stdout a pipe: the map arrives on it, and /dev/stdout stays a link.
    let o = bin().args(plan_to(&loads, "/dev/stdout")).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        std::fs::symlink_metadata("/dev/stdout")
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let out = stdout(&o);
    assert!(out.starts_with("{"), "{out}");
    assert!(out.contains("\"layer_list\""), "{out}");
    assert!(out.contains("wrote /dev/stdout"), "{out}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_fifo_is_written_through() {
    let dir = tmp("fifo");
    let loads = loads_file(&dir);
    let fifo = dir.join("out.fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let o = bin()
        .args(plan_to(&loads, fifo.to_str().unwrap()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let got = reader.join().unwrap();
    assert!(got.contains("\"layer_list\""), "{got}");
    let ft = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(ft.is_fifo(), "the FIFO is now {ft:?}");
    assert!(temporaries(&dir).is_empty());
    std::fs::remove_dir_all(dir).unwrap();
}

/// A writer: its output's file name, its arguments for an output path, what the output holds.
type WriterCase<'a> = (&'a str, Box<dyn Fn(&str) -> Vec<String> + 'a>, &'a str);

#[test]
fn every_writer_follows_a_symlink_to_its_file_and_keeps_the_link() {
    let dir = tmp("links");
    let real = dir.join("real");
    std::fs::create_dir_all(&real).unwrap();
    let loads = loads_file(&dir);
    let map = dir.join("map.json");
    let o = bin()
        .args(plan_to(&loads, map.to_str().unwrap()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let trace = shared(MIXTRAL);
    let sim = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "--trace",
            trace.as_str(),
            "--ranks",
            "2",
            "--redundant",
            "2",
            "--heat-interval",
            "2",
            "--algo-interval",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let (l, m) = (loads.to_str().unwrap(), map.to_str().unwrap());
    let cases: Vec<WriterCase<'_>> = vec![
        (
            "plan.json",
            Box::new(|out: &str| plan_to(&loads, out)),
            "\"layer_list\"",
        ),
        (
            "hot.svg",
            Box::new(|out: &str| {
                ["hotness", "--map", m, "--loads", l, "--svg", out]
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
            }),
            "<svg",
        ),
        (
            "log.json",
            Box::new(|out: &str| {
                let mut v = vec!["simulate".to_string()];
                v.extend(sim(&["--policy", "default", "--placements-log", out]));
                v
            }),
            "eplb-placements/v1",
        ),
        (
            "report.html",
            Box::new(|out: &str| {
                let mut v = vec!["report".to_string()];
                v.extend(sim(&["--policies", "default", "--out", out]));
                v
            }),
            "<html",
        ),
    ];
    for (name, args, needle) in cases {
        let target = real.join(name);
        std::fs::write(&target, "old").unwrap();
        let link = dir.join(format!("link-{name}"));
        symlink(Path::new("real").join(name), &link).unwrap();
        let o = bin().args(args(link.to_str().unwrap())).output().unwrap();
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{name}: the link was replaced"
        );
        let text = std::fs::read_to_string(&target).unwrap();
        assert!(text.contains(needle), "{name}: {text:.200}");
        assert!(temporaries(&dir).is_empty(), "{name}");
        assert!(temporaries(&real).is_empty(), "{name}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn hotness_svg_refuses_its_own_inputs_and_links_to_them() {
    let dir = tmp("svg-input");
    let loads = loads_file(&dir);
    let map = dir.join("map.json");
    let o = bin()
        .args(plan_to(&loads, map.to_str().unwrap()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (map_before, loads_before) = (std::fs::read(&map).unwrap(), std::fs::read(&loads).unwrap());
    let map_link = dir.join("map-link.svg");
    let loads_link = dir.join("loads-link.svg");
    symlink(&map, &map_link).unwrap();
    symlink(&loads, &loads_link).unwrap();
    let (l, m) = (loads.to_str().unwrap(), map.to_str().unwrap());
    for out in [&map, &loads, &map_link, &loads_link] {
        let o = eplb(&[
            "hotness",
            "--map",
            m,
            "--loads",
            l,
            "--svg",
            out.to_str().unwrap(),
        ]);
        fails_with(&o, 1, "the output is the input file");
        assert!(stderr(&o).starts_with("error: "), "{}", stderr(&o));
    }
    assert_eq!(std::fs::read(&map).unwrap(), map_before);
    assert_eq!(std::fs::read(&loads).unwrap(), loads_before);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Starts `plan --out OUT` held before its rename (`EPLB_TEST_HOLD_WRITE`), sends `signal`,
/// and checks the exit status, that no temporary file is left and that OUT is untouched.
fn interrupt_a_write(signal: &str, code: i32) {
    let dir = tmp(&format!("signal-{signal}"));
    let loads = loads_file(&dir);
    let out = dir.join("map.json");
    std::fs::write(&out, "previous").unwrap();
    let mut child = bin()
        .args(plan_to(&loads, out.to_str().unwrap()))
        .env("EPLB_TEST_HOLD_WRITE", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let held = line
        .strip_prefix("eplb-test: holding ")
        .unwrap_or_else(|| panic!("unexpected: {line}"))
        .trim_end();
    // The temporary file exists, written, beside the target.
    assert!(Path::new(held).is_file(), "{held}");
    assert_eq!(Path::new(held).parent(), Some(dir.as_path()));
    assert_eq!(temporaries(&dir).len(), 1);
    // The shell's builtin `kill` (no procps needed).
    let killed = Command::new("sh")
        .arg("-c")
        .arg(format!("kill -{signal} {}", child.id()))
        .status()
        .unwrap();
    assert!(killed.success());
    let started = Instant::now();
    let status = child.wait().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(status.code(), Some(code), "{status}");
    assert_eq!(temporaries(&dir), Vec::<String>::new());
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "previous");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_interrupted_write_leaves_no_temporary_file() {
    interrupt_a_write("TERM", 143);
    interrupt_a_write("INT", 130);
}

/// A trace-like file of `bytes` bytes whose `counts` is one array far longer than any
/// dimension may be (refused by the scanner), and a model object for the pre-parse.
fn long_array_trace(path: &Path, bytes: usize) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    write!(
        f,
        "{{\"format\": \"eplb-trace/v1\", \"model\": {{\"arch\": \"mixtral\", \"num_experts\": 8}}, \"counts\": [1"
    )
    .unwrap();
    for _ in 0..bytes / 2 {
        f.write_all(b",1").unwrap();
    }
    f.write_all(b"]}").unwrap();
}

#[test]
fn an_oversized_input_is_refused_before_it_is_read() {
    let dir = tmp("oversized");
    let big = dir.join("big.json");
    long_array_trace(&big, 200_000);
    let size = std::fs::metadata(&big).unwrap().len();
    let b = big.to_str().unwrap();
    let loads = loads_file(&dir);
    let map = dir.join("map.json");
    let o = bin()
        .args(plan_to(&loads, map.to_str().unwrap()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let cfg = dir.join("cfg.json");
    std::fs::write(
        &cfg,
        format!("{{\"eplb_config\": {{}}}} {}", " ".repeat(4000)),
    )
    .unwrap();
    let cfg_size = std::fs::metadata(&cfg).unwrap().len();
    let sim = |cmd: &str| -> Vec<String> {
        let mut v: Vec<String> = [
            cmd,
            "--trace",
            b,
            "--ranks",
            "2",
            "--redundant",
            "2",
            "--heat-interval",
            "2",
            "--algo-interval",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(["--max-input-bytes".to_string(), "2000".to_string()]);
        v
    };
    let words = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut simulate = sim("simulate");
    simulate.extend(words(&["--policy", "default"]));
    let mut report = sim("report");
    report.extend(words(&["--out", dir.join("r.html").to_str().unwrap()]));
    let limit = ["--max-input-bytes", "2000"];
    let with_limit = |a: &[&str]| {
        let mut v = words(a);
        v.extend(words(&limit));
        v
    };
    let cases = vec![
        (
            with_limit(
                &plan_to(&big, "/dev/null")
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
            ),
            b.to_string(),
            size,
        ),
        (simulate, b.to_string(), size),
        (report, b.to_string(), size),
        (
            with_limit(&["hotness", "--map", map.to_str().unwrap(), "--loads", b]),
            b.to_string(),
            size,
        ),
        (with_limit(&["validate", b]), b.to_string(), size),
        (
            with_limit(&["check-config", cfg.to_str().unwrap()]),
            cfg.display().to_string(),
            cfg_size,
        ),
    ];
    for (args, input, size) in cases {
        let started = Instant::now();
        let o = bin().args(&args).output().unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "{args:?}");
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.starts_with(&format!("error: {input}: ")), "{args:?}: {e}");
        assert!(
            e.contains(&format!(
                "{size} bytes is over the input size limit of 2000 bytes (--max-input-bytes)"
            )),
            "{args:?}: {e}"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// Under an address-space limit far below what a `serde_json::Value` of the file would take,
/// a file the scanner refuses is refused with an error, not an abort.
#[test]
fn a_long_array_is_refused_by_the_scanner_before_any_tree_is_built() {
    let dir = tmp("scanner");
    let big = dir.join("big.json");
    // 40 MB of `,1`: 20 M numbers, about 640 MB as `Value`s.
    long_array_trace(&big, 40_000_000);
    let b = big.to_str().unwrap();
    let exe = env!("CARGO_BIN_EXE_eplb");
    for args in [
        format!("plan --loads {b} --ranks 2 --redundant 2 --policy default"),
        format!(
            "simulate --trace {b} --ranks 2 --redundant 2 --policy default --heat-interval 2 --algo-interval 1"
        ),
    ] {
        // 300 MB of address space: the file (40 MB) and the binary fit, the tree does not.
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -v 300000 && exec {exe} {args}"))
            .env_remove("DYNAMIC_EPLB")
            .env_remove("EXPERT_MAP_RECORD")
            .output()
            .unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args}: {e}");
        assert!(e.starts_with(&format!("error: {b}")), "{args}: {e}");
        assert!(e.contains("65535"), "{args}: {e}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_trace_shorter_than_one_cycle_is_said_so() {
    let trace = shared(MIXTRAL);
    // The trace has 9 windows; H + A = 11.
    let base = [
        "--trace",
        trace.as_str(),
        "--ranks",
        "2",
        "--redundant",
        "2",
        "--heat-interval",
        "10",
        "--algo-interval",
        "1",
    ];
    let run = |extra: &[&str]| {
        let mut a = vec!["simulate"];
        a.extend_from_slice(&base);
        a.extend_from_slice(&["--policy", "default"]);
        a.extend_from_slice(extra);
        eplb(&a)
    };
    let o = run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("warning: ") && e.contains("9 windows") && e.contains("11"),
        "{e}"
    );
    let out = stdout(&o);
    assert!(!out.contains("NaN"), "{out}");
    assert!(out.contains("n/a"), "{out}");
    let o = run(&["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("9 windows"), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for key in [
        "mean_par_from_first_activation",
        "p99_par_from_first_activation",
        "est_net_saving_pct",
    ] {
        assert!(v[key].is_null(), "{key}: {}", v[key]);
    }
    // The report says it too.
    let dir = tmp("short-report");
    let page = dir.join("r.html");
    let mut a = vec!["report"];
    a.extend_from_slice(&base);
    a.extend_from_slice(&["--policies", "default", "--out", page.to_str().unwrap()]);
    let o = eplb(&a);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("9 windows"), "{}", stderr(&o));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(!html.contains("NaN"), "the page prints NaN");
    // A trace of one cycle and more: no warning.
    let o = eplb(&[
        "simulate",
        "--trace",
        trace.as_str(),
        "--ranks",
        "2",
        "--redundant",
        "2",
        "--heat-interval",
        "2",
        "--algo-interval",
        "1",
        "--policy",
        "default",
    ]);
    assert!(o.status.success());
    assert!(!stderr(&o).contains("windows"), "{}", stderr(&o));
    std::fs::remove_dir_all(dir).unwrap();
}
