//! File input and output of the `eplb` tool and the runtime: bounded reads, atomic writes.
//!
//! **Invariant:** an input is read only if it is a regular file no larger than the limit
//! (default [`DEFAULT_INPUT_LIMIT`], 1 GiB); a FIFO, a device such as `/dev/zero`, a directory or
//! a socket is refused before it is opened, so nothing blocks or grows without bound.
//!
//! **Invariant:** an output replaces only a regular file, atomically (a temporary file in the
//! same directory, written, fsynced and renamed over the target), so a reader sees the old
//! content or the new, never a part. A symbolic link is followed to the file it names, which is
//! replaced (the link stays); a FIFO or a character device (`/dev/null`, `/dev/stdout`) is
//! written through, never replaced; anything else is refused ([`WriteRefused`]).
//!
//! **Invariant:** every temporary file in progress is listed, so that a process ending on a
//! signal leaves none behind ([`remove_pending_temporaries`]; the `eplb` binary calls it on
//! SIGINT and SIGTERM).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// The default input size limit: 1 GiB.
pub const DEFAULT_INPUT_LIMIT: u64 = 1 << 30;

/// Why an input was not read.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReadError {
    /// Not a regular file (a directory, a FIFO, a device, a socket).
    NotRegular {
        /// What it is instead.
        kind: &'static str,
    },
    /// Larger than the limit.
    TooLarge {
        /// The size (or, for a file that grew while read, more than the limit).
        size: u64,
        /// The limit in bytes.
        limit: u64,
    },
    /// An I/O error.
    Io(io::Error),
}

impl core::fmt::Display for ReadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ReadError::NotRegular { kind } => write!(f, "not a regular file ({kind})"),
            ReadError::TooLarge { size, limit } => write!(
                f,
                "{size} bytes is over the input size limit of {limit} bytes (--max-input-bytes)"
            ),
            ReadError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReadError {}

/// What a non-regular file is, for a message.
fn kind_of(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// Reads the whole of `path`, which must be a regular file of at most `limit` bytes.
///
/// The file type is checked on the path's metadata before opening (opening a FIFO would wait
/// for a writer), the size from the metadata, and the read itself stops after `limit + 1`
/// bytes, so a file that grows meanwhile is refused too.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let meta = std::fs::metadata(path).map_err(ReadError::Io)?;
    if !meta.file_type().is_file() {
        return Err(ReadError::NotRegular {
            kind: kind_of(meta.file_type()),
        });
    }
    if meta.len() > limit {
        return Err(ReadError::TooLarge {
            size: meta.len(),
            limit,
        });
    }
    let file = File::open(path).map_err(ReadError::Io)?;
    // The descriptor's own type (the path may have been swapped after the check).
    let opened = file.metadata().map_err(ReadError::Io)?;
    if !opened.file_type().is_file() {
        return Err(ReadError::NotRegular {
            kind: kind_of(opened.file_type()),
        });
    }
    let cap = usize::try_from(opened.len().min(limit)).unwrap_or(0);
    let mut buf = Vec::with_capacity(cap);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(ReadError::Io)?;
    let got = buf.len() as u64;
    if got > limit {
        return Err(ReadError::TooLarge { size: got, limit });
    }
    Ok(buf)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_bounded_to_string(path: &Path, limit: u64) -> Result<String, ReadError> {
    let bytes = read_bounded(path, limit)?;
    String::from_utf8(bytes)
        .map_err(|e| ReadError::Io(io::Error::new(io::ErrorKind::InvalidData, e.utf8_error())))
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// The temporary files this process has created and not yet renamed or removed (see
/// [`remove_pending_temporaries`]). A path is added under the lock together with the file's
/// creation, and removed under the lock together with its rename, so the list never misses a
/// temporary file that exists.
static PENDING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn pending() -> MutexGuard<'static, Vec<PathBuf>> {
    PENDING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Removes every temporary file of an atomic write still in progress in this process, and
/// returns how many it removed. For a signal handler that ends the process: the `eplb` binary
/// calls it on SIGINT and SIGTERM, then exits; an engine that handles those signals itself can
/// do the same. Writes in progress then fail (their temporary file is gone); the targets are
/// untouched.
pub fn remove_pending_temporaries() -> usize {
    remove_pending_where(|_| true)
}

fn remove_pending_where(select: impl Fn(&Path) -> bool) -> usize {
    let mut list = pending();
    let mut removed = 0;
    list.retain(|p| {
        if !select(p) {
            return true;
        }
        if std::fs::remove_file(p).is_ok() {
            removed += 1;
        }
        false
    });
    removed
}

/// A hook run after a temporary file is written and before it is renamed (tests only).
static BEFORE_COMMIT: OnceLock<fn(&Path)> = OnceLock::new();

/// Installs a function called with each temporary file's path after it is written and synced,
/// right before the rename. For tests of interrupted writes (the `eplb` binary installs one
/// that holds the write when `EPLB_TEST_HOLD_WRITE` is set); the first call wins.
#[doc(hidden)]
pub fn set_before_commit_hook(hook: fn(&Path)) {
    let _ = BEFORE_COMMIT.set(hook);
}

/// Why an output was not written (inside the [`io::Error`] of [`write_atomic`], kind
/// `InvalidInput`; `get_ref()` and `downcast_ref` give it back).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteRefused {
    /// The path names something that is neither a regular file nor a stream (a directory, a
    /// block device, a socket): it is never replaced, and not written into.
    NotWritable {
        /// What it is.
        kind: &'static str,
    },
    /// More than [`MAX_LINKS`] symbolic links in a row, or a loop.
    TooManyLinks,
    /// A regular file reached through a link whose text does not name it (such as
    /// `/proc/self/fd/1` of a deleted file): there is no path to replace it at.
    UnnamedFile,
    /// The path names no file.
    NoFileName,
}

impl core::fmt::Display for WriteRefused {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WriteRefused::NotWritable { kind } => {
                write!(f, "not a regular file ({kind}); refusing to write to it")
            }
            WriteRefused::TooManyLinks => write!(
                f,
                "more than {MAX_LINKS} symbolic links in a row (or a loop); write to the file's own path"
            ),
            WriteRefused::UnnamedFile => write!(
                f,
                "a link to a regular file that has no path (deleted or anonymous); write to a file's path"
            ),
            WriteRefused::NoFileName => write!(f, "the output path names no file"),
        }
    }
}

impl std::error::Error for WriteRefused {}

impl From<WriteRefused> for io::Error {
    fn from(e: WriteRefused) -> Self {
        io::Error::new(io::ErrorKind::InvalidInput, e)
    }
}

/// The most symbolic links followed from an output path (as Linux's `MAXSYMLINKS`).
pub const MAX_LINKS: usize = 40;

/// Where an output goes.
#[derive(Debug)]
enum Target {
    /// A regular file (existing or not) at this path, after following every symbolic link:
    /// replaced by a temporary file in its directory renamed over it. `mode`: the permissions
    /// of the file it replaces.
    Replace {
        path: PathBuf,
        mode: Option<std::fs::Permissions>,
    },
    /// A FIFO or a character device (`/dev/null`, a terminal, `/dev/stdout` on a pipe): opened
    /// and written, never replaced.
    Stream,
}

/// Follows `path` through its symbolic links to what it names.
fn resolve_output(path: &Path) -> io::Result<Target> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    // What the kernel reaches through the whole chain (including magic links such as
    // `/proc/self/fd/1`, which `read_link` cannot follow by name).
    let reached = match std::fs::metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    if let Some(m) = &reached {
        let ft = m.file_type();
        if ft.is_fifo() || ft.is_char_device() {
            return Ok(Target::Stream);
        }
        if !ft.is_file() {
            return Err(WriteRefused::NotWritable { kind: kind_of(ft) }.into());
        }
    }
    // The chain by name: the last path is the file (or the place of a new file).
    let mut cur = path.to_path_buf();
    let mut hops = 0;
    loop {
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_LINKS {
                    return Err(WriteRefused::TooManyLinks.into());
                }
                let next = std::fs::read_link(&cur)?;
                cur = if next.is_absolute() {
                    next
                } else {
                    parent_dir(&cur).join(next)
                };
            }
            Ok(m) => {
                // An existing file: it must be the one the kernel reached.
                return match &reached {
                    Some(r) if r.dev() == m.dev() && r.ino() == m.ino() => Ok(Target::Replace {
                        path: cur,
                        mode: Some(m.permissions()),
                    }),
                    Some(_) => Err(WriteRefused::UnnamedFile.into()),
                    None => Err(WriteRefused::NotWritable {
                        kind: kind_of(m.file_type()),
                    }
                    .into()),
                };
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return match reached {
                    // A new file, or a dangling link's target: created there.
                    None => Ok(Target::Replace {
                        path: cur,
                        mode: None,
                    }),
                    Some(_) => Err(WriteRefused::UnnamedFile.into()),
                };
            }
            Err(e) => return Err(e),
        }
    }
}

/// The directory holding `path` (`.` for a bare name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A temporary file of an atomic write: listed in [`PENDING`] from its creation until it is
/// renamed or removed; dropping it uncommitted removes it.
struct TempFile {
    path: PathBuf,
    file: Option<File>,
}

impl TempFile {
    /// Creates `.NAME.PID.SEQ.tmp` beside `target` with `mode` (less the umask).
    fn create(target: &Path, mode: u32) -> io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let name = target.file_name().ok_or(WriteRefused::NoFileName)?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(
            ".{}.{}.tmp",
            std::process::id(),
            TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let path = parent_dir(target).join(tmp_name);
        let mut list = pending();
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)?;
        list.push(path.clone());
        drop(list);
        Ok(Self {
            path,
            file: Some(file),
        })
    }

    /// Renames the file over `target` and forgets it.
    fn commit(mut self, target: &Path) -> io::Result<()> {
        drop(self.file.take());
        let mut list = pending();
        // A signal handler may have removed it: then the rename fails and nothing is replaced.
        let done = std::fs::rename(&self.path, target);
        if done.is_ok() {
            list.retain(|p| p != &self.path);
        }
        drop(list);
        done
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        drop(self.file.take());
        let mut list = pending();
        if let Some(i) = list.iter().position(|p| p == &self.path) {
            let _ = std::fs::remove_file(&self.path);
            list.swap_remove(i);
        }
    }
}

/// Writes `bytes` to what `path` names, never replacing anything but a regular file:
///
/// - a regular file (or no file yet) is replaced atomically: a temporary file in the same
///   directory is written, fsynced, given the old file's permission bits (a new file: 0666
///   less the umask, as any created file; the owner and group are the writer's, not the old
///   file's) and renamed over it (then the
///   directory is fsynced, best effort); a reader sees the old contents or the new, never a
///   part. On error the temporary file is removed and the file is untouched;
/// - a symbolic link is followed (up to [`MAX_LINKS`]) to the file it names, which is replaced
///   in its own directory; the link stays;
/// - a FIFO or a character device (`/dev/null`, a terminal, `/dev/stdout` on a pipe) is opened
///   and written through (opening a FIFO waits for a reader);
/// - anything else (a directory, a block device, a socket) is refused with [`WriteRefused`].
///
/// A temporary file in progress is listed for [`remove_pending_temporaries`].
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    path.file_name().ok_or(WriteRefused::NoFileName)?;
    match resolve_output(path)? {
        Target::Stream => write_through(path, bytes),
        Target::Replace { path: target, mode } => {
            // Replacing a file: private until it has the old file's permissions. A new file:
            // created as any file is (0666 less the umask).
            let create_mode = if mode.is_some() { 0o600 } else { 0o666 };
            let mut tmp = TempFile::create(&target, create_mode)?;
            if let Some(f) = tmp.file.as_mut() {
                f.write_all(bytes)?;
                if let Some(mode) = mode {
                    f.set_permissions(mode)?;
                }
                f.sync_all()?;
            }
            if let Some(hook) = BEFORE_COMMIT.get() {
                hook(&tmp.path);
            }
            tmp.commit(&target)?;
            if let Ok(d) = File::open(parent_dir(&target)) {
                let _ = d.sync_all();
            }
            Ok(())
        }
    }
}

/// Opens a FIFO or character device and writes `bytes` into it.
fn write_through(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    // No `create`, no `truncate`: it exists, and is not a regular file.
    let mut f = OpenOptions::new().write(true).open(path)?;
    // The descriptor's own type (the path may have been swapped after the check): a regular
    // file here would be overwritten in place, not replaced.
    let ft = f.metadata()?.file_type();
    if !(ft.is_fifo() || ft.is_char_device()) {
        return Err(WriteRefused::NotWritable { kind: kind_of(ft) }.into());
    }
    f.write_all(bytes)?;
    f.flush()
}

/// Whether `a` and `b` name the same existing file (same device and inode, so links and
/// different spellings of one path count as the same).
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// An output path that names an input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverwritesInput {
    /// The output path given.
    pub output: std::path::PathBuf,
    /// The input it names.
    pub input: std::path::PathBuf,
}

impl core::fmt::Display for OverwritesInput {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{}: the output is the input file {}; write to another path",
            self.output.display(),
            self.input.display()
        )
    }
}

impl std::error::Error for OverwritesInput {}

/// An error naming `output` when it is the same file as one of `inputs` (writing it would
/// destroy the input).
pub fn refuse_overwrite_input(output: &Path, inputs: &[&Path]) -> Result<(), OverwritesInput> {
    match inputs.iter().find(|i| same_file(output, i)) {
        Some(i) => Err(OverwritesInput {
            output: output.to_path_buf(),
            input: i.to_path_buf(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("eplb-fsio-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn refuses_devices_directories_and_fifos_without_blocking() {
        for p in ["/dev/zero", "/dev/urandom", "/dev/null"] {
            let e = read_bounded(Path::new(p), DEFAULT_INPUT_LIMIT).unwrap_err();
            assert_eq!(e.to_string(), "not a regular file (a character device)");
        }
        let d = dir("kinds");
        let e = read_bounded(&d, DEFAULT_INPUT_LIMIT).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file (a directory)");
        let fifo = d.join("fifo");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let e = read_bounded(&fifo, DEFAULT_INPUT_LIMIT).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file (a FIFO)");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn the_limit_counts_bytes() {
        let d = dir("limit");
        let f = d.join("f.json");
        std::fs::write(&f, b"[1, 2]").unwrap();
        assert_eq!(read_bounded(&f, 6).unwrap(), b"[1, 2]");
        let e = read_bounded(&f, 5).unwrap_err();
        assert!(
            matches!(e, ReadError::TooLarge { size: 6, limit: 5 }),
            "{e}"
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary() {
        let d = dir("atomic");
        let f = d.join("out.json");
        write_atomic(&f, b"one").unwrap();
        write_atomic(&f, b"two").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("out.json")]);
        assert!(write_atomic(&d.join("missing/out.json"), b"x").is_err());
        assert!(same_file(&f, &d.join(".").join("out.json")));
        assert!(refuse_overwrite_input(&f, &[&d.join("./out.json")]).is_err());
        assert!(refuse_overwrite_input(&d.join("new.json"), &[&f]).is_ok());
        std::fs::remove_dir_all(d).unwrap();
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_fifo_is_written_through_not_replaced() {
        use std::os::unix::fs::FileTypeExt;
        let d = dir("fifo-out");
        let fifo = d.join("out");
        let _ = std::fs::remove_file(&fifo);
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        write_atomic(&fifo, b"through the pipe").unwrap();
        assert_eq!(reader.join().unwrap(), b"through the pipe");
        let ft = std::fs::symlink_metadata(&fifo).unwrap().file_type();
        assert!(ft.is_fifo(), "{ft:?}");
        assert_eq!(names(&d), ["out"]);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn dev_null_stays_a_character_device() {
        use std::os::unix::fs::FileTypeExt;
        write_atomic(Path::new("/dev/null"), b"discarded").unwrap();
        let ft = std::fs::symlink_metadata("/dev/null").unwrap().file_type();
        assert!(ft.is_char_device());
    }

    #[test]
    fn a_symlink_is_followed_and_kept() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let d = dir("links");
        let real_dir = d.join("real");
        std::fs::create_dir_all(&real_dir).unwrap();
        let target = real_dir.join("map.json");
        std::fs::write(&target, b"old").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
        // A relative link to a relative link to the file.
        symlink("real/map.json", d.join("hop")).unwrap();
        symlink("hop", d.join("link")).unwrap();
        write_atomic(&d.join("link"), b"new").unwrap();
        assert!(
            std::fs::symlink_metadata(d.join("link"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            std::fs::read_link(d.join("link")).unwrap(),
            Path::new("hop")
        );
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o640, "{mode:o}");
        // The temporary file lived beside the target, and is gone.
        assert_eq!(names(&real_dir), ["map.json"]);
        assert_eq!(names(&d), ["hop", "link", "real"]);
        // A dangling link: the file it names is created.
        symlink("real/new.json", d.join("dangling")).unwrap();
        write_atomic(&d.join("dangling"), b"fresh").unwrap();
        assert_eq!(std::fs::read(real_dir.join("new.json")).unwrap(), b"fresh");
        assert!(
            std::fs::symlink_metadata(d.join("dangling"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        // A loop is refused.
        symlink("loop-b", d.join("loop-a")).unwrap();
        symlink("loop-a", d.join("loop-b")).unwrap();
        let e = write_atomic(&d.join("loop-a"), b"x").unwrap_err();
        assert!(e.to_string().contains("symbolic links"), "{e}");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn directories_are_refused_and_a_replaced_file_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let d = dir("kinds-out");
        let sub = d.join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        let e = write_atomic(&sub, b"x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let refused = e.get_ref().and_then(|r| r.downcast_ref::<WriteRefused>());
        assert_eq!(
            refused,
            Some(&WriteRefused::NotWritable {
                kind: "a directory"
            })
        );
        assert!(sub.is_dir());
        let f = d.join("script");
        std::fs::write(&f, b"old").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
        write_atomic(&f, b"new").unwrap();
        let mode = std::fs::metadata(&f).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o755, "{mode:o}");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn pending_temporaries_are_listed_until_renamed_or_removed() {
        let d = dir("pending");
        let target = d.join("out.json");
        let mut tmp = TempFile::create(&target, 0o600).unwrap();
        tmp.file.as_mut().unwrap().write_all(b"partial").unwrap();
        assert!(tmp.path.exists());
        // What a signal handler does (only this test's directory: tests run in parallel).
        assert_eq!(remove_pending_where(|p| p.starts_with(&d)), 1);
        assert!(!tmp.path.exists());
        // The write then fails, and replaces nothing.
        assert!(tmp.commit(&target).is_err());
        assert!(!target.exists());
        // Dropped uncommitted (an error, a panic): removed and unlisted.
        let tmp = TempFile::create(&target, 0o600).unwrap();
        let path = tmp.path.clone();
        drop(tmp);
        assert!(!path.exists());
        assert!(!pending().contains(&path));
        // Committed: unlisted.
        let tmp = TempFile::create(&target, 0o600).unwrap();
        let path = tmp.path.clone();
        tmp.commit(&target).unwrap();
        assert!(!pending().contains(&path));
        assert_eq!(names(&d), ["out.json"]);
        std::fs::remove_dir_all(d).unwrap();
    }
}
