//! `eplb-core`: the sans-IO core of the eplb expert-parallelism load balancer.
//!
//! Shapes and their validation, placements `[L][R][S]` with their expert maps and `log2phy`,
//! the initial layouts, the per-slot heat ring and its fold into logical heat, the metrics
//! (rank loads, PAR, hotness, lower bound), the heat-stage filter, the cycle state machine and
//! the serving-time model (milliseconds per iteration, the stall of moves, the pay-off gate).
//!
//! **Invariant:** no allocation: every buffer is a caller's slice or a fixed-size value.
//!
//! **Invariant:** no panics on input: bad input is an [`Error`] that says what and where
//! (the panic-free clippy lints are denied outside tests).
//!
//! **Invariant:** no I/O, no clock, no threads, no `unsafe`; logging only through `log` at
//! debug/trace level.
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

pub mod cycle;
mod error;
pub mod hash;
pub mod heat;
pub mod layout;
pub mod live;
pub mod metrics;
pub mod placement;
pub mod settings;
mod shape;
pub mod stage;
pub mod time;

pub use cycle::{Cycle, Phase, Step};
pub use error::Error;
pub use hash::{Fnv1a, fnv1a};
pub use heat::HeatRing;
pub use layout::Layout;
pub use live::{EMPTY, LiveSet, NO_COPY};
pub use metrics::{Hotness, Routing};
pub use placement::{ExpertId, LayerPlacement, NOT_HERE, Placement, ReplicaChoice};
pub use settings::SettingError;
pub use shape::Shape;
pub use stage::{HeatStage, IterationStage, StageClassifier};
pub use time::{Dtype, Hardware, LayerTime, ModelSpec, QuantType, Role, TimeModel};
