//! The whole step: attention, the dense parts, host overhead and the MoE layers as their kernels
//! run (`docs/time-model.md`, "The step model"; the research note
//! `time-model-validation.md` §2, §3 and §6 has the sources).
//!
//! [`TimeModel::layer_time`] is the pay-off gate's compact MoE proxy and stays as it is. A
//! [`StepModel`] prices what a user sees: one iteration (a TPOT in decode, one prefill
//! iteration) on the busiest rank, from
//!
//! - **attention** per layer, data-parallel over the ranks (each rank runs its own requests):
//!   MLA (DeepSeek-V3/R1, Kimi-K2, DeepSeek-V2-Lite) in decode reads the latent KV of each
//!   request's context (`L * (kv_lora + rope) * 2` bytes) and computes
//!   `2 * h_q * s_q * L * (d_k + d_v)` FLOPs (absorbed, FlashMLA); in prefill it computes
//!   `h_q * (d_qk + d_v) * P^2` per prompt (causal). GQA (Qwen3, Mixtral) in decode reads
//!   `L * 2 * h_kv * d * 2` bytes and computes `4 * h_q * s_q * L * d`; in prefill
//!   `2 * h_q * d * P^2`. The larger of compute and memory time is taken;
//! - **the dense parts**: attention projections, shared experts, the dense layers' FFN and the
//!   LM head, each a GEMM priced at the larger of `2 * params * m / (eta_c(m) * F)` and
//!   `params * weight_bytes / (eta_m * B_hbm)`;
//! - **the element-wise kernels** between them (norms, quantisation, rope, the KV-cache write,
//!   SiLU-and-mul, the MoE permutation; [`Arch::elementwise_bytes`]), their bytes streamed at
//!   [`ATTENTION_MEMORY_EFFICIENCY`] of HBM, or the hardware's per-layer launch overhead when
//!   that is larger;
//! - **host overhead**, once per step ([`Topology::host_ms`]);
//! - **routed expert GEMM** per rank: each copy's expected rows `lambda` padded to whole tiles
//!   of [`tile_rows`] (`ceil(lambda / BM)` tiles, a cold copy one tile with probability
//!   `1 - exp(-lambda)`), priced at the efficiency curve `eta_c(m) = 0.7 * m / (m + 128)`,
//!   against one weight read per active copy at `eta_m` of HBM: the larger of the two (the
//!   DeepGEMM measurements reach both their FLOP and byte rates at once). Decode thus follows
//!   the hottest copy and the number of active copies; the busiest rank sets the layer;
//! - **all-to-all**, dispatch and combine, each `t0 + bytes / link` on the busiest endpoint:
//!   the larger of what it sends (its own tokens) and what it receives (its pairs), with
//!   real payloads (dispatch `H + 4 H / 128 + 16` bytes for 8-bit activations with their
//!   scales and metadata, `2 H + 16` in bf16; combine `2 H`). Decode uses DeepEP's
//!   low-latency kernels: one message per (token, expert) pair, the remote share over the
//!   scale-out link and the rest over the scale-up link, in parallel. Prefill uses the normal
//!   kernels: a token crosses to each *distinct destination node* once (node-limited routing,
//!   at most [`Arch::node_limit`] nodes) and is forwarded inside the node once per *distinct
//!   destination GPU*; each copy is reached independently with probability
//!   `lambda / tokens`, so a node's distinct tokens saturate under skew. The latency `t0`
//!   is paid once per phase and per micro-batch and never scaled by the skew;
//! - **overlap**: `none` adds compute and communication; `two-batch` runs two micro-batches so
//!   that a layer costs the larger of its compute path and its communication path (each
//!   micro-batch pays its own `t0` and reads the weights again); in prefill the compute runs
//!   on the SMs the normal kernels leave ([`Topology::comm_sm_share`]);
//! - **Ascend MC2** ([`Topology::fused_mc2`]): `MoeDistributeDispatch/Combine` fuse the
//!   quantisation, the transfer and the grouped matmul, so the transfer of one tile overlaps
//!   the GEMM of the previous one: the routed part of a layer costs `t0 + max(gemm, transfer)`
//!   instead of `t0 + gemm + transfer`.
//!
//! The busiest rank's figures add up per layer. Every term is multiplied by one free constant
//! of a [`Calibration`] (all `1.0` for the presets), which is what `eplb calibrate` fits.
//!
//! **Invariant:** no allocation, no panic on input; every bad number is an [`Error`].

use super::{
    COMBINE_BYTES, Dtype, Hardware, ModelSpec, Role, TimeModel, active_probability, clamp_u16,
    non_negative, positive, slots_len,
};
use crate::Error;
use crate::placement::check_len;

/// GEMM compute efficiency at `m` rows: `0.7 * m / (m + 128)`. Fitted to DeepGEMM's H800 FP8
/// table (grouped masked M 256: 932 TFLOPS = 0.47 of peak; M 512: 0.53; M 1024: 0.62;
/// contiguous M 4096: 0.61-0.68). These figures are *tuning* figures, not validation.
pub fn gemm_efficiency(m: f64) -> f64 {
    if m > 0.0 { 0.7 * m / (m + 128.0) } else { 0.0 }
}

/// Share of HBM bandwidth a weight-streaming GEMM reaches (DeepGEMM small-M: 1.7-2.7 of
/// 3.35 TB/s; tuning figure).
pub const WEIGHT_READ_EFFICIENCY: f64 = 0.65;
/// Share of HBM bandwidth the decode attention kernel reaches (FlashMLA: 3.0 of 3.35 TB/s).
pub const ATTENTION_MEMORY_EFFICIENCY: f64 = 0.9;
/// Share of the bf16 peak the attention kernel reaches (FlashMLA: 660 of 989 TFLOPS).
pub const ATTENTION_COMPUTE_EFFICIENCY: f64 = 0.66;

/// Rows of one GEMM tile: 64 in decode (DeepGEMM's masked layout after the low-latency
/// dispatch), 128 in prefill (the contiguous layout's alignment).
pub const fn tile_rows(role: Role) -> f64 {
    match role {
        Role::Decode => 64.0,
        Role::Prefill => 128.0,
    }
}

/// How the attention of a model is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Attention {
    /// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2).
    Mla {
        /// Query heads `h_q`.
        q_heads: u16,
        /// Latent KV rank (`kv_lora_rank`).
        kv_lora: u16,
        /// Decoupled rope dims (`qk_rope_head_dim`).
        rope: u16,
        /// `qk_nope_head_dim`.
        qk_nope: u16,
        /// `v_head_dim`.
        v_head: u16,
        /// `q_lora_rank` (0: no query compression).
        q_lora: u16,
    },
    /// Grouped-query attention (Qwen3, Mixtral).
    Gqa {
        /// Query heads.
        q_heads: u16,
        /// KV heads.
        kv_heads: u16,
        /// Head dim.
        head_dim: u16,
    },
}

/// What a model has beside its MoE layers (the numbers of its `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arch {
    /// The attention.
    pub attention: Attention,
    /// Decoder layers in all (MoE and dense).
    pub layers: u16,
    /// FFN intermediate size of the dense layers (0 when every layer is MoE).
    pub dense_intermediate: u32,
    /// Vocabulary (the LM head).
    pub vocab: u32,
    /// At most this many nodes per token (DeepSeek's node-limited routing, `topk_group`); 0:
    /// no limit.
    pub node_limit: u16,
}

impl Arch {
    /// The architecture of a model preset (by name); a custom model gets a GQA attention with
    /// `H / 128` query heads, 8 KV heads of 128 dims and no dense layer.
    pub fn for_model(m: &ModelSpec) -> Arch {
        const fn mla(q_heads: u16, q_lora: u16) -> Attention {
            Attention::Mla {
                q_heads,
                kv_lora: 512,
                rope: 64,
                qk_nope: 128,
                v_head: 128,
                q_lora,
            }
        }
        match m.name {
            "deepseek-v3" => Arch {
                attention: mla(128, 1536),
                layers: 61,
                dense_intermediate: 18432,
                vocab: 129_280,
                node_limit: 4,
            },
            "kimi-k2" => Arch {
                attention: mla(64, 1536),
                layers: 61,
                dense_intermediate: 18432,
                vocab: 163_840,
                node_limit: 0,
            },
            "deepseek-v2-lite" => Arch {
                attention: mla(16, 0),
                layers: 27,
                dense_intermediate: 10944,
                vocab: 102_400,
                node_limit: 0,
            },
            "qwen3-235b" => Arch {
                attention: Attention::Gqa {
                    q_heads: 64,
                    kv_heads: 4,
                    head_dim: 128,
                },
                layers: 94,
                dense_intermediate: 0,
                vocab: 151_936,
                node_limit: 0,
            },
            "qwen3-30b" => Arch {
                attention: Attention::Gqa {
                    q_heads: 32,
                    kv_heads: 4,
                    head_dim: 128,
                },
                layers: 48,
                dense_intermediate: 0,
                vocab: 151_936,
                node_limit: 0,
            },
            "mixtral-8x7b" => Arch {
                attention: Attention::Gqa {
                    q_heads: 32,
                    kv_heads: 8,
                    head_dim: 128,
                },
                layers: 32,
                dense_intermediate: 0,
                vocab: 32_000,
                node_limit: 0,
            },
            _ => Arch {
                attention: Attention::Gqa {
                    q_heads: u16::try_from((m.hidden / 128).max(1)).unwrap_or(u16::MAX),
                    kv_heads: 8,
                    head_dim: 128,
                },
                layers: m.moe_layers,
                dense_intermediate: 0,
                vocab: 32_000,
                node_limit: 0,
            },
        }
    }

    /// Weights of one layer's attention projections (parameters).
    pub fn attention_params(&self, hidden: u32) -> f64 {
        let h = f64::from(hidden);
        match self.attention {
            Attention::Mla {
                q_heads,
                kv_lora,
                rope,
                qk_nope,
                v_head,
                q_lora,
            } => {
                let (hq, kv, r, n, v, ql) = (
                    f64::from(q_heads),
                    f64::from(kv_lora),
                    f64::from(rope),
                    f64::from(qk_nope),
                    f64::from(v_head),
                    f64::from(q_lora),
                );
                let q = if q_lora > 0 {
                    h * ql + ql * hq * (n + r)
                } else {
                    h * hq * (n + r)
                };
                q + h * (kv + r) + kv * hq * (n + v) + hq * v * h
            }
            Attention::Gqa {
                q_heads,
                kv_heads,
                head_dim,
            } => {
                let (hq, hk, d) = (f64::from(q_heads), f64::from(kv_heads), f64::from(head_dim));
                h * (hq + 2.0 * hk) * d + hq * d * h
            }
        }
    }

    /// `(FLOPs, bytes)` of one decode attention over `requests` requests of mean context
    /// `context` with `s_q` query tokens each.
    pub fn decode_attention(&self, requests: f64, context: f64, s_q: f64) -> (f64, f64) {
        match self.attention {
            Attention::Mla {
                q_heads,
                kv_lora,
                rope,
                ..
            } => {
                let dk = f64::from(kv_lora) + f64::from(rope);
                let dv = f64::from(kv_lora);
                (
                    requests * 2.0 * f64::from(q_heads) * s_q * context * (dk + dv),
                    requests * context * dk * 2.0,
                )
            }
            Attention::Gqa {
                q_heads,
                kv_heads,
                head_dim,
            } => {
                let d = f64::from(head_dim);
                (
                    requests * 4.0 * f64::from(q_heads) * s_q * context * d,
                    requests * context * 2.0 * f64::from(kv_heads) * d * 2.0,
                )
            }
        }
    }

    /// Bytes the memory-bound element-wise kernels of one layer move per token `(MoE layer,
    /// dense layer)`: what runs between the GEMMs and the attention kernel and is priced by
    /// neither. Counted from the operators (bf16 activations, `w` bytes per quantised element):
    ///
    /// - two fused residual-add RMSNorms over `H` (read input and residual, write both): `16 H`;
    /// - quantising the attention's and the MLP's `H`-wide inputs (read `2`, write `w` per
    ///   element; none in bf16): `2 (2 + w) H`; the router's input read: `2 H` (MoE layers);
    /// - attention: rope on the query and key (read and write `(h_q + 1) d_rope` or
    ///   `(h_q + h_kv) d`), the KV-cache write, the output projection's input quantisation
    ///   and, in MLA prefill (not absorbed), the assembly of each head's key from its
    ///   no-rope part and the shared rope part (read `h_q d_nope`, write `h_q (d_nope + d_rope)`);
    /// - SiLU-and-mul (with the down projection's quantisation) per expert row, routed and
    ///   shared: read `2 I` and write `I` elements: `(4 + w) I` bytes;
    /// - prefill only (the normal kernels receive tokens in arrival order): the permutation
    ///   into the grouped GEMM's per-expert layout (read and write the dispatched payload per
    ///   pair) and the weighted un-permutation before the combine (read and write `2 H` per
    ///   pair); decode's low-latency kernels write and read the per-expert layout directly;
    /// - adding the shared expert's output: `6 H`.
    ///
    /// The dense layers' FFN runs its SiLU-and-mul on `dense_intermediate`.
    pub fn elementwise_bytes(&self, m: &ModelSpec, role: Role) -> (f64, f64) {
        let h = f64::from(m.hidden);
        let w = dtype_weight_bytes(m.dtype);
        let quant = |d: f64| {
            if m.dtype == Dtype::Bf16 {
                0.0
            } else {
                (2.0 + w) * d
            }
        };
        let act = if m.dtype == Dtype::Bf16 { 2.0 } else { w };
        let glu = |i: f64| (4.0 + act) * i;
        let attention = match self.attention {
            Attention::Mla {
                q_heads,
                kv_lora,
                rope,
                qk_nope,
                v_head,
                ..
            } => {
                let (hq, r, n) = (f64::from(q_heads), f64::from(rope), f64::from(qk_nope));
                let assembly = match role {
                    Role::Prefill => 2.0 * (hq * n + r) + 2.0 * hq * (n + r),
                    Role::Decode => 0.0,
                };
                4.0 * (hq + 1.0) * r
                    + 2.0 * (f64::from(kv_lora) + r)
                    + assembly
                    + quant(hq * f64::from(v_head))
            }
            Attention::Gqa {
                q_heads,
                kv_heads,
                head_dim,
            } => {
                let (hq, hk, d) = (f64::from(q_heads), f64::from(kv_heads), f64::from(head_dim));
                4.0 * (hq + hk) * d + 4.0 * hk * d + quant(hq * d)
            }
        };
        let common = 16.0 * h + 2.0 * quant(h) + attention;
        let k = f64::from(m.top_k);
        let shared = f64::from(m.shared_experts);
        let routing = match role {
            Role::Prefill => k * (2.0 * dispatch_payload(m.hidden, m.dtype) + 4.0 * h),
            Role::Decode => 0.0,
        };
        let shared_add = if shared > 0.0 { 6.0 * h } else { 0.0 };
        let moe =
            common + 2.0 * h + glu(f64::from(m.intermediate)) * (k + shared) + routing + shared_add;
        let dense = common + glu(f64::from(self.dense_intermediate));
        (moe, dense)
    }

    /// FLOPs of one causal prefill attention over `requests` prompts of `prompt` tokens.
    pub fn prefill_attention_flops(&self, requests: f64, prompt: f64) -> f64 {
        let l2 = prompt * prompt;
        match self.attention {
            Attention::Mla {
                q_heads,
                rope,
                qk_nope,
                v_head,
                ..
            } => {
                requests
                    * f64::from(q_heads)
                    * (f64::from(qk_nope) + f64::from(rope) + f64::from(v_head))
                    * l2
            }
            Attention::Gqa {
                q_heads, head_dim, ..
            } => requests * 2.0 * f64::from(q_heads) * f64::from(head_dim) * l2,
        }
    }
}

/// Where the ranks sit and how fast they reach each other, beside the links of [`Hardware`]
/// (`intra_node_bytes_per_s` inside a node, `inter_node_bytes_per_s` out of the scale-up
/// domain): one set of links for the time model and the weight-move cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Topology {
    /// Ranks per node (the scale-up island a token is forwarded within).
    pub ranks_per_node: u16,
    /// Ranks in one scale-up domain (8 for an HGX node, 72 for GB200 NVL72, 768 dies for an
    /// Ascend A3 SuperPoD's UB domain). Nodes inside one domain reach each other over
    /// [`Topology::domain_bytes_per_s`], beyond it over the scale-out link.
    pub domain_ranks: u16,
    /// Per-rank, per-direction bandwidth between nodes of one scale-up domain, bytes/s.
    pub domain_bytes_per_s: f64,
    /// Share of the scale-up link bandwidth an all-to-all reaches (AIC's DeepEP fit: 634-777
    /// of 900 GB/s on GB200; DeepEP 153-158 of 200 GB/s on H800).
    pub link_efficiency: f64,
    /// Fixed latency of one all-to-all phase inside a node, ms.
    pub a2a_latency_intra_ms: f64,
    /// Fixed latency of one all-to-all phase across nodes, ms.
    pub a2a_latency_inter_ms: f64,
    /// Host overhead of one step (scheduling, sampling, launches not captured by a graph), ms.
    pub host_ms: f64,
    /// Dispatch and combine are Ascend's fused MC2 operators.
    pub fused_mc2: bool,
    /// Share of the streaming multiprocessors the prefill all-to-all kernels hold while they
    /// run beside the compute of the other micro-batch ([`Overlap::TwoBatch`]): DeepEP's normal
    /// kernels run on a fixed SM budget (24 of an H800's 132 SMs in SGLang's deployment,
    /// `DEEPEP_NUM_SMS=24`; the DeepSeek-V3 report dedicates 20), so the overlapped compute
    /// gets `1 - share` of the GPU. The low-latency (decode) kernels receive through a hook and
    /// hold no SMs; fused MC2 runs in the same operator. 0: no contention.
    pub comm_sm_share: f64,
}

impl Topology {
    /// The topology of a hardware preset (by name); unknown names get an NVIDIA-like HGX node.
    pub fn for_hardware(hw: &Hardware) -> Topology {
        let hgx = Topology {
            ranks_per_node: 8,
            domain_ranks: 8,
            domain_bytes_per_s: hw.inter_node_bytes_per_s,
            link_efficiency: 0.75,
            a2a_latency_intra_ms: 0.015,
            a2a_latency_inter_ms: 0.030,
            host_ms: 1.5,
            fused_mc2: false,
            comm_sm_share: 24.0 / 132.0,
        };
        let ascend = Topology {
            link_efficiency: 0.6,
            a2a_latency_intra_ms: 0.02,
            a2a_latency_inter_ms: 0.04,
            host_ms: 2.0,
            fused_mc2: true,
            comm_sm_share: 0.0,
            ..hgx
        };
        match hw.name {
            "gb200" => Topology {
                domain_ranks: 72,
                ranks_per_node: 72,
                domain_bytes_per_s: hw.intra_node_bytes_per_s,
                // Blackwell: 148 SMs.
                comm_sm_share: 24.0 / 148.0,
                ..hgx
            },
            "a3" => Topology {
                ranks_per_node: 16,
                domain_ranks: 768,
                domain_bytes_per_s: hw.intra_node_bytes_per_s,
                ..ascend
            },
            "a2" | "950pr" | "950dt" => ascend,
            "b200" => Topology {
                comm_sm_share: 24.0 / 148.0,
                ..hgx
            },
            _ => hgx,
        }
    }

    /// Checks every number.
    pub fn check(&self) -> Result<(), Error> {
        if self.ranks_per_node == 0 {
            return Err(Error::ZeroDimension {
                what: "ranks per node",
            });
        }
        if self.domain_ranks == 0 {
            return Err(Error::ZeroDimension {
                what: "scale-up domain ranks",
            });
        }
        crate::settings::bytes_per_s("scale-up domain bandwidth", self.domain_bytes_per_s)?;
        positive("link efficiency", self.link_efficiency)?;
        if self.link_efficiency > 1.0 {
            return Err(Error::BadParameter {
                what: "link efficiency",
                requirement: "at most 1",
            });
        }
        crate::settings::duration_ms(
            "all-to-all latency inside a node",
            self.a2a_latency_intra_ms,
        )?;
        crate::settings::duration_ms("all-to-all latency across nodes", self.a2a_latency_inter_ms)?;
        crate::settings::duration_ms("host overhead", self.host_ms)?;
        non_negative("communication SM share", self.comm_sm_share)?;
        if self.comm_sm_share >= 1.0 {
            return Err(Error::BadParameter {
                what: "communication SM share",
                requirement: "below 1",
            });
        }
        Ok(())
    }
}

/// Overlap of computation and communication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Overlap {
    /// One batch: compute and all-to-all add up.
    #[default]
    None,
    /// Two micro-batches (SGLang TBO, vLLM DBO, DeepSeek): a layer costs the larger of its
    /// compute path and its communication path.
    TwoBatch,
}

impl Overlap {
    /// `none` or `two-batch`.
    pub const fn name(self) -> &'static str {
        match self {
            Overlap::None => "none",
            Overlap::TwoBatch => "two-batch",
        }
    }

    /// The mode named `name` (`none`, `two-batch`; `tbo` and `dbo` too).
    pub fn from_name(name: &str) -> Option<Overlap> {
        let n = name.trim();
        if n.eq_ignore_ascii_case("none") {
            Some(Overlap::None)
        } else if ["two-batch", "tbo", "dbo", "two_batch"]
            .iter()
            .any(|k| n.eq_ignore_ascii_case(k))
        {
            Some(Overlap::TwoBatch)
        } else {
            None
        }
    }

    fn micro_batches(self) -> f64 {
        match self {
            Overlap::None => 1.0,
            Overlap::TwoBatch => 2.0,
        }
    }
}

/// The model's free constants: one multiplier per term (1.0 = the presets). `eplb calibrate`
/// fits them by non-negative least squares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// Host overhead per step.
    pub host: f64,
    /// Attention and the dense parts (the backbone EPLB cannot change).
    pub backbone: f64,
    /// Routed expert GEMM (the inverse of a GEMM efficiency).
    pub gemm: f64,
    /// All-to-all bandwidth term (the inverse of a link bandwidth).
    pub link: f64,
    /// All-to-all fixed latency.
    pub latency: f64,
}

impl Default for Calibration {
    fn default() -> Self {
        Self::PRESET
    }
}

impl Calibration {
    /// Every multiplier 1.
    pub const PRESET: Calibration = Calibration {
        host: 1.0,
        backbone: 1.0,
        gemm: 1.0,
        link: 1.0,
        latency: 1.0,
    };
    /// The names of the constants, in [`Calibration::as_array`] order.
    pub const NAMES: [&'static str; 5] = ["host", "backbone", "gemm", "link", "latency"];

    /// The multipliers in [`Calibration::NAMES`] order.
    pub const fn as_array(&self) -> [f64; 5] {
        [self.host, self.backbone, self.gemm, self.link, self.latency]
    }

    /// From multipliers in [`Calibration::NAMES`] order.
    pub const fn from_array(a: [f64; 5]) -> Calibration {
        Calibration {
            host: a[0],
            backbone: a[1],
            gemm: a[2],
            link: a[3],
            latency: a[4],
        }
    }

    /// Every multiplier finite and `>= 0`.
    pub fn check(&self) -> Result<(), Error> {
        for v in self.as_array() {
            non_negative("calibration multiplier", v)?;
        }
        Ok(())
    }

    /// The band of the model's uncertainty around `self`: `(fast, slow)` multipliers. Without
    /// calibration (`calibrated == false`) the box is a2a bandwidth +-30 %, latency x[0.5, 2],
    /// GEMM efficiency +-30 %, backbone +-25 %, host x[0.5, 2] (research note §5); with a
    /// calibration every term is known to +-10 %.
    pub fn band(&self, calibrated: bool) -> (Calibration, Calibration) {
        let (lo, hi) = if calibrated {
            ([0.9; 5], [1.1; 5])
        } else {
            (
                [0.5, 0.75, 1.0 / 1.3, 1.0 / 1.3, 0.5],
                [2.0, 1.25, 1.0 / 0.7, 1.0 / 0.7, 2.0],
            )
        };
        let a = self.as_array();
        let mut f = [0.0; 5];
        let mut s = [0.0; 5];
        for ((((f, s), a), lo), hi) in f.iter_mut().zip(&mut s).zip(a).zip(lo).zip(hi) {
            *f = a * lo;
            *s = a * hi;
        }
        (Calibration::from_array(f), Calibration::from_array(s))
    }
}

/// The raw (uncalibrated) terms of one MoE layer on its busiest rank, all micro-batches.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MoeTerms {
    /// Routed expert GEMM of the busiest rank, ms.
    pub gemm_ms: f64,
    /// All-to-all bandwidth time (dispatch plus combine, busiest endpoint), ms.
    pub a2a_bw_ms: f64,
    /// All-to-all fixed latency (every phase of every micro-batch), ms.
    pub a2a_latency_ms: f64,
    /// The rank with the largest GEMM (lowest index on ties).
    pub busiest_rank: u16,
    /// Its expected active copies (one micro-batch).
    pub active_copies: f64,
}

/// The raw terms of the backbone: what does not depend on the placement.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BackboneTerms {
    /// Attention of one layer (every layer has one), ms.
    pub attention_ms: f64,
    /// Projections, shared experts and the element-wise kernels (at least the launch
    /// overhead) of one MoE layer, ms.
    pub moe_layer_other_ms: f64,
    /// Of it, the element-wise kernels or their launch floor, whichever is larger, ms.
    pub moe_layer_elementwise_ms: f64,
    /// Everything of one dense layer but its attention (projections, FFN, overhead), ms.
    pub dense_layer_other_ms: f64,
    /// LM head, once per step, ms.
    pub head_ms: f64,
    /// Host overhead, once per step, ms.
    pub host_ms: f64,
}

/// One step, priced.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepTime {
    /// The step (TPOT in decode, one iteration in prefill), ms.
    pub iteration_ms: f64,
    /// Routed GEMM plus all-to-all of every MoE layer (before any overlap), ms.
    pub moe_ms: f64,
    /// Routed GEMM alone, ms.
    pub gemm_ms: f64,
    /// Attention of every layer, ms.
    pub attention_ms: f64,
    /// All-to-all of every MoE layer (latency included, before any overlap), ms.
    pub a2a_ms: f64,
    /// Of it, fixed latency, ms.
    pub a2a_latency_ms: f64,
    /// Projections, shared experts, dense FFN, LM head, launches and host overhead, ms.
    pub other_ms: f64,
    /// Time the overlap hid: `moe + attention + other - iteration` (0 without overlap), ms.
    pub hidden_ms: f64,
}

impl StepTime {
    fn add_layer(&mut self, layer: LayerStep) {
        self.iteration_ms += layer.total;
        self.gemm_ms += layer.gemm;
        self.a2a_ms += layer.a2a;
        self.a2a_latency_ms += layer.latency;
        self.attention_ms += layer.attention;
        self.other_ms += layer.other;
    }

    fn finish(&mut self) {
        self.moe_ms = self.gemm_ms + self.a2a_ms;
        let parts = self.moe_ms + self.attention_ms + self.other_ms;
        self.hidden_ms = (parts - self.iteration_ms).max(0.0);
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct LayerStep {
    total: f64,
    gemm: f64,
    a2a: f64,
    latency: f64,
    attention: f64,
    other: f64,
}

/// What the busiest endpoints of one micro-batch's all-to-all receive.
#[derive(Debug, Clone, Copy, Default)]
struct A2aLoad {
    /// (token, expert) pairs of the busiest rank (the low-latency kernels' messages).
    pairs_max: f64,
    /// Share of all tokens that reach the busiest rank (any of its copies): the normal
    /// kernels' scale-up messages.
    rank_reach_max: f64,
    /// Share of all tokens that reach the busiest node.
    node_reach_max: f64,
    /// Distinct nodes one token reaches, on average.
    nodes_per_token: f64,
}

/// The whole-step model: the MoE model of a [`TimeModel`] plus the architecture, the
/// topology, the request shape, the overlap mode and a calibration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepModel {
    /// Hardware, MoE shape, tokens per rank `T`, expert bytes; its `ranks_per_node`, when set,
    /// overrides [`Topology::ranks_per_node`].
    pub time: TimeModel,
    /// The rest of the model.
    pub arch: Arch,
    /// Where the ranks sit.
    pub topology: Topology,
    /// Decode or prefill.
    pub role: Role,
    /// Requests per rank per step `B`.
    pub requests_per_rank: f64,
    /// Mean context of a decode request (KV tokens read), tokens.
    pub context_tokens: f64,
    /// Prompt length of a prefill request, tokens.
    pub prompt_tokens: f64,
    /// Tokens per request per step in decode (1, or 1 + MTP drafts).
    pub tokens_per_request: f64,
    /// Overlap mode.
    pub overlap: Overlap,
    /// The free constants.
    pub calibration: Calibration,
}

/// Documented defaults per role: decode 4096 context tokens, 1 token per request per step
/// (requests = `T`); prefill prompts of 4096 tokens (requests = `T / 4096`).
pub const DEFAULT_CONTEXT_TOKENS: f64 = 4096.0;
/// Default prefill prompt length, tokens.
pub const DEFAULT_PROMPT_TOKENS: f64 = 4096.0;

fn dtype_weight_bytes(d: Dtype) -> f64 {
    match d {
        Dtype::Bf16 => 2.0,
        Dtype::Int8 | Dtype::Fp8 => 1.0,
        Dtype::Fp4 => 0.5,
    }
}

/// Bytes one token dispatches to one destination: `H + 4 H / 128 + 16` for 8-bit activations
/// (fp8/int8 with per-128 scales and metadata), `2 H + 16` in bf16.
pub fn dispatch_payload(hidden: u32, dtype: Dtype) -> f64 {
    let h = f64::from(hidden);
    match dtype {
        Dtype::Bf16 => 2.0 * h + 16.0,
        _ => h + 4.0 * h / 128.0 + 16.0,
    }
}

/// Bytes one token combines from one source: `2 H` (bf16).
pub fn combine_payload(hidden: u32) -> f64 {
    COMBINE_BYTES * f64::from(hidden)
}

impl StepModel {
    /// The step model of `time` for `role` on the hardware preset's topology with the role's
    /// defaults: decode `B = T` requests of [`DEFAULT_CONTEXT_TOKENS`], one token each;
    /// prefill prompts of [`DEFAULT_PROMPT_TOKENS`], `B = T / P`; no overlap; no calibration.
    pub fn new(time: TimeModel, role: Role) -> StepModel {
        let mut s = StepModel {
            time,
            arch: Arch::for_model(&time.model),
            topology: Topology::for_hardware(&time.hardware),
            role,
            requests_per_rank: 0.0,
            context_tokens: DEFAULT_CONTEXT_TOKENS,
            prompt_tokens: DEFAULT_PROMPT_TOKENS,
            tokens_per_request: 1.0,
            overlap: Overlap::None,
            calibration: Calibration::PRESET,
        };
        s.requests_per_rank = s.default_requests();
        s
    }

    /// Requests per rank implied by `T` and the request shape: `T / s_q` in decode, `T / P`
    /// in prefill.
    pub fn default_requests(&self) -> f64 {
        match self.role {
            Role::Decode => self.time.tokens_per_rank / self.tokens_per_request.max(1e-9),
            Role::Prefill => self.time.tokens_per_rank / self.prompt_tokens.max(1e-9),
        }
    }

    /// Checks every number.
    pub fn check(&self) -> Result<(), Error> {
        self.time.check()?;
        self.topology.check()?;
        self.calibration.check()?;
        if self.arch.layers < self.time.model.moe_layers {
            return Err(Error::BadParameter {
                what: "model layers",
                requirement: "at least the MoE layers",
            });
        }
        positive("requests per rank", self.requests_per_rank)?;
        non_negative("context tokens", self.context_tokens)?;
        positive("prompt tokens", self.prompt_tokens)?;
        positive("tokens per request", self.tokens_per_request)?;
        Ok(())
    }

    /// Ranks per node for `ranks` ranks: the model's `ranks_per_node` when set, else the
    /// topology's, at most `ranks`.
    pub fn node_ranks(&self, ranks: usize) -> usize {
        let g = self
            .time
            .ranks_per_node
            .unwrap_or(self.topology.ranks_per_node)
            .max(1);
        usize::from(g).min(ranks.max(1))
    }

    /// The link between nodes for an EP group of `ranks`: the scale-up domain's when the group
    /// fits in one domain, else the scale-out link, bytes/s.
    pub fn inter_node_bytes_per_s(&self, ranks: usize) -> f64 {
        if ranks <= usize::from(self.topology.domain_ranks) {
            self.topology.domain_bytes_per_s * self.topology.link_efficiency
        } else {
            self.time.hardware.inter_node_bytes_per_s
        }
    }

    /// A layer's weight exchange, ms: the busiest rank's bytes over the node's link, or the
    /// link between nodes (the same links as the all-to-all) when its moves cross nodes.
    pub fn exchange_ms(&self, busiest_bytes: f64, crosses_nodes: bool, ranks: usize) -> f64 {
        let bw = if crosses_nodes {
            self.inter_node_bytes_per_s(ranks)
        } else {
            self.time.hardware.intra_node_bytes_per_s
        };
        if busiest_bytes > 0.0 && bw > 0.0 {
            busiest_bytes / bw * 1e3
        } else {
            0.0
        }
    }

    /// A dense GEMM of `params` weights over `m` rows, ms: the larger of
    /// `2 * params * m / (eta_c(m) * F)` and `params * weight_bytes / (eta_m * B_hbm)`.
    pub fn gemm_ms_of(&self, params: f64, m: f64) -> f64 {
        self.gemm_ms(params, m)
    }

    fn gemm_ms(&self, params: f64, m: f64) -> f64 {
        let hw = &self.time.hardware;
        let d = self.time.model.dtype;
        if params <= 0.0 || m <= 0.0 {
            return 0.0;
        }
        let compute = 2.0 * params * m / (gemm_efficiency(m) * hw.flops(d));
        let memory = params * dtype_weight_bytes(d) / (WEIGHT_READ_EFFICIENCY * hw.hbm_bytes_per_s);
        compute.max(memory) * 1e3
    }

    /// The backbone's raw terms for this model on `ranks` ranks.
    pub fn backbone(&self) -> Result<BackboneTerms, Error> {
        self.check()?;
        let hw = &self.time.hardware;
        let m = &self.time.model;
        let mb = self.overlap.micro_batches();
        let t = self.time.tokens_per_rank / mb;
        let b = self.requests_per_rank / mb;
        let attention = match self.role {
            Role::Decode => {
                let (f, by) =
                    self.arch
                        .decode_attention(b, self.context_tokens, self.tokens_per_request);
                (f / (ATTENTION_COMPUTE_EFFICIENCY * hw.flops_bf16))
                    .max(by / (ATTENTION_MEMORY_EFFICIENCY * hw.hbm_bytes_per_s))
            }
            Role::Prefill => {
                self.arch.prefill_attention_flops(b, self.prompt_tokens)
                    / (ATTENTION_COMPUTE_EFFICIENCY * hw.flops_bf16)
            }
        } * 1e3
            * mb;
        let h = f64::from(m.hidden);
        let proj = self.gemm_ms(self.arch.attention_params(m.hidden), t) * mb;
        let shared = self.gemm_ms(
            3.0 * h * f64::from(m.intermediate) * f64::from(m.shared_experts),
            t,
        ) * mb;
        let dense = self.gemm_ms(3.0 * h * f64::from(self.arch.dense_intermediate), t) * mb;
        let head_rows = match self.role {
            Role::Decode => self.time.tokens_per_rank,
            Role::Prefill => self.requests_per_rank,
        };
        let head = self.gemm_ms(h * f64::from(self.arch.vocab), head_rows);
        // The element-wise kernels stream their bytes at the attention kernel's share of HBM,
        // or cost the launch floor when they are too small to fill it.
        let (moe_bytes, dense_bytes) = self.arch.elementwise_bytes(m, self.role);
        let stream = |bytes: f64| {
            (bytes * self.time.tokens_per_rank / (ATTENTION_MEMORY_EFFICIENCY * hw.hbm_bytes_per_s)
                * 1e3)
                .max(hw.layer_overhead_ms)
        };
        let moe_elementwise = stream(moe_bytes);
        Ok(BackboneTerms {
            attention_ms: attention,
            moe_layer_other_ms: proj + shared + moe_elementwise,
            moe_layer_elementwise_ms: moe_elementwise,
            dense_layer_other_ms: proj + dense + stream(dense_bytes),
            head_ms: head,
            host_ms: self.topology.host_ms,
        })
    }

    /// Routed GEMM of one rank from its copies' expected rows (one micro-batch), ms, and its
    /// expected active copies.
    fn rank_gemm(&self, lambdas: impl Iterator<Item = f64>) -> (f64, f64) {
        let hw = &self.time.hardware;
        let m = &self.time.model;
        let bm = tile_rows(self.role);
        let flops_per_row = m.flops_per_pair();
        let peak = hw.flops(m.dtype);
        let mut compute = 0.0;
        let mut active = 0.0;
        for lambda in lambdas {
            let p = active_probability(lambda);
            active += p;
            if lambda <= 0.0 {
                continue;
            }
            let rows = if lambda >= 1.0 {
                libm::ceil(lambda / bm) * bm
            } else {
                p * bm
            };
            let useful = lambda.max(p);
            compute += rows * flops_per_row / (gemm_efficiency(rows.max(useful)) * peak);
        }
        let memory =
            active * self.time.expert_bytes / (WEIGHT_READ_EFFICIENCY * hw.hbm_bytes_per_s);
        (compute.max(memory) * 1e3, active)
    }

    /// All-to-all `(bandwidth ms, latency ms)` of one micro-batch of `t` tokens per rank whose
    /// busiest endpoints receive `load`.
    ///
    /// Decode (DeepEP's low-latency kernels) sends one message per (token, expert) pair: the
    /// busiest rank's pairs, the remote share over the scale-out link. Prefill (the normal
    /// kernels) sends a token once per *distinct destination node* over the scale-out link, to
    /// the GPU with the sender's local index there, and forwards it once per distinct
    /// destination GPU over the scale-up link. So the scale-out leg of a rank carries the larger
    /// of what it sends (its tokens times the distinct remote nodes each reaches) and its share
    /// of what its node receives (the node's distinct tokens, spread over the node's `g`
    /// NICs), and the scale-up leg the distinct tokens of the busiest GPU. Expert-level skew
    /// thus reaches the scale-out leg only through the busiest node's distinct tokens, which
    /// saturate: a token that already reaches a node adds nothing for a second hot expert there.
    fn a2a(&self, ranks: usize, t: f64, load: &A2aLoad) -> (f64, f64) {
        let m = &self.time.model;
        let hw = &self.time.hardware;
        let topo = &self.topology;
        let r = ranks.max(1) as f64;
        let g = self.node_ranks(ranks) as f64;
        let k = f64::from(m.top_k);
        let payload = dispatch_payload(m.hidden, m.dtype) + combine_payload(m.hidden);
        let intra_bw = hw.intra_node_bytes_per_s * topo.link_efficiency;
        let inter_bw = self.inter_node_bytes_per_s(ranks);
        let multi_node = r > g;
        let (intra_bytes, inter_bytes) = match self.role {
            Role::Decode => {
                // Low-latency kernels: one message per pair.
                let busiest = (t * k).max(load.pairs_max);
                (
                    busiest * (g - 1.0) / r * payload,
                    busiest * (r - g) / r * payload,
                )
            }
            Role::Prefill => {
                // Normal kernels: once per distinct destination node, then forwarded once per
                // distinct destination GPU.
                let nodes = r / g;
                let mut scale = 1.0;
                let limit = f64::from(self.arch.node_limit);
                if limit > 0.0 && load.nodes_per_token > limit {
                    scale = limit / load.nodes_per_token;
                }
                let remote = (nodes - 1.0) / nodes;
                let send = load.nodes_per_token * scale;
                let recv = nodes * load.node_reach_max * scale;
                let tokens = t * r;
                (
                    tokens * load.rank_reach_max * (g - 1.0) / g * payload,
                    t * remote * send.max(recv) * payload,
                )
            }
        };
        let bw = (intra_bytes / intra_bw).max(if multi_node {
            inter_bytes / inter_bw
        } else {
            0.0
        }) * 1e3;
        let t0 = if multi_node {
            topo.a2a_latency_inter_ms
        } else if g > 1.0 {
            topo.a2a_latency_intra_ms
        } else {
            0.0
        };
        // Dispatch and combine: two phases.
        (bw, 2.0 * t0)
    }

    /// The raw MoE terms of one layer from its slot loads `[R][S]` (any non-negative scale:
    /// they are shares of the layer's `T * R * k` pairs per step).
    pub fn moe_layer(
        &self,
        layer: u16,
        ranks: usize,
        slots_per_rank: usize,
        slot_loads: &[f64],
    ) -> Result<MoeTerms, Error> {
        let len = slots_len(ranks, slots_per_rank)?;
        check_len("slot loads [R][S]", len, slot_loads.len())?;
        let mut total = 0.0;
        for (i, &w) in slot_loads.iter().enumerate() {
            if !(w.is_finite() && w >= 0.0) {
                return Err(Error::BadSlotLoad {
                    layer,
                    rank: clamp_u16(i / slots_per_rank),
                    slot: clamp_u16(i % slots_per_rank),
                });
            }
            total += w;
        }
        if !total.is_finite() {
            return Err(Error::Overflow {
                what: "sum of slot loads",
            });
        }
        let m = &self.time.model;
        let mb = self.overlap.micro_batches();
        let t = self.time.tokens_per_rank / mb;
        let pairs = t * ranks as f64 * f64::from(m.top_k);
        let scale = if total > 0.0 { pairs / total } else { 0.0 };
        let g = self.node_ranks(ranks);
        // A token reaches a copy with probability `lambda / tokens` (independent copies).
        let tokens = t * ranks as f64;
        let miss = |w: f64| {
            if tokens > 0.0 {
                (1.0 - w * scale / tokens).clamp(0.0, 1.0)
            } else {
                1.0
            }
        };
        let mut out = MoeTerms::default();
        let mut load = A2aLoad::default();
        let mut node_miss = 1.0;
        for (r, row) in slot_loads.chunks_exact(slots_per_rank).enumerate() {
            let (ms, active) = self.rank_gemm(row.iter().map(|&w| w * scale));
            let rp: f64 = row.iter().map(|&w| w * scale).sum();
            let rank_miss: f64 = row.iter().map(|&w| miss(w)).product();
            load.pairs_max = load.pairs_max.max(rp);
            load.rank_reach_max = load.rank_reach_max.max(1.0 - rank_miss);
            node_miss *= rank_miss;
            if (r + 1) % g == 0 || r + 1 == ranks {
                load.node_reach_max = load.node_reach_max.max(1.0 - node_miss);
                load.nodes_per_token += 1.0 - node_miss;
                node_miss = 1.0;
            }
            if r == 0 || ms > out.gemm_ms {
                out.gemm_ms = ms;
                out.active_copies = active;
                out.busiest_rank = clamp_u16(r);
            }
        }
        let (bw, lat) = self.a2a(ranks, t, &load);
        out.gemm_ms *= mb;
        out.a2a_bw_ms = bw * mb;
        out.a2a_latency_ms = lat * mb;
        Ok(out)
    }

    /// The raw MoE terms of one layer when the busiest rank carries `par` times the mean
    /// rank's pairs, spread evenly over its `ceil(N / R)` experts (`par` 1.0: balanced).
    pub fn moe_layer_par(&self, ranks: usize, par: f64) -> Result<MoeTerms, Error> {
        if ranks == 0 {
            return Err(Error::ZeroDimension { what: "ranks" });
        }
        if !(par.is_finite() && par >= 1.0) {
            return Err(Error::BadParameter {
                what: "PAR (busiest rank's load over the mean)",
                requirement: "a finite number >= 1",
            });
        }
        if par > ranks as f64 {
            return Err(Error::BadParameter {
                what: "PAR (busiest rank's load over the mean)",
                requirement: "at most the number of ranks",
            });
        }
        self.check()?;
        let m = &self.time.model;
        let mb = self.overlap.micro_batches();
        let t = self.time.tokens_per_rank / mb;
        let per_rank = usize::from(m.experts).div_ceil(ranks).max(1);
        let rank_pairs = t * f64::from(m.top_k) * par;
        let lambda = rank_pairs / per_rank as f64;
        let (ms, active) = self.rank_gemm(core::iter::repeat_n(lambda, per_rank));
        let g = self.node_ranks(ranks) as f64;
        // The busiest node holds the busiest rank and `g - 1` average ones; every copy is
        // reached independently with probability `lambda / tokens`.
        let tokens = t * ranks as f64;
        let n = per_rank as f64;
        let reach = |lambda: f64| 1.0 - libm::pow((1.0 - lambda / tokens).clamp(0.0, 1.0), n);
        let busy = reach(lambda);
        let mean = reach(t * f64::from(m.top_k) / n);
        let node_of = |first: f64| 1.0 - (1.0 - first) * libm::pow(1.0 - mean, g - 1.0);
        let nodes = (ranks as f64 / g).max(1.0);
        let load = A2aLoad {
            pairs_max: rank_pairs,
            rank_reach_max: busy,
            node_reach_max: node_of(busy),
            nodes_per_token: (nodes - 1.0) * node_of(mean) + node_of(busy),
        };
        let (bw, lat) = self.a2a(ranks, t, &load);
        Ok(MoeTerms {
            gemm_ms: ms * mb,
            a2a_bw_ms: bw * mb,
            a2a_latency_ms: lat * mb,
            busiest_rank: 0,
            active_copies: active,
        })
    }

    /// Dispatch and combine of one balanced-or-skewed layer (`par` as in
    /// [`StepModel::moe_layer_par`]), each with its latency, ms, uncalibrated: the bandwidth
    /// term is split between the phases by their payloads.
    pub fn a2a_phases_par(&self, ranks: usize, par: f64) -> Result<(f64, f64), Error> {
        let t = self.moe_layer_par(ranks, par)?;
        let m = &self.time.model;
        let d = dispatch_payload(m.hidden, m.dtype);
        let c = combine_payload(m.hidden);
        let lat = t.a2a_latency_ms / 2.0;
        Ok((
            lat + t.a2a_bw_ms * d / (d + c),
            lat + t.a2a_bw_ms * c / (d + c),
        ))
    }

    /// Share of the GPU the compute keeps while the all-to-all of the other micro-batch runs
    /// beside it: `1 - comm_sm_share` for the prefill normal kernels, else 1.
    pub fn overlapped_compute_share(&self) -> f64 {
        match (self.role, self.overlap, self.topology.fused_mc2) {
            (Role::Prefill, Overlap::TwoBatch, false) => 1.0 - self.topology.comm_sm_share,
            _ => 1.0,
        }
    }

    fn compose_layer(&self, b: &BackboneTerms, moe: &MoeTerms, c: &Calibration) -> LayerStep {
        let attention = b.attention_ms * c.backbone;
        let other = b.moe_layer_other_ms * c.backbone;
        let gemm = moe.gemm_ms * c.gemm;
        let bw = moe.a2a_bw_ms * c.link;
        let latency = moe.a2a_latency_ms * c.latency;
        let a2a = bw + latency;
        let total = match (self.topology.fused_mc2, self.overlap) {
            (false, Overlap::None) => attention + other + gemm + a2a,
            (false, Overlap::TwoBatch) => {
                ((attention + other + gemm) / self.overlapped_compute_share()).max(a2a)
            }
            (true, Overlap::None) => attention + other + latency + gemm.max(bw),
            (true, Overlap::TwoBatch) => (attention + other).max(latency + gemm.max(bw)),
        };
        LayerStep {
            total,
            gemm,
            a2a,
            latency,
            attention,
            other,
        }
    }

    /// The step from the backbone and each MoE layer's raw terms, under `calibration`.
    pub fn compose(
        &self,
        backbone: &BackboneTerms,
        layers: impl IntoIterator<Item = MoeTerms>,
        calibration: &Calibration,
    ) -> StepTime {
        let c = calibration;
        let mut st = StepTime::default();
        for l in layers {
            st.add_layer(self.compose_layer(backbone, &l, c));
        }
        let dense = f64::from(self.arch.layers.saturating_sub(self.time.model.moe_layers));
        let dense_attention = dense * backbone.attention_ms * c.backbone;
        let dense_other = dense * backbone.dense_layer_other_ms * c.backbone;
        let fixed = backbone.head_ms * c.backbone + backbone.host_ms * c.host;
        st.attention_ms += dense_attention;
        st.other_ms += dense_other + fixed;
        st.iteration_ms += dense_attention + dense_other + fixed;
        st.finish();
        st
    }

    /// The step when every MoE layer has the busiest-rank load `par` (over the mean).
    pub fn step_par(&self, ranks: usize, par: f64) -> Result<StepTime, Error> {
        let b = self.backbone()?;
        let l = self.moe_layer_par(ranks, par)?;
        Ok(self.compose(
            &b,
            core::iter::repeat_n(l, usize::from(self.time.model.moe_layers)),
            &self.calibration,
        ))
    }

    /// The step from slot loads `[L][R][S]` (one MoE layer per `R * S` block; their number
    /// need not be the model's MoE layers: a trace keeps its own). `scratch` is empty or holds
    /// one [`MoeTerms`] per layer, written in layer order.
    pub fn step(
        &self,
        ranks: usize,
        slots_per_rank: usize,
        slot_loads: &[f64],
        scratch: &mut [MoeTerms],
    ) -> Result<StepTime, Error> {
        let layers = super::slot_layers(ranks, slots_per_rank, slot_loads)?;
        if !scratch.is_empty() {
            check_len("per-layer terms [L]", layers, scratch.len())?;
        }
        let b = self.backbone()?;
        let mut err = None;
        let terms = slot_loads
            .chunks_exact(slot_loads.len() / layers)
            .enumerate()
            .map(
                |(l, w)| match self.moe_layer(clamp_u16(l), ranks, slots_per_rank, w) {
                    Ok(t) => t,
                    Err(e) => {
                        err.get_or_insert(e);
                        MoeTerms::default()
                    }
                },
            );
        // Scale the trace's layers to the model's MoE layers (a trace may keep fewer).
        let mut st = StepTime::default();
        let mut n = 0usize;
        for (i, t) in terms.enumerate() {
            if let Some(o) = scratch.get_mut(i) {
                *o = t;
            }
            st.add_layer(self.compose_layer(&b, &t, &self.calibration));
            n += 1;
        }
        if let Some(e) = err {
            return Err(e);
        }
        Ok(self.finish_layers(&b, st, n, &self.calibration))
    }

    /// The step from per-layer raw terms already priced (`moe` in layer order), under
    /// `calibration`: what a band or a calibration re-prices without routing again.
    pub fn step_from_terms(
        &self,
        moe: &[MoeTerms],
        calibration: &Calibration,
    ) -> Result<StepTime, Error> {
        let b = self.backbone()?;
        let mut st = StepTime::default();
        for t in moe {
            st.add_layer(self.compose_layer(&b, t, calibration));
        }
        Ok(self.finish_layers(&b, st, moe.len(), calibration))
    }

    fn finish_layers(
        &self,
        b: &BackboneTerms,
        mut st: StepTime,
        n: usize,
        c: &Calibration,
    ) -> StepTime {
        let want = usize::from(self.time.model.moe_layers);
        if n > 0 && n != want {
            let f = want as f64 / n as f64;
            st.iteration_ms *= f;
            st.gemm_ms *= f;
            st.a2a_ms *= f;
            st.a2a_latency_ms *= f;
            st.attention_ms *= f;
            st.other_ms *= f;
        }
        let tail = self.compose(b, core::iter::empty(), c);
        st.iteration_ms += tail.iteration_ms;
        st.attention_ms += tail.attention_ms;
        st.other_ms += tail.other_ms;
        st.finish();
        st
    }

    /// The hardware of the model.
    pub fn hardware(&self) -> &Hardware {
        &self.time.hardware
    }
}
