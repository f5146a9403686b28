//! Out-of-sample check of the policies on a drift series the incremental policy was not tuned on
//! (validation aid; not part of the gate).
//!
//! `cargo run --release -p eplb-runtime --example validate_series -- [--windows-per-segment 40]
//! [--seed 2] [--ranks 32,64] [--write PATH] [--traces-dir DIR]`
//!
//! The series is built like `data/series/dsv3_drift_perm.json`, but from the four SGLang
//! aggregate traces that series does not use: one segment of `--windows-per-segment` windows
//! each from `decode_in1800out100`, `prefill_in2000out100`, `decode_in2000out100` and
//! `prefill_in1800out100`, in that order. Every window holds, for every layer, a multinomial
//! sample of 16384 tokens x top-8 assignments from that layer's normalised counts in the
//! segment's trace. Expert ids are then permuted per layer (one permutation per layer, the same
//! for every window) so the id gradient of the SGLang files does not favour the default layout.
//!
//! Sampling method (deterministic for a given `--seed`):
//!
//! - Random numbers come from SplitMix64. The sampling stream is seeded with `seed`, the
//!   permutation stream with `seed ^ PERMUTATION_STREAM`.
//! - A multinomial draw of `n` assignments over the `N` experts of a layer is taken by
//!   conditional binomials: expert `i` gets `Binomial(n_left, w_i / (w_i + ... + w_{N-1}))`, and
//!   the last expert gets what is left, so every layer sums to exactly `n`.
//! - Each binomial draw is exact inversion that visits the support from the mode outwards,
//!   always stepping to the neighbour with the larger probability (the probabilities come from
//!   the ratio recurrence, starting from the mode's probability computed with log-factorials).
//!   Any fixed visiting order gives the exact distribution; starting at the mode makes the
//!   expected work proportional to the standard deviation, not the mean, so the
//!   `160 x 58 x 256` draws take well under a second.
//! - Permutations are Fisher-Yates shuffles drawn layer by layer.
//!
//! The policies (`static`, `default`, `flashlb`, `deepseek`, `incremental`) then run through
//! [`simulate`] with `H = 10`, `A = 1`, routing `log2phy`, the default initial layout, `X = R`,
//! 8 ranks per node and one expert group (so DeepSeek's EPLB runs globally).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use eplb_core::metrics::Routing;
use eplb_policies::PolicyKind;
use eplb_sim::simulate::{Initial, SimConfig, SimPolicy, SimTrace, simulate};

/// The aggregate traces the series is built from, one segment each, in order.
const SOURCES: [&str; 4] = [
    "sglang_dsv3_decode_in1800out100",
    "sglang_dsv3_prefill_in2000out100",
    "sglang_dsv3_decode_in2000out100",
    "sglang_dsv3_prefill_in1800out100",
];
/// Tokens per window.
const TOKENS: u64 = 16384;
/// Routed experts per token.
const TOP_K: u64 = 8;
/// Xored into the seed to get the permutation stream.
const PERMUTATION_STREAM: u64 = 0x7065_726D_7574_6521;

/// SplitMix64.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..bound` (multiply-shift; `bound >= 1`).
    fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }
}

/// `ln(k!)`: a table for small `k`, Stirling's series beyond.
struct LnFactorial {
    table: Vec<f64>,
}

impl LnFactorial {
    const EXACT: usize = 64;

    fn new() -> Self {
        let mut table = Vec::with_capacity(Self::EXACT);
        let mut acc = 0.0f64;
        table.push(0.0);
        for k in 1..Self::EXACT {
            acc += (k as f64).ln();
            table.push(acc);
        }
        Self { table }
    }

    fn get(&self, k: u64) -> f64 {
        if let Some(&v) = self.table.get(k as usize) {
            return v;
        }
        let x = k as f64;
        let inv = 1.0 / x;
        let inv2 = inv * inv;
        x * x.ln() - x
            + 0.5 * (std::f64::consts::TAU * x).ln()
            + inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 * (1.0 / 1260.0)))
    }
}

/// One exact `Binomial(n, p)` draw by inversion from the mode outwards (see the crate doc).
fn binomial(n: u64, p: f64, lnf: &LnFactorial, rng: &mut SplitMix64) -> u64 {
    if n == 0 || p <= 0.0 {
        return 0;
    }
    if p >= 1.0 {
        return n;
    }
    let mode = (((n + 1) as f64 * p).floor() as u64).min(n);
    let ln_pmf = lnf.get(n) - lnf.get(mode) - lnf.get(n - mode)
        + mode as f64 * p.ln()
        + (n - mode) as f64 * (-p).ln_1p();
    let at_mode = ln_pmf.exp();
    let mut u = rng.next_f64() - at_mode;
    if u < 0.0 {
        return mode;
    }
    // Odds of one more success.
    let odds = p / (1.0 - p);
    let (mut lo, mut hi) = (mode, mode);
    let (mut p_lo, mut p_hi) = (at_mode, at_mode);
    loop {
        let down = if lo > 0 {
            p_lo * lo as f64 / ((n - lo + 1) as f64 * odds)
        } else {
            -1.0
        };
        let up = if hi < n {
            p_hi * (n - hi) as f64 / (hi + 1) as f64 * odds
        } else {
            -1.0
        };
        // Both sides exhausted or underflowed: only rounding is left, so take the mode.
        if down <= 0.0 && up <= 0.0 {
            return mode;
        }
        if down >= up {
            lo -= 1;
            p_lo = down;
            u -= down;
            if u < 0.0 {
                return lo;
            }
        } else {
            hi += 1;
            p_hi = up;
            u -= up;
            if u < 0.0 {
                return hi;
            }
        }
    }
}

/// A multinomial draw of `n` over `weights` into `out` by conditional binomials; `suffix[i]` is
/// `weights[i..].sum()` (`suffix.len() == weights.len() + 1`).
fn multinomial(
    n: u64,
    weights: &[f64],
    suffix: &[f64],
    lnf: &LnFactorial,
    rng: &mut SplitMix64,
    out: &mut [u64],
) {
    let mut left = n;
    let last = weights.len() - 1;
    for (i, (o, &w)) in out.iter_mut().zip(weights).enumerate() {
        // The last expert takes the rest (it is 0 unless that expert has weight: an expert
        // followed only by zero weights draws with probability exactly 1).
        let x = if i == last {
            left
        } else if left == 0 || suffix[i] <= 0.0 {
            0
        } else {
            binomial(left, w / suffix[i], lnf, rng)
        };
        *o = x;
        left -= x;
    }
}

/// One source: per layer, the weights and their suffix sums.
struct Source {
    name: String,
    weights: Vec<Vec<f64>>,
    suffix: Vec<Vec<f64>>,
}

fn load_source(dir: &str, name: &str) -> Source {
    let path = format!("{dir}/{name}.json");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    let heat = eplb_map::heat::load_heat(&bytes, None)
        .unwrap_or_else(|e| panic!("cannot parse {path}: {e}"));
    let summed = heat.summed();
    let n = heat.experts();
    let mut weights = Vec::with_capacity(heat.layers());
    let mut suffix = Vec::with_capacity(heat.layers());
    for layer in summed.chunks_exact(n) {
        let total: f64 = layer.iter().sum();
        assert!(total > 0.0, "{path}: a layer without load");
        let w: Vec<f64> = layer.iter().map(|&c| c / total).collect();
        let mut s = vec![0.0; n + 1];
        for i in (0..n).rev() {
            s[i] = s[i + 1] + w[i];
        }
        weights.push(w);
        suffix.push(s);
    }
    Source {
        name: name.to_string(),
        weights,
        suffix,
    }
}

/// The series `[T][L][N]` and its shape.
fn build_series(sources: &[Source], per_segment: usize, seed: u64) -> SimTrace {
    let layers = sources[0].weights.len();
    let experts = sources[0].weights[0].len();
    for s in sources {
        assert_eq!(
            (s.weights.len(), s.weights[0].len()),
            (layers, experts),
            "{} has another shape",
            s.name
        );
    }
    let mut perm_rng = SplitMix64(seed ^ PERMUTATION_STREAM);
    let perms: Vec<Vec<usize>> = (0..layers)
        .map(|_| {
            let mut p: Vec<usize> = (0..experts).collect();
            for i in (1..experts).rev() {
                let j = perm_rng.below(i as u64 + 1) as usize;
                p.swap(i, j);
            }
            p
        })
        .collect();
    let windows = per_segment * sources.len();
    let mut counts = vec![0u64; windows * layers * experts];
    let lnf = LnFactorial::new();
    let mut rng = SplitMix64(seed);
    let mut draw = vec![0u64; experts];
    for (w, window) in counts.chunks_exact_mut(layers * experts).enumerate() {
        let src = &sources[w / per_segment];
        for (l, row) in window.chunks_exact_mut(experts).enumerate() {
            multinomial(
                TOKENS * TOP_K,
                &src.weights[l],
                &src.suffix[l],
                &lnf,
                &mut rng,
                &mut draw,
            );
            for (e, &c) in draw.iter().enumerate() {
                row[perms[l][e]] = c;
            }
        }
    }
    SimTrace {
        windows,
        layers,
        experts,
        counts,
    }
}

fn write_series(path: &str, trace: &SimTrace, per_segment: usize, seed: u64) {
    let (t, l, n) = (trace.windows, trace.layers, trace.experts);
    let counts: Vec<Vec<&[u64]>> = trace
        .counts
        .chunks_exact(l * n)
        .map(|w| w.chunks_exact(n).collect())
        .collect();
    let segments: Vec<serde_json::Value> = SOURCES
        .iter()
        .map(|s| serde_json::json!({"file": format!("{s}.json"), "windows": per_segment}))
        .collect();
    let stem = std::path::Path::new(path)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("validate_series");
    let v = serde_json::json!({
        "format": "eplb-trace/v1",
        "name": stem,
        "model": {
            "name": "DeepSeek-V3/R1 (671B); exact checkpoint not stated by the source",
            "arch": "deepseek_v3",
            "num_hidden_layers": 61,
            "num_moe_layers": l,
            "num_experts": n,
            "top_k": TOP_K,
            "num_shared_experts": 1
        },
        "phase": "mixed",
        "workload": format!(
            "synthetic validation drift series: {} segments of {per_segment} windows, each \
             window a multinomial sample ({TOKENS} tokens x top-{TOP_K}) of one recorded \
             aggregate trace's per-layer distribution; expert ids permuted per layer (seed {seed})",
            SOURCES.len()
        ),
        "unit": "number of (token, routed expert) assignments",
        "layer_ids": (3..3 + l).collect::<Vec<usize>>(),
        "num_windows": t,
        "window": format!("one batch of forward iterations ({TOKENS} tokens)"),
        "window_tokens": vec![TOKENS; t],
        "counts": counts,
        "per_rank_origin": null,
        "source": {
            "case": {
                "kind": "multinomial (conditional binomials, exact inversion from the mode; SplitMix64)",
                "segments": segments,
                "tokens_per_window": TOKENS,
                "seed": seed
            },
            "permute_ids_seed": seed,
            "generator": "eplb-runtime/examples/validate_series.rs"
        },
        "notes": "Built from aggregate traces not used for the incremental policy's tuning. \
                  Windows within a segment are i.i.d. samples. Not recorded windows."
    });
    let file = std::fs::File::create(path).unwrap_or_else(|e| panic!("cannot create {path}: {e}"));
    serde_json::to_writer(std::io::BufWriter::new(file), &v).expect("write series");
    // Round trip: the file must read back as the same counts, with no warnings.
    let heat = eplb_map::heat::load_heat(&std::fs::read(path).expect("reread"), None)
        .expect("written series parses");
    assert!(heat.warnings().is_empty(), "{:?}", heat.warnings());
    assert_eq!(heat.counts_u64().as_deref(), Some(&trace.counts[..]));
}

struct Args {
    per_segment: usize,
    seed: u64,
    ranks: Vec<u16>,
    write: Option<String>,
    dir: String,
}

fn parse_args() -> Args {
    let mut a = Args {
        per_segment: 40,
        seed: 2,
        ranks: vec![32, 64],
        write: None,
        dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/traces").into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            println!(
                "validate_series [--windows-per-segment 40] [--seed 2] [--ranks 32,64] \
                 [--write PATH] [--traces-dir DIR]"
            );
            std::process::exit(0);
        }
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--windows-per-segment" => {
                a.per_segment = value.parse().expect("--windows-per-segment: a number");
                assert!(a.per_segment > 0, "--windows-per-segment must be >= 1");
            }
            "--seed" => a.seed = value.parse().expect("--seed: a number"),
            "--ranks" => {
                a.ranks = value
                    .split(',')
                    .map(|r| r.trim().parse().expect("--ranks: numbers"))
                    .collect();
            }
            "--write" => a.write = Some(value),
            "--traces-dir" => a.dir = value,
            _ => panic!("unknown flag {flag}"),
        }
    }
    a
}

fn main() {
    let started = Instant::now();
    let args = parse_args();
    let sources: Vec<Source> = SOURCES.iter().map(|s| load_source(&args.dir, s)).collect();
    let t0 = Instant::now();
    let trace = build_series(&sources, args.per_segment, args.seed);
    println!(
        "series: {} x {} x {} (top-{TOP_K}, {TOKENS} tokens/window), segments {} x {} windows, \
         seed {}; sampled in {:.2} s",
        trace.windows,
        trace.layers,
        trace.experts,
        SOURCES
            .iter()
            .map(|s| s.trim_start_matches("sglang_dsv3_"))
            .collect::<Vec<_>>()
            .join(" -> "),
        args.per_segment,
        args.seed,
        t0.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.write {
        write_series(path, &trace, args.per_segment, args.seed);
        println!("wrote {path}");
    }

    let policies = [
        SimPolicy::Static,
        SimPolicy::Policy(PolicyKind::Default),
        SimPolicy::Policy(PolicyKind::FlashLb),
        SimPolicy::Policy(PolicyKind::DeepSeek),
        SimPolicy::Policy(PolicyKind::Incremental),
    ];
    for &ranks in &args.ranks {
        let nodes = ranks.div_ceil(8);
        println!(
            "\nR={ranks}, X={ranks}, {nodes} node(s) of {}, 1 group (DeepSeek global); H=10, A=1, \
             log2phy, default initial layout",
            ranks.min(8)
        );
        println!(
            "| policy | mean PAR w>=11 | p99 w>=11 | changes | moves total | policy ms/cycle |"
        );
        println!("|---|---|---|---|---|---|");
        for &policy in &policies {
            let cfg = SimConfig {
                ranks,
                redundant: u32::from(ranks),
                ranks_per_node: Some(ranks.min(8)),
                groups: None,
                policy,
                heat_interval: 10,
                algo_interval: 1,
                initial: Initial::Default,
                routing: Routing::Log2Phy,
                seed: 0,
                expert_bytes: 8,
                payoff_gate: None,
                events: Vec::new(),
            };
            let r = simulate(&trace, &cfg, &mut |_, _| {})
                .unwrap_or_else(|e| panic!("{} on R={ranks}: {e}", policy.name()));
            println!(
                "| {} | {:.4} | {:.4} | {} | {} | {:.1} |",
                policy.name(),
                r.mean_par_from_first_activation,
                r.p99_par_from_first_activation,
                r.changes,
                r.moves_total,
                r.policy_time_ms_mean
            );
        }
    }
    println!("\ntotal {:.1} s", started.elapsed().as_secs_f64());
}
