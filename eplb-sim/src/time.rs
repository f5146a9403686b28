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
use eplb_core::time::{
    Hardware, LayerTime, ModelSpec, Role, TimeModel, cycle_overhead_ms, exchange_ms, layer_stall_ms,
};
use eplb_runtime::transfer::plan_transfers;
use serde_json::{Value, json};

use crate::Run;
use crate::SimError;
use crate::cost::{CostBasis, ModelPreset, MoveCost};
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
/// and `reload_bytes_per_s` ([`DEFAULT_RELOAD_BYTES_PER_S`]).
pub const HW_PARAMS: [&str; 9] = [
    "flops_bf16",
    "flops_8bit",
    "flops_fp4",
    "hbm_bytes_per_s",
    "intra_node_bytes_per_s",
    "inter_node_bytes_per_s",
    "layer_overhead_ms",
    "collective_ms",
    "reload_bytes_per_s",
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
}

/// A resolved [`TimeSpec`]: the model the estimates use and what names it.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeBasis {
    /// The model (hardware, model shape, `T`, expert bytes, ranks per node).
    pub model: TimeModel,
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
        if let Some(t) = self.tokens_per_rank
            && !(t.is_finite() && t > 0.0)
        {
            return Err(setting(
                "--tokens-per-rank",
                format!("{t} is not a finite number > 0"),
            ));
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
            Some(p) => p.model_spec(),
            None => ModelSpec {
                name: "custom",
                hidden: u32::try_from(cost.dims.hidden).unwrap_or(u32::MAX),
                intermediate: u32::try_from(cost.dims.intermediate).unwrap_or(u32::MAX),
                ..ModelPreset::DeepSeekV3.model_spec()
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
        Ok(TimeBasis {
            model: tm,
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
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(setting(
                &format!("--hw-param reload_bytes_per_s={v}"),
                "expected a finite number of bytes/s > 0".to_owned(),
            ))
        }
    }
}

fn set_hw(hw: &mut Hardware, key: &str, v: f64) -> Result<(), SimError> {
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
    hw.check()
        .map_err(|e| setting(&format!("--hw-param {key}={v}"), e.to_string()))
}

fn set_model(m: &mut ModelSpec, key: &str, v: f64) -> Result<(), SimError> {
    let bad = |why: &str| setting(&format!("--model-param {key}={v}"), why.to_owned());
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
    /// routing.
    pub fn gate(&self, cfg: &SimConfig) -> eplb_core::time::gate::Gate {
        eplb_core::time::gate::Gate {
            model: self.model,
            iterations: u64::from(cfg.heat_interval) + u64::from(cfg.algo_interval),
            routing: cfg.routing,
        }
    }

    /// The `time_model` object of `simulate --json`: hardware, model, role, tokens per rank,
    /// expert bytes, dtype, ranks per node, iterations per window, what was defaulted, and
    /// every number of the hardware and the model.
    pub fn to_json(&self) -> Value {
        let tm = &self.model;
        let hw = &tm.hardware;
        let m = &tm.model;
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
            },
        })
    }

    /// One line for people: hardware, model, role, `T`, expert size.
    pub fn describe(&self) -> String {
        let tm = &self.model;
        let mut s = format!(
            "time model: {} on {} ({} ms per layer overhead), {} {}, {} tokens per rank per iteration, {:.1} MB per expert, one window = one iteration",
            tm.model.name,
            tm.hardware.name,
            tm.hardware.layer_overhead_ms,
            self.role.name(),
            tm.model.dtype.name(),
            tm.tokens_per_rank,
            tm.expert_bytes / 1e6
        );
        if !self.defaulted.is_empty() {
            s.push_str(&format!(
                " [default {}: set --hardware/--role/--tokens-per-rank]",
                self.defaulted.join(", ")
            ));
        }
        s
    }
}

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

/// A run's time figures, per window and per cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeFigures {
    /// Estimated MoE ms of one iteration under the placement live in each window.
    pub per_window_ms: Vec<f64>,
    /// The same under the run's initial placement (`static`).
    pub static_per_window_ms: Vec<f64>,
    /// One entry per cycle that reached its activation, in order.
    pub stalls: Vec<CycleStall>,
    /// The first window of the means (`H + A`, the first activation; as the PAR metrics).
    pub first_window: usize,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

impl TimeFigures {
    fn tail<'a>(&self, v: &'a [f64]) -> &'a [f64] {
        v.get(self.first_window..).unwrap_or(&[])
    }

    /// Mean estimated MoE ms per iteration from the first activation.
    pub fn mean_ms(&self) -> f64 {
        mean(self.tail(&self.per_window_ms))
    }

    /// The same under the initial placement.
    pub fn static_mean_ms(&self) -> f64 {
        mean(self.tail(&self.static_per_window_ms))
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

    /// Net saving against `baseline_per_window_ms` (per window, ms), percent, over the windows
    /// from the first activation: `(base - (policy + stalls)) / base * 100`.
    pub fn net_saving_pct_against(&self, baseline_per_window_ms: &[f64]) -> f64 {
        let base: f64 = self.tail(baseline_per_window_ms).iter().sum();
        let ours: f64 = self.tail(&self.per_window_ms).iter().sum::<f64>() + self.stall_total_ms();
        if base > 0.0 {
            (base - ours) / base * 100.0
        } else {
            f64::NAN
        }
    }

    /// Net saving against the run's own initial placement, percent.
    pub fn net_saving_pct(&self) -> f64 {
        self.net_saving_pct_against(&self.static_per_window_ms)
    }

    /// The time keys of `simulate --json` (`est_*` and `time_model`).
    pub(crate) fn add_json(&self, v: &mut Value, basis: &TimeBasis) {
        v["est_moe_ms_per_iter_mean"] = json!(self.mean_ms());
        v["est_moe_ms_per_iter_static"] = json!(self.static_mean_ms());
        v["est_stall_ms_total"] = json!(self.stall_total_ms());
        v["est_stall_ms_per_cycle_max"] = json!(self.stall_max_ms());
        v["est_stall_ms_per_cycle_mean"] = json!(self.stall_mean_ms());
        v["est_net_saving_pct"] = json!(self.net_saving_pct());
        v["time_model"] = basis.to_json();
    }

    /// One line for people.
    pub fn describe(&self, basis: &TimeBasis) -> String {
        let tm = &basis.model;
        format!(
            "time ({} {} on {}, {}, {} tokens per rank): {} ms MoE per iteration from first activation (static {} ms); stalls {} ms in total, at most {} ms per cycle; net saving {}% against static",
            tm.model.name,
            tm.model.dtype.name(),
            tm.hardware.name,
            basis.role.name(),
            tm.tokens_per_rank,
            fixed(self.mean_ms(), 3),
            fixed(self.static_mean_ms(), 3),
            fixed(self.stall_total_ms(), 2),
            fixed(self.stall_max_ms(), 2),
            fixed(self.net_saving_pct(), 2)
        )
    }
}

/// The estimated MoE ms per iteration of every window of `trace`, served by `placements`
/// (`(first window, placement [L][R][S])`, in window order, the first from window 0) routed
/// with `cfg.routing`.
pub fn window_ms<'p>(
    trace: &SimTrace,
    shape: &Shape,
    cfg: &SimConfig,
    tm: &TimeModel,
    placements: impl IntoIterator<Item = (usize, &'p [u16])>,
) -> Result<Vec<f64>, SimError> {
    let (l, n) = (trace.layers, trace.experts);
    let (r, s) = (shape.ranks(), shape.slots_per_rank());
    let mut it = placements.into_iter().peekable();
    let Some((_, first)) = it.next() else {
        return Ok(Vec::new());
    };
    let mut router = Router::new(shape, first, cfg.routing);
    let mut routed = vec![0u32; shape.placement_len()];
    let mut loads = vec![0.0f64; shape.placement_len()];
    let mut per_layer = vec![LayerTime::default(); l];
    let mut out = Vec::with_capacity(trace.windows);
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
        let ms = tm
            .model_time(r, s, &loads, &mut per_layer)
            .map_err(|error| SimError::TimeModel {
                window: Some(w),
                layer: None,
                error,
            })?;
        out.push(ms);
    }
    Ok(out)
}

/// The time figures of `run` over `trace`. Each cycle's stall: one digest, and per changed
/// layer one vote plus the part of its exchange beyond one iteration. The exchange takes the
/// busiest rank's bytes (`MoveCost`) over the intra-node link, or the inter-node one when
/// `cfg.ranks_per_node` splits the ranks and one of the layer's transfers
/// ([`eplb_runtime::transfer::plan_transfers`]) crosses nodes; the iteration it hides behind is the
/// estimate of the window before the activation (under the old placement). Every cycle of a
/// policy pays the digest, also one that changed nothing; `static` (no EPLB) pays nothing.
/// `static_ms`: the initial placement's per-window figures when already known.
pub fn estimate(
    trace: &SimTrace,
    run: &Run,
    cfg: &SimConfig,
    basis: &TimeBasis,
    static_ms: Option<&[f64]>,
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
    static_ms: Option<&[f64]>,
) -> Result<TimeFigures, SimError> {
    let tm = &basis.model;
    let per_window_ms = window_ms(
        trace,
        shape,
        cfg,
        tm,
        log.iter()
            .map(|e| (e.active_from_window, e.placement.as_slice())),
    )?;
    let static_per_window_ms = match (static_ms, log.len()) {
        (Some(s), _) => s.to_vec(),
        (None, 1) => per_window_ms.clone(),
        (None, _) => window_ms(
            trace,
            shape,
            cfg,
            tm,
            log.first().map(|e| (0, e.placement.as_slice())),
        )?,
    };
    let per = shape.slots_per_layer().max(1);
    let hw = &tm.hardware;
    let g = cfg
        .ranks_per_node
        .map(usize::from)
        .filter(|&g| g > 0 && g < shape.ranks());
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
        let iteration = per_window_ms
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
            let ex = exchange_ms(lc.max_rank_bytes as f64, crosses, hw).map_err(time_err)?;
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
        per_window_ms,
        static_per_window_ms,
        stalls,
        first_window,
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
