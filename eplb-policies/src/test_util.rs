//! Test helper: one checked `rebalance` call with owned buffers.

use std::vec;
use std::vec::Vec;

use eplb_core::{Placement, Shape};

use crate::{Error, Input, Output, Policy, Summary, rebalance, scratch_len};

/// Runs `policy` on `current` (`[L][R][S]`) and logical `loads` through [`rebalance`], with
/// fresh scratch and the caller's `state`; returns the new placement and the summary.
pub(crate) fn rebalance_owned<P: Policy>(
    policy: &mut P,
    shape: Shape,
    current: &[u16],
    loads: &[f64],
    seed: u64,
    state: &mut [u64],
) -> Result<(Vec<u16>, Summary), Error> {
    let input = Input::new(Placement::new(shape, current)?, loads, None, seed)?;
    let mut scratch = vec![0u64; scratch_len(policy, &shape)];
    let mut out = vec![0u16; shape.placement_len()];
    let l = shape.layers();
    let (mut ch, mut pb, mut pa) = (vec![false; l], vec![0.0; l], vec![0.0; l]);
    let summary = rebalance(
        policy,
        &input,
        &mut scratch,
        state,
        Output {
            placement: &mut out,
            changed: &mut ch,
            par_before: &mut pb,
            par_after: &mut pa,
        },
    )?;
    Ok((out, summary))
}
