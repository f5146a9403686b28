//! The Python package's step of `cargo xtask test` (`python/`, not a workspace member).
//!
//! 1. `cargo fmt --check`, `cargo clippy -D warnings` and `cargo test` on `python/Cargo.toml`
//!    (target dir `target/python`);
//! 2. maturin (from PyPI, in the tools venv `target/python-tools`, made once) builds the wheel
//!    into `target/python/wheels`, with the cargo feature `test-panic` (the shipped wheel,
//!    `pip install ./python`, has not `eplb._native._panic_for_test`);
//! 3. a fresh venv `target/python-test-venv` gets only numpy and pytest (from PyPI) and the wheel;
//! 4. pytest runs `python/tests` in it, with `EPLB_BIN` set to the CLI so that the tests compare
//!    `eplb.simulate` and `eplb.write_map` with it. Any non-zero pytest status fails the gate,
//!    including 5 (no test collected);
//! 5. mypy checks the package and `mypy.stubtest` its native stubs against the built module;
//! 6. with `$EPLB_TORCH_PYTHON` (a venv with torch, which `.ci/run` prepares), the adapter tests
//!    run again against real torch tensors (`EPLB_TEST_TORCH=real`), and the runtime tests run
//!    `eplb.runtime.Runtime` in gloo processes (`test_runtime_torch.py`); without it, a warning.
//!
//! The interpreter is `$EPLB_PYTHON`, else `python3`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{cargo, root, run};

/// The maturin the wheel is built with (the PEP 517 backend in `pyproject.toml` allows the
/// same range).
const MATURIN: &str = "maturin>=1.9,<2.0";

fn python() -> String {
    std::env::var("EPLB_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn manifest() -> PathBuf {
    root().join("python").join("Cargo.toml")
}

fn target_dir() -> PathBuf {
    root().join("target").join("python")
}

pub(crate) fn venv_bin(venv: &Path, exe: &str) -> PathBuf {
    venv.join("bin").join(exe)
}

/// Creates a venv at `dir` (replacing any), or says which package is missing.
pub(crate) fn make_venv(dir: &Path) -> Result<(), String> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let py = python();
    run(
        &format!("python: {py} -m venv {}", dir.display()),
        Command::new(&py).args(["-m", "venv"]).arg(dir),
    )
    .map_err(|e| {
        format!("{e}: this needs Python's venv module (on Debian: apt-get install python3-venv)")
    })
}

pub(crate) fn pip_install(venv: &Path, what: &str, args: &[&str]) -> Result<(), String> {
    run(
        &format!("python: pip install {what}"),
        Command::new(venv_bin(venv, "python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(args),
    )
}

/// The tools venv with maturin, made when missing.
fn maturin() -> Result<PathBuf, String> {
    let venv = root().join("target").join("python-tools");
    let exe = venv_bin(&venv, "maturin");
    let works = Command::new(&exe)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !works {
        make_venv(&venv)?;
        pip_install(&venv, MATURIN, &[MATURIN])?;
    }
    Ok(exe)
}

/// fmt, clippy and the Rust tests of the native module (the conversions and the guard, in an
/// interpreter the test binary starts: without `extension-module` it links libpython).
fn lint() -> Result<(), String> {
    let m = manifest();
    let m = m.to_str().ok_or("python/Cargo.toml: path is not UTF-8")?;
    run(
        "python: cargo fmt --check (python/)",
        cargo().args(["fmt", "--check", "--manifest-path", m]),
    )?;
    run(
        "python: cargo clippy (python/, warnings denied)",
        cargo()
            .args([
                "clippy",
                "--all-targets",
                "--features",
                "test-panic",
                "--manifest-path",
                m,
                "--target-dir",
            ])
            .arg(target_dir())
            .args(["--", "-D", "warnings"]),
    )?;
    run(
        "python: cargo test (python/, the conversions and the guard)",
        cargo()
            .args(["test", "--quiet", "--manifest-path", m, "--target-dir"])
            .arg(target_dir()),
    )
}

/// Builds the wheel; returns its path.
fn build_wheel(maturin: &Path) -> Result<PathBuf, String> {
    let out = target_dir().join("wheels");
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    run(
        "python: maturin build --release (the eplb wheel)",
        Command::new(maturin)
            .current_dir(root())
            .args(["build", "--release", "--quiet", "-m"])
            .arg(manifest())
            // `eplb._native._panic_for_test` for the tests; `pip install ./python` leaves it out.
            .args(["--features", "extension-module,test-panic"])
            .arg("--target-dir")
            .arg(target_dir())
            .arg("-o")
            .arg(&out)
            .args(["--interpreter", &python()]),
    )?;
    let wheels: Vec<PathBuf> = std::fs::read_dir(&out)
        .map_err(|e| format!("{}: {e}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    match wheels.as_slice() {
        [w] => Ok(w.clone()),
        other => Err(format!(
            "python: expected one wheel in {}, found {}",
            out.display(),
            other.len()
        )),
    }
}

/// The whole step.
pub fn test() -> Result<(), String> {
    lint()?;
    let maturin = maturin()?;
    let wheel = build_wheel(&maturin)?;
    run(
        "python: the eplb CLI for the comparison tests",
        cargo().args(["build", "--quiet", "-p", "eplb-cli", "--bin", "eplb"]),
    )?;
    let venv = root().join("target").join("python-test-venv");
    make_venv(&venv)?;
    pip_install(&venv, "numpy pytest (fresh venv)", &["numpy", "pytest"])?;
    let w = wheel.to_str().ok_or("wheel path is not UTF-8")?;
    pip_install(&venv, "the eplb wheel", &["--no-deps", w])?;
    let tests = root().join("python").join("tests");
    eprintln!("==> python: pytest python/tests (fresh venv)");
    pytest(&venv_bin(&venv, "python"), &tests, &["."], &[])?;
    type_check(&venv)?;
    real_torch(w, &tests)
}

/// Runs pytest on `args` in `tests` with the interpreter `python`.
fn pytest(python: &Path, tests: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let status = Command::new(python)
        .current_dir(tests)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(args)
        .env("EPLB_BIN", root().join("target").join("debug").join("eplb"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("python: cannot start pytest: {e}"))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(5) => Err("python: pytest collected no test (exit 5)".into()),
        _ => Err(format!("python: pytest failed ({status})")),
    }
}

/// mypy over the package (with the native module's stubs) and `mypy.stubtest`, which checks
/// those stubs against the module the wheel installed.
fn type_check(venv: &Path) -> Result<(), String> {
    pip_install(venv, "mypy (after the tests)", &["mypy"])?;
    let py = venv_bin(venv, "python");
    run(
        "python: mypy (the package, python/pyproject.toml's [tool.mypy])",
        Command::new(&py).current_dir(root().join("python")).args([
            "-m",
            "mypy",
            "--no-incremental",
        ]),
    )?;
    // From the tests' folder, so that the installed package, not the source tree, is checked.
    run(
        "python: mypy.stubtest eplb._native (the stubs against the built module)",
        Command::new(&py)
            .current_dir(root().join("python").join("tests"))
            .args(["-m", "mypy.stubtest", "eplb._native"]),
    )
}

/// The adapter tests against real torch and the runtime tests over torch.distributed (gloo
/// processes), in the venv `.ci/run` prepares (`$EPLB_TORCH_PYTHON`, torch from PyPI on the
/// CPU). Skipped with a warning when it is not set or cannot import
/// torch.
fn real_torch(wheel: &str, tests: &Path) -> Result<(), String> {
    let Some(py) = std::env::var_os("EPLB_TORCH_PYTHON").map(PathBuf::from) else {
        eprintln!(
            "warning: python: EPLB_TORCH_PYTHON is not set; the adapter tests against real torch \
             are skipped (.ci/run sets it)"
        );
        return Ok(());
    };
    let has_torch = Command::new(&py)
        .args(["-c", "import torch, numpy, pytest"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_torch {
        eprintln!(
            "warning: python: {} cannot import torch, numpy and pytest; the adapter tests \
             against real torch are skipped",
            py.display()
        );
        return Ok(());
    }
    run(
        "python: the eplb wheel into the torch venv",
        Command::new(&py).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--force-reinstall",
            wheel,
        ]),
    )?;
    eprintln!(
        "==> python: the adapter tests against real torch ({})",
        py.display()
    );
    pytest(
        &py,
        tests,
        &[
            "test_vllm.py",
            "test_vllm_ascend.py",
            "test_sglang.py",
            "test_deepseek.py",
            "test_adapt.py",
            "test_runtime_torch.py",
            "test_arguments.py",
        ],
        &[("EPLB_TEST_TORCH", "real")],
    )
}
