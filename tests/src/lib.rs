//! Shared helpers of the eplb workspace integration tests.
