//! The `deployment` object: parsing errors with their exact messages, every row of the support
//! table, every usage warning with its message, flag overrides, and the start-up log.

use std::sync::Mutex;

use eplb_core::HeatStage;
use eplb_runtime::config::deployment::{
    Advice, Deployment, DeploymentError, Hardware, QuantType, Role, Support, check_support,
    supported_hardware,
};
use eplb_runtime::config::{ConfigError, DYNAMIC_EPLB, EplbConfig, Mode};

const GUARD: [(&str, &str); 1] = [(DYNAMIC_EPLB, "1")];

const SUPPORTED: &str = "EPLB supports W8A8 and W8A8-Dynamic on A2/A3, W4A8 with fused MC2 (fused_mc2: true) on A2/A3, MXFP4 and MXFP8 on 950PR/950DT, and unquantised weights (unverified) anywhere";

/// Parses `{"eplb_config": <eplb>, "deployment": <dep>}` with the env guard satisfied.
fn parse(eplb: &str, dep: &str) -> Result<EplbConfig, Vec<String>> {
    let text = format!("{{\"eplb_config\": {eplb}, \"deployment\": {dep}}}");
    EplbConfig::from_json_str(&text, &GUARD).map_err(|e| e.messages())
}

const DYNAMIC: &str = r#"{"dynamic_eplb": true}"#;

fn hw(name: &str) -> Hardware {
    name.parse().unwrap()
}

#[test]
fn parse_errors_name_key_and_value() {
    let cases: &[(&str, &[&str])] = &[
        (
            r#"{"hardwre": "A3"}"#,
            &["deployment: unknown key \"hardwre\"; did you mean \"hardware\"?"],
        ),
        (
            r#"{"gpu": 1}"#,
            &[
                "deployment: unknown key \"gpu\"; valid keys: hardware, quant_type, fused_mc2, role, input_len, concurrency, experts_per_die, tokens_per_die",
            ],
        ),
        (
            r#"{"hardware": "A5"}"#,
            &[
                "deployment.hardware: unknown hardware \"A5\"; expected one of A2, A3, 950PR, 950DT; did you mean \"A2\"?",
            ],
        ),
        (
            r#"{"hardware": 3}"#,
            &[
                "deployment.hardware: expected a string (\"A2\", \"A3\", \"950PR\" or \"950DT\"), got 3",
            ],
        ),
        (
            r#"{"quant_type": "W8A16"}"#,
            &[
                "deployment.quant_type: unknown quant type \"W8A16\"; expected one of none, W8A8, W8A8-Dynamic, W4A8, MXFP4, MXFP8, W4A8MXFP4, W4A16, W4A16MXFP4; did you mean \"W4A16\"?",
            ],
        ),
        (
            r#"{"fused_mc2": "yes"}"#,
            &["deployment.fused_mc2: expected a boolean, got \"yes\""],
        ),
        (
            r#"{"role": "both"}"#,
            &["deployment.role: unknown role \"both\"; expected one of prefill, decode, colocated"],
        ),
        (
            r#"{"input_len": 1024.5}"#,
            &["deployment.input_len: expected an integer, got 1024.5"],
        ),
        (
            r#"{"concurrency": true}"#,
            &["deployment.concurrency: expected an integer, got true"],
        ),
        (
            r#"{"experts_per_die": 0}"#,
            &["deployment.experts_per_die: must be in 1..=4294967295, got 0"],
        ),
        (
            r#"{"tokens_per_die": -1}"#,
            &["deployment.tokens_per_die: must be in 0..=4294967295, got -1"],
        ),
        (
            r#"{"input_len": 4294967296}"#,
            &["deployment.input_len: must be in 1..=4294967295, got 4294967296"],
        ),
        (
            r#"["A3"]"#,
            &["deployment: must be a JSON object, got [\"A3\"]"],
        ),
        (
            r#"{"hardware": "A9", "role": 1, "extra": 0}"#,
            &[
                "deployment: unknown key \"extra\"; valid keys: hardware, quant_type, fused_mc2, role, input_len, concurrency, experts_per_die, tokens_per_die",
                "deployment.hardware: unknown hardware \"A9\"; expected one of A2, A3, 950PR, 950DT; did you mean \"A2\"?",
                "deployment.role: expected a string (\"prefill\", \"decode\" or \"colocated\"), got 1",
            ],
        ),
    ];
    let mut failures = Vec::new();
    for (dep, want) in cases {
        let got = parse("{}", dep).err().unwrap_or_default();
        if got != *want {
            failures.push(format!("{dep}\n  got:  {got:#?}\n  want: {want:#?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Problems with the config and the deployment are reported together, the document's
    // (the deployment's) first.
    let got = parse(r#"{"eplb_policy_type": 9}"#, r#"{"role": "x"}"#).unwrap_err();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].starts_with("deployment.role"), "{got:?}");
    assert!(
        got[1].starts_with("eplb_config.eplb_policy_type"),
        "{got:?}"
    );
}

#[test]
fn every_key_parses_and_null_is_absent() {
    let cfg = parse(
        "{}",
        r#"{"hardware": "a3", "quant_type": "W8A8_DYNAMIC", "fused_mc2": true, "role": "Decode",
            "input_len": 2048, "concurrency": 64, "experts_per_die": 16, "tokens_per_die": 0}"#,
    )
    .unwrap();
    let d = *cfg.deployment_facts().unwrap();
    assert_eq!(
        d,
        Deployment {
            hardware: Some(Hardware::A3),
            quant_type: Some(QuantType::W8A8Dynamic),
            fused_mc2: Some(true),
            role: Some(Role::Decode),
            input_len: Some(2048),
            concurrency: Some(64),
            experts_per_die: Some(16),
            tokens_per_die: Some(0),
        }
    );
    assert_eq!(
        d.summary(),
        "hardware A3, quant_type W8A8-Dynamic, fused_mc2 true, role decode, input_len 2048, concurrency 64, experts_per_die 16, tokens_per_die 0"
    );
    let cfg = parse("{}", r#"{"hardware": null}"#).unwrap();
    assert_eq!(cfg.deployment_facts(), Some(&Deployment::default()));
    assert_eq!(Deployment::default().summary(), "none known");
    assert_eq!(parse("{}", "{}").unwrap().warnings(), Vec::<String>::new());
}

/// Every (hardware, quant type, fused MC2) combination against the seed's table.
#[test]
fn support_table_every_row() {
    let a = [Hardware::A2, Hardware::A3];
    let b = [Hardware::Ascend950Pr, Hardware::Ascend950Dt];
    for q in QuantType::ALL {
        for fused in [false, true] {
            let want: Vec<Hardware> = match (q, fused) {
                (QuantType::None, _) => Hardware::ALL.to_vec(),
                (QuantType::W8A8 | QuantType::W8A8Dynamic, _) => a.to_vec(),
                (QuantType::W4A8, true) => a.to_vec(),
                (QuantType::Mxfp4 | QuantType::Mxfp8, _) => b.to_vec(),
                _ => vec![],
            };
            assert_eq!(supported_hardware(q, fused), want.as_slice(), "{q} {fused}");
            for h in Hardware::ALL {
                let got = check_support(Some(h), q, fused);
                if want.contains(&h) {
                    let s = if q == QuantType::None {
                        Support::Unverified
                    } else {
                        Support::Verified
                    };
                    assert_eq!(got, Ok(s), "{h} {q} {fused}");
                } else {
                    assert_eq!(
                        got,
                        Err(DeploymentError::Unsupported {
                            hardware: Some(h),
                            quant: q,
                            fused_mc2: fused
                        }),
                        "{h} {q} {fused}"
                    );
                }
            }
            // Hardware unknown: an error only when no hardware supports it.
            assert_eq!(
                check_support(None, q, fused).is_ok(),
                !want.is_empty(),
                "{q} {fused}"
            );
        }
    }
}

/// The messages of the support table's errors, through the config (dynamic EPLB on).
#[test]
fn support_table_messages() {
    let cases: &[(&str, String)] = &[
        (
            r#"{"hardware": "950DT", "quant_type": "W4A16"}"#,
            format!(
                "deployment: EPLB does not support quant_type W4A16 without fused MC2 on 950DT (W4A8MXFP4, W4A16 and W4A16MXFP4 are explicitly unsupported on the 950 products and not supported on A2/A3); {SUPPORTED}"
            ),
        ),
        (
            r#"{"hardware": "950PR", "quant_type": "W4A8MXFP4"}"#,
            format!(
                "deployment: EPLB does not support quant_type W4A8MXFP4 without fused MC2 on 950PR (W4A8MXFP4, W4A16 and W4A16MXFP4 are explicitly unsupported on the 950 products and not supported on A2/A3); {SUPPORTED}"
            ),
        ),
        (
            r#"{"hardware": "950DT", "quant_type": "W4A16MXFP4", "fused_mc2": true}"#,
            format!(
                "deployment: EPLB does not support quant_type W4A16MXFP4 with fused MC2 on 950DT (W4A8MXFP4, W4A16 and W4A16MXFP4 are explicitly unsupported on the 950 products and not supported on A2/A3); {SUPPORTED}"
            ),
        ),
        (
            r#"{"quant_type": "W4A16"}"#,
            format!(
                "deployment: EPLB does not support quant_type W4A16 without fused MC2 on any hardware (W4A8MXFP4, W4A16 and W4A16MXFP4 are explicitly unsupported on the 950 products and not supported on A2/A3); {SUPPORTED}"
            ),
        ),
        (
            r#"{"hardware": "A3", "quant_type": "W4A8"}"#,
            format!(
                "deployment: EPLB does not support quant_type W4A8 without fused MC2 on A3 (W4A8 needs fused MC2: set fused_mc2 to true); {SUPPORTED}"
            ),
        ),
        (
            r#"{"hardware": "950PR", "quant_type": "W4A8", "fused_mc2": true}"#,
            format!(
                "deployment: EPLB does not support quant_type W4A8 with fused MC2 on 950PR (W4A8 with fused MC2 is supported on A2/A3 only); {SUPPORTED}"
            ),
        ),
        (
            r#"{"hardware": "950DT", "quant_type": "W8A8"}"#,
            format!(
                "deployment: EPLB does not support quant_type W8A8 without fused MC2 on 950DT (supported on A2/A3 only); {SUPPORTED}"
            ),
        ),
        (
            r#"{"hardware": "950PR", "quant_type": "W8A8-Dynamic"}"#,
            format!(
                "deployment: EPLB does not support quant_type W8A8-Dynamic without fused MC2 on 950PR (supported on A2/A3 only); {SUPPORTED}"
            ),
        ),
        (
            r#"{"hardware": "A2", "quant_type": "MXFP4"}"#,
            format!(
                "deployment: EPLB does not support quant_type MXFP4 without fused MC2 on A2 (supported on the 950 products only); {SUPPORTED}"
            ),
        ),
        (
            r#"{"hardware": "A3", "quant_type": "MXFP8"}"#,
            format!(
                "deployment: EPLB does not support quant_type MXFP8 without fused MC2 on A3 (supported on the 950 products only); {SUPPORTED}"
            ),
        ),
    ];
    for (dep, want) in cases {
        assert_eq!(
            parse(DYNAMIC, dep).unwrap_err(),
            vec![want.clone()],
            "{dep}"
        );
    }
    // The supported rows pass, with no warning.
    for dep in [
        r#"{"hardware": "A2", "quant_type": "W8A8"}"#,
        r#"{"hardware": "A3", "quant_type": "W8A8-Dynamic", "fused_mc2": true}"#,
        r#"{"hardware": "A3", "quant_type": "W4A8", "fused_mc2": true}"#,
        r#"{"hardware": "950PR", "quant_type": "MXFP4"}"#,
        r#"{"hardware": "950DT", "quant_type": "MXFP8"}"#,
        r#"{"quant_type": "MXFP8"}"#,
    ] {
        let cfg = parse(DYNAMIC, dep).unwrap();
        assert!(cfg.warnings().is_empty(), "{dep}: {:?}", cfg.warnings());
    }
    // Static EPLB is EPLB too.
    let tmp = std::env::temp_dir().join(format!("eplb-dep-static-{}.json", std::process::id()));
    std::fs::write(&tmp, "{}").unwrap();
    let eplb = format!("{{\"expert_map_path\": {:?}}}", tmp.display().to_string());
    let got = parse(&eplb, r#"{"hardware": "950DT", "quant_type": "W4A16"}"#);
    std::fs::remove_file(&tmp).unwrap();
    assert_eq!(got.unwrap_err().len(), 1);
}

#[test]
fn unquantised_is_supported_with_a_warning() {
    for h in ["A2", "A3", "950PR", "950DT"] {
        let cfg = parse(
            DYNAMIC,
            &format!(r#"{{"hardware": "{h}", "quant_type": "none"}}"#),
        )
        .unwrap();
        assert_eq!(
            cfg.warnings(),
            vec![
                "deployment.quant_type = none: EPLB with unquantised (bf16/fp16) expert weights is not in vLLM-Ascend's support table; it should work but is unverified"
            ],
            "{h}"
        );
        assert_eq!(
            cfg.advice(),
            vec![Advice::Unverified {
                quant: QuantType::None
            }]
        );
    }
}

#[test]
fn eplb_off_turns_the_support_error_into_a_warning() {
    let cfg = parse("{}", r#"{"hardware": "950DT", "quant_type": "W4A16"}"#).unwrap();
    assert_eq!(cfg.mode(), Mode::Off);
    assert_eq!(
        cfg.warnings(),
        vec![format!(
            "deployment: EPLB does not support quant_type W4A16 without fused MC2 on 950DT (W4A8MXFP4, W4A16 and W4A16MXFP4 are explicitly unsupported on the 950 products and not supported on A2/A3); {SUPPORTED} (EPLB is off now; enabling it would be an error)"
        )]
    );
    // Usage advice needs the cycle: nothing while off.
    let cfg = parse(
        r#"{"algorithm_execution_interval": 5}"#,
        r#"{"role": "prefill", "input_len": 100}"#,
    )
    .unwrap();
    assert!(cfg.warnings().is_empty(), "{:?}", cfg.warnings());
}

#[test]
fn every_usage_warning_with_its_number() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            r#"{"dynamic_eplb": true, "algorithm_execution_interval": 30}"#,
            "{}",
            &[
                "eplb_config.algorithm_execution_interval = 30 is below 50: balancing may start during warm-up",
            ],
        ),
        (
            DYNAMIC,
            r#"{"role": "prefill", "input_len": 512}"#,
            &[
                "deployment: prefill node with input_len = 512 (shorter than 1024 tokens): EPLB is not recommended, the balancing gain may not cover its runtime cost",
            ],
        ),
        (
            DYNAMIC,
            r#"{"hardware": "A3", "role": "decode", "experts_per_die": 8}"#,
            &[
                "deployment: decode node with experts_per_die = 8 (at most 8; 16 on 950DT): EPLB is not recommended, its gain and its cost are comparable here; benchmark first",
            ],
        ),
        (
            DYNAMIC,
            r#"{"hardware": "950DT", "quant_type": "MXFP8", "role": "decode", "experts_per_die": 16}"#,
            &[
                "deployment: decode node with experts_per_die = 16 (at most 16 on 950DT): EPLB is not recommended, its gain and its cost are comparable here; benchmark first",
            ],
        ),
        (
            DYNAMIC,
            r#"{"role": "decode", "tokens_per_die": 127}"#,
            &[
                "deployment: decode node with tokens_per_die = 127 (below 128): EPLB is not recommended, the balancing gain may not cover its runtime cost",
            ],
        ),
        (
            DYNAMIC,
            r#"{"input_len": 2048}"#,
            &[
                "deployment: input_len = 2048 (above 1024 tokens): start with eplb_config.eplb_heat_collection_stage = \"prefill\" (configured: \"all\"); empirical advice, benchmark",
            ],
        ),
        (
            r#"{"dynamic_eplb": true, "eplb_heat_collection_stage": "prefill"}"#,
            r#"{"input_len": 512, "concurrency": 2048}"#,
            &[
                "deployment: input_len = 512 (at most 1024 tokens) with concurrency = 2048 (above 1024): start with eplb_config.eplb_heat_collection_stage = \"decode\" or \"all\" (configured: \"prefill\"); empirical advice, benchmark",
            ],
        ),
        // Several at once, in a stable order; record mode runs the cycle too.
        (
            r#"{"expert_map_record_path": "rec/map.json", "algorithm_execution_interval": 5,
                "eplb_heat_collection_stage": "decode"}"#,
            r#"{"role": "prefill", "input_len": 100, "concurrency": 4096}"#,
            &[
                "eplb_config.algorithm_execution_interval = 5 is below 50: balancing may start during warm-up",
                "deployment: prefill node with input_len = 100 (shorter than 1024 tokens): EPLB is not recommended, the balancing gain may not cover its runtime cost",
            ],
        ),
    ];
    let dir = std::env::temp_dir().join(format!("eplb-dep-warn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cwd_free = |s: &str| s.replace("rec/", &format!("{}/", dir.display()));
    for (eplb, dep, want) in cases {
        let cfg = parse(&cwd_free(eplb), dep).unwrap();
        assert_eq!(cfg.warnings(), *want, "{eplb} {dep}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn thresholds_are_exact() {
    let warn = |dep: &str| parse(DYNAMIC, dep).unwrap().advice();
    // Prefill: below 1024 warns, 1024 does not.
    assert_eq!(
        warn(r#"{"role": "prefill", "input_len": 1023}"#),
        vec![Advice::ShortPrefillInputs { input_len: 1023 }]
    );
    assert!(warn(r#"{"role": "prefill", "input_len": 1024}"#).is_empty());
    // Only prefill nodes get the prefill warning, only decode nodes the decode ones.
    assert!(
        warn(r#"{"role": "decode", "input_len": 100}"#).is_empty(),
        "decode node with short inputs"
    );
    assert!(warn(r#"{"role": "colocated", "experts_per_die": 2, "tokens_per_die": 1}"#).is_empty());
    // Decode: at most 8 experts per die (16 on 950DT), fewer than 128 tokens.
    for (h, limit) in [("A2", 8), ("A3", 8), ("950PR", 8), ("950DT", 16)] {
        let at = warn(&format!(
            r#"{{"hardware": "{h}", "role": "decode", "experts_per_die": {limit}}}"#
        ));
        assert_eq!(
            at,
            vec![Advice::FewExpertsPerDie {
                experts_per_die: limit,
                limit,
                hardware: Some(hw(h))
            }],
            "{h}"
        );
        let above = warn(&format!(
            r#"{{"hardware": "{h}", "role": "decode", "experts_per_die": {}}}"#,
            limit + 1
        ));
        assert!(above.is_empty(), "{h}");
    }
    assert!(warn(r#"{"role": "decode", "tokens_per_die": 128}"#).is_empty());
    // A: 49 warns, 50 does not.
    assert_eq!(
        parse(
            r#"{"dynamic_eplb": true, "algorithm_execution_interval": 49}"#,
            "{}"
        )
        .unwrap()
        .advice(),
        vec![Advice::ShortAlgoInterval { algo_interval: 49 }]
    );
    assert!(
        parse(
            r#"{"dynamic_eplb": true, "algorithm_execution_interval": 50}"#,
            "{}"
        )
        .unwrap()
        .advice()
        .is_empty()
    );
    // Heat stage: no advice when the configured stage follows it, or at the boundaries.
    let stage = |s: &str, dep: &str| {
        parse(
            &format!(r#"{{"dynamic_eplb": true, "eplb_heat_collection_stage": "{s}"}}"#),
            dep,
        )
        .unwrap()
        .advice()
    };
    assert!(stage("prefill", r#"{"input_len": 4096}"#).is_empty());
    assert_eq!(
        stage("decode", r#"{"input_len": 1025}"#),
        vec![Advice::HeatStage {
            input_len: 1025,
            concurrency: None,
            configured: HeatStage::Decode,
            suggested: "\"prefill\""
        }]
    );
    assert!(stage("all", r#"{"input_len": 1024}"#).is_empty());
    assert!(stage("prefill", r#"{"input_len": 1024, "concurrency": 1024}"#).is_empty());
    assert!(stage("decode", r#"{"input_len": 1024, "concurrency": 4096}"#).is_empty());
    assert!(stage("all", r#"{"input_len": 512, "concurrency": 4096}"#).is_empty());
    assert_eq!(
        stage("prefill", r#"{"input_len": 1024, "concurrency": 1025}"#).len(),
        1
    );
}

#[test]
fn overrides_win_before_the_support_check() {
    let text = r#"{"eplb_config": {"dynamic_eplb": true},
                   "deployment": {"hardware": "A3", "quant_type": "W4A8", "role": "decode"}}"#;
    let value: serde_json::Value = serde_json::from_str(text).unwrap();
    // From the file alone: W4A8 without fused MC2 is an error.
    let errs = EplbConfig::from_value(&value, &GUARD).unwrap_err();
    assert!(matches!(
        errs.problems(),
        [ConfigError::Deployment(DeploymentError::Unsupported { .. })]
    ));
    // The flag turns fused MC2 on.
    let flags = Deployment {
        fused_mc2: Some(true),
        experts_per_die: Some(4),
        ..Deployment::default()
    };
    let cfg = EplbConfig::from_value_with_deployment(&value, &GUARD, None, &flags).unwrap();
    let d = cfg.deployment_facts().unwrap();
    assert_eq!(d.quant_type, Some(QuantType::W4A8));
    assert_eq!(d.fused_mc2, Some(true));
    assert_eq!(d.experts_per_die, Some(4));
    assert_eq!(d.role, Some(Role::Decode));
    assert_eq!(cfg.advice().len(), 1);
    // Flags alone make a deployment for the inner form too.
    let inner: serde_json::Value = serde_json::from_str(r#"{"dynamic_eplb": true}"#).unwrap();
    let flags = Deployment {
        hardware: Some(Hardware::Ascend950Dt),
        quant_type: Some(QuantType::W4A16),
        ..Deployment::default()
    };
    let errs = EplbConfig::from_value_with_deployment(&inner, &GUARD, None, &flags).unwrap_err();
    assert_eq!(errs.len(), 1);
    assert!(errs.messages()[0].contains("W4A16"));
    assert!(errs.messages()[0].contains("950DT"));
}

/// Captures `log::warn!` lines.
struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            self.0.lock().unwrap().push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

static LOG: Capture = Capture(Mutex::new(Vec::new()));

#[test]
fn warnings_are_logged_when_a_config_is_accepted() {
    log::set_logger(&LOG).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let cfg = parse(
        DYNAMIC,
        r#"{"hardware": "A3", "role": "decode", "experts_per_die": 8}"#,
    )
    .unwrap();
    let want = format!("eplb: {}", cfg.warnings()[0]);
    let got = LOG.0.lock().unwrap().clone();
    assert!(got.contains(&want), "{got:?}");
}
