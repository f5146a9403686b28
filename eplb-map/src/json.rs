//! Helpers shared by the JSON readers (`std`).

use std::vec::Vec;

use serde_json::Value;

use crate::Error;

/// A `serde_json` failure as [`Error::Json`].
pub(crate) fn syntax(e: &serde_json::Error) -> Error {
    use serde_json::error::Category;
    let kind = match e.classify() {
        Category::Io => "read error",
        Category::Syntax => "syntax error",
        Category::Data => "data error",
        Category::Eof => "unexpected end of input",
    };
    Error::Json {
        line: e.line(),
        column: e.column(),
        kind,
    }
}

/// Parses JSON that may hold Python's `NaN`, `Infinity` and `-Infinity` in number positions: they
/// become the strings `"NaN"`, `"Infinity"`, `"-Infinity"`, which the numeric readers report as
/// non-finite counts with their position. The rewrite runs only when the plain parse fails.
pub(crate) fn parse_lenient_numbers(bytes: &[u8]) -> Result<Value, Error> {
    match serde_json::from_slice(bytes) {
        Ok(v) => Ok(v),
        Err(e) => {
            if let Some(fixed) = quote_non_finite(bytes)
                && let Ok(v) = serde_json::from_slice(&fixed)
            {
                return Ok(v);
            }
            Err(syntax(&e))
        }
    }
}

/// Quotes bare `NaN`, `Infinity` and `-Infinity` outside strings; `None` when there is none.
fn quote_non_finite(bytes: &[u8]) -> Option<Vec<u8>> {
    const TOKENS: [&[u8]; 3] = [b"-Infinity", b"Infinity", b"NaN"];
    let mut out = Vec::with_capacity(bytes.len() + 16);
    let mut in_string = false;
    let mut escaped = false;
    let mut changed = false;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        } else if let Some(t) = TOKENS
            .iter()
            .find(|t| bytes.get(i..).is_some_and(|rest| rest.starts_with(t)))
        {
            out.push(b'"');
            out.extend_from_slice(t);
            out.push(b'"');
            i += t.len();
            changed = true;
            continue;
        }
        out.push(b);
        i += 1;
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_outside_strings() {
        let got = quote_non_finite(br#"{"a NaN": [NaN, -Infinity, "x\"NaN", Infinity]}"#);
        assert_eq!(
            got.as_deref(),
            Some(&br#"{"a NaN": ["NaN", "-Infinity", "x\"NaN", "Infinity"]}"#[..])
        );
        assert_eq!(quote_non_finite(b"[1, 2]"), None);
    }
}
