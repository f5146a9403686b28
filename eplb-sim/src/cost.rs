//! What a rebalance costs: expert copies moved, their bytes, and the time at a link per rank.
//!
//! [`move_cost`] plans each changed layer's transfers as the runtime does ([`eplb_runtime::transfer::plan_transfers`])
//! and counts, per layer, the expert copies sent between ranks, their bytes, and the bytes of
//! the busiest rank (the larger of what it sends and what it receives). At a [`Link`]
//! bandwidth per rank, a layer's exchange takes the busiest rank's bytes over the bandwidth
//! (the links work in parallel and in both directions); layers are updated one after another,
//! so a rebalance takes the sum over layers ([`MoveCost::transfer_ms`]). One expert's bytes are
//! its payload's ([`eplb_runtime::payload::ExpertPayload`]) for a catalogue model ([`ModelSpec`]) or custom
//! dimensions and a quant type ([`CostSpec`]).

use core::fmt;
use core::str::FromStr;

use eplb_core::Shape;
use eplb_core::time::ModelSpec;
use eplb_runtime::config::deployment::{QuantType, UnknownName};
use eplb_runtime::payload::{ExpertPayload, ModelDims, PayloadError};
use eplb_runtime::transfer::{PlanError, plan_transfers};
use serde_json::{Value, json};

/// The catalogue model named `name` or one of its aliases ([`ModelSpec::from_name`]); an
/// unknown name lists the presets and suggests the closest.
pub fn parse_model(name: &str) -> Result<ModelSpec, UnknownName> {
    ModelSpec::from_name(name).ok_or_else(|| {
        let names = model_names();
        UnknownName {
            what: "model",
            got: name.to_owned(),
            expected: names,
            suggestion: eplb_runtime::config::suggest::closest(name, names),
        }
    })
}

/// The catalogue's preset names, in [`ModelSpec::ALL`] order.
pub fn model_names() -> &'static [&'static str] {
    const NAMES: [&str; ModelSpec::ALL.len()] = {
        let mut out = [""; ModelSpec::ALL.len()];
        let mut i = 0;
        while i < out.len() {
            out[i] = ModelSpec::ALL[i].name;
            i += 1;
        }
        out
    };
    &NAMES
}

/// The catalogue model an `eplb-trace/v1` trace names in its `model` object (`name`, `arch`,
/// `num_experts`), when it is not the DeepSeek-V3 default: `deepseek_v2` with 64 experts (or
/// "lite" in the name) is DeepSeek-V2-Lite (the ESFT traces). `None` for anything else,
/// `deepseek_v3` included (the default already is DeepSeek-V3), except Kimi-K2 (`kimi_k2`, or
/// `deepseek_v3` with 384 experts or "kimi" in the name) and Mixtral (`mixtral` with 8
/// experts or none given).
pub fn model_from_trace(model: &Value) -> Option<ModelSpec> {
    let arch = model.get("arch")?.as_str()?.to_ascii_lowercase();
    let name = model
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_ascii_lowercase();
    let experts = model.get("num_experts").and_then(Value::as_u64);
    match arch.as_str() {
        "deepseek_v2" if experts == Some(64) || name.contains("lite") => {
            Some(ModelSpec::DEEPSEEK_V2_LITE)
        }
        "kimi_k2" => Some(ModelSpec::KIMI_K2),
        "deepseek_v3" if experts == Some(384) || name.contains("kimi") => Some(ModelSpec::KIMI_K2),
        "mixtral" if experts.is_none_or(|e| e == 8) => Some(ModelSpec::MIXTRAL_8X7B),
        _ => None,
    }
}

/// The bandwidth of each rank's link for weight transfers.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    name: String,
    bytes_per_s: f64,
}

/// Why a link description was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkError {
    /// The text given.
    pub got: String,
    /// A rate was given, but it is outside the physical range of a link
    /// ([`eplb_core::settings::bytes_per_s`]).
    pub out_of_range: Option<eplb_core::SettingError>,
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = &self.out_of_range {
            return write!(f, "link {:?}: {e}", self.got);
        }
        write!(
            f,
            "unknown link {:?}; expected 10gbps, hccs, roce or <N>gbps with N > 0",
            self.got
        )
    }
}

/// The slowest link rate accepted (Gbit/s): [`eplb_core::settings::MIN_BYTES_PER_S`] (8
/// Mbit/s).
pub const MIN_GBPS: f64 = eplb_core::settings::MIN_BYTES_PER_S * 8.0 / 1e9;

impl core::error::Error for LinkError {}

impl Link {
    /// The seed's minimum network for redistribution: 10 Gbit/s.
    pub fn min_10gbps() -> Self {
        Self {
            name: "10gbps".to_owned(),
            bytes_per_s: 10e9 / 8.0,
        }
    }

    /// A2 HCCS peer-to-peer: about 56 GB/s per NPU pair (`research/cann-hccl.md`, a secondary
    /// source, unconfirmed).
    pub fn hccs() -> Self {
        Self {
            name: "hccs".to_owned(),
            bytes_per_s: 56e9,
        }
    }

    /// One RoCE port per NPU at 200 GbE (`research/cann-hccl.md`, commonly quoted, not
    /// verified).
    pub fn roce() -> Self {
        Self {
            name: "roce".to_owned(),
            bytes_per_s: 200e9 / 8.0,
        }
    }

    /// `gbit` Gbit/s; `None` unless its rate passes [`Link::check_gbps`].
    pub fn gbps(gbit: f64) -> Option<Self> {
        Self::check_gbps(gbit).ok().map(|bytes_per_s| Self {
            name: format!("{gbit}gbps"),
            bytes_per_s,
        })
    }

    /// The bytes/s of `gbit` Gbit/s when it is a link's rate
    /// ([`eplb_core::settings::bytes_per_s`]: 8 Mbit/s to 8 Pbit/s).
    pub fn check_gbps(gbit: f64) -> Result<f64, eplb_core::SettingError> {
        eplb_core::settings::bytes_per_s("link", gbit * 1e9 / 8.0)
    }

    /// The name (`10gbps`, `hccs`, `roce`, `<N>gbps`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes per second.
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes_per_s
    }

    /// Gbit/s.
    pub fn gbit_per_s(&self) -> f64 {
        self.bytes_per_s * 8.0 / 1e9
    }

    /// Milliseconds to move `bytes` over this link.
    pub fn ms(&self, bytes: u64) -> f64 {
        bytes as f64 / self.bytes_per_s * 1e3
    }

    /// `{"name", "gbit_per_s"}`.
    pub fn to_json(&self) -> Value {
        json!({"name": self.name, "gbit_per_s": self.gbit_per_s()})
    }
}

impl FromStr for Link {
    type Err = LinkError;

    /// `10gbps` (the default), `hccs`, `roce`, or `<N>gbps` (`25gbps`, `2.5gbps`); any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        let err = || LinkError {
            got: s.to_owned(),
            out_of_range: None,
        };
        match t.as_str() {
            "hccs" => Ok(Link::hccs()),
            "roce" => Ok(Link::roce()),
            _ => {
                let n = t.strip_suffix("gbps").ok_or_else(err)?;
                let gbit: f64 = n.trim().parse().map_err(|_| err())?;
                if !(gbit.is_finite() && gbit > 0.0) {
                    return Err(err());
                }
                Link::check_gbps(gbit).map_err(|e| LinkError {
                    got: s.to_owned(),
                    out_of_range: Some(e),
                })?;
                let mut link = Link::gbps(gbit).ok_or_else(err)?;
                link.name = t;
                Ok(link)
            }
        }
    }
}

/// The cost of one layer's exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerCost {
    /// Expert copies sent between ranks.
    pub transfers: usize,
    /// Bytes sent between ranks.
    pub bytes: u64,
    /// The busiest rank's bytes: the larger of what it sends and what it receives.
    pub max_rank_bytes: u64,
}

/// The cost of going from one placement to another, per layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveCost {
    /// Bytes of one expert.
    pub expert_bytes: u64,
    /// Per layer (unchanged layers cost nothing).
    pub layers: Vec<LayerCost>,
}

impl MoveCost {
    /// Expert copies sent between ranks, over all layers.
    pub fn transfers(&self) -> usize {
        self.layers.iter().map(|l| l.transfers).sum()
    }

    /// Bytes sent between ranks, over all layers.
    pub fn bytes_moved(&self) -> u64 {
        self.layers.iter().map(|l| l.bytes).sum()
    }

    /// Bytes sent between ranks, per layer.
    pub fn bytes_per_layer(&self) -> Vec<u64> {
        self.layers.iter().map(|l| l.bytes).collect()
    }

    /// Estimated time of the whole update at `link` per rank: per layer, the busiest rank's
    /// bytes over the bandwidth; layers one after another.
    pub fn transfer_ms(&self, link: &Link) -> f64 {
        self.layers.iter().map(|l| link.ms(l.max_rank_bytes)).sum()
    }

    /// The longest single layer's exchange at `link` (it must hide behind one forward).
    pub fn transfer_ms_max_layer(&self, link: &Link) -> f64 {
        self.layers
            .iter()
            .map(|l| link.ms(l.max_rank_bytes))
            .fold(0.0, f64::max)
    }
}

/// The cost of replacing placement `old` with `new` (both `[L][R][S]` of `shape`) when one
/// expert is `expert_bytes` long; each changed layer is planned as the runtime plans it.
pub fn move_cost(
    shape: &Shape,
    old: &[u16],
    new: &[u16],
    expert_bytes: usize,
) -> Result<MoveCost, PlanError> {
    for (what, got) in [("old placement", old.len()), ("new placement", new.len())] {
        if got != shape.placement_len() {
            return Err(PlanError::Shape {
                what,
                expected: shape.placement_len(),
                got,
            });
        }
    }
    let per = shape.slots_per_layer().max(1);
    let bytes = expert_bytes as u64;
    let mut layers = Vec::with_capacity(shape.layers());
    for (o, n) in old.chunks_exact(per).zip(new.chunks_exact(per)) {
        if o == n {
            layers.push(LayerCost {
                transfers: 0,
                bytes: 0,
                max_rank_bytes: 0,
            });
            continue;
        }
        let (transfers, _) = plan_transfers(shape, o, n)?;
        let mut sent = vec![0u64; shape.ranks()];
        let mut recv = vec![0u64; shape.ranks()];
        for t in &transfers {
            if let Some(s) = sent.get_mut(usize::from(t.src)) {
                *s = s.saturating_add(bytes);
            }
            if let Some(r) = recv.get_mut(usize::from(t.dst)) {
                *r = r.saturating_add(bytes);
            }
        }
        let max_rank_bytes = sent.iter().chain(&recv).copied().max().unwrap_or(0);
        layers.push(LayerCost {
            transfers: transfers.len(),
            bytes: bytes.saturating_mul(transfers.len() as u64),
            max_rank_bytes,
        });
    }
    Ok(MoveCost {
        expert_bytes: bytes,
        layers,
    })
}

/// The cost of each step of a sequence of placements (`placements[k]` to `placements[k+1]`).
pub fn sequence_cost<'p>(
    shape: &Shape,
    placements: impl IntoIterator<Item = &'p [u16]>,
    expert_bytes: usize,
) -> Result<Vec<MoveCost>, PlanError> {
    let mut out = Vec::new();
    let mut prev: Option<&[u16]> = None;
    for p in placements {
        if let Some(old) = prev {
            out.push(move_cost(shape, old, p, expert_bytes)?);
        }
        prev = Some(p);
    }
    Ok(out)
}

/// What a cost estimate is asked for (the command-line flags); unset fields take the defaults:
/// DeepSeek-V3, W8A8, the 10 Gbit/s link.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CostSpec {
    /// A catalogue model.
    pub model: Option<ModelSpec>,
    /// `H`, given with `intermediate` instead of a preset.
    pub hidden: Option<u64>,
    /// `I`, given with `hidden` instead of a preset.
    pub intermediate: Option<u64>,
    /// The quant type.
    pub quant: Option<QuantType>,
    /// Whether fused MC2 is on.
    pub fused_mc2: bool,
    /// The link per rank.
    pub link: Option<Link>,
}

/// A resolved [`CostSpec`]: the payload and link a cost estimate uses.
#[derive(Debug, Clone, PartialEq)]
pub struct CostBasis {
    /// The model's name (a preset's title, or `custom`).
    pub model: String,
    /// Its dimensions.
    pub dims: ModelDims,
    /// The quant type.
    pub quant: QuantType,
    /// Whether fused MC2 is on.
    pub fused_mc2: bool,
    /// One expert's tensors.
    pub payload: ExpertPayload,
    /// The link per rank.
    pub link: Link,
    /// Which of `model`, `quant`, `link` were defaulted.
    pub defaulted: Vec<&'static str>,
    /// The catalogue model (given, from the trace, or the DeepSeek-V3 default); `None` for
    /// custom dimensions (`--hidden`/`--intermediate`).
    pub preset: Option<ModelSpec>,
}

/// `n` bytes in binary units (`42.04 MiB`).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = "B";
    for u in UNITS {
        unit = u;
        if v < 1024.0 || u == "TiB" {
            break;
        }
        v /= 1024.0;
    }
    if unit == "B" {
        format!("{n} B")
    } else {
        format!("{v:.2} {unit}")
    }
}

/// A duration in milliseconds for people (`35.3 ms`, `4.21 s`).
pub fn human_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}

/// Why the cost settings cannot size an expert.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CostError {
    /// A model preset and the hidden or intermediate size were both given.
    ModelAndSizes,
    /// Only one of the hidden and intermediate sizes was given.
    SizesApart,
    /// The payload cannot be built (a zero size, or a quant type that needs fused MC2).
    Payload(PayloadError),
}

impl fmt::Display for CostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CostError::ModelAndSizes => {
                f.write_str("give either a model or the hidden and intermediate sizes, not both")
            }
            CostError::SizesApart => f.write_str("the hidden and intermediate sizes go together"),
            CostError::Payload(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for CostError {}

impl CostSpec {
    /// Applies the defaults and builds the payload. `hidden` and `intermediate` go together
    /// and exclude `model`.
    pub fn resolve(&self) -> Result<CostBasis, CostError> {
        self.resolve_for_trace(None)
    }

    /// [`CostSpec::resolve`] for a trace of `trace_model` (see [`model_from_trace`]): with no
    /// `model`, `hidden` or `intermediate` given, the expert is sized by the trace's model
    /// instead of the DeepSeek-V3 default. An unset quant type is the catalogue model's
    /// checkpoint type ([`QuantType::checkpoint`]) whether the model was named or inferred, so
    /// naming the trace's own model prices it exactly as inferring it does.
    pub fn resolve_for_trace(
        &self,
        trace_model: Option<ModelSpec>,
    ) -> Result<CostBasis, CostError> {
        let mut defaulted = Vec::new();
        let mut preset = None;
        let (model, dims) = match (self.model, self.hidden, self.intermediate) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
                return Err(CostError::ModelAndSizes);
            }
            (None, Some(hidden), Some(intermediate)) => (
                "custom".to_owned(),
                ModelDims {
                    hidden,
                    intermediate,
                },
            ),
            (None, Some(_), None) | (None, None, Some(_)) => {
                return Err(CostError::SizesApart);
            }
            (Some(m), None, None) => {
                preset = Some(m);
                (m.label.to_owned(), ModelDims::of(&m))
            }
            (None, None, None) => match trace_model {
                Some(m) => {
                    preset = Some(m);
                    (format!("{} (from the trace)", m.label), ModelDims::of(&m))
                }
                None => {
                    defaulted.push("model");
                    let m = ModelSpec::DEEPSEEK_V3;
                    preset = Some(m);
                    (m.label.to_owned(), ModelDims::of(&m))
                }
            },
        };
        let quant = self.quant.unwrap_or_else(|| {
            defaulted.push("quant");
            preset.map_or(QuantType::W8A8, |m| QuantType::checkpoint(&m))
        });
        let link = self.link.clone().unwrap_or_else(|| {
            defaulted.push("link");
            Link::min_10gbps()
        });
        let payload =
            ExpertPayload::for_quant(dims, quant, self.fused_mc2).map_err(CostError::Payload)?;
        Ok(CostBasis {
            model,
            dims,
            quant,
            fused_mc2: self.fused_mc2,
            payload,
            link,
            defaulted,
            preset,
        })
    }
}

impl CostBasis {
    /// `{"model", "hidden", "intermediate", "quant_type", "fused_mc2", "expert_bytes",
    /// "tensors", "defaulted"}`.
    pub fn payload_json(&self) -> Value {
        let p = self.payload.to_json();
        json!({
            "model": self.model,
            "hidden": self.dims.hidden,
            "intermediate": self.dims.intermediate,
            "quant_type": self.quant.name(),
            "fused_mc2": self.fused_mc2,
            "expert_bytes": p.get("expert_bytes"),
            "tensors": p.get("tensors"),
            "defaulted": self.defaulted,
        })
    }

    /// One line: the model, quant type, expert size, link, and what was defaulted.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "payload: {} (H={}, I={}) {}{}, {} per expert ({} bytes, {} tensors); link {} ({} Gbit/s per rank)",
            self.model,
            self.dims.hidden,
            self.dims.intermediate,
            self.quant,
            if self.fused_mc2 { " fused MC2" } else { "" },
            human_bytes(self.payload.total_bytes() as u64),
            self.payload.total_bytes(),
            self.payload.tensors().len(),
            self.link.name(),
            self.link.gbit_per_s()
        );
        if !self.defaulted.is_empty() {
            s.push_str(&format!(
                " [default {}: set --model/--quant/--link]",
                self.defaulted.join(", ")
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(44 * 1024), "44.00 KiB");
        assert_eq!(human_bytes(42 * 1024 * 1024), "42.00 MiB");
        assert_eq!(human_ms(35.25), "35.2 ms");
        assert_eq!(human_ms(4210.0), "4.21 s");
    }

    #[test]
    fn links() {
        assert_eq!("10gbps".parse::<Link>().unwrap(), {
            let mut l = Link::min_10gbps();
            l.name = "10gbps".into();
            l
        });
        assert_eq!("HCCS".parse::<Link>().unwrap().bytes_per_s(), 56e9);
        assert_eq!("roce".parse::<Link>().unwrap().gbit_per_s(), 200.0);
        assert_eq!("2.5gbps".parse::<Link>().unwrap().bytes_per_s(), 312.5e6);
        for bad in ["0gbps", "-1gbps", "fast", "gbps", "nangbps", "infgbps"] {
            assert!(bad.parse::<Link>().is_err(), "{bad}");
        }
    }
}
