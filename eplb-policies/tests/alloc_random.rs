//! `Random::place` inside `rebalance` allocates nothing (one policy per test crate: the
//! counting allocator is process-wide).

mod common;

use eplb_policies::random::Random;

#[test]
fn rebalance_does_not_allocate() {
    common::assert_rebalance_allocation_free(Random::new, 0, true);
}
