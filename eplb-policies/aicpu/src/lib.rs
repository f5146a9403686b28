//! `eplb-aicpu`: the AICPU entry point of eplb, a C-ABI static library that runs one rebalance.
//!
//! An Ascend AICPU kernel is an aarch64 shared object whose entry is
//! `extern "C" uint32_t Fn(void *args)`, built by CANN's C++ toolchain. It links
//! `libeplb_aicpu.a`, includes `include/eplb_aicpu.h`, fills an [`EplbAicpuArgs`] (shape, policy,
//! seed and raw buffers it owns) and calls [`eplb_aicpu_rebalance`]; buffer sizes come from
//! [`eplb_aicpu_scratch_len`] and [`eplb_aicpu_state_len`]. The call is `eplb_policies::rebalance`
//! on the same inputs, so its output is byte for byte the Rust API's.
//!
//! Version 2 of the argument block appends the pay-off gate ([`EplbAicpuGate`], on with
//! `payoff_gate = 1`): after the policy, `eplb_core::time::gate::Gate::apply` keeps a changed
//! layer only when the time model says its move pays, exactly as the runtime's `PolicyHost`
//! applies it (held layers get their current rows back, their PAR after is their PAR before,
//! the summary is recomputed), and the per-layer ages it reads live after the policy state in
//! the caller's `state` buffer. A version 1 block (248 bytes) is still accepted and behaves as
//! before; so does a version 2 block with `payoff_gate = 0`.
//!
//! Version 3 appends the live ranks (elastic EP): with `live` set (`[R]` bytes, 1 = live) the call
//! runs `eplb_policies::rebalance` with the live set instead: the current placement may hold
//! [`EPLB_AICPU_EMPTY`] slots (every slot of a dead rank is one), the new placement uses only
//! the live ranks, and `reloads` counts the copies of experts that had no copy on a live rank.
//! A null `live` (and every version 2 or 1 block) behaves as version 2.
//!
//! **Invariant:** `no_std` and no allocation: every byte it reads or writes is in the buffers the
//! caller passes (and the output fields of the argument struct, within its version's size).
//!
//! **Invariant:** no panics on input: every pointer, alignment, length, overlap, shape, policy
//! number, load and time-model number is checked, and a problem is a documented status code
//! (`EPLB_AICPU_E_*`), never a crash.
//!
//! `unsafe` is confined to turning the checked raw pointers into slices and to reading and
//! writing the argument struct; each block says why it is sound.
#![cfg_attr(not(test), no_std)]
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented,
        clippy::arithmetic_side_effects
    )
)]
#![warn(clippy::std_instead_of_core)]

#[cfg(not(target_pointer_width = "64"))]
compile_error!("the eplb AICPU ABI is LP64 (64-bit pointers) only");

use core::ffi::c_void;
use core::mem::{offset_of, size_of};
use core::ptr;

use eplb_core::metrics::{self, Routing};
use eplb_core::time::gate::{self, Gate};
use eplb_core::time::{Dtype, Hardware, ModelSpec, TimeModel};
use eplb_core::{Placement, Shape};
use eplb_policies::{
    AnyPolicy, Arena, Error, Input, Output, Policy, PolicyKind, Samples, words_f64, words_u32,
};

/// Version of [`EplbAicpuArgs`] this library implements (and the header describes). The
/// library also accepts version 2 blocks ([`EPLB_AICPU_ARGS_V2_SIZE`] bytes, no live ranks) and
/// version 1 blocks ([`EPLB_AICPU_ARGS_V1_SIZE`] bytes, no gate).
pub const EPLB_AICPU_ABI_VERSION: u32 = 3;
/// `struct_size` of a version 1 argument block: the fields up to and including `result`.
pub const EPLB_AICPU_ARGS_V1_SIZE: u32 = 248;
/// `struct_size` of a version 2 argument block: the fields up to and including `gate_result`.
pub const EPLB_AICPU_ARGS_V2_SIZE: u32 = 408;
/// A slot that holds no expert (its rank is gone, or joined without weights yet): the id
/// `eplb_core::live::EMPTY`, in `current` and `out_placement` of a call with `live` set.
pub const EPLB_AICPU_EMPTY: u16 = 65535;

// Status codes returned by `eplb_aicpu_rebalance`. Keep in step with `include/eplb_aicpu.h`
// (`cargo xtask aicpu` compares the two).

/// Success: the outputs and `args.result` are written.
pub const EPLB_AICPU_OK: u32 = 0;
/// `args` is null. Nothing is written.
pub const EPLB_AICPU_E_NULL_ARGS: u32 = 1;
/// `args.version` / `args.struct_size` are none of 3 / `sizeof(eplb_aicpu_args)` (432),
/// 2 / [`EPLB_AICPU_ARGS_V2_SIZE`] (408), 1 / [`EPLB_AICPU_ARGS_V1_SIZE`] (248). Nothing is
/// written.
pub const EPLB_AICPU_E_VERSION: u32 = 2;
/// A buffer the call needs is null, or so high in memory that it would wrap the address space.
pub const EPLB_AICPU_E_NULL_POINTER: u32 = 3;
/// `args` (8 bytes) or a buffer is not aligned for its element type. When `args` itself is
/// misaligned nothing is written.
pub const EPLB_AICPU_E_MISALIGNED: u32 = 4;
/// A buffer holds fewer elements than the shape needs; `result.detail` = elements needed.
pub const EPLB_AICPU_E_TOO_SHORT: u32 = 5;
/// Two buffers overlap and one of them is written (`result.field` and `result.detail` name them).
pub const EPLB_AICPU_E_OVERLAP: u32 = 6;
/// The shape is invalid (a zero dimension, `R*S < N`, `S > N`, `R % ranks_per_node != 0`,
/// `groups > N`).
pub const EPLB_AICPU_E_SHAPE: u32 = 7;
/// The policy number is not one of `EPLB_AICPU_POLICY_*`; `result.detail` = the number.
pub const EPLB_AICPU_E_POLICY: u32 = 8;
/// A load (or sample) is NaN, infinite or negative; `result.detail` = `layer * N + expert`.
pub const EPLB_AICPU_E_LOAD: u32 = 9;
/// The scratch buffer is too small; `result.detail` = words needed.
pub const EPLB_AICPU_E_SCRATCH: u32 = 10;
/// The policy state buffer is too small; `result.detail` = words needed.
pub const EPLB_AICPU_E_STATE: u32 = 11;
/// The current placement is not structurally valid (an id `>= N`, or an expert missing from a
/// layer); `result.detail` = the layer.
pub const EPLB_AICPU_E_PLACEMENT: u32 = 12;
/// The topology does not suit the policy (DeepSeek hierarchical with `N % groups != 0`);
/// `result.detail` = the offending value.
pub const EPLB_AICPU_E_TOPOLOGY: u32 = 13;
/// The policy needs per-window samples (`windows >= 1`) and none were given.
pub const EPLB_AICPU_E_SAMPLES_REQUIRED: u32 = 14;
/// The policy found no valid placement (a bug in the policy; keep the current placement);
/// `result.detail` = the layer when known.
pub const EPLB_AICPU_E_POLICY_FAILED: u32 = 15;
/// A pay-off gate input is invalid (version 2): `payoff_gate` not 0 or 1, or, with the gate on,
/// a field of `args.gate` (NaN, infinite, negative, a zero rate or bandwidth, a zero size, an
/// unknown dtype or routing, `top_k` above the experts, both intervals 0). `result.field` =
/// the `EPLB_AICPU_FIELD_GATE_*` (or `EPLB_AICPU_FIELD_PAYOFF_GATE`); `result.detail` = the
/// value (a `double`'s IEEE-754 bits).
pub const EPLB_AICPU_E_GATE: u32 = 16;
/// The live ranks are invalid (version 3, `live` set): a byte not 0 or 1 (`result.detail` =
/// the rank), too few live ranks to hold every expert (`live * S < N`, none live included;
/// `result.detail` = the live ranks), or the pay-off gate on with a live set (not supported;
/// `result.field` = `EPLB_AICPU_FIELD_PAYOFF_GATE`). `result.field` = `EPLB_AICPU_FIELD_LIVE`
/// otherwise.
pub const EPLB_AICPU_E_LIVE: u32 = 17;

// Policy numbers (`args.policy`): vLLM-Ascend's `eplb_policy_type` 0..4, and 5 for DeepSeek's.

/// Seeded random swaps between ranks (tests the update path).
pub const EPLB_AICPU_POLICY_RANDOM: u32 = 0;
/// vLLM-Ascend's DefaultEplb.
pub const EPLB_AICPU_POLICY_DEFAULT: u32 = 1;
/// vLLM-Ascend's SwiftBalance.
pub const EPLB_AICPU_POLICY_SWIFT: u32 = 2;
/// vLLM-Ascend's FlashLB (keeps history in the state buffer).
pub const EPLB_AICPU_POLICY_FLASHLB: u32 = 3;
/// eplb's incremental policy (keeps estimates in the state buffer).
pub const EPLB_AICPU_POLICY_INCREMENTAL: u32 = 4;
/// DeepSeek's EPLB (hierarchical when `groups % nodes == 0`, else global). Our number.
pub const EPLB_AICPU_POLICY_DEEPSEEK: u32 = 5;

// Field ids in `result.field`: which argument an error refers to.

/// No particular field.
pub const EPLB_AICPU_FIELD_NONE: u32 = 0;
/// The shape fields (`layers` .. `groups`).
pub const EPLB_AICPU_FIELD_SHAPE: u32 = 1;
/// `policy`.
pub const EPLB_AICPU_FIELD_POLICY: u32 = 2;
/// `current` / `current_len`.
pub const EPLB_AICPU_FIELD_CURRENT: u32 = 3;
/// `loads` / `loads_len`.
pub const EPLB_AICPU_FIELD_LOADS: u32 = 4;
/// `samples` / `samples_len` / `windows`.
pub const EPLB_AICPU_FIELD_SAMPLES: u32 = 5;
/// `out_placement` / `out_placement_len`.
pub const EPLB_AICPU_FIELD_OUT_PLACEMENT: u32 = 6;
/// `out_changed` / `out_changed_len`.
pub const EPLB_AICPU_FIELD_OUT_CHANGED: u32 = 7;
/// `out_par_before` / `out_par_before_len`.
pub const EPLB_AICPU_FIELD_OUT_PAR_BEFORE: u32 = 8;
/// `out_par_after` / `out_par_after_len`.
pub const EPLB_AICPU_FIELD_OUT_PAR_AFTER: u32 = 9;
/// `scratch` / `scratch_len`.
pub const EPLB_AICPU_FIELD_SCRATCH: u32 = 10;
/// `state` / `state_len`.
pub const EPLB_AICPU_FIELD_STATE: u32 = 11;
/// The argument struct itself.
pub const EPLB_AICPU_FIELD_ARGS: u32 = 12;
/// `payoff_gate`.
pub const EPLB_AICPU_FIELD_PAYOFF_GATE: u32 = 13;
/// `gate.flops_bf16`.
pub const EPLB_AICPU_FIELD_GATE_FLOPS_BF16: u32 = 14;
/// `gate.flops_8bit`.
pub const EPLB_AICPU_FIELD_GATE_FLOPS_8BIT: u32 = 15;
/// `gate.flops_fp4`.
pub const EPLB_AICPU_FIELD_GATE_FLOPS_FP4: u32 = 16;
/// `gate.hbm_bytes_per_s`.
pub const EPLB_AICPU_FIELD_GATE_HBM: u32 = 17;
/// `gate.intra_node_bytes_per_s`.
pub const EPLB_AICPU_FIELD_GATE_INTRA_NODE: u32 = 18;
/// `gate.inter_node_bytes_per_s`.
pub const EPLB_AICPU_FIELD_GATE_INTER_NODE: u32 = 19;
/// `gate.layer_overhead_ms`.
pub const EPLB_AICPU_FIELD_GATE_LAYER_OVERHEAD: u32 = 20;
/// `gate.collective_ms`.
pub const EPLB_AICPU_FIELD_GATE_COLLECTIVE: u32 = 21;
/// `gate.hidden`.
pub const EPLB_AICPU_FIELD_GATE_HIDDEN: u32 = 22;
/// `gate.intermediate`.
pub const EPLB_AICPU_FIELD_GATE_INTERMEDIATE: u32 = 23;
/// `gate.top_k`.
pub const EPLB_AICPU_FIELD_GATE_TOP_K: u32 = 24;
/// `gate.dtype`.
pub const EPLB_AICPU_FIELD_GATE_DTYPE: u32 = 25;
/// `gate.routing`.
pub const EPLB_AICPU_FIELD_GATE_ROUTING: u32 = 26;
/// `gate.tokens_per_rank`.
pub const EPLB_AICPU_FIELD_GATE_TOKENS_PER_RANK: u32 = 27;
/// `gate.expert_bytes`.
pub const EPLB_AICPU_FIELD_GATE_EXPERT_BYTES: u32 = 28;
/// `gate.heat_interval` and `gate.algo_interval` (both 0).
pub const EPLB_AICPU_FIELD_GATE_INTERVALS: u32 = 29;
/// `live` / `live_len` (version 3).
pub const EPLB_AICPU_FIELD_LIVE: u32 = 30;

// Compute dtypes (`gate.dtype`): the activation side of the quant type.

/// bf16 / fp16 (unquantised checkpoints).
pub const EPLB_AICPU_DTYPE_BF16: u32 = 0;
/// int8 activations (W8A8, W8A8-Dynamic, W4A8).
pub const EPLB_AICPU_DTYPE_INT8: u32 = 1;
/// fp8 activations.
pub const EPLB_AICPU_DTYPE_FP8: u32 = 2;
/// fp4 (at the 8-bit peak on chips without fp4 units, `flops_fp4 = 0`).
pub const EPLB_AICPU_DTYPE_FP4: u32 = 3;

// Routing models (`gate.routing`): how the gate splits an expert's tokens over its copies.

/// vLLM-Ascend's static `log2phy` choice (what the runtime's gate uses).
pub const EPLB_AICPU_ROUTING_LOG2PHY: u32 = 0;
/// An even split over the copies.
pub const EPLB_AICPU_ROUTING_EVEN: u32 = 1;

/// What one call reports besides its buffers (`eplb_aicpu_result` in C). Written by every call
/// that gets past the version check: on success the summary, on failure zeros and
/// `field` / `detail`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EplbAicpuResult {
    /// Layers whose placement changed.
    pub changed_layers: u32,
    /// Rows (layer, rank) of the new placement holding an expert twice (DeepSeek only).
    pub colocated_rows: u32,
    /// (rank, expert) copies to fetch relative to the current placement.
    pub moves: u64,
    /// Mean PAR over layers, current placement.
    pub par_mean_before: f64,
    /// Max PAR over layers, current placement.
    pub par_max_before: f64,
    /// Mean PAR over layers, new placement.
    pub par_mean_after: f64,
    /// Max PAR over layers, new placement.
    pub par_max_after: f64,
    /// On failure: the `EPLB_AICPU_FIELD_*` the error refers to.
    pub field: u32,
    /// Written as 0.
    pub reserved: u32,
    /// On failure: a number that locates the problem (see each status code).
    pub detail: u64,
}

/// The pay-off gate's inputs (`eplb_aicpu_gate` in C, version 2): the numbers of
/// `eplb_core::time::TimeModel` (`docs/time-model.md` gives the presets and their sources) and
/// the cycle a move must pay back over. Rates and bandwidths are per rank (one die), one
/// direction; the gate's node split is the shape's `ranks_per_node`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EplbAicpuGate {
    /// Dense bf16 peak, FLOP/s (`> 0`).
    pub flops_bf16: f64,
    /// Dense int8/fp8 peak, FLOP/s (`> 0`).
    pub flops_8bit: f64,
    /// Dense fp4 peak, FLOP/s (`>= 0`; 0: fp4 runs at the 8-bit peak).
    pub flops_fp4: f64,
    /// HBM bandwidth, bytes/s (`> 0`).
    pub hbm_bytes_per_s: f64,
    /// Intra-node bandwidth of one rank, one direction, bytes/s (`> 0`).
    pub intra_node_bytes_per_s: f64,
    /// Inter-node bandwidth of one rank, one direction, bytes/s (`> 0`).
    pub inter_node_bytes_per_s: f64,
    /// Fixed time of one MoE layer on one rank, ms (`>= 0`).
    pub layer_overhead_ms: f64,
    /// Latency of one small collective over the EP group, ms (`>= 0`).
    pub collective_ms: f64,
    /// Hidden size `H` (`>= 1`).
    pub hidden: u32,
    /// Expert intermediate size `I` (`>= 1`).
    pub intermediate: u32,
    /// Routed experts (0: the shape's `N`).
    pub experts: u16,
    /// Experts per token `k` (`1..=experts`).
    pub top_k: u16,
    /// MoE layers (0: the shape's `L`).
    pub moe_layers: u16,
    /// Shared experts per MoE layer.
    pub shared_experts: u16,
    /// `EPLB_AICPU_DTYPE_*`.
    pub dtype: u32,
    /// `EPLB_AICPU_ROUTING_*`.
    pub routing: u32,
    /// Tokens per iteration per rank `T` (`> 0`).
    pub tokens_per_rank: f64,
    /// Bytes of one expert's weights and scales (`>= 0`).
    pub expert_bytes: f64,
    /// Heat interval `H`, iterations.
    pub heat_interval: u32,
    /// Algorithm interval `A`, iterations (`H + A >= 1`: the horizon).
    pub algo_interval: u32,
}

/// What the pay-off gate did (`eplb_aicpu_gate_result` in C, version 2): zeros when the gate is
/// off or the call failed.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EplbAicpuGateResult {
    /// Layers the policy changed.
    pub changed_layers: u32,
    /// Of them, layers whose move pays: they take the new placement.
    pub moved_layers: u32,
    /// Of them, layers held back: they keep their current rows.
    pub held_layers: u32,
    /// Written as 0.
    pub reserved: u32,
    /// Predicted MoE time per iteration the moved layers save, ms.
    pub saving_ms_per_iter: f64,
    /// Predicted stall of the moved layers' exchanges, ms.
    pub stall_ms: f64,
    /// Predicted saving per iteration given up by the held layers, ms.
    pub forgone_ms_per_iter: f64,
}

/// The argument block of [`eplb_aicpu_rebalance`] (`eplb_aicpu_args` in C), version 3.
///
/// Lengths count elements (not bytes) and may exceed what the shape needs; only the first
/// elements needed are read or written. `ranks_per_node = 0` means one node (`R`), `groups = 0`
/// means one group. `windows = 0` means no per-window samples (`samples` is then ignored).
/// `state` may be null when [`eplb_aicpu_state_len`] is 0. The first 8 bytes (`version`,
/// `struct_size`) are the same in every version; a version 1 block is the first 248 bytes
/// (up to and including `result`), a version 2 block the first 408 (up to and including
/// `gate_result`), and the call reads and writes nothing beyond them.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EplbAicpuArgs {
    /// [`EPLB_AICPU_ABI_VERSION`].
    pub version: u32,
    /// `size_of::<EplbAicpuArgs>()` (432).
    pub struct_size: u32,
    /// MoE layers `L`.
    pub layers: u16,
    /// Logical experts per layer `N`.
    pub experts: u16,
    /// EP ranks `R`.
    pub ranks: u16,
    /// Physical slots per rank `S`.
    pub slots_per_rank: u16,
    /// Ranks per node (0: `R`).
    pub ranks_per_node: u16,
    /// Expert groups (0: 1).
    pub groups: u16,
    /// `EPLB_AICPU_POLICY_*`.
    pub policy: u32,
    /// Seed (the random policy's).
    pub seed: u64,
    /// Per-window samples `T` (0: none).
    pub windows: u64,
    /// Current placement `[L][R][S]`, read.
    pub current: *const u16,
    /// Elements at `current` (at least `L*R*S`).
    pub current_len: u64,
    /// Logical loads `[L][N]`, finite and `>= 0`, read.
    pub loads: *const f64,
    /// Elements at `loads` (at least `L*N`).
    pub loads_len: u64,
    /// Per-window loads `[T][L][N]`, oldest first, read when `windows >= 1`.
    pub samples: *const f64,
    /// Elements at `samples` (at least `T*L*N`).
    pub samples_len: u64,
    /// New placement `[L][R][S]`, written.
    pub out_placement: *mut u16,
    /// Elements at `out_placement` (at least `L*R*S`).
    pub out_placement_len: u64,
    /// Per layer: 1 if the layer changed, else 0; written.
    pub out_changed: *mut u8,
    /// Elements at `out_changed` (at least `L`).
    pub out_changed_len: u64,
    /// Per layer: PAR of the current placement (even split over replicas); written.
    pub out_par_before: *mut f64,
    /// Elements at `out_par_before` (at least `L`).
    pub out_par_before_len: u64,
    /// Per layer: PAR of the new placement; written.
    pub out_par_after: *mut f64,
    /// Elements at `out_par_after` (at least `L`).
    pub out_par_after_len: u64,
    /// Per-call scratch, contents unspecified before and after.
    pub scratch: *mut u64,
    /// Words at `scratch` (at least [`eplb_aicpu_scratch_len_v2`]).
    pub scratch_len: u64,
    /// Policy state kept across calls; zeros are a fresh state. With the gate on, the policy's
    /// words are followed by one word per layer: the cycles its placement has lived.
    pub state: *mut u64,
    /// Words at `state` (at least [`eplb_aicpu_state_len_v2`]).
    pub state_len: u64,
    /// Written by the call.
    pub result: EplbAicpuResult,
    /// Version 2: 1 turns the pay-off gate on, 0 leaves it off.
    pub payoff_gate: u32,
    /// Version 2: set to 0 (not read).
    pub reserved: u32,
    /// Version 2: the gate's inputs, read when `payoff_gate = 1`.
    pub gate: EplbAicpuGate,
    /// Version 2: written by the call.
    pub gate_result: EplbAicpuGateResult,
    /// Version 3: the live ranks, `[R]` bytes (1 live, 0 gone), read; null: every rank live and
    /// the call is version 2's. With it set the call plans over the live ranks only
    /// (`eplb_policies::rebalance` over the live set): `current` may hold [`EPLB_AICPU_EMPTY`] (every slot of
    /// a dead rank must), `out_placement` holds it on every slot of a dead rank.
    pub live: *const u8,
    /// Version 3: elements at `live` (at least `R` when `live` is set).
    pub live_len: u64,
    /// Version 3: written by the call: (rank, expert) copies in the new placement of experts
    /// that had no copy on a live rank (to load from storage); 0 without `live`.
    pub reloads: u64,
}

impl EplbAicpuArgs {
    /// Version and size set, every other field zero or null.
    pub const fn new() -> Self {
        Self {
            version: EPLB_AICPU_ABI_VERSION,
            struct_size: size_of::<Self>() as u32,
            layers: 0,
            experts: 0,
            ranks: 0,
            slots_per_rank: 0,
            ranks_per_node: 0,
            groups: 0,
            policy: 0,
            seed: 0,
            windows: 0,
            current: ptr::null(),
            current_len: 0,
            loads: ptr::null(),
            loads_len: 0,
            samples: ptr::null(),
            samples_len: 0,
            out_placement: ptr::null_mut(),
            out_placement_len: 0,
            out_changed: ptr::null_mut(),
            out_changed_len: 0,
            out_par_before: ptr::null_mut(),
            out_par_before_len: 0,
            out_par_after: ptr::null_mut(),
            out_par_after_len: 0,
            scratch: ptr::null_mut(),
            scratch_len: 0,
            state: ptr::null_mut(),
            state_len: 0,
            result: EplbAicpuResult {
                changed_layers: 0,
                colocated_rows: 0,
                moves: 0,
                par_mean_before: 0.0,
                par_max_before: 0.0,
                par_mean_after: 0.0,
                par_max_after: 0.0,
                field: 0,
                reserved: 0,
                detail: 0,
            },
            payoff_gate: 0,
            reserved: 0,
            gate: EplbAicpuGate {
                flops_bf16: 0.0,
                flops_8bit: 0.0,
                flops_fp4: 0.0,
                hbm_bytes_per_s: 0.0,
                intra_node_bytes_per_s: 0.0,
                inter_node_bytes_per_s: 0.0,
                layer_overhead_ms: 0.0,
                collective_ms: 0.0,
                hidden: 0,
                intermediate: 0,
                experts: 0,
                top_k: 0,
                moe_layers: 0,
                shared_experts: 0,
                dtype: 0,
                routing: 0,
                tokens_per_rank: 0.0,
                expert_bytes: 0.0,
                heat_interval: 0,
                algo_interval: 0,
            },
            gate_result: EplbAicpuGateResult {
                changed_layers: 0,
                moved_layers: 0,
                held_layers: 0,
                reserved: 0,
                saving_ms_per_iter: 0.0,
                stall_ms: 0.0,
                forgone_ms_per_iter: 0.0,
            },
            live: ptr::null(),
            live_len: 0,
            reloads: 0,
        }
    }
}

impl Default for EplbAicpuArgs {
    fn default() -> Self {
        Self::new()
    }
}

// The C header asserts the same numbers with `_Static_assert`; `cargo xtask aicpu` checks that
// both lists agree.
const _: () = {
    assert!(size_of::<EplbAicpuResult>() == 64);
    assert!(align_of::<EplbAicpuResult>() == 8);
    assert!(offset_of!(EplbAicpuResult, changed_layers) == 0);
    assert!(offset_of!(EplbAicpuResult, colocated_rows) == 4);
    assert!(offset_of!(EplbAicpuResult, moves) == 8);
    assert!(offset_of!(EplbAicpuResult, par_mean_before) == 16);
    assert!(offset_of!(EplbAicpuResult, par_max_before) == 24);
    assert!(offset_of!(EplbAicpuResult, par_mean_after) == 32);
    assert!(offset_of!(EplbAicpuResult, par_max_after) == 40);
    assert!(offset_of!(EplbAicpuResult, field) == 48);
    assert!(offset_of!(EplbAicpuResult, reserved) == 52);
    assert!(offset_of!(EplbAicpuResult, detail) == 56);

    assert!(size_of::<EplbAicpuGate>() == 112);
    assert!(align_of::<EplbAicpuGate>() == 8);
    assert!(offset_of!(EplbAicpuGate, flops_bf16) == 0);
    assert!(offset_of!(EplbAicpuGate, flops_8bit) == 8);
    assert!(offset_of!(EplbAicpuGate, flops_fp4) == 16);
    assert!(offset_of!(EplbAicpuGate, hbm_bytes_per_s) == 24);
    assert!(offset_of!(EplbAicpuGate, intra_node_bytes_per_s) == 32);
    assert!(offset_of!(EplbAicpuGate, inter_node_bytes_per_s) == 40);
    assert!(offset_of!(EplbAicpuGate, layer_overhead_ms) == 48);
    assert!(offset_of!(EplbAicpuGate, collective_ms) == 56);
    assert!(offset_of!(EplbAicpuGate, hidden) == 64);
    assert!(offset_of!(EplbAicpuGate, intermediate) == 68);
    assert!(offset_of!(EplbAicpuGate, experts) == 72);
    assert!(offset_of!(EplbAicpuGate, top_k) == 74);
    assert!(offset_of!(EplbAicpuGate, moe_layers) == 76);
    assert!(offset_of!(EplbAicpuGate, shared_experts) == 78);
    assert!(offset_of!(EplbAicpuGate, dtype) == 80);
    assert!(offset_of!(EplbAicpuGate, routing) == 84);
    assert!(offset_of!(EplbAicpuGate, tokens_per_rank) == 88);
    assert!(offset_of!(EplbAicpuGate, expert_bytes) == 96);
    assert!(offset_of!(EplbAicpuGate, heat_interval) == 104);
    assert!(offset_of!(EplbAicpuGate, algo_interval) == 108);

    assert!(size_of::<EplbAicpuGateResult>() == 40);
    assert!(align_of::<EplbAicpuGateResult>() == 8);
    assert!(offset_of!(EplbAicpuGateResult, changed_layers) == 0);
    assert!(offset_of!(EplbAicpuGateResult, moved_layers) == 4);
    assert!(offset_of!(EplbAicpuGateResult, held_layers) == 8);
    assert!(offset_of!(EplbAicpuGateResult, reserved) == 12);
    assert!(offset_of!(EplbAicpuGateResult, saving_ms_per_iter) == 16);
    assert!(offset_of!(EplbAicpuGateResult, stall_ms) == 24);
    assert!(offset_of!(EplbAicpuGateResult, forgone_ms_per_iter) == 32);

    assert!(size_of::<EplbAicpuArgs>() == 432);
    assert!(align_of::<EplbAicpuArgs>() == 8);
    assert!(offset_of!(EplbAicpuArgs, version) == 0);
    assert!(offset_of!(EplbAicpuArgs, struct_size) == 4);
    assert!(offset_of!(EplbAicpuArgs, layers) == 8);
    assert!(offset_of!(EplbAicpuArgs, experts) == 10);
    assert!(offset_of!(EplbAicpuArgs, ranks) == 12);
    assert!(offset_of!(EplbAicpuArgs, slots_per_rank) == 14);
    assert!(offset_of!(EplbAicpuArgs, ranks_per_node) == 16);
    assert!(offset_of!(EplbAicpuArgs, groups) == 18);
    assert!(offset_of!(EplbAicpuArgs, policy) == 20);
    assert!(offset_of!(EplbAicpuArgs, seed) == 24);
    assert!(offset_of!(EplbAicpuArgs, windows) == 32);
    assert!(offset_of!(EplbAicpuArgs, current) == 40);
    assert!(offset_of!(EplbAicpuArgs, current_len) == 48);
    assert!(offset_of!(EplbAicpuArgs, loads) == 56);
    assert!(offset_of!(EplbAicpuArgs, loads_len) == 64);
    assert!(offset_of!(EplbAicpuArgs, samples) == 72);
    assert!(offset_of!(EplbAicpuArgs, samples_len) == 80);
    assert!(offset_of!(EplbAicpuArgs, out_placement) == 88);
    assert!(offset_of!(EplbAicpuArgs, out_placement_len) == 96);
    assert!(offset_of!(EplbAicpuArgs, out_changed) == 104);
    assert!(offset_of!(EplbAicpuArgs, out_changed_len) == 112);
    assert!(offset_of!(EplbAicpuArgs, out_par_before) == 120);
    assert!(offset_of!(EplbAicpuArgs, out_par_before_len) == 128);
    assert!(offset_of!(EplbAicpuArgs, out_par_after) == 136);
    assert!(offset_of!(EplbAicpuArgs, out_par_after_len) == 144);
    assert!(offset_of!(EplbAicpuArgs, scratch) == 152);
    assert!(offset_of!(EplbAicpuArgs, scratch_len) == 160);
    assert!(offset_of!(EplbAicpuArgs, state) == 168);
    assert!(offset_of!(EplbAicpuArgs, state_len) == 176);
    assert!(offset_of!(EplbAicpuArgs, result) == 184);
    assert!(offset_of!(EplbAicpuArgs, payoff_gate) == 248);
    assert!(offset_of!(EplbAicpuArgs, reserved) == 252);
    assert!(offset_of!(EplbAicpuArgs, gate) == 256);
    assert!(offset_of!(EplbAicpuArgs, gate_result) == 368);
    assert!(offset_of!(EplbAicpuArgs, live) == 408);
    assert!(offset_of!(EplbAicpuArgs, live_len) == 416);
    assert!(offset_of!(EplbAicpuArgs, reloads) == 424);
    // A version 1 block is the prefix up to and including `result` (184 + 64): the version 2
    // fields start right after it.
    assert!(offset_of!(EplbAicpuArgs, payoff_gate) == EPLB_AICPU_ARGS_V1_SIZE as usize);
    // A version 2 block is the prefix up to and including `gate_result` (368 + 40).
    assert!(offset_of!(EplbAicpuArgs, live) == EPLB_AICPU_ARGS_V2_SIZE as usize);
    assert!(EPLB_AICPU_EMPTY == eplb_core::live::EMPTY);
};

/// A failed call: status code, field and detail for `result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fail {
    status: u32,
    field: u32,
    detail: u64,
}

const fn fail(status: u32, field: u32, detail: u64) -> Fail {
    Fail {
        status,
        field,
        detail,
    }
}

fn to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The policy of an `EPLB_AICPU_POLICY_*` number.
fn policy_kind(n: u32) -> Option<PolicyKind> {
    if n == EPLB_AICPU_POLICY_DEEPSEEK {
        Some(PolicyKind::DeepSeek)
    } else {
        PolicyKind::from_number(u64::from(n))
    }
}

/// The shape, with 0 meaning the default for `ranks_per_node` (`R`) and `groups` (1).
fn shape_of(
    layers: u16,
    experts: u16,
    ranks: u16,
    slots_per_rank: u16,
    ranks_per_node: u16,
    groups: u16,
) -> Option<Shape> {
    let ranks_per_node = if ranks_per_node == 0 {
        ranks
    } else {
        ranks_per_node
    };
    let groups = groups.max(1);
    Shape::with_topology(
        layers,
        experts,
        ranks,
        slots_per_rank,
        ranks_per_node,
        groups,
    )
    .ok()
}

/// Words the pay-off gate adds for `shape`: `(scratch, state)`. Scratch: the gate's `f64` and
/// `u32` buffers ([`gate::scratch_len`]) and a `u32` copy of the ages; state: one word per layer,
/// the ages.
fn gate_words(shape: &Shape) -> (usize, usize) {
    let (floats, words) = gate::scratch_len(shape);
    let l = shape.layers();
    let scratch = words_f64(floats)
        .saturating_add(words_u32(words))
        .saturating_add(words_u32(l));
    (scratch, l)
}

/// Scratch and state words for `policy` on a shape, with the gate's when `payoff_gate` is 1
/// and for any live set when `live` is 1, or `None` when the shape, the policy number or a
/// flag is invalid (the gate and a live set do not combine).
#[allow(clippy::too_many_arguments)]
fn buffer_words(
    layers: u16,
    experts: u16,
    ranks: u16,
    slots_per_rank: u16,
    ranks_per_node: u16,
    groups: u16,
    policy: u32,
    payoff_gate: u32,
    live: u32,
) -> Option<(usize, usize)> {
    let shape = shape_of(
        layers,
        experts,
        ranks,
        slots_per_rank,
        ranks_per_node,
        groups,
    )?;
    let p = AnyPolicy::new(policy_kind(policy)?);
    match (live, payoff_gate) {
        (0, _) => {}
        (1, 0) => return live_words(&p, &shape),
        _ => return None,
    }
    let (scratch, state) = (eplb_policies::scratch_len(&p, &shape), p.state_len(&shape));
    let (gs, gst) = match payoff_gate {
        0 => (0, 0),
        1 => gate_words(&shape),
        _ => return None,
    };
    Some((scratch.saturating_add(gs), state.saturating_add(gst)))
}

/// Scratch and state words of a call with `live` set, for any live set of `shape`
/// (`eplb_policies::buffer_lens`; the state is the full shape's, which covers every live
/// set). `None` when the policy refuses the shape.
fn live_words(p: &AnyPolicy, shape: &Shape) -> Option<(usize, usize)> {
    eplb_policies::buffer_lens(p, shape)
        .ok()
        .map(|b| (b.scratch, b.state))
}

/// Scratch words (`u64`) [`eplb_aicpu_rebalance`] needs for `policy` on this shape with the
/// pay-off gate off; 0 when the shape or the policy number is invalid (a valid input always
/// needs at least one word). `ranks_per_node = 0` means `R`, `groups = 0` means 1, as in
/// [`EplbAicpuArgs`]. Equal to [`eplb_aicpu_scratch_len_v2`] with `payoff_gate = 0`.
#[unsafe(no_mangle)]
pub extern "C" fn eplb_aicpu_scratch_len(
    layers: u16,
    experts: u16,
    ranks: u16,
    slots_per_rank: u16,
    ranks_per_node: u16,
    groups: u16,
    policy: u32,
) -> u64 {
    eplb_aicpu_scratch_len_v2(
        layers,
        experts,
        ranks,
        slots_per_rank,
        ranks_per_node,
        groups,
        policy,
        0,
    )
}

/// Policy state words (`u64`) for `policy` on this shape with the pay-off gate off; 0 when the
/// policy keeps no state, and also 0 when the shape or policy number is invalid (tell the two
/// apart with [`eplb_aicpu_scratch_len`], which is 0 only for invalid input). Equal to
/// [`eplb_aicpu_state_len_v2`] with `payoff_gate = 0`.
#[unsafe(no_mangle)]
pub extern "C" fn eplb_aicpu_state_len(
    layers: u16,
    experts: u16,
    ranks: u16,
    slots_per_rank: u16,
    ranks_per_node: u16,
    groups: u16,
    policy: u32,
) -> u64 {
    eplb_aicpu_state_len_v2(
        layers,
        experts,
        ranks,
        slots_per_rank,
        ranks_per_node,
        groups,
        policy,
        0,
    )
}

/// Scratch words (`u64`) for `policy` on this shape with `payoff_gate` as in [`EplbAicpuArgs`]
/// (1: the gate's scratch is added); 0 when the shape, the policy number or the flag is
/// invalid.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn eplb_aicpu_scratch_len_v2(
    layers: u16,
    experts: u16,
    ranks: u16,
    slots_per_rank: u16,
    ranks_per_node: u16,
    groups: u16,
    policy: u32,
    payoff_gate: u32,
) -> u64 {
    buffer_words(
        layers,
        experts,
        ranks,
        slots_per_rank,
        ranks_per_node,
        groups,
        policy,
        payoff_gate,
        0,
    )
    .map_or(0, |(scratch, _)| to_u64(scratch))
}

/// State words (`u64`) for `policy` on this shape with `payoff_gate` as in [`EplbAicpuArgs`]:
/// the policy's, plus one per layer (the gate's ages) when the gate is on; 0 when there is no
/// state or the input is invalid (tell them apart with [`eplb_aicpu_scratch_len_v2`]).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn eplb_aicpu_state_len_v2(
    layers: u16,
    experts: u16,
    ranks: u16,
    slots_per_rank: u16,
    ranks_per_node: u16,
    groups: u16,
    policy: u32,
    payoff_gate: u32,
) -> u64 {
    buffer_words(
        layers,
        experts,
        ranks,
        slots_per_rank,
        ranks_per_node,
        groups,
        policy,
        payoff_gate,
        0,
    )
    .map_or(0, |(_, state)| to_u64(state))
}

/// Version 3 sizing: scratch words (`u64`) for `policy` on this shape with `payoff_gate` as in
/// [`EplbAicpuArgs`] and `live` 1 for a call with `live` set (enough for *any* live set of the
/// shape, so a caller sizes once), 0 without; 0 when the shape, the policy number or a flag is
/// invalid, or when both the gate and `live` are 1 (they do not combine).
/// `eplb_aicpu_scratch_len_v3(..., g, 0)` equals `eplb_aicpu_scratch_len_v2(..., g)`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn eplb_aicpu_scratch_len_v3(
    layers: u16,
    experts: u16,
    ranks: u16,
    slots_per_rank: u16,
    ranks_per_node: u16,
    groups: u16,
    policy: u32,
    payoff_gate: u32,
    live: u32,
) -> u64 {
    buffer_words(
        layers,
        experts,
        ranks,
        slots_per_rank,
        ranks_per_node,
        groups,
        policy,
        payoff_gate,
        live,
    )
    .map_or(0, |(scratch, _)| to_u64(scratch))
}

/// Version 3 sizing: state words (`u64`) as [`eplb_aicpu_state_len_v2`], with `live` as in
/// [`eplb_aicpu_scratch_len_v3`] (with `live` 1: the full shape's policy state, which serves
/// every live set); 0 when there is no state or the input is invalid.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn eplb_aicpu_state_len_v3(
    layers: u16,
    experts: u16,
    ranks: u16,
    slots_per_rank: u16,
    ranks_per_node: u16,
    groups: u16,
    policy: u32,
    payoff_gate: u32,
    live: u32,
) -> u64 {
    buffer_words(
        layers,
        experts,
        ranks,
        slots_per_rank,
        ranks_per_node,
        groups,
        policy,
        payoff_gate,
        live,
    )
    .map_or(0, |(_, state)| to_u64(state))
}

/// The ABI version this library implements ([`EPLB_AICPU_ABI_VERSION`]), to compare with the
/// header's `EPLB_AICPU_ABI_VERSION` at run time.
#[unsafe(no_mangle)]
pub extern "C" fn eplb_aicpu_abi_version() -> u32 {
    EPLB_AICPU_ABI_VERSION
}

/// A checked buffer: where it is, how many bytes the call uses, and whether it is written.
#[derive(Debug, Clone, Copy)]
struct Region {
    field: u32,
    start: usize,
    bytes: usize,
    written: bool,
}

impl Region {
    fn overlaps(&self, other: &Region) -> bool {
        self.bytes != 0
            && other.bytes != 0
            && (self.written || other.written)
            && self.start < other.start.saturating_add(other.bytes)
            && other.start < self.start.saturating_add(self.bytes)
    }
}

/// Checks a buffer of `given` elements at `ptr` of which the call uses `needed`: not null,
/// aligned, long enough (`short` is the status when it is not), not wrapping the address space.
fn check_buffer<T>(
    field: u32,
    ptr: *const T,
    given: u64,
    needed: usize,
    short: u32,
    written: bool,
) -> Result<Region, Fail> {
    let empty = Region {
        field,
        start: ptr.addr(),
        bytes: 0,
        written,
    };
    if needed == 0 {
        return Ok(empty);
    }
    if ptr.is_null() {
        return Err(fail(EPLB_AICPU_E_NULL_POINTER, field, 0));
    }
    if !ptr.is_aligned() {
        return Err(fail(EPLB_AICPU_E_MISALIGNED, field, 0));
    }
    if given < to_u64(needed) {
        return Err(fail(short, field, to_u64(needed)));
    }
    let bytes = needed
        .checked_mul(size_of::<T>())
        .filter(|&b| isize::try_from(b).is_ok())
        .filter(|&b| ptr.addr().checked_add(b).is_some())
        .ok_or(fail(EPLB_AICPU_E_NULL_POINTER, field, 0))?;
    Ok(Region { bytes, ..empty })
}

/// Fails when a written region overlaps any other region.
fn check_overlap(regions: &[Region]) -> Result<(), Fail> {
    for (i, a) in regions.iter().enumerate() {
        for b in regions.iter().skip(i.saturating_add(1)) {
            if a.overlaps(b) {
                return Err(fail(EPLB_AICPU_E_OVERLAP, a.field, u64::from(b.field)));
            }
        }
    }
    Ok(())
}

/// `len` elements at `ptr` as a shared slice (empty when `len == 0`, whatever `ptr` is).
///
/// # Safety
/// When `len > 0`, `ptr` must be non-null, aligned, valid for reads of `len` elements for `'a`,
/// and not written through any other pointer during `'a`.
unsafe fn slice_ref<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract, restated: non-null, aligned, `len` readable elements, not
    // mutated during `'a`; `len * size_of::<T>()` was checked to fit `isize`.
    unsafe { core::slice::from_raw_parts(ptr, len) }
}

/// `len` elements at `ptr` as an exclusive slice (empty when `len == 0`, whatever `ptr` is).
///
/// # Safety
/// When `len > 0`, `ptr` must be non-null, aligned, valid for reads and writes of `len`
/// elements for `'a`, hold initialised values of `T`, and not be accessed through any other
/// pointer during `'a`.
unsafe fn slice_mut<'a, T>(ptr: *mut T, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract, restated: non-null, aligned, `len` readable and writable
    // initialised elements, no other access during `'a`; the byte size was checked to fit
    // `isize`.
    unsafe { core::slice::from_raw_parts_mut(ptr, len) }
}

/// A core error as a load problem of `field`, or `other` for anything else.
fn load_fail(e: &Error, field: u32, experts: usize, other: Fail) -> Fail {
    match e {
        Error::Core(eplb_core::Error::BadLoad { layer, index }) => {
            let at = usize::from(*layer)
                .saturating_mul(experts)
                .saturating_add(*index);
            fail(EPLB_AICPU_E_LOAD, field, to_u64(at))
        }
        _ => other,
    }
}

/// The status of a failed `rebalance`.
fn rebalance_fail(e: &Error, experts: usize) -> Fail {
    let failed = fail(EPLB_AICPU_E_POLICY_FAILED, EPLB_AICPU_FIELD_NONE, 0);
    match *e {
        Error::Scratch { needed, .. } => fail(
            EPLB_AICPU_E_SCRATCH,
            EPLB_AICPU_FIELD_SCRATCH,
            to_u64(needed),
        ),
        Error::State { needed, .. } => {
            fail(EPLB_AICPU_E_STATE, EPLB_AICPU_FIELD_STATE, to_u64(needed))
        }
        Error::SamplesRequired { .. } => {
            fail(EPLB_AICPU_E_SAMPLES_REQUIRED, EPLB_AICPU_FIELD_SAMPLES, 0)
        }
        Error::Topology { value, .. } => {
            fail(EPLB_AICPU_E_TOPOLOGY, EPLB_AICPU_FIELD_SHAPE, to_u64(value))
        }
        Error::UnknownPolicy => fail(EPLB_AICPU_E_POLICY, EPLB_AICPU_FIELD_POLICY, 0),
        Error::NoPlacement { layer, .. } => fail(
            EPLB_AICPU_E_POLICY_FAILED,
            EPLB_AICPU_FIELD_NONE,
            u64::from(layer),
        ),
        _ => load_fail(e, EPLB_AICPU_FIELD_LOADS, experts, failed),
    }
}

/// The layer a placement error names, or 0.
fn placement_layer(e: &eplb_core::Error) -> u64 {
    match *e {
        eplb_core::Error::ExpertOutOfRange { layer, .. }
        | eplb_core::Error::MissingExpert { layer, .. }
        | eplb_core::Error::ColocatedCopies { layer, .. }
        | eplb_core::Error::NotLive { layer, .. } => u64::from(layer),
        _ => 0,
    }
}

/// A `double` of the gate that must be finite and `> 0` (`zero_ok`: `>= 0`).
fn gate_rate(field: u32, v: f64, zero_ok: bool) -> Result<f64, Fail> {
    if v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0)) {
        Ok(v)
    } else {
        Err(fail(EPLB_AICPU_E_GATE, field, v.to_bits()))
    }
}

/// The pay-off gate `g` describes on `shape`, each field checked (`EPLB_AICPU_E_GATE` names
/// the first bad one, in struct order). The node split is the shape's, as in the runtime: a
/// split only when `ranks_per_node < R`.
fn gate_of(g: &EplbAicpuGate, shape: &Shape) -> Result<Gate, Fail> {
    let bad = |field: u32, v: u64| fail(EPLB_AICPU_E_GATE, field, v);
    let hardware = Hardware {
        name: "aicpu",
        flops_bf16: gate_rate(EPLB_AICPU_FIELD_GATE_FLOPS_BF16, g.flops_bf16, false)?,
        flops_8bit: gate_rate(EPLB_AICPU_FIELD_GATE_FLOPS_8BIT, g.flops_8bit, false)?,
        flops_fp4: gate_rate(EPLB_AICPU_FIELD_GATE_FLOPS_FP4, g.flops_fp4, true)?,
        hbm_bytes_per_s: gate_rate(EPLB_AICPU_FIELD_GATE_HBM, g.hbm_bytes_per_s, false)?,
        intra_node_bytes_per_s: gate_rate(
            EPLB_AICPU_FIELD_GATE_INTRA_NODE,
            g.intra_node_bytes_per_s,
            false,
        )?,
        inter_node_bytes_per_s: gate_rate(
            EPLB_AICPU_FIELD_GATE_INTER_NODE,
            g.inter_node_bytes_per_s,
            false,
        )?,
        layer_overhead_ms: gate_rate(
            EPLB_AICPU_FIELD_GATE_LAYER_OVERHEAD,
            g.layer_overhead_ms,
            true,
        )?,
        collective_ms: gate_rate(EPLB_AICPU_FIELD_GATE_COLLECTIVE, g.collective_ms, true)?,
    };
    if g.hidden == 0 {
        return Err(bad(EPLB_AICPU_FIELD_GATE_HIDDEN, 0));
    }
    if g.intermediate == 0 {
        return Err(bad(EPLB_AICPU_FIELD_GATE_INTERMEDIATE, 0));
    }
    let or = |v: u16, default: usize| {
        if v == 0 {
            u16::try_from(default).unwrap_or(u16::MAX)
        } else {
            v
        }
    };
    let experts = or(g.experts, shape.experts());
    if g.top_k == 0 || g.top_k > experts {
        return Err(bad(EPLB_AICPU_FIELD_GATE_TOP_K, u64::from(g.top_k)));
    }
    let dtype = match g.dtype {
        EPLB_AICPU_DTYPE_BF16 => Dtype::Bf16,
        EPLB_AICPU_DTYPE_INT8 => Dtype::Int8,
        EPLB_AICPU_DTYPE_FP8 => Dtype::Fp8,
        EPLB_AICPU_DTYPE_FP4 => Dtype::Fp4,
        d => return Err(bad(EPLB_AICPU_FIELD_GATE_DTYPE, u64::from(d))),
    };
    let routing = match g.routing {
        EPLB_AICPU_ROUTING_LOG2PHY => Routing::Log2Phy,
        EPLB_AICPU_ROUTING_EVEN => Routing::Even,
        r => return Err(bad(EPLB_AICPU_FIELD_GATE_ROUTING, u64::from(r))),
    };
    let tokens_per_rank = gate_rate(
        EPLB_AICPU_FIELD_GATE_TOKENS_PER_RANK,
        g.tokens_per_rank,
        false,
    )?;
    let expert_bytes = gate_rate(EPLB_AICPU_FIELD_GATE_EXPERT_BYTES, g.expert_bytes, true)?;
    let iterations = u64::from(g.heat_interval).saturating_add(u64::from(g.algo_interval));
    if iterations == 0 {
        return Err(bad(EPLB_AICPU_FIELD_GATE_INTERVALS, 0));
    }
    let rpn = shape.ranks_per_node();
    let model = TimeModel {
        hardware,
        model: ModelSpec {
            name: "aicpu",
            label: "aicpu",
            aliases: &[],
            hidden: g.hidden,
            intermediate: g.intermediate,
            experts,
            top_k: g.top_k,
            moe_layers: or(g.moe_layers, shape.layers()),
            shared_experts: g.shared_experts,
            dtype,
        },
        tokens_per_rank,
        expert_bytes,
        ranks_per_node: (rpn > 0 && rpn < shape.ranks())
            .then(|| u16::try_from(rpn).ok())
            .flatten(),
    };
    // Every number was checked above; this is the core's own check, kept as a backstop.
    model
        .check()
        .map_err(|_| fail(EPLB_AICPU_E_GATE, EPLB_AICPU_FIELD_NONE, 0))?;
    // The block carries no step time besides the MoE layers: the gate weighs a move against
    // the MoE time alone (conservative: it errs toward not moving).
    Ok(Gate {
        model,
        iterations,
        routing,
        step_other_ms: 0.0,
    })
}

/// What a successful call writes into the argument block.
#[derive(Debug, Clone, Copy, Default)]
struct Done {
    result: EplbAicpuResult,
    gate: EplbAicpuGateResult,
    reloads: u64,
}

/// Everything after the version check: validates `a`, builds slices, runs the policy (over the
/// live ranks when `a.live` is set) and, when `a.payoff_gate` is 1, the gate. `args_addr` and
/// `args_bytes` say where the argument struct lives (no buffer may overlap it). A version 1 or
/// 2 block arrives here with the later versions' fields as [`EplbAicpuArgs::new`] has them: the
/// gate off, no live set.
fn run(a: &EplbAicpuArgs, args_addr: usize, args_bytes: usize) -> Result<Done, Fail> {
    let shape = shape_of(
        a.layers,
        a.experts,
        a.ranks,
        a.slots_per_rank,
        a.ranks_per_node,
        a.groups,
    )
    .ok_or(fail(EPLB_AICPU_E_SHAPE, EPLB_AICPU_FIELD_SHAPE, 0))?;
    let kind = policy_kind(a.policy).ok_or(fail(
        EPLB_AICPU_E_POLICY,
        EPLB_AICPU_FIELD_POLICY,
        u64::from(a.policy),
    ))?;
    let elastic = !a.live.is_null();
    if elastic && a.payoff_gate != 0 {
        return Err(fail(
            EPLB_AICPU_E_LIVE,
            EPLB_AICPU_FIELD_PAYOFF_GATE,
            u64::from(a.payoff_gate),
        ));
    }
    let gate = match a.payoff_gate {
        0 => None,
        1 => Some(gate_of(&a.gate, &shape)?),
        v => {
            return Err(fail(
                EPLB_AICPU_E_GATE,
                EPLB_AICPU_FIELD_PAYOFF_GATE,
                u64::from(v),
            ));
        }
    };
    let mut policy = AnyPolicy::new(kind);
    let (policy_scratch, policy_state) = (
        eplb_policies::scratch_len(&policy, &shape),
        policy.state_len(&shape),
    );
    let (gate_scratch, gate_state) = if gate.is_some() {
        gate_words(&shape)
    } else {
        (0, 0)
    };
    let scratch_needed = policy_scratch.saturating_add(gate_scratch);
    let state_needed = policy_state.saturating_add(gate_state);
    let (l, n) = (shape.layers(), shape.experts());
    let (p, ln) = (shape.placement_len(), shape.loads_len());
    let too_many_windows = fail(EPLB_AICPU_E_TOO_SHORT, EPLB_AICPU_FIELD_SAMPLES, u64::MAX);
    let windows = usize::try_from(a.windows).map_err(|_| too_many_windows)?;
    let samples_needed = windows.checked_mul(ln).ok_or(too_many_windows)?;

    const SHORT: u32 = EPLB_AICPU_E_TOO_SHORT;
    let regions = [
        Region {
            field: EPLB_AICPU_FIELD_ARGS,
            start: args_addr,
            bytes: args_bytes,
            written: true,
        },
        check_buffer(
            EPLB_AICPU_FIELD_CURRENT,
            a.current,
            a.current_len,
            p,
            SHORT,
            false,
        )?,
        check_buffer(
            EPLB_AICPU_FIELD_LOADS,
            a.loads,
            a.loads_len,
            ln,
            SHORT,
            false,
        )?,
        check_buffer(
            EPLB_AICPU_FIELD_SAMPLES,
            a.samples,
            a.samples_len,
            samples_needed,
            SHORT,
            false,
        )?,
        check_buffer(
            EPLB_AICPU_FIELD_OUT_PLACEMENT,
            a.out_placement,
            a.out_placement_len,
            p,
            SHORT,
            true,
        )?,
        check_buffer(
            EPLB_AICPU_FIELD_OUT_CHANGED,
            a.out_changed,
            a.out_changed_len,
            l,
            SHORT,
            true,
        )?,
        check_buffer(
            EPLB_AICPU_FIELD_OUT_PAR_BEFORE,
            a.out_par_before,
            a.out_par_before_len,
            l,
            SHORT,
            true,
        )?,
        check_buffer(
            EPLB_AICPU_FIELD_OUT_PAR_AFTER,
            a.out_par_after,
            a.out_par_after_len,
            l,
            SHORT,
            true,
        )?,
        check_buffer(
            EPLB_AICPU_FIELD_SCRATCH,
            a.scratch,
            a.scratch_len,
            scratch_needed,
            EPLB_AICPU_E_SCRATCH,
            true,
        )?,
        check_buffer(
            EPLB_AICPU_FIELD_STATE,
            a.state,
            a.state_len,
            state_needed,
            EPLB_AICPU_E_STATE,
            true,
        )?,
        check_buffer(
            EPLB_AICPU_FIELD_LIVE,
            a.live,
            a.live_len,
            if elastic { shape.ranks() } else { 0 },
            SHORT,
            false,
        )?,
    ];
    check_overlap(&regions)?;

    // From here on every buffer is non-null (or unused), aligned, long enough, inside the
    // address space, and no written buffer overlaps another buffer or the argument struct. The
    // caller promised that each pointer is valid for its stated length during this call, and
    // that nobody else touches the buffers meanwhile (`eplb_aicpu_rebalance`'s `# Safety`).

    // SAFETY: `current` checked above for `p` elements; read only, overlaps no written buffer.
    let current = unsafe { slice_ref(a.current, p) };
    // SAFETY: `loads` checked above for `ln` elements; read only, overlaps no written buffer.
    let loads = unsafe { slice_ref(a.loads, ln) };
    // SAFETY: `samples` checked above for `samples_needed` elements (0 when `windows == 0`,
    // then not dereferenced); read only, overlaps no written buffer.
    let samples = unsafe { slice_ref(a.samples, samples_needed) };
    // SAFETY: `out_placement` checked above for `p` elements, overlaps nothing; any `u16` bit
    // pattern is valid.
    let out_placement = unsafe { slice_mut(a.out_placement, p) };
    // SAFETY: `out_changed` checked above for `l` bytes, overlaps nothing; any `u8` is valid.
    let changed_bytes = unsafe { slice_mut(a.out_changed, l) };
    // SAFETY: `out_par_before` checked above for `l` elements, overlaps nothing; any bit pattern
    // is a valid `f64`.
    let par_before = unsafe { slice_mut(a.out_par_before, l) };
    // SAFETY: as for `out_par_before`.
    let par_after = unsafe { slice_mut(a.out_par_after, l) };
    // SAFETY: `scratch` checked above for `scratch_needed` words, overlaps nothing; any `u64` is
    // valid.
    let scratch = unsafe { slice_mut(a.scratch, scratch_needed) };
    // SAFETY: `state` checked above for `state_needed` words (0: not dereferenced), overlaps
    // nothing; any `u64` is valid.
    let state = unsafe { slice_mut(a.state, state_needed) };
    // SAFETY: `live` checked above for `R` bytes when set (else 0, not dereferenced); read
    // only, overlaps no written buffer.
    let live_flags = unsafe { slice_ref(a.live, if elastic { shape.ranks() } else { 0 }) };

    // `rebalance` reports per-layer flags as `bool`; the C side sees bytes 0 and 1.
    changed_bytes.fill(0);
    let changed_ptr = ptr::from_mut(changed_bytes) as *mut [bool];
    // SAFETY: `bool` has the size and alignment of `u8`; every byte was just set to 0, a valid
    // `bool`, and `rebalance` stores only valid `bool`s. `changed_bytes` is not used again, so
    // this is the only live reference to those bytes.
    let changed = unsafe { &mut *changed_ptr };

    let samples = if windows == 0 {
        None
    } else {
        let other = fail(EPLB_AICPU_E_TOO_SHORT, EPLB_AICPU_FIELD_SAMPLES, 0);
        Some(
            Samples::new(&shape, windows, samples)
                .map_err(|e| load_fail(&e, EPLB_AICPU_FIELD_SAMPLES, n, other))?,
        )
    };
    let out_of = |placement, changed, par_before, par_after| Output {
        placement,
        changed,
        par_before,
        par_after,
    };
    if elastic {
        let live = live_set(&mut policy, shape, live_flags)?;
        let summary =
            live_input(shape, current, &live, loads, samples, a.seed).and_then(|input| {
                eplb_policies::rebalance(
                    &mut policy,
                    &input,
                    scratch,
                    state,
                    out_of(out_placement, changed, par_before, par_after),
                )
                .map_err(|e| rebalance_fail(&e, n))
            })?;
        return Ok(Done {
            result: result_of(&summary),
            gate: EplbAicpuGateResult::default(),
            reloads: to_u64(summary.reloads),
        });
    }
    let current = Placement::new(shape, current).map_err(|e| {
        fail(
            EPLB_AICPU_E_PLACEMENT,
            EPLB_AICPU_FIELD_CURRENT,
            placement_layer(&e),
        )
    })?;
    let other = fail(EPLB_AICPU_E_TOO_SHORT, EPLB_AICPU_FIELD_LOADS, 0);
    let input = Input::new(current, loads, samples, a.seed)
        .map_err(|e| load_fail(&e, EPLB_AICPU_FIELD_LOADS, n, other))?;
    let out = Output {
        placement: &mut *out_placement,
        changed: &mut *changed,
        par_before: &mut *par_before,
        par_after: &mut *par_after,
    };
    // The policy's part of the scratch and the state first, the gate's after it.
    let short_scratch = fail(
        EPLB_AICPU_E_SCRATCH,
        EPLB_AICPU_FIELD_SCRATCH,
        to_u64(scratch_needed),
    );
    let (scratch, gate_scratch) = scratch
        .split_at_mut_checked(policy_scratch)
        .ok_or(short_scratch)?;
    let (state, ages) = state.split_at_mut_checked(policy_state).ok_or(fail(
        EPLB_AICPU_E_STATE,
        EPLB_AICPU_FIELD_STATE,
        to_u64(state_needed),
    ))?;
    let mut summary = eplb_policies::rebalance(&mut policy, &input, scratch, state, out)
        .map_err(|e| rebalance_fail(&e, n))?;
    let mut gate_result = EplbAicpuGateResult::default();
    if let Some(g) = gate {
        let out = Output {
            placement: out_placement,
            changed,
            par_before,
            par_after,
        };
        let gated = apply_gate(&g, &input, out, gate_scratch, ages, &mut summary);
        // Every input of the gate was checked: a failure here is a bug.
        gate_result = gated.map_err(|_| fail(EPLB_AICPU_E_GATE, EPLB_AICPU_FIELD_NONE, 0))?;
    }
    Ok(Done {
        result: result_of(&summary),
        gate: gate_result,
        reloads: 0,
    })
}

/// The `result` of a successful call.
fn result_of(summary: &eplb_policies::Summary) -> EplbAicpuResult {
    EplbAicpuResult {
        changed_layers: to_u32(summary.changed_layers),
        colocated_rows: to_u32(summary.colocated_rows),
        moves: to_u64(summary.moves),
        par_mean_before: summary.before.mean,
        par_max_before: summary.before.max,
        par_mean_after: summary.after.mean,
        par_max_after: summary.after.max,
        field: EPLB_AICPU_FIELD_NONE,
        reserved: 0,
        detail: 0,
    }
}

/// The checked live set of a call with `live` set: the set of `flags` (each byte 0 or 1), with
/// enough live ranks, and a full shape that suits the policy.
fn live_set(
    policy: &mut AnyPolicy,
    shape: Shape,
    flags: &[u8],
) -> Result<eplb_policies::LiveSet, Fail> {
    let bad_live = |detail: usize| fail(EPLB_AICPU_E_LIVE, EPLB_AICPU_FIELD_LIVE, to_u64(detail));
    let mut live = eplb_policies::LiveSet::none(shape.ranks()).map_err(|_| bad_live(0))?;
    for (r, &f) in flags.iter().enumerate() {
        match f {
            0 => {}
            1 => live.insert(r).map_err(|_| bad_live(r))?,
            _ => return Err(bad_live(r)),
        }
    }
    if live.count().saturating_mul(shape.slots_per_rank()) < shape.experts() {
        return Err(bad_live(live.count()));
    }
    // The full shape must suit the policy, as without a live set.
    policy
        .check_shape(&shape)
        .map_err(|e| rebalance_fail(&e, shape.experts()))?;
    Ok(live)
}

/// The checked input of a call with `live` set: `current` as the placement the ranks of
/// `live` hold, then `eplb_policies::Input::new`, with their errors as status codes.
fn live_input<'a>(
    shape: Shape,
    current: &'a [u16],
    live: &'a eplb_policies::LiveSet,
    loads: &'a [f64],
    samples: Option<Samples<'a>>,
    seed: u64,
) -> Result<Input<'a>, Fail> {
    let bad_live = |detail: usize| fail(EPLB_AICPU_E_LIVE, EPLB_AICPU_FIELD_LIVE, to_u64(detail));
    Placement::with_live(shape, current, live)
        .map_err(Error::from)
        .and_then(|p| Input::new(p, loads, samples, seed))
        .map_err(|e| match e {
            Error::Core(
                ref c @ (eplb_core::Error::NotLive { .. }
                | eplb_core::Error::ExpertOutOfRange { .. }
                | eplb_core::Error::Length { .. }),
            ) => fail(
                EPLB_AICPU_E_PLACEMENT,
                EPLB_AICPU_FIELD_CURRENT,
                placement_layer(c),
            ),
            Error::TooFewLiveRanks { live, .. } => bad_live(live),
            e => load_fail(
                &e,
                EPLB_AICPU_FIELD_LOADS,
                shape.experts(),
                fail(EPLB_AICPU_E_TOO_SHORT, EPLB_AICPU_FIELD_LOADS, 0),
            ),
        })
}

/// Applies the pay-off gate to the policy's output `out` (computed from `input`) as the
/// runtime's `PolicyHost` does: layers that do not pay get their current rows back, their
/// changed flag cleared and their PAR after set to their PAR before; `summary`'s changed
/// layers, moves, co-located rows and PAR after are recomputed for the gated placement. `ages`
/// (one word per layer, in the caller's state: the cycles the layer's placement has lived, 0
/// read as 1) are read, then advanced: 1 for a layer that moves, one more for the others.
/// `scratch` holds [`gate_words`] words.
fn apply_gate(
    g: &Gate,
    input: &Input<'_>,
    out: Output<'_>,
    scratch: &mut [u64],
    ages: &mut [u64],
    summary: &mut eplb_policies::Summary,
) -> Result<EplbAicpuGateResult, Error> {
    let shape = *input.shape();
    let (l, r) = (shape.layers(), shape.ranks());
    let current = input.current().as_slice();
    let (floats, words) = gate::scratch_len(&shape);
    let mut arena = Arena::new(scratch);
    let floats = arena.f64s(floats)?;
    let words = arena.u32s(words)?;
    let read_ages = arena.u32s(l)?;
    for (a, &w) in read_ages.iter_mut().zip(ages.iter()) {
        *a = u32::try_from(w).unwrap_or(u32::MAX);
    }
    // `out.changed` says which layers the policy changed; the gate rewrites it to the layers
    // that move (a subset of them).
    let sum = g.apply(
        &shape,
        current,
        out.placement,
        input.loads(),
        gate::Scratch {
            floats: &mut *floats,
            words: &mut *words,
            ages: read_ages,
        },
        out.changed,
    )?;
    let per = shape.slots_per_layer();
    let mut moves = 0usize;
    for ((((moved, old), new), after), &before) in out
        .changed
        .iter()
        .zip(current.chunks_exact(per))
        .zip(out.placement.chunks_exact(per))
        .zip(out.par_after.iter_mut())
        .zip(out.par_before.iter())
    {
        if *moved {
            moves = moves.saturating_add(metrics::moves(old, new, shape.slots_per_rank()));
        } else {
            // A held layer (or one the policy left alone: the same rows, so the same PAR).
            *after = before;
        }
    }
    let p = Placement::new(shape, out.placement)?;
    let (per_layer, rank_buf) = floats.split_at_mut_checked(l).unwrap_or_default();
    let rank_buf = rank_buf.get_mut(..r).unwrap_or_default();
    let m_scratch = words
        .get_mut(..metrics::scratch_len(&shape))
        .unwrap_or_default();
    summary.after = metrics::hotness(
        &p,
        input.loads(),
        Routing::Even,
        m_scratch,
        rank_buf,
        per_layer,
    )?;
    summary.changed_layers = out.changed.iter().filter(|&&c| c).count();
    summary.moves = moves;
    summary.colocated_rows = p.colocated_rows();
    for ((age, &read), &moved) in ages
        .iter_mut()
        .zip(read_ages.iter())
        .zip(out.changed.iter())
    {
        *age = if moved {
            1
        } else {
            u64::from(read.max(1).saturating_add(1))
        };
    }
    Ok(EplbAicpuGateResult {
        changed_layers: to_u32(sum.changed),
        moved_layers: to_u32(sum.moved),
        held_layers: to_u32(sum.changed.saturating_sub(sum.moved)),
        reserved: 0,
        saving_ms_per_iter: sum.saving_ms_per_iter,
        stall_ms: sum.stall_ms,
        forgone_ms_per_iter: sum.forgone_ms_per_iter,
    })
}

/// Runs one rebalance described by `args` (an `eplb_aicpu_args`, i.e. [`EplbAicpuArgs`]) and
/// returns `EPLB_AICPU_OK` or an `EPLB_AICPU_E_*` status. Fits the AICPU kernel signature
/// `uint32_t Fn(void *args)`.
///
/// Checks, in this order: `args` non-null and 8-byte aligned, `version` and `struct_size`
/// (3 and 432, 2 and 408, or 1 and 248), the shape, the policy number, `payoff_gate` not set
/// with a live set (version 3), the pay-off gate (version 2: `payoff_gate`, then with it on
/// each field of `gate`), then each buffer (`current`, `loads`, `samples`, `out_placement`,
/// `out_changed`, `out_par_before`, `out_par_after`, `scratch`, `state`, `live`: null,
/// alignment, length; scratch and state sized with the gate's words when it is on, for any
/// live set when `live` is set), overlaps, the samples, with `live` set the live bytes and the
/// live count, the current placement and the loads; then runs `eplb_policies::rebalance` (or
/// `rebalance` over the live set with `live` set) and, when on, the gate. After the version check
/// `args.result` (and, in a version 2 or 3 block, `args.gate_result`; in a version 3 block
/// `args.reloads`) is always written. On a non-zero status the
/// output buffers' contents are unspecified (keep the current placement); the gate's ages are
/// written only on success.
///
/// # Safety
/// `args` is null, or points to a readable and writable `eplb_aicpu_args` of the version and
/// size its first 8 bytes state, which are readable whatever its version. Every pointer field
/// the call uses (see [`EplbAicpuArgs`]) is valid for reads (inputs) or reads and writes
/// (outputs, scratch, state) of its stated `*_len` elements, and no other thread accesses the
/// struct or the buffers during the call. Nulls, misalignment, short lengths and overlaps are
/// detected and reported, not assumed away.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn eplb_aicpu_rebalance(args: *mut c_void) -> u32 {
    let args = args.cast::<EplbAicpuArgs>();
    if args.is_null() {
        return EPLB_AICPU_E_NULL_ARGS;
    }
    if !args.is_aligned() {
        return EPLB_AICPU_E_MISALIGNED;
    }
    // SAFETY: `args` is non-null and aligned, and the caller guarantees that its first 8 bytes
    // (`version`, `struct_size`, the same in every version) are readable.
    let prefix = unsafe { args.cast::<[u32; 2]>().read() };
    let bytes = match prefix {
        [EPLB_AICPU_ABI_VERSION, V3_SIZE] => size_of::<EplbAicpuArgs>(),
        [2, EPLB_AICPU_ARGS_V2_SIZE] => V2_BYTES,
        [1, EPLB_AICPU_ARGS_V1_SIZE] => V1_BYTES,
        _ => {
            log::debug!("eplb_aicpu_rebalance: version/size {prefix:?} not supported");
            return EPLB_AICPU_E_VERSION;
        }
    };
    // Fields of later versions that a version 1 or 2 block lacks stay as `new()` has them: the
    // gate off, no live set.
    let mut a = EplbAicpuArgs::new();
    // SAFETY: `args` is non-null and aligned, and its version and size say that `bytes` bytes
    // are readable there (the caller's contract); `a` is a local of at least `bytes` bytes
    // (`bytes <= size_of::<EplbAicpuArgs>()`), so the two cannot overlap. The first `bytes`
    // bytes of both have the same layout (asserted), and every field is an integer, a float or
    // a raw pointer, for which any initialised bit pattern is valid. No reference to `*args`
    // stays alive.
    unsafe {
        ptr::copy_nonoverlapping(
            args.cast::<u8>().cast_const(),
            ptr::from_mut(&mut a).cast::<u8>(),
            bytes,
        );
    }
    let (status, done) = match run(&a, args.addr(), bytes) {
        Ok(done) => (EPLB_AICPU_OK, done),
        Err(f) => {
            log::debug!(
                "eplb_aicpu_rebalance: status {} field {} detail {}",
                f.status,
                f.field,
                f.detail
            );
            let result = EplbAicpuResult {
                field: f.field,
                detail: f.detail,
                ..EplbAicpuResult::default()
            };
            (
                f.status,
                Done {
                    result,
                    ..Done::default()
                },
            )
        }
    };
    let out = args
        .wrapping_byte_add(offset_of!(EplbAicpuArgs, result))
        .cast::<EplbAicpuResult>();
    // SAFETY: `out` is the `result` field of the aligned, writable struct at `args` (caller's
    // contract), hence aligned; every slice made from the buffers has ended with `run`, and no
    // written buffer overlaps the struct (checked), so nothing else refers to these bytes.
    unsafe { out.write(done.result) };
    if bytes >= V2_BYTES {
        let out = args
            .wrapping_byte_add(offset_of!(EplbAicpuArgs, gate_result))
            .cast::<EplbAicpuGateResult>();
        // SAFETY: as for `result`: a version 2 or 3 block (`bytes` is at least the version 2
        // size) has this field, aligned and writable, and nothing else refers to it.
        unsafe { out.write(done.gate) };
    }
    if bytes == size_of::<EplbAicpuArgs>() {
        let out = args
            .wrapping_byte_add(offset_of!(EplbAicpuArgs, reloads))
            .cast::<u64>();
        // SAFETY: as for `result`: a version 3 block (`bytes` is its full size) has this field,
        // aligned and writable, and nothing else refers to it.
        unsafe { out.write(done.reloads) };
    }
    status
}

/// `struct_size` of a version 3 block.
const V3_SIZE: u32 = size_of::<EplbAicpuArgs>() as u32;
/// Bytes of a version 2 block.
const V2_BYTES: usize = EPLB_AICPU_ARGS_V2_SIZE as usize;
/// Bytes of a version 1 block.
const V1_BYTES: usize = EPLB_AICPU_ARGS_V1_SIZE as usize;

/// Spins forever: nothing in this crate panics on input, so reaching this is a bug. An AICPU
/// kernel has no process to abort; the host sees the kernel time out.
#[cfg(not(test))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    loop {
        core::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests;
