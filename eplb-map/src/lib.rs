//! `eplb-map`: the on-disk and on-wire formats of eplb.
//!
//! - [`map`]: vLLM-Ascend's expert-map JSON. The writer ([`map::write_map_json`]) is
//!   byte-compatible with vLLM-Ascend's recorder and needs no `std`; the reader
//!   (`map::read_map_json`, `std`) is strict where vLLM-Ascend is silent, in two modes:
//!   strict (co-located copies are errors) and lenient (they are counted as a warning).
//! - [`blob`]: a versioned postcard placement blob with magic, version, shape and CRC-32,
//!   encoded into and decoded from caller buffers (layout and stability in `SPEC.md`).
//! - `heat` (`std`): heat inputs (`eplb-trace/v1`, SGLang's `logical_count` dump, a plain
//!   `[L][N]` array, vLLM-Ascend's per-slot loads folded through a placement) as one `Heat`
//!   type, and `heat::sniff` to tell them apart.
//!
//! Features: none by default (`no_std`, no `alloc`: the blob codec and the JSON writer);
//! `std` adds the owned types, the JSON readers and the heat inputs (through `serde_json`);
//! `json` is another name for `std`.
//!
//! **Invariant:** the default build is `no_std` and never allocates: every buffer is the caller's.
//!
//! **Invariant:** never trusts its input and never panics on it: every decoder returns an
//! [`Error`] that says what is wrong and where (byte offset; layer, device, slot, expert;
//! window), and is fuzzed (`fuzz/`).
//!
//! **Invariant:** no I/O and no `unsafe`: callers read and write files; output is deterministic
//! (no hash-map order anywhere).
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

#[cfg(any(feature = "std", test))]
extern crate std;

pub mod blob;
mod error;
#[cfg(feature = "std")]
pub mod heat;
#[cfg(feature = "std")]
pub mod json;
pub mod map;
#[cfg(feature = "std")]
mod owned;

pub use error::{Axis, Error, Position, ShortText};
#[cfg(feature = "std")]
pub use heat::{Heat, HeatFormat, Warning};
#[cfg(feature = "std")]
pub use owned::OwnedPlacement;
