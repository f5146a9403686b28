//! Raw C types of the ACL runtime and HCCL, hand-written from the documented headers
//! (`research/cann-hccl.md` §1.3-§1.7).
//!
//! C enums are `#[repr(transparent)]` newtypes with associated consts, never Rust enums: a newer
//! library returning a value we do not know must not be undefined behaviour. Struct layouts are
//! pinned by `const` asserts.

use core::ffi::{c_char, c_int, c_void};
use core::mem::{align_of, offset_of, size_of};

/// `aclError`: `0` is success.
pub type AclErrorCode = c_int;
/// `aclrtStream`.
pub type AclrtStream = *mut c_void;
/// `aclrtEvent`.
pub type AclrtEvent = *mut c_void;
/// `HcclComm`.
pub type HcclComm = *mut c_void;

/// `ACL_SUCCESS`.
pub const ACL_SUCCESS: AclErrorCode = 0;

/// Named `aclError` values (`acl_base_rt.h`, `rt_error_codes.h`).
pub mod acl_error {
    use super::AclErrorCode;
    /// `ACL_ERROR_INVALID_PARAM`.
    pub const INVALID_PARAM: AclErrorCode = 100_000;
    /// `ACL_ERROR_UNINITIALIZE`.
    pub const UNINITIALIZE: AclErrorCode = 100_001;
    /// `ACL_ERROR_REPEAT_INITIALIZE` (treated as success by `init`).
    pub const REPEAT_INITIALIZE: AclErrorCode = 100_002;
    /// `ACL_ERROR_BAD_ALLOC`.
    pub const BAD_ALLOC: AclErrorCode = 200_000;
    /// `ACL_ERROR_API_NOT_SUPPORT`.
    pub const API_NOT_SUPPORT: AclErrorCode = 200_001;
    /// `ACL_ERROR_INVALID_DEVICE`.
    pub const INVALID_DEVICE: AclErrorCode = 200_002;
    /// `ACL_ERROR_FEATURE_UNSUPPORTED`.
    pub const FEATURE_UNSUPPORTED: AclErrorCode = 200_006;
    /// `ACL_ERROR_STORAGE_OVER_LIMIT`.
    pub const STORAGE_OVER_LIMIT: AclErrorCode = 300_000;
    /// `ACL_ERROR_INTERNAL_ERROR`.
    pub const INTERNAL_ERROR: AclErrorCode = 500_000;
    /// `ACL_ERROR_RT_PARAM_INVALID`.
    pub const RT_PARAM_INVALID: AclErrorCode = 107_000;
    /// `ACL_ERROR_RT_INVALID_DEVICEID`.
    pub const RT_INVALID_DEVICEID: AclErrorCode = 107_001;
    /// `ACL_ERROR_RT_DEVICE_TASK_ABORT`.
    pub const RT_DEVICE_TASK_ABORT: AclErrorCode = 107_022;
    /// `ACL_ERROR_RT_STREAM_ABORT`.
    pub const RT_STREAM_ABORT: AclErrorCode = 107_023;
    /// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`.
    pub const RT_FEATURE_NOT_SUPPORT: AclErrorCode = 207_000;
    /// `ACL_ERROR_RT_MEMORY_ALLOCATION`.
    pub const RT_MEMORY_ALLOCATION: AclErrorCode = 207_001;
    /// `ACL_ERROR_RT_NO_DEVICE`.
    pub const RT_NO_DEVICE: AclErrorCode = 207_004;
    /// `ACL_ERROR_RT_DEVICE_OOM`.
    pub const RT_DEVICE_OOM: AclErrorCode = 207_018;
    /// `ACL_ERROR_RT_INTERNAL_ERROR`.
    pub const RT_INTERNAL_ERROR: AclErrorCode = 507_000;
    /// `ACL_ERROR_RT_AICPU_TIMEOUT`.
    pub const RT_AICPU_TIMEOUT: AclErrorCode = 507_017;
    /// `ACL_ERROR_RT_STREAM_SYNC_TIMEOUT`.
    pub const RT_STREAM_SYNC_TIMEOUT: AclErrorCode = 507_046;
    /// `ACL_ERROR_RT_EVENT_SYNC_TIMEOUT`.
    pub const RT_EVENT_SYNC_TIMEOUT: AclErrorCode = 507_047;
    /// `ACL_ERROR_RT_LINK_ERROR`.
    pub const RT_LINK_ERROR: AclErrorCode = 507_056;
    /// `ACL_ERROR_RT_SUSPECT_REMOTE_ERROR`.
    pub const RT_SUSPECT_REMOTE_ERROR: AclErrorCode = 507_057;
    /// `ACL_ERROR_RT_SOCKET_CLOSE`.
    pub const RT_SOCKET_CLOSE: AclErrorCode = 507_901;
    /// `ACL_ERROR_RT_COMM_OP_RETRY_FAIL`.
    pub const RT_COMM_OP_RETRY_FAIL: AclErrorCode = 507_904;
}

/// `aclrtMemcpyKind`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AclrtMemcpyKind(pub u32);

impl AclrtMemcpyKind {
    /// `ACL_MEMCPY_HOST_TO_HOST`.
    pub const HOST_TO_HOST: Self = Self(0);
    /// `ACL_MEMCPY_HOST_TO_DEVICE`.
    pub const HOST_TO_DEVICE: Self = Self(1);
    /// `ACL_MEMCPY_DEVICE_TO_HOST`.
    pub const DEVICE_TO_HOST: Self = Self(2);
    /// `ACL_MEMCPY_DEVICE_TO_DEVICE`.
    pub const DEVICE_TO_DEVICE: Self = Self(3);
    /// `ACL_MEMCPY_DEFAULT`.
    pub const DEFAULT: Self = Self(4);
}

/// `aclrtMemMallocPolicy` (values and OR-able flags).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AclrtMemMallocPolicy(pub u32);

impl AclrtMemMallocPolicy {
    /// `ACL_MEM_MALLOC_HUGE_FIRST`.
    pub const HUGE_FIRST: Self = Self(0);
    /// `ACL_MEM_MALLOC_HUGE_ONLY`.
    pub const HUGE_ONLY: Self = Self(1);
    /// `ACL_MEM_MALLOC_NORMAL_ONLY`.
    pub const NORMAL_ONLY: Self = Self(2);
    /// `ACL_MEM_MALLOC_HUGE_FIRST_P2P`.
    pub const HUGE_FIRST_P2P: Self = Self(3);
    /// `ACL_MEM_MALLOC_HUGE_ONLY_P2P`.
    pub const HUGE_ONLY_P2P: Self = Self(4);
    /// `ACL_MEM_MALLOC_NORMAL_ONLY_P2P`.
    pub const NORMAL_ONLY_P2P: Self = Self(5);
}

/// `aclrtEventRecordedStatus`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AclrtEventRecordedStatus(pub u32);

impl AclrtEventRecordedStatus {
    /// `ACL_EVENT_RECORDED_STATUS_NOT_READY`.
    pub const NOT_READY: Self = Self(0);
    /// `ACL_EVENT_RECORDED_STATUS_COMPLETE`.
    pub const COMPLETE: Self = Self(1);
}

/// `HcclResult`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HcclResult(pub u32);

impl HcclResult {
    /// `HCCL_SUCCESS`.
    pub const SUCCESS: Self = Self(0);
    /// `HCCL_E_PARA`.
    pub const E_PARA: Self = Self(1);
    /// `HCCL_E_PTR`.
    pub const E_PTR: Self = Self(2);
    /// `HCCL_E_MEMORY`.
    pub const E_MEMORY: Self = Self(3);
    /// `HCCL_E_INTERNAL`.
    pub const E_INTERNAL: Self = Self(4);
    /// `HCCL_E_NOT_SUPPORT`.
    pub const E_NOT_SUPPORT: Self = Self(5);
    /// `HCCL_E_NOT_FOUND`.
    pub const E_NOT_FOUND: Self = Self(6);
    /// `HCCL_E_UNAVAIL`.
    pub const E_UNAVAIL: Self = Self(7);
    /// `HCCL_E_SYSCALL`.
    pub const E_SYSCALL: Self = Self(8);
    /// `HCCL_E_TIMEOUT`.
    pub const E_TIMEOUT: Self = Self(9);
    /// `HCCL_E_OPEN_FILE_FAILURE`.
    pub const E_OPEN_FILE_FAILURE: Self = Self(10);
    /// `HCCL_E_TCP_CONNECT`.
    pub const E_TCP_CONNECT: Self = Self(11);
    /// `HCCL_E_ROCE_CONNECT`.
    pub const E_ROCE_CONNECT: Self = Self(12);
    /// `HCCL_E_TCP_TRANSFER`.
    pub const E_TCP_TRANSFER: Self = Self(13);
    /// `HCCL_E_ROCE_TRANSFER`.
    pub const E_ROCE_TRANSFER: Self = Self(14);
    /// `HCCL_E_RUNTIME`.
    pub const E_RUNTIME: Self = Self(15);
    /// `HCCL_E_DRV`.
    pub const E_DRV: Self = Self(16);
    /// `HCCL_E_PROFILING`.
    pub const E_PROFILING: Self = Self(17);
    /// `HCCL_E_CCE`.
    pub const E_CCE: Self = Self(18);
    /// `HCCL_E_NETWORK`.
    pub const E_NETWORK: Self = Self(19);
    /// `HCCL_E_AGAIN`.
    pub const E_AGAIN: Self = Self(20);
    /// `HCCL_E_REMOTE` (error CQE).
    pub const E_REMOTE: Self = Self(21);
    /// `HCCL_E_SUSPENDING`.
    pub const E_SUSPENDING: Self = Self(22);
    /// `HCCL_E_OPRETRY_FAIL`.
    pub const E_OPRETRY_FAIL: Self = Self(23);
    /// `HCCL_E_OOM`.
    pub const E_OOM: Self = Self(24);
}

/// `HcclDataType`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HcclDataType(pub u32);

impl HcclDataType {
    /// `HCCL_DATA_TYPE_INT8`.
    pub const INT8: Self = Self(0);
    /// `HCCL_DATA_TYPE_INT16`.
    pub const INT16: Self = Self(1);
    /// `HCCL_DATA_TYPE_INT32`.
    pub const INT32: Self = Self(2);
    /// `HCCL_DATA_TYPE_FP16`.
    pub const FP16: Self = Self(3);
    /// `HCCL_DATA_TYPE_FP32`.
    pub const FP32: Self = Self(4);
    /// `HCCL_DATA_TYPE_INT64`.
    pub const INT64: Self = Self(5);
    /// `HCCL_DATA_TYPE_UINT64`.
    pub const UINT64: Self = Self(6);
    /// `HCCL_DATA_TYPE_UINT8`.
    pub const UINT8: Self = Self(7);
    /// `HCCL_DATA_TYPE_UINT16`.
    pub const UINT16: Self = Self(8);
    /// `HCCL_DATA_TYPE_UINT32`.
    pub const UINT32: Self = Self(9);
    /// `HCCL_DATA_TYPE_FP64`.
    pub const FP64: Self = Self(10);
    /// `HCCL_DATA_TYPE_BFP16`.
    pub const BFP16: Self = Self(11);
    /// `HCCL_DATA_TYPE_INT128`.
    pub const INT128: Self = Self(12);
    /// `HCCL_DATA_TYPE_HIF8`.
    pub const HIF8: Self = Self(14);
    /// `HCCL_DATA_TYPE_FP8E4M3`.
    pub const FP8E4M3: Self = Self(15);
    /// `HCCL_DATA_TYPE_FP8E5M2`.
    pub const FP8E5M2: Self = Self(16);
    /// `HCCL_DATA_TYPE_FP8E8M0`.
    pub const FP8E8M0: Self = Self(17);
    /// `HCCL_DATA_TYPE_RESERVED`.
    pub const RESERVED: Self = Self(255);

    /// Bytes per element, `None` for a type this crate does not know.
    pub const fn size(self) -> Option<usize> {
        match self.0 {
            0 | 7 | 14..=17 => Some(1),
            1 | 3 | 8 | 11 => Some(2),
            2 | 4 | 9 => Some(4),
            5 | 6 | 10 => Some(8),
            12 => Some(16),
            _ => None,
        }
    }
}

/// `HcclReduceOp`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HcclReduceOp(pub u32);

impl HcclReduceOp {
    /// `HCCL_REDUCE_SUM`.
    pub const SUM: Self = Self(0);
    /// `HCCL_REDUCE_PROD`.
    pub const PROD: Self = Self(1);
    /// `HCCL_REDUCE_MAX`.
    pub const MAX: Self = Self(2);
    /// `HCCL_REDUCE_MIN`.
    pub const MIN: Self = Self(3);
}

/// `HcclSendRecvType`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HcclSendRecvType(pub u32);

impl HcclSendRecvType {
    /// `HCCL_SEND`.
    pub const SEND: Self = Self(0);
    /// `HCCL_RECV`.
    pub const RECV: Self = Self(1);
}

/// `HCCL_ROOT_INFO_BYTES`.
pub const HCCL_ROOT_INFO_BYTES: usize = 4108;

/// `HcclRootInfo`: an opaque blob the root rank makes and every rank must receive out of band.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HcclRootInfo {
    /// The bytes.
    pub internal: [c_char; HCCL_ROOT_INFO_BYTES],
}

impl core::fmt::Debug for HcclRootInfo {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("HcclRootInfo { .. }")
    }
}

const _: () = assert!(size_of::<HcclRootInfo>() == 4108 && align_of::<HcclRootInfo>() == 1);

/// `HcclSendRecvItem`: one entry of `HcclBatchSendRecv`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HcclSendRecvItem {
    /// Send or receive.
    pub send_recv_type: HcclSendRecvType,
    /// Device buffer.
    pub buf: *mut c_void,
    /// Elements of `data_type`.
    pub count: u64,
    /// Element type.
    pub data_type: HcclDataType,
    /// The peer.
    pub remote_rank: u32,
}

const _: () = {
    assert!(size_of::<HcclSendRecvItem>() == 32);
    assert!(align_of::<HcclSendRecvItem>() == 8);
    assert!(offset_of!(HcclSendRecvItem, send_recv_type) == 0);
    assert!(offset_of!(HcclSendRecvItem, buf) == 8);
    assert!(offset_of!(HcclSendRecvItem, count) == 16);
    assert!(offset_of!(HcclSendRecvItem, data_type) == 24);
    assert!(offset_of!(HcclSendRecvItem, remote_rank) == 28);
};
