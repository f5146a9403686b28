//! Properties of `deepseek`, `default` and `random` on random shapes and loads: a valid
//! placement (no co-located copies except DeepSeek's), PAR never below the lower bound,
//! determinism, and DefaultEplb's kept experts keeping their slot.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use eplb_core::metrics;
use eplb_core::{Layout, Placement, Shape};
use eplb_policies::deepseek::DeepSeek;
use eplb_policies::default::DefaultEplb;
use eplb_policies::random::Random;
use eplb_policies::{Error, Input, Output, Policy, rebalance, scratch_len};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    shape: Shape,
    loads: Vec<f64>,
    /// Seed of the random swaps applied to the default layout to make the current placement.
    shuffle: u64,
    seed: u64,
}

fn divisors(n: u16) -> Vec<u16> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

fn case() -> impl Strategy<Value = Case> {
    (1u16..=3, 1u16..=40, 1u16..=10)
        .prop_flat_map(|(l, n, r)| {
            let s_min = n.div_ceil(r).max(1);
            (Just((l, n, r)), s_min..=n.min(s_min + 4))
        })
        .prop_flat_map(|((l, n, r), s)| {
            (
                Just((l, n, r, s)),
                prop::sample::select(divisors(r)),
                1u16..=n.min(8),
            )
        })
        .prop_flat_map(|((l, n, r, s), rpn, g)| {
            let shape = Shape::with_topology(l, n, r, s, rpn, g).unwrap();
            // Small integers make ties; a few large values make hot experts.
            let load = prop_oneof![
                4 => (0u32..6).prop_map(f64::from),
                4 => 0.0f64..1000.0,
                1 => 1e4f64..1e6,
            ];
            (
                Just(shape),
                prop::collection::vec(load, shape.loads_len()),
                any::<u64>(),
                any::<u64>(),
            )
        })
        .prop_map(|(shape, loads, shuffle, seed)| Case {
            shape,
            loads,
            shuffle,
            seed,
        })
}

/// The default layout, shuffled by seeded swaps (a servable current placement).
fn current(c: &Case) -> Vec<u16> {
    let mut base = vec![0u16; c.shape.placement_len()];
    Layout::default().fill(&c.shape, &mut base).unwrap();
    let input = Input::new(
        Placement::new(c.shape, &base).unwrap(),
        &c.loads,
        None,
        c.shuffle,
    )
    .unwrap();
    let mut out = vec![0u16; c.shape.placement_len()];
    Random::with_swaps(3 * c.shape.ranks())
        .place(&input, &mut [], &mut [], &mut out)
        .unwrap();
    out
}

fn run<P: Policy>(p: &mut P, c: &Case, cur: &[u16]) -> Result<(Vec<u16>, Vec<f64>), Error> {
    let shape = c.shape;
    let input = Input::new(Placement::new(shape, cur).unwrap(), &c.loads, None, c.seed).unwrap();
    let mut scratch = vec![0u64; scratch_len(p, &shape)];
    let mut out = vec![0u16; shape.placement_len()];
    let l = shape.layers();
    let (mut ch, mut pb, mut pa) = (vec![false; l], vec![0.0; l], vec![0.0; l]);
    rebalance(
        p,
        &input,
        &mut scratch,
        &mut [],
        Output {
            placement: &mut out,
            changed: &mut ch,
            par_before: &mut pb,
            par_after: &mut pa,
        },
    )?;
    Ok((out, pa))
}

fn check_common(c: &Case, out: &[u16], par: &[f64], colocates: bool) -> Result<(), TestCaseError> {
    let shape = c.shape;
    let p = Placement::new(shape, out);
    prop_assert!(p.is_ok(), "invalid placement: {:?}", p.err());
    if !colocates {
        prop_assert_eq!(p.unwrap().colocated_rows(), 0);
    }
    let n = shape.experts();
    let mut copies = vec![0u16; n];
    for (l, &pl) in par.iter().enumerate() {
        let lb =
            metrics::lower_bound_par(&shape, &c.loads[l * n..(l + 1) * n], &mut copies).unwrap();
        prop_assert!(
            pl >= lb - 1e-9,
            "layer {l}: PAR {pl} below the lower bound {lb}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn deepseek_props(c in case()) {
        let cur = current(&c);
        let hier = c.shape.groups().is_multiple_of(c.shape.nodes());
        match run(&mut DeepSeek, &c, &cur) {
            Ok((out, par)) => {
                check_common(&c, &out, &par, true)?;
                let (again, _) = run(&mut DeepSeek, &c, &cur).unwrap();
                prop_assert_eq!(out, again);
            }
            Err(e) => {
                prop_assert!(hier && !c.shape.experts().is_multiple_of(c.shape.groups()), "{e}");
                prop_assert!(matches!(e, Error::Topology { .. }), "{}", e);
            }
        }
    }

    #[test]
    fn default_props(c in case()) {
        let cur = current(&c);
        let (out, par) = run(&mut DefaultEplb, &c, &cur).unwrap();
        check_common(&c, &out, &par, false)?;
        let (again, _) = run(&mut DefaultEplb, &c, &cur).unwrap();
        prop_assert_eq!(&out, &again);
        let s = c.shape.slots_per_rank();
        for (r, (old, new)) in cur.chunks_exact(s).zip(out.chunks_exact(s)).enumerate() {
            for (j, e) in new.iter().enumerate() {
                if old.contains(e) {
                    prop_assert_eq!(old[j], *e, "row {}: kept expert {} changed slot", r, e);
                }
            }
        }
    }

    #[test]
    fn random_props(c in case()) {
        let cur = current(&c);
        let (out, par) = run(&mut Random::new(), &c, &cur).unwrap();
        check_common(&c, &out, &par, false)?;
        let (again, _) = run(&mut Random::new(), &c, &cur).unwrap();
        prop_assert_eq!(&out, &again);
        // Swaps keep every expert's copy count per layer.
        let per = c.shape.slots_per_layer();
        for (a, b) in cur.chunks_exact(per).zip(out.chunks_exact(per)) {
            let (mut x, mut y) = (a.to_vec(), b.to_vec());
            x.sort_unstable();
            y.sort_unstable();
            prop_assert_eq!(x, y);
        }
    }
}
