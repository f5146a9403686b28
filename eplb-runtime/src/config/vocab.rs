//! The config's vocabulary, below every other part of it: the keys of `eplb_config` and the
//! modes a config decides between (a leaf, so that [`deployment`](super::deployment) and the
//! errors name them without importing the module that parses the config).

/// The keys of `eplb_config`, in vLLM-Ascend's order (the extensions `eplb_policy_seed`,
/// `eplb_policy_params`, `eplb_payoff_gate` and the observability keys last).
pub const KEYS: [&str; 14] = [
    "dynamic_eplb",
    "expert_map_path",
    "expert_heat_collection_interval",
    "algorithm_execution_interval",
    "expert_map_record_path",
    "num_redundant_experts",
    "eplb_policy_type",
    "eplb_heat_collection_stage",
    "eplb_policy_seed",
    "eplb_policy_params",
    "eplb_payoff_gate",
    "eplb_metrics",
    "eplb_heat_record_path",
    "eplb_heat_record_max_bytes",
];

/// What the runtime does, as decided by the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// No EPLB: the default layout, no heat collection.
    Off,
    /// The initial placement is read from `expert_map_path`; no planner.
    Static,
    /// The whole cycle: collect heat, plan, move weights (seeded by `expert_map_path` if set).
    Dynamic,
    /// The cycle without weight moves: each cycle end writes the expert map to
    /// `expert_map_record_path`.
    Record,
}

impl Mode {
    /// `off`, `static`, `dynamic` or `record`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Static => "static",
            Mode::Dynamic => "dynamic",
            Mode::Record => "record",
        }
    }

    /// Whether the mode runs the cycle (and so needs the env guard).
    pub fn is_dynamic(self) -> bool {
        matches!(self, Mode::Dynamic | Mode::Record)
    }
}

impl core::fmt::Display for Mode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}
