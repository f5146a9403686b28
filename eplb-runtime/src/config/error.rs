//! What can be wrong with an `eplb_config`, and the list of every problem found.

use core::fmt;
use std::path::PathBuf;

use super::env::{DYNAMIC_EPLB, EXPERT_MAP_RECORD};

/// One problem with an `eplb_config` (or with the model shape it is applied to).
///
/// Every message is lower case, has no trailing period and names the key (as
/// `eplb_config.<key>`) and the value it got.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The text is not JSON.
    Json {
        /// 1-based line of the syntax error.
        line: usize,
        /// 1-based column of the syntax error.
        column: usize,
        /// The parser's description.
        message: String,
    },
    /// A config file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's description.
        message: String,
    },
    /// The document, or the value of `eplb_config`, is not a JSON object.
    NotAnObject {
        /// `None` for the document itself, `Some("eplb_config")` for the inner object.
        key: Option<&'static str>,
        /// The value given, as JSON (shortened when long).
        got: String,
    },
    /// A key that `eplb_config` (or the document around it) does not have.
    UnknownKey {
        /// `true` for a key beside `eplb_config`, `false` for a key inside it.
        top_level: bool,
        /// The key given.
        key: String,
        /// The closest valid key, if one is close enough to be a typo.
        suggestion: Option<&'static str>,
    },
    /// An `eplb_config` key written beside `eplb_config` instead of inside it.
    MisplacedKey {
        /// The key given.
        key: &'static str,
    },
    /// `eplb_config` or `deployment` written inside `eplb_config` instead of beside it.
    NestedTopLevelKey {
        /// The key given.
        key: &'static str,
    },
    /// A value of the wrong JSON type (this includes `true` for an integer and `600.0` for an
    /// integer).
    WrongType {
        /// The key.
        key: &'static str,
        /// What the key takes.
        expected: &'static str,
        /// The value given, as JSON (shortened when long).
        got: String,
    },
    /// A numeric setting out of the range its one rule allows
    /// ([`eplb_core::settings`]: the CLI, `check-config`, the runtime and the Python package
    /// refuse the same value with the same words).
    Setting {
        /// The key's path (`expert_heat_collection_interval`, `eplb_payoff_gate.tokens_per_rank`).
        key: &'static str,
        /// The rule broken.
        error: eplb_core::SettingError,
    },
    /// A negative value for a count (`num_redundant_experts`, `eplb_policy_seed`).
    Negative {
        /// The key.
        key: &'static str,
        /// The value given.
        got: i64,
    },
    /// An integer larger than the key's type holds.
    TooLarge {
        /// The key.
        key: &'static str,
        /// The largest accepted value.
        max: u64,
        /// The value given, as JSON.
        got: String,
    },
    /// `eplb_policy_type` names no policy.
    UnknownPolicy {
        /// The value given, as JSON.
        got: String,
        /// The policy name closest to a string value, if one is close enough.
        suggestion: Option<&'static str>,
    },
    /// An entry of `eplb_policy_params` that the policy does not take, or a value out of range
    /// or not a number.
    PolicyParam {
        /// The policy parser's message, naming the parameter.
        message: String,
    },
    /// An observability key (`eplb_metrics`, `eplb_heat_record_path`,
    /// `eplb_heat_record_max_bytes`) holds an unknown key or value.
    Observe {
        /// The key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
    /// `eplb_payoff_gate` holds an unknown key or value.
    PayoffGate {
        /// What is wrong, naming the key.
        message: String,
    },
    /// `eplb_payoff_gate`'s `calibration` file cannot be read or is not an
    /// `eplb-calibration/v1` file.
    PayoffGateCalibration {
        /// The path given.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// `eplb_heat_collection_stage` names no stage.
    UnknownStage {
        /// The value given (the string itself).
        got: String,
        /// The closest stage name, if one is close enough.
        suggestion: Option<&'static str>,
    },
    /// A map path that does not end with `.json`.
    NotJsonPath {
        /// `expert_map_path` or `expert_map_record_path`.
        key: &'static str,
        /// The path given.
        path: PathBuf,
    },
    /// `expert_map_path` does not exist, is not a file or cannot be read.
    MapUnreadable {
        /// The path given.
        path: PathBuf,
        /// Why (the operating system's description, or "is a directory").
        message: String,
    },
    /// `expert_map_path` exists but the map validator rejected it.
    MapInvalid {
        /// The path given.
        path: PathBuf,
        /// The validator's description.
        message: String,
    },
    /// `expert_map_record_path` cannot be used: it is a directory, its parent directory does
    /// not exist, or it is `expert_map_path`.
    RecordPath {
        /// The path given.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// Dynamic or record mode without the environment variables vLLM-Ascend requires.
    EnvGuard {
        /// The record path when record mode asked for dynamic EPLB, `None` for
        /// `dynamic_eplb: true`.
        record_path: Option<PathBuf>,
        /// The value of `DYNAMIC_EPLB`, if set.
        dynamic_eplb: Option<String>,
        /// The value of `EXPERT_MAP_RECORD`, if set.
        expert_map_record: Option<String>,
    },
    /// Dynamic EPLB on a single rank (vLLM-Ascend: "EPLB must used in expert parallelism").
    SingleRank,
    /// The redundant count does not fit the model shape (`(N + X) % R != 0` and the other
    /// checks of [`eplb_core::Shape`]).
    Shape {
        /// The redundant count used: `num_redundant_experts` when dynamic, else 0.
        redundant: u32,
        /// Whether dynamic EPLB is on (otherwise the redundant count is 0 by rule).
        dynamic: bool,
        /// Logical experts `N`.
        experts: u16,
        /// EP ranks `R`.
        ranks: u16,
        /// The shape error, which lists the nearest valid redundant counts when `N + X` does
        /// not divide.
        source: eplb_core::Error,
    },
    /// A problem with the `deployment` object, or a quant type that EPLB does not support on
    /// the named hardware (with EPLB on); the message names the key or the combination.
    Deployment(crate::config::deployment::DeploymentError),
}

fn quoted(path: &std::path::Path) -> String {
    format!("{:?}", path.display().to_string())
}

fn suggestion(f: &mut fmt::Formatter<'_>, s: Option<&str>) -> fmt::Result {
    match s {
        Some(s) => write!(f, "; did you mean \"{s}\"?"),
        None => Ok(()),
    }
}

fn env_value(v: Option<&String>) -> String {
    match v {
        Some(v) => format!("{v:?}"),
        None => "unset".to_owned(),
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Json {
                line,
                column,
                message,
            } => write!(f, "invalid JSON at line {line}, column {column}: {message}"),
            ConfigError::Io { path, message } => {
                write!(f, "cannot read config file {}: {message}", quoted(path))
            }
            ConfigError::NotAnObject { key: None, got } => {
                write!(f, "the config must be a JSON object, got {got}")
            }
            ConfigError::NotAnObject {
                key: Some(key),
                got,
            } => {
                write!(f, "{key}: must be a JSON object, got {got}")
            }
            ConfigError::UnknownKey {
                top_level: true,
                key,
                suggestion: s,
            } => {
                write!(f, "unknown top-level key {key:?}")?;
                match s {
                    Some(_) => suggestion(f, *s),
                    None => write!(f, "; expected \"eplb_config\" or \"deployment\""),
                }
            }
            ConfigError::UnknownKey {
                top_level: false,
                key,
                suggestion: s,
            } => {
                write!(f, "eplb_config: unknown key {key:?}")?;
                match s {
                    Some(_) => suggestion(f, *s),
                    None => write!(f, "; valid keys: {}", super::KEYS.join(", ")),
                }
            }
            ConfigError::MisplacedKey { key } => write!(
                f,
                "unknown top-level key {key:?}; it belongs inside \"eplb_config\""
            ),
            ConfigError::NestedTopLevelKey { key } => write!(
                f,
                "eplb_config: unknown key {key:?}; it belongs at the top level, beside \"eplb_config\""
            ),
            ConfigError::WrongType { key, expected, got } => {
                write!(f, "eplb_config.{key}: expected {expected}, got {got}")
            }
            ConfigError::Setting { key, error } => write!(f, "eplb_config.{key}: {error}"),
            ConfigError::Negative { key, got } => {
                write!(f, "eplb_config.{key}: must be at least 0, got {got}")
            }
            ConfigError::TooLarge { key, max, got } => {
                write!(f, "eplb_config.{key}: must be at most {max}, got {got}")
            }
            ConfigError::UnknownPolicy { got, suggestion: s } => {
                write!(
                    f,
                    "eplb_config.eplb_policy_type: unknown policy {got}; expected 0..4 or one of "
                )?;
                let names: Vec<&str> = eplb_policies::PolicyKind::ALL
                    .iter()
                    .map(|k| k.name())
                    .collect();
                write!(f, "{}", names.join(", "))?;
                suggestion(f, *s)
            }
            ConfigError::PolicyParam { message } => {
                write!(f, "eplb_config.eplb_policy_params: {message}")
            }
            ConfigError::Observe { key, message } => {
                write!(f, "eplb_config.{key}: {message}")
            }
            ConfigError::PayoffGate { message } => {
                write!(f, "eplb_config.eplb_payoff_gate: {message}")
            }
            ConfigError::PayoffGateCalibration { path, message } => write!(
                f,
                "eplb_config.eplb_payoff_gate.calibration: {}: {message}",
                quoted(path)
            ),
            ConfigError::UnknownStage { got, suggestion: s } => {
                write!(
                    f,
                    "eplb_config.eplb_heat_collection_stage: unknown stage {got:?}; expected \"all\", \"prefill\" or \"decode\""
                )?;
                suggestion(f, *s)
            }
            ConfigError::NotJsonPath { .. }
            | ConfigError::MapUnreadable { .. }
            | ConfigError::MapInvalid { .. }
            | ConfigError::RecordPath { .. }
            | ConfigError::EnvGuard { .. } => self.fmt_files(f),
            ConfigError::SingleRank => write!(
                f,
                "eplb_config.dynamic_eplb = true needs expert parallelism (at least 2 ranks), got 1 rank"
            ),
            ConfigError::Shape {
                redundant,
                dynamic,
                experts,
                ranks,
                source,
            } => {
                if *dynamic {
                    write!(f, "eplb_config.num_redundant_experts = {redundant}")?;
                } else {
                    write!(f, "0 redundant experts (dynamic_eplb is false)")?;
                }
                write!(f, " with {experts} experts on {ranks} ranks: {source}")
            }
            ConfigError::Deployment(e) => write!(f, "{e}"),
        }
    }
}

impl ConfigError {
    /// The messages about files and the environment (maps, record paths, env guards).
    fn fmt_files(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NotJsonPath { key, path } => write!(
                f,
                "eplb_config.{key}: {} must end with \".json\"",
                quoted(path)
            ),
            ConfigError::MapUnreadable { path, message } => write!(
                f,
                "eplb_config.expert_map_path: cannot read {}: {message}",
                quoted(path)
            ),
            ConfigError::MapInvalid { path, message } => write!(
                f,
                "eplb_config.expert_map_path: {} is not a valid expert map: {message}",
                quoted(path)
            ),
            ConfigError::RecordPath { path, message } => write!(
                f,
                "eplb_config.expert_map_record_path: {}: {message}",
                quoted(path)
            ),
            ConfigError::EnvGuard {
                record_path,
                dynamic_eplb,
                expert_map_record,
            } => {
                match record_path {
                    Some(p) => write!(
                        f,
                        "eplb_config.expert_map_record_path = {} (record mode, dynamic EPLB)",
                        quoted(p)
                    )?,
                    None => write!(f, "eplb_config.dynamic_eplb = true")?,
                }
                write!(
                    f,
                    " needs the environment variable {DYNAMIC_EPLB}=true (or 1, any case) or {EXPERT_MAP_RECORD}=true; found {DYNAMIC_EPLB} {}, {EXPERT_MAP_RECORD} {}",
                    env_value(dynamic_eplb.as_ref()),
                    env_value(expert_map_record.as_ref())
                )
            }
            _ => Ok(()),
        }
    }
}

impl core::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            ConfigError::Shape { source, .. } => Some(source),
            ConfigError::Deployment(e) => Some(e),
            _ => None,
        }
    }
}

/// Every problem found in one config, in a stable order (document problems first, then the
/// keys in vLLM-Ascend's validation order). Never empty.
///
/// `Display` writes one problem per line; the CLI prints each as its own `error: ...` line via
/// [`ConfigErrors::problems`].
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigErrors {
    problems: Vec<ConfigError>,
}

impl ConfigErrors {
    /// Wraps a list of problems; `None` if it is empty.
    pub fn new(problems: Vec<ConfigError>) -> Option<Self> {
        if problems.is_empty() {
            None
        } else {
            Some(Self { problems })
        }
    }

    /// The problems, in the order found.
    pub fn problems(&self) -> &[ConfigError] {
        &self.problems
    }

    /// The problems, by value.
    pub fn into_problems(self) -> Vec<ConfigError> {
        self.problems
    }

    /// The number of problems (at least 1).
    pub fn len(&self) -> usize {
        self.problems.len()
    }

    /// Always `false`: there is at least one problem.
    pub fn is_empty(&self) -> bool {
        self.problems.is_empty()
    }

    /// Each problem's message.
    pub fn messages(&self) -> Vec<String> {
        self.problems.iter().map(ToString::to_string).collect()
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        Self { problems: vec![e] }
    }
}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.problems.into_iter()
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = core::slice::Iter<'a, ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.problems.iter()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl core::error::Error for ConfigErrors {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self.problems.as_slice() {
            [one] => Some(one),
            _ => None,
        }
    }
}
