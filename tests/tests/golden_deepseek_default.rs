//! Golden vectors for `deepseek` (hierarchical and global) and `default` (vLLM-Ascend
//! DefaultEplb): exact placements where the golden file says `exact`, PAR within tolerance
//! where it says `metric`.

use eplb_core::{Placement, Shape};
use eplb_policies::deepseek::DeepSeek;
use eplb_policies::default::DefaultEplb;
use eplb_policies::{Input, Policy};
use eplb_tests::{GOLDEN_CASES, GoldenCase, even_pars, golden, rebalance_fresh};

fn run<P: Policy>(policy: &mut P, shape: Shape, case: &GoldenCase) -> Vec<u16> {
    let current = Placement::new(shape, &case.current).unwrap();
    let input = Input::new(current, &case.loads, None, 0).unwrap();
    rebalance_fresh(policy, &input, &case.name).placement
}

/// The first differing layer, for a readable failure.
fn first_diff(shape: Shape, got: &[u16], want: &[u16]) -> Option<usize> {
    let per = shape.slots_per_layer();
    got.chunks_exact(per)
        .zip(want.chunks_exact(per))
        .position(|(a, b)| a != b)
}

/// Checks one peer on one case; returns a line for the summary.
fn check(case: &GoldenCase, peer: &str, shape: Shape, got: &[u16]) -> String {
    let Some(e) = case.expected.get(peer) else {
        return format!("{}/{peer}: no expectation", case.name);
    };
    if e.placement.is_empty() {
        return format!("{}/{peer}: skipped upstream", case.name);
    }
    let ours = even_pars(shape, got, &case.loads);
    let mean = ours.iter().sum::<f64>() / ours.len() as f64;
    for (l, (p, lb)) in ours.iter().zip(&case.lower_bound).enumerate() {
        assert!(
            *p >= lb - 1e-9,
            "{}/{peer} layer {l}: PAR {p} below the lower bound {lb}",
            case.name
        );
    }
    if e.exact {
        if let Some(l) = first_diff(shape, got, &e.placement) {
            let per = shape.slots_per_layer();
            panic!(
                "{}/{peer}: layer {l} differs\n ours {:?}\n want {:?}",
                case.name,
                &got[l * per..(l + 1) * per],
                &e.placement[l * per..(l + 1) * per]
            );
        }
        format!("{}/{peer}: exact (PAR mean {mean:.4})", case.name)
    } else {
        let limit = e.par_mean * (1.0 + e.tolerance);
        assert!(
            mean <= limit,
            "{}/{peer}: PAR mean {mean} above {} x (1 + {})",
            case.name,
            e.par_mean,
            e.tolerance
        );
        format!(
            "{}/{peer}: metric, PAR mean {mean:.4} <= {:.4} (recorded {:.4})",
            case.name, limit, e.par_mean
        )
    }
}

#[test]
fn deepseek_hierarchical_golden() {
    for name in GOLDEN_CASES {
        let case = golden(name);
        let got = run(&mut DeepSeek, case.shape, &case);
        println!("{}", check(&case, "deepseek_hier", case.shape, &got));
    }
}

#[test]
fn deepseek_global_golden() {
    for name in GOLDEN_CASES {
        let case = golden(name);
        let shape = case.shape.topology(case.shape.ranks() as u16, 1).unwrap();
        let got = run(&mut DeepSeek, shape, &case);
        println!("{}", check(&case, "deepseek_global", shape, &got));
    }
}

#[test]
fn default_golden() {
    for name in GOLDEN_CASES {
        let case = golden(name);
        let got = run(&mut DefaultEplb, case.shape, &case);
        println!("{}", check(&case, "vllm_ascend_default", case.shape, &got));
        // Kept experts keep their slot.
        let s = case.shape.slots_per_rank();
        for (old, new) in case.current.chunks_exact(s).zip(got.chunks_exact(s)) {
            for (j, e) in new.iter().enumerate() {
                if old.contains(e) {
                    assert_eq!(old[j], *e, "{name}: kept expert {e} moved within its rank");
                }
            }
        }
    }
}
