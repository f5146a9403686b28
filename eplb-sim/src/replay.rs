//! A trace read for replay, and one policy's run over it with its cost.
//!
//! `eplb simulate`, `eplb report` and the Python `eplb.simulate` all go through here: read
//! the trace ([`Replay::load`]), then [`Replay::run`] a policy with its parameters. The
//! trace's own model (its `model` object) sizes an expert when the cost settings name none.

use crate::SimError;
use crate::cost::{CostBasis, CostSpec, MoveCost, model_from_trace, sequence_cost};
use crate::simulate::{
    Initial, SimConfig, SimPolicy, SimResult, SimTrace, simulate, simulate_with,
};
use eplb_core::time::ModelSpec;
use eplb_map::heat::load_heat;
use eplb_policies::PolicyKind;
use eplb_runtime::policies::{Param, policy_with};

/// A trace in memory with what its header says and the cost basis of its replays.
#[derive(Debug, Clone)]
pub struct Replay {
    /// The windows' counts.
    pub trace: SimTrace,
    /// The trace's own name, if it has one.
    pub name: Option<String>,
    /// The name of the model the trace names, if any.
    pub model: Option<String>,
    /// What one expert weighs and how fast it moves.
    pub basis: CostBasis,
    /// What the trace reader found questionable but accepted (the command prints them as
    /// `warning: SOURCE: ...`).
    pub warnings: Vec<String>,
}

/// One policy's run over a [`Replay`]: the simulator's result and the cost of each placement
/// change (`costs[k]` from log entry `k` to `k + 1`).
#[derive(Debug, Clone)]
pub struct Run {
    /// The simulator's result.
    pub result: SimResult,
    /// The cost of each change between consecutive placements of the log.
    pub costs: Vec<MoveCost>,
}

impl Replay {
    /// Reads an `eplb-trace/v1` trace (`bytes`; `source` names it in errors) for replay. With
    /// no model in `cost`, the model the trace names sizes an expert (`CostSpec::resolve_for_trace`).
    /// The cost settings are checked first, so a bad flag is reported before a bad trace.
    pub fn load(bytes: &[u8], source: &str, cost: &CostSpec) -> Result<Self, SimError> {
        let setting = SimError::CostSettings;
        cost.resolve().map_err(setting)?;
        let trace_err = |why: String| SimError::Trace {
            source: source.to_owned(),
            why,
        };
        // The bounded scan and the compact parse first: a document the scanner refuses costs
        // no memory, and the model is read after it without building the counts again.
        let heat = load_heat(bytes, None).map_err(|e| trace_err(e.to_string()))?;
        let (preset, model) = trace_model(bytes);
        let basis = cost.resolve_for_trace(preset).map_err(setting)?;
        let mut warnings: Vec<String> = heat.warnings().iter().map(ToString::to_string).collect();
        if let Some(m) = basis.preset {
            let named = cost.model.is_some();
            check_model_shape(&m, named, &heat, &mut warnings).map_err(|why| {
                SimError::Setting {
                    what: format!("--model {}", m.name),
                    why: format!("{source}: {why}"),
                }
            })?;
        }
        let counts = heat
            .counts_u64()
            .ok_or_else(|| trace_err("counts must be whole token counts".to_owned()))?;
        Ok(Replay {
            trace: SimTrace {
                windows: heat.windows(),
                layers: heat.layers(),
                experts: heat.experts(),
                counts,
            },
            name: heat.name().map(str::to_owned),
            model,
            basis,
            warnings,
        })
    }

    /// This replay's first window repeated `windows` times: an aggregate trace (one window
    /// summing a whole run) read as a stationary workload.
    pub fn stationary(&self, windows: usize) -> Self {
        let t = &self.trace;
        let one = t.layers * t.experts;
        let first = t.counts.get(..one).unwrap_or(&[]);
        let mut counts = Vec::with_capacity(one * windows);
        for _ in 0..windows {
            counts.extend_from_slice(first);
        }
        Self {
            trace: SimTrace {
                windows,
                layers: t.layers,
                experts: t.experts,
                counts,
            },
            ..self.clone()
        }
    }

    /// Replays `cfg.policy` with `params` (set through the policy's own parser; `static` takes
    /// none) and prices each placement change at this replay's cost basis. `progress` is
    /// called with (windows done, windows).
    pub fn run(
        &self,
        cfg: &SimConfig,
        params: &[Param],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Run, SimError> {
        let custom = check_params(cfg.policy, params)?;
        let result = match custom {
            Some(p) => simulate_with(&self.trace, cfg, Box::new(p), progress),
            None => simulate(&self.trace, cfg, progress),
        }?;
        let costs = sequence_cost(
            &result.shape,
            result.log.iter().map(|e| e.placement.as_slice()),
            self.basis.payload.total_bytes(),
        )?;
        Ok(Run { result, costs })
    }
}

impl Replay {
    /// A warning when the trace is too short for one cycle to show: the first new placement
    /// serves window `H + A` (counting from 0), so a trace of at most `H + A` windows has no
    /// window after an activation, and the figures "from first activation" (and the time
    /// model's estimate and net saving, which are taken over the same windows) do not exist:
    /// they are `NaN` in a [`crate::SimResult`], `null` in the JSON.
    pub fn short_trace_warning(&self, heat_interval: u32, algo_interval: u32) -> Option<String> {
        let (h, a) = (heat_interval as usize, algo_interval as usize);
        let first = h.saturating_add(a);
        (self.trace.windows <= first).then(|| {
            format!(
                "the trace has {} windows, fewer than one cycle needs (heat interval {h} + algorithm interval {a} = {first} windows, then at least one window served by the new placement): no placement is activated, so the figures from first activation, the time estimate and the net saving are not available (null in the JSON); use a shorter heat interval or a longer trace",
                self.trace.windows
            )
        })
    }
}

impl Run {
    /// Whether the run's numbers are the policy's: an error when every plan failed (they are
    /// the initial placement's), else a warning line when some did (the placement stayed as
    /// it was for them), else `None`.
    pub fn check_plans(&self) -> Result<Option<String>, SimError> {
        let r = &self.result;
        if r.plan_failures == 0 {
            return Ok(None);
        }
        let why = r
            .first_plan_failure
            .as_deref()
            .unwrap_or("unknown")
            .to_owned();
        if r.plan_failures >= r.plans {
            return Err(SimError::EveryPlanFailed {
                plans: r.plans,
                why,
            });
        }
        Ok(Some(format!(
            "{} of {} plans failed (the placement stayed as it was for them): {why}",
            r.plan_failures, r.plans
        )))
    }
}

/// The policy with `params` set, when any are given; an unknown key or a value out of range
/// is an error naming it (before any input is read, when called first).
pub fn check_params(
    policy: SimPolicy,
    params: &[Param],
) -> Result<Option<eplb_policies::AnyPolicy>, SimError> {
    let setting = |why: String| SimError::Setting {
        what: "--param".to_owned(),
        why,
    };
    match (policy, params.is_empty()) {
        (_, true) => Ok(None),
        (SimPolicy::Policy(k), false) => policy_with(k, params)
            .map(Some)
            .map_err(|e| setting(e.to_string())),
        (SimPolicy::Static, false) => {
            Err(setting("policy `static` takes no parameters".to_owned()))
        }
    }
}

/// `static`, a policy number `0..4` or a policy name.
pub fn parse_sim_policy(s: &str) -> Result<SimPolicy, SimError> {
    if s == "static" {
        return Ok(SimPolicy::Static);
    }
    s.parse::<PolicyKind>()
        .map(SimPolicy::Policy)
        .map_err(|e| SimError::Setting {
            what: format!("--policy {s}"),
            why: e.to_string(),
        })
}

impl core::str::FromStr for Initial {
    type Err = SimError;

    /// `default` or `random:SEED`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "default" {
            return Ok(Initial::Default);
        }
        s.strip_prefix("random:")
            .and_then(|x| x.parse::<u64>().ok())
            .map(Initial::Random)
            .ok_or_else(|| SimError::Setting {
                what: format!("--initial {s}"),
                why: "expected `default` or `random:SEED`".to_owned(),
            })
    }
}

/// Checks the catalogue model `m` against the trace `heat`: routed experts and top-k (when the
/// trace gives it) that differ are an error when the model was `named` (`--model`) and a
/// warning when it was inferred or defaulted (a trace that names no model is priced as
/// DeepSeek-V3); MoE layers that differ are a warning (a trace may hold one pipeline stage).
fn check_model_shape(
    m: &ModelSpec,
    named: bool,
    heat: &eplb_map::heat::Heat,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    let how = if named {
        ""
    } else {
        " (the default or the trace's own; give --model)"
    };
    let mut hard = Vec::new();
    if heat.experts() != usize::from(m.experts) {
        hard.push(format!(
            "the trace has {} routed experts per layer, {}{how} has {}",
            heat.experts(),
            m.name,
            m.experts
        ));
    }
    if let Some(k) = heat.top_k()
        && k != u64::from(m.top_k)
    {
        hard.push(format!(
            "the trace routes top-{k}, {}{how} routes top-{}",
            m.name, m.top_k
        ));
    }
    if named && !hard.is_empty() {
        return Err(format!(
            "{}; the model does not match the trace (name the trace's model, or give --hidden/--intermediate with --model-param)",
            hard.join("; ")
        ));
    }
    if heat.layers() != usize::from(m.moe_layers) {
        hard.push(format!(
            "the trace has {} MoE layers, {} has {} (the step is scaled from the trace's layers to the model's)",
            heat.layers(),
            m.name,
            m.moe_layers
        ));
    }
    if !hard.is_empty() {
        warnings.push(format!(
            "{}: the time figures use the model's shape",
            hard.join("; ")
        ));
    }
    Ok(())
}

/// The model preset a trace names in its `model` object, and that object's `name`.
///
/// It reads the document without building it: only the `model` object's `arch`, `name` and
/// `num_experts` are kept, everything else (the counts) is skipped as it is scanned
/// ([`serde::de::IgnoredAny`]), so it takes no memory for the counts. A document that is not
/// an object, or not JSON, names no model.
pub fn trace_model(bytes: &[u8]) -> (Option<ModelSpec>, Option<String>) {
    use serde::Deserialize as _;
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let parse = |b: &[u8]| {
        let mut de = serde_json::Deserializer::from_slice(b);
        match head::Head::deserialize(&mut de) {
            Ok(h) if de.end().is_ok() => Some(h),
            _ => None,
        }
    };
    // A one-object trace, or the header line of the line layout (a runtime recording).
    let first_line = || {
        let end = bytes.iter().position(|&b| b == b'\n')?;
        parse(bytes.get(..end)?)
    };
    let Some(head) = parse(bytes).or_else(first_line) else {
        return (None, None);
    };
    let Some(m) = head.model else {
        return (None, None);
    };
    let name = match &m.name {
        head::Field::Str(s) => Some(s.clone()),
        _ => None,
    };
    (model_from_trace(&m.to_value()), name)
}

/// The typed read of [`trace_model`].
mod head {
    use core::fmt;

    use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use serde_json::Value;

    /// A trace's top level: its `model` (the last one, as `serde_json::Value` keeps it).
    pub(super) struct Head {
        pub(super) model: Option<Model>,
    }

    /// The fields of a `model` object that name a preset.
    #[derive(Default)]
    pub(super) struct Model {
        pub(super) arch: Field,
        pub(super) name: Field,
        pub(super) num_experts: Field,
    }

    impl Model {
        /// As the `Value` that [`crate::cost::model_from_trace`] reads.
        pub(super) fn to_value(&self) -> Value {
            let mut m = serde_json::Map::new();
            for (k, f) in [
                ("arch", &self.arch),
                ("name", &self.name),
                ("num_experts", &self.num_experts),
            ] {
                match f {
                    Field::Str(s) => m.insert(k.to_owned(), Value::from(s.as_str())),
                    Field::U64(u) => m.insert(k.to_owned(), Value::from(*u)),
                    Field::Absent | Field::Other => None,
                };
            }
            Value::Object(m)
        }
    }

    /// A field's value, kept only when it is a string or a non-negative integer.
    #[derive(Default)]
    pub(super) enum Field {
        #[default]
        Absent,
        Str(String),
        U64(u64),
        Other,
    }

    impl<'de> Deserialize<'de> for Head {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_map(HeadVisitor)
        }
    }

    struct HeadVisitor;

    impl<'de> Visitor<'de> for HeadVisitor {
        type Value = Head;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a trace object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Head, A::Error> {
            let mut model = None;
            while let Some(key) = map.next_key::<Key>()? {
                match key {
                    Key::Model => model = Some(map.next_value::<Model>()?),
                    Key::Other => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(Head { model })
        }
    }

    impl<'de> Deserialize<'de> for Model {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(ModelVisitor)
        }
    }

    /// Any value; an object's preset fields are kept, anything else is an empty model.
    struct ModelVisitor;

    impl<'de> Visitor<'de> for ModelVisitor {
        type Value = Model;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<Model, E> {
            Ok(Model::default())
        }
        fn visit_i64<E>(self, _: i64) -> Result<Model, E> {
            Ok(Model::default())
        }
        fn visit_u64<E>(self, _: u64) -> Result<Model, E> {
            Ok(Model::default())
        }
        fn visit_f64<E>(self, _: f64) -> Result<Model, E> {
            Ok(Model::default())
        }
        fn visit_str<E>(self, _: &str) -> Result<Model, E> {
            Ok(Model::default())
        }
        fn visit_unit<E>(self) -> Result<Model, E> {
            Ok(Model::default())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Model, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Model::default())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Model, A::Error> {
            let mut m = Model::default();
            while let Some(key) = map.next_key::<String>()? {
                let slot = match key.as_str() {
                    "arch" => &mut m.arch,
                    "name" => &mut m.name,
                    "num_experts" => &mut m.num_experts,
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                };
                *slot = map.next_value::<Field>()?;
            }
            Ok(m)
        }
    }

    impl<'de> Deserialize<'de> for Field {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(FieldVisitor)
        }
    }

    struct FieldVisitor;

    impl<'de> Visitor<'de> for FieldVisitor {
        type Value = Field;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<Field, E> {
            Ok(Field::Other)
        }
        fn visit_i64<E>(self, i: i64) -> Result<Field, E> {
            Ok(u64::try_from(i).map_or(Field::Other, Field::U64))
        }
        fn visit_u64<E>(self, u: u64) -> Result<Field, E> {
            Ok(Field::U64(u))
        }
        fn visit_f64<E>(self, _: f64) -> Result<Field, E> {
            Ok(Field::Other)
        }
        fn visit_str<E>(self, s: &str) -> Result<Field, E> {
            Ok(Field::Str(s.to_owned()))
        }
        fn visit_unit<E>(self) -> Result<Field, E> {
            Ok(Field::Other)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Field, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Field::Other)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Field, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Field::Other)
        }
    }

    /// A top-level key: `model` or another (not kept).
    enum Key {
        Model,
        Other,
    }

    impl<'de> Deserialize<'de> for Key {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_str(KeyVisitor)
        }
    }

    struct KeyVisitor;

    impl Visitor<'_> for KeyVisitor {
        type Value = Key;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a key")
        }
        fn visit_str<E>(self, s: &str) -> Result<Key, E> {
            Ok(if s == "model" { Key::Model } else { Key::Other })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_model_is_read_without_building_the_counts() {
        let t = br#"{"format": "eplb-trace/v1", "counts": [[[1, 2]]],
            "model": {"name": "Mixtral-8x7B", "arch": "mixtral", "num_experts": 8, "x": [1, {"a": 2}]}}"#;
        assert_eq!(
            trace_model(t),
            (
                Some(ModelSpec::MIXTRAL_8X7B),
                Some("Mixtral-8x7B".to_owned())
            )
        );
        // The last `model` counts; fields of another type are absent.
        let t = br#"{"model": {"arch": "kimi_k2"}, "model": {"arch": "deepseek_v2", "name": 3, "num_experts": 64}}"#;
        assert_eq!(trace_model(t), (Some(ModelSpec::DEEPSEEK_V2_LITE), None));
        let t = br#"{"model": {"arch": "deepseek_v2", "num_experts": -64, "name": "x"}}"#;
        assert_eq!(trace_model(t), (None, Some("x".to_owned())));
        // Not an object, not JSON, no model, a model that is no object.
        for t in [
            &b"[[1, 2], [3, 4]]"[..],
            b"{\"model\": {\"arch\": \"mixtral\"}",
            b"{\"counts\": []}",
            b"{\"model\": [1, 2]}",
            b"{\"model\": {\"arch\": \"mixtral\"}} x",
        ] {
            assert_eq!(trace_model(t).0, None, "{}", String::from_utf8_lossy(t));
        }
        // A byte order mark is skipped, as the trace reader does.
        let t = b"\xEF\xBB\xBF{\"model\": {\"arch\": \"mixtral\"}}";
        assert_eq!(trace_model(t).0, Some(ModelSpec::MIXTRAL_8X7B));
    }
}
