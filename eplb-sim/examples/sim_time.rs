//! Times `simulate` alone (no cost or time estimate): `sim_time TRACE R X POLICY REPEATS`.
use std::time::Instant;

use eplb_core::metrics::Routing;
use eplb_policies::PolicyKind;
use eplb_sim::simulate::{Initial, SimConfig, SimPolicy, SimTrace, simulate};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let bytes = std::fs::read(&a[1]).unwrap();
    let heat = eplb_map::heat::load_heat(&bytes, None).unwrap();
    let trace = SimTrace {
        windows: heat.windows(),
        layers: heat.layers(),
        experts: heat.experts(),
        counts: heat.counts_u64().unwrap(),
    };
    let policy = if a[4] == "static" {
        SimPolicy::Static
    } else {
        SimPolicy::Policy(a[4].parse::<PolicyKind>().unwrap())
    };
    let cfg = SimConfig {
        ranks: a[2].parse().unwrap(),
        redundant: a[3].parse().unwrap(),
        ranks_per_node: None,
        groups: None,
        policy,
        heat_interval: 10,
        algo_interval: 1,
        initial: Initial::Default,
        routing: Routing::Log2Phy,
        seed: 0,
        expert_bytes: 64,
        payoff_gate: None,
        events: Vec::new(),
    };
    let mut best = f64::MAX;
    let mut par = 0.0;
    for _ in 0..a[5].parse::<usize>().unwrap() {
        let t = Instant::now();
        let r = simulate(&trace, &cfg, &mut |_, _| {}).unwrap();
        best = best.min(t.elapsed().as_secs_f64());
        par = r.mean_par;
    }
    println!("best {best:.3} s mean_par {par}");
}
