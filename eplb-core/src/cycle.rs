//! The EPLB cycle as a pure state machine: one event per forward iteration, one step out.
//!
//! A cycle collects heat for `H` matching iterations, gives the planner `A` iterations (any
//! stage), then walks the layers whose placement changed, one per iteration, and starts over.
//! This is vLLM-Ascend's MRv1 cycle (`research/vllm-ascend-eplb.md` §1.4) with two deliberate
//! changes: the snapshot is taken right after the `H`-th *matching* iteration (a filter that never
//! matches never plans), and unchanged layers are not walked.

use crate::Error;

/// Where the cycle is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Collecting heat; `counted` matching iterations so far (`< H`).
    Collecting {
        /// Matching iterations counted in this cycle.
        counted: u32,
    },
    /// The planner is running; `waited` iterations since the snapshot (`< A`).
    Planning {
        /// Iterations since the snapshot.
        waited: u32,
    },
    /// The plan is due; waiting for every rank to have it ([`Cycle::on_plan`]; while some
    /// rank does not, the cycle stays due).
    Due,
    /// Layer `layer` is being updated (launched before the current forward, committed after it).
    Updating {
        /// The layer in flight.
        layer: u16,
    },
}

/// What the driver does after the iteration it just reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Still collecting; add this iteration's heat iff `counted`.
    Collect {
        /// Whether this iteration matched the stage filter and was counted.
        counted: bool,
    },
    /// This iteration completed the heat interval: add its heat, snapshot, start the planner.
    Snapshot,
    /// The planner is running; nothing to do.
    Wait,
    /// The plan is due: agree with every rank whether it is ready, then call [`Cycle::on_plan`]
    /// (ready), or nothing (late: the next iteration is `PlanDue` again).
    PlanDue,
    /// Before the next forward launch layer `l`'s transfer; after it, commit.
    UpdateLayer(u16),
    /// The cycle ended (every changed layer committed, or nothing changed): reset the heat.
    CycleDone,
}

/// The cycle state machine. No clock, no I/O, no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cycle {
    heat_interval: u32,
    algo_interval: u32,
    phase: Phase,
}

impl Cycle {
    /// A cycle with heat interval `H >= 1` and algorithm interval `A >= 1`.
    pub fn new(heat_interval: u32, algo_interval: u32) -> Result<Self, Error> {
        if heat_interval == 0 {
            return Err(Error::ZeroInterval {
                what: "expert_heat_collection_interval",
            });
        }
        if algo_interval == 0 {
            return Err(Error::ZeroInterval {
                what: "algorithm_execution_interval",
            });
        }
        Ok(Self {
            heat_interval,
            algo_interval,
            phase: Phase::Collecting { counted: 0 },
        })
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// `H`.
    pub fn heat_interval(&self) -> u32 {
        self.heat_interval
    }

    /// `A`.
    pub fn algo_interval(&self) -> u32 {
        self.algo_interval
    }

    /// The layer whose transfer must be launched before the next forward, if any.
    pub fn layer_in_flight(&self) -> Option<u16> {
        match self.phase {
            Phase::Updating { layer } => Some(layer),
            _ => None,
        }
    }

    /// Reports one finished forward iteration. `matched`: it passed the stage filter.
    /// `changed`: per layer, whether the plan changed it (read only while updating).
    pub fn on_iteration(&mut self, matched: bool, changed: &[bool]) -> Step {
        match self.phase {
            Phase::Collecting { counted } => {
                let counted_now = counted + u32::from(matched);
                if counted_now >= self.heat_interval {
                    self.phase = Phase::Planning { waited: 0 };
                    Step::Snapshot
                } else {
                    self.phase = Phase::Collecting {
                        counted: counted_now,
                    };
                    Step::Collect { counted: matched }
                }
            }
            Phase::Planning { waited } => {
                let waited = waited + 1;
                if waited >= self.algo_interval {
                    self.phase = Phase::Due;
                    Step::PlanDue
                } else {
                    self.phase = Phase::Planning { waited };
                    Step::Wait
                }
            }
            Phase::Due => Step::PlanDue,
            Phase::Updating { layer } => self.next_layer(usize::from(layer) + 1, changed),
        }
    }

    /// Every rank has the plan: start walking the changed layers. Returns the first
    /// [`Step::UpdateLayer`], or [`Step::CycleDone`] when nothing changed. Ignored (returns the
    /// current step) unless the plan is due.
    pub fn on_plan(&mut self, changed: &[bool]) -> Step {
        match self.phase {
            Phase::Due => self.next_layer(0, changed),
            Phase::Updating { layer } => Step::UpdateLayer(layer),
            _ => Step::Wait,
        }
    }

    /// Abandons the current cycle (for example after a planner failure): heat restarts.
    pub fn reset(&mut self) {
        self.phase = Phase::Collecting { counted: 0 };
    }

    fn next_layer(&mut self, from: usize, changed: &[bool]) -> Step {
        let next = changed
            .get(from..)
            .and_then(|rest| rest.iter().position(|&c| c))
            .map(|i| from + i)
            .and_then(|l| u16::try_from(l).ok());
        match next {
            Some(layer) => {
                self.phase = Phase::Updating { layer };
                Step::UpdateLayer(layer)
            }
            None => {
                self.phase = Phase::Collecting { counted: 0 };
                Step::CycleDone
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_intervals_are_errors() {
        assert_eq!(
            Cycle::new(0, 1),
            Err(Error::ZeroInterval {
                what: "expert_heat_collection_interval"
            })
        );
        assert_eq!(
            Cycle::new(1, 0),
            Err(Error::ZeroInterval {
                what: "algorithm_execution_interval"
            })
        );
    }

    #[test]
    fn full_cycle_transitions() {
        let changed = [false, true, false, true];
        let mut c = Cycle::new(3, 2).unwrap();
        assert_eq!(
            c.on_iteration(true, &changed),
            Step::Collect { counted: true }
        );
        assert_eq!(
            c.on_iteration(false, &changed),
            Step::Collect { counted: false }
        );
        assert_eq!(c.phase(), Phase::Collecting { counted: 1 });
        assert_eq!(
            c.on_iteration(true, &changed),
            Step::Collect { counted: true }
        );
        assert_eq!(c.on_iteration(true, &changed), Step::Snapshot);
        assert_eq!(c.on_iteration(false, &changed), Step::Wait);
        assert_eq!(c.on_iteration(false, &changed), Step::PlanDue);
        // Not every rank has it: no call, and the next iteration is due again.
        assert_eq!(c.on_iteration(true, &changed), Step::PlanDue);
        assert_eq!(c.on_plan(&changed), Step::UpdateLayer(1));
        assert_eq!(c.layer_in_flight(), Some(1));
        assert_eq!(c.on_iteration(true, &changed), Step::UpdateLayer(3));
        assert_eq!(c.on_iteration(true, &changed), Step::CycleDone);
        assert_eq!(c.phase(), Phase::Collecting { counted: 0 });
    }

    #[test]
    fn unchanged_plan_ends_the_cycle_at_once() {
        let mut c = Cycle::new(1, 1).unwrap();
        assert_eq!(c.on_iteration(true, &[]), Step::Snapshot);
        assert_eq!(c.on_iteration(true, &[]), Step::PlanDue);
        assert_eq!(c.on_plan(&[false, false]), Step::CycleDone);
        assert_eq!(c.on_plan(&[true]), Step::Wait);
    }

    #[test]
    fn filter_that_never_matches_never_plans() {
        let mut c = Cycle::new(2, 1).unwrap();
        for _ in 0..10_000 {
            assert_eq!(
                c.on_iteration(false, &[true]),
                Step::Collect { counted: false }
            );
        }
        assert_eq!(c.phase(), Phase::Collecting { counted: 0 });
    }
}
