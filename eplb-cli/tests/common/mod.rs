//! Helpers shared by the eplb-cli integration tests (the `eplb` binary) (each test crate uses a part of them).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// A file under `../shared` (relative to the project root), which must exist.
pub fn shared(rel: &str) -> String {
    let p = PathBuf::from(format!("{}/../../shared/{rel}", env!("CARGO_MANIFEST_DIR")));
    assert!(p.is_file(), "missing test input {}", p.display());
    p.display().to_string()
}

/// Runs the `eplb` binary with the env guard cleared, or satisfied (`DYNAMIC_EPLB=1`).
pub fn eplb_with(args: &[&str], with_guard: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_eplb"));
    c.args(args)
        .env_remove("DYNAMIC_EPLB")
        .env_remove("EXPERT_MAP_RECORD");
    if with_guard {
        c.env("DYNAMIC_EPLB", "1");
    }
    c.output().unwrap()
}

/// Runs the `eplb` binary with the env guard cleared.
pub fn eplb(args: &[&str]) -> Output {
    eplb_with(args, false)
}

/// The arguments `plan --loads LOADS --ranks R --redundant X --policy P`.
pub fn plan_args<'a>(
    loads: &'a str,
    ranks: &'a str,
    redundant: &'a str,
    policy: &'a str,
) -> Vec<&'a str> {
    vec![
        "plan",
        "--loads",
        loads,
        "--ranks",
        ranks,
        "--redundant",
        redundant,
        "--policy",
        policy,
    ]
}

/// Runs `eplb plan --loads LOADS --ranks R --redundant X --policy P` followed by `extra`.
pub fn eplb_plan(
    loads: &str,
    ranks: &str,
    redundant: &str,
    policy: &str,
    extra: &[&str],
) -> Output {
    let mut args = plan_args(loads, ranks, redundant, policy);
    args.extend_from_slice(extra);
    eplb(&args)
}

/// Asserts that `o` exited with `code` and that its standard error contains `needle`.
#[track_caller]
pub fn fails_with(o: &Output, code: i32, needle: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(code), "{e}");
    assert!(e.contains(needle), "expected `{needle}` in: {e}");
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A fresh temporary directory for one test.
pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("eplb-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
