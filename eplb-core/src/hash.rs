//! FNV-1a 64 over words: the one hash of placements, plan requests and fingerprints.
//!
//! Each word is xor-ed in whole, then multiplied by the FNV prime (one step per word, not per
//! byte), so hashing `u16` ids or bytes widened to `u64` gives the values every caller has
//! always computed. Not a cryptographic hash: it detects accidental differences between ranks,
//! never a forged one.

/// The FNV-1a 64 offset basis.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// The FNV-1a 64 prime.
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A running FNV-1a 64 hash over words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv1a {
    /// The empty hash.
    pub const fn new() -> Self {
        Self(FNV_OFFSET)
    }

    /// Folds in one word.
    pub fn word(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(FNV_PRIME);
    }

    /// Folds in every word of `words`, in order.
    pub fn words(&mut self, words: impl IntoIterator<Item = u64>) {
        for w in words {
            self.word(w);
        }
    }

    /// The hash so far.
    pub const fn finish(&self) -> u64 {
        self.0
    }
}

/// FNV-1a 64 of `words`.
pub fn fnv1a(words: impl IntoIterator<Item = u64>) -> u64 {
    let mut h = Fnv1a::new();
    h.words(words);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // FNV-1a 64 of the bytes "a" and "foobar" (the published test vectors), one byte a word.
        assert_eq!(fnv1a("a".bytes().map(u64::from)), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(
            fnv1a("foobar".bytes().map(u64::from)),
            0x8594_4171_f739_67e8
        );
        assert_eq!(fnv1a([]), FNV_OFFSET);
    }
}
