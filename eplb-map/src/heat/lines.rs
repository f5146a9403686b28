//! The line layout of `eplb-trace/v1`: what a recorder appends to while it runs (the runtime's
//! `eplb_heat_record_path`).
//!
//! Line 1 is the header: an `eplb-trace/v1` object without `counts` (a first line with
//! `counts` is a one-object trace), with `"layout": "lines"`
//! and any informative fields. Each further line is one window, an object with `counts`
//! (`[L][N]`) and any other fields (the runtime writes `cycle`; the runtime and the adapters
//! write the optional `iteration_ms`, the engine's measured step in ms over the window's
//! iterations, which `eplb calibrate --measured` reads and heat readers ignore; `eplb
//! calibrate` also honours an optional `par` and `iterations` per window). The windows of
//! every complete line, in file order, are the trace's `counts` `[W][L][N]`; empty lines are
//! skipped, and a last line without its newline (a recorder cut off mid-write) is ignored.
//! Everything else is read as from the one-object layout.

use std::vec::Vec;

use crate::json::{MAX_ARRAY_LEN, Node, parse_lenient_numbers, skip_bom};
use crate::{Error, Position};

/// The `format` tag of a trace.
pub const TRACE_FORMAT: &str = "eplb-trace/v1";

/// The one-object document that `bytes` in the line layout stand for; `None` when `bytes` are
/// not in the line layout (their first line is not an `eplb-trace/v1` header with `"layout":
/// "lines"`).
pub(super) fn join(bytes: &[u8]) -> Result<Option<Node>, Error> {
    let bytes = skip_bom(bytes);
    let Some(nl) = bytes.iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    let (first, rest) = bytes.split_at(nl);
    // Cheap test before parsing: a one-object trace on one line is not parsed twice.
    if !contains(first, b"\"layout\"") || !contains(first, b"\"lines\"") {
        return Ok(None);
    }
    let Ok(Node::Obj(mut header)) = parse_lenient_numbers::<Node>(first) else {
        return Ok(None);
    };
    let is_lines = |kv: &[(std::string::String, Node)], key: &str, want: &str| {
        kv.iter()
            .rev()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.as_str())
            == Some(want)
    };
    if !is_lines(&header, "layout", "lines")
        || !is_lines(&header, "format", TRACE_FORMAT)
        || header.iter().any(|(k, _)| k == "counts")
    {
        return Ok(None);
    }
    let mut windows: Vec<Node> = Vec::new();
    // Lines after the header; the last piece has no newline when the writer was cut off.
    let body = rest.get(1..).unwrap_or(&[]);
    let mut pieces = body.split(|&b| b == b'\n').enumerate().peekable();
    while let Some((i, line)) = pieces.next() {
        if pieces.peek().is_none() {
            // After the last newline: empty, or a partial line.
            break;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let file_line = i + 2;
        let node: Node = parse_lenient_numbers(line).map_err(|e| match e {
            Error::Json { column, kind, .. } => Error::Json {
                line: file_line,
                column,
                kind,
            },
            other => other,
        })?;
        let counts = match node {
            Node::Obj(kv) => kv.into_iter().rev().find(|(k, _)| k == "counts"),
            _ => {
                return Err(Error::WrongType {
                    at: Position::root(),
                    key: "window line",
                    expected: "an object with \"counts\"",
                });
            }
        };
        let Some((_, counts)) = counts else {
            return Err(Error::MissingKey {
                at: Position::root(),
                key: "counts",
            });
        };
        if windows.len() >= MAX_ARRAY_LEN {
            return Err(Error::ArrayTooLong {
                offset: 0,
                limit: MAX_ARRAY_LEN,
            });
        }
        windows.push(counts);
    }
    header.retain(|(k, _)| k != "layout");
    header.push(("counts".into(), Node::Arr(windows)));
    Ok(Some(Node::Obj(header)))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use crate::heat::load_heat;
    use std::format;
    use std::string::ToString;

    const HEADER: &str = r#"{"format":"eplb-trace/v1","layout":"lines","name":"rec","model":{"num_moe_layers":2,"num_experts":3}}"#;

    #[test]
    fn windows_of_complete_lines_partial_last_line_ignored() {
        let text = format!(
            "{HEADER}\n{{\"cycle\":1,\"counts\":[[1,2,3],[4,5,6]]}}\n\n{{\"cycle\":1,\"counts\":[[0,0,9],[1,1,1]]}}\n{{\"cycle\":2,\"counts\":[[7,7"
        );
        let heat = load_heat(text.as_bytes(), None).unwrap();
        assert_eq!((heat.windows(), heat.layers(), heat.experts()), (2, 2, 3));
        assert_eq!(
            heat.counts_u64().unwrap(),
            [1, 2, 3, 4, 5, 6, 0, 0, 9, 1, 1, 1]
        );
        assert_eq!(heat.name(), Some("rec"));
        assert_eq!(
            crate::heat::sniff(text.as_bytes()).unwrap(),
            crate::HeatFormat::Trace
        );
    }

    #[test]
    fn a_bad_window_line_names_its_line() {
        let text = format!(
            "{HEADER}\n{{\"counts\":[[1,2,3],[4,5,6]]}}\n{{\"counts\":[[1,2,3],[4,5,]]}}\n"
        );
        let e = load_heat(text.as_bytes(), None).unwrap_err().to_string();
        assert!(e.contains("line 3"), "{e}");
        let ragged =
            format!("{HEADER}\n{{\"counts\":[[1,2,3],[4,5,6]]}}\n{{\"counts\":[[1,2],[4,5]]}}\n");
        assert!(load_heat(ragged.as_bytes(), None).is_err());
    }

    #[test]
    fn a_one_object_trace_is_not_the_line_layout() {
        let one = r#"{"format":"eplb-trace/v1","layout":"lines","counts":[[[1,2]]]}"#;
        assert_eq!(load_heat(one.as_bytes(), None).unwrap().windows(), 1);
        let one_nl = format!("{one}\n");
        assert_eq!(load_heat(one_nl.as_bytes(), None).unwrap().windows(), 1);
    }
}
