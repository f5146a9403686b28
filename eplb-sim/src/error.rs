//! The simulator's error.

use core::fmt;

use eplb_runtime::rank::{DriveError, MachineError};
use eplb_runtime::transfer::PlanError;

use crate::events::{MemberEvent, MemberKind};

/// Why a replay could not run: what is wrong, and where.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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
    /// The cost settings cannot size an expert.
    CostSettings(crate::cost::CostError),
    /// A placement change could not be priced (its layers could not be planned).
    Cost(PlanError),
    /// The trace's counts are not `windows x layers x experts` values.
    Counts {
        /// Values held.
        values: usize,
        /// Windows `T`.
        windows: usize,
        /// Layers `L`.
        layers: usize,
        /// Experts `N`.
        experts: usize,
    },
    /// The heat interval `H` or the algorithm interval `A` is 0 (both must be at least 1).
    Intervals {
        /// `H`.
        heat: u32,
        /// `A`.
        algo: u32,
    },
    /// More layers or experts than a placement can number.
    TooMany {
        /// `layers` or `experts`.
        what: &'static str,
        /// How many.
        count: usize,
    },
    /// The trace and settings cannot form a shape, placement or live set (`eplb-core`'s
    /// reason).
    Shape(eplb_core::Error),
    /// The policy cannot serve the shape (its topology or buffer sizes).
    Policy {
        /// The policy's name.
        policy: &'static str,
        /// Why.
        error: eplb_policies::Error,
    },
    /// A trace count does not fit a rank machine's per-iteration `u32` counter.
    Counter {
        /// The window.
        window: usize,
        /// The layer.
        layer: usize,
        /// The expert.
        expert: usize,
        /// The count.
        count: u64,
    },
    /// A membership event that cannot happen in this run.
    Event {
        /// The event.
        event: MemberEvent,
        /// Why.
        why: String,
    },
    /// A rank machine refused an input.
    Machine {
        /// The window (`None`: before the first).
        window: Option<usize>,
        /// The rank.
        rank: usize,
        /// Its error.
        error: MachineError,
    },
    /// The one-thread driver failed (the ranks wait in different collectives, or still
    /// exchange after [`eplb_runtime::rank::LocalCollective::MAX_ROUNDS`] collectives in one
    /// iteration: a livelock; or a machine refused a reply or a plan).
    Drive {
        /// The window.
        window: Option<usize>,
        /// Why.
        error: DriveError,
    },
    /// The layer walk after `window` did not end within `iterations` update iterations: a
    /// livelock.
    Livelock {
        /// The window.
        window: usize,
        /// The bound (`2L + 2`).
        iterations: usize,
    },
    /// The time model failed at a window or a layer (`eplb-core`'s reason).
    TimeModel {
        /// The window, if the time of one failed.
        window: Option<usize>,
        /// The layer, if the stall of one failed.
        layer: Option<usize>,
        /// Why.
        error: eplb_core::Error,
    },
    /// An output could not be encoded.
    Encode {
        /// What.
        what: &'static str,
    },
    /// An `advise` worker panicked (`setting: None`) or left setting `setting` unrun.
    Worker {
        /// The setting.
        setting: Option<usize>,
    },
}

impl SimError {
    /// This error, placed at `window` when it does not name one yet.
    pub fn at_window(self, window: usize) -> Self {
        match self {
            SimError::Drive {
                window: None,
                error,
            } => SimError::Drive {
                window: Some(window),
                error,
            },
            SimError::Machine {
                window: None,
                rank,
                error,
            } => SimError::Machine {
                window: Some(window),
                rank,
                error,
            },
            other => other,
        }
    }
}

/// `rank R fails at window W` (or joins): an event as the library names it.
fn event(f: &mut fmt::Formatter<'_>, e: &MemberEvent) -> fmt::Result {
    let verb = match e.kind {
        MemberKind::Fail => "fails",
        MemberKind::Join => "joins",
    };
    write!(f, "rank {} {verb} at window {}", e.rank, e.window)
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
            SimError::CostSettings(e) => write!(f, "cost: {e}"),
            SimError::Counts {
                values,
                windows,
                layers,
                experts,
            } => write!(
                f,
                "trace counts hold {values} values, expected {windows} x {layers} x {experts}"
            ),
            SimError::Intervals { heat, algo } => write!(
                f,
                "the heat interval ({heat}) and the algorithm interval ({algo}) must be at least 1"
            ),
            SimError::TooMany { what, count } => write!(f, "{count} {what} is too many"),
            SimError::Shape(e) => write!(f, "{e}"),
            SimError::Policy { policy, error } => write!(f, "policy {policy}: {error}"),
            SimError::Counter {
                window,
                layer,
                expert,
                count,
            } => write!(
                f,
                "trace window {window}, layer {layer}, expert {expert}: count {count} does not fit a per-iteration u32 counter (at most {})",
                u32::MAX
            ),
            SimError::Event { event: e, why } => {
                event(f, e)?;
                write!(f, ": {why}")
            }
            SimError::Machine {
                window,
                rank,
                error,
            } => {
                f.write_str("simulation: ")?;
                if let Some(w) = window {
                    write!(f, "window {w}: ")?;
                }
                write!(f, "rank {rank}: {error}")
            }
            SimError::Drive { window, error } => {
                f.write_str("simulation: ")?;
                if let Some(w) = window {
                    write!(f, "window {w}: ")?;
                }
                write!(f, "{error}")
            }
            SimError::TimeModel {
                window,
                layer,
                error,
            } => {
                f.write_str("time model")?;
                if let Some(w) = window {
                    write!(f, ", window {w}")?;
                }
                if let Some(l) = layer {
                    write!(f, ", layer {l}")?;
                }
                write!(f, ": {error}")
            }
            SimError::Encode { what } => write!(f, "{what} could not be encoded"),
            SimError::Worker { setting: None } => f.write_str("an advise worker panicked"),
            SimError::Worker { setting: Some(i) } => write!(f, "advise setting {i} was not run"),
            SimError::Livelock { window, iterations } => write!(
                f,
                "simulation livelock: the layer update after window {window} did not end within \
                 {iterations} iterations"
            ),
        }
    }
}

impl std::error::Error for SimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SimError::Cost(e) => Some(e),
            SimError::CostSettings(e) => Some(e),
            SimError::Shape(e) | SimError::TimeModel { error: e, .. } => Some(e),
            SimError::Policy { error, .. } => Some(error),
            SimError::Machine { error, .. } => Some(error),
            SimError::Drive { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl From<DriveError> for SimError {
    fn from(error: DriveError) -> Self {
        SimError::Drive {
            window: None,
            error,
        }
    }
}

impl From<PlanError> for SimError {
    fn from(e: PlanError) -> Self {
        SimError::Cost(e)
    }
}
