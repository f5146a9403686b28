//! `static`: the policy that never rebalances. The new placement is the current one.
//!
//! It is the baseline every other policy is measured against (`eplb simulate --policy
//! static`, the first run of `eplb report`, the "no EPLB" side of `eplb advise`), and what a
//! rank serves when EPLB is off. It takes no parameters, keeps no state and needs no scratch.

use eplb_core::Shape;

use crate::{Error, Input, Policy, PolicyKind, check_out_len};

/// Never rebalances: every layer keeps its placement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Static;

impl Static {
    /// The policy.
    pub const fn new() -> Self {
        Static
    }
}

impl Policy for Static {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Static
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
        check_out_len(input.shape(), out)?;
        out.copy_from_slice(input.current().as_slice());
        Ok(())
    }
}
