//! What the ranks agree on, and in which order: the next task of the cycle, the collective this
//! rank waits in, and the plan it holds for the cycle (ready, failed or missing).

use eplb_core::{Placement, Shape, Step};

use super::{Action, Collective, Gather, Health, PlanInput, PlannerAction, RankMachine, RunMode};

/// The digest word of a failed plan (a real placement hash of 0 is mapped to 1).
pub const FAILED_PLAN: u64 = 0;

/// The next step of the cycle that is not a layer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Task {
    Idle,
    Gather,
    Submit,
    AgreeReady,
    AgreeDigest,
    CheckPlacement,
    Settle {
        taken: bool,
        record: bool,
        resync: bool,
    },
    Record,
}

/// What answer the machine waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Awaiting {
    Nothing,
    /// The all-gather of this rank's words of that kind.
    Gather(Gather),
    /// The plan-ready AND.
    Ready,
    /// The driver's install of a layer ([`RankMachine::handle_committed`]).
    Committed(u16),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PlanSlot {
    /// No answer from the planner for the current cycle.
    Missing,
    /// The plan in `plan` (its hash).
    Ready(u64),
    /// The planner failed.
    Failed,
}

/// The agreement state of one rank.
#[derive(Debug, Clone)]
pub(super) struct Agree {
    pub(super) task: Task,
    pub(super) awaiting: Awaiting,
    pub(super) plan_slot: PlanSlot,
    /// A plan was asked for this cycle and not settled yet.
    pub(super) submitted: bool,
    /// The two words lent to the driver by the last two-word gather.
    pub(super) sent: [u64; 2],
}

impl Agree {
    pub(super) fn new() -> Self {
        Self {
            task: Task::Idle,
            awaiting: Awaiting::Nothing,
            plan_slot: PlanSlot::Missing,
            submitted: false,
            sent: [0; 2],
        }
    }
}

/// FNV-1a 64 over a placement's ids (one step per id); never [`FAILED_PLAN`].
pub fn placement_hash(placement: &[u16]) -> u64 {
    let h = eplb_core::fnv1a(placement.iter().map(|&v| u64::from(v)));
    if h == FAILED_PLAN { 1 } else { h }
}

/// [`placement_hash`] of `placement` with layer `layer` taken from `plan`.
fn placement_hash_with_layer(placement: &[u16], plan: &[u16], shape: &Shape, layer: u16) -> u64 {
    let per = shape.slots_per_layer();
    let mut h = eplb_core::Fnv1a::new();
    for (l, (old, new)) in placement
        .chunks_exact(per)
        .zip(plan.chunks_exact(per))
        .enumerate()
    {
        let rows = if l == usize::from(layer) { new } else { old };
        h.words(rows.iter().map(|&v| u64::from(v)));
    }
    let h = h.finish();
    if h == FAILED_PLAN { 1 } else { h }
}

impl RankMachine {
    /// The planner's answer for `cycle`: the plan's placement, or `None` when the policy failed.
    /// Answers for another cycle are ignored.
    pub fn handle_plan(&mut self, cycle: u64, plan: Option<Placement<'_>>) {
        if cycle != self.cycle_no
            || !self.agree.submitted
            || self.agree.plan_slot != PlanSlot::Missing
        {
            return;
        }
        self.agree.plan_slot = match plan {
            Some(p) if *p.shape() == self.shape => {
                self.plan.copy_from_slice(p.as_slice());
                PlanSlot::Ready(placement_hash(&self.plan))
            }
            Some(_) => {
                log::error!(
                    "eplb rank {}: cycle {cycle}: the plan has another shape",
                    self.rank
                );
                PlanSlot::Failed
            }
            None => PlanSlot::Failed,
        };
    }

    /// Words this rank sent in a gather of `of`.
    pub(super) fn sent_len(&self, of: Gather) -> usize {
        match of {
            Gather::Heat => self.heat.held().len(),
            Gather::Digest | Gather::Vote { .. } | Gather::Placement => self.agree.sent.len(),
        }
    }

    /// The heat gather answered with every rank's words (length checked), or failed.
    pub(super) fn on_heat(&mut self, all: Option<&[u64]>) -> Result<(), super::MachineError> {
        let folded = match all {
            Some(words) => self.heat.fold(&self.shape, &self.placement, words),
            None => Ok(()),
        };
        let ok = all.is_some() && folded.is_ok();
        if self.collective_done(ok, "heat gather", true) {
            self.cycle_no += 1;
            self.agree.submitted = true;
            self.agree.plan_slot = PlanSlot::Missing;
            self.agree.task = Task::Submit;
        }
        folded
    }

    /// The plan-ready AND answered (`Some(AND over every rank)`), or failed.
    pub(super) fn on_ready(&mut self, all: Option<bool>) {
        if !self.collective_done(all.is_some(), "agreement", true) {
            return;
        }
        if all == Some(true) {
            self.agree.task = Task::AgreeDigest;
        } else {
            self.stats.late_iterations += 1;
            self.events.plan_late = true;
        }
    }

    /// The digest gather answered with every rank's `[cycle, hash]`, or failed.
    pub(super) fn on_digests(&mut self, all: Option<&[u64]>) {
        if !self.collective_done(all.is_some(), "digest agreement", true) {
            return;
        }
        let all = all.unwrap_or(&[]);
        let mine = self.digest();
        let failed = all.chunks_exact(2).any(|d| d.get(1) == Some(&FAILED_PLAN));
        let same = all.chunks_exact(2).all(|d| d == mine);
        self.stats.plans_taken += 1;
        self.agree.submitted = false;
        self.changed.iter_mut().for_each(|c| *c = false);
        if failed || !same {
            if failed {
                self.stats.plan_failures += 1;
            } else {
                self.stats.digest_mismatches += 1;
                let first = all
                    .chunks_exact(2)
                    .position(|d| d != mine)
                    .unwrap_or_default();
                log::error!(
                    "eplb rank {}: cycle {}: rank {first} holds another plan (digest {:016x}, mine \
                     {:016x}); the cycle is abandoned on every rank",
                    self.rank,
                    self.cycle_no,
                    all.get(2 * first + 1).copied().unwrap_or_default(),
                    mine[1]
                );
            }
            self.plan.copy_from_slice(&self.placement);
            self.agree.task = Task::Settle {
                taken: false,
                record: false,
                resync: !failed,
            };
            self.events.plan_taken = Some(0);
            let _ = self.cycle.on_plan(&self.changed);
            self.end_cycle();
            return;
        }
        let record = self.cfg.mode == RunMode::Record;
        if !record {
            let per = self.shape.slots_per_layer();
            for ((c, old), new) in self
                .changed
                .iter_mut()
                .zip(self.placement.chunks_exact(per))
                .zip(self.plan.chunks_exact(per))
            {
                *c = old != new;
            }
        }
        self.agree.task = Task::Settle {
            taken: true,
            record,
            resync: false,
        };
        self.events.plan_taken = Some(self.changed.iter().filter(|&&c| c).count());
        match self.cycle.on_plan(&self.changed) {
            Step::UpdateLayer(l) => self.walk.start(l),
            _ => self.end_cycle(),
        }
    }

    /// The placement check answered with every rank's `[cycle, hash of its live placement]`,
    /// or failed. A layer whose vote this rank could not learn is committed when every other
    /// rank holds it, aborted when none does. Placements that still differ stop balancing
    /// ([`Health::Diverged`]).
    pub(super) fn on_placements(&mut self, all: Option<&[u64]>) {
        if !self.collective_done(all.is_some(), "placement check", false) {
            return;
        }
        let all = all.unwrap_or(&[]);
        let mine = [self.cycle_no, placement_hash(&self.placement)];
        let others = |d: [u64; 2]| {
            all.chunks_exact(2)
                .enumerate()
                .all(|(r, x)| r == self.rank || x == d)
        };
        if let Some(l) = self.walk.unsure {
            let with = [
                self.cycle_no,
                placement_hash_with_layer(&self.placement, &self.plan, &self.shape, l),
            ];
            let committed = others(with);
            if committed || others(mine) {
                self.walk.settle_unsure(l, committed);
                return;
            }
        } else if others(mine) {
            return;
        }
        log::error!(
            "eplb rank {}: the ranks hold different placements after cycle {}; balancing stopped \
             until the engine resumes it",
            self.rank,
            self.cycle_no
        );
        self.health = Health::Diverged;
        self.abandon_cycle();
    }

    /// This rank's `[cycle, plan hash]` (hash [`FAILED_PLAN`] without a plan).
    pub(super) fn digest(&self) -> [u64; 2] {
        let hash = match self.agree.plan_slot {
            PlanSlot::Ready(h) => h,
            PlanSlot::Missing | PlanSlot::Failed => FAILED_PLAN,
        };
        [self.cycle_no, hash]
    }

    /// Asks for a collective: books it and waits for its answer.
    pub(super) fn gather_words(&mut self, of: Gather, words: [u64; 2]) -> Action<'_> {
        self.agree.sent = words;
        self.agree.awaiting = Awaiting::Gather(of);
        self.stats.collectives += 1;
        Action::Collective(Collective::AllGather {
            of,
            send: &self.agree.sent,
        })
    }

    /// The action of the next cycle task, if any.
    pub(super) fn poll_task(&mut self) -> Option<Action<'_>> {
        let task = core::mem::replace(&mut self.agree.task, Task::Idle);
        match task {
            Task::Idle => None,
            Task::Gather => {
                self.agree.awaiting = Awaiting::Gather(Gather::Heat);
                self.stats.collectives += 1;
                Some(Action::Collective(Collective::AllGather {
                    of: Gather::Heat,
                    send: self.heat.held(),
                }))
            }
            Task::Submit => Some(Action::Planner(PlannerAction::Submit(PlanInput {
                cycle: self.cycle_no,
                seed: self.cfg.seed.wrapping_add(self.cycle_no),
                current: &self.placement,
                windows: self.heat.folded_windows(),
                loads: self.heat.loads(),
                samples: self.heat.samples(),
            }))),
            Task::AgreeReady => {
                self.agree.awaiting = Awaiting::Ready;
                self.stats.collectives += 1;
                Some(Action::Collective(Collective::AllAnd {
                    flag: self.agree.plan_slot != PlanSlot::Missing,
                }))
            }
            Task::AgreeDigest => {
                let digest = self.digest();
                Some(self.gather_words(Gather::Digest, digest))
            }
            Task::CheckPlacement => {
                let digest = [self.cycle_no, placement_hash(&self.placement)];
                Some(self.gather_words(Gather::Placement, digest))
            }
            Task::Settle {
                taken,
                record,
                resync,
            } => {
                if record {
                    self.agree.task = Task::Record;
                }
                Some(Action::Planner(PlannerAction::Settle {
                    cycle: self.cycle_no,
                    taken,
                    resync,
                }))
            }
            Task::Record => Some(Action::Record {
                cycle: self.cycle_no,
            }),
        }
    }
}
