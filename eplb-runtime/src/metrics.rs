//! Prometheus metrics of the serving runtime, with vLLM's definitions.
//!
//! [`Metrics::register`] puts eplb's metric families into a [`Registry`] the engine owns (or one
//! it creates and hands to its `/metrics` handler): never a global. The families are updated
//! only when a cycle event happens, by a [`RankObserver`] that the
//! [`Controller`](crate::controller::Controller) calls after each forward
//! ([`Controller::set_metrics`](crate::controller::Controller::set_metrics)); on a forward
//! where nothing happened the observer compares four words and returns. The simulator feeds
//! the same families from a replay (`eplb simulate --metrics-out`).
//!
//! | name (default prefix `eplb_`) | type | labels | what |
//! | --- | --- | --- | --- |
//! | `eplb_balancedness_{min,p50,p90,avg}` | gauge | `when` = `before`, `after` | per layer, mean over max rank load (1 = perfect), summarised over layers for the last planned cycle; `p90` is the 10th percentile across layers (90% of layers are at least this balanced), as vLLM's `vllm:eplb_balancedness_p90` |
//! | `eplb_par_{mean,max}` | gauge | `when` | PAR (max over mean rank load) averaged / maximised over layers: the `[Expert Hotness]` log line |
//! | `eplb_health` | gauge | `state` = `running`, `suspended`, `diverged` | 1 for the rank's state, 0 for the others |
//! | `eplb_cycles_total` | counter | | cycles that reached their plan decision (taken, or failed everywhere) |
//! | `eplb_rearrangements_total` | counter | | cycles that moved at least one layer (vLLM's rearrangements) |
//! | `eplb_layers_moved_total` | counter | | layers committed |
//! | `eplb_expert_copies_moved_total` | counter | | expert copies fetched by committed layers, over every rank |
//! | `eplb_moved_bytes_total` | counter | | those copies times the expert's bytes |
//! | `eplb_plans_late_total` | counter | | iterations at which the plan was due but not ready on every rank |
//! | `eplb_plans_failed_total` | counter | | cycles whose plan failed on some rank |
//! | `eplb_collectives_failed_total` | counter | | collectives that failed on this rank |
//! | `eplb_digest_mismatches_total` | counter | | cycles abandoned because ranks held different plans |
//! | `eplb_layers_aborted_total` | counter | | layer exchanges that failed somewhere (the layer kept its placement) |
//! | `eplb_walk_duration_seconds` | histogram | | from the taken plan to the end of its layer walk |
//! | `eplb_planner_duration_seconds` | histogram | | the policy call alone |
//! | `eplb_gate_saving_step_share` | gauge | | with the pay-off gate on (`eplb_payoff_gate`): the predicted saving per iteration of the layers the last taken plan moved, as a share of the step (`GateSummary::saving_share`); 0 without the gate |
//! | `eplb_gate_forgone_step_share` | gauge | | the predicted saving the gate gave up on that plan (layers held on their placement), as a share of the step; 0 without the gate |
//!
//! 27 series and two histograms of 16 buckets (`+Inf` included) with `_sum` and `_count`: 63
//! samples per rank, whatever the model. Opt-in
//! ([`MetricsSettings::per_layer`]): `eplb_layer_balancedness{layer, when}` and
//! `eplb_layer_expert_copies_moved_total{layer}`, `3 L` more series (174 on DeepSeek-V3's 58
//! layers). Series come out in a fixed order (no hash-map order).
//!
//! **Invariant:** nothing here runs on a forward where no cycle event happened, beyond the
//! check that none did; no panic on any input.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use eplb_core::Shape;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::planner::Plan;
use crate::rank::{Events, Health, MachineStats, RankMachine};

/// The default name prefix (`eplb_`).
pub const DEFAULT_PREFIX: &str = "eplb";

/// Upper bounds of `eplb_planner_duration_seconds`: 1 ms doubling to 16.4 s (15 buckets + `+Inf`).
pub fn planner_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 15)
}
/// Upper bounds of `eplb_walk_duration_seconds`: 10 ms doubling to 164 s (15 buckets + `+Inf`).
pub fn walk_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.01, 2.0, 15)
}

/// What to export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    /// Name prefix without the underscore (`eplb`): `<prefix>_balancedness_min`, ...
    pub prefix: String,
    /// Also the per-layer series (`3 L` of them).
    pub per_layer: bool,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            per_layer: false,
        }
    }
}

type GaugeF = Gauge<f64, AtomicU64>;
type Labels = Vec<(&'static str, String)>;

/// Metrics of one family under fixed label sets, encoded in the order given (a
/// `prometheus_client` `Family` encodes in hash-map order).
#[derive(Debug, Clone)]
struct Series<M> {
    series: Arc<Vec<(Labels, M)>>,
}

impl<M: EncodeMetric + TypedMetric> EncodeMetric for Series<M> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, m) in self.series.iter() {
            m.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }
    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

impl<M: Default> Series<M> {
    fn new(labels: impl IntoIterator<Item = Labels>) -> Self {
        Self {
            series: Arc::new(labels.into_iter().map(|l| (l, M::default())).collect()),
        }
    }
}
impl<M> Series<M> {
    fn at(&self, i: usize) -> Option<&M> {
        self.series.get(i).map(|(_, m)| m)
    }
}

fn when(w: &'static str) -> Labels {
    vec![("when", w.to_owned())]
}
/// `when="before"` (index 0) and `when="after"` (index 1).
fn before_after<M: Default>() -> Series<M> {
    Series::new([when("before"), when("after")])
}

/// Balancedness summaries of one side (before or after a plan) over layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Balancedness {
    /// The least balanced layer.
    pub min: f64,
    /// The median layer.
    pub p50: f64,
    /// The 10th percentile across layers (vLLM's `p90`: 90% of layers are at least this
    /// balanced).
    pub p90: f64,
    /// The mean over layers.
    pub avg: f64,
}

/// A layer's balancedness (mean over max rank load) from its PAR (max over mean): `1 / PAR`;
/// a layer without load (PAR 0 or not finite) counts as balanced (1).
pub fn balancedness_of_par(par: f64) -> f64 {
    // PAR below 1 cannot happen for max over mean; it is read as balanced rather than > 1.
    if par.is_finite() && par >= 1.0 {
        1.0 / par
    } else {
        1.0
    }
}

impl Balancedness {
    /// The summaries of per-layer PAR values (`[L]`); all 1 without layers.
    pub fn from_par(par: &[f64]) -> Self {
        let mut b: Vec<f64> = par.iter().map(|&p| balancedness_of_par(p)).collect();
        if b.is_empty() {
            return Self {
                min: 1.0,
                p50: 1.0,
                p90: 1.0,
                avg: 1.0,
            };
        }
        b.sort_by(f64::total_cmp);
        let avg = b.iter().sum::<f64>() / b.len() as f64;
        Self {
            min: b.first().copied().unwrap_or(1.0),
            p50: quantile(&b, 0.5),
            p90: quantile(&b, 0.1),
            avg,
        }
    }
}

/// Linear-interpolated quantile `q` of sorted, non-empty `v` (numpy's default).
fn quantile(v: &[f64], q: f64) -> f64 {
    let pos = q * v.len().saturating_sub(1) as f64;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(v.len().saturating_sub(1));
    match (v.get(lo), v.get(hi)) {
        (Some(&a), Some(&b)) => a + (b - a) * (pos - lo as f64),
        _ => 1.0,
    }
}

/// The metric families, shared by every clone of [`Metrics`].
#[derive(Debug)]
struct Families {
    bal: [Series<GaugeF>; 4],
    par_mean: Series<GaugeF>,
    par_max: Series<GaugeF>,
    health: Series<Gauge>,
    cycles: Counter,
    rearrangements: Counter,
    layers_moved: Counter,
    copies_moved: Counter,
    bytes_moved: Counter,
    late: Counter,
    failed_plans: Counter,
    failed_collectives: Counter,
    digest_mismatches: Counter,
    layers_aborted: Counter,
    walk: Histogram,
    planner: Histogram,
    gate_saving_share: GaugeF,
    gate_forgone_share: GaugeF,
    /// `[L][before, after]` when per-layer series are on.
    layer_bal: Option<Series<GaugeF>>,
    /// `[L]` when per-layer series are on.
    layer_copies: Option<Series<Counter>>,
}

/// A handle on eplb's metric families in a registry (cheap to clone; every clone updates the
/// same series).
#[derive(Debug, Clone)]
pub struct Metrics {
    f: Arc<Families>,
}

/// What one cycle's plan decision says, for [`Metrics::record_plan`].
#[derive(Debug, Clone, Copy)]
pub struct PlanSample<'a> {
    /// Per layer PAR before the plan (the live placement under the cycle's heat).
    pub par_before: &'a [f64],
    /// Per layer PAR after it (the plan under the same heat).
    pub par_after: &'a [f64],
    /// The policy's wall time.
    pub planner_time: Duration,
    /// What the pay-off gate decided for the plan (`None`: the gate is off).
    pub gate: Option<eplb_core::time::gate::GateSummary>,
}

impl Metrics {
    /// Registers eplb's families in `registry` under `settings.prefix` (an empty prefix: no
    /// prefix); `layers` sizes the per-layer series.
    pub fn register(registry: &mut Registry, settings: &MetricsSettings, layers: usize) -> Self {
        let reg = if settings.prefix.is_empty() {
            registry
        } else {
            registry.sub_registry_with_prefix(&settings.prefix)
        };
        let f = Families::new(settings, layers);
        f.register(reg);
        Self { f: Arc::new(f) }
    }

    /// A cycle reached its plan decision: `plan` when every rank took it (its balancedness,
    /// PAR and planner time are exported), `None` when it failed or was abandoned.
    pub fn record_plan(&self, plan: Option<&PlanSample<'_>>) {
        let f = &self.f;
        f.cycles.inc();
        let Some(p) = plan else {
            return;
        };
        for (side, par) in [p.par_before, p.par_after].into_iter().enumerate() {
            let b = Balancedness::from_par(par);
            for (s, v) in f.bal.iter().zip([b.min, b.p50, b.p90, b.avg]) {
                if let Some(g) = s.at(side) {
                    g.set(v);
                }
            }
            let (mean, max) = if par.is_empty() {
                (1.0, 1.0)
            } else {
                (
                    par.iter().sum::<f64>() / par.len() as f64,
                    par.iter().copied().fold(f64::MIN, f64::max),
                )
            };
            if let Some(g) = f.par_mean.at(side) {
                g.set(mean);
            }
            if let Some(g) = f.par_max.at(side) {
                g.set(max);
            }
            if let Some(s) = &f.layer_bal {
                for (l, &x) in par.iter().enumerate() {
                    if let Some(g) = s.at(2 * l + side) {
                        g.set(balancedness_of_par(x));
                    }
                }
            }
        }
        f.planner.observe(p.planner_time.as_secs_f64());
        if let Some(g) = &p.gate {
            f.gate_saving_share.set(g.saving_share());
            f.gate_forgone_share.set(g.forgone_share());
        }
    }

    /// A layer committed, having fetched `copies` expert copies over every rank, `bytes` in all.
    pub fn record_layer_moved(&self, layer: usize, copies: u64, bytes: u64) {
        let f = &self.f;
        f.layers_moved.inc();
        f.copies_moved.inc_by(copies);
        f.bytes_moved.inc_by(bytes);
        if let Some(c) = f.layer_copies.as_ref().and_then(|s| s.at(layer)) {
            c.inc_by(copies);
        }
    }

    /// A walk ended after `took` (`None`: not timed, as in a replay); `rearranged`: it
    /// committed at least one layer.
    pub fn record_walk(&self, took: Option<Duration>, rearranged: bool) {
        if let Some(t) = took {
            self.f.walk.observe(t.as_secs_f64());
        }
        if rearranged {
            self.f.rearrangements.inc();
        }
    }

    /// Adds the failure counters' increments.
    pub fn record_failures(&self, d: &Failures) {
        let f = &self.f;
        f.late.inc_by(d.late_plans);
        f.failed_plans.inc_by(d.failed_plans);
        f.failed_collectives.inc_by(d.failed_collectives);
        f.digest_mismatches.inc_by(d.digest_mismatches);
        f.layers_aborted.inc_by(d.layers_aborted);
    }

    /// Sets the health gauge.
    pub fn record_health(&self, h: Health) {
        let state = match h {
            Health::Running => 0,
            Health::Suspended { .. } => 1,
            Health::Diverged => 2,
        };
        for (i, (_, g)) in self.f.health.series.iter().enumerate() {
            g.set(i64::from(i == state));
        }
    }
}

/// The content type of [`encode_text`]: the Prometheus text format 0.0.4.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of [`encode_openmetrics`].
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `registry` in the OpenMetrics text format (`# EOF` last), as `prometheus_client` writes it,
/// with the families that sub-registries split merged ([`merge_families`]).
pub fn encode_openmetrics(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(merge_families(&text))
}

/// One family of each name: `prometheus_client` writes a family once per sub-registry (ranks of
/// one process registered with `sub_registry_with_label(("rank", ..))`), which both text formats
/// forbid (`promtool`: "second HELP line"). Keeps the first `# HELP` / `# TYPE` / `# UNIT` of
/// each name and puts every sample of the name under it, families in first-seen order, samples
/// in their order; `# EOF` stays last.
pub fn merge_families(text: &str) -> String {
    let mut order: Vec<&str> = Vec::new();
    let mut fams: std::collections::BTreeMap<&str, (Vec<&str>, Vec<&str>)> =
        std::collections::BTreeMap::new();
    let mut current: Option<&str> = None;
    let mut eof = false;
    for line in text.lines() {
        if line == "# EOF" {
            eof = true;
            continue;
        }
        let meta = ["# HELP ", "# TYPE ", "# UNIT "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p));
        if let Some(rest) = meta {
            let name = rest.split(' ').next().unwrap_or(rest);
            let fam = fams.entry(name).or_insert_with(|| {
                order.push(name);
                (Vec::new(), Vec::new())
            });
            let kind = line.get(..7).unwrap_or("");
            if !fam.0.iter().any(|m| m.get(..7) == Some(kind)) {
                fam.0.push(line);
            }
            current = Some(name);
            continue;
        }
        match current.and_then(|c| fams.get_mut(c)) {
            Some(fam) => fam.1.push(line),
            None => {
                // A sample before any family header: keep it under its own name.
                order.push(line);
                fams.insert(line, (Vec::new(), vec![line]));
            }
        }
    }
    let mut out = String::with_capacity(text.len());
    for name in order {
        if let Some((meta, samples)) = fams.get(name) {
            for l in meta.iter().chain(samples) {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    if eof {
        out.push_str("# EOF\n");
    }
    out
}

/// `registry` in the Prometheus text format 0.0.4 (what `promtool check metrics`, the
/// node exporter's textfile collector and every Prometheus read): the OpenMetrics text with each
/// counter family named by its `_total` samples in `# HELP` / `# TYPE`, and without `# UNIT`
/// and `# EOF`.
pub fn encode_text(registry: &Registry) -> Result<String, std::fmt::Error> {
    Ok(openmetrics_to_text(&encode_openmetrics(registry)?))
}

/// The conversion of [`encode_text`].
pub fn openmetrics_to_text(om: &str) -> String {
    let counters: std::collections::BTreeSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len() + 16 * counters.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(p);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                if !tail.is_empty() {
                    out.push(' ');
                    out.push_str(tail);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Increments of the failure counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Failures {
    /// Iterations at which the plan was late.
    pub late_plans: u64,
    /// Failed plans.
    pub failed_plans: u64,
    /// Failed collectives.
    pub failed_collectives: u64,
    /// Digest mismatches.
    pub digest_mismatches: u64,
    /// Aborted layers.
    pub layers_aborted: u64,
}

impl Failures {
    /// What grew from `old` to `new`.
    pub fn between(old: &MachineStats, new: &MachineStats) -> Self {
        Self {
            late_plans: new.late_iterations.saturating_sub(old.late_iterations),
            failed_plans: new.plan_failures.saturating_sub(old.plan_failures),
            failed_collectives: new
                .collective_failures
                .saturating_sub(old.collective_failures),
            digest_mismatches: new.digest_mismatches.saturating_sub(old.digest_mismatches),
            layers_aborted: new.layers_failed.saturating_sub(old.layers_failed),
        }
    }
}

/// Expert copies a layer's change fetches: per rank, the experts of its new row it did not
/// hold (`new` and `old` are one layer's `[R][S]` rows).
pub fn layer_copies_moved(old: &[u16], new: &[u16], slots_per_rank: usize) -> u64 {
    eplb_core::metrics::moves(old, new, slots_per_rank) as u64
}

/// One rank's view for [`Metrics`]: turns the machine's events and counters into metric
/// updates. The [`Controller`](crate::controller::Controller) holds one
/// ([`Controller::set_metrics`](crate::controller::Controller::set_metrics)).
#[derive(Debug, Clone)]
pub struct RankObserver {
    metrics: Metrics,
    shape: Shape,
    expert_bytes: u64,
    /// The counters at the last update.
    last: MachineStats,
    /// Whether the last events said suspended.
    suspended: bool,
    /// The placement as of the last update `[L][R][S]` (to count a committed layer's copies).
    placement: Vec<u16>,
    /// When the walk of the taken plan started.
    walk_started: Option<Instant>,
    /// Layers committed in this walk.
    committed: u64,
}

impl RankObserver {
    /// The observer of a machine of `shape` that starts on `placement`; an expert copy weighs
    /// `expert_bytes`.
    pub fn new(metrics: Metrics, shape: Shape, placement: &[u16], expert_bytes: u64) -> Self {
        Self {
            metrics,
            shape,
            expert_bytes,
            last: MachineStats::default(),
            suspended: false,
            placement: placement.to_vec(),
            walk_started: None,
            committed: 0,
        }
    }

    /// The metrics it updates.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// After a forward: `ev` are the forward's events, `plan` the planner's last answer. Does
    /// nothing unless something happened.
    #[inline]
    pub fn after_forward(&mut self, ev: &Events, machine: &RankMachine, plan: Option<&Plan>) {
        let quiet = ev.committed.is_none()
            && ev.failed.is_none()
            && ev.plan_taken.is_none()
            && !ev.plan_late
            && !ev.cycle_done
            && ev.suspended == self.suspended
            && machine.stats().collective_failures == self.last.collective_failures;
        if !quiet {
            self.on_event(ev, machine, plan, Instant::now());
        }
    }

    /// The slow path of [`RankObserver::after_forward`], at `now`.
    pub fn on_event(
        &mut self,
        ev: &Events,
        machine: &RankMachine,
        plan: Option<&Plan>,
        now: Instant,
    ) {
        let m = &self.metrics;
        let stats = machine.stats();
        let failures = Failures::between(&self.last, &stats);
        m.record_failures(&failures);
        if ev.suspended != self.suspended || ev.suspended {
            m.record_health(machine.health());
        }
        self.suspended = ev.suspended;
        if let Some(changed) = ev.plan_taken {
            let taken = failures.failed_plans == 0 && failures.digest_mismatches == 0;
            let sample = plan
                .filter(|p| taken && p.cycle() == machine.cycle_number())
                .map(|p| PlanSample {
                    par_before: p.par_before(),
                    par_after: p.par_after(),
                    planner_time: p.elapsed(),
                    gate: p.gate().copied(),
                });
            m.record_plan(sample.as_ref());
            if changed > 0 {
                self.walk_started = Some(now);
                self.committed = 0;
            }
        }
        let (s, per) = (self.shape.slots_per_rank(), self.shape.slots_per_layer());
        if let Some(layer) = ev.committed {
            let l = usize::from(layer);
            let range = l * per..(l + 1) * per;
            if let (Some(old), Some(new)) = (
                self.placement.get_mut(range.clone()),
                machine.placement().get(range),
            ) {
                let copies = layer_copies_moved(old, new, s);
                m.record_layer_moved(l, copies, copies.saturating_mul(self.expert_bytes));
                old.copy_from_slice(new);
                self.committed += 1;
            }
        }
        if ev.cycle_done || ev.suspended {
            if let Some(t0) = self.walk_started.take() {
                m.record_walk(Some(now.saturating_duration_since(t0)), self.committed > 0);
            }
            if self.placement.len() == machine.placement().len() {
                self.placement.copy_from_slice(machine.placement());
            }
        }
        self.last = stats;
    }
}

impl Families {
    /// The families of `settings` (the per-layer ones only when opted in, sized by `layers`).
    fn new(settings: &MetricsSettings, layers: usize) -> Self {
        Families {
            bal: [
                before_after(),
                before_after(),
                before_after(),
                before_after(),
            ],
            par_mean: before_after(),
            par_max: before_after(),
            health: Series::new(
                ["running", "suspended", "diverged"].map(|s| vec![("state", s.to_owned())]),
            ),
            cycles: Counter::default(),
            rearrangements: Counter::default(),
            layers_moved: Counter::default(),
            copies_moved: Counter::default(),
            bytes_moved: Counter::default(),
            late: Counter::default(),
            failed_plans: Counter::default(),
            failed_collectives: Counter::default(),
            digest_mismatches: Counter::default(),
            layers_aborted: Counter::default(),
            walk: Histogram::new(walk_buckets()),
            planner: Histogram::new(planner_buckets()),
            gate_saving_share: GaugeF::default(),
            gate_forgone_share: GaugeF::default(),
            layer_bal: settings.per_layer.then(|| {
                Series::new((0..layers).flat_map(|l| {
                    ["before", "after"].map(|w| vec![("layer", l.to_string()), ("when", w.into())])
                }))
            }),
            layer_copies: settings
                .per_layer
                .then(|| Series::new((0..layers).map(|l| vec![("layer", l.to_string())]))),
        }
    }

    /// Registers every family in `reg`, with its help text, and marks the health "running".
    fn register(&self, reg: &mut Registry) {
        let f = self;
        if let Some(g) = f.health.at(0) {
            g.set(1);
        }
        let bal_help = [
            ("balancedness_min", "least balanced layer"),
            ("balancedness_p50", "median layer"),
            (
                "balancedness_p90",
                "10th percentile across layers (90% of layers are at least this balanced)",
            ),
            ("balancedness_avg", "mean over layers"),
        ];
        for ((name, what), s) in bal_help.iter().zip(&f.bal) {
            reg.register(
                *name,
                format!(
                    "Balancedness (mean over max tokens per EP rank, 1 = perfect) of the last \
                 planned cycle, {what}; when = before / after the plan"
                ),
                s.clone(),
            );
        }
        reg.register(
            "par_mean",
            "PAR (max over mean tokens per EP rank) averaged over layers, before / after the \
         last plan (the [Expert Hotness] log's mean)",
            f.par_mean.clone(),
        );
        reg.register(
            "par_max",
            "PAR (max over mean tokens per EP rank) of the worst layer, before / after the last \
         plan (the [Expert Hotness] log's max)",
            f.par_max.clone(),
        );
        reg.register(
            "health",
            "Balancing state of this rank: 1 for the current state, 0 for the others",
            f.health.clone(),
        );
        let counters: [(&str, &str, &Counter); 10] = [
            (
                "cycles",
                "Cycles that reached their plan decision (taken, or failed everywhere)",
                &f.cycles,
            ),
            (
                "rearrangements",
                "Cycles that moved at least one layer",
                &f.rearrangements,
            ),
            ("layers_moved", "Layers committed", &f.layers_moved),
            (
                "expert_copies_moved",
                "Expert copies fetched by committed layers, over every rank",
                &f.copies_moved,
            ),
            (
                "moved_bytes",
                "Bytes of expert weights fetched by committed layers, over every rank",
                &f.bytes_moved,
            ),
            (
                "plans_late",
                "Iterations at which the plan was due but not ready on every rank",
                &f.late,
            ),
            (
                "plans_failed",
                "Cycles whose plan failed on some rank",
                &f.failed_plans,
            ),
            (
                "collectives_failed",
                "Collectives that failed on this rank",
                &f.failed_collectives,
            ),
            (
                "digest_mismatches",
                "Cycles abandoned because ranks held different plans",
                &f.digest_mismatches,
            ),
            (
                "layers_aborted",
                "Layer exchanges that failed somewhere (the layer kept its placement)",
                &f.layers_aborted,
            ),
        ];
        for (name, help, c) in counters {
            reg.register(name, help, c.clone());
        }
        reg.register(
            "walk_duration_seconds",
            "Seconds from a taken plan to the end of its layer-by-layer walk",
            f.walk.clone(),
        );
        reg.register(
            "planner_duration_seconds",
            "Seconds of the policy call that computed a plan",
            f.planner.clone(),
        );
        reg.register(
            "gate_saving_step_share",
            "Pay-off gate: predicted saving per iteration of the layers the last taken plan \
             moved, as a share of the step (0 without the gate)",
            f.gate_saving_share.clone(),
        );
        reg.register(
            "gate_forgone_step_share",
            "Pay-off gate: predicted saving per iteration the gate gave up on the last taken \
             plan (layers held on their placement), as a share of the step (0 without the gate)",
            f.gate_forgone_share.clone(),
        );
        if let Some(s) = &f.layer_bal {
            reg.register(
                "layer_balancedness",
                "Balancedness (mean over max tokens per EP rank) of one layer, before / after \
             the last plan (opt-in, 2 series per layer)",
                s.clone(),
            );
        }
        if let Some(s) = &f.layer_copies {
            reg.register(
                "layer_expert_copies_moved",
                "Expert copies fetched by one layer's commits, over every rank (opt-in, 1 series \
             per layer)",
                s.clone(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn balancedness_is_one_over_par_with_vllms_p90() {
        // Layers with PAR 1, 2, 4, 5: balancedness 1, 0.5, 0.25, 0.2.
        let b = Balancedness::from_par(&[2.0, 1.0, 5.0, 4.0]);
        assert_eq!(b.min, 0.2);
        assert!((b.avg - 0.4875).abs() < 1e-12);
        assert!((b.p50 - 0.375).abs() < 1e-12);
        // 10th percentile: 0.2 + 0.3 * (0.25 - 0.2).
        assert!((b.p90 - 0.215).abs() < 1e-12);
        assert_eq!(Balancedness::from_par(&[0.0, f64::NAN]).min, 1.0);
    }

    #[test]
    fn exposition_names_and_order_are_fixed() {
        let mut reg = Registry::default();
        let m = Metrics::register(
            &mut reg,
            &MetricsSettings {
                prefix: "eplb".into(),
                per_layer: true,
            },
            2,
        );
        m.record_plan(Some(&PlanSample {
            par_before: &[2.0, 1.0],
            par_after: &[1.25, 1.0],
            planner_time: Duration::from_millis(3),
            gate: Some(eplb_core::time::gate::GateSummary {
                changed: 2,
                moved: 1,
                saving_ms_per_iter: 2.0,
                stall_ms: 0.1,
                forgone_ms_per_iter: 1.0,
                step_ms: 40.0,
            }),
        }));
        m.record_layer_moved(1, 3, 300);
        m.record_walk(Some(Duration::from_millis(40)), true);
        m.record_health(Health::Suspended { failures: 3 });
        let mut a = String::new();
        encode(&mut a, &reg).unwrap();
        let mut b = String::new();
        encode(&mut b, &reg).unwrap();
        assert_eq!(a, b);
        let text = encode_text(&reg).unwrap();
        assert!(
            text.contains("# TYPE eplb_cycles_total counter\n"),
            "{text}"
        );
        assert!(text.contains("# HELP eplb_cycles_total Cycles"), "{text}");
        assert!(!text.contains("# EOF"));
        assert!(a.ends_with("# EOF\n"));
        for line in [
            "eplb_balancedness_min{when=\"before\"} 0.5",
            "eplb_balancedness_min{when=\"after\"} 0.8",
            "eplb_par_max{when=\"before\"} 2.0",
            "eplb_health{state=\"running\"} 0",
            "eplb_health{state=\"suspended\"} 1",
            "eplb_cycles_total 1",
            "eplb_rearrangements_total 1",
            "eplb_expert_copies_moved_total 3",
            "eplb_moved_bytes_total 300",
            "eplb_walk_duration_seconds_count 1",
            "eplb_planner_duration_seconds_count 1",
            "eplb_gate_saving_step_share 0.05",
            "eplb_gate_forgone_step_share 0.025",
            "eplb_layer_balancedness{layer=\"1\",when=\"after\"} 1.0",
            "eplb_layer_expert_copies_moved_total{layer=\"1\"} 3",
        ] {
            assert!(a.lines().any(|l| l == line), "missing {line:?} in\n{a}");
        }
        // Ranks in sub-registries: one family per name, every rank's samples under it.
        let mut reg2 = Registry::default();
        for r in 0..2 {
            let sub = reg2.sub_registry_with_label(("rank".into(), r.to_string().into()));
            Metrics::register(sub, &MetricsSettings::default(), 2).record_plan(None);
        }
        let two = encode_text(&reg2).unwrap();
        assert_eq!(two.matches("# HELP eplb_cycles_total ").count(), 1, "{two}");
        assert!(two.contains(
            "# TYPE eplb_cycles_total counter\neplb_cycles_total{rank=\"0\"} 1\neplb_cycles_total{rank=\"1\"} 1\n"
        ));
        assert!(encode_openmetrics(&reg2).unwrap().ends_with("\n# EOF\n"));
        let before = a.find("when=\"before\"").unwrap();
        let after = a.find("when=\"after\"").unwrap();
        assert!(before < after);
    }
}
