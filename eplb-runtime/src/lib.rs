//! `eplb-runtime`: the std runtime of eplb.
//!
//! The config ([`config`]), the per-rank controller that drives the core cycle ([`controller`]),
//! the planner thread ([`planner`]), transfer planning ([`transfer`]), the [`transport::Transport`] trait with
//! the in-process host transport ([`transport`]), the simulator ([`simulate`]), deployment
//! facts and usage advice ([`deployment`]), expert payloads and rebalance cost ([`payload`]), the
//! HTML report of `eplb report` ([`report`]), atomic file output ([`fsio`]) and the `eplb`
//! command-line tool.
//!
//! **Invariant:** the serving thread never blocks on the planner: a late plan is retried at the
//! next iteration, on every rank alike.
//!
//! **Invariant:** no forward sees a half-updated layer: receives land in spare buffers and a
//! layer is committed only when every rank's exchange succeeded.
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod controller;
pub mod deployment;
pub mod fsio;
pub mod modes;
pub mod payload;
pub mod planner;
pub mod policies;
pub mod rank;
pub mod report;
pub mod simulate;
pub mod transfer;
pub mod transport;
