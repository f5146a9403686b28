//! `simulate --fail-rank R@W` / `--join-rank R@W`: the membership keys of `--json`, and bad
//! values refused with `error: ...` and a non-zero exit.

mod common;

use common::{eplb, shared};

fn sim(extra: &[&str]) -> std::process::Output {
    sim_with("16", extra)
}

/// `sim` with `redundant` redundant experts.
fn sim_with(redundant: &str, extra: &[&str]) -> std::process::Output {
    let trace = shared("data/series/esft_chain.json");
    let mut args = vec![
        "simulate",
        "--trace",
        trace.as_str(),
        "--ranks",
        "8",
        "--redundant",
        redundant,
        "--heat-interval",
        "10",
        "--algo-interval",
        "1",
        "--policy",
        "default",
        "--json",
    ];
    args.extend_from_slice(extra);
    eplb(&args)
}

#[test]
fn simulate_json_reports_the_failure_its_reloads_and_the_join() {
    let out = sim(&["--fail-rank", "3@40", "--join-rank", "3@100"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ev = v["membership_events"].as_array().unwrap();
    assert_eq!(ev.len(), 2);
    assert_eq!(ev[0]["kind"], "fail");
    assert_eq!(ev[0]["rank"], 3);
    assert_eq!(ev[0]["window"], 40);
    assert_eq!(ev[0]["live_ranks"], 7);
    assert!(ev[0]["lost_experts"].as_u64().unwrap() > 0);
    assert!(ev[0]["unserved_tokens"].as_u64().unwrap() > 0);
    let copies = ev[0]["reload_copies"].as_u64().unwrap();
    assert!(copies > 0);
    let expert = v["payload"]["expert_bytes"].as_u64().unwrap();
    assert_eq!(ev[0]["reload_bytes"].as_u64().unwrap(), copies * expert);
    assert!(ev[0]["reload_ms"].as_f64().unwrap() > 0.0);
    assert!(ev[0]["recovered_at_window"].as_u64().is_some());
    assert_eq!(ev[1]["kind"], "join");
    assert_eq!(ev[1]["live_ranks"], 8);
    assert!(v["reload_bytes_total"].as_u64().unwrap() >= copies * expert);
    assert!(v["unserved_tokens_total"].as_u64().unwrap() > 0);
    // Without events: the keys are there, empty and zero.
    let out = sim(&[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["membership_events"], serde_json::json!([]));
    assert_eq!(v["reload_bytes_total"], 0);
    assert_eq!(v["unserved_tokens_total"], 0);
}

#[test]
fn bad_membership_values_say_error_and_fail() {
    for (flag, value, says) in [
        ("--fail-rank", "5@", "--fail-rank 5@"),
        ("--fail-rank", "x@3", "--fail-rank x@3"),
        ("--fail-rank", "8@3", "rank 8 is not below the 8 ranks"),
        ("--fail-rank", "3@100000", "window 100000 is not below"),
        ("--join-rank", "3@10", "rank 3 is live"),
    ] {
        let out = sim(&[flag, value]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value}");
        assert!(
            err.starts_with("error: ") && err.contains(says),
            "{flag} {value}: {err}"
        );
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn report_marks_each_membership_event_on_its_time_charts() {
    let trace = shared("data/series/esft_chain.json");
    let dir = std::env::temp_dir().join(format!("eplb-members-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_path = dir.join("r.html");
    let out = eplb(&[
        "report",
        "--trace",
        &trace,
        "--ranks",
        "8",
        "--redundant",
        "16",
        "--heat-interval",
        "10",
        "--algo-interval",
        "1",
        "--policies",
        "default",
        "--fail-rank",
        "3@40",
        "--join-rank",
        "3@100",
        "--out",
        out_path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&out_path).unwrap();
    // The PAR chart and the time chart each carry both labels.
    assert_eq!(html.matches("rank 3 fails").count(), 2);
    assert_eq!(html.matches("rank 3 joins").count(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A failure and a join of one rank at one window is refused before the run, worded with the
/// join's flag (it used to end in an internal error halfway through); several events at one
/// window each report their own lost experts.
#[test]
fn events_at_one_window_are_checked_and_reported_one_by_one() {
    let out = sim(&["--fail-rank", "3@20", "--join-rank", "3@20"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("error: --join-rank 3@20: rank 3 already has an event at window 20"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    // 8 ranks with 24 redundant experts (11 slots): two may fail.
    let lost = |extra: &[&str]| -> Vec<u64> {
        let out = sim_with("24", extra);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["membership_events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["lost_experts"].as_u64().unwrap())
            .collect()
    };
    let alone = lost(&["--fail-rank", "3@20"]);
    let both = lost(&["--fail-rank", "3@20", "--fail-rank", "4@20"]);
    assert_eq!(both.len(), 2);
    assert_eq!(both[0], alone[0]);
    assert!(both[1] > both[0], "{both:?}");
}
