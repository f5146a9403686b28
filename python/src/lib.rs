//! `eplb._native`: the Rust side of the Python package `eplb`.
//!
//! Numpy in, numpy out. Every entry point checks its arrays (dtype, number of dimensions,
//! sizes), copies them into Rust buffers, runs the Rust call off the GIL on a worker thread
//! while the calling thread keeps answering Ctrl-C ([`errors::guarded`]), catches any panic,
//! and maps every error to `eplb.EplbError` (a `ValueError`) carrying the Rust message, which
//! names the layer, rank and expert where it can.
//!
//! The Rust crates' `log` records go to Python's `logging`, under the `eplb` logger
//! ([`logs`]).
//!
//! Nothing here keeps a thread, a global (but the log bridge's queue) or a clock: results are a pure function of the inputs
//! and the policy's settings and state, so every rank of an engine computes the same placement.
//! A call's worker thread ends with the call (an interrupted call's, when its work stops).
#![forbid(unsafe_code)]

mod adapt;
mod convert;
mod errors;
mod logs;
mod maps;
mod policy;
mod runtime;
mod sim;

use pyo3::prelude::*;

/// Raises a Rust panic inside the guarded call (tests that a panic becomes `EplbError`). Built
/// only with the cargo feature `test-panic`, which the test build (`cargo xtask python`) turns
/// on and the shipped wheel (`pip install ./python`) does not.
#[cfg(feature = "test-panic")]
#[pyfunction]
fn _panic_for_test(py: Python<'_>) -> PyResult<()> {
    errors::guarded(py, || -> Result<(), errors::Error> {
        panic!("deliberate test panic")
    })
}

/// The module.
#[pymodule]
mod _native {
    #[pymodule_export]
    use crate::adapt::{
        PayoffGate, derive_maps, fold_slot_loads, keep_slots, policy_name, repair_current,
    };
    #[pymodule_export]
    use crate::errors::EplbError;
    #[pymodule_export]
    use crate::maps::{hotness, map_json, read_map, validate_map, write_map};
    #[pymodule_export]
    use crate::policy::{NativePolicy, Rebalance, policy_params, rebalance_experts};
    #[pymodule_export]
    use crate::runtime::{ExchangePlan, NativeRuntime, startup_placement};
    #[pymodule_export]
    use crate::sim::simulate;

    use pyo3::prelude::*;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        crate::logs::install(m.py());
        // An attribute, not an export: it stays out of `__all__`, so that the stubs (the
        // shipped module's) match the test build too.
        #[cfg(feature = "test-panic")]
        m.setattr(
            "_panic_for_test",
            wrap_pyfunction!(super::_panic_for_test, m)?,
        )?;
        m.add("__version__", env!("CARGO_PKG_VERSION"))
    }
}
