//! [`PolicyHost`]: a policy with its scratch, its state and the working copy of that state.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use eplb_core::Shape;
use eplb_core::metrics::Routing;
use eplb_core::time::gate::Gate;
use eplb_policies::{BufferLens, Input, Output, Policy, Summary, buffer_lens, rebalance};

use super::{Outcome, Plan, PlanFailure};

/// A policy on one shape, with its buffers allocated once: the one place a policy is run and
/// its state settled (see the [module docs](super)).
///
/// `plan` runs the policy on a working copy of the state, catching a panic; `settle` then
/// makes the copy the state (taken), drops it (abandoned) or restarts from zero (resync). Only
/// the cycle planned last can be settled, once: repeats (every rank of a simulator, ranks
/// sharing a planner) are ignored.
#[derive(Debug, Clone)]
pub struct PolicyHost<P: Policy + ?Sized = dyn Policy + Send> {
    shape: Shape,
    /// The buffer sizes, or why the policy cannot serve the shape (then nothing is allocated
    /// and every plan fails with the reason).
    lens: Result<BufferLens, eplb_policies::Error>,
    scratch: Vec<u64>,
    /// After the last cycle taken.
    state: Vec<u64>,
    /// After the cycle planned last.
    working: Vec<u64>,
    /// The cycle planned last, until it is settled.
    pending: Option<u64>,
    /// The pay-off gate applied to every plan, if on, with its scratch.
    gate: Option<GateState>,
    policy: Box<P>,
}

/// The pay-off gate and its buffers (allocated when the gate is set).
#[derive(Debug, Clone)]
struct GateState {
    gate: Gate,
    fscratch: Vec<f64>,
    uscratch: Vec<u32>,
    moved: Vec<bool>,
    /// Per layer, the cycles its placement has lived, after the last cycle taken (1 right
    /// after a move): a layer that rarely changes gets a longer pay-back horizon.
    ages: Vec<u32>,
    /// The ages after the cycle planned last (kept iff the cycle is taken, like the policy
    /// state, so that every rank holds the same ages).
    pending_ages: Vec<u32>,
    metrics: Vec<u32>,
    rank_buf: Vec<f64>,
    per_layer: Vec<f64>,
}

impl<P: Policy + ?Sized> PolicyHost<P> {
    /// `policy` on `shape`: its buffer sizes are checked ([`buffer_lens`]) before anything is
    /// allocated.
    pub fn new(policy: Box<P>, shape: Shape) -> Self {
        let lens = buffer_lens(policy.as_ref(), &shape);
        let (scratch, state) = match &lens {
            Ok(l) => (vec![0u64; l.scratch], vec![0u64; l.state]),
            Err(_) => (Vec::new(), Vec::new()),
        };
        Self {
            shape,
            lens,
            scratch,
            working: state.clone(),
            state,
            pending: None,
            gate: None,
            policy,
        }
    }

    /// Turns the pay-off gate on (`Some`) or off: every later plan keeps a changed layer only
    /// when the gate says it pays ([`eplb_core::time::gate`]). Every rank must set the same
    /// gate: its decision is then computed from agreed inputs only.
    pub fn set_gate(&mut self, gate: Option<Gate>) {
        self.gate = gate.map(|gate| {
            let (f, u) = eplb_core::time::gate::scratch_len(&self.shape);
            GateState {
                gate,
                fscratch: vec![0.0; f],
                uscratch: vec![0; u],
                moved: vec![false; self.shape.layers()],
                ages: vec![1; self.shape.layers()],
                pending_ages: vec![1; self.shape.layers()],
                metrics: vec![0; eplb_core::metrics::scratch_len(&self.shape)],
                rank_buf: vec![0.0; self.shape.ranks()],
                per_layer: vec![0.0; self.shape.layers()],
            }
        });
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// The state after the last cycle taken.
    pub fn state(&self) -> &[u64] {
        &self.state
    }

    /// Per layer, the cycles its placement has lived as the pay-off gate counts them (after the
    /// last cycle taken); `None` when the gate is off.
    pub fn gate_ages(&self) -> Option<&[u32]> {
        self.gate.as_ref().map(|g| g.ages.as_slice())
    }

    /// Runs the policy for `cycle` on `input`, on a working copy of the state (validated by
    /// [`rebalance`]; a panic becomes [`PlanFailure::Panicked`]). The copy waits for
    /// [`PolicyHost::settle`]. A current placement after a membership change is planned over
    /// its live ranks ([`rebalance`]); the pay-off gate does not apply to it: such a plan
    /// restores every expert and the balance over the ranks left, which no saving estimate
    /// should hold back.
    pub fn plan(&mut self, cycle: u64, input: &Input<'_>) -> Outcome {
        self.check_input_shape(input.shape())?;
        let live = match input.current().live() {
            Some(l) => *l,
            None => eplb_core::LiveSet::all(self.shape.ranks()).map_err(PlanFailure::input)?,
        };
        let mut plan = self.run(cycle, live, |policy, scratch, state, out| {
            rebalance(policy, input, scratch, state, out)
        })?;
        if input.current().is_whole()
            && let Some(g) = self.gate.as_mut()
        {
            g.apply(input, &mut plan).map_err(PlanFailure::input)?;
        }
        Ok(plan)
    }

    /// Plans `req` ([`PolicyHost::plan`] on [`PlanRequest::input`](super::PlanRequest::input)).
    pub fn plan_request(&mut self, req: &super::PlanRequest) -> Outcome {
        let input = req.input(&self.shape)?;
        self.plan(req.cycle, &input)
    }

    fn check_input_shape(&self, shape: &Shape) -> Result<(), PlanFailure> {
        if let Err(e) = &self.lens {
            return Err(PlanFailure::Shape(*e));
        }
        if *shape != self.shape {
            return Err(PlanFailure::Input(eplb_policies::Error::Core(
                eplb_core::Error::Length {
                    what: "placement [L][R][S] of the host's shape",
                    expected: self.shape.placement_len(),
                    got: shape.placement_len(),
                },
            )));
        }
        Ok(())
    }

    /// Runs `call` on a working copy of the state, catching a panic.
    fn run(
        &mut self,
        cycle: u64,
        live: eplb_core::LiveSet,
        call: impl FnOnce(
            &mut P,
            &mut [u64],
            &mut [u64],
            Output<'_>,
        ) -> Result<Summary, eplb_policies::Error>,
    ) -> Outcome {
        self.working.copy_from_slice(&self.state);
        self.pending = Some(cycle);
        let l = self.shape.layers();
        let mut placement = vec![0u16; self.shape.placement_len()];
        let (mut changed, mut par_before, mut par_after) =
            (vec![false; l], vec![0.0; l], vec![0.0; l]);
        let (policy, scratch, working) = (&mut self.policy, &mut self.scratch, &mut self.working);
        let started = Instant::now();
        let summary = catch_unwind(AssertUnwindSafe(|| {
            call(
                policy.as_mut(),
                scratch,
                working,
                Output {
                    placement: &mut placement,
                    changed: &mut changed,
                    par_before: &mut par_before,
                    par_after: &mut par_after,
                },
            )
        }))
        .map_err(|panic| {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            PlanFailure::Panicked(msg)
        })?
        .map_err(PlanFailure::Policy)?;
        Ok(Plan {
            cycle,
            placement,
            live,
            changed,
            par_before,
            par_after,
            summary,
            elapsed: started.elapsed(),
            gate: None,
        })
    }

    /// Every rank took `cycle` (`taken`) or abandoned it: the state advances to the working
    /// copy, or stays the one before it; with `resync` (the ranks held different plans) it
    /// restarts from the policy's initial state. Anything but the cycle planned last, and any
    /// repeat, is ignored.
    pub fn settle(&mut self, cycle: u64, taken: bool, resync: bool) {
        if self.pending != Some(cycle) {
            return;
        }
        self.pending = None;
        if taken {
            core::mem::swap(&mut self.state, &mut self.working);
        } else if resync {
            self.state.fill(0);
        }
        if let Some(g) = self.gate.as_mut() {
            if taken {
                g.ages.copy_from_slice(&g.pending_ages);
            } else if resync {
                g.ages.fill(1);
            }
        }
    }

    /// [`PolicyHost::plan`], then settle at once: the state advances only when the plan
    /// succeeded (one-shot callers: the Python `Policy`, `eplb plan`).
    pub fn plan_and_take(&mut self, cycle: u64, input: &Input<'_>) -> Outcome {
        let outcome = self.plan(cycle, input);
        self.settle(cycle, outcome.is_ok(), false);
        outcome
    }

    /// [`PolicyHost::plan_request`], then settle at once (one-shot callers).
    pub fn plan_request_and_take(&mut self, req: &super::PlanRequest) -> Outcome {
        let cycle = req.cycle;
        let outcome = self.plan_request(req);
        self.settle(cycle, outcome.is_ok(), false);
        outcome
    }

    /// Forgets the state: the next plan starts from the policy's initial state.
    pub fn reset(&mut self) {
        self.state.fill(0);
        self.pending = None;
        if let Some(g) = self.gate.as_mut() {
            g.ages.fill(1);
        }
    }
}

impl GateState {
    /// Gates `plan` (computed from `input`) and brings its per-layer arrays and summary in
    /// line with the layers that keep their placement.
    fn apply(&mut self, input: &Input<'_>, plan: &mut Plan) -> Result<(), eplb_core::Error> {
        let shape = *input.shape();
        let current = input.current().as_slice();
        let sum = self.gate.apply(
            &shape,
            current,
            &mut plan.placement,
            input.loads(),
            eplb_core::time::gate::Scratch {
                floats: &mut self.fscratch,
                words: &mut self.uscratch,
                ages: &self.ages,
            },
            &mut self.moved,
        )?;
        for ((next, &age), &moved) in self
            .pending_ages
            .iter_mut()
            .zip(&self.ages)
            .zip(&self.moved)
        {
            *next = if moved { 1 } else { age.saturating_add(1) };
        }
        let per = shape.slots_per_layer();
        let mut moves = 0;
        for (l, (changed, moved)) in plan.changed.iter_mut().zip(&self.moved).enumerate() {
            if *changed && !*moved {
                *changed = false;
                if let (Some(a), Some(&b)) = (plan.par_after.get_mut(l), plan.par_before.get(l)) {
                    *a = b;
                }
            }
            if *changed {
                let range = l * per..(l + 1) * per;
                if let (Some(o), Some(n)) = (current.get(range.clone()), plan.placement.get(range))
                {
                    moves += eplb_core::metrics::moves(o, n, shape.slots_per_rank());
                }
            }
        }
        let p = eplb_core::Placement::new(shape, &plan.placement)?;
        plan.summary.changed_layers = plan.changed.iter().filter(|&&c| c).count();
        plan.summary.moves = moves;
        plan.summary.colocated_rows = p.colocated_rows();
        plan.summary.after = eplb_core::metrics::hotness(
            &p,
            input.loads(),
            Routing::Even,
            &mut self.metrics,
            &mut self.rank_buf,
            &mut self.per_layer,
        )?;
        plan.gate = Some(sum);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eplb_core::{Layout, Placement};
    use eplb_policies::{Error, PolicyKind};

    /// Counts its calls in its one state word, then copies the current placement, fails or
    /// panics as `then` says of the input's seed.
    struct Counter {
        then: fn(u64) -> Result<(), Error>,
    }

    impl Policy for Counter {
        fn kind(&self) -> PolicyKind {
            PolicyKind::Random
        }
        fn scratch_len(&self, _shape: &Shape) -> usize {
            0
        }
        fn state_len(&self, _shape: &Shape) -> usize {
            1
        }
        fn place(
            &mut self,
            input: &Input<'_>,
            _scratch: &mut [u64],
            state: &mut [u64],
            out: &mut [u16],
        ) -> Result<(), Error> {
            state[0] += 1;
            (self.then)(input.seed())?;
            out.copy_from_slice(input.current().as_slice());
            Ok(())
        }
    }

    fn host(then: fn(u64) -> Result<(), Error>) -> (PolicyHost, Vec<u16>, Vec<f64>) {
        let shape = Shape::new(1, 4, 2, 2).unwrap();
        let mut p = vec![0u16; shape.placement_len()];
        Layout::Default.fill(&shape, &mut p).unwrap();
        let h: PolicyHost = PolicyHost::new(Box::new(Counter { then }), shape);
        (h, p, vec![1.0, 2.0, 3.0, 4.0])
    }

    fn input<'a>(h: &PolicyHost, p: &'a [u16], loads: &'a [f64]) -> Input<'a> {
        seeded(h, p, loads, 0)
    }

    fn seeded<'a>(h: &PolicyHost, p: &'a [u16], loads: &'a [f64], seed: u64) -> Input<'a> {
        Input::new(Placement::new(*h.shape(), p).unwrap(), loads, None, seed).unwrap()
    }

    #[test]
    fn the_state_advances_only_for_taken_cycles_once() {
        let (mut h, p, w) = host(|_| Ok(()));
        h.plan(1, &input(&h, &p, &w)).unwrap();
        assert_eq!(h.state(), [0], "planned is not taken");
        h.settle(1, false, false);
        assert_eq!(h.state(), [0], "abandoned");
        h.plan(2, &input(&h, &p, &w)).unwrap();
        h.settle(2, true, false);
        h.settle(2, true, false);
        assert_eq!(h.state(), [1], "taken once, the repeat ignored");
        h.settle(1, true, false);
        assert_eq!(h.state(), [1], "a cycle not planned last is ignored");
        h.plan(3, &input(&h, &p, &w)).unwrap();
        h.settle(3, false, true);
        assert_eq!(h.state(), [0], "resync restarts from the initial state");
    }

    #[test]
    fn an_error_after_the_policy_wrote_its_state_leaves_the_state_as_it_was() {
        let (mut h, p, w) = host(|seed| {
            if seed == 7 {
                Err(Error::NoPlacement {
                    layer: 0,
                    why: "injected",
                })
            } else {
                Ok(())
            }
        });
        h.plan_and_take(1, &input(&h, &p, &w)).unwrap();
        assert_eq!(h.state(), [1]);
        let e = h.plan_and_take(2, &seeded(&h, &p, &w, 7)).unwrap_err();
        assert!(matches!(e, PlanFailure::Policy(_)), "{e:?}");
        assert_eq!(h.state(), [1], "the failed call's write was dropped");
        h.plan_and_take(3, &input(&h, &p, &w)).unwrap();
        assert_eq!(h.state(), [2]);
    }

    #[test]
    fn the_gates_ages_advance_only_for_taken_cycles() {
        use eplb_core::time::{Hardware, ModelSpec, Role, TimeModel};
        let (mut h, p, w) = host(|_| Ok(()));
        let gate = Gate {
            model: TimeModel::new(Hardware::A3, ModelSpec::DEEPSEEK_V3, Role::Decode, 44e6),
            iterations: 10,
            routing: Routing::Log2Phy,
            step_other_ms: 0.0,
        };
        h.set_gate(Some(gate));
        assert_eq!(h.gate_ages(), Some(&[1u32][..]));
        // The policy keeps the placement: the layer did not move, so its age grows by one for
        // a taken cycle and not at all for an abandoned one.
        h.plan(1, &input(&h, &p, &w)).unwrap();
        h.settle(1, false, false);
        assert_eq!(h.gate_ages(), Some(&[1u32][..]));
        h.plan(2, &input(&h, &p, &w)).unwrap();
        h.settle(2, true, false);
        assert_eq!(h.gate_ages(), Some(&[2u32][..]));
        h.plan(3, &input(&h, &p, &w)).unwrap();
        h.settle(3, false, true);
        assert_eq!(h.gate_ages(), Some(&[1u32][..]), "resync restarts the ages");
    }

    #[test]
    fn a_panic_is_a_failure_with_its_message_and_drops_the_copy() {
        let (mut h, p, w) = host(|_| panic!("deliberate"));
        let e = h.plan_and_take(1, &input(&h, &p, &w)).unwrap_err();
        assert_eq!(e, PlanFailure::Panicked("deliberate".into()));
        assert_eq!(h.state(), [0]);
    }

    #[test]
    fn a_shape_the_policy_cannot_serve_fails_every_plan_and_allocates_nothing() {
        let shape = Shape::new(1, 4, 2, 2).unwrap();
        let other = Shape::new(1, 4, 2, 3).unwrap();
        let mut h: PolicyHost = PolicyHost::new(Box::new(Counter { then: |_| Ok(()) }), shape);
        let mut p = vec![0u16; other.placement_len()];
        Layout::Default.fill(&other, &mut p).unwrap();
        let w = [1.0; 4];
        let i = Input::new(Placement::new(other, &p).unwrap(), &w, None, 0).unwrap();
        assert!(matches!(h.plan(1, &i), Err(PlanFailure::Input(_))));
    }
}
