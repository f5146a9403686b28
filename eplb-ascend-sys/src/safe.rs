//! Safe RAII wrappers over the raw calls: the runtime ([`Runtime`]), a stream with the device
//! buffers its work touches ([`Workspace`]), and an HCCL communicator ([`Comm`], with its
//! [`RootInfo`]).
//!
//! The soundness argument is ownership: asynchronous work only ever touches buffers owned by the
//! [`Workspace`] whose stream runs it, and a workspace frees a buffer only after its stream has
//! been synchronized successfully (a buffer whose stream cannot be drained is leaked, never
//! freed under the device's feet). Every region is bounds-checked before a pointer is formed.
//! Device pointers are never dereferenced on the host.
//!
//! Device binding: the ACL runtime binds devices per thread. Every call here that needs a device
//! binds it first (one `aclrtSetDevice` per thread and device, cached), so the objects can move
//! between threads. Drop never panics; failures in drop are ignored.

use core::ffi::{CStr, c_char, c_void};
use core::marker::PhantomData;
use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{AclError, Error, HcclError};
use crate::loader::Cann;
use crate::types::{
    ACL_SUCCESS, AclErrorCode, AclrtMemMallocPolicy, AclrtMemcpyKind, AclrtStream,
    HCCL_ROOT_INFO_BYTES, HcclComm, HcclDataType, HcclResult, HcclRootInfo, HcclSendRecvItem,
    HcclSendRecvType, acl_error,
};

/// Marks a type `!Sync` (and, with a raw pointer beside it, nothing else).
type NotSync = PhantomData<Cell<()>>;

thread_local! {
    /// The (CANN instance, device) this thread is bound to.
    static BOUND: Cell<Option<(usize, i32)>> = const { Cell::new(None) };
}

/// An initialised ACL runtime (`aclInit` done). Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    cann: Arc<Cann>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("location", self.cann.location())
            .finish()
    }
}

impl Runtime {
    /// Initialises the runtime (`aclInit(NULL)`); an already initialised runtime is fine.
    /// Never finalizes: the process may share the runtime with other users (torch_npu).
    pub fn init(cann: Arc<Cann>) -> Result<Self, Error> {
        let rt = Self { cann };
        // SAFETY: `aclInit` accepts a null config path; the pointer comes from the loaded table.
        let code = unsafe { (rt.cann.acl.aclInit)(core::ptr::null()) };
        if code != ACL_SUCCESS && code != acl_error::REPEAT_INITIALIZE {
            return Err(rt.acl_error("aclInit", code));
        }
        Ok(rt)
    }

    /// The loaded CANN.
    pub fn cann(&self) -> &Arc<Cann> {
        &self.cann
    }

    /// Binds the calling thread to `device` (`aclrtSetDevice`), unless it already is.
    pub fn bind(&self, device: i32) -> Result<(), Error> {
        let key = (Arc::as_ptr(&self.cann) as usize, device);
        if BOUND.with(Cell::get) == Some(key) {
            return Ok(());
        }
        // SAFETY: plain integer argument; the function pointer comes from the loaded table.
        let code = unsafe { (self.cann.acl.aclrtSetDevice)(device) };
        if code != ACL_SUCCESS {
            return Err(self.acl_error("aclrtSetDevice", code));
        }
        BOUND.with(|b| b.set(Some(key)));
        Ok(())
    }

    fn recent_message(&self) -> Option<String> {
        let f = self.cann.acl.aclGetRecentErrMsg?;
        // SAFETY: no arguments; returns null or a NUL-terminated thread-local string.
        let p = unsafe { f() };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated, valid until the next ACL call on this thread; it is
        // copied out at once.
        let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        (!s.is_empty()).then_some(s)
    }

    pub(crate) fn acl_error(&self, call: &'static str, code: AclErrorCode) -> Error {
        Error::Acl(AclError {
            call,
            code,
            message: self.recent_message(),
        })
    }

    pub(crate) fn hccl_error(&self, call: &'static str, code: HcclResult) -> Error {
        // SAFETY: plain integer argument; returns null or a static NUL-terminated string.
        let p: *const c_char = unsafe { (self.cann.hccl.HcclGetErrorString)(code) };
        let name = if p.is_null() {
            None
        } else {
            // SAFETY: non-null and NUL-terminated (a static string of the library).
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        let message = match (name, self.recent_message()) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        };
        Error::Hccl(HcclError {
            call,
            code,
            message,
        })
    }

    fn check(&self, call: &'static str, code: AclErrorCode) -> Result<(), Error> {
        if code == ACL_SUCCESS {
            Ok(())
        } else {
            Err(self.acl_error(call, code))
        }
    }

    fn check_hccl(&self, call: &'static str, code: HcclResult) -> Result<(), Error> {
        if code == HcclResult::SUCCESS {
            Ok(())
        } else {
            Err(self.hccl_error(call, code))
        }
    }
}

/// The root info of an HCCL world: 4108 opaque bytes that the root rank makes
/// ([`RootInfo::generate`]) and every rank must receive, over any channel.
#[derive(Clone, PartialEq, Eq)]
pub struct RootInfo {
    bytes: Box<[u8; HCCL_ROOT_INFO_BYTES]>,
}

impl fmt::Debug for RootInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RootInfo { .. }")
    }
}

impl RootInfo {
    /// `HcclGetRootInfo` on `device` (call it on the root rank only).
    pub fn generate(rt: &Runtime, device: i32) -> Result<Self, Error> {
        rt.bind(device)?;
        let mut raw = HcclRootInfo {
            internal: [0; HCCL_ROOT_INFO_BYTES],
        };
        // SAFETY: `raw` is a writable 4108-byte HcclRootInfo.
        let code = unsafe { (rt.cann.hccl.HcclGetRootInfo)(&mut raw) };
        rt.check_hccl("HcclGetRootInfo", code)?;
        Ok(Self {
            bytes: Box::new(raw.internal.map(|c| c as u8)),
        })
    }

    /// The bytes to ship to the other ranks.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..]
    }

    /// Root info received from the root rank; must be exactly 4108 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, Error> {
        let arr: [u8; HCCL_ROOT_INFO_BYTES] = bytes.try_into().map_err(|_| {
            Error::invalid(format!(
                "root info holds {} bytes, HCCL needs {HCCL_ROOT_INFO_BYTES}",
                bytes.len()
            ))
        })?;
        Ok(Self {
            bytes: Box::new(arr),
        })
    }

    fn raw(&self) -> HcclRootInfo {
        HcclRootInfo {
            internal: self.bytes.map(|b| b as c_char),
        }
    }
}

/// An HCCL communicator endpoint: `Send` (it may move to another thread) but not `Sync` (HCCL
/// requires the calls on one communicator to be issued serially). Destroyed on drop.
pub struct Comm {
    rt: Runtime,
    raw: HcclComm,
    device: i32,
    rank: u32,
    ranks: u32,
    _not_sync: NotSync,
}

// SAFETY: an HcclComm is a handle that any thread bound to its device may use; `Comm` binds the
// device before every call and is not `Sync`, so calls stay serial.
unsafe impl Send for Comm {}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Comm")
            .field("device", &self.device)
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .finish_non_exhaustive()
    }
}

impl Comm {
    /// Joins the world of `root` as `rank` of `ranks` on `device` (`HcclCommInitRootInfo`).
    /// Blocks until every rank has joined (or HCCL's connect timeout passes).
    pub fn init_root_info(
        rt: &Runtime,
        device: i32,
        ranks: u32,
        rank: u32,
        root: &RootInfo,
    ) -> Result<Self, Error> {
        if ranks == 0 || rank >= ranks {
            return Err(Error::invalid(format!(
                "rank {rank} out of range for {ranks} ranks"
            )));
        }
        rt.bind(device)?;
        let info = root.raw();
        let mut raw: HcclComm = core::ptr::null_mut();
        // SAFETY: `info` is a valid HcclRootInfo and `raw` a writable handle slot.
        let code = unsafe { (rt.cann.hccl.HcclCommInitRootInfo)(ranks, &info, rank, &mut raw) };
        rt.check_hccl("HcclCommInitRootInfo", code)?;
        if raw.is_null() {
            return Err(Error::invalid("HcclCommInitRootInfo returned a null comm"));
        }
        Ok(Self {
            rt: rt.clone(),
            raw,
            device,
            rank,
            ranks,
            _not_sync: PhantomData,
        })
    }

    /// This endpoint's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// The raw handle (for calls this wrapper does not cover; it stays owned by `self`).
    pub fn as_raw(&self) -> HcclComm {
        self.raw
    }

    /// `HcclGetCommAsyncError`: the communicator's asynchronous error, `None` when it has none
    /// (or when the loaded CANN cannot tell).
    pub fn async_error(&mut self) -> Option<Error> {
        let f = self.rt.cann.hccl.HcclGetCommAsyncError?;
        self.rt.bind(self.device).ok()?;
        let mut code = HcclResult::SUCCESS;
        // SAFETY: `raw` is a live communicator; `code` is writable.
        let rc = unsafe { f(self.raw, &mut code) };
        if rc != HcclResult::SUCCESS || code == HcclResult::SUCCESS {
            return None;
        }
        Some(self.rt.hccl_error("HcclGetCommAsyncError", code))
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.rt.bind(self.device).is_ok() {
            // SAFETY: `raw` is a live communicator, destroyed exactly once, here.
            let _ = unsafe { (self.rt.cann.hccl.HcclCommDestroy)(self.raw) };
        }
    }
}

/// A buffer of a [`Workspace`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferId(usize);

/// A byte range of a workspace buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    /// The buffer.
    pub buffer: BufferId,
    /// First byte.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Region {
    /// `len` bytes of `buffer` from `offset`.
    pub fn new(buffer: BufferId, offset: usize, len: usize) -> Self {
        Self {
            buffer,
            offset,
            len,
        }
    }
}

/// Direction of a point-to-point transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum P2pKind {
    /// Send the region to the peer.
    Send,
    /// Receive the peer's data into the region.
    Recv,
}

/// One entry of a batched send/receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct P2p {
    /// Send or receive.
    pub kind: P2pKind,
    /// The peer's rank.
    pub peer: u32,
    /// The bytes sent or received (a whole number of `dtype` elements).
    pub region: Region,
    /// Element type.
    pub dtype: HcclDataType,
}

#[derive(Debug)]
struct RawBuffer {
    ptr: *mut c_void,
    len: usize,
}

/// A stream on one device and the device buffers that its work touches.
///
/// Buffers are addressed by [`BufferId`] and [`Region`]; work is enqueued on the stream and
/// completes by [`Workspace::synchronize`]. Synchronous copies ([`Workspace::write`],
/// [`Workspace::read`]) first drain the stream, so they are ordered after earlier work. `Send`,
/// not `Sync`.
pub struct Workspace {
    rt: Runtime,
    device: i32,
    stream: AclrtStream,
    buffers: Vec<Option<RawBuffer>>,
    /// Work was enqueued since the last successful synchronization.
    pending: Cell<bool>,
    /// A synchronization failed: the stream may still hold work, so nothing is freed.
    stuck: Cell<bool>,
    /// Limit of the implicit synchronizations (before synchronous copies, in drop).
    drain_timeout: Option<Duration>,
    _not_sync: NotSync,
}

// SAFETY: the stream and device buffers are handles usable from any thread bound to the device;
// every method binds it first, and `Workspace` is not `Sync`.
unsafe impl Send for Workspace {}

impl fmt::Debug for Workspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workspace")
            .field("device", &self.device)
            .field("buffers", &self.buffers.iter().flatten().count())
            .field("pending", &self.pending.get())
            .finish_non_exhaustive()
    }
}

impl Workspace {
    /// A new stream on `device`.
    pub fn new(rt: &Runtime, device: i32) -> Result<Self, Error> {
        rt.bind(device)?;
        let mut stream: AclrtStream = core::ptr::null_mut();
        // SAFETY: `stream` is a writable handle slot.
        let code = unsafe { (rt.cann.acl.aclrtCreateStream)(&mut stream) };
        rt.check("aclrtCreateStream", code)?;
        Ok(Self {
            rt: rt.clone(),
            device,
            stream,
            buffers: Vec::new(),
            pending: Cell::new(false),
            stuck: Cell::new(false),
            drain_timeout: None,
            _not_sync: PhantomData,
        })
    }

    /// Bounds the implicit synchronizations: before a synchronous copy and in drop (default:
    /// none). A drop whose synchronization fails leaks the buffers instead of freeing them.
    pub fn set_drain_timeout(&mut self, timeout: Option<Duration>) {
        self.drain_timeout = timeout;
    }

    /// The device.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// The raw stream handle (for calls this wrapper does not cover; it stays owned by `self`).
    pub fn as_raw_stream(&self) -> AclrtStream {
        self.stream
    }

    /// The runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    fn bind(&self) -> Result<(), Error> {
        self.rt.bind(self.device)
    }

    /// Allocates `len` bytes of device memory (contents undefined).
    pub fn alloc(&mut self, len: usize) -> Result<BufferId, Error> {
        if len == 0 {
            return Err(Error::invalid("a device buffer of 0 bytes"));
        }
        self.bind()?;
        let mut ptr: *mut c_void = core::ptr::null_mut();
        // SAFETY: `ptr` is a writable pointer slot; size and policy are plain values.
        let code = unsafe {
            (self.rt.cann.acl.aclrtMalloc)(&mut ptr, len, AclrtMemMallocPolicy::HUGE_FIRST.0)
        };
        self.rt.check("aclrtMalloc", code)?;
        let raw = RawBuffer { ptr, len };
        if let Some(i) = self.buffers.iter().position(Option::is_none) {
            if let Some(slot) = self.buffers.get_mut(i) {
                *slot = Some(raw);
            }
            Ok(BufferId(i))
        } else {
            self.buffers.push(Some(raw));
            Ok(BufferId(self.buffers.len() - 1))
        }
    }

    /// Frees a buffer, after draining the stream (`timeout` as in [`Workspace::synchronize`]).
    pub fn free(&mut self, id: BufferId, timeout: Option<Duration>) -> Result<(), Error> {
        self.raw(id)?;
        self.synchronize(timeout)?;
        if let Some(raw) = self.buffers.get_mut(id.0).and_then(Option::take) {
            // SAFETY: `raw.ptr` came from aclrtMalloc and no work on the (drained) stream uses
            // it; it is freed exactly once since it was taken out of the table.
            let code = unsafe { (self.rt.cann.acl.aclrtFree)(raw.ptr) };
            self.rt.check("aclrtFree", code)?;
        }
        Ok(())
    }

    /// The length of a buffer.
    pub fn len(&self, id: BufferId) -> Option<usize> {
        self.buffers.get(id.0)?.as_ref().map(|b| b.len)
    }

    fn raw(&self, id: BufferId) -> Result<&RawBuffer, Error> {
        self.buffers
            .get(id.0)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::invalid(format!("buffer #{} does not exist", id.0)))
    }

    /// The device address of a checked region (never dereferenced on the host).
    fn addr(&self, r: Region) -> Result<*mut c_void, Error> {
        let b = self.raw(r.buffer)?;
        let end = r.offset.checked_add(r.len);
        if end.is_none_or(|e| e > b.len) {
            return Err(Error::invalid(format!(
                "region {}+{} out of buffer #{} of {} bytes",
                r.offset, r.len, r.buffer.0, b.len
            )));
        }
        Ok(b.ptr.cast::<u8>().wrapping_add(r.offset).cast())
    }

    fn drain(&self) -> Result<(), Error> {
        if self.pending.get() || self.stuck.get() {
            self.sync_stream(self.drain_timeout)?;
        }
        Ok(())
    }

    /// Copies `src` into the region (synchronous, host to device).
    pub fn write(&mut self, dst: Region, src: &[u8]) -> Result<(), Error> {
        if src.len() != dst.len {
            return Err(Error::invalid(format!(
                "writing {} bytes into a region of {}",
                src.len(),
                dst.len
            )));
        }
        let d = self.addr(dst)?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.drain()?;
        // SAFETY: `d` is `dst.len` bytes of live device memory (checked), `src` as many host
        // bytes; the stream is drained, so no queued work touches `d`.
        let code = unsafe {
            (self.rt.cann.acl.aclrtMemcpy)(
                d,
                dst.len,
                src.as_ptr().cast(),
                src.len(),
                AclrtMemcpyKind::HOST_TO_DEVICE.0,
            )
        };
        self.rt.check("aclrtMemcpy", code)
    }

    /// Copies the region into `dst` (synchronous, device to host).
    pub fn read(&self, src: Region, dst: &mut [u8]) -> Result<(), Error> {
        if dst.len() != src.len {
            return Err(Error::invalid(format!(
                "reading a region of {} bytes into {}",
                src.len,
                dst.len()
            )));
        }
        let s = self.addr(src)?;
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.drain()?;
        // SAFETY: `s` is `src.len` bytes of live device memory (checked), `dst` as many writable
        // host bytes; the stream is drained.
        let code = unsafe {
            (self.rt.cann.acl.aclrtMemcpy)(
                dst.as_mut_ptr().cast(),
                dst.len(),
                s,
                src.len,
                AclrtMemcpyKind::DEVICE_TO_HOST.0,
            )
        };
        self.rt.check("aclrtMemcpy", code)
    }

    /// Enqueues a device-to-device copy (the regions must have the same length and must not
    /// overlap).
    pub fn copy(&mut self, dst: Region, src: Region) -> Result<(), Error> {
        if dst.len != src.len {
            return Err(Error::invalid(format!(
                "copying {} bytes into a region of {}",
                src.len, dst.len
            )));
        }
        let (d, s) = (self.addr(dst)?, self.addr(src)?);
        if dst.buffer == src.buffer
            && dst.offset < src.offset + src.len
            && src.offset < dst.offset + dst.len
        {
            return Err(Error::invalid("overlapping device copy"));
        }
        if dst.len == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both regions are live, bounds-checked device memory owned by this workspace,
        // which keeps them alive until the stream is drained.
        let code = unsafe {
            (self.rt.cann.acl.aclrtMemcpyAsync)(
                d,
                dst.len,
                s,
                src.len,
                AclrtMemcpyKind::DEVICE_TO_DEVICE.0,
                self.stream,
            )
        };
        self.rt.check("aclrtMemcpyAsync", code)?;
        self.pending.set(true);
        Ok(())
    }

    fn sync_stream(&self, timeout: Option<Duration>) -> Result<(), Error> {
        self.bind()?;
        let acl = &self.rt.cann.acl;
        let (call, code) = match (timeout, acl.aclrtSynchronizeStreamWithTimeout) {
            (Some(t), Some(f)) => {
                let ms = i32::try_from(t.as_millis()).unwrap_or(i32::MAX).max(1);
                // SAFETY: `stream` is this workspace's live stream.
                let code = unsafe { f(self.stream, ms) };
                ("aclrtSynchronizeStreamWithTimeout", code)
            }
            // SAFETY: `stream` is this workspace's live stream.
            _ => ("aclrtSynchronizeStream", unsafe {
                (acl.aclrtSynchronizeStream)(self.stream)
            }),
        };
        if code == ACL_SUCCESS {
            self.pending.set(false);
            self.stuck.set(false);
            Ok(())
        } else {
            self.stuck.set(true);
            Err(self.rt.acl_error(call, code))
        }
    }

    /// Waits for every enqueued operation (`None`: without a time limit, or when the loaded
    /// CANN lacks `aclrtSynchronizeStreamWithTimeout`). A failure of enqueued work is reported
    /// here.
    pub fn synchronize(&mut self, timeout: Option<Duration>) -> Result<(), Error> {
        self.sync_stream(timeout)
    }

    /// Enqueues one `HcclBatchSendRecv` on this stream. Per the HCCL rules, at most one send and
    /// one receive per peer; every region is a whole number of elements.
    pub fn batch_send_recv(&mut self, comm: &mut Comm, items: &[P2p]) -> Result<(), Error> {
        let f = self
            .rt
            .cann
            .hccl
            .HcclBatchSendRecv
            .ok_or(Error::Unsupported {
                symbol: "HcclBatchSendRecv",
            })?;
        self.same_device(comm)?;
        let mut raw = Vec::with_capacity(items.len());
        for (i, it) in items.iter().enumerate() {
            if it.peer >= comm.ranks || it.peer == comm.rank {
                return Err(Error::invalid(format!(
                    "item {i}: peer {} (this is rank {} of {})",
                    it.peer, comm.rank, comm.ranks
                )));
            }
            if items
                .iter()
                .take(i)
                .any(|o| o.kind == it.kind && o.peer == it.peer)
            {
                return Err(Error::invalid(format!(
                    "item {i}: a second buffer in one direction for peer {}",
                    it.peer
                )));
            }
            let count = elements(it.region.len, it.dtype)?;
            raw.push(HcclSendRecvItem {
                send_recv_type: match it.kind {
                    P2pKind::Send => HcclSendRecvType::SEND,
                    P2pKind::Recv => HcclSendRecvType::RECV,
                },
                buf: self.addr(it.region)?,
                count,
                data_type: it.dtype,
                remote_rank: it.peer,
            });
        }
        if raw.is_empty() {
            return Ok(());
        }
        let n = u32::try_from(raw.len()).map_err(|_| Error::invalid("too many items"))?;
        self.bind()?;
        // SAFETY: `raw` holds `n` items whose buffers are bounds-checked device memory owned by
        // this workspace (kept alive until the stream is drained); `comm` is live.
        let code = unsafe { f(raw.as_mut_ptr(), n, comm.raw, self.stream) };
        self.pending.set(true);
        self.rt.check_hccl("HcclBatchSendRecv", code)
    }

    /// Enqueues `HcclAllGather`: every rank's `send` lands, rank-major, in `recv`
    /// (`recv.len == ranks * send.len`).
    pub fn all_gather(
        &mut self,
        comm: &mut Comm,
        send: Region,
        recv: Region,
        dtype: HcclDataType,
    ) -> Result<(), Error> {
        self.same_device(comm)?;
        let count = elements(send.len, dtype)?;
        if Some(recv.len) != send.len.checked_mul(comm.ranks as usize) || count == 0 {
            return Err(Error::invalid(format!(
                "all-gather of {} bytes per rank into {} bytes for {} ranks",
                send.len, recv.len, comm.ranks
            )));
        }
        if send.buffer == recv.buffer
            && send.offset < recv.offset + recv.len
            && recv.offset < send.offset + send.len
        {
            return Err(Error::invalid(
                "all-gather send and receive regions overlap",
            ));
        }
        let (s, r) = (self.addr(send)?, self.addr(recv)?);
        self.bind()?;
        // SAFETY: both regions are bounds-checked device memory owned by this workspace (kept
        // alive until the stream is drained); `comm` is live.
        let code =
            unsafe { (self.rt.cann.hccl.HcclAllGather)(s, r, count, dtype, comm.raw, self.stream) };
        self.pending.set(true);
        self.rt.check_hccl("HcclAllGather", code)
    }

    fn same_device(&self, comm: &Comm) -> Result<(), Error> {
        if comm.device == self.device && Arc::ptr_eq(&comm.rt.cann, &self.rt.cann) {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "communicator on device {} used with a stream on device {}",
                comm.device, self.device
            )))
        }
    }
}

fn elements(bytes: usize, dtype: HcclDataType) -> Result<u64, Error> {
    let size = dtype
        .size()
        .ok_or_else(|| Error::invalid(format!("unknown HCCL data type {}", dtype.0)))?;
    if !bytes.is_multiple_of(size) {
        return Err(Error::invalid(format!(
            "{bytes} bytes are not a whole number of {size}-byte elements"
        )));
    }
    u64::try_from(bytes / size).map_err(|_| Error::invalid("count overflows u64"))
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return; // cannot reach the device: leak rather than free under running work
        }
        if (self.pending.get() || self.stuck.get()) && self.sync_stream(self.drain_timeout).is_err()
        {
            return; // the stream may still use the buffers: leak them
        }
        for raw in self.buffers.drain(..).flatten() {
            // SAFETY: from aclrtMalloc, freed once; the stream is drained.
            let _ = unsafe { (self.rt.cann.acl.aclrtFree)(raw.ptr) };
        }
        // SAFETY: this workspace's stream, destroyed once, with no work left on it.
        let _ = unsafe { (self.rt.cann.acl.aclrtDestroyStream)(self.stream) };
    }
}
