//! Errors: `eplb.EplbError`, Python's own `OSError` subclasses for I/O, and the guard that
//! runs Rust without the GIL and turns a panic into an error instead of crossing into Python.

use std::panic::{AssertUnwindSafe, catch_unwind};

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

create_exception!(
    eplb,
    EplbError,
    PyValueError,
    "An error of eplb: bad input (dtype, shape, values, sizes), an unknown policy or parameter, \
     or a failed Rust call. The message is the Rust error's, naming layer, rank and expert."
);

pub(crate) fn err(msg: impl Into<String>) -> PyErr {
    EplbError::new_err(msg.into())
}

/// Runs `f` without the GIL; a panic becomes an `EplbError` instead of crossing into Python.
pub(crate) fn guarded<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> Result<T, String> + Send,
) -> PyResult<T> {
    let r = py.detach(|| catch_unwind(AssertUnwindSafe(f)));
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(err(e)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            Err(err(format!(
                "internal error (a Rust panic, please report): {what}"
            )))
        }
    }
}

/// The Python `OSError` subclass of `e` (by its kind), with errno, message and file name.
pub(crate) fn os_error(e: &std::io::Error, path: &str) -> PyErr {
    use pyo3::exceptions::{
        PyFileNotFoundError, PyIsADirectoryError, PyOSError, PyPermissionError,
    };
    use std::io::ErrorKind;
    // Rust's text ends in " (os error N)"; Python's `strerror` is the text alone.
    let text = e.to_string();
    let strerror = match text.rfind(" (os error ") {
        Some(at) => text.get(..at).unwrap_or(&text).to_owned(),
        None => text,
    };
    let args = (e.raw_os_error().unwrap_or(0), strerror, path.to_owned());
    match e.kind() {
        ErrorKind::NotFound => PyFileNotFoundError::new_err(args),
        ErrorKind::PermissionDenied => PyPermissionError::new_err(args),
        ErrorKind::IsADirectory => PyIsADirectoryError::new_err(args),
        _ => PyOSError::new_err(args),
    }
}
