//! `simulate` with the static baseline reproduces the `static` rows of `dynamic-anchors.md`.

use eplb_core::metrics::Routing;
use eplb_runtime::simulate::{Initial, SimConfig, SimPolicy, SimTrace, simulate};

fn trace(rel: &str) -> SimTrace {
    let path = format!("{}/../../shared/{rel}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let heat = eplb_map::heat::load_heat(&bytes, None).unwrap();
    SimTrace {
        windows: heat.windows(),
        layers: heat.layers(),
        experts: heat.experts(),
        counts: heat.counts_u64().unwrap(),
    }
}

fn cfg(ranks: u16, redundant: u32, policy: SimPolicy) -> SimConfig {
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

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 0.00005 + 1e-9
}

#[test]
fn esft_r8x8_static_row() {
    let t = trace("data/series/esft_chain.json");
    let r = simulate(&t, &cfg(8, 8, SimPolicy::Static), &mut |_, _| {}).unwrap();
    println!("{r:?}");
    assert!(close(r.mean_par, 1.5271), "{}", r.mean_par);
    assert!(close(r.p99_par, 1.6076), "{}", r.p99_par);
    assert!((r.max_par - 2.594).abs() < 0.0005, "{}", r.max_par);
    assert!(close(r.mean_par_from_first_activation, 1.5273));
    assert!(close(r.p99_par_from_first_activation, 1.6081));
    assert!(close(r.other_routing_mean_par, 1.5271));
    assert_eq!(r.changes, 0);
    assert_eq!(r.cycles, 17);
}
