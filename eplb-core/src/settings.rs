//! One rule per numeric setting: the function that accepts or refuses a value, used by every
//! surface that takes it (the CLI's flags, the `eplb_config` reader and `eplb check-config`,
//! the runtime's start-up, the Python package), so a value is accepted or refused alike
//! everywhere, with the same message ([`SettingError`]; each surface prefixes where it read the
//! value: `--tokens-per-rank`, `eplb_config.eplb_payoff_gate.tokens_per_rank`, ...).
//!
//! The bounds are physical: a finite value beyond any batch, chip or model is refused rather
//! than carried into a 300-digit figure.
//!
//! | setting | accepted | why the bound |
//! | --- | --- | --- |
//! | tokens per rank | `(0, 2^20]` ([`MAX_TOKENS_PER_RANK`]) | DeepSeek's prefill runs 16K tokens per GPU; 2^20 tokens of one 7168-wide bf16 activation alone are 15 GB |
//! | a bandwidth (HBM, links, `--link`, reload) | `[1e6, 1e15]` bytes/s ([`MIN_BYTES_PER_S`], [`MAX_BYTES_PER_S`]) | 8 Mbit/s is below any datacentre link; 1 PB/s is 100x the fastest HBM (8 TB/s) |
//! | a compute peak | `[1e9, 1e18]` FLOP/s ([`MIN_FLOPS`], [`MAX_FLOPS`]); fp4 may be 0 (no fp4 units) | 1 EFLOP/s is 100x the fastest chip's fp4 peak (10 PFLOP/s) |
//! | a time (overheads, latencies, host) | `[0, 60000]` ms ([`MAX_MS`]) | one minute per layer or per collective stops any serving |
//! | heat and algorithm intervals | `1..=u32::MAX` iterations | zero never completes a cycle |
//! | redundant experts | `0..=65535` ([`MAX_REDUNDANT_EXPERTS`]) | a layer's slots are numbered in 16 bits |
//! | ranks | `1..=65535` | ranks are numbered in 16 bits |

use core::fmt;

/// The most tokens one rank processes in one iteration (`T`), `2^20`.
pub const MAX_TOKENS_PER_RANK: f64 = 1_048_576.0;
/// The slowest bandwidth accepted, bytes/s (8 Mbit/s).
pub const MIN_BYTES_PER_S: f64 = 1e6;
/// The fastest bandwidth accepted, bytes/s (1 PB/s).
pub const MAX_BYTES_PER_S: f64 = 1e15;
/// The lowest compute peak accepted, FLOP/s (1 GFLOP/s).
pub const MIN_FLOPS: f64 = 1e9;
/// The highest compute peak accepted, FLOP/s (1 EFLOP/s).
pub const MAX_FLOPS: f64 = 1e18;
/// The longest fixed time accepted (an overhead, a latency), ms: one minute.
pub const MAX_MS: f64 = 60_000.0;
/// The most redundant experts accepted: a layer's slots are numbered in 16 bits.
pub const MAX_REDUNDANT_EXPERTS: u32 = u16::MAX as u32;

/// A value as it was given, for a message.
#[derive(Debug, Clone, Copy)]
pub enum Number {
    /// An integer in `i64`.
    Int(i64),
    /// An integer above `i64::MAX`.
    Big(u64),
    /// A real number (also an integer beyond `u64`, rounded).
    Float(f64),
}

impl Number {
    /// `v` as a [`Number`]: exact up to `u64::MAX`.
    pub fn of_integer(v: i128) -> Number {
        if let Ok(i) = i64::try_from(v) {
            Number::Int(i)
        } else if let Ok(u) = u64::try_from(v) {
            Number::Big(u)
        } else {
            Number::Float(v as f64)
        }
    }
}

impl PartialEq for Number {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Number::Int(a), Number::Int(b)) => a == b,
            (Number::Big(a), Number::Big(b)) => a == b,
            (Number::Float(a), Number::Float(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

impl Eq for Number {}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Number::Int(i) => write!(f, "{i}"),
            Number::Big(u) => write!(f, "{u}"),
            // Plain between a thousandth and a billion, else in scientific notation: never a
            // 300-digit figure.
            Number::Float(x) if x == 0.0 || (x.abs() >= 1e-3 && x.abs() < 1e9) => write!(f, "{x}"),
            Number::Float(x) => write!(f, "{x:e}"),
        }
    }
}

/// A rule: what a value must be, and why the bound is there.
#[derive(Debug, PartialEq, Eq)]
pub struct Rule {
    /// What the value must be (`a number in (0, 1048576]`).
    pub must_be: &'static str,
    /// Why the bound is there.
    pub why: &'static str,
}

/// A numeric setting out of its range: which setting, the value and the rule it broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingError {
    /// The setting in words (`tokens per rank`, `heat interval`, `hardware HBM bandwidth`).
    pub setting: &'static str,
    /// The value refused.
    pub got: Number,
    /// The rule.
    pub rule: &'static Rule,
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} must be {}, got {}",
            self.setting, self.rule.must_be, self.got
        )?;
        if !self.rule.why.is_empty() {
            write!(f, " ({})", self.rule.why)?;
        }
        Ok(())
    }
}

impl core::error::Error for SettingError {}

const TOKENS: Rule = Rule {
    must_be: "a number in (0, 1048576]",
    why: "no batch puts more than 2^20 tokens on one rank in one iteration",
};
const BANDWIDTH: Rule = Rule {
    must_be: "a rate in [1e6, 1e15] bytes/s (8 Mbit/s to 8 Pbit/s)",
    why: "beyond any link or memory",
};
const FLOPS: Rule = Rule {
    must_be: "a rate in [1e9, 1e18] FLOP/s",
    why: "beyond any chip",
};
const FLOPS_OR_ZERO: Rule = Rule {
    must_be: "0 or a rate in [1e9, 1e18] FLOP/s",
    why: "beyond any chip",
};
const DURATION: Rule = Rule {
    must_be: "a time in [0, 60000] ms",
    why: "a minute per layer or per collective stops any serving",
};
const INTERVAL: Rule = Rule {
    must_be: "an integer in 1..=4294967295",
    why: "zero never completes a cycle",
};
const REDUNDANT: Rule = Rule {
    must_be: "an integer in 0..=65535",
    why: "a layer's slots are numbered in 16 bits",
};
const RANKS: Rule = Rule {
    must_be: "an integer in 1..=65535",
    why: "ranks are numbered in 16 bits",
};

fn float(
    setting: &'static str,
    v: f64,
    ok: bool,
    rule: &'static Rule,
) -> Result<f64, SettingError> {
    if ok && v.is_finite() {
        Ok(v)
    } else {
        Err(SettingError {
            setting,
            got: Number::Float(v),
            rule,
        })
    }
}

/// `T`, tokens per iteration per rank: `(0, 2^20]`.
pub fn tokens_per_rank(v: f64) -> Result<f64, SettingError> {
    float(
        "tokens per rank",
        v,
        v > 0.0 && v <= MAX_TOKENS_PER_RANK,
        &TOKENS,
    )
}

/// A bandwidth named `setting`, bytes/s: `[1e6, 1e15]`.
pub fn bytes_per_s(setting: &'static str, v: f64) -> Result<f64, SettingError> {
    float(
        setting,
        v,
        (MIN_BYTES_PER_S..=MAX_BYTES_PER_S).contains(&v),
        &BANDWIDTH,
    )
}

/// A compute peak named `setting`, FLOP/s: `[1e9, 1e18]`, or `0` when `zero_ok` (a chip
/// without fp4 units).
pub fn flops(setting: &'static str, v: f64, zero_ok: bool) -> Result<f64, SettingError> {
    let in_range = (MIN_FLOPS..=MAX_FLOPS).contains(&v);
    if zero_ok {
        float(setting, v, v == 0.0 || in_range, &FLOPS_OR_ZERO)
    } else {
        float(setting, v, in_range, &FLOPS)
    }
}

/// A fixed time named `setting` (an overhead, a latency), ms: `[0, 60000]`.
pub fn duration_ms(setting: &'static str, v: f64) -> Result<f64, SettingError> {
    float(setting, v, (0.0..=MAX_MS).contains(&v), &DURATION)
}

fn integer<T: TryFrom<i128>>(
    setting: &'static str,
    v: i128,
    min: i128,
    rule: &'static Rule,
) -> Result<T, SettingError> {
    let err = SettingError {
        setting,
        got: Number::of_integer(v),
        rule,
    };
    if v < min {
        return Err(err);
    }
    T::try_from(v).map_err(|_| err)
}

/// `H`, the heat interval, iterations: `1..=u32::MAX`.
pub fn heat_interval(v: i128) -> Result<u32, SettingError> {
    integer("heat interval", v, 1, &INTERVAL)
}

/// `A`, the algorithm interval, iterations: `1..=u32::MAX`.
pub fn algo_interval(v: i128) -> Result<u32, SettingError> {
    integer("algorithm interval", v, 1, &INTERVAL)
}

/// `X`, redundant experts per layer: `0..=65535`.
pub fn redundant_experts(v: i128) -> Result<u32, SettingError> {
    let x: u16 = integer("redundant experts", v, 0, &REDUNDANT)?;
    Ok(u32::from(x))
}

/// `R`, EP ranks: `1..=65535`.
pub fn ranks(v: i128) -> Result<u16, SettingError> {
    integer("ranks", v, 1, &RANKS)
}

/// Reads an integer setting from text (a flag's value) for one of the integer rules: the
/// text must be an integer (any sign, any size); `None` when it is not one.
pub fn parse_integer(s: &str) -> Option<i128> {
    s.trim().parse::<i128>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate std;
    use std::string::ToString;

    #[test]
    fn absurd_values_are_refused_with_short_messages() {
        let e = tokens_per_rank(1e300).unwrap_err().to_string();
        assert_eq!(
            e,
            "tokens per rank must be a number in (0, 1048576], got 1e300 (no batch puts more than 2^20 tokens on one rank in one iteration)"
        );
        assert!(tokens_per_rank(16384.0).is_ok());
        assert!(tokens_per_rank(0.0).is_err() && tokens_per_rank(f64::NAN).is_err());
        let e = bytes_per_s("link", 1e-300 * 1e9 / 8.0)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("link must be a rate in [1e6, 1e15] bytes/s"),
            "{e}"
        );
        assert!(e.contains("got 1.25e-292"), "{e}");
        assert!(bytes_per_s("link", 1.25e9).is_ok());
        assert_eq!(
            heat_interval(-1).unwrap_err().to_string(),
            "heat interval must be an integer in 1..=4294967295, got -1 (zero never completes a cycle)"
        );
        assert_eq!(heat_interval(600), Ok(600));
        assert!(algo_interval(1 << 40).is_err());
        assert_eq!(redundant_experts(0), Ok(0));
        assert!(redundant_experts(65_536).is_err());
        assert!(ranks(0).is_err() && ranks(65_536).is_err());
        assert_eq!(flops("hardware fp4 peak", 0.0, true), Ok(0.0));
        assert!(flops("hardware bf16 peak", 0.0, false).is_err());
        assert!(duration_ms("host overhead", -1.0).is_err());
        assert_eq!(parse_integer(" -3 "), Some(-3));
        assert_eq!(parse_integer("1.5"), None);
    }
}
