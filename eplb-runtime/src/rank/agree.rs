//! The agreement room: the next task of the cycle, the answer this rank waits for, the plan it
//! holds for the cycle (ready, failed or missing), the words it lent to the last agreement gather
//! and each rank's placement once settled (the placement check). It reads the agreements' words
//! ([`wire`]) and says what they decide ([`Verdict`], the readiness, the agreed
//! placement); the machine applies that to its cycle, statistics, events and health.

use super::action::Gather;
use super::wire::{self, AGREE_WORDS, FAILED_PLAN, Heard};

/// The next step of the cycle that is not a layer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Task {
    Idle,
    Gather,
    Submit,
    AgreeReady,
    AgreeDigest,
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
    /// The driver's install of a layer (`RankMachine::handle_committed`).
    Committed(u16),
    /// The driver's load of a layer's lost experts (`RankMachine::handle_loaded`).
    Loaded(u16),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PlanSlot {
    /// No answer from the planner for the current cycle.
    Missing,
    /// The plan in the machine's `plan` (its hash).
    Ready(u64),
    /// The planner failed.
    Failed,
}

/// What the digests decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Every rank holds this rank's plan.
    Take,
    /// Some rank has no plan.
    Failed,
    /// `rank` holds another plan (digest `theirs`; this rank's is `mine`).
    Mismatch { rank: usize, theirs: u64, mine: u64 },
}

/// The placement check's reading: the placement most ranks hold once they settled their open
/// layers (ties: the lowest hash), and how many hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Agreed {
    pub(super) hash: u64,
    pub(super) holders: usize,
}

/// The agreement state of one rank.
#[derive(Debug, Clone)]
pub(super) struct Agree {
    task: Task,
    awaiting: Awaiting,
    plan_slot: PlanSlot,
    /// A plan was asked for this cycle and not settled yet.
    submitted: bool,
    /// A placement check is due once the task is done (end of a walk, out of step, resume).
    check: bool,
    /// The words lent to the driver by the last agreement gather.
    sent: [u64; AGREE_WORDS],
    /// Each rank's placement hash once its open layer is settled (the placement check), `[R]`.
    post: Vec<u64>,
}

impl Agree {
    pub(super) fn new(ranks: usize) -> Self {
        Self {
            task: Task::Idle,
            awaiting: Awaiting::Nothing,
            plan_slot: PlanSlot::Missing,
            submitted: false,
            check: false,
            sent: [0; AGREE_WORDS],
            post: vec![0; ranks],
        }
    }

    /// The answer waited for.
    pub(super) fn awaiting(&self) -> Awaiting {
        self.awaiting
    }

    /// Waits for `what` (a layer's install or load).
    pub(super) fn wait_for(&mut self, what: Awaiting) {
        self.awaiting = what;
    }

    /// `what` arrived: `true` if it was the answer waited for (then nothing is waited for).
    pub(super) fn answered(&mut self, what: Awaiting) -> bool {
        let was = self.awaiting == what;
        if was {
            self.awaiting = Awaiting::Nothing;
        }
        was
    }

    /// The next task, taken (the task becomes [`Task::Idle`]).
    pub(super) fn take_task(&mut self) -> Task {
        core::mem::replace(&mut self.task, Task::Idle)
    }

    /// Sets the next task.
    pub(super) fn set_task(&mut self, task: Task) {
        self.task = task;
    }

    /// Asks for a placement check once the task is done.
    pub(super) fn request_check(&mut self) {
        self.check = true;
    }

    /// Whether a placement check was asked for (the request is taken).
    pub(super) fn take_check(&mut self) -> bool {
        core::mem::take(&mut self.check)
    }

    /// The heat gather ended (`ok`: this rank folded it): the plan is asked for, or this cycle's
    /// plan failed here.
    pub(super) fn heat_gathered(&mut self, ok: bool) {
        self.submitted = ok;
        if ok {
            self.plan_slot = PlanSlot::Missing;
            self.task = Task::Submit;
        } else {
            self.plan_slot = PlanSlot::Failed;
        }
    }

    /// Whether the planner's answer for this cycle is awaited.
    pub(super) fn awaits_plan(&self) -> bool {
        self.submitted && self.plan_slot == PlanSlot::Missing
    }

    /// The planner answered: the plan's hash, or `None` when it failed.
    pub(super) fn plan_answered(&mut self, hash: Option<u64>) {
        self.plan_slot = hash.map_or(PlanSlot::Failed, PlanSlot::Ready);
    }

    /// The cycle is dropped: a submitted plan is settled as not taken; another task but a
    /// settlement is forgotten.
    pub(super) fn drop_cycle(&mut self) {
        if self.submitted {
            self.submitted = false;
            self.task = Task::Settle {
                taken: false,
                record: false,
                resync: false,
            };
        } else if !matches!(self.task, Task::Settle { .. }) {
            self.task = Task::Idle;
        }
        if matches!(self.awaiting, Awaiting::Loaded(_)) {
            self.awaiting = Awaiting::Nothing;
        }
    }

    /// Whether this rank has this cycle's answer from the planner (ready or failed).
    pub(super) fn has_plan(&self) -> bool {
        self.plan_slot != PlanSlot::Missing
    }

    /// This rank's plan hash ([`FAILED_PLAN`] without a plan).
    pub(super) fn digest(&self) -> u64 {
        match self.plan_slot {
            PlanSlot::Ready(h) => h,
            PlanSlot::Missing | PlanSlot::Failed => FAILED_PLAN,
        }
    }

    /// Lends this rank's words of `of` in `cycle` (tagged and sealed) and waits for the gather.
    pub(super) fn send(&mut self, of: Gather, cycle: u64, a: u64, b: u64, live: u64) -> &[u64] {
        self.sent = wire::words(of, cycle, a, b, live);
        self.awaiting = Awaiting::Gather(of);
        &self.sent
    }

    /// Waits for the heat gather (untagged: the words are the heat ring's).
    pub(super) fn send_heat(&mut self) {
        self.awaiting = Awaiting::Gather(Gather::Heat);
    }

    /// Word `a` this rank sent last.
    pub(super) fn sent_a(&self) -> u64 {
        self.sent.get(1).copied().unwrap_or_default()
    }

    /// Reads an agreement reply of `of` (length checked) against the words this rank sent.
    pub(super) fn hear<'a>(&self, all: Option<&'a [u64]>, of: Gather) -> Heard<'a> {
        wire::hear(all, of, &self.sent)
    }

    /// The readiness words (`None`: unknown here): whether every rank has its plan (unknown here:
    /// as this rank's word says). If so the digest is next.
    pub(super) fn on_ready(&mut self, words: Option<&[u64]>) -> bool {
        let every = match words {
            Some(words) => wire::ranks(words).all(|w| w.get(1) == Some(&1)),
            None => self.sent_a() == 1,
        };
        if every {
            self.task = Task::AgreeDigest;
        }
        every
    }

    /// The digests (`None`: unknown here; a failed plan here failed everywhere, a plan held here
    /// is taken as if every rank held it). The plan is settled with the planner next, and (in
    /// `record` mode, when taken) recorded.
    pub(super) fn on_digests(&mut self, words: Option<&[u64]>, record: bool) -> Verdict {
        let mine = self.digest();
        let verdict = match words {
            None if mine == FAILED_PLAN => Verdict::Failed,
            None => Verdict::Take,
            Some(words) => {
                let digests = || wire::ranks(words).map(|w| w.get(1).copied());
                if digests().any(|d| d == Some(FAILED_PLAN)) {
                    Verdict::Failed
                } else if let Some(rank) = digests().position(|d| d != Some(mine)) {
                    Verdict::Mismatch {
                        rank,
                        theirs: digests().nth(rank).flatten().unwrap_or_default(),
                        mine,
                    }
                } else {
                    Verdict::Take
                }
            }
        };
        self.submitted = false;
        self.task = match verdict {
            Verdict::Take => Task::Settle {
                taken: true,
                record,
                resync: false,
            },
            Verdict::Failed | Verdict::Mismatch { .. } => Task::Settle {
                taken: false,
                record: false,
                resync: verdict != Verdict::Failed,
            },
        };
        verdict
    }

    /// The placement check's words (every rank at that step), over the first `members` ranks:
    /// each rank's placement once it settled its open layer, as every rank computes it (a rank
    /// commits its open layer if some rank holds the placement with it, since then every rank
    /// voted yes on it, else drops it), and the one most ranks hold.
    pub(super) fn on_placements(&mut self, words: &[u64], members: usize) -> Agreed {
        for (post, w) in self.post.iter_mut().zip(wire::ranks(words)) {
            let (open, live) = (wire::a_word(w), wire::live_word(w));
            *post = if open != 0 && wire::ranks(words).any(|x| wire::live_word(x) == open) {
                open
            } else {
                live
            };
        }
        let (hash, holders) = wire::majority_of(self.post.get(..members).unwrap_or(&self.post));
        Agreed { hash, holders }
    }
}
