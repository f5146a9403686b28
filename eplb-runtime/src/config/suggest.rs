//! "Did you mean ...?": a small edit distance and the closest candidate.

/// Levenshtein distance between `a` and `b`, counted in `char`s (insert, delete, substitute).
pub fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    // `row[j]` is the distance between the prefix of `a` read so far and `b[..j]`.
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = i; // previous row, column j - 1
        let mut left = i + 1; // this row, column j - 1
        for (cb, cell) in b.iter().zip(row.iter_mut().skip(1)) {
            let up = *cell;
            let here = (diag + usize::from(ca != *cb)).min(up + 1).min(left + 1);
            diag = up;
            *cell = here;
            left = here;
        }
        if let Some(first) = row.first_mut() {
            *first = i + 1;
        }
    }
    row.last().copied().unwrap_or(0)
}

/// The candidate closest to `given`, if it is close enough to be a plausible typo.
///
/// A candidate that equals `given` ignoring case always qualifies; otherwise the edit distance
/// must be at most `max(2, len / 3)` where `len` is the length of `given` in `char`s (ties go to
/// the earlier candidate); failing that, the first candidate that starts with `given` (of at
/// least 4 `char`s) qualifies.
pub fn closest<'c>(given: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let lower = given.to_lowercase();
    if let Some(c) = candidates.iter().find(|c| c.to_lowercase() == lower) {
        return Some(c);
    }
    let limit = (given.chars().count() / 3).max(2);
    let mut best: Option<(usize, &'c str)> = None;
    for c in candidates {
        let d = levenshtein(&lower, &c.to_lowercase());
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    if let Some((_, c)) = best {
        return Some(c);
    }
    // A truncated name ("deploy", "eplb_policy") suggests the first key it starts.
    if lower.chars().count() >= 4 {
        return candidates
            .iter()
            .find(|c| c.to_lowercase().starts_with(&lower))
            .copied();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        for (a, b, d) in [
            ("", "", 0),
            ("", "abc", 3),
            ("abc", "", 3),
            ("kitten", "sitting", 3),
            ("flaw", "lawn", 2),
            ("dynamic_epbl", "dynamic_eplb", 2),
            ("same", "same", 0),
            ("é", "e", 1),
        ] {
            assert_eq!(levenshtein(a, b), d, "{a} vs {b}");
            assert_eq!(levenshtein(b, a), d, "{b} vs {a}");
        }
    }

    #[test]
    fn closest_candidate() {
        let keys = ["dynamic_eplb", "expert_map_path", "expert_map_record_path"];
        assert_eq!(closest("dynamic_epbl", &keys), Some("dynamic_eplb"));
        assert_eq!(closest("DYNAMIC_EPLB", &keys), Some("dynamic_eplb"));
        assert_eq!(closest("expert_map_pth", &keys), Some("expert_map_path"));
        assert_eq!(closest("foo", &keys), None);
        assert_eq!(closest("expert_map", &keys), Some("expert_map_path"));
        assert_eq!(closest("dyn", &keys), None);
        assert_eq!(closest("", &keys), None);
    }
}
