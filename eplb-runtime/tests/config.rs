//! `eplb_config` parsing: a table of malformed configs with their exact messages, and the valid
//! forms (defaults, wrapped and inner, record and static paths, shapes).

use core::sync::atomic::{AtomicUsize, Ordering};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use eplb_core::HeatStage;
use eplb_policies::PolicyKind;
use eplb_runtime::config::{
    ConfigError, ConfigErrors, DYNAMIC_EPLB, EXPERT_MAP_RECORD, Env, EplbConfig, MapValidator,
    Mode, ProcessEnv,
};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "eplb-config-{tag}-{}-{nanos}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// `{TMP}` replaced by this directory, escaped for a JSON string.
    fn json(&self, text: &str) -> String {
        let quoted = serde_json::to_string(&self.0.display().to_string()).unwrap();
        text.replace("{TMP}", &quoted[1..quoted.len() - 1])
    }

    /// `{TMP}` replaced by this directory as messages show it.
    fn msg(&self, text: &str) -> String {
        let shown = format!("{:?}", self.0.display().to_string());
        text.replace("{TMP}", &shown[1..shown.len() - 1])
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The guard satisfied.
const GUARD: [(&str, &str); 1] = [(DYNAMIC_EPLB, "1")];
/// Nothing set.
const NO_ENV: [(&str, &str); 0] = [];

fn parse(text: &str, env: &dyn Env) -> Result<EplbConfig, ConfigErrors> {
    EplbConfig::from_json_str(text, env)
}

fn messages(text: &str, env: &dyn Env) -> Vec<String> {
    match parse(text, env) {
        Ok(cfg) => panic!("accepted {text}: {cfg:?}"),
        Err(e) => e.messages(),
    }
}

/// A message matches an expectation exactly, or by prefix when the expectation ends with `*`
/// (for operating-system wording).
fn matches(got: &str, want: &str) -> bool {
    match want.strip_suffix('*') {
        Some(prefix) => got.starts_with(prefix),
        None => got == want,
    }
}

const ALL_POLICIES: &str = "random, default, swift, flashlb, incremental, deepseek";

#[test]
fn malformed_configs_name_key_and_value() {
    let tmp = TempDir::new("bad");
    std::fs::write(tmp.path().join("map.json"), "{}").unwrap();
    std::fs::create_dir(tmp.path().join("dir.json")).unwrap();
    std::fs::create_dir(tmp.path().join("recdir.json")).unwrap();
    std::fs::write(tmp.path().join("afile"), "x").unwrap();

    let valid_keys = "dynamic_eplb, expert_map_path, expert_heat_collection_interval, \
                      algorithm_execution_interval, expert_map_record_path, num_redundant_experts, \
                      eplb_policy_type, eplb_heat_collection_stage, eplb_policy_seed, \
                      eplb_policy_params, eplb_payoff_gate, eplb_metrics, \
                      eplb_heat_record_path, eplb_heat_record_max_bytes";
    let unknown_foo = format!("eplb_config: unknown key \"foo\"; valid keys: {valid_keys}");
    let policy = |got: &str, tail: &str| {
        format!(
            "eplb_config.eplb_policy_type: unknown policy {got}; expected 0..4 or one of {ALL_POLICIES}{tail}"
        )
    };
    let stage = |got: &str, tail: &str| {
        format!(
            "eplb_config.eplb_heat_collection_stage: unknown stage \"{got}\"; expected \"all\", \"prefill\" or \"decode\"{tail}"
        )
    };
    let guard_tail = |d: &str, r: &str| {
        format!(
            " needs the environment variable DYNAMIC_EPLB=true (or 1, any case) or EXPERT_MAP_RECORD=true; found DYNAMIC_EPLB {d}, EXPERT_MAP_RECORD {r}"
        )
    };
    let yes_env = [(DYNAMIC_EPLB, "yes"), (EXPERT_MAP_RECORD, "TRUE")];

    let cases: Vec<(&str, &dyn Env, Vec<String>)> = vec![
        // Document shape.
        (
            "[1, 2]",
            &GUARD,
            vec!["the config must be a JSON object, got [1,2]".into()],
        ),
        (
            "{\"dynamic_eplb\": tru}",
            &GUARD,
            vec!["invalid JSON at line 1, column 21: expected ident".into()],
        ),
        (
            "{\"eplb_config\": null}",
            &GUARD,
            vec!["eplb_config: must be a JSON object, got null".into()],
        ),
        (
            "{\"eplb_config\": [600]}",
            &GUARD,
            vec!["eplb_config: must be a JSON object, got [600]".into()],
        ),
        // Unknown keys.
        (
            "{\"dynamic_epbl\": true}",
            &GUARD,
            vec![
                "eplb_config: unknown key \"dynamic_epbl\"; did you mean \"dynamic_eplb\"?".into(),
            ],
        ),
        (
            "{\"eplb_config\": {\"expert_map_pth\": \"a.json\"}}",
            &GUARD,
            vec![
                "eplb_config: unknown key \"expert_map_pth\"; did you mean \"expert_map_path\"?"
                    .into(),
            ],
        ),
        (
            "{\"Num_Redundant_Experts\": 2}",
            &GUARD,
            vec![
                "eplb_config: unknown key \"Num_Redundant_Experts\"; did you mean \"num_redundant_experts\"?"
                    .into(),
            ],
        ),
        ("{\"foo\": 1}", &GUARD, vec![unknown_foo.clone()]),
        (
            "{\"eplb_confg\": {}}",
            &GUARD,
            vec![
                "eplb_config: unknown key \"eplb_confg\"; did you mean \"eplb_config\"?".into(),
            ],
        ),
        (
            "{\"eplb_config\": {}, \"deploy\": {}}",
            &GUARD,
            vec!["unknown top-level key \"deploy\"; did you mean \"deployment\"?".into()],
        ),
        (
            "{\"eplb_confg\": {}, \"deployment\": {}}",
            &GUARD,
            vec!["unknown top-level key \"eplb_confg\"; did you mean \"eplb_config\"?".into()],
        ),
        (
            "{\"eplb_config\": {\"eplb_policy\": 1}}",
            &GUARD,
            vec![
                "eplb_config: unknown key \"eplb_policy\"; did you mean \"eplb_policy_type\"?"
                    .into(),
            ],
        ),
        (
            "{\"eplb_config\": {}, \"zzz\": 1}",
            &GUARD,
            vec![
                "unknown top-level key \"zzz\"; expected \"eplb_config\" or \"deployment\"".into(),
            ],
        ),
        (
            "{\"eplb_config\": {}, \"dynamic_eplb\": true}",
            &GUARD,
            vec![
                "unknown top-level key \"dynamic_eplb\"; it belongs inside \"eplb_config\"".into(),
            ],
        ),
        (
            "{\"eplb_config\": {\"deployment\": {}}}",
            &GUARD,
            vec![
                "eplb_config: unknown key \"deployment\"; it belongs at the top level, beside \"eplb_config\""
                    .into(),
            ],
        ),
        // Wrong types.
        (
            "{\"dynamic_eplb\": \"true\"}",
            &GUARD,
            vec!["eplb_config.dynamic_eplb: expected a boolean, got \"true\"".into()],
        ),
        (
            "{\"dynamic_eplb\": 1}",
            &GUARD,
            vec!["eplb_config.dynamic_eplb: expected a boolean, got 1".into()],
        ),
        (
            "{\"expert_heat_collection_interval\": 600.0}",
            &GUARD,
            vec!["eplb_config.expert_heat_collection_interval: expected an integer, got 600.0".into()],
        ),
        (
            "{\"expert_heat_collection_interval\": true}",
            &GUARD,
            vec!["eplb_config.expert_heat_collection_interval: expected an integer, got true".into()],
        ),
        (
            "{\"algorithm_execution_interval\": \"50\"}",
            &GUARD,
            vec!["eplb_config.algorithm_execution_interval: expected an integer, got \"50\"".into()],
        ),
        (
            "{\"num_redundant_experts\": 1.5}",
            &GUARD,
            vec!["eplb_config.num_redundant_experts: expected an integer, got 1.5".into()],
        ),
        (
            "{\"num_redundant_experts\": null}",
            &GUARD,
            vec!["eplb_config.num_redundant_experts: expected an integer, got null".into()],
        ),
        (
            "{\"eplb_policy_seed\": \"7\"}",
            &GUARD,
            vec!["eplb_config.eplb_policy_seed: expected an integer, got \"7\"".into()],
        ),
        (
            "{\"eplb_policy_type\": 2.0}",
            &GUARD,
            vec![
                "eplb_config.eplb_policy_type: expected an integer 0..4 or a policy name, got 2.0"
                    .into(),
            ],
        ),
        (
            "{\"eplb_policy_type\": [2]}",
            &GUARD,
            vec![
                "eplb_config.eplb_policy_type: expected an integer 0..4 or a policy name, got [2]"
                    .into(),
            ],
        ),
        (
            "{\"eplb_heat_collection_stage\": 1}",
            &GUARD,
            vec![
                "eplb_config.eplb_heat_collection_stage: expected a string (\"all\", \"prefill\" or \"decode\"), got 1"
                    .into(),
            ],
        ),
        (
            "{\"expert_map_path\": 3}",
            &GUARD,
            vec![
                "eplb_config.expert_map_path: expected a path string ending with \".json\", or null, got 3"
                    .into(),
            ],
        ),
        (
            "{\"eplb_config\": {\"expert_map_record_path\": {\"path\": \"a.json\"}}}",
            &GUARD,
            vec![
                "eplb_config.expert_map_record_path: expected a path string ending with \".json\", or null, got {\"path\":\"a.json\"}"
                    .into(),
            ],
        ),
        // Ranges.
        (
            "{\"expert_heat_collection_interval\": 0}",
            &GUARD,
            vec![
                "eplb_config.expert_heat_collection_interval: heat interval must be an integer in 1..=4294967295, got 0 (zero never completes a cycle)"
                    .into(),
            ],
        ),
        (
            "{\"algorithm_execution_interval\": 0}",
            &GUARD,
            vec![
                "eplb_config.algorithm_execution_interval: algorithm interval must be an integer in 1..=4294967295, got 0 (zero never completes a cycle)"
                    .into(),
            ],
        ),
        (
            "{\"algorithm_execution_interval\": -3}",
            &GUARD,
            vec!["eplb_config.algorithm_execution_interval: algorithm interval must be an integer in 1..=4294967295, got -3 (zero never completes a cycle)".into()],
        ),
        (
            "{\"expert_heat_collection_interval\": 4294967296}",
            &GUARD,
            vec![
                "eplb_config.expert_heat_collection_interval: heat interval must be an integer in 1..=4294967295, got 4294967296 (zero never completes a cycle)"
                    .into(),
            ],
        ),
        (
            "{\"num_redundant_experts\": -1}",
            &GUARD,
            vec!["eplb_config.num_redundant_experts: redundant experts must be an integer in 0..=65535, got -1 (a layer's slots are numbered in 16 bits)".into()],
        ),
        (
            "{\"num_redundant_experts\": 5000000000}",
            &GUARD,
            vec![
                "eplb_config.num_redundant_experts: redundant experts must be an integer in 0..=65535, got 5000000000 (a layer's slots are numbered in 16 bits)"
                    .into(),
            ],
        ),
        (
            "{\"eplb_policy_seed\": -5}",
            &GUARD,
            vec!["eplb_config.eplb_policy_seed: must be at least 0, got -5".into()],
        ),
        // Policy and stage.
        ("{\"eplb_policy_type\": 5}", &GUARD, vec![policy("5", "")]),
        ("{\"eplb_policy_type\": -1}", &GUARD, vec![policy("-1", "")]),
        (
            "{\"eplb_policy_type\": \"Swift\"}",
            &GUARD,
            vec![policy("\"Swift\"", "; did you mean \"swift\"?")],
        ),
        (
            "{\"eplb_policy_type\": \"flash\"}",
            &GUARD,
            vec![policy("\"flash\"", "; did you mean \"flashlb\"?")],
        ),
        (
            "{\"eplb_policy_type\": \"greedy\"}",
            &GUARD,
            vec![policy("\"greedy\"", "")],
        ),
        (
            "{\"eplb_policy_type\": \"7\"}",
            &GUARD,
            vec![policy("\"7\"", "")],
        ),
        (
            "{\"eplb_heat_collection_stage\": \"prefil\"}",
            &GUARD,
            vec![stage("prefil", "; did you mean \"prefill\"?")],
        ),
        (
            "{\"eplb_heat_collection_stage\": \"Decode\"}",
            &GUARD,
            vec![stage("Decode", "; did you mean \"decode\"?")],
        ),
        (
            "{\"eplb_heat_collection_stage\": \"both\"}",
            &GUARD,
            vec![stage("both", "")],
        ),
        // Map paths.
        (
            "{\"expert_map_path\": \"map.txt\"}",
            &GUARD,
            vec!["eplb_config.expert_map_path: \"map.txt\" must end with \".json\"".into()],
        ),
        (
            "{\"expert_map_path\": \"map.JSON\"}",
            &NO_ENV,
            vec!["eplb_config.expert_map_path: \"map.JSON\" must end with \".json\"".into()],
        ),
        (
            "{\"expert_map_path\": \"{TMP}/missing.json\"}",
            &NO_ENV,
            vec![tmp.msg("eplb_config.expert_map_path: cannot read \"{TMP}/missing.json\": *")],
        ),
        (
            "{\"expert_map_path\": \"{TMP}/dir.json\"}",
            &NO_ENV,
            vec![tmp.msg(
                "eplb_config.expert_map_path: cannot read \"{TMP}/dir.json\": is a directory",
            )],
        ),
        (
            "{\"expert_map_record_path\": \"out/rec.csv\"}",
            &GUARD,
            vec![
                "eplb_config.expert_map_record_path: \"out/rec.csv\" must end with \".json\""
                    .into(),
            ],
        ),
        (
            "{\"expert_map_record_path\": \"{TMP}/recdir.json\"}",
            &GUARD,
            vec![tmp.msg("eplb_config.expert_map_record_path: \"{TMP}/recdir.json\": is a directory")],
        ),
        (
            "{\"expert_map_record_path\": \"{TMP}/afile/sub/rec.json\"}",
            &GUARD,
            vec![tmp.msg(
                "eplb_config.expert_map_record_path: \"{TMP}/afile/sub/rec.json\": directory \"{TMP}/afile/sub\" *",
            )],
        ),
        // Env guard.
        (
            "{\"dynamic_eplb\": true}",
            &NO_ENV,
            vec![format!(
                "eplb_config.dynamic_eplb = true{}",
                guard_tail("unset", "unset")
            )],
        ),
        (
            "{\"eplb_config\": {\"dynamic_eplb\": true}}",
            &yes_env,
            vec![format!(
                "eplb_config.dynamic_eplb = true{}",
                guard_tail("\"yes\"", "\"TRUE\"")
            )],
        ),
        (
            "{\"expert_map_record_path\": \"rec.json\", \"dynamic_eplb\": false}",
            &NO_ENV,
            vec![format!(
                "eplb_config.expert_map_record_path = \"rec.json\" (record mode, dynamic EPLB){}",
                guard_tail("unset", "unset")
            )],
        ),
        (
            "{\"dynamic_eplb\": true, \"expert_map_path\": \"{TMP}/map.json\"}",
            &[(DYNAMIC_EPLB, "0")],
            vec![format!(
                "eplb_config.dynamic_eplb = true{}",
                guard_tail("\"0\"", "unset")
            )],
        ),
        // Several problems at once, in a stable order.
        (
            "{\"dynamic_epbl\": true, \"foo\": 1, \"expert_heat_collection_interval\": 0, \
              \"eplb_policy_type\": 9, \"eplb_heat_collection_stage\": \"Decode\"}",
            &GUARD,
            vec![
                "eplb_config: unknown key \"dynamic_epbl\"; did you mean \"dynamic_eplb\"?".into(),
                unknown_foo.clone(),
                "eplb_config.expert_heat_collection_interval: heat interval must be an integer in 1..=4294967295, got 0 (zero never completes a cycle)"
                    .into(),
                policy("9", ""),
                stage("Decode", "; did you mean \"decode\"?"),
            ],
        ),
        (
            "{\"eplb_config\": {\"dynamic_eplb\": true, \"expert_map_path\": \"{TMP}/missing.json\", \
              \"algorithm_execution_interval\": 0}, \"extra\": 1}",
            &NO_ENV,
            vec![
                "unknown top-level key \"extra\"; expected \"eplb_config\" or \"deployment\"".into(),
                tmp.msg("eplb_config.expert_map_path: cannot read \"{TMP}/missing.json\": *"),
                "eplb_config.algorithm_execution_interval: algorithm interval must be an integer in 1..=4294967295, got 0 (zero never completes a cycle)"
                    .into(),
                format!("eplb_config.dynamic_eplb = true{}", guard_tail("unset", "unset")),
            ],
        ),
    ];
    assert!(cases.len() >= 25);

    let mut failures = Vec::new();
    for (text, env, want) in &cases {
        let text = tmp.json(text);
        let got = messages(&text, *env);
        let ok = got.len() == want.len() && got.iter().zip(want).all(|(g, w)| matches(g, w));
        if !ok {
            failures.push(format!("{text}\n  got:  {got:#?}\n  want: {want:#?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn defaults() {
    for text in ["{}", "{\"eplb_config\": {}}", "{\"deployment\": {}}"] {
        let cfg = parse(text, &NO_ENV).unwrap();
        assert_eq!(cfg.mode(), Mode::Off);
        assert!(!cfg.dynamic());
        assert_eq!(cfg.expert_map_path(), None);
        assert_eq!(cfg.expert_map_record_path(), None);
        assert_eq!(cfg.heat_interval(), 600);
        assert_eq!(cfg.algo_interval(), 50);
        assert_eq!(cfg.num_redundant_experts(), 0);
        assert_eq!(cfg.redundant_experts(), 0);
        assert_eq!(cfg.policy(), PolicyKind::Swift);
        assert_eq!(cfg.policy_seed(), 0);
        assert_eq!(cfg.heat_stage(), HeatStage::All);
        assert!(cfg.warnings().is_empty());
    }
    let cfg = parse("{}", &NO_ENV).unwrap();
    assert_eq!(cfg, EplbConfig::default());
    assert_eq!(cfg.deployment(), None);
    assert_eq!(
        cfg.summary(),
        "mode: off\n\
         dynamic_eplb: false\n\
         expert_map_path: none\n\
         expert_map_record_path: none\n\
         expert_heat_collection_interval: 600\n\
         algorithm_execution_interval: 50\n\
         num_redundant_experts: 0\n\
         eplb_policy_type: 2 (swift)\n\
         eplb_policy_seed: 0\n\
         eplb_heat_collection_stage: all\n\
         deployment: none"
    );
}

#[test]
fn wrapped_and_inner_forms_agree() {
    let inner = r#"{
        "dynamic_eplb": true,
        "expert_map_path": null,
        "expert_map_record_path": null,
        "expert_heat_collection_interval": 400,
        "algorithm_execution_interval": 30,
        "num_redundant_experts": 16,
        "eplb_policy_type": 3,
        "eplb_policy_seed": 18446744073709551615,
        "eplb_heat_collection_stage": "decode"
    }"#;
    let wrapped = format!("{{\"eplb_config\": {inner}}}");
    let a = parse(inner, &GUARD).unwrap();
    let b = parse(&wrapped, &GUARD).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.mode(), Mode::Dynamic);
    assert_eq!(a.heat_interval(), 400);
    assert_eq!(a.algo_interval(), 30);
    assert_eq!(a.num_redundant_experts(), 16);
    assert_eq!(a.redundant_experts(), 16);
    assert_eq!(a.policy(), PolicyKind::FlashLb);
    assert_eq!(a.policy_seed(), u64::MAX);
    assert_eq!(a.heat_stage(), HeatStage::Decode);
    let value: serde_json::Value = serde_json::from_str(&wrapped).unwrap();
    assert_eq!(EplbConfig::from_value(&value, &GUARD).unwrap(), a);
}

#[test]
fn policy_params_are_checked_by_the_policy() {
    let cfg = parse(
        r#"{"eplb_policy_type": "incremental",
            "eplb_policy_params": {"max_fetches": 40, "min_gain": 0.02}}"#,
        &GUARD,
    )
    .unwrap();
    assert_eq!(
        cfg.policy_params(),
        &[
            ("max_fetches".to_owned(), 40.0),
            ("min_gain".to_owned(), 0.02)
        ]
    );
    let eplb_policies::AnyPolicy::Incremental(p) = cfg.build_policy() else {
        panic!("not incremental");
    };
    assert_eq!((p.params().max_fetches, p.params().min_gain), (40, 0.02));
    assert!(
        cfg.summary()
            .contains("eplb_policy_params: max_fetches=40, min_gain=0.02")
    );
    assert_eq!(parse("{}", &GUARD).unwrap().policy_params(), &[]);
    assert_eq!(
        messages(
            r#"{"eplb_policy_type": 4, "eplb_policy_params": {"min_gainz": 1, "movers": 0, "z": "x"}}"#,
            &GUARD
        ),
        vec![
            "eplb_config.eplb_policy_params: parameter `z`: expected a number, got \"x\"".to_owned(),
            "eplb_config.eplb_policy_params: unknown parameter `min_gainz` for policy `incremental` (it takes: min_gain, max_fetches, max_fetch_fraction, cold_start, partners, movers, shift_threshold, history_windows, workload_weight, z)".to_owned(),
            "eplb_config.eplb_policy_params: parameter `movers` = 0 is out of range (expected an integer >= 1)".to_owned(),
        ]
    );
    assert_eq!(
        messages(r#"{"eplb_policy_type": "swift", "eplb_policy_params": {"movers": 4}}"#, &GUARD),
        vec!["eplb_config.eplb_policy_params: unknown parameter `movers` for policy `swift` (it takes: none)".to_owned()]
    );
    assert_eq!(
        messages(r#"{"eplb_policy_params": [1]}"#, &GUARD),
        vec!["eplb_config.eplb_policy_params: expected an object of numbers, got [1]".to_owned()]
    );
}

#[test]
fn policies_by_number_and_name() {
    for (given, want) in [
        ("0", PolicyKind::Random),
        ("1", PolicyKind::Default),
        ("2", PolicyKind::Swift),
        ("3", PolicyKind::FlashLb),
        ("4", PolicyKind::Incremental),
        ("\"random\"", PolicyKind::Random),
        ("\"default\"", PolicyKind::Default),
        ("\"swift\"", PolicyKind::Swift),
        ("\"flashlb\"", PolicyKind::FlashLb),
        ("\"incremental\"", PolicyKind::Incremental),
        ("\"deepseek\"", PolicyKind::DeepSeek),
        ("\"4\"", PolicyKind::Incremental),
    ] {
        let cfg = parse(&format!("{{\"eplb_policy_type\": {given}}}"), &NO_ENV).unwrap();
        assert_eq!(cfg.policy(), want, "{given}");
    }
    let cfg = parse("{\"eplb_policy_type\": \"deepseek\"}", &NO_ENV).unwrap();
    assert!(cfg.summary().contains("\neplb_policy_type: deepseek\n"));
}

#[test]
fn env_guard_values() {
    let text = "{\"dynamic_eplb\": true}";
    for (env, ok) in [
        (vec![(DYNAMIC_EPLB, "true")], true),
        (vec![(DYNAMIC_EPLB, "True")], true),
        (vec![(DYNAMIC_EPLB, "1")], true),
        (vec![(EXPERT_MAP_RECORD, "true")], true),
        (vec![(EXPERT_MAP_RECORD, "True")], false),
        (vec![(DYNAMIC_EPLB, "on")], false),
        (vec![], false),
    ] {
        let env: BTreeMap<String, String> = env
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(parse(text, &env).is_ok(), ok, "{env:?}");
    }
    // Static mode and off need no env.
    assert!(parse("{\"dynamic_eplb\": false}", &NO_ENV).is_ok());
}

#[test]
fn record_path_needs_an_existing_directory() {
    let tmp = TempDir::new("rec");
    let text = tmp.json("{\"expert_map_record_path\": \"{TMP}/a/b/map.json\"}");
    let e = parse(&text, &[(EXPERT_MAP_RECORD, "true")]).unwrap_err();
    assert_eq!(
        e.messages(),
        vec![tmp.msg(
            "eplb_config.expert_map_record_path: \"{TMP}/a/b/map.json\": directory \"{TMP}/a/b\" does not exist"
        )]
    );
    assert!(!tmp.path().join("a").exists());
    std::fs::create_dir_all(tmp.path().join("a/b")).unwrap();
    let cfg = parse(&text, &[(EXPERT_MAP_RECORD, "true")]).unwrap();
    assert!(!tmp.path().join("a/b/map.json").exists());
    assert_eq!(cfg.mode(), Mode::Record);
    assert!(cfg.dynamic());
    assert_eq!(
        cfg.expert_map_record_path(),
        Some(tmp.path().join("a/b/map.json").as_path())
    );
    assert!(
        cfg.summary()
            .contains("\ndynamic_eplb: true (forced by expert_map_record_path)\n")
    );
    assert!(parse(&text, &GUARD).is_ok());
}

#[test]
fn invalid_config_creates_nothing() {
    let tmp = TempDir::new("norec");
    let text = tmp.json(
        "{\"expert_map_record_path\": \"{TMP}/x/map.json\", \"expert_heat_collection_interval\": 0}",
    );
    assert!(parse(&text, &GUARD).is_err());
    assert!(!tmp.path().join("x").exists());
    // The env guard failing also creates nothing.
    let text = tmp.json("{\"expert_map_record_path\": \"{TMP}/x/map.json\"}");
    assert!(parse(&text, &NO_ENV).is_err());
    assert!(!tmp.path().join("x").exists());
}

#[test]
fn bare_record_file_name() {
    let cfg = parse("{\"expert_map_record_path\": \"expert_map.json\"}", &GUARD).unwrap();
    assert_eq!(cfg.mode(), Mode::Record);
    assert_eq!(
        cfg.expert_map_record_path(),
        Some(Path::new("expert_map.json"))
    );
}

#[test]
fn static_map_path() {
    let tmp = TempDir::new("static");
    std::fs::write(tmp.path().join("map.json"), "{\"moe_layer_count\": 0}").unwrap();
    let text = tmp.json("{\"expert_map_path\": \"{TMP}/map.json\", \"num_redundant_experts\": 4}");
    let cfg = parse(&text, &NO_ENV).unwrap();
    assert_eq!(cfg.mode(), Mode::Static);
    assert!(!cfg.dynamic());
    assert_eq!(cfg.redundant_experts(), 0);
    assert_eq!(
        cfg.expert_map_path(),
        Some(tmp.path().join("map.json").as_path())
    );
    assert_eq!(
        cfg.warnings(),
        vec![
            "eplb_config.num_redundant_experts = 4 is ignored because dynamic_eplb is false"
                .to_owned(),
            "static EPLB is scheduled for removal upstream (vLLM-Ascend v0.25.1)".to_owned(),
        ]
    );
    assert!(
        cfg.summary()
            .contains("\nnum_redundant_experts: 4 (ignored: dynamic_eplb is false)\n")
    );

    // With dynamic_eplb the file seeds the dynamic mode.
    let text = tmp.json("{\"expert_map_path\": \"{TMP}/map.json\", \"dynamic_eplb\": true}");
    let cfg = parse(&text, &GUARD).unwrap();
    assert_eq!(cfg.mode(), Mode::Dynamic);
    assert!(cfg.expert_map_path().is_some());
}

#[test]
fn map_validator_hook() {
    let tmp = TempDir::new("validate");
    std::fs::write(tmp.path().join("good.json"), "good").unwrap();
    std::fs::write(tmp.path().join("bad.json"), "bad").unwrap();
    let validator: &MapValidator<'_> = &|p: &Path| {
        let text = std::fs::read_to_string(p)?;
        if text == "good" {
            Ok(())
        } else {
            Err("layer 0: device 1 has 4 slots, device 0 has 5".into())
        }
    };
    let good = tmp.json("{\"expert_map_path\": \"{TMP}/good.json\"}");
    let cfg = EplbConfig::from_json_str_with(&good, &NO_ENV, Some(validator)).unwrap();
    assert_eq!(cfg.mode(), Mode::Static);

    let bad = tmp.json("{\"expert_map_path\": \"{TMP}/bad.json\"}");
    assert!(EplbConfig::from_json_str(&bad, &NO_ENV).is_ok());
    let err = EplbConfig::from_json_str_with(&bad, &NO_ENV, Some(validator)).unwrap_err();
    assert_eq!(
        err.messages(),
        vec![tmp.msg(
            "eplb_config.expert_map_path: \"{TMP}/bad.json\" is not a valid expert map: layer 0: device 1 has 4 slots, device 0 has 5"
        )]
    );
    // The validator is not called for a missing file.
    let missing = tmp.json("{\"expert_map_path\": \"{TMP}/none.json\"}");
    let called = core::cell::Cell::new(false);
    let spy = |_: &Path| -> Result<(), eplb_runtime::config::MapRejected> {
        called.set(true);
        Ok(())
    };
    assert!(EplbConfig::from_json_str_with(&missing, &NO_ENV, Some(&spy)).is_err());
    assert!(!called.get());
}

#[test]
fn deployment_is_kept_raw() {
    let text = r#"{"eplb_config": {"eplb_policy_type": "default"},
                   "deployment": {"hardware": "A3", "fused_mc2": true}}"#;
    let cfg = parse(text, &NO_ENV).unwrap();
    assert_eq!(cfg.policy(), PolicyKind::Default);
    assert_eq!(
        cfg.deployment(),
        Some(&serde_json::json!({"hardware": "A3", "fused_mc2": true}))
    );
    assert!(cfg.summary().ends_with("\ndeployment: given"));
}

#[test]
fn shape_checks() {
    let dynamic = |x: u32| {
        parse(
            &format!("{{\"dynamic_eplb\": true, \"num_redundant_experts\": {x}}}"),
            &GUARD,
        )
        .unwrap()
    };
    let off = parse("{\"num_redundant_experts\": 2}", &NO_ENV).unwrap();

    let shape = dynamic(32).check_shape(256, 32).unwrap();
    assert_eq!(shape.slots_per_rank(), 9);
    assert_eq!(shape.redundant(), 32);
    let shape = dynamic(32).shape(58, 256, 32).unwrap();
    assert_eq!(shape.layers(), 58);

    let err = dynamic(2).check_shape(8, 3).unwrap_err();
    assert_eq!(
        err.to_string(),
        "eplb_config.num_redundant_experts = 2 with 8 experts on 3 ranks: 8 experts + 2 redundant \
         is not a multiple of 3 ranks; nearest valid redundant counts: 1 or 4"
    );
    assert!(core::error::Error::source(&err).is_some());

    // Not dynamic: X is 0 whatever the config says.
    assert_eq!(off.check_shape(8, 2).unwrap().redundant(), 0);
    assert_eq!(
        off.check_shape(8, 3).unwrap_err().to_string(),
        "0 redundant experts (dynamic_eplb is false) with 8 experts on 3 ranks: 8 experts + 0 \
         redundant is not a multiple of 3 ranks; nearest valid redundant counts: 1"
    );
    assert!(off.check_shape(8, 1).is_ok());

    assert_eq!(
        dynamic(0).check_shape(8, 1).unwrap_err(),
        ConfigError::SingleRank
    );
    assert_eq!(
        ConfigError::SingleRank.to_string(),
        "eplb_config.dynamic_eplb = true needs expert parallelism (at least 2 ranks), got 1 rank"
    );
    // Too many redundant copies for the shape are errors too.
    assert!(dynamic(10).check_shape(8, 2).is_err());
}

#[test]
fn from_file_reads_and_reports() {
    let tmp = TempDir::new("file");
    let file = tmp.path().join("cfg.json");
    std::fs::write(&file, "{\"eplb_config\": {\"eplb_policy_type\": 1}}").unwrap();
    let cfg = EplbConfig::from_file(&file, &NO_ENV, None).unwrap();
    assert_eq!(cfg.policy(), PolicyKind::Default);

    let missing = tmp.path().join("missing.json");
    let err = EplbConfig::from_file(&missing, &NO_ENV, None).unwrap_err();
    assert_eq!(err.len(), 1);
    assert!(matches(
        &err.to_string(),
        &tmp.msg("cannot read config file \"{TMP}/missing.json\": *")
    ));
}

#[test]
fn errors_list_every_problem() {
    let err = parse(
        "{\"expert_heat_collection_interval\": 0, \"algorithm_execution_interval\": 0}",
        &NO_ENV,
    )
    .unwrap_err();
    assert_eq!(err.len(), 2);
    assert!(!err.is_empty());
    assert_eq!(err.to_string(), err.messages().join("\n"));
    assert_eq!(err.problems().len(), 2);
    assert!(core::error::Error::source(&err).is_none());
    assert_eq!(
        err.clone().into_problems(),
        err.into_iter().collect::<Vec<_>>()
    );
    assert_eq!(ConfigErrors::new(Vec::new()), None);
}

#[test]
fn process_env_reads_this_process() {
    assert_eq!(
        ProcessEnv.var("PATH"),
        std::env::var_os("PATH").map(|v| v.to_string_lossy().into_owned())
    );
    assert_eq!(ProcessEnv.var("EPLB_SURELY_UNSET_VARIABLE_1234"), None);
}

#[test]
fn record_path_equal_to_the_map_path_is_refused() {
    let tmp = TempDir::new("recmap");
    let map = tmp.path().join("map.json");
    std::fs::write(&map, "{}").unwrap();
    for record in ["{TMP}/map.json", "{TMP}/./map.json"] {
        let text = tmp.json(&format!(
            "{{\"expert_map_path\": \"{{TMP}}/map.json\", \"expert_map_record_path\": \"{record}\"}}"
        ));
        let e = parse(&text, &GUARD).unwrap_err();
        assert_eq!(
            e.messages(),
            vec![tmp.msg(&format!(
                "eplb_config.expert_map_record_path: \"{record}\": is expert_map_path; recording would overwrite the map it starts from"
            ))]
        );
    }
    assert_eq!(std::fs::read(&map).unwrap(), b"{}");
}

#[test]
fn payoff_gate_is_off_by_default_and_on_with_true_or_its_settings() {
    use eplb_runtime::startup::{ModelInfo, payoff_gate};
    let model = ModelInfo {
        layers: 58,
        experts: 256,
        ranks: 32,
        ranks_per_node: 16,
        groups: 1,
        max_num_seqs: 64,
        speculative_tokens: 0,
        tp_size: 1,
    };
    let off = parse(r#"{"dynamic_eplb": true}"#, &GUARD).unwrap();
    assert!(off.payoff_gate().is_none());
    assert!(payoff_gate(&off, &model).unwrap().is_none());
    // `true`: DeepSeek-V3 W8A8 on A3, decode, over the next cycle (H + A iterations).
    let on = parse(
        r#"{"dynamic_eplb": true, "eplb_payoff_gate": true,
            "expert_heat_collection_interval": 100, "algorithm_execution_interval": 20}"#,
        &GUARD,
    )
    .unwrap();
    let g = payoff_gate(&on, &model).unwrap().unwrap();
    assert_eq!(g.iterations, 120);
    assert_eq!(g.model.hardware.name, eplb_core::time::Hardware::A3.name);
    assert_eq!(g.model.model.hidden, 7168);
    assert_eq!(g.model.tokens_per_rank, 128.0);
    assert_eq!(g.model.ranks_per_node, Some(16));
    // The W8A8 DeepSeek-V3 expert of the payload table.
    assert_eq!(g.model.expert_bytes, 44_085_248.0);
    // Its settings, and the deployment facts for the ones it leaves out.
    let set = parse(
        r#"{"eplb_config": {"dynamic_eplb": true,
              "eplb_payoff_gate": {"model": "qwen3-30b", "tokens_per_rank": 64}},
            "deployment": {"hardware": "A2", "role": "prefill", "quant_type": "W8A8"}}"#,
        &GUARD,
    )
    .unwrap();
    let g = payoff_gate(&set, &model).unwrap().unwrap();
    assert_eq!(g.model.hardware.name, eplb_core::time::Hardware::A2.name);
    assert_eq!(g.model.model.hidden, 2048);
    assert_eq!(g.model.tokens_per_rank, 64.0);
    // Bad values and keys are errors that name them.
    assert_eq!(
        messages(r#"{"eplb_payoff_gate": "yes"}"#, &GUARD),
        vec![
            "eplb_config.eplb_payoff_gate: expected a boolean or an object, got \"yes\"".to_owned()
        ]
    );
    let m = messages(
        r#"{"eplb_payoff_gate": {"modle": "x", "hardware": "tpu", "tokens_per_rank": 0}}"#,
        &GUARD,
    );
    assert_eq!(m.len(), 3, "{m:?}");
    assert!(
        m.iter()
            .any(|e| e.contains("unknown key \"modle\"") && e.contains("did you mean \"model\"")),
        "{m:?}"
    );
    assert!(
        m.iter()
            .any(|e| e.contains("hardware: unknown hardware \"tpu\"")),
        "{m:?}"
    );
    assert!(
        m.iter()
            .any(|e| e.contains("eplb_config.eplb_payoff_gate.tokens_per_rank: tokens per rank must be a number in (0, 1048576], got 0")),
        "{m:?}"
    );
}

#[test]
fn payoff_gate_calibration_prices_the_gates_step_and_bad_files_are_errors_naming_the_key() {
    use eplb_runtime::startup::{ModelInfo, payoff_gate};
    let model = ModelInfo {
        layers: 58,
        experts: 256,
        ranks: 32,
        ranks_per_node: 16,
        groups: 1,
        max_num_seqs: 64,
        speculative_tokens: 0,
        tp_size: 1,
    };
    let tmp = TempDir::new("calib");
    // What `eplb calibrate --out` writes: the multipliers and the fit's report.
    std::fs::write(
        tmp.path().join("calib.json"),
        r#"{"format": "eplb-calibration/v1", "points": 3, "residuals_pct": [0.1],
            "multipliers": {"host": 2.0, "backbone": 2.0, "gemm": 1.0, "link": 1.0, "latency": 1.0}}"#,
    )
    .unwrap();
    let plain = parse(r#"{"dynamic_eplb": true, "eplb_payoff_gate": {}}"#, &GUARD).unwrap();
    let calibrated = parse(
        &tmp.json(
            r#"{"dynamic_eplb": true, "eplb_payoff_gate": {"calibration": "{TMP}/calib.json"}}"#,
        ),
        &GUARD,
    )
    .unwrap();
    let c = calibrated
        .payoff_gate()
        .and_then(|g| g.calibration.as_ref())
        .unwrap();
    assert_eq!(c.path, tmp.path().join("calib.json"));
    assert_eq!(c.multipliers.as_array(), [2.0, 2.0, 1.0, 1.0, 1.0]);
    // `eplb check-config` prints it.
    assert!(
        calibrated.summary().contains(&format!(
            "calibration {})",
            tmp.path().join("calib.json").display()
        )),
        "{}",
        calibrated.summary()
    );
    assert!(
        plain.summary().contains("calibration none (the presets))"),
        "{}",
        plain.summary()
    );
    // The gate weighs moves against the step the calibration prices: the backbone and host
    // doubled, so is the step besides the MoE layers; the MoE model is the same.
    let g0 = payoff_gate(&plain, &model).unwrap().unwrap();
    let g1 = payoff_gate(&calibrated, &model).unwrap().unwrap();
    assert!(g0.step_other_ms > 0.0, "{g0:?}");
    assert!(
        (g1.step_other_ms - 2.0 * g0.step_other_ms).abs() < 1e-9 * g0.step_other_ms,
        "{g0:?} {g1:?}"
    );
    assert_eq!((g0.model, g0.iterations), (g1.model, g1.iterations));
    // A missing file, a directory, a file of another format, a bad multiplier and a path
    // that is not a string: typed errors naming the key.
    std::fs::write(
        tmp.path().join("other.json"),
        r#"{"format": "eplb-trace/v1"}"#,
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("neg.json"),
        r#"{"format": "eplb-calibration/v1", "multipliers":
            {"host": 1, "backbone": -1, "gemm": 1, "link": 1, "latency": 1}}"#,
    )
    .unwrap();
    for (file, why) in [
        ("missing.json", "No such file"),
        ("", "is a directory"),
        ("other.json", "\"format\" must be \"eplb-calibration/v1\""),
        (
            "neg.json",
            "multipliers.backbone must be a finite number >= 0, not -1",
        ),
    ] {
        let text = tmp.json(&format!(
            r#"{{"eplb_payoff_gate": {{"calibration": "{{TMP}}/{file}"}}}}"#
        ));
        let e = parse(&text, &GUARD).unwrap_err();
        let p = e.problems();
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            matches!(&p[0], ConfigError::PayoffGateCalibration { path, .. }
                if *path == tmp.path().join(file)),
            "{p:?}"
        );
        let m = p[0].to_string();
        assert!(
            m.starts_with(&tmp.msg("eplb_config.eplb_payoff_gate.calibration: \"{TMP}/"))
                && m.contains(why),
            "{m}"
        );
    }
    assert_eq!(
        messages(r#"{"eplb_payoff_gate": {"calibration": 3}}"#, &GUARD),
        vec![
            "eplb_config.eplb_payoff_gate: calibration: expected the path of a calibration file (eplb calibrate --out), got 3"
                .to_owned()
        ]
    );
}
