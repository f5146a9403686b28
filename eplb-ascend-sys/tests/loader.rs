//! The loader's error when no CANN is installed. In its own test binary: once any test of a
//! process has loaded (fake) CANN, the dynamic linker finds `libascendcl.so` by its soname.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::OsString;
use std::path::PathBuf;

use eplb_ascend_sys::{Cann, Error, ErrorKind, Location, Search};

fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("eplb-ascend-sys-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn loader_reports_every_place_it_looked() {
    let empty = scratch_dir("empty");
    let env = |k: &str| -> Option<OsString> {
        match k {
            "ASCEND_HOME_PATH" => Some(empty.join("home-path").into()),
            "ASCEND_TOOLKIT_HOME" => Some(empty.join("toolkit").into()),
            "HOME" => Some(empty.join("user").into()),
            _ => None,
        }
    };
    let search = Search::standard_with(&env);
    // An explicit directory is the only place looked at.
    let err = Cann::load_dir(&empty).unwrap_err();
    assert_eq!(err.attempts.len(), 1);
    assert!(err.to_string().contains("explicit directory"));
    let err = match Cann::load(&search) {
        Ok(c) => {
            // A machine with CANN in a default root or on LD_LIBRARY_PATH: nothing more to check.
            eprintln!("CANN is installed here ({:?})", c.location());
            return;
        }
        Err(e) => e,
    };
    let text = err.to_string();
    for needle in [
        "no usable CANN runtime",
        "home-path/lib64 ($ASCEND_HOME_PATH/lib64): libascendcl.so not found",
        "toolkit/lib64 ($ASCEND_TOOLKIT_HOME/lib64)",
        "/usr/local/Ascend/cann/lib64 (default install root)",
        "/usr/local/Ascend/ascend-toolkit/latest/lib64",
        "user/Ascend/ascend-toolkit/latest/lib64",
        "the dynamic linker's search path: libascendcl.so",
        "set_env.sh",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    assert_eq!(err.attempts.len(), search.locations().len());
    assert_eq!(search.locations().last(), Some(&Location::LinkerPath));
    // The error converts into the crate error with kind Unsupported.
    assert_eq!(Error::from(err).kind(), ErrorKind::Unsupported);
}
