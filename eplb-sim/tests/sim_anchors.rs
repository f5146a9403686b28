//! `simulate` reproduces the `static` rows of `dynamic-anchors.md` to 4 decimals, and DeepSeek
//! (global) within 0.005 of the DeepSeek/vLLM global rows.

mod common;

use common::{anchor_cfg as cfg, trace};
use eplb_policies::PolicyKind;
use eplb_sim::simulate::{SimPolicy, simulate};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 0.00005 + 1e-9
}

#[test]
fn esft_r8x8_static_row() {
    let t = trace("data/series/esft_chain.json");
    let r = simulate(&t, &cfg(8, 8, SimPolicy::Static), &mut |_, _| {}).unwrap();
    assert!(close(r.mean_par, 1.5271), "{}", r.mean_par);
    assert!(close(r.p99_par, 1.6076), "{}", r.p99_par);
    assert!((r.max_par - 2.594).abs() < 0.0005, "{}", r.max_par);
    assert!(close(r.mean_par_from_first_activation, 1.5273));
    assert!(close(r.p99_par_from_first_activation, 1.6081));
    assert!(close(r.other_routing_mean_par, 1.5271));
    assert_eq!(r.changes, 0);
    assert_eq!(r.cycles, 17);
}

#[test]
fn dsv3_r32x32_perm_static_and_deepseek_global_rows() {
    let t = trace("data/series/dsv3_drift_perm.json");
    let r = simulate(&t, &cfg(32, 32, SimPolicy::Static), &mut |_, _| {}).unwrap();
    assert!(close(r.mean_par, 1.8826), "{}", r.mean_par);
    assert!(close(r.p99_par, 1.9815), "{}", r.p99_par);
    assert!((r.max_par - 2.897).abs() < 0.0005, "{}", r.max_par);
    assert!(close(r.mean_par_from_first_activation, 1.8852));
    assert!(close(r.p99_par_from_first_activation, 1.9815));
    assert_eq!(r.cycles, 14);
    let r = simulate(
        &t,
        &cfg(32, 32, SimPolicy::Policy(PolicyKind::DeepSeek)),
        &mut |_, _| {},
    )
    .unwrap();
    assert!((r.mean_par - 1.1681).abs() < 0.005, "{}", r.mean_par);
    assert!(
        (r.mean_par_from_first_activation - 1.1179).abs() < 0.005,
        "{}",
        r.mean_par_from_first_activation
    );
    assert_eq!(r.changes, 14);
}

#[test]
fn esft_r8x8_deepseek_global_row() {
    let t = trace("data/series/esft_chain.json");
    let r = simulate(
        &t,
        &cfg(8, 8, SimPolicy::Policy(PolicyKind::DeepSeek)),
        &mut |_, _| {},
    )
    .unwrap();
    assert!((r.mean_par - 1.2544).abs() < 0.005, "{}", r.mean_par);
    assert!(
        (r.mean_par_from_first_activation - 1.2383).abs() < 0.005,
        "{}",
        r.mean_par_from_first_activation
    );
    assert_eq!(r.changes, 17);
    // Moves per change near the published 1558 (83.2% of slots).
    assert!(
        (r.moves_per_change() - 1558.0).abs() < 30.0,
        "{}",
        r.moves_per_change()
    );
}

#[test]
fn esft_flashlb_rows_within_0_005() {
    // dynamic-anchors.md: vllm-ascend FlashLB, esft_chain R8/X8 and R16/X16, from window 11.
    let t = trace("data/series/esft_chain.json");
    for (r, x, want, moves_per_change) in [(8, 8, 1.1945, 1165.0), (16, 16, 1.3489, 1393.0)] {
        let res = simulate(
            &t,
            &cfg(r, x, SimPolicy::Policy(PolicyKind::FlashLb)),
            &mut |_, _| {},
        )
        .unwrap();
        assert!(
            (res.mean_par_from_first_activation - want).abs() < 0.005,
            "R{r}: {}",
            res.mean_par_from_first_activation
        );
        assert!(
            (res.moves_per_change() - moves_per_change).abs() < 0.1 * moves_per_change,
            "R{r}: {}",
            res.moves_per_change()
        );
        assert_eq!(res.same_rank_duplicate_rows_max, 0);
    }
}
