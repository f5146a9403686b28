//! The docs step of `cargo xtask test` (`cargo xtask docs` alone), after the Python step:
//!
//! 1. `scripts/docs_check.py`: every fenced block of `README.md`, `python/README.md` and
//!    `docs/*.md` runs as written (`sh`, `python`), or compiles (`python fragment`, `cpp`, ...),
//!    with the built `eplb` first on `PATH` and the Python test venv's interpreter (the wheel
//!    `cargo xtask python` installed); and every file the CLI's `--help` names is in the
//!    repository. The script's docstring has the fence rules.
//! 2. `scripts/figures.py --check`: the figures README.md and BENCHMARKS.md quote between
//!    `figures:` markers equal what the code computes now.
//!
//! The scripts need only Python's standard library (`$EPLB_PYTHON`, else `python3`); blocks
//! that import torch run with `$EPLB_TORCH_PYTHON` when it is set.

use std::path::PathBuf;
use std::process::Command;

use crate::python::venv_bin;
use crate::{cargo, root, run};

fn python() -> String {
    std::env::var("EPLB_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The whole step.
pub fn check() -> Result<(), String> {
    run(
        "docs: the eplb CLI",
        cargo().args(["build", "--quiet", "-p", "eplb-cli", "--bin", "eplb"]),
    )?;
    let eplb: PathBuf = root().join("target").join("debug").join("eplb");
    let venv_python = venv_bin(&root().join("target").join("python-test-venv"), "python");
    let has_wheel = Command::new(&venv_python)
        .args(["-c", "import eplb"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_wheel {
        return Err(format!(
            "docs: {} cannot import eplb; run `cargo xtask python` first (it builds the wheel \
             into that venv)",
            venv_python.display()
        ));
    }
    run(
        "docs: every fenced block of README.md, python/README.md and docs/*.md, as written",
        Command::new(python())
            .current_dir(root())
            .arg(root().join("scripts").join("docs_check.py"))
            .arg("--eplb")
            .arg(&eplb)
            .arg("--python")
            .arg(&venv_python),
    )?;
    run(
        "docs: the figures README.md and BENCHMARKS.md quote (scripts/figures.py --check)",
        Command::new(python())
            .current_dir(root())
            .arg(root().join("scripts").join("figures.py"))
            .arg("--eplb")
            .arg(&eplb)
            .arg("--check"),
    )
}
