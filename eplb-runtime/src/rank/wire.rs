//! The agreement word format: the machine's protocol surface, the one thing every rank of a
//! deployment must read alike (a driver, a fault-injecting transport or a test builds words
//! with these functions; nothing else in the machine knows the layout).
//!
//! Every agreement is an all-gather of [`AGREE_WORDS`] words per rank, rank-major:
//!
//! | word | name | meaning |
//! | --- | --- | --- |
//! | 0 | `tag` | [`agree_tag`]: the cycle in bits 24 and up, the step in bits 16 to 23, a vote's layer in bits 0 to 15 ([`tag_gather`] reads it back) |
//! | 1 | `a` | the step's first word: readiness 0/1, the plan digest ([`FAILED_PLAN`] when it failed), a vote's yes 1 / no 0, the hash with the open layer installed (placement check; 0 none), the proposed live set's digest (membership) |
//! | 2 | `b` | the step's second word: a vote's [`outcome`] of the previous vote; 0 elsewhere |
//! | 3 | `live` | the rank's live placement hash ([`placement_hash`]) where the step compares it (readiness, vote, placement check, membership); 0 elsewhere |
//! | 4 | `check` | [`seal`] of words 0 to 3 |
//!
//! The steps, by their number in the tag: 0 the heat gather (untagged, `[T][L][S]` counts), 1
//! [`Gather::Ready`], 2 [`Gather::Digest`], 3 [`Gather::Vote`], 4 [`Gather::Placement`], 5
//! [`Gather::Members`].
//!
//! How a rank reads an agreement (`Heard`, `hear`): a failure or a word failing its check is
//! *unknown* here (the peers may have read every word); every sound word but another tag is *out
//! of step* (every rank that reads the words sees it, so every one of them drops the cycle at this
//! step and checks its placement at once); otherwise the step's own rule decides.
//!
//! **Stability:** changing a constant, a bit position or the hash changes the protocol: ranks of
//! two versions would read each other's words as out of step or corrupt.

use super::action::Gather;

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

/// This rank's words of `of` in `cycle`, sealed: `[tag, a, b, live, check]`.
pub(super) fn words(of: Gather, cycle: u64, a: u64, b: u64, live: u64) -> [u64; AGREE_WORDS] {
    let tag = agree_tag(of, cycle);
    [tag, a, b, live, seal([tag, a, b, live])]
}

/// A placement's hash: FNV-1a 64 over the FNV-1a 64 of each layer's ids (`per` ids a layer,
/// one step per id); never [`FAILED_PLAN`]. Hashing per layer lets a rank that installs one
/// layer rehash that layer alone (the machine keeps each layer's hash).
pub fn placement_hash(placement: &[u16], per: usize) -> u64 {
    let per = per.max(1);
    combine(placement.chunks_exact(per).map(layer_hash))
}

/// FNV-1a 64 of one layer's ids.
fn layer_hash(rows: &[u16]) -> u64 {
    eplb_core::fnv1a(rows.iter().map(|&v| u64::from(v)))
}

/// The placement hash of the layer hashes `layers`.
fn combine(layers: impl IntoIterator<Item = u64>) -> u64 {
    not_failed(eplb_core::fnv1a(layers))
}

/// [`placement_hash`] of a live placement, kept as state: each layer's hash, so that a change
/// of layer `l` rehashes that layer only, the hash is read from `L` words, and the hash with
/// one layer's rows replaced hashes that layer alone. Bit for bit [`placement_hash`].
#[derive(Debug, Clone)]
pub(super) struct PlacementHash {
    /// Slots per layer (`R * S`).
    per: usize,
    /// `[L]`: each layer's hash.
    layers: Vec<u64>,
}

impl PlacementHash {
    /// The hash of `placement` (layers of `per` slots).
    pub(super) fn new(placement: &[u16], per: usize) -> Self {
        let per = per.max(1);
        Self {
            per,
            layers: placement.chunks_exact(per).map(layer_hash).collect(),
        }
    }

    /// The layers of `placement` from `layer` on changed.
    pub(super) fn changed_from(&mut self, placement: &[u16], layer: usize) {
        let layers = placement.chunks_exact(self.per).skip(layer);
        for (h, rows) in self.layers.iter_mut().skip(layer).zip(layers) {
            *h = layer_hash(rows);
        }
    }

    /// Layer `layer` of `placement` changed.
    pub(super) fn changed_layer(&mut self, placement: &[u16], layer: usize) {
        let rows = placement.chunks_exact(self.per).nth(layer);
        if let (Some(h), Some(rows)) = (self.layers.get_mut(layer), rows) {
            *h = layer_hash(rows);
        }
    }

    /// [`placement_hash`] of the placement.
    pub(super) fn value(&self) -> u64 {
        combine(self.layers.iter().copied())
    }

    /// [`placement_hash`] of the placement hashed with layer `layer`'s rows replaced by `new`.
    pub(super) fn with_layer(&self, layer: u16, new: &[u16]) -> u64 {
        let l = usize::from(layer);
        if l >= self.layers.len() {
            return self.value();
        }
        let replaced = layer_hash(new);
        combine(
            self.layers
                .iter()
                .enumerate()
                .map(|(i, &h)| if i == l { replaced } else { h }),
        )
    }
}

/// A hash, never [`FAILED_PLAN`].
fn not_failed(h: u64) -> u64 {
    if h == FAILED_PLAN { 1 } else { h }
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

/// Reads an agreement reply of `of` (length checked) against the words this rank `sent`.
pub(super) fn hear<'a>(all: Option<&'a [u64]>, of: Gather, sent: &[u64; AGREE_WORDS]) -> Heard<'a> {
    let Some(all) = all else {
        return Heard::Unknown { corrupt: false };
    };
    let [my_tag, _, _, my_live, _] = *sent;
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

/// Each rank's words, rank-major.
pub(super) fn ranks(words: &[u64]) -> core::slice::ChunksExact<'_, u64> {
    words.chunks_exact(AGREE_WORDS)
}

/// The highest cycle among the tags of `words` (`None` without words).
pub(super) fn top_cycle(words: &[u64]) -> Option<u64> {
    ranks(words)
        .filter_map(|w| w.first().map(|&t| t >> 24))
        .max()
}

/// Word `a` of one rank's agreement words.
pub(super) fn a_word(w: &[u64]) -> u64 {
    w.get(1).copied().unwrap_or_default()
}

/// Word `live` of one rank's agreement words.
pub(super) fn live_word(w: &[u64]) -> u64 {
    w.get(3).copied().unwrap_or_default()
}

/// The live placement hash most ranks sent in `words` (agreement words, rank-major; ties: the
/// lowest hash), and how many sent it.
pub(super) fn majority(words: &[u64]) -> (u64, usize) {
    let count = |h: u64| ranks(words).filter(|w| live_word(w) == h).count();
    best_count(ranks(words).map(live_word), count)
}

/// The hash most of `hashes` are (ties: the lowest), and how many.
pub(super) fn majority_of(hashes: &[u64]) -> (u64, usize) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_hash_is_placement_hash_bit_for_bit() {
        let per = 6;
        let mut p: Vec<u16> = (0..4 * per).map(|i| (i * 7 % 11) as u16).collect();
        let mut kept = PlacementHash::new(&p, per);
        assert_eq!(kept.value(), placement_hash(&p, per));
        for layer in [2, 0, 3] {
            let new: Vec<u16> = (0..per).map(|i| (i * 3 + layer) as u16).collect();
            let mut whole = p.clone();
            whole[layer * per..(layer + 1) * per].copy_from_slice(&new);
            assert_eq!(
                kept.with_layer(layer as u16, &new),
                placement_hash(&whole, per)
            );
            p = whole;
            kept.changed_layer(&p, layer);
            assert_eq!(kept.value(), placement_hash(&p, per));
            kept.changed_from(&p, 0);
            assert_eq!(kept.value(), placement_hash(&p, per));
        }
        // A layer beyond the placement replaces nothing.
        assert_eq!(kept.with_layer(9, &[1; 6]), placement_hash(&p, per));
        // Every layer counts, and where it is.
        let mut swapped = p.clone();
        swapped[..per].copy_from_slice(&p[per..2 * per]);
        swapped[per..2 * per].copy_from_slice(&p[..per]);
        assert_ne!(placement_hash(&swapped, per), placement_hash(&p, per));
    }
}
