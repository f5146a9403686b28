//! Planning: the one place a policy runs ([`PolicyHost`]), and the planner thread that runs it
//! off the serving thread ([`Planner`]).
//!
//! **Policy state advances only for cycles every rank took.** A stateful policy (FlashLB's ring
//! and thresholds, the incremental policy's history) plans each cycle on a copy of its state.
//! When the ranks have agreed on the cycle's plan digest, the driver settles it
//! ([`PolicyHost::settle`]): taken, the copy becomes the state; abandoned (a failed plan or a
//! digest mismatch anywhere, a failed collective), the copy is dropped and the next cycle plans
//! from the state before it, on every rank alike. A panic also drops the copy. When the ranks
//! held different plans (a digest mismatch: their states may already differ) every rank
//! restarts the policy from its initial state, so they agree again from the next cycle on.
//!
//! Three drivers hold a [`PolicyHost`] and nothing else runs a policy: the planner thread
//! ([`Planner`], behind a channel), the simulator (`eplb-sim`, in place, once for all ranks) and
//! the Python `Policy` (which takes each call at once: [`PolicyHost::plan_and_take`]).

use core::fmt;
use std::time::Duration;

use eplb_core::time::gate::GateSummary;
use eplb_core::{Placement, Shape};
use eplb_policies::{Input, LiveInput, Samples, Summary};

mod host;
mod thread;

pub use host::PolicyHost;
pub use thread::{Planner, PlannerStats, plan_once};

/// What the planner is asked for one cycle.
#[derive(Debug, Clone)]
pub struct PlanRequest {
    /// The cycle number (every rank counts cycles alike).
    pub cycle: u64,
    /// The live placement the heat was measured on, `[L][R][S]`.
    pub current: Vec<u16>,
    /// The ranks that serve, when not every rank does (the slots of the others in `current`
    /// are [`EMPTY`](eplb_core::EMPTY)): the plan may use only them.
    pub live: Option<eplb_core::LiveSet>,
    /// Logical loads `[L][N]`, summed over the heat interval.
    pub loads: Vec<f64>,
    /// Per-window logical loads `(T, [T][L][N])`, oldest first.
    pub samples: Option<(usize, Vec<f64>)>,
    /// Seed for randomised policies.
    pub seed: u64,
}

impl PlanRequest {
    /// The policy's input for `shape`, checked: the placement, the loads and the samples.
    pub fn input(&self, shape: &Shape) -> Result<Input<'_>, PlanFailure> {
        let samples = self.samples.as_ref().map(|(t, data)| (*t, data.as_slice()));
        policy_input(shape, &self.current, &self.loads, samples, self.seed)
    }

    /// The policy's input over the live ranks `live` ([`eplb_policies::rebalance_live`]),
    /// checked.
    pub fn live_input(
        &self,
        shape: &Shape,
        live: eplb_core::LiveSet,
    ) -> Result<LiveInput<'_>, PlanFailure> {
        let samples = self.samples.as_ref().map(|(t, data)| (*t, data.as_slice()));
        policy_live_input(shape, &self.current, live, &self.loads, samples, self.seed)
    }
}

/// The policy's input for `shape`, checked: the placement `current` (`[L][R][S]`), the loads
/// (`[L][N]`), the per-window samples (`T`, `[T][L][N]`) and the seed. The one conversion from
/// a plan request (the planner thread's, the simulator's) to what a policy takes.
pub fn policy_input<'a>(
    shape: &Shape,
    current: &'a [u16],
    loads: &'a [f64],
    samples: Option<(usize, &'a [f64])>,
    seed: u64,
) -> Result<Input<'a>, PlanFailure> {
    let current = Placement::new(*shape, current).map_err(PlanFailure::input)?;
    let samples = match samples {
        Some((t, data)) => Some(Samples::new(shape, t, data).map_err(PlanFailure::Input)?),
        None => None,
    };
    Input::new(current, loads, samples, seed).map_err(PlanFailure::Input)
}

/// [`policy_input`] over the live ranks `live` ([`eplb_policies::rebalance_live`]): `current`
/// may hold [`EMPTY`](eplb_core::EMPTY) slots (every slot of a rank outside `live` must be).
pub fn policy_live_input<'a>(
    shape: &Shape,
    current: &'a [u16],
    live: eplb_core::LiveSet,
    loads: &'a [f64],
    samples: Option<(usize, &'a [f64])>,
    seed: u64,
) -> Result<LiveInput<'a>, PlanFailure> {
    let samples = match samples {
        Some((t, data)) => Some(Samples::new(shape, t, data).map_err(PlanFailure::Input)?),
        None => None,
    };
    LiveInput::new(*shape, current, live, loads, samples, seed).map_err(PlanFailure::Input)
}

/// A computed plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The cycle it answers.
    pub cycle: u64,
    /// The new placement `[L][R][S]`.
    pub placement: Vec<u16>,
    /// Per layer: changed.
    pub changed: Vec<bool>,
    /// Per layer PAR before (even split).
    pub par_before: Vec<f64>,
    /// Per layer PAR after (even split).
    pub par_after: Vec<f64>,
    /// Totals.
    pub summary: Summary,
    /// Wall time of the policy call alone.
    pub elapsed: Duration,
    /// What the pay-off gate decided, when it is on ([`PolicyHost::set_gate`]).
    pub gate: Option<GateSummary>,
}

/// Why a cycle has no plan. Every one keeps the live placement.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum PlanFailure {
    /// The request is not a valid input (its placement, loads or samples).
    Input(eplb_policies::Error),
    /// The policy cannot serve the shape (its range, topology or buffer sizes).
    Shape(eplb_policies::Error),
    /// The policy returned an error.
    Policy(eplb_policies::Error),
    /// The policy panicked (its message); the working state was dropped.
    Panicked(String),
    /// Ranks sharing a planner submitted different requests under one cycle number.
    Diverged {
        /// The cycle.
        cycle: u64,
    },
    /// The planner thread is gone (it could not start, or it ended).
    PlannerGone,
}

impl PlanFailure {
    pub(crate) fn input(e: eplb_core::Error) -> Self {
        PlanFailure::Input(eplb_policies::Error::Core(e))
    }
}

impl fmt::Display for PlanFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanFailure::Input(e) | PlanFailure::Shape(e) | PlanFailure::Policy(e) => e.fmt(f),
            PlanFailure::Panicked(msg) => write!(f, "policy panicked: {msg}"),
            PlanFailure::Diverged { cycle } => write!(
                f,
                "cycle {cycle}: ranks submitted different heat or placements"
            ),
            PlanFailure::PlannerGone => f.write_str("the planner thread is gone"),
        }
    }
}

impl std::error::Error for PlanFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PlanFailure::Input(e) | PlanFailure::Shape(e) | PlanFailure::Policy(e) => Some(e),
            _ => None,
        }
    }
}

/// The outcome of one request.
pub type Outcome = Result<Plan, PlanFailure>;
