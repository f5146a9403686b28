//! The `eplb_config`: vLLM-Ascend's EPLB keys, defaults, validation and env guards.
//!
//! The serving engine hands over its additional config as JSON, either wrapped,
//! `{"eplb_config": {...}, "deployment": {...}}`, or as the inner object alone. A document is the
//! wrapped form when its top level holds `eplb_config` or `deployment`; otherwise it is the inner
//! object. [`EplbConfig::from_json_str`] and [`EplbConfig::from_value`] parse it and validate it
//! as vLLM-Ascend does at start-up, and report **every** problem found ([`ConfigErrors`]), not
//! just the first. An [`EplbConfig`] that exists is valid.
//!
//! | key | default | takes |
//! | --- | --- | --- |
//! | `dynamic_eplb` | `false` | boolean; forced to `true` by `expert_map_record_path` |
//! | `expert_map_path` | `null` | path ending with `.json`, which exists, is readable and (with a validator) validates |
//! | `expert_map_record_path` | `null` | path ending with `.json` in an existing directory |
//! | `expert_heat_collection_interval` | 600 | integer `1..=u32::MAX` (`H`) |
//! | `algorithm_execution_interval` | 50 | integer `1..=u32::MAX` (`A`) |
//! | `num_redundant_experts` | 0 | integer `0..=65535` (`X`, used only when dynamic) |
//! | `eplb_policy_type` | 2 | integer `0..=4` or a name: `random`, `default`, `swift`, `flashlb`, `incremental`, `deepseek` |
//! | `eplb_policy_seed` | 0 | integer `0..=u64::MAX` (extension: seeds the random policy) |
//! | `eplb_policy_params` | `{}` | object of numbers: the policy's parameters by name (extension; `DESIGN.md`, "Policy parameters"), checked by the policy's own parser |
//! | `eplb_heat_collection_stage` | `"all"` | `"all"`, `"prefill"` or `"decode"` |
//! | `eplb_metrics` | `true` | boolean, or an object with any of `enabled` (boolean), `prefix` (a metric name prefix, default `"eplb"`) and `per_layer` (boolean, default `false`: `3 L` more series): the Prometheus metrics exported into the engine's registry (extension; [`crate::metrics`]) |
//! | `eplb_heat_record_path` | `null` | path of a file in an existing directory: rank 0 appends each cycle's heat there as an `eplb-trace/v1` line recording (extension; [`crate::heat_record`]) |
//! | `eplb_heat_record_max_bytes` | 1073741824 | integer `>= 1`: the recording stops growing at this size, with one log line (extension) |
//! | `eplb_payoff_gate` | `false` | boolean, or an object with any of `model` (a time-model preset: `deepseek-v3`, `kimi-k2`, `qwen3-235b`, `qwen3-30b`, `deepseek-v2-lite`, `mixtral-8x7b`), `hardware` (`A2`, `A3`, `950PR`, `950DT`, `H100`, `H200`, `B200`), `role` (`decode`, `prefill`), `tokens_per_rank` (a number in `(0, 2^20]`) and `calibration` (the path of an `eplb-calibration/v1` file, as `eplb calibrate --out` writes it; read with the config): moves a changed layer only when the time model says it pays over the next cycle (extension; [`PayoffGate`]) |
//!
//! Beside `eplb_config`, only `deployment` is accepted: the deployment facts of
//! [`crate::config::deployment`] (hardware, quant type, role, ...). It is kept raw
//! ([`EplbConfig::deployment`]) and parsed ([`EplbConfig::deployment_facts`]); its problems are
//! reported with the config's ([`ConfigError::Deployment`]), and so is a quant type that EPLB
//! does not support on the named hardware, when EPLB is on. Its usage advice joins
//! [`EplbConfig::warnings`], which are also logged (`log::warn!`) when a config is accepted.
//!
//! # Env guard
//!
//! Dynamic and record mode need `DYNAMIC_EPLB` = `true`/`1` (any case) or
//! `EXPERT_MAP_RECORD` = `true` (exactly); static mode needs none. The environment is an
//! argument ([`Env`]): [`ProcessEnv`] in production, a map or a slice of pairs in tests.
//!
//! # Map validation
//!
//! `expert_map_path` must end with `.json`, exist, be a file and be readable. Whether its content
//! is a valid expert map is decided by an optional [`MapValidator`] passed to
//! [`EplbConfig::from_value_with`] (the runtime plugs in `eplb-map`'s reader there); without one
//! only the file checks run. The path is resolved against the working directory, as in
//! vLLM-Ascend.
//!
//! # Model shape
//!
//! `(N + X) % R` is not checked by the config alone (the model shape is not known yet):
//! [`EplbConfig::check_shape`] does it as soon as `N` and `R` are known, with
//! `X = num_redundant_experts` when dynamic and 0 otherwise (vLLM-Ascend's rule), and the error
//! lists the nearest valid redundant counts. With `expert_map_path` the redundant count comes
//! from the file (its entries per layer minus `N`) and the configured one is ignored: build the
//! shape from the map instead.
//!
//! # Deviations from vLLM-Ascend 0.23
//!
//! - All problems are reported at once, each naming its key and value, instead of the first
//!   exception.
//! - Types are strict: `true` is not an integer (Python's `bool` is an `int`), `600.0` is not an
//!   integer, `"false"` is not a boolean (Python would take any truthy value for
//!   `dynamic_eplb`).
//! - Intervals below 1 are errors (vLLM-Ascend accepts 0, which hangs the cycle), and more
//!   than 65535 redundant experts too. Every numeric key is checked by its one rule in
//!   [`eplb_core::settings`], the rule the CLI flags and the Python package use.
//! - The env guard is a returned error, not an `assert` that `python -O` skips.
//! - A bare record file name works (vLLM-Ascend calls `os.makedirs("")`, which fails). The
//!   parent directory must exist (vLLM-Ascend creates it): validation has no side effect, and
//!   a mistyped directory is an error at start-up.
//! - `eplb_policy_type` also takes 4 (`incremental`) and names, including `deepseek`, and the
//!   numbers as strings (`"2"`); `eplb_policy_seed` is an extension key.
//! - Top-level keys other than `eplb_config` and `deployment` are errors.
//! - Dynamic EPLB on one rank is reported by [`EplbConfig::check_shape`] instead of an `assert`
//!   at layer construction.

pub mod deployment;
mod env;
mod error;
mod observe;
pub mod suggest;
mod vocab;

use core::fmt::Write as _;
use std::path::{Path, PathBuf};

use eplb_core::{HeatStage, Shape};
use eplb_policies::{AnyPolicy, PolicyKind};
use serde_json::{Map, Value};

use self::deployment::{Advice, Deployment};
use crate::policies::Param;

pub use env::{DYNAMIC_EPLB, EXPERT_MAP_RECORD, Env, ProcessEnv, env_guard_holds};
pub use error::{ConfigError, ConfigErrors};
pub use observe::{METRICS_KEYS, Observe};
pub use vocab::{KEYS, Mode};

/// The keys of an `eplb_payoff_gate` object.
pub const PAYOFF_GATE_KEYS: [&str; 5] = [
    "model",
    "hardware",
    "role",
    "tokens_per_rank",
    "calibration",
];

/// `eplb_payoff_gate`: the pay-off gate is on, with these time-model settings. Unset fields
/// come from the deployment facts (`hardware`, `role`, `tokens_per_die`) where those name
/// them, else the defaults: DeepSeek-V3 on A3, decode, the role's tokens per rank
/// (`docs/time-model.md`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PayoffGate {
    /// The model preset.
    pub model: Option<eplb_core::time::ModelSpec>,
    /// The hardware preset.
    pub hardware: Option<eplb_core::time::Hardware>,
    /// The role.
    pub role: Option<eplb_core::time::Role>,
    /// Tokens per iteration per rank.
    pub tokens_per_rank: Option<f64>,
    /// The calibration file (`eplb calibrate --out`) and its multipliers, read when the config
    /// was: the gate prices the step with them (`None`: the presets).
    pub calibration: Option<PayoffGateCalibration>,
}

/// `eplb_payoff_gate`'s `calibration`: the file named and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct PayoffGateCalibration {
    /// The `eplb-calibration/v1` file, as given.
    pub path: PathBuf,
    /// Its multipliers.
    pub multipliers: eplb_core::time::step::Calibration,
}

/// The keys accepted at the top level of the wrapped form.
pub const TOP_LEVEL_KEYS: [&str; 2] = ["eplb_config", "deployment"];

/// Default `expert_heat_collection_interval` (`H`), in counted iterations.
pub const DEFAULT_HEAT_INTERVAL: u32 = 600;
/// Default `algorithm_execution_interval` (`A`), in iterations.
pub const DEFAULT_ALGO_INTERVAL: u32 = 50;
/// Default `eplb_policy_type`: SwiftBalance (type 2).
pub const DEFAULT_POLICY: PolicyKind = PolicyKind::Swift;

/// Checks the content of an `expert_map_path` file; `Err` carries a description of the first
/// problem (lower case, no trailing period).
///
/// Called only after the path passed the file checks. The runtime passes `eplb-map`'s reader
/// here, in its lenient mode (static loading reads leniently: co-located copies are a warning,
/// not an error, so that any placement `eplb plan` writes can be read back).
pub type MapValidator<'a> = dyn Fn(&Path) -> Result<(), MapRejected> + 'a;

/// Why a [`MapValidator`] rejected a map: any error (a read error, an `eplb_map::Error`, ...).
pub type MapRejected = Box<dyn std::error::Error + Send + Sync>;

/// A validated `eplb_config`.
///
/// Build it with [`EplbConfig::from_json_str`], [`EplbConfig::from_value`] (or their `_with`
/// forms taking a [`MapValidator`]), [`EplbConfig::from_file`], or [`EplbConfig::default`]
/// (every key at its default: mode [`Mode::Off`]).
#[derive(Debug, Clone, PartialEq)]
pub struct EplbConfig {
    dynamic: bool,
    dynamic_given: bool,
    expert_map_path: Option<PathBuf>,
    expert_map_record_path: Option<PathBuf>,
    heat_interval: u32,
    algo_interval: u32,
    num_redundant_experts: u32,
    policy: PolicyKind,
    policy_seed: u64,
    policy_params: Vec<Param>,
    heat_stage: HeatStage,
    payoff_gate: Option<PayoffGate>,
    observe: Observe,
    deployment: Option<Value>,
    facts: Option<Deployment>,
}

impl Default for EplbConfig {
    fn default() -> Self {
        Self {
            dynamic: false,
            dynamic_given: false,
            expert_map_path: None,
            expert_map_record_path: None,
            heat_interval: DEFAULT_HEAT_INTERVAL,
            algo_interval: DEFAULT_ALGO_INTERVAL,
            num_redundant_experts: 0,
            policy: DEFAULT_POLICY,
            policy_seed: 0,
            policy_params: Vec::new(),
            heat_stage: HeatStage::All,
            payoff_gate: None,
            observe: Observe::default(),
            deployment: None,
            facts: None,
        }
    }
}

impl EplbConfig {
    /// Parses and validates a JSON document (wrapped or inner form) without a map validator.
    pub fn from_json_str(text: &str, env: &dyn Env) -> Result<Self, ConfigErrors> {
        Self::from_json_str_with(text, env, None)
    }

    /// Parses and validates a JSON document, checking `expert_map_path` with `map_validator`.
    pub fn from_json_str_with(
        text: &str,
        env: &dyn Env,
        map_validator: Option<&MapValidator<'_>>,
    ) -> Result<Self, ConfigErrors> {
        let value = parse_json(text)?;
        Self::from_value_with(&value, env, map_validator)
    }

    /// Reads, parses and validates a JSON file, checking `expert_map_path` with
    /// `map_validator` when given.
    pub fn from_file(
        path: &Path,
        env: &dyn Env,
        map_validator: Option<&MapValidator<'_>>,
    ) -> Result<Self, ConfigErrors> {
        let text = crate::fsio::read_bounded_to_string(path, crate::fsio::DEFAULT_INPUT_LIMIT)
            .map_err(|e| ConfigError::Io {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        Self::from_json_str_with(&text, env, map_validator)
    }

    /// Validates a parsed JSON value (wrapped or inner form) without a map validator.
    pub fn from_value(value: &Value, env: &dyn Env) -> Result<Self, ConfigErrors> {
        Self::from_value_with(value, env, None)
    }

    /// Validates a parsed JSON value, checking `expert_map_path` with `map_validator`.
    ///
    /// The parent directory of `expert_map_record_path` must exist; nothing is created.
    pub fn from_value_with(
        value: &Value,
        env: &dyn Env,
        map_validator: Option<&MapValidator<'_>>,
    ) -> Result<Self, ConfigErrors> {
        Self::from_value_with_deployment(value, env, map_validator, &Deployment::default())
    }

    /// [`EplbConfig::from_value_with`], with deployment facts from elsewhere (command-line
    /// flags) that override those of the document's `deployment` object before the support
    /// table is applied.
    ///
    /// Every accepted config's [`EplbConfig::warnings`] are logged with `log::warn!`.
    pub fn from_value_with_deployment(
        value: &Value,
        env: &dyn Env,
        map_validator: Option<&MapValidator<'_>>,
        overrides: &Deployment,
    ) -> Result<Self, ConfigErrors> {
        let mut p = Parser {
            errs: Vec::new(),
            cfg: Self::default(),
        };
        p.document(value, env, map_validator, overrides);
        match ConfigErrors::new(p.errs) {
            Some(errs) => Err(errs),
            None => {
                for w in p.cfg.warnings() {
                    log::warn!("eplb: {w}");
                }
                Ok(p.cfg)
            }
        }
    }

    /// [`EplbConfig::from_file`] with deployment facts that override the file's (see
    /// [`EplbConfig::from_value_with_deployment`]).
    pub fn from_file_with_deployment(
        path: &Path,
        env: &dyn Env,
        map_validator: Option<&MapValidator<'_>>,
        overrides: &Deployment,
    ) -> Result<Self, ConfigErrors> {
        Self::from_file_with_limit(
            path,
            crate::fsio::DEFAULT_INPUT_LIMIT,
            env,
            map_validator,
            overrides,
        )
    }

    /// [`EplbConfig::from_file_with_deployment`] with an input size limit other than
    /// [`crate::fsio::DEFAULT_INPUT_LIMIT`] for the config file (`eplb check-config
    /// --max-input-bytes`): a larger file, or one that is not a regular file, is refused before
    /// it is read.
    pub fn from_file_with_limit(
        path: &Path,
        limit: u64,
        env: &dyn Env,
        map_validator: Option<&MapValidator<'_>>,
        overrides: &Deployment,
    ) -> Result<Self, ConfigErrors> {
        let text =
            crate::fsio::read_bounded_to_string(path, limit).map_err(|e| ConfigError::Io {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        let value = parse_json(&text)?;
        Self::from_value_with_deployment(&value, env, map_validator, overrides)
    }

    /// What the runtime does: [`Mode::Record`] with a record path, else [`Mode::Dynamic`] when
    /// `dynamic_eplb` (seeded by `expert_map_path` if set), else [`Mode::Static`] with a map
    /// path, else [`Mode::Off`].
    pub fn mode(&self) -> Mode {
        if self.expert_map_record_path.is_some() {
            Mode::Record
        } else if self.dynamic {
            Mode::Dynamic
        } else if self.expert_map_path.is_some() {
            Mode::Static
        } else {
            Mode::Off
        }
    }

    /// `dynamic_eplb` as in effect: `true` when given or forced by a record path.
    pub fn dynamic(&self) -> bool {
        self.dynamic
    }

    /// `expert_map_path`: the initial placement to load.
    pub fn expert_map_path(&self) -> Option<&Path> {
        self.expert_map_path.as_deref()
    }

    /// `expert_map_record_path`: where record mode writes the expert map.
    pub fn expert_map_record_path(&self) -> Option<&Path> {
        self.expert_map_record_path.as_deref()
    }

    /// `expert_heat_collection_interval` (`H >= 1`): counted iterations of heat per cycle.
    pub fn heat_interval(&self) -> u32 {
        self.heat_interval
    }

    /// `algorithm_execution_interval` (`A >= 1`): iterations the planner gets.
    pub fn algo_interval(&self) -> u32 {
        self.algo_interval
    }

    /// `num_redundant_experts` as written (see [`EplbConfig::redundant_experts`] for the
    /// count in effect).
    pub fn num_redundant_experts(&self) -> u32 {
        self.num_redundant_experts
    }

    /// The redundant count `X` in effect without a map file: `num_redundant_experts` when
    /// dynamic, else 0. With `expert_map_path`, `X` comes from the file instead.
    pub fn redundant_experts(&self) -> u32 {
        if self.dynamic {
            self.num_redundant_experts
        } else {
            0
        }
    }

    /// `eplb_policy_type`.
    pub fn policy(&self) -> PolicyKind {
        self.policy
    }

    /// `eplb_policy_seed` (extension; seeds the random policy).
    pub fn policy_seed(&self) -> u64 {
        self.policy_seed
    }

    /// `eplb_policy_params` (extension), sorted by name: each one is known to
    /// [`EplbConfig::policy`] and in its range.
    pub fn policy_params(&self) -> &[Param] {
        &self.policy_params
    }

    /// The policy of [`EplbConfig::policy`] with [`EplbConfig::policy_params`] set.
    pub fn build_policy(&self) -> AnyPolicy {
        // Checked when the config was parsed; a failure here would be a bug, so it falls back
        // to the parameters that do apply.
        let mut p = AnyPolicy::new(self.policy);
        for (k, v) in &self.policy_params {
            let _ = p.set_param(k, *v);
        }
        p
    }

    /// `eplb_heat_collection_stage`.
    pub fn heat_stage(&self) -> HeatStage {
        self.heat_stage
    }

    /// `eplb_payoff_gate`: the gate's settings when it is on.
    pub fn payoff_gate(&self) -> Option<&PayoffGate> {
        self.payoff_gate.as_ref()
    }

    /// `eplb_metrics`, `eplb_heat_record_path`, `eplb_heat_record_max_bytes` (extensions).
    pub fn observe(&self) -> &Observe {
        &self.observe
    }

    /// The raw `deployment` object given beside `eplb_config`, as written.
    pub fn deployment(&self) -> Option<&Value> {
        self.deployment.as_ref()
    }

    /// The parsed deployment facts: the `deployment` object merged with any overrides;
    /// `None` when neither gave one.
    pub fn deployment_facts(&self) -> Option<&Deployment> {
        self.facts.as_ref()
    }

    /// The usage advice for this config and its deployment (see [`crate::config::deployment`]):
    /// `algorithm_execution_interval` below 50 and the deployment's not-recommended scenarios
    /// when the cycle runs, unverified quant types when EPLB is on, unsupported combinations
    /// while EPLB is off.
    pub fn advice(&self) -> Vec<Advice> {
        self.facts
            .unwrap_or_default()
            .advice(self.mode(), self.algo_interval, self.heat_stage)
    }

    /// Checks the config against the model: `experts` logical experts (`N`) on `ranks` EP ranks
    /// (`R`), and returns the one-layer [`Shape`] (use [`Shape::with_layers`] for the model's
    /// layer count).
    ///
    /// Uses `X = `[`EplbConfig::redundant_experts`]; `(N + X) % R != 0` is an error that lists
    /// the nearest valid redundant counts. Dynamic EPLB on one rank is an error. With
    /// `expert_map_path` the file decides `X`: build the shape from the map instead.
    pub fn check_shape(&self, experts: u16, ranks: u16) -> Result<Shape, ConfigError> {
        self.shape(1, experts, ranks)
    }

    /// [`EplbConfig::check_shape`] for `layers` MoE layers.
    pub fn shape(&self, layers: u16, experts: u16, ranks: u16) -> Result<Shape, ConfigError> {
        if self.dynamic && ranks == 1 {
            return Err(ConfigError::SingleRank);
        }
        let redundant = self.redundant_experts();
        Shape::from_redundant(layers, experts, ranks, redundant).map_err(|source| {
            ConfigError::Shape {
                redundant,
                dynamic: self.dynamic,
                experts,
                ranks,
                source,
            }
        })
    }

    /// The effective settings, one `key: value` per line (no trailing newline), for
    /// `eplb check-config`.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let mode = self.mode();
        let _ = writeln!(s, "mode: {mode}");
        let forced = if self.expert_map_record_path.is_some() && !self.dynamic_given {
            " (forced by expert_map_record_path)"
        } else {
            ""
        };
        let _ = writeln!(s, "dynamic_eplb: {}{forced}", self.dynamic);
        let _ = writeln!(
            s,
            "expert_map_path: {}",
            path_or_none(self.expert_map_path.as_deref())
        );
        let _ = writeln!(
            s,
            "expert_map_record_path: {}",
            path_or_none(self.expert_map_record_path.as_deref())
        );
        let _ = writeln!(s, "expert_heat_collection_interval: {}", self.heat_interval);
        let _ = writeln!(s, "algorithm_execution_interval: {}", self.algo_interval);
        let note = if self.num_redundant_experts == 0 {
            ""
        } else if !self.dynamic {
            " (ignored: dynamic_eplb is false)"
        } else if self.expert_map_path.is_some() {
            " (ignored: the expert map file decides)"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "num_redundant_experts: {}{note}",
            self.num_redundant_experts
        );
        match self.policy.number() {
            Some(n) => {
                let _ = writeln!(s, "eplb_policy_type: {n} ({})", self.policy);
            }
            None => {
                let _ = writeln!(s, "eplb_policy_type: {}", self.policy);
            }
        }
        let _ = writeln!(s, "eplb_policy_seed: {}", self.policy_seed);
        if !self.policy_params.is_empty() {
            let kv: Vec<String> = self
                .policy_params
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let _ = writeln!(s, "eplb_policy_params: {}", kv.join(", "));
        }
        let _ = writeln!(s, "eplb_heat_collection_stage: {}", self.heat_stage);
        // The observability keys, when not at their defaults.
        match &self.observe.metrics {
            None => {
                let _ = writeln!(s, "eplb_metrics: off");
            }
            Some(m) if *m != crate::metrics::MetricsSettings::default() => {
                let _ = writeln!(
                    s,
                    "eplb_metrics: prefix {:?}, per-layer series {}",
                    m.prefix,
                    if m.per_layer { "on" } else { "off" }
                );
            }
            Some(_) => {}
        }
        if let Some(p) = &self.observe.heat_record_path {
            let _ = writeln!(
                s,
                "eplb_heat_record_path: {} (at most {} bytes)",
                p.display(),
                self.observe.heat_record_max_bytes
            );
        }
        if let Some(g) = &self.payoff_gate {
            let or =
                |v: Option<String>| v.unwrap_or_else(|| "from the deployment or default".into());
            let _ = writeln!(
                s,
                "eplb_payoff_gate: on (model {}, hardware {}, role {}, tokens_per_rank {}, calibration {})",
                or(g.model.map(|m| m.name.to_owned())),
                or(g.hardware.map(|h| h.name.to_owned())),
                or(g.role.map(|r| r.name().to_owned())),
                or(g.tokens_per_rank.map(|t| t.to_string())),
                g.calibration.as_ref().map_or_else(
                    || "none (the presets)".to_owned(),
                    |c| c.path.display().to_string()
                ),
            );
        }
        let _ = write!(
            s,
            "deployment: {}",
            if self.deployment.is_some() || self.facts.is_some() {
                "given"
            } else {
                "none"
            }
        );
        s
    }

    /// Settings that are valid but probably not what was meant (lower case, no trailing
    /// period), for `eplb check-config` to print as warnings.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if !self.dynamic && self.num_redundant_experts > 0 {
            w.push(format!(
                "eplb_config.num_redundant_experts = {} is ignored because dynamic_eplb is false",
                self.num_redundant_experts
            ));
        }
        if self.dynamic && self.expert_map_path.is_some() && self.num_redundant_experts > 0 {
            w.push(format!(
                "eplb_config.num_redundant_experts = {} is ignored: the redundant count comes from expert_map_path",
                self.num_redundant_experts
            ));
        }
        if self.mode() == Mode::Static {
            w.push(
                "static EPLB is scheduled for removal upstream (vLLM-Ascend v0.25.1)".to_owned(),
            );
        }
        w.extend(self.advice().iter().map(ToString::to_string));
        w
    }
}

/// Reads an `eplb-calibration/v1` file for `eplb_payoff_gate`'s `calibration`: a regular,
/// readable file (not a FIFO or a device) of at most 1 MiB whose content
/// [`crate::calibration::parse`] accepts. `Err` says what is wrong.
fn read_calibration(path: &Path) -> Result<eplb_core::time::step::Calibration, String> {
    use std::io::Read;
    const MAX: u64 = 1 << 20;
    match std::fs::metadata(path) {
        Err(e) => return Err(e.to_string()),
        Ok(m) if m.is_dir() => return Err("is a directory".to_owned()),
        Ok(m) if !m.is_file() => {
            return Err("not a regular file (a FIFO, a device or a socket)".to_owned());
        }
        Ok(m) if m.len() > MAX => return Err(format!("larger than {MAX} bytes")),
        Ok(_) => {}
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX + 1).read_to_end(&mut bytes))
        .map_err(|e| e.to_string())?;
    crate::calibration::parse(&bytes)
}

fn path_or_none(p: Option<&Path>) -> String {
    match p {
        Some(p) => format!("{:?}", p.display().to_string()),
        None => "none".to_owned(),
    }
}

/// Parses a config document strictly: a leading UTF-8 byte order mark is skipped, serde's
/// reason is kept, and a key given twice in one object is an error (which one would count is a
/// guess: `"dynamic_eplb": true, "dynamic_eplb": false`).
fn parse_json(text: &str) -> Result<Value, ConfigError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json {
        line: e.line(),
        column: e.column(),
        message: json_message(&e),
    })?;
    if let Some(eplb_map::Error::DuplicateKey { line, column, key }) =
        eplb_map::json::duplicate_key(text.as_bytes())
    {
        return Err(ConfigError::Json {
            line,
            column,
            message: format!("duplicate key {key}"),
        });
    }
    Ok(value)
}

/// serde_json's message without its trailing " at line L column C".
fn json_message(e: &serde_json::Error) -> String {
    let full = e.to_string();
    match full.rfind(" at line ") {
        Some(i) => full.get(..i).unwrap_or(&full).to_owned(),
        None => full,
    }
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

fn static_key(key: &str) -> Option<&'static str> {
    KEYS.iter().copied().find(|k| *k == key)
}

/// The state of one validation: the config being filled in and the problems found.
struct Parser {
    errs: Vec<ConfigError>,
    cfg: EplbConfig,
}

impl Parser {
    fn document(
        &mut self,
        value: &Value,
        env: &dyn Env,
        map_validator: Option<&MapValidator<'_>>,
        overrides: &Deployment,
    ) {
        let Some(top) = value.as_object() else {
            self.errs.push(ConfigError::NotAnObject {
                key: None,
                got: render(value),
            });
            return;
        };
        let wrapped = TOP_LEVEL_KEYS.iter().any(|k| top.contains_key(*k));
        let empty = Map::new();
        let inner = if wrapped {
            for key in top.keys() {
                if TOP_LEVEL_KEYS.contains(&key.as_str()) {
                    continue;
                }
                self.errs.push(match static_key(key) {
                    Some(key) => ConfigError::MisplacedKey { key },
                    None => ConfigError::UnknownKey {
                        top_level: true,
                        key: key.clone(),
                        suggestion: suggest::closest(key, &TOP_LEVEL_KEYS),
                    },
                });
            }
            self.cfg.deployment = top.get("deployment").cloned();
            if let Some(v) = top.get("deployment") {
                match Deployment::from_value(v) {
                    Ok(d) => self.cfg.facts = Some(d),
                    Err(errs) => self
                        .errs
                        .extend(errs.into_iter().map(ConfigError::Deployment)),
                }
            }
            match top.get("eplb_config") {
                None => &empty,
                Some(Value::Object(m)) => m,
                Some(other) => {
                    self.errs.push(ConfigError::NotAnObject {
                        key: Some("eplb_config"),
                        got: render(other),
                    });
                    &empty
                }
            }
        } else {
            top
        };
        if !overrides.is_empty() {
            self.cfg
                .facts
                .get_or_insert_with(Deployment::default)
                .merge(overrides);
        }
        self.eplb_config(inner, env, map_validator);
    }

    fn eplb_config(
        &mut self,
        obj: &Map<String, Value>,
        env: &dyn Env,
        map_validator: Option<&MapValidator<'_>>,
    ) {
        for key in obj.keys() {
            if static_key(key).is_some() {
                continue;
            }
            if let Some(key) = TOP_LEVEL_KEYS.iter().copied().find(|k| k == key) {
                self.errs.push(ConfigError::NestedTopLevelKey { key });
                continue;
            }
            let suggestion =
                suggest::closest(key, &KEYS).or_else(|| suggest::closest(key, &TOP_LEVEL_KEYS));
            self.errs.push(ConfigError::UnknownKey {
                top_level: false,
                key: key.clone(),
                suggestion,
            });
        }

        if let Some(v) = obj.get("dynamic_eplb") {
            match v {
                Value::Bool(b) => {
                    self.cfg.dynamic = *b;
                    self.cfg.dynamic_given = *b;
                }
                other => self.wrong_type("dynamic_eplb", "a boolean", other),
            }
        }

        // Map path (§4): `.json`, exists, readable, validates.
        if let Some(path) = self.path("expert_map_path", obj)
            && self.map_file(&path, map_validator)
        {
            self.cfg.expert_map_path = Some(path);
        }

        // Record path: `.json`, not a directory; its parent is created at the end.
        let record_given = matches!(obj.get("expert_map_record_path"), Some(Value::String(_)));
        if record_given {
            self.cfg.dynamic = true;
        }
        if let Some(path) = self.path("expert_map_record_path", obj) {
            if path.is_dir() {
                self.errs.push(ConfigError::RecordPath {
                    path,
                    message: "is a directory".to_owned(),
                });
            } else {
                self.cfg.expert_map_record_path = Some(path);
            }
        }

        if let Some(h) = self.setting(
            "expert_heat_collection_interval",
            obj,
            eplb_core::settings::heat_interval,
        ) {
            self.cfg.heat_interval = h;
        }
        if let Some(a) = self.setting(
            "algorithm_execution_interval",
            obj,
            eplb_core::settings::algo_interval,
        ) {
            self.cfg.algo_interval = a;
        }
        if let Some(x) = self.setting(
            "num_redundant_experts",
            obj,
            eplb_core::settings::redundant_experts,
        ) {
            self.cfg.num_redundant_experts = x;
        }
        if let Some(v) = obj.get("eplb_policy_type") {
            self.policy(v);
        }
        if let Some(seed) = self.count("eplb_policy_seed", obj, u64::MAX) {
            self.cfg.policy_seed = seed;
        }
        if let Some(v) = obj.get("eplb_heat_collection_stage") {
            self.stage(v);
        }
        if let Some(v) = obj.get("eplb_policy_params") {
            self.policy_params(v);
        }
        if let Some(v) = obj.get("eplb_payoff_gate") {
            self.payoff_gate(v);
        }
        observe::parse(obj, &mut self.cfg.observe, &mut self.errs);

        if self.cfg.dynamic && !env_guard_holds(env) {
            self.errs.push(ConfigError::EnvGuard {
                record_path: if record_given {
                    obj.get("expert_map_record_path")
                        .and_then(Value::as_str)
                        .map(PathBuf::from)
                } else {
                    None
                },
                dynamic_eplb: env.var(DYNAMIC_EPLB),
                expert_map_record: env.var(EXPERT_MAP_RECORD),
            });
        }

        // The support table, once the mode is known: an error only when EPLB is on.
        if self.cfg.mode() != Mode::Off
            && let Some(facts) = &self.cfg.facts
            && let Err(e) = facts.check_support()
        {
            self.errs.push(ConfigError::Deployment(e));
        }

        if self.errs.is_empty() {
            self.check_record_dir();
        }
    }

    fn wrong_type(&mut self, key: &'static str, expected: &'static str, got: &Value) {
        self.errs.push(ConfigError::WrongType {
            key,
            expected,
            got: render(got),
        });
    }

    /// A path key: `null` or absent is `None`; a string must end with `.json`.
    fn path(&mut self, key: &'static str, obj: &Map<String, Value>) -> Option<PathBuf> {
        match obj.get(key)? {
            Value::Null => None,
            Value::String(s) => {
                let path = PathBuf::from(s);
                if s.ends_with(".json") {
                    Some(path)
                } else {
                    self.errs.push(ConfigError::NotJsonPath { key, path });
                    None
                }
            }
            other => {
                self.wrong_type(key, "a path string ending with \".json\", or null", other);
                None
            }
        }
    }

    /// Whether the map file exists, is a readable file and passes the validator.
    fn map_file(&mut self, path: &Path, map_validator: Option<&MapValidator<'_>>) -> bool {
        let unreadable = |message: String| ConfigError::MapUnreadable {
            path: path.to_owned(),
            message,
        };
        match std::fs::metadata(path) {
            Err(e) => {
                self.errs.push(unreadable(e.to_string()));
                return false;
            }
            Ok(m) if m.is_dir() => {
                self.errs.push(unreadable("is a directory".to_owned()));
                return false;
            }
            // Opening a FIFO would wait for a writer; a device may never end.
            Ok(m) if !m.is_file() => {
                self.errs.push(unreadable(
                    "not a regular file (a FIFO, a device or a socket)".to_owned(),
                ));
                return false;
            }
            Ok(_) => {}
        }
        if let Err(e) = std::fs::File::open(path) {
            self.errs.push(unreadable(e.to_string()));
            return false;
        }
        if let Some(validate) = map_validator
            && let Err(why) = validate(path)
        {
            self.errs.push(ConfigError::MapInvalid {
                path: path.to_owned(),
                message: why.to_string(),
            });
            return false;
        }
        true
    }

    /// An integer of the JSON value, if it is one (floats are not).
    fn integer(v: &Value) -> Option<i128> {
        let n = v.as_number()?;
        n.as_u64()
            .map(i128::from)
            .or_else(|| n.as_i64().map(i128::from))
    }

    /// An integer key checked by its one rule ([`eplb_core::settings`]).
    fn setting<T>(
        &mut self,
        key: &'static str,
        obj: &Map<String, Value>,
        rule: fn(i128) -> Result<T, eplb_core::SettingError>,
    ) -> Option<T> {
        let v = obj.get(key)?;
        let Some(n) = Self::integer(v) else {
            self.wrong_type(key, "an integer", v);
            return None;
        };
        match rule(n) {
            Ok(x) => Some(x),
            Err(error) => {
                self.errs.push(ConfigError::Setting { key, error });
                None
            }
        }
    }

    /// A count: `0..=max`.
    fn count(&mut self, key: &'static str, obj: &Map<String, Value>, max: u64) -> Option<u64> {
        let v = obj.get(key)?;
        let Some(n) = Self::integer(v) else {
            self.wrong_type(key, "an integer", v);
            return None;
        };
        if n < 0 {
            self.errs.push(ConfigError::Negative {
                key,
                got: i64::try_from(n).unwrap_or(i64::MIN),
            });
            return None;
        }
        match u64::try_from(n) {
            Ok(n) if n <= max => Some(n),
            _ => {
                self.errs.push(ConfigError::TooLarge {
                    key,
                    max,
                    got: render(v),
                });
                None
            }
        }
    }

    fn policy(&mut self, v: &Value) {
        let unknown = |suggestion| ConfigError::UnknownPolicy {
            got: render(v),
            suggestion,
        };
        match v {
            Value::Number(_) => match Self::integer(v) {
                Some(n) => match u64::try_from(n).ok().and_then(PolicyKind::from_number) {
                    Some(k) => self.cfg.policy = k,
                    None => self.errs.push(unknown(None)),
                },
                None => self.wrong_type("eplb_policy_type", "an integer 0..4 or a policy name", v),
            },
            Value::String(s) => match s.parse::<PolicyKind>() {
                Ok(k) => self.cfg.policy = k,
                Err(_) => {
                    let names = PolicyKind::ALL.map(PolicyKind::name);
                    self.errs.push(unknown(suggest::closest(s, &names)));
                }
            },
            other => self.wrong_type(
                "eplb_policy_type",
                "an integer 0..4 or a policy name",
                other,
            ),
        }
    }

    /// `eplb_policy_params`: an object of numbers, each checked by the policy's own parser
    /// (after `eplb_policy_type`, so against the chosen policy).
    fn payoff_gate(&mut self, v: &Value) {
        let m = match v {
            Value::Bool(false) => return,
            Value::Bool(true) => {
                self.cfg.payoff_gate = Some(PayoffGate::default());
                return;
            }
            Value::Object(m) => m,
            other => {
                self.wrong_type("eplb_payoff_gate", "a boolean or an object", other);
                return;
            }
        };
        let mut gate = PayoffGate::default();
        let bad = |message: String| ConfigError::PayoffGate { message };
        let mut errs = Vec::new();
        for (key, x) in m {
            let name = x.as_str();
            match key.as_str() {
                "model" => match name.and_then(eplb_core::time::ModelSpec::from_name) {
                    Some(spec) => gate.model = Some(spec),
                    None => errs.push(bad(format!(
                        "model: unknown model {}; expected one of {}",
                        render(x),
                        eplb_core::time::ModelSpec::ALL.map(|m| m.name).join(", ")
                    ))),
                },
                "hardware" => match name.and_then(eplb_core::time::Hardware::from_name) {
                    Some(hw) => gate.hardware = Some(hw),
                    None => errs.push(bad(format!(
                        "hardware: unknown hardware {}; expected one of {}",
                        render(x),
                        eplb_core::time::Hardware::ALL.map(|h| h.name).join(", ")
                    ))),
                },
                "role" => match name.and_then(eplb_core::time::Role::from_name) {
                    Some(role) => gate.role = Some(role),
                    None => errs.push(bad(format!(
                        "role: unknown role {}; expected \"decode\" or \"prefill\"",
                        render(x)
                    ))),
                },
                "tokens_per_rank" => match x.as_f64() {
                    Some(t) => match eplb_core::settings::tokens_per_rank(t) {
                        Ok(t) => gate.tokens_per_rank = Some(t),
                        Err(error) => errs.push(ConfigError::Setting {
                            key: "eplb_payoff_gate.tokens_per_rank",
                            error,
                        }),
                    },
                    None => errs.push(bad(format!(
                        "tokens_per_rank: expected a number, got {}",
                        render(x)
                    ))),
                },
                "calibration" => match name {
                    Some(p) if !p.is_empty() => match read_calibration(Path::new(p)) {
                        Ok(multipliers) => {
                            gate.calibration = Some(PayoffGateCalibration {
                                path: PathBuf::from(p),
                                multipliers,
                            });
                        }
                        Err(message) => errs.push(ConfigError::PayoffGateCalibration {
                            path: PathBuf::from(p),
                            message,
                        }),
                    },
                    _ => errs.push(bad(format!(
                        "calibration: expected the path of a calibration file (eplb calibrate --out), got {}",
                        render(x)
                    ))),
                },
                other => errs.push(bad(format!(
                    "unknown key {other:?}; expected one of {}{}",
                    PAYOFF_GATE_KEYS.join(", "),
                    suggest::closest(other, &PAYOFF_GATE_KEYS)
                        .map(|s| format!(" (did you mean {s:?}?)"))
                        .unwrap_or_default()
                ))),
            }
        }
        if errs.is_empty() {
            self.cfg.payoff_gate = Some(gate);
        }
        self.errs.append(&mut errs);
    }

    fn policy_params(&mut self, v: &Value) {
        let Value::Object(m) = v else {
            self.wrong_type("eplb_policy_params", "an object of numbers", v);
            return;
        };
        let mut params: Vec<Param> = Vec::with_capacity(m.len());
        for (key, x) in m {
            match x.as_f64() {
                Some(x) => params.push((key.clone(), x)),
                None => self.errs.push(ConfigError::PolicyParam {
                    message: format!("parameter `{key}`: expected a number, got {}", render(x)),
                }),
            }
        }
        // Sorted, so that the first error and the order of setting do not depend on the
        // object's order.
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let mut p = AnyPolicy::new(self.cfg.policy);
        for (key, x) in &params {
            if let Err(e) = p.set_param(key, *x) {
                self.errs.push(ConfigError::PolicyParam {
                    message: e.to_string(),
                });
            }
        }
        self.cfg.policy_params = params;
    }

    fn stage(&mut self, v: &Value) {
        match v {
            Value::String(s) => match s.parse::<HeatStage>() {
                Ok(st) => self.cfg.heat_stage = st,
                Err(_) => {
                    let names = HeatStage::ALL.map(HeatStage::name);
                    self.errs.push(ConfigError::UnknownStage {
                        got: s.clone(),
                        suggestion: suggest::closest(s, &names),
                    });
                }
            },
            other => self.wrong_type(
                "eplb_heat_collection_stage",
                "a string (\"all\", \"prefill\" or \"decode\")",
                other,
            ),
        }
    }

    /// Checks that the record path is not the map path and that its parent directory exists
    /// (nothing to check for a bare file name): a missing directory is an error at start-up,
    /// not a failed write at the first plan, and nothing is created.
    fn check_record_dir(&mut self) {
        let Some(path) = self.cfg.expert_map_record_path.as_deref() else {
            return;
        };
        // Recording over the map the run starts from would destroy it.
        if let Some(map) = self.cfg.expert_map_path.as_deref()
            && (map == path || crate::fsio::same_file(map, path))
        {
            self.errs.push(ConfigError::RecordPath {
                path: path.to_owned(),
                message: "is expert_map_path; recording would overwrite the map it starts from"
                    .to_owned(),
            });
            return;
        }
        let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else {
            return;
        };
        let problem = match std::fs::metadata(parent) {
            Ok(m) if m.is_dir() => return,
            Ok(_) => "is not a directory".to_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_owned(),
            Err(e) => e.to_string(),
        };
        self.errs.push(ConfigError::RecordPath {
            path: path.to_owned(),
            message: format!("directory {:?} {problem}", parent.display().to_string()),
        });
    }
}
