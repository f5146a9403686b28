//! Heat inputs: every shared trace and series loads; each format's errors carry their position.

use std::path::PathBuf;

use eplb_core::{Layout, Placement, Shape};
use eplb_map::heat::{self, HeatFormat, load_heat, sniff};
use eplb_map::{Axis, Error, Position, Warning};

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data");

/// Lists the `.json` files of a shared directory; fails loudly when it is missing or short.
fn json_files(dir: &str, at_least: usize) -> Vec<PathBuf> {
    let path = PathBuf::from(SHARED).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&path)
        .unwrap_or_else(|e| panic!("shared data directory {} must exist: {e}", path.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= at_least,
        "{} holds {} traces, expected at least {at_least}",
        path.display(),
        files.len()
    );
    files
}

fn read(path: &PathBuf) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

#[test]
fn every_shared_trace_loads() {
    let mut sum_rule_warned = 0;
    for path in json_files("traces", 14) {
        let bytes = read(&path);
        assert_eq!(
            sniff(&bytes).unwrap(),
            HeatFormat::Trace,
            "{}",
            path.display()
        );
        let h = load_heat(&bytes, None).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let stem = path.file_stem().unwrap().to_str().unwrap();
        assert_eq!(h.name(), Some(stem));
        assert!(h.is_integral());
        assert_eq!(h.layer_ids().len(), h.layers());
        let dims = (h.layers(), h.experts());
        if stem.starts_with("sglang_dsv3") {
            assert_eq!((h.windows(), dims), (1, (58, 256)), "{stem}");
            assert_eq!(h.layer_ids()[0], 3);
            assert_eq!(h.top_k(), Some(8));
        } else if stem.starts_with("esft") {
            assert!((65..=67).contains(&h.windows()), "{stem}");
            assert_eq!(dims, (26, 64), "{stem}");
        } else if stem.starts_with("mixtral") {
            assert_eq!((h.windows(), dims), (9, (32, 8)), "{stem}");
        } else {
            panic!("unexpected trace {stem}: extend this test");
        }
        assert_eq!(h.window_tokens().map(<[u64]>::len), Some(h.windows()));
        for w in h.warnings() {
            match w {
                Warning::SumRule { .. } => sum_rule_warned += 1,
                other => panic!("{stem}: unexpected warning {other}"),
            }
        }
        // Token totals (README statistics table) from window_tokens.
        let tokens: u64 = h.window_tokens().unwrap().iter().sum();
        let expected_tokens = match stem {
            "esft_dsv2lite_intent" => 8222,
            "mixtral8x7b_gsm8k_decode" => 244,
            "sglang_dsv3_prefill_in1024" => 8_388_608,
            _ => tokens,
        };
        assert_eq!(tokens, expected_tokens, "{stem}");
    }
    // The README: in four prefill files the per-layer totals differ (a warning, not an error).
    assert!(sum_rule_warned >= 1);
}

#[test]
fn every_shared_series_loads() {
    for path in json_files("series", 2) {
        let bytes = read(&path);
        let h = load_heat(&bytes, None).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let stem = path.file_stem().unwrap().to_str().unwrap();
        let dims = (h.windows(), h.layers(), h.experts());
        match stem {
            "esft_chain" => assert_eq!(dims, (195, 26, 64)),
            "dsv3_drift_perm" => assert_eq!(dims, (160, 58, 256)),
            other => panic!("unexpected series {other}: extend this test"),
        }
        assert!(h.is_integral());
        let summed = h.summed();
        assert_eq!(summed.len(), h.layers() * h.experts());
        assert!(summed.iter().all(|v| v.is_finite() && *v >= 0.0));
    }
}

fn pos(axes: &[(Axis, usize)]) -> Position {
    axes.iter()
        .fold(Position::root(), |p, &(a, i)| p.with(a, i))
}

fn trace_with(counts: &str) -> String {
    format!(r#"{{"format": "eplb-trace/v1", "counts": {counts}}}"#)
}

#[test]
fn minimal_trace_needs_only_format_and_counts() {
    let h = load_heat(
        trace_with("[[[1, 2], [3, 4]], [[0, 0], [5, 6]]]").as_bytes(),
        None,
    )
    .unwrap();
    assert_eq!((h.windows(), h.layers(), h.experts()), (2, 2, 2));
    assert_eq!(h.summed(), vec![1.0, 2.0, 8.0, 10.0]);
    assert_eq!(h.window(1).unwrap(), &[0.0, 0.0, 5.0, 6.0]);
    assert_eq!(h.get(1, 1, 0), Some(5.0));
    assert_eq!(h.counts_u64().unwrap(), vec![1, 2, 3, 4, 0, 0, 5, 6]);
    assert_eq!(h.layer_ids(), &[0, 1]);
    assert!(h.warnings().is_empty());
}

#[test]
fn trace_sum_rule_and_bad_optional_fields_are_warnings() {
    let text = r#"{"format": "eplb-trace/v1", "model": {"top_k": 2}, "window_tokens": [2, 1],
        "num_windows": 3, "layer_ids": "x", "counts": [[[1, 3]], [[1, 0]]]}"#;
    let h = load_heat(text.as_bytes(), None).unwrap();
    assert_eq!(
        h.warnings(),
        &[
            Warning::IgnoredField {
                field: "num_windows",
                reason: "does not match the windows of counts"
            },
            Warning::IgnoredField {
                field: "layer_ids",
                reason: "not a list of one non-negative integer per layer"
            },
            Warning::SumRule {
                mismatches: 1,
                window: 1,
                layer: 0,
                expected: 2,
                got: 1
            },
        ]
    );
}

#[test]
fn trace_count_errors_name_window_layer_expert() {
    let at = |w, l, e| pos(&[(Axis::Window, w), (Axis::Layer, l), (Axis::Expert, e)]);
    let cases = [
        ("[[[1, -2]]]", Error::NegativeCount { at: at(0, 0, 1) }),
        (
            "[[[1, 2]], [[0, 2.5]]]",
            Error::FractionalCount { at: at(1, 0, 1) },
        ),
        ("[[[1, NaN]]]", Error::NonFiniteCount { at: at(0, 0, 1) }),
        (
            "[[[Infinity, 1]]]",
            Error::NonFiniteCount { at: at(0, 0, 0) },
        ),
        ("[[[1, null]]]", Error::MissingCount { at: at(0, 0, 1) }),
        ("[[[1, \"3\"]]]", Error::NotANumber { at: at(0, 0, 1) }),
        (
            "[[[1, 2]], [[3]]]",
            Error::RaggedArray {
                at: at(1, 0, 0).with(Axis::Expert, 0),
                expected: 2,
                got: 1,
            },
        ),
        (
            "[[[1, 9007199254740993]]]",
            Error::CountTooLarge { at: at(0, 0, 1) },
        ),
        (
            "[[1, 2]]",
            Error::Dimensions {
                at: pos(&[(Axis::Window, 0), (Axis::Layer, 0)]),
                expected: 3,
            },
        ),
        (
            "[[[[1]]]]",
            Error::Dimensions {
                at: at(0, 0, 0),
                expected: 3,
            },
        ),
        (
            "[]",
            Error::Empty {
                at: Position::root(),
                what: "counts",
            },
        ),
    ];
    for (counts, want) in cases {
        let got = load_heat(trace_with(counts).as_bytes(), None).unwrap_err();
        // The ragged row is reported at the row (window 1, layer 0).
        let want = match want {
            Error::RaggedArray { expected, got, .. } => Error::RaggedArray {
                at: pos(&[(Axis::Window, 1), (Axis::Layer, 0)]),
                expected,
                got,
            },
            w => w,
        };
        assert_eq!(got, want, "counts {counts}");
    }
    assert_eq!(
        load_heat(trace_with("[[[1, -2]]]").as_bytes(), None)
            .unwrap_err()
            .to_string(),
        "window 0, layer 0, expert 1: count is negative"
    );
}

#[test]
fn trace_format_and_counts_are_required() {
    assert_eq!(
        load_heat(br#"{"counts": [[[1]]]}"#, None).unwrap_err(),
        Error::MissingKey {
            at: Position::root(),
            key: "format"
        }
    );
    assert_eq!(
        load_heat(br#"{"format": "eplb-trace/v1"}"#, None).unwrap_err(),
        Error::MissingKey {
            at: Position::root(),
            key: "counts"
        }
    );
    assert_eq!(
        load_heat(br#"{"format": "eplb-trace/v2", "counts": [[[1]]]}"#, None).unwrap_err(),
        Error::FormatTag {
            found: eplb_map::ShortText::new("eplb-trace/v2")
        }
    );
}

#[test]
fn sglang_dump_drops_and_reports_all_zero_layers() {
    let text =
        br#"{"logical_count": [[0, 0, 0], [0.0, 0, 0], [1.0, 2.5, 0], [0, 0, 0], [4, 0, 1]]}"#;
    assert_eq!(sniff(text).unwrap(), HeatFormat::Sglang);
    let h = load_heat(text, None).unwrap();
    assert_eq!(h.format(), HeatFormat::Sglang);
    assert_eq!((h.windows(), h.layers(), h.experts()), (1, 2, 3));
    assert_eq!(h.as_slice(), &[1.0, 2.5, 0.0, 4.0, 0.0, 1.0]);
    assert_eq!(h.layer_ids(), &[2, 4]);
    assert_eq!(
        h.warnings(),
        &[Warning::DroppedZeroLayers {
            layers: vec![0, 1, 3]
        }]
    );
    assert!(!h.is_integral());
    assert_eq!(
        load_heat(br#"{"logical_count": [[0, 0], [0, 0]]}"#, None).unwrap_err(),
        Error::AllLayersZero
    );
    assert_eq!(
        load_heat(br#"{"logical_count": [[1, -1]]}"#, None).unwrap_err(),
        Error::NegativeCount {
            at: pos(&[(Axis::Layer, 0), (Axis::Expert, 1)])
        }
    );
}

#[test]
fn plain_array_may_be_fractional() {
    let text = b"[[1.5, 2], [0, 0.25]]";
    assert_eq!(sniff(text).unwrap(), HeatFormat::Plain);
    let h = load_heat(text, None).unwrap();
    assert_eq!((h.windows(), h.layers(), h.experts()), (1, 2, 2));
    assert_eq!(h.as_slice(), &[1.5, 2.0, 0.0, 0.25]);
    assert_eq!(h.counts_u64(), None);
    assert_eq!(
        load_heat(b"[[1.5, 2], [0, NaN]]", None).unwrap_err(),
        Error::NonFiniteCount {
            at: pos(&[(Axis::Layer, 1), (Axis::Expert, 1)])
        }
    );
}

#[test]
fn slot_loads_fold_through_the_placement() {
    // N = 4, R = 2, S = 3; default layout: [0,1,2],[3,0,1] per layer.
    let shape = Shape::new(2, 4, 2, 3).unwrap();
    let mut slots = vec![0u16; 12];
    Layout::Default.fill(&shape, &mut slots).unwrap();
    let p = Placement::new(shape, &slots).unwrap();
    let text = b"[[[1, 2, 3], [4, 5, 6]], [[0, 0, 0], [1, 1, 1]]]";
    assert_eq!(sniff(text).unwrap(), HeatFormat::SlotLoads);
    assert_eq!(load_heat(text, None).unwrap_err(), Error::NeedsPlacement);
    let h = load_heat(text, Some(&p)).unwrap();
    assert_eq!(h.format(), HeatFormat::SlotLoads);
    assert_eq!(h.as_slice(), &[6.0, 8.0, 3.0, 4.0, 1.0, 1.0, 0.0, 1.0]);
    // FlashLB's [H][L][R][S] gives windows.
    let text = b"[[[[1, 2, 3], [4, 5, 6]], [[0, 0, 0], [1, 1, 1]]], [[[0, 0, 0], [0, 0, 0]], [[1, 0, 0], [0, 0, 0]]]]";
    let h = load_heat(text, Some(&p)).unwrap();
    assert_eq!(h.windows(), 2);
    assert_eq!(
        h.window(1).unwrap(),
        &[0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    );
    assert_eq!(
        load_heat(b"[[[1, 2], [4, 5]], [[0, 0], [1, 1]]]", Some(&p)).unwrap_err(),
        Error::ShapeMismatch {
            what: "slots per device",
            expected: 3,
            got: 2
        }
    );
}

#[test]
fn sniff_rejects_what_is_no_heat_format() {
    for (text, found) in [
        (&b"[1, 2]"[..], "an array of fewer than 2 dimensions"),
        (b"[[[[[1]]]]]", "an array of more than 4 dimensions"),
        (
            b"{\"a\": 1}",
            "an object without \"format\" or \"logical_count\"",
        ),
        (b"3", "neither an object nor an array"),
    ] {
        assert_eq!(sniff(text).unwrap_err(), Error::UnknownFormat { found });
    }
    assert!(matches!(
        sniff(b"{\"format\": ").unwrap_err(),
        Error::Json { .. }
    ));
}

#[test]
fn heat_new_validates_values() {
    let h = heat::Heat::new(1, 1, 2, vec![1.0, 2.0]).unwrap();
    assert_eq!(h.summed(), vec![1.0, 2.0]);
    assert_eq!(
        heat::Heat::new(1, 2, 2, vec![1.0, 2.0, 0.0, -1.0]).unwrap_err(),
        Error::NegativeCount {
            at: pos(&[(Axis::Window, 0), (Axis::Layer, 1), (Axis::Expert, 1)])
        }
    );
    assert!(heat::Heat::new(1, 1, 2, vec![1.0]).is_err());
}

#[test]
fn a_short_input_cannot_ask_for_a_huge_allocation() {
    // The first window claims 1 x 100000 experts and there are 200001 windows: 2e10 values if
    // the first row's sizes were trusted. The second window is ragged.
    let mut text = String::from(r#"{"format": "eplb-trace/v1", "counts": [[["#);
    text.push_str(&"0,".repeat(99_999));
    text.push_str("0]]");
    text.push_str(&",[]".repeat(200_000));
    text.push_str("]}");
    // Refused while scanning, before anything is built: no array may be longer than a u16
    // index reaches.
    assert_eq!(
        load_heat(text.as_bytes(), None).unwrap_err(),
        Error::ArrayTooLong {
            offset: 40,
            limit: 65535
        }
    );
    // Within the array limit, the ragged second window is found without trusting the first
    // row's sizes (60000 experts x 60001 windows would be 3.6e9 values).
    let mut text = String::from(r#"{"format": "eplb-trace/v1", "counts": [[["#);
    text.push_str(&"0,".repeat(59_999));
    text.push_str("0]]");
    text.push_str(&",[]".repeat(60_000));
    text.push_str("]}");
    assert_eq!(
        load_heat(text.as_bytes(), None).unwrap_err(),
        Error::RaggedArray {
            at: pos(&[(Axis::Window, 1)]),
            expected: 1,
            got: 0
        }
    );
}
