//! Planning over the live ranks only: how [`rebalance`](crate::rebalance) plans a placement after a membership
//! change, one mechanism for every policy.
//!
//! After a membership change (elastic EP) some ranks are gone: their slots are [`EMPTY`] in the
//! current placement, and an expert whose every copy sat on them is *lost* (it must be loaded
//! from storage). A rank that joined is live with an all-[`EMPTY`] row. [`rebalance`](crate::rebalance) plans
//! such a placement (one that is not [whole](eplb_core::Placement::is_whole)) on the live ranks
//! only, in three steps:
//!
//! 1. **Compact.** The live ranks, in ascending order, form the shape
//!    `(L, N, R' = live ranks, S)` ([`compact_shape`]). Its topology keeps `ranks_per_node` when
//!    it divides `R'`, else it is one node (`ranks_per_node = R'`); it keeps the expert groups
//!    unless they would make an invalid hierarchical topology (groups divisible by the nodes but
//!    experts not divisible by the groups), then it has one group. DeepSeek's hierarchical mode
//!    falls back to its global mode on such a shape as it does on any other. With every rank
//!    live the compact shape is the shape itself.
//! 2. **Servable current.** Per layer, deterministically: first every lost expert (ascending id)
//!    gets a slot: an [`EMPTY`] slot of a live rank if there is one (lowest rank, lowest slot),
//!    else a slot of the expert with the most copies (more than one; ties: lowest load per copy,
//!    then lowest id), on that expert's highest holding rank, its last slot (a lost expert is on
//!    no live rank, so it never lands next to a copy of itself). Then every remaining
//!    [`EMPTY`] slot gets the expert with the highest load per copy (load / copies) that its
//!    rank does not hold yet (ties: lowest id). The result is a structurally valid placement of
//!    the compact shape, and [`rebalance`](crate::rebalance) runs on it: its repair of co-located copies, its
//!    output checks and its metrics all apply.
//! 3. **Expand.** The live ranks' rows come from the compact result; every slot of a dead rank
//!    is [`EMPTY`].
//!
//! The [`Summary`] counts `moves` against the real current placement (a copy on a slot that
//! was [`EMPTY`], or of a lost expert, is a move) and `reloads`, the (rank, expert) copies of
//! lost experts. `changed` compares the real current rows with the new ones; `par_before` and
//! `par_after` are the PAR over the live ranks only (the compact shape's), `par_before` of the
//! servable current of step 2.
//!
//! Policy state: a state buffer sized for the full shape ([`crate::buffer_lens`]) serves every
//! live set. The stateful policies (FlashLB, incremental) fingerprint the shape they last ran
//! on, ranks included, so a state written for the full shape reads as fresh on a compact shape
//! and the other way round. Compact shapes of equal size share their state: what it holds
//! (per-expert estimates, load samples) does not depend on which ranks are live.

use eplb_core::{Placement, Shape};

use crate::arena::{Arena, Words, words_u16, words_u32};
pub use crate::policy::compact_shape;
use crate::policy::{check_range, rebalance_whole, whole_scratch_len};
use crate::{Error, Input, Output, Policy, Summary};

pub use eplb_core::live::{EMPTY, LiveSet, NO_COPY, lost_experts};

/// Scratch words of a degraded plan on the compact shape `c`: the servable current, two
/// per-expert counters, and the whole-placement scratch of the policy on `c`.
fn compact_scratch<P: Policy + ?Sized>(policy: &P, c: &Shape) -> usize {
    (Words(words_u16(c.placement_len())) + 2 * Words(words_u32(c.experts())))
        .get()
        .saturating_add(whole_scratch_len(policy, c))
}

/// The largest `(scratch, state)` words over every live count the shape allows (every count
/// from `ceil(N / S)` to `R`; the whole placement's need is the count `R`'s).
pub(crate) fn live_words<P: Policy + ?Sized>(policy: &P, shape: &Shape) -> (usize, usize) {
    let min_live = shape
        .experts()
        .div_ceil(shape.slots_per_rank().max(1))
        .max(1);
    let mut scratch = 0usize;
    let mut state = policy.state_len(shape);
    for live in min_live..=shape.ranks() {
        if let Ok(c) = compact_shape(shape, live) {
            scratch = scratch.max(compact_scratch(policy, &c));
            state = state.max(policy.state_len(&c));
        }
    }
    (scratch, state)
}

/// Copies the live rows of the elastic `current` into `compact` (`[L][R'][S]`).
fn gather(current: &Placement<'_>, compact: &mut [u16]) {
    let s = current.shape().slots_per_rank().max(1);
    let r = current.shape().ranks();
    let mut dst = compact.chunks_exact_mut(s);
    for (i, row) in current.as_slice().chunks_exact(s).enumerate() {
        if current.is_live(i % r.max(1))
            && let Some(d) = dst.next()
        {
            d.copy_from_slice(row);
        }
    }
}

/// Step 2 of the module documentation on one compact layer `lay` (`[R'][S]`, may hold
/// [`EMPTY`]): every expert gets a slot, then every [`EMPTY`] slot an expert its rank lacks.
/// `copies` and `mark` hold `N` counters each.
fn make_servable(lay: &mut [u16], s: usize, loads: &[f64], copies: &mut [u32], mark: &mut [u32]) {
    let load = |x: usize| loads.get(x).copied().unwrap_or(0.0);
    copies.fill(0);
    mark.fill(0);
    for &e in lay.iter() {
        if let Some(c) = copies.get_mut(usize::from(e)) {
            *c += 1;
        }
    }
    // Lost experts, ascending id.
    for x in 0..copies.len() {
        if copies.get(x).is_none_or(|&c| c > 0) {
            continue;
        }
        let Ok(xid) = u16::try_from(x) else { break };
        let slot = match lay.iter().position(|&e| e == EMPTY) {
            Some(i) => Some(i),
            None => {
                // The donor: most copies (> 1), then lowest load per copy, then lowest id.
                let mut best: Option<(usize, u32, f64)> = None;
                for (y, &c) in copies.iter().enumerate() {
                    if c < 2 {
                        continue;
                    }
                    let per = load(y) / f64::from(c);
                    if best.is_none_or(|(_, bc, bp)| c > bc || (c == bc && per < bp)) {
                        best = Some((y, c, per));
                    }
                }
                best.and_then(|(y, _, _)| {
                    let i = lay.iter().rposition(|&e| usize::from(e) == y)?;
                    if let Some(c) = copies.get_mut(y) {
                        *c -= 1;
                    }
                    Some(i)
                })
            }
        };
        // Without an EMPTY slot some expert has two copies (`R' * S >= N`), so `slot` is set.
        if let Some(v) = slot.and_then(|i| lay.get_mut(i)) {
            *v = xid;
            if let Some(c) = copies.get_mut(x) {
                *c = 1;
            }
        }
    }
    // Remaining EMPTY slots, rank by rank.
    for (r, row) in lay.chunks_exact_mut(s.max(1)).enumerate() {
        if !row.contains(&EMPTY) {
            continue;
        }
        let stamp = u32::try_from(r + 1).unwrap_or(u32::MAX);
        for &e in row.iter() {
            if let Some(m) = mark.get_mut(usize::from(e)) {
                *m = stamp;
            }
        }
        for j in 0..row.len() {
            if row.get(j) != Some(&EMPTY) {
                continue;
            }
            let mut best: Option<(usize, f64)> = None;
            for (x, (&c, &m)) in copies.iter().zip(mark.iter()).enumerate() {
                if m == stamp {
                    continue;
                }
                let per = load(x) / f64::from(c.max(1));
                if best.is_none_or(|(_, b)| per > b) {
                    best = Some((x, per));
                }
            }
            // A row with an EMPTY slot holds fewer than `S <= N` experts: `best` is set.
            let Some((x, _)) = best else { continue };
            let Ok(xid) = u16::try_from(x) else { continue };
            if let Some(v) = row.get_mut(j) {
                *v = xid;
            }
            if let Some(c) = copies.get_mut(x) {
                *c += 1;
            }
            if let Some(m) = mark.get_mut(x) {
                *m = stamp;
            }
        }
    }
}

/// (rank, expert) copies in `new` (one compact layer) of the experts that have no copy on a
/// live rank of `old` (one elastic layer, dead rows [`EMPTY`]). `copies` holds `N` counters.
fn layer_reloads(old: &[u16], new: &[u16], s: usize, copies: &mut [u32]) -> usize {
    copies.fill(0);
    for &e in old {
        if let Some(c) = copies.get_mut(usize::from(e)) {
            *c += 1;
        }
    }
    let mut reloads = 0;
    for row in new.chunks_exact(s.max(1)) {
        for (j, &e) in row.iter().enumerate() {
            let first = row.get(..j).is_some_and(|head| !head.contains(&e));
            if first && copies.get(usize::from(e)) == Some(&0) {
                reloads += 1;
            }
        }
    }
    reloads
}

/// Writes the compact placement held in the front of `out` (`[L][R'][S]`) out to the full
/// `[L][R][S]` in place: live rows from the compact rows, dead rows [`EMPTY`].
fn expand(current: &Placement<'_>, out: &mut [u16]) {
    let shape = current.shape();
    let (r, s) = (shape.ranks(), shape.slots_per_rank());
    let rows = shape.layers() * r;
    let live_rows = current.live_count();
    // Full row `j` of layer `l` takes compact row `l * R' + position(rank)`; that index is never
    // above `j`, so walking down from the last row reads every compact row before it is written
    // over.
    for j in (0..rows).rev() {
        let (l, rank) = (j / r.max(1), j % r.max(1));
        let dst = j * s;
        let position = match current.live() {
            Some(live) => live.position(rank),
            None => Some(rank),
        };
        match position {
            Some(p) => {
                let src = (l * live_rows + p) * s;
                if src != dst && src + s <= out.len() && dst + s <= out.len() {
                    out.copy_within(src..src + s, dst);
                }
            }
            None => {
                if let Some(row) = out.get_mut(dst..dst + s) {
                    row.fill(EMPTY);
                }
            }
        }
    }
}

/// [`rebalance`](crate::rebalance) of a current placement that is not whole: plans on the compact shape from a
/// servable current (see the module documentation), then writes the full placement `[L][R][S]`
/// into `out.placement` with every slot of a dead rank [`EMPTY`].
///
/// `scratch` holds at least the compact shape's need ([`crate::scratch_len`] of the full shape
/// serves every live set), `state` at least [`Policy::state_len`] of the compact shape (the
/// full shape's is enough for every policy here). On error `out.placement` holds the input's
/// current placement (once its length is checked).
pub(crate) fn rebalance_degraded<P: Policy + ?Sized>(
    policy: &mut P,
    input: &Input<'_>,
    scratch: &mut [u64],
    state: &mut [u64],
    out: Output<'_>,
) -> Result<Summary, Error> {
    crate::check_out_len(input.shape(), out.placement)?;
    let Output {
        placement,
        changed,
        par_before,
        par_after,
    } = out;
    let planned = plan_live(
        policy,
        input,
        scratch,
        state,
        Output {
            placement: &mut *placement,
            changed,
            par_before,
            par_after,
        },
    );
    if planned.is_err() {
        placement.copy_from_slice(input.current().as_slice());
    }
    planned
}

/// [`rebalance_degraded`] after the placement's length check; the caller restores the current
/// placement on error.
fn plan_live<P: Policy + ?Sized>(
    policy: &mut P,
    input: &Input<'_>,
    scratch: &mut [u64],
    state: &mut [u64],
    out: Output<'_>,
) -> Result<Summary, Error> {
    let shape = *input.shape();
    let compact = *input.compact_shape();
    let current = input.current();
    check_range(&shape)?;
    let needed = compact_scratch(policy, &compact);
    if scratch.len() < needed {
        return Err(Error::Scratch {
            needed,
            got: scratch.len(),
        });
    }
    let (mine, rest) =
        scratch.split_at_mut(needed.saturating_sub(whole_scratch_len(policy, &compact)));
    let mut arena = Arena::new(mine);
    let cur = arena.u16s(compact.placement_len())?;
    let copies = arena.u32s(shape.experts())?;
    let mark = arena.u32s(shape.experts())?;
    gather(current, cur);
    let s = shape.slots_per_rank();
    for (l, lay) in cur.chunks_exact_mut(compact.slots_per_layer()).enumerate() {
        let loads = input.layer_loads(l);
        make_servable(lay, s, loads, copies, mark);
    }
    let planned = Placement::new(compact, cur)
        .map_err(Error::InvalidOutput)
        .and_then(|p| Input::new(p, input.loads(), input.samples().copied(), input.seed()))
        .and_then(|inp| {
            let small = out.placement.get_mut(..compact.placement_len()).ok_or(
                eplb_core::Error::Length {
                    what: "new placement [L][R][S]",
                    expected: compact.placement_len(),
                    got: 0,
                },
            )?;
            rebalance_whole(
                policy,
                &inp,
                rest,
                state,
                Output {
                    placement: small,
                    changed: &mut *out.changed,
                    par_before: &mut *out.par_before,
                    par_after: &mut *out.par_after,
                },
            )
        });
    let summary = planned?;

    let mut reloads = 0;
    let (full_layer, small_layer) = (shape.slots_per_layer(), compact.slots_per_layer());
    for (old, new) in current
        .as_slice()
        .chunks_exact(full_layer)
        .zip(out.placement.chunks_exact(small_layer))
    {
        reloads += layer_reloads(old, new, s, copies);
    }
    expand(current, out.placement);

    let mut changed_layers = 0;
    for ((c, old), new) in out
        .changed
        .iter_mut()
        .zip(current.as_slice().chunks_exact(full_layer))
        .zip(out.placement.chunks_exact(full_layer))
    {
        *c = old != new;
        changed_layers += usize::from(*c);
    }
    Ok(Summary {
        changed_layers,
        moves: eplb_core::metrics::moves(current.as_slice(), out.placement, s),
        reloads,
        ..summary
    })
}

#[cfg(test)]
mod tests;
