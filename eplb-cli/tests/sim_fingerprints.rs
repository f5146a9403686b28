//! The simulator's placements logs stay byte-identical to those of commit 1ec8aa2 (the threaded
//! simulator before the rank machine; FlashLB's re-recorded for issue 28): the fingerprints in
//! `tests/data/sim_fingerprints.txt` (FNV-1a 64 of `eplb simulate --placements-log` without the
//! `policy_time_s` members, the one wall-clock number in the log; `scripts/sim_fingerprints.py`
//! recomputes them all with a release build). This test recomputes the cheap ones: every policy on `esft_chain` R8 X8 under the
//! default options, with H=3 A=2, and with a random initial layout, plus a seed and a routing
//! variant.

mod common;

use common::{eplb, shared};

const CHEAP: [&str; 4] = [
    "[]",
    "[--heat-interval 3 --algo-interval 2]",
    "[--initial random:7]",
    "[--seed 5]",
];

fn fnv(bytes: &[u8]) -> u64 {
    eplb_core::fnv1a(bytes.iter().map(|&b| u64::from(b)))
}

/// Removes every `,"policy_time_s":NUMBER` from the log.
fn strip_times(text: &str) -> String {
    const KEY: &str = ",\"policy_time_s\":";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(KEY) {
        out.push_str(&rest[..i]);
        let tail = &rest[i + KEY.len()..];
        let end = tail
            .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
            .unwrap_or(tail.len());
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn placements_logs_match_the_recorded_fingerprints() {
    let table = std::fs::read_to_string(format!(
        "{}/tests/data/sim_fingerprints.txt",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let dir = std::env::temp_dir().join(format!("eplb-fp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("p.json");
    let mut checked = 0;
    for line in table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let open = line.find('[').unwrap();
        let close = line.find(']').unwrap();
        let head: Vec<&str> = line[..open].split_whitespace().collect();
        let extra = &line[open..=close];
        let tail: Vec<&str> = line[close + 1..].split_whitespace().collect();
        let (series, ranks, policy, want) = (head[0], head[1], tail[0], tail[1]);
        let cheap = series == "esft_chain" && ranks == "8" && CHEAP.contains(&extra);
        let variant = series == "esft_chain"
            && ranks == "8"
            && extra == "[--routing even]"
            && policy == "default";
        if !(cheap || variant) {
            continue;
        }
        let trace = shared(&format!("data/series/{series}.json"));
        let log_s = log.display().to_string();
        let mut args = vec![
            "simulate",
            "--trace",
            &trace,
            "--ranks",
            ranks,
            "--redundant",
            ranks,
            "--policy",
            policy,
            "--placements-log",
            &log_s,
        ];
        let extra_args: Vec<&str> = extra
            .trim_matches(|c| c == '[' || c == ']')
            .split_whitespace()
            .collect();
        if !extra_args.contains(&"--heat-interval") {
            args.extend(["--heat-interval", "10", "--algo-interval", "1"]);
        }
        args.extend(&extra_args);
        let out = eplb(&args);
        assert!(
            out.status.success(),
            "{line}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&log).unwrap();
        let got = format!("{:016x}", fnv(strip_times(&text).as_bytes()));
        assert_eq!(got, want, "{series} R{ranks} {extra} {policy}");
        checked += 1;
    }
    std::fs::remove_dir_all(dir).unwrap();
    assert_eq!(checked, 29, "cases recomputed");
}

#[test]
fn stripping_removes_only_the_policy_times() {
    let s = r#"{"a":1,"policy_time_s":0.00012,"b":[1,2]},{"policy_time_s":3e-5},{"x":2,"policy_time_s":12}"#;
    assert_eq!(
        strip_times(s),
        r#"{"a":1,"b":[1,2]},{"policy_time_s":3e-5},{"x":2}"#
    );
}
