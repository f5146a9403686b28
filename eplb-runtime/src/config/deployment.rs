//! Deployment facts and the usage advisor: where EPLB is supported, and where it is not worth
//! its cost (`research/seed-usage-rules.md`).
//!
//! The serving engine (or `eplb check-config`) describes the deployment beside `eplb_config`:
//!
//! ```json
//! {"eplb_config": {...},
//!  "deployment": {"hardware": "A3", "quant_type": "W8A8", "fused_mc2": false, "role": "decode",
//!                 "input_len": 2048, "concurrency": 64, "experts_per_die": 16, "tokens_per_die": 256}}
//! ```
//!
//! Every key is optional; an unknown key or a value of the wrong type is an error naming the
//! key and the value ([`DeploymentError`]). [`Deployment::from_value`] parses the object, the
//! config keeps the result ([`crate::config::EplbConfig::deployment_facts`]).
//!
//! # Support table (errors)
//!
//! | quant type | hardware on which EPLB supports it |
//! | --- | --- |
//! | `W8A8`, `W8A8-Dynamic` | `A2`, `A3` |
//! | `W4A8`, only with fused MC2 (`fused_mc2: true`) | `A2`, `A3` |
//! | `MXFP4`, `MXFP8` | `950PR`, `950DT` |
//! | `none` (bf16 / fp16) | any, with a warning: unverified |
//!
//! `W4A8MXFP4`, `W4A16` and `W4A16MXFP4` are explicitly unsupported on the 950 products and are
//! not listed for A2 / A3 either, so they are errors everywhere. Any other pair not in the table
//! (W4A8 without fused MC2, W8A8 on 950, MXFP4 on A3, ...) is an error that names the supported
//! pairs ([`check_support`]). An absent `fused_mc2` counts as `false` (vLLM-Ascend's default).
//! Without `hardware` only the quant types that no hardware supports are errors.
//!
//! The support table applies whenever EPLB is on (static, dynamic or record mode). With EPLB off
//! the same finding is a warning ([`Advice::UnsupportedWhileOff`]): the engine serves such a
//! model fine, it just cannot turn EPLB on.
//!
//! # Usage advice (warnings)
//!
//! When the cycle runs (dynamic or record mode), [`Deployment::advice`] reports the seed's
//! not-recommended scenarios, each with its reason and the number that triggered it:
//! prefill nodes with inputs shorter than 1024 tokens; decode nodes with at most 8 experts per
//! die (16 on 950DT) or fewer than 128 tokens per die; `algorithm_execution_interval` below 50;
//! and the heat-stage advice (inputs above 1024 tokens: collect `prefill` heat; inputs of at
//! most 1024 tokens with concurrency above 1024: `decode` or `all`), given only when the
//! configured stage differs from it.

use core::fmt;
use core::str::FromStr;

use eplb_core::HeatStage;
use serde_json::{Map, Value};

use crate::config::{Mode, suggest};

/// The keys of the `deployment` object.
pub const KEYS: [&str; 8] = [
    "hardware",
    "quant_type",
    "fused_mc2",
    "role",
    "input_len",
    "concurrency",
    "experts_per_die",
    "tokens_per_die",
];

/// Prefill inputs shorter than this many tokens make EPLB not worth it; longer inputs suggest
/// the `prefill` heat stage.
pub const LONG_INPUT_TOKENS: u32 = 1024;
/// Concurrency above this (with inputs of at most [`LONG_INPUT_TOKENS`]) suggests the `decode`
/// or `all` heat stage.
pub const HIGH_CONCURRENCY: u32 = 1024;
/// Decode nodes with fewer tokens per die than this gain too little from EPLB.
pub const MIN_TOKENS_PER_DIE: u32 = 128;
/// The smallest recommended `algorithm_execution_interval` (balancing must not start during
/// warm-up).
pub const MIN_ALGO_INTERVAL: u32 = 50;

/// An Ascend product family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hardware {
    /// Atlas A2 (910B).
    A2,
    /// Atlas A3 (910C).
    A3,
    /// Ascend 950PR.
    Ascend950Pr,
    /// Ascend 950DT.
    Ascend950Dt,
}

impl Hardware {
    /// Every family, in table order.
    pub const ALL: [Hardware; 4] = [
        Hardware::A2,
        Hardware::A3,
        Hardware::Ascend950Pr,
        Hardware::Ascend950Dt,
    ];

    /// `A2`, `A3`, `950PR` or `950DT`.
    pub fn name(self) -> &'static str {
        match self {
            Hardware::A2 => "A2",
            Hardware::A3 => "A3",
            Hardware::Ascend950Pr => "950PR",
            Hardware::Ascend950Dt => "950DT",
        }
    }

    /// Whether this is an Ascend 950 product.
    pub fn is_950(self) -> bool {
        matches!(self, Hardware::Ascend950Pr | Hardware::Ascend950Dt)
    }

    /// The decode-node threshold: at most this many experts per die, EPLB is not recommended
    /// (16 on 950DT, else 8).
    pub fn few_experts_per_die(self) -> u32 {
        if self == Hardware::Ascend950Dt { 16 } else { 8 }
    }
}

impl fmt::Display for Hardware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of the accepted values, with what is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    /// What was being named (`hardware`, `quant type`, `role`).
    pub what: &'static str,
    /// The name given.
    pub got: String,
    /// The accepted names.
    pub expected: &'static [&'static str],
    /// The closest accepted name, if one is close enough to be a typo.
    pub suggestion: Option<&'static str>,
}

impl UnknownName {
    fn new(what: &'static str, got: &str, expected: &'static [&'static str]) -> Self {
        Self {
            what,
            got: got.to_owned(),
            expected,
            suggestion: suggest::closest(got, expected),
        }
    }
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown {} {:?}; expected one of {}",
            self.what,
            self.got,
            self.expected.join(", ")
        )?;
        match self.suggestion {
            Some(s) => write!(f, "; did you mean \"{s}\"?"),
            None => Ok(()),
        }
    }
}

impl core::error::Error for UnknownName {}

const HARDWARE_NAMES: [&str; 4] = ["A2", "A3", "950PR", "950DT"];

impl FromStr for Hardware {
    type Err = UnknownName;

    /// Case-insensitive; an `Ascend` prefix is accepted (`Ascend950DT`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let t = t
            .get(..6)
            .filter(|p| p.eq_ignore_ascii_case("ascend"))
            .and_then(|_| t.get(6..))
            .unwrap_or(t);
        Hardware::ALL
            .into_iter()
            .find(|h| h.name().eq_ignore_ascii_case(t))
            .ok_or_else(|| UnknownName::new("hardware", s, &HARDWARE_NAMES))
    }
}

/// The MoE quant type: one of the model facts of the time model's catalogue
/// ([`eplb_core::time::QuantType`]), re-exported where the deployment facts name it.
pub use eplb_core::time::QuantType;

const QUANT_NAMES: [&str; 9] = [
    "none",
    "W8A8",
    "W8A8-Dynamic",
    "W4A8",
    "MXFP4",
    "MXFP8",
    "W4A8MXFP4",
    "W4A16",
    "W4A16MXFP4",
];

/// The quant type named `s` ([`QuantType::from_name`]: case-insensitive, `_` counts as `-`,
/// vLLM's `W8A8_DYNAMIC`); an unknown name lists the quant types and suggests the closest.
pub fn parse_quant(s: &str) -> Result<QuantType, UnknownName> {
    QuantType::from_name(s).ok_or_else(|| UnknownName::new("quant type", s, &QUANT_NAMES))
}

/// Whether EPLB is explicitly unsupported with `q` on the 950 products.
pub fn unsupported_on_950(q: QuantType) -> bool {
    matches!(
        q,
        QuantType::W4A8Mxfp4 | QuantType::W4A16 | QuantType::W4A16Mxfp4
    )
}

/// What a node does in a disaggregated (or co-located) deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A prefill (P) node.
    Prefill,
    /// A decode (D) node.
    Decode,
    /// Prefill and decode on the same node.
    Colocated,
}

const ROLE_NAMES: [&str; 3] = ["prefill", "decode", "colocated"];

impl Role {
    /// Every role.
    pub const ALL: [Role; 3] = [Role::Prefill, Role::Decode, Role::Colocated];

    /// `prefill`, `decode` or `colocated`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Colocated => "colocated",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Role {
    type Err = UnknownName;

    /// Case-insensitive.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownName::new("role", s, &ROLE_NAMES))
    }
}

/// One problem with a `deployment` object, or an unsupported combination.
///
/// Messages are lower case, have no trailing period and name the key (as `deployment.<key>`)
/// and the value given.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeploymentError {
    /// `deployment` is not a JSON object.
    NotAnObject {
        /// The value given, as JSON.
        got: String,
    },
    /// A key the `deployment` object does not have.
    UnknownKey {
        /// The key given.
        key: String,
        /// The closest valid key, if one is close enough to be a typo.
        suggestion: Option<&'static str>,
    },
    /// A value of the wrong JSON type.
    WrongType {
        /// The key.
        key: &'static str,
        /// What the key takes.
        expected: &'static str,
        /// The value given, as JSON.
        got: String,
    },
    /// A name that is not an accepted value of the key.
    UnknownValue {
        /// The key.
        key: &'static str,
        /// What was wrong with the name.
        name: UnknownName,
    },
    /// An integer out of the key's range.
    OutOfRange {
        /// The key.
        key: &'static str,
        /// Smallest accepted value.
        min: u32,
        /// Largest accepted value.
        max: u32,
        /// The value given, as JSON.
        got: String,
    },
    /// EPLB does not support this quant type (on this hardware).
    Unsupported {
        /// The hardware, if known.
        hardware: Option<Hardware>,
        /// The quant type.
        quant: QuantType,
        /// Whether fused MC2 is on.
        fused_mc2: bool,
    },
}

/// The supported pairs, for messages.
const SUPPORTED_PAIRS: &str = "EPLB supports W8A8 and W8A8-Dynamic on A2/A3, W4A8 with fused MC2 (fused_mc2: true) on A2/A3, MXFP4 and MXFP8 on 950PR/950DT, and unquantised weights (unverified) anywhere";

impl fmt::Display for DeploymentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeploymentError::NotAnObject { got } => {
                write!(f, "deployment: must be a JSON object, got {got}")
            }
            DeploymentError::UnknownKey { key, suggestion } => {
                write!(f, "deployment: unknown key {key:?}")?;
                match suggestion {
                    Some(s) => write!(f, "; did you mean \"{s}\"?"),
                    None => write!(f, "; valid keys: {}", KEYS.join(", ")),
                }
            }
            DeploymentError::WrongType { key, expected, got } => {
                write!(f, "deployment.{key}: expected {expected}, got {got}")
            }
            DeploymentError::UnknownValue { key, name } => write!(f, "deployment.{key}: {name}"),
            DeploymentError::OutOfRange { key, min, max, got } => {
                write!(f, "deployment.{key}: must be in {min}..={max}, got {got}")
            }
            DeploymentError::Unsupported {
                hardware,
                quant,
                fused_mc2,
            } => {
                let mc2 = if *fused_mc2 {
                    "with fused MC2"
                } else {
                    "without fused MC2"
                };
                match hardware {
                    Some(h) => write!(
                        f,
                        "deployment: EPLB does not support quant_type {quant} {mc2} on {h}"
                    )?,
                    None => write!(
                        f,
                        "deployment: EPLB does not support quant_type {quant} {mc2} on any hardware"
                    )?,
                }
                let why = match quant {
                    q if unsupported_on_950(*q) => {
                        " (W4A8MXFP4, W4A16 and W4A16MXFP4 are explicitly unsupported on the 950 products and not supported on A2/A3)"
                    }
                    QuantType::W4A8 if !fused_mc2 => {
                        " (W4A8 needs fused MC2: set fused_mc2 to true)"
                    }
                    QuantType::W4A8 => " (W4A8 with fused MC2 is supported on A2/A3 only)",
                    QuantType::W8A8 | QuantType::W8A8Dynamic => " (supported on A2/A3 only)",
                    QuantType::Mxfp4 | QuantType::Mxfp8 => " (supported on the 950 products only)",
                    _ => "",
                };
                write!(f, "{why}; {SUPPORTED_PAIRS}")
            }
        }
    }
}

impl core::error::Error for DeploymentError {}

/// How well EPLB is supported for a combination that is not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// In the support table.
    Verified,
    /// Not in the table but expected to work (unquantised weights): warn.
    Unverified,
}

/// The hardware on which EPLB supports `quant` (with fused MC2 `fused_mc2`); empty when none
/// does. Unquantised weights run anywhere (unverified).
pub fn supported_hardware(quant: QuantType, fused_mc2: bool) -> &'static [Hardware] {
    const A: &[Hardware] = &[Hardware::A2, Hardware::A3];
    const B: &[Hardware] = &[Hardware::Ascend950Pr, Hardware::Ascend950Dt];
    match quant {
        QuantType::None => &Hardware::ALL,
        QuantType::W8A8 | QuantType::W8A8Dynamic => A,
        QuantType::W4A8 if fused_mc2 => A,
        QuantType::Mxfp4 | QuantType::Mxfp8 => B,
        QuantType::W4A8 | QuantType::W4A8Mxfp4 | QuantType::W4A16 | QuantType::W4A16Mxfp4 => &[],
    }
}

/// The support table: whether EPLB supports `quant` (fused MC2 `fused_mc2`) on `hardware`
/// (`None`: unknown, then only the quant types that no hardware supports are errors).
pub fn check_support(
    hardware: Option<Hardware>,
    quant: QuantType,
    fused_mc2: bool,
) -> Result<Support, DeploymentError> {
    let on = supported_hardware(quant, fused_mc2);
    let ok = match hardware {
        Some(h) => on.contains(&h),
        None => !on.is_empty(),
    };
    if !ok {
        return Err(DeploymentError::Unsupported {
            hardware,
            quant,
            fused_mc2,
        });
    }
    Ok(if quant == QuantType::None {
        Support::Unverified
    } else {
        Support::Verified
    })
}

/// The deployment facts that the advice needs; every field optional.
///
/// A plain record: build it with [`Deployment::from_value`] (the JSON object), field by field
/// (command-line flags), and combine with [`Deployment::merge`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deployment {
    /// `hardware`.
    pub hardware: Option<Hardware>,
    /// `quant_type` of the MoE experts.
    pub quant_type: Option<QuantType>,
    /// `fused_mc2`: whether fused MC2 is enabled (absent counts as `false`).
    pub fused_mc2: Option<bool>,
    /// `role` of the node.
    pub role: Option<Role>,
    /// `input_len`: typical input length in tokens.
    pub input_len: Option<u32>,
    /// `concurrency`: typical concurrent requests.
    pub concurrency: Option<u32>,
    /// `experts_per_die`: physical experts per die (`S`).
    pub experts_per_die: Option<u32>,
    /// `tokens_per_die`: tokens per die per forward (decode load).
    pub tokens_per_die: Option<u32>,
}

/// The value of an integer key, if the JSON value is an integer (floats and booleans are not).
fn integer(v: &Value) -> Option<i128> {
    let n = v.as_number()?;
    n.as_u64()
        .map(i128::from)
        .or_else(|| n.as_i64().map(i128::from))
}

/// A JSON value as text for a message, shortened to about 60 characters.
fn render(v: &Value) -> String {
    const MAX: usize = 60;
    let s = v.to_string();
    if s.chars().count() <= MAX {
        s
    } else {
        let mut t: String = s.chars().take(MAX - 3).collect();
        t.push_str("...");
        t
    }
}

fn name_of<T>(
    key: &'static str,
    expected: &'static str,
    parse: fn(&str) -> Result<T, UnknownName>,
    v: &Value,
    errs: &mut Vec<DeploymentError>,
) -> Option<T> {
    match v {
        Value::String(s) => match parse(s) {
            Ok(t) => Some(t),
            Err(name) => {
                errs.push(DeploymentError::UnknownValue { key, name });
                None
            }
        },
        other => {
            errs.push(DeploymentError::WrongType {
                key,
                expected,
                got: render(other),
            });
            None
        }
    }
}

fn count(key: &'static str, min: u32, v: &Value, errs: &mut Vec<DeploymentError>) -> Option<u32> {
    let Some(n) = integer(v) else {
        errs.push(DeploymentError::WrongType {
            key,
            expected: "an integer",
            got: render(v),
        });
        return None;
    };
    match u32::try_from(n) {
        Ok(n) if n >= min => Some(n),
        _ => {
            errs.push(DeploymentError::OutOfRange {
                key,
                min,
                max: u32::MAX,
                got: render(v),
            });
            None
        }
    }
}

impl Deployment {
    /// Parses a `deployment` object, reporting every problem (unknown keys, wrong types,
    /// unknown names, integers out of range). The support table is not applied here (it
    /// depends on whether EPLB is on): see [`Deployment::check_support`].
    ///
    /// Integers: `input_len`, `concurrency` and `experts_per_die` in `1..=u32::MAX`,
    /// `tokens_per_die` in `0..=u32::MAX`. A `null` value counts as absent.
    pub fn from_value(value: &Value) -> Result<Self, Vec<DeploymentError>> {
        let Some(obj) = value.as_object() else {
            return Err(vec![DeploymentError::NotAnObject { got: render(value) }]);
        };
        Self::from_object(obj)
    }

    fn from_object(obj: &Map<String, Value>) -> Result<Self, Vec<DeploymentError>> {
        let mut errs = Vec::new();
        for key in obj.keys() {
            if !KEYS.contains(&key.as_str()) {
                errs.push(DeploymentError::UnknownKey {
                    key: key.clone(),
                    suggestion: suggest::closest(key, &KEYS),
                });
            }
        }
        let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
        let mut d = Deployment::default();
        if let Some(v) = get("hardware") {
            d.hardware = name_of(
                "hardware",
                "a string (\"A2\", \"A3\", \"950PR\" or \"950DT\")",
                str::parse::<Hardware>,
                v,
                &mut errs,
            );
        }
        if let Some(v) = get("quant_type") {
            d.quant_type = name_of(
                "quant_type",
                "a quant type string",
                parse_quant,
                v,
                &mut errs,
            );
        }
        if let Some(v) = get("fused_mc2") {
            match v {
                Value::Bool(b) => d.fused_mc2 = Some(*b),
                other => errs.push(DeploymentError::WrongType {
                    key: "fused_mc2",
                    expected: "a boolean",
                    got: render(other),
                }),
            }
        }
        if let Some(v) = get("role") {
            d.role = name_of(
                "role",
                "a string (\"prefill\", \"decode\" or \"colocated\")",
                str::parse::<Role>,
                v,
                &mut errs,
            );
        }
        if let Some(v) = get("input_len") {
            d.input_len = count("input_len", 1, v, &mut errs);
        }
        if let Some(v) = get("concurrency") {
            d.concurrency = count("concurrency", 1, v, &mut errs);
        }
        if let Some(v) = get("experts_per_die") {
            d.experts_per_die = count("experts_per_die", 1, v, &mut errs);
        }
        if let Some(v) = get("tokens_per_die") {
            d.tokens_per_die = count("tokens_per_die", 0, v, &mut errs);
        }
        if errs.is_empty() { Ok(d) } else { Err(errs) }
    }

    /// Whether no fact is known.
    pub fn is_empty(&self) -> bool {
        *self == Deployment::default()
    }

    /// Overwrites the facts with those `overrides` knows (command-line flags over the file).
    pub fn merge(&mut self, overrides: &Deployment) {
        let o = *overrides;
        self.hardware = o.hardware.or(self.hardware);
        self.quant_type = o.quant_type.or(self.quant_type);
        self.fused_mc2 = o.fused_mc2.or(self.fused_mc2);
        self.role = o.role.or(self.role);
        self.input_len = o.input_len.or(self.input_len);
        self.concurrency = o.concurrency.or(self.concurrency);
        self.experts_per_die = o.experts_per_die.or(self.experts_per_die);
        self.tokens_per_die = o.tokens_per_die.or(self.tokens_per_die);
    }

    /// Whether fused MC2 is on (`false` when not given).
    pub fn fused_mc2(&self) -> bool {
        self.fused_mc2.unwrap_or(false)
    }

    /// The support table applied to these facts; `Ok(None)` when the quant type is unknown.
    pub fn check_support(&self) -> Result<Option<Support>, DeploymentError> {
        match self.quant_type {
            Some(q) => check_support(self.hardware, q, self.fused_mc2()).map(Some),
            None => Ok(None),
        }
    }

    /// The warnings for a config in `mode` with `algorithm_execution_interval` =
    /// `algo_interval` and heat stage `stage` (see the module docs). Nothing when `mode` is
    /// [`Mode::Off`] except [`Advice::UnsupportedWhileOff`]; the usage advice needs the cycle
    /// (dynamic or record).
    pub fn advice(&self, mode: Mode, algo_interval: u32, stage: HeatStage) -> Vec<Advice> {
        let mut out = Vec::new();
        let support = self.check_support();
        if mode == Mode::Off {
            if let Err(error) = support {
                out.push(Advice::UnsupportedWhileOff { error });
            }
            return out;
        }
        if let (Ok(Some(Support::Unverified)), Some(quant)) = (support, self.quant_type) {
            out.push(Advice::Unverified { quant });
        }
        if !mode.is_dynamic() {
            return out;
        }
        if algo_interval < MIN_ALGO_INTERVAL {
            out.push(Advice::ShortAlgoInterval { algo_interval });
        }
        if self.role == Some(Role::Prefill)
            && let Some(input_len) = self.input_len.filter(|&n| n < LONG_INPUT_TOKENS)
        {
            out.push(Advice::ShortPrefillInputs { input_len });
        }
        if self.role == Some(Role::Decode) {
            let limit = self.hardware.map_or(8, Hardware::few_experts_per_die);
            if let Some(experts_per_die) = self.experts_per_die.filter(|&n| n <= limit) {
                out.push(Advice::FewExpertsPerDie {
                    experts_per_die,
                    limit,
                    hardware: self.hardware,
                });
            }
            if let Some(tokens_per_die) = self.tokens_per_die.filter(|&n| n < MIN_TOKENS_PER_DIE) {
                out.push(Advice::LowDieLoad { tokens_per_die });
            }
        }
        if let Some(input_len) = self.input_len {
            if input_len > LONG_INPUT_TOKENS && stage != HeatStage::Prefill {
                out.push(Advice::HeatStage {
                    input_len,
                    concurrency: self.concurrency,
                    configured: stage,
                    suggested: "\"prefill\"",
                });
            } else if input_len <= LONG_INPUT_TOKENS
                && stage == HeatStage::Prefill
                && let Some(c) = self.concurrency.filter(|&c| c > HIGH_CONCURRENCY)
            {
                out.push(Advice::HeatStage {
                    input_len,
                    concurrency: Some(c),
                    configured: stage,
                    suggested: "\"decode\" or \"all\"",
                });
            }
        }
        out
    }

    /// The known facts as `key value` pairs separated by `, ` (`none known` when empty).
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if let Some(h) = self.hardware {
            parts.push(format!("hardware {h}"));
        }
        if let Some(q) = self.quant_type {
            parts.push(format!("quant_type {q}"));
        }
        if let Some(b) = self.fused_mc2 {
            parts.push(format!("fused_mc2 {b}"));
        }
        if let Some(r) = self.role {
            parts.push(format!("role {r}"));
        }
        for (k, v) in [
            ("input_len", self.input_len),
            ("concurrency", self.concurrency),
            ("experts_per_die", self.experts_per_die),
            ("tokens_per_die", self.tokens_per_die),
        ] {
            if let Some(v) = v {
                parts.push(format!("{k} {v}"));
            }
        }
        if parts.is_empty() {
            "none known".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// A usage recommendation: the deployment works, but EPLB may not pay off or is unverified.
///
/// `Display` gives the warning text: what, the number that triggered it, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Advice {
    /// EPLB is off, but the combination would be an error with EPLB on.
    UnsupportedWhileOff {
        /// The error it would be.
        error: DeploymentError,
    },
    /// Unquantised weights: not in the support table.
    Unverified {
        /// The quant type (`none`).
        quant: QuantType,
    },
    /// `algorithm_execution_interval` below [`MIN_ALGO_INTERVAL`].
    ShortAlgoInterval {
        /// The configured `A`.
        algo_interval: u32,
    },
    /// A prefill node with inputs shorter than [`LONG_INPUT_TOKENS`].
    ShortPrefillInputs {
        /// `input_len`.
        input_len: u32,
    },
    /// A decode node with at most 8 experts per die (16 on 950DT).
    FewExpertsPerDie {
        /// `experts_per_die`.
        experts_per_die: u32,
        /// The threshold applied (8, or 16 on 950DT).
        limit: u32,
        /// The hardware, if known.
        hardware: Option<Hardware>,
    },
    /// A decode node with fewer than [`MIN_TOKENS_PER_DIE`] tokens per die.
    LowDieLoad {
        /// `tokens_per_die`.
        tokens_per_die: u32,
    },
    /// The heat stage differs from the advice for this input length and concurrency.
    HeatStage {
        /// `input_len`.
        input_len: u32,
        /// `concurrency`, if known.
        concurrency: Option<u32>,
        /// `eplb_heat_collection_stage` as configured.
        configured: HeatStage,
        /// The suggested stage(s), quoted.
        suggested: &'static str,
    },
}

impl fmt::Display for Advice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Advice::UnsupportedWhileOff { error } => {
                write!(
                    f,
                    "{error} (EPLB is off now; enabling it would be an error)"
                )
            }
            Advice::Unverified { quant } => write!(
                f,
                "deployment.quant_type = {quant}: EPLB with unquantised (bf16/fp16) expert weights is not in vLLM-Ascend's support table; it should work but is unverified"
            ),
            Advice::ShortAlgoInterval { algo_interval } => write!(
                f,
                "eplb_config.algorithm_execution_interval = {algo_interval} is below {MIN_ALGO_INTERVAL}: balancing may start during warm-up"
            ),
            Advice::ShortPrefillInputs { input_len } => write!(
                f,
                "deployment: prefill node with input_len = {input_len} (shorter than {LONG_INPUT_TOKENS} tokens): EPLB is not recommended, the balancing gain may not cover its runtime cost"
            ),
            Advice::FewExpertsPerDie {
                experts_per_die,
                limit,
                hardware,
            } => {
                write!(
                    f,
                    "deployment: decode node with experts_per_die = {experts_per_die} (at most {limit}"
                )?;
                if *limit == 8 {
                    write!(f, "; 16 on 950DT")?;
                } else if let Some(h) = hardware {
                    write!(f, " on {h}")?;
                }
                write!(
                    f,
                    "): EPLB is not recommended, its gain and its cost are comparable here; benchmark first"
                )
            }
            Advice::LowDieLoad { tokens_per_die } => write!(
                f,
                "deployment: decode node with tokens_per_die = {tokens_per_die} (below {MIN_TOKENS_PER_DIE}): EPLB is not recommended, the balancing gain may not cover its runtime cost"
            ),
            Advice::HeatStage {
                input_len,
                concurrency,
                configured,
                suggested,
            } => {
                if *input_len > LONG_INPUT_TOKENS {
                    write!(
                        f,
                        "deployment: input_len = {input_len} (above {LONG_INPUT_TOKENS} tokens)"
                    )?;
                } else {
                    write!(
                        f,
                        "deployment: input_len = {input_len} (at most {LONG_INPUT_TOKENS} tokens) with concurrency = {} (above {HIGH_CONCURRENCY})",
                        concurrency.unwrap_or(0)
                    )?;
                }
                write!(
                    f,
                    ": start with eplb_config.eplb_heat_collection_stage = {suggested} (configured: \"{configured}\"); empirical advice, benchmark"
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for h in Hardware::ALL {
            assert_eq!(h.name().parse::<Hardware>(), Ok(h));
            assert_eq!(h.name().to_lowercase().parse::<Hardware>(), Ok(h));
        }
        assert_eq!("Ascend950DT".parse::<Hardware>(), Ok(Hardware::Ascend950Dt));
        for q in QuantType::ALL {
            assert_eq!(parse_quant(q.name()), Ok(q));
        }
        assert_eq!(parse_quant("W8A8_DYNAMIC"), Ok(QuantType::W8A8Dynamic));
        for r in Role::ALL {
            assert_eq!(r.name().parse::<Role>(), Ok(r));
        }
        let e = "A5".parse::<Hardware>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown hardware \"A5\"; expected one of A2, A3, 950PR, 950DT; did you mean \"A2\"?"
        );
    }
}
