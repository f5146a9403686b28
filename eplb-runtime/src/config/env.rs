//! The environment the env guard reads, passed in rather than read globally.

use core::hash::BuildHasher;
use std::collections::{BTreeMap, HashMap};

/// The variable that enables dynamic EPLB: `true` or `1`, any case.
pub const DYNAMIC_EPLB: &str = "DYNAMIC_EPLB";
/// The variable that enables dynamic EPLB for recording: exactly `true`.
pub const EXPERT_MAP_RECORD: &str = "EXPERT_MAP_RECORD";

/// A source of environment variables.
///
/// The config never reads the process environment by itself: the caller passes [`ProcessEnv`]
/// in production and a map or a slice of pairs in tests.
pub trait Env {
    /// The value of `key`, or `None` when it is unset.
    fn var(&self, key: &str) -> Option<String>;
}

/// The environment of this process (`std::env::var_os`; a value that is not UTF-8 is converted
/// lossily).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var_os(key).map(|v| v.to_string_lossy().into_owned())
    }
}

impl Env for BTreeMap<String, String> {
    fn var(&self, key: &str) -> Option<String> {
        self.get(key).cloned()
    }
}

impl<S: BuildHasher> Env for HashMap<String, String, S> {
    fn var(&self, key: &str) -> Option<String> {
        self.get(key).cloned()
    }
}

/// A list of `(name, value)` pairs; the first pair with the name wins.
impl Env for [(&str, &str)] {
    fn var(&self, key: &str) -> Option<String> {
        self.iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| (*v).to_owned())
    }
}

/// A fixed list of `(name, value)` pairs; the first pair with the name wins.
impl<const N: usize> Env for [(&str, &str); N] {
    fn var(&self, key: &str) -> Option<String> {
        self.as_slice().var(key)
    }
}

impl<E: Env + ?Sized> Env for &E {
    fn var(&self, key: &str) -> Option<String> {
        (**self).var(key)
    }
}

/// Whether the environment allows dynamic (and record) EPLB, as vLLM-Ascend decides it:
/// `DYNAMIC_EPLB` lower-cased is `true` or `1`, or `EXPERT_MAP_RECORD` is exactly `true`.
pub fn env_guard_holds(env: &dyn Env) -> bool {
    let dynamic = env
        .var(DYNAMIC_EPLB)
        .is_some_and(|v| matches!(v.to_lowercase().as_str(), "true" | "1"));
    dynamic || env.var(EXPERT_MAP_RECORD).is_some_and(|v| v == "true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_values() {
        for (pairs, holds) in [
            (&[][..], false),
            (&[(DYNAMIC_EPLB, "true")][..], true),
            (&[(DYNAMIC_EPLB, "TRUE")][..], true),
            (&[(DYNAMIC_EPLB, "True")][..], true),
            (&[(DYNAMIC_EPLB, "1")][..], true),
            (&[(DYNAMIC_EPLB, "yes")][..], false),
            (&[(DYNAMIC_EPLB, "0")][..], false),
            (&[(DYNAMIC_EPLB, " true")][..], false),
            (&[(EXPERT_MAP_RECORD, "true")][..], true),
            (&[(EXPERT_MAP_RECORD, "TRUE")][..], false),
            (&[(EXPERT_MAP_RECORD, "1")][..], false),
            (
                &[(DYNAMIC_EPLB, "false"), (EXPERT_MAP_RECORD, "true")][..],
                true,
            ),
        ] {
            assert_eq!(env_guard_holds(&pairs), holds, "{pairs:?}");
        }
    }

    #[test]
    fn maps_are_envs() {
        let mut m = BTreeMap::new();
        m.insert(DYNAMIC_EPLB.to_owned(), "1".to_owned());
        assert!(env_guard_holds(&m));
        let h: HashMap<String, String> = m.into_iter().collect();
        assert!(env_guard_holds(&h));
        assert!(!env_guard_holds(&[("OTHER", "true")]));
    }
}
