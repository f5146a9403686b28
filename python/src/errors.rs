//! Errors: `eplb.EplbError`, Python's own `OSError` subclasses for I/O, the one error type the
//! Rust side of a call returns ([`Error`], with a `From` for every library error), and the guard
//! that runs that Rust side off the GIL, turns a panic into an error instead of crossing into
//! Python, and keeps the calling thread answering Ctrl-C ([`guarded`], [`guarded_cancel`]; a
//! short call that must borrow uses [`guarded_short`], on the calling thread).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, sync_channel};
use std::time::Duration;

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

/// What the Rust side of a call failed with: a message (`EplbError`) or a Python exception
/// made in Rust (an `OSError` subclass naming a file). Every library error converts into it
/// with `?`, so that the work closures of [`guarded`] never spell `e.to_string()`; the text is
/// the library error's `Display`, which names layer, rank and expert.
#[derive(Debug)]
pub(crate) enum Error {
    /// Raised as `EplbError(message)`.
    Eplb(String),
    /// Raised as it is.
    Py(PyErr),
}

impl From<Error> for PyErr {
    fn from(e: Error) -> Self {
        match e {
            Error::Eplb(msg) => EplbError::new_err(msg),
            Error::Py(e) => e,
        }
    }
}

impl From<PyErr> for Error {
    fn from(e: PyErr) -> Self {
        Error::Py(e)
    }
}

impl From<String> for Error {
    fn from(msg: String) -> Self {
        Error::Eplb(msg)
    }
}

impl From<&str> for Error {
    fn from(msg: &str) -> Self {
        Error::Eplb(msg.to_owned())
    }
}

/// `From` for the library errors whose `Display` is the whole message.
macro_rules! eplb_errors {
    ($($t:ty),* $(,)?) => {
        $(impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::Eplb(e.to_string())
            }
        })*
    };
}

eplb_errors!(
    eplb_core::Error,
    eplb_policies::Error,
    eplb_policies::ParamError<'_>,
    eplb_runtime::planner::PlanFailure,
    eplb_runtime::fsio::OverwritesInput,
    eplb_sim::SimError,
    eplb_sim::cost::CostError,
    numpy::ndarray::ShapeError,
    eplb_map::Error,
);

impl From<eplb_runtime::fsio::ReadError> for Error {
    /// An I/O failure is the `OSError` subclass of its kind; a refused file (not regular, too
    /// large) is an `EplbError`.
    fn from(e: eplb_runtime::fsio::ReadError) -> Self {
        match e {
            eplb_runtime::fsio::ReadError::Io(io) => Error::Py(os_error(&io, None)),
            other => Error::Eplb(other.to_string()),
        }
    }
}

/// How often the calling thread wakes, while the work runs, to run Python's signal handlers.
pub(crate) const SIGNAL_TICK: Duration = Duration::from_millis(50);

/// Set when the caller stopped waiting (Ctrl-C): work that can stop early watches it.
#[derive(Clone, Default)]
pub(crate) struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// Whether the caller has gone (the result will be dropped).
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The message of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    format!("internal error (a Rust panic, please report): {what}")
}

/// Runs `f` on the calling thread with the GIL held (work that calls back into Python, such as
/// the runtime's transport); a panic becomes an `EplbError`.
pub(crate) fn guarded_held<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => Err(err(panic_message(panic.as_ref()))),
    }
}

/// Runs `f` on the calling thread with the GIL released; a panic becomes an `EplbError`. For
/// short calls only (a per-step call of an engine, a few microseconds to milliseconds), and for
/// work that must borrow: the calling thread does not run signal handlers until `f` returns,
/// so Ctrl-C waits for it. Anything that can run long on big input uses [`guarded`].
pub(crate) fn guarded_short<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    crate::logs::around(py, || {
        match py.detach(|| catch_unwind(AssertUnwindSafe(f))) {
            Ok(r) => r.map_err(PyErr::from),
            Err(panic) => Err(err(panic_message(panic.as_ref()))),
        }
    })
}

/// Runs `f` off the GIL ([`guarded_cancel`] for work that never looks at the cancel flag).
pub(crate) fn guarded<T: Send + 'static>(
    py: Python<'_>,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> PyResult<T> {
    guarded_cancel(py, move |_| f())
}

/// Runs `f` on a worker thread with the GIL released, and returns what it returns.
///
/// A panic in `f` becomes an `EplbError` ("internal error") instead of crossing into Python.
/// While `f` runs, the calling thread wakes every [`SIGNAL_TICK`] and runs Python's signal
/// handlers (`py.check_signals()`): when one raises (Ctrl-C's `KeyboardInterrupt`), the call
/// returns that exception at once, sets `f`'s [`Cancel`] flag, and leaves the worker to finish
/// (or stop at its next look at the flag) in the background; its result is dropped. Hence
/// `'static`: `f` owns what it reads (move the buffers in; share a lock through an `Arc`).
/// The `log` records of the call reach Python's `logging` before it returns.
pub(crate) fn guarded_cancel<T: Send + 'static>(
    py: Python<'_>,
    f: impl FnOnce(&Cancel) -> Result<T, Error> + Send + 'static,
) -> PyResult<T> {
    crate::logs::around(py, || run_guarded(py, f))
}

fn run_guarded<T: Send + 'static>(
    py: Python<'_>,
    f: impl FnOnce(&Cancel) -> Result<T, Error> + Send + 'static,
) -> PyResult<T> {
    let cancel = Cancel::default();
    let flag = cancel.clone();
    let (tx, rx) = sync_channel(1);
    let work = move || {
        let r = catch_unwind(AssertUnwindSafe(|| f(&flag)));
        // The receiver is gone when the caller was interrupted: the result is dropped.
        let _ = tx.send(r);
    };
    // The main thread's stack size: a policy's recursion depth is the same as on the caller.
    let spawned = std::thread::Builder::new()
        .name("eplb-call".into())
        .stack_size(8 << 20)
        .spawn(work);
    if let Err(e) = spawned {
        return Err(err(format!(
            "cannot start the worker thread of the call: {e}"
        )));
    }
    let mut rx = rx;
    loop {
        let (back, got) = py.detach(move || {
            let got = rx.recv_timeout(SIGNAL_TICK);
            (rx, got)
        });
        rx = back;
        match got {
            Ok(Ok(r)) => return r.map_err(PyErr::from),
            Ok(Err(panic)) => return Err(err(panic_message(panic.as_ref()))),
            Err(RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    cancel.set();
                    return Err(e);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(err(
                    "internal error (the worker thread of the call ended without a result)",
                ));
            }
        }
    }
}

/// The Python `OSError` subclass of `e` (by its kind), with errno, message and file name.
pub(crate) fn os_error(e: &std::io::Error, path: Option<&str>) -> PyErr {
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
    let errno = e.raw_os_error().unwrap_or(0);
    macro_rules! raise {
        ($t:ty) => {
            match path {
                Some(p) => <$t>::new_err((errno, strerror, p.to_owned())),
                None => <$t>::new_err((errno, strerror)),
            }
        };
    }
    match e.kind() {
        ErrorKind::NotFound => raise!(PyFileNotFoundError),
        ErrorKind::PermissionDenied => raise!(PyPermissionError),
        ErrorKind::IsADirectory => raise!(PyIsADirectoryError),
        _ => raise!(PyOSError),
    }
}

/// The conversions and the guard, in an interpreter this test binary starts (the crate is also
/// an `rlib`, and without the `extension-module` feature it links libpython). Ctrl-C needs the
/// interpreter's main thread, which a test thread is not: `python/tests/test_interrupt.py`.
#[cfg(test)]
mod tests {
    use super::*;
    use pyo3::exceptions::PyFileNotFoundError;

    fn with_py<R>(f: impl FnOnce(Python<'_>) -> R) -> R {
        Python::initialize();
        Python::attach(f)
    }

    #[test]
    fn a_library_error_is_an_eplb_error_with_its_display() {
        with_py(|py| {
            let e = eplb_policies::Error::SamplesRequired { policy: "flashlb" };
            let want = e.to_string();
            let got = PyErr::from(Error::from(e));
            assert!(got.is_instance_of::<EplbError>(py));
            assert_eq!(got.value(py).to_string(), want);
        });
    }

    #[test]
    fn a_missing_file_is_file_not_found_error() {
        with_py(|py| {
            let io = std::io::Error::from(std::io::ErrorKind::NotFound);
            let got = PyErr::from(Error::from(eplb_runtime::fsio::ReadError::Io(io)));
            assert!(got.is_instance_of::<PyFileNotFoundError>(py));
            let refused = eplb_runtime::fsio::ReadError::TooLarge { size: 9, limit: 1 };
            assert!(PyErr::from(Error::from(refused)).is_instance_of::<EplbError>(py));
        });
    }

    #[test]
    fn guarded_short_borrows_and_catches_a_panic() {
        with_py(|py| {
            let v = [1, 2, 3];
            assert_eq!(
                guarded_short(py, || Ok(v.iter().sum::<i32>())).ok(),
                Some(6)
            );
            let p = guarded_short(py, || -> Result<(), Error> { panic!("boom {}", v.len()) });
            let p = p.err().map(|e| e.value(py).to_string());
            assert_eq!(
                p.as_deref(),
                Some("internal error (a Rust panic, please report): boom 3")
            );
        });
    }

    #[test]
    fn guarded_returns_the_value_the_error_or_the_panic() {
        with_py(|py| {
            assert_eq!(guarded(py, || Ok(7)).ok(), Some(7));
            let e = guarded(py, || -> Result<(), Error> { Err("layer 3: bad".into()) });
            let e = e.err().map(|e| e.value(py).to_string());
            assert_eq!(e.as_deref(), Some("layer 3: bad"));
            let p = guarded(py, || -> Result<(), Error> { panic!("boom") });
            let p = p
                .err()
                .map(|e| (e.is_instance_of::<EplbError>(py), e.value(py).to_string()));
            assert_eq!(
                p,
                Some((
                    true,
                    "internal error (a Rust panic, please report): boom".to_owned()
                ))
            );
        });
    }
}
