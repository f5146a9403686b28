//! `eplb._native`: the Rust side of the Python package `eplb`.
//!
//! Numpy in, numpy out. Every entry point checks its arrays (dtype, number of dimensions,
//! sizes), copies them into Rust buffers, releases the GIL for the Rust call
//! ([`Python::detach`]), catches any panic, and maps every error to `eplb.EplbError` (a
//! `ValueError`) carrying the Rust message, which names the layer, rank and expert where it can.
//!
//! Nothing here keeps a thread, a global or a clock: results are a pure function of the inputs
//! and the policy's settings and state, so every rank of an engine computes the same placement.
#![forbid(unsafe_code)]

mod adapt;
mod convert;
mod errors;
mod maps;
mod policy;
mod runtime;
mod sim;

use pyo3::prelude::*;

use adapt::{PayoffGate, derive_maps, fold_slot_loads, keep_slots, policy_name, repair_current};
use errors::{EplbError, guarded};
use maps::{hotness, map_json, read_map, validate_map, write_map};
use policy::{NativePolicy, policy_params, rebalance_experts};
use sim::simulate;

/// Raises a Rust panic inside the guarded call (tests that a panic becomes `EplbError`).
#[pyfunction]
fn _panic_for_test(py: Python<'_>) -> PyResult<()> {
    guarded(py, || -> Result<(), String> {
        panic!("deliberate test panic")
    })
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("EplbError", m.py().get_type::<EplbError>())?;
    m.add_class::<NativePolicy>()?;
    m.add_class::<runtime::NativeRuntime>()?;
    m.add_class::<runtime::ExchangePlan>()?;
    m.add_function(wrap_pyfunction!(runtime::startup_placement, m)?)?;
    m.add_function(wrap_pyfunction!(rebalance_experts, m)?)?;
    m.add_function(wrap_pyfunction!(hotness, m)?)?;
    m.add_function(wrap_pyfunction!(read_map, m)?)?;
    m.add_function(wrap_pyfunction!(validate_map, m)?)?;
    m.add_function(wrap_pyfunction!(map_json, m)?)?;
    m.add_function(wrap_pyfunction!(write_map, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(policy_params, m)?)?;
    m.add_function(wrap_pyfunction!(keep_slots, m)?)?;
    m.add_function(wrap_pyfunction!(fold_slot_loads, m)?)?;
    m.add_function(wrap_pyfunction!(derive_maps, m)?)?;
    m.add_function(wrap_pyfunction!(repair_current, m)?)?;
    m.add_function(wrap_pyfunction!(policy_name, m)?)?;
    m.add_class::<PayoffGate>()?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
