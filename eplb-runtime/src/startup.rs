//! Start-up per mode: the placement a rank starts from, the controller settings a config
//! implies, the record-mode sink that writes the expert-map JSON, and a rank's whole
//! [`Controller`] from a config in one call ([`controller`]).
//!
//! Start-up wiring lives here, beside the driver and not inside it: this module uses the
//! controller, the planner and the config; none of them uses it.

use core::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use eplb_core::{Layout, Placement, ReplicaChoice, Shape, StageClassifier};
use eplb_map::map::{ReadOptions, read_map_json, to_json};

use crate::config::{ConfigError, EplbConfig, Mode};
use crate::controller::{
    Controller, ControllerConfig, DEFAULT_MAX_COLLECTIVE_FAILURES, MachineConfig, RecordSink,
};
use crate::fsio::ReadError;
use crate::planner::Planner;
use crate::rank::{MachineError, RunMode};
use crate::transport::Transport;

/// Why a rank could not start: what is wrong, and where.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The config's mode runs no controller (off or static).
    NoController(Mode),
    /// The model and the config do not form a shape (or a topology).
    Shape(eplb_core::Error),
    /// The config's settings do not fit the model (a redundancy the ranks cannot hold, one
    /// rank in a dynamic mode).
    Config(ConfigError),
    /// A map file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: ReadError,
    },
    /// A map file is not a valid expert map for the model.
    Map {
        /// The file.
        path: PathBuf,
        /// Why.
        error: eplb_map::Error,
    },
    /// The pay-off gate's model has no payload for the deployment's quant type.
    Payload(crate::payload::PayloadError),
    /// The pay-off gate's time model rejected its settings (a number out of range).
    Gate(eplb_core::Error),
    /// The controller refused its start (a transport that does not match the shape).
    Controller(MachineError),
    /// A rank that joins ([`joining_controller`]) was handed a live set that holds it.
    AlreadyLive {
        /// The joining rank.
        rank: usize,
    },
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::NoController(m) => write!(f, "mode {m} runs no controller"),
            StartError::Shape(e) => e.fmt(f),
            StartError::Config(e) => e.fmt(f),
            StartError::Read { path, error } => write!(f, "{}: {error}", path.display()),
            StartError::Map { path, error } => write!(f, "{}: {error}", path.display()),
            StartError::Payload(e) => write!(f, "eplb_payoff_gate: {e}"),
            StartError::Gate(e) => write!(f, "eplb_payoff_gate: {e}"),
            StartError::Controller(e) => e.fmt(f),
            StartError::AlreadyLive { rank } => write!(
                f,
                "rank {rank} joins, but the live set it was handed holds it already (hand over \
                 the peers' live ranks, without the joining one)"
            ),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::NoController(_) => None,
            StartError::Shape(e) => Some(e),
            StartError::Config(e) => Some(e),
            StartError::Read { error, .. } => Some(error),
            StartError::Map { error, .. } => Some(error),
            StartError::Payload(e) => Some(e),
            StartError::Gate(e) => Some(e),
            StartError::Controller(e) => Some(e),
            StartError::AlreadyLive { .. } => None,
        }
    }
}

impl From<eplb_core::Error> for StartError {
    fn from(e: eplb_core::Error) -> Self {
        StartError::Shape(e)
    }
}

impl From<ConfigError> for StartError {
    fn from(e: ConfigError) -> Self {
        StartError::Config(e)
    }
}

impl From<MachineError> for StartError {
    fn from(e: MachineError) -> Self {
        StartError::Controller(e)
    }
}

/// The controller of `transport.rank()` as `cfg` says, in one call: the start-up placement
/// ([`startup`]), the controller settings ([`controller_config`]), this rank's own planner
/// thread with the configured policy, and in record mode on rank 0 the sink that writes the
/// expert map to `expert_map_record_path` ([`record_sink`]).
pub fn controller<T: Transport>(
    cfg: &EplbConfig,
    model: &ModelInfo,
    transport: T,
) -> Result<Controller<T>, StartError> {
    let (shape, placement) = startup(cfg, model)?;
    let placement = eplb_core::Placement::new(shape, &placement).map_err(MachineError::from)?;
    build(cfg, model, transport, placement)
}

/// The controller of a rank that comes back (elastic EP): as [`controller`], but it starts from
/// `placement`, the placement its peers hold at the iteration it joins (the engine hands it
/// over: a live rank's `Controller::placement`, `EMPTY` in the rows of every rank outside
/// `live`, this one's included), with `live` the peers' live set (without this rank). Its slots
/// hold nothing routable until a walk fills them; the engine then tells every rank of the new
/// set, this one too, `Controller::add_ranks(&[rank])` at the same iteration.
pub fn joining_controller<T: Transport>(
    cfg: &EplbConfig,
    model: &ModelInfo,
    transport: T,
    placement: &[u16],
    live: &eplb_core::LiveSet,
) -> Result<Controller<T>, StartError> {
    let (shape, _) = startup(cfg, model)?;
    let rank = transport.rank();
    if live.contains(rank) {
        return Err(StartError::AlreadyLive { rank });
    }
    let placement =
        eplb_core::Placement::with_live(shape, placement, live).map_err(MachineError::from)?;
    build(cfg, model, transport, placement)
}

fn build<T: Transport>(
    cfg: &EplbConfig,
    model: &ModelInfo,
    transport: T,
    placement: eplb_core::Placement<'_>,
) -> Result<Controller<T>, StartError> {
    let shape = *placement.shape();
    let ccfg = controller_config(cfg, model)?;
    let policy = crate::policies::policy_for(cfg.policy());
    let gate = payoff_gate(cfg, model)?;
    let planner = Arc::new(Planner::with_gate(policy, shape, gate));
    let rank = transport.rank();
    let record = ccfg.machine.mode == RunMode::Record;
    let mut c = Controller::new(placement, ccfg, transport, planner)?;
    if record
        && rank == 0
        && let Some(path) = cfg.expert_map_record_path()
    {
        c.set_record_sink(record_sink(path.to_path_buf()));
    }
    if rank == 0
        && let Some(path) = cfg.observe().heat_record_path.as_deref()
    {
        heat_recorder(&mut c, cfg, path);
    }
    Ok(c)
}

/// Rank 0's heat recording (`eplb_heat_record_path`, which [`controller`] sets up; for a
/// controller built by hand); a file that cannot be opened leaves recording off with an error in
/// the log (serving never fails for it).
pub fn heat_recorder<T: Transport>(c: &mut Controller<T>, cfg: &EplbConfig, path: &Path) {
    let meta = crate::heat_record::RecordMeta {
        shape: *c.shape(),
        heat_interval: cfg.heat_interval(),
        algo_interval: cfg.algo_interval(),
    };
    match crate::heat_record::HeatRecorder::open(path, cfg.observe().heat_record_max_bytes, meta) {
        Ok(r) => {
            log::info!("eplb: recording each cycle's heat to {}", path.display());
            c.set_heat_recorder(r);
        }
        Err(e) => log::error!("eplb: heat recording to {} is off: {e}", path.display()),
    }
}

/// Registers eplb's metrics in the engine's `registry` as `eplb_metrics` says and has `c`
/// update them on every cycle event; `expert_bytes` is one expert copy's weight. `None` when
/// the config turns metrics off. Ranks that share a process and a registry pass each a
/// sub-registry with their own label (`registry.sub_registry_with_label(("rank", ...))`).
pub fn attach_metrics<T: Transport>(
    c: &mut Controller<T>,
    cfg: &EplbConfig,
    registry: &mut prometheus_client::registry::Registry,
    expert_bytes: u64,
) -> Option<crate::metrics::Metrics> {
    let settings = cfg.observe().metrics.as_ref()?;
    let m = crate::metrics::Metrics::register(registry, settings, c.shape().layers());
    c.set_metrics(m.clone(), expert_bytes);
    Some(m)
}

/// What the serving engine tells the runtime about the model and the parallel layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelInfo {
    /// MoE layers on this pipeline stage (without the MTP layer).
    pub layers: u16,
    /// Logical (routed) experts per layer.
    pub experts: u16,
    /// EP ranks.
    pub ranks: u16,
    /// Ranks per node (for DeepSeek's hierarchy).
    pub ranks_per_node: u16,
    /// Expert groups of the model (for DeepSeek's hierarchy).
    pub groups: u16,
    /// `max_num_seqs` of the engine (stage classifier).
    pub max_num_seqs: u32,
    /// Speculative tokens per step (stage classifier).
    pub speculative_tokens: u32,
    /// TP size for the `log2phy` rotation (0 or 1: none).
    pub tp_size: u16,
}

/// The pay-off gate `eplb_payoff_gate` turns on, for `model` on this deployment (`None`: off).
///
/// Unset settings come from the deployment facts, else the defaults: the hardware (`A3`), the
/// role (decode; a colocated node counts as decode), the tokens per rank (the deployment's
/// `tokens_per_die`, else the role's default), the model (DeepSeek-V3), whose dtype follows
/// the deployment's quant type (by default the model's checkpoint: `none` for the bf16 presets,
/// else W8A8, [`crate::config::deployment::QuantType::checkpoint`]) and whose expert bytes are that quant type's
/// payload ([`crate::payload::ExpertPayload::for_quant`]). The rest of the step (attention,
/// dense layers, host), which an exchange hides behind, is priced once here by the whole-step
/// model with the role's defaults on `model.ranks` ranks, under the `calibration` file's
/// multipliers when one is given ([`eplb_core::time::gate::Gate::for_step`]). Every rank builds the same gate from the same
/// config, so their decisions agree.
pub fn payoff_gate(
    cfg: &EplbConfig,
    model: &ModelInfo,
) -> Result<Option<eplb_core::time::gate::Gate>, StartError> {
    let Some(g) = resolve_payoff_gate(cfg)? else {
        return Ok(None);
    };
    let mut time = g.time;
    time.ranks_per_node = (model.ranks_per_node > 0 && model.ranks_per_node < model.ranks)
        .then_some(model.ranks_per_node);
    let mut step = eplb_core::time::step::StepModel::new(time, g.role);
    if let Some(c) = &g.calibration {
        step.calibration = *c;
    }
    eplb_core::time::gate::Gate::for_step(
        &step,
        usize::from(model.ranks),
        g.iterations,
        eplb_core::metrics::Routing::Log2Phy,
    )
    .map(Some)
    .map_err(StartError::Gate)
}

/// The settings of the gate `eplb_payoff_gate` turns on, with every default applied, before
/// the ranks are known ([`payoff_gate`] adds them): what `eplb check-config` prints.
#[derive(Debug, Clone, PartialEq)]
pub struct PayoffGateSettings {
    /// The time model (hardware, model with the quant type's dtype, tokens per rank, expert
    /// bytes; no node split yet).
    pub time: eplb_core::time::TimeModel,
    /// The role.
    pub role: eplb_core::time::Role,
    /// The experts' quant type.
    pub quant: crate::config::deployment::QuantType,
    /// Whether fused MC2 is on.
    pub fused_mc2: bool,
    /// The cycle a move must pay back over: heat interval plus algorithm interval.
    pub iterations: u64,
    /// The calibration's multipliers, when a file was named.
    pub calibration: Option<eplb_core::time::step::Calibration>,
}

impl PayoffGateSettings {
    /// One line: `model M (QUANT, B bytes per expert), hardware H, role R, tokens per rank T,
    /// over N iterations[, calibrated]`.
    pub fn summary(&self) -> String {
        format!(
            "model {} ({}{}, {} bytes per expert), hardware {}, role {}, tokens per rank {}, over {} iterations{}",
            self.time.model.name,
            self.quant,
            if self.fused_mc2 { " fused MC2" } else { "" },
            self.time.expert_bytes,
            self.time.hardware.name,
            self.role.name(),
            eplb_core::settings::Number::Float(self.time.tokens_per_rank),
            self.iterations,
            if self.calibration.is_some() {
                ", calibrated"
            } else {
                ""
            }
        )
    }
}

/// [`PayoffGateSettings`] of `cfg` (`None`: the gate is off). Every number passes its rule
/// ([`eplb_core::settings`]) or is a [`StartError::Gate`].
pub fn resolve_payoff_gate(cfg: &EplbConfig) -> Result<Option<PayoffGateSettings>, StartError> {
    use crate::config::deployment::{Hardware as Family, QuantType, Role as NodeRole};
    use eplb_core::time::{Hardware, ModelSpec, Role, TimeModel};
    let Some(spec) = cfg.payoff_gate() else {
        return Ok(None);
    };
    let facts = cfg.deployment_facts().cloned().unwrap_or_default();
    let hardware = spec.hardware.unwrap_or(match facts.hardware {
        Some(Family::A2) => Hardware::A2,
        Some(Family::Ascend950Pr) => Hardware::ASCEND_950PR,
        Some(Family::Ascend950Dt) => Hardware::ASCEND_950DT,
        Some(Family::A3) | None => Hardware::A3,
    });
    let role = spec.role.unwrap_or(match facts.role {
        Some(NodeRole::Prefill) => Role::Prefill,
        Some(NodeRole::Decode | NodeRole::Colocated) | None => Role::Decode,
    });
    let mut spec_model = spec.model.unwrap_or(ModelSpec::DEEPSEEK_V3);
    let quant = facts
        .quant_type
        .unwrap_or_else(|| QuantType::checkpoint(&spec_model));
    spec_model.dtype = quant.compute_dtype();
    let fused_mc2 = facts.fused_mc2.unwrap_or(false);
    let payload = crate::payload::ExpertPayload::for_quant(
        crate::payload::ModelDims::of(&spec_model),
        quant,
        fused_mc2,
    )
    .map_err(StartError::Payload)?;
    let mut time = TimeModel::new(hardware, spec_model, role, payload.total_bytes() as f64);
    if let Some(t) = spec.tokens_per_rank.or(facts.tokens_per_die.map(f64::from)) {
        time.tokens_per_rank = t;
    }
    time.check().map_err(StartError::Gate)?;
    Ok(Some(PayoffGateSettings {
        time,
        role,
        quant,
        fused_mc2,
        iterations: u64::from(cfg.heat_interval()) + u64::from(cfg.algo_interval()),
        calibration: spec.calibration.as_ref().map(|c| c.multipliers),
    }))
}

/// The shape and placement a rank starts from.
///
/// Static, and dynamic seeded by a map: the map at `expert_map_path`, read leniently (co-located
/// copies are a warning) and checked against the model; its redundancy wins over the configured
/// one, as in vLLM-Ascend. Dynamic or record without a map: the default layout with the
/// configured redundancy. Off: the contiguous layout without redundancy (vLLM's own map).
pub fn startup(cfg: &EplbConfig, model: &ModelInfo) -> Result<(Shape, Vec<u16>), StartError> {
    let topo = |s: Shape| s.topology(model.ranks_per_node.max(1), model.groups.max(1));
    if let Some(path) = cfg.expert_map_path() {
        let (shape, placement) = read_static_map(path, model)?;
        return Ok((topo(shape)?, placement));
    }
    let (shape, layout) = match cfg.mode() {
        Mode::Off | Mode::Static => (
            Shape::from_redundant(model.layers, model.experts, model.ranks, 0)?,
            Layout::Contiguous,
        ),
        Mode::Dynamic | Mode::Record => (
            cfg.shape(model.layers, model.experts, model.ranks)?,
            Layout::Default,
        ),
    };
    let shape = topo(shape)?;
    let mut p = vec![0u16; shape.placement_len()];
    layout.fill(&shape, &mut p)?;
    Ok((shape, p))
}

/// Reads a static expert map for `model`.
pub fn read_static_map(path: &Path, model: &ModelInfo) -> Result<(Shape, Vec<u16>), StartError> {
    let bytes =
        crate::fsio::read_bounded(path, crate::fsio::DEFAULT_INPUT_LIMIT).map_err(|error| {
            StartError::Read {
                path: path.to_path_buf(),
                error,
            }
        })?;
    let opts = ReadOptions::lenient()
        .experts(model.experts)
        .ranks(model.ranks)
        .layers(model.layers);
    let map = read_map_json(&bytes, &opts).map_err(|error| StartError::Map {
        path: path.to_path_buf(),
        error,
    })?;
    let shape = map.shape();
    if map.colocated_rows() > 0 {
        log::warn!(
            "eplb: {}: {} device rows hold an expert twice ({}); the second copy gets no tokens",
            path.display(),
            map.colocated_rows(),
            colocated_row_list(map.placement().as_slice(), &shape)
        );
    }
    Ok((shape, map.into_placement().into_vec()))
}

/// The rows `(layer, device)` of `placement` (`[L][R][S]` of `shape`) that hold an expert
/// twice, for a warning: `layer 3 device 5 (expert 37)`, the first 8 and a count of the rest.
pub fn colocated_row_list(placement: &[u16], shape: &Shape) -> String {
    const SHOWN: usize = 8;
    let (s, r) = (shape.slots_per_rank().max(1), shape.ranks().max(1));
    let mut rows = Vec::new();
    let mut more = 0usize;
    for (i, row) in placement.chunks_exact(s).enumerate() {
        let twice = row
            .iter()
            .enumerate()
            .find(|&(j, e)| row.get(..j).is_some_and(|h| h.contains(e)));
        if let Some((_, e)) = twice {
            if rows.len() < SHOWN {
                rows.push(format!("layer {} device {} (expert {e})", i / r, i % r));
            } else {
                more += 1;
            }
        }
    }
    let mut text = rows.join(", ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

/// The controller settings a config implies (dynamic or record modes).
pub fn controller_config(
    cfg: &EplbConfig,
    model: &ModelInfo,
) -> Result<ControllerConfig, StartError> {
    let mode = match cfg.mode() {
        Mode::Dynamic => RunMode::Dynamic,
        Mode::Record => RunMode::Record,
        m => return Err(StartError::NoController(m)),
    };
    Ok(ControllerConfig {
        machine: MachineConfig {
            heat_interval: cfg.heat_interval(),
            algo_interval: cfg.algo_interval(),
            stage: cfg.heat_stage(),
            classifier: StageClassifier::new(model.max_num_seqs, model.speculative_tokens),
            mode,
            seed: cfg.policy_seed(),
            max_collective_failures: DEFAULT_MAX_COLLECTIVE_FAILURES,
            // Taken from the transport by the controller.
            atomic_collectives: false,
        },
        replica_choice: if model.tp_size > 1 {
            ReplicaChoice::TpRotation(model.tp_size)
        } else {
            ReplicaChoice::Plain
        },
    })
}

/// The record-mode sink of rank 0: each plan is written to `path` as vLLM-Ascend's expert-map
/// JSON with [`crate::fsio::write_atomic`] (a temporary file in the same directory, fsynced and
/// renamed over the old one, keeping its permissions), so a reader never sees half a map. A
/// symbolic link is followed to the file it names; a FIFO or a character device is written
/// through, never replaced; a directory or another kind of file is an error. An engine that
/// handles SIGINT or SIGTERM itself can call [`crate::fsio::remove_pending_temporaries`]
/// before it exits, so that no temporary file of an interrupted write stays behind.
pub fn record_sink(path: PathBuf) -> RecordSink {
    Box::new(move |shape: &Shape, placement: &[u16]| {
        let p = Placement::new(*shape, placement)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let text = to_json(&p);
        crate::fsio::write_atomic(&path, text.as_bytes())
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn model() -> ModelInfo {
        ModelInfo {
            layers: 2,
            experts: 8,
            ranks: 2,
            ranks_per_node: 2,
            groups: 1,
            max_num_seqs: 16,
            speculative_tokens: 0,
            tp_size: 1,
        }
    }

    fn env() -> BTreeMap<String, String> {
        BTreeMap::from([("DYNAMIC_EPLB".to_string(), "true".to_string())])
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("eplb-modes-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn dynamic_starts_from_the_default_layout() {
        let cfg = EplbConfig::from_json_str(
            r#"{"dynamic_eplb": true, "num_redundant_experts": 2}"#,
            &env(),
        )
        .unwrap();
        let (shape, p) = startup(&cfg, &model()).unwrap();
        assert_eq!(shape.slots_per_rank(), 5);
        assert_eq!(&p[..10], &[0, 1, 2, 3, 4, 5, 6, 7, 0, 1]);
        let cc = controller_config(&cfg, &model()).unwrap();
        assert_eq!(
            (cc.machine.heat_interval, cc.machine.algo_interval),
            (600, 50)
        );
        assert_eq!(cc.machine.mode, RunMode::Dynamic);
    }

    #[test]
    fn off_is_vllms_contiguous_map_and_runs_no_controller() {
        let cfg = EplbConfig::default();
        let (shape, p) = startup(&cfg, &model()).unwrap();
        assert_eq!(shape.redundant(), 0);
        assert_eq!(&p[..8], &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(controller_config(&cfg, &model()).is_err());
    }

    #[test]
    fn static_map_loads_and_record_sink_writes_it_back() {
        let dir = tmp("static");
        let map = dir.join("map.json");
        let shape = Shape::new(2, 8, 2, 5).unwrap();
        let placement: Vec<u16> = vec![7, 2, 0, 3, 5, 6, 1, 4, 7, 2, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1];
        let mut sink = record_sink(map.clone());
        sink(&shape, &placement).unwrap();
        let cfg = EplbConfig::from_json_str(
            &format!(r#"{{"expert_map_path": {:?}}}"#, map.display().to_string()),
            &BTreeMap::new(),
        )
        .unwrap();
        let (s, p) = startup(&cfg, &model()).unwrap();
        assert_eq!(s.redundant(), 2);
        assert_eq!(p, placement);
        // A map for another model is refused.
        let mut other = model();
        other.experts = 9;
        assert!(startup(&cfg, &other).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_record_sink_follows_a_link_and_never_replaces_a_device() {
        use std::os::unix::fs::{FileTypeExt, symlink};
        let dir = tmp("record-targets");
        let shape = Shape::new(2, 8, 2, 5).unwrap();
        let placement: Vec<u16> = vec![7, 2, 0, 3, 5, 6, 1, 4, 7, 2, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1];
        let real = dir.join("real.json");
        std::fs::write(&real, "old").unwrap();
        let link = dir.join("record.json");
        symlink("real.json", &link).unwrap();
        record_sink(link.clone())(&shape, &placement).unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(
            std::fs::read_to_string(&real)
                .unwrap()
                .contains("layer_list")
        );
        record_sink(PathBuf::from("/dev/null"))(&shape, &placement).unwrap();
        let ft = std::fs::symlink_metadata("/dev/null").unwrap().file_type();
        assert!(ft.is_char_device());
        // A directory is an error naming the path, and stays.
        let e = record_sink(dir.clone())(&shape, &placement).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        assert!(dir.is_dir());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_joining_rank_starts_from_its_peers_placement_with_empty_rows() {
        use crate::transport::host::{HostTransport, HostWorld};
        use eplb_core::{EMPTY, LiveSet};
        let cfg = EplbConfig::from_json_str(
            r#"{"dynamic_eplb": true, "num_redundant_experts": 2}"#,
            &env(),
        )
        .unwrap();
        let (shape, mut p) = startup(&cfg, &model()).unwrap();
        let s = shape.slots_per_rank();
        // The peers retired rank 1's rows when it left.
        for layer in p.chunks_exact_mut(shape.slots_per_layer()) {
            layer[s..2 * s].fill(EMPTY);
        }
        let without = LiveSet::all(2).unwrap().without(&[1]).unwrap();
        let endpoint = || {
            let rows = vec![vec![EMPTY; s]; shape.layers()];
            HostTransport::new(
                HostWorld::new(2, std::time::Duration::from_secs(1)),
                1,
                &rows,
                8,
            )
        };
        let c = joining_controller(&cfg, &model(), endpoint(), &p, &without).unwrap();
        assert_eq!(c.placement(), p.as_slice());
        assert_eq!(c.live().iter().collect::<Vec<_>>(), [0]);
        assert!(c.expert_map(0).iter().all(|&slot| slot == -1));
        // Handed a live set that holds it, or a placement that keeps its rows: refused.
        let all = LiveSet::all(2).unwrap();
        let e = joining_controller(&cfg, &model(), endpoint(), &p, &all)
            .err()
            .unwrap();
        assert!(matches!(e, StartError::AlreadyLive { rank: 1 }), "{e}");
        let (_, kept) = startup(&cfg, &model()).unwrap();
        let e = joining_controller(&cfg, &model(), endpoint(), &kept, &without)
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("rank 1 is not live but holds expert"),
            "{e}"
        );
    }
}
