//! The simulator under a hostile policy: failed plans are counted, kept out of the placements
//! and reported in the JSON.

mod common;

use eplb_core::Shape;
use eplb_policies::{Error, Input, Policy, PolicyKind};
use eplb_sim::SimPolicy;
use eplb_sim::simulate::simulate_with;

/// The default policy, failing on the calls whose number `fails` says.
struct Flaky {
    inner: eplb_policies::AnyPolicy,
    calls: u32,
    fails: fn(u32) -> bool,
}

impl Policy for Flaky {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Default
    }
    fn scratch_len(&self, shape: &Shape) -> usize {
        self.inner.scratch_len(shape)
    }
    fn place(
        &mut self,
        input: &Input<'_>,
        scratch: &mut [u64],
        state: &mut [u64],
        out: &mut [u16],
    ) -> Result<(), Error> {
        self.calls += 1;
        if (self.fails)(self.calls) {
            return Err(Error::NoPlacement {
                layer: 0,
                why: "injected failure",
            });
        }
        self.inner.place(input, scratch, state, out)
    }
}

#[test]
fn simulate_counts_the_plans_that_failed() {
    let trace = common::trace("data/traces/mixtral8x7b_gsm8k_decode.json");
    let mut cfg = common::anchor_cfg(4, 4, SimPolicy::Policy(PolicyKind::Default));
    cfg.heat_interval = 2;
    let odd: fn(u32) -> bool = |c| c % 2 == 0;
    let all: fn(u32) -> bool = |_| true;
    for (fails, every) in [(odd, false), (all, true)] {
        let flaky = Flaky {
            inner: eplb_policies::AnyPolicy::new(PolicyKind::Default),
            calls: 0,
            fails,
        };
        let r = simulate_with(&trace, &cfg, Box::new(flaky), &mut |_, _| {}).unwrap();
        assert!(r.plans >= 2, "{}", r.plans);
        if every {
            assert_eq!(r.plan_failures, r.plans);
            assert_eq!(r.changes, 0);
        } else {
            assert_eq!(r.plan_failures, r.plans / 2);
        }
        let why = r.first_plan_failure.clone().unwrap();
        assert!(why.contains("injected failure"), "{why}");
        let v = eplb_sim::json::sim_json(&r, "default", cfg.routing);
        assert_eq!(v["plan_failures"], r.plan_failures);
    }
}
