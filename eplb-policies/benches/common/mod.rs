//! The DeepSeek-V3 golden inputs shared by the policy benchmarks.
#![allow(dead_code)]

use std::path::PathBuf;

use eplb_core::Shape;
use serde_json::Value;

/// One golden input.
pub struct Case {
    pub name: &'static str,
    pub shape: Shape,
    pub current: Vec<u16>,
    pub loads: Vec<f64>,
}

fn flat(v: &Value, out: &mut Vec<f64>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| flat(x, out)),
        x => out.push(x.as_f64().expect("number")),
    }
}

/// Reads `../../shared/data/golden/<name>.json` (relative to this crate).
pub fn golden(name: &'static str) -> Case {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/golden")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let raw: Value = serde_json::from_str(&text).unwrap();
    let sh = &raw["shape"];
    let get = |k: &str| sh[k].as_u64().unwrap() as u16;
    let (r, nodes) = (get("num_ranks"), get("num_nodes"));
    let shape = Shape::with_topology(
        get("num_layers"),
        get("num_experts"),
        r,
        get("slots_per_rank"),
        r / nodes,
        get("num_groups"),
    )
    .unwrap();
    let (mut current, mut loads) = (Vec::new(), Vec::new());
    flat(&raw["input"]["current_placement"], &mut current);
    flat(&raw["input"]["loads"], &mut loads);
    Case {
        name,
        shape,
        current: current.into_iter().map(|x| x as u16).collect(),
        loads,
    }
}

/// The DeepSeek-V3 inputs every policy is measured on.
pub fn dsv3_cases() -> Vec<Case> {
    [
        "dsv3_prefill_ep32",
        "dsv3_decode_ep32",
        "dsv3_prefill_ep64",
        "dsv3_decode_ep64",
    ]
    .into_iter()
    .map(golden)
    .collect()
}
