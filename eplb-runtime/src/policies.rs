//! Policy construction for the runtime: a policy by kind, with its parameters.

use eplb_policies::{AnyPolicy, ParamError, Policy, PolicyKind};

/// A boxed policy of `kind`, ready for the planner thread.
pub fn policy_for(kind: PolicyKind) -> Box<dyn Policy + Send> {
    Box::new(eplb_policies::AnyPolicy::new(kind))
}

/// One policy parameter by name, as `--param` and `eplb_policy_params` give it.
pub type Param = (String, f64);

/// The policy of `kind` with `params` set in order through the policy's own parser
/// ([`AnyPolicy::set_param`]): an unknown key or a value out of range is an error naming it.
pub fn policy_with(kind: PolicyKind, params: &[Param]) -> Result<AnyPolicy, ParamError<'_>> {
    let mut p = AnyPolicy::new(kind);
    for (k, v) in params {
        p.set_param(k, *v)?;
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_reach_the_policy_parser() {
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
        let bad = [("max_fetches".to_owned(), -1.0)];
        let e = policy_with(PolicyKind::Incremental, &bad);
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("`max_fetches` = -1 is out of range")
        );
        let unknown = [("min_gain".to_owned(), 1.0)];
        let e = policy_with(PolicyKind::FlashLb, &unknown);
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("unknown parameter `min_gain` for policy `flashlb`")
        );
    }
}
