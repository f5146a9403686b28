//! Calibration from the user's own numbers (`eplb calibrate`, `docs/time-model.md`,
//! "Calibration"): a file of measured step times at known shapes, a non-negative least-squares
//! fit of the step model's free multipliers ([`Calibration`]) and the `eplb-calibration/v1`
//! file every time-aware command accepts (`--calibration`).

use eplb_core::time::step::Calibration;
use serde_json::{Value, json};

use crate::SimError;

/// The format tag of a calibration file.
pub const FORMAT: &str = eplb_runtime::calibration::FORMAT;

fn bad(source: &str, why: impl Into<String>) -> SimError {
    SimError::Setting {
        what: source.to_owned(),
        why: why.into(),
    }
}

/// Reads an `eplb-calibration/v1` file: `{"format": "eplb-calibration/v1", "multipliers":
/// {"host": x, "backbone": x, "gemm": x, "link": x, "latency": x}, ...}`; every multiplier
/// must be present, finite and `>= 0`. Other keys (residuals, the fit's inputs) are kept for
/// people and ignored here. The runtime's reader ([`eplb_runtime::calibration::parse`]), so
/// that the pay-off gate's `calibration` and `--calibration` read one format alike.
pub fn read_calibration(bytes: &[u8], source: &str) -> Result<Calibration, SimError> {
    eplb_runtime::calibration::parse(bytes).map_err(|why| bad(source, why))
}

/// The JSON of a calibration file with its multipliers and `extra` keys (the fit's report).
pub fn calibration_json(c: &Calibration, extra: Value) -> Value {
    let mut v = json!({
        "format": FORMAT,
        "multipliers": Calibration::NAMES.iter().zip(c.as_array())
            .map(|(k, x)| ((*k).to_owned(), json!(x)))
            .collect::<serde_json::Map<String, Value>>(),
    });
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        for (k, x) in e {
            o.insert(k, x);
        }
    }
    v
}

/// One measured step: its shape and its time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Decode or prefill.
    pub role: eplb_core::time::Role,
    /// EP ranks of the run.
    pub ranks: u16,
    /// Tokens per rank per step.
    pub tokens_per_rank: f64,
    /// Mean decode context (decode), tokens.
    pub context_tokens: Option<f64>,
    /// Prompt length (prefill), tokens.
    pub prompt_tokens: Option<f64>,
    /// The busiest rank's MoE load over the mean during the measurement (1.0: forced
    /// balanced routing).
    pub par: f64,
    /// The measured step (TPOT, or one prefill iteration), ms.
    pub step_ms: f64,
}

/// The fit: the multipliers and how well they reproduce the points.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// The fitted multipliers.
    pub calibration: Calibration,
    /// Per point: `(measured, predicted)` ms.
    pub residuals: Vec<(f64, f64)>,
    /// Root-mean-square relative error of the fit.
    pub rms_rel: f64,
    /// The largest relative error.
    pub max_rel: f64,
}

/// Reads measured points: a JSON array of objects (or `{"points": [...]}`) with keys `role`,
/// `tokens_per_rank`, `step_ms` and optionally `ranks` (default `default_ranks`),
/// `context_tokens`, `prompt_tokens`, `par` (default 1.0); or a CSV with a header naming the
/// same columns (comma-separated, empty cells for absent values). An A/B pair with the
/// engine's forced-balanced routing is two points: the same shape at its measured PAR and at
/// PAR 1.
pub fn read_measured(
    bytes: &[u8],
    source: &str,
    default_ranks: u16,
) -> Result<Vec<Measured>, SimError> {
    let text = std::str::from_utf8(bytes).map_err(|_| bad(source, "not UTF-8 text"))?;
    let t = text.trim_start();
    let rows: Vec<std::collections::BTreeMap<String, String>> =
        if t.starts_with('[') || t.starts_with('{') {
            let v: Value =
                serde_json::from_str(t).map_err(|e| bad(source, format!("not JSON: {e}")))?;
            let arr = match &v {
                Value::Array(a) => a,
                Value::Object(o) => o
                    .get("points")
                    .and_then(Value::as_array)
                    .ok_or_else(|| bad(source, "expected an array or {\"points\": [...]}"))?,
                _ => return Err(bad(source, "expected an array of points")),
            };
            arr.iter()
                .enumerate()
                .map(|(i, p)| {
                    let o = p
                        .as_object()
                        .ok_or_else(|| bad(source, format!("point {i} is not an object")))?;
                    Ok(o.iter()
                        .filter(|(_, v)| !v.is_null())
                        .map(|(k, v)| {
                            (
                                k.clone(),
                                v.as_str().map_or_else(|| v.to_string(), str::to_owned),
                            )
                        })
                        .collect())
                })
                .collect::<Result<_, SimError>>()?
        } else {
            let mut lines = t.lines().filter(|l| !l.trim().is_empty());
            let header: Vec<String> = lines
                .next()
                .ok_or_else(|| bad(source, "empty CSV"))?
                .split(',')
                .map(|h| h.trim().to_owned())
                .collect();
            lines
                .enumerate()
                .map(|(i, l)| {
                    let cells: Vec<&str> = l.split(',').map(str::trim).collect();
                    if cells.len() != header.len() {
                        return Err(bad(
                            source,
                            format!(
                                "CSV row {}: {} cells for {} columns",
                                i + 2,
                                cells.len(),
                                header.len()
                            ),
                        ));
                    }
                    Ok(header
                        .iter()
                        .zip(cells)
                        .filter(|(_, c)| !c.is_empty())
                        .map(|(h, c)| (h.clone(), c.to_owned()))
                        .collect())
                })
                .collect::<Result<_, SimError>>()?
        };
    if rows.is_empty() {
        return Err(bad(source, "no measured point"));
    }
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            let num = |k: &str| -> Result<Option<f64>, SimError> {
                match r.get(k) {
                    None => Ok(None),
                    Some(s) => s
                        .parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite())
                        .map(Some)
                        .ok_or_else(|| {
                            bad(source, format!("point {i}: {k} `{s}` is not a number"))
                        }),
                }
            };
            let need = |k: &str| -> Result<f64, SimError> {
                num(k)?.ok_or_else(|| bad(source, format!("point {i}: {k} is missing")))
            };
            let role = r
                .get("role")
                .and_then(|s| eplb_core::time::Role::from_name(s))
                .ok_or_else(|| bad(source, format!("point {i}: role must be decode or prefill")))?;
            let ranks = match num("ranks")? {
                None => default_ranks,
                Some(x) if x >= 1.0 && x.fract() == 0.0 && x <= f64::from(u16::MAX) => x as u16,
                Some(x) => {
                    return Err(bad(
                        source,
                        format!("point {i}: ranks {x} is not a whole number >= 1"),
                    ));
                }
            };
            let m = Measured {
                role,
                ranks,
                tokens_per_rank: need("tokens_per_rank")?,
                context_tokens: num("context_tokens")?,
                prompt_tokens: num("prompt_tokens")?,
                par: num("par")?.unwrap_or(1.0),
                step_ms: need("step_ms")?,
            };
            if !(m.tokens_per_rank > 0.0 && m.step_ms > 0.0) {
                return Err(bad(
                    source,
                    format!("point {i}: tokens_per_rank and step_ms must be > 0"),
                ));
            }
            if !(m.par >= 1.0 && m.par <= f64::from(m.ranks)) {
                return Err(bad(
                    source,
                    format!("point {i}: par {} must be between 1 and the ranks", m.par),
                ));
            }
            if m.context_tokens.is_some_and(|c| c < 0.0)
                || m.prompt_tokens.is_some_and(|p| p <= 0.0)
            {
                return Err(bad(
                    source,
                    format!("point {i}: context_tokens must be >= 0 and prompt_tokens > 0"),
                ));
            }
            Ok(m)
        })
        .collect()
}

/// What a heat recording does not say about its windows, for [`read_recording`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecordingDefaults {
    /// The role the recording ran in (`eplb calibrate --role`); a recording names none.
    pub role: Option<eplb_core::time::Role>,
    /// EP ranks when the header has no `topology.ranks`.
    pub ranks: u16,
    /// Experts per token when the header has no `top_k` (the model preset's).
    pub top_k: u16,
}

/// Reads the measured points of an `eplb-trace/v1` recording in the line layout (the runtime's
/// `eplb_heat_record_path`, the adapters' `EPLB_TRACE_DIR`): every complete window line with an
/// `iteration_ms` (finite, `> 0`) is one point, the others are skipped. `Ok(None)` when `bytes`
/// are not an `eplb-trace/v1` document (read them with [`read_measured`]).
///
/// Per point: `step_ms` = `iteration_ms`; `ranks` = the header's `topology.ranks` (else
/// `defaults.ranks`); `tokens_per_rank` = the window's (token, expert) assignments per layer,
/// averaged over layers, over `top_k * ranks * iterations` (`top_k` from the header, else
/// `defaults.top_k`; `iterations` the line's `iterations`, else the header's
/// `intervals.iterations_per_window`, else 1); `par` = the line's `par` when given, else the
/// window's busiest-rank load over the mean on the contiguous layout (`N / R` experts per rank:
/// the deployment without EPLB, averaged over layers; record with EPLB off, or write `par`, when
/// the run balanced its experts); no context or prompt length (the model's defaults).
pub fn read_recording(
    bytes: &[u8],
    source: &str,
    defaults: RecordingDefaults,
) -> Result<Option<Vec<Measured>>, SimError> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let first = bytes.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let header: Option<Value> = serde_json::from_slice(first).ok();
    let is_trace = |v: &Value| v.get("format").and_then(Value::as_str) == Some("eplb-trace/v1");
    let header = match header {
        Some(h) if is_trace(&h) => h,
        _ => {
            // A one-object trace on several lines.
            let whole: Option<Value> = serde_json::from_slice(bytes).ok();
            if whole.as_ref().is_some_and(is_trace) {
                return Err(bad(
                    source,
                    "an eplb-trace/v1 trace in the one-object layout carries no per-window \
                     iteration_ms; give a recording in the line layout (eplb_heat_record_path, \
                     EPLB_TRACE_DIR) or measured points",
                ));
            }
            return Ok(None);
        }
    };
    if header.get("layout").and_then(Value::as_str) != Some("lines")
        || header.get("counts").is_some()
    {
        return Err(bad(
            source,
            "an eplb-trace/v1 trace in the one-object layout carries no per-window \
             iteration_ms; give a recording in the line layout (eplb_heat_record_path, \
             EPLB_TRACE_DIR) or measured points",
        ));
    }
    let role = defaults.role.ok_or_else(|| {
        bad(
            source,
            "a heat recording does not say its role: pass --role decode or --role prefill",
        )
    })?;
    let whole = |v: Option<&Value>, what: &str| -> Result<Option<u64>, SimError> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .filter(|&n| n >= 1)
                .map(Some)
                .ok_or_else(|| bad(source, format!("{what} must be a whole number >= 1"))),
        }
    };
    let ranks = match whole(header.pointer("/topology/ranks"), "topology.ranks")? {
        None => defaults.ranks,
        Some(r) => u16::try_from(r).map_err(|_| bad(source, "topology.ranks is too large"))?,
    };
    let top_k = whole(header.get("top_k"), "top_k")?.unwrap_or(u64::from(defaults.top_k));
    let per = whole(
        header.pointer("/intervals/iterations_per_window"),
        "intervals.iterations_per_window",
    )?
    .unwrap_or(1);
    let mut points = Vec::new();
    // Complete lines only: a last line without its newline is a recorder cut off mid-write.
    let body = bytes.get(first.len() + 1..).unwrap_or(&[]);
    let complete = body.len() - body.iter().rev().take_while(|&&b| b != b'\n').count();
    for (i, line) in body[..complete].split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let at = |why: String| bad(source, format!("line {}: {why}", i + 2));
        let v: Value = serde_json::from_slice(line).map_err(|e| at(format!("not JSON: {e}")))?;
        let ms = match v.get("iteration_ms") {
            None | Some(Value::Null) => continue,
            Some(x) => x
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| at("iteration_ms must be a finite number > 0".into()))?,
        };
        let iterations = whole(v.get("iterations"), &format!("line {}: iterations", i + 2))?;
        let counts = v
            .get("counts")
            .and_then(Value::as_array)
            .ok_or_else(|| at("counts must be an array [L][N]".into()))?;
        let mut layers: Vec<Vec<f64>> = Vec::with_capacity(counts.len());
        for layer in counts {
            let row = layer
                .as_array()
                .ok_or_else(|| at("counts must be an array [L][N]".into()))?;
            let row: Option<Vec<f64>> = row
                .iter()
                .map(|x| x.as_f64().filter(|x| x.is_finite() && *x >= 0.0))
                .collect();
            layers.push(row.ok_or_else(|| at("counts must be numbers >= 0".into()))?);
        }
        if layers.is_empty() {
            return Err(at("counts has no layer".into()));
        }
        let pairs = layers.iter().map(|l| l.iter().sum::<f64>()).sum::<f64>() / layers.len() as f64;
        let denom = (top_k * u64::from(ranks) * iterations.unwrap_or(per)) as f64;
        let tokens_per_rank = pairs / denom;
        if tokens_per_rank.is_nan() || tokens_per_rank <= 0.0 {
            return Err(at("the window routed no token".into()));
        }
        let par = match v.get("par") {
            None | Some(Value::Null) => contiguous_par(&layers, usize::from(ranks)),
            Some(x) => x
                .as_f64()
                .filter(|p| *p >= 1.0 && *p <= f64::from(ranks))
                .ok_or_else(|| at("par must be a number between 1 and the ranks".into()))?,
        };
        points.push(Measured {
            role,
            ranks,
            tokens_per_rank,
            context_tokens: None,
            prompt_tokens: None,
            par,
            step_ms: ms,
        });
    }
    if points.is_empty() {
        return Err(bad(
            source,
            "no window of the recording carries iteration_ms (the engine reports it with \
             Controller::record_iteration_ms or eplb.integrations.record_iteration_ms)",
        ));
    }
    Ok(Some(points))
}

/// Mean over layers of the busiest rank's load over the mean when the `N` experts of a layer
/// sit contiguously on `ranks` ranks (`ceil(N / R)` per rank), clamped to `[1, ranks]`.
fn contiguous_par(layers: &[Vec<f64>], ranks: usize) -> f64 {
    let r = ranks.max(1);
    let mut sum = 0.0;
    for l in layers {
        let per = l.len().div_ceil(r).max(1);
        let total: f64 = l.iter().sum();
        let busiest = l
            .chunks(per)
            .map(|c| c.iter().sum::<f64>())
            .fold(0.0, f64::max);
        sum += if total > 0.0 {
            busiest / (total / r as f64)
        } else {
            1.0
        };
    }
    (sum / layers.len().max(1) as f64).clamp(1.0, r as f64)
}

/// The step the model predicts for `m` under `c`, from `spec` (model, hardware, topology,
/// overlap) and `cost` (expert bytes).
pub fn predict(
    spec: &crate::time::TimeSpec,
    cost: &crate::cost::CostBasis,
    ranks_per_node: Option<u16>,
    m: &Measured,
    c: &Calibration,
) -> Result<f64, SimError> {
    let s = crate::time::TimeSpec {
        role: Some(m.role),
        tokens_per_rank: Some(m.tokens_per_rank),
        context_tokens: m.context_tokens.or(spec.context_tokens),
        prompt_tokens: m.prompt_tokens.or(spec.prompt_tokens),
        calibration: Some(("fit".to_owned(), *c)),
        ..spec.clone()
    };
    let g = ranks_per_node.map(|g| g.min(m.ranks));
    Ok(crate::estimate::estimate_step(&s, cost, m.ranks, g, m.par)?
        .central
        .iteration_ms)
}

/// Fits the multipliers to `points` by non-negative least squares on relative errors (each
/// point weighs `1 / measured`). The step is piecewise linear in the multipliers (linear
/// without overlap; the larger of two linear paths with it), so the fit is repeated on the
/// terms active at the previous solution until it settles.
pub fn fit(
    spec: &crate::time::TimeSpec,
    cost: &crate::cost::CostBasis,
    ranks_per_node: Option<u16>,
    points: &[Measured],
) -> Result<Fit, SimError> {
    if points.is_empty() {
        return Err(bad("--measured", "no measured point"));
    }
    // The iteration can settle on the wrong pieces (a multiplier at 0 makes its term vanish
    // from every derivative), so it starts from the presets and from each corner of the
    // all-to-all's constants, and keeps the solution with the smallest relative error.
    let mut best: Option<([f64; 5], f64)> = None;
    for start in [
        [1.0; 5],
        [1.0, 1.0, 1.0, 2.0, 2.0],
        [1.0, 1.0, 1.0, 0.5, 0.5],
    ] {
        let x = settle(spec, cost, ranks_per_node, points, start)?;
        let err = rms_rel(spec, cost, ranks_per_node, points, &x)?;
        if best.is_none_or(|(_, e)| err < e * (1.0 - 1e-9)) {
            best = Some((x, err));
        }
    }
    let x = best.map_or([1.0; 5], |(x, _)| x);
    let calibration = Calibration::from_array(x);
    let mut residuals = Vec::with_capacity(points.len());
    let (mut sq, mut mx) = (0.0, 0.0f64);
    for m in points {
        let p = predict(spec, cost, ranks_per_node, m, &calibration)?;
        let rel = (p - m.step_ms) / m.step_ms;
        sq += rel * rel;
        mx = mx.max(rel.abs());
        residuals.push((m.step_ms, p));
    }
    Ok(Fit {
        calibration,
        rms_rel: (sq / points.len() as f64).sqrt(),
        max_rel: mx,
        residuals,
    })
}

/// The piecewise-linear least-squares iteration from `start`: linearise at the current
/// multipliers, solve, repeat until it settles (at most 8 rounds); the best round is kept.
fn settle(
    spec: &crate::time::TimeSpec,
    cost: &crate::cost::CostBasis,
    ranks_per_node: Option<u16>,
    points: &[Measured],
    start: [f64; 5],
) -> Result<[f64; 5], SimError> {
    let mut x = start;
    let mut best = (x, rms_rel(spec, cost, ranks_per_node, points, &x)?);
    for _ in 0..8 {
        let c = Calibration::from_array(x);
        let mut rows = Vec::with_capacity(points.len());
        for m in points {
            let base = predict(spec, cost, ranks_per_node, m, &c)?;
            let mut f = [0.0; 5];
            for (j, fj) in f.iter_mut().enumerate() {
                let mut y = x;
                let h = 1e-3 * x.get(j).copied().unwrap_or(1.0).max(1e-3);
                if let Some(v) = y.get_mut(j) {
                    *v += h;
                }
                let up = predict(spec, cost, ranks_per_node, m, &Calibration::from_array(y))?;
                *fj = (up - base) / h / m.step_ms;
            }
            rows.push((f, 1.0));
        }
        let next = nnls(&rows);
        let moved = next
            .iter()
            .zip(&x)
            .map(|(a, b)| (a - b).abs() / b.abs().max(1e-9))
            .fold(0.0, f64::max);
        x = next;
        let err = rms_rel(spec, cost, ranks_per_node, points, &x)?;
        if err < best.1 {
            best = (x, err);
        }
        if moved < 1e-9 {
            break;
        }
    }
    Ok(best.0)
}

/// Root-mean-square relative error of the model under multipliers `x` on `points`.
fn rms_rel(
    spec: &crate::time::TimeSpec,
    cost: &crate::cost::CostBasis,
    ranks_per_node: Option<u16>,
    points: &[Measured],
    x: &[f64; 5],
) -> Result<f64, SimError> {
    let c = Calibration::from_array(*x);
    let mut sq = 0.0;
    for m in points {
        let rel = (predict(spec, cost, ranks_per_node, m, &c)? - m.step_ms) / m.step_ms;
        sq += rel * rel;
    }
    Ok((sq / points.len().max(1) as f64).sqrt())
}

/// Non-negative least squares `min |A x - b|`, `x >= 0`, for five unknowns, exactly: the
/// unconstrained least-squares solution on every subset of free unknowns (the rest at 0),
/// keeping the feasible one with the smallest residual (32 subsets; columns scaled to unit
/// norm for the elimination).
fn nnls(rows: &[([f64; 5], f64)]) -> [f64; 5] {
    let mut ata = [[0.0; 5]; 5];
    let mut atb = [0.0; 5];
    let mut btb = 0.0;
    for (a, b) in rows {
        btb += b * b;
        for i in 0..5 {
            atb[i] += a[i] * b;
            for j in 0..5 {
                ata[i][j] += a[i] * a[j];
            }
        }
    }
    let scale: [f64; 5] = core::array::from_fn(|i| {
        let d = ata[i][i];
        if d > 0.0 { 1.0 / d.sqrt() } else { 0.0 }
    });
    let q: [[f64; 5]; 5] =
        core::array::from_fn(|i| core::array::from_fn(|j| ata[i][j] * scale[i] * scale[j]));
    let r: [f64; 5] = core::array::from_fn(|i| atb[i] * scale[i]);
    let mut best = ([0.0; 5], btb);
    for mask in 1u32..32 {
        let idx: Vec<usize> = (0..5)
            .filter(|&i| mask & (1 << i) != 0 && scale[i] > 0.0)
            .collect();
        if idx.len() != mask.count_ones() as usize {
            continue;
        }
        let n = idx.len();
        let mut m: Vec<Vec<f64>> = idx
            .iter()
            .map(|&i| {
                let mut row: Vec<f64> = idx.iter().map(|&j| q[i][j]).collect();
                row.push(r[i]);
                row
            })
            .collect();
        // Gaussian elimination with partial pivoting.
        let mut ok = true;
        for c in 0..n {
            let p = (c..n)
                .max_by(|&a, &b| m[a][c].abs().total_cmp(&m[b][c].abs()))
                .unwrap_or(c);
            if m[p][c].abs() < 1e-12 {
                ok = false;
                break;
            }
            m.swap(c, p);
            let pivot = m[c].clone();
            for (k, row) in m.iter_mut().enumerate() {
                if k != c {
                    let f = row[c] / pivot[c];
                    for (x, y) in row.iter_mut().zip(&pivot).skip(c) {
                        *x -= f * y;
                    }
                }
            }
        }
        if !ok {
            continue;
        }
        let mut z = [0.0; 5];
        for (k, &i) in idx.iter().enumerate() {
            z[i] = m[k][n] / m[k][k];
        }
        if z.iter().any(|&v| v < 0.0) {
            continue;
        }
        // Residual |Az - b|^2 = z'Qz - 2 r'z + b'b.
        let mut res = btb;
        for i in 0..5 {
            res -= 2.0 * r[i] * z[i];
            for j in 0..5 {
                res += z[i] * q[i][j] * z[j];
            }
        }
        if res < best.1 - 1e-15 {
            best = (z, res);
        }
    }
    core::array::from_fn(|i| best.0[i] * scale[i])
}
