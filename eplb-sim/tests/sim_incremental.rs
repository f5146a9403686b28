//! The incremental policy inside the dynamic loop (`research/dynamic-anchors.md`: the ESFT chain
//! and the DeepSeek-V3 drift series, H=10, A=1, log2phy): from the first activation better
//! balanced than FlashLB's published rows and nearer the clairvoyant cycle, with at most half of
//! FlashLB's weight fetches, and never two copies of an expert on one rank.

mod common;

use common::{anchor_cfg, trace};
use eplb_policies::PolicyKind;
use eplb_sim::simulate::{SimPolicy, simulate};

fn run(ranks: u16, redundant: u32) -> eplb_sim::simulate::SimResult {
    run_on("esft_chain", ranks, redundant)
}

fn run_on(series: &str, ranks: u16, redundant: u32) -> eplb_sim::simulate::SimResult {
    let trace = trace(&format!("data/series/{series}.json"));
    let cfg = anchor_cfg(ranks, redundant, SimPolicy::Policy(PolicyKind::Incremental));
    let r = simulate(&trace, &cfg, &mut |_, _| {}).unwrap();
    assert_eq!(r.same_rank_duplicate_rows_max, 0);
    assert_eq!(r.failed_layers, 0);
    r
}

#[test]
fn esft_r8x8_beats_flashlb_with_half_the_fetches() {
    // FlashLB 1.1945 with 19,802 fetches; the clairvoyant cycle is 1.1945 too.
    let r = run(8, 8);
    assert!(
        r.mean_par_from_first_activation < 1.1945,
        "mean PAR from the first activation {}",
        r.mean_par_from_first_activation
    );
    assert!(r.moves_total <= 19_802 / 2, "fetches {}", r.moves_total);
}

#[test]
fn esft_r16x16_nearer_the_clairvoyant_than_flashlb_with_half_the_fetches() {
    // FlashLB 1.3489 with 23,678 fetches; clairvoyant 1.3387; midpoint 1.3438.
    let r = run(16, 16);
    assert!(
        r.mean_par_from_first_activation < (1.3489 + 1.3387) / 2.0,
        "mean PAR from the first activation {}",
        r.mean_par_from_first_activation
    );
    assert!(r.moves_total <= 23_678 / 2, "fetches {}", r.moves_total);
}

#[test]
fn dsv3_r32x32_nearer_the_clairvoyant_than_flashlb_with_half_the_fetches() {
    // FlashLB 1.0916 with 39,985 fetches; clairvoyant 1.0575; midpoint 1.07455.
    let r = run_on("dsv3_drift_perm", 32, 32);
    assert!(
        r.mean_par_from_first_activation < (1.0916 + 1.0575) / 2.0,
        "mean PAR from the first activation {}",
        r.mean_par_from_first_activation
    );
    assert!(r.moves_total <= 39_985 / 2, "fetches {}", r.moves_total);
}

#[test]
fn dsv3_r64x64_nearer_the_clairvoyant_than_flashlb_with_half_the_fetches() {
    // FlashLB 1.1259 with 49,319 fetches; clairvoyant 1.0911; midpoint 1.1085.
    let r = run_on("dsv3_drift_perm", 64, 64);
    assert!(
        r.mean_par_from_first_activation < (1.1259 + 1.0911) / 2.0,
        "mean PAR from the first activation {}",
        r.mean_par_from_first_activation
    );
    assert!(r.moves_total <= 49_319 / 2, "fetches {}", r.moves_total);
}
