//! Every golden case loads, and our metrics reproduce its recorded PARs.

use eplb_core::metrics;
use eplb_tests::{GOLDEN_CASES, even_pars, golden};

#[test]
fn golden_metrics_match_recorded_pars() {
    for name in GOLDEN_CASES {
        let case = golden(name);
        let cur = even_pars(case.shape, &case.current, &case.loads);
        for (a, b) in cur.iter().zip(&case.current_par) {
            assert!((a - b).abs() < 1e-9, "{name}: current PAR {a} vs {b}");
        }
        let mut copies = vec![0u16; case.shape.experts()];
        for (l, lb) in case.lower_bound.iter().enumerate() {
            let n = case.shape.experts();
            let ours =
                metrics::lower_bound_par(&case.shape, &case.loads[l * n..(l + 1) * n], &mut copies)
                    .unwrap();
            assert!(
                (ours - lb).abs() < 1e-9,
                "{name} layer {l}: lower bound {ours} vs {lb}"
            );
        }
        for (peer, e) in &case.expected {
            // DeepSeek placements may co-locate copies; PAR is defined for them all the same.
            let got = even_pars(case.shape, &e.placement, &case.loads);
            for (l, (a, b)) in got.iter().zip(&e.par).enumerate() {
                assert!(
                    (a - b).abs() < 1e-9,
                    "{name}/{peer} layer {l}: PAR {a} vs {b}"
                );
            }
        }
    }
}
