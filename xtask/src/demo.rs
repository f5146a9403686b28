//! `cargo xtask demo`: replays the vendored ESFT trace through `eplb simulate` for every policy
//! and prints realized PAR, weight moves and planner time per policy, then writes the
//! `eplb report` page of the first cluster to `target/eplb-demo/report.html`.

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
    let screenshot = match args {
        [] => false,
        [a] if a == "--screenshot" => true,
        [a, ..] => {
            return Err(format!(
                "`cargo xtask demo` takes only `--screenshot`, got `{a}`"
            ));
        }
    };
    run(
        "build eplb (release)",
        cargo().args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "eplb-cli",
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
            "{:<12} {:>10} {:>9} {:>8} {:>13} {:>12}  {:>24}",
            "policy",
            "mean PAR*",
            "p99 PAR*",
            "changes",
            "moves/change",
            "planner ms",
            "step saving % (band)**"
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
                "{policy:<12} {:>10.4} {:>9.4} {:>8} {:>13.0} {:>12.2}  {:>24}",
                f("mean_par_from_first_activation"),
                f("p99_par_from_first_activation"),
                v["changes"].as_u64().unwrap_or(0),
                f("moves_per_change"),
                f("policy_time_ms_mean"),
                format!(
                    "{:.2} ({:.2} to {:.2})",
                    f("est_net_saving_pct"),
                    f("est_net_saving_pct_low"),
                    f("est_net_saving_pct_high")
                ),
            );
        }
    }
    println!();
    println!("* from the first activation (window 11) on; lower bound 1.0000 on every window.");
    println!(
        "** estimated saving of the whole step (TPOT) against static net of the moves, with the time \
         model's band (docs/time-model.md; default hardware a3, decode, 128 tokens per rank)."
    );
    let page = report(&bin, CLUSTERS[0])?;
    println!();
    println!("report of EP{}: {}", CLUSTERS[0].0, page.display());
    if screenshot {
        let png = root().join("docs").join("report.png");
        shoot(&page, &png)?;
        println!("screenshot: {}", png.display());
    }
    println!("demo ran in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs `eplb report` on the demo trace for `(ranks, redundant)` from the project root, with
/// relative paths and the program named `eplb`, so the page shows a command one can retype.
fn report(
    bin: &std::path::Path,
    (ranks, redundant): (u16, u32),
) -> Result<std::path::PathBuf, String> {
    let rel = std::path::Path::new("target").join("eplb-demo");
    std::fs::create_dir_all(root().join(&rel))
        .map_err(|e| format!("{}: {e}", root().join(&rel).display()))?;
    let out = rel.join("report.html");
    let mut cmd = Command::new(bin);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.arg0("eplb");
    }
    cmd.current_dir(root())
        .args(["report", "--trace", "data/esft_chain.json"])
        .args([
            "--ranks",
            &ranks.to_string(),
            "--redundant",
            &redundant.to_string(),
            "--policies",
            "all",
            "--heat-interval",
            "10",
            "--algo-interval",
            "1",
            "--out",
        ])
        .arg(&out);
    run("eplb report", &mut cmd)?;
    Ok(root().join(out))
}

/// Renders `page` with headless Chromium (Debian's `chromium`) into `png`: 1400 CSS pixels wide
/// at scale 0.6, which keeps the PNG under 500 KB.
fn shoot(page: &std::path::Path, png: &std::path::Path) -> Result<(), String> {
    let profile = std::env::temp_dir().join(format!("eplb-demo-chromium-{}", std::process::id()));
    let mut cmd = Command::new("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--force-device-scale-factor=0.6",
        "--window-size=1400,3900",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .arg(format!("--screenshot={}", png.display()))
    .arg(format!("file://{}", page.display()))
    .stderr(std::process::Stdio::null());
    let done = run("chromium --screenshot (apt-get install chromium)", &mut cmd);
    let _ = std::fs::remove_dir_all(&profile);
    done
}
