//! Policy construction for the runtime, and the `static` pseudo-policy of the simulator.

use eplb_core::Shape;
use eplb_policies::{AnyPolicy, Error, Input, Policy, PolicyKind};

/// A policy that never rebalances: the new placement is the current one (the `static` baseline
/// of `eplb simulate`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Keep;

impl Policy for Keep {
    fn kind(&self) -> PolicyKind {
        // Reported as the random policy's kind only for the trait's sake; the simulator names it
        // "static".
        PolicyKind::Random
    }
    fn scratch_len(&self, _shape: &Shape) -> usize {
        0
    }
    fn place(
        &mut self,
        input: &Input<'_>,
        _scratch: &mut [u64],
        _state: &mut [u64],
        out: &mut [u16],
    ) -> Result<(), Error> {
        eplb_policies::check_out_len(input.shape(), out)?;
        out.copy_from_slice(input.current().as_slice());
        Ok(())
    }
}

/// A boxed policy of `kind`, ready for the planner thread.
pub fn policy_for(kind: PolicyKind) -> Result<Box<dyn Policy + Send>, String> {
    Ok(Box::new(eplb_policies::AnyPolicy::new(kind)))
}

/// One policy parameter by name, as `--param` and `eplb_policy_params` give it.
pub type Param = (String, f64);

/// The policy of `kind` with `params` set in order through the policy's own parser
/// ([`AnyPolicy::set_param`]): an unknown key or a value out of range is an error naming it.
pub fn policy_with(kind: PolicyKind, params: &[Param]) -> Result<AnyPolicy, String> {
    let mut p = AnyPolicy::new(kind);
    for (k, v) in params {
        p.set_param(k, *v).map_err(|e| e.to_string())?;
    }
    Ok(p)
}

/// A `--param KEY=VALUE` argument: the key and its value as a number.
pub fn parse_param(s: &str) -> Result<Param, String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("--param {s}: expected KEY=VALUE"))?;
    if k.is_empty() {
        return Err(format!("--param {s}: empty parameter name"));
    }
    let x: f64 = v
        .trim()
        .parse()
        .map_err(|_| format!("--param {s}: parameter `{k}`: `{v}` is not a number"))?;
    Ok((k.to_owned(), x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_parse_and_reach_the_policy_parser() {
        assert_eq!(
            parse_param("min_gain=0.02"),
            Ok(("min_gain".to_owned(), 0.02))
        );
        assert!(parse_param("min_gain").unwrap_err().contains("KEY=VALUE"));
        assert!(parse_param("=1").is_err());
        assert!(parse_param("z=abc").unwrap_err().contains("`z`"));
        let p = policy_with(
            PolicyKind::Incremental,
            &[
                ("min_gain".to_owned(), 0.5),
                ("max_fetches".to_owned(), 7.0),
            ],
        )
        .unwrap();
        let AnyPolicy::Incremental(inc) = p else {
            panic!("not incremental")
        };
        assert_eq!((inc.params().min_gain, inc.params().max_fetches), (0.5, 7));
        let e = policy_with(PolicyKind::Incremental, &[("max_fetches".to_owned(), -1.0)]);
        assert!(
            e.unwrap_err()
                .contains("`max_fetches` = -1 is out of range")
        );
        let e = policy_with(PolicyKind::FlashLb, &[("min_gain".to_owned(), 1.0)]);
        assert!(
            e.unwrap_err()
                .contains("unknown parameter `min_gain` for policy `flashlb`")
        );
    }
}
