//! Trace bytes to `eplb simulate`: the heat reader, the count checks, then the simulator over
//! real controllers, planner and host transport on a small shape chosen by the first bytes.
//! Never panics; a result has finite metrics where there were windows, and the policy
//! failures it reports are no more than its plans.
#![no_main]

use eplb_core::metrics::Routing;
use eplb_map::heat::load_heat;
use eplb_policies::PolicyKind;
use eplb_sim::simulate::{Initial, SimConfig, SimPolicy, SimTrace, simulate};
use libfuzzer_sys::fuzz_target;

/// Counts above this many values are skipped, so that one execution stays fast.
const MAX_VALUES: usize = 2048;

fuzz_target!(|data: &[u8]| {
    let Some((head, json)) = data.split_at_checked(4) else {
        return;
    };
    let Ok(heat) = load_heat(json, None) else {
        return;
    };
    if heat.as_slice().len() > MAX_VALUES {
        return;
    }
    let Some(counts) = heat.counts_u64() else {
        return;
    };
    let trace = SimTrace {
        windows: heat.windows(),
        layers: heat.layers(),
        experts: heat.experts(),
        counts,
    };
    let ranks = 1 + u16::from(head[0] % 4);
    let redundant = u32::from(head[1] % 4);
    let policy = match head[2] % 7 {
        6 => SimPolicy::Static,
        k => SimPolicy::Policy(PolicyKind::ALL[usize::from(k)]),
    };
    let cfg = SimConfig {
        ranks,
        redundant,
        ranks_per_node: (head[3] & 1 == 1).then_some(1),
        groups: (head[3] & 2 == 2).then_some(2),
        policy,
        heat_interval: 1 + u32::from((head[3] >> 2) % 3),
        algo_interval: 1 + u32::from((head[3] >> 4) % 2),
        initial: if head[3] & 64 == 0 {
            Initial::Default
        } else {
            Initial::Random(u64::from(head[0]))
        },
        routing: if head[3] & 128 == 0 {
            Routing::Log2Phy
        } else {
            Routing::Even
        },
        seed: u64::from(head[1]),
        expert_bytes: 8,
        events: Vec::new(),
        payoff_gate: None,
    };
    match simulate(&trace, &cfg, &mut |_, _| {}) {
        Ok(r) => {
            assert!(r.plan_failures <= r.plans);
            assert_eq!(r.cycles + 1, r.log.len());
            if trace.windows > 0 && trace.layers > 0 {
                assert!(!r.mean_par.is_nan() || trace.counts.iter().all(|&c| c == 0));
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
