//! The crate's one error type: vendor errors keep the vendor code and message and add a
//! [`ErrorKind`].

use std::fmt;

use crate::loader::LoadError;
use crate::types::{AclErrorCode, HcclResult, acl_error};

/// What kind of failure a vendor code means (`research/cann-hccl.md` §1.4, §1.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad argument or state (ACL 1xxxxx, `HCCL_E_PARA`, `HCCL_E_PTR`).
    InvalidInput,
    /// `aclInit` was not called.
    NotInitialized,
    /// Device or host memory is exhausted.
    OutOfMemory,
    /// The feature or call is not supported by this CANN or device.
    Unsupported,
    /// An operation or synchronization timed out.
    Timeout,
    /// A peer, a link or the network failed (retry only after rebuilding the communicator).
    Remote,
    /// An internal error of the runtime or driver.
    Internal,
    /// Anything else.
    Other,
}

/// A failed ACL runtime call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclError {
    /// The call.
    pub call: &'static str,
    /// The `aclError` it returned.
    pub code: AclErrorCode,
    /// `aclGetRecentErrMsg` right after the call, if any.
    pub message: Option<String>,
}

impl AclError {
    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        use acl_error as e;
        match self.code {
            e::UNINITIALIZE => ErrorKind::NotInitialized,
            e::BAD_ALLOC | e::RT_MEMORY_ALLOCATION | e::RT_DEVICE_OOM | e::STORAGE_OVER_LIMIT => {
                ErrorKind::OutOfMemory
            }
            e::API_NOT_SUPPORT | e::FEATURE_UNSUPPORTED | e::RT_FEATURE_NOT_SUPPORT => {
                ErrorKind::Unsupported
            }
            e::RT_STREAM_SYNC_TIMEOUT | e::RT_EVENT_SYNC_TIMEOUT | e::RT_AICPU_TIMEOUT => {
                ErrorKind::Timeout
            }
            e::RT_LINK_ERROR
            | e::RT_SUSPECT_REMOTE_ERROR
            | e::RT_SOCKET_CLOSE
            | e::RT_COMM_OP_RETRY_FAIL
            | e::RT_DEVICE_TASK_ABORT
            | e::RT_STREAM_ABORT => ErrorKind::Remote,
            100_000..=199_999 => ErrorKind::InvalidInput,
            500_000..=599_999 => ErrorKind::Internal,
            _ => ErrorKind::Other,
        }
    }
}

impl fmt::Display for AclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed with aclError {}", self.call, self.code)?;
        if let Some(m) = &self.message {
            write!(f, ": {m}")?;
        }
        Ok(())
    }
}

/// A failed HCCL call (or an asynchronous HCCL failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcclError {
    /// The call.
    pub call: &'static str,
    /// The `HcclResult`.
    pub code: HcclResult,
    /// `HcclGetErrorString` of the code, then `aclGetRecentErrMsg`, if any.
    pub message: Option<String>,
}

impl HcclError {
    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        match self.code {
            HcclResult::E_PARA | HcclResult::E_PTR => ErrorKind::InvalidInput,
            HcclResult::E_MEMORY | HcclResult::E_OOM => ErrorKind::OutOfMemory,
            HcclResult::E_NOT_SUPPORT => ErrorKind::Unsupported,
            HcclResult::E_TIMEOUT => ErrorKind::Timeout,
            HcclResult::E_TCP_CONNECT
            | HcclResult::E_ROCE_CONNECT
            | HcclResult::E_TCP_TRANSFER
            | HcclResult::E_ROCE_TRANSFER
            | HcclResult::E_NETWORK
            | HcclResult::E_REMOTE
            | HcclResult::E_OPRETRY_FAIL => ErrorKind::Remote,
            HcclResult::E_INTERNAL
            | HcclResult::E_RUNTIME
            | HcclResult::E_DRV
            | HcclResult::E_CCE
            | HcclResult::E_SYSCALL => ErrorKind::Internal,
            _ => ErrorKind::Other,
        }
    }
}

impl fmt::Display for HcclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed with HcclResult {}", self.call, self.code.0)?;
        if let Some(m) = &self.message {
            write!(f, ": {m}")?;
        }
        Ok(())
    }
}

/// Every failure of this crate.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// CANN could not be loaded.
    Load(LoadError),
    /// An ACL runtime call failed.
    Acl(AclError),
    /// An HCCL call failed.
    Hccl(HcclError),
    /// The loaded CANN lacks an optional call that this operation needs.
    Unsupported {
        /// The missing symbol.
        symbol: &'static str,
    },
    /// A bad argument, caught before calling CANN.
    Invalid {
        /// What was wrong.
        what: String,
    },
}

impl Error {
    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Load(_) | Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::Acl(e) => e.kind(),
            Error::Hccl(e) => e.kind(),
            Error::Invalid { .. } => ErrorKind::InvalidInput,
        }
    }

    /// The vendor code (`aclError` or `HcclResult`), 0 when there is none.
    pub fn code(&self) -> i32 {
        match self {
            Error::Acl(e) => e.code,
            Error::Hccl(e) => i32::try_from(e.code.0).unwrap_or(i32::MAX),
            _ => 0,
        }
    }

    pub(crate) fn invalid(what: impl Into<String>) -> Self {
        Error::Invalid { what: what.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Load(e) => e.fmt(f),
            Error::Acl(e) => e.fmt(f),
            Error::Hccl(e) => e.fmt(f),
            Error::Unsupported { symbol } => {
                write!(f, "the loaded CANN does not provide {symbol}")
            }
            Error::Invalid { what } => write!(f, "invalid argument: {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Load(e) => Some(e),
            _ => None,
        }
    }
}

impl From<LoadError> for Error {
    fn from(e: LoadError) -> Self {
        Error::Load(e)
    }
}
