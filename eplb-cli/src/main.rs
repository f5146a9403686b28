//! `eplb`, the command-line tool of eplb; see `eplb --help` and `DESIGN.md`.
//!
//! Each subcommand is a module of [`cli`]; the report's HTML page and charts are [`report`].
//! The work itself is done by the libraries: `eplb-sim` replays, `eplb-runtime` reads configs
//! and maps, `eplb-policies` plans.

mod cli;
mod report;

fn main() -> std::process::ExitCode {
    cli::run(std::env::args_os())
}
