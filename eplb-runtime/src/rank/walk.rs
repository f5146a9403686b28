//! The walk room: the layer walk of a taken plan (the layer due, the one launched, its vote) and a
//! layer held open, whose vote this rank could not learn or whose install failed, with its new
//! rows, until its peers tell. Each method returns what the machine books ([`Dropped`],
//! [`Install`], [`LayerStep`]); the walk never touches the machine's statistics, events or health.

use super::action::LayerAction;
use super::wire::{self, AGREE_WORDS, Heard, PlacementHash, outcome};

/// Installs of one layer this rank tries at once before it keeps the exchange for the placement
/// check; one more try there, and a rank that still cannot install it stops balancing.
const COMMIT_TRIES: u32 = 2;

/// The layer in the driver's hands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerJob {
    Idle,
    Launched(u16),
    /// Not exchanged (a previous layer's outcome is unknown here, or its load failed): votes no
    /// after the forward.
    Skipped(u16),
    /// Loading the layer's lost experts (the driver answers `RankMachine::handle_loaded`).
    Loading(u16),
    Exchanged(u16, bool),
    Commit(u16),
    Abort(u16),
}

/// A layer that failed here without an abort to ask for (this rank did not launch it): the
/// machine books it as failed.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Dropped(pub(super) Option<u16>);

/// What a finished install means.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Install {
    /// Installed: copy the rows ([`Walk::installed_rows`]) into the live placement.
    Done,
    /// Failed; the commit is asked for again at once.
    Retry { tries: u32 },
    /// Failed again; the layer is held open until the placement check repairs it.
    Kept { tries: u32 },
    /// Failed once more: this rank holds another placement than its peers and stops.
    Diverged { tries: u32 },
}

/// What the layer in hand needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LayerStep {
    /// The vote on its exchange (a two-word gather).
    Vote {
        /// The layer.
        layer: u16,
        /// This rank's words.
        words: [u64; 2],
    },
    /// A local layer action (the machine waits for a commit's or a load's answer, and books an
    /// abort as a failed layer).
    Do(LayerAction),
}

/// The walk state of one rank.
#[derive(Debug, Clone)]
pub(super) struct Walk {
    job: LayerJob,
    /// The layer to launch before the next forward.
    due: Option<u16>,
    /// The layer this rank launched last (its exchange data is live in the driver).
    launched: Option<u16>,
    /// A layer whose vote this rank could not learn (its exchange data is kept).
    unsure: Option<u16>,
    /// The layer whose new rows are in `kept_rows` (an open layer, until it is installed or
    /// dropped: the plan may be another cycle's by then).
    kept: Option<u16>,
    /// The new rows `[R][S]` of the layer held open.
    kept_rows: Vec<u16>,
    /// The unsure layer once its outcome is known: `(layer, committed)`.
    resolved: Option<(u16, bool)>,
    /// This rank's outcome of the previous layer vote of the walk ([`outcome`]).
    last_outcome: u64,
    /// Failed installs of the layer in hand.
    commit_tries: u32,
    /// The layer whose lost experts were loaded (`true`) or failed to load (`false`), to launch
    /// next.
    loaded: Option<(u16, bool)>,
    /// A launched layer this rank votes no on whatever its exchange says (its load failed).
    vote_no: Option<u16>,
    /// A plan's layers are being walked (from the taken plan to the end of the cycle); the
    /// placement is checked at its end.
    walking: bool,
}

impl Walk {
    /// The walk of a shape with `per` slots per layer (`R * S`).
    pub(super) fn new(per: usize) -> Self {
        Self {
            job: LayerJob::Idle,
            due: None,
            launched: None,
            unsure: None,
            kept: None,
            kept_rows: vec![0; per],
            resolved: None,
            last_outcome: outcome::UNKNOWN,
            commit_tries: 0,
            loaded: None,
            vote_no: None,
            walking: false,
        }
    }

    /// Whether a layer update is under way: a walk, or a layer still in the driver's hands.
    pub(super) fn is_active(&self) -> bool {
        self.walking || self.job != LayerJob::Idle
    }

    /// A taken plan's walk starts with `layer`.
    pub(super) fn start(&mut self, layer: u16) {
        self.walking = true;
        self.due = Some(layer);
    }

    /// The cycle asks for `layer` next.
    pub(super) fn set_due(&mut self, layer: u16) {
        self.due = Some(layer);
    }

    /// The cycle ended: whether a walk was under way (then the placements are checked).
    pub(super) fn end(&mut self) -> bool {
        core::mem::take(&mut self.walking)
    }

    /// Balancing runs again (resume, membership): the installs of the layer in hand count anew.
    pub(super) fn restart(&mut self) {
        self.commit_tries = 0;
    }

    /// Whether this rank's exchange of the layer in hand succeeded (its yes in the vote).
    pub(super) fn voted_yes(&self) -> bool {
        matches!(self.job, LayerJob::Exchanged(_, true))
    }

    /// The hash of the placement whose hash is `hash` with the open layer installed (0: none
    /// open).
    pub(super) fn open_hash(&self, hash: &PlacementHash) -> u64 {
        self.unsure
            .map_or(0, |l| hash.with_layer(l, &self.kept_rows))
    }

    /// Retires the ranks outside `live` from the open layer's rows (a membership change: they
    /// are compared at the check without the ranks that left).
    pub(super) fn retire_kept(&mut self, one_layer: &eplb_core::Shape, live: &eplb_core::LiveSet) {
        if self.kept.is_some() {
            let _ = eplb_core::live::retire(one_layer, live, &mut self.kept_rows);
        }
    }

    /// The placement check showed what happened to the unsure layer: committed if some rank
    /// holds the placement with it installed (`open`, this rank's word `a`), which is then this
    /// rank's placement hash (returned).
    pub(super) fn settle_from_check(&mut self, words: &[u64], open: u64) -> Option<u64> {
        let l = self.unsure?;
        let committed = wire::ranks(words).any(|x| wire::live_word(x) == open);
        self.settle_unsure(l, committed);
        committed.then_some(open)
    }

    /// The placement check told what happened to the unsure `layer`.
    fn settle_unsure(&mut self, layer: u16, committed: bool) {
        self.unsure = None;
        self.job = if committed {
            LayerJob::Commit(layer)
        } else {
            LayerJob::Abort(layer)
        };
    }

    /// The layer leaves the driver's hands (installed, failed or aborted).
    fn release(&mut self) {
        self.job = LayerJob::Idle;
        self.launched = None;
    }

    /// A forward ran: a launched layer that was not reported counts as failed.
    pub(super) fn after_forward(&mut self, rank: usize) {
        match self.job {
            LayerJob::Skipped(l) => self.job = LayerJob::Exchanged(l, false),
            LayerJob::Launched(l) => {
                log::error!(
                    "eplb rank {rank}: layer {l}: no exchange result reported; counted as failed"
                );
                self.job = LayerJob::Exchanged(l, false);
            }
            _ => {}
        }
    }

    /// The load of `layer`'s lost experts finished; it is launched next (voted no on if `ok` is
    /// false).
    pub(super) fn on_loaded(&mut self, layer: u16, ok: bool) {
        self.job = LayerJob::Idle;
        self.loaded = Some((layer, ok));
        self.due = Some(layer);
    }

    /// This rank's exchange of `layer` finished after the forward.
    pub(super) fn on_exchanged(&mut self, layer: u16, ok: bool) {
        if self.job == LayerJob::Launched(layer) {
            let ok = ok && self.vote_no != Some(layer);
            self.vote_no = None;
            self.job = LayerJob::Exchanged(layer, ok);
        }
    }

    /// The install of `layer` finished (`plan`: the taken plan `[L][R][S]`, whose rows a layer
    /// held open keeps).
    pub(super) fn on_committed(&mut self, layer: u16, ok: bool, plan: &[u16]) -> Install {
        let launched = self.launched;
        self.release();
        if ok {
            self.commit_tries = 0;
            return Install::Done;
        }
        self.commit_tries += 1;
        let tries = self.commit_tries;
        self.launched = launched;
        if tries < COMMIT_TRIES {
            self.job = LayerJob::Commit(layer);
            Install::Retry { tries }
        } else if tries == COMMIT_TRIES && self.unsure.is_none() {
            self.keep(layer, plan);
            Install::Kept { tries }
        } else {
            // Still open (the driver keeps the exchange): the placement check after the
            // engine's resume tries once more.
            self.keep(layer, plan);
            Install::Diverged { tries }
        }
    }

    /// The rows of `layer` just installed: the open layer's kept rows (then no layer is held
    /// open), else the plan's.
    pub(super) fn installed_rows<'a>(
        &'a mut self,
        layer: u16,
        plan: &'a [u16],
    ) -> Option<&'a [u16]> {
        if self.kept == Some(layer) {
            self.kept = None;
            return Some(&self.kept_rows);
        }
        let per = self.kept_rows.len();
        let l = usize::from(layer);
        plan.get(l * per..(l + 1) * per)
    }

    /// The layer vote answered (`heard`; a rank that cannot read it already booked the failed
    /// collective). `yes_here`: this rank voted yes (read before the failure was booked);
    /// `atomic`: the collectives fail on every rank or none; `placement` and `live_hash`: the
    /// live placement and its hash, against which a layer held open is settled.
    ///
    /// A rank that voted yes and cannot read the vote (it failed here on a transport whose
    /// collectives are not atomic, or a word failed its check) cannot know whether its peers
    /// committed: it keeps the exchange (no commit, no abort), votes no on the next layer without
    /// exchanging it, and settles it from the placement hashes of the next vote or placement
    /// check: installs it if some rank holds the placement with it (then every rank voted yes),
    /// drops it if most hold the placement without it. A vote out of step commits nothing
    /// anywhere.
    #[expect(
        clippy::too_many_arguments,
        reason = "the vote's whole context, borrowed"
    )]
    pub(super) fn on_vote(
        &mut self,
        rank: usize,
        l: u16,
        heard: Heard<'_>,
        yes_here: bool,
        atomic: bool,
        plan: &[u16],
        live_hash: &PlacementHash,
    ) -> Dropped {
        let all = match heard {
            Heard::InStep(all) => all,
            Heard::OutOfStep => {
                self.last_outcome = outcome::ABORTED;
                return self.abort_or_drop(l);
            }
            Heard::Unknown { corrupt } => {
                if yes_here && self.unsure.is_none() && (corrupt || !atomic) {
                    log::error!(
                        "eplb rank {rank}: layer {l}: the outcome of the vote is unknown here; \
                         the exchange is kept until the peers tell",
                    );
                    self.last_outcome = outcome::UNKNOWN;
                    self.job = LayerJob::Idle;
                    self.keep(l, plan);
                    return Dropped(None);
                }
                self.last_outcome = outcome::ABORTED;
                return self.abort_or_drop(l);
            }
        };
        if let Some(u) = self.unsure
            && let Some(committed) = self.open_layer_verdict(all, live_hash)
        {
            // The placement most ranks hold tells what they did with the open layer (their
            // words `b`, the outcome of their previous vote, may be about a vote this rank
            // missed).
            self.unsure = None;
            self.resolved = Some((u, committed));
        }
        let yes = all.chunks_exact(AGREE_WORDS).all(|x| x.get(1) == Some(&1));
        self.last_outcome = if yes {
            outcome::COMMITTED
        } else {
            outcome::ABORTED
        };
        if yes {
            self.job = LayerJob::Commit(l);
            Dropped(None)
        } else {
            self.abort_or_drop(l)
        }
    }

    /// What a vote's words (rank-major) say of the open layer: committed (`true`) if some rank
    /// holds the placement with it installed (then every rank voted yes on it), dropped
    /// (`false`) if most ranks hold this rank's placement without it, `None` if neither.
    fn open_layer_verdict(&self, words: &[u64], live_hash: &PlacementHash) -> Option<bool> {
        let open = self.open_hash(live_hash);
        if wire::ranks(words).any(|w| wire::live_word(w) == open) {
            Some(true)
        } else if wire::majority(words).0 == live_hash.value() {
            Some(false)
        } else {
            None
        }
    }

    /// Holds `layer` open: its exchange stays in the driver, its new rows (from `plan`) here.
    fn keep(&mut self, layer: u16, plan: &[u16]) {
        self.unsure = Some(layer);
        self.kept = Some(layer);
        let per = self.kept_rows.len();
        let l = usize::from(layer);
        if let Some(rows) = plan.get(l * per..(l + 1) * per) {
            self.kept_rows.copy_from_slice(rows);
        }
    }

    /// Ends a failed layer: an abort if this rank launched it, else a drop (booked by the
    /// machine).
    fn abort_or_drop(&mut self, l: u16) -> Dropped {
        if self.launched == Some(l) {
            self.job = LayerJob::Abort(l);
            Dropped(None)
        } else {
            self.job = LayerJob::Idle;
            Dropped(Some(l))
        }
    }

    /// Drops the walk with the cycle: a layer not yet committed is aborted.
    pub(super) fn abandon(&mut self) -> Dropped {
        let dropped = match self.job {
            LayerJob::Launched(l) | LayerJob::Exchanged(l, _) => self.abort_or_drop(l),
            LayerJob::Skipped(_) | LayerJob::Loading(_) => {
                self.job = LayerJob::Idle;
                Dropped(None)
            }
            _ => Dropped(None),
        };
        self.loaded = None;
        self.vote_no = None;
        self.due = None;
        self.walking = false;
        dropped
    }

    /// The next step of the layer in hand, if any (owned, so that the machine can fall through
    /// to the cycle's tasks without a borrow). `needs_load` tells whether this rank's new rows of
    /// a layer hold an expert that no live rank holds.
    pub(super) fn next_step(
        &mut self,
        rank: usize,
        needs_load: impl FnOnce(u16) -> bool,
    ) -> Option<LayerStep> {
        if self.job == LayerJob::Idle
            && let Some((layer, committed)) = self.resolved.take()
        {
            log::info!(
                "eplb rank {rank}: layer {layer}: the peers {} it",
                if committed { "committed" } else { "aborted" }
            );
            self.settle_unsure(layer, committed);
        }
        match self.job {
            LayerJob::Exchanged(layer, ok) => Some(LayerStep::Vote {
                layer,
                words: [u64::from(ok), self.last_outcome],
            }),
            LayerJob::Commit(layer) => Some(LayerStep::Do(LayerAction::Commit { layer })),
            LayerJob::Abort(layer) => {
                if self.kept == Some(layer) {
                    self.kept = None;
                }
                self.release();
                Some(LayerStep::Do(LayerAction::Abort { layer }))
            }
            LayerJob::Idle => {
                let layer = self.due.take()?;
                let loaded = match self.loaded.take() {
                    Some((l, ok)) if l == layer => Some(ok),
                    _ => None,
                };
                if self.unsure.is_some() {
                    // No receive while a layer's outcome is unknown: send only, vote "no"
                    // after the forward, when the peers vote.
                    self.job = LayerJob::Skipped(layer);
                    Some(LayerStep::Do(LayerAction::SendOnly { layer }))
                } else if loaded.is_none() && needs_load(layer) {
                    self.job = LayerJob::Loading(layer);
                    Some(LayerStep::Do(LayerAction::Load { layer }))
                } else {
                    if loaded == Some(false) {
                        self.vote_no = Some(layer);
                    }
                    self.job = LayerJob::Launched(layer);
                    self.launched = Some(layer);
                    Some(LayerStep::Do(LayerAction::Launch { layer }))
                }
            }
            LayerJob::Launched(_) | LayerJob::Skipped(_) | LayerJob::Loading(_) => None,
        }
    }
}
