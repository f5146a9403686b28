//! `eplb-map`: on-disk and on-wire formats of eplb.
//!
//! **Invariant:** never trusts its input; the default build is `no_std`.
//!
//! Status: the expert-map JSON, the placement blob and the heat inputs arrive with the map issue;
//! this crate holds nothing yet.
#![no_std]
#![forbid(unsafe_code)]
