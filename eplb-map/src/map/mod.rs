//! vLLM-Ascend's expert-map JSON (`research/vllm-ascend-eplb.md` §4).
//!
//! ```text
//! { "moe_layer_count": L,
//!   "layer_list": [ { "layer_id": l, "device_count": R,
//!                     "device_list": [ { "device_id": r, "device_expert": [e, ...] } ] } ] }
//! ```
//!
//! [`write_map_json`] (no `std` needed) writes exactly the bytes of vLLM-Ascend's recorder
//! (Python `json.dump(..., indent=4)`: this key order, four-space indent, one number per line,
//! no trailing newline). With the `std` feature, `read_map_json` reads strictly and
//! `check_map_json` lists every problem.

use core::fmt;

use eplb_core::Placement;

#[cfg(feature = "std")]
mod read;
#[cfg(feature = "std")]
pub use read::{LayerSource, MapFile, MapReport, ReadOptions, check_map_json, read_map_json};

/// Writes `placement` as vLLM-Ascend's recorder would, byte for byte.
pub fn write_map_json<W: fmt::Write>(placement: &Placement<'_>, out: &mut W) -> fmt::Result {
    let shape = placement.shape();
    write!(
        out,
        "{{\n    \"moe_layer_count\": {},\n    \"layer_list\": [",
        shape.layers()
    )?;
    for (l, layer) in placement.layers().enumerate() {
        if l > 0 {
            out.write_char(',')?;
        }
        write!(
            out,
            "\n        {{\n            \"layer_id\": {l},\n            \"device_count\": {},\n            \"device_list\": [",
            shape.ranks()
        )?;
        for (r, row) in layer.rows().enumerate() {
            if r > 0 {
                out.write_char(',')?;
            }
            write!(
                out,
                "\n                {{\n                    \"device_id\": {r},\n                    \"device_expert\": ["
            )?;
            for (s, e) in row.iter().enumerate() {
                if s > 0 {
                    out.write_char(',')?;
                }
                write!(out, "\n                        {e}")?;
            }
            out.write_str("\n                    ]\n                }")?;
        }
        out.write_str("\n            ]\n        }")?;
    }
    out.write_str("\n    ]\n}")
}

/// `placement` as vLLM-Ascend's expert-map JSON, in a new string.
#[cfg(feature = "std")]
pub fn to_json(placement: &Placement<'_>) -> std::string::String {
    let mut s = std::string::String::with_capacity(60 + placement.as_slice().len() * 30);
    // Writing into a `String` cannot fail.
    let _ = write_map_json(placement, &mut s);
    s
}
