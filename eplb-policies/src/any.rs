//! Every policy behind one value, without allocation: what the runtime's planner and the AICPU
//! entry point hold.

use eplb_core::Shape;

use crate::deepseek::DeepSeek;
use crate::default::DefaultEplb;
use crate::fixed::Static;
use crate::flashlb::FlashLb;
use crate::incremental::Incremental;
use crate::random::Random;
use crate::swift::SwiftBalance;
use crate::{Error, Input, ParamError, Policy, PolicyKind};

/// One of the policies, chosen by [`PolicyKind`].
#[derive(Debug, Clone)]
pub enum AnyPolicy {
    /// Type 0.
    Random(Random),
    /// Type 1.
    Default(DefaultEplb),
    /// Type 2.
    Swift(SwiftBalance),
    /// Type 3.
    FlashLb(FlashLb),
    /// Type 4.
    Incremental(Incremental),
    /// DeepSeek's EPLB.
    DeepSeek(DeepSeek),
    /// Never rebalances (the tools' baseline).
    Static(Static),
}

impl AnyPolicy {
    /// The policy of `kind` with its default parameters.
    pub fn new(kind: PolicyKind) -> Self {
        match kind {
            PolicyKind::Random => AnyPolicy::Random(Random::new()),
            PolicyKind::Default => AnyPolicy::Default(DefaultEplb::new()),
            PolicyKind::Swift => AnyPolicy::Swift(SwiftBalance::new()),
            PolicyKind::FlashLb => AnyPolicy::FlashLb(FlashLb::new()),
            PolicyKind::Incremental => AnyPolicy::Incremental(Incremental::new()),
            PolicyKind::DeepSeek => AnyPolicy::DeepSeek(DeepSeek::new()),
            PolicyKind::Static => AnyPolicy::Static(Static::new()),
        }
    }

    /// Sets the policy's parameter `key` to `value` ([`PolicyKind::params`] lists them): an
    /// unknown key, or a value out of its range, is an error that names it.
    pub fn set_param<'k>(&mut self, key: &'k str, value: f64) -> Result<(), ParamError<'k>> {
        match self {
            AnyPolicy::Random(p) => p.set(key, value),
            AnyPolicy::Incremental(p) => p.params_mut().set(key, value),
            other => Err(ParamError::Unknown {
                policy: other.kind(),
                key,
            }),
        }
    }

    fn inner(&self) -> &dyn Policy {
        match self {
            AnyPolicy::Random(p) => p,
            AnyPolicy::Default(p) => p,
            AnyPolicy::Swift(p) => p,
            AnyPolicy::FlashLb(p) => p,
            AnyPolicy::Incremental(p) => p,
            AnyPolicy::DeepSeek(p) => p,
            AnyPolicy::Static(p) => p,
        }
    }

    fn inner_mut(&mut self) -> &mut dyn Policy {
        match self {
            AnyPolicy::Random(p) => p,
            AnyPolicy::Default(p) => p,
            AnyPolicy::Swift(p) => p,
            AnyPolicy::FlashLb(p) => p,
            AnyPolicy::Incremental(p) => p,
            AnyPolicy::DeepSeek(p) => p,
            AnyPolicy::Static(p) => p,
        }
    }
}

impl Policy for AnyPolicy {
    fn kind(&self) -> PolicyKind {
        self.inner().kind()
    }
    fn scratch_len(&self, shape: &Shape) -> usize {
        self.inner().scratch_len(shape)
    }
    fn state_len(&self, shape: &Shape) -> usize {
        self.inner().state_len(shape)
    }
    fn colocates(&self) -> bool {
        self.inner().colocates()
    }
    fn check_shape(&self, shape: &Shape) -> Result<(), Error> {
        self.inner().check_shape(shape)
    }
    fn place(
        &mut self,
        input: &Input<'_>,
        scratch: &mut [u64],
        state: &mut [u64],
        out: &mut [u16],
    ) -> Result<(), Error> {
        self.inner_mut().place(input, scratch, state, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_builds_its_policy() {
        for kind in PolicyKind::ALL.into_iter().chain([PolicyKind::Static]) {
            assert_eq!(AnyPolicy::new(kind).kind(), kind);
        }
        assert!(AnyPolicy::new(PolicyKind::DeepSeek).colocates());
        assert!(!AnyPolicy::new(PolicyKind::Incremental).colocates());
    }
}
