//! The Rust crates' `log` records, forwarded to Python's `logging`.
//!
//! The module's init installs [`Bridge`] as the `log` crate's logger. A record becomes a line of
//! the Python logger named after its target: `eplb_runtime::controller` logs to
//! `eplb.runtime.controller`, `eplb_sim::simulate` to `eplb.sim.simulate`, any other target `t`
//! to `eplb.t` (`::` turned into `.`), so that configuring the `eplb` logger configures them all.
//!
//! A record is never handed to Python on the thread that logs it. [`Bridge::log`] only formats
//! it and pushes it onto a bounded queue (a lock held for the push alone); [`flush`] takes the
//! queue and calls `logging` with the GIL, and every entry point of the module that runs Rust
//! code which logs calls it before it returns ([`around`]: the guarded calls, the runtime's
//! construction and its per-step, membership, wait and close methods). The planner thread, the heat
//! recorder's writer and a guarded call's worker never wait for the GIL: the calling thread
//! holds it while it joins them (a runtime's `close`) or waits for their results, so a thread
//! that blocked on the GIL to log would deadlock it. The price: a record of a background
//! thread reaches Python at the next call into the module (the next `after_forward` of a
//! serving engine), not at once.
//!
//! Level: [`around`] reads the effective level of the `eplb` logger when a call starts and sets
//! `log`'s maximum level from it, so a record below it costs the `log` macro's level compare
//! and nothing else; the Python logger's own filters and handlers then apply as usual. A
//! background thread's record between two calls is filtered by the level of the last call.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use log::{Level, LevelFilter, Log, Metadata, Record};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// Records held between two flushes, at most; more are counted and dropped.
const CAP: usize = 1024;

struct Line {
    level: Level,
    logger: String,
    message: String,
}

static QUEUE: Mutex<VecDeque<Line>> = Mutex::new(VecDeque::new());
static DROPPED: AtomicU64 = AtomicU64::new(0);
static BRIDGE: Bridge = Bridge;
/// Whether [`BRIDGE`] is the process's `log` logger.
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The Python logger `eplb`.
static EPLB_LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The `log` logger of the extension module (see the module's documentation).
struct Bridge;

impl Log for Bridge {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = Line {
            level: record.level(),
            logger: logger_name(record.target()),
            message: record.args().to_string(),
        };
        let mut q = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() < CAP {
            q.push_back(line);
        } else {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn flush(&self) {}
}

/// The Python logger of a `log` target.
fn logger_name(target: &str) -> String {
    let dotted = target.replace("::", ".");
    match dotted.strip_prefix("eplb_") {
        Some(rest) => format!("eplb.{rest}"),
        None if dotted == "eplb" || dotted.starts_with("eplb.") => dotted,
        None => format!("eplb.{dotted}"),
    }
}

/// Python's number of a level.
fn py_level(level: Level) -> u32 {
    match level {
        Level::Error => 40,
        Level::Warn => 30,
        Level::Info => 20,
        Level::Debug => 10,
        Level::Trace => 5,
    }
}

/// The `log` filter that lets through what a Python logger at `level` emits.
fn filter_of(level: i64) -> LevelFilter {
    match level {
        ..=5 => LevelFilter::Trace,
        6..=10 => LevelFilter::Debug,
        11..=20 => LevelFilter::Info,
        21..=30 => LevelFilter::Warn,
        31..=50 => LevelFilter::Error,
        _ => LevelFilter::Off,
    }
}

/// Installs the bridge (module init). Another `log` logger already installed in the process
/// (an embedding program's) is left in place: the records then go to it.
pub(crate) fn install(py: Python<'_>) {
    if log::set_logger(&BRIDGE).is_ok() {
        INSTALLED.store(true, Ordering::Relaxed);
        refresh_level(py);
    }
}

fn refresh_level(py: Python<'_>) {
    let level = EPLB_LOGGER
        .get_or_try_init(py, || {
            py.import("logging")
                .and_then(|m| m.call_method1("getLogger", ("eplb",)))
                .map(Bound::unbind)
        })
        .and_then(|l| l.bind(py).call_method0("getEffectiveLevel"))
        .and_then(|v| v.extract::<i64>());
    if let Ok(level) = level {
        log::set_max_level(filter_of(level));
    }
}

/// Runs `f` (a call into the module, GIL held) between a read of the `eplb` logger's level and
/// a [`flush`] of the records logged until it returned.
pub(crate) fn around<T>(py: Python<'_>, f: impl FnOnce() -> T) -> T {
    begin(py);
    let r = f();
    flush(py);
    r
}

/// Reads the `eplb` logger's level (a call starts; [`flush`] ends it).
pub(crate) fn begin(py: Python<'_>) {
    if INSTALLED.load(Ordering::Relaxed) {
        refresh_level(py);
    }
}

/// Hands the queued records to Python's `logging` (calling thread, GIL held). An exception of a
/// handler is Python's `logging` business (it prints it); one raised here is swallowed: logging
/// never fails a call.
pub(crate) fn flush(py: Python<'_>) {
    if !INSTALLED.load(Ordering::Relaxed) {
        return;
    }
    let lines = std::mem::take(&mut *QUEUE.lock().unwrap_or_else(|p| p.into_inner()));
    let dropped = DROPPED.swap(0, Ordering::Relaxed);
    if (!lines.is_empty() || dropped > 0)
        && let Ok(logging) = py.import("logging")
    {
        for l in lines {
            let _ = logging
                .call_method1("getLogger", (l.logger.as_str(),))
                .and_then(|lg| lg.call_method1("log", (py_level(l.level), l.message)));
        }
        if dropped > 0 {
            let _ = logging.call_method1("getLogger", ("eplb",)).and_then(|lg| {
                lg.call_method1(
                    "warning",
                    (format!(
                        "eplb: {dropped} Rust log records were dropped (more than \
                                 {CAP} between two calls into eplb)"
                    ),),
                )
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_become_loggers_under_eplb() {
        assert_eq!(
            logger_name("eplb_runtime::controller"),
            "eplb.runtime.controller"
        );
        assert_eq!(logger_name("eplb_sim"), "eplb.sim");
        assert_eq!(logger_name("eplb"), "eplb");
        assert_eq!(logger_name("other::thing"), "eplb.other.thing");
    }

    #[test]
    fn python_levels_map_to_filters() {
        assert_eq!(filter_of(30), LevelFilter::Warn);
        assert_eq!(filter_of(20), LevelFilter::Info);
        assert_eq!(filter_of(0), LevelFilter::Trace);
        assert_eq!(filter_of(10), LevelFilter::Debug);
        assert_eq!(filter_of(40), LevelFilter::Error);
        assert_eq!(filter_of(51), LevelFilter::Off);
    }
}
