//! `eplb-ascend-sys`: the CANN ACL runtime and HCCL, declared by hand and loaded at run time.
//!
//! - [`types`]: the raw C types (enums as `#[repr(transparent)]` newtypes, struct layouts pinned
//!   by `const` asserts), written from the documented API.
//! - [`loader`]: [`Cann`], the loaded libraries with typed function tables; [`Search`] says where
//!   to look (an explicit directory, `$ASCEND_HOME_PATH` / `$ASCEND_TOOLKIT_HOME`, the default
//!   install roots); HCCL symbols come from `libhccl.so`, then `libhcomm.so`; optional symbols
//!   are `Option`s.
//! - [`safe`]: RAII wrappers ([`Runtime`], [`Workspace`] = a stream and its device buffers,
//!   [`Comm`], [`RootInfo`]) that the HCCL transport of `eplb-runtime` builds on.
//! - [`fake`]: the fake CANN (C, built by `build.rs` with feature `fake-cann`) and its
//!   fault-injection hooks, for tests.
//!
//! **Invariant:** nothing panics when CANN is absent or returns an error: loading returns a
//! [`LoadError`] that lists every place it looked, and every call returns an [`Error`] with the
//! vendor code and message.
//!
//! **Invariant:** no link-time dependency on CANN: a binary built with this crate starts on a
//! machine without it.
//!
//! **Invariant:** asynchronous device work only touches buffers owned by the [`Workspace`] that
//! runs it, and a workspace frees nothing its stream may still use; `Drop` never panics.

pub mod error;
pub mod fake;
pub mod loader;
pub mod safe;
pub mod types;

pub use error::{AclError, Error, ErrorKind, HcclError};
pub use loader::{AclApi, Attempt, Cann, HcclApi, LoadError, Location, Search};
pub use safe::{BufferId, Comm, P2p, P2pKind, Region, RootInfo, Runtime, Workspace};
