//! The heat-collection stage filter and the per-iteration classifier.

use core::fmt;
use core::str::FromStr;

/// Which iterations feed the heat (`eplb_heat_collection_stage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum HeatStage {
    /// Every iteration.
    #[default]
    All,
    /// Iterations classified as prefill.
    Prefill,
    /// Iterations classified as decode.
    Decode,
}

/// What one forward iteration was, by its padded token count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IterationStage {
    /// More padded tokens than `max_num_seqs * (1 + speculative_tokens)`.
    Prefill,
    /// At most that many.
    Decode,
}

impl HeatStage {
    /// All stages, in the order of their names in the config.
    pub const ALL: [HeatStage; 3] = [HeatStage::All, HeatStage::Prefill, HeatStage::Decode];

    /// Whether an iteration of this kind feeds the heat.
    pub fn matches(self, it: IterationStage) -> bool {
        match self {
            HeatStage::All => true,
            HeatStage::Prefill => it == IterationStage::Prefill,
            HeatStage::Decode => it == IterationStage::Decode,
        }
    }

    /// The config name: `all`, `prefill` or `decode`.
    pub fn name(self) -> &'static str {
        match self {
            HeatStage::All => "all",
            HeatStage::Prefill => "prefill",
            HeatStage::Decode => "decode",
        }
    }
}

impl fmt::Display for HeatStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown stage name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownStage;

impl fmt::Display for UnknownStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("heat collection stage must be one of \"all\", \"prefill\", \"decode\"")
    }
}

impl core::error::Error for UnknownStage {}

impl FromStr for HeatStage {
    type Err = UnknownStage;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HeatStage::ALL
            .into_iter()
            .find(|st| st.name() == s)
            .ok_or(UnknownStage)
    }
}

/// Classifies iterations: prefill iff padded tokens `> max_num_seqs * (1 + speculative_tokens)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageClassifier {
    threshold: u64,
}

impl StageClassifier {
    /// The classifier of vLLM-Ascend's model runner.
    pub fn new(max_num_seqs: u32, speculative_tokens: u32) -> Self {
        Self {
            threshold: u64::from(max_num_seqs) * (1 + u64::from(speculative_tokens)),
        }
    }

    /// The padded-token threshold.
    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// What an iteration with `padded_tokens` was.
    pub fn classify(&self, padded_tokens: u64) -> IterationStage {
        if padded_tokens > self.threshold {
            IterationStage::Prefill
        } else {
            IterationStage::Decode
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_and_filter() {
        let c = StageClassifier::new(16, 1);
        assert_eq!(c.threshold(), 32);
        assert_eq!(c.classify(32), IterationStage::Decode);
        assert_eq!(c.classify(33), IterationStage::Prefill);
        assert!(HeatStage::All.matches(IterationStage::Decode));
        assert!(HeatStage::Prefill.matches(IterationStage::Prefill));
        assert!(!HeatStage::Prefill.matches(IterationStage::Decode));
        assert!(HeatStage::Decode.matches(IterationStage::Decode));
        assert!(!HeatStage::Decode.matches(IterationStage::Prefill));
        for st in HeatStage::ALL {
            assert_eq!(st.name().parse::<HeatStage>(), Ok(st));
        }
        assert_eq!("Prefill".parse::<HeatStage>(), Err(UnknownStage));
    }
}
