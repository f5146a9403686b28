//! The `eplb` command-line tool; see `eplb --help`.

fn main() -> std::process::ExitCode {
    eplb_runtime::cli::run(std::env::args_os())
}
