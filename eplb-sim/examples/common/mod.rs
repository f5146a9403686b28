//! Shared by the incremental policy's tuning and profiling examples: the trace, the anchor
//! configuration of `dynamic-anchors.md`, and `key=value` parameters.

use eplb_core::metrics::Routing;
use eplb_policies::PolicyKind;
use eplb_policies::incremental::Params;
use eplb_sim::simulate::{Initial, SimConfig, SimPolicy, SimTrace};

/// The trace at `path` (eplb-trace/v1 or any heat format `load_heat` reads), integer counts.
pub fn load_trace(path: &str) -> SimTrace {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let heat = eplb_map::heat::load_heat(&bytes, None).expect("heat");
    SimTrace {
        windows: heat.windows(),
        layers: heat.layers(),
        experts: heat.experts(),
        counts: heat.counts_u64().expect("integer counts"),
    }
}

/// The anchors' loop: H=10, A=1, log2phy routing, default initial layout, one node.
pub fn anchor_cfg(ranks: &str, redundant: &str) -> SimConfig {
    SimConfig {
        ranks: ranks.parse().expect("R"),
        redundant: redundant.parse().expect("X"),
        ranks_per_node: None,
        groups: None,
        policy: SimPolicy::Policy(PolicyKind::Incremental),
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

/// Sets one `key=value` parameter of the incremental policy through [`Params::set`]: any of
/// its names, or the short ones `gain`, `budget`, `shift`, `history`, `ww`; panics on an
/// unknown key or a value out of range.
pub fn set_param(p: &mut Params, kv: &str) {
    let (k, v) = kv.split_once('=').expect("key=value");
    let v: f64 = v.parse().expect("number");
    let k = match k {
        "gain" => "min_gain",
        "budget" => "max_fetch_fraction",
        "shift" => "shift_threshold",
        "history" => "history_windows",
        "ww" => "workload_weight",
        k => k,
    };
    p.set(k, v).unwrap_or_else(|e| panic!("{e}"));
}
