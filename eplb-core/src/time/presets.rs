//! Hardware and model presets from public spec sheets and `config.json` files.
//!
//! `docs/time-model.md` names the source of every number and says how the numbers without a
//! public figure (the 950 series' bf16 peak, the scale-out links, the overhead and collective
//! latencies) were derived. Bandwidths are per rank and per direction.

use super::{Dtype, Hardware, ModelSpec};

const TERA: f64 = 1e12;
const GIGA: f64 = 1e9;

/// Ascend NPUs: per-layer overhead and small-collective latency (assumed, see the doc).
const ASCEND_OVERHEAD_MS: f64 = 0.1;
const ASCEND_COLLECTIVE_MS: f64 = 0.1;
/// NVIDIA GPUs: per-layer overhead and small-collective latency (assumed, see the doc).
const NVIDIA_OVERHEAD_MS: f64 = 0.05;
const NVIDIA_COLLECTIVE_MS: f64 = 0.05;

impl Hardware {
    /// Ascend A2 (910B, top bin), one die: 376 TFLOPS bf16, 752 TOPS int8, HBM 1.6 TB/s,
    /// HCCS 7 x 56 GB/s (bidirectional) full mesh = 196 GB/s per direction, RoCE 200 Gb/s.
    pub const A2: Hardware = Hardware {
        name: "a2",
        flops_bf16: 376.0 * TERA,
        flops_8bit: 752.0 * TERA,
        flops_fp4: 0.0,
        hbm_bytes_per_s: 1.6 * TERA,
        intra_node_bytes_per_s: 196.0 * GIGA,
        inter_node_bytes_per_s: 25.0 * GIGA,
        layer_overhead_ms: ASCEND_OVERHEAD_MS,
        collective_ms: ASCEND_COLLECTIVE_MS,
    };

    /// Ascend A3 (910C), one die (half a package): 376 TFLOPS bf16, 752 TOPS int8, HBM
    /// 1.6 TB/s, UB 196 GB/s per direction, RoCE 400 Gb/s per package = 25 GB/s per die.
    pub const A3: Hardware = Hardware {
        name: "a3",
        flops_bf16: 376.0 * TERA,
        flops_8bit: 752.0 * TERA,
        flops_fp4: 0.0,
        hbm_bytes_per_s: 1.6 * TERA,
        intra_node_bytes_per_s: 196.0 * GIGA,
        inter_node_bytes_per_s: 25.0 * GIGA,
        layer_overhead_ms: ASCEND_OVERHEAD_MS,
        collective_ms: ASCEND_COLLECTIVE_MS,
    };

    /// Ascend 950PR, one device: 1 PFLOPS fp8, 2 PFLOPS MXFP4, bf16 taken as half of fp8,
    /// HBM (HiBL 1.0) 1.6 TB/s, 2 TB/s interconnect = 1 TB/s per direction, scale-out assumed
    /// 400 Gb/s.
    pub const ASCEND_950PR: Hardware = Hardware {
        name: "950pr",
        flops_bf16: 500.0 * TERA,
        flops_8bit: 1000.0 * TERA,
        flops_fp4: 2000.0 * TERA,
        hbm_bytes_per_s: 1.6 * TERA,
        intra_node_bytes_per_s: 1000.0 * GIGA,
        inter_node_bytes_per_s: 50.0 * GIGA,
        layer_overhead_ms: ASCEND_OVERHEAD_MS,
        collective_ms: ASCEND_COLLECTIVE_MS,
    };

    /// Ascend 950DT, one device: as [`Hardware::ASCEND_950PR`] with HBM (HiZQ 2.0) 4 TB/s.
    pub const ASCEND_950DT: Hardware = Hardware {
        name: "950dt",
        hbm_bytes_per_s: 4.0 * TERA,
        ..Hardware::ASCEND_950PR
    };

    /// NVIDIA H100 SXM: 989 TFLOPS bf16, 1979 TFLOPS fp8/int8 (dense), HBM3 3.35 TB/s,
    /// NVLink 900 GB/s (bidirectional) = 450 GB/s per direction, 400 Gb/s NIC per GPU.
    pub const H100: Hardware = Hardware {
        name: "h100",
        flops_bf16: 989.0 * TERA,
        flops_8bit: 1979.0 * TERA,
        flops_fp4: 0.0,
        hbm_bytes_per_s: 3.35 * TERA,
        intra_node_bytes_per_s: 450.0 * GIGA,
        inter_node_bytes_per_s: 50.0 * GIGA,
        layer_overhead_ms: NVIDIA_OVERHEAD_MS,
        collective_ms: NVIDIA_COLLECTIVE_MS,
    };

    /// NVIDIA H200 SXM: the H100's compute and links with HBM3e 4.8 TB/s.
    pub const H200: Hardware = Hardware {
        name: "h200",
        hbm_bytes_per_s: 4.8 * TERA,
        ..Hardware::H100
    };

    /// NVIDIA B200 (HGX, 1000 W): 2.25 PFLOPS bf16, 4.5 PFLOPS fp8, 9 PFLOPS fp4 (dense),
    /// HBM3e 8 TB/s, NVLink 5 1.8 TB/s (bidirectional) = 900 GB/s per direction, 400 Gb/s NIC.
    pub const B200: Hardware = Hardware {
        name: "b200",
        flops_bf16: 2250.0 * TERA,
        flops_8bit: 4500.0 * TERA,
        flops_fp4: 9000.0 * TERA,
        hbm_bytes_per_s: 8.0 * TERA,
        intra_node_bytes_per_s: 900.0 * GIGA,
        inter_node_bytes_per_s: 50.0 * GIGA,
        layer_overhead_ms: NVIDIA_OVERHEAD_MS,
        collective_ms: NVIDIA_COLLECTIVE_MS,
    };

    /// NVIDIA H800 SXM: the H100's compute and HBM, NVLink 400 GB/s (bidirectional) = 200 GB/s
    /// per direction, 400 Gb/s NIC per GPU (the chip of DeepSeek's and DeepEP's figures).
    pub const H800: Hardware = Hardware {
        name: "h800",
        intra_node_bytes_per_s: 200.0 * GIGA,
        ..Hardware::H100
    };

    /// NVIDIA GB200 (NVL72), one GPU: 2.5 PFLOPS bf16, 5 PFLOPS fp8, 10 PFLOPS fp4 (dense),
    /// HBM3e 8 TB/s, NVLink 5 900 GB/s per direction across the 72-GPU domain, 400 Gb/s NIC.
    pub const GB200: Hardware = Hardware {
        name: "gb200",
        flops_bf16: 2500.0 * TERA,
        flops_8bit: 5000.0 * TERA,
        flops_fp4: 10000.0 * TERA,
        ..Hardware::B200
    };

    /// Every hardware preset.
    pub const ALL: [Hardware; 9] = [
        Hardware::A2,
        Hardware::A3,
        Hardware::ASCEND_950PR,
        Hardware::ASCEND_950DT,
        Hardware::H100,
        Hardware::H200,
        Hardware::B200,
        Hardware::H800,
        Hardware::GB200,
    ];

    /// The preset named `name` or one of its aliases (ASCII case-insensitive, trimmed):
    /// `a2` (`910b`, `ascend-a2`), `a3` (`910c`, `ascend-a3`), `950pr` (`ascend-950pr`),
    /// `950dt` (`ascend-950dt`), `h100` (`h100-sxm`), `h200` (`h200-sxm`), `b200` (`hgx-b200`), `h800` (`h800-sxm`), `gb200` (`gb200-nvl72`).
    pub fn from_name(name: &str) -> Option<Hardware> {
        const ALIASES: [(&str, Hardware); 12] = [
            ("910b", Hardware::A2),
            ("ascend-a2", Hardware::A2),
            ("910c", Hardware::A3),
            ("ascend-a3", Hardware::A3),
            ("ascend-950pr", Hardware::ASCEND_950PR),
            ("ascend-950dt", Hardware::ASCEND_950DT),
            ("h100-sxm", Hardware::H100),
            ("h200-sxm", Hardware::H200),
            ("hgx-b200", Hardware::B200),
            ("b200-hgx", Hardware::B200),
            ("h800-sxm", Hardware::H800),
            ("gb200-nvl72", Hardware::GB200),
        ];
        lookup(name, Hardware::ALL.iter().map(|h| (h.name, *h)), ALIASES)
    }
}

impl ModelSpec {
    /// DeepSeek-V3 / R1: H 7168, I 2048, 256 routed experts, top-8, 58 MoE layers (61 minus 3
    /// dense), 1 shared expert; W8A8 on Ascend (int8).
    pub const DEEPSEEK_V3: ModelSpec = ModelSpec {
        name: "deepseek-v3",
        label: "DeepSeek-V3/R1",
        aliases: &["deepseek-r1", "dsv3", "dsr1"],
        hidden: 7168,
        intermediate: 2048,
        experts: 256,
        top_k: 8,
        moe_layers: 58,
        shared_experts: 1,
        dtype: Dtype::Int8,
    };

    /// Kimi-K2: H 7168, I 2048, 384 routed experts, top-8, 60 MoE layers (61 minus 1 dense),
    /// 1 shared expert; W8A8 (int8).
    pub const KIMI_K2: ModelSpec = ModelSpec {
        name: "kimi-k2",
        label: "Kimi-K2",
        aliases: &["kimi"],
        hidden: 7168,
        intermediate: 2048,
        experts: 384,
        top_k: 8,
        moe_layers: 60,
        shared_experts: 1,
        dtype: Dtype::Int8,
    };

    /// Qwen3-235B-A22B: H 4096, I 1536, 128 experts, top-8, 94 MoE layers, no shared expert;
    /// W8A8 (int8).
    pub const QWEN3_235B: ModelSpec = ModelSpec {
        name: "qwen3-235b",
        label: "Qwen3-235B-A22B",
        aliases: &["qwen3-235b-a22b"],
        hidden: 4096,
        intermediate: 1536,
        experts: 128,
        top_k: 8,
        moe_layers: 94,
        shared_experts: 0,
        dtype: Dtype::Int8,
    };

    /// Qwen3-30B-A3B: H 2048, I 768, 128 experts, top-8, 48 MoE layers, no shared expert;
    /// W8A8 (int8).
    pub const QWEN3_30B: ModelSpec = ModelSpec {
        name: "qwen3-30b",
        label: "Qwen3-30B-A3B",
        aliases: &["qwen3-30b-a3b"],
        hidden: 2048,
        intermediate: 768,
        experts: 128,
        top_k: 8,
        moe_layers: 48,
        shared_experts: 0,
        dtype: Dtype::Int8,
    };

    /// DeepSeek-V2-Lite: H 2048, I 1408, 64 routed experts, top-6, 26 MoE layers (27 minus 1
    /// dense), 2 shared experts; bf16 checkpoint.
    pub const DEEPSEEK_V2_LITE: ModelSpec = ModelSpec {
        name: "deepseek-v2-lite",
        label: "DeepSeek-V2-Lite",
        aliases: &["dsv2-lite"],
        hidden: 2048,
        intermediate: 1408,
        experts: 64,
        top_k: 6,
        moe_layers: 26,
        shared_experts: 2,
        dtype: Dtype::Bf16,
    };

    /// Mixtral-8x7B: H 4096, I 14336, 8 experts, top-2, 32 MoE layers, no shared expert; bf16.
    pub const MIXTRAL_8X7B: ModelSpec = ModelSpec {
        name: "mixtral-8x7b",
        label: "Mixtral-8x7B",
        aliases: &["mixtral", "mixtral-8x7b-v0.1"],
        hidden: 4096,
        intermediate: 14336,
        experts: 8,
        top_k: 2,
        moe_layers: 32,
        shared_experts: 0,
        dtype: Dtype::Bf16,
    };

    /// Every model preset.
    pub const ALL: [ModelSpec; 6] = [
        ModelSpec::DEEPSEEK_V3,
        ModelSpec::KIMI_K2,
        ModelSpec::QWEN3_235B,
        ModelSpec::QWEN3_30B,
        ModelSpec::DEEPSEEK_V2_LITE,
        ModelSpec::MIXTRAL_8X7B,
    ];

    /// The preset named `name` or one of its aliases (ASCII case-insensitive, trimmed): the
    /// names and aliases of [`ModelSpec::ALL`].
    pub fn from_name(name: &str) -> Option<ModelSpec> {
        let n = name.trim();
        ModelSpec::ALL.into_iter().find(|m| {
            m.name.eq_ignore_ascii_case(n) || m.aliases.iter().any(|a| a.eq_ignore_ascii_case(n))
        })
    }
}

/// The preset whose name or alias is `name` (ASCII case-insensitive, trimmed).
fn lookup<'a, T: Copy>(
    name: &str,
    presets: impl Iterator<Item = (&'a str, T)>,
    aliases: impl IntoIterator<Item = (&'a str, T)>,
) -> Option<T> {
    let n = name.trim();
    presets
        .chain(aliases)
        .find(|(k, _)| k.eq_ignore_ascii_case(n))
        .map(|(_, v)| v)
}
