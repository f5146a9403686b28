//! `eplb-ascend-sys`: raw CANN ACL and HCCL declarations, loaded at run time.
//!
//! Status: the declarations, the loader and the fake CANN arrive with the Ascend issue; this
//! crate holds nothing yet.
