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
use eplb_core::{LiveSet, Placement, Shape};
use eplb_policies::{Input, Samples, Summary};

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
    /// The ranks that serve (every rank, until a membership change): the slots of the others
    /// in `current` are [`EMPTY`](eplb_core::EMPTY), and the plan may use only them.
    pub live: LiveSet,
    /// Logical loads `[L][N]`, summed over the heat interval.
    pub loads: Vec<f64>,
    /// Per-window logical loads `(T, [T][L][N])`, oldest first.
    pub samples: Option<(usize, Vec<f64>)>,
    /// Seed for randomised policies.
    pub seed: u64,
}

impl PlanRequest {
    /// The policy's input for `shape`, checked: the placement with its live set, the loads and
    /// the samples.
    pub fn input(&self, shape: &Shape) -> Result<Input<'_>, PlanFailure> {
        let samples = self.samples.as_ref().map(|(t, data)| (*t, data.as_slice()));
        policy_input(
            shape,
            &self.current,
            &self.live,
            &self.loads,
            samples,
            self.seed,
        )
    }
}

/// The policy's input for `shape`, checked: the placement `current` (`[L][R][S]`) that the
/// ranks of `live` hold ([`Placement::with_live`]), the loads (`[L][N]`), the per-window
/// samples (`T`, `[T][L][N]`) and the seed. The one conversion from a plan request (the
/// planner thread's, the simulator's) to what a policy takes.
pub fn policy_input<'a>(
    shape: &Shape,
    current: &'a [u16],
    live: &'a LiveSet,
    loads: &'a [f64],
    samples: Option<(usize, &'a [f64])>,
    seed: u64,
) -> Result<Input<'a>, PlanFailure> {
    let current = Placement::with_live(*shape, current, live).map_err(PlanFailure::input)?;
    let samples = match samples {
        Some((t, data)) => Some(Samples::new(shape, t, data).map_err(PlanFailure::Input)?),
        None => None,
    };
    Input::new(current, loads, samples, seed).map_err(PlanFailure::Input)
}

/// A computed plan: only [`PolicyHost`] builds one, from a policy output that
/// [`eplb_policies::rebalance`] validated, so its holders (the rank machine, the controller)
/// take it without validating again.
#[derive(Debug, Clone)]
pub struct Plan {
    cycle: u64,
    placement: Vec<u16>,
    live: LiveSet,
    changed: Vec<bool>,
    par_before: Vec<f64>,
    par_after: Vec<f64>,
    summary: Summary,
    elapsed: Duration,
    gate: Option<GateSummary>,
}

impl Plan {
    /// The cycle it answers.
    pub fn cycle(&self) -> u64 {
        self.cycle
    }
    /// The new placement `[L][R][S]` (the slots of ranks outside [`Plan::live`] are
    /// [`EMPTY`](eplb_core::EMPTY)).
    pub fn placement(&self) -> &[u16] {
        &self.placement
    }
    /// The ranks the placement uses (the request's live set).
    pub fn live(&self) -> &LiveSet {
        &self.live
    }
    /// Per layer: changed.
    pub fn changed(&self) -> &[bool] {
        &self.changed
    }
    /// Per layer PAR before (even split, over the live ranks).
    pub fn par_before(&self) -> &[f64] {
        &self.par_before
    }
    /// Per layer PAR after (even split, over the live ranks).
    pub fn par_after(&self) -> &[f64] {
        &self.par_after
    }
    /// Totals.
    pub fn summary(&self) -> &Summary {
        &self.summary
    }
    /// Wall time of the policy call alone.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }
    /// What the pay-off gate decided, when it is on ([`PolicyHost::set_gate`]).
    pub fn gate(&self) -> Option<&GateSummary> {
        self.gate.as_ref()
    }
    /// The placement, taken out.
    pub fn into_placement(self) -> Vec<u16> {
        self.placement
    }
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
