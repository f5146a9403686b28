//! Transfer planning: which rank sends which expert to which rank, for one changed layer.
//!
//! Every (rank, expert) copy that the new placement adds gets a source: first a rank that drops
//! that expert, then a holder on the destination's node, then any holder; within a tier the holder
//! with the fewest sends so far (then the lowest rank), so sends spread over holders. Messages
//! between two ranks are ordered by ascending expert id on both sides, so a receiver can match
//! them by position, as HCCL requires. A rank receives at most `S` experts per layer (it has `S`
//! receive buffers); experts it keeps but moves to another slot are copied locally at commit.

use std::fmt;

use eplb_core::Shape;

/// One expert sent from one rank to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Transfer {
    /// Sending rank.
    pub src: u16,
    /// Receiving rank.
    pub dst: u16,
    /// Logical expert.
    pub expert: u16,
}

/// A send of this rank: the expert in `slot` goes to `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendOp {
    /// Receiving rank.
    pub peer: u16,
    /// Logical expert.
    pub expert: u16,
    /// The live slot it is read from.
    pub slot: u16,
}

/// A receive of this rank: `expert` from `peer` lands in receive buffer `buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvOp {
    /// Sending rank.
    pub peer: u16,
    /// Logical expert.
    pub expert: u16,
    /// Receive buffer index (`< S`).
    pub buffer: u16,
}

/// Where a slot's new content comes from at commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotSource {
    /// The slot keeps its content.
    Unchanged,
    /// A kept expert moves from another slot of this rank.
    Local {
        /// The old slot.
        from_slot: u16,
    },
    /// The expert arrived in a receive buffer.
    Received {
        /// The receive buffer.
        buffer: u16,
    },
}

/// One rank's part of one layer's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlan {
    /// Layer.
    pub layer: usize,
    /// Sends, ordered by (peer, expert).
    pub sends: Vec<SendOp>,
    /// Receives, ordered by (peer, expert); buffer `i` for the `i`-th.
    pub recvs: Vec<RecvOp>,
    /// The rank's new row `[S]`.
    pub new_row: Vec<u16>,
    /// Per slot, where its new content comes from.
    pub install: Vec<SlotSource>,
}

impl RankPlan {
    /// Whether the rank does anything for this layer.
    pub fn is_empty(&self) -> bool {
        self.sends.is_empty()
            && self.recvs.is_empty()
            && self.install.iter().all(|s| *s == SlotSource::Unchanged)
    }
}

/// One layer's whole plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerPlan {
    /// Layer.
    pub layer: usize,
    /// Every transfer, ordered by (src, dst, expert).
    pub transfers: Vec<Transfer>,
    /// Per rank.
    pub ranks: Vec<RankPlan>,
}

/// Why a layer plan cannot be made.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    /// A row slice has the wrong length.
    Shape {
        /// What.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Given.
        got: usize,
    },
    /// The new placement needs an expert that no rank holds now.
    NoSource {
        /// Layer.
        layer: usize,
        /// Expert.
        expert: u16,
        /// Rank that needs it.
        rank: u16,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Shape {
                what,
                expected,
                got,
            } => write!(f, "{what}: expected {expected} values, got {got}"),
            PlanError::NoSource {
                layer,
                expert,
                rank,
            } => write!(
                f,
                "layer {layer}: rank {rank} needs expert {expert}, which no rank holds"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// Plans one layer: `old` and `new` are `[R][S]` rows of the same shape.
pub fn plan_layer(
    shape: &Shape,
    layer: usize,
    old: &[u16],
    new: &[u16],
) -> Result<LayerPlan, PlanError> {
    let (r, s) = (shape.ranks(), shape.slots_per_rank());
    for (what, got) in [
        ("old layer [R][S]", old.len()),
        ("new layer [R][S]", new.len()),
    ] {
        if got != r * s {
            return Err(PlanError::Shape {
                what,
                expected: r * s,
                got,
            });
        }
    }
    let rpn = shape.ranks_per_node().max(1);
    let old_rows: Vec<&[u16]> = old.chunks_exact(s).collect();
    let new_rows: Vec<&[u16]> = new.chunks_exact(s).collect();
    let mut sends_so_far = vec![0usize; r];
    let mut transfers = Vec::new();
    for (dst, (nrow, orow)) in new_rows.iter().zip(&old_rows).enumerate() {
        for (i, &e) in nrow.iter().enumerate() {
            if nrow.get(..i).is_some_and(|seen| seen.contains(&e)) || orow.contains(&e) {
                continue;
            }
            // Tier 0: drops e; tier 1: same node; tier 2: any holder.
            let src = old_rows
                .iter()
                .enumerate()
                .filter(|(_, row)| row.contains(&e))
                .map(|(h, _)| h)
                .min_by_key(|&h| {
                    let keeps = new_rows.get(h).is_some_and(|row| row.contains(&e));
                    let tier = if !keeps {
                        0
                    } else if h / rpn == dst / rpn {
                        1
                    } else {
                        2
                    };
                    (tier, sends_so_far.get(h).copied().unwrap_or(0), h)
                })
                .ok_or(PlanError::NoSource {
                    layer,
                    expert: e,
                    rank: dst as u16,
                })?;
            if let Some(n) = sends_so_far.get_mut(src) {
                *n += 1;
            }
            transfers.push(Transfer {
                src: src as u16,
                dst: dst as u16,
                expert: e,
            });
        }
    }
    transfers.sort_unstable();
    let mut ranks = Vec::with_capacity(r);
    for (rank, (orow, nrow)) in old_rows.iter().zip(&new_rows).enumerate() {
        let sends = transfers
            .iter()
            .filter(|t| usize::from(t.src) == rank)
            .map(|t| SendOp {
                peer: t.dst,
                expert: t.expert,
                slot: orow.iter().rposition(|&x| x == t.expert).unwrap_or(0) as u16,
            })
            .collect::<Vec<_>>();
        let mut recv_list: Vec<&Transfer> = transfers
            .iter()
            .filter(|t| usize::from(t.dst) == rank)
            .collect();
        recv_list.sort_unstable_by_key(|t| (t.src, t.expert));
        let recvs: Vec<RecvOp> = recv_list
            .iter()
            .enumerate()
            .map(|(i, t)| RecvOp {
                peer: t.src,
                expert: t.expert,
                buffer: i as u16,
            })
            .collect();
        let install = nrow
            .iter()
            .enumerate()
            .map(|(slot, &e)| {
                if orow.get(slot) == Some(&e) {
                    SlotSource::Unchanged
                } else if let Some(from) = orow.iter().rposition(|&x| x == e) {
                    SlotSource::Local {
                        from_slot: from as u16,
                    }
                } else {
                    let buffer = recvs
                        .iter()
                        .find(|rv| rv.expert == e)
                        .map_or(0, |rv| rv.buffer);
                    SlotSource::Received { buffer }
                }
            })
            .collect();
        ranks.push(RankPlan {
            layer,
            sends,
            recvs,
            new_row: nrow.to_vec(),
            install,
        });
    }
    Ok(LayerPlan {
        layer,
        transfers,
        ranks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vLLM-Ascend reference vector (§3.6): the Swift plan of `asc_spec_3_6` versus the old
    /// maps. Our sources are the same here (dropping ranks first, then the lowest holder).
    #[test]
    fn asc_spec_3_6_swift_plan() {
        let shape = Shape::new(1, 10, 4, 3).unwrap();
        let old = [0, 1, 2, 3, 4, 5, 6, 7, 0, 8, 9, 1];
        let new = [0, 1, 8, 6, 4, 5, 3, 7, 0, 2, 9, 6];
        let plan = plan_layer(&shape, 0, &old, &new).unwrap();
        let t = |src, dst, expert| Transfer { src, dst, expert };
        assert_eq!(
            plan.transfers,
            vec![t(0, 3, 2), t(1, 2, 3), t(2, 1, 6), t(2, 3, 6), t(3, 0, 8)]
        );
        let r3 = &plan.ranks[3];
        assert_eq!(
            r3.recvs,
            vec![
                RecvOp {
                    peer: 0,
                    expert: 2,
                    buffer: 0
                },
                RecvOp {
                    peer: 2,
                    expert: 6,
                    buffer: 1
                }
            ]
        );
        assert_eq!(
            r3.sends,
            vec![SendOp {
                peer: 0,
                expert: 8,
                slot: 0
            }]
        );
        assert_eq!(
            r3.install,
            vec![
                SlotSource::Received { buffer: 0 },
                SlotSource::Unchanged,
                SlotSource::Received { buffer: 1 }
            ]
        );
    }

    #[test]
    fn local_moves_and_missing_sources() {
        let shape = Shape::new(1, 4, 2, 2).unwrap();
        let plan = plan_layer(&shape, 0, &[0, 1, 2, 3], &[1, 0, 2, 3]).unwrap();
        assert!(plan.transfers.is_empty());
        assert_eq!(
            plan.ranks[0].install,
            vec![
                SlotSource::Local { from_slot: 1 },
                SlotSource::Local { from_slot: 0 }
            ]
        );
        assert!(plan.ranks[1].is_empty());
        // An old layer that lacks expert 4 (not a valid placement) has no source for it.
        let shape = Shape::new(1, 5, 2, 3).unwrap();
        assert_eq!(
            plan_layer(&shape, 3, &[0, 1, 2, 3, 0, 1], &[4, 1, 2, 3, 0, 1]),
            Err(PlanError::NoSource {
                layer: 3,
                expert: 4,
                rank: 0
            })
        );
    }
}
