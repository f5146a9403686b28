//! Issue 29 through the binary: `simulate --metrics-out` writes the metrics the runtime would
//! have exported over a replay, and a trace in the line layout (what the runtime's
//! `eplb_heat_record_path` writes) replays in `simulate`, `report` and `advise` exactly as the
//! same windows in one object do.

mod common;

use common::{eplb, stderr, stdout, tmp};

fn demo() -> String {
    format!("{}/../data/esft_chain.json", env!("CARGO_MANIFEST_DIR"))
}

/// The value of the sample line `name` (labels included) of an exposition.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .parse()
        .unwrap()
}

const SIM: [&str; 10] = [
    "--ranks",
    "8",
    "--redundant",
    "8",
    "--policy",
    "flashlb",
    "--heat-interval",
    "16",
    "--algo-interval",
    "4",
];

#[test]
fn metrics_out_agrees_with_the_json() {
    let dir = tmp("metrics-out");
    let out = dir.join("m.prom");
    let trace = demo();
    let mut args = vec!["simulate", "--trace", trace.as_str()];
    args.extend_from_slice(&SIM);
    args.extend_from_slice(&["--json", "--metrics-out", out.to_str().unwrap()]);
    let o = eplb(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        sample(&text, "eplb_cycles_total"),
        v["cycles"].as_f64().unwrap()
    );
    assert_eq!(
        sample(&text, "eplb_rearrangements_total"),
        v["changes"].as_f64().unwrap()
    );
    assert_eq!(
        sample(&text, "eplb_expert_copies_moved_total"),
        v["moves_total"].as_f64().unwrap()
    );
    assert_eq!(
        sample(&text, "eplb_planner_duration_seconds_count"),
        v["cycles"].as_f64().unwrap()
    );
    let before = sample(&text, "eplb_balancedness_min{when=\"before\"}");
    let after = sample(&text, "eplb_balancedness_min{when=\"after\"}");
    assert!(
        0.0 < before && before < after && after <= 1.0,
        "{before} {after}"
    );
    assert!(text.contains("# TYPE eplb_cycles_total counter\n"));
    assert!(!text.contains("# EOF"));

    // Never over the trace.
    let mut args = vec!["simulate", "--trace", trace.as_str()];
    args.extend_from_slice(&SIM);
    args.extend_from_slice(&["--metrics-out", trace.as_str()]);
    let o = eplb(&args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    std::fs::remove_dir_all(dir).unwrap();
}

/// The demo trace rewritten in the line layout: its header without `counts`, then one window a
/// line, and a partial last line as a recorder cut off mid-write leaves.
fn as_lines(trace: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(trace).unwrap()).unwrap();
    let counts = v.as_object_mut().unwrap().remove("counts").unwrap();
    v["layout"] = "lines".into();
    let mut text = format!("{v}\n");
    for (k, w) in counts.as_array().unwrap().iter().enumerate() {
        text.push_str(&format!(
            "{}\n",
            serde_json::json!({"cycle": k / 16, "counts": w})
        ));
    }
    text.push_str("{\"cycle\":99,\"counts\":[[1,2");
    text
}

#[test]
fn the_line_layout_replays_in_simulate_report_and_advise_unchanged() {
    let dir = tmp("lines");
    let lines = dir.join("rec.jsonl");
    let trace = demo();
    std::fs::write(&lines, as_lines(&trace)).unwrap();
    let lines = lines.to_str().unwrap();
    let run = |t: &str| {
        let mut args = vec!["simulate", "--trace", t];
        args.extend_from_slice(&SIM);
        args.push("--json");
        let o = eplb(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let mut v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        for k in ["policy_time_ms_mean", "policy_time_ms_max"] {
            v.as_object_mut().unwrap().remove(k);
        }
        v
    };
    assert_eq!(run(lines), run(&trace));

    let advise = |t: &str| {
        let o = eplb(&[
            "advise",
            "--trace",
            t,
            "--ranks",
            "8",
            "--policies",
            "swift",
            "--heat-intervals",
            "16",
            "--algo-intervals",
            "4",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    assert_eq!(advise(lines), advise(&trace));

    let page = dir.join("r.html");
    let o = eplb(&[
        "report",
        "--trace",
        lines,
        "--ranks",
        "8",
        "--redundant",
        "8",
        "--policies",
        "swift",
        "--heat-interval",
        "16",
        "--algo-interval",
        "4",
        "--out",
        page.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::metadata(&page).unwrap().len() > 1000);
    std::fs::remove_dir_all(dir).unwrap();
}
