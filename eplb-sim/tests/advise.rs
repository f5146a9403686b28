//! `eplb_sim::advise` on synthetic DeepSeek-V3-shaped traces: the same table on 1 and 2
//! threads, and the seed's usage rules as the time model sees them (`docs/time-model.md`,
//! "The seed's usage rules, from the model").

use eplb_core::metrics::Routing;
use eplb_core::time::Role;
use eplb_policies::PolicyKind;
use eplb_runtime::config::deployment::QuantType;
use eplb_sim::advise::{Advice, Grid, Verdict, advise};
use eplb_sim::cost::CostSpec;
use eplb_sim::time::TimeSpec;
use eplb_sim::{Initial, Replay, SimConfig, SimPolicy, SimTrace};

const LAYERS: usize = 4;
const EXPERTS: usize = 256;
const TOP_K: u64 = 8;
const WINDOWS: usize = 24;

/// A drifting Zipf(0.6) trace: each layer's popularity order is a seeded permutation, redrawn
/// every `WINDOWS / 4` windows; 4096 tokens per window.
fn drifting_trace() -> Replay {
    let mut x: u64 = 7;
    let mut next = || {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut perms = Vec::new();
    for _ in 0..4 * LAYERS {
        let mut p: Vec<usize> = (0..EXPERTS).collect();
        for i in (1..EXPERTS).rev() {
            p.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        perms.push(p);
    }
    let weights: Vec<f64> = (0..EXPERTS)
        .map(|r| 1.0 / ((r + 1) as f64).powf(0.6))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut counts = Vec::with_capacity(WINDOWS * LAYERS * EXPERTS);
    for w in 0..WINDOWS {
        let seg = w * 4 / WINDOWS;
        for l in 0..LAYERS {
            let p = &perms[seg * LAYERS + l];
            counts.extend(
                (0..EXPERTS).map(|e| (4096.0 * TOP_K as f64 * weights[p[e]] / total) as u64),
            );
        }
    }
    Replay {
        trace: SimTrace {
            windows: WINDOWS,
            layers: LAYERS,
            experts: EXPERTS,
            counts,
        },
        name: Some("synthetic".to_owned()),
        model: None,
        basis: CostSpec::default().resolve().unwrap(),
        warnings: Vec::new(),
    }
}

fn base(ranks: u16) -> SimConfig {
    SimConfig {
        ranks,
        redundant: 0,
        ranks_per_node: None,
        groups: None,
        policy: SimPolicy::Static,
        heat_interval: 1,
        algo_interval: 1,
        initial: Initial::Default,
        routing: Routing::Log2Phy,
        seed: 0,
        expert_bytes: 64,
        payoff_gate: None,
        events: Vec::new(),
    }
}

fn grid(ranks: u16) -> Grid {
    Grid {
        policies: vec![PolicyKind::Swift, PolicyKind::Incremental],
        heat_intervals: vec![4, 8],
        algo_intervals: vec![1],
        redundant: vec![0, u32::from(ranks)],
        payoff_gate: vec![false],
    }
}

fn run(ranks: u16, role: Role, tokens: f64, threads: usize) -> Advice {
    run_on(ranks, role, tokens, threads, "a3", QuantType::W8A8)
}

/// `advise` on the drifting trace with `hardware` and the experts quantised as `quant`.
fn run_on(
    ranks: u16,
    role: Role,
    tokens: f64,
    threads: usize,
    hardware: &str,
    quant: QuantType,
) -> Advice {
    let mut replay = drifting_trace();
    replay.basis = CostSpec {
        quant: Some(quant),
        ..CostSpec::default()
    }
    .resolve()
    .unwrap();
    let spec = TimeSpec {
        hardware: Some(hardware.to_owned()),
        role: Some(role),
        tokens_per_rank: Some(tokens),
        ..TimeSpec::default()
    };
    advise(
        &replay,
        &base(ranks),
        &spec,
        &grid(ranks),
        threads,
        &|_, _| {},
    )
    .unwrap()
}

/// `advise`'s verdict for `ranks` ranks (256 / `ranks` experts per die); checks that the
/// recommendation, the flag, the band and the A/B line agree with it.
fn verdict(ranks: u16, role: Role, tokens: f64, hardware: &str, quant: QuantType) -> Verdict {
    let a = run_on(ranks, role, tokens, 2, hardware, quant);
    let text = a.recommendation();
    let (lo, c, hi) = a.saving_pct;
    assert!(lo <= c && c <= hi, "{lo} {c} {hi}");
    assert_eq!(Verdict::of(lo, hi), a.verdict);
    assert_eq!(a.recommended, a.verdict == Verdict::Enable);
    let prefix = match a.verdict {
        Verdict::Enable => "enable: policy",
        Verdict::DoNotEnable => "do not enable",
        Verdict::BenchmarkFirst => "benchmark first",
    };
    assert!(text.starts_with(prefix), "{text}");
    assert_eq!(a.ab_run().is_some(), a.verdict == Verdict::BenchmarkFirst);
    let j = a.to_json();
    assert_eq!(j["verdict"], a.verdict.name());
    assert_eq!(j["saving_pct_low"], lo);
    assert_eq!(j["saving_pct_central"], c);
    assert_eq!(j["saving_pct_high"], hi);
    a.verdict
}

fn recommends(ranks: u16, role: Role, tokens: f64, hardware: &str, quant: QuantType) -> bool {
    verdict(ranks, role, tokens, hardware, quant) == Verdict::Enable
}

#[test]
fn the_table_is_the_same_on_one_and_two_threads() {
    let one = run(32, Role::Decode, 128.0, 1);
    let two = run(32, Role::Decode, 128.0, 2);
    assert_eq!(one.rows.len(), 8);
    assert_eq!(one.table(), two.table());
    assert_eq!(one.to_json().to_string(), two.to_json().to_string());
    // Ranked: best net saving first.
    for pair in one.rows.windows(2) {
        assert!(pair[0].net_saving_pct >= pair[1].net_saving_pct);
    }
}

/// The seed: decode nodes with "a per-die load below 128 tokens" are not recommended. The
/// model's crossover on this trace lies between 48 and 64 tokens per die.
#[test]
fn decode_below_the_token_threshold_is_not_recommended_and_well_above_it_is() {
    for tokens in [16.0, 32.0] {
        let a = run(32, Role::Decode, tokens, 2);
        assert!(!a.recommended, "T = {tokens}: {}", a.recommendation());
        assert!(a.recommendation().starts_with("do not enable"));
        assert_eq!(a.eplb_config(), serde_json::json!({"dynamic_eplb": false}));
    }
    for tokens in [256.0, 512.0] {
        let a = run(32, Role::Decode, tokens, 2);
        assert!(a.recommended, "T = {tokens}: {}", a.recommendation());
        assert!(a.recommendation().starts_with("enable: policy"));
        assert!(a.rows[0].net_saving_pct > 5.0, "{}", a.table());
        assert_eq!(a.eplb_config()["dynamic_eplb"], true);
    }
}

/// The seed: decode nodes with more than 8 experts per die (16 on 950DT) are not recommended.
/// The model puts the boundary there: a die holding many experts reads all of them every
/// iteration whatever the placement (memory-bound), and its load is a sum over many experts
/// (little skew), so balance saves less than the moves cost; a die holding few experts is
/// compute-bound on its hot experts. The 950DT's HBM (4 TB/s against 1 PFLOPS fp8, 1.9x the
/// A3's bytes per FLOP) moves the boundary up by one doubling. `docs/time-model.md` ("The
/// seed's rules as `advise` sees them") says how this reading of the rule was chosen.
#[test]
fn the_experts_per_die_boundary_comes_out_of_the_model() {
    let a3 = |ranks, tokens| recommends(ranks, Role::Decode, tokens, "a3", QuantType::W8A8);
    // A3, 128 tokens per die: 32 and 16 experts per die do not pay, 8 and 4 do.
    assert!(!a3(8, 128.0), "A3, 32 experts per die");
    assert!(!a3(16, 128.0), "A3, 16 experts per die");
    assert!(a3(32, 128.0), "A3, 8 experts per die");
    assert!(a3(64, 128.0), "A3, 4 experts per die");
    // 256 tokens per die: 16 experts per die are worth a benchmark on both chips (the seed:
    // "around 8 experts per die the gain and the cost are comparable: benchmark first"); 32
    // are not worth enabling on the 950DT.
    let dt = |ranks| verdict(ranks, Role::Decode, 256.0, "950dt", QuantType::Mxfp8);
    assert!(!a3(16, 256.0), "A3, 16 experts per die");
    assert_ne!(dt(16), Verdict::DoNotEnable, "950DT, 16 experts per die");
    assert_ne!(dt(8), Verdict::Enable, "950DT, 32 experts per die");
}

/// The seed: prefill nodes with inputs under 1024 tokens are not recommended. The model has
/// no input length: with one prompt per die per iteration, the tokens per die are the input
/// length. On a prefill node with many experts per die (32 on a 950PR, 64 on an A3) the
/// verdict flips between 512 and 1024 tokens, where the seed puts it; with fewer experts per
/// die the model enables EPLB for shorter inputs too (the same boundary as the decode rules).
#[test]
fn the_prefill_input_boundary_comes_out_of_the_model_with_one_prompt_per_die() {
    let pr = |tokens| recommends(8, Role::Prefill, tokens, "950pr", QuantType::Mxfp8);
    assert!(!pr(512.0), "950PR, 32 experts per die, 512-token inputs");
    assert!(pr(1024.0), "950PR, 32 experts per die, 1024-token inputs");
    let a3 = |tokens| run_on(4, Role::Prefill, tokens, 2, "a3", QuantType::W8A8);
    let (short, long) = (a3(512.0), a3(1024.0));
    assert!(
        !short.recommended,
        "A3, 64 experts per die, 512-token inputs"
    );
    // 64 experts per die: longer inputs save more, but not yet enough to enable on this trace.
    assert!(long.saving_pct.1 > short.saving_pct.1);
    // Fewer experts per die: compute-bound already at 512 tokens.
    assert!(recommends(32, Role::Prefill, 512.0, "a3", QuantType::W8A8));
}

/// An aggregate trace (one window) is replayed as a stationary workload, says so, and is
/// judged like any other: its first window alone, repeated.
#[test]
fn a_one_window_trace_is_advised_as_a_stationary_workload() {
    let drifting = drifting_trace();
    let one = Replay {
        trace: SimTrace {
            windows: 1,
            counts: drifting.trace.counts[..drifting.trace.layers * drifting.trace.experts]
                .to_vec(),
            ..drifting.trace.clone()
        },
        ..drifting.clone()
    };
    let spec = TimeSpec {
        role: Some(Role::Decode),
        tokens_per_rank: Some(512.0),
        ..TimeSpec::default()
    };
    let mut g = grid(32);
    g.heat_intervals = vec![8, 16];
    let a = advise(&one, &base(32), &spec, &g, 2, &|_, _| {}).unwrap();
    assert_eq!(a.stationary, Some(eplb_sim::advise::STATIONARY_WINDOWS));
    assert_eq!(a.to_json()["stationary_windows"], 200);
    assert!(a.recommended, "{}", a.recommendation());
    // Stationary heat: after the first move the placement stays, so every stall beyond the
    // first cycle's is a digest only, and each row counts the first move's stall in full.
    let best = &a.rows[0];
    assert!(
        best.stall_ms_per_cycle_max > best.stall_ms_per_cycle_mean,
        "{}",
        a.table()
    );
    // A trace of a time dimension keeps its own windows.
    let drift = advise(&drifting, &base(32), &spec, &g, 2, &|_, _| {}).unwrap();
    assert_eq!(drift.stationary, None);
}
