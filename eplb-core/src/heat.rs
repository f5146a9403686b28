//! The heat window: a ring of per-window logical loads over caller storage.

use crate::placement::check_len;
use crate::{Error, Placement, Shape};

/// The most buckets the ring keeps per layer (FlashLB's sample count).
pub const MAX_WINDOWS: usize = 64;

/// Storage needed for `windows` buckets of `shape`: `windows * L * N` counts.
pub const fn storage_len(shape: &Shape, windows: usize) -> usize {
    windows * shape.loads_len()
}

/// The ring size and bucket width used for a heat interval of `h` iterations: at most
/// [`MAX_WINDOWS`] buckets, each summing `ceil(h / buckets)` iterations.
pub fn layout_for_interval(h: u32) -> Result<(usize, u32), Error> {
    if h == 0 {
        return Err(Error::ZeroInterval {
            what: "heat interval",
        });
    }
    let w = (h as usize).min(MAX_WINDOWS);
    Ok((w, h.div_ceil(w as u32)))
}

/// A ring of `W` buckets x `L` layers x `N` experts of token counts, over caller storage `B`
/// (a `&mut [u64]`, or any owner of a `[u64]` such as a `Vec<u64>` in std code).
///
/// Each bucket sums `iters_per_bucket` consecutive counted iterations. Counts are folded from
/// per-slot counts into logical experts through the placement they were measured on.
#[derive(Debug)]
pub struct HeatWindow<B> {
    layers: usize,
    experts: usize,
    capacity: usize,
    iters_per_bucket: u32,
    head: usize,
    filled: usize,
    iters_in_head: u32,
    storage: B,
}

impl<B: AsRef<[u64]> + AsMut<[u64]>> HeatWindow<B> {
    /// A ring of `windows` buckets, each summing `iters_per_bucket` iterations.
    pub fn new(
        shape: &Shape,
        windows: usize,
        iters_per_bucket: u32,
        mut storage: B,
    ) -> Result<Self, Error> {
        if windows == 0 {
            return Err(Error::ZeroDimension { what: "windows" });
        }
        if iters_per_bucket == 0 {
            return Err(Error::ZeroDimension {
                what: "iterations per bucket",
            });
        }
        check_len(
            "heat storage [W][L][N]",
            storage_len(shape, windows),
            storage.as_ref().len(),
        )?;
        storage.as_mut().fill(0);
        Ok(Self {
            layers: shape.layers(),
            experts: shape.experts(),
            capacity: windows,
            iters_per_bucket,
            head: 0,
            filled: 0,
            iters_in_head: 0,
            storage,
        })
    }

    /// A ring sized for a heat interval of `h` iterations ([`layout_for_interval`]).
    pub fn for_interval(shape: &Shape, h: u32, storage: B) -> Result<Self, Error> {
        let (w, per) = layout_for_interval(h)?;
        Self::new(shape, w, per, storage)
    }

    /// Number of buckets that hold at least one iteration (at most the capacity).
    pub fn windows(&self) -> usize {
        self.filled
    }

    /// Ring capacity in buckets.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets everything.
    pub fn reset(&mut self) {
        self.storage.as_mut().fill(0);
        self.head = 0;
        self.filled = 0;
        self.iters_in_head = 0;
    }

    fn open_bucket(&mut self) {
        if self.iters_in_head >= self.iters_per_bucket {
            self.head = (self.head + 1) % self.capacity;
            self.iters_in_head = 0;
            let len = self.layers * self.experts;
            let start = self.head * len;
            if let Some(b) = self.storage.as_mut().get_mut(start..start + len) {
                b.fill(0);
            }
        }
    }

    fn head_bucket(&mut self) -> &mut [u64] {
        self.open_bucket();
        let len = self.layers * self.experts;
        let start = self.head * len;
        self.storage
            .as_mut()
            .get_mut(start..start + len)
            .unwrap_or(&mut [])
    }

    /// Adds one rank's per-slot counts `[L][S]` (measured on `placement`) into the current bucket.
    pub fn add_rank_slots(
        &mut self,
        placement: &Placement<'_>,
        rank: usize,
        counts: &[u32],
    ) -> Result<(), Error> {
        let shape = *placement.shape();
        self.check_shape(&shape)?;
        if rank >= shape.ranks() {
            return Err(Error::Index {
                what: "rank",
                index: rank,
                bound: shape.ranks(),
            });
        }
        let s = shape.slots_per_rank();
        check_len("slot counts [L][S]", shape.layers() * s, counts.len())?;
        let n = self.experts;
        let bucket = self.head_bucket();
        for ((layer, row_counts), heat) in placement
            .layers()
            .zip(counts.chunks_exact(s))
            .zip(bucket.chunks_exact_mut(n))
        {
            fold_row(layer.rank(rank), row_counts, heat);
        }
        Ok(())
    }

    /// Adds all ranks' per-slot counts `[L][R][S]` (measured on `placement`) into the current
    /// bucket.
    pub fn add_all_slots(
        &mut self,
        placement: &Placement<'_>,
        counts: &[u32],
    ) -> Result<(), Error> {
        let shape = *placement.shape();
        self.check_shape(&shape)?;
        check_len("slot counts [L][R][S]", shape.placement_len(), counts.len())?;
        let n = self.experts;
        let bucket = self.head_bucket();
        for ((layer, layer_counts), heat) in placement
            .layers()
            .zip(counts.chunks_exact(shape.slots_per_layer()))
            .zip(bucket.chunks_exact_mut(n))
        {
            fold_row(layer.as_slice(), layer_counts, heat);
        }
        Ok(())
    }

    /// Adds logical counts `[L][N]` into the current bucket.
    pub fn add_logical(&mut self, counts: &[u64]) -> Result<(), Error> {
        check_len(
            "logical counts [L][N]",
            self.layers * self.experts,
            counts.len(),
        )?;
        let bucket = self.head_bucket();
        for (h, &c) in bucket.iter_mut().zip(counts) {
            *h = h.saturating_add(c);
        }
        Ok(())
    }

    /// Adds logical counts `[L][N]` given as `u32` (one iteration's counts) into the current
    /// bucket.
    pub fn add_logical_u32(&mut self, counts: &[u32]) -> Result<(), Error> {
        check_len(
            "logical counts [L][N]",
            self.layers * self.experts,
            counts.len(),
        )?;
        let bucket = self.head_bucket();
        for (h, &c) in bucket.iter_mut().zip(counts) {
            *h = h.saturating_add(u64::from(c));
        }
        Ok(())
    }

    /// Closes one counted iteration: after `iters_per_bucket` of them the next counts go to a
    /// fresh bucket (the oldest one is overwritten once the ring is full).
    pub fn end_iteration(&mut self) {
        self.open_bucket();
        if self.iters_in_head == 0 {
            self.filled = (self.filled + 1).min(self.capacity);
        }
        self.iters_in_head += 1;
    }

    /// The counts of chronological bucket `i` (0 = oldest held) for `layer`, `[N]`.
    pub fn bucket(&self, i: usize, layer: usize) -> Option<&[u64]> {
        if i >= self.filled || layer >= self.layers {
            return None;
        }
        let idx = (self.head + self.capacity + 1 + i - self.filled) % self.capacity;
        let start = (idx * self.layers + layer) * self.experts;
        self.storage.as_ref().get(start..start + self.experts)
    }

    fn check_shape(&self, shape: &Shape) -> Result<(), Error> {
        check_len("placement layers", self.layers, shape.layers())?;
        check_len("placement experts", self.experts, shape.experts())
    }

    fn check_out(&self, layer: usize, out: usize, len: usize) -> Result<(), Error> {
        if layer >= self.layers {
            return Err(Error::Index {
                what: "layer",
                index: layer,
                bound: self.layers,
            });
        }
        check_len("heat output", len, out)
    }

    /// Sum over the held buckets of `layer`'s counts, as `f64` into `out` (`[N]`).
    pub fn sum(&self, layer: usize, out: &mut [f64]) -> Result<(), Error> {
        self.check_out(layer, out.len(), self.experts)?;
        out.fill(0.0);
        for i in 0..self.filled {
            if let Some(b) = self.bucket(i, layer) {
                for (o, &c) in out.iter_mut().zip(b) {
                    *o += c as f64;
                }
            }
        }
        Ok(())
    }

    /// Sum over the held buckets of every layer, `[L][N]`.
    pub fn sum_all(&self, out: &mut [f64]) -> Result<(), Error> {
        check_len("heat output [L][N]", self.layers * self.experts, out.len())?;
        for (l, o) in out.chunks_exact_mut(self.experts).enumerate() {
            self.sum(l, o)?;
        }
        Ok(())
    }

    /// Writes the buckets of every layer in chronological order, `[T][L][N]` with
    /// `T = self.windows()`, as `f64`.
    pub fn samples(&self, out: &mut [f64]) -> Result<(), Error> {
        check_len(
            "heat samples [T][L][N]",
            self.filled * self.layers * self.experts,
            out.len(),
        )?;
        for (i, o) in out.chunks_exact_mut(self.layers * self.experts).enumerate() {
            for (l, ol) in o.chunks_exact_mut(self.experts).enumerate() {
                if let Some(b) = self.bucket(i, l) {
                    for (x, &c) in ol.iter_mut().zip(b) {
                        *x = c as f64;
                    }
                }
            }
        }
        Ok(())
    }

    /// Per-expert mean over the held buckets of `layer` (0 when empty).
    pub fn mean(&self, layer: usize, out: &mut [f64]) -> Result<(), Error> {
        self.sum(layer, out)?;
        if self.filled > 0 {
            let t = self.filled as f64;
            for o in out.iter_mut() {
                *o /= t;
            }
        }
        Ok(())
    }

    /// Per-expert sample variance over the held buckets of `layer` (`T - 1` denominator, 0 when
    /// `T <= 1`), given the mean from [`Self::mean`].
    pub fn variance(&self, layer: usize, mean: &[f64], out: &mut [f64]) -> Result<(), Error> {
        self.check_out(layer, out.len(), self.experts)?;
        check_len("mean [N]", self.experts, mean.len())?;
        out.fill(0.0);
        if self.filled <= 1 {
            return Ok(());
        }
        for i in 0..self.filled {
            if let Some(b) = self.bucket(i, layer) {
                for ((o, &c), &m) in out.iter_mut().zip(b).zip(mean) {
                    let d = c as f64 - m;
                    *o += d * d;
                }
            }
        }
        let denom = (self.filled - 1) as f64;
        for o in out.iter_mut() {
            *o /= denom;
        }
        Ok(())
    }

    /// Sample covariance matrix `[N][N]` over the held buckets of `layer` (`T - 1` denominator,
    /// all 0 when `T <= 1`), given the mean from [`Self::mean`].
    pub fn covariance(&self, layer: usize, mean: &[f64], out: &mut [f64]) -> Result<(), Error> {
        let n = self.experts;
        self.check_out(layer, out.len(), n * n)?;
        check_len("mean [N]", n, mean.len())?;
        out.fill(0.0);
        if self.filled <= 1 {
            return Ok(());
        }
        for i in 0..self.filled {
            if let Some(b) = self.bucket(i, layer) {
                for ((row, &ci), &mi) in out.chunks_exact_mut(n).zip(b).zip(mean) {
                    let di = ci as f64 - mi;
                    for ((o, &cj), &mj) in row.iter_mut().zip(b).zip(mean) {
                        *o += di * (cj as f64 - mj);
                    }
                }
            }
        }
        let denom = (self.filled - 1) as f64;
        for o in out.iter_mut() {
            *o /= denom;
        }
        Ok(())
    }
}

fn fold_row(ids: &[u16], counts: &[u32], heat: &mut [u64]) {
    for (&e, &c) in ids.iter().zip(counts) {
        if let Some(h) = heat.get_mut(usize::from(e)) {
            *h = h.saturating_add(u64::from(c));
        }
    }
}
