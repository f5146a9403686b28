//! The checked call: [`rebalance`] runs a policy on a whole current placement, and plans any
//! other (after a membership change) over its live ranks ([`crate::live`]); [`buffer_lens`] and
//! [`scratch_len`] size its buffers once for every live set.

use eplb_core::Shape;

use crate::live::{live_words, rebalance_degraded};
use crate::policy::{check_range, checked_lens, rebalance_whole};
use crate::{BufferLens, Error, Input, Output, Policy, Summary};

/// Scratch words [`rebalance`] needs for `policy` on `shape` for any current placement, whole
/// or with any live set (`usize::MAX` when the size overflows; [`buffer_lens`] turns that into
/// an error): a caller sizes once for the full shape.
pub fn scratch_len<P: Policy + ?Sized>(policy: &P, shape: &Shape) -> usize {
    live_words(policy, shape).0
}

/// Checks `shape` against the supported range ([`MAX_RANKS`](crate::MAX_RANKS), [`MAX_SLOTS_PER_LAYER`](crate::MAX_SLOTS_PER_LAYER)) and
/// the policy's [`Policy::check_shape`], then the buffer sizes of `policy` against
/// [`MAX_BUFFER_BYTES`](crate::MAX_BUFFER_BYTES) with checked arithmetic, and returns the sizes; call it before
/// allocating. The sizes serve every current placement of `shape`, whole or with any live set
/// ([`scratch_len`]; the state is the full shape's [`Policy::state_len`], the most over every
/// live count for every policy here). [`rebalance`] applies the same range check.
pub fn buffer_lens<P: Policy + ?Sized>(policy: &P, shape: &Shape) -> Result<BufferLens, Error> {
    check_range(shape)?;
    policy.check_shape(shape)?;
    let (scratch, state) = live_words(policy, shape);
    checked_lens(scratch, state)
}

/// Runs `policy`, then checks its output and fills the per-layer report.
///
/// The new placement must be structurally valid, and free of co-located copies unless the policy
/// [`colocates`](Policy::colocates); otherwise the result is [`Error::InvalidOutput`] and
/// `out.placement` holds the current placement again.
///
/// A current placement after a membership change (some rank gone, or some slot
/// [`EMPTY`](eplb_core::EMPTY)) is planned over the live ranks only ([`crate::live`]): every
/// slot of a rank outside the live set comes out [`EMPTY`](eplb_core::EMPTY), every lost expert
/// gets a copy again, and [`Summary::reloads`] counts those copies. With a whole current
/// placement that path is never taken.
///
/// `scratch` holds at least [`scratch_len`] words for the current placement's live set (the
/// full shape's [`scratch_len`] serves every one), `state` at least [`Policy::state_len`] of
/// the full shape.
pub fn rebalance<P: Policy + ?Sized>(
    policy: &mut P,
    input: &Input<'_>,
    scratch: &mut [u64],
    state: &mut [u64],
    out: Output<'_>,
) -> Result<Summary, Error> {
    if input.current().is_whole() {
        rebalance_whole(policy, input, scratch, state, out)
    } else {
        rebalance_degraded(policy, input, scratch, state, out)
    }
}
