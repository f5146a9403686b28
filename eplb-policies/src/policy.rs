//! The `Policy` trait and the checked call around it.

use eplb_core::metrics::{self, Routing};
use eplb_core::{Placement, Shape};

use crate::arena::{Arena, Words, words_f64, words_u32};
use crate::{Error, PolicyKind};

/// Per-window logical loads `[T][L][N]` (FlashLB's samples), oldest first.
#[derive(Debug, Clone, Copy)]
pub struct Samples<'a> {
    windows: usize,
    layers: usize,
    experts: usize,
    data: &'a [f64],
}

impl<'a> Samples<'a> {
    /// Wraps `data` (`[T][L][N]`, `T = windows >= 1`), checking its length and values.
    pub fn new(shape: &Shape, windows: usize, data: &'a [f64]) -> Result<Self, Error> {
        if windows == 0 {
            return Err(eplb_core::Error::ZeroDimension { what: "windows" }.into());
        }
        let expected = windows * shape.loads_len();
        if data.len() != expected {
            return Err(eplb_core::Error::Length {
                what: "heat samples [T][L][N]",
                expected,
                got: data.len(),
            }
            .into());
        }
        for (i, w) in data.chunks_exact(shape.experts()).enumerate() {
            metrics::check_loads(i % shape.layers(), w)?;
        }
        Ok(Self {
            windows,
            layers: shape.layers(),
            experts: shape.experts(),
            data,
        })
    }

    /// Number of windows `T`.
    pub fn windows(&self) -> usize {
        self.windows
    }

    /// The loads of window `t`, layer `layer` (`[N]`); empty when out of range.
    pub fn get(&self, t: usize, layer: usize) -> &'a [f64] {
        if t >= self.windows || layer >= self.layers {
            return &[];
        }
        let start = (t * self.layers + layer) * self.experts;
        self.data.get(start..start + self.experts).unwrap_or(&[])
    }

    /// The whole `[T][L][N]` slice.
    pub fn as_slice(&self) -> &'a [f64] {
        self.data
    }
}

/// The load checks of [`Input::new`]: `loads` is `[L][N]`, finite and `>= 0`, and `samples`
/// (if any) have the shape's layers and experts.
pub(crate) fn check_loads_and_samples(
    shape: &Shape,
    loads: &[f64],
    samples: Option<&Samples<'_>>,
) -> Result<(), Error> {
    if loads.len() != shape.loads_len() {
        return Err(eplb_core::Error::Length {
            what: "logical loads [L][N]",
            expected: shape.loads_len(),
            got: loads.len(),
        }
        .into());
    }
    for (l, w) in loads.chunks_exact(shape.experts()).enumerate() {
        metrics::check_loads(l, w)?;
    }
    if let Some(s) = samples
        && (s.layers != shape.layers() || s.experts != shape.experts())
    {
        return Err(eplb_core::Error::Length {
            what: "heat samples layers x experts",
            expected: shape.loads_len(),
            got: s.layers * s.experts,
        }
        .into());
    }
    Ok(())
}

/// What a policy is given.
///
/// The current placement carries its live set ([`Placement::with_live`]). A policy's
/// [`Policy::place`] only ever sees a whole placement (every rank serves, every slot holds an
/// expert): [`rebalance`](crate::rebalance) plans a placement after a membership change on the live ranks alone
/// ([`crate::live`]).
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    current: Placement<'a>,
    /// The shape the policy plans on: the live ranks only ([`compact_shape`]); the
    /// shape itself when every rank serves.
    compact: Shape,
    loads: &'a [f64],
    samples: Option<Samples<'a>>,
    seed: u64,
}

impl<'a> Input<'a> {
    /// The current placement (with its live set: at least `ceil(N / S)` live ranks), logical
    /// loads `[L][N]` (finite, `>= 0`), optional per-window samples and a seed.
    pub fn new(
        current: Placement<'a>,
        loads: &'a [f64],
        samples: Option<Samples<'a>>,
        seed: u64,
    ) -> Result<Self, Error> {
        let compact = compact_shape(current.shape(), current.live_count())?;
        check_loads_and_samples(current.shape(), loads, samples.as_ref())?;
        Ok(Self {
            current,
            compact,
            loads,
            samples,
            seed,
        })
    }

    /// The shape (with ranks per node and expert groups).
    pub fn shape(&self) -> &Shape {
        self.current.shape()
    }
    /// The current placement.
    pub fn current(&self) -> &Placement<'a> {
        &self.current
    }
    /// The shape the policy plans on: the live ranks only ([`compact_shape`]).
    pub fn compact_shape(&self) -> &Shape {
        &self.compact
    }
    /// Logical loads `[L][N]`.
    pub fn loads(&self) -> &'a [f64] {
        self.loads
    }
    /// Logical loads of one layer (`[N]`; empty when out of range).
    pub fn layer_loads(&self, layer: usize) -> &'a [f64] {
        let n = self.shape().experts();
        self.loads.get(layer * n..(layer + 1) * n).unwrap_or(&[])
    }
    /// Per-window samples, if given.
    pub fn samples(&self) -> Option<&Samples<'a>> {
        self.samples.as_ref()
    }
    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

/// Where [`rebalance`](crate::rebalance) writes its results; every slice is the caller's.
#[derive(Debug)]
pub struct Output<'a> {
    /// The new placement `[L][R][S]`.
    pub placement: &'a mut [u16],
    /// Per layer: whether the placement changed.
    pub changed: &'a mut [bool],
    /// Per layer: PAR of the current placement (even split over replicas).
    pub par_before: &'a mut [f64],
    /// Per layer: PAR of the new placement (even split over replicas).
    pub par_after: &'a mut [f64],
}

/// What one [`rebalance`](crate::rebalance) call did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Layers whose placement changed.
    pub changed_layers: usize,
    /// (rank, expert) copies to fetch relative to the current placement.
    pub moves: usize,
    /// Rows (layer, rank) of the new placement holding an expert twice.
    pub colocated_rows: usize,
    /// Mean and max PAR before (the hotness log's "current").
    pub before: eplb_core::Hotness,
    /// Mean and max PAR after (the hotness log's "updated").
    pub after: eplb_core::Hotness,
    /// (rank, expert) copies in the new placement of experts that had no copy on a live rank
    /// in the current one: they must be loaded from storage, not from a peer. Always 0 from
    /// [`rebalance`](crate::rebalance) (every expert has a copy); see [`crate::live`].
    pub reloads: usize,
}

/// A placement policy. Implementations are `no_std` and allocation-free.
pub trait Policy {
    /// Which policy this is.
    fn kind(&self) -> PolicyKind;

    /// Scratch words (`u64`) that [`Policy::place`] needs for `shape`: a pure function of the
    /// shape.
    fn scratch_len(&self, shape: &Shape) -> usize;

    /// State words (`u64`) kept across calls for `shape`: a pure function of the shape. A state
    /// buffer of zeros is a fresh state; one written for another shape must be treated as fresh.
    ///
    /// In a cluster every rank runs its own copy of the policy, so the states must stay equal.
    /// The runtime's planner therefore calls [`Policy::place`] on a *copy* of the state and
    /// keeps that copy only when every rank took the cycle (they agreed on the plan's digest);
    /// otherwise the state stays the one before the cycle, and when ranks held different plans
    /// every rank restarts from zeros. A policy must therefore depend on nothing but its inputs
    /// and this buffer (`eplb_runtime::planner`).
    fn state_len(&self, _shape: &Shape) -> usize {
        0
    }

    /// Whether `shape` (its topology: ranks per node, expert groups) suits the policy; checked
    /// by [`buffer_lens`](crate::buffer_lens) before any buffer is allocated, so a caller can refuse the shape up
    /// front instead of failing every call.
    fn check_shape(&self, _shape: &Shape) -> Result<(), Error> {
        Ok(())
    }

    /// Whether the policy may put two copies of one expert on one rank (only DeepSeek's, to stay
    /// exact). [`rebalance`](crate::rebalance) rejects such output from every other policy.
    fn colocates(&self) -> bool {
        false
    }

    /// Writes the new placement `[L][R][S]` into `out`. `scratch` has at least
    /// [`Policy::scratch_len`] words (contents unspecified), `state` at least
    /// [`Policy::state_len`].
    fn place(
        &mut self,
        input: &Input<'_>,
        scratch: &mut [u64],
        state: &mut [u64],
        out: &mut [u16],
    ) -> Result<(), Error>;
}

/// Checks that `out` has room for a whole placement of `shape` (`[L][R][S]`): what every
/// [`Policy::place`] checks first, since it may be called without [`rebalance`](crate::rebalance).
pub fn check_out_len(shape: &Shape, out: &[u16]) -> Result<(), Error> {
    if out.len() == shape.placement_len() {
        Ok(())
    } else {
        Err(eplb_core::Error::Length {
            what: "new placement [L][R][S]",
            expected: shape.placement_len(),
            got: out.len(),
        }
        .into())
    }
}

fn metrics_words(shape: &Shape) -> usize {
    words_u32(metrics::scratch_len(shape)) + words_f64(shape.ranks())
}

/// Words of the servable copy of a current placement with co-located copies (see
/// [`rebalance`](crate::rebalance)) and its per-expert copy counts.
fn repair_words(shape: &Shape) -> usize {
    (Words(shape.placement_len()).u16s() + Words(shape.experts()).u32s()).get()
}

/// Scratch words [`rebalance`](crate::rebalance) needs for `policy` on `shape` with a whole current placement.
/// For a policy that does not [`colocate`](Policy::colocates) it includes room for a servable
/// copy of the current placement.
pub(crate) fn whole_scratch_len<P: Policy + ?Sized>(policy: &P, shape: &Shape) -> usize {
    let own = if policy.colocates() {
        policy.scratch_len(shape)
    } else {
        policy
            .scratch_len(shape)
            .saturating_add(repair_words(shape))
    };
    own.max(metrics_words(shape))
}

/// Makes every row of `slots` (one layer `[R][S]`) servable where it can: a second copy of an
/// expert on a rank is replaced by the expert with the highest load per copy that the rank
/// does not hold (lowest id on ties). Every expert keeps at least one copy, so the layer stays
/// structurally valid. A row that already holds every expert keeps its duplicate.
fn repair_layer(slots: &mut [u16], s: usize, loads: &[f64], copies: &mut [u32]) {
    copies.fill(0);
    for &e in slots.iter() {
        if let Some(c) = copies.get_mut(usize::from(e)) {
            *c += 1;
        }
    }
    for row in slots.chunks_exact_mut(s.max(1)) {
        for j in 0..row.len() {
            let Some(&e) = row.get(j) else { break };
            let seen_before = row.get(..j).is_some_and(|head| head.contains(&e));
            if !seen_before {
                continue;
            }
            let mut best: Option<(u16, f64)> = None;
            for (x, &c) in copies.iter().enumerate() {
                let Ok(x) = u16::try_from(x) else { break };
                if row.contains(&x) {
                    continue;
                }
                let per_copy = loads.get(usize::from(x)).copied().unwrap_or(0.0) / f64::from(c + 1);
                if best.is_none_or(|(_, b)| per_copy > b) {
                    best = Some((x, per_copy));
                }
            }
            let Some((x, _)) = best else { continue };
            if let Some(slot) = row.get_mut(j) {
                *slot = x;
            }
            if let Some(c) = copies.get_mut(usize::from(e)) {
                *c -= 1;
            }
            if let Some(c) = copies.get_mut(usize::from(x)) {
                *c += 1;
            }
        }
    }
}

/// The shape of `live` ranks of `shape` (see the module documentation): `R' = live`, the node
/// size kept when it divides `R'` (else one node), the groups kept unless they would make an
/// invalid hierarchical topology (else one group); `shape` itself when `live == R`.
/// [`Error::TooFewLiveRanks`] when `live * S < N` (or `live` is 0 or above `R`).
pub fn compact_shape(shape: &Shape, live: usize) -> Result<Shape, Error> {
    let (n, s) = (shape.experts(), shape.slots_per_rank());
    if live == shape.ranks() {
        return Ok(*shape);
    }
    let too_few = Error::TooFewLiveRanks {
        live,
        ranks: shape.ranks(),
        slots_per_rank: s,
        experts: n,
    };
    if live == 0 || live > shape.ranks() || live.saturating_mul(s) < n {
        return Err(too_few);
    }
    let r = u16::try_from(live).map_err(|_| too_few)?;
    let rpn = shape.ranks_per_node();
    let rpn = if live.is_multiple_of(rpn) { rpn } else { live };
    let nodes = live / rpn.max(1);
    let g = shape.groups();
    let g = if g.is_multiple_of(nodes.max(1)) && !n.is_multiple_of(g.max(1)) {
        1
    } else {
        g
    };
    // Every dimension fits `u16`: they come from a valid shape.
    let as16 = |v: usize| u16::try_from(v).unwrap_or(u16::MAX);
    Ok(Shape::with_topology(
        as16(shape.layers()),
        as16(n),
        r,
        as16(s),
        as16(rpn),
        as16(g),
    )?)
}

/// The most ranks a policy call accepts. At this edge the slowest policy (`incremental`) takes
/// about 1.5 s per layer on one core (`BENCHMARKS.md`, "Extreme shapes").
pub const MAX_RANKS: usize = 2048;

/// The most slots per layer (`R * S`) a policy call accepts. At this edge with 16 copies per
/// expert (`R = 256`, `S = 16`, `N = 256`) `incremental` takes about 3 s per layer; every other
/// policy stays below 1 s per layer (`BENCHMARKS.md`, "Extreme shapes").
pub const MAX_SLOTS_PER_LAYER: usize = 4096;

/// The most bytes of scratch plus state a policy may need: 1 GiB.
pub const MAX_BUFFER_BYTES: usize = 1 << 30;

/// The sizes of the buffers [`rebalance`](crate::rebalance) needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferLens {
    /// Scratch words ([`scratch_len`](crate::scratch_len)).
    pub scratch: usize,
    /// State words ([`Policy::state_len`]).
    pub state: usize,
}

/// `scratch` and `state` words as [`BufferLens`], if their bytes stay within
/// [`MAX_BUFFER_BYTES`] (checked arithmetic).
pub(crate) fn checked_lens(scratch: usize, state: usize) -> Result<BufferLens, Error> {
    let bytes = scratch
        .checked_add(state)
        .and_then(|w| w.checked_mul(8))
        .unwrap_or(usize::MAX);
    if bytes > MAX_BUFFER_BYTES {
        return Err(Error::TooLarge {
            what: "scratch and state bytes",
            needed: bytes,
            limit: MAX_BUFFER_BYTES,
        });
    }
    Ok(BufferLens { scratch, state })
}

/// The supported range of shapes ([`MAX_RANKS`], [`MAX_SLOTS_PER_LAYER`]).
pub fn check_range(shape: &Shape) -> Result<(), Error> {
    if shape.ranks() > MAX_RANKS {
        return Err(Error::TooLarge {
            what: "ranks",
            needed: shape.ranks(),
            limit: MAX_RANKS,
        });
    }
    if shape.slots_per_layer() > MAX_SLOTS_PER_LAYER {
        return Err(Error::TooLarge {
            what: "slots per layer (ranks x slots per rank)",
            needed: shape.slots_per_layer(),
            limit: MAX_SLOTS_PER_LAYER,
        });
    }
    Ok(())
}

/// [`rebalance`](crate::rebalance) of a whole current placement.
pub(crate) fn rebalance_whole<P: Policy + ?Sized>(
    policy: &mut P,
    input: &Input<'_>,
    scratch: &mut [u64],
    state: &mut [u64],
    out: Output<'_>,
) -> Result<Summary, Error> {
    let shape = *input.shape();
    let l = shape.layers();
    for (what, got) in [
        ("changed [L]", out.changed.len()),
        ("PAR before [L]", out.par_before.len()),
        ("PAR after [L]", out.par_after.len()),
    ] {
        if got != l {
            return Err(eplb_core::Error::Length {
                what,
                expected: l,
                got,
            }
            .into());
        }
    }
    check_out_len(&shape, out.placement)?;
    check_range(&shape)?;
    let needed = whole_scratch_len(policy, &shape);
    if scratch.len() < needed {
        return Err(Error::Scratch {
            needed,
            got: scratch.len(),
        });
    }
    let state_needed = policy.state_len(&shape);
    if state.len() < state_needed {
        return Err(Error::State {
            needed: state_needed,
            got: state.len(),
        });
    }

    let current = input.current().as_slice();
    // A current placement with co-located copies (DeepSeek's, say) is structurally valid: a
    // policy that never co-locates plans from a servable copy of it, so it returns a servable
    // placement. Moves and the PAR before are still counted against the real current one.
    let placed = if !policy.colocates() && input.current().colocated_rows() > 0 {
        let (head, rest) = scratch.split_at_mut(repair_words(&shape).min(scratch.len()));
        let mut arena = Arena::new(head);
        let fixed = arena.u16s(shape.placement_len())?;
        let copies = arena.u32s(shape.experts())?;
        fixed.copy_from_slice(current);
        for (l, layer) in fixed.chunks_exact_mut(shape.slots_per_layer()).enumerate() {
            repair_layer(layer, shape.slots_per_rank(), input.layer_loads(l), copies);
        }
        let fixed = Placement::new(shape, fixed)?;
        let repaired = Input {
            current: fixed,
            ..*input
        };
        policy.place(&repaired, rest, state, out.placement)
    } else {
        policy.place(input, scratch, state, out.placement)
    };
    if let Err(e) = placed {
        out.placement.copy_from_slice(current);
        return Err(e);
    }
    // The one validation of the policy's output.
    let checked = Placement::new(shape, &*out.placement).and_then(|p| {
        if !policy.colocates() {
            p.check_servable()?;
        }
        Ok((p, p.colocated_rows()))
    });
    let (new, colocated_rows) = match checked {
        Ok(c) => c,
        Err(e) => {
            out.placement.copy_from_slice(current);
            return Err(Error::InvalidOutput(e));
        }
    };

    let mut arena = Arena::new(scratch);
    let m_scratch = arena.u32s(metrics::scratch_len(&shape))?;
    let rank_buf = arena.f64s(shape.ranks())?;
    let before = metrics::hotness(
        input.current(),
        input.loads(),
        Routing::Even,
        m_scratch,
        rank_buf,
        out.par_before,
    )?;
    let after = metrics::hotness(
        &new,
        input.loads(),
        Routing::Even,
        m_scratch,
        rank_buf,
        out.par_after,
    )?;
    let per_layer = shape.slots_per_layer();
    let mut changed_layers = 0;
    for ((c, old), newl) in out
        .changed
        .iter_mut()
        .zip(current.chunks_exact(per_layer))
        .zip(new.as_slice().chunks_exact(per_layer))
    {
        *c = old != newl;
        changed_layers += usize::from(*c);
    }
    Ok(Summary {
        changed_layers,
        moves: metrics::moves(current, new.as_slice(), shape.slots_per_rank()),
        colocated_rows,
        before,
        after,
        reloads: 0,
    })
}
