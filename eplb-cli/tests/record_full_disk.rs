//! Issue 37, class 6: the runtime's heat recording (`eplb_heat_record_path`) on a file system
//! that fills up. An 8-rank controller cluster records the demo trace into a 64 KiB tmpfs
//! (mounted in a private mount namespace, `unshare -m`, so it needs root): the disk fills after
//! a few cycles, the recorder logs one error and stops, the cluster serves and balances to the
//! end, the file holds whole lines only, and `eplb simulate` replays it.
//!
//! The test re-runs itself inside the namespace (the tmpfs exists only there), which copies the
//! recording and the log lines out for the checks. Where a mount namespace cannot be had (not
//! root, no `unshare`), it says so on stderr and checks nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use common::{eplb, stderr, stdout, tmp};
use eplb_runtime::config::EplbConfig;
use eplb_runtime::startup::ModelInfo;
use eplb_sim::Replay;
use eplb_sim::cluster::{ClusterSpec, run_cluster};
use eplb_sim::cost::CostSpec;

const TEST: &str = "a_recording_on_a_full_disk_keeps_whole_lines_and_replays";
/// Inside the namespace: the tmpfs mount point.
const ENV_FS: &str = "EPLB_TEST_SMALL_FS";
/// Inside the namespace: where the results are copied.
const ENV_OUT: &str = "EPLB_TEST_SMALL_FS_OUT";
const FS_SIZE: u64 = 64 * 1024;

/// The error and warning lines of the run.
static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            LOG.lock()
                .unwrap()
                .push(format!("{} {}", r.level(), r.args()));
        }
    }

    fn flush(&self) {}
}

static CAPTURE: Capture = Capture;

/// Whether this user can mount a tmpfs in a private mount namespace (`dir` stays as it was).
fn can_mount(dir: &Path) -> Result<(), String> {
    let probe = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs -o size=4k tmpfs \"$1\"",
            "sh",
        ])
        .arg(dir)
        .output();
    match probe {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => Err(format!("cannot run unshare: {e}")),
    }
}

fn demo() -> String {
    format!("{}/../data/esft_chain.json", env!("CARGO_MANIFEST_DIR"))
}

/// In the namespace: the cluster records into the small file system.
fn record_on_the_small_fs(fs: &Path, out: &Path) {
    log::set_logger(&CAPTURE).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let bytes = std::fs::read(demo()).unwrap();
    let t = Replay::load(&bytes, "esft_chain.json", &CostSpec::default())
        .unwrap()
        .trace;
    let path = fs.join("heat.jsonl");
    let cfg = EplbConfig::from_value(
        &serde_json::json!({
            "dynamic_eplb": true,
            "expert_heat_collection_interval": 4,
            "algorithm_execution_interval": 2,
            "num_redundant_experts": 8,
            "eplb_policy_type": "flashlb",
            "eplb_heat_record_path": path.to_str().unwrap(),
        }),
        &[("DYNAMIC_EPLB", "true")],
    )
    .unwrap();
    let model = ModelInfo {
        layers: t.layers as u16,
        experts: t.experts as u16,
        ranks: 8,
        ranks_per_node: 8,
        groups: 1,
        max_num_seqs: 256,
        speculative_tokens: 0,
        tp_size: 1,
    };
    let spec = ClusterSpec {
        ranks: 8,
        expert_bytes: 16,
        metrics_expert_bytes: 16,
        passes: 1,
        pace: None,
        resume_after: None,
    };
    // The engine never sees the error: the run completes.
    let run = run_cluster(&t, &cfg, &model, &spec, None).unwrap();
    std::fs::write(
        out.join("run.txt"),
        format!(
            "{} {} {}",
            run.iterations,
            run.cycles_done.len(),
            run.plans_taken.len()
        ),
    )
    .unwrap();
    std::fs::write(out.join("log.txt"), LOG.lock().unwrap().join("\n")).unwrap();
    if path.exists() {
        std::fs::copy(&path, out.join("heat.jsonl")).unwrap();
    }
}

#[test]
fn a_recording_on_a_full_disk_keeps_whole_lines_and_replays() {
    if let (Some(fs), Some(out)) = (std::env::var_os(ENV_FS), std::env::var_os(ENV_OUT)) {
        record_on_the_small_fs(Path::new(&fs), Path::new(&out));
        return;
    }
    let dir = tmp("record-full-disk");
    let fs: PathBuf = dir.join("fs");
    let out: PathBuf = dir.join("out");
    std::fs::create_dir_all(&fs).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    if let Err(why) = can_mount(&fs) {
        eprintln!(
            "warning: {TEST} checks nothing here: it needs a tmpfs in a private mount namespace \
             (`unshare -m`, as root), and {why}"
        );
        return;
    }
    let o = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs -o size=64k tmpfs \"$1\" && shift && exec \"$@\"",
            "sh",
        ])
        .arg(&fs)
        .arg(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(ENV_FS, &fs)
        .env(ENV_OUT, &out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the run in the namespace failed:\n{}\n{}",
        stdout(&o),
        stderr(&o)
    );
    // Nothing leaked out of the namespace.
    assert_eq!(std::fs::read_dir(&fs).unwrap().count(), 0);

    // The cluster served the whole trace and kept balancing after the disk filled.
    let run = std::fs::read_to_string(out.join("run.txt")).unwrap();
    let [iterations, cycles, plans]: [usize; 3] = run
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    assert_eq!(iterations, 195, "{run}");
    assert!(cycles >= 3 && plans >= 3, "{run}");

    // The disk did fill, and the file holds whole lines only.
    let rec = std::fs::read(out.join("heat.jsonl")).unwrap();
    let text = String::from_utf8(rec.clone()).unwrap();
    assert!(
        rec.len() as u64 > FS_SIZE / 2 && (rec.len() as u64) < FS_SIZE,
        "{} bytes",
        rec.len()
    );
    assert_eq!(rec.last(), Some(&b'\n'), "a partial last line is left");
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        serde_json::from_str::<serde_json::Value>(l)
            .unwrap_or_else(|e| panic!("line {} is not whole: {e}", i + 1));
    }
    let windows = lines.len() - 1;
    assert!(windows >= 4, "{windows} windows");
    // Cycles went on after the recording stopped (each records 4 windows).
    assert!(
        cycles * 4 > windows,
        "{cycles} cycles, {windows} windows recorded"
    );

    // One log line, naming the file and the cause.
    let log = std::fs::read_to_string(out.join("log.txt")).unwrap();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("heat recording"))
        .collect();
    assert_eq!(errors.len(), 1, "{log}");
    assert!(
        errors[0].starts_with("ERROR ")
            && errors[0].contains("heat.jsonl stopped: No space left on device")
            && errors[0].contains("keeps its whole lines"),
        "{log}"
    );

    // It replays: what `eplb simulate --trace` reads, and `eplb simulate` itself.
    let replay = Replay::load(&rec, "heat.jsonl", &CostSpec::default()).unwrap();
    assert_eq!(replay.trace.windows, windows);
    let file = out.join("heat.jsonl");
    let o = eplb(&[
        "simulate",
        "--trace",
        file.to_str().unwrap(),
        "--ranks",
        "8",
        "--redundant",
        "8",
        "--policy",
        "flashlb",
        "--heat-interval",
        "1",
        "--algo-interval",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["cycles"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["mean_par"].as_f64().unwrap() >= 1.0, "{v}");
    std::fs::remove_dir_all(dir).unwrap();
}
