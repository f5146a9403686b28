//! `cargo xtask aicpu`: builds and proves the AICPU C-ABI staticlib (`eplb-policies/aicpu`).
//!
//! The host part ([`host_check`], also run by `cargo xtask test`):
//! 1. checks that `include/eplb_aicpu.h` and `src/lib.rs` assert the same sizes, offsets and
//!    constants, and that every struct field is asserted on both sides;
//! 2. converts golden DeepSeek-V3 cases (`../shared/data/golden`) into the C test's binary
//!    `.case` files under `target/aicpu/golden` (a missing golden file is an error);
//! 3. builds the staticlib (release, `target/aicpu`), runs `eplb-aicpu-reference` (the Rust
//!    API; with the pay-off gate on, the runtime's `PolicyHost`) to write the expected results,
//!    compiles `tests/c/test_aicpu.c` with `cc` against the header and the `.a`, and runs it:
//!    byte-for-byte comparison for every policy (ABI version 1, version 2 with the gate off and
//!    on), bad-argument status codes, timings and buffer sizes.
//!
//! The aarch64 part ([`aarch64_check`], also run by `cargo xtask test`): when the target
//! `aarch64-unknown-linux-gnu`, `aarch64-linux-gnu-gcc` (with the aarch64 C library) and
//! `qemu-aarch64` are there, builds the staticlib for that target, compiles the same C test with
//! the cross compiler and runs it under `qemu-aarch64` against the expected files the host's Rust
//! reference wrote: the aarch64 C ABI must give the host's bytes for every case, policy and call.
//! Without the tools it says what is missing and is skipped.
//!
//! The whole task ([`run`]) also builds the staticlib for `aarch64-unknown-linux-gnu` and
//! `aarch64-unknown-none` when those targets are installed and lists the `eplb_aicpu_` symbols
//! each archive exports (`nm`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::{cargo, installed_targets, root};

/// Golden cases the C test runs, from `../shared/data/golden/<name>.json`.
const CASES: [&str; 3] = ["dsv3_prefill_ep32", "dsv3_decode_ep64", "dsv3_decode_ep32"];

/// A case with per-window samples, derived from the first golden case.
const WINDOWS_CASE: &str = "dsv3_prefill_ep32_windows";
/// Windows in [`WINDOWS_CASE`].
const WINDOWS: usize = 4;

/// Seed of every case (the random policy's).
const SEED: u64 = 7;

/// Cross targets the staticlib is built for when installed.
const AICPU_TARGETS: [&str; 2] = [ARM_TARGET, "aarch64-unknown-none"];

/// The AICPU's aarch64 Linux target, whose C test runs under qemu.
const ARM_TARGET: &str = "aarch64-unknown-linux-gnu";
/// The C cross compiler and linker for [`ARM_TARGET`] (Debian `gcc-aarch64-linux-gnu`, with the
/// C library of `libc6-dev-arm64-cross`).
const ARM_CC: &str = "aarch64-linux-gnu-gcc";
/// The user-mode emulator (Debian `qemu-user`).
const QEMU: &str = "qemu-aarch64";
/// Where the aarch64 C library and its loader live, for `qemu-aarch64 -L`.
const ARM_SYSROOT: &str = "/usr/aarch64-linux-gnu";
/// Debian packages that provide [`ARM_CC`], its C library and [`QEMU`].
const ARM_PACKAGES: &str = "gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user";

/// Functions the archive must export.
const EXPORTS: [&str; 8] = [
    "eplb_aicpu_rebalance",
    "eplb_aicpu_scratch_len",
    "eplb_aicpu_state_len",
    "eplb_aicpu_scratch_len_v2",
    "eplb_aicpu_state_len_v2",
    "eplb_aicpu_scratch_len_v3",
    "eplb_aicpu_state_len_v3",
    "eplb_aicpu_abi_version",
];

fn crate_dir() -> PathBuf {
    root().join("eplb-policies").join("aicpu")
}

fn target_dir() -> PathBuf {
    root().join("target").join("aicpu")
}

/// The golden cases in the C test's format, and the Rust API's results for them, written by
/// [`host_check`].
pub struct Golden {
    dir: PathBuf,
    names: Vec<String>,
}

/// `cargo xtask aicpu`: the host check, the aarch64 builds and their symbols, the aarch64 check.
pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("`cargo xtask aicpu` takes no arguments, got `{a}`"));
    }
    let golden = host_check()?;
    let host_lib = target_dir().join("release").join("libeplb_aicpu.a");
    list_symbols("host", &host_lib)?;
    let installed = installed_targets();
    for target in AICPU_TARGETS {
        if !installed.iter().any(|t| t == target) {
            eprintln!(
                "==> aicpu: target {target} is not installed; skipped (rustup target add {target})"
            );
            continue;
        }
        build_lib_for(target)?;
        list_symbols(target, &lib_for(target))?;
    }
    aarch64_check(&golden)
}

/// The host part: header check, staticlib, Rust reference, C test (see the module docs).
pub fn host_check() -> Result<Golden, String> {
    check_header()?;
    let golden_dir = target_dir().join("golden");
    std::fs::create_dir_all(&golden_dir).map_err(|e| format!("{}: {e}", golden_dir.display()))?;
    let mut names = Vec::new();
    for name in CASES {
        let case = golden_case(name)?;
        if names.is_empty() {
            write_case(&golden_dir, WINDOWS_CASE, &with_windows(&case))?;
        }
        write_case(&golden_dir, name, &case)?;
        names.push(name.to_string());
    }
    names.push(WINDOWS_CASE.to_string());

    crate::run("aicpu: staticlib for the host", &mut build_lib())?;
    crate::run(
        "aicpu: Rust API results (eplb-aicpu-reference)",
        aicpu_cargo()
            .args([
                "run",
                "--release",
                "--quiet",
                "-p",
                "eplb-aicpu-reference",
                "--",
            ])
            .arg(&golden_dir)
            .args(&names),
    )?;
    let exe = target_dir().join("test_aicpu");
    compile_c_test(
        "cc",
        &target_dir().join("release").join("libeplb_aicpu.a"),
        &exe,
    )?;
    check_header_cxx()?;
    crate::run(
        "aicpu: C test (golden cases byte for byte, bad arguments, timings)",
        Command::new(&exe).arg(&golden_dir).args(&names),
    )?;
    Ok(Golden {
        dir: golden_dir,
        names,
    })
}

/// The aarch64 part (see the module docs): the C test built for [`ARM_TARGET`], run under
/// [`QEMU`] on the expected files [`host_check`] wrote. Skipped, with the reason, when the host
/// is aarch64 already or a tool is missing.
pub fn aarch64_check(golden: &Golden) -> Result<(), String> {
    let host = std::env::consts::ARCH;
    let missing = if host == "aarch64" {
        Some("the host is aarch64: the host C test ran there".to_string())
    } else {
        arm_missing()
    };
    if let Some(why) = missing {
        eprintln!("==> aicpu: aarch64 C test under qemu skipped ({why})");
        return Ok(());
    }
    build_lib_for(ARM_TARGET)?;
    let exe = target_dir().join(ARM_TARGET).join("test_aicpu");
    compile_c_test(ARM_CC, &lib_for(ARM_TARGET), &exe)?;
    crate::run(
        &format!(
            "aicpu: aarch64 C test under {QEMU} (the {ARM_TARGET} C ABI vs the {host} Rust \
             API's bytes, {} cases x 6 policies x 2 calls, ABI v1, v2 and v2 with the pay-off \
             gate; bad arguments)",
            golden.names.len()
        ),
        Command::new(QEMU)
            .args(["-L", ARM_SYSROOT])
            .arg(&exe)
            .arg("--no-timing")
            .arg(&golden.dir)
            .args(&golden.names),
    )
    .map_err(|e| format!("{e}; the FAIL lines above say what differs from {host}"))?;
    eprintln!(
        "==> aicpu: aarch64 == {host}, bit for bit: {} golden cases x 6 policies x 2 calls \
         (v1, v2, v2 gated)",
        golden.names.len()
    );
    Ok(())
}

/// Why the aarch64 C test cannot run here, if it cannot.
fn arm_missing() -> Option<String> {
    if !installed_targets().iter().any(|t| t == ARM_TARGET) {
        return Some(format!(
            "target {ARM_TARGET} is not installed: rustup target add {ARM_TARGET}"
        ));
    }
    let runs = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let mut missing = Vec::new();
    if !runs(ARM_CC) {
        missing.push(format!("no {ARM_CC}"));
    } else if !Command::new(ARM_CC)
        .arg("-print-file-name=libc.so")
        .output()
        .is_ok_and(|o| Path::new(String::from_utf8_lossy(&o.stdout).trim()).is_absolute())
    {
        missing.push(format!("{ARM_CC} finds no aarch64 C library"));
    }
    if !runs(QEMU) {
        missing.push(format!("no {QEMU}"));
    }
    let loader = Path::new(ARM_SYSROOT)
        .join("lib")
        .join("ld-linux-aarch64.so.1");
    if !loader.exists() {
        missing.push(format!("no {}", loader.display()));
    }
    (!missing.is_empty()).then(|| format!("{}: apt-get install {ARM_PACKAGES}", missing.join(", ")))
}

fn aicpu_cargo() -> Command {
    let mut c = cargo();
    c.current_dir(crate_dir())
        .env("CARGO_TARGET_DIR", target_dir());
    c
}

fn build_lib() -> Command {
    let mut c = aicpu_cargo();
    c.args(["build", "--release", "--quiet", "-p", "eplb-aicpu"]);
    c
}

/// Builds the staticlib for a cross target; for [`ARM_TARGET`] with [`ARM_CC`] as its linker
/// when that is installed (in this command's environment only).
fn build_lib_for(target: &str) -> Result<(), String> {
    let mut c = build_lib();
    c.args(["--target", target]);
    if target == ARM_TARGET
        && Command::new(ARM_CC)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    {
        c.env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", ARM_CC);
    }
    crate::run(&format!("aicpu: staticlib for {target}"), &mut c)
}

fn lib_for(target: &str) -> PathBuf {
    target_dir()
        .join(target)
        .join("release")
        .join("libeplb_aicpu.a")
}

/// Compiles the C test with the C compiler `cc` (C11, warnings as errors) against `lib`.
fn compile_c_test(cc: &str, lib: &Path, exe: &Path) -> Result<(), String> {
    let dir = crate_dir();
    let include = dir.join("include");
    crate::run(
        &format!("aicpu: {cc} test_aicpu.c + libeplb_aicpu.a"),
        Command::new(cc)
            .args([
                "-std=c11",
                "-O2",
                "-Wall",
                "-Wextra",
                "-Wpedantic",
                "-Werror",
            ])
            .arg("-I")
            .arg(&include)
            .arg(dir.join("tests").join("c").join("test_aicpu.c"))
            .arg(lib)
            .args(["-lpthread", "-ldl", "-lm", "-o"])
            .arg(exe),
    )
}

/// The AICPU kernel is C++: the header must compile there too. A `cc` without a C++ front end
/// is not an error.
fn check_header_cxx() -> Result<(), String> {
    let include = crate_dir().join("include");
    let out = Command::new("cc")
        .args(["-x", "c++", "-std=c++11", "-Wall", "-Wextra", "-Werror"])
        .args(["-fsyntax-only"])
        .arg(include.join("eplb_aicpu.h"))
        .output()
        .map_err(|e| format!("cc: cannot start: {e}"))?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        eprintln!("==> aicpu: eplb_aicpu.h compiles as C++11");
    } else if err.contains("cc1plus") {
        eprintln!("==> aicpu: no C++ front end for cc; C++ check of eplb_aicpu.h skipped");
    } else {
        return Err(format!("eplb_aicpu.h does not compile as C++11:\n{err}"));
    }
    Ok(())
}

/// Lists the `eplb_aicpu_` symbols an archive defines and checks the exports are there.
fn list_symbols(what: &str, lib: &Path) -> Result<(), String> {
    let out = Command::new("nm")
        .args(["-g", "--defined-only"])
        .arg(lib)
        .output()
        .map_err(|e| format!("nm: cannot start: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nm {} failed: {}",
            lib.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let syms: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .last()
                .is_some_and(|s| s.starts_with("eplb_aicpu_"))
        })
        .collect();
    let size = std::fs::metadata(lib).map(|m| m.len()).unwrap_or(0);
    println!(
        "aicpu: {what}: {} ({} KiB), exported eplb_aicpu_ symbols:",
        lib.display(),
        size / 1024
    );
    for s in &syms {
        println!("  {s}");
    }
    for f in EXPORTS {
        if !syms.iter().any(|l| l.ends_with(&format!(" T {f}"))) {
            return Err(format!("{}: `{f}` is not exported", lib.display()));
        }
    }
    // What the archive needs from the C side: compiler runtime and mem* only, never an
    // allocator or Rust's std.
    let names = |args: &[&str]| -> Result<BTreeSet<String>, String> {
        let out = Command::new("nm")
            .args(args)
            .arg(lib)
            .output()
            .map_err(|e| format!("nm: cannot start: {e}"))?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.ends_with(':') && !l.is_empty())
            .filter_map(|l| l.split_whitespace().last().map(str::to_owned))
            .collect())
    };
    let defined = names(&["-g", "--defined-only"])?;
    let needed: Vec<String> = names(&["-u"])?.difference(&defined).cloned().collect();
    println!("  needs from the C runtime: {}", needed.join(" "));
    let forbidden = [
        "malloc",
        "calloc",
        "realloc",
        "free",
        "__rust_alloc",
        "__rust_dealloc",
    ];
    if let Some(bad) = needed
        .iter()
        .find(|s| forbidden.contains(&s.as_str()) || s.starts_with("_ZN3std"))
    {
        return Err(format!("{}: references `{bad}`", lib.display()));
    }
    Ok(())
}

// ---- header / Rust agreement ----

/// Integer `#define EPLB_AICPU_*` of the header, and `pub const EPLB_AICPU_*` of the Rust side.
fn constants(text: &str, rust: bool) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        let (name, value) = if rust {
            let Some(rest) = line.strip_prefix("pub const EPLB_AICPU_") else {
                continue;
            };
            let Some((name, rest)) = rest.split_once(':') else {
                continue;
            };
            let Some((_, v)) = rest.split_once('=') else {
                continue;
            };
            (name, v.trim().trim_end_matches(';'))
        } else {
            let Some(rest) = line.strip_prefix("#define EPLB_AICPU_") else {
                continue;
            };
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(v)) = (parts.next(), parts.next()) else {
                continue;
            };
            (name, v.trim_end_matches('u'))
        };
        if let Ok(v) = value.parse::<u64>() {
            out.insert(format!("EPLB_AICPU_{name}"), v);
        }
    }
    out
}

/// `struct.field -> offset`, `struct.size`, `struct.align` from the layout asserts. The Rust
/// structs are named `EplbAicpuArgs` / `EplbAicpuResult` / `EplbAicpuGate` /
/// `EplbAicpuGateResult`, the C ones `eplb_aicpu_args` / `eplb_aicpu_result` /
/// `eplb_aicpu_gate` / `eplb_aicpu_gate_result`; both map to `args` / `result` / `gate` /
/// `gate_result`.
fn layout(text: &str, rust: bool) -> BTreeMap<String, u64> {
    let short = |s: &str| match s.trim() {
        "EplbAicpuArgs" | "eplb_aicpu_args" => Some("args"),
        "EplbAicpuResult" | "eplb_aicpu_result" => Some("result"),
        "EplbAicpuGate" | "eplb_aicpu_gate" => Some("gate"),
        "EplbAicpuGateResult" | "eplb_aicpu_gate_result" => Some("gate_result"),
        _ => None,
    };
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        let body = if rust {
            line.strip_prefix("assert!(")
                .and_then(|b| b.strip_suffix(");"))
        } else {
            line.strip_prefix("EPLB_AICPU_STATIC_ASSERT(")
                .and_then(|b| b.rsplit_once(',').map(|(a, _)| a))
        };
        let Some((lhs, rhs)) = body.and_then(|b| b.split_once("==")) else {
            continue;
        };
        let Ok(value) = rhs.trim().parse::<u64>() else {
            continue;
        };
        let lhs = lhs.trim();
        let key = if let Some(args) = lhs
            .strip_prefix("offset_of!(")
            .or_else(|| lhs.strip_prefix("offsetof("))
            .and_then(|a| a.strip_suffix(')'))
        {
            let Some((s, field)) = args.split_once(',') else {
                continue;
            };
            short(s).map(|s| format!("{s}.{}", field.trim()))
        } else if let Some(t) = lhs
            .strip_prefix("size_of::<")
            .and_then(|a| a.strip_suffix(">()"))
            .or_else(|| {
                lhs.strip_prefix("sizeof(")
                    .and_then(|a| a.strip_suffix(')'))
            })
        {
            short(t).map(|s| format!("{s}.size"))
        } else if let Some(t) = lhs
            .strip_prefix("align_of::<")
            .and_then(|a| a.strip_suffix(">()"))
            .or_else(|| {
                lhs.strip_prefix("EPLB_AICPU_ALIGNOF(")
                    .and_then(|a| a.strip_suffix(')'))
            })
        {
            short(t).map(|s| format!("{s}.align"))
        } else {
            None
        };
        if let Some(k) = key {
            out.insert(k, value);
        }
    }
    out
}

/// Field names of a struct body that starts at the line containing `open` and ends at the
/// next line starting with `}`.
fn fields(text: &str, open: &str, rust: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if !inside {
            inside = line.contains(open);
            continue;
        }
        if line.starts_with('}') {
            break;
        }
        let line = line.split("/*").next().unwrap_or("").trim();
        let name = if rust {
            line.strip_prefix("pub ")
                .and_then(|l| l.split_once(':'))
                .map(|(n, _)| n.trim())
        } else {
            line.strip_suffix(';')
                .and_then(|l| l.rsplit([' ', '*']).next())
        };
        if let Some(n) = name.filter(|n| !n.is_empty() && !n.starts_with("//")) {
            out.push(n.to_string());
        }
    }
    out
}

/// Appends one line per key whose value differs between the header and the Rust side.
fn differences(
    problems: &mut String,
    what: &str,
    header: &BTreeMap<String, u64>,
    rust: &BTreeMap<String, u64>,
) {
    for key in header.keys().chain(rust.keys()).collect::<BTreeSet<_>>() {
        let (h, r) = (header.get(key), rust.get(key));
        if h != r {
            let _ = writeln!(problems, "{what} {key}: header {h:?}, rust {r:?}");
        }
    }
}

fn check_header() -> Result<(), String> {
    let dir = crate_dir();
    let read =
        |p: PathBuf| std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()));
    let h = read(dir.join("include").join("eplb_aicpu.h"))?;
    let rs = read(dir.join("src").join("lib.rs"))?;
    let mut problems = String::new();
    let (hc, rc) = (constants(&h, false), constants(&rs, true));
    if hc.len() < 30 {
        let _ = writeln!(problems, "only {} constants in the header", hc.len());
    }
    differences(&mut problems, "constant", &hc, &rc);
    let (hl, rl) = (layout(&h, false), layout(&rs, true));
    differences(&mut problems, "layout assert", &hl, &rl);
    for (s, rust_open, c_open) in [
        (
            "args",
            "pub struct EplbAicpuArgs {",
            "typedef struct eplb_aicpu_args {",
        ),
        (
            "result",
            "pub struct EplbAicpuResult {",
            "typedef struct eplb_aicpu_result {",
        ),
        (
            "gate",
            "pub struct EplbAicpuGate {",
            "typedef struct eplb_aicpu_gate {",
        ),
        (
            "gate_result",
            "pub struct EplbAicpuGateResult {",
            "typedef struct eplb_aicpu_gate_result {",
        ),
    ] {
        let (rf, cf) = (fields(&rs, rust_open, true), fields(&h, c_open, false));
        if rf != cf || rf.is_empty() {
            let _ = writeln!(
                problems,
                "{s} fields differ:\n  header: {cf:?}\n  rust:   {rf:?}"
            );
        }
        for f in rf
            .iter()
            .map(|f| format!("{s}.{f}"))
            .chain([format!("{s}.size"), format!("{s}.align")])
        {
            if !rl.contains_key(&f) {
                let _ = writeln!(problems, "no layout assert for {f}");
            }
        }
    }
    if problems.is_empty() {
        eprintln!(
            "==> aicpu: eplb_aicpu.h agrees with src/lib.rs ({} constants, {} layout asserts)",
            hc.len(),
            hl.len()
        );
        Ok(())
    } else {
        Err(format!("eplb_aicpu.h and src/lib.rs disagree:\n{problems}"))
    }
}

// ---- golden cases in the C test's binary format ----

struct Case {
    /// layers, experts, ranks, slots per rank, ranks per node, groups.
    dims: [u64; 6],
    current: Vec<u16>,
    loads: Vec<f64>,
    windows: usize,
    samples: Vec<f64>,
}

fn flatten(v: &Value, out: &mut Vec<f64>) -> Result<(), String> {
    match v {
        Value::Array(a) => a.iter().try_for_each(|x| flatten(x, out)),
        x => {
            out.push(x.as_f64().ok_or_else(|| format!("not a number: {x}"))?);
            Ok(())
        }
    }
}

fn golden_case(name: &str) -> Result<Case, String> {
    let path = root()
        .join("..")
        .join("shared")
        .join("data")
        .join("golden")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "golden input {} is required by the AICPU check: {e}",
            path.display()
        )
    })?;
    let raw: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let err = |what: &str| format!("{}: {what}", path.display());
    let sh = &raw["shape"];
    let get = |k: &str| {
        sh[k]
            .as_u64()
            .ok_or_else(|| err(&format!("shape.{k} missing")))
    };
    let (l, n, r, s) = (
        get("num_layers")?,
        get("num_experts")?,
        get("num_ranks")?,
        get("slots_per_rank")?,
    );
    let (groups, nodes) = (get("num_groups")?, get("num_nodes")?);
    if nodes == 0 || r % nodes != 0 {
        return Err(err("num_nodes does not divide num_ranks"));
    }
    let input = &raw["input"];
    let mut cur = Vec::new();
    flatten(&input["current_placement"], &mut cur)?;
    let current: Vec<u16> = cur.iter().map(|&x| x as u16).collect();
    let (ln, per_layer) = ((l * n) as usize, (r * s) as usize);
    if current.len() != l as usize * per_layer {
        return Err(err("current_placement size"));
    }
    let mut loads = Vec::new();
    if input.get("loads").is_some() {
        flatten(&input["loads"], &mut loads)?;
    } else if input.get("slot_loads").is_some() {
        let mut slot = Vec::new();
        flatten(&input["slot_loads"], &mut slot)?;
        if slot.len() != current.len() {
            return Err(err("slot_loads size"));
        }
        loads = vec![0.0; ln];
        for (j, (&e, &x)) in current.iter().zip(&slot).enumerate() {
            loads[(j / per_layer) * n as usize + e as usize] += x;
        }
    } else {
        return Err(err("input.loads or input.slot_loads missing"));
    }
    if loads.len() != ln {
        return Err(err("loads size"));
    }
    Ok(Case {
        dims: [l, n, r, s, r / nodes, groups],
        current,
        loads,
        windows: 0,
        samples: Vec::new(),
    })
}

/// The case with [`WINDOWS`] per-window samples that differ per window, and loads = their sum.
fn with_windows(case: &Case) -> Case {
    let n = case.dims[1] as usize;
    let mut samples = Vec::with_capacity(WINDOWS * case.loads.len());
    for t in 0..WINDOWS {
        samples.extend(case.loads.iter().enumerate().map(|(i, &x)| {
            let (layer, e) = (i / n, i % n);
            x * 0.125 * (1 + (e + 3 * t + layer) % 4) as f64
        }));
    }
    let mut loads = vec![0.0; case.loads.len()];
    for w in samples.chunks_exact(case.loads.len()) {
        loads.iter_mut().zip(w).for_each(|(s, x)| *s += x);
    }
    Case {
        dims: case.dims,
        current: case.current.clone(),
        loads,
        windows: WINDOWS,
        samples,
    }
}

/// Writes `DIR/NAME.case` (format in `eplb-policies/aicpu/reference/src/main.rs`).
fn write_case(dir: &Path, name: &str, c: &Case) -> Result<(), String> {
    let mut b = Vec::new();
    b.extend_from_slice(b"EPLBCAS1");
    for v in c.dims.iter().chain(&[SEED, c.windows as u64]) {
        b.extend_from_slice(&v.to_le_bytes());
    }
    c.current
        .iter()
        .for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
    b.resize(b.len().next_multiple_of(8), 0);
    c.loads
        .iter()
        .chain(&c.samples)
        .for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
    let path = dir.join(format!("{name}.case"));
    std::fs::write(&path, b).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "#define EPLB_AICPU_H\n#define EPLB_AICPU_OK 0u /* ok */\n\
typedef struct eplb_aicpu_result {\n    uint32_t a; /* x */\n    const double *b;\n} eplb_aicpu_result;\n\
EPLB_AICPU_STATIC_ASSERT(sizeof(eplb_aicpu_result) == 16, \"s\");\n\
EPLB_AICPU_STATIC_ASSERT(offsetof(eplb_aicpu_result, b) == 8, \"b\");\n";
    const RS: &str = "pub const EPLB_AICPU_OK: u32 = 0;\npub struct EplbAicpuResult {\n    /// doc\n\
    pub a: u32,\n    pub b: *const f64,\n}\n    assert!(size_of::<EplbAicpuResult>() == 16);\n\
    assert!(offset_of!(EplbAicpuResult, b) == 8);\n";

    #[test]
    fn header_and_rust_parse_alike() {
        assert_eq!(constants(H, false), constants(RS, true));
        assert_eq!(constants(H, false).len(), 1);
        assert_eq!(layout(H, false), layout(RS, true));
        assert_eq!(layout(H, false).len(), 2);
        let want = ["a", "b"].map(String::from).to_vec();
        assert_eq!(fields(H, "typedef struct eplb_aicpu_result {", false), want);
        assert_eq!(fields(RS, "pub struct EplbAicpuResult {", true), want);
        let mut p = String::new();
        differences(
            &mut p,
            "c",
            &layout(H, false),
            &layout(&RS.replace("8);", "4);"), true),
        );
        assert!(p.contains("result.b"), "{p}");
    }
}
