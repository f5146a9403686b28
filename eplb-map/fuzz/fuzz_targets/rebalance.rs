//! The checked policy call (`eplb_policies::rebalance`) on an arbitrary small shape, topology,
//! loads, per-window samples, current placement (co-located copies included) and policy:
//! never panics; whatever it returns is structurally valid, servable unless the policy
//! co-locates, and the checked call accepts it back as the next current placement.
#![no_main]

use eplb_core::{Placement, Shape};
use eplb_policies::{AnyPolicy, Input, Output, Policy, PolicyKind, Samples, buffer_lens, rebalance};
use libfuzzer_sys::fuzz_target;

/// Bytes read one at a time, zero when exhausted.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn below(&mut self, n: usize) -> usize {
        usize::from(self.u8()) % n.max(1)
    }
    fn load(&mut self) -> f64 {
        // Zeros, ties, small and huge values.
        match self.u8() % 8 {
            0 => 0.0,
            1 => 1.0,
            2 => 1e300,
            3 => f64::from(self.u8()) * 1e-300,
            _ => f64::from(u16::from_le_bytes([self.u8(), self.u8()])),
        }
    }
}

/// A structurally valid placement from arbitrary ids: every expert is written over a slot
/// whose expert has a copy elsewhere, so every expert appears in every layer.
fn placement(b: &mut Bytes<'_>, shape: &Shape) -> Vec<u16> {
    let (n, per) = (shape.experts(), shape.slots_per_layer());
    let mut p = vec![0u16; shape.placement_len()];
    for layer in p.chunks_exact_mut(per) {
        for x in layer.iter_mut() {
            *x = b.below(n) as u16;
        }
        for e in 0..n as u16 {
            if layer.contains(&e) {
                continue;
            }
            let mut counts = vec![0usize; n];
            layer.iter().for_each(|&x| counts[usize::from(x)] += 1);
            let start = b.below(per);
            if let Some(j) = (0..per)
                .map(|k| (start + k) % per)
                .find(|&j| counts[usize::from(layer[j])] > 1)
            {
                layer[j] = e;
            }
        }
    }
    p
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let layers = 1 + b.below(3) as u16;
    let experts = 1 + b.below(12) as u16;
    let ranks = 1 + b.below(8) as u16;
    let min_s = usize::from(experts).div_ceil(usize::from(ranks)) as u16;
    let slots = min_s + b.below(4) as u16;
    let Ok(mut shape) = Shape::new(layers, experts, ranks, slots) else {
        return;
    };
    if b.u8() % 2 == 1 {
        let rpn = 1 + b.below(usize::from(ranks)) as u16;
        let groups = 1 + b.below(usize::from(experts)) as u16;
        if let Ok(s) = shape.topology(rpn, groups) {
            shape = s;
        }
    }
    let kind = PolicyKind::ALL[b.below(PolicyKind::ALL.len())];
    let mut policy = AnyPolicy::new(kind);
    let Ok(lens) = buffer_lens(&policy, &shape) else {
        return;
    };
    let mut current = placement(&mut b, &shape);
    assert!(Placement::new(shape, &current).is_ok());
    let windows = b.below(4);
    let mut scratch = vec![0u64; lens.scratch];
    let mut state = vec![0u64; lens.state];
    let l = shape.layers();
    // Two calls: the second plans from the first's output, with the state it left.
    for round in 0..2 {
        let loads: Vec<f64> = (0..shape.loads_len()).map(|_| b.load()).collect();
        let samples_data: Vec<f64> = (0..windows * shape.loads_len()).map(|_| b.load()).collect();
        let samples = if windows > 0 {
            match Samples::new(&shape, windows, &samples_data) {
                Ok(s) => Some(s),
                Err(_) => None,
            }
        } else {
            None
        };
        let cur = Placement::new(shape, &current).expect("current stays valid");
        let Ok(input) = Input::new(cur, &loads, samples, u64::from(b.u8())) else {
            return;
        };
        let mut out = vec![0u16; shape.placement_len()];
        let (mut changed, mut before, mut after) = (vec![false; l], vec![0.0; l], vec![0.0; l]);
        let result = rebalance(
            &mut policy,
            &input,
            &mut scratch,
            &mut state,
            Output {
                placement: &mut out,
                changed: &mut changed,
                par_before: &mut before,
                par_after: &mut after,
            },
        );
        match result {
            Ok(summary) => {
                let p = Placement::new(shape, &out).expect("valid output");
                if !policy.colocates() {
                    assert!(p.check_servable().is_ok(), "round {round}: {kind:?}");
                    assert_eq!(summary.colocated_rows, 0);
                }
                current = out;
            }
            Err(e) => {
                let _ = e.to_string();
                // The current placement is back in the output.
                assert_eq!(out, current);
                return;
            }
        }
    }
});
