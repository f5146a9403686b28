//! Helpers shared by the eplb-sim integration tests (each test crate uses a part of them).
#![allow(dead_code)]

use std::path::PathBuf;

use eplb_core::metrics::Routing;
use eplb_sim::{Initial, SimConfig, SimPolicy, SimTrace};

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
        payoff_gate: None,
        events: Vec::new(),
    }
}
