//! Policy parameters by name: the one parser that the CLI (`--param KEY=VALUE`), the config
//! (`eplb_policy_params`) and the Python package (`**params`) share.
//!
//! A value is a number (`f64`); each parameter checks its own range. An unknown name or a value
//! out of range is a [`ParamError`] that names the parameter.

use core::fmt;

use crate::PolicyKind;

/// One parameter a policy takes: its name and its accepted range, in words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamInfo {
    /// The name (`min_gain`).
    pub name: &'static str,
    /// The accepted values, for error messages (`">= 0"`).
    pub range: &'static str,
}

/// A parameter that could not be set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamError<'k> {
    /// The policy takes no parameter of this name.
    Unknown {
        /// The policy.
        policy: PolicyKind,
        /// The name given.
        key: &'k str,
    },
    /// The value is outside the parameter's range (or not finite).
    OutOfRange {
        /// The parameter.
        key: &'static str,
        /// The value given.
        value: f64,
        /// The accepted values.
        range: &'static str,
    },
}

impl fmt::Display for ParamError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamError::Unknown { policy, key } => {
                write!(
                    f,
                    "unknown parameter `{key}` for policy `{policy}` (it takes: "
                )?;
                let names = policy.params();
                if names.is_empty() {
                    f.write_str("none")?;
                }
                for (i, p) in names.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(p.name)?;
                }
                f.write_str(")")
            }
            ParamError::OutOfRange { key, value, range } => {
                write!(
                    f,
                    "parameter `{key}` = {value} is out of range (expected {range})"
                )
            }
        }
    }
}

/// The largest whole value a parameter takes (`2^53`, exact in `f64`).
const MAX_WHOLE: f64 = 9_007_199_254_740_992.0;

/// `value` if it is finite and `ok`, else the range error of `info`.
pub(crate) fn real(info: &ParamInfo, value: f64, ok: bool) -> Result<f64, ParamError<'static>> {
    if ok && value.is_finite() {
        Ok(value)
    } else {
        Err(ParamError::OutOfRange {
            key: info.name,
            value,
            range: info.range,
        })
    }
}

/// `value` as a whole number `>= min`, else the range error of `info`.
pub(crate) fn whole(info: &ParamInfo, value: f64, min: f64) -> Result<usize, ParamError<'static>> {
    // In range first, so that the cast is exact when the value is whole.
    let ok = value >= min && value <= MAX_WHOLE && (value as u64) as f64 == value;
    real(info, value, ok).map(|v| v as usize)
}

/// The entry of `key` in `table`, else the unknown-parameter error of `policy`.
pub(crate) fn find<'k>(
    table: &'static [ParamInfo],
    policy: PolicyKind,
    key: &'k str,
) -> Result<&'static ParamInfo, ParamError<'k>> {
    table
        .iter()
        .find(|p| p.name == key)
        .ok_or(ParamError::Unknown { policy, key })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AnyPolicy;
    use std::string::ToString;

    #[test]
    fn errors_name_the_parameter_and_its_range() {
        let mut p = AnyPolicy::new(PolicyKind::Incremental);
        let e = p.set_param("min_gainz", 1.0).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("unknown parameter `min_gainz` for policy `incremental` (it takes: min_gain, max_fetches,"),
            "{text}"
        );
        let e = p.set_param("max_fetches", 1.5).unwrap_err();
        assert_eq!(
            e.to_string(),
            "parameter `max_fetches` = 1.5 is out of range (expected an integer >= 0)"
        );
        assert_eq!(
            p.set_param("min_gain", f64::NAN).unwrap_err().to_string(),
            "parameter `min_gain` = NaN is out of range (expected >= 0)"
        );
        let mut s = AnyPolicy::new(PolicyKind::Swift);
        assert_eq!(
            s.set_param("partners", 3.0).unwrap_err().to_string(),
            "unknown parameter `partners` for policy `swift` (it takes: none)"
        );
        let mut r = AnyPolicy::new(PolicyKind::Random);
        assert!(r.set_param("swaps", -1.0).is_err());
        assert!(r.set_param("swaps", 0.0).is_ok());
    }

    #[test]
    fn every_listed_parameter_is_accepted_at_a_valid_value() {
        for kind in PolicyKind::ALL {
            for info in kind.params() {
                let mut p = AnyPolicy::new(kind);
                assert!(p.set_param(info.name, 1.0).is_ok(), "{kind} {}", info.name);
            }
        }
    }
}
