//! `eplb-runtime`: the std serving runtime of eplb, the library an engine links.
//!
//! The config with its deployment facts ([`config`]), start-up from a config
//! ([`startup`]: modes, the initial placement, the wiring of a [`controller::Controller`]),
//! the per-rank sans-IO cycle ([`rank`]) and the controller that drives it ([`controller`]),
//! the planner thread ([`planner`]), transfer planning ([`transfer`]), the
//! [`transport::Transport`] trait with the in-process host transport and HCCL ([`transport`]),
//! expert payloads ([`payload`]), the policies by name with their parameters ([`policies`]) and
//! atomic, bounded file I/O ([`fsio`]). The simulator is `eplb-sim`; the `eplb` tool is
//! `eplb-cli`. Neither clap nor plotters is in this crate's dependency tree (the gate checks it).
//!
//! **Invariant:** the serving thread never blocks on the planner: a late plan is retried at the
//! next iteration, on every rank alike.
//!
//! **Invariant:** no forward sees a half-updated layer: receives land in spare buffers and a
//! layer is committed only when every rank's exchange succeeded.
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

pub mod calibration;
pub mod config;
pub mod controller;
pub mod fsio;
pub mod heat_record;
pub mod metrics;
pub mod payload;
pub mod planner;
pub mod policies;
pub mod rank;
pub mod startup;
pub mod transfer;
pub mod transport;
