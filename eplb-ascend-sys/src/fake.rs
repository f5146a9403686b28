//! Control of the fake CANN (tests only): where it was built, and its fault-injection hooks.
//!
//! The fake CANN is two C libraries (`fake/fake_acl.c` → `libascendcl.so`, `fake/fake_hccl.c` →
//! `libhccl.so`) with the same symbols as the real ones: device memory is host memory, streams
//! run synchronously, HCCL ranks are threads of one process. Load it like the real CANN, through
//! [`Cann::load_dir`](crate::Cann::load_dir) with [`dir`]; then [`FakeCann::open`] on the same
//! directory reaches the same library instance and its test hooks.

use core::ffi::{c_char, c_int};
use std::ffi::CString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use libloading::Library;

use crate::loader::ACL_LIBRARY;

/// The directory of the fake CANN built by this crate's build script (feature `fake-cann`).
pub fn dir() -> Option<&'static Path> {
    option_env!("EPLB_FAKE_CANN_DIR").map(Path::new)
}

type FailFn = unsafe extern "C" fn(*const c_char, c_int, u32, u32, c_int) -> c_int;
type HangFn = unsafe extern "C" fn(*const c_char, c_int, u32, u32) -> c_int;
type ClearFn = unsafe extern "C" fn(c_int);
type TimeoutFn = unsafe extern "C" fn(u32);
type CountFn = unsafe extern "C" fn(c_int) -> usize;

/// The fake CANN's test hooks.
pub struct FakeCann {
    fail: FailFn,
    hang: HangFn,
    clear: ClearFn,
    timeout: TimeoutFn,
    allocations: CountFn,
    handles: CountFn,
    dir: PathBuf,
    _lib: Library,
}

impl fmt::Debug for FakeCann {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeCann").field("dir", &self.dir).finish()
    }
}

fn device_arg(device: Option<i32>) -> c_int {
    device.unwrap_or(-1)
}

impl FakeCann {
    /// Opens the fake `libascendcl.so` in `dir` (the same instance a [`Cann`](crate::Cann)
    /// loaded from `dir` uses).
    pub fn open(dir: &Path) -> Result<Self, String> {
        let path = dir.join(ACL_LIBRARY);
        // SAFETY: the fake CANN's initialisers are trivial (static state only).
        let lib = unsafe { Library::new(&path) }.map_err(|e| format!("{}: {e}", path.display()))?;
        // SAFETY: the types are the hooks' C declarations in fake/fake_acl.c; the pointers are
        // used only while `_lib` keeps the library loaded.
        let get = |name: &str| unsafe { lib.get::<CountFn>(name.as_bytes()).map(|s| *s) };
        let miss = |e: libloading::Error| format!("{}: not the fake CANN: {e}", path.display());
        // SAFETY: as above, each with its own declaration.
        let (fail, hang, clear, timeout) = unsafe {
            (
                *lib.get::<FailFn>(b"fake_cann_fail\0").map_err(miss)?,
                *lib.get::<HangFn>(b"fake_cann_hang\0").map_err(miss)?,
                *lib.get::<ClearFn>(b"fake_cann_clear\0").map_err(miss)?,
                *lib.get::<TimeoutFn>(b"fake_cann_set_timeout_ms\0")
                    .map_err(miss)?,
            )
        };
        let allocations = get("fake_cann_live_allocations\0").map_err(miss)?;
        let handles = get("fake_cann_live_handles\0").map_err(miss)?;
        Ok(Self {
            fail,
            hang,
            clear,
            timeout,
            allocations,
            handles,
            dir: dir.to_path_buf(),
            _lib: lib,
        })
    }

    /// Calls `nth ..= nth + count - 1` (1-based, counted from now) of `symbol` on `device`
    /// (`None`: any device) fail with `code` and do nothing.
    pub fn fail(
        &self,
        symbol: &str,
        device: Option<i32>,
        nth: u32,
        count: u32,
        code: i32,
    ) -> Result<(), String> {
        let s = CString::new(symbol).map_err(|e| e.to_string())?;
        // SAFETY: `s` is NUL-terminated and outlives the call; the rest are plain values.
        let rc = unsafe { (self.fail)(s.as_ptr(), device_arg(device), nth, count, code) };
        (rc == 0)
            .then_some(())
            .ok_or_else(|| "bad injection".into())
    }

    /// Calls `nth ..= nth + count - 1` of `symbol` on `device` hang until the fake's timeout:
    /// a receiving call loses its incoming data and reports a timeout on its stream; a stream
    /// synchronization reports a stream timeout.
    pub fn hang(
        &self,
        symbol: &str,
        device: Option<i32>,
        nth: u32,
        count: u32,
    ) -> Result<(), String> {
        let s = CString::new(symbol).map_err(|e| e.to_string())?;
        // SAFETY: as in `fail`.
        let rc = unsafe { (self.hang)(s.as_ptr(), device_arg(device), nth, count) };
        (rc == 0)
            .then_some(())
            .ok_or_else(|| "bad injection".into())
    }

    /// Removes the faults injected for `device` (`None`: all).
    pub fn clear(&self, device: Option<i32>) {
        // SAFETY: plain value.
        unsafe { (self.clear)(device_arg(device)) }
    }

    /// How long blocking calls wait for their peers (process-wide; default 5 s).
    pub fn set_timeout(&self, t: Duration) {
        let ms = u32::try_from(t.as_millis()).unwrap_or(u32::MAX);
        // SAFETY: plain value.
        unsafe { (self.timeout)(ms) }
    }

    /// Live device allocations of `device` (`None`: all).
    pub fn live_allocations(&self, device: Option<i32>) -> usize {
        // SAFETY: plain value.
        unsafe { (self.allocations)(device_arg(device)) }
    }

    /// Live streams and events of `device` (`None`: all).
    pub fn live_handles(&self, device: Option<i32>) -> usize {
        // SAFETY: plain value.
        unsafe { (self.handles)(device_arg(device)) }
    }
}
