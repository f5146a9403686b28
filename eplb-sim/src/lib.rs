//! `eplb-sim`: eplb's offline library, the simulator and what scores its runs.
//!
//! The simulator replays a trace's windows through the serving runtime's own rank machines
//! ([`simulate`]), the cost model prices every placement change in bytes and milliseconds
//! ([`cost`]), a [`replay::Replay`] is a trace read for replay with its cost basis, and
//! [`json`] builds the `simulate --json` object and the `eplb-placements/v1` log. The `eplb`
//! tool (`eplb-cli`) and the Python package call it with typed arguments; neither clap nor
//! plotters is in this crate's dependency tree (the gate checks it).
//!
//! **Invariant:** a replay is deterministic: the same trace and settings give the same
//! placements, metrics and JSON on every platform and thread count (only the measured policy
//! wall time differs).
#![forbid(unsafe_code)]

pub mod advise;
pub mod calibrate;
pub mod cluster;
pub mod cost;
mod error;
pub mod estimate;
mod events;
pub mod json;
pub mod metrics_out;
pub mod replay;
pub mod simulate;
pub mod time;

pub use error::SimError;
pub use replay::{Replay, Run};
pub use simulate::{
    Initial, MemberEvent, MemberKind, MemberOutcome, SimConfig, SimPolicy, SimResult, SimTrace,
};
