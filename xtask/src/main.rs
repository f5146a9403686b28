//! `cargo xtask`: every repeatable command of the eplb workspace.
//!
//! - `cargo xtask demo [--screenshot]`: the simulator on the vendored ESFT trace, every policy,
//!   and its `eplb report` page (with `--screenshot`, rendered to `docs/report.png` by Chromium).
//! - `cargo xtask test`: the whole gate (fmt, clippy, tests, docs, the no_std proof, the Python
//!   package's wheel and tests, cross builds when their targets are installed).
//! - `cargo xtask python`: only the Python package's step of the gate.
//! - `cargo xtask docs`: only the docs step of the gate (every fenced block of the docs runs;
//!   the figures README.md and BENCHMARKS.md quote are current); after `cargo xtask python`.
//! - `cargo xtask metrics`: only the metrics exposition step of the gate (promtool and the
//!   reference parser; issue 29).
//! - `cargo xtask cross`: builds the no_std crates for `aarch64-unknown-none` and
//!   `aarch64-unknown-linux-gnu`, installing the targets with rustup when it can.
//! - `cargo xtask fuzz`: runs each decoder's fuzz target (cargo-fuzz, nightly).
//! - `cargo xtask bench`: runs the criterion benchmarks.
//! - `cargo xtask aicpu`: the AICPU C-ABI staticlib: C test on the golden cases, aarch64 builds,
//!   the C test built for aarch64 under qemu (same bytes as x86_64).
#![allow(missing_docs, clippy::print_stdout, clippy::print_stderr)]

mod aicpu;
mod circles;
mod cmd;
mod demo;
mod docs;
mod exposition;
mod fuzz;
mod python;

use std::process::{Command, ExitCode};

use cmd::{cargo, installed_targets, root, run};

/// Targets the no_std crates are cross-built for: bare metal, and the AICPU's aarch64 Linux.
const CROSS_TARGETS: [&str; 2] = ["aarch64-unknown-none", "aarch64-unknown-linux-gnu"];

/// Crates that must build without std.
const NO_STD_CRATES: [&str; 3] = ["eplb-core", "eplb-policies", "eplb-map"];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    let result = match cmd.as_str() {
        "test" => test(rest),
        "cross" => cross(true),
        "demo" => demo::demo(rest),
        "fuzz" => fuzz::run(rest),
        "aicpu" => aicpu::run(rest),
        "python" => python::test(),
        "docs" => docs::check(),
        "metrics" => exposition::check(),
        "bench" => bench(rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => {
            eprintln!("error: unknown task `{other}`\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "usage: cargo xtask <task>
tasks:
  demo    replay the vendored ESFT trace through every policy, print the results and write
          target/eplb-demo/report.html (--screenshot: also docs/report.png via chromium)
  test    the whole gate: fmt, clippy, tests, docs, no_std proof, Python wheel + pytest,
          cross builds (if targets present)
  cross   build the no_std crates for aarch64-unknown-none and aarch64-unknown-linux-gnu
  fuzz    run each fuzz target (--seconds N, default 60; --target NAME)
  bench   run the criterion benchmarks (extra args go to `cargo bench`)
  aicpu   build the AICPU C-ABI staticlib, run its C test on the golden cases, aarch64 builds,
          the C test for aarch64 under qemu-aarch64 (when installed) against the x86_64 bytes
  python  the Python package: fmt, clippy, maturin wheel, pytest in a fresh venv (numpy, pytest)
  docs    every fenced block of README.md, python/README.md and docs/*.md runs as written, the
          files --help names exist, the quoted figures are current (after `cargo xtask python`)
  metrics the metrics exposition: serve_metrics scraped on loopback and simulate --metrics-out,
          linted by promtool and parsed by prometheus_client (each skips with a warning if absent)";

fn test(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("`cargo xtask test` takes no arguments, got `{a}`"));
    }
    run(
        "cargo fmt --check",
        cargo().args(["fmt", "--all", "--check"]),
    )?;
    run(
        "cargo clippy (all targets, all features, warnings denied)",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    crate_boundaries()?;
    import_circles()?;
    run(
        "cargo test",
        cargo().args(["test", "--workspace", "--all-features"]),
    )?;
    exposition::check()?;
    run(
        "cargo doc (warnings denied)",
        cargo()
            .args(["doc", "--workspace", "--no-deps", "--all-features"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    no_std_proof(None)?;
    let golden = aicpu::host_check()?;
    aicpu::aarch64_check(&golden)?;
    python::test()?;
    docs::check()?;
    cross(false)
}

/// The tools' dependencies stay out of the libraries an engine links: neither `eplb-runtime`
/// (the serving library) nor `eplb-sim` (the offline library) has clap or plotters in its
/// normal dependency tree, nor signal-hook (the binary's SIGINT/SIGTERM handler) (`cargo tree
/// -i`, as rust-analyzer guards its boundaries). The check proves itself on `eplb-cli`, which
/// must have all three.
fn crate_boundaries() -> Result<(), String> {
    eprintln!(
        "==> crate boundaries: no clap, plotters or signal-hook under eplb-runtime or eplb-sim"
    );
    let depends = |krate: &str, dep: &str| -> Result<bool, String> {
        let out = cargo()
            .args([
                "tree",
                "-p",
                krate,
                "-e",
                "normal",
                "--all-features",
                "-i",
                dep,
            ])
            .output()
            .map_err(|e| format!("cannot run cargo tree: {e}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let absent = stderr.contains("did not match any packages");
        if !out.status.success() && !absent {
            return Err(format!("cargo tree -p {krate} -i {dep} failed: {stderr}"));
        }
        Ok(!out.stdout.is_empty())
    };
    for dep in ["clap", "plotters", "signal-hook"] {
        if !depends("eplb-cli", dep)? {
            return Err(format!(
                "the boundary check is broken: eplb-cli should depend on {dep}"
            ));
        }
        for krate in ["eplb-runtime", "eplb-sim"] {
            if depends(krate, dep)? {
                return Err(format!(
                    "{krate} depends on {dep} (see `cargo tree -p {krate} -e normal -i {dep}`); \
                     the tools' crates belong in eplb-cli"
                ));
            }
        }
    }
    Ok(())
}

/// Builds the `#![no_std]` staticlib with its own panic handler that links the no_std crates.
fn no_std_proof(target: Option<&str>) -> Result<(), String> {
    let dir = root().join("tests").join("no-std-smoke");
    let mut cmd = cargo();
    cmd.current_dir(&dir)
        .args(["build", "--release", "--quiet"])
        .env(
            "CARGO_TARGET_DIR",
            root().join("target").join("no-std-smoke"),
        );
    if let Some(t) = target {
        cmd.args(["--target", t]);
    }
    run(
        &format!(
            "no_std proof: staticlib with its own panic handler links {} ({})",
            NO_STD_CRATES.join(", "),
            target.unwrap_or("host")
        ),
        &mut cmd,
    )
}

/// Cross-builds the no_std crates. With `install`, tries `rustup target add` for missing
/// targets first; a target that cannot be had is reported plainly and skipped.
fn cross(install: bool) -> Result<(), String> {
    let mut built = 0;
    for target in CROSS_TARGETS {
        if !installed_targets().iter().any(|t| t == target) {
            if !install {
                eprintln!(
                    "==> cross: target {target} is not installed; skipped (run `cargo xtask cross` to install it)"
                );
                continue;
            }
            eprintln!("==> cross: installing target {target} with rustup");
            let ok = Command::new("rustup")
                .args(["target", "add", target])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                eprintln!(
                    "==> cross: target {target} cannot be had here (rustup target add failed); skipped"
                );
                continue;
            }
        }
        let mut cmd = cargo();
        cmd.args(["build", "--release", "--quiet", "--target", target]);
        for c in NO_STD_CRATES {
            cmd.args(["-p", c]);
        }
        cmd.arg("--no-default-features");
        run(&format!("cross: no_std crates for {target}"), &mut cmd)?;
        no_std_proof(Some(target))?;
        built += 1;
    }
    if install && built == 0 {
        return Err("no cross target could be installed".into());
    }
    Ok(())
}

fn bench(args: &[String]) -> Result<(), String> {
    run(
        "cargo bench",
        cargo().args(["bench", "--workspace"]).args(args),
    )
}

/// No module of a crate, at any depth, imports a module that imports it back, directly or
/// through others ([`circles`]).
fn import_circles() -> Result<(), String> {
    eprintln!("==> import circles: none between the modules of any crate, at any depth");
    circles::check(&root())
}
