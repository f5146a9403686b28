//! The observability extension keys of `eplb_config` (issue 29): `eplb_metrics`,
//! `eplb_heat_record_path` and `eplb_heat_record_max_bytes`, parsed into [`Observe`].

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::ConfigError;
use crate::metrics::{DEFAULT_PREFIX, MetricsSettings};

/// The keys of an `eplb_metrics` object.
pub const METRICS_KEYS: [&str; 3] = ["enabled", "prefix", "per_layer"];

/// What the observability keys say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observe {
    /// `eplb_metrics`: the metrics' settings, `None` when turned off (`false` or
    /// `{"enabled": false}`). On by default: metrics exist once the engine hands a registry over.
    pub metrics: Option<MetricsSettings>,
    /// `eplb_heat_record_path`: where rank 0 appends each cycle's heat.
    pub heat_record_path: Option<PathBuf>,
    /// `eplb_heat_record_max_bytes`: the recording's size cap.
    pub heat_record_max_bytes: u64,
}

impl Default for Observe {
    fn default() -> Self {
        Self {
            metrics: Some(MetricsSettings::default()),
            heat_record_path: None,
            heat_record_max_bytes: crate::heat_record::DEFAULT_MAX_BYTES,
        }
    }
}

fn bad(key: &'static str, message: String) -> ConfigError {
    ConfigError::Observe { key, message }
}

/// Whether `prefix` is a valid metric name prefix: `[a-zA-Z_:][a-zA-Z0-9_:]*`, or empty.
fn valid_prefix(prefix: &str) -> bool {
    prefix.chars().enumerate().all(|(i, c)| {
        c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
    })
}

/// Parses the observability keys of `obj` into `out`; the problems go to `errs`.
pub(super) fn parse(obj: &Map<String, Value>, out: &mut Observe, errs: &mut Vec<ConfigError>) {
    if let Some(v) = obj.get("eplb_metrics") {
        metrics(v, out, errs);
    }
    match obj.get("eplb_heat_record_path") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => match record_path(Path::new(s)) {
            Ok(()) => out.heat_record_path = Some(PathBuf::from(s)),
            Err(e) => errs.push(bad("eplb_heat_record_path", e.to_string())),
        },
        Some(other) => errs.push(bad(
            "eplb_heat_record_path",
            format!("expected a path string, or null, got {other}"),
        )),
    }
    if let Some(v) = obj.get("eplb_heat_record_max_bytes") {
        match v.as_u64().filter(|&n| n >= 1) {
            Some(n) => out.heat_record_max_bytes = n,
            None => errs.push(bad(
                "eplb_heat_record_max_bytes",
                format!("expected an integer of at least 1 (bytes), got {v}"),
            )),
        }
    }
}

/// Why a heat recording path cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RecordPathError {
    /// The path is empty.
    Empty,
    /// The path is a directory.
    Directory(PathBuf),
    /// The path's directory does not exist (nothing is created).
    NoDirectory {
        /// The path.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
    },
}

impl std::fmt::Display for RecordPathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordPathError::Empty => f.write_str("the path is empty"),
            RecordPathError::Directory(p) => write!(f, "{} is a directory", p.display()),
            RecordPathError::NoDirectory { path, dir } => write!(
                f,
                "{}: the directory {} does not exist",
                path.display(),
                dir.display()
            ),
        }
    }
}

/// A recording path must not be a directory and its directory must exist (nothing is created).
fn record_path(path: &Path) -> Result<(), RecordPathError> {
    if path.as_os_str().is_empty() {
        return Err(RecordPathError::Empty);
    }
    if path.is_dir() {
        return Err(RecordPathError::Directory(path.to_path_buf()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if dir.is_dir() {
        Ok(())
    } else {
        Err(RecordPathError::NoDirectory {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
        })
    }
}

fn metrics(v: &Value, out: &mut Observe, errs: &mut Vec<ConfigError>) {
    let m = match v {
        Value::Bool(false) => {
            out.metrics = None;
            return;
        }
        Value::Bool(true) => {
            out.metrics = Some(MetricsSettings::default());
            return;
        }
        Value::Object(m) => m,
        other => {
            errs.push(bad(
                "eplb_metrics",
                format!("expected a boolean or an object, got {other}"),
            ));
            return;
        }
    };
    let mut settings = MetricsSettings {
        prefix: DEFAULT_PREFIX.to_owned(),
        per_layer: false,
    };
    let mut enabled = true;
    let before = errs.len();
    for (key, x) in m {
        match (key.as_str(), x) {
            ("enabled", Value::Bool(b)) => enabled = *b,
            ("per_layer", Value::Bool(b)) => settings.per_layer = *b,
            ("prefix", Value::String(p)) if valid_prefix(p) => settings.prefix.clone_from(p),
            ("prefix", other) => errs.push(bad(
                "eplb_metrics",
                format!(
                    "prefix: expected a metric name prefix ([a-zA-Z_:][a-zA-Z0-9_:]*, or \"\"), \
                     got {other}"
                ),
            )),
            ("enabled" | "per_layer", other) => errs.push(bad(
                "eplb_metrics",
                format!("{key}: expected a boolean, got {other}"),
            )),
            (other, _) => errs.push(bad(
                "eplb_metrics",
                format!(
                    "unknown key {other:?}; expected one of {}{}",
                    METRICS_KEYS.join(", "),
                    super::suggest::closest(other, &METRICS_KEYS)
                        .map(|s| format!(" (did you mean {s:?}?)"))
                        .unwrap_or_default()
                ),
            )),
        }
    }
    if errs.len() == before {
        out.metrics = enabled.then_some(settings);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(json: &str) -> (Observe, Vec<String>) {
        let v: Value = serde_json::from_str(json).unwrap();
        let mut out = Observe::default();
        let mut errs = Vec::new();
        parse(v.as_object().unwrap(), &mut out, &mut errs);
        (out, errs.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn metrics_are_on_by_default_and_configurable() {
        assert_eq!(parsed("{}").0, Observe::default());
        assert_eq!(parsed(r#"{"eplb_metrics": false}"#).0.metrics, None);
        let (o, e) = parsed(r#"{"eplb_metrics": {"prefix": "vllm:eplb", "per_layer": true}}"#);
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(
            o.metrics,
            Some(MetricsSettings {
                prefix: "vllm:eplb".into(),
                per_layer: true
            })
        );
        let (_, e) = parsed(r#"{"eplb_metrics": {"prefx": "x", "prefix": "1x"}}"#);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e.iter().any(|m| m.contains("did you mean \"prefix\"")));
    }

    #[test]
    fn the_summary_names_them_when_not_at_their_defaults() {
        let env: [(&str, &str); 0] = [];
        let summary = |v: serde_json::Value| {
            crate::config::EplbConfig::from_value(&v, &env)
                .unwrap()
                .summary()
        };
        let plain = summary(serde_json::json!({}));
        assert!(!plain.contains("eplb_metrics") && !plain.contains("eplb_heat_record"));
        let path = std::env::temp_dir().join("h.jsonl");
        let set = summary(serde_json::json!({
            "eplb_metrics": false,
            "eplb_heat_record_path": path.to_str().unwrap(),
        }));
        assert!(set.contains("\neplb_metrics: off\n"), "{set}");
        assert!(
            set.contains(&format!(
                "\neplb_heat_record_path: {} (at most 1073741824 bytes)\n",
                path.display()
            )),
            "{set}"
        );
        let custom = summary(serde_json::json!({"eplb_metrics": {"per_layer": true}}));
        assert!(custom.contains("\neplb_metrics: prefix \"eplb\", per-layer series on\n"));
    }

    #[test]
    fn heat_record_keys_are_checked() {
        let dir = std::env::temp_dir();
        let ok = dir.join("eplb-heat.jsonl");
        let (o, e) = parsed(&format!(
            r#"{{"eplb_heat_record_path": {:?}, "eplb_heat_record_max_bytes": 4096}}"#,
            ok.to_str().unwrap()
        ));
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(o.heat_record_path.as_deref(), Some(ok.as_path()));
        assert_eq!(o.heat_record_max_bytes, 4096);
        let (_, e) = parsed(
            r#"{"eplb_heat_record_path": "/no/such/dir/h.jsonl", "eplb_heat_record_max_bytes": 0}"#,
        );
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e[0].starts_with("eplb_config.eplb_heat_record_path: "),
            "{e:?}"
        );
    }
}
