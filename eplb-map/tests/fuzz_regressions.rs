//! Inputs found by the fuzzers (`eplb-map/fuzz`) or written against them (deep nesting, huge
//! numbers, oversized varints), kept as regression tests: every decoder must return without
//! panicking, and the outcome is pinned by the file name: a file named `ok_*` must be accepted,
//! every other file must be rejected.

use std::path::PathBuf;

use eplb_core::{Layout, Placement, Shape};
use eplb_map::map::{ReadOptions, check_map_json, read_map_json};
use eplb_map::{blob, heat};

fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fuzz_regressions"
    ))
    .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{} must exist: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != ".keep"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

#[test]
fn map_json_inputs_do_not_panic() {
    for (name, data) in inputs("map_json") {
        for opts in [ReadOptions::strict(), ReadOptions::lenient()] {
            let r = read_map_json(&data, &opts);
            let c = check_map_json(&data, &opts);
            assert_eq!(r.is_ok(), c.errors.is_empty(), "{name}");
            assert_eq!(r.is_ok(), name.starts_with("ok_"), "{name}: {r:?}");
        }
    }
}

#[test]
fn blob_inputs_do_not_panic() {
    for (name, data) in inputs("blob") {
        let mut out = vec![0u16; 1 << 16];
        let _ = blob::header(&data);
        let r = blob::decode(&data, &mut out);
        assert_eq!(r.is_ok(), name.starts_with("ok_"), "{name}: {r:?}");
        if let Ok(p) = r {
            assert_eq!(blob::to_vec(&p).len(), blob::encoded_len(&p), "{name}");
        }
    }
}

#[test]
fn trace_inputs_do_not_panic() {
    let shape = Shape::new(2, 4, 2, 3).unwrap();
    let mut slots = [0u16; 12];
    Layout::Default.fill(&shape, &mut slots).unwrap();
    let p = Placement::new(shape, &slots).unwrap();
    for (name, data) in inputs("trace") {
        let _ = heat::sniff(&data);
        for placement in [None, Some(&p)] {
            if let Ok(h) = heat::load_heat(&data, placement) {
                assert!(
                    h.as_slice().iter().all(|v| v.is_finite() && *v >= 0.0),
                    "{name}"
                );
            }
        }
    }
}
