//! The vLLM-Ascend helper vectors of `../shared/data/golden/asc_maps.json` (layouts, expert maps,
//! `log2phy` with and without the TP rotation, `local2global`), run through `eplb-core`.

use eplb_core::{LayerPlacement, Layout, ReplicaChoice, Shape};
use eplb_tests::shared_json;
use serde_json::Value;

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn rows(v: &Value) -> Vec<Vec<i64>> {
    v.as_array().unwrap().iter().map(ints).collect()
}

/// A `[R][N]` global expert map (slot or -1) back to a `[R][S]` placement.
fn global_to_placement(map: &[Vec<i64>]) -> (Vec<u16>, usize) {
    let s = map.iter().flat_map(|r| r.iter()).copied().max().unwrap() as usize + 1;
    let mut p = vec![u16::MAX; map.len() * s];
    for (r, row) in map.iter().enumerate() {
        for (e, &slot) in row.iter().enumerate() {
            if slot >= 0 {
                p[r * s + slot as usize] = e as u16;
            }
        }
    }
    (p, s)
}

fn layer(shape: Shape, p: &[u16]) -> LayerPlacement<'_> {
    LayerPlacement::new(shape, 0, p).unwrap()
}

fn expert_map(l: &LayerPlacement<'_>, rank: usize) -> Vec<i64> {
    let mut out = vec![0i32; l.shape().experts()];
    l.expert_map(rank, &mut out).unwrap();
    out.into_iter().map(i64::from).collect()
}

fn log2phy(l: &LayerPlacement<'_>, rank: usize, tp: Option<u16>) -> Vec<i64> {
    let mut out = vec![0u32; l.shape().experts()];
    let choice = tp.map_or(ReplicaChoice::Plain, ReplicaChoice::TpRotation);
    l.log2phy(rank, choice, &mut out).unwrap();
    out.into_iter().map(i64::from).collect()
}

#[test]
fn every_asc_maps_vector() {
    let doc = shared_json("data/golden/asc_maps.json");
    assert_eq!(doc["schema"], "eplb-golden-maps/v1");
    let mut checked = 0;
    for v in doc["vectors"].as_array().unwrap() {
        let args = &v["args"];
        let exp = &v["expected"];
        let head = v["source"].as_str().unwrap().contains("HEAD");
        match v["function"].as_str().unwrap() {
            "generate_global_placement" => {
                // Shared-expert "mix placement" is out of scope (DESIGN.md, Layouts).
                if args["num_shared_experts"].as_u64() != Some(0) {
                    continue;
                }
                let (n, r, x) = (
                    args["n_expert"].as_u64().unwrap() as u16,
                    args["ep_size"].as_u64().unwrap() as u16,
                    args["n_redundant"].as_u64().unwrap() as u32,
                );
                let shape = Shape::from_redundant(1, n, r, x).unwrap();
                let layout = if head {
                    Layout::Default
                } else {
                    Layout::Contiguous
                };
                let mut out = vec![0u16; shape.placement_len()];
                layout.fill(&shape, &mut out).unwrap();
                let want: Vec<u16> = rows(exp).concat().iter().map(|&e| e as u16).collect();
                assert_eq!(out, want, "{v}");
            }
            "init_eplb_config" => {
                let (n, r, rank) = (
                    args["num_experts"].as_u64().unwrap() as u16,
                    args["ep_size"].as_u64().unwrap() as u16,
                    args["ep_rank"].as_u64().unwrap() as usize,
                );
                if args["dynamic_eplb"] == false {
                    // EPLB off: vLLM's contiguous map, no log2phy (the runtime's concern);
                    // it equals the contiguous layout with no redundancy.
                    let shape = Shape::from_redundant(1, n, r, 0).unwrap();
                    let mut p = vec![0u16; shape.placement_len()];
                    Layout::Contiguous.fill(&shape, &mut p).unwrap();
                    assert_eq!(
                        expert_map(&layer(shape, &p), rank),
                        ints(&exp["expert_map"])
                    );
                    checked += 1;
                    continue;
                }
                let (p, shape) = if let Some(json) = args.get("expert_map_json") {
                    let devs = json["layer_list"][0]["device_list"].as_array().unwrap();
                    let p: Vec<u16> = devs
                        .iter()
                        .flat_map(|d| ints(&d["device_expert"]))
                        .map(|e| e as u16)
                        .collect();
                    let s = (p.len() / devs.len()) as u16;
                    (p, Shape::new(1, n, r, s).unwrap())
                } else {
                    let x = args["num_redundant_experts"].as_u64().unwrap() as u32;
                    let shape = Shape::from_redundant(1, n, r, x).unwrap();
                    let mut p = vec![0u16; shape.placement_len()];
                    let layout = if head {
                        Layout::Default
                    } else {
                        Layout::Contiguous
                    };
                    layout.fill(&shape, &mut p).unwrap();
                    (p, shape)
                };
                let l = layer(shape, &p);
                assert_eq!(expert_map(&l, rank), ints(&exp["expert_map"]), "{v}");
                assert_eq!(log2phy(&l, rank, None), ints(&exp["log2phy"]), "{v}");
                assert_eq!(
                    shape.redundant() as u64,
                    exp["num_redundant"].as_u64().unwrap()
                );
                if let Some(g) = exp.get("global_expert_map") {
                    for (rr, row) in rows(g).iter().enumerate() {
                        assert_eq!(&expert_map(&l, rr), row, "{v}");
                    }
                }
            }
            "generate_log2phy_map" => {
                let map = rows(&args["global_expert_map"]);
                let (p, s) = global_to_placement(&map);
                let n = map[0].len() as u16;
                let shape = Shape::new(1, n, map.len() as u16, s as u16).unwrap();
                let tp = args["tp_size"].as_u64().map(|t| t as u16);
                let rank = args["ep_rank"].as_u64().unwrap() as usize;
                assert_eq!(log2phy(&layer(shape, &p), rank, tp), ints(exp), "{v}");
            }
            "local2global" => {
                let placement = &args["placement"][0];
                let prow = rows(placement);
                let s = prow[0].len();
                let p: Vec<u16> = prow.concat().iter().map(|&e| e as u16).collect();
                let n = exp[0][0].as_array().unwrap().len() as u16;
                let shape = Shape::new(1, n, prow.len() as u16, s as u16).unwrap();
                let l = layer(shape, &p);
                for (rank, row) in rows(&exp[0]).iter().enumerate() {
                    assert_eq!(&expert_map(&l, rank), row, "{v}");
                }
            }
            // The JSON reader (eplb-map) and transfer planning (eplb-runtime) test these.
            "expert_file_to_tensor" | "compose_expert_update_info_greedy" => continue,
            other => panic!("unknown vector function {other}"),
        }
        checked += 1;
    }
    assert!(checked >= 18, "only {checked} vectors checked");
}

/// `test_eplb_utils` with the placement of the §4 fixture written as a literal.
#[test]
fn json_fixture_literal() {
    let shape = Shape::new(1, 8, 2, 5).unwrap();
    let p = [7, 2, 0, 3, 5, 6, 1, 4, 7, 2];
    let l = layer(shape, &p);
    assert_eq!(expert_map(&l, 1), [-1, 1, 4, -1, 2, -1, 0, 3]);
    assert_eq!(log2phy(&l, 1, None), [2, 6, 9, 3, 7, 4, 5, 8]);
    assert_eq!(shape.redundant(), 2);
}
