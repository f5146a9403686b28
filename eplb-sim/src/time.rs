//! Time figures of a run: the serving-time model (`eplb_core::time`) applied after the fact to
//! the placements a run served (`docs/time-model.md`, "How the tools use the model").
//!
//! A [`TimeSpec`] (hardware preset, role, tokens per rank, overrides) is resolved against the
//! run's cost basis into a [`TimeBasis`]: the model's shape is the cost basis' model preset (the
//! one `--model` flag, the trace's model, or DeepSeek-V3), its compute dtype follows the quant
//! type, and one expert's bytes are the payload's. [`estimate`] then routes each window's
//! logical counts to the slots of the placement live in it (the simulator's own router and
//! routing rule) and prices every window with [`TimeModel::model_time`], and every cycle's
//! moves with the exchange stall and the collectives.
//!
//! **Windows and iterations.** One trace window stands for one iteration, as in the simulator
//! (its heat and algorithm intervals count windows): a window's counts give the shares of the
//! slots, and the tokens of that iteration are `tokens_per_rank` on every rank, whatever the
//! trace's `window_tokens`. Totals over windows are totals over iterations.

use eplb_core::Shape;
use eplb_core::settings::Number;
use eplb_core::time::step::{Calibration, MoeTerms, Overlap, StepModel, Topology};
use eplb_core::time::{Hardware, ModelSpec, Role, TimeModel, cycle_overhead_ms, layer_stall_ms};
use eplb_runtime::transfer::plan_transfers;
use serde_json::{Value, json};

use crate::Run;
use crate::SimError;
use crate::cost::{CostBasis, MoveCost};
use crate::simulate::{LogEntry, Router, SimConfig, SimPolicy, SimTrace};

/// The hardware preset when none is given.
pub const DEFAULT_HARDWARE: Hardware = Hardware::A3;

/// How fast a rank reads a lost expert's weights back when no live rank holds a copy (elastic
/// membership, `simulate --fail-rank`), in bytes/s: 25 GB/s, a host-to-device copy from pinned
/// host memory over a PCIe Gen4 x16 link (32 GB/s raw, about 80 % of it in practice). It is an
/// assumption, not a measurement: an Ascend A2/A3 host link is PCIe Gen5 x16 (faster), a read
/// from local NVMe storage is about 3 to 7 GB/s (slower). One number for every hardware preset;
/// `--hw-param reload_bytes_per_s=X` overrides it.
pub const DEFAULT_RELOAD_BYTES_PER_S: f64 = 25e9;

/// The `--hw-param` keys (the fields of [`Hardware`]; rates in FLOP/s and bytes/s, times in ms),
/// `reload_bytes_per_s` ([`DEFAULT_RELOAD_BYTES_PER_S`]) and the topology's numbers
/// ([`Topology`]: `domain_ranks`, `domain_bytes_per_s`, `link_efficiency`,
/// `a2a_latency_intra_ms`, `a2a_latency_inter_ms`, `host_ms`, `fused_mc2` 0 or 1,
/// `comm_sm_share` in `[0, 1)`).
pub const HW_PARAMS: [&str; 17] = [
    "flops_bf16",
    "flops_8bit",
    "flops_fp4",
    "hbm_bytes_per_s",
    "intra_node_bytes_per_s",
    "inter_node_bytes_per_s",
    "layer_overhead_ms",
    "collective_ms",
    "reload_bytes_per_s",
    "domain_ranks",
    "domain_bytes_per_s",
    "link_efficiency",
    "a2a_latency_intra_ms",
    "a2a_latency_inter_ms",
    "host_ms",
    "fused_mc2",
    "comm_sm_share",
];

/// The topology keys of [`HW_PARAMS`] (applied to the [`Topology`], not the [`Hardware`]).
const TOPOLOGY_PARAMS: [&str; 8] = [
    "domain_ranks",
    "domain_bytes_per_s",
    "link_efficiency",
    "a2a_latency_intra_ms",
    "a2a_latency_inter_ms",
    "host_ms",
    "fused_mc2",
    "comm_sm_share",
];

/// The `--model-param` keys (the numeric fields of [`ModelSpec`]).
pub const MODEL_PARAMS: [&str; 6] = [
    "hidden",
    "intermediate",
    "experts",
    "top_k",
    "moe_layers",
    "shared_experts",
];

/// What a time estimate is asked for (the command-line flags); unset fields take the defaults:
/// A3, decode, the role's tokens per rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TimeSpec {
    /// A hardware preset name (`Hardware::from_name`).
    pub hardware: Option<String>,
    /// The serving role.
    pub role: Option<Role>,
    /// Tokens per iteration per rank (`T`).
    pub tokens_per_rank: Option<f64>,
    /// Overrides of the hardware preset, `(key, value)` with keys of [`HW_PARAMS`].
    pub hw_params: Vec<(String, f64)>,
    /// Overrides of the model preset, `(key, value)` with keys of [`MODEL_PARAMS`].
    pub model_params: Vec<(String, f64)>,
    /// Requests per rank per step (default: `T` in decode, `T / prompt` in prefill).
    pub requests_per_rank: Option<f64>,
    /// Mean decode context, tokens (default 4096).
    pub context_tokens: Option<f64>,
    /// Prefill prompt length, tokens (default 4096).
    pub prompt_tokens: Option<f64>,
    /// Tokens per request per step in decode, 1 + MTP drafts (default 1).
    pub tokens_per_request: Option<f64>,
    /// Overlap mode (default none).
    pub overlap: Option<Overlap>,
    /// A fitted calibration and where it came from (`eplb calibrate`).
    pub calibration: Option<(String, Calibration)>,
}

/// A resolved [`TimeSpec`]: the model the estimates use and what names it.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeBasis {
    /// The MoE model (hardware, model shape, `T`, expert bytes, ranks per node as given).
    pub model: TimeModel,
    /// The whole-step model every estimate uses (its `time` is [`TimeBasis::model`]).
    pub step: StepModel,
    /// Where the calibration came from (`None`: the presets).
    pub calibration_source: Option<String>,
    /// The link weights move over when the user named one (`--link`, bytes/s): then the cost
    /// figures and the time model's exchanges use it both; `None`: the hardware's links (the
    /// all-to-all's).
    pub exchange_bytes_per_s: Option<f64>,
    /// The role.
    pub role: Role,
    /// Which of `hardware`, `role`, `tokens_per_rank` were defaulted.
    pub defaulted: Vec<&'static str>,
    /// How fast a rank reads a lost expert back from host memory, bytes/s
    /// ([`DEFAULT_RELOAD_BYTES_PER_S`] unless `--hw-param reload_bytes_per_s` says otherwise).
    pub reload_bytes_per_s: f64,
}

fn setting(what: &str, why: String) -> SimError {
    SimError::Setting {
        what: what.to_owned(),
        why,
    }
}

/// The hardware preset named `name`; an unknown name lists the valid ones.
pub fn parse_hardware(name: &str) -> Result<Hardware, SimError> {
    Hardware::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = Hardware::ALL.iter().map(|h| h.name).collect();
        setting(
            &format!("--hardware {name}"),
            format!("unknown hardware; expected one of {}", names.join(", ")),
        )
    })
}

/// The role named `name` (`decode` or `prefill`).
pub fn parse_role(name: &str) -> Result<Role, SimError> {
    Role::from_name(name).ok_or_else(|| {
        setting(
            &format!("--role {name}"),
            "unknown role; expected decode or prefill".to_owned(),
        )
    })
}

impl TimeSpec {
    /// Checks the names and values alone (before any input is read).
    pub fn check(&self) -> Result<(), SimError> {
        if let Some(h) = &self.hardware {
            parse_hardware(h)?;
        }
        if let Some(t) = self.tokens_per_rank {
            eplb_core::settings::tokens_per_rank(t)
                .map_err(|e| setting("--tokens-per-rank", e.to_string()))?;
        }
        let mut hw = DEFAULT_HARDWARE;
        for (k, v) in &self.hw_params {
            set_hw(&mut hw, k, *v)?;
        }
        self.reload_bytes_per_s()?;
        let mut m = ModelSpec::DEEPSEEK_V3;
        for (k, v) in &self.model_params {
            set_model(&mut m, k, *v)?;
        }
        let mut topo = Topology::for_hardware(&hw);
        for (k, v) in &self.hw_params {
            set_topology(&mut topo, k, *v)?;
        }
        for (flag, v) in [
            ("--requests-per-rank", self.requests_per_rank),
            ("--prompt-tokens", self.prompt_tokens),
            ("--tokens-per-request", self.tokens_per_request),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v > 0.0)
            {
                return Err(setting(flag, format!("{v} is not a finite number > 0")));
            }
        }
        if let Some(v) = self.context_tokens
            && !(v.is_finite() && v >= 0.0)
        {
            return Err(setting(
                "--context-tokens",
                format!("{v} is not a finite number >= 0"),
            ));
        }
        if let Some((src, c)) = &self.calibration {
            c.check().map_err(|e| setting(src, e.to_string()))?;
        }
        Ok(())
    }

    /// The model for a run of `cost` (its model preset, quant type and payload) on a cluster of
    /// `ranks_per_node` ranks per node (`None`: one node).
    pub fn resolve(
        &self,
        cost: &CostBasis,
        ranks_per_node: Option<u16>,
    ) -> Result<TimeBasis, SimError> {
        self.check()?;
        let mut defaulted = Vec::new();
        let mut hardware = match &self.hardware {
            Some(h) => parse_hardware(h)?,
            None => {
                defaulted.push("hardware");
                DEFAULT_HARDWARE
            }
        };
        for (k, v) in &self.hw_params {
            set_hw(&mut hardware, k, *v)?;
        }
        let mut model = match cost.preset {
            Some(p) => p,
            None => ModelSpec {
                name: "custom",
                label: "custom",
                aliases: &[],
                hidden: u32::try_from(cost.dims.hidden).unwrap_or(u32::MAX),
                intermediate: u32::try_from(cost.dims.intermediate).unwrap_or(u32::MAX),
                ..ModelSpec::DEEPSEEK_V3
            },
        };
        model.dtype = cost.quant.compute_dtype();
        for (k, v) in &self.model_params {
            set_model(&mut model, k, *v)?;
        }
        let role = self.role.unwrap_or_else(|| {
            defaulted.push("role");
            Role::Decode
        });
        let tokens_per_rank = self.tokens_per_rank.unwrap_or_else(|| {
            defaulted.push("tokens_per_rank");
            role.default_tokens_per_rank()
        });
        let tm = TimeModel {
            hardware,
            model,
            tokens_per_rank,
            expert_bytes: cost.payload.total_bytes() as f64,
            ranks_per_node,
        };
        tm.check()
            .map_err(|e| setting("time model", e.to_string()))?;
        let mut step = StepModel::new(tm, role);
        for (k, v) in &self.hw_params {
            set_topology(&mut step.topology, k, *v)?;
        }
        if ranks_per_node.is_none() {
            defaulted.push("ranks_per_node");
        }
        match role {
            Role::Decode => {
                match self.context_tokens {
                    Some(c) => step.context_tokens = c,
                    None => defaulted.push("context_tokens"),
                }
                match self.tokens_per_request {
                    Some(c) => step.tokens_per_request = c,
                    None => defaulted.push("tokens_per_request"),
                }
            }
            Role::Prefill => match self.prompt_tokens {
                Some(c) => step.prompt_tokens = c,
                None => defaulted.push("prompt_tokens"),
            },
        }
        step.requests_per_rank = match self.requests_per_rank {
            Some(b) => b,
            None => {
                defaulted.push("requests_per_rank");
                step.default_requests()
            }
        };
        step.overlap = self.overlap.unwrap_or_else(|| {
            defaulted.push("overlap");
            Overlap::None
        });
        if let Some((_, c)) = &self.calibration {
            step.calibration = *c;
        }
        step.check()
            .map_err(|e| setting("time model", e.to_string()))?;
        Ok(TimeBasis {
            model: tm,
            step,
            calibration_source: self.calibration.as_ref().map(|(s, _)| s.clone()),
            exchange_bytes_per_s: (!cost.defaulted.contains(&"link"))
                .then(|| cost.link.bytes_per_s()),
            role,
            defaulted,
            reload_bytes_per_s: self.reload_bytes_per_s()?,
        })
    }
}

impl TimeSpec {
    /// The reload bandwidth: the last `reload_bytes_per_s` override, else the default; an error
    /// unless it is a finite number > 0.
    pub fn reload_bytes_per_s(&self) -> Result<f64, SimError> {
        let v = self
            .hw_params
            .iter()
            .rev()
            .find(|(k, _)| k == "reload_bytes_per_s")
            .map_or(DEFAULT_RELOAD_BYTES_PER_S, |(_, v)| *v);
        eplb_core::settings::bytes_per_s("reload bandwidth", v).map_err(|e| {
            setting(
                &format!("--hw-param reload_bytes_per_s={}", Number::Float(v)),
                e.to_string(),
            )
        })
    }
}

fn set_topology(t: &mut Topology, key: &str, v: f64) -> Result<(), SimError> {
    let bad = |why: String| setting(&format!("--hw-param {key}={}", Number::Float(v)), why);
    match key {
        "domain_ranks" => {
            if !(v.is_finite() && v >= 1.0 && v.fract() == 0.0 && v <= f64::from(u16::MAX)) {
                return Err(bad("expected a whole number of ranks >= 1".to_owned()));
            }
            t.domain_ranks = v as u16;
        }
        "domain_bytes_per_s" => t.domain_bytes_per_s = v,
        "link_efficiency" => t.link_efficiency = v,
        "a2a_latency_intra_ms" => t.a2a_latency_intra_ms = v,
        "a2a_latency_inter_ms" => t.a2a_latency_inter_ms = v,
        "host_ms" => t.host_ms = v,
        "comm_sm_share" => t.comm_sm_share = v,
        "fused_mc2" => {
            if v != 0.0 && v != 1.0 {
                return Err(bad("expected 0 or 1".to_owned()));
            }
            t.fused_mc2 = v == 1.0;
        }
        _ => return Ok(()),
    }
    t.check().map_err(|e| bad(e.to_string()))
}

fn set_hw(hw: &mut Hardware, key: &str, v: f64) -> Result<(), SimError> {
    if TOPOLOGY_PARAMS.contains(&key) {
        // Not a field of the hardware preset: see `set_topology`.
        return Ok(());
    }
    if key == "reload_bytes_per_s" {
        // Not a field of the hardware preset: checked by `TimeSpec::reload_bytes_per_s`.
        return Ok(());
    }
    let slot = match key {
        "flops_bf16" => &mut hw.flops_bf16,
        "flops_8bit" => &mut hw.flops_8bit,
        "flops_fp4" => &mut hw.flops_fp4,
        "hbm_bytes_per_s" => &mut hw.hbm_bytes_per_s,
        "intra_node_bytes_per_s" => &mut hw.intra_node_bytes_per_s,
        "inter_node_bytes_per_s" => &mut hw.inter_node_bytes_per_s,
        "layer_overhead_ms" => &mut hw.layer_overhead_ms,
        "collective_ms" => &mut hw.collective_ms,
        _ => {
            return Err(setting(
                &format!("--hw-param {key}"),
                format!("unknown key; expected one of {}", HW_PARAMS.join(", ")),
            ));
        }
    };
    *slot = v;
    hw.check().map_err(|e| {
        setting(
            &format!("--hw-param {key}={}", Number::Float(v)),
            e.to_string(),
        )
    })
}

fn set_model(m: &mut ModelSpec, key: &str, v: f64) -> Result<(), SimError> {
    let bad = |why: &str| {
        setting(
            &format!("--model-param {key}={}", Number::Float(v)),
            why.to_owned(),
        )
    };
    if !(v.is_finite() && v >= 0.0 && v.fract() == 0.0) {
        return Err(bad("expected a whole number >= 0"));
    }
    match key {
        "hidden" | "intermediate" => {
            let x = u32::try_from(v as u64).map_err(|_| bad("too large"))?;
            if key == "hidden" {
                m.hidden = x;
            } else {
                m.intermediate = x;
            }
        }
        "experts" | "top_k" | "moe_layers" | "shared_experts" => {
            let x = u16::try_from(v as u64).map_err(|_| bad("too large"))?;
            match key {
                "experts" => m.experts = x,
                "top_k" => m.top_k = x,
                "moe_layers" => m.moe_layers = x,
                _ => m.shared_experts = x,
            }
        }
        _ => {
            return Err(setting(
                &format!("--model-param {key}"),
                format!("unknown key; expected one of {}", MODEL_PARAMS.join(", ")),
            ));
        }
    }
    Ok(())
}

impl TimeBasis {
    /// The pay-off gate of this model for a run of `cfg`: a changed layer must pay back its
    /// stall within the next cycle (`H + A` iterations, one window each) under `cfg`'s
    /// routing, and an exchange hides behind the whole step: the step model's time besides
    /// the MoE layers on `cfg.ranks` ranks, under this basis's calibration
    /// ([`eplb_core::time::gate::Gate::for_step`]).
    pub fn gate(&self, cfg: &SimConfig) -> Result<eplb_core::time::gate::Gate, SimError> {
        let mut step = self.step;
        step.time = self.model;
        eplb_core::time::gate::Gate::for_step(
            &step,
            usize::from(cfg.ranks),
            u64::from(cfg.heat_interval) + u64::from(cfg.algo_interval),
            cfg.routing,
        )
        .map_err(|error| SimError::TimeModel {
            window: None,
            layer: None,
            error,
        })
    }

    /// Ranks per node the step model assumes for `ranks` ranks (the `--ranks-per-node` given,
    /// else the hardware preset's node, at most `ranks`).
    pub fn ranks_per_node_for(&self, ranks: usize) -> usize {
        self.step.node_ranks(ranks)
    }

    /// The `topology` object: what the model assumed about where the ranks sit, for `ranks`
    /// ranks (`None`: not known yet).
    pub fn topology_json(&self, ranks: Option<usize>) -> Value {
        let t = &self.step.topology;
        let hw = &self.model.hardware;
        let mut v = json!({
            "hardware": hw.name,
            "ranks_per_node": self.model.ranks_per_node.unwrap_or(t.ranks_per_node),
            "ranks_per_node_source": if self.model.ranks_per_node.is_some() { "given" } else { "hardware preset" },
            "scale_up_domain_ranks": t.domain_ranks,
            "intra_node_bytes_per_s": hw.intra_node_bytes_per_s,
            "domain_bytes_per_s": t.domain_bytes_per_s,
            "scale_out_bytes_per_s": hw.inter_node_bytes_per_s,
            "link_efficiency": t.link_efficiency,
            "a2a_latency_intra_ms": t.a2a_latency_intra_ms,
            "a2a_latency_inter_ms": t.a2a_latency_inter_ms,
            "host_ms": t.host_ms,
            "fused_mc2": t.fused_mc2,
            "comm_sm_share": t.comm_sm_share,
            "a2a_kernel": match (t.fused_mc2, self.role) {
                (true, _) => "mc2",
                (false, Role::Decode) => "low-latency",
                (false, Role::Prefill) => "normal",
            },
        });
        if let Some(r) = ranks {
            let g = self.step.node_ranks(r);
            v["ranks"] = json!(r);
            v["nodes"] = json!(r.div_ceil(g.max(1)));
            v["ranks_per_node"] = json!(g);
            v["inter_node_link"] = json!(if r <= g {
                "none"
            } else if r <= usize::from(t.domain_ranks) {
                "scale-up domain"
            } else {
                "scale-out"
            });
            v["inter_node_bytes_per_s"] = json!(self.step.inter_node_bytes_per_s(r));
        }
        v
    }

    /// One line for people: the topology assumed for `ranks` ranks.
    pub fn describe_topology(&self, ranks: usize) -> String {
        let t = &self.step.topology;
        let g = self.step.node_ranks(ranks);
        let nodes = ranks.div_ceil(g.max(1));
        let link = if ranks <= g {
            "no link between nodes".to_owned()
        } else if ranks <= usize::from(t.domain_ranks) {
            format!(
                "nodes joined by the scale-up domain at {:.0} GB/s per rank",
                self.step.inter_node_bytes_per_s(ranks) / 1e9
            )
        } else {
            format!(
                "nodes joined by the scale-out link at {:.0} GB/s per rank",
                self.step.inter_node_bytes_per_s(ranks) / 1e9
            )
        };
        format!(
            "topology: {ranks} ranks = {nodes} node(s) of {g} ({}), {:.0} GB/s per rank inside a node at {:.0}% efficiency, {link}; all-to-all {} kernels, latency {} ms per phase inside a node, {} ms across nodes; overlap {}; host {} ms per step",
            if self.model.ranks_per_node.is_some() {
                "given"
            } else {
                "hardware preset: set --ranks-per-node"
            },
            self.model.hardware.intra_node_bytes_per_s / 1e9,
            t.link_efficiency * 100.0,
            match (t.fused_mc2, self.role) {
                (true, _) => "fused MC2",
                (false, Role::Decode) => "low-latency",
                (false, Role::Prefill) => "normal",
            },
            t.a2a_latency_intra_ms,
            t.a2a_latency_inter_ms,
            self.step.overlap.name(),
            t.host_ms
        )
    }

    /// The `time_model` object of `simulate --json`: hardware, model, role, tokens per rank,
    /// expert bytes, dtype, ranks per node, iterations per window, what was defaulted, every
    /// number of the hardware and the model, the topology, the request shape and the
    /// calibration.
    pub fn to_json(&self) -> Value {
        let tm = &self.model;
        let hw = &tm.hardware;
        let m = &tm.model;
        let st = &self.step;
        json!({
            "hardware": hw.name,
            "model": m.name,
            "role": self.role.name(),
            "tokens_per_rank": tm.tokens_per_rank,
            "expert_bytes": tm.expert_bytes,
            "dtype": m.dtype.name(),
            "ranks_per_node": tm.ranks_per_node,
            "iterations_per_window": 1,
            "defaulted": self.defaulted,
            "hardware_params": {
                "flops_bf16": hw.flops_bf16,
                "flops_8bit": hw.flops_8bit,
                "flops_fp4": hw.flops_fp4,
                "hbm_bytes_per_s": hw.hbm_bytes_per_s,
                "intra_node_bytes_per_s": hw.intra_node_bytes_per_s,
                "inter_node_bytes_per_s": hw.inter_node_bytes_per_s,
                "layer_overhead_ms": hw.layer_overhead_ms,
                "collective_ms": hw.collective_ms,
            },
            "model_params": {
                "hidden": m.hidden,
                "intermediate": m.intermediate,
                "experts": m.experts,
                "top_k": m.top_k,
                "moe_layers": m.moe_layers,
                "shared_experts": m.shared_experts,
                "layers": st.arch.layers,
            },
            "topology": self.topology_json(None),
            "step": {
                "requests_per_rank": st.requests_per_rank,
                "context_tokens": st.context_tokens,
                "prompt_tokens": st.prompt_tokens,
                "tokens_per_request": st.tokens_per_request,
                "overlap": st.overlap.name(),
            },
            "calibration": {
                "source": self.calibration_source,
                "multipliers": Calibration::NAMES.iter().zip(st.calibration.as_array())
                    .map(|(k, v)| ((*k).to_owned(), json!(v)))
                    .collect::<serde_json::Map<String, Value>>(),
            },
            "baseline": BASELINE,
            "exchange_link": match self.exchange_bytes_per_s {
                Some(bw) => json!({"source": "--link", "bytes_per_s": bw}),
                None => json!({"source": "hardware links (the all-to-all's)"}),
            },
        })
    }

    /// One line for people: hardware, model, role, `T`, expert size, request shape.
    pub fn describe(&self) -> String {
        let tm = &self.model;
        let st = &self.step;
        let shape = match self.role {
            Role::Decode => format!(
                "{:.0} requests per rank of {:.0} context tokens, {} token(s) per request per step",
                st.requests_per_rank, st.context_tokens, st.tokens_per_request
            ),
            Role::Prefill => format!(
                "{:.2} prompts per rank of {:.0} tokens",
                st.requests_per_rank, st.prompt_tokens
            ),
        };
        let mut s = format!(
            "time model: {} on {} ({} ms per layer overhead), {} {}, {} tokens per rank per iteration, {}, {:.1} MB per expert, one window = one iteration, savings as a share of the whole step against {}",
            tm.model.name,
            tm.hardware.name,
            tm.hardware.layer_overhead_ms,
            self.role.name(),
            tm.model.dtype.name(),
            tm.tokens_per_rank,
            shape,
            tm.expert_bytes / 1e6,
            BASELINE
        );
        match &self.calibration_source {
            Some(src) => s.push_str(&format!(", calibrated from {src}")),
            None => s.push_str(", uncalibrated"),
        }
        if !self.defaulted.is_empty() {
            s.push_str(&format!(
                " [default {}: set --hardware/--role/--tokens-per-rank/--ranks-per-node/--context-tokens/--prompt-tokens/--tokens-per-request/--overlap]",
                self.defaulted.join(", ")
            ));
        }
        s
    }

    /// The saving band's corners: `(low-saving, high-saving)` calibrations around the basis'
    /// own. Low: the terms EPLB changes (routed GEMM, a2a bandwidth) fast, the rest slow; high:
    /// the reverse.
    pub fn saving_corners(&self) -> (Calibration, Calibration) {
        let c = self.step.calibration;
        let (fast, slow) = c.band(self.calibration_source.is_some());
        let low = Calibration {
            gemm: fast.gemm,
            link: fast.link,
            latency: slow.latency,
            backbone: slow.backbone,
            host: slow.host,
        };
        let high = Calibration {
            gemm: slow.gemm,
            link: slow.link,
            latency: fast.latency,
            backbone: fast.backbone,
            host: fast.host,
        };
        (low, high)
    }
}

/// The deployment every saving is measured against: no EPLB, the static placement without
/// redundant experts (the fewest the shape allows).
pub const BASELINE: &str = "static placement, no redundant experts (no EPLB)";

/// The stall one cycle's moves add.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CycleStall {
    /// The cycle (log entry index, 1-based).
    pub cycle: usize,
    /// The first window its placement serves.
    pub window: usize,
    /// Layers whose placement changed.
    pub changed_layers: usize,
    /// Its stall, ms: the digest plus, per changed layer, the vote and the exchange beyond one
    /// iteration.
    pub ms: f64,
}

/// The time of every window of a run under one placement sequence.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WindowTimes {
    /// The whole step (iteration), ms.
    pub step_ms: Vec<f64>,
    /// Its MoE part (routed GEMM plus all-to-all, before overlap), ms.
    pub moe_ms: Vec<f64>,
    /// The step at the band's low-saving corner ([`TimeBasis::saving_corners`]), ms.
    pub low_ms: Vec<f64>,
    /// The step at the band's high-saving corner, ms.
    pub high_ms: Vec<f64>,
}

/// A run's time figures, per window and per cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeFigures {
    /// Estimated step (iteration) ms under the placement live in each window.
    pub per_window_ms: Vec<f64>,
    /// The same under the run's initial placement (`static`).
    pub static_per_window_ms: Vec<f64>,
    /// Estimated MoE ms (routed GEMM plus all-to-all) of each window.
    pub moe_per_window_ms: Vec<f64>,
    /// The same under the initial placement.
    pub static_moe_per_window_ms: Vec<f64>,
    /// The run's windows at the band's corners (low-saving, high-saving), and the static's.
    pub corners: [Vec<f64>; 4],
    /// One entry per cycle that reached its activation, in order.
    pub stalls: Vec<CycleStall>,
    /// The first window of the means (`H + A`, the first activation; as the PAR metrics).
    pub first_window: usize,
    /// The run's ranks (for the topology it assumed).
    pub ranks: usize,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Net saving, percent: `(base - (ours + stalls)) / base * 100` (NaN when `base` is not > 0).
pub fn saving_pct(base: f64, ours: f64, stalls: f64) -> f64 {
    if base > 0.0 {
        (base - (ours + stalls)) / base * 100.0
    } else {
        f64::NAN
    }
}

impl TimeFigures {
    fn tail<'a>(&self, v: &'a [f64]) -> &'a [f64] {
        v.get(self.first_window..).unwrap_or(&[])
    }

    /// Mean estimated step ms per iteration from the first activation.
    pub fn mean_ms(&self) -> f64 {
        mean(self.tail(&self.per_window_ms))
    }

    /// The same under the initial placement.
    pub fn static_mean_ms(&self) -> f64 {
        mean(self.tail(&self.static_per_window_ms))
    }

    /// Mean estimated MoE ms per iteration from the first activation.
    pub fn moe_mean_ms(&self) -> f64 {
        mean(self.tail(&self.moe_per_window_ms))
    }

    /// The same under the initial placement.
    pub fn static_moe_mean_ms(&self) -> f64 {
        mean(self.tail(&self.static_moe_per_window_ms))
    }

    /// Sum of every cycle's stall, ms (`+ 0.0`: an empty sum is `-0.0`).
    pub fn stall_total_ms(&self) -> f64 {
        self.stalls.iter().map(|c| c.ms).sum::<f64>() + 0.0
    }

    /// The largest stall of one cycle, ms.
    pub fn stall_max_ms(&self) -> f64 {
        self.stalls.iter().map(|c| c.ms).fold(0.0, f64::max)
    }

    /// The mean stall of one cycle, ms (0 without cycles).
    pub fn stall_mean_ms(&self) -> f64 {
        if self.stalls.is_empty() {
            0.0
        } else {
            self.stall_total_ms() / self.stalls.len() as f64
        }
    }

    /// The initial placement's windows, as [`window_ms`] gives them.
    pub fn static_times(&self) -> WindowTimes {
        let [_, _, lo, hi] = &self.corners;
        WindowTimes {
            step_ms: self.static_per_window_ms.clone(),
            moe_ms: self.static_moe_per_window_ms.clone(),
            low_ms: lo.clone(),
            high_ms: hi.clone(),
        }
    }

    /// Net saving against `baseline_per_window_ms` (per window step ms), percent of the step,
    /// over the windows from the first activation: `(base - (policy + stalls)) / base * 100`.
    pub fn net_saving_pct_against(&self, baseline_per_window_ms: &[f64]) -> f64 {
        let base: f64 = self.tail(baseline_per_window_ms).iter().sum();
        let ours: f64 = self.tail(&self.per_window_ms).iter().sum::<f64>();
        saving_pct(base, ours, self.stall_total_ms())
    }

    /// Net saving against the run's own initial placement, percent of the step.
    pub fn net_saving_pct(&self) -> f64 {
        self.net_saving_pct_against(&self.static_per_window_ms)
    }

    /// The saving's band against the initial placement: `(low, high)` percent of the step,
    /// from the model's parameter box.
    pub fn net_saving_band_pct(&self) -> (f64, f64) {
        let [lo, hi, slo, shi] = &self.corners;
        let st = self.stall_total_ms();
        let sum = |v: &[f64]| self.tail(v).iter().sum::<f64>();
        let a = saving_pct(sum(slo), sum(lo), st);
        let b = saving_pct(sum(shi), sum(hi), st);
        let c = self.net_saving_pct();
        (a.min(b).min(c), a.max(b).max(c))
    }

    /// The time keys of `simulate --json` (`est_*` and `time_model`).
    pub fn add_json(&self, v: &mut Value, basis: &TimeBasis) {
        v["est_moe_ms_per_iter_mean"] = json!(self.moe_mean_ms());
        v["est_moe_ms_per_iter_static"] = json!(self.static_moe_mean_ms());
        v["est_step_ms_per_iter_mean"] = json!(self.mean_ms());
        v["est_step_ms_per_iter_static"] = json!(self.static_mean_ms());
        v["est_stall_ms_total"] = json!(self.stall_total_ms());
        v["est_stall_ms_per_cycle_max"] = json!(self.stall_max_ms());
        v["est_stall_ms_per_cycle_mean"] = json!(self.stall_mean_ms());
        v["est_net_saving_pct"] = json!(self.net_saving_pct());
        let (lo, hi) = self.net_saving_band_pct();
        v["est_net_saving_pct_low"] = json!(lo);
        v["est_net_saving_pct_high"] = json!(hi);
        v["time_model"] = basis.to_json();
        v["topology"] = basis.topology_json(Some(self.ranks));
    }

    /// One line for people.
    pub fn describe(&self, basis: &TimeBasis) -> String {
        let tm = &basis.model;
        let (lo, hi) = self.net_saving_band_pct();
        format!(
            "{}\ntime ({} {} on {}, {}, {} tokens per rank): {} ms per step from first activation (static {} ms), of it {} ms MoE (static {} ms); stalls {} ms in total, at most {} ms per cycle; net saving {}% of the step against static (band {}% to {}%)",
            basis.describe_topology(self.ranks),
            tm.model.name,
            tm.model.dtype.name(),
            tm.hardware.name,
            basis.role.name(),
            tm.tokens_per_rank,
            fixed(self.mean_ms(), 3),
            fixed(self.static_mean_ms(), 3),
            fixed(self.moe_mean_ms(), 3),
            fixed(self.static_moe_mean_ms(), 3),
            fixed(self.stall_total_ms(), 2),
            fixed(self.stall_max_ms(), 2),
            fixed(self.net_saving_pct(), 2),
            fixed(lo, 2),
            fixed(hi, 2)
        )
    }
}

/// The estimated times of every window of `trace`, served by `placements` (`(first window,
/// placement [L][R][S])`, in window order, the first from window 0) routed with
/// `cfg.routing`.
pub fn window_ms<'p>(
    trace: &SimTrace,
    shape: &Shape,
    cfg: &SimConfig,
    basis: &TimeBasis,
    placements: impl IntoIterator<Item = (usize, &'p [u16])>,
) -> Result<WindowTimes, SimError> {
    let (l, n) = (trace.layers, trace.experts);
    let (r, s) = (shape.ranks(), shape.slots_per_rank());
    let mut it = placements.into_iter().peekable();
    let Some((_, first)) = it.next() else {
        return Ok(WindowTimes::default());
    };
    let step = &basis.step;
    let (low, high) = basis.saving_corners();
    let mut router = Router::new(shape, first, cfg.routing);
    let mut routed = vec![0u32; shape.placement_len()];
    let mut loads = vec![0.0f64; shape.placement_len()];
    let mut terms = vec![MoeTerms::default(); l];
    let mut out = WindowTimes {
        step_ms: Vec::with_capacity(trace.windows),
        moe_ms: Vec::with_capacity(trace.windows),
        low_ms: Vec::with_capacity(trace.windows),
        high_ms: Vec::with_capacity(trace.windows),
    };
    for w in 0..trace.windows {
        while let Some(&(from, p)) = it.peek() {
            if from > w {
                break;
            }
            router.rebuild(p);
            it.next();
        }
        let counts = trace
            .counts
            .get(w * l * n..(w + 1) * l * n)
            .ok_or(SimError::Counts {
                values: trace.counts.len(),
                windows: trace.windows,
                layers: l,
                experts: n,
            })?;
        router.route(counts, &mut routed);
        for (x, &c) in loads.iter_mut().zip(&routed) {
            *x = f64::from(c);
        }
        let err = |error: eplb_core::Error| SimError::TimeModel {
            window: Some(w),
            layer: None,
            error,
        };
        let st = step.step(r, s, &loads, &mut terms).map_err(err)?;
        out.step_ms.push(st.iteration_ms);
        out.moe_ms.push(st.moe_ms);
        out.low_ms.push(
            step.step_from_terms(&terms, &low)
                .map_err(err)?
                .iteration_ms,
        );
        out.high_ms.push(
            step.step_from_terms(&terms, &high)
                .map_err(err)?
                .iteration_ms,
        );
    }
    Ok(out)
}

/// The time figures of `run` over `trace`. Each cycle's stall: one digest, and per changed
/// layer one vote plus the part of its exchange beyond one iteration. The exchange takes the
/// busiest rank's bytes (`MoveCost`) over the link inside a node, or the link between nodes
/// (the all-to-all's, [`StepModel::exchange_ms`]) when one of the layer's transfers
/// ([`eplb_runtime::transfer::plan_transfers`]) crosses nodes; the iteration it hides behind is
/// the step estimate of the window before the activation (under the old placement). Every
/// cycle of a policy pays the digest, also one that changed nothing; `static` (no EPLB) pays
/// nothing. `static_ms`: the initial placement's per-window figures when already known.
pub fn estimate(
    trace: &SimTrace,
    run: &Run,
    cfg: &SimConfig,
    basis: &TimeBasis,
    static_ms: Option<&WindowTimes>,
) -> Result<TimeFigures, SimError> {
    estimate_log(
        trace,
        &run.result.shape,
        &run.result.log,
        &run.costs,
        cfg,
        basis,
        static_ms,
    )
}

/// [`estimate`] from the parts of a run: its shape, its placements log and the cost of each
/// change (`costs[k]` from `log[k]` to `log[k + 1]`).
pub fn estimate_log(
    trace: &SimTrace,
    shape: &Shape,
    log: &[LogEntry],
    costs: &[MoveCost],
    cfg: &SimConfig,
    basis: &TimeBasis,
    static_ms: Option<&WindowTimes>,
) -> Result<TimeFigures, SimError> {
    let tm = &basis.model;
    let ours = window_ms(
        trace,
        shape,
        cfg,
        basis,
        log.iter()
            .map(|e| (e.active_from_window, e.placement.as_slice())),
    )?;
    let stat = match (static_ms, log.len()) {
        (Some(s), _) => s.clone(),
        (None, 1) => ours.clone(),
        (None, _) => window_ms(
            trace,
            shape,
            cfg,
            basis,
            log.first().map(|e| (0, e.placement.as_slice())),
        )?,
    };
    let per = shape.slots_per_layer().max(1);
    let hw = &tm.hardware;
    let g = basis.step.node_ranks(shape.ranks());
    let g = (g < shape.ranks()).then_some(g);
    let mut stalls = Vec::with_capacity(log.len().saturating_sub(1));
    // `static` is no EPLB: its cycles exist only in the simulator, they cost nothing.
    let no_eplb = cfg.policy == SimPolicy::Static;
    for (pair, cost) in log.windows(2).zip(costs) {
        let (old, new) = (&pair[0], &pair[1]);
        let w = new.active_from_window;
        if no_eplb {
            stalls.push(CycleStall {
                cycle: new.cycle,
                window: w,
                changed_layers: 0,
                ms: 0.0,
            });
            continue;
        }
        let iteration = ours
            .step_ms
            .get(w.saturating_sub(1))
            .copied()
            .unwrap_or(0.0);
        let mut ms = cycle_overhead_ms(hw);
        let mut changed = 0;
        for (layer, ((o, nw), lc)) in old
            .placement
            .chunks_exact(per)
            .zip(new.placement.chunks_exact(per))
            .zip(&cost.layers)
            .enumerate()
        {
            if o == nw {
                continue;
            }
            changed += 1;
            let crosses = match g {
                Some(g) => plan_transfers(shape, o, nw)?
                    .0
                    .iter()
                    .any(|t| usize::from(t.src) / g != usize::from(t.dst) / g),
                None => false,
            };
            let time_err = |error: eplb_core::Error| SimError::TimeModel {
                window: None,
                layer: Some(layer),
                error,
            };
            let ex = match basis.exchange_bytes_per_s {
                Some(bw) => lc.max_rank_bytes as f64 / bw * 1e3,
                None => basis
                    .step
                    .exchange_ms(lc.max_rank_bytes as f64, crosses, shape.ranks()),
            };
            ms += layer_stall_ms(ex, iteration, hw).map_err(time_err)?;
        }
        stalls.push(CycleStall {
            cycle: new.cycle,
            window: w,
            changed_layers: changed,
            ms,
        });
    }
    let first_window = (cfg.heat_interval as usize + cfg.algo_interval as usize).min(trace.windows);
    Ok(TimeFigures {
        per_window_ms: ours.step_ms,
        static_per_window_ms: stat.step_ms,
        moe_per_window_ms: ours.moe_ms,
        static_moe_per_window_ms: stat.moe_ms,
        corners: [ours.low_ms, ours.high_ms, stat.low_ms, stat.high_ms],
        stalls,
        first_window,
        ranks: shape.ranks(),
    })
}

/// `x` with `precision` decimals, or `n/a` when it is not a number (a figure a run cannot
/// show, such as one taken over no window; the JSON has `null` there).
pub fn fixed(x: f64, precision: usize) -> String {
    if x.is_finite() {
        format!("{x:.precision$}")
    } else {
        "n/a".to_owned()
    }
}

#[cfg(test)]
mod tests;
