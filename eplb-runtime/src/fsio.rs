//! File input and output of the `eplb` tool and the runtime: bounded reads, atomic writes.
//!
//! **Invariant:** an input is read only if it is a regular file no larger than the limit
//! (default [`DEFAULT_INPUT_LIMIT`], 1 GiB); a FIFO, a device such as `/dev/zero`, a directory or
//! a socket is refused before it is opened, so nothing blocks or grows without bound.
//!
//! **Invariant:** an output file is replaced atomically (a temporary file in the same directory,
//! written, fsynced and renamed over the target), so a reader sees the old content or the new,
//! never a part.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Writes `bytes` to `path` atomically: a temporary file in the same directory is written,
/// fsynced and renamed over `path` (then the directory is fsynced, best effort). On error the
/// temporary file is removed and `path` is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "the output path names no file")
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(
        ".{}.{}.tmp",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
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
}
