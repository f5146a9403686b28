//! Parameter sweep of the incremental policy on a trace (tuning aid; not part of the gate).
//!
//! `cargo run --release -p eplb-runtime --example tune_incremental -- TRACE R X [key=value ...]`
//! with keys `gain`, `budget`, `partners`, `shift`, `history`, `z`, `movers`, `ww`, or
//! `policy=NAME` to run another policy the same way.

mod common;

use eplb_core::metrics::Routing;
use eplb_policies::PolicyKind;
use eplb_policies::incremental::{Incremental, Params};
use eplb_sim::simulate::simulate_with;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: tune_incremental TRACE R X [key=value ...]");
        std::process::exit(2);
    }
    let trace = common::load_trace(&args[0]);
    let mut p = Params::default();
    let mut other: Option<PolicyKind> = None;
    for kv in &args[3..] {
        if let Some(name) = kv.strip_prefix("policy=") {
            other = Some(name.parse().expect("policy"));
        } else {
            common::set_param(&mut p, kv);
        }
    }
    let cfg = common::anchor_cfg(&args[1], &args[2]);
    let pol: Box<dyn eplb_policies::Policy + Send> = match other {
        Some(k) => Box::new(eplb_policies::AnyPolicy::new(k)),
        None => Box::new(Incremental::with_params(p)),
    };
    let r = simulate_with(&trace, &cfg, pol, &mut |_, _| {}).expect("simulate");
    let per: Vec<usize> = r
        .log
        .windows(2)
        .map(|w| {
            eplb_core::metrics::moves(&w[0].placement, &w[1].placement, r.shape.slots_per_rank())
        })
        .collect();
    let times: Vec<String> = r
        .log
        .iter()
        .filter_map(|e| e.policy_time_s.map(|t| format!("{:.1}", t * 1e3)))
        .collect();
    println!("moves per cycle {per:?}\nms per cycle {times:?}");
    // Mean PAR per cycle span, scored from the log.
    let (l, n) = (trace.layers, trace.experts);
    let shape = r.shape;
    let mut scratch = vec![0u32; eplb_core::metrics::scratch_len(&shape)];
    let mut ranks = vec![0.0; shape.ranks()];
    let mut spans = Vec::new();
    for (k, e) in r.log.iter().enumerate() {
        let end = r
            .log
            .get(k + 1)
            .map_or(trace.windows, |x| x.active_from_window);
        let p = eplb_core::Placement::new(shape, &e.placement).unwrap();
        let mut sum = 0.0;
        let mut cnt = 0;
        for wdw in e.active_from_window..end {
            for (li, lp) in p.layers().enumerate() {
                let loads: Vec<f64> = trace.counts[(wdw * l + li) * n..(wdw * l + li + 1) * n]
                    .iter()
                    .map(|&c| c as f64)
                    .collect();
                sum += eplb_core::metrics::layer_par(
                    &lp,
                    &loads,
                    Routing::Log2Phy,
                    &mut scratch,
                    &mut ranks,
                )
                .unwrap();
                cnt += 1;
            }
        }
        spans.push(format!(
            "{}:{:.3}",
            e.active_from_window,
            sum / cnt.max(1) as f64
        ));
    }
    println!("PAR per span {spans:?}");
    println!(
        "{:?}\n  w>=11 mean {:.4} p99 {:.4} | moves total {} ({:.0}/change) | {:.2} ms/cycle (max {:.1})",
        p,
        r.mean_par_from_first_activation,
        r.p99_par_from_first_activation,
        r.moves_total,
        r.moves_per_change(),
        r.policy_time_ms_mean,
        r.policy_time_ms_max
    );
}
