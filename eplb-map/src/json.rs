//! JSON helpers shared by the readers (`std`): serde reasons, BOM skipping, duplicate keys.

use std::string::ToString;
use std::vec::Vec;

use serde_json::Number;

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

/// The most elements a JSON array of a heat file or an expert map may hold: every dimension
/// (layers, experts, ranks, slots, windows) is indexed by a `u16`.
pub const MAX_ARRAY_LEN: usize = u16::MAX as usize;

/// Scans `bytes` (without building anything; memory: one counter per open array) and refuses
/// an array of more than `limit` elements as soon as its `limit + 1`-th element starts, so a
/// document of the wrong shape is refused before it is parsed into memory. Anything that is
/// not JSON is left to the parser.
pub(crate) fn check_array_lengths(bytes: &[u8], limit: usize) -> Result<(), Error> {
    /// Deeper nesting is left to the parser (whose recursion limit is 128).
    const MAX_DEPTH: usize = 256;
    // Per open container: (is an array, elements so far, offset of its opening bracket).
    let mut stack: Vec<(bool, usize, usize)> = Vec::new();
    let (mut in_string, mut escaped) = (false, false);
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            b']' | b'}' => {
                stack.pop();
                continue;
            }
            b',' => {
                if let Some((true, n, at)) = stack.last_mut() {
                    *n += 1;
                    if *n > limit {
                        return Err(Error::ArrayTooLong { offset: *at, limit });
                    }
                }
                continue;
            }
            _ => {}
        }
        // The start of a value (or of a key, or a ':'): the first element of an empty array.
        if let Some((true, n, _)) = stack.last_mut()
            && *n == 0
        {
            *n = 1;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                if stack.len() >= MAX_DEPTH {
                    return Ok(());
                }
                stack.push((b == b'[', 0, i));
            }
            _ => {}
        }
    }
    Ok(())
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
pub(crate) fn parse_lenient_numbers<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<T, Error> {
    let bytes = skip_bom(bytes);
    check_array_lengths(bytes, MAX_ARRAY_LEN)?;
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

/// A JSON document in the compact form of the readers: an array of non-negative integers is
/// one `Vec<u64>` (8 bytes a number, against about 32 for a `serde_json::Value`), an array of
/// other numbers one `Vec<Number>` (16 bytes), so a document takes a small multiple of its
/// file. Numbers keep their JSON kind (`1` is an integer, `1.0` a float), as in `serde_json`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Null,
    Bool(bool),
    Number(Number),
    Str(std::string::String),
    /// An array holding something other than numbers (or nothing but arrays, objects, ...).
    Arr(Vec<Node>),
    /// An array of non-negative integers only (empty arrays too).
    Ints(Vec<u64>),
    /// An array of numbers only, some of them not non-negative integers.
    Nums(Vec<Number>),
    /// Keys in document order; a repeated key's last value counts (as in `serde_json`).
    Obj(Vec<(std::string::String, Node)>),
}

impl Node {
    /// The value of `key` of an object.
    pub(crate) fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Obj(kv) => kv.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    /// A string's text.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }
    /// A non-negative integer (as `serde_json::Value::as_u64`).
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match self {
            Node::Number(n) => n.as_u64(),
            _ => None,
        }
    }
    /// The length of an array.
    pub(crate) fn array_len(&self) -> Option<usize> {
        match self {
            Node::Arr(a) => Some(a.len()),
            Node::Ints(a) => Some(a.len()),
            Node::Nums(a) => Some(a.len()),
            _ => None,
        }
    }
    /// Element `i` of an array of numbers as a non-negative integer: `Some(None)` for another
    /// element, `None` when this is no such array or `i` is out of range.
    pub(crate) fn u64_at(&self, i: usize) -> Option<Option<u64>> {
        match self {
            Node::Ints(a) => a.get(i).map(|&u| Some(u)),
            Node::Nums(a) => a.get(i).map(Number::as_u64),
            Node::Arr(a) => a.get(i).map(Node::as_u64),
            _ => None,
        }
    }
}

impl<'de> serde::de::Deserialize<'de> for Node {
    fn deserialize<D: serde::de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> serde::de::Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Node, E> {
        Ok(Node::Bool(b))
    }
    fn visit_i64<E>(self, i: i64) -> Result<Node, E> {
        Ok(Node::Number(Number::from(i)))
    }
    fn visit_u64<E>(self, u: u64) -> Result<Node, E> {
        Ok(Node::Number(Number::from(u)))
    }
    fn visit_f64<E>(self, f: f64) -> Result<Node, E> {
        // serde_json hands only finite floats here.
        Ok(Number::from_f64(f).map_or(Node::Null, Node::Number))
    }
    fn visit_str<E>(self, s: &str) -> Result<Node, E> {
        Ok(Node::Str(s.into()))
    }
    fn visit_string<E>(self, s: std::string::String) -> Result<Node, E> {
        Ok(Node::Str(s))
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        // As compact as the elements allow: integers, then numbers, then anything.
        let mut ints: Vec<u64> = Vec::new();
        let mut nums: Option<Vec<Number>> = None;
        while let Some(x) = seq.next_element::<Node>()? {
            match (x, &mut nums) {
                (Node::Number(n), None) => match n.as_u64() {
                    Some(u) => ints.push(u),
                    None => {
                        let mut v: Vec<Number> = ints.drain(..).map(Number::from).collect();
                        v.push(n);
                        nums = Some(v);
                    }
                },
                (Node::Number(n), Some(v)) => v.push(n),
                (other, _) => {
                    let mut nodes: Vec<Node> = match nums.take() {
                        Some(v) => v.into_iter().map(Node::Number).collect(),
                        None => ints.drain(..).map(|u| Node::Number(u.into())).collect(),
                    };
                    nodes.push(other);
                    while let Some(y) = seq.next_element::<Node>()? {
                        nodes.push(y);
                    }
                    nodes.shrink_to_fit();
                    return Ok(Node::Arr(nodes));
                }
            }
        }
        Ok(match nums {
            Some(mut v) => {
                v.shrink_to_fit();
                Node::Nums(v)
            }
            None => {
                ints.shrink_to_fit();
                Node::Ints(ints)
            }
        })
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut kv = Vec::new();
        while let Some(k) = map.next_key::<std::string::String>()? {
            let v = map.next_value::<Node>()?;
            kv.push((k, v));
        }
        Ok(Node::Obj(kv))
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
    fn array_lengths_are_counted_while_scanning() {
        assert!(check_array_lengths(b"[[1, 2, 3], [4]]", 3).is_ok());
        assert!(check_array_lengths(b"[]", 0).is_ok());
        assert!(check_array_lengths(b"[[]]", 1).is_ok());
        assert_eq!(
            check_array_lengths(b"[[1, 2], [1, 2, 3, 4]]", 3),
            Err(Error::ArrayTooLong {
                offset: 9,
                limit: 3
            })
        );
        // Commas inside strings and objects are not elements.
        assert!(check_array_lengths(br#"[{"a": 1, "b": [1], "c": 2}, "x,y,z,w"]"#, 2).is_ok());
        assert_eq!(
            check_array_lengths(br#"{"counts": [1, 2, 3]}"#, 2),
            Err(Error::ArrayTooLong {
                offset: 11,
                limit: 2
            })
        );
    }

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
