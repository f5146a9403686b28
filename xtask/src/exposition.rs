//! The metrics exposition step of the gate (issue 29): the `serve_metrics` example serves a
//! simulated 8-rank cluster and scrapes its own `/metrics` over loopback, `eplb simulate
//! --metrics-out` writes a replay's metrics; both are linted with `promtool check metrics`
//! (Debian's `prometheus`; skipped with a warning when missing) and parsed with the reference
//! parser, `prometheus_client.parser.text_string_to_metric_families` (PyPI, in the tools venv
//! `target/metrics-tools`, made once; skipped with a warning when it cannot be installed),
//! which must find every family eplb exports.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::python::{make_venv, pip_install, venv_bin};
use crate::{cargo, root, run};

/// Every family of `eplb_runtime::metrics` (default settings), as the text format names them.
const FAMILIES: [&str; 19] = [
    "eplb_balancedness_min",
    "eplb_balancedness_p50",
    "eplb_balancedness_p90",
    "eplb_balancedness_avg",
    "eplb_par_mean",
    "eplb_par_max",
    "eplb_health",
    "eplb_cycles",
    "eplb_rearrangements",
    "eplb_layers_moved",
    "eplb_expert_copies_moved",
    "eplb_moved_bytes",
    "eplb_plans_late",
    "eplb_plans_failed",
    "eplb_collectives_failed",
    "eplb_digest_mismatches",
    "eplb_layers_aborted",
    "eplb_walk_duration_seconds",
    "eplb_planner_duration_seconds",
];

pub fn check() -> Result<(), String> {
    let dir = root().join("target").join("metrics");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let live = dir.join("serve_metrics.prom");
    let sim = dir.join("simulate.prom");
    let arg = |p: &Path| p.to_str().map(str::to_owned).ok_or("path is not UTF-8");
    run(
        "metrics: serve_metrics (8 ranks over the host transport, /metrics scraped on loopback)",
        cargo().args([
            "run",
            "--quiet",
            "-p",
            "eplb-sim",
            "--example",
            "serve_metrics",
            "--",
            "--port",
            "0",
            "--pace-ms",
            "1",
            "--passes",
            "4",
            "--policy",
            "default",
            "--exit",
            "--dump",
            &arg(&live)?,
        ]),
    )?;
    run(
        "metrics: eplb simulate --metrics-out (the demo trace)",
        cargo().args([
            "run",
            "--quiet",
            "-p",
            "eplb-cli",
            "--bin",
            "eplb",
            "--",
            "simulate",
            "--trace",
            "data/esft_chain.json",
            "--ranks",
            "8",
            "--redundant",
            "8",
            "--policy",
            "default",
            "--heat-interval",
            "16",
            "--algo-interval",
            "4",
            "--metrics-out",
            &arg(&sim)?,
        ]),
    )?;
    for f in [&live, &sim] {
        promtool(f)?;
    }
    parse(&[live, sim])
}

/// `promtool check metrics < file`, or a warning when promtool is missing.
fn promtool(file: &Path) -> Result<(), String> {
    let found = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !found {
        eprintln!(
            "warning: promtool is missing (apt-get install prometheus): {} not linted",
            file.display()
        );
        return Ok(());
    }
    let input = std::fs::File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(input)
        .output()
        .map_err(|e| format!("promtool: {e}"))?;
    eprintln!("==> metrics: promtool check metrics < {}", file.display());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!(
            "promtool check metrics {}: {}",
            file.display(),
            said.trim()
        ))
    }
}

/// The reference parser over `files`, or a warning when it cannot be installed.
fn parse(files: &[PathBuf]) -> Result<(), String> {
    let venv = root().join("target").join("metrics-tools");
    let py = venv_bin(&venv, "python");
    let has = |py: &Path| {
        Command::new(py)
            .args(["-c", "import prometheus_client.parser"])
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !has(&py) {
        let made = make_venv(&venv)
            .and_then(|()| pip_install(&venv, "prometheus_client", &["prometheus_client"]));
        if let Err(e) = made.and_then(|()| {
            if has(&py) {
                Ok(())
            } else {
                Err("prometheus_client does not import".into())
            }
        }) {
            eprintln!("warning: the reference parser (PyPI prometheus_client) is unavailable: {e}");
            return Ok(());
        }
    }
    let script = format!(
        r#"import sys
from prometheus_client.parser import text_string_to_metric_families
want = {want:?}
for path in sys.argv[1:]:
    fams = {{f.name: f for f in text_string_to_metric_families(open(path).read())}}
    missing = [n for n in want if n not in fams]
    if missing:
        sys.exit("%s: missing families %s" % (path, missing))
    print("%s: %d families, %d samples" % (path, len(fams), sum(len(f.samples) for f in fams.values())))
"#,
        want = FAMILIES
    );
    let mut cmd = Command::new(&py);
    cmd.args(["-c", &script]).args(files);
    run(
        "metrics: the reference parser (prometheus_client.parser) finds every family",
        &mut cmd,
    )
}
