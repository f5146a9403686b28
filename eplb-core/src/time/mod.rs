//! The serving-time model: what a placement costs in milliseconds per iteration, what its moves
//! stall, and whether a changed layer pays for its move (`docs/time-model.md` has the sources of
//! every constant and the validation against published figures).
//!
//! # Inputs
//!
//! One MoE layer is described by its per-slot share of token-expert pairs over a trace window,
//! `w[r][s]` for `R` ranks and `S` slots per rank (any non-negative sum; the model normalises),
//! and by `T`, the tokens of one iteration on one rank ([`Role::default_tokens_per_rank`]). The
//! hardware ([`Hardware`]) and the model ([`ModelSpec`]) are plain numbers; `expert_bytes` is the
//! bytes of one expert's weights and scales (the std side takes it from the runtime's payload
//! table, the core does not recompute it).
//!
//! # Active copies
//!
//! Per iteration the layer routes `T * R * k` pairs (`k` = top-k). A slot with window share
//! `p = w[r][s] / sum(w)` receives on average `lambda = p * T * R * k` pairs per iteration. If the
//! pairs of one iteration arrive independently (Poisson with mean `lambda`), the slot receives at
//! least one with probability `1 - exp(-lambda)` ([`active_probability`]); a rank's expected
//! active copies are the sum over its slots. The window mean is all a trace keeps, and the
//! Poisson limit is exact for many independent tokens each picking an expert with a small
//! probability. It is wrong when routing is bursty (a few requests with long, similar prompts
//! hit the same experts for many iterations: fewer distinct experts per iteration than
//! predicted) or correlated inside a batch (the `k` picks of one token are distinct, and tokens
//! of one sequence pick alike): both make the model over-count active copies at small `lambda`,
//! so it over-states the memory time of a cold rank, never of a saturated one.
//!
//! # Per rank, per layer, per iteration (a roofline)
//!
//! - compute: `c_r = (pairs_r + T * shared) * 6 * H * I / F(dtype)`, with `pairs_r = sum_s
//!   lambda[r][s]`, `6 H I` the FLOPs of one token through one expert (gate, up and down
//!   projections, `2 H I` each) and `F` the chip's dense peak for the compute dtype;
//! - memory: `m_r = (active_r + shared) * expert_bytes / B_hbm` (shared experts are read by
//!   every rank every iteration);
//! - rank time: `max(c_r, m_r) + overhead` (kernel launches, gating, permutation; one constant).
//!
//! The layer waits for its slowest rank: `moe = max_r(rank time) + a2a`.
//!
//! # Dispatch and combine
//!
//! The rank that receives the most pairs sets the all-to-all time. A pair moves `H` activations
//! to its expert (dispatch, [`Dtype::dispatch_bytes`] each) and `H` results back (combine, bf16:
//! [`COMBINE_BYTES`]); the two phases run one after the other, each on one direction of the
//! link: `bytes = pairs_max * H * (dispatch + combine)`. Sources are taken as uniform over the
//! `R` ranks: with `G` ranks per node, the fraction `1/R` comes from the rank itself (free),
//! `(G - 1)/R` over the intra-node link and `(R - G)/R` over the inter-node link; the two links
//! work in parallel, so `a2a = max(bytes * (G-1)/R / B_intra, bytes * (R-G)/R / B_inter)`.
//! Without `ranks_per_node` every rank is on one node (`G = R`). The a2a is added to the rank
//! time, not overlapped: engines that overlap two micro-batches (DeepSeek's) hide part of it,
//! and the model then over-states the layer.
//!
//! # Moves
//!
//! A changed layer's exchange takes the busiest rank's bytes (the larger of what it sends and
//! what it receives) over its link, the inter-node one when the layer's moves cross nodes
//! ([`exchange_ms`]). The runtime launches the exchange before a forward and waits for it after,
//! so it stalls only by the part beyond one iteration, plus one small collective (the per-layer
//! vote): `stall = max(0, exchange - iteration) + collective` ([`layer_stall_ms`]); each cycle
//! adds one more small collective, the digest ([`cycle_overhead_ms`]).
//!
//! # The pay-off gate
//!
//! [`layer_pays`]: a changed layer is moved only when its predicted saving per iteration times
//! the iterations it will serve (the next cycle: heat interval plus algorithm interval) exceeds
//! the stall its exchange adds, strictly (a tie keeps the old placement). Every rank must take
//! the same decision without a new collective, so every input must be agreed: the
//! digest-agreed plan (old and new placement, hence the moves and their bytes), the gathered
//! heat (hence the slot loads and the saving) and the shared configuration (hardware, model,
//! `T`, intervals). No measured local time may enter it. The functions here are deterministic
//! (`f64` arithmetic in a fixed order, `libm` for `exp`), so equal inputs give equal decisions
//! on every rank.
//!
//! **Invariant:** no allocation, no panics on input: every bad number is an
//! [`Error::BadParameter`], [`Error::BadSlotLoad`], [`Error::Length`] or
//! [`Error::ZeroDimension`].

use crate::Error;
use crate::placement::check_len;

pub mod gate;
mod presets;
pub mod step;
#[cfg(test)]
mod step_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod validation;

/// Bytes of one combined element: engines combine expert outputs in bf16.
pub const COMBINE_BYTES: f64 = 2.0;

/// The dtype the expert matmuls run in (the activation side of the quant type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// bf16 / fp16 (unquantised checkpoints).
    Bf16,
    /// int8 activations (W8A8, W8A8-Dynamic, W4A8).
    Int8,
    /// fp8 activations (FP8 checkpoints, MXFP8).
    Fp8,
    /// fp4 (NVFP4, MXFP4) on chips with fp4 units; elsewhere it runs at the 8-bit peak.
    Fp4,
}

impl Dtype {
    /// Bytes of one dispatched activation element: 2 for bf16, 1 otherwise (int8 and fp8 are
    /// dispatched at 8 bits; fp4 checkpoints are assumed to dispatch 8-bit activations too,
    /// as DeepEP and the fused MC2 dispatch do).
    pub const fn dispatch_bytes(self) -> f64 {
        match self {
            Dtype::Bf16 => 2.0,
            Dtype::Int8 | Dtype::Fp8 | Dtype::Fp4 => 1.0,
        }
    }

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Int8 => "int8",
            Dtype::Fp8 => "fp8",
            Dtype::Fp4 => "fp4",
        }
    }
}

/// The quantisation of the MoE expert weights: with the [`ModelSpec`] it sets an expert's
/// bytes (the std side's payload table) and the compute dtype ([`QuantType::compute_dtype`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    /// Unquantised (bf16 / fp16) weights.
    None,
    /// Static W8A8: int8 weights, fp32 per-channel scales.
    W8A8,
    /// Dynamic W8A8: int8 weights, fp32 per-channel scales.
    W8A8Dynamic,
    /// W4A8: int4 weights, fp32 per-channel scales and scale biases.
    W4A8,
    /// MXFP4: fp4 weights, one 8-bit block scale per 32 elements.
    Mxfp4,
    /// MXFP8: fp8 weights, one 8-bit block scale per 32 elements.
    Mxfp8,
    /// W4A8 with MXFP4 weights (not supported by EPLB).
    W4A8Mxfp4,
    /// W4A16 (not supported by EPLB).
    W4A16,
    /// W4A16 with MXFP4 weights (not supported by EPLB).
    W4A16Mxfp4,
}

impl QuantType {
    /// Every quant type, in table order.
    pub const ALL: [QuantType; 9] = [
        QuantType::None,
        QuantType::W8A8,
        QuantType::W8A8Dynamic,
        QuantType::W4A8,
        QuantType::Mxfp4,
        QuantType::Mxfp8,
        QuantType::W4A8Mxfp4,
        QuantType::W4A16,
        QuantType::W4A16Mxfp4,
    ];

    /// `none`, `W8A8`, `W8A8-Dynamic`, `W4A8`, `MXFP4`, `MXFP8`, `W4A8MXFP4`, `W4A16` or
    /// `W4A16MXFP4`.
    pub const fn name(self) -> &'static str {
        match self {
            QuantType::None => "none",
            QuantType::W8A8 => "W8A8",
            QuantType::W8A8Dynamic => "W8A8-Dynamic",
            QuantType::W4A8 => "W4A8",
            QuantType::Mxfp4 => "MXFP4",
            QuantType::Mxfp8 => "MXFP8",
            QuantType::W4A8Mxfp4 => "W4A8MXFP4",
            QuantType::W4A16 => "W4A16",
            QuantType::W4A16Mxfp4 => "W4A16MXFP4",
        }
    }

    /// The quant type named `name` (ASCII case-insensitive, trimmed; `_` counts as `-`, as
    /// in vLLM's `W8A8_DYNAMIC`).
    pub fn from_name(name: &str) -> Option<QuantType> {
        let n = name.trim().as_bytes();
        let same = |a: &[u8], b: &[u8]| {
            a.len() == b.len()
                && a.iter().zip(b).all(|(x, y)| {
                    let x = if *x == b'_' { b'-' } else { *x };
                    x.eq_ignore_ascii_case(y)
                })
        };
        QuantType::ALL
            .into_iter()
            .find(|q| same(n, q.name().as_bytes()))
    }

    /// The dtype the expert matmuls run in, for the time model: the activation side of the
    /// quant type (int8 for the W8A8 and W4A8 families, fp8 for MXFP8, fp4 for MXFP4, bf16 for
    /// unquantised and weight-only types).
    pub const fn compute_dtype(self) -> Dtype {
        match self {
            QuantType::W8A8 | QuantType::W8A8Dynamic | QuantType::W4A8 | QuantType::W4A8Mxfp4 => {
                Dtype::Int8
            }
            QuantType::Mxfp8 => Dtype::Fp8,
            QuantType::Mxfp4 => Dtype::Fp4,
            QuantType::None | QuantType::W4A16 | QuantType::W4A16Mxfp4 => Dtype::Bf16,
        }
    }

    /// The quant type of `model`'s published checkpoint as the catalogue records it: `none`
    /// for an unquantised (bf16) checkpoint, else W8A8, what Ascend deployments of the large
    /// models run ([`ModelSpec::checkpoint_unquantised`]).
    pub const fn checkpoint(model: &ModelSpec) -> QuantType {
        if model.checkpoint_unquantised() {
            QuantType::None
        } else {
            QuantType::W8A8
        }
    }
}

impl core::fmt::Display for QuantType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// One rank's chip (a die on A2 and A3, a device on 950 and NVIDIA): peak rates and latencies.
/// Bandwidths are bytes per second per rank per direction; every field can be overridden.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hardware {
    /// Preset name (lower case).
    pub name: &'static str,
    /// Dense bf16/fp16 peak, FLOP/s.
    pub flops_bf16: f64,
    /// Dense int8/fp8 peak, FLOP/s (OP/s for int8).
    pub flops_8bit: f64,
    /// Dense fp4 peak, FLOP/s; `0.0` when the chip has no fp4 units (fp4 then runs at
    /// [`Hardware::flops_8bit`]).
    pub flops_fp4: f64,
    /// HBM bandwidth, bytes/s.
    pub hbm_bytes_per_s: f64,
    /// Intra-node (scale-up) bandwidth of one rank, one direction, bytes/s.
    pub intra_node_bytes_per_s: f64,
    /// Inter-node (scale-out) bandwidth of one rank, one direction, bytes/s.
    pub inter_node_bytes_per_s: f64,
    /// Fixed time of one MoE layer on one rank beyond the roofline (launches, gating,
    /// permutation), ms.
    pub layer_overhead_ms: f64,
    /// Latency of one small collective over the EP group (the per-layer vote, the per-cycle
    /// digest), ms.
    pub collective_ms: f64,
}

impl Hardware {
    /// Dense peak of `dtype`, FLOP/s.
    pub fn flops(&self, dtype: Dtype) -> f64 {
        match dtype {
            Dtype::Bf16 => self.flops_bf16,
            Dtype::Int8 | Dtype::Fp8 => self.flops_8bit,
            Dtype::Fp4 if self.flops_fp4 > 0.0 => self.flops_fp4,
            Dtype::Fp4 => self.flops_8bit,
        }
    }

    /// Checks every number by the rules of [`crate::settings`]: peaks in `[1e9, 1e18]` FLOP/s
    /// (fp4 may be `0`), bandwidths in `[1e6, 1e15]` bytes/s, times in `[0, 60000]` ms.
    pub fn check(&self) -> Result<(), Error> {
        use crate::settings::{bytes_per_s, duration_ms, flops};
        flops("hardware bf16 peak", self.flops_bf16, false)?;
        flops("hardware 8-bit peak", self.flops_8bit, false)?;
        flops("hardware fp4 peak", self.flops_fp4, true)?;
        bytes_per_s("hardware HBM bandwidth", self.hbm_bytes_per_s)?;
        bytes_per_s("hardware intra-node bandwidth", self.intra_node_bytes_per_s)?;
        bytes_per_s("hardware inter-node bandwidth", self.inter_node_bytes_per_s)?;
        duration_ms("hardware layer overhead", self.layer_overhead_ms)?;
        duration_ms("hardware collective latency", self.collective_ms)?;
        Ok(())
    }
}

/// The MoE shape of a model (the numbers of its `config.json`) and its default compute dtype:
/// one entry of the model catalogue ([`ModelSpec::ALL`], the one table every tool and the
/// runtime read; `docs/time-model.md`'s table is tested against it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelSpec {
    /// Preset name (lower case): the name the command line and `eplb_payoff_gate` take.
    pub name: &'static str,
    /// The model's display name (`DeepSeek-V3/R1`).
    pub label: &'static str,
    /// Other names [`ModelSpec::from_name`] accepts (lower case).
    pub aliases: &'static [&'static str],
    /// Hidden size `H`.
    pub hidden: u32,
    /// Expert intermediate size `I` (`moe_intermediate_size`).
    pub intermediate: u32,
    /// Routed experts `N`.
    pub experts: u16,
    /// Experts per token `k`.
    pub top_k: u16,
    /// MoE layers (all layers minus the dense ones).
    pub moe_layers: u16,
    /// Shared experts per MoE layer (same intermediate size as a routed expert).
    pub shared_experts: u16,
    /// Default compute dtype of the preset's quant type. It also says what the published
    /// checkpoint is: [`Dtype::Bf16`] for an unquantised checkpoint (quant type `none`), else
    /// the dtype of W8A8, which Ascend deployments of the large models run
    /// ([`ModelSpec::checkpoint_unquantised`]).
    pub dtype: Dtype,
}

impl ModelSpec {
    /// Checks that `H`, `I`, `N`, `k` and the layers are at least 1 and `k <= N`.
    pub fn check(&self) -> Result<(), Error> {
        for (what, v) in [
            ("model hidden size", self.hidden),
            ("model expert intermediate size", self.intermediate),
            ("model routed experts", u32::from(self.experts)),
            ("model top-k", u32::from(self.top_k)),
            ("model MoE layers", u32::from(self.moe_layers)),
        ] {
            if v == 0 {
                return Err(Error::ZeroDimension { what });
            }
        }
        if self.top_k > self.experts {
            return Err(Error::BadParameter {
                what: "model top-k",
                requirement: "at most the routed experts",
            });
        }
        Ok(())
    }

    /// Whether the preset's published checkpoint is unquantised (bf16): its experts are then
    /// priced at quant type `none` unless a quant type is given.
    pub const fn checkpoint_unquantised(&self) -> bool {
        matches!(self.dtype, Dtype::Bf16)
    }

    /// FLOPs of one token through one expert: `6 * H * I`.
    pub fn flops_per_pair(&self) -> f64 {
        6.0 * f64::from(self.hidden) * f64::from(self.intermediate)
    }
}

/// The serving role of the ranks: it sets the default tokens per iteration per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Role {
    /// Decode: one token per running request per iteration.
    #[default]
    Decode,
    /// Prefill: prompt tokens.
    Prefill,
}

impl Role {
    /// Both roles.
    pub const ALL: [Role; 2] = [Role::Decode, Role::Prefill];

    /// Default `T`, tokens per iteration per rank: DeepSeek's published per-GPU batches of its
    /// V3/R1 deployment (`deepseek-ai/profile-data`): decode 128 requests per GPU (one token
    /// each without speculative decoding), prefill 16K tokens per GPU. Both sit at or above the
    /// thresholds of vLLM-Ascend's usage notes (decode: at least 128 tokens per die; prefill:
    /// inputs of at least 1024 tokens), i.e. where EPLB is said to pay.
    pub const fn default_tokens_per_rank(self) -> f64 {
        match self {
            Role::Decode => 128.0,
            Role::Prefill => 16384.0,
        }
    }

    /// `decode` or `prefill`.
    pub const fn name(self) -> &'static str {
        match self {
            Role::Decode => "decode",
            Role::Prefill => "prefill",
        }
    }

    /// The role named `name` (ASCII case-insensitive; `d` and `p` too).
    pub fn from_name(name: &str) -> Option<Role> {
        let n = name.trim();
        if n.eq_ignore_ascii_case("decode") || n.eq_ignore_ascii_case("d") {
            Some(Role::Decode)
        } else if n.eq_ignore_ascii_case("prefill") || n.eq_ignore_ascii_case("p") {
            Some(Role::Prefill)
        } else {
            None
        }
    }
}

/// The time of one MoE layer for one iteration.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LayerTime {
    /// Compute time of the slowest rank, ms.
    pub compute_ms: f64,
    /// Weight-read time of the slowest rank, ms.
    pub memory_ms: f64,
    /// Expected active copies (shared experts included) of the slowest rank.
    pub active_copies: f64,
    /// Dispatch plus combine, set by the rank receiving the most pairs, ms.
    pub a2a_ms: f64,
    /// The layer: slowest rank's `max(compute, memory) + overhead`, plus `a2a_ms`, ms.
    pub moe_ms: f64,
    /// The slowest rank (the lowest index on ties).
    pub busiest_rank: u16,
}

/// Everything the model needs besides the slot loads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeModel {
    /// The chip of every rank.
    pub hardware: Hardware,
    /// The model.
    pub model: ModelSpec,
    /// `T`: tokens per iteration per rank.
    pub tokens_per_rank: f64,
    /// Bytes of one expert's weights and scales (`ExpertPayload::total_bytes` on the std side).
    pub expert_bytes: f64,
    /// Ranks per node, when known (it must divide the ranks); `None`: one node.
    pub ranks_per_node: Option<u16>,
}

impl TimeModel {
    /// A model with the role's default `T` and no node split.
    pub fn new(hardware: Hardware, model: ModelSpec, role: Role, expert_bytes: f64) -> Self {
        Self {
            hardware,
            model,
            tokens_per_rank: role.default_tokens_per_rank(),
            expert_bytes,
            ranks_per_node: None,
        }
    }

    /// Checks every number of the hardware, the model, `T` and `expert_bytes`.
    pub fn check(&self) -> Result<(), Error> {
        self.hardware.check()?;
        self.model.check()?;
        crate::settings::tokens_per_rank(self.tokens_per_rank)?;
        non_negative("expert bytes", self.expert_bytes)?;
        if self.ranks_per_node == Some(0) {
            return Err(Error::ZeroDimension {
                what: "ranks per node",
            });
        }
        Ok(())
    }

    /// The time of one layer (index `layer`, used in errors) from its slot loads `[R][S]`.
    pub fn layer_time(
        &self,
        layer: u16,
        ranks: usize,
        slots_per_rank: usize,
        slot_loads: &[f64],
    ) -> Result<LayerTime, Error> {
        self.check()?;
        let len = slots_len(ranks, slots_per_rank)?;
        check_len("slot loads [R][S]", len, slot_loads.len())?;
        let mut total = 0.0;
        for (r, row) in slot_loads.chunks_exact(slots_per_rank).enumerate() {
            for (s, &w) in row.iter().enumerate() {
                if !(w.is_finite() && w >= 0.0) {
                    return Err(Error::BadSlotLoad {
                        layer,
                        rank: clamp_u16(r),
                        slot: clamp_u16(s),
                    });
                }
                total += w;
            }
        }
        if !total.is_finite() {
            return Err(Error::Overflow {
                what: "sum of slot loads",
            });
        }
        let hw = &self.hardware;
        let m = &self.model;
        let rf = ranks as f64;
        let pairs_per_iter = self.tokens_per_rank * rf * f64::from(m.top_k);
        let scale = if total > 0.0 {
            pairs_per_iter / total
        } else {
            0.0
        };
        let shared = f64::from(m.shared_experts);
        let ms_per_pair = m.flops_per_pair() / hw.flops(m.dtype) * 1e3;
        let ms_per_copy = self.expert_bytes / hw.hbm_bytes_per_s * 1e3;
        let mut worst: Option<(f64, LayerTime)> = None;
        let mut max_pairs = 0.0f64;
        for (r, row) in slot_loads.chunks_exact(slots_per_rank).enumerate() {
            let mut pairs = 0.0;
            let mut active = shared;
            for &w in row {
                let lambda = w * scale;
                pairs += lambda;
                active += active_probability(lambda);
            }
            max_pairs = max_pairs.max(pairs);
            let compute_ms = (pairs + self.tokens_per_rank * shared) * ms_per_pair;
            let memory_ms = active * ms_per_copy;
            let t = compute_ms.max(memory_ms) + hw.layer_overhead_ms;
            if worst.is_none_or(|(b, _)| t > b) {
                worst = Some((
                    t,
                    LayerTime {
                        compute_ms,
                        memory_ms,
                        active_copies: active,
                        a2a_ms: 0.0,
                        moe_ms: 0.0,
                        busiest_rank: clamp_u16(r),
                    },
                ));
            }
        }
        let (t, mut out) = worst.unwrap_or_default();
        out.a2a_ms = self.a2a_ms(ranks, max_pairs)?;
        out.moe_ms = t + out.a2a_ms;
        Ok(out)
    }

    /// Dispatch plus combine when the busiest receiver gets `pairs` pairs per iteration, ms.
    pub fn a2a_ms(&self, ranks: usize, pairs: f64) -> Result<f64, Error> {
        if ranks == 0 {
            return Err(Error::ZeroDimension { what: "ranks" });
        }
        non_negative("pairs received", pairs)?;
        let g = match self.ranks_per_node {
            None => ranks,
            Some(0) => {
                return Err(Error::ZeroDimension {
                    what: "ranks per node",
                });
            }
            Some(g) if !ranks.is_multiple_of(usize::from(g)) => {
                return Err(Error::RanksPerNode {
                    ranks_per_node: g,
                    ranks: clamp_u16(ranks),
                });
            }
            Some(g) => usize::from(g),
        };
        let hw = &self.hardware;
        let rf = ranks as f64;
        let bytes = pairs
            * f64::from(self.model.hidden)
            * (self.model.dtype.dispatch_bytes() + COMBINE_BYTES);
        let intra = bytes * (g - 1) as f64 / rf / hw.intra_node_bytes_per_s;
        let inter = bytes * (ranks - g) as f64 / rf / hw.inter_node_bytes_per_s;
        Ok(intra.max(inter) * 1e3)
    }

    /// The MoE time of one iteration: the sum over layers of [`TimeModel::layer_time`], from slot
    /// loads `[L][R][S]`. `per_layer` is empty or holds `L` values, written in layer order.
    pub fn model_time(
        &self,
        ranks: usize,
        slots_per_rank: usize,
        slot_loads: &[f64],
        per_layer: &mut [LayerTime],
    ) -> Result<f64, Error> {
        let layers = slot_layers(ranks, slots_per_rank, slot_loads)?;
        if !per_layer.is_empty() {
            check_len("per-layer times [L]", layers, per_layer.len())?;
        }
        let mut sum = 0.0;
        for (l, w) in slot_loads
            .chunks_exact(slot_loads.len() / layers)
            .enumerate()
        {
            let t = self.layer_time(clamp_u16(l), ranks, slots_per_rank, w)?;
            if let Some(o) = per_layer.get_mut(l) {
                *o = t;
            }
            sum += t.moe_ms;
        }
        Ok(sum)
    }
}

/// Probability that a copy with a mean of `lambda` pairs per iteration receives at least one:
/// `1 - exp(-lambda)` (0 for `lambda <= 0` or NaN, 1 for `+inf`).
pub fn active_probability(lambda: f64) -> f64 {
    if lambda > 0.0 {
        -libm::expm1(-lambda)
    } else {
        0.0
    }
}

/// A layer's exchange time, ms: the busiest rank's bytes (the larger of sent and received)
/// over its intra-node link, or its inter-node link when the layer's moves cross nodes.
pub fn exchange_ms(busiest_bytes: f64, crosses_nodes: bool, hw: &Hardware) -> Result<f64, Error> {
    non_negative("exchange bytes", busiest_bytes)?;
    let bw = if crosses_nodes {
        positive("hardware inter-node bandwidth", hw.inter_node_bytes_per_s)?
    } else {
        positive("hardware intra-node bandwidth", hw.intra_node_bytes_per_s)?
    };
    Ok(busiest_bytes / bw * 1e3)
}

/// The stall a changed layer adds, ms: the exchange beyond one iteration (it runs during a
/// forward) plus one vote: `max(0, exchange - iteration) + collective`.
pub fn layer_stall_ms(exchange_ms: f64, iteration_ms: f64, hw: &Hardware) -> Result<f64, Error> {
    non_negative("exchange time", exchange_ms)?;
    non_negative("iteration time", iteration_ms)?;
    non_negative("hardware collective latency", hw.collective_ms)?;
    Ok((exchange_ms - iteration_ms).max(0.0) + hw.collective_ms)
}

/// The fixed cost of one cycle, ms: one digest collective.
pub fn cycle_overhead_ms(hw: &Hardware) -> f64 {
    hw.collective_ms
}

/// The pay-off gate: a changed layer moves only when `saving_ms_per_iter * iterations >
/// stall_ms` (strictly: a tie does not move; NaN or infinite inputs do not move). Every rank
/// must compute it from agreed inputs only (the digest-agreed plan, the gathered heat, the
/// shared configuration), so all ranks decide alike without a collective.
pub fn layer_pays(saving_ms_per_iter: f64, iterations: u64, stall_ms: f64) -> bool {
    let gain = saving_ms_per_iter * iterations as f64;
    gain.is_finite() && stall_ms.is_finite() && gain > stall_ms
}

/// The number of MoE layers in slot loads `[L][R][S]` (at least one whole layer of `R * S`).
pub(crate) fn slot_layers(
    ranks: usize,
    slots_per_rank: usize,
    slot_loads: &[f64],
) -> Result<usize, Error> {
    let len = slots_len(ranks, slots_per_rank)?;
    if slot_loads.is_empty() || !slot_loads.len().is_multiple_of(len) {
        return Err(Error::Length {
            what: "slot loads [L][R][S]",
            expected: len * (slot_loads.len() / len).max(1),
            got: slot_loads.len(),
        });
    }
    Ok(slot_loads.len() / len)
}

fn slots_len(ranks: usize, slots_per_rank: usize) -> Result<usize, Error> {
    if ranks == 0 {
        return Err(Error::ZeroDimension { what: "ranks" });
    }
    if slots_per_rank == 0 {
        return Err(Error::ZeroDimension {
            what: "slots per rank",
        });
    }
    ranks.checked_mul(slots_per_rank).ok_or(Error::Overflow {
        what: "ranks x slots per rank",
    })
}

fn clamp_u16(v: usize) -> u16 {
    u16::try_from(v).unwrap_or(u16::MAX)
}

fn positive(what: &'static str, v: f64) -> Result<f64, Error> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(Error::BadParameter {
            what,
            requirement: "a finite number > 0",
        })
    }
}

fn non_negative(what: &'static str, v: f64) -> Result<f64, Error> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(Error::BadParameter {
            what,
            requirement: "a finite number >= 0",
        })
    }
}
