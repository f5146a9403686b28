//! Property tests of the core invariants.

use eplb_core::metrics::{self, Routing};
use eplb_core::{Cycle, HeatRing, Layout, Placement, ReplicaChoice, Shape, Step};
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
    fn heat_ring_buckets_iteration_k_into_window_k_over_per(
        h in 1u32..400,
        frac in 0.0f64..=1.0,
        seed in 0u32..1000,
    ) {
        let shape = Shape::new(2, 4, 2, 2).unwrap();
        let words = 2 * 2;
        let (w, per) = eplb_core::heat::layout_for_interval(h).unwrap();
        prop_assert!(w * per as usize >= h as usize, "a cycle's {} iterations must fit", h);
        let mut storage = vec![u64::MAX; eplb_core::heat::ring_len(&shape, w)];
        let mut ring = HeatRing::new(&shape, h, storage.as_mut_slice()).unwrap();
        prop_assert_eq!((ring.capacity(), ring.per_window()), (w, per));
        prop_assert!(ring.as_slice().iter().all(|&x| x == 0));
        let counts = |k: u32| -> [u32; 4] {
            let x = k.wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000;
            [x, 1, 0, x / 3]
        };
        let iters = ((f64::from(h) * frac) as u32).min(h);
        for round in 0..2 {
            for k in 0..iters {
                ring.add(&counts(k)).unwrap();
                prop_assert_eq!(ring.windows(), (k / per + 1) as usize);
            }
            prop_assert_eq!(ring.counted(), iters);
            let t = iters.div_ceil(per) as usize;
            prop_assert_eq!(ring.held().len(), t * words);
            let mut want = vec![0u64; w * words];
            for k in 0..iters {
                let b = (k / per) as usize;
                for (x, c) in want[b * words..(b + 1) * words].iter_mut().zip(counts(k)) {
                    *x += u64::from(c);
                }
            }
            prop_assert_eq!(ring.as_slice(), &want[..], "round {}", round);
            prop_assert_eq!(ring.held(), &want[..t * words]);
            // Reset zeroes the windows used; a second round counts exactly as the first.
            ring.reset();
            prop_assert_eq!((ring.counted(), ring.windows()), (0, 0));
            prop_assert!(ring.held().is_empty());
            prop_assert!(ring.as_slice().iter().all(|&x| x == 0));
        }
        // Filling every window, then one more: refused, nothing added.
        for k in 0..(w as u32 * per) {
            ring.add(&counts(k)).unwrap();
        }
        let full = ring.as_slice().to_vec();
        prop_assert!(
            matches!(ring.add(&counts(0)), Err(eplb_core::Error::Overflow { .. })),
            "a full ring must refuse"
        );
        prop_assert_eq!(ring.as_slice(), &full[..]);
        prop_assert_eq!(ring.windows(), w);
    }

    #[test]
    fn fold_maps_every_slot_count_to_its_expert(
        (shape, p) in placement(),
        t in 0usize..4,
        seed in 0u64..1000,
    ) {
        let (l, r, s, n) = (shape.layers(), shape.ranks(), shape.slots_per_rank(), shape.experts());
        let gathered: Vec<u64> = (0..r * t * l * s)
            .map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(seed) % 5000)
            .collect();
        let mut samples = vec![f64::NAN; t * l * n];
        let mut loads = vec![f64::NAN; l * n];
        let placed = eplb_core::Placement::new(shape, &p).unwrap();
        eplb_core::heat::fold_slot_heat(&placed, t, &gathered, &mut samples, &mut loads).unwrap();
        // Reference: slot (rank, window, layer, slot) of the gather adds to its expert.
        let mut want = vec![0.0; t * l * n];
        for rank in 0..r {
            for win in 0..t {
                for layer in 0..l {
                    for slot in 0..s {
                        let c = gathered[((rank * t + win) * l + layer) * s + slot];
                        let e = p[(layer * r + rank) * s + slot] as usize;
                        want[(win * l + layer) * n + e] += c as f64;
                    }
                }
            }
        }
        prop_assert_eq!(&samples, &want);
        // The loads are the sum of the samples over the windows.
        let mut sum = vec![0.0; l * n];
        for win in samples.chunks_exact(l * n) {
            for (a, b) in sum.iter_mut().zip(win) {
                *a += b;
            }
        }
        prop_assert_eq!(&loads, &sum);
        // No token is lost or invented.
        let total: u64 = gathered.iter().sum();
        prop_assert_eq!(loads.iter().sum::<f64>(), total as f64);
    }
}
