//! Property tests of the core invariants.

use eplb_core::metrics::{self, Routing};
use eplb_core::{Cycle, HeatWindow, Layout, Placement, ReplicaChoice, Shape, Step};
use proptest::prelude::*;

/// A random servable shape and placement: the default layout with expert ids permuted per layer
/// and rank rows shuffled.
fn placement() -> impl Strategy<Value = (Shape, Vec<u16>)> {
    (1u16..4, 2u16..24, 1u16..9)
        .prop_flat_map(|(l, n, r)| {
            let min_s = n.div_ceil(r).max(1);
            (Just(l), Just(n), Just(r), min_s..=n)
        })
        .prop_flat_map(|(l, n, r, s)| {
            let shape = Shape::new(l, n, r, s).unwrap();
            let perms = proptest::collection::vec(
                Just((0..n).collect::<Vec<u16>>()).prop_shuffle(),
                l as usize,
            );
            let rows = proptest::collection::vec(
                Just((0..r as usize).collect::<Vec<usize>>()).prop_shuffle(),
                l as usize,
            );
            (Just(shape), perms, rows)
        })
        .prop_map(|(shape, perms, rows)| {
            let mut base = vec![0u16; shape.placement_len()];
            Layout::Default.fill(&shape, &mut base).unwrap();
            let s = shape.slots_per_rank();
            let per = shape.slots_per_layer();
            let mut out = vec![0u16; base.len()];
            for l in 0..shape.layers() {
                for (dst, &src) in rows[l].iter().enumerate() {
                    for k in 0..s {
                        let e = base[l * per + src * s + k];
                        out[l * per + dst * s + k] = perms[l][e as usize];
                    }
                }
            }
            (shape, out)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn maps_route_every_expert_to_a_holder((shape, p) in placement(), tp in 0u16..5) {
        let pl = Placement::new(shape, &p).unwrap();
        prop_assert_eq!(pl.colocated_rows(), 0);
        let n = shape.experts();
        let s = shape.slots_per_rank();
        let mut map = vec![0i32; n];
        let mut l2p = vec![0u32; n];
        for layer in pl.layers() {
            for rank in 0..shape.ranks() {
                layer.expert_map(rank, &mut map).unwrap();
                for (e, &slot) in map.iter().enumerate() {
                    if slot >= 0 {
                        prop_assert_eq!(layer.rank(rank)[slot as usize] as usize, e);
                    } else {
                        prop_assert!(!layer.holds(rank, e as u16));
                    }
                }
                for choice in [ReplicaChoice::Plain, ReplicaChoice::TpRotation(tp)] {
                    layer.log2phy(rank, choice, &mut l2p).unwrap();
                    for (e, &phys) in l2p.iter().enumerate() {
                        let (h, slot) = (phys as usize / s, phys as usize % s);
                        prop_assert!(h < shape.ranks());
                        prop_assert_eq!(layer.rank(h)[slot] as usize, e);
                    }
                }
            }
        }
    }

    #[test]
    fn par_is_at_least_the_lower_bound(
        (shape, p) in placement(),
        seed in proptest::collection::vec(0.0f64..1000.0, 24 * 3),
    ) {
        let pl = Placement::new(shape, &p).unwrap();
        let n = shape.experts();
        let mut scratch = vec![0u32; metrics::scratch_len(&shape)];
        let mut ranks = vec![0.0; shape.ranks()];
        let mut copies = vec![0u16; n];
        for layer in pl.layers() {
            let loads = &seed[layer.index() * 24..layer.index() * 24 + n];
            let lb = metrics::lower_bound_par(&shape, loads, &mut copies).unwrap();
            for routing in [Routing::Even, Routing::Log2Phy] {
                let par = metrics::layer_par(&layer, loads, routing, &mut scratch, &mut ranks).unwrap();
                prop_assert!(par + 1e-9 >= lb, "{routing:?}: PAR {par} < bound {lb}");
                let total: f64 = loads.iter().sum();
                let sum: f64 = ranks.iter().sum();
                prop_assert!((total - sum).abs() <= 1e-6 * total.max(1.0));
            }
        }
    }

    #[test]
    fn cycle_visits_every_changed_layer_once(
        h in 1u32..6, a in 1u32..6,
        changed in proptest::collection::vec(any::<bool>(), 1..20),
        matches in proptest::collection::vec(any::<bool>(), 64),
        late in 0usize..4,
    ) {
        let mut c = Cycle::new(h, a).unwrap();
        let mut visited = vec![0u32; changed.len()];
        let mut counted = 0u32;
        let mut late_left = late;
        let mut done = false;
        for i in 0..10_000usize {
            let m = matches[i % matches.len()] || i > 1000;
            let mut step = c.on_iteration(m, &changed);
            if step == Step::PlanDue {
                // Late: no call, the next iteration is due again.
                step = if late_left > 0 { late_left -= 1; Step::PlanDue } else { c.on_plan(&changed) };
            }
            match step {
                Step::Collect { counted: k } => { prop_assert_eq!(k, m); counted += u32::from(k); }
                Step::Snapshot => { counted += 1; prop_assert_eq!(counted, h); }
                Step::UpdateLayer(l) => visited[l as usize] += 1,
                Step::CycleDone => { done = true; break; }
                Step::Wait | Step::PlanDue => {}
            }
        }
        prop_assert!(done, "cycle never ended");
        for (l, (&v, &ch)) in visited.iter().zip(&changed).enumerate() {
            prop_assert_eq!(v, u32::from(ch), "layer {}", l);
        }
    }

    #[test]
    fn heat_window_keeps_the_last_buckets(
        h in 1u32..200,
        iters in 1usize..300,
    ) {
        let shape = Shape::new(1, 4, 2, 2).unwrap();
        let p = [0u16, 1, 2, 3];
        let pl = Placement::new(shape, &p).unwrap();
        let (w, per) = eplb_core::heat::layout_for_interval(h).unwrap();
        let mut storage = vec![0u64; eplb_core::heat::storage_len(&shape, w)];
        let mut heat = HeatWindow::new(&shape, w, per, &mut storage).unwrap();
        for i in 0..iters {
            let c = i as u32 + 1;
            heat.add_all_slots(&pl, &[c, 0, 0, 2 * c]).unwrap();
            heat.end_iteration();
        }
        let buckets = iters.div_ceil(per as usize);
        prop_assert_eq!(heat.windows(), buckets.min(w));
        // The held buckets cover the last iterations, oldest first.
        let first_bucket = buckets - heat.windows();
        let first_iter = first_bucket * per as usize;
        let want: u64 = (first_iter..iters).map(|i| i as u64 + 1).sum();
        let mut sum = vec![0.0; 4];
        heat.sum(0, &mut sum).unwrap();
        prop_assert_eq!(sum[0], want as f64);
        prop_assert_eq!(sum[3], 2.0 * want as f64);
        let oldest = heat.bucket(0, 0).unwrap()[0];
        let want_oldest: u64 = (first_iter..(first_iter + per as usize).min(iters)).map(|i| i as u64 + 1).sum();
        prop_assert_eq!(oldest, want_oldest);
    }
}
