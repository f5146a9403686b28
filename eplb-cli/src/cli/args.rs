//! What the subcommands share: the output buffer ([`Io`]), the argument groups (replay,
//! topology, cost, time) and the flag parsers. A leaf: it imports no subcommand.

use clap::{Args, ValueEnum};
use eplb_core::Shape;
use eplb_core::metrics::Routing;
use eplb_core::settings;
use eplb_core::time::ModelSpec;
use eplb_core::time::Role;
use eplb_core::time::step::Overlap;
use eplb_map::heat::Heat;
use eplb_map::map::{ReadOptions, read_map_json};
use eplb_policies::PolicyKind;
use eplb_runtime::config::deployment::QuantType;
use eplb_runtime::policies::Param;
use eplb_sim::cost::{CostBasis, CostSpec, Link};
use eplb_sim::time::TimeSpec;
use eplb_sim::{Initial, Replay, SimConfig, SimPolicy};
use std::path::{Path, PathBuf};

/// What every command writes through: the input size limit and the buffered standard output,
/// written once at the end by [`run`](super::run) (so a closed pipe or a full disk is handled in one place).
pub(super) struct Io {
    pub(super) limit: u64,
    pub(super) out: String,
}

impl Io {
    pub(super) fn read(&self, path: &Path) -> Result<Vec<u8>, String> {
        eplb_runtime::fsio::read_bounded(path, self.limit)
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

#[derive(Debug, Args)]
pub(super) struct Topology {
    /// Ranks per node (DeepSeek's hierarchy); default: all ranks on one node.
    #[arg(long)]
    pub(super) ranks_per_node: Option<u16>,
    /// Expert groups of the model (DeepSeek's hierarchy); default 1.
    #[arg(long)]
    pub(super) groups: Option<u16>,
}

/// What one expert weighs and how fast it moves, for the cost estimate of `plan`, `simulate`
/// and `report` (default: the model the trace names if known, else DeepSeek-V3 W8A8; 10 Gbit/s).
#[derive(Debug, Args)]
pub(super) struct CostArgs {
    /// Model preset sizing an expert and shaping the time model: deepseek-v3 (= deepseek-r1),
    /// qwen3-235b, qwen3-30b, deepseek-v2-lite, kimi-k2, mixtral-8x7b; default: the trace's
    /// model when known (ESFT: deepseek-v2-lite), else deepseek-v3.
    #[arg(long, value_parser = parse_model, conflicts_with_all = ["hidden", "intermediate"])]
    pub(super) model: Option<ModelSpec>,
    /// Hidden size H (with --intermediate, instead of --model).
    #[arg(long, requires = "intermediate")]
    pub(super) hidden: Option<u64>,
    /// Expert intermediate size I (with --hidden, instead of --model).
    #[arg(long, requires = "hidden")]
    pub(super) intermediate: Option<u64>,
    /// MoE quant type: none, W8A8, W8A8-Dynamic, W4A8, MXFP4, MXFP8.
    #[arg(long, value_parser = parse_quant)]
    pub(super) quant: Option<QuantType>,
    /// Fused MC2 is on (W4A8 needs it; W8A8 then moves the fused scales too).
    #[arg(long)]
    pub(super) fused_mc2: bool,
    /// Link per rank: 10gbps (default), hccs (~56 GB/s), roce (200 GbE) or `<N>gbps`.
    #[arg(long, value_parser = parse_from_str::<Link>)]
    pub(super) link: Option<Link>,
}

impl CostArgs {
    pub(super) fn resolve(&self) -> Result<CostBasis, String> {
        self.resolve_for_trace(None)
    }

    /// With no model flags, a trace that names a known model sizes the expert.
    pub(super) fn resolve_for_trace(
        &self,
        trace_model: Option<ModelSpec>,
    ) -> Result<CostBasis, String> {
        self.spec()
            .resolve_for_trace(trace_model)
            .map_err(|e| crate::words::cost_error(&e))
    }

    /// The flags as the cost model's settings.
    pub(super) fn spec(&self) -> CostSpec {
        CostSpec {
            model: self.model,
            hidden: self.hidden,
            intermediate: self.intermediate,
            quant: self.quant,
            fused_mc2: self.fused_mc2,
            link: self.link.clone(),
        }
    }
}

/// The serving-time model's settings (`docs/time-model.md`) for `simulate`, `report` and
/// `advise`; the model's shape is `--model`'s (or the trace's), its expert size the payload's.
#[derive(Debug, Args, Clone)]
pub(super) struct TimeArgs {
    /// Hardware preset of the time model: a2, a3 (default), 950pr, 950dt, h100, h200, b200.
    #[arg(long, value_parser = parse_hardware)]
    pub(super) hardware: Option<String>,
    /// Serving role of the time model: decode (default) or prefill.
    #[arg(long, value_parser = parse_role)]
    pub(super) role: Option<Role>,
    /// Tokens per iteration per rank (default: 128 for decode, 16384 for prefill).
    #[arg(long)]
    pub(super) tokens_per_rank: Option<f64>,
    /// Override one number of the hardware preset, `KEY=VALUE` (repeatable): flops_bf16,
    /// flops_8bit, flops_fp4 (FLOP/s), hbm_bytes_per_s, intra_node_bytes_per_s,
    /// inter_node_bytes_per_s (bytes/s), layer_overhead_ms, collective_ms.
    #[arg(long = "hw-param", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub(super) hw_params: Vec<(String, f64)>,
    /// Override one number of the model, `KEY=VALUE` (repeatable): hidden, intermediate,
    /// experts, top_k, moe_layers, shared_experts.
    #[arg(long = "model-param", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub(super) model_params: Vec<(String, f64)>,
    #[command(flatten)]
    pub(super) shape: StepArgs,
}

/// The request shape and the step model's settings (`docs/time-model.md`, "The step model").
#[derive(Debug, Args, Clone)]
pub(super) struct StepArgs {
    /// Mean context of a decode request, tokens (default 4096).
    #[arg(long)]
    pub(super) context_tokens: Option<f64>,
    /// Prompt length of a prefill request, tokens (default 4096).
    #[arg(long)]
    pub(super) prompt_tokens: Option<f64>,
    /// Requests per rank per step (default: tokens per rank / tokens per request in decode,
    /// tokens per rank / prompt tokens in prefill).
    #[arg(long)]
    pub(super) requests_per_rank: Option<f64>,
    /// Tokens per request per step in decode: 1, or 1 + MTP drafts (default 1).
    #[arg(long)]
    pub(super) tokens_per_request: Option<f64>,
    /// Overlap of computation and all-to-all: none (default) or two-batch.
    #[arg(long, value_parser = parse_overlap)]
    pub(super) overlap: Option<Overlap>,
    /// An `eplb calibrate` output (eplb-calibration/v1): the model's fitted constants.
    #[arg(long)]
    pub(super) calibration: Option<PathBuf>,
}

impl TimeArgs {
    /// The flags as the time model's settings, without the calibration file (checks that
    /// need no input).
    pub(super) fn spec(&self) -> TimeSpec {
        TimeSpec {
            hardware: self.hardware.clone(),
            role: self.role,
            tokens_per_rank: self.tokens_per_rank,
            hw_params: self.hw_params.clone(),
            model_params: self.model_params.clone(),
            requests_per_rank: self.shape.requests_per_rank,
            context_tokens: self.shape.context_tokens,
            prompt_tokens: self.shape.prompt_tokens,
            tokens_per_request: self.shape.tokens_per_request,
            overlap: self.shape.overlap,
            calibration: None,
        }
    }

    /// The flags as the time model's settings, the calibration file read.
    pub(super) fn spec_with(&self, io: &Io) -> Result<TimeSpec, String> {
        let mut spec = self.spec();
        spec.calibration = read_calibration_arg(self.shape.calibration.as_deref(), io)?;
        Ok(spec)
    }
}

/// Reads `--calibration FILE` when given.
pub(super) fn read_calibration_arg(
    path: Option<&Path>,
    io: &Io,
) -> Result<Option<(String, eplb_core::time::step::Calibration)>, String> {
    let Some(p) = path else { return Ok(None) };
    let bytes = io.read(p)?;
    let src = p.display().to_string();
    let c = eplb_sim::calibrate::read_calibration(&bytes, &src).map_err(|e| e.to_string())?;
    Ok(Some((src, c)))
}

pub(super) fn parse_overlap(s: &str) -> Result<Overlap, String> {
    Overlap::from_name(s).ok_or_else(|| format!("{s}: unknown overlap; expected none or two-batch"))
}

pub(super) fn parse_hardware(s: &str) -> Result<String, String> {
    eplb_sim::time::parse_hardware(s)
        .map(|_| s.to_owned())
        .map_err(|e| match e {
            eplb_sim::SimError::Setting { why, .. } => why,
            other => other.to_string(),
        })
}

pub(super) fn parse_role(s: &str) -> Result<Role, String> {
    eplb_sim::time::parse_role(s).map_err(|e| match e {
        eplb_sim::SimError::Setting { why, .. } => why,
        other => other.to_string(),
    })
}

/// `value` of `flag` by its one rule; the message names the flag, then the rule.
pub(super) fn setting<T>(
    flag: &str,
    value: i128,
    rule: fn(i128) -> Result<T, eplb_core::SettingError>,
) -> Result<T, String> {
    rule(value).map_err(|e| format!("{flag}: {e}"))
}

/// A `--ranks` value: `1..=65535` ([`settings::ranks`]).
pub(super) fn parse_ranks(s: &str) -> Result<u16, String> {
    let n = settings::parse_integer(s).ok_or_else(|| format!("`{s}` is not an integer"))?;
    settings::ranks(n).map_err(|e| e.to_string())
}

/// A `KEY=VALUE` argument with a numeric value.
pub(super) fn parse_key_value(s: &str) -> Result<(String, f64), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s}: expected KEY=VALUE"))?;
    let x: f64 = v
        .trim()
        .parse()
        .map_err(|_| format!("{s}: `{v}` is not a number"))?;
    Ok((k.trim().to_owned(), x))
}

/// A `--quant` value: a quant type's name (case-insensitive; `_` counts as `-`).
pub(super) fn parse_quant(s: &str) -> Result<QuantType, String> {
    eplb_runtime::config::deployment::parse_quant(s).map_err(|e| e.to_string())
}

/// A `--model` value: a catalogue model's name or alias.
pub(super) fn parse_model(s: &str) -> Result<ModelSpec, String> {
    eplb_sim::cost::parse_model(s).map_err(|e| e.to_string())
}

pub(super) fn parse_from_str<T>(s: &str) -> Result<T, String>
where
    T: core::str::FromStr,
    T::Err: core::fmt::Display,
{
    s.parse::<T>().map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(super) enum RoutingArg {
    /// vLLM-Ascend's static per-source-rank replica choice.
    Log2phy,
    /// Even split over replicas.
    Even,
}

/// The options of every replay (`simulate`, `report`, `advise`): the topology, the start, the
/// routing model, the seed, the cost model and the time model.
#[derive(Debug, Args)]
pub(super) struct RunArgs {
    #[command(flatten)]
    pub(super) topo: Topology,
    /// `default` or `random:SEED`.
    #[arg(long, default_value = "default")]
    pub(super) initial: String,
    /// Routing model of the metrics.
    #[arg(long, value_enum, default_value = "log2phy")]
    pub(super) routing: RoutingArg,
    /// Seed of randomised policies.
    #[arg(long, default_value_t = 0)]
    pub(super) seed: u64,
    #[command(flatten)]
    pub(super) cost: CostArgs,
    #[command(flatten)]
    pub(super) time: TimeArgs,
}

impl RunArgs {
    /// Checks the settings that need no input (before any is read): the initial placement,
    /// the cost and the time model; returns the initial placement and the routing model.
    pub(super) fn check(&self) -> Result<(Initial, Routing), String> {
        let initial: Initial = self.initial.parse().map_err(|e| format!("{e}"))?;
        self.cost.resolve()?;
        self.time.spec().check().map_err(|e| e.to_string())?;
        let routing = match self.routing {
            RoutingArg::Log2phy => Routing::Log2Phy,
            RoutingArg::Even => Routing::Even,
        };
        Ok((initial, routing))
    }
}

/// The options `simulate` and `report` share: the trace, the shape, the cycle and
/// [`RunArgs`].
#[derive(Debug, Args)]
pub(super) struct ReplayArgs {
    /// An eplb-trace/v1 trace with windows.
    #[arg(long)]
    pub(super) trace: PathBuf,
    /// EP ranks.
    #[arg(long, value_parser = parse_ranks)]
    pub(super) ranks: u16,
    /// Redundant experts (0..=65535).
    #[arg(long, allow_negative_numbers = true)]
    pub(super) redundant: i128,
    /// Heat windows per cycle (H >= 1).
    #[arg(long, allow_negative_numbers = true)]
    pub(super) heat_interval: i128,
    /// Windows between the snapshot and the new placement (A >= 1).
    #[arg(long, allow_negative_numbers = true)]
    pub(super) algo_interval: i128,
    #[command(flatten)]
    pub(super) run: RunArgs,
    /// Move a changed layer only when the time model says its saving over the next cycle
    /// exceeds the stall of its exchange (the runtime's `eplb_payoff_gate`).
    #[arg(long)]
    pub(super) payoff_gate: bool,
    /// Rank R fails at the start of window W, `R@W` (repeatable): the survivors reroute, reload
    /// what only it held and re-plan over the live ranks (docs/simulation.md, "Elastic membership").
    #[arg(long = "fail-rank", value_name = "R@W")]
    pub(super) fail_ranks: Vec<String>,
    /// Rank R, which failed earlier, joins again at the start of window W, `R@W` (repeatable).
    #[arg(long = "join-rank", value_name = "R@W")]
    pub(super) join_ranks: Vec<String>,
}

impl ReplayArgs {
    /// Reads the trace (bounded) and builds the settings for `policy`; the trace reader's
    /// warnings go to standard error.
    /// `--redundant`, `--heat-interval` and `--algo-interval`, each checked by its one rule
    /// ([`eplb_core::settings`]).
    pub(super) fn cycle(&self) -> Result<(u32, u32, u32), String> {
        Ok((
            setting("--redundant", self.redundant, settings::redundant_experts)?,
            setting(
                "--heat-interval",
                self.heat_interval,
                settings::heat_interval,
            )?,
            setting(
                "--algo-interval",
                self.algo_interval,
                settings::algo_interval,
            )?,
        ))
    }

    pub(super) fn load(&self, io: &Io, policy: SimPolicy) -> Result<(Replay, SimConfig), String> {
        let (redundant, heat_interval, algo_interval) = self.cycle()?;
        let (initial, routing) = self.run.check()?;
        let events = self.events()?;
        let bytes = io.read(&self.trace)?;
        let source = self.trace.display().to_string();
        let replay =
            Replay::load(&bytes, &source, &self.run.cost.spec()).map_err(|e| e.to_string());
        if let Ok(r) = &replay {
            for w in &r.warnings {
                errln!("warning: {source}: {w}");
            }
        }
        let replay = replay?;
        if let Some(w) = replay.short_trace_warning(heat_interval, algo_interval) {
            errln!("warning: {source}: {w}");
        }
        let cfg = SimConfig {
            ranks: self.ranks,
            redundant,
            ranks_per_node: self.run.topo.ranks_per_node,
            groups: self.run.topo.groups,
            policy,
            heat_interval,
            algo_interval,
            initial,
            routing,
            seed: self.run.seed,
            expert_bytes: 64,
            payoff_gate: None,
            events,
        };
        // The events against the trace and shape, before any window is replayed.
        if !cfg.events.is_empty() {
            let slots = (replay.trace.experts + redundant as usize)
                .checked_div(usize::from(self.ranks))
                .unwrap_or(0);
            eplb_sim::simulate::validate_events(
                &cfg.events,
                usize::from(self.ranks),
                replay.trace.windows,
                replay.trace.experts,
                slots,
            )
            .map_err(|e| crate::words::sim_error(&e))?;
        }
        let cfg = SimConfig {
            payoff_gate: if self.payoff_gate {
                let basis = self
                    .run
                    .time
                    .spec()
                    .resolve(&replay.basis, cfg.ranks_per_node)
                    .map_err(|e| e.to_string())?;
                Some(basis.gate(&cfg).map_err(|e| crate::words::sim_error(&e))?)
            } else {
                None
            },
            ..cfg
        };
        Ok((replay, cfg))
    }
}

impl ReplayArgs {
    /// `--fail-rank` and `--join-rank` as membership events in window order (a failure before a
    /// join at the same window); an unreadable value is an error that names it.
    pub(super) fn events(&self) -> Result<Vec<eplb_sim::MemberEvent>, String> {
        use eplb_sim::MemberKind;
        let mut events = Vec::new();
        for (kind, values) in [
            (MemberKind::Fail, &self.fail_ranks),
            (MemberKind::Join, &self.join_ranks),
        ] {
            for v in values {
                events.push(crate::words::parse_event(kind, v)?);
            }
        }
        // Stable: at one window, failures (given first) before joins.
        events.sort_by_key(|e| e.window);
        Ok(events)
    }
}

pub(super) fn parse_policy(s: &str) -> Result<PolicyKind, String> {
    s.parse::<PolicyKind>()
        .map_err(|e| format!("--policy {s}: {e}"))
}

pub(super) fn layout_shape(
    heat: &Heat,
    ranks: u16,
    redundant: u32,
    topo: &Topology,
) -> Result<Shape, String> {
    let l = u16::try_from(heat.layers()).map_err(|_| "too many layers".to_string())?;
    let n = u16::try_from(heat.experts()).map_err(|_| "too many experts".to_string())?;
    Shape::from_redundant(l, n, ranks, redundant)
        .and_then(|s| {
            s.topology(
                topo.ranks_per_node.unwrap_or(ranks),
                topo.groups.unwrap_or(1),
            )
        })
        .map_err(|e| e.to_string())
}

pub(super) fn read_current(io: &Io, path: &Path, shape: &Shape) -> Result<Vec<u16>, String> {
    let opts = ReadOptions::lenient()
        .experts(shape.experts() as u16)
        .ranks(shape.ranks() as u16)
        .layers(shape.layers() as u16);
    let map =
        read_map_json(&io.read(path)?, &opts).map_err(|e| format!("{}: {e}", path.display()))?;
    if map.shape().slots_per_rank() != shape.slots_per_rank() {
        return Err(format!(
            "{}: {} slots per device, but --ranks/--redundant give {}",
            path.display(),
            map.shape().slots_per_rank(),
            shape.slots_per_rank()
        ));
    }
    if map.colocated_rows() > 0 {
        let rows =
            eplb_runtime::startup::colocated_row_list(map.placement().as_slice(), &map.shape());
        errln!(
            "warning: {}: {} device rows hold an expert twice ({rows}); the policy plans from a servable copy",
            path.display(),
            map.colocated_rows()
        );
    }
    Ok(map.into_placement().into_vec())
}

pub(super) fn warn_heat(heat: &Heat, path: &Path) {
    for w in heat.warnings() {
        errln!("warning: {}: {w}", path.display());
    }
}

/// A `--param KEY=VALUE` argument: the key and its value as a number.
pub(super) fn parse_param(s: &str) -> Result<Param, String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("--param {s}: expected KEY=VALUE"))?;
    if k.is_empty() {
        return Err(format!("--param {s}: empty parameter name"));
    }
    let x: f64 = v
        .trim()
        .parse()
        .map_err(|_| format!("--param {s}: parameter `{k}`: `{v}` is not a number"))?;
    Ok((k.to_owned(), x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_parse() {
        assert_eq!(
            parse_param("min_gain=0.02"),
            Ok(("min_gain".to_owned(), 0.02))
        );
        assert!(parse_param("min_gain").unwrap_err().contains("KEY=VALUE"));
        assert!(parse_param("=1").is_err());
        assert!(parse_param("z=abc").unwrap_err().contains("`z`"));
    }
}
