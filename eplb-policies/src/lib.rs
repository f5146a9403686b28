//! `eplb-policies`: the placement policies of eplb.
//!
//! **Invariant:** `no_std`, no allocation, no `unsafe`, no panics on input.
//!
//! Status: the `Policy` trait and the policies arrive with the policies issue; this crate holds
//! nothing yet.
#![no_std]
#![forbid(unsafe_code)]
