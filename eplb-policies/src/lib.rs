//! `eplb-policies`: the placement policies of eplb.
//!
//! Every policy implements [`Policy`]: given the shape, the current placement, the logical heat
//! (and, for policies that use them, the per-window samples) and a seed, it writes a new placement
//! into a caller buffer. [`rebalance`] wraps a policy: it checks every buffer, runs it, checks the
//! result and reports per layer whether it changed and its PAR before and after.
//!
//! Memory is the caller's: per-call scratch of [`scratch_len`] words and a persistent state
//! buffer of [`Policy::state_len`] words (FlashLB's history, for instance), both pure functions
//! of the shape, so a host allocates them once and an AICPU uses static buffers. Buffers are
//! `u64` words so that any carve-out ([`Arena`]) is aligned for `f64`.
//!
//! After a membership change (elastic EP) the current placement carries its live set, and
//! [`rebalance`] plans any policy over the live ranks only ([`live`]).
//!
//! **Invariant:** `no_std`, no allocation, no `unsafe`, no panics on input: a bad input or too
//! small a buffer is an [`Error`].
//!
//! **Invariant:** deterministic: the same input and seed give the same output on every platform.
#![no_std]
#![warn(clippy::std_instead_of_core, clippy::alloc_instead_of_core)]
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]

#[cfg(test)]
extern crate std;

mod any;
mod arena;
pub mod common;
pub mod deepseek;
pub mod default;
mod error;
pub mod fixed;
pub mod flashlb;
mod heap;
pub mod incremental;
mod kind;
pub mod live;
mod params;
mod policy;
pub mod random;
mod rebalance;
pub mod swift;
#[cfg(test)]
mod test_util;

pub use any::AnyPolicy;
pub use arena::{Arena, Words, words_f64, words_u16, words_u32};
pub use error::Error;
pub use fixed::Static;
pub use kind::PolicyKind;
pub use live::{LiveSet, compact_shape, lost_experts};
pub use params::{ParamError, ParamInfo};
pub use policy::{
    BufferLens, Input, MAX_BUFFER_BYTES, MAX_RANKS, MAX_SLOTS_PER_LAYER, Output, Policy, Samples,
    Summary, check_out_len, check_range,
};
pub use rebalance::{buffer_lens, rebalance, scratch_len};
