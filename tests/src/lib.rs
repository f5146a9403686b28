//! Shared helpers of the eplb workspace integration tests: paths to `../shared` and the golden
//! vectors (`../shared/data/golden`, schema `eplb-golden/v1`).
//!
//! A missing file is a loud failure, never a skip.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use eplb_core::metrics::{self, Routing};
use eplb_core::{Placement, Shape};
use eplb_policies::{Input, Output, Policy, Summary, rebalance, scratch_len};
use serde_json::Value;

/// Per-layer PAR of `placement` under the even split (the golden files' routing).
pub fn even_pars(shape: Shape, placement: &[u16], loads: &[f64]) -> Vec<f64> {
    let p = Placement::new(shape, placement).unwrap();
    let mut scratch = vec![0u32; metrics::scratch_len(&shape)];
    let mut ranks = vec![0.0; shape.ranks()];
    let mut per_layer = vec![0.0; shape.layers()];
    metrics::hotness(
        &p,
        loads,
        Routing::Even,
        &mut scratch,
        &mut ranks,
        &mut per_layer,
    )
    .unwrap();
    per_layer
}

/// One [`rebalance`] of `input` by `policy` with fresh scratch and state.
pub struct Rebalanced {
    /// The new placement.
    pub placement: Vec<u16>,
    /// Per-layer PAR after (even split).
    pub par: Vec<f64>,
    /// The summary.
    pub summary: Summary,
}

/// Runs [`rebalance`] once with fresh buffers; panics with `name` on an error.
pub fn rebalance_fresh<P: Policy>(policy: &mut P, input: &Input<'_>, name: &str) -> Rebalanced {
    let shape = *input.shape();
    let mut scratch = vec![0u64; scratch_len(policy, &shape)];
    let mut state = vec![0u64; policy.state_len(&shape)];
    let l = shape.layers();
    let mut placement = vec![0u16; shape.placement_len()];
    let (mut changed, mut before, mut par) = (vec![false; l], vec![0.0; l], vec![0.0; l]);
    let summary = rebalance(
        policy,
        input,
        &mut scratch,
        &mut state,
        Output {
            placement: &mut placement,
            changed: &mut changed,
            par_before: &mut before,
            par_after: &mut par,
        },
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    Rebalanced {
        placement,
        par,
        summary,
    }
}

/// The project root (the workspace directory).
pub fn project_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests crate sits in the workspace")
        .to_path_buf()
}

/// `../shared` relative to the project root.
pub fn shared_dir() -> PathBuf {
    project_root().join("..").join("shared")
}

/// A file under `../shared`, which must exist.
pub fn shared_file(rel: &str) -> PathBuf {
    let p = shared_dir().join(rel);
    assert!(
        p.is_file(),
        "required test input {} is missing (tests read ../shared relative to the project root)",
        p.display()
    );
    p
}

/// Reads and parses a JSON file under `../shared`.
pub fn shared_json(rel: &str) -> Value {
    let p = shared_file(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The names of every `eplb-golden/v1` case.
pub const GOLDEN_CASES: &[&str] = &[
    "deepseek_readme",
    "flashlb_toy",
    "flashlb_toy_tiefree",
    "asc_spec_3_6",
    "asc_spec_3_6_flashlb",
    "dsv3_prefill_ep32",
    "dsv3_decode_ep32",
    "dsv3_decode_ep64",
    "dsv3_prefill_ep64",
    "dsv3_drift_ep32",
    "esft_law_ep8",
    "esft_intent_ep16",
];

/// One peer's expected output on a golden case.
#[derive(Debug, Clone)]
pub struct Expected {
    /// `match == "exact"`.
    pub exact: bool,
    /// The peer's placement, flat `[L][R*S]`.
    pub placement: Vec<u16>,
    /// Per-layer PAR of the peer's placement (even split).
    pub par: Vec<f64>,
    /// Mean PAR over layers.
    pub par_mean: f64,
    /// Relative tolerance on `par_mean` for `metric` matches (0 for exact ones).
    pub tolerance: f64,
}

/// One golden case, with loads folded to logical `[L][N]`.
#[derive(Debug, Clone)]
pub struct GoldenCase {
    pub name: String,
    /// Shape with the case's nodes and groups.
    pub shape: Shape,
    /// The current placement `[L][R][S]`.
    pub current: Vec<u16>,
    /// Logical loads `[L][N]` (given, or folded from slot loads rank-major, or summed over
    /// windows).
    pub loads: Vec<f64>,
    /// Per-window logical loads `[T][L][N]`, when the case has windows.
    pub windows: Option<(usize, Vec<f64>)>,
    /// Lower-bound PAR per layer.
    pub lower_bound: Vec<f64>,
    /// PAR of the current placement per layer.
    pub current_par: Vec<f64>,
    /// Expectations per peer (`deepseek_hier`, `vllm_ascend_default`, ...).
    pub expected: BTreeMap<String, Expected>,
    /// The raw JSON, for anything else.
    pub raw: Value,
}

fn flat_u16(v: &Value) -> Vec<u16> {
    let mut out = Vec::new();
    fn go(v: &Value, out: &mut Vec<u16>) {
        match v {
            Value::Array(a) => a.iter().for_each(|x| go(x, out)),
            x => out.push(u16::try_from(x.as_u64().expect("integer id")).expect("id fits u16")),
        }
    }
    go(v, &mut out);
    out
}

fn flat_f64(v: &Value) -> Vec<f64> {
    let mut out = Vec::new();
    fn go(v: &Value, out: &mut Vec<f64>) {
        match v {
            Value::Array(a) => a.iter().for_each(|x| go(x, out)),
            x => out.push(x.as_f64().expect("number")),
        }
    }
    go(v, &mut out);
    out
}

/// Folds slot loads `[L][R*S]` into logical `[L][N]`, rank-major, through `placement`.
fn fold(placement: &[u16], slot_loads: &[f64], layers: usize, n: usize) -> Vec<f64> {
    let per_layer = placement.len() / layers;
    let mut out = vec![0.0; layers * n];
    for l in 0..layers {
        for j in 0..per_layer {
            let e = placement[l * per_layer + j] as usize;
            out[l * n + e] += slot_loads[l * per_layer + j];
        }
    }
    out
}

/// Loads golden case `name` from `../shared/data/golden/<name>.json`.
pub fn golden(name: &str) -> GoldenCase {
    let raw = shared_json(&format!("data/golden/{name}.json"));
    assert_eq!(raw["schema"], "eplb-golden/v1", "{name}: schema");
    let sh = &raw["shape"];
    let get = |k: &str| {
        sh[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: shape.{k}")) as u16
    };
    let (layers, experts, ranks, spr) = (
        get("num_layers"),
        get("num_experts"),
        get("num_ranks"),
        get("slots_per_rank"),
    );
    let (groups, nodes) = (get("num_groups"), get("num_nodes"));
    let shape = Shape::with_topology(layers, experts, ranks, spr, ranks / nodes, groups)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let input = &raw["input"];
    let current = flat_u16(&input["current_placement"]);
    assert_eq!(
        current.len(),
        shape.placement_len(),
        "{name}: placement size"
    );
    let (l, n) = (shape.layers(), shape.experts());
    let windows = if input.get("window_loads").is_some() {
        let w = flat_f64(&input["window_loads"]);
        Some((w.len() / (l * n), w))
    } else if input.get("window_slot_loads").is_some() {
        let ws = &input["window_slot_loads"];
        let t = ws.as_array().unwrap().len();
        let mut w = Vec::with_capacity(t * l * n);
        for win in ws.as_array().unwrap() {
            w.extend(fold(&current, &flat_f64(win), l, n));
        }
        Some((t, w))
    } else {
        None
    };
    let loads = if input.get("loads").is_some() {
        flat_f64(&input["loads"])
    } else if input.get("slot_loads").is_some() {
        fold(&current, &flat_f64(&input["slot_loads"]), l, n)
    } else {
        let (t, w) = windows.as_ref().expect("loads, slot_loads or windows");
        let mut sum = vec![0.0; l * n];
        for win in w.chunks_exact(l * n).take(*t) {
            for (s, x) in sum.iter_mut().zip(win) {
                *s += x;
            }
        }
        sum
    };
    assert_eq!(loads.len(), l * n, "{name}: loads size");
    let mut expected = BTreeMap::new();
    for (peer, e) in raw["expected"].as_object().unwrap() {
        expected.insert(
            peer.clone(),
            Expected {
                exact: e["match"] == "exact",
                placement: flat_u16(&e["placement"]),
                par: flat_f64(&e["metrics"]["par"]),
                par_mean: e["metrics"]["par_mean"].as_f64().unwrap(),
                tolerance: e["tolerance"]["par_mean_rel"].as_f64().unwrap_or(0.0),
            },
        );
    }
    GoldenCase {
        name: name.to_string(),
        shape,
        current,
        lower_bound: flat_f64(&raw["lower_bound"]["par"]),
        current_par: flat_f64(&raw["current"]["par"]),
        loads,
        windows,
        expected,
        raw,
    }
}
