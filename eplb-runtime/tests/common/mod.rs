//! Helpers shared by the eplb-runtime integration tests (each test crate uses a part of them).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

use eplb_core::Shape;
use eplb_core::metrics::Routing;
use eplb_runtime::simulate::{Initial, SimConfig, SimPolicy, SimTrace};

/// A file under `../shared` (relative to the project root), which must exist.
pub fn shared(rel: &str) -> String {
    let p = PathBuf::from(format!("{}/../../shared/{rel}", env!("CARGO_MANIFEST_DIR")));
    assert!(p.is_file(), "missing test input {}", p.display());
    p.display().to_string()
}

/// A trace under `../shared`, as whole token counts.
pub fn trace(rel: &str) -> SimTrace {
    let path = shared(rel);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let heat = eplb_map::heat::load_heat(&bytes, None).unwrap();
    SimTrace {
        windows: heat.windows(),
        layers: heat.layers(),
        experts: heat.experts(),
        counts: heat.counts_u64().unwrap(),
    }
}

/// The setting of `dynamic-anchors.md`: H=10, A=1, log2phy, default initial layout, one node.
pub fn anchor_cfg(ranks: u16, redundant: u32, policy: SimPolicy) -> SimConfig {
    SimConfig {
        ranks,
        redundant,
        ranks_per_node: None,
        groups: None,
        policy,
        heat_interval: 10,
        algo_interval: 1,
        initial: Initial::Default,
        routing: Routing::Log2Phy,
        seed: 0,
        expert_bytes: 8,
    }
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

/// The default layout of `shape`.
pub fn default_layout(shape: &Shape) -> Vec<u16> {
    let mut p = vec![0u16; shape.placement_len()];
    eplb_core::Layout::Default.fill(shape, &mut p).unwrap();
    p
}

/// Rank `rank`'s rows of `placement`, one per layer (`[L][S]`).
pub fn rank_rows(shape: &Shape, placement: &[u16], rank: usize) -> Vec<Vec<u16>> {
    let s = shape.slots_per_rank();
    placement
        .chunks_exact(shape.slots_per_layer())
        .map(|l| l[rank * s..(rank + 1) * s].to_vec())
        .collect()
}

/// The small cluster shape of the end-to-end tests: 4 layers, 16 experts, 8 ranks x 3 slots.
pub fn small_shape() -> Shape {
    Shape::new(4, 16, 8, 3).unwrap()
}

/// Skewed, deterministic per-slot counts of `rank` under `placement`: experts with
/// `(e + l + shift) % 5 == 0` are `hot` times hotter.
pub fn slot_counts(
    shape: &Shape,
    placement: &[u16],
    rank: usize,
    iter: usize,
    hot: u32,
    shift: usize,
) -> Vec<u32> {
    let (s, per) = (shape.slots_per_rank(), shape.slots_per_layer());
    let mut out = Vec::with_capacity(shape.layers() * s);
    for l in 0..shape.layers() {
        for slot in 0..s {
            let e = placement[l * per + rank * s + slot] as usize;
            let h = if (e + l + shift).is_multiple_of(5) {
                hot
            } else {
                1
            };
            out.push(h * (1 + ((e * 7 + iter) % 11) as u32));
        }
    }
    out
}
