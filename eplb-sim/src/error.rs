//! The simulator's error.

use core::fmt;

use eplb_runtime::transfer::PlanError;

/// Why a replay could not run: what is wrong, and where.
#[derive(Debug, Clone, PartialEq)]
pub enum SimError {
    /// The trace could not be read as a replayable trace (`source` names it).
    Trace {
        /// The trace's name (a path, as given).
        source: String,
        /// What is wrong with it.
        why: String,
    },
    /// A setting is out of range or unknown (a policy name, a parameter, `--initial`, the
    /// cost model's model, quant type or link).
    Setting {
        /// The setting as the command line names it, with the value where that helps
        /// (`--param`, `--policy fastest`, `--initial x`, `cost`).
        what: String,
        /// What is wrong with it.
        why: String,
    },
    /// A file could not be read or written.
    File {
        /// The file, as given.
        path: String,
        /// Why.
        why: String,
    },
    /// Every plan of the run failed, so its numbers are the initial placement's and must not
    /// pass for the policy's result.
    EveryPlanFailed {
        /// Plans computed.
        plans: u64,
        /// The first failure.
        why: String,
    },
    /// A placement change could not be priced (its layers could not be planned).
    Cost(PlanError),
    /// The replay itself failed (a shape the trace and settings cannot form, a livelock of
    /// the driver, a count that does not fit a rank machine's counter).
    Run(String),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Trace { source, why } => write!(f, "{source}: {why}"),
            SimError::Setting { what, why } => write!(f, "{what}: {why}"),
            SimError::File { path, why } => write!(f, "{path}: {why}"),
            SimError::EveryPlanFailed { plans, why } => write!(
                f,
                "every plan failed ({plans} of {plans}), the numbers are the initial placement's: {why}"
            ),
            SimError::Cost(e) => write!(f, "cost: {e}"),
            SimError::Run(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for SimError {}

impl From<PlanError> for SimError {
    fn from(e: PlanError) -> Self {
        SimError::Cost(e)
    }
}
