//! `eplb`, the command-line tool of eplb; see `eplb --help` and `DESIGN.md`.
//!
//! Each subcommand is a module of [`cli`]; the report's HTML page and charts are [`report`].
//! The work itself is done by the libraries: `eplb-sim` replays, `eplb-runtime` reads configs
//! and maps, `eplb-policies` plans.
//!
//! On SIGINT or SIGTERM the tool removes the temporary file of any output it is writing
//! (`eplb_runtime::fsio::remove_pending_temporaries`) and exits with 130 or 143 (128 + the
//! signal), as a shell reports a process ended by it.

mod cli;
mod report;
mod words;

use std::path::Path;

fn main() -> std::process::ExitCode {
    interrupts::install();
    cli::run(std::env::args_os())
}

mod interrupts {
    use super::Path;
    use signal_hook::consts::{SIGINT, SIGTERM};
    use signal_hook::iterator::Signals;

    /// Handles SIGINT and SIGTERM on a thread of their own: the temporaries in progress are
    /// removed, then the process exits with 128 + the signal. Without the handler (it cannot
    /// be installed) the signals keep their default action.
    pub(super) fn install() {
        if std::env::var_os("EPLB_TEST_HOLD_WRITE").is_some() {
            eplb_runtime::fsio::set_before_commit_hook(hold);
        }
        let Ok(mut signals) = Signals::new([SIGINT, SIGTERM]) else {
            return;
        };
        let _ = std::thread::Builder::new()
            .name("eplb-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    eplb_runtime::fsio::remove_pending_temporaries();
                    std::process::exit(128 + sig);
                }
            });
    }

    /// The test hook (`EPLB_TEST_HOLD_WRITE` set): says which temporary file is written and
    /// waits, before its rename, until a signal ends the process; so a test interrupts a write
    /// in progress deterministically.
    fn hold(tmp: &Path) {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "eplb-test: holding {}", tmp.display());
        loop {
            std::thread::park();
        }
    }
}
