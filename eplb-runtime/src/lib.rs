//! `eplb-runtime`: the std runtime of eplb.
//!
//! Status: the config, controller, planner, transports, simulator and CLI arrive with the
//! runtime issue; this crate holds nothing yet.
#![forbid(unsafe_code)]
