//! One rank's heat: the machine-owned storage of its per-slot ring and of the logical heat
//! folded from every rank's gathered ring. The ring and the fold are `eplb-core`'s
//! ([`eplb_core::HeatRing`], [`eplb_core::heat::fold_slot_heat`]); this file only owns the
//! buffers.
//!
//! Forms, once each: u64 `[W][L][S]` (this rank's ring) → u64 `[R][T][L][S]` (the gather, the
//! driver's buffer) → f64 `[T][L][N]` (`samples`) → f64 `[L][N]` (`loads`, the sum over `T`).

use eplb_core::Placement;
use eplb_core::heat::{fold_slot_heat, layout_for_interval, ring_len};
use eplb_core::{Error, HeatRing, LiveSet, Shape};

use super::{MachineError, check};

/// The per-slot heat ring `[W][L][S]` (counted iteration `k` of a cycle goes to window
/// `k / per`) and the logical heat folded from the last gather. Every buffer is sized in
/// [`SlotHeat::new`].
#[derive(Debug, Clone)]
pub(super) struct SlotHeat {
    ring: HeatRing<Vec<u64>>,
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
        let (w, _) = layout_for_interval(heat_interval)?;
        let ln = shape.loads_len();
        Ok(Self {
            ring: HeatRing::new(shape, heat_interval, vec![0; ring_len(shape, w)])?,
            folded: 0,
            loads: vec![0.0; ln],
            samples: vec![0.0; w * ln],
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

    /// Adds one counted iteration's per-slot counts `[L][S]`.
    pub(super) fn add(&mut self, counts: &[u32]) -> Result<(), Error> {
        self.ring.add(counts)
    }

    /// Words of the whole ring, `W * L * S`: the most this rank sends in a heat gather.
    pub(super) fn capacity(&self) -> usize {
        self.ring.as_slice().len()
    }

    /// The windows counted so far, `[T][L][S]`: what this rank sends in the heat gather.
    pub(super) fn held(&self) -> &[u64] {
        self.ring.held()
    }

    pub(super) fn reset(&mut self) {
        self.ring.reset();
    }

    /// Folds the gathered slot heat (`[R'][T][L][S]`, rank-major over the `R'` live ranks, `T`
    /// the windows this rank holds, at least 1) through `placement` into `samples` and their sum
    /// `loads` ([`fold_slot_heat`]). A rank that does not fold only checks the gather's length.
    pub(super) fn fold(
        &mut self,
        shape: &Shape,
        placement: &[u16],
        live: &LiveSet,
        gathered: &[u64],
    ) -> Result<(), MachineError> {
        let (l, s, n) = (shape.layers(), shape.slots_per_rank(), shape.experts());
        let t = self.ring.windows().max(1);
        check(
            "gathered slot heat [R'][T][L][S]",
            live.count() * t * l * s,
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
        let placement = Placement::with_live(*shape, placement, live)?;
        fold_slot_heat(&placement, t, gathered, samples, &mut self.loads)?;
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
