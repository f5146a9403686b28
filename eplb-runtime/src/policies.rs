//! Policy construction for the runtime, and the `static` pseudo-policy of the simulator.

use eplb_core::Shape;
use eplb_policies::{Error, Input, Policy, PolicyKind};

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
