//! JSON helpers shared by the readers (`std`): serde reasons, BOM skipping, duplicate keys.

use std::string::ToString;
use std::vec::Vec;

use serde_json::Value;

use crate::Error;

/// serde_json's reasons (its `ErrorCode` messages), so that [`Error::Json`] keeps the reason
/// in a `&'static str` (an early end of input stays "unexpected end of input").
const REASONS: [(&str, &str); 19] = [
    ("expected `:`", "syntax error: expected `:`"),
    ("expected `,` or `]`", "syntax error: expected `,` or `]`"),
    ("expected `,` or `}`", "syntax error: expected `,` or `}`"),
    ("expected ident", "syntax error: expected ident"),
    ("expected value", "syntax error: expected value"),
    ("expected `\"`", "syntax error: expected `\"`"),
    ("invalid escape", "syntax error: invalid escape"),
    ("invalid number", "syntax error: invalid number"),
    ("number out of range", "syntax error: number out of range"),
    (
        "invalid unicode code point",
        "syntax error: invalid unicode code point",
    ),
    (
        "control character",
        "syntax error: control character in a string",
    ),
    ("key must be a string", "syntax error: key must be a string"),
    (
        "lone leading surrogate",
        "syntax error: lone leading surrogate in hex escape",
    ),
    ("trailing comma", "syntax error: trailing comma"),
    ("trailing characters", "syntax error: trailing characters"),
    (
        "unexpected end of hex escape",
        "syntax error: unexpected end of hex escape",
    ),
    (
        "recursion limit exceeded",
        "syntax error: nesting too deep (recursion limit exceeded)",
    ),
    ("invalid type", "data error: invalid type"),
    ("invalid UTF-8", "syntax error: invalid UTF-8"),
];

/// A `serde_json` failure as [`Error::Json`], with serde's reason where it is one of its own.
pub(crate) fn syntax(e: &serde_json::Error) -> Error {
    use serde_json::error::Category;
    let text = e.to_string();
    let kind = REASONS
        .iter()
        .find(|(prefix, _)| text.starts_with(prefix))
        .map(|(_, kind)| *kind)
        .unwrap_or(match e.classify() {
            Category::Io => "read error",
            Category::Syntax => "syntax error",
            Category::Data => "data error",
            Category::Eof => "unexpected end of input",
        });
    Error::Json {
        line: e.line(),
        column: e.column(),
        kind,
    }
}

/// `bytes` without a leading UTF-8 byte order mark (which some editors write).
pub(crate) fn skip_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes)
}

/// The first key that occurs twice in one object of `bytes`, as [`Error::DuplicateKey`];
/// `None` when there is none, or when `bytes` is not JSON (the parser reports that).
///
/// It walks the document with serde without building it (memory: the keys of the objects on
/// the current path).
pub fn duplicate_key(bytes: &[u8]) -> Option<Error> {
    use serde::de::Deserialize;
    let mut de = serde_json::Deserializer::from_slice(skip_bom(bytes));
    match NoDup::deserialize(&mut de) {
        Ok(NoDup) => None,
        Err(e) => {
            let text = e.to_string();
            let key = text.strip_prefix(DUP)?;
            let key = key.get(..key.find(" at line ").unwrap_or(key.len()))?;
            Some(Error::DuplicateKey {
                line: e.line(),
                column: e.column(),
                key: crate::ShortText::new(key),
            })
        }
    }
}

const DUP: &str = "eplb duplicate key: ";

/// A JSON value that is only checked for duplicate keys.
struct NoDup;

impl<'de> serde::de::Deserialize<'de> for NoDup {
    fn deserialize<D: serde::de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDupVisitor)
    }
}

struct NoDupVisitor;

impl<'de> serde::de::Visitor<'de> for NoDupVisitor {
    type Value = NoDup;

    fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<NoDup, E> {
        Ok(NoDup)
    }
    fn visit_i64<E>(self, _: i64) -> Result<NoDup, E> {
        Ok(NoDup)
    }
    fn visit_u64<E>(self, _: u64) -> Result<NoDup, E> {
        Ok(NoDup)
    }
    fn visit_f64<E>(self, _: f64) -> Result<NoDup, E> {
        Ok(NoDup)
    }
    fn visit_str<E>(self, _: &str) -> Result<NoDup, E> {
        Ok(NoDup)
    }
    fn visit_unit<E>(self) -> Result<NoDup, E> {
        Ok(NoDup)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<NoDup, A::Error> {
        while seq.next_element::<NoDup>()?.is_some() {}
        Ok(NoDup)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<NoDup, A::Error> {
        use serde::de::Error as _;
        let mut keys = std::collections::BTreeSet::new();
        while let Some(k) = map.next_key::<std::string::String>()? {
            map.next_value::<NoDup>()?;
            if !keys.insert(k.clone()) {
                return Err(A::Error::custom(std::format!("{DUP}{k}")));
            }
        }
        Ok(NoDup)
    }
}

/// Parses JSON that may hold Python's `NaN`, `Infinity` and `-Infinity` in number positions: they
/// become the strings `"NaN"`, `"Infinity"`, `"-Infinity"`, which the numeric readers report as
/// non-finite counts with their position. The rewrite runs only when the plain parse fails.
pub(crate) fn parse_lenient_numbers(bytes: &[u8]) -> Result<Value, Error> {
    let bytes = skip_bom(bytes);
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
