//! `eplb-aicpu`: the AICPU entry point of eplb, a C-ABI static library that runs one rebalance.
//!
//! An Ascend AICPU kernel is an aarch64 shared object whose entry is
//! `extern "C" uint32_t Fn(void *args)`, built by CANN's C++ toolchain. It links
//! `libeplb_aicpu.a`, includes `include/eplb_aicpu.h`, fills an [`EplbAicpuArgs`] (shape, policy,
//! seed and raw buffers it owns) and calls [`eplb_aicpu_rebalance`]; buffer sizes come from
//! [`eplb_aicpu_scratch_len`] and [`eplb_aicpu_state_len`]. The call is `eplb_policies::rebalance`
//! on the same inputs, so its output is byte for byte the Rust API's.
//!
//! **Invariant:** `no_std` and no allocation: every byte it reads or writes is in the buffers the
//! caller passes (and the output fields of the argument struct).
//!
//! **Invariant:** no panics on input: every pointer, alignment, length, overlap, shape, policy
//! number and load is checked, and a problem is a documented status code
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

use eplb_core::{Placement, Shape};
use eplb_policies::{AnyPolicy, Error, Input, Output, Policy, PolicyKind, Samples};

/// Version of [`EplbAicpuArgs`]; `args.version` must equal it.
pub const EPLB_AICPU_ABI_VERSION: u32 = 1;

// Status codes returned by `eplb_aicpu_rebalance`. Keep in step with `include/eplb_aicpu.h`
// (`cargo xtask aicpu` compares the two).

/// Success: the outputs and `args.result` are written.
pub const EPLB_AICPU_OK: u32 = 0;
/// `args` is null. Nothing is written.
pub const EPLB_AICPU_E_NULL_ARGS: u32 = 1;
/// `args.version` is not [`EPLB_AICPU_ABI_VERSION`] or `args.struct_size` is not
/// `sizeof(eplb_aicpu_args)`. Nothing is written.
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

/// The argument block of [`eplb_aicpu_rebalance`] (`eplb_aicpu_args` in C), version 1.
///
/// Lengths count elements (not bytes) and may exceed what the shape needs; only the first
/// elements needed are read or written. `ranks_per_node = 0` means one node (`R`), `groups = 0`
/// means one group. `windows = 0` means no per-window samples (`samples` is then ignored).
/// `state` may be null when [`eplb_aicpu_state_len`] is 0. The first 8 bytes (`version`,
/// `struct_size`) are the same in every version.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EplbAicpuArgs {
    /// [`EPLB_AICPU_ABI_VERSION`].
    pub version: u32,
    /// `size_of::<EplbAicpuArgs>()` (248).
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
    /// Words at `scratch` (at least [`eplb_aicpu_scratch_len`]).
    pub scratch_len: u64,
    /// Policy state kept across calls; zeros are a fresh state.
    pub state: *mut u64,
    /// Words at `state` (at least [`eplb_aicpu_state_len`]).
    pub state_len: u64,
    /// Written by the call.
    pub result: EplbAicpuResult,
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

    assert!(size_of::<EplbAicpuArgs>() == 248);
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

/// Scratch and state words for `policy` on a shape, or `None` when either is invalid.
fn buffer_words(
    layers: u16,
    experts: u16,
    ranks: u16,
    slots_per_rank: u16,
    ranks_per_node: u16,
    groups: u16,
    policy: u32,
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
    Some((eplb_policies::scratch_len(&p, &shape), p.state_len(&shape)))
}

/// Scratch words (`u64`) [`eplb_aicpu_rebalance`] needs for `policy` on this shape; 0 when the
/// shape or the policy number is invalid (a valid input always needs at least one word).
/// `ranks_per_node = 0` means `R`, `groups = 0` means 1, as in [`EplbAicpuArgs`].
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
    buffer_words(
        layers,
        experts,
        ranks,
        slots_per_rank,
        ranks_per_node,
        groups,
        policy,
    )
    .map_or(0, |(scratch, _)| to_u64(scratch))
}

/// Policy state words (`u64`) for `policy` on this shape; 0 when the policy keeps no state, and
/// also 0 when the shape or policy number is invalid (tell the two apart with
/// [`eplb_aicpu_scratch_len`], which is 0 only for invalid input).
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
    buffer_words(
        layers,
        experts,
        ranks,
        slots_per_rank,
        ranks_per_node,
        groups,
        policy,
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
        | eplb_core::Error::ColocatedCopies { layer, .. } => u64::from(layer),
        _ => 0,
    }
}

/// Everything after the version check: validates `a`, builds slices, runs the policy.
/// `args_addr` is where the argument struct lives (it must not overlap any buffer).
fn run(a: &EplbAicpuArgs, args_addr: usize) -> Result<EplbAicpuResult, Fail> {
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
    let mut policy = AnyPolicy::new(kind);
    let scratch_needed = eplb_policies::scratch_len(&policy, &shape);
    let state_needed = policy.state_len(&shape);
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
            bytes: size_of::<EplbAicpuArgs>(),
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

    // `rebalance` reports per-layer flags as `bool`; the C side sees bytes 0 and 1.
    changed_bytes.fill(0);
    let changed_ptr = ptr::from_mut(changed_bytes) as *mut [bool];
    // SAFETY: `bool` has the size and alignment of `u8`; every byte was just set to 0, a valid
    // `bool`, and `rebalance` stores only valid `bool`s. `changed_bytes` is not used again, so
    // this is the only live reference to those bytes.
    let changed = unsafe { &mut *changed_ptr };

    let current = Placement::new(shape, current).map_err(|e| {
        fail(
            EPLB_AICPU_E_PLACEMENT,
            EPLB_AICPU_FIELD_CURRENT,
            placement_layer(&e),
        )
    })?;
    let samples = if windows == 0 {
        None
    } else {
        let other = fail(EPLB_AICPU_E_TOO_SHORT, EPLB_AICPU_FIELD_SAMPLES, 0);
        Some(
            Samples::new(&shape, windows, samples)
                .map_err(|e| load_fail(&e, EPLB_AICPU_FIELD_SAMPLES, n, other))?,
        )
    };
    let other = fail(EPLB_AICPU_E_TOO_SHORT, EPLB_AICPU_FIELD_LOADS, 0);
    let input = Input::new(current, loads, samples, a.seed)
        .map_err(|e| load_fail(&e, EPLB_AICPU_FIELD_LOADS, n, other))?;
    let out = Output {
        placement: out_placement,
        changed,
        par_before,
        par_after,
    };
    let summary = eplb_policies::rebalance(&mut policy, &input, scratch, state, out)
        .map_err(|e| rebalance_fail(&e, n))?;
    Ok(EplbAicpuResult {
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
    })
}

/// Runs one rebalance described by `args` (an `eplb_aicpu_args`, i.e. [`EplbAicpuArgs`]) and
/// returns `EPLB_AICPU_OK` or an `EPLB_AICPU_E_*` status. Fits the AICPU kernel signature
/// `uint32_t Fn(void *args)`.
///
/// Checks, in this order: `args` non-null and 8-byte aligned, `version` and `struct_size`, the
/// shape, the policy number, then each buffer (`current`, `loads`, `samples`, `out_placement`,
/// `out_changed`, `out_par_before`, `out_par_after`, `scratch`, `state`: null, alignment,
/// length), overlaps, the current placement, the samples and the loads; then runs
/// `eplb_policies::rebalance`. After the version check `args.result` is always written. On a
/// non-zero status the output buffers' contents are unspecified (keep the current placement).
///
/// # Safety
/// `args` is null, or points to a readable and writable `eplb_aicpu_args` whose first 8 bytes
/// are readable whatever its version. Every pointer field the call uses (see
/// [`EplbAicpuArgs`]) is valid for reads (inputs) or reads and writes (outputs, scratch, state)
/// of its stated `*_len` elements, and no other thread accesses the struct or the buffers during
/// the call. Nulls, misalignment, short lengths and overlaps are detected and reported, not
/// assumed away.
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
    if prefix != [EPLB_AICPU_ABI_VERSION, size_of::<EplbAicpuArgs>() as u32] {
        log::debug!("eplb_aicpu_rebalance: version/size {prefix:?} not supported");
        return EPLB_AICPU_E_VERSION;
    }
    // SAFETY: non-null, aligned, and of this version and size, so the caller guarantees the
    // whole struct is readable; it holds only integers, floats and raw pointers, for which any
    // initialised bit pattern is valid. This is a copy: no reference to `*args` stays alive.
    let a = unsafe { args.read() };
    let (status, result) = match run(&a, args.addr()) {
        Ok(r) => (EPLB_AICPU_OK, r),
        Err(f) => {
            log::debug!(
                "eplb_aicpu_rebalance: status {} field {} detail {}",
                f.status,
                f.field,
                f.detail
            );
            let r = EplbAicpuResult {
                field: f.field,
                detail: f.detail,
                ..EplbAicpuResult::default()
            };
            (f.status, r)
        }
    };
    let out = args
        .wrapping_byte_add(offset_of!(EplbAicpuArgs, result))
        .cast::<EplbAicpuResult>();
    // SAFETY: `out` is the `result` field of the aligned, writable struct at `args` (caller's
    // contract), hence aligned; every slice made from the buffers has ended with `run`, and no
    // written buffer overlaps the struct (checked), so nothing else refers to these bytes.
    unsafe { out.write(result) };
    status
}

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
