//! The configuration `advise --config-out` writes, in the words of the engine that will run it.
//!
//! A recommended row is a policy, a heat interval `H`, an algorithm interval `A`, a redundant
//! count `X` and, when the row ran with the pay-off gate, the gate's time model (model,
//! hardware, role, tokens per rank, calibration) and the expert payload it priced moves with
//! (quant type, fused MC2). [`Advice::engine_config`] writes what the named [`Engine`] reads to
//! run that row:
//!
//! - [`Engine::Eplb`] (eplb's own runtime, `eplb.runtime.Runtime` in Python included): the
//!   `eplb_config` object as today; a gated row writes the wrapped form
//!   `{"eplb_config": {..., "eplb_payoff_gate": {model, hardware, role, tokens_per_rank[,
//!   calibration]}}, "deployment": {"quant_type", "fused_mc2"}}`, so that the runtime's gate
//!   ([`eplb_runtime::startup::payoff_gate`]) prices the same model, chip, role, tokens and
//!   expert bytes as the row. The document is checked by the runtime's own reader before it is
//!   returned (with the env guard [`EngineConfig::env`] states), so it passes `eplb
//!   check-config` as written.
//! - [`Engine::VllmAscend`] (MRv1 `dynamic_eplb`): `additional_config` with vLLM-Ascend's
//!   `eplb_config` keys (its policy types are 0..3; the type only chooses the load format: 3
//!   for flashlb, else 2) and `eplb_rs: {"policy": <name>, "params": {}}`, the setting under
//!   which eplb's plugin serves every type with the row's policy. Without `eplb_rs` vLLM-Ascend
//!   runs its own policy of that type (and an unknown type as its Random policy).
//! - [`Engine::Vllm`]: the flags `--enable-eplb` and `--eplb-config` (`window_size` = `H`,
//!   `step_interval` = `H + A`, `num_redundant_experts` = `X`, `policy` `default`), with
//!   `EPLB_POLICY` naming the row's policy for eplb's plugin.
//! - [`Engine::Sglang`]: `--enable-eplb`, `--ep-num-redundant-experts X`,
//!   `--eplb-rebalance-num-iterations H + A`, `--eplb-algorithm eplb_rs:<policy>`.
//!
//! vLLM and SGLang apply a placement when it is computed (no algorithm interval) and do not run
//! the pay-off gate: their documents carry a note saying what differs from the row. A gated
//! row is refused for every engine but eplb's; so is a setting the engine's configuration
//! cannot express (the gate's time model with `--hw-param`, `--model-param`, custom expert
//! sizes, the request shape or the `even` routing model), and a policy its plugin does not
//! serve (`deepseek` on vLLM-Ascend, which co-locates copies).

use eplb_core::metrics::Routing;
use eplb_policies::PolicyKind;
use eplb_runtime::config::{DYNAMIC_EPLB, EplbConfig};
use serde_json::{Value, json};

use super::{Advice, Setting};
use crate::SimError;
use crate::cost::CostBasis;
use crate::time::TimeSpec;

/// The serving engine a written configuration is for (`advise --engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Engine {
    /// eplb's own runtime (`eplb_config`; in Python `eplb.runtime.Runtime`).
    #[default]
    Eplb,
    /// vLLM with eplb's plugin (`--eplb-config`, `EPLB_POLICY`).
    Vllm,
    /// vLLM-Ascend MRv1 with eplb's plugin (`additional_config`: `eplb_config` and `eplb_rs`).
    VllmAscend,
    /// SGLang with eplb's plugin (`--eplb-algorithm eplb_rs:<policy>`).
    Sglang,
}

impl Engine {
    /// Every engine.
    pub const ALL: [Engine; 4] = [
        Engine::Eplb,
        Engine::Vllm,
        Engine::VllmAscend,
        Engine::Sglang,
    ];

    /// `eplb`, `vllm`, `vllm-ascend` or `sglang`.
    pub const fn name(self) -> &'static str {
        match self {
            Engine::Eplb => "eplb",
            Engine::Vllm => "vllm",
            Engine::VllmAscend => "vllm-ascend",
            Engine::Sglang => "sglang",
        }
    }

    /// The engine named `name` (ASCII case-insensitive; `vllm_ascend` too).
    pub fn from_name(name: &str) -> Option<Engine> {
        let n = name.trim().replace('_', "-");
        Engine::ALL
            .into_iter()
            .find(|e| e.name().eq_ignore_ascii_case(&n))
    }

    /// Whether the engine runs the pay-off gate (only eplb's runtime does).
    pub const fn runs_gate(self) -> bool {
        matches!(self, Engine::Eplb)
    }

    /// Whether the engine runs `policy` as advise simulated it: eplb's plugin refuses
    /// `deepseek` on vLLM-Ascend (its planner rejects co-located copies).
    pub fn runs(self, policy: PolicyKind) -> bool {
        !(self == Engine::VllmAscend && policy == PolicyKind::DeepSeek)
    }
}

/// What to give the engine: the document `--config-out` writes, the environment it needs and
/// what differs from the row.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// The engine.
    pub engine: Engine,
    /// The document written.
    pub document: Value,
    /// Environment variables the engine needs set, `(name, value)` (the env guard of dynamic
    /// EPLB, the plugin's policy selection).
    pub env: Vec<(&'static str, String)>,
    /// The engine's command-line flags that carry the document (vLLM, SGLang), as one line.
    pub flags: Option<String>,
    /// What the engine runs differently from the row (empty: it runs the row).
    pub notes: Vec<String>,
}

impl EngineConfig {
    /// `{"engine", "document", "env", "flags", "notes"}`.
    pub fn to_json(&self) -> Value {
        let env: serde_json::Map<String, Value> = self
            .env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(v.as_str())))
            .collect();
        json!({
            "engine": self.engine.name(),
            "document": self.document,
            "env": env,
            "flags": self.flags,
            "notes": self.notes,
        })
    }
}

/// Why a row cannot be written for an engine: `Err(SimError::Setting)` naming the flag.
fn refuse(engine: Engine, why: String) -> SimError {
    SimError::Setting {
        what: format!("--config-out for --engine {}", engine.name()),
        why,
    }
}

/// The flags of `spec` the runtime's gate cannot be told (it prices the step with the role's
/// defaults and the presets as they are).
fn inexpressible(spec: &TimeSpec, cost: &CostBasis, routing: Routing) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (k, v) in &spec.hw_params {
        out.push(format!("--hw-param {k}={v}"));
    }
    for (k, v) in &spec.model_params {
        out.push(format!("--model-param {k}={v}"));
    }
    if cost.preset.is_none() {
        out.push("--hidden/--intermediate (a custom model)".to_owned());
    }
    for (flag, given) in [
        ("--requests-per-rank", spec.requests_per_rank.is_some()),
        ("--context-tokens", spec.context_tokens.is_some()),
        ("--prompt-tokens", spec.prompt_tokens.is_some()),
        ("--tokens-per-request", spec.tokens_per_request.is_some()),
        ("--overlap", spec.overlap.is_some()),
    ] {
        if given {
            out.push(flag.to_owned());
        }
    }
    if routing != Routing::Log2Phy {
        out.push("--routing even (the runtime routes log2phy)".to_owned());
    }
    out
}

impl Advice {
    /// The configuration that runs the recommended row on `engine` (`{"dynamic_eplb": false}`,
    /// or the engine's "off", when nothing is recommended). `spec` is the time model's settings
    /// as given, `cost` the run's cost basis and `routing` its routing model: a gated row is
    /// written only when the runtime's gate can be told every one of them. See the module
    /// docs for each engine's document.
    pub fn engine_config(
        &self,
        engine: Engine,
        spec: &TimeSpec,
        cost: &CostBasis,
        routing: Routing,
    ) -> Result<EngineConfig, SimError> {
        let Some(row) = self.winner() else {
            return Ok(off(engine));
        };
        let s = row.setting;
        if !engine.runs(s.policy) {
            return Err(refuse(
                engine,
                format!(
                    "eplb's plugin does not serve the {} policy there; give --policies without it",
                    s.policy.name()
                ),
            ));
        }
        if s.payoff_gate && !engine.runs_gate() {
            return Err(refuse(
                engine,
                "the recommended row runs the pay-off gate, which only eplb's runtime runs; \
                 advise without --payoff-gate"
                    .to_owned(),
            ));
        }
        match engine {
            Engine::Eplb => self.eplb_document(&s, spec, cost, routing),
            Engine::VllmAscend => Ok(vllm_ascend(&s)),
            Engine::Vllm => Ok(vllm(&s)),
            Engine::Sglang => Ok(sglang(&s)),
        }
    }

    fn eplb_document(
        &self,
        s: &Setting,
        spec: &TimeSpec,
        cost: &CostBasis,
        routing: Routing,
    ) -> Result<EngineConfig, SimError> {
        let mut inner = s.eplb_config();
        let document = if s.payoff_gate {
            let missing = inexpressible(spec, cost, routing);
            if !missing.is_empty() {
                return Err(refuse(
                    Engine::Eplb,
                    format!(
                        "the recommended row's pay-off gate used {}, which eplb_payoff_gate cannot express (it takes a model and hardware preset, a role, tokens per rank and a calibration file)",
                        missing.join(", ")
                    ),
                ));
            }
            inner["eplb_payoff_gate"] = self.gate_object();
            json!({
                "eplb_config": inner,
                "deployment": {
                    "quant_type": cost.quant.name(),
                    "fused_mc2": cost.fused_mc2,
                },
            })
        } else {
            inner
        };
        // Checked by the runtime's reader, with the env guard the output states.
        let guard: [(&str, &str); 1] = [(DYNAMIC_EPLB, "1")];
        if let Err(errs) = EplbConfig::from_value(&document, &guard) {
            return Err(refuse(
                Engine::Eplb,
                format!(
                    "the runtime would refuse the configuration: {}",
                    errs.messages().join("; ")
                ),
            ));
        }
        let mut notes = Vec::new();
        if s.payoff_gate && self.time.model.ranks_per_node.is_none() {
            notes.push(format!(
                "the gate was estimated with {} ranks per node (the {} preset's node; --ranks-per-node not given): the runtime takes the engine's ranks per node",
                self.time.ranks_per_node_for(usize::from(self.ranks)),
                self.time.model.hardware.name
            ));
        }
        Ok(EngineConfig {
            engine: Engine::Eplb,
            document,
            env: vec![(DYNAMIC_EPLB, "1".to_owned())],
            flags: None,
            notes,
        })
    }
}

fn off(engine: Engine) -> EngineConfig {
    let (document, flags) = match engine {
        Engine::Eplb => (json!({"dynamic_eplb": false}), None),
        Engine::VllmAscend => (json!({"eplb_config": {"dynamic_eplb": false}}), None),
        Engine::Vllm | Engine::Sglang => (json!({"enable_eplb": false}), Some(String::new())),
    };
    EngineConfig {
        engine,
        document,
        env: Vec::new(),
        flags,
        notes: Vec::new(),
    }
}

/// The load format vLLM-Ascend feeds the policy: 3 (per-window loads) for flashlb, else 2.
fn vllm_ascend_type(p: PolicyKind) -> u8 {
    if p == PolicyKind::FlashLb { 3 } else { 2 }
}

fn vllm_ascend(s: &Setting) -> EngineConfig {
    let document = json!({
        "eplb_config": {
            "dynamic_eplb": true,
            "num_redundant_experts": s.redundant,
            "expert_heat_collection_interval": s.heat_interval,
            "algorithm_execution_interval": s.algo_interval,
            "eplb_policy_type": vllm_ascend_type(s.policy),
        },
        "eplb_rs": {"policy": s.policy.name(), "params": {}},
    });
    EngineConfig {
        engine: Engine::VllmAscend,
        flags: Some(format!("--additional-config '{document}'")),
        document,
        env: vec![(DYNAMIC_EPLB, "true".to_owned())],
        notes: vec![
            "eplb's Python package must be installed in the engine's environment: its plugin serves the policy named in eplb_rs (without it vLLM-Ascend runs its own policy of that type)".to_owned(),
        ],
    }
}

fn no_algo_interval(engine: &str, s: &Setting) -> String {
    format!(
        "{engine} applies a placement when it is computed: the row's algorithm interval ({} iterations) is folded into the rebalance period",
        s.algo_interval
    )
}

fn vllm(s: &Setting) -> EngineConfig {
    let eplb_config = json!({
        "window_size": s.heat_interval,
        "step_interval": s.heat_interval + s.algo_interval,
        "num_redundant_experts": s.redundant,
        "policy": "default",
    });
    EngineConfig {
        engine: Engine::Vllm,
        flags: Some(format!("--enable-eplb --eplb-config '{eplb_config}'")),
        document: json!({"enable_eplb": true, "eplb_config": eplb_config}),
        env: vec![("EPLB_POLICY", s.policy.name().to_owned())],
        notes: vec![
            no_algo_interval("vLLM", s),
            "vLLM's first rebalance comes after a quarter of step_interval".to_owned(),
        ],
    }
}

fn sglang(s: &Setting) -> EngineConfig {
    let algorithm = format!("eplb_rs:{}", s.policy.name());
    let period = s.heat_interval + s.algo_interval;
    EngineConfig {
        engine: Engine::Sglang,
        flags: Some(format!(
            "--enable-eplb --ep-num-redundant-experts {} --eplb-rebalance-num-iterations {period} --eplb-algorithm {algorithm}",
            s.redundant
        )),
        document: json!({
            "enable_eplb": true,
            "ep_num_redundant_experts": s.redundant,
            "eplb_rebalance_num_iterations": period,
            "eplb_algorithm": algorithm,
        }),
        env: Vec::new(),
        notes: vec![
            no_algo_interval("SGLang", s),
            format!(
                "SGLang's recorder keeps its own window, not the row's heat interval ({} iterations)",
                s.heat_interval
            ),
        ],
    }
}
