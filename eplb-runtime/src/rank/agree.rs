//! What the ranks agree on, and in which order: the next task of the cycle, the collective this
//! rank waits in, the plan it holds for the cycle (ready, failed or missing), and the agreement
//! words themselves: every agreement gather carries, per rank, `[tag, a, b, live, check]`
//! ([`AGREE_WORDS`]), so that a rank reading its peers' words knows whether they are at its step
//! ([`agree_tag`]) and whether a word arrived whole ([`seal`]).
//!
//! How a rank reads an agreement ([`Heard`]): a failure or a word failing its check is *unknown*
//! here (the peers may have read every word); every sound word but another tag is *out of step*
//! (every rank that reads the words sees it, so every one of them drops the cycle at this step
//! and checks its placement at once); otherwise the step's own rule decides.

use eplb_core::{Shape, Step};

use super::{Action, Collective, Gather, Health, PlanInput, PlannerAction, RankMachine, RunMode};

/// The digest word of a failed plan (a real placement hash of 0 is mapped to 1).
pub const FAILED_PLAN: u64 = 0;

/// Words per rank of every agreement gather: `[tag, a, b, live, check]` ([`Gather`]).
pub const AGREE_WORDS: usize = 5;

const STEP_READY: u64 = 1;
const STEP_DIGEST: u64 = 2;
const STEP_VOTE: u64 = 3;
const STEP_PLACEMENT: u64 = 4;
const STEP_MEMBERS: u64 = 5;
/// Mixed into [`seal`] so that a word of zeros does not pass its check.
const SEAL_KEY: u64 = 0x5EA1_ED00_E91B_2700;

/// The tag of an agreement word of `of` in `cycle`: the cycle in bits 24 and up, the step in bits
/// 16 to 23, the layer of a vote in bits 0 to 15 (the heat gather, untagged, is step 0).
pub fn agree_tag(of: Gather, cycle: u64) -> u64 {
    let (step, layer) = match of {
        Gather::Heat => (0, 0),
        Gather::Ready => (STEP_READY, 0),
        Gather::Digest => (STEP_DIGEST, 0),
        Gather::Vote { layer } => (STEP_VOTE, layer),
        Gather::Placement => (STEP_PLACEMENT, 0),
        Gather::Members => (STEP_MEMBERS, 0),
    };
    (cycle << 24) | (step << 16) | u64::from(layer)
}

/// The gather and cycle an agreement tag names; `None` for a word that is no agreement tag.
pub fn tag_gather(tag: u64) -> Option<(Gather, u64)> {
    let layer = (tag & 0xffff) as u16;
    let of = match (tag >> 16) & 0xff {
        STEP_READY => Gather::Ready,
        STEP_DIGEST => Gather::Digest,
        STEP_VOTE => Gather::Vote { layer },
        STEP_PLACEMENT => Gather::Placement,
        STEP_MEMBERS => Gather::Members,
        _ => return None,
    };
    Some((of, tag >> 24))
}

/// The check word of an agreement's first four words (FNV-1a, keyed).
pub fn seal(words: [u64; 4]) -> u64 {
    eplb_core::fnv1a(words) ^ SEAL_KEY
}

/// An agreement reply as this rank reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Heard<'a> {
    /// Failed here, or (`corrupt`) some word failed its check: what the peers read is unknown.
    Unknown {
        /// A word failed its check (the transport reported success).
        corrupt: bool,
    },
    /// Every word sound, but some rank at another step, layer or cycle (in the readiness flag
    /// also: on another live placement).
    OutOfStep,
    /// Every rank at this step: the words, rank-major, [`AGREE_WORDS`] each.
    InStep(&'a [u64]),
}

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
    /// The driver's install of a layer ([`RankMachine::handle_committed`]).
    Committed(u16),
    /// The driver's load of a layer's lost experts ([`RankMachine::handle_loaded`]).
    Loaded(u16),
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
    /// A placement check is due once the task is done (end of a walk, out of step, resume).
    pub(super) check: bool,
    /// The words lent to the driver by the last agreement gather.
    pub(super) sent: [u64; AGREE_WORDS],
}

impl Agree {
    pub(super) fn new() -> Self {
        Self {
            task: Task::Idle,
            awaiting: Awaiting::Nothing,
            plan_slot: PlanSlot::Missing,
            submitted: false,
            check: false,
            sent: [0; AGREE_WORDS],
        }
    }
}

/// FNV-1a 64 over a placement's ids (one step per id); never [`FAILED_PLAN`].
pub fn placement_hash(placement: &[u16]) -> u64 {
    let h = eplb_core::fnv1a(placement.iter().map(|&v| u64::from(v)));
    if h == FAILED_PLAN { 1 } else { h }
}

/// [`placement_hash`] of `placement` with layer `layer`'s rows replaced by `new`.
fn placement_hash_with_layer(placement: &[u16], new: &[u16], shape: &Shape, layer: u16) -> u64 {
    let per = shape.slots_per_layer();
    let mut h = eplb_core::Fnv1a::new();
    for (l, old) in placement.chunks_exact(per).enumerate() {
        let rows = if l == usize::from(layer) { new } else { old };
        h.words(rows.iter().map(|&v| u64::from(v)));
    }
    let h = h.finish();
    if h == FAILED_PLAN { 1 } else { h }
}

impl RankMachine {
    /// The planner's answer for `cycle`: the plan, or `None` when the policy failed. Answers
    /// for another cycle are ignored. The plan was validated when the planner host built it; a
    /// plan for another shape or live set (a stale answer across a membership change) counts
    /// as a failed plan.
    pub fn handle_plan(&mut self, cycle: u64, plan: Option<&crate::planner::Plan>) {
        let plan = plan.filter(|p| *p.live() == self.live);
        self.take_plan(cycle, plan.map(|p| (self.shape, p.placement())));
    }

    fn take_plan(&mut self, cycle: u64, plan: Option<(Shape, &[u16])>) {
        if cycle != self.cycle_no
            || !self.agree.submitted
            || self.agree.plan_slot != PlanSlot::Missing
        {
            return;
        }
        self.agree.plan_slot = match plan {
            Some((shape, p)) if shape == self.shape && p.len() == self.plan.len() => {
                self.plan.copy_from_slice(p);
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
            Gather::Ready
            | Gather::Digest
            | Gather::Vote { .. }
            | Gather::Members
            | Gather::Placement => AGREE_WORDS,
        }
    }

    /// Reads an agreement reply of `of` (length checked): [`Heard`].
    pub(super) fn hear<'a>(&self, all: Option<&'a [u64]>, of: Gather) -> Heard<'a> {
        let Some(all) = all else {
            return Heard::Unknown { corrupt: false };
        };
        let [my_tag, _, _, my_live, _] = self.agree.sent;
        let mut in_step = true;
        for w in all.chunks_exact(AGREE_WORDS) {
            let &[tag, a, b, live, check] = w else {
                return Heard::Unknown { corrupt: true };
            };
            if seal([tag, a, b, live]) != check {
                return Heard::Unknown { corrupt: true };
            }
            in_step &= match of {
                // Any cycle: the check is where the ranks adopt one.
                Gather::Placement => tag_gather(tag).map(|(g, _)| g) == Some(Gather::Placement),
                // Any cycle: a rank that joins adopts its peers'.
                Gather::Members => tag_gather(tag).map(|(g, _)| g) == Some(Gather::Members),
                Gather::Ready => tag == my_tag && live == my_live,
                Gather::Heat | Gather::Digest | Gather::Vote { .. } => tag == my_tag,
            };
        }
        if in_step {
            Heard::InStep(all)
        } else {
            Heard::OutOfStep
        }
    }

    /// The ranks read another step's words in `of`: this rank drops the cycle (so does every
    /// rank that read the same words) and checks its placement at once. Only a placement check
    /// out of step counts as a failed collective (towards the suspension): the check it leads
    /// to is the resynchronization, and a check that cannot realign the ranks must end.
    pub(super) fn out_of_step(&mut self, of: Gather) {
        self.stats.resyncs += 1;
        log::warn!(
            "eplb rank {}: cycle {}: {of}: the ranks are out of step; the cycle is dropped and the \
             ranks check their placements",
            self.rank,
            self.cycle_no
        );
        if of == Gather::Placement {
            self.collective_done(false, "placement check (out of step)", true);
        } else {
            self.abandon_cycle();
        }
        if self.health == Health::Running {
            self.agree.check = true;
        }
    }

    /// The heat gather answered with every rank's words (length checked), or failed.
    ///
    /// The cycle goes on either way, so that every rank stays at the same step: a rank without
    /// the heat has no plan, says so in its digest ([`FAILED_PLAN`]), and every rank drops the
    /// cycle there.
    pub(super) fn on_heat(&mut self, all: Option<&[u64]>) -> Result<(), super::MachineError> {
        let folded = match all {
            Some(words) => self
                .heat
                .fold(&self.shape, &self.placement, &self.live, words),
            None => Ok(()),
        };
        let ok = all.is_some() && folded.is_ok();
        self.collective_done(ok, "heat gather", false);
        if self.health == Health::Running {
            self.cycle_no += 1;
            self.agree.submitted = ok;
            if ok {
                self.agree.plan_slot = PlanSlot::Missing;
                self.agree.task = Task::Submit;
            } else {
                self.agree.plan_slot = PlanSlot::Failed;
            }
        }
        folded
    }

    /// The readiness words answered, or failed here. Unknown here: a rank that has its answer
    /// goes on to the digest as if every rank had (the digest's tags tell), one that has none asks
    /// again after the next iteration, as every rank does then.
    pub(super) fn on_ready(&mut self, all: Option<&[u64]>) {
        let mine = self.agree.sent.get(1) == Some(&1);
        let every = match self.hear(all, Gather::Ready) {
            Heard::OutOfStep => return self.out_of_step(Gather::Ready),
            Heard::Unknown { .. } => {
                self.collective_done(false, "plan-ready agreement", false);
                if self.health != Health::Running {
                    return;
                }
                mine
            }
            Heard::InStep(words) => {
                self.collective_done(true, "plan-ready agreement", false);
                words
                    .chunks_exact(AGREE_WORDS)
                    .all(|w| w.get(1) == Some(&1))
            }
        };
        if every {
            self.agree.task = Task::AgreeDigest;
        } else {
            self.stats.late_iterations += 1;
            self.events.plan_late = true;
        }
    }

    /// The digest gather answered with every rank's words, or failed here. Unknown here: a
    /// failed plan here failed everywhere; a plan held here is taken as if every rank held it
    /// (no layer moves unless every rank votes on it at the same step).
    pub(super) fn on_digests(&mut self, all: Option<&[u64]>) {
        let mine = self.digest_hash();
        let verdict = match self.hear(all, Gather::Digest) {
            Heard::OutOfStep => return self.out_of_step(Gather::Digest),
            Heard::Unknown { .. } => {
                self.collective_done(false, "digest agreement", false);
                if self.health != Health::Running {
                    return;
                }
                if mine == FAILED_PLAN {
                    Verdict::Failed
                } else {
                    Verdict::Take
                }
            }
            Heard::InStep(words) => {
                self.collective_done(true, "digest agreement", false);
                let digests = || words.chunks_exact(AGREE_WORDS).map(|w| w.get(1).copied());
                if digests().any(|d| d == Some(FAILED_PLAN)) {
                    Verdict::Failed
                } else if let Some(rank) = digests().position(|d| d != Some(mine)) {
                    Verdict::Mismatch {
                        rank,
                        theirs: digests().nth(rank).flatten().unwrap_or_default(),
                    }
                } else {
                    Verdict::Take
                }
            }
        };
        self.stats.plans_taken += 1;
        self.agree.submitted = false;
        self.changed.iter_mut().for_each(|c| *c = false);
        if verdict != Verdict::Take {
            if let Verdict::Mismatch { rank, theirs } = verdict {
                self.stats.digest_mismatches += 1;
                log::error!(
                    "eplb rank {}: cycle {}: rank {rank} holds another plan (digest {theirs:016x}, \
                     mine {mine:016x}); the cycle is abandoned on every rank",
                    self.rank,
                    self.cycle_no,
                );
            } else {
                self.stats.plan_failures += 1;
            }
            self.plan.copy_from_slice(&self.placement);
            self.agree.task = Task::Settle {
                taken: false,
                record: false,
                resync: verdict != Verdict::Failed,
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

    /// The placement check answered with every rank's words, or failed here.
    ///
    /// The ranks compare placement hashes, never cycle numbers: each adopts the highest cycle
    /// among the tags (a stale cycle's plan is gone already: the check follows a dropped or ended
    /// cycle). Every rank computes each rank's placement once it settled its open layer (the one
    /// whose vote or install it could not finish, its exchange kept; word `a` is the hash with it
    /// installed): installed if some rank holds that placement (then every rank voted yes on
    /// it), dropped otherwise. The placement most ranks then hold (ties: the lowest hash) is the
    /// agreed one. A rank that does not hold it after settling its open layer cannot repair it:
    /// it says so and stops balancing ([`Health::Diverged`]). Unknown here: nothing changes (the
    /// next readiness flag compares the placements again).
    pub(super) fn on_placements(&mut self, all: Option<&[u64]>) {
        let words = match self.hear(all, Gather::Placement) {
            Heard::OutOfStep => return self.out_of_step(Gather::Placement),
            Heard::Unknown { .. } => {
                self.collective_done(false, "placement check", false);
                return;
            }
            Heard::InStep(words) => {
                self.collective_done(true, "placement check", false);
                words
            }
        };
        let chunks = || words.chunks_exact(AGREE_WORDS);
        let top = chunks()
            .filter_map(|w| w.first().map(|&t| t >> 24))
            .max()
            .unwrap_or(self.cycle_no);
        if top != self.cycle_no {
            log::warn!(
                "eplb rank {}: resynchronized from cycle {} to cycle {top}",
                self.rank,
                self.cycle_no
            );
            self.cycle_no = top;
        }
        // Each rank's placement once it settled its open layer, as every rank computes it: a
        // rank commits its open layer if some rank holds the placement with it (then every rank
        // voted yes on it), else drops it.
        for (post, w) in self.post.iter_mut().zip(chunks()) {
            let (open, live) = (open_word(w), live_word(w));
            *post = if open != 0 && chunks().any(|x| live_word(x) == open) {
                open
            } else {
                live
            };
        }
        let members = self.net_count;
        let (agreed, holders) = majority_of(self.post.get(..members).unwrap_or(&self.post));
        let mut mine = placement_hash(&self.placement);
        if let Some(l) = self.walk.unsure {
            let open = self.agree.sent.get(1).copied().unwrap_or_default();
            let committed = chunks().any(|x| live_word(x) == open);
            if committed {
                mine = open;
            }
            self.walk.settle_unsure(l, committed);
        }
        if mine == agreed {
            if holders < members {
                log::warn!(
                    "eplb rank {}: {} of {members} ranks hold another placement than \
                     {agreed:016x}; each repairs it or stops",
                    self.rank,
                    members - holders,
                );
            }
            return;
        }
        log::error!(
            "eplb rank {}: this rank's placement ({mine:016x}) differs from the one {holders} of \
             {} ranks hold ({agreed:016x}) and it cannot repair it; balancing stopped on this \
             rank until the engine resumes it",
            self.rank,
            self.net_count
        );
        self.health = Health::Diverged;
        self.abandon_cycle();
    }

    /// The hash of the placement with the open layer `l` installed.
    pub(super) fn open_hash(&self, l: u16) -> u64 {
        placement_hash_with_layer(&self.placement, &self.kept, &self.shape, l)
    }

    /// What a vote's words (rank-major) say of the open layer `l`: committed (`true`) if some
    /// rank holds the placement with it installed (then every rank voted yes on it), dropped
    /// (`false`) if most ranks hold this rank's placement without it, `None` if neither.
    pub(super) fn open_layer_verdict(&self, l: u16, words: &[u64]) -> Option<bool> {
        let open = self.open_hash(l);
        if words
            .chunks_exact(AGREE_WORDS)
            .any(|w| live_word(w) == open)
        {
            Some(true)
        } else if majority(words).0 == placement_hash(&self.placement) {
            Some(false)
        } else {
            None
        }
    }

    /// This rank's plan hash ([`FAILED_PLAN`] without a plan).
    pub(super) fn digest_hash(&self) -> u64 {
        match self.agree.plan_slot {
            PlanSlot::Ready(h) => h,
            PlanSlot::Missing | PlanSlot::Failed => FAILED_PLAN,
        }
    }

    /// Asks for an agreement gather of `of` with this rank's words `a`, `b` and `live`: tags and
    /// seals them, books it and waits for its answer.
    pub(super) fn gather_words(&mut self, of: Gather, a: u64, b: u64, live: u64) -> Action<'_> {
        let tag = agree_tag(of, self.cycle_no);
        self.agree.sent = [tag, a, b, live, seal([tag, a, b, live])];
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
            Task::Idle => {
                if self.members != super::members::MemberStep::Idle {
                    return self.poll_members();
                }
                if !core::mem::take(&mut self.agree.check) || self.health != Health::Running {
                    return None;
                }
                let live = placement_hash(&self.placement);
                let open = self.walk.unsure.map_or(0, |l| self.open_hash(l));
                Some(self.gather_words(Gather::Placement, open, 0, live))
            }
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
                live: &self.live,
                windows: self.heat.folded_windows(),
                loads: self.heat.loads(),
                samples: self.heat.samples(),
            }))),
            Task::AgreeReady => {
                let ready = u64::from(self.agree.plan_slot != PlanSlot::Missing);
                let live = placement_hash(&self.placement);
                Some(self.gather_words(Gather::Ready, ready, 0, live))
            }
            Task::AgreeDigest => {
                let hash = self.digest_hash();
                Some(self.gather_words(Gather::Digest, hash, 0, 0))
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

/// Word `live` of one rank's agreement words.
fn live_word(w: &[u64]) -> u64 {
    w.get(3).copied().unwrap_or_default()
}

/// Word `a` of one rank's placement-check words: the hash with its open layer installed (0:
/// none open).
fn open_word(w: &[u64]) -> u64 {
    w.get(1).copied().unwrap_or_default()
}

/// The live placement hash most ranks sent in `words` (agreement words, rank-major; ties: the
/// lowest hash), and how many sent it.
pub(super) fn majority(words: &[u64]) -> (u64, usize) {
    let chunks = || words.chunks_exact(AGREE_WORDS);
    let count = |h: u64| chunks().filter(|w| live_word(w) == h).count();
    best_count(chunks().map(live_word), count)
}

/// The hash most of `hashes` are (ties: the lowest), and how many.
fn majority_of(hashes: &[u64]) -> (u64, usize) {
    let count = |h: u64| hashes.iter().filter(|&&x| x == h).count();
    best_count(hashes.iter().copied(), count)
}

fn best_count(hashes: impl Iterator<Item = u64>, count: impl Fn(u64) -> usize) -> (u64, usize) {
    hashes.fold((0, 0), |(best, n), h| {
        let c = count(h);
        if c > n || (c == n && h < best) {
            (h, c)
        } else {
            (best, n)
        }
    })
}

/// What the digests decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Take,
    Failed,
    Mismatch { rank: usize, theirs: u64 },
}
