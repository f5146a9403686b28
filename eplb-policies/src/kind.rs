//! Selecting a policy by number or name.

use core::fmt;
use core::str::FromStr;

use crate::Error;

/// The policies, with vLLM-Ascend's `eplb_policy_type` numbers where they have one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// Type 0: seeded random swaps between ranks (tests the update path).
    Random,
    /// Type 1: vLLM-Ascend's DefaultEplb.
    Default,
    /// Type 2: vLLM-Ascend's SwiftBalance.
    Swift,
    /// Type 3: vLLM-Ascend's FlashLB.
    FlashLb,
    /// Type 4: ours, plans from the current placement and takes only the moves that pay.
    Incremental,
    /// DeepSeek's EPLB (hierarchical when groups divide into nodes, else global). No number.
    DeepSeek,
    /// Never rebalances: the baseline of the tools (`eplb simulate --policy static`). Not in
    /// [`PolicyKind::ALL`] (which lists the balancing policies) and not a name or number an
    /// `eplb_config` selects; [`PolicyKind::from_name_or_static`] parses it.
    Static,
}

impl PolicyKind {
    /// Every policy.
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Random,
        PolicyKind::Default,
        PolicyKind::Swift,
        PolicyKind::FlashLb,
        PolicyKind::Incremental,
        PolicyKind::DeepSeek,
    ];

    /// The canonical name.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Random => "random",
            PolicyKind::Default => "default",
            PolicyKind::Swift => "swift",
            PolicyKind::FlashLb => "flashlb",
            PolicyKind::Incremental => "incremental",
            PolicyKind::DeepSeek => "deepseek",
            PolicyKind::Static => "static",
        }
    }

    /// The parameters the policy takes by name ([`crate::AnyPolicy::set_param`]), in order.
    pub fn params(self) -> &'static [crate::ParamInfo] {
        match self {
            PolicyKind::Random => &crate::random::PARAMS,
            PolicyKind::Incremental => &crate::incremental::PARAMS,
            _ => &[],
        }
    }

    /// vLLM-Ascend's `eplb_policy_type`, if the policy has one.
    pub fn number(self) -> Option<u8> {
        match self {
            PolicyKind::Random => Some(0),
            PolicyKind::Default => Some(1),
            PolicyKind::Swift => Some(2),
            PolicyKind::FlashLb => Some(3),
            PolicyKind::Incremental => Some(4),
            PolicyKind::DeepSeek | PolicyKind::Static => None,
        }
    }

    /// `static`, or what [`FromStr`] accepts (a number `0..4` or a balancing policy's name).
    pub fn from_name_or_static(s: &str) -> Result<Self, Error> {
        if s == PolicyKind::Static.name() {
            Ok(PolicyKind::Static)
        } else {
            s.parse()
        }
    }

    /// The policy of an `eplb_policy_type` number.
    pub fn from_number(n: u64) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.number().is_some_and(|m| u64::from(m) == n))
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = Error;
    /// A number `0..4` or a name.
    fn from_str(s: &str) -> Result<Self, Error> {
        if let Ok(n) = s.parse::<u64>() {
            return Self::from_number(n).ok_or(Error::UnknownPolicy);
        }
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or(Error::UnknownPolicy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_names_select() {
        for k in PolicyKind::ALL {
            assert_eq!(k.name().parse::<PolicyKind>(), Ok(k));
            if let Some(n) = k.number() {
                assert_eq!(std::format!("{n}").parse::<PolicyKind>(), Ok(k));
            }
        }
        assert_eq!("5".parse::<PolicyKind>(), Err(Error::UnknownPolicy));
        assert_eq!("Swift".parse::<PolicyKind>(), Err(Error::UnknownPolicy));
        // `static` is the tools' baseline, not a policy a config selects.
        assert_eq!("static".parse::<PolicyKind>(), Err(Error::UnknownPolicy));
        assert_eq!(
            PolicyKind::from_name_or_static("static"),
            Ok(PolicyKind::Static)
        );
        assert_eq!(
            PolicyKind::from_name_or_static("3"),
            Ok(PolicyKind::FlashLb)
        );
    }
}
