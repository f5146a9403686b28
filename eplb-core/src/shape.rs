//! The dimensions of one EP deployment, validated once.

use crate::Error;

/// Layers `L`, logical experts `N`, ranks `R`, slots per rank `S`, ranks per node and expert groups.
///
/// A `Shape` that exists is valid: every dimension is at least 1, `R * S >= N`, `S <= N` (so a
/// placement without co-located copies exists), `ranks_per_node` divides `R`, `groups <= N`, and
/// physical ids `rank * S + slot` fit the `int32` of vLLM-Ascend's `log2phy`.
/// The redundant count is derived: `X = R * S - N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    layers: u16,
    experts: u16,
    ranks: u16,
    slots_per_rank: u16,
    ranks_per_node: u16,
    groups: u16,
}

impl Shape {
    /// A shape with one node (`ranks_per_node = R`) and one expert group.
    pub fn new(layers: u16, experts: u16, ranks: u16, slots_per_rank: u16) -> Result<Self, Error> {
        Self::with_topology(layers, experts, ranks, slots_per_rank, ranks, 1)
    }

    /// A shape with an explicit node size and number of expert groups.
    pub fn with_topology(
        layers: u16,
        experts: u16,
        ranks: u16,
        slots_per_rank: u16,
        ranks_per_node: u16,
        groups: u16,
    ) -> Result<Self, Error> {
        for (what, v) in [
            ("layers", layers),
            ("experts", experts),
            ("ranks", ranks),
            ("slots per rank", slots_per_rank),
            ("ranks per node", ranks_per_node),
            ("expert groups", groups),
        ] {
            if v == 0 {
                return Err(Error::ZeroDimension { what });
            }
        }
        let slots = u32::from(ranks) * u32::from(slots_per_rank);
        if slots < u32::from(experts) {
            return Err(Error::TooFewSlots {
                ranks,
                slots_per_rank,
                experts,
            });
        }
        if slots_per_rank > experts {
            return Err(Error::TooManySlotsPerRank {
                slots_per_rank,
                experts,
            });
        }
        if slots > i32::MAX as u32 {
            return Err(Error::PhysicalIdsOverflow {
                ranks,
                slots_per_rank,
            });
        }
        if !ranks.is_multiple_of(ranks_per_node) {
            return Err(Error::RanksPerNode {
                ranks_per_node,
                ranks,
            });
        }
        if groups > experts {
            return Err(Error::Groups { groups, experts });
        }
        Ok(Self {
            layers,
            experts,
            ranks,
            slots_per_rank,
            ranks_per_node,
            groups,
        })
    }

    /// A shape from the redundant count `X` instead of the slots per rank: `S = (N + X) / R`,
    /// which must divide.
    pub fn from_redundant(
        layers: u16,
        experts: u16,
        ranks: u16,
        redundant: u32,
    ) -> Result<Self, Error> {
        if ranks == 0 {
            return Err(Error::ZeroDimension { what: "ranks" });
        }
        let total = u32::from(experts)
            .checked_add(redundant)
            .ok_or(Error::Overflow {
                what: "experts + redundant",
            })?;
        if !total.is_multiple_of(u32::from(ranks)) {
            return Err(Error::RedundancyNotDivisible {
                experts,
                redundant,
                ranks,
            });
        }
        let s = total / u32::from(ranks);
        let s = u16::try_from(s).map_err(|_| Error::Overflow {
            what: "slots per rank",
        })?;
        Self::new(layers, experts, ranks, s)
    }

    /// The same shape with another node size and group count.
    pub fn topology(self, ranks_per_node: u16, groups: u16) -> Result<Self, Error> {
        Self::with_topology(
            self.layers,
            self.experts,
            self.ranks,
            self.slots_per_rank,
            ranks_per_node,
            groups,
        )
    }

    /// The same shape with another number of layers.
    pub fn with_layers(self, layers: u16) -> Result<Self, Error> {
        Self::with_topology(
            layers,
            self.experts,
            self.ranks,
            self.slots_per_rank,
            self.ranks_per_node,
            self.groups,
        )
    }

    /// MoE layers `L`.
    pub const fn layers(&self) -> usize {
        self.layers as usize
    }
    /// Logical (routed) experts per layer `N`.
    pub const fn experts(&self) -> usize {
        self.experts as usize
    }
    /// EP ranks `R`.
    pub const fn ranks(&self) -> usize {
        self.ranks as usize
    }
    /// Physical slots per rank `S`.
    pub const fn slots_per_rank(&self) -> usize {
        self.slots_per_rank as usize
    }
    /// Ranks per node.
    pub const fn ranks_per_node(&self) -> usize {
        self.ranks_per_node as usize
    }
    /// Nodes, `R / ranks_per_node`.
    pub const fn nodes(&self) -> usize {
        (self.ranks / self.ranks_per_node) as usize
    }
    /// Expert groups of the model (DeepSeek's `num_groups`).
    pub const fn groups(&self) -> usize {
        self.groups as usize
    }
    /// Physical slots per layer, `R * S`.
    pub const fn slots_per_layer(&self) -> usize {
        self.ranks as usize * self.slots_per_rank as usize
    }
    /// Redundant experts `X = R * S - N`.
    pub const fn redundant(&self) -> usize {
        self.slots_per_layer() - self.experts as usize
    }
    /// Length of a whole placement, `L * R * S`.
    pub const fn placement_len(&self) -> usize {
        self.layers as usize * self.slots_per_layer()
    }
    /// Length of per-layer logical loads for all layers, `L * N`.
    pub const fn loads_len(&self) -> usize {
        self.layers as usize * self.experts as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    #[test]
    fn valid_shapes() {
        let s = Shape::with_topology(58, 256, 32, 9, 8, 8).unwrap();
        assert_eq!(s.redundant(), 32);
        assert_eq!(s.nodes(), 4);
        assert_eq!(s.slots_per_layer(), 288);
        assert_eq!(s.placement_len(), 58 * 288);
        let s = Shape::from_redundant(26, 64, 8, 8).unwrap();
        assert_eq!(s.slots_per_rank(), 9);
    }

    #[test]
    fn a_redundant_count_near_u32_max_is_an_error_not_an_overflow() {
        assert_eq!(
            Shape::from_redundant(1, 8, 4, u32::MAX),
            Err(Error::Overflow {
                what: "experts + redundant"
            })
        );
    }

    #[test]
    fn invalid_shapes_name_the_value() {
        assert_eq!(
            Shape::new(0, 8, 2, 5),
            Err(Error::ZeroDimension { what: "layers" })
        );
        assert_eq!(
            Shape::new(1, 8, 2, 3),
            Err(Error::TooFewSlots {
                ranks: 2,
                slots_per_rank: 3,
                experts: 8
            })
        );
        assert_eq!(
            Shape::new(1, 4, 2, 5),
            Err(Error::TooManySlotsPerRank {
                slots_per_rank: 5,
                experts: 4
            })
        );
        assert_eq!(
            Shape::with_topology(1, 8, 6, 2, 4, 1),
            Err(Error::RanksPerNode {
                ranks_per_node: 4,
                ranks: 6
            })
        );
        assert_eq!(
            Shape::with_topology(1, 8, 4, 2, 4, 9),
            Err(Error::Groups {
                groups: 9,
                experts: 8
            })
        );
        assert!(Shape::new(1, 65535, 65535, 65535).is_err());
        let e = Shape::from_redundant(1, 8, 3, 2).unwrap_err();
        assert_eq!(
            format!("{e}"),
            "8 experts + 2 redundant is not a multiple of 3 ranks; nearest valid redundant counts: 1 or 4"
        );
        let e = Shape::new(1, 8, 2, 3).unwrap_err();
        assert_eq!(
            format!("{e}"),
            "2 ranks x 3 slots = 6 slots cannot hold 8 experts"
        );
    }
}
