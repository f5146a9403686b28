//! The `eplb-calibration/v1` file `eplb calibrate` writes (`docs/time-model.md`,
//! "Calibration"): the whole-step model's free multipliers. Read here so that the runtime's
//! pay-off gate (`eplb_payoff_gate`'s `calibration`) and the offline tools share one reader.

use eplb_core::time::step::Calibration;
use serde_json::Value;

/// The format tag of a calibration file.
pub const FORMAT: &str = "eplb-calibration/v1";

/// Reads an `eplb-calibration/v1` document: `{"format": "eplb-calibration/v1",
/// "multipliers": {"host": x, "backbone": x, "gemm": x, "link": x, "latency": x}, ...}`;
/// every multiplier must be present, finite and `>= 0`. Other keys (residuals, the fit's
/// inputs) are kept for people and ignored here. `Err` says what is wrong (lower case, no
/// trailing period), for the caller to prefix with the file's name.
pub fn parse(bytes: &[u8]) -> Result<Calibration, String> {
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not a JSON calibration file: {e}"))?;
    if v.get("format").and_then(Value::as_str) != Some(FORMAT) {
        return Err(format!("\"format\" must be \"{FORMAT}\""));
    }
    let m = v
        .get("multipliers")
        .and_then(Value::as_object)
        .ok_or_else(|| "\"multipliers\" must be an object".to_owned())?;
    let mut a = [0.0; 5];
    for (slot, name) in a.iter_mut().zip(Calibration::NAMES) {
        let x = m
            .get(name)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("multipliers.{name} must be a number"))?;
        if !(x.is_finite() && x >= 0.0) {
            return Err(format!(
                "multipliers.{name} must be a finite number >= 0, not {x}"
            ));
        }
        *slot = x;
    }
    Ok(Calibration::from_array(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_multipliers_and_names_what_is_wrong() {
        let ok = br#"{"format": "eplb-calibration/v1", "residuals": [],
            "multipliers": {"host": 2, "backbone": 1.5, "gemm": 1, "link": 0.5, "latency": 0}}"#;
        assert_eq!(
            parse(ok).unwrap(),
            Calibration::from_array([2.0, 1.5, 1.0, 0.5, 0.0])
        );
        for (doc, want) in [
            (&b"{"[..], "not a JSON calibration file"),
            (br#"{"format": "x"}"#, "\"format\" must be"),
            (
                br#"{"format": "eplb-calibration/v1"}"#,
                "\"multipliers\" must be an object",
            ),
            (
                br#"{"format": "eplb-calibration/v1", "multipliers": {"host": 1}}"#,
                "multipliers.backbone must be a number",
            ),
            (
                br#"{"format": "eplb-calibration/v1", "multipliers":
                    {"host": -1, "backbone": 1, "gemm": 1, "link": 1, "latency": 1}}"#,
                "multipliers.host must be a finite number >= 0",
            ),
        ] {
            let e = parse(doc).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }
}
