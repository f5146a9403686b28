//! The `eplb_config` reader on arbitrary bytes, with and without the env guards: never panics,
//! and an accepted config's summary and warnings render.
#![no_main]

use std::collections::BTreeMap;

use eplb_runtime::config::EplbConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let none: BTreeMap<String, String> = BTreeMap::new();
    let mut guard = BTreeMap::new();
    guard.insert("DYNAMIC_EPLB".to_owned(), "1".to_owned());
    guard.insert("EXPERT_MAP_RECORD".to_owned(), "true".to_owned());
    for env in [&none, &guard] {
        match EplbConfig::from_json_str(text, env) {
            Ok(cfg) => {
                let _ = cfg.summary();
                for w in cfg.warnings() {
                    let _ = w.to_string();
                }
                let _ = cfg.mode();
            }
            Err(errors) => {
                assert!(!errors.messages().is_empty());
            }
        }
    }
});
