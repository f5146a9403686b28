//! `cargo xtask fuzz [--seconds N] [--target NAME]...`: runs the cargo-fuzz targets, each in a
//! fuzz crate beside what it fuzzes: `eplb-map/fuzz` holds the decoders (`map_json`, `blob`,
//! `trace`) and the checked policy call (`rebalance`); `eplb-runtime/fuzz` the config reader
//! (`config`); `eplb-sim/fuzz` the trace-to-simulate path (`simulate`).
//!
//! Each target runs for `N` seconds (default 60) with the installed `nightly` toolchain
//! (`cargo +nightly fuzz run`), from its fuzz crate `DIR` (separate crates, not workspace
//! members). New corpus entries go to `DIR/corpus/<target>` (ignored by git); the checked-in
//! seeds in `DIR/seeds/<target>` and the dictionary `DIR/dict/<target>.dict` are used when
//! present. A crash stops the run with an error; libFuzzer leaves the input in
//! `DIR/artifacts/<target>/`; keep a decoder's as a regression test in
//! `eplb-map/tests/fuzz_regressions/<target>/`. cargo-fuzz is installed with
//! `cargo install cargo-fuzz` when missing.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fuzz targets, in the order they run.
pub const TARGETS: [&str; 6] = [
    "map_json",
    "blob",
    "trace",
    "rebalance",
    "config",
    "simulate",
];

/// Seconds per target when `--seconds` is not given.
pub const DEFAULT_SECONDS: u64 = 60;

/// Seconds one input may take before libFuzzer reports it as a hang.
const INPUT_TIMEOUT_SECONDS: u64 = 10;

const USAGE: &str = "usage: cargo xtask fuzz [--seconds N] [--target map_json|blob|trace|rebalance|config|simulate]...";

/// Runs the fuzz targets; `args` are the arguments after `fuzz`.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut seconds = DEFAULT_SECONDS;
    let mut targets: Vec<&'static str> = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--seconds" => {
                let v = it
                    .next()
                    .ok_or_else(|| format!("--seconds needs a value\n{USAGE}"))?;
                seconds = v
                    .parse()
                    .map_err(|e| format!("--seconds {v:?}: {e}\n{USAGE}"))?;
                if seconds == 0 {
                    return Err(format!("--seconds must be at least 1\n{USAGE}"));
                }
            }
            "--target" => {
                let v = it
                    .next()
                    .ok_or_else(|| format!("--target needs a value\n{USAGE}"))?;
                let t = TARGETS
                    .iter()
                    .find(|t| **t == v.as_str())
                    .ok_or_else(|| format!("unknown fuzz target {v:?}\n{USAGE}"))?;
                if !targets.contains(t) {
                    targets.push(t);
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if targets.is_empty() {
        targets.extend(TARGETS);
    }
    ensure_cargo_fuzz()?;
    for target in targets {
        run_target(&fuzz_dir(target), target, seconds)?;
    }
    Ok(())
}

/// The fuzz crate of `target`, beside what it fuzzes: `eplb-runtime/fuzz` (the config reader),
/// `eplb-sim/fuzz` (the simulator), `eplb-map/fuzz` (the decoders and the checked policy call).
fn fuzz_dir(target: &str) -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    let crate_dir = match target {
        "config" => "eplb-runtime",
        "simulate" => "eplb-sim",
        _ => "eplb-map",
    };
    xtask.parent().unwrap_or(xtask).join(crate_dir).join("fuzz")
}

/// Installs cargo-fuzz when `cargo fuzz` is not available.
fn ensure_cargo_fuzz() -> Result<(), String> {
    let present = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        return Ok(());
    }
    eprintln!("xtask fuzz: cargo-fuzz not found; running `cargo install cargo-fuzz`");
    let status = Command::new("cargo")
        .args(["install", "cargo-fuzz"])
        .status()
        .map_err(|e| format!("cannot run `cargo install cargo-fuzz`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo install cargo-fuzz` failed ({status})"))
    }
}

fn run_target(dir: &Path, target: &str, seconds: u64) -> Result<(), String> {
    let corpus = dir.join("corpus").join(target);
    std::fs::create_dir_all(&corpus)
        .map_err(|e| format!("cannot create {}: {e}", corpus.display()))?;
    let seeds = dir.join("seeds").join(target);
    let dict = dir.join("dict").join(format!("{target}.dict"));

    // `cargo` from PATH is rustup's proxy, which understands `+nightly` (the `CARGO` variable of
    // `cargo xtask` names the stable binary, which would not).
    let mut cmd = Command::new("cargo");
    cmd.current_dir(dir)
        .args(["+nightly", "fuzz", "run", target])
        .arg(&corpus);
    if seeds.is_dir() {
        cmd.arg(&seeds);
    }
    cmd.arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECONDS}"))
        .arg("-print_final_stats=1");
    if dict.is_file() {
        cmd.arg(format!("-dict={}", dict.display()));
    }
    eprintln!("xtask fuzz: {target} for {seconds} s");
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run `cargo +nightly fuzz run {target}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "fuzz target {target} failed ({status}); the input is in {}",
            dir.join("artifacts").join(target).display()
        ))
    }
}
