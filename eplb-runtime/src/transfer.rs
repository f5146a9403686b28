//! Transfer planning: which rank sends which expert to which rank, for one changed layer.
//!
//! Every (rank, expert) copy that the new placement adds gets a source: first a rank that drops
//! that expert, then a holder on the destination's node, then any holder; within a tier the holder
//! with the fewest sends so far (then the lowest rank), so sends spread over holders. Messages
//! between two ranks are ordered by ascending expert id on both sides, so a receiver can match
//! them by position, as HCCL requires. A rank receives at most `S` experts per layer (it has `S`
//! receive buffers); experts it keeps but moves to another slot are copied locally at commit.
//!
//! Elastic membership: an [`EMPTY`] slot of the old layer holds nothing and is never a source (a
//! rank that left has only such rows); an [`EMPTY`] slot of the new layer needs nothing (it is
//! left as it is and not routed to). An expert of the new layer that no rank holds in the old one
//! (its every copy was on ranks that left) is a **load**: each rank that needs it fills a receive
//! buffer from storage or a host backup ([`crate::transport::Transport::load`]); load buffers
//! are numbered after the receives, so receives and loads together fit the `S` buffers.

use std::fmt;

use eplb_core::{EMPTY, Shape};

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

/// A load of this rank: `expert`, which no rank holds, is read from storage or a host backup into
/// receive buffer `buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOp {
    /// Logical expert.
    pub expert: u16,
    /// Receive buffer index (`recvs.len() + i` for the `i`-th load, `< S`).
    pub buffer: u16,
}

/// One expert loaded from storage by one rank (an expert that lost its last copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Load {
    /// The rank that loads it.
    pub rank: u16,
    /// Logical expert.
    pub expert: u16,
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
    /// The expert was loaded from storage or a host backup into a receive buffer
    /// ([`crate::transport::Transport::load`]).
    Loaded {
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
    /// Loads of experts no rank holds, ordered by expert; buffer `recvs.len() + i` for the
    /// `i`-th.
    pub loads: Vec<LoadOp>,
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
            && self.loads.is_empty()
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
    /// Every load of an expert no rank holds, ordered by (rank, expert).
    pub loads: Vec<Load>,
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
    /// The new placement needs an expert that no rank holds now. No longer returned by
    /// [`plan_layer`] (such an expert is a [`Load`]); kept so that matches on it still compile.
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

/// The transfers and loads of [`plan_layer`] (`LayerPlan::transfers` and `LayerPlan::loads`,
/// the same lists in the same order) without the per-rank plans: for a caller that prices or
/// times a change (the simulator's cost and time models). The holders of every expert are
/// indexed once, so a source is found among its holders only.
pub fn plan_transfers(
    shape: &Shape,
    old: &[u16],
    new: &[u16],
) -> Result<(Vec<Transfer>, Vec<Load>), PlanError> {
    let (r, s) = (shape.ranks(), shape.slots_per_rank());
    check_layers(r * s, old, new)?;
    let rpn = shape.ranks_per_node().max(1);
    let old_rows: Vec<&[u16]> = old.chunks_exact(s).collect();
    let new_rows: Vec<&[u16]> = new.chunks_exact(s).collect();
    let holders = Holders::new(&old_rows);
    let mut sends_so_far = vec![0usize; r];
    let mut transfers = Vec::new();
    let mut loads = Vec::new();
    for (dst, (nrow, orow)) in new_rows.iter().zip(&old_rows).enumerate() {
        for (i, &e) in nrow.iter().enumerate() {
            if e == EMPTY
                || nrow.get(..i).is_some_and(|seen| seen.contains(&e))
                || orow.contains(&e)
            {
                continue;
            }
            // Tier 0: drops e; tier 1: same node; tier 2: any holder.
            let src = holders
                .of(e)
                .iter()
                .map(|&h| usize::from(h))
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
                });
            let Some(src) = src else {
                // Lost: every copy was on ranks that left.
                loads.push(Load {
                    rank: dst as u16,
                    expert: e,
                });
                continue;
            };
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
    loads.sort_unstable();
    Ok((transfers, loads))
}

/// The ranks holding each expert in a layer's old rows, in ascending rank order (each once).
struct Holders {
    /// `[E + 1]` offsets into `ranks`.
    start: Vec<usize>,
    ranks: Vec<u16>,
}

impl Holders {
    fn new(rows: &[&[u16]]) -> Self {
        /// The experts of `row`, each at its first slot.
        fn firsts(row: &[u16]) -> impl Iterator<Item = usize> + '_ {
            row.iter()
                .enumerate()
                .filter(|&(i, &e)| e != EMPTY && !row.get(..i).is_some_and(|s| s.contains(&e)))
                .map(|(_, &e)| usize::from(e))
        }
        let top = rows
            .iter()
            .flat_map(|row| firsts(row))
            .max()
            .map_or(0, |e| e + 1);
        // start[e + 1] counts e's holders, then (summed) ends e's range.
        let mut start = vec![0usize; top + 1];
        for e in rows.iter().flat_map(|row| firsts(row)) {
            if let Some(c) = start.get_mut(e + 1) {
                *c += 1;
            }
        }
        let mut acc = 0;
        for c in start.iter_mut() {
            acc += *c;
            *c = acc;
        }
        let mut fill = start.clone();
        let mut ranks = vec![0u16; acc];
        for (h, row) in rows.iter().enumerate() {
            for e in firsts(row) {
                if let Some(at) = fill.get_mut(e)
                    && let Some(slot) = ranks.get_mut(*at)
                {
                    *slot = h as u16;
                    *at += 1;
                }
            }
        }
        Self { start, ranks }
    }

    /// The ranks holding `e` (none when no rank does).
    fn of(&self, e: u16) -> &[u16] {
        let e = usize::from(e);
        match (self.start.get(e), self.start.get(e + 1)) {
            (Some(&a), Some(&b)) => self.ranks.get(a..b).unwrap_or(&[]),
            _ => &[],
        }
    }
}

/// Plans one layer: `old` and `new` are `[R][S]` rows of the same shape, [`EMPTY`] for a slot
/// that holds (`old`) or needs (`new`) nothing.
pub fn plan_layer(
    shape: &Shape,
    layer: usize,
    old: &[u16],
    new: &[u16],
) -> Result<LayerPlan, PlanError> {
    let (transfers, loads) = plan_transfers(shape, old, new)?;
    let s = shape.slots_per_rank();
    let r = shape.ranks();
    let old_rows: Vec<&[u16]> = old.chunks_exact(s).collect();
    let new_rows: Vec<&[u16]> = new.chunks_exact(s).collect();
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
        let rank_loads: Vec<LoadOp> = loads
            .iter()
            .filter(|l| usize::from(l.rank) == rank)
            .enumerate()
            .map(|(i, l)| LoadOp {
                expert: l.expert,
                buffer: (recvs.len() + i) as u16,
            })
            .collect();
        let install = nrow
            .iter()
            .enumerate()
            .map(|(slot, &e)| {
                if e == EMPTY || orow.get(slot) == Some(&e) {
                    SlotSource::Unchanged
                } else if let Some(from) = orow.iter().rposition(|&x| x == e) {
                    SlotSource::Local {
                        from_slot: from as u16,
                    }
                } else if let Some(ld) = rank_loads.iter().find(|ld| ld.expert == e) {
                    SlotSource::Loaded { buffer: ld.buffer }
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
            loads: rank_loads,
            new_row: nrow.to_vec(),
            install,
        });
    }
    Ok(LayerPlan {
        layer,
        transfers,
        loads,
        ranks,
    })
}

/// The loads of [`plan_layer`] alone (`LayerPlan::loads`, the same list in the same order),
/// without planning a transfer: for a driver that needs only what must be read back from
/// storage (the simulator). `O(R * S)` with one table of the experts the old layer holds.
pub fn plan_loads(shape: &Shape, old: &[u16], new: &[u16]) -> Result<Vec<Load>, PlanError> {
    let (r, s) = (shape.ranks(), shape.slots_per_rank());
    check_layers(r * s, old, new)?;
    let top = old
        .iter()
        .chain(new)
        .filter(|&&e| e != EMPTY)
        .map(|&e| usize::from(e) + 1)
        .max()
        .unwrap_or(0);
    let mut held = vec![false; top];
    for &e in old.iter().filter(|&&e| e != EMPTY) {
        if let Some(h) = held.get_mut(usize::from(e)) {
            *h = true;
        }
    }
    let mut loads = Vec::new();
    for (dst, nrow) in new.chunks_exact(s.max(1)).enumerate() {
        for (i, &e) in nrow.iter().enumerate() {
            let held = held.get(usize::from(e)).copied().unwrap_or(false);
            if e == EMPTY || held || nrow.get(..i).is_some_and(|seen| seen.contains(&e)) {
                continue;
            }
            loads.push(Load {
                rank: dst as u16,
                expert: e,
            });
        }
    }
    loads.sort_unstable();
    Ok(loads)
}

/// Both layers hold `slots` (`R * S`) ids.
fn check_layers(slots: usize, old: &[u16], new: &[u16]) -> Result<(), PlanError> {
    for (what, got) in [
        ("old layer [R][S]", old.len()),
        ("new layer [R][S]", new.len()),
    ] {
        if got != slots {
            return Err(PlanError::Shape {
                what,
                expected: slots,
                got,
            });
        }
    }
    Ok(())
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
        // An old layer that lacks expert 4 has no source for it: rank 0 loads it (this was
        // `PlanError::NoSource` before elastic membership).
        let shape = Shape::new(1, 5, 2, 3).unwrap();
        let plan = plan_layer(&shape, 3, &[0, 1, 2, 3, 0, 1], &[4, 1, 2, 3, 0, 1]).unwrap();
        assert_eq!(plan.loads, vec![Load { rank: 0, expert: 4 }]);
        assert_eq!(
            plan.ranks[0].loads,
            vec![LoadOp {
                expert: 4,
                buffer: 0
            }]
        );
        assert_eq!(plan.ranks[0].install[0], SlotSource::Loaded { buffer: 0 });
        assert!(!plan.ranks[0].is_empty());
        assert!(plan.ranks[1].is_empty());
    }

    const E: u16 = EMPTY;

    /// Every source of `plan` holds its expert in `old`, and no rank sends from an EMPTY slot.
    fn check_sources(shape: &Shape, old: &[u16], plan: &LayerPlan) {
        let s = shape.slots_per_rank();
        for t in &plan.transfers {
            let row = &old[usize::from(t.src) * s..(usize::from(t.src) + 1) * s];
            assert!(row.contains(&t.expert), "{t:?} from a rank without it");
        }
        for (rank, rp) in plan.ranks.iter().enumerate() {
            for op in &rp.sends {
                assert_eq!(old[rank * s + usize::from(op.slot)], op.expert, "{op:?}");
            }
        }
    }

    #[test]
    fn a_dead_ranks_empty_rows_are_never_sources() {
        // 8 experts, 4 ranks x 3 slots; rank 2 is gone (EMPTY row). Experts 0..=3 have copies on
        // live ranks; the new layer spreads them over the three live ranks.
        let shape = Shape::new(1, 8, 4, 3).unwrap();
        #[rustfmt::skip]
        let old = [
            0, 1, 4,
            2, 3, 5,
            E, E, E,
            0, 6, 7,
        ];
        #[rustfmt::skip]
        let new = [
            0, 1, 7,
            2, 3, 6,
            E, E, E,
            4, 5, 0,
        ];
        let plan = plan_layer(&shape, 0, &old, &new).unwrap();
        check_sources(&shape, &old, &plan);
        assert!(plan.transfers.iter().all(|t| t.src != 2 && t.dst != 2));
        assert!(plan.loads.is_empty());
        assert!(plan.ranks[2].is_empty());
        assert_eq!(plan.ranks[2].install, vec![SlotSource::Unchanged; 3]);
        let t = |src, dst, expert| Transfer { src, dst, expert };
        assert_eq!(
            plan.transfers,
            vec![t(0, 3, 4), t(1, 3, 5), t(3, 0, 7), t(3, 1, 6)]
        );
    }

    #[test]
    fn a_lost_expert_becomes_a_load_on_each_rank_that_needs_it() {
        // Rank 1 held the only copies of experts 2 and 3 and is gone. The new layer puts 2 on
        // ranks 0 and 2, and 3 on rank 2; rank 2 also receives expert 0 from rank 0.
        let shape = Shape::new(1, 5, 3, 3).unwrap();
        #[rustfmt::skip]
        let old = [
            0, 1, 4,
            E, E, E,
            1, 4, E,
        ];
        #[rustfmt::skip]
        let new = [
            0, 1, 2,
            E, E, E,
            3, 0, 2,
        ];
        let plan = plan_layer(&shape, 2, &old, &new).unwrap();
        check_sources(&shape, &old, &plan);
        assert_eq!(
            plan.loads,
            vec![
                Load { rank: 0, expert: 2 },
                Load { rank: 2, expert: 2 },
                Load { rank: 2, expert: 3 }
            ]
        );
        assert_eq!(
            plan.transfers,
            vec![Transfer {
                src: 0,
                dst: 2,
                expert: 0
            }]
        );
        let r0 = &plan.ranks[0];
        assert!(r0.recvs.is_empty());
        assert_eq!(
            r0.loads,
            vec![LoadOp {
                expert: 2,
                buffer: 0
            }]
        );
        assert_eq!(r0.install[2], SlotSource::Loaded { buffer: 0 });
        // Rank 2: one receive (buffer 0), then its loads by expert (buffers 1 and 2).
        let r2 = &plan.ranks[2];
        assert_eq!(r2.recvs.len(), 1);
        assert_eq!(
            r2.loads,
            vec![
                LoadOp {
                    expert: 2,
                    buffer: 1
                },
                LoadOp {
                    expert: 3,
                    buffer: 2
                }
            ]
        );
        assert_eq!(
            r2.install,
            vec![
                SlotSource::Loaded { buffer: 2 },
                SlotSource::Received { buffer: 0 },
                SlotSource::Loaded { buffer: 1 }
            ]
        );
        assert!(r2.recvs.len() + r2.loads.len() <= shape.slots_per_rank());
        assert!(plan.ranks[1].is_empty());
    }

    #[test]
    fn a_joining_rank_receives_its_whole_new_row_from_peers() {
        // Rank 1 joins with an EMPTY row and takes a copy of 0 and 3 and the only slot of 5's
        // second copy; every expert it needs is held by a peer.
        let shape = Shape::new(1, 6, 3, 3).unwrap();
        #[rustfmt::skip]
        let old = [
            0, 1, 2,
            E, E, E,
            3, 4, 5,
        ];
        #[rustfmt::skip]
        let new = [
            0, 1, 2,
            3, 0, 5,
            3, 4, 5,
        ];
        let plan = plan_layer(&shape, 0, &old, &new).unwrap();
        check_sources(&shape, &old, &plan);
        assert!(plan.loads.is_empty());
        let r1 = &plan.ranks[1];
        let mut got: Vec<u16> = r1.recvs.iter().map(|r| r.expert).collect();
        got.sort_unstable();
        assert_eq!(got, vec![0, 3, 5]);
        assert!(r1.sends.is_empty());
        assert!(
            r1.install
                .iter()
                .all(|s| matches!(s, SlotSource::Received { .. }))
        );
        // Each received expert installs from the buffer that carries it.
        for (slot, src) in r1.install.iter().enumerate() {
            let SlotSource::Received { buffer } = *src else {
                unreachable!()
            };
            assert_eq!(r1.recvs[usize::from(buffer)].expert, new[3 + slot]);
        }
        assert!(plan.ranks[0].recvs.is_empty() && plan.ranks[2].recvs.is_empty());
    }

    #[test]
    fn plan_loads_and_plan_transfers_are_plan_layers_own() {
        let shape = Shape::from_redundant(1, 8, 4, 4).unwrap();
        let mut x: u64 = 3;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        let mut with_loads = 0;
        for _ in 0..500 {
            let mut row = |p_empty: u64| -> Vec<u16> {
                (0..12)
                    .map(|_| {
                        if next(100) < p_empty {
                            EMPTY
                        } else {
                            next(8) as u16
                        }
                    })
                    .collect()
            };
            let (old, new) = (row(40), row(10));
            for shape in [shape, shape.topology(2, 1).unwrap()] {
                let plan = plan_layer(&shape, 0, &old, &new).unwrap();
                with_loads += usize::from(!plan.loads.is_empty());
                let loads = plan_loads(&shape, &old, &new).unwrap();
                assert_eq!(loads, plan.loads, "{old:?} -> {new:?}");
                let both = plan_transfers(&shape, &old, &new).unwrap();
                assert_eq!(both, (plan.transfers, plan.loads), "{old:?} -> {new:?}");
            }
        }
        assert!(with_loads > 50, "{with_loads}");
        assert!(plan_loads(&shape, &[0; 11], &[0; 12]).is_err());
    }
}
