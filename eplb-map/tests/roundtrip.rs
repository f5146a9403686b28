//! Property tests: for any structurally valid placement, JSON write-then-read and blob
//! encode-then-decode are the identity.

use eplb_core::{Placement, Shape};
use eplb_map::map::{self, ReadOptions, read_map_json};
use eplb_map::{Error, blob};
use proptest::prelude::*;

/// A valid placement: per layer a permutation of `0..N` plus `X` extra ids, shuffled.
/// `colocated` allows an extra id on a rank that already holds it.
fn placement(colocated: bool) -> impl Strategy<Value = (Shape, Vec<u16>)> {
    (1u16..4, 1u16..24, 1u16..6)
        .prop_flat_map(move |(layers, experts, ranks)| {
            // S in ceil(N/R) ..= min(N, ceil(N/R) + 3).
            let min_s = experts.div_ceil(ranks);
            let max_s = experts.min(min_s + 3);
            (Just((layers, experts, ranks)), min_s..=max_s)
        })
        .prop_flat_map(move |((layers, experts, ranks), s)| {
            let shape = Shape::new(layers, experts, ranks, s).unwrap();
            let per_layer = shape.slots_per_layer();
            let extra = per_layer - usize::from(experts);
            let layer = (
                Just((0..experts).collect::<Vec<u16>>()).prop_shuffle(),
                proptest::collection::vec(0..experts, extra),
            )
                .prop_map(|(mut perm, extras)| {
                    perm.extend(extras);
                    perm
                })
                .prop_shuffle();
            (
                Just(shape),
                proptest::collection::vec(layer, usize::from(layers)),
            )
        })
        .prop_map(|(shape, layers)| (shape, layers.concat()))
        .prop_filter(
            "no co-located copies unless asked",
            move |(shape, slots)| {
                colocated
                    || Placement::new(*shape, slots)
                        .map(|p| p.colocated_rows() == 0)
                        .unwrap_or(false)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn json_write_then_read_is_identity((shape, slots) in placement(false)) {
        let p = Placement::new(shape, &slots).unwrap();
        let text = map::to_json(&p);
        let opts = ReadOptions::strict()
            .experts(shape.experts() as u16)
            .ranks(shape.ranks() as u16)
            .layers(shape.layers() as u16);
        let m = read_map_json(text.as_bytes(), &opts).unwrap();
        prop_assert_eq!(m.placement().as_slice(), slots.as_slice());
        prop_assert_eq!(m.shape(), shape);
        prop_assert_eq!(m.colocated_rows(), 0);
    }

    #[test]
    fn json_lenient_round_trip_keeps_colocated_copies((shape, slots) in placement(true)) {
        let p = Placement::new(shape, &slots).unwrap();
        let text = map::to_json(&p);
        let lenient = ReadOptions::lenient().experts(shape.experts() as u16);
        let m = read_map_json(text.as_bytes(), &lenient).unwrap();
        prop_assert_eq!(m.placement().as_slice(), slots.as_slice());
        prop_assert_eq!(m.colocated_rows(), p.colocated_rows());
        let strict = read_map_json(text.as_bytes(), &ReadOptions::strict());
        prop_assert_eq!(strict.is_ok(), p.colocated_rows() == 0);
        if let Err(e) = strict {
            let is_colocated = matches!(e, Error::ColocatedCopies { .. });
            prop_assert!(is_colocated);
        }
    }

    #[test]
    fn blob_encode_then_decode_is_identity(
        (shape, slots) in placement(true),
        rpn_pick in 0usize..4,
    ) {
        // Any ranks-per-node that divides R, and a group count, travel in the header.
        let divisors: Vec<u16> = (1..=shape.ranks() as u16)
            .filter(|d| (shape.ranks() as u16).is_multiple_of(*d))
            .collect();
        let rpn = divisors[rpn_pick % divisors.len()];
        let shape = shape.topology(rpn, 1).unwrap();
        let p = Placement::new(shape, &slots).unwrap();
        let mut buf = vec![0u8; blob::max_encoded_len(&shape)];
        let n = blob::encode(&p, &mut buf).unwrap();
        prop_assert_eq!(n, blob::encoded_len(&p));
        prop_assert_eq!(blob::header(&buf[..n]).unwrap(), shape);
        let mut out = vec![0u16; shape.placement_len()];
        let q = blob::decode(&buf[..n], &mut out).unwrap();
        prop_assert_eq!(q.as_slice(), slots.as_slice());
        prop_assert_eq!(*q.shape(), shape);
        // Any single flipped bit is detected (checksum or structure), never accepted silently
        // as a different placement.
        let bit = (slots.len() * 7 + n) % (n * 8);
        let mut bad = buf[..n].to_vec();
        bad[bit / 8] ^= 1 << (bit % 8);
        let mut out2 = vec![0u16; shape.placement_len() + 64];
        if let Ok(r) = blob::decode(&bad, &mut out2) {
            prop_assert_eq!(r.as_slice(), slots.as_slice());
        }
    }
}
