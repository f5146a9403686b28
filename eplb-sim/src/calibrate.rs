//! Calibration from the user's own numbers (`eplb calibrate`, `docs/time-model.md`,
//! "Calibration"): a file of measured step times at known shapes, a non-negative least-squares
//! fit of the step model's free multipliers ([`Calibration`]) and the `eplb-calibration/v1`
//! file every time-aware command accepts (`--calibration`).

use eplb_core::time::step::Calibration;
use serde_json::{Value, json};

use crate::SimError;

/// The format tag of a calibration file.
pub const FORMAT: &str = "eplb-calibration/v1";

fn bad(source: &str, why: impl Into<String>) -> SimError {
    SimError::Setting {
        what: source.to_owned(),
        why: why.into(),
    }
}

/// Reads an `eplb-calibration/v1` file: `{"format": "eplb-calibration/v1", "multipliers":
/// {"host": x, "backbone": x, "gemm": x, "link": x, "latency": x}, ...}`; every multiplier
/// must be present, finite and `>= 0`. Other keys (residuals, the fit's inputs) are kept for
/// people and ignored here.
pub fn read_calibration(bytes: &[u8], source: &str) -> Result<Calibration, SimError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| bad(source, format!("not a JSON calibration file: {e}")))?;
    if v.get("format").and_then(Value::as_str) != Some(FORMAT) {
        return Err(bad(source, format!("\"format\" must be \"{FORMAT}\"")));
    }
    let m = v
        .get("multipliers")
        .and_then(Value::as_object)
        .ok_or_else(|| bad(source, "\"multipliers\" must be an object"))?;
    let mut a = [0.0; 5];
    for (slot, name) in a.iter_mut().zip(Calibration::NAMES) {
        let x = m
            .get(name)
            .and_then(Value::as_f64)
            .ok_or_else(|| bad(source, format!("multipliers.{name} must be a number")))?;
        if !(x.is_finite() && x >= 0.0) {
            return Err(bad(
                source,
                format!("multipliers.{name} must be a finite number >= 0, not {x}"),
            ));
        }
        *slot = x;
    }
    Ok(Calibration::from_array(a))
}

/// The JSON of a calibration file with its multipliers and `extra` keys (the fit's report).
pub fn calibration_json(c: &Calibration, extra: Value) -> Value {
    let mut v = json!({
        "format": FORMAT,
        "multipliers": Calibration::NAMES.iter().zip(c.as_array())
            .map(|(k, x)| ((*k).to_owned(), json!(x)))
            .collect::<serde_json::Map<String, Value>>(),
    });
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        for (k, x) in e {
            o.insert(k, x);
        }
    }
    v
}
