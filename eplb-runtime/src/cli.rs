//! The `eplb` command-line tool (`DESIGN.md`, "The command-line tool").
//!
//! Errors go to stderr as `error: ...` with exit status 1 (2 for usage errors); `--json` prints
//! one JSON object on stdout.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand, ValueEnum};
use eplb_core::metrics::{self, Routing};
use eplb_core::{Layout, Placement, Shape};
use eplb_map::heat::{Heat, load_heat};
use eplb_map::map::{ReadOptions, check_map_json, read_map_json, to_json};
use eplb_policies::PolicyKind;
use serde_json::json;

use crate::config::{EplbConfig, ProcessEnv};
use crate::deployment::{Deployment, Hardware, QuantType, Role};
use crate::payload::{
    CostBasis, CostSpec, Link, ModelPreset, MoveCost, human_bytes, human_ms, move_cost,
    sequence_cost,
};
use crate::planner::{PlanRequest, plan_once};
use crate::policies::{Param, parse_param, policy_with};
use crate::simulate::{
    Initial, SimConfig, SimPolicy, SimResult, SimTrace, simulate, simulate_with,
};

/// The `eplb` tool.
#[derive(Debug, Parser)]
#[command(
    name = "eplb",
    version,
    about = "Expert Parallelism Load Balancer for MoE serving"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Largest input file read, in bytes (default 1 GiB); inputs must be regular files.
    #[arg(long, global = true, default_value_t = crate::fsio::DEFAULT_INPUT_LIMIT)]
    max_input_bytes: u64,
}

/// What every command writes through: the input size limit and the buffered standard output,
/// written once at the end by [`run`] (so a closed pipe or a full disk is handled in one place).
struct Io {
    limit: u64,
    out: String,
}

impl Io {
    fn read(&self, path: &Path) -> Result<Vec<u8>, String> {
        crate::fsio::read_bounded(path, self.limit).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// One line on standard error; a closed or full stderr is ignored (there is nowhere left to
/// report it), never a panic as `eprintln!` would.
macro_rules! errln {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr());
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Appends one line to the command's standard output.
macro_rules! outln {
    ($io:expr) => { $io.out.push('\n') };
    ($io:expr, $($arg:tt)*) => {{
        use core::fmt::Write as _;
        let _ = writeln!($io.out, $($arg)*);
    }};
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compute a placement from recorded heat and write a vLLM-Ascend expert-map JSON.
    Plan(PlanArgs),
    /// Check an expert-map JSON; exit 0 when valid, else 1 with every problem found.
    Validate(ValidateArgs),
    /// Validate an `eplb_config` JSON as the runtime would at start-up.
    CheckConfig(CheckConfigArgs),
    /// The hotness numbers (PAR over layers) of a placement under recorded heat.
    Hotness(HotnessArgs),
    /// Replay a trace through the dynamic cycle and score the placements (SIMULATION.md).
    Simulate(SimulateArgs),
    /// Simulate several policies on one trace and write one self-contained HTML page of charts.
    Report(ReportArgs),
}

#[derive(Debug, Args)]
struct Topology {
    /// Ranks per node (DeepSeek's hierarchy); default: all ranks on one node.
    #[arg(long)]
    ranks_per_node: Option<u16>,
    /// Expert groups of the model (DeepSeek's hierarchy); default 1.
    #[arg(long)]
    groups: Option<u16>,
}

#[derive(Debug, Args)]
struct PlanArgs {
    /// Heat: an eplb-trace/v1 trace, an SGLang logical_count dump, or a JSON array [L][N].
    #[arg(long)]
    loads: PathBuf,
    /// EP ranks.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    ranks: u16,
    /// Redundant experts.
    #[arg(long)]
    redundant: u32,
    #[command(flatten)]
    topo: Topology,
    /// Policy: 0..4 or random, default, swift, flashlb, incremental, deepseek.
    #[arg(long)]
    policy: String,
    /// A policy parameter, `KEY=VALUE` (repeatable; `DESIGN.md`, "Policy parameters"). From
    /// the default layout the incremental policy's `cold_start` defaults to 1 (every layer is
    /// rebuilt).
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
    params: Vec<Param>,
    /// The current placement (expert-map JSON); default: the default layout.
    #[arg(long)]
    current: Option<PathBuf>,
    /// Seed of randomised policies.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to write the new expert map.
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    cost: CostArgs,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// What one expert weighs and how fast it moves, for the cost estimate of `plan`, `simulate`
/// and `report` (default: the model the trace names if known, else DeepSeek-V3 W8A8; 10 Gbit/s).
#[derive(Debug, Args)]
struct CostArgs {
    /// Model preset sizing an expert: deepseek-v3 (= deepseek-r1), qwen3-235b, qwen3-30b,
    /// deepseek-v2-lite; default: the trace's model when known (ESFT: deepseek-v2-lite), else
    /// deepseek-v3.
    #[arg(long, value_parser = parse_from_str::<ModelPreset>, conflicts_with_all = ["hidden", "intermediate"])]
    model: Option<ModelPreset>,
    /// Hidden size H (with --intermediate, instead of --model).
    #[arg(long, requires = "intermediate")]
    hidden: Option<u64>,
    /// Expert intermediate size I (with --hidden, instead of --model).
    #[arg(long, requires = "hidden")]
    intermediate: Option<u64>,
    /// MoE quant type: none, W8A8, W8A8-Dynamic, W4A8, MXFP4, MXFP8.
    #[arg(long, value_parser = parse_from_str::<QuantType>)]
    quant: Option<QuantType>,
    /// Fused MC2 is on (W4A8 needs it; W8A8 then moves the fused scales too).
    #[arg(long)]
    fused_mc2: bool,
    /// Link per rank: 10gbps (default), hccs (~56 GB/s), roce (200 GbE) or <N>gbps.
    #[arg(long, value_parser = parse_from_str::<Link>)]
    link: Option<Link>,
}

impl CostArgs {
    fn resolve(&self) -> Result<CostBasis, String> {
        self.resolve_for_trace(None)
    }

    /// With no model flags, a trace that names a known model sizes the expert.
    fn resolve_for_trace(&self, trace_model: Option<ModelPreset>) -> Result<CostBasis, String> {
        CostSpec {
            model: self.model,
            hidden: self.hidden,
            intermediate: self.intermediate,
            quant: self.quant,
            fused_mc2: self.fused_mc2,
            link: self.link.clone(),
        }
        .resolve_for_trace(trace_model)
    }
}

/// The deployment facts of `check-config` (override the file's `deployment` object).
#[derive(Debug, Args)]
struct DeploymentArgs {
    /// Hardware: A2, A3, 950PR, 950DT.
    #[arg(long, value_parser = parse_from_str::<Hardware>)]
    hardware: Option<Hardware>,
    /// MoE quant type: none, W8A8, W8A8-Dynamic, W4A8, MXFP4, MXFP8, W4A8MXFP4, W4A16, W4A16MXFP4.
    #[arg(long = "quant", alias = "quant-type", value_parser = parse_from_str::<QuantType>)]
    quant_type: Option<QuantType>,
    /// Fused MC2 is enabled.
    #[arg(long)]
    fused_mc2: bool,
    /// Node role: prefill, decode, colocated.
    #[arg(long, value_parser = parse_from_str::<Role>)]
    role: Option<Role>,
    /// Typical input length (tokens).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    input_len: Option<u32>,
    /// Typical concurrency (requests).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: Option<u32>,
    /// Physical experts per die.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    experts_per_die: Option<u32>,
    /// Tokens per die per forward.
    #[arg(long)]
    tokens_per_die: Option<u32>,
}

impl DeploymentArgs {
    fn facts(&self) -> Deployment {
        Deployment {
            hardware: self.hardware,
            quant_type: self.quant_type,
            fused_mc2: self.fused_mc2.then_some(true),
            role: self.role,
            input_len: self.input_len,
            concurrency: self.concurrency,
            experts_per_die: self.experts_per_die,
            tokens_per_die: self.tokens_per_die,
        }
    }
}

fn parse_from_str<T>(s: &str) -> Result<T, String>
where
    T: core::str::FromStr,
    T::Err: core::fmt::Display,
{
    s.parse::<T>().map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
struct ValidateArgs {
    /// The expert-map JSON.
    map: PathBuf,
    /// Logical experts of the model.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    experts: Option<u16>,
    /// EP ranks.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    ranks: Option<u16>,
    /// Accept an expert held twice on one device.
    #[arg(long)]
    allow_duplicates: bool,
}

#[derive(Debug, Args)]
struct CheckConfigArgs {
    /// `{"eplb_config": {...}}` or the inner object.
    file: PathBuf,
    /// Logical experts of the model (with --ranks: checks the redundancy divides).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    experts: Option<u16>,
    /// EP ranks.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    ranks: Option<u16>,
    #[command(flatten)]
    deployment: DeploymentArgs,
}

#[derive(Debug, Args)]
struct HotnessArgs {
    /// The placement (expert-map JSON).
    #[arg(long)]
    map: PathBuf,
    /// Heat: a trace, an SGLang dump, a JSON array [L][N], or per-slot loads [L][R][S].
    #[arg(long)]
    loads: PathBuf,
    /// Also draw the rank loads per layer (log2phy routing) as an SVG heat map here.
    #[arg(long)]
    svg: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RoutingArg {
    /// vLLM-Ascend's static per-source-rank replica choice.
    Log2phy,
    /// Even split over replicas.
    Even,
}

/// The options `simulate` and `report` share: the trace, the shape, the cycle, the start, the
/// routing model, the seed and the cost model.
#[derive(Debug, Args)]
struct ReplayArgs {
    /// An eplb-trace/v1 trace with windows.
    #[arg(long)]
    trace: PathBuf,
    /// EP ranks.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    ranks: u16,
    /// Redundant experts.
    #[arg(long)]
    redundant: u32,
    /// Heat windows per cycle (H >= 1).
    #[arg(long)]
    heat_interval: u32,
    /// Windows between the snapshot and the new placement (A >= 1).
    #[arg(long)]
    algo_interval: u32,
    #[command(flatten)]
    topo: Topology,
    /// `default` or `random:SEED`.
    #[arg(long, default_value = "default")]
    initial: String,
    /// Routing model of the metrics.
    #[arg(long, value_enum, default_value = "log2phy")]
    routing: RoutingArg,
    /// Seed of randomised policies.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    cost: CostArgs,
}

/// A trace read for replay, with the simulator's settings and the cost basis.
struct Replay {
    trace: SimTrace,
    /// The trace's own name, if it has one.
    name: Option<String>,
    /// The name of the model the trace names, if any.
    model: Option<String>,
    basis: CostBasis,
    cfg: SimConfig,
}

impl ReplayArgs {
    /// Reads the trace (bounded) and builds the settings for `policy`.
    fn load(&self, io: &Io, policy: SimPolicy) -> Result<Replay, String> {
        let initial = parse_initial(&self.initial)?;
        self.cost.resolve()?;
        let bytes = io.read(&self.trace)?;
        let (preset, model) = trace_model(&bytes);
        let basis = self.cost.resolve_for_trace(preset)?;
        let heat = load_heat(&bytes, None).map_err(|e| format!("{}: {e}", self.trace.display()))?;
        warn_heat(&heat, &self.trace);
        let counts = heat.counts_u64().ok_or_else(|| {
            format!(
                "{}: counts must be whole token counts",
                self.trace.display()
            )
        })?;
        let trace = SimTrace {
            windows: heat.windows(),
            layers: heat.layers(),
            experts: heat.experts(),
            counts,
        };
        let cfg = SimConfig {
            ranks: self.ranks,
            redundant: self.redundant,
            ranks_per_node: self.topo.ranks_per_node,
            groups: self.topo.groups,
            policy,
            heat_interval: self.heat_interval,
            algo_interval: self.algo_interval,
            initial,
            routing: match self.routing {
                RoutingArg::Log2phy => Routing::Log2Phy,
                RoutingArg::Even => Routing::Even,
            },
            seed: self.seed,
            expert_bytes: 64,
        };
        Ok(Replay {
            trace,
            name: heat.name().map(str::to_owned),
            model,
            basis,
            cfg,
        })
    }
}

#[derive(Debug, Args)]
struct SimulateArgs {
    #[command(flatten)]
    replay: ReplayArgs,
    /// Policy: static, 0..4, random, default, swift, flashlb, incremental, deepseek.
    #[arg(long)]
    policy: String,
    /// A policy parameter, `KEY=VALUE` (repeatable; `DESIGN.md`, "Policy parameters").
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
    params: Vec<Param>,
    /// Write the eplb-placements/v1 log here.
    #[arg(long)]
    placements_log: Option<PathBuf>,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ReportArgs {
    #[command(flatten)]
    replay: ReplayArgs,
    /// `all`, or a comma-separated list of static, 0..4, random, default, swift, flashlb,
    /// incremental, deepseek (static is always run as the baseline).
    #[arg(long, default_value = "all")]
    policies: String,
    /// A policy parameter, `KEY=VALUE` (repeatable), for each listed policy that takes `KEY`
    /// (at least one must).
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = parse_param)]
    params: Vec<Param>,
    /// Where to write the HTML page (atomically).
    #[arg(long)]
    out: PathBuf,
}

/// Runs the tool on `args` (including the program name) and returns the exit code.
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(c) => c,
        Err(e) => {
            if e.use_stderr() {
                let _ = e.print();
                return ExitCode::from(2);
            }
            // --help and --version go to stdout, through the same checks as any output.
            return finish(Ok(ExitCode::SUCCESS), e.render().to_string().as_bytes());
        }
    };
    let mut io = Io {
        limit: cli.max_input_bytes,
        out: String::new(),
    };
    let result = match cli.command {
        Command::Plan(a) => plan(&a, &mut io),
        Command::Validate(a) => validate(&a, &mut io),
        Command::CheckConfig(a) => check_config(&a, &mut io),
        Command::Hotness(a) => hotness(&a, &mut io),
        Command::Simulate(a) => simulate_cmd(&a, &mut io),
        Command::Report(a) => report_cmd(&a, &argv, &mut io),
    };
    finish(result, io.out.as_bytes())
}

/// `eplb simulate ARGS --json` in this process, for bindings: `args` are the subcommand's
/// arguments (without the program name, `simulate` and `--json`), and the result is the JSON
/// text the command prints (one object, the very bytes, so no float is re-rounded), or its
/// error message (a usage error included). Warnings still go to standard error, as the command
/// prints them.
pub fn simulate_json<I, T>(args: I) -> Result<String, String>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv: Vec<std::ffi::OsString> = ["eplb", "simulate"]
        .into_iter()
        .map(std::ffi::OsString::from)
        .chain(args.into_iter().map(Into::into))
        .chain(std::iter::once("--json".into()))
        .collect();
    let cli = Cli::try_parse_from(&argv).map_err(|e| {
        let text = e.render().to_string();
        let first = text.lines().next().unwrap_or("bad arguments");
        first.strip_prefix("error: ").unwrap_or(first).to_owned()
    })?;
    let Command::Simulate(a) = cli.command else {
        return Err("not a simulate command".into());
    };
    let mut io = Io {
        limit: cli.max_input_bytes,
        out: String::new(),
    };
    simulate_cmd(&a, &mut io)?;
    Ok(io.out.trim().to_owned())
}

/// Writes a command's standard output, then its error if any. A closed pipe (EPIPE) ends the
/// command quietly with its own status; any other write error is `error: stdout: ...`, exit 1.
fn finish(result: Result<ExitCode, String>, out: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_all(out).and_then(|()| stdout.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            errln!("error: stdout: {e}");
            return ExitCode::FAILURE;
        }
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            errln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The model preset a trace names in its `model` object, and that object's `name`.
fn trace_model(bytes: &[u8]) -> (Option<ModelPreset>, Option<String>) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return (None, None);
    };
    let Some(m) = v.get("model") else {
        return (None, None);
    };
    (
        ModelPreset::from_trace_model(m),
        m.get("name").and_then(|n| n.as_str()).map(str::to_owned),
    )
}

fn parse_policy(s: &str) -> Result<PolicyKind, String> {
    s.parse::<PolicyKind>()
        .map_err(|e| format!("--policy {s}: {e}"))
}

fn layout_shape(heat: &Heat, ranks: u16, redundant: u32, topo: &Topology) -> Result<Shape, String> {
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

fn read_current(io: &Io, path: &Path, shape: &Shape) -> Result<Vec<u16>, String> {
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
        let rows = crate::modes::colocated_row_list(map.placement().as_slice(), &map.shape());
        errln!(
            "warning: {}: {} device rows hold an expert twice ({rows}); the policy plans from a servable copy",
            path.display(),
            map.colocated_rows()
        );
    }
    Ok(map.into_placement().into_vec())
}

fn warn_heat(heat: &Heat, path: &Path) {
    for w in heat.warnings() {
        errln!("warning: {}: {w}", path.display());
    }
}

fn plan(a: &PlanArgs, io: &mut Io) -> Result<ExitCode, String> {
    let kind = parse_policy(&a.policy)?;
    // Checks the parameters before any file is read.
    policy_with(kind, &a.params).map_err(|e| format!("--param: {e}"))?;
    if let Some(out) = &a.out {
        let mut inputs = vec![a.loads.as_path()];
        inputs.extend(a.current.as_deref());
        crate::fsio::refuse_overwrite_input(out, &inputs)?;
    }
    a.cost.resolve()?;
    let bytes = io.read(&a.loads)?;
    let basis = a.cost.resolve_for_trace(trace_model(&bytes).0)?;
    // One parse: per-slot loads are the one format that needs a placement.
    let heat = load_heat(&bytes, None).map_err(|e| match e {
        eplb_map::Error::NeedsPlacement => format!(
            "{}: per-slot loads need a placement; use `eplb hotness` or convert to [L][N]",
            a.loads.display()
        ),
        e => format!("{}: {e}", a.loads.display()),
    })?;
    warn_heat(&heat, &a.loads);
    let shape = layout_shape(&heat, a.ranks, a.redundant, &a.topo)?;
    let mut default = vec![0u16; shape.placement_len()];
    Layout::Default
        .fill(&shape, &mut default)
        .map_err(|e| e.to_string())?;
    let current = match &a.current {
        Some(p) => read_current(io, p, &shape)?,
        None => default.clone(),
    };
    let (params, rebuilt) = one_shot_params(kind, &a.params, current == default);
    let policy = policy_with(kind, &params).map_err(|e| format!("--param: {e}"))?;
    let samples = (heat.windows() > 1).then(|| (heat.windows(), heat.as_slice().to_vec()));
    let req = PlanRequest {
        cycle: 1,
        current,
        loads: heat.summed(),
        samples,
        seed: a.seed,
    };
    let mut policy: Box<dyn eplb_policies::Policy + Send> = Box::new(policy);
    // The shape's range, the policy's topology and its buffer sizes, before any allocation.
    let lens = eplb_policies::buffer_lens(policy.as_ref(), &shape)
        .map_err(|e| format!("policy {}: {e}", kind.name()))?;
    let mut scratch = vec![0u64; lens.scratch];
    let mut state = vec![0u64; lens.state];
    let plan =
        plan_once(policy.as_mut(), &shape, &req, &mut scratch, &mut state).map_err(|e| match &a
            .current
        {
            Some(p) => format!("policy {} on --current {}: {e}", kind.name(), p.display()),
            None => format!("policy {}: {e}", kind.name()),
        })?;
    if plan.summary.colocated_rows > 0 {
        errln!(
            "warning: the plan holds an expert twice on {} device rows (the second copy gets no tokens under log2phy)",
            plan.summary.colocated_rows
        );
    }
    let mut copies = vec![0u16; shape.experts()];
    let lower: Vec<f64> = req
        .loads
        .chunks_exact(shape.experts())
        .map(|w| metrics::lower_bound_par(&shape, w, &mut copies).unwrap_or(1.0))
        .collect();
    if let Some(out) = &a.out {
        let p = Placement::new(shape, &plan.placement).map_err(|e| e.to_string())?;
        crate::fsio::write_atomic(out, to_json(&p).as_bytes())
            .map_err(|e| format!("{}: {e}", out.display()))?;
    }
    let elapsed_us = plan.elapsed.as_secs_f64() * 1e6;
    let cost = move_cost(
        &shape,
        &req.current,
        &plan.placement,
        basis.payload.total_bytes(),
    )
    .map_err(|e| e.to_string())?;
    if a.json {
        let mut v = json!({
            "policy": kind.name(),
            "layers": shape.layers(),
            "par_before": plan.par_before,
            "par_after": plan.par_after,
            "lower_bound": lower,
            "moves": plan.summary.moves,
            "elapsed_us": elapsed_us,
            "changed_layers": plan.summary.changed_layers,
            "colocated_rows": plan.summary.colocated_rows,
        });
        add_plan_cost(&mut v, &cost, &basis);
        outln!(io, "{v}");
    } else {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        outln!(
            io,
            "policy {}: {} layers, R={} S={} X={}",
            kind.name(),
            shape.layers(),
            shape.ranks(),
            shape.slots_per_rank(),
            shape.redundant()
        );
        if rebuilt {
            outln!(
                io,
                "from the default layout: every layer rebuilt (cold_start=1; --param cold_start=5 for the loop's threshold)"
            );
        }
        outln!(
            io,
            "PAR (even split): before mean={:.4} max={:.4}, after mean={:.4} max={:.4}, lower bound mean={:.4}",
            plan.summary.before.mean,
            plan.summary.before.max,
            plan.summary.after.mean,
            plan.summary.after.max,
            mean(&lower)
        );
        outln!(
            io,
            "changed layers: {}, weight fetches: {}, policy time: {:.1} us",
            plan.summary.changed_layers,
            plan.summary.moves,
            elapsed_us
        );
        outln!(io, "{}", basis.describe());
        outln!(io, "{}", plan_cost_line(&cost, &basis));
        if let Some(out) = &a.out {
            outln!(io, "wrote {}", out.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The parameters of a one-shot plan: from the default layout, which has nothing to keep and
/// no later call to polish it, the incremental policy rebuilds every layer (`cold_start = 1`)
/// unless `--param cold_start` says otherwise; its default threshold is for the loop, where a
/// rebuild's extra fetches recur. Also whether that default was added.
fn one_shot_params(kind: PolicyKind, params: &[Param], from_default: bool) -> (Vec<Param>, bool) {
    let mut all = params.to_vec();
    let add = kind == PolicyKind::Incremental
        && from_default
        && !params.iter().any(|(k, _)| k == "cold_start");
    if add {
        all.insert(0, ("cold_start".to_owned(), 1.0));
    }
    (all, add)
}

/// The cost keys of `plan --json`.
fn add_plan_cost(v: &mut serde_json::Value, cost: &MoveCost, basis: &CostBasis) {
    v["bytes_moved"] = json!(cost.bytes_moved());
    v["bytes_per_layer"] = json!(cost.bytes_per_layer());
    v["transfer_ms"] = json!(cost.transfer_ms(&basis.link));
    v["transfer_ms_max_layer"] = json!(cost.transfer_ms_max_layer(&basis.link));
    v["payload"] = basis.payload_json();
    v["link"] = basis.link.to_json();
}

fn plan_cost_line(cost: &MoveCost, basis: &CostBasis) -> String {
    let max_layer = cost.bytes_per_layer().into_iter().max().unwrap_or(0);
    format!(
        "cost: {} expert copies, {} moved (at most {} in one layer); at {}: about {} for the update, the longest layer {} (busiest rank's link)",
        cost.transfers(),
        human_bytes(cost.bytes_moved()),
        human_bytes(max_layer),
        basis.link.name(),
        human_ms(cost.transfer_ms(&basis.link)),
        human_ms(cost.transfer_ms_max_layer(&basis.link))
    )
}

fn validate(a: &ValidateArgs, io: &mut Io) -> Result<ExitCode, String> {
    let bytes = io.read(&a.map)?;
    let mut opts = if a.allow_duplicates {
        ReadOptions::lenient()
    } else {
        ReadOptions::strict()
    };
    if let Some(n) = a.experts {
        opts = opts.experts(n);
    }
    if let Some(r) = a.ranks {
        opts = opts.ranks(r);
    }
    let report = check_map_json(&bytes, &opts);
    match report.map {
        Some(map) if report.errors.is_empty() => {
            for w in map.warnings() {
                errln!("warning: {}: {w}", a.map.display());
            }
            let s = map.shape();
            outln!(
                io,
                "{}: valid: {} layers, {} devices x {} slots, {} experts, {} redundant",
                a.map.display(),
                s.layers(),
                s.ranks(),
                s.slots_per_rank(),
                s.experts(),
                s.redundant()
            );
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            for e in &report.errors {
                errln!("error: {}: {e}", a.map.display());
            }
            if report.truncated {
                errln!("error: {}: more problems not listed", a.map.display());
            }
            Ok(ExitCode::FAILURE)
        }
    }
}

fn check_config(a: &CheckConfigArgs, io: &mut Io) -> Result<ExitCode, String> {
    let validator = |p: &Path| -> Result<(), String> {
        let mut opts = ReadOptions::lenient();
        if let Some(n) = a.experts {
            opts = opts.experts(n);
        }
        if let Some(r) = a.ranks {
            opts = opts.ranks(r);
        }
        let bytes = crate::fsio::read_bounded(p, io.limit).map_err(|e| e.to_string())?;
        read_map_json(&bytes, &opts)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let overrides = a.deployment.facts();
    let cfg = match EplbConfig::from_file_with_deployment(
        &a.file,
        &ProcessEnv,
        Some(&validator),
        &overrides,
    ) {
        Ok(c) => c,
        Err(errors) => {
            for m in errors.messages() {
                errln!("error: {}: {m}", a.file.display());
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    // With a map file, the map decides the redundancy (the validator checked it against
    // --experts/--ranks); otherwise the configured redundancy must divide.
    if let (Some(n), Some(r), None) = (a.experts, a.ranks, cfg.expert_map_path())
        && let Err(e) = cfg.check_shape(n, r)
    {
        errln!("error: {}: {e}", a.file.display());
        return Ok(ExitCode::FAILURE);
    }
    for w in cfg.warnings() {
        errln!("warning: {w}");
    }
    outln!(io, "{}: valid", a.file.display());
    outln!(io, "{}", cfg.summary());
    if let Some(d) = cfg.deployment_facts() {
        outln!(io, "deployment facts: {}", d.summary());
    }
    Ok(ExitCode::SUCCESS)
}

fn hotness(a: &HotnessArgs, io: &mut Io) -> Result<ExitCode, String> {
    let map = read_map_json(&io.read(&a.map)?, &ReadOptions::lenient())
        .map_err(|e| format!("{}: {e}", a.map.display()))?;
    for w in map.warnings() {
        errln!("warning: {}: {w}", a.map.display());
    }
    let shape = map.shape();
    let placement = map.placement().view().map_err(|e| e.to_string())?;
    let heat = load_heat(&io.read(&a.loads)?, Some(&placement))
        .map_err(|e| format!("{}: {e}", a.loads.display()))?;
    warn_heat(&heat, &a.loads);
    if heat.layers() != shape.layers() || heat.experts() > shape.experts() {
        return Err(format!(
            "{} has {} layers x {} experts, the map {} layers x {} experts",
            a.loads.display(),
            heat.layers(),
            heat.experts(),
            shape.layers(),
            shape.experts()
        ));
    }
    let loads = heat.summed();
    if loads.len() != shape.loads_len() {
        return Err(format!(
            "{}: {} experts per layer, the map has {}",
            a.loads.display(),
            heat.experts(),
            shape.experts()
        ));
    }
    let mut scratch = vec![0u32; metrics::scratch_len(&shape)];
    let mut ranks = vec![0.0; shape.ranks()];
    let mut even = vec![0.0; shape.layers()];
    let mut routed = vec![0.0; shape.layers()];
    let h_even = metrics::hotness(
        &placement,
        &loads,
        Routing::Even,
        &mut scratch,
        &mut ranks,
        &mut even,
    )
    .map_err(|e| e.to_string())?;
    let h_routed = metrics::hotness(
        &placement,
        &loads,
        Routing::Log2Phy,
        &mut scratch,
        &mut ranks,
        &mut routed,
    )
    .map_err(|e| e.to_string())?;
    outln!(
        io,
        "[Expert Hotness] current: mean={:.3} max={:.3}",
        h_even.mean,
        h_even.max
    );
    outln!(
        io,
        "under log2phy routing: mean={:.3} max={:.3}",
        h_routed.mean,
        h_routed.max
    );
    outln!(io, "layer  PAR(even)  PAR(log2phy)");
    for (l, (e, r)) in even.iter().zip(&routed).enumerate() {
        outln!(io, "{l:>5}  {e:>9.4}  {r:>12.4}");
    }
    if let Some(out) = &a.svg {
        let title = format!(
            "{} under {} (log2phy routing)",
            a.map.display(),
            a.loads.display()
        );
        let svg = crate::report::hotness_svg(&placement, &loads, Routing::Log2Phy, &title)?;
        crate::fsio::write_atomic(out, svg.as_bytes())
            .map_err(|e| format!("{}: {e}", out.display()))?;
        outln!(io, "wrote {}", out.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_initial(s: &str) -> Result<Initial, String> {
    if s == "default" {
        return Ok(Initial::Default);
    }
    s.strip_prefix("random:")
        .and_then(|x| x.parse::<u64>().ok())
        .map(Initial::Random)
        .ok_or_else(|| format!("--initial {s}: expected `default` or `random:SEED`"))
}

fn simulate_cmd(a: &SimulateArgs, io: &mut Io) -> Result<ExitCode, String> {
    let policy = if a.policy == "static" {
        SimPolicy::Static
    } else {
        SimPolicy::Policy(parse_policy(&a.policy)?)
    };
    // Parameters are checked before any input is read.
    let custom = match (policy, a.params.is_empty()) {
        (_, true) => None,
        (SimPolicy::Policy(k), false) => {
            Some(policy_with(k, &a.params).map_err(|e| format!("--param: {e}"))?)
        }
        (SimPolicy::Static, false) => {
            return Err("--param: policy `static` takes no parameters".to_owned());
        }
    };
    if let Some(log) = &a.placements_log {
        crate::fsio::refuse_overwrite_input(log, &[a.replay.trace.as_path()])?;
    }
    let Replay {
        trace,
        name,
        basis,
        cfg,
        ..
    } = a.replay.load(io, policy)?;
    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut shown = false;
    let mut progress = |done: usize, total: usize| {
        if tty && started.elapsed().as_secs_f64() > 1.0 {
            let width = 30;
            let filled = done * width / total.max(1);
            let _ = write!(
                std::io::stderr(),
                "\r[{}{}] {done}/{total} windows",
                "=".repeat(filled),
                " ".repeat(width - filled)
            );
            let _ = std::io::stderr().flush();
            shown = true;
        }
    };
    let r = match custom {
        Some(p) => simulate_with(&trace, &cfg, Box::new(p), &mut progress)?,
        None => simulate(&trace, &cfg, &mut progress)?,
    };
    if shown {
        errln!();
    }
    if let Some(path) = &a.placements_log {
        write_placements_log(path, &r, policy.name(), name.as_deref())?;
    }
    let costs = sequence_cost(
        &r.shape,
        r.log.iter().map(|e| e.placement.as_slice()),
        basis.payload.total_bytes(),
    )
    .map_err(|e| e.to_string())?;
    if a.json {
        let mut v = sim_json(&r, policy.name(), cfg.routing);
        add_sim_cost(&mut v, &costs, &basis);
        outln!(io, "{v}");
    } else {
        print_sim(io, &r, policy.name(), cfg.routing);
        outln!(io, "{}", basis.describe());
        outln!(io, "{}", sim_cost_line(&costs, &basis));
    }
    // A failed plan keeps the old placement: say so, and never pass a run whose every plan
    // failed off as the policy's result.
    if r.plan_failures > 0 {
        let why = r.first_plan_failure.as_deref().unwrap_or("unknown");
        if r.plan_failures >= r.plans {
            return Err(format!(
                "every plan failed ({} of {}), the numbers are the initial placement's: {why}",
                r.plan_failures, r.plans
            ));
        }
        errln!(
            "warning: {} of {} plans failed (the placement stayed as it was for them): {why}",
            r.plan_failures,
            r.plans
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn report_cmd(
    a: &ReportArgs,
    argv: &[std::ffi::OsString],
    io: &mut Io,
) -> Result<ExitCode, String> {
    use crate::report::{PolicyList, ReportJob, shell_quote};
    let policies = PolicyList::parse(&a.policies)?;
    crate::fsio::refuse_overwrite_input(&a.out, &[a.replay.trace.as_path()])?;
    if let Some(dir) = a.out.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        return Err(format!(
            "--out {}: {} is not a directory",
            a.out.display(),
            dir.display()
        ));
    }
    let Replay {
        trace,
        name,
        model,
        basis,
        cfg: base,
    } = a.replay.load(io, SimPolicy::Static)?;
    let words: Vec<String> = argv
        .iter()
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    let trace_name = name.unwrap_or_else(|| {
        a.replay.trace.file_name().map_or_else(
            || a.replay.trace.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        )
    });
    let report = crate::report::run(ReportJob {
        trace: &trace,
        trace_name,
        trace_model: model,
        base,
        policies,
        params: a.params.clone(),
        basis: &basis,
        command: shell_quote(&words),
    })?;
    let html = report.html()?;
    crate::fsio::write_atomic(&a.out, html.as_bytes())
        .map_err(|e| format!("{}: {e}", a.out.display()))?;
    outln!(io, "wrote {}", a.out.display());
    Ok(ExitCode::SUCCESS)
}

/// Bytes moved over all cycles, their mean per cycle, and the mean transfer time per cycle at
/// the link (cycles that change nothing count as zero).
fn sim_cost(costs: &[MoveCost], basis: &CostBasis) -> (u64, f64, f64) {
    let total: u64 = costs.iter().map(MoveCost::bytes_moved).sum();
    // `+ 0.0`: an empty float sum is -0.0.
    let ms = costs
        .iter()
        .map(|c| c.transfer_ms(&basis.link))
        .sum::<f64>()
        + 0.0;
    let n = costs.len().max(1) as f64;
    (total, total as f64 / n, ms / n)
}

/// The cost keys of `simulate --json`.
pub(crate) fn add_sim_cost(v: &mut serde_json::Value, costs: &[MoveCost], basis: &CostBasis) {
    let (total, per_cycle, ms) = sim_cost(costs, basis);
    v["bytes_moved_total"] = json!(total);
    v["bytes_per_cycle_mean"] = json!(per_cycle);
    v["transfer_ms_per_cycle_mean"] = json!(ms);
    v["transfer_ms_per_cycle_max"] = json!(
        costs
            .iter()
            .map(|c| c.transfer_ms(&basis.link))
            .fold(0.0, f64::max)
    );
    v["payload"] = basis.payload_json();
    v["link"] = basis.link.to_json();
}

fn sim_cost_line(costs: &[MoveCost], basis: &CostBasis) -> String {
    let (total, per_cycle, ms) = sim_cost(costs, basis);
    format!(
        "cost: {} moved over {} cycles ({} per cycle on average); at {}: about {} per cycle (busiest rank's link, layers one after another)",
        human_bytes(total),
        costs.len(),
        human_bytes(per_cycle.round() as u64),
        basis.link.name(),
        human_ms(ms)
    )
}

fn routing_name(r: Routing) -> &'static str {
    match r {
        Routing::Log2Phy => "log2phy",
        Routing::Even => "even",
    }
}

/// The `simulate --json` object.
pub fn sim_json(r: &SimResult, policy: &str, routing: Routing) -> serde_json::Value {
    let slots = r.shape.placement_len() as f64;
    json!({
        "policy": policy,
        "routing": routing_name(routing),
        "mean_par": r.mean_par,
        "p99_par": r.p99_par,
        "max_par": r.max_par,
        "mean_par_from_first_activation": r.mean_par_from_first_activation,
        "p99_par_from_first_activation": r.p99_par_from_first_activation,
        "changes": r.changes,
        "moves_total": r.moves_total,
        "moves_per_change": r.moves_per_change(),
        "moves_per_change_fraction": r.moves_per_change() / slots,
        "slot_writes_total": r.slot_writes_total,
        "same_rank_duplicate_rows_max": r.same_rank_duplicate_rows_max,
        "policy_time_ms_mean": r.policy_time_ms_mean,
        "policy_time_ms_max": r.policy_time_ms_max,
        "cycles": r.cycles,
        "other_routing_mean_par": r.other_routing_mean_par,
        "lower_bound_mean_par": r.lower_bound_mean_par,
        "failed_layers": r.failed_layers,
        "plan_failures": r.plan_failures,
    })
}

fn print_sim(io: &mut Io, r: &SimResult, policy: &str, routing: Routing) {
    let s = r.shape;
    outln!(
        io,
        "policy {policy}: L={} N={} R={} S={} X={}, routing {}, {} cycles",
        s.layers(),
        s.experts(),
        s.ranks(),
        s.slots_per_rank(),
        s.redundant(),
        routing_name(routing),
        r.cycles
    );
    outln!(
        io,
        "PAR: mean {:.4}  p99 {:.4}  max {:.3}  | from first activation: mean {:.4}  p99 {:.4}",
        r.mean_par,
        r.p99_par,
        r.max_par,
        r.mean_par_from_first_activation,
        r.p99_par_from_first_activation
    );
    outln!(
        io,
        "changes {}  moves {} ({:.1} per change, {:.1}% of slots)  slot writes {}  same-rank duplicate rows max {}",
        r.changes,
        r.moves_total,
        r.moves_per_change(),
        100.0 * r.moves_per_change() / s.placement_len() as f64,
        r.slot_writes_total,
        r.same_rank_duplicate_rows_max
    );
    outln!(
        io,
        "policy time per cycle: mean {:.2} ms, max {:.2} ms; lower bound mean PAR {:.4}",
        r.policy_time_ms_mean,
        r.policy_time_ms_max,
        r.lower_bound_mean_par
    );
}

fn write_placements_log(
    path: &Path,
    r: &SimResult,
    policy: &str,
    case: Option<&str>,
) -> Result<(), String> {
    let s = r.shape;
    let nest = |p: &[u16]| -> serde_json::Value {
        p.chunks_exact(s.slots_per_layer())
            .map(|layer| {
                layer
                    .chunks_exact(s.slots_per_rank())
                    .map(|row| row.to_vec())
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .into()
    };
    let entries: Vec<serde_json::Value> = r
        .log
        .iter()
        .map(|e| {
            let mut v = json!({
                "cycle": e.cycle,
                "active_from_window": e.active_from_window,
                "placement": nest(&e.placement),
            });
            if let Some((a, b)) = e.heat_windows {
                v["heat_windows"] = json!([a, b]);
            }
            if let Some(t) = e.policy_time_s {
                v["policy_time_s"] = json!(t);
            }
            v
        })
        .collect();
    let mut doc = json!({
        "format": "eplb-placements/v1",
        "policy": policy,
        "num_layers": s.layers(),
        "num_ranks": s.ranks(),
        "slots_per_rank": s.slots_per_rank(),
        "num_experts": s.experts(),
        "entries": entries,
    });
    if let Some(c) = case {
        doc["case"] = json!(c);
    }
    let text = serde_json::to_string(&doc).map_err(|e| e.to_string())?;
    crate::fsio::write_atomic(path, text.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))
}
