//! One model catalogue (issue 37, class 4): naming the trace's own model prices it exactly as
//! inferring it from the trace does, and a model whose shape contradicts the trace is refused.

mod common;

use common::{eplb, shared, stderr};
use serde_json::Value;

const SERIES: &str = "data/series/esft_chain.json";

fn simulate(trace: &str, extra: &[&str]) -> std::process::Output {
    let mut v = vec![
        "simulate",
        "--trace",
        trace,
        "--ranks",
        "8",
        "--redundant",
        "0",
        "--heat-interval",
        "10",
        "--algo-interval",
        "1",
        "--policy",
        "swift",
        "--json",
    ];
    v.extend_from_slice(extra);
    eplb(&v)
}

/// Every figure but the policy's own wall-clock time.
fn figures(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    let mut v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let m = v.as_object_mut().unwrap();
    m.remove("policy_time_ms_max");
    m.remove("policy_time_ms_mean");
    // The label says where the model came from; the numbers must not.
    let label = m["payload"]["model"].as_str().unwrap().to_owned();
    m["payload"]["model"] = Value::from(label.trim_end_matches(" (from the trace)"));
    v
}

#[test]
fn naming_the_traces_model_prices_it_as_inferring_it() {
    let trace = shared(SERIES);
    let inferred = figures(&simulate(&trace, &[]));
    assert_eq!(inferred["payload"]["quant_type"], "none");
    for name in ["deepseek-v2-lite", "DSV2-Lite"] {
        let named = figures(&simulate(&trace, &["--model", name]));
        assert_eq!(named, inferred, "--model {name}");
    }
    // A quant type given still wins over the checkpoint's.
    let w8 = figures(&simulate(
        &trace,
        &["--model", "deepseek-v2-lite", "--quant", "W8A8"],
    ));
    assert_eq!(w8["payload"]["quant_type"], "W8A8");
}

#[test]
fn a_model_that_contradicts_the_trace_is_refused() {
    let trace = shared(SERIES);
    let o = simulate(&trace, &["--model", "deepseek-v3"]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.starts_with("error: --model deepseek-v3: "), "{e}");
    assert!(
        e.contains("the trace has 64 routed experts per layer, deepseek-v3 has 256"),
        "{e}"
    );
    assert!(e.contains("top-6") && e.contains("top-8"), "{e}");
    assert!(o.stdout.is_empty());
    // An unknown name lists the catalogue.
    let o = simulate(&trace, &["--model", "gpt-moe"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(
            "deepseek-v3, kimi-k2, qwen3-235b, qwen3-30b, deepseek-v2-lite, mixtral-8x7b"
        ),
        "{}",
        stderr(&o)
    );
}
