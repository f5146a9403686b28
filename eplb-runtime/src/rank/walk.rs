//! The layer walk of a taken plan: the layer due, the one launched, its vote, and a layer whose
//! vote this rank could not learn until its peers tell.

use super::agree::{AGREE_WORDS, Awaiting, Heard};
use super::{Gather, Health, LayerAction, RankMachine};

/// Installs of one layer this rank tries at once before it keeps the exchange for the placement
/// check; one more try there, and a rank that still cannot install it stops balancing.
const COMMIT_TRIES: u32 = 2;

/// Word `b` of a layer vote: this rank's outcome of the previous vote of the walk (for the logs and
/// tests; a rank holding a layer open settles it from the placement hashes instead, since the
/// previous vote may be one it missed).
pub mod outcome {
    /// The previous layer was aborted here.
    pub const ABORTED: u64 = 0;
    /// The previous layer was committed here.
    pub const COMMITTED: u64 = 1;
    /// No previous vote in this walk, or its outcome is unknown here.
    pub const UNKNOWN: u64 = 2;
}

/// The layer in the driver's hands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LayerJob {
    Idle,
    Launched(u16),
    /// Not exchanged (a previous layer's outcome is unknown here, or its load failed): votes no
    /// after the forward.
    Skipped(u16),
    /// Loading the layer's lost experts (the driver answers [`RankMachine::handle_loaded`]).
    Loading(u16),
    Exchanged(u16, bool),
    Commit(u16),
    Abort(u16),
}

/// The walk state of one rank.
#[derive(Debug, Clone)]
pub(super) struct Walk {
    pub(super) job: LayerJob,
    /// The layer to launch before the next forward.
    pub(super) due: Option<u16>,
    /// The layer this rank launched last (its exchange data is live in the driver).
    launched: Option<u16>,
    /// A layer whose vote this rank could not learn (its exchange data is kept).
    pub(super) unsure: Option<u16>,
    /// The layer whose new rows are in the machine's `kept` (an open layer, until it is
    /// installed or dropped: the plan may be another cycle's by then).
    pub(super) kept: Option<u16>,
    /// The unsure layer once its outcome is known: `(layer, committed)`.
    resolved: Option<(u16, bool)>,
    /// This rank's outcome of the previous layer vote of the walk ([`outcome`]).
    last_outcome: u64,
    /// Failed installs of the layer in hand.
    pub(super) commit_tries: u32,
    /// The layer whose lost experts were loaded (`true`) or failed to load (`false`), to launch
    /// next.
    loaded: Option<(u16, bool)>,
    /// A launched layer this rank votes no on whatever its exchange says (its load failed).
    vote_no: Option<u16>,
    /// A plan's layers are being walked (from the taken plan to the end of the cycle); the
    /// placement is checked at its end.
    pub(super) walking: bool,
}

impl Walk {
    pub(super) fn new() -> Self {
        Self {
            job: LayerJob::Idle,
            due: None,
            launched: None,
            unsure: None,
            kept: None,
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

    /// The placement check told what happened to the unsure `layer`.
    pub(super) fn settle_unsure(&mut self, layer: u16, committed: bool) {
        self.unsure = None;
        self.job = if committed {
            LayerJob::Commit(layer)
        } else {
            LayerJob::Abort(layer)
        };
    }

    /// The layer leaves the driver's hands (installed, failed or aborted).
    pub(super) fn release(&mut self) {
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
}

impl RankMachine {
    /// The load of `layer`'s lost experts finished ([`LayerAction::Load`]): `ok` when every one
    /// is in its receive buffer. A failed load is logged; this rank then takes part in the
    /// layer's exchange as usual (its peers' sends and receives stay matched) but votes no, so
    /// the layer keeps its rows on every rank (the next cycle's plan tries again).
    pub fn handle_loaded(&mut self, layer: u16, ok: bool) {
        if self.agree.awaiting != Awaiting::Loaded(layer) {
            return;
        }
        self.agree.awaiting = Awaiting::Nothing;
        if ok {
            self.stats.loads += 1;
        } else {
            self.stats.load_failures += 1;
            log::error!(
                "eplb rank {}: layer {layer}: loading the experts that lost every copy failed; \
                 this rank votes no and the layer keeps its rows on every rank",
                self.rank
            );
        }
        self.walk.job = LayerJob::Idle;
        self.walk.loaded = Some((layer, ok));
        self.walk.due = Some(layer);
    }

    /// This rank's exchange of `layer` finished after the forward (`ok`: every byte arrived).
    pub fn handle_exchanged(&mut self, layer: u16, ok: bool) {
        if self.walk.job == LayerJob::Launched(layer) {
            let ok = ok && self.walk.vote_no != Some(layer);
            self.walk.vote_no = None;
            self.walk.job = LayerJob::Exchanged(layer, ok);
        }
    }

    /// The commit of `layer` finished (`ok`: the slots hold the new experts).
    ///
    /// Every rank voted yes, so the peers hold the new layer: a failed install is repaired, not
    /// dropped. The driver keeps the exchange (its received data) after a failed install; the
    /// machine asks for the commit again at once, then holds the layer open (sends only, votes
    /// no, receives nothing until it is settled) and installs it at the next vote or placement
    /// check that shows a peer holding the placement with it. A third failure stops balancing on
    /// this rank ([`Health::Diverged`]), with a log line naming the layer; the layer stays open,
    /// and the placement check after the engine's resume tries it once more.
    pub fn handle_committed(&mut self, layer: u16, ok: bool) {
        if self.agree.awaiting != Awaiting::Committed(layer) {
            return;
        }
        self.agree.awaiting = Awaiting::Nothing;
        let launched = self.walk.launched;
        self.walk.release();
        if !ok {
            self.stats.commit_failures += 1;
            self.walk.commit_tries += 1;
            let tries = self.walk.commit_tries;
            if tries < COMMIT_TRIES {
                log::warn!(
                    "eplb rank {}: layer {layer}: install failed (try {tries}); trying again",
                    self.rank
                );
                self.walk.launched = launched;
                self.walk.job = LayerJob::Commit(layer);
            } else if tries == COMMIT_TRIES && self.walk.unsure.is_none() {
                log::error!(
                    "eplb rank {}: layer {layer}: install failed {tries} times; the exchange is \
                     kept and the placement check repairs the layer",
                    self.rank
                );
                self.walk.launched = launched;
                self.keep_layer(layer);
            } else {
                // Still open (the driver keeps the exchange): the placement check after the
                // engine's resume tries once more.
                log::error!(
                    "eplb rank {}: layer {layer}: install failed {tries} times; this rank holds \
                     another placement than its peers and stops balancing until the engine \
                     resumes it",
                    self.rank
                );
                self.walk.launched = launched;
                self.keep_layer(layer);
                self.health = Health::Diverged;
                self.abandon_cycle();
            }
            return;
        }
        self.walk.commit_tries = 0;
        let per = self.shape.slots_per_layer();
        let range = usize::from(layer) * per..(usize::from(layer) + 1) * per;
        let src = if self.walk.kept == Some(layer) {
            self.walk.kept = None;
            Some(self.kept.as_slice())
        } else {
            self.plan.get(range.clone())
        };
        if let (Some(dst), Some(src)) = (self.placement.get_mut(range), src) {
            dst.copy_from_slice(src);
        }
        self.stats.layers_committed += 1;
        self.events.committed = Some(layer);
    }

    /// The layer vote answered with every rank's words, or failed here.
    ///
    /// A rank that voted yes and cannot read the vote (it failed here on a transport whose
    /// collectives are not atomic, or a word failed its check) cannot know whether its peers
    /// committed: it keeps the exchange (no commit, no abort), votes no on the next layer without
    /// exchanging it, and settles it from the placement hashes of the next vote or placement
    /// check: installs it if some rank holds the placement with it (then every rank voted yes),
    /// drops it if most hold the placement without it. A vote out of step commits nothing
    /// anywhere.
    pub(super) fn on_votes(&mut self, l: u16, all: Option<&[u64]>) {
        let mine = matches!(self.walk.job, LayerJob::Exchanged(_, true));
        let all = match self.hear(all, Gather::Vote { layer: l }) {
            Heard::InStep(all) => {
                self.collective_done(true, "layer vote", false);
                all
            }
            Heard::OutOfStep => {
                self.walk.last_outcome = outcome::ABORTED;
                self.walk.job = self.abort_or_drop(l);
                return self.out_of_step(Gather::Vote { layer: l });
            }
            Heard::Unknown { corrupt } => {
                self.collective_done(false, "layer vote", false);
                let w = &mut self.walk;
                if mine && w.unsure.is_none() && (corrupt || !self.cfg.atomic_collectives) {
                    log::error!(
                        "eplb rank {}: layer {l}: the outcome of the vote is unknown here; the \
                         exchange is kept until the peers tell",
                        self.rank
                    );
                    w.last_outcome = outcome::UNKNOWN;
                    w.job = LayerJob::Idle;
                    self.keep_layer(l);
                } else {
                    w.last_outcome = outcome::ABORTED;
                    self.walk.job = self.abort_or_drop(l);
                }
                return;
            }
        };
        if let Some(u) = self.walk.unsure
            && let Some(committed) = self.open_layer_verdict(u, all)
        {
            // The placement most ranks hold tells what they did with the open layer (their
            // words `b`, the outcome of their previous vote, may be about a vote this rank
            // missed).
            self.walk.unsure = None;
            self.walk.resolved = Some((u, committed));
        }
        let w = &mut self.walk;
        let yes = all.chunks_exact(AGREE_WORDS).all(|x| x.get(1) == Some(&1));
        w.last_outcome = if yes {
            outcome::COMMITTED
        } else {
            outcome::ABORTED
        };
        self.walk.job = if yes {
            LayerJob::Commit(l)
        } else {
            self.abort_or_drop(l)
        };
    }

    /// Holds `layer` open: its exchange stays in the driver, its new rows in `kept`.
    pub(super) fn keep_layer(&mut self, layer: u16) {
        self.walk.unsure = Some(layer);
        self.walk.kept = Some(layer);
        let per = self.shape.slots_per_layer();
        let l = usize::from(layer);
        if let Some(rows) = self.plan.get(l * per..(l + 1) * per) {
            self.kept.copy_from_slice(rows);
        }
    }

    /// The job that ends a failed layer: an abort if this rank launched it, else a drop.
    pub(super) fn abort_or_drop(&mut self, l: u16) -> LayerJob {
        if self.walk.launched == Some(l) {
            LayerJob::Abort(l)
        } else {
            self.stats.layers_failed += 1;
            self.events.failed = Some(l);
            LayerJob::Idle
        }
    }

    /// Drops the walk with the cycle: a layer not yet committed is aborted.
    pub(super) fn abandon_walk(&mut self) {
        match self.walk.job {
            LayerJob::Launched(l) | LayerJob::Exchanged(l, _) => {
                self.walk.job = self.abort_or_drop(l);
            }
            LayerJob::Skipped(_) | LayerJob::Loading(_) => self.walk.job = LayerJob::Idle,
            _ => {}
        }
        if matches!(self.agree.awaiting, Awaiting::Loaded(_)) {
            self.agree.awaiting = Awaiting::Nothing;
        }
        self.walk.loaded = None;
        self.walk.vote_no = None;
        self.walk.due = None;
        self.walk.walking = false;
    }

    /// The next step of the layer in hand, if any (owned, so that [`RankMachine::poll`] can
    /// fall through to the cycle's tasks without a borrow).
    pub(super) fn next_layer_step(&mut self) -> Option<LayerStep> {
        if self.walk.job == LayerJob::Idle
            && let Some((layer, committed)) = self.walk.resolved.take()
        {
            log::info!(
                "eplb rank {}: layer {layer}: the peers {} it",
                self.rank,
                if committed { "committed" } else { "aborted" }
            );
            self.walk.settle_unsure(layer, committed);
        }
        match self.walk.job {
            LayerJob::Exchanged(layer, ok) => Some(LayerStep::Vote {
                layer,
                words: [u64::from(ok), self.walk.last_outcome],
            }),
            LayerJob::Commit(layer) => {
                self.agree.awaiting = Awaiting::Committed(layer);
                Some(LayerStep::Do(LayerAction::Commit { layer }))
            }
            LayerJob::Abort(layer) => {
                if self.walk.kept == Some(layer) {
                    self.walk.kept = None;
                }
                self.walk.release();
                self.stats.layers_failed += 1;
                self.events.failed = Some(layer);
                Some(LayerStep::Do(LayerAction::Abort { layer }))
            }
            LayerJob::Idle => {
                let layer = self.walk.due.take()?;
                let loaded = match self.walk.loaded.take() {
                    Some((l, ok)) if l == layer => Some(ok),
                    _ => None,
                };
                if self.walk.unsure.is_some() {
                    // No receive while a layer's outcome is unknown: send only, vote "no"
                    // after the forward, when the peers vote.
                    self.walk.job = LayerJob::Skipped(layer);
                    Some(LayerStep::Do(LayerAction::SendOnly { layer }))
                } else if loaded.is_none() && self.needs_load(layer) {
                    self.walk.job = LayerJob::Loading(layer);
                    self.agree.awaiting = Awaiting::Loaded(layer);
                    Some(LayerStep::Do(LayerAction::Load { layer }))
                } else {
                    if loaded == Some(false) {
                        self.walk.vote_no = Some(layer);
                    }
                    self.walk.job = LayerJob::Launched(layer);
                    self.walk.launched = Some(layer);
                    Some(LayerStep::Do(LayerAction::Launch { layer }))
                }
            }
            LayerJob::Launched(_) | LayerJob::Skipped(_) | LayerJob::Loading(_) => None,
        }
    }
}

/// What the layer in hand needs next.
pub(super) enum LayerStep {
    /// The vote on its exchange (a two-word gather).
    Vote {
        /// The layer.
        layer: u16,
        /// This rank's words.
        words: [u64; 2],
    },
    /// A local layer action.
    Do(LayerAction),
}
