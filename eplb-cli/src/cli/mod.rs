//! The `eplb` command-line tool (`README.md`, "The `eplb` tool"): one module per
//! subcommand, and here what they share (the parser, the output buffer, the replay options).
//!
//! Errors go to stderr as `error: ...` with exit status 1 (2 for usage errors); `--json` prints
//! one JSON object on stdout.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use args::Io;

/// The `eplb` tool.
#[derive(Debug, Parser)]
#[command(
    name = "eplb",
    version,
    about = "Expert Parallelism Load Balancer for MoE serving"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Largest input file read, in bytes (default 1 GiB); inputs must be regular files.
    #[arg(long, global = true, default_value_t = eplb_runtime::fsio::DEFAULT_INPUT_LIMIT)]
    max_input_bytes: u64,
}

/// One line on standard error; a closed or full stderr is ignored (there is nowhere left to
/// report it), never a panic as `eprintln!` would.
macro_rules! errln {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr());
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Appends one line to the command's standard output.
macro_rules! outln {
    ($io:expr) => { $io.out.push('\n') };
    ($io:expr, $($arg:tt)*) => {{
        use core::fmt::Write as _;
        let _ = writeln!($io.out, $($arg)*);
    }};
}

mod advise;
mod args;
mod calibrate;
mod check_config;
mod estimate;
mod hotness;
mod plan;
mod report;
mod simulate;
mod validate;

#[derive(Debug, Subcommand)]
enum Command {
    /// Compute a placement from recorded heat and write a vLLM-Ascend expert-map JSON.
    Plan(plan::PlanArgs),
    /// Check an expert-map JSON; exit 0 when valid, else 1 with every problem found.
    Validate(validate::ValidateArgs),
    /// Validate an `eplb_config` JSON as the runtime would at start-up.
    CheckConfig(check_config::CheckConfigArgs),
    /// The hotness numbers (PAR over layers) of a placement under recorded heat.
    Hotness(hotness::HotnessArgs),
    /// Replay a trace through the dynamic cycle and score the placements (docs/simulation.md).
    Simulate(simulate::SimulateArgs),
    /// Simulate several policies on one trace and write one self-contained HTML page of charts.
    Report(report::ReportArgs),
    /// Sweep policies, intervals and redundant experts over a trace with the time model, and
    /// recommend a setting, or not to enable EPLB.
    Advise(advise::AdviseArgs),
    /// Price one step of a deployment without a trace (the whole-step time model).
    Estimate(estimate::EstimateArgs),
    /// Fit the time model's free constants to measured step times (NNLS) and write a
    /// calibration file for `--calibration`.
    Calibrate(calibrate::CalibrateArgs),
}
/// Runs the tool on `args` (including the program name) and returns the exit code.
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(c) => c,
        Err(e) => {
            if e.use_stderr() {
                let _ = e.print();
                return ExitCode::from(2);
            }
            // --help and --version go to stdout, through the same checks as any output.
            return finish(Ok(ExitCode::SUCCESS), e.render().to_string().as_bytes());
        }
    };
    let mut io = Io {
        limit: cli.max_input_bytes,
        out: String::new(),
    };
    let result = match cli.command {
        Command::Plan(a) => plan::run(&a, &mut io),
        Command::Validate(a) => validate::run(&a, &mut io),
        Command::CheckConfig(a) => check_config::run(&a, &mut io),
        Command::Hotness(a) => hotness::run(&a, &mut io),
        Command::Simulate(a) => simulate::run(&a, &mut io),
        Command::Report(a) => report::run(&a, &argv, &mut io),
        Command::Advise(a) => advise::run(&a, &mut io),
        Command::Estimate(a) => estimate::run(&a, &mut io),
        Command::Calibrate(a) => calibrate::run(&a, &mut io),
    };
    finish(result, io.out.as_bytes())
}

/// Writes a command's standard output, then its error if any. A closed pipe (EPIPE) ends the
/// command quietly with its own status; any other write error is `error: stdout: ...`, exit 1.
fn finish(result: Result<ExitCode, String>, out: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_all(out).and_then(|()| stdout.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            errln!("error: stdout: {e}");
            return ExitCode::FAILURE;
        }
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            errln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
