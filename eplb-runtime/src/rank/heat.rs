//! One rank's heat: the per-slot ring it counts into, and the fold of every rank's gathered ring
//! through the live placement into the logical heat the planner is given.
//!
//! Forms, once each: u64 `[W][L][S]` (this rank's ring) → u64 `[R][T][L][S]` (the gather, the
//! driver's buffer) → f64 `[T][L][N]` (`samples`) → f64 `[L][N]` (`loads`, the sum over `T`).

use eplb_core::{Error, Shape};

use super::{MachineError, check};

/// The per-slot heat ring `[W][L][S]` (counted iteration `k` of a cycle goes to bucket
/// `k / per`) and the logical heat folded from the last gather. Every buffer is sized in
/// [`SlotHeat::new`].
#[derive(Debug, Clone)]
pub(super) struct SlotHeat {
    per: u32,
    counted: u32,
    /// `L * S`: the words of one bucket.
    words: usize,
    ring: Vec<u64>,
    /// `T` of the last fold (0 before the first).
    folded: usize,
    /// `[L][N]`.
    loads: Vec<f64>,
    /// `[W][L][N]`, the first `folded` windows valid.
    samples: Vec<f64>,
    /// Whether this rank folds the gathered heat (false: a rank whose plans come from a
    /// planner another rank of its process feeds; it keeps no logical heat).
    folds: bool,
}

impl SlotHeat {
    pub(super) fn new(shape: &Shape, heat_interval: u32) -> Result<Self, Error> {
        let (w, per) = eplb_core::heat::layout_for_interval(heat_interval)?;
        let (l, s, n) = (shape.layers(), shape.slots_per_rank(), shape.experts());
        Ok(Self {
            per,
            counted: 0,
            words: l * s,
            ring: vec![0; w * l * s],
            folded: 0,
            loads: vec![0.0; l * n],
            samples: vec![0.0; w * l * n],
            folds: true,
        })
    }

    /// From now on, folds nothing and keeps no logical heat ([`super::RankMachine::share_planner`]).
    pub(super) fn stop_folding(&mut self) {
        self.folds = false;
        self.folded = 0;
        self.loads = Vec::new();
        self.samples = Vec::new();
    }

    /// Windows counted into so far this cycle (`T` at the snapshot).
    fn windows(&self) -> usize {
        self.counted.div_ceil(self.per) as usize
    }

    pub(super) fn add(&mut self, counts: &[u32]) {
        let b = (self.counted / self.per) as usize;
        if let Some(bucket) = self.ring.get_mut(b * self.words..(b + 1) * self.words) {
            for (h, &c) in bucket.iter_mut().zip(counts) {
                *h = h.saturating_add(u64::from(c));
            }
            self.counted += 1;
        }
    }

    /// Words of the whole ring, `W * L * S`: the most this rank sends in a heat gather.
    pub(super) fn capacity(&self) -> usize {
        self.ring.len()
    }

    /// The windows counted so far, `[T][L][S]`: what this rank sends in the heat gather.
    pub(super) fn held(&self) -> &[u64] {
        self.ring.get(..self.windows() * self.words).unwrap_or(&[])
    }

    pub(super) fn reset(&mut self) {
        let n = self.windows() * self.words;
        if let Some(d) = self.ring.get_mut(..n) {
            d.fill(0);
        }
        self.counted = 0;
    }

    /// Folds the gathered slot heat (`[R][T][L][S]`, rank-major, `T` the windows this rank
    /// holds) through `placement` into `samples` and their sum `loads`. This is the one fold
    /// from slot heat to logical heat.
    pub(super) fn fold(
        &mut self,
        shape: &Shape,
        placement: &[u16],
        gathered: &[u64],
    ) -> Result<(), MachineError> {
        let (l, n) = (shape.layers(), shape.experts());
        let t = self.windows().max(1);
        check(
            "gathered slot heat [R][T][L][S]",
            shape.ranks() * t * self.words,
            gathered.len(),
        )?;
        if !self.folds {
            return Ok(());
        }
        let Some(samples) = self.samples.get_mut(..t * l * n) else {
            return Err(MachineError::Len {
                what: "heat windows [T]",
                expected: self.samples.len() / (l * n).max(1),
                got: t,
            });
        };
        fold_slot_heat(shape, placement, t, gathered, samples);
        self.loads.fill(0.0);
        for win in samples.chunks_exact(l * n) {
            for (a, b) in self.loads.iter_mut().zip(win) {
                *a += b;
            }
        }
        self.folded = t;
        Ok(())
    }

    /// `T` of the last fold.
    pub(super) fn folded_windows(&self) -> usize {
        self.folded
    }
    /// The last fold's logical loads `[L][N]`.
    pub(super) fn loads(&self) -> &[f64] {
        &self.loads
    }
    /// The last fold's per-window logical heat `[T][L][N]`.
    pub(super) fn samples(&self) -> &[f64] {
        let len = self.folded * self.loads.len();
        self.samples.get(..len).unwrap_or(&[])
    }
}

/// Folds rank-major slot heat `[R][T][L][S]` through `placement` (`[L][R][S]`) into logical
/// per-window heat `[T][L][N]` (overwritten).
fn fold_slot_heat(
    shape: &Shape,
    placement: &[u16],
    windows: usize,
    gathered: &[u64],
    samples: &mut [f64],
) {
    let (l, s, n) = (shape.layers(), shape.slots_per_rank(), shape.experts());
    let per = shape.slots_per_layer();
    samples.fill(0.0);
    let part = windows * l * s;
    if part == 0 {
        return;
    }
    for (rank, chunk) in gathered.chunks_exact(part).enumerate() {
        for (i, win) in chunk.chunks_exact(l * s).enumerate() {
            for (layer, row) in win.chunks_exact(s).enumerate() {
                let base = layer * per + rank * s;
                let at = (i * l + layer) * n;
                let (Some(experts), Some(out)) =
                    (placement.get(base..base + s), samples.get_mut(at..at + n))
                else {
                    continue;
                };
                for (&c, &e) in row.iter().zip(experts) {
                    if let Some(x) = out.get_mut(usize::from(e)) {
                        *x += c as f64;
                    }
                }
            }
        }
    }
}
