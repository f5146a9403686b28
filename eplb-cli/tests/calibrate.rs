//! `eplb calibrate`: recovers constants hidden in measurements that `eplb estimate` produced,
//! writes a file `estimate`, `simulate` and `advise` accept, and names bad input.

mod common;

use common::{eplb, shared, stderr, stdout, tmp};
use serde_json::{Value, json};

const HIDDEN: [(&str, f64); 5] = [
    ("host", 1.7),
    ("backbone", 1.2),
    ("gemm", 1.4),
    ("link", 0.8),
    ("latency", 2.0),
];

fn estimate(args: &[&str]) -> Value {
    let mut v = vec![
        "estimate",
        "--model",
        "deepseek-v3",
        "--hardware",
        "h800",
        "--ranks-per-node",
        "8",
        "--json",
    ];
    v.extend_from_slice(args);
    let out = eplb(&v);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

#[test]
fn calibrate_recovers_hidden_constants_and_its_file_is_accepted() {
    let dir = tmp("calibrate-cli");
    let hidden = dir.join("hidden.json");
    let m: serde_json::Map<String, Value> = HIDDEN
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    std::fs::write(
        &hidden,
        json!({"format": "eplb-calibration/v1", "multipliers": m}).to_string(),
    )
    .unwrap();
    let h = hidden.to_str().unwrap();
    let mut points = Vec::new();
    for ranks in ["8", "32"] {
        for t in ["16", "64", "256"] {
            for ctx in ["1024", "8192"] {
                for par in ["1", "1.6"] {
                    let v = estimate(&[
                        "--ranks",
                        ranks,
                        "--role",
                        "decode",
                        "--tokens-per-rank",
                        t,
                        "--context-tokens",
                        ctx,
                        "--par",
                        par,
                        "--calibration",
                        h,
                    ]);
                    points.push(json!({
                        "role": "decode", "ranks": ranks.parse::<u16>().unwrap(),
                        "tokens_per_rank": t.parse::<f64>().unwrap(),
                        "context_tokens": ctx.parse::<f64>().unwrap(),
                        "par": par.parse::<f64>().unwrap(),
                        "step_ms": v["iteration_ms"],
                    }));
                }
            }
        }
    }
    let measured = dir.join("measured.json");
    std::fs::write(&measured, json!({ "points": points }).to_string()).unwrap();
    let out_path = dir.join("calib.json");
    let _ = std::fs::remove_file(&out_path);
    let args = [
        "calibrate",
        "--measured",
        measured.to_str().unwrap(),
        "--out",
        out_path.to_str().unwrap(),
        "--model",
        "deepseek-v3",
        "--hardware",
        "h800",
        "--ranks",
        "32",
        "--ranks-per-node",
        "8",
    ];
    let out = eplb(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("rms relative error") && text.contains("measured"),
        "{text}"
    );
    let c: Value = serde_json::from_slice(&std::fs::read(&out_path).unwrap()).unwrap();
    assert_eq!(c["format"], "eplb-calibration/v1");
    for (k, want) in HIDDEN {
        let got = c["multipliers"][k].as_f64().unwrap();
        assert!((got / want - 1.0).abs() < 0.05, "{k}: {got} vs {want}");
    }
    assert_eq!(c["residuals"].as_array().unwrap().len(), points.len());
    assert!(c["max_relative_error"].as_f64().unwrap() < 0.01);
    // estimate with the fitted file reproduces a hidden measurement.
    let o = out_path.to_str().unwrap();
    let a = estimate(&[
        "--ranks",
        "32",
        "--role",
        "decode",
        "--tokens-per-rank",
        "64",
        "--calibration",
        o,
    ]);
    let b = estimate(&[
        "--ranks",
        "32",
        "--role",
        "decode",
        "--tokens-per-rank",
        "64",
        "--calibration",
        h,
    ]);
    let (x, y) = (
        a["iteration_ms"].as_f64().unwrap(),
        b["iteration_ms"].as_f64().unwrap(),
    );
    assert!((x / y - 1.0).abs() < 0.01, "{x} vs {y}");
    // simulate and advise take it and name it.
    let trace = shared("data/series/esft_chain.json");
    let sim = eplb(&[
        "simulate",
        "--trace",
        &trace,
        "--ranks",
        "8",
        "--redundant",
        "8",
        "--heat-interval",
        "10",
        "--algo-interval",
        "1",
        "--policy",
        "swift",
        "--calibration",
        o,
        "--json",
    ]);
    assert!(sim.status.success(), "{}", stderr(&sim));
    let v: Value = serde_json::from_str(&stdout(&sim)).unwrap();
    assert_eq!(v["time_model"]["calibration"]["source"], o);
    assert!(
        v["est_net_saving_pct_low"].as_f64().unwrap() <= v["est_net_saving_pct"].as_f64().unwrap()
    );
    let adv = eplb(&[
        "advise",
        "--trace",
        &trace,
        "--ranks",
        "8",
        "--policies",
        "swift",
        "--heat-intervals",
        "10",
        "--algo-intervals",
        "1",
        "--calibration",
        o,
        "--json",
    ]);
    assert!(adv.status.success(), "{}", stderr(&adv));
    let v: Value = serde_json::from_str(&stdout(&adv)).unwrap();
    assert_eq!(v["time_model"]["calibration"]["source"], o);
    // Refuses to overwrite its input, and names bad input.
    let mut same = args.to_vec();
    same[4] = same[2];
    assert!(!eplb(&same).status.success());
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "role,tokens_per_rank,step_ms\ndecode,abc,3\n").unwrap();
    let mut a2 = args.to_vec();
    a2[2] = bad.to_str().unwrap();
    let out = eplb(&a2);
    assert!(!out.status.success());
    assert!(
        stderr(&out).starts_with("error: ") && stderr(&out).contains("tokens_per_rank"),
        "{}",
        stderr(&out)
    );
}

/// `--measured` also takes a heat recording whose windows carry `iteration_ms` (what the
/// runtime's `eplb_heat_record_path` and the adapters' `EPLB_TRACE_DIR` write when the engine
/// reports its step times); `--role` says its role.
#[test]
fn calibrate_takes_a_heat_recording_with_iteration_times() {
    let dir = tmp("calibrate-recording");
    let hidden = dir.join("hidden.json");
    let m: serde_json::Map<String, Value> = HIDDEN
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    std::fs::write(
        &hidden,
        json!({"format": "eplb-calibration/v1", "multipliers": m}).to_string(),
    )
    .unwrap();
    // 16 ranks, 64 experts of DeepSeek-V3's top-8 in 2 layers, one iteration per window,
    // every expert alike (PAR 1).
    let mut text = String::from(
        r#"{"format":"eplb-trace/v1","layout":"lines","model":{"num_moe_layers":2,"num_experts":64},"topology":{"ranks":16},"intervals":{"iterations_per_window":1}}"#,
    );
    text.push('\n');
    let mut times = Vec::new();
    for t in [16u64, 64, 256, 1024] {
        let v = estimate(&[
            "--ranks",
            "16",
            "--role",
            "decode",
            "--tokens-per-rank",
            &t.to_string(),
            "--calibration",
            hidden.to_str().unwrap(),
        ]);
        let ms = v["iteration_ms"].as_f64().unwrap();
        times.push(ms);
        let layer = json!(vec![t * 8 * 16 / 64; 64]);
        text.push_str(&format!(
            "{}\n",
            json!({"cycle": 1, "iteration_ms": ms, "counts": [layer, layer]})
        ));
    }
    let rec = dir.join("heat.jsonl");
    std::fs::write(&rec, &text).unwrap();
    let out_path = dir.join("calib.json");
    let _ = std::fs::remove_file(&out_path);
    let mut args = vec![
        "calibrate",
        "--measured",
        rec.to_str().unwrap(),
        "--out",
        out_path.to_str().unwrap(),
        "--model",
        "deepseek-v3",
        "--hardware",
        "h800",
        "--ranks",
        "1",
        "--ranks-per-node",
        "8",
        "--json",
    ];
    // Without its role: an error that says how to give it.
    let out = eplb(&args);
    assert!(!out.status.success());
    assert!(
        stderr(&out).starts_with("error: ") && stderr(&out).contains("--role"),
        "{}",
        stderr(&out)
    );
    args.extend(["--role", "decode"]);
    let out = eplb(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["fitted_on"]["points"], 4);
    let res = v["residuals"].as_array().unwrap();
    for (r, ms) in res.iter().zip(&times) {
        assert_eq!(r["ranks"], 16);
        assert_eq!(r["par"], 1.0);
        assert_eq!(r["measured_ms"].as_f64().unwrap(), *ms);
    }
    let tokens: Vec<f64> = res
        .iter()
        .map(|r| r["tokens_per_rank"].as_f64().unwrap())
        .collect();
    assert_eq!(tokens, [16.0, 64.0, 256.0, 1024.0]);
    assert!(v["max_relative_error"].as_f64().unwrap() < 0.01, "{v}");
    assert!(out_path.exists());
}
