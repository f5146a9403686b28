use super::*;
use crate::simulate::{Initial, Router, SimPolicy};
use eplb_core::metrics::Routing;
use eplb_core::time::Dtype;
use eplb_policies::PolicyKind;

fn replay() -> crate::Replay {
    let bytes = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/data/series/esft_chain.json"
    ))
    .unwrap();
    crate::Replay::load(&bytes, "esft_chain", &crate::cost::CostSpec::default()).unwrap()
}

fn cfg(policy: SimPolicy) -> SimConfig {
    SimConfig {
        ranks: 8,
        redundant: 8,
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
    }
}

#[test]
fn windows_are_priced_with_the_simulators_routing() {
    let r = replay();
    let c = cfg(SimPolicy::Policy(PolicyKind::Swift));
    let run = r.run(&c, &[], &mut |_, _| {}).unwrap();
    let basis = TimeSpec::default().resolve(&r.basis, None).unwrap();
    let fig = estimate(&r.trace, &run, &c, &basis, None).unwrap();
    let shape = run.result.shape;
    let (l, n) = (r.trace.layers, r.trace.experts);
    let mut out = vec![0u32; shape.placement_len()];
    for w in [0, 11, 40, r.trace.windows - 1] {
        let live = run
            .result
            .log
            .iter()
            .rev()
            .find(|e| e.active_from_window <= w)
            .unwrap();
        let counts = &r.trace.counts[w * l * n..(w + 1) * l * n];
        Router::new(&shape, &live.placement, Routing::Log2Phy).route(counts, &mut out);
        let loads: Vec<f64> = out.iter().map(|&c| f64::from(c)).collect();
        let want = basis
            .step
            .step(shape.ranks(), shape.slots_per_rank(), &loads, &mut [])
            .unwrap()
            .iteration_ms;
        assert_eq!(fig.per_window_ms[w].to_bits(), want.to_bits(), "window {w}");
    }
    // Every cycle pays the digest; one that changed layers pays a vote per changed layer.
    assert_eq!(fig.stalls.len(), run.result.cycles);
    let hw = basis.model.hardware;
    for s in &fig.stalls {
        assert!(s.ms >= hw.collective_ms * (1 + s.changed_layers) as f64 - 1e-12);
    }
    assert!(fig.stall_total_ms() > 0.0);
    assert!(fig.mean_ms() < fig.static_mean_ms(), "swift balances");
}

#[test]
fn static_saves_nothing_and_stalls_never() {
    let r = replay();
    let c = cfg(SimPolicy::Static);
    let run = r.run(&c, &[], &mut |_, _| {}).unwrap();
    let basis = TimeSpec::default().resolve(&r.basis, None).unwrap();
    let fig = estimate(&r.trace, &run, &c, &basis, None).unwrap();
    assert_eq!(fig.per_window_ms, fig.static_per_window_ms);
    assert_eq!(fig.stall_total_ms(), 0.0);
    assert_eq!(fig.net_saving_pct(), 0.0);
}

#[test]
fn each_stall_is_the_digest_plus_votes_plus_exchanges_beyond_an_iteration() {
    let r = replay();
    let c = cfg(SimPolicy::Policy(PolicyKind::Swift));
    let run = r.run(&c, &[], &mut |_, _| {}).unwrap();
    for bw in [196e9, 1e8, 1e6] {
        let basis = TimeSpec {
            hw_params: vec![("intra_node_bytes_per_s".to_owned(), bw)],
            ..TimeSpec::default()
        }
        .resolve(&r.basis, None)
        .unwrap();
        let fig = estimate(&r.trace, &run, &c, &basis, None).unwrap();
        let hw = basis.model.hardware;
        for (s, cost) in fig.stalls.iter().zip(&run.costs) {
            let it = fig.per_window_ms[s.window - 1];
            let mut want = hw.collective_ms;
            let mut changed = 0;
            for lc in cost.layers.iter().filter(|lc| lc.transfers > 0) {
                changed += 1;
                let ex = lc.max_rank_bytes as f64 / bw * 1e3;
                want += (ex - it).max(0.0) + hw.collective_ms;
            }
            assert_eq!(s.changed_layers, changed);
            assert!(
                (s.ms - want).abs() <= 1e-9 * want,
                "{bw}: {} vs {want}",
                s.ms
            );
        }
    }
}

#[test]
fn settings_resolve_and_bad_ones_name_the_valid_ones() {
    let r = replay();
    // The trace names DeepSeek-V2-Lite: the time model takes its shape, bf16.
    let b = TimeSpec::default().resolve(&r.basis, Some(4)).unwrap();
    assert_eq!(b.model.model.name, "deepseek-v2-lite");
    assert_eq!(b.model.model.dtype, Dtype::Bf16);
    assert_eq!(b.model.expert_bytes, r.basis.payload.total_bytes() as f64);
    assert_eq!(b.model.tokens_per_rank, 128.0);
    assert_eq!(
        b.defaulted,
        [
            "hardware",
            "role",
            "tokens_per_rank",
            "context_tokens",
            "tokens_per_request",
            "requests_per_rank",
            "overlap"
        ]
    );
    // Without --ranks-per-node the hardware preset's node is assumed, and said.
    let b = TimeSpec::default().resolve(&r.basis, None).unwrap();
    assert!(b.defaulted.contains(&"ranks_per_node"));
    assert_eq!(b.ranks_per_node_for(64), 16);
    assert!(
        b.describe_topology(64)
            .contains("hardware preset: set --ranks-per-node")
    );
    assert_eq!(
        b.topology_json(Some(64))["inter_node_link"],
        "scale-up domain"
    );
    let b = TimeSpec {
        hardware: Some("H200".to_owned()),
        role: Some(Role::Prefill),
        model_params: vec![("top_k".to_owned(), 4.0)],
        ..TimeSpec::default()
    }
    .resolve(&r.basis, None)
    .unwrap();
    assert_eq!(
        (
            b.model.hardware.name,
            b.model.tokens_per_rank,
            b.model.model.top_k
        ),
        ("h200", 16384.0, 4)
    );
    let e = parse_hardware("tpu").unwrap_err().to_string();
    assert!(
        e.contains("a2, a3, 950pr, 950dt, h100, h200, b200, h800, gb200"),
        "{e}"
    );
    for (k, v) in [
        ("link_efficiency", 2.0),
        ("domain_ranks", 0.5),
        ("fused_mc2", 3.0),
        ("comm_sm_share", 1.0),
        ("host_ms", -1.0),
    ] {
        let spec = TimeSpec {
            hw_params: vec![(k.to_owned(), v)],
            ..TimeSpec::default()
        };
        assert!(spec.check().is_err(), "{k}={v}");
    }
    for bad in [
        TimeSpec {
            context_tokens: Some(-1.0),
            ..TimeSpec::default()
        },
        TimeSpec {
            prompt_tokens: Some(0.0),
            ..TimeSpec::default()
        },
        TimeSpec {
            requests_per_rank: Some(f64::NAN),
            ..TimeSpec::default()
        },
    ] {
        assert!(bad.check().is_err(), "{bad:?}");
    }
    let e = TimeSpec {
        hw_params: vec![("speed".to_owned(), 1.0)],
        ..TimeSpec::default()
    }
    .check()
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("flops_bf16") && e.contains("collective_ms"),
        "{e}"
    );
    for bad in [0.0, -1.0, f64::NAN] {
        let spec = TimeSpec {
            tokens_per_rank: Some(bad),
            ..TimeSpec::default()
        };
        assert!(spec.check().is_err(), "{bad}");
    }
    assert!(
        TimeSpec {
            model_params: vec![("hidden".to_owned(), 1.5)],
            ..TimeSpec::default()
        }
        .check()
        .is_err()
    );
}

#[test]
fn a_named_link_prices_the_exchanges_of_the_time_model_too() {
    let r = replay();
    let c = cfg(SimPolicy::Policy(PolicyKind::Swift));
    let run = r.run(&c, &[], &mut |_, _| {}).unwrap();
    // Default link: the hardware's (the all-to-all's) links, and the JSON says so.
    let hw = TimeSpec::default().resolve(&r.basis, None).unwrap();
    assert_eq!(hw.exchange_bytes_per_s, None);
    assert_eq!(
        hw.to_json()["exchange_link"]["source"],
        "hardware links (the all-to-all's)"
    );
    // `--link 1gbps`: the cost figures and the exchanges use it both.
    let mut named = r.basis.clone();
    named.link = "1gbps".parse().unwrap();
    named.defaulted.retain(|d| *d != "link");
    let b = TimeSpec::default().resolve(&named, None).unwrap();
    assert_eq!(b.exchange_bytes_per_s, Some(named.link.bytes_per_s()));
    let slow = estimate(&r.trace, &run, &c, &b, None).unwrap();
    let fast = estimate(&r.trace, &run, &c, &hw, None).unwrap();
    assert!(slow.stall_total_ms() > fast.stall_total_ms());
    for (s, cost) in slow.stalls.iter().zip(&run.costs) {
        let it = slow.per_window_ms[s.window - 1];
        let mut want = b.model.hardware.collective_ms;
        for lc in cost.layers.iter().filter(|lc| lc.transfers > 0) {
            let ex = lc.max_rank_bytes as f64 / named.link.bytes_per_s() * 1e3;
            want += (ex - it).max(0.0) + b.model.hardware.collective_ms;
        }
        assert!(
            (s.ms - want).abs() <= 1e-9 * want.max(1.0),
            "{} vs {want}",
            s.ms
        );
    }
}
