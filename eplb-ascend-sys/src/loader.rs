//! Run-time loading of the CANN libraries: where to look ([`Search`]), what was found ([`Cann`],
//! with typed function tables [`AclApi`] and [`HcclApi`]), and why nothing was ([`LoadError`]).
//!
//! Required symbols are resolved at load time: a library that lacks one is skipped with the
//! reason recorded. Optional symbols (newer or older CANN only) are `Option`s.

use core::ffi::{c_char, c_void};
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use libloading::Library;

use crate::types::{
    AclErrorCode, AclrtEvent, AclrtStream, HcclComm, HcclDataType, HcclResult, HcclRootInfo,
    HcclSendRecvItem,
};

/// The ACL runtime library's file name.
pub const ACL_LIBRARY: &str = "libascendcl.so";
/// The HCCL library's file name (collectives and point to point; comm management on old CANN).
pub const HCCL_LIBRARY: &str = "libhccl.so";
/// The communicator-management half of HCCL on CANN 8.5 and later.
pub const HCOMM_LIBRARY: &str = "libhcomm.so";

/// The default install roots, tried after the environment (`<root>/lib64`).
pub const DEFAULT_ROOTS: [&str; 2] = [
    "/usr/local/Ascend/cann",
    "/usr/local/Ascend/ascend-toolkit/latest",
];

/// Declares a table of function pointers and its loader.
macro_rules! api {
    (
        $(#[$sm:meta])*
        $table:ident {
            required { $( $(#[$rm:meta])* $r:ident: fn($($ra:ty),*) $(-> $rr:ty)?; )* }
            optional { $( $(#[$om:meta])* $o:ident: fn($($oa:ty),*) $(-> $or:ty)?; )* }
        }
    ) => {
        $(#[$sm])*
        #[allow(non_snake_case)]
        #[derive(Clone, Copy)]
        pub struct $table {
            $( $(#[$rm])* pub $r: unsafe extern "C" fn($($ra),*) $(-> $rr)?, )*
            $( $(#[$om])* pub $o: Option<unsafe extern "C" fn($($oa),*) $(-> $or)?>, )*
        }

        impl fmt::Debug for $table {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($table))
                    $( .field(stringify!($o), &self.$o.is_some()) )*
                    .finish_non_exhaustive()
            }
        }

        impl $table {
            /// Resolves every symbol in `libs`, first library first.
            fn resolve(libs: &[&Library]) -> Result<Self, &'static str> {
                Ok(Self {
                    $(
                        $r: {
                            // SAFETY: the type is the symbol's documented C signature
                            // (research/cann-hccl.md §1.6, §1.8); the library stays loaded as
                            // long as the `Cann` that holds this table.
                            unsafe { lookup(libs, concat!(stringify!($r), "\0")) }
                                .ok_or(stringify!($r))?
                        },
                    )*
                    $(
                        $o: {
                            // SAFETY: as above.
                            unsafe { lookup(libs, concat!(stringify!($o), "\0")) }
                        },
                    )*
                })
            }
        }
    };
}

/// Looks `name` (NUL-terminated) up in each library in turn.
///
/// # Safety
///
/// `T` must be the function pointer type of the symbol's C declaration, and the returned pointer
/// must not be called after every library in `libs` has been unloaded.
unsafe fn lookup<T: Copy>(libs: &[&Library], name: &str) -> Option<T> {
    libs.iter().find_map(|lib| {
        // SAFETY: the caller guarantees `T` matches the symbol; the symbol is copied out as a
        // plain function pointer whose validity the caller ties to the library's lifetime.
        unsafe { lib.get::<T>(name.as_bytes()) }.ok().map(|s| *s)
    })
}

api! {
    /// The ACL runtime calls (`libascendcl.so`).
    AclApi {
        required {
            /// `aclError aclInit(const char *configPath)`.
            aclInit: fn(*const c_char) -> AclErrorCode;
            /// `aclError aclrtSetDevice(int32_t deviceId)`.
            aclrtSetDevice: fn(i32) -> AclErrorCode;
            /// `aclError aclrtCreateStream(aclrtStream *stream)`.
            aclrtCreateStream: fn(*mut AclrtStream) -> AclErrorCode;
            /// `aclError aclrtDestroyStream(aclrtStream stream)`.
            aclrtDestroyStream: fn(AclrtStream) -> AclErrorCode;
            /// `aclError aclrtSynchronizeStream(aclrtStream stream)`.
            aclrtSynchronizeStream: fn(AclrtStream) -> AclErrorCode;
            /// `aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)`.
            aclrtMalloc: fn(*mut *mut c_void, usize, u32) -> AclErrorCode;
            /// `aclError aclrtFree(void *devPtr)`.
            aclrtFree: fn(*mut c_void) -> AclErrorCode;
            /// `aclError aclrtMallocHost(void **hostPtr, size_t size)`.
            aclrtMallocHost: fn(*mut *mut c_void, usize) -> AclErrorCode;
            /// `aclError aclrtFreeHost(void *hostPtr)`.
            aclrtFreeHost: fn(*mut c_void) -> AclErrorCode;
            /// `aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
            /// aclrtMemcpyKind kind)`.
            aclrtMemcpy: fn(*mut c_void, usize, *const c_void, usize, u32) -> AclErrorCode;
            /// `aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src,
            /// size_t count, aclrtMemcpyKind kind, aclrtStream stream)`.
            aclrtMemcpyAsync:
                fn(*mut c_void, usize, *const c_void, usize, u32, AclrtStream) -> AclErrorCode;
            /// `aclError aclrtCreateEvent(aclrtEvent *event)`.
            aclrtCreateEvent: fn(*mut AclrtEvent) -> AclErrorCode;
            /// `aclError aclrtDestroyEvent(aclrtEvent event)`.
            aclrtDestroyEvent: fn(AclrtEvent) -> AclErrorCode;
            /// `aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream)`.
            aclrtRecordEvent: fn(AclrtEvent, AclrtStream) -> AclErrorCode;
            /// `aclError aclrtSynchronizeEvent(aclrtEvent event)`.
            aclrtSynchronizeEvent: fn(AclrtEvent) -> AclErrorCode;
        }
        optional {
            /// `aclError aclFinalize(void)`.
            aclFinalize: fn() -> AclErrorCode;
            /// `const char *aclGetRecentErrMsg(void)` (thread-local, most recent failure).
            aclGetRecentErrMsg: fn() -> *const c_char;
            /// `aclError aclrtResetDevice(int32_t deviceId)`.
            aclrtResetDevice: fn(i32) -> AclErrorCode;
            /// `aclError aclrtGetDeviceCount(uint32_t *count)`.
            aclrtGetDeviceCount: fn(*mut u32) -> AclErrorCode;
            /// `aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream,
            /// int32_t timeoutMs)`.
            aclrtSynchronizeStreamWithTimeout: fn(AclrtStream, i32) -> AclErrorCode;
            /// `aclError aclrtQueryEventStatus(aclrtEvent event,
            /// aclrtEventRecordedStatus *status)`.
            aclrtQueryEventStatus: fn(AclrtEvent, *mut u32) -> AclErrorCode;
            /// `aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event)`.
            aclrtStreamWaitEvent: fn(AclrtStream, AclrtEvent) -> AclErrorCode;
            /// `const char *aclrtGetSocName(void)`.
            aclrtGetSocName: fn() -> *const c_char;
        }
    }
}

api! {
    /// The HCCL calls (`libhccl.so`, then `libhcomm.so`).
    HcclApi {
        required {
            /// `HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo)`.
            HcclGetRootInfo: fn(*mut HcclRootInfo) -> HcclResult;
            /// `HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo,
            /// uint32_t rank, HcclComm *comm)`.
            HcclCommInitRootInfo:
                fn(u32, *const HcclRootInfo, u32, *mut HcclComm) -> HcclResult;
            /// `HcclResult HcclCommDestroy(HcclComm comm)`.
            HcclCommDestroy: fn(HcclComm) -> HcclResult;
            /// `HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType,
            /// uint32_t destRank, HcclComm comm, aclrtStream stream)`.
            HcclSend: fn(*mut c_void, u64, HcclDataType, u32, HcclComm, AclrtStream) -> HcclResult;
            /// `HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType,
            /// uint32_t srcRank, HcclComm comm, aclrtStream stream)`.
            HcclRecv: fn(*mut c_void, u64, HcclDataType, u32, HcclComm, AclrtStream) -> HcclResult;
            /// `HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount,
            /// HcclDataType dataType, HcclComm comm, aclrtStream stream)`.
            HcclAllGather:
                fn(*mut c_void, *mut c_void, u64, HcclDataType, HcclComm, AclrtStream)
                    -> HcclResult;
            /// `const char *HcclGetErrorString(HcclResult code)`.
            HcclGetErrorString: fn(HcclResult) -> *const c_char;
        }
        optional {
            /// `HcclResult HcclBatchSendRecv(HcclSendRecvItem *sendRecvInfo, uint32_t itemNum,
            /// HcclComm comm, aclrtStream stream)`.
            HcclBatchSendRecv:
                fn(*mut HcclSendRecvItem, u32, HcclComm, AclrtStream) -> HcclResult;
            /// `HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank,
            /// HcclComm *comm)` (a rank-table JSON file).
            HcclCommInitClusterInfo: fn(*const c_char, u32, *mut HcclComm) -> HcclResult;
            /// `HcclResult HcclGetCommAsyncError(HcclComm comm, HcclResult *asyncError)`.
            HcclGetCommAsyncError: fn(HcclComm, *mut HcclResult) -> HcclResult;
            /// `HcclResult HcclGroupStart(void)`.
            HcclGroupStart: fn() -> HcclResult;
            /// `HcclResult HcclGroupEnd(void)`.
            HcclGroupEnd: fn() -> HcclResult;
            /// `HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize)`.
            HcclGetRankSize: fn(HcclComm, *mut u32) -> HcclResult;
            /// `HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank)`.
            HcclGetRankId: fn(HcclComm, *mut u32) -> HcclResult;
        }
    }
}

/// Where one search step looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A directory holding `libascendcl.so` and `libhccl.so`.
    Dir {
        /// The directory.
        dir: PathBuf,
        /// Why it is on the list (e.g. "$ASCEND_HOME_PATH/lib64").
        origin: String,
    },
    /// The dynamic linker's own search (`LD_LIBRARY_PATH`, the ld.so cache).
    LinkerPath,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Dir { dir, origin } => write!(f, "{} ({origin})", dir.display()),
            Location::LinkerPath => f.write_str("the dynamic linker's search path"),
        }
    }
}

/// An ordered list of places to look for CANN.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Search {
    locations: Vec<Location>,
}

impl Search {
    /// Only `dir` (for instance `$ASCEND_HOME_PATH/lib64`, or the fake CANN's directory).
    pub fn dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            locations: vec![Location::Dir {
                dir: dir.into(),
                origin: "explicit directory".into(),
            }],
        }
    }

    /// The standard order, read from the process environment: `$EPLB_ASCEND_LIB_DIR`,
    /// `$ASCEND_HOME_PATH/lib64`, `$ASCEND_TOOLKIT_HOME/lib64`, the [`DEFAULT_ROOTS`] and
    /// `$HOME/Ascend/{cann,ascend-toolkit/latest}/lib64`, then the dynamic linker's search path.
    pub fn standard() -> Self {
        Self::standard_with(&|k| std::env::var_os(k))
    }

    /// [`Search::standard`] with the environment given as a function (for tests).
    pub fn standard_with(env: &dyn Fn(&str) -> Option<OsString>) -> Self {
        let mut s = Self::default();
        if let Some(d) = env("EPLB_ASCEND_LIB_DIR").filter(|d| !d.is_empty()) {
            s.push_dir(PathBuf::from(d), "$EPLB_ASCEND_LIB_DIR");
        }
        for var in ["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"] {
            if let Some(root) = env(var).filter(|d| !d.is_empty()) {
                s.push_dir(Path::new(&root).join("lib64"), &format!("${var}/lib64"));
            }
        }
        for root in DEFAULT_ROOTS {
            s.push_dir(Path::new(root).join("lib64"), "default install root");
        }
        if let Some(home) = env("HOME").filter(|d| !d.is_empty()) {
            for sub in ["Ascend/cann", "Ascend/ascend-toolkit/latest"] {
                s.push_dir(
                    Path::new(&home).join(sub).join("lib64"),
                    "default install root",
                );
            }
        }
        s.locations.push(Location::LinkerPath);
        s
    }

    /// Appends `dir` unless it is already on the list.
    pub fn push_dir(&mut self, dir: PathBuf, origin: &str) {
        let dup = self
            .locations
            .iter()
            .any(|l| matches!(l, Location::Dir { dir: d, .. } if *d == dir));
        if !dup {
            self.locations.push(Location::Dir {
                dir,
                origin: origin.into(),
            });
        }
    }

    /// The places, in order.
    pub fn locations(&self) -> &[Location] {
        &self.locations
    }
}

/// One place that was tried and why it did not do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// Where.
    pub location: Location,
    /// What went wrong there.
    pub reason: String,
}

/// No usable CANN was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// Every place tried, in order.
    pub attempts: Vec<Attempt>,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no usable CANN runtime ({ACL_LIBRARY} and {HCCL_LIBRARY}) found; looked in:"
        )?;
        if self.attempts.is_empty() {
            f.write_str(" nowhere (empty search list)")?;
        }
        for a in &self.attempts {
            write!(f, "\n  - {}: {}", a.location, a.reason)?;
        }
        write!(
            f,
            "\nsource CANN's set_env.sh (it sets ASCEND_HOME_PATH) or set EPLB_ASCEND_LIB_DIR \
             to the directory holding {ACL_LIBRARY}"
        )
    }
}

impl std::error::Error for LoadError {}

/// A loaded CANN: the libraries and their function tables. Share it as `Arc<Cann>`; the function
/// pointers stay valid as long as it lives.
pub struct Cann {
    /// The ACL runtime calls.
    pub acl: AclApi,
    /// The HCCL calls.
    pub hccl: HcclApi,
    location: Location,
    _libs: Vec<Library>,
}

impl fmt::Debug for Cann {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cann")
            .field("location", &self.location)
            .field("acl", &self.acl)
            .field("hccl", &self.hccl)
            .finish_non_exhaustive()
    }
}

impl Cann {
    /// Loads CANN from the first location of `search` that has both libraries with every
    /// required symbol.
    pub fn load(search: &Search) -> Result<Arc<Self>, LoadError> {
        let mut attempts = Vec::new();
        for location in search.locations() {
            match Self::load_at(location) {
                Ok(c) => return Ok(Arc::new(c)),
                Err(reason) => attempts.push(Attempt {
                    location: location.clone(),
                    reason,
                }),
            }
        }
        Err(LoadError { attempts })
    }

    /// Loads CANN from `dir` only.
    pub fn load_dir(dir: impl Into<PathBuf>) -> Result<Arc<Self>, LoadError> {
        Self::load(&Search::dir(dir))
    }

    /// Loads CANN from the [`Search::standard`] locations.
    pub fn load_standard() -> Result<Arc<Self>, LoadError> {
        Self::load(&Search::standard())
    }

    /// Where it was loaded from.
    pub fn location(&self) -> &Location {
        &self.location
    }

    fn load_at(location: &Location) -> Result<Self, String> {
        let acl = open(location, ACL_LIBRARY)?.ok_or_else(|| format!("{ACL_LIBRARY} not found"))?;
        let hccl =
            open(location, HCCL_LIBRARY)?.ok_or_else(|| format!("{HCCL_LIBRARY} not found"))?;
        let hcomm = open(location, HCOMM_LIBRARY).ok().flatten();
        let acl_api =
            AclApi::resolve(&[&acl]).map_err(|s| format!("{ACL_LIBRARY} lacks the symbol {s}"))?;
        let mut hccl_libs = vec![&hccl];
        hccl_libs.extend(hcomm.as_ref());
        let hccl_api = HcclApi::resolve(&hccl_libs).map_err(|s| {
            format!("neither {HCCL_LIBRARY} nor {HCOMM_LIBRARY} has the symbol {s}")
        })?;
        let mut libs = vec![acl, hccl];
        libs.extend(hcomm);
        Ok(Self {
            acl: acl_api,
            hccl: hccl_api,
            location: location.clone(),
            _libs: libs,
        })
    }
}

/// Opens `name` at `location`: `Ok(None)` when the file is not there.
fn open(location: &Location, name: &str) -> Result<Option<Library>, String> {
    let target: OsString = match location {
        Location::Dir { dir, .. } => {
            let p = dir.join(name);
            if !p.is_file() {
                return Ok(None);
            }
            p.into_os_string()
        }
        Location::LinkerPath => name.into(),
    };
    // SAFETY: opening a CANN library runs its initialisers; that is what loading CANN means, and
    // the libraries at these locations are CANN (or the fake CANN built for tests).
    match unsafe { Library::new(&target) } {
        Ok(l) => Ok(Some(l)),
        Err(e) => Err(format!("{name}: {e}")),
    }
}
