//! The vLLM-Ascend expert-map JSON: golden bytes, the §4 fixture and golden vectors, and the
//! strict reader's errors on malformed maps.

use eplb_core::{Placement, ReplicaChoice, Shape};
use eplb_map::map::{self, LayerSource, ReadOptions, check_map_json, read_map_json};
use eplb_map::{Axis, Error, Position, ShortText, Warning};
use serde_json::{Value, json};

const ASC_MAPS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/data/golden/asc_maps.json"
);

fn fixture_slots() -> Vec<u16> {
    vec![7, 2, 0, 3, 5, 6, 1, 4, 7, 2]
}

#[test]
fn writer_matches_python_json_dump_indent4_byte_for_byte() {
    let shape = Shape::new(1, 8, 2, 5).unwrap();
    let slots = fixture_slots();
    let p = Placement::new(shape, &slots).unwrap();
    let golden = include_str!("data/fixture_a2_indent4.json");
    assert_eq!(map::to_json(&p), golden);
    assert!(
        !golden.ends_with('\n'),
        "json.dump writes no trailing newline"
    );

    let shape = Shape::new(2, 4, 2, 3).unwrap();
    let slots = [0, 1, 2, 3, 0, 1, 3, 2, 1, 0, 3, 2];
    let p = Placement::new(shape, &slots).unwrap();
    assert_eq!(
        map::to_json(&p),
        include_str!("data/two_layers_indent4.json")
    );
}

#[test]
fn writer_works_without_alloc_over_fmt_write() {
    struct Count(usize);
    impl core::fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let shape = Shape::new(1, 8, 2, 5).unwrap();
    let slots = fixture_slots();
    let p = Placement::new(shape, &slots).unwrap();
    let mut c = Count(0);
    map::write_map_json(&p, &mut c).unwrap();
    assert_eq!(c.0, include_str!("data/fixture_a2_indent4.json").len());
}

#[test]
fn reads_the_vllm_ascend_fixture_and_its_expert_map_and_log2phy() {
    let m = read_map_json(
        include_bytes!("data/fixture_a2_indent4.json"),
        &ReadOptions::strict(),
    )
    .unwrap();
    assert_eq!(m.placement().as_slice(), fixture_slots().as_slice());
    let shape = m.shape();
    assert_eq!(
        (
            shape.layers(),
            shape.experts(),
            shape.ranks(),
            shape.slots_per_rank()
        ),
        (1, 8, 2, 5)
    );
    assert_eq!(shape.redundant(), 2);
    assert!(m.warnings().is_empty());
}

fn golden_vectors() -> Vec<Value> {
    let text = std::fs::read_to_string(ASC_MAPS)
        .unwrap_or_else(|e| panic!("golden file {ASC_MAPS} must exist: {e}"));
    let v: Value = serde_json::from_str(&text).unwrap();
    v["vectors"].as_array().unwrap().clone()
}

#[test]
fn golden_expert_file_to_tensor_including_the_mtp_rule() {
    let mut seen = 0;
    for v in golden_vectors() {
        if v["function"] != "expert_file_to_tensor" {
            continue;
        }
        seen += 1;
        let bytes = serde_json::to_vec(&v["args"]["expert_map_json"]).unwrap();
        let m = read_map_json(&bytes, &ReadOptions::strict()).unwrap();
        let index = v["args"]["layer_id"].as_u64().unwrap() as usize;
        let expected = &v["expected"];
        match m.layer_for_index(index) {
            Ok(LayerSource::Table(layer)) => {
                let want: Vec<u16> = expected["placement"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|row| row.as_array().unwrap().iter())
                    .map(|x| x.as_u64().unwrap() as u16)
                    .collect();
                assert_eq!(layer.as_slice(), want.as_slice());
                assert_eq!(
                    layer.as_slice().len() as u64,
                    expected["physical_count"].as_u64().unwrap()
                );
            }
            Ok(LayerSource::Mtp { physical_experts }) => {
                assert!(expected["placement"].is_null());
                assert_eq!(
                    physical_experts as u64,
                    expected["physical_count"].as_u64().unwrap()
                );
            }
            Err(e) => {
                assert_eq!(expected["error"], "ValueError: Invalid EPLB Table");
                assert_eq!(
                    e,
                    Error::LayerIndex {
                        index: 3,
                        layers: 2
                    }
                );
            }
        }
    }
    assert_eq!(seen, 4);
}

#[test]
fn golden_init_eplb_config_from_a_json_map() {
    let mut seen = 0;
    for v in golden_vectors() {
        let args = &v["args"];
        if v["function"] != "init_eplb_config" || args.get("expert_map_json").is_none() {
            continue;
        }
        seen += 1;
        let n = args["num_experts"].as_u64().unwrap() as u16;
        let r = args["ep_size"].as_u64().unwrap() as u16;
        let rank = args["ep_rank"].as_u64().unwrap() as usize;
        let bytes = serde_json::to_vec(&args["expert_map_json"]).unwrap();
        let m = read_map_json(&bytes, &ReadOptions::strict().experts(n).ranks(r)).unwrap();
        let p = m.placement().view().unwrap();
        let layer = p.layer(0).unwrap();
        let mut em = vec![0i32; usize::from(n)];
        layer.expert_map(rank, &mut em).unwrap();
        let mut l2p = vec![0u32; usize::from(n)];
        layer.log2phy(rank, ReplicaChoice::Plain, &mut l2p).unwrap();
        let want_em: Vec<i32> =
            serde_json::from_value(v["expected"]["expert_map"].clone()).unwrap();
        let want_l2p: Vec<u32> = serde_json::from_value(v["expected"]["log2phy"].clone()).unwrap();
        assert_eq!(em, want_em);
        assert_eq!(l2p, want_l2p);
        assert_eq!(
            m.shape().redundant() as u64,
            v["expected"]["num_redundant"].as_u64().unwrap()
        );
    }
    assert!(seen >= 1, "asc_maps.json holds the §4 fixture vector");
}

// ---------------------------------------------------------------------------------------------
// Malformed maps: each with its expected error.

/// A valid two-layer map (N = 4, R = 2, S = 3), as a JSON value to break.
fn good() -> Value {
    json!({
        "moe_layer_count": 2,
        "layer_list": [
            {"layer_id": 0, "device_count": 2, "device_list": [
                {"device_id": 0, "device_expert": [0, 1, 2]},
                {"device_id": 1, "device_expert": [3, 0, 1]}]},
            {"layer_id": 1, "device_count": 2, "device_list": [
                {"device_id": 0, "device_expert": [3, 2, 1]},
                {"device_id": 1, "device_expert": [0, 3, 2]}]}
        ]
    })
}

fn read(v: &Value, opts: ReadOptions) -> Result<eplb_map::map::MapFile, Error> {
    read_map_json(&serde_json::to_vec(v).unwrap(), &opts)
}

fn strict_err(v: &Value) -> Error {
    read(v, ReadOptions::strict()).unwrap_err()
}

fn at(layer: usize, device: Option<usize>) -> Position {
    let p = Position::root().with(Axis::Layer, layer);
    match device {
        Some(d) => p.with(Axis::Device, d),
        None => p,
    }
}

#[test]
fn the_good_map_reads() {
    let m = read(&good(), ReadOptions::strict().experts(4).ranks(2).layers(2)).unwrap();
    assert_eq!(
        m.placement().as_slice(),
        &[0, 1, 2, 3, 0, 1, 3, 2, 1, 0, 3, 2]
    );
}

#[test]
fn malformed_01_not_json() {
    assert_eq!(
        read_map_json(b"{\"moe_layer_count\": 1,", &ReadOptions::strict()).unwrap_err(),
        Error::Json {
            line: 1,
            column: 22,
            kind: "unexpected end of input"
        }
    );
}

#[test]
fn malformed_02_not_an_object() {
    assert_eq!(
        strict_err(&json!([1, 2])),
        Error::WrongType {
            at: Position::root(),
            key: "document",
            expected: "an object"
        }
    );
}

#[test]
fn malformed_03_missing_key() {
    let mut v = good();
    v.as_object_mut().unwrap().remove("moe_layer_count");
    assert_eq!(
        strict_err(&v),
        Error::MissingKey {
            at: Position::root(),
            key: "moe_layer_count"
        }
    );
    let mut v = good();
    v["layer_list"][1]["device_list"][0]
        .as_object_mut()
        .unwrap()
        .remove("device_expert");
    assert_eq!(
        strict_err(&v),
        Error::MissingKey {
            at: at(1, Some(0)),
            key: "device_expert"
        }
    );
}

#[test]
fn malformed_04_extra_key() {
    let mut v = good();
    v["layer_list"][0]["comment"] = json!("hi");
    assert_eq!(
        strict_err(&v),
        Error::UnknownKey {
            at: at(0, None),
            key: ShortText::new("comment")
        }
    );
}

#[test]
fn malformed_05_wrong_types() {
    let mut v = good();
    v["moe_layer_count"] = json!("2");
    assert_eq!(
        strict_err(&v),
        Error::WrongType {
            at: Position::root(),
            key: "moe_layer_count",
            expected: "a non-negative integer"
        }
    );
    let mut v = good();
    v["layer_list"][0]["device_list"][1]["device_expert"][2] = json!(1.5);
    assert_eq!(
        strict_err(&v),
        Error::WrongType {
            at: at(0, Some(1)).with(Axis::Slot, 2),
            key: "device_expert",
            expected: "expert ids (non-negative integers)"
        }
    );
    let mut v = good();
    v["layer_list"][0]["device_list"][1]["device_expert"][0] = json!(-1);
    assert!(matches!(strict_err(&v), Error::WrongType { .. }));
    let mut v = good();
    v["layer_list"] = json!({});
    assert_eq!(
        strict_err(&v),
        Error::WrongType {
            at: Position::root(),
            key: "layer_list",
            expected: "an array"
        }
    );
}

#[test]
fn malformed_06_ragged_row() {
    let mut v = good();
    v["layer_list"][1]["device_list"][1]["device_expert"] = json!([0, 3, 2, 1]);
    assert_eq!(
        strict_err(&v),
        Error::RaggedRow {
            layer: 1,
            device: 1,
            slots: 4,
            expected: 3
        }
    );
}

#[test]
fn malformed_07_device_count_differs_from_the_list() {
    let mut v = good();
    v["layer_list"][1]["device_count"] = json!(3);
    assert_eq!(
        strict_err(&v),
        Error::DeviceCount {
            layer: 1,
            declared: 3,
            listed: 2
        }
    );
}

#[test]
fn malformed_08_layer_id_out_of_order() {
    let mut v = good();
    v["layer_list"][0]["layer_id"] = json!(1);
    v["layer_list"][1]["layer_id"] = json!(0);
    assert_eq!(
        strict_err(&v),
        Error::LayerIdOrder {
            layer: 0,
            layer_id: 1
        }
    );
}

#[test]
fn malformed_09_device_id_out_of_order() {
    let mut v = good();
    v["layer_list"][1]["device_list"][1]["device_id"] = json!(5);
    assert_eq!(
        strict_err(&v),
        Error::DeviceIdOrder {
            layer: 1,
            device: 1,
            device_id: 5
        }
    );
}

#[test]
fn malformed_10_colocated_copies_strict_and_lenient() {
    let mut v = good();
    // Layer 1, device 0 holds expert 3 twice; every expert is still present.
    v["layer_list"][1]["device_list"][0]["device_expert"] = json!([3, 1, 3]);
    v["layer_list"][1]["device_list"][1]["device_expert"] = json!([0, 2, 1]);
    assert_eq!(
        strict_err(&v),
        Error::ColocatedCopies {
            layer: 1,
            device: 0,
            slot: 2,
            expert: 3
        }
    );
    let m = read(&v, ReadOptions::lenient()).unwrap();
    assert_eq!(m.colocated_rows(), 1);
    assert_eq!(m.warnings(), vec![Warning::ColocatedCopies { rows: 1 }]);
    assert_eq!(m.placement().view().unwrap().colocated_rows(), 1);
}

#[test]
fn malformed_11_id_outside_0_n() {
    let mut v = good();
    v["layer_list"][0]["device_list"][1]["device_expert"] = json!([3, 0, 4]);
    assert_eq!(
        read(&v, ReadOptions::strict().experts(4)).unwrap_err(),
        Error::ExpertOutOfRange {
            layer: 0,
            device: 1,
            slot: 2,
            expert: 4,
            experts: 4
        }
    );
    let mut v = good();
    v["layer_list"][0]["device_list"][1]["device_expert"] = json!([3, 0, 70000]);
    assert!(matches!(
        strict_err(&v),
        Error::ExpertOutOfRange { expert: 70000, .. }
    ));
}

#[test]
fn malformed_12_expert_held_by_no_device() {
    let mut v = good();
    v["layer_list"][1]["device_list"][0]["device_expert"] = json!([2, 1, 0]);
    v["layer_list"][1]["device_list"][1]["device_expert"] = json!([0, 2, 1]);
    assert_eq!(
        read(&v, ReadOptions::strict()).unwrap_err(),
        Error::MissingExpert {
            layer: 1,
            expert: 3
        }
    );
    // With N given, an expert past every id is missing too.
    assert_eq!(
        read(&good(), ReadOptions::strict().experts(5)).unwrap_err(),
        Error::MissingExpert {
            layer: 0,
            expert: 4
        }
    );
}

#[test]
fn malformed_13_slots_do_not_divide_over_the_ranks() {
    assert_eq!(
        read(&good(), ReadOptions::strict().ranks(4)).unwrap_err(),
        Error::SlotsNotDivisible {
            layer: 0,
            slots: 6,
            ranks: 4
        }
    );
    assert_eq!(
        read(&good(), ReadOptions::strict().ranks(3)).unwrap_err(),
        Error::RankMismatch {
            expected: 3,
            found: 2
        }
    );
}

#[test]
fn malformed_14_more_layers_than_the_model() {
    assert_eq!(
        read(&good(), ReadOptions::strict().layers(1)).unwrap_err(),
        Error::TooManyLayers {
            layers: 2,
            model: 1
        }
    );
    assert_eq!(
        read(&good(), ReadOptions::strict().layers(3)).unwrap_err(),
        Error::TooFewLayers {
            layers: 2,
            model: 3
        }
    );
}

#[test]
fn malformed_15_moe_layer_count_differs_from_the_list() {
    let mut v = good();
    v["moe_layer_count"] = json!(3);
    assert_eq!(
        strict_err(&v),
        Error::LayerCount {
            declared: 3,
            listed: 2
        }
    );
}

#[test]
fn malformed_16_layers_with_different_device_counts() {
    let mut v = good();
    v["layer_list"][1]["device_count"] = json!(1);
    v["layer_list"][1]["device_list"] = json!([{"device_id": 0, "device_expert": [0, 1, 2]}]);
    assert_eq!(
        strict_err(&v),
        Error::RaggedLayer {
            layer: 1,
            devices: 1,
            expected: 2
        }
    );
}

#[test]
fn malformed_17_empty_lists() {
    let mut v = good();
    v["moe_layer_count"] = json!(0);
    v["layer_list"] = json!([]);
    assert_eq!(
        strict_err(&v),
        Error::Empty {
            at: Position::root(),
            what: "layer_list"
        }
    );
    let mut v = good();
    v["layer_list"][0]["device_list"][0]["device_expert"] = json!([]);
    assert_eq!(
        strict_err(&v),
        Error::Empty {
            at: at(0, Some(0)),
            what: "device_expert"
        }
    );
}

#[test]
fn malformed_18_more_slots_per_device_than_experts() {
    // N = 2, one device with three slots: the core's shape check.
    let v = json!({"moe_layer_count": 1, "layer_list": [{"layer_id": 0, "device_count": 1,
        "device_list": [{"device_id": 0, "device_expert": [0, 1, 0]}]}]});
    assert!(matches!(
        read(&v, ReadOptions::lenient()).unwrap_err(),
        Error::Core(eplb_core::Error::TooManySlotsPerRank { .. })
    ));
}

#[test]
fn malformed_19_layer_entry_not_an_object() {
    let mut v = good();
    v["layer_list"][1] = json!([1, 2]);
    assert_eq!(
        strict_err(&v),
        Error::WrongType {
            at: at(1, None),
            key: "layer_list element",
            expected: "an object"
        }
    );
}

#[test]
fn check_lists_every_problem_in_document_order() {
    let mut v = good();
    v["extra"] = json!(1);
    v["layer_list"][0]["layer_id"] = json!(7);
    v["layer_list"][1]["device_list"][1]["device_id"] = json!(0);
    let report = check_map_json(&serde_json::to_vec(&v).unwrap(), &ReadOptions::strict());
    assert_eq!(
        report.errors,
        vec![
            Error::UnknownKey {
                at: Position::root(),
                key: ShortText::new("extra")
            },
            Error::LayerIdOrder {
                layer: 0,
                layer_id: 7
            },
            Error::DeviceIdOrder {
                layer: 1,
                device: 1,
                device_id: 0
            },
        ]
    );
    assert!(report.map.is_none());
    assert!(!report.truncated);
    let ok = check_map_json(
        &serde_json::to_vec(&good()).unwrap(),
        &ReadOptions::strict(),
    );
    assert!(ok.errors.is_empty());
    assert!(ok.map.is_some());
}

#[test]
fn messages_say_what_and_where() {
    let cases = [
        (
            Error::ColocatedCopies {
                layer: 1,
                device: 0,
                slot: 2,
                expert: 3,
            },
            "layer 1, device 0, slot 2: expert 3 is already held by this device (co-located copy)",
        ),
        (
            Error::WrongType {
                at: at(0, Some(1)).with(Axis::Slot, 2),
                key: "device_expert",
                expected: "expert ids (non-negative integers)",
            },
            "layer 0, device 1, slot 2: \"device_expert\" must be expert ids (non-negative integers)",
        ),
        (
            Error::MissingKey {
                at: Position::root(),
                key: "layer_list",
            },
            "top level: missing key \"layer_list\"",
        ),
        (
            Error::UnknownKey {
                at: at(0, None),
                key: ShortText::new("a-very-long-key-name-that-goes-on-and-on"),
            },
            "layer 0: unknown key \"a-very-long-key-name-tha\"...",
        ),
    ];
    for (e, want) in cases {
        assert_eq!(e.to_string(), want);
    }
}

#[test]
fn read_back_what_we_write_for_the_dsv3_shape() {
    let shape = Shape::new(58, 256, 32, 9).unwrap();
    let mut slots = vec![0u16; shape.placement_len()];
    eplb_core::Layout::Default.fill(&shape, &mut slots).unwrap();
    let p = Placement::new(shape, &slots).unwrap();
    let text = map::to_json(&p);
    let m = read_map_json(
        text.as_bytes(),
        &ReadOptions::strict().experts(256).ranks(32).layers(58),
    )
    .unwrap();
    assert_eq!(m.placement().as_slice(), slots.as_slice());
    // And Python reads it back to the same bytes (json.loads then json.dump(indent=4)) is pinned
    // by the golden test above.
}
