//! Heat inputs (`std`): four recorded formats, one [`Heat`] type.
//!
//! | format | shape | numbers |
//! | --- | --- | --- |
//! | [`eplb-trace/v1`](HeatFormat::Trace) (`docs/trace-format.md`) | `counts` `[W][L][N]` | integers `>= 0` |
//! | [SGLang](HeatFormat::Sglang) `{"logical_count": ..}` | `[L][N]` (or `[W][L][N]`) | `>= 0`; all-zero (dense) layers dropped and reported |
//! | [plain array](HeatFormat::Plain) | `[L][N]` | `>= 0`, may be fractional |
//! | [vLLM-Ascend slot loads](HeatFormat::SlotLoads) | `[L][R][S]` (or `[W][L][R][S]`) | `>= 0`; folded through a placement |
//!
//! **Parsing:** arrays are counted while scanning the bytes, and an array of more than 65535
//! elements is refused before anything is built (every dimension is a `u16`); the document is
//! then built compactly (an array of non-negative integers as one `Vec<u64>`, other numbers as
//! `serde_json::Number`s), so memory stays a small multiple of the file (about 4x for the parse
//! at one digit a number). A leading UTF-8 byte
//! order mark is skipped; JSON errors keep serde's reason.
//!
//! **Storage:** every format becomes windows x layers x experts of `f64` ([`Heat::as_slice`]).
//! Integer counts are exact: an integer above 2^53 is an error, so every count, and every sum of
//! up to 1024 windows of counts below 2^43, is an exact `f64`. [`Heat::is_integral`] says whether
//! all values are whole numbers (always for traces), and [`Heat::counts_u64`] gives them as `u64`.
//!
//! Negative, fractional (trace `counts` only), NaN / infinite (Python's `NaN`, `Infinity`),
//! `null` and non-numeric counts are errors with their position (window, layer, expert).
//! In a trace only `format` and `counts` are required; the other fields are informative, and a
//! mismatch with them (`window_tokens * top_k` against the counts, `num_windows`, `layer_ids`) is
//! a [`Warning`], never an error.

use core::fmt;
use std::string::String;
use std::vec::Vec;

use serde_json::Number;

use crate::json::Node;
use eplb_core::Placement;
use eplb_core::heat::fold_row;

use crate::{Axis, Error, Position, ShortText};

mod lines;

/// The largest integer `f64` holds exactly, 2^53.
const EXACT_MAX: f64 = 9_007_199_254_740_992.0;

pub use lines::TRACE_FORMAT;

/// Which heat format a file is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeatFormat {
    /// `eplb-trace/v1`: an object with `format` and `counts` `[W][L][N]`.
    Trace,
    /// SGLang's expert-distribution dump: an object with `logical_count` `[L][N]`.
    Sglang,
    /// A plain JSON array `[L][N]`.
    Plain,
    /// vLLM-Ascend's per-slot loads, a plain JSON array `[L][R][S]` (or `[W][L][R][S]`).
    SlotLoads,
}

impl fmt::Display for HeatFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HeatFormat::Trace => "eplb-trace/v1",
            HeatFormat::Sglang => "sglang logical_count",
            HeatFormat::Plain => "[L][N] array",
            HeatFormat::SlotLoads => "[L][R][S] slot loads",
        })
    }
}

/// Something odd in an input that does not stop it from being used.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Warning {
    /// Rows `(layer, device)` of a map that hold some expert twice (read leniently).
    ColocatedCopies {
        /// How many rows.
        rows: usize,
    },
    /// All-zero layers of an SGLang dump (dense layers) were dropped.
    DroppedZeroLayers {
        /// Their indices in the dump.
        layers: Vec<usize>,
    },
    /// `sum(counts[w][l]) != window_tokens[w] * top_k` in some `(window, layer)` pairs.
    SumRule {
        /// Pairs that break the rule.
        mismatches: usize,
        /// The first such window.
        window: usize,
        /// The first such layer.
        layer: usize,
        /// `window_tokens[w] * top_k` there.
        expected: u64,
        /// The sum of the counts there.
        got: u64,
    },
    /// An optional trace field was ignored.
    IgnoredField {
        /// The field.
        field: &'static str,
        /// Why.
        reason: &'static str,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::ColocatedCopies { rows } => write!(
                f,
                "{rows} (layer, device) rows hold an expert twice; the second copy gets no tokens under log2phy routing"
            ),
            Warning::DroppedZeroLayers { layers } => {
                write!(
                    f,
                    "dropped {} all-zero (dense) layers: {layers:?}",
                    layers.len()
                )
            }
            Warning::SumRule {
                mismatches,
                window,
                layer,
                expected,
                got,
            } => write!(
                f,
                "{mismatches} (window, layer) pairs break sum(counts) = window_tokens * top_k; first: window {window}, layer {layer}: {got} != {expected}"
            ),
            Warning::IgnoredField { field, reason } => {
                write!(f, "ignored field \"{field}\": {reason}")
            }
        }
    }
}

/// Expert heat: windows `W` x layers `L` x logical experts `N`, as `f64` (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Heat {
    format: HeatFormat,
    windows: usize,
    layers: usize,
    experts: usize,
    values: Vec<f64>,
    layer_ids: Vec<usize>,
    window_tokens: Option<Vec<u64>>,
    top_k: Option<u64>,
    name: Option<String>,
    warnings: Vec<Warning>,
}

impl Heat {
    /// Heat from values `[W][L][N]`; each must be finite and `>= 0` (and at most 2^53).
    /// The format is recorded as [`HeatFormat::Plain`].
    pub fn new(
        windows: usize,
        layers: usize,
        experts: usize,
        values: Vec<f64>,
    ) -> Result<Self, Error> {
        let expected = windows
            .checked_mul(layers)
            .and_then(|v| v.checked_mul(experts))
            .ok_or(Error::TooLarge {
                what: "heat size",
                value: u64::MAX,
                max: usize::MAX as u64,
            })?;
        if expected != values.len() || expected == 0 {
            return Err(Error::Core(eplb_core::Error::Length {
                what: "heat [W][L][N]",
                expected,
                got: values.len(),
            }));
        }
        for (i, &v) in values.iter().enumerate() {
            let at = Position::root()
                .with(Axis::Window, i / (layers * experts))
                .with(Axis::Layer, i / experts % layers)
                .with(Axis::Expert, i % experts);
            check_real(v, at, false)?;
        }
        Ok(Self::build(
            HeatFormat::Plain,
            windows,
            layers,
            experts,
            values,
        ))
    }

    fn build(
        format: HeatFormat,
        windows: usize,
        layers: usize,
        experts: usize,
        values: Vec<f64>,
    ) -> Self {
        Self {
            format,
            windows,
            layers,
            experts,
            values,
            layer_ids: (0..layers).collect(),
            window_tokens: None,
            top_k: None,
            name: None,
            warnings: Vec::new(),
        }
    }

    /// The format it was read from.
    pub fn format(&self) -> HeatFormat {
        self.format
    }
    /// Windows `W` (1 for formats without time).
    pub fn windows(&self) -> usize {
        self.windows
    }
    /// MoE layers `L`.
    pub fn layers(&self) -> usize {
        self.layers
    }
    /// Logical experts `N`.
    pub fn experts(&self) -> usize {
        self.experts
    }
    /// All values `[W][L][N]`.
    pub fn as_slice(&self) -> &[f64] {
        &self.values
    }
    /// One window `[L][N]`, or `None` past the end.
    pub fn window(&self, w: usize) -> Option<&[f64]> {
        let n = self.layers * self.experts;
        self.values
            .get(w.checked_mul(n)?..w.checked_add(1)?.checked_mul(n)?)
    }
    /// One value.
    pub fn get(&self, window: usize, layer: usize, expert: usize) -> Option<f64> {
        if layer >= self.layers || expert >= self.experts {
            return None;
        }
        self.window(window)?
            .get(layer * self.experts + expert)
            .copied()
    }
    /// The windows summed: `[L][N]`.
    pub fn summed(&self) -> Vec<f64> {
        let n = self.layers * self.experts;
        let mut out = std::vec![0.0; n];
        for w in self.values.chunks_exact(n.max(1)) {
            for (o, v) in out.iter_mut().zip(w) {
                *o += v;
            }
        }
        out
    }
    /// Whether every value is a whole number.
    pub fn is_integral(&self) -> bool {
        self.values.iter().all(|v| v.fract() == 0.0)
    }
    /// The values as `u64` counts, when [`is_integral`](Self::is_integral).
    pub fn counts_u64(&self) -> Option<Vec<u64>> {
        self.is_integral()
            .then(|| self.values.iter().map(|&v| v as u64).collect())
    }
    /// The original layer index of each row (a trace's `layer_ids`, the rows an SGLang dump kept,
    /// else `0..L`).
    pub fn layer_ids(&self) -> &[usize] {
        &self.layer_ids
    }
    /// A trace's `window_tokens`, when present and well-formed.
    pub fn window_tokens(&self) -> Option<&[u64]> {
        self.window_tokens.as_deref()
    }
    /// A trace's `model.top_k`, when present.
    pub fn top_k(&self) -> Option<u64> {
        self.top_k
    }
    /// A trace's `name`, when present.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
    /// What was odd but accepted, in a fixed order.
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }
}

/// Which of the heat formats `bytes` holds (used by `eplb plan --loads FILE`). Parses the whole
/// document; contents are not checked.
pub fn sniff(bytes: &[u8]) -> Result<HeatFormat, Error> {
    let v: Node = parse_document(bytes)?;
    detect(&v)
}

fn detect(v: &Node) -> Result<HeatFormat, Error> {
    match v {
        o @ Node::Obj(_) => {
            if let Some(tag) = o.get("format") {
                return match tag.as_str() {
                    Some(TRACE_FORMAT) => Ok(HeatFormat::Trace),
                    Some(other) => Err(Error::FormatTag {
                        found: ShortText::new(other),
                    }),
                    None => Err(Error::WrongType {
                        at: Position::root(),
                        key: "format",
                        expected: "the string \"eplb-trace/v1\"",
                    }),
                };
            }
            if o.get("logical_count").is_some() {
                return Ok(HeatFormat::Sglang);
            }
            if o.get("counts").is_some() {
                return Err(Error::MissingKey {
                    at: Position::root(),
                    key: "format",
                });
            }
            Err(Error::UnknownFormat {
                found: "an object without \"format\" or \"logical_count\"",
            })
        }
        Node::Arr(_) | Node::Ints(_) | Node::Nums(_) => match depth(v) {
            2 => Ok(HeatFormat::Plain),
            3 | 4 => Ok(HeatFormat::SlotLoads),
            0 | 1 => Err(Error::UnknownFormat {
                found: "an array of fewer than 2 dimensions",
            }),
            _ => Err(Error::UnknownFormat {
                found: "an array of more than 4 dimensions",
            }),
        },
        _ => Err(Error::UnknownFormat {
            found: "neither an object nor an array",
        }),
    }
}

/// Nesting depth along first elements (`[[1]]` is 2; an empty array counts as one level).
fn depth(mut v: &Node) -> usize {
    let mut d = 0;
    loop {
        match v {
            Node::Arr(a) => {
                d += 1;
                match a.first() {
                    Some(x) => v = x,
                    None => break,
                }
            }
            Node::Ints(_) | Node::Nums(_) => {
                d += 1;
                break;
            }
            _ => break,
        }
    }
    d
}

/// Reads heat in any of the formats ([`sniff`]). Per-slot loads need `placement` (the one
/// they were measured on); the other formats ignore it.
pub fn load_heat(bytes: &[u8], placement: Option<&Placement<'_>>) -> Result<Heat, Error> {
    let v: Node = parse_document(bytes)?;
    let format = detect(&v)?;
    from_value(&v, format, placement)
}

/// Reads heat in the given format.
pub fn load_heat_as(
    bytes: &[u8],
    format: HeatFormat,
    placement: Option<&Placement<'_>>,
) -> Result<Heat, Error> {
    let v: Node = parse_document(bytes)?;
    from_value(&v, format, placement)
}

/// The document of `bytes`: one JSON value, or a trace in the line layout joined into one
/// (`lines`: a recorder's header line, then one window per line).
fn parse_document(bytes: &[u8]) -> Result<Node, Error> {
    match lines::join(bytes)? {
        Some(v) => Ok(v),
        None => crate::json::parse_lenient_numbers(bytes),
    }
}

fn from_value(
    v: &Node,
    format: HeatFormat,
    placement: Option<&Placement<'_>>,
) -> Result<Heat, Error> {
    match format {
        HeatFormat::Trace => trace(object(v)?),
        HeatFormat::Sglang => sglang(object(v)?),
        HeatFormat::Plain => {
            let a = numeric_array(v, &[Axis::Layer, Axis::Expert], "loads", false)?;
            let (l, n) = (dim(&a.dims, 0), dim(&a.dims, 1));
            Ok(Heat::build(HeatFormat::Plain, 1, l, n, a.values))
        }
        HeatFormat::SlotLoads => {
            let placement = placement.ok_or(Error::NeedsPlacement)?;
            slot_loads(v, placement)
        }
    }
}

fn object(v: &Node) -> Result<&Node, Error> {
    match v {
        Node::Obj(_) => Ok(v),
        _ => Err(Error::WrongType {
            at: Position::root(),
            key: "document",
            expected: "an object",
        }),
    }
}

fn dim(dims: &[usize], i: usize) -> usize {
    dims.get(i).copied().unwrap_or(0)
}

struct NumArray {
    dims: Vec<usize>,
    values: Vec<f64>,
}

/// A rectangular numeric array of exactly `axes.len()` dimensions, flattened row-major.
fn numeric_array(
    v: &Node,
    axes: &[Axis],
    name: &'static str,
    integer: bool,
) -> Result<NumArray, Error> {
    let mut dims = Vec::with_capacity(axes.len());
    // `None`: the walk reached the numbers of an array of numbers.
    let mut cur = Some(v);
    let mut at = Position::root();
    for (k, axis) in axes.iter().enumerate() {
        match cur {
            Some(Node::Arr(a)) => match a.first() {
                Some(first) => {
                    dims.push(a.len());
                    cur = Some(first);
                    at = at.with(*axis, 0);
                }
                None => return Err(Error::Empty { at, what: name }),
            },
            Some(n @ (Node::Ints(_) | Node::Nums(_))) => {
                let len = n.array_len().unwrap_or(0);
                if len == 0 {
                    return Err(Error::Empty { at, what: name });
                }
                dims.push(len);
                cur = None;
                at = at.with(*axis, 0);
            }
            _ if k == 0 => {
                return Err(Error::WrongType {
                    at,
                    key: name,
                    expected: "an array",
                });
            }
            _ => {
                return Err(Error::Dimensions {
                    at,
                    expected: axes.len(),
                });
            }
        }
    }
    // The first rows' lengths only suggest the size (a ragged array is an error later); cap the
    // reservation so that a short input cannot ask for a huge allocation.
    let total = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let mut values = Vec::with_capacity(total.unwrap_or(0).min(1 << 20));
    walk_array(v, 0, Position::root(), &dims, axes, integer, &mut values)?;
    Ok(NumArray { dims, values })
}

fn walk_array(
    v: &Node,
    depth: usize,
    at: Position,
    dims: &[usize],
    axes: &[Axis],
    integer: bool,
    out: &mut Vec<f64>,
) -> Result<(), Error> {
    let (Some(&want), Some(axis)) = (dims.get(depth), axes.get(depth)) else {
        out.push(leaf(v, at, integer)?);
        return Ok(());
    };
    let len = match v {
        Node::Arr(_) | Node::Ints(_) | Node::Nums(_) => v.array_len().unwrap_or(0),
        Node::Null => return Err(Error::MissingCount { at }),
        _ => {
            return Err(Error::Dimensions {
                at,
                expected: axes.len(),
            });
        }
    };
    if len != want {
        return Err(Error::RaggedArray {
            at,
            expected: want,
            got: len,
        });
    }
    match v {
        Node::Arr(a) => {
            for (i, x) in a.iter().enumerate() {
                walk_array(x, depth + 1, at.with(*axis, i), dims, axes, integer, out)?;
            }
        }
        Node::Ints(_) | Node::Nums(_) if dims.get(depth + 1).is_some() => {
            // A number where an array was expected.
            return Err(Error::Dimensions {
                at: at.with(*axis, 0),
                expected: axes.len(),
            });
        }
        Node::Ints(a) => {
            for (i, &u) in a.iter().enumerate() {
                out.push(int_leaf(u, at.with(*axis, i))?);
            }
        }
        Node::Nums(a) => {
            for (i, n) in a.iter().enumerate() {
                out.push(number_leaf(n, at.with(*axis, i), integer)?);
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_real(f: f64, at: Position, integer: bool) -> Result<f64, Error> {
    if !f.is_finite() {
        return Err(Error::NonFiniteCount { at });
    }
    if f < 0.0 {
        return Err(Error::NegativeCount { at });
    }
    if integer && f.fract() != 0.0 {
        return Err(Error::FractionalCount { at });
    }
    if f > EXACT_MAX {
        return Err(Error::CountTooLarge { at });
    }
    // `-0.0 + 0.0` is `0.0`.
    Ok(f + 0.0)
}

fn int_leaf(u: u64, at: Position) -> Result<f64, Error> {
    if u > 1 << 53 {
        return Err(Error::CountTooLarge { at });
    }
    Ok(u as f64)
}

fn number_leaf(n: &Number, at: Position, integer: bool) -> Result<f64, Error> {
    if let Some(u) = n.as_u64() {
        int_leaf(u, at)
    } else if n.as_i64().is_some() {
        Err(Error::NegativeCount { at })
    } else {
        check_real(n.as_f64().unwrap_or(f64::NAN), at, integer)
    }
}

fn leaf(v: &Node, at: Position, integer: bool) -> Result<f64, Error> {
    match v {
        Node::Number(n) => number_leaf(n, at, integer),
        Node::Null => Err(Error::MissingCount { at }),
        Node::Str(s) if matches!(s.as_str(), "NaN" | "Infinity" | "-Infinity") => {
            Err(Error::NonFiniteCount { at })
        }
        Node::Arr(_) | Node::Ints(_) | Node::Nums(_) => Err(Error::Dimensions {
            at,
            expected: at.axes().count(),
        }),
        _ => Err(Error::NotANumber { at }),
    }
}

fn trace(obj: &Node) -> Result<Heat, Error> {
    let root = Position::root();
    match obj.get("format") {
        None => {
            return Err(Error::MissingKey {
                at: root,
                key: "format",
            });
        }
        Some(Node::Str(s)) if s == TRACE_FORMAT => {}
        Some(Node::Str(s)) => {
            return Err(Error::FormatTag {
                found: ShortText::new(s),
            });
        }
        Some(_) => {
            return Err(Error::WrongType {
                at: root,
                key: "format",
                expected: "the string \"eplb-trace/v1\"",
            });
        }
    }
    let counts = obj.get("counts").ok_or(Error::MissingKey {
        at: root,
        key: "counts",
    })?;
    let a = numeric_array(
        counts,
        &[Axis::Window, Axis::Layer, Axis::Expert],
        "counts",
        true,
    )?;
    let (w, l, n) = (dim(&a.dims, 0), dim(&a.dims, 1), dim(&a.dims, 2));
    let mut heat = Heat::build(HeatFormat::Trace, w, l, n, a.values);
    let mut warnings = Vec::new();

    heat.name = obj.get("name").and_then(Node::as_str).map(String::from);
    if let Some(v) = obj.get("num_windows")
        && v.as_u64() != Some(w as u64)
    {
        warnings.push(Warning::IgnoredField {
            field: "num_windows",
            reason: "does not match the windows of counts",
        });
    }
    if let Some(v) = obj.get("layer_ids") {
        match u64_list(v, l) {
            Some(ids) => heat.layer_ids = ids.into_iter().map(|x| x as usize).collect(),
            None => warnings.push(Warning::IgnoredField {
                field: "layer_ids",
                reason: "not a list of one non-negative integer per layer",
            }),
        }
    }
    if let Some(v) = obj.get("window_tokens") {
        match u64_list(v, w) {
            Some(t) => heat.window_tokens = Some(t),
            None => warnings.push(Warning::IgnoredField {
                field: "window_tokens",
                reason: "not a list of one non-negative integer per window",
            }),
        }
    }
    if let Some(model) = obj.get("model") {
        match model.get("top_k") {
            None => {}
            Some(k) => match k.as_u64() {
                Some(k) => heat.top_k = Some(k),
                None => warnings.push(Warning::IgnoredField {
                    field: "model.top_k",
                    reason: "not a non-negative integer",
                }),
            },
        }
    }
    if let (Some(tokens), Some(k)) = (&heat.window_tokens, heat.top_k) {
        let mut first: Option<(usize, usize, u64, u64)> = None;
        let mut mismatches = 0usize;
        for (wi, &t) in tokens.iter().enumerate() {
            let expected = t.saturating_mul(k);
            for li in 0..l {
                let start = (wi * l + li) * n;
                let got = heat
                    .values
                    .get(start..start + n)
                    .unwrap_or(&[])
                    .iter()
                    .fold(0u64, |acc, &v| acc.saturating_add(v as u64));
                if got != expected {
                    mismatches += 1;
                    first.get_or_insert((wi, li, expected, got));
                }
            }
        }
        if let Some((window, layer, expected, got)) = first {
            warnings.push(Warning::SumRule {
                mismatches,
                window,
                layer,
                expected,
                got,
            });
        }
    }
    heat.warnings = warnings;
    Ok(heat)
}

fn u64_list(v: &Node, len: usize) -> Option<Vec<u64>> {
    if v.array_len()? != len {
        return None;
    }
    (0..len).map(|i| v.u64_at(i).flatten()).collect()
}

fn sglang(obj: &Node) -> Result<Heat, Error> {
    let root = Position::root();
    let lc = obj.get("logical_count").ok_or(Error::MissingKey {
        at: root,
        key: "logical_count",
    })?;
    let (w, l, n, values) = if depth(lc) >= 3 {
        let a = numeric_array(
            lc,
            &[Axis::Window, Axis::Layer, Axis::Expert],
            "logical_count",
            false,
        )?;
        (dim(&a.dims, 0), dim(&a.dims, 1), dim(&a.dims, 2), a.values)
    } else {
        let a = numeric_array(lc, &[Axis::Layer, Axis::Expert], "logical_count", false)?;
        (1, dim(&a.dims, 0), dim(&a.dims, 1), a.values)
    };
    let zero: Vec<bool> = (0..l)
        .map(|li| {
            (0..w).all(|wi| {
                let start = (wi * l + li) * n;
                values
                    .get(start..start + n)
                    .is_none_or(|row| row.iter().all(|&v| v == 0.0))
            })
        })
        .collect();
    let kept: Vec<usize> = (0..l)
        .filter(|&li| !zero.get(li).copied().unwrap_or(false))
        .collect();
    if kept.is_empty() {
        return Err(Error::AllLayersZero);
    }
    let dropped: Vec<usize> = (0..l)
        .filter(|&li| zero.get(li).copied().unwrap_or(false))
        .collect();
    let mut out = Vec::with_capacity(w * kept.len() * n);
    for wi in 0..w {
        for &li in &kept {
            let start = (wi * l + li) * n;
            out.extend_from_slice(values.get(start..start + n).unwrap_or(&[]));
        }
    }
    let mut heat = Heat::build(HeatFormat::Sglang, w, kept.len(), n, out);
    heat.layer_ids = kept;
    if !dropped.is_empty() {
        log::debug!("sglang dump: dropped {} all-zero layers", dropped.len());
        heat.warnings
            .push(Warning::DroppedZeroLayers { layers: dropped });
    }
    Ok(heat)
}

fn slot_loads(v: &Node, placement: &Placement<'_>) -> Result<Heat, Error> {
    let shape = placement.shape();
    let four = depth(v) >= 4;
    let a = if four {
        numeric_array(
            v,
            &[Axis::Window, Axis::Layer, Axis::Device, Axis::Slot],
            "loads",
            false,
        )?
    } else {
        numeric_array(v, &[Axis::Layer, Axis::Device, Axis::Slot], "loads", false)?
    };
    let (w, dims) = if four {
        (dim(&a.dims, 0), a.dims.get(1..).unwrap_or(&[]))
    } else {
        (1, a.dims.as_slice())
    };
    for (i, (what, expected)) in [
        ("layers", shape.layers()),
        ("devices", shape.ranks()),
        ("slots per device", shape.slots_per_rank()),
    ]
    .into_iter()
    .enumerate()
    {
        let got = dim(dims, i);
        if got != expected {
            return Err(Error::ShapeMismatch {
                what,
                expected,
                got,
            });
        }
    }
    let (l, n, per_layer) = (shape.layers(), shape.experts(), shape.slots_per_layer());
    let mut out = std::vec![0.0; w * l * n];
    for (wi, window) in a.values.chunks_exact(l * per_layer).enumerate() {
        for (layer, loads) in placement.layers().zip(window.chunks_exact(per_layer)) {
            let base = (wi * l + layer.index()) * n;
            if let Some(row) = out.get_mut(base..base + n) {
                fold_row(layer.as_slice(), loads.iter().copied(), row);
            }
        }
    }
    Ok(Heat::build(HeatFormat::SlotLoads, w, l, n, out))
}
