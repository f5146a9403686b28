//! `cargo xtask demo`: replays the vendored ESFT trace through `eplb simulate` for every policy
//! and prints realized PAR, weight moves and planner time per policy.

use std::process::Command;

use serde_json::Value;

use crate::{cargo, root, run};

/// The policies shown, in order.
const POLICIES: [&str; 7] = [
    "static",
    "random",
    "default",
    "swift",
    "flashlb",
    "deepseek",
    "incremental",
];

/// (ranks, redundant) clusters replayed.
const CLUSTERS: [(u16, u32); 2] = [(8, 8), (16, 16)];

pub fn demo(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("`cargo xtask demo` takes no arguments, got `{a}`"));
    }
    run(
        "build eplb (release)",
        cargo().args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "eplb-runtime",
            "--bin",
            "eplb",
        ]),
    )?;
    let bin = root().join("target").join("release").join("eplb");
    let trace = root().join("data").join("esft_chain.json");
    if !trace.is_file() {
        return Err(format!("{} is missing", trace.display()));
    }
    let started = std::time::Instant::now();
    println!();
    println!("eplb demo: ESFT DeepSeek-V2-Lite trace (195 windows x 26 layers x 64 experts,");
    println!(
        "domain shifts intent -> law -> summary), heat 10 windows, plan active 1 window later,"
    );
    println!("log2phy routing; PAR = max rank load / mean rank load (1.0 is perfect).");
    for (ranks, redundant) in CLUSTERS {
        println!();
        println!("EP{ranks}, {redundant} redundant experts");
        println!(
            "{:<12} {:>10} {:>9} {:>8} {:>13} {:>12}",
            "policy", "mean PAR*", "p99 PAR*", "changes", "moves/change", "planner ms"
        );
        for policy in POLICIES {
            let out = Command::new(&bin)
                .args(["simulate", "--trace"])
                .arg(&trace)
                .args([
                    "--ranks",
                    &ranks.to_string(),
                    "--redundant",
                    &redundant.to_string(),
                    "--policy",
                    policy,
                    "--heat-interval",
                    "10",
                    "--algo-interval",
                    "1",
                    "--json",
                ])
                .output()
                .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
            if !out.status.success() {
                let msg = String::from_utf8_lossy(&out.stderr);
                println!(
                    "{policy:<12} unavailable: {}",
                    msg.trim().trim_start_matches("error: ")
                );
                continue;
            }
            let v: Value = serde_json::from_slice(&out.stdout)
                .map_err(|e| format!("eplb simulate --json printed no JSON: {e}"))?;
            let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            println!(
                "{policy:<12} {:>10.4} {:>9.4} {:>8} {:>13.0} {:>12.2}",
                f("mean_par_from_first_activation"),
                f("p99_par_from_first_activation"),
                v["changes"].as_u64().unwrap_or(0),
                f("moves_per_change"),
                f("policy_time_ms_mean"),
            );
        }
    }
    println!();
    println!("* from the first activation (window 11) on; lower bound 1.0000 on every window.");
    println!("demo ran in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
