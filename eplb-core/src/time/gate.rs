//! The pay-off gate: a changed layer is moved only when the time it saves over the next cycle
//! exceeds the stall its exchange adds (module docs of [`crate::time`], "The pay-off gate").
//!
//! For every layer that the plan changes, with the gathered logical heat `[N]` routed to slots
//! under the routing model ([`metrics::slot_loads`]):
//!
//! - `saving = moe(current) - moe(plan)` per iteration ([`TimeModel::layer_time`]);
//! - the exchange moves, per rank, the copies it receives (experts of its new row that its old
//!   row lacks) and sends (each received copy comes from the old holder that has sent the
//!   fewest so far, lowest rank first: an estimate of the runtime's transfer plan, which also
//!   prefers holders that drop the expert and holders on the receiver's node); the busiest
//!   rank's bytes over its link give the exchange time, on the inter-node link when some copy
//!   comes from another node ([`exchange_ms`]);
//! - `stall = layer_stall_ms(exchange, step)`, where the step is the current placement's MoE
//!   time summed over layers plus the rest of the step ([`Gate::step_other_ms`]: attention,
//!   dense layers, shared experts, LM head and host overhead, priced once by the whole-step
//!   model, [`Gate::for_step`]): an exchange that hides behind one step costs only the vote.
//!   With `step_other_ms = 0` the step is the MoE time alone, shorter than the real one, and
//!   the stall is over-stated (the gate errs on the side of not moving);
//! - the layer moves iff `layer_pays(saving, iterations * age, stall)`, where `age` is the
//!   number of cycles the layer's current placement has lived ([`Scratch::ages`]; 1 right
//!   after it moved): a placement that has stayed long is likely to stay as long again, so a
//!   move of a rarely changing layer is paid back over a longer horizon. Otherwise its rows of
//!   the plan are overwritten with the current ones.
//!
//! **Agreement.** Every input is agreed among the ranks: the digest-agreed plan, the current
//! placement, the gathered heat, the configuration and the ages (the runtime keeps them with
//! the policy state: they advance only for cycles every rank took). Evaluated in a fixed order with `f64`
//! arithmetic and no clock, the gate takes the same decision on every rank without a
//! collective. Apply it to the plan *before* its digest is taken.

use crate::metrics::{self, Routing};
use crate::placement::check_len;
use crate::{Error, LayerPlacement, Placement, Shape};

use super::step::{Overlap, StepModel};
use super::{TimeModel, exchange_ms, layer_pays, layer_stall_ms};

/// The pay-off gate's settings: the time model and the cycle a move must pay back over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gate {
    /// The time model (hardware, model, tokens per rank, expert bytes, ranks per node).
    pub model: TimeModel,
    /// Iterations the new placement serves before the next one: the heat interval plus the
    /// algorithm interval.
    pub iterations: u64,
    /// How tokens are routed to an expert's copies.
    pub routing: Routing,
    /// The step's time besides its MoE layers, ms per iteration (attention, dense layers,
    /// shared experts, LM head, host overhead): what an exchange can hide behind beside the
    /// MoE time. A constant of the configuration (every rank computes the same), `>= 0`;
    /// 0 weighs a move against the MoE time alone. [`Gate::for_step`] prices it.
    pub step_other_ms: f64,
}

/// What the gate decided for one plan.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GateSummary {
    /// Layers the plan changed.
    pub changed: usize,
    /// Of them, layers that pay and keep their new placement.
    pub moved: usize,
    /// Predicted MoE time per iteration saved by the moved layers.
    pub saving_ms_per_iter: f64,
    /// Predicted stall of the moved layers' exchanges.
    pub stall_ms: f64,
    /// Predicted saving per iteration the gate gave up (layers kept on their placement).
    pub forgone_ms_per_iter: f64,
    /// The step the stalls were weighed against, ms: the current placement's MoE time plus
    /// [`Gate::step_other_ms`].
    pub step_ms: f64,
}

impl GateSummary {
    /// The moved layers' saving as a share of the step (`saving_ms_per_iter / step_ms`; 0
    /// when the step is 0).
    pub fn saving_share(&self) -> f64 {
        share(self.saving_ms_per_iter, self.step_ms)
    }

    /// The forgone saving as a share of the step.
    pub fn forgone_share(&self) -> f64 {
        share(self.forgone_ms_per_iter, self.step_ms)
    }
}

fn share(ms: f64, step_ms: f64) -> f64 {
    if step_ms > 0.0 && step_ms.is_finite() {
        ms / step_ms
    } else {
        0.0
    }
}

/// The caller's buffers of one [`Gate::apply`], sized by [`scratch_len`].
#[derive(Debug)]
pub struct Scratch<'a> {
    /// `f64` words.
    pub floats: &'a mut [f64],
    /// `u32` words.
    pub words: &'a mut [u32],
    /// Per layer, how many cycles its placement has lived (empty: 1 for every layer).
    pub ages: &'a [u32],
}

/// The scratch the gate needs for `shape`: `(f64 words, u32 words)` of a [`Scratch`].
pub const fn scratch_len(shape: &Shape) -> (usize, usize) {
    (
        shape.layers() + shape.slots_per_layer(),
        metrics::scratch_len(shape) + 2 * shape.ranks(),
    )
}

impl Gate {
    /// The gate of `step`'s MoE model on `ranks` ranks: [`Gate::step_other_ms`] is the step's
    /// time besides its MoE layers at balanced load ([`StepModel::step_par`] at PAR 1, under
    /// `step`'s calibration): `attention + other` without overlap; with an overlap mode
    /// `max(0, iteration - moe)`, so that it never over-states what an exchange hides behind.
    pub fn for_step(
        step: &StepModel,
        ranks: usize,
        iterations: u64,
        routing: Routing,
    ) -> Result<Gate, Error> {
        let st = step.step_par(ranks, 1.0)?;
        let other = match step.overlap {
            Overlap::None => st.attention_ms + st.other_ms,
            Overlap::TwoBatch => (st.iteration_ms - st.moe_ms).max(0.0),
        };
        Ok(Gate {
            model: step.time,
            iterations,
            routing,
            step_other_ms: other,
        })
    }

    /// Applies the gate to `plan` (`[L][R][S]`, changed in place: layers that do not pay get
    /// their `current` rows back) under the gathered logical `loads` (`[L][N]`); `moved[l]`
    /// says whether layer `l` changes after the gate. Scratch sizes: [`scratch_len`].
    pub fn apply(
        &self,
        shape: &Shape,
        current: &[u16],
        plan: &mut [u16],
        loads: &[f64],
        scratch: Scratch<'_>,
        moved: &mut [bool],
    ) -> Result<GateSummary, Error> {
        let Scratch {
            floats: fscratch,
            words: uscratch,
            ages,
        } = scratch;
        self.model.check()?;
        if !(self.step_other_ms.is_finite() && self.step_other_ms >= 0.0) {
            return Err(Error::BadParameter {
                what: "gate step time besides the MoE layers",
                requirement: "a finite number >= 0",
            });
        }
        let (l, r, s) = (shape.layers(), shape.ranks(), shape.slots_per_rank());
        let per = shape.slots_per_layer();
        check_len(
            "current placement [L][R][S]",
            shape.placement_len(),
            current.len(),
        )?;
        check_len("plan [L][R][S]", shape.placement_len(), plan.len())?;
        check_len("logical loads [L][N]", shape.loads_len(), loads.len())?;
        check_len("moved [L]", l, moved.len())?;
        let (fl, ul) = scratch_len(shape);
        check_len("gate scratch (f64)", fl, fscratch.len())?;
        check_len("gate scratch (u32)", ul, uscratch.len())?;
        let (old_ms, slot_w) = fscratch.split_at_mut(l);
        let (mscratch, counts) = uscratch.split_at_mut(metrics::scratch_len(shape));
        let (recv, sent) = counts.split_at_mut(r);
        let old = Placement::new(*shape, current)?;
        let n = shape.experts();
        // The current placement's time per layer, and the iteration it makes up.
        let mut iteration_ms = 0.0;
        for (layer, t) in old_ms.iter_mut().enumerate() {
            let lp = old.layer(layer).ok_or(Error::Index {
                what: "layer",
                index: layer,
                bound: l,
            })?;
            let w = loads.get(layer * n..(layer + 1) * n).unwrap_or(&[]);
            metrics::slot_loads(&lp, w, self.routing, mscratch, slot_w)?;
            *t = self.model.layer_time(clamp(layer), r, s, slot_w)?.moe_ms;
            iteration_ms += *t;
        }
        // The step an exchange can hide behind.
        iteration_ms += self.step_other_ms;
        let mut sum = GateSummary {
            step_ms: iteration_ms,
            ..GateSummary::default()
        };
        for (layer, (old_row, new_row)) in current
            .chunks_exact(per)
            .zip(plan.chunks_exact_mut(per))
            .enumerate()
        {
            let Some(m) = moved.get_mut(layer) else {
                break;
            };
            *m = old_row != &*new_row;
            if !*m {
                continue;
            }
            sum.changed += 1;
            let lp = LayerPlacement::new(*shape, layer, new_row)?;
            let w = loads.get(layer * n..(layer + 1) * n).unwrap_or(&[]);
            metrics::slot_loads(&lp, w, self.routing, mscratch, slot_w)?;
            let new_ms = self.model.layer_time(clamp(layer), r, s, slot_w)?.moe_ms;
            let saving = old_ms.get(layer).copied().unwrap_or(0.0) - new_ms;
            let (copies, crosses) =
                busiest_copies(shape, old_row, new_row, recv, sent, &self.model);
            let exchange = exchange_ms(
                copies as f64 * self.model.expert_bytes,
                crosses,
                &self.model.hardware,
            )?;
            let stall = layer_stall_ms(exchange, iteration_ms, &self.model.hardware)?;
            let age = u64::from(ages.get(layer).copied().unwrap_or(1).max(1));
            if layer_pays(saving, self.iterations.saturating_mul(age), stall) {
                sum.moved += 1;
                sum.saving_ms_per_iter += saving;
                sum.stall_ms += stall;
            } else {
                *m = false;
                sum.forgone_ms_per_iter += saving.max(0.0);
                new_row.copy_from_slice(old_row);
            }
        }
        Ok(sum)
    }
}

/// The most expert copies one rank receives or sends in the exchange from `old` to `new`
/// (`[R][S]` rows), and whether a copy crosses nodes (`model.ranks_per_node`).
fn busiest_copies(
    shape: &Shape,
    old: &[u16],
    new: &[u16],
    recv: &mut [u32],
    sent: &mut [u32],
    model: &TimeModel,
) -> (u32, bool) {
    let s = shape.slots_per_rank().max(1);
    recv.fill(0);
    sent.fill(0);
    let g = model.ranks_per_node.map(usize::from).filter(|&g| g > 0);
    let mut crosses = false;
    for (dst, (nrow, orow)) in new.chunks_exact(s).zip(old.chunks_exact(s)).enumerate() {
        for (i, e) in nrow.iter().enumerate() {
            if nrow.get(..i).is_some_and(|seen| seen.contains(e)) || orow.contains(e) {
                continue;
            }
            if let Some(c) = recv.get_mut(dst) {
                *c += 1;
            }
            // The holder that has sent the fewest so far, lowest rank first.
            let src = old
                .chunks_exact(s)
                .enumerate()
                .filter(|(_, row)| row.contains(e))
                .map(|(h, _)| h)
                .min_by_key(|&h| (sent.get(h).copied().unwrap_or(0), h));
            if let Some(h) = src {
                if let Some(c) = sent.get_mut(h) {
                    *c += 1;
                }
                if g.is_some_and(|g| h / g != dst / g) {
                    crosses = true;
                }
            }
        }
    }
    let most = recv.iter().chain(sent.iter()).copied().max().unwrap_or(0);
    (most, crosses)
}

fn clamp(v: usize) -> u16 {
    u16::try_from(v).unwrap_or(u16::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{Hardware, ModelSpec, Role};
    use std::vec;
    use std::vec::Vec;

    /// 2 layers, 8 experts, 4 ranks x 3 slots; layer 0 skewed on rank 0's experts.
    fn case() -> (Shape, Vec<u16>, Vec<u16>, Vec<f64>) {
        let shape = Shape::new(2, 8, 4, 3).unwrap();
        // Current: experts 0 and 1 (the hot ones) both on rank 0.
        let row = [0u16, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3];
        let current: Vec<u16> = row.iter().chain(row.iter()).copied().collect();
        // Plan: layer 0 spreads 0 and 1 over ranks; layer 1 unchanged.
        let better = [0u16, 2, 3, 1, 4, 5, 6, 7, 0, 1, 2, 3];
        let plan: Vec<u16> = better.iter().chain(row.iter()).copied().collect();
        let mut loads = vec![1.0; 16];
        loads[0] = 40.0;
        loads[1] = 40.0;
        (shape, current, plan, loads)
    }

    fn gate(iterations: u64, bytes: f64, hw: Hardware) -> Gate {
        let mut model = TimeModel::new(hw, ModelSpec::DEEPSEEK_V3, Role::Prefill, bytes);
        model.tokens_per_rank = 4096.0;
        Gate {
            model,
            iterations,
            routing: Routing::Log2Phy,
            step_other_ms: 0.0,
        }
    }

    fn sc<'a>(floats: &'a mut [f64], words: &'a mut [u32]) -> Scratch<'a> {
        Scratch {
            floats,
            words,
            ages: &[],
        }
    }

    fn run(g: &Gate) -> (Vec<u16>, Vec<bool>, GateSummary) {
        let (shape, current, mut plan, loads) = case();
        let (f, u) = scratch_len(&shape);
        let (mut fs, mut us, mut moved) = (vec![0.0; f], vec![0u32; u], vec![true; 2]);
        let sum = g
            .apply(
                &shape,
                &current,
                &mut plan,
                &loads,
                sc(&mut fs, &mut us),
                &mut moved,
            )
            .unwrap();
        (plan, moved, sum)
    }

    #[test]
    fn slot_loads_sum_to_rank_loads() {
        let (shape, _, plan, loads) = case();
        let p = Placement::new(shape, &plan).unwrap();
        for routing in [Routing::Even, Routing::Log2Phy] {
            for lp in p.layers() {
                let w = &loads[lp.index() * 8..(lp.index() + 1) * 8];
                let mut scratch = vec![0u32; metrics::scratch_len(&shape)];
                let (mut slots, mut ranks) = (vec![0.0; 12], vec![0.0; 4]);
                metrics::slot_loads(&lp, w, routing, &mut scratch, &mut slots).unwrap();
                metrics::rank_loads(&lp, w, routing, &mut scratch, &mut ranks).unwrap();
                for (r, want) in ranks.iter().enumerate() {
                    let got: f64 = slots[r * 3..r * 3 + 3].iter().sum();
                    assert!(
                        (got - want).abs() < 1e-9,
                        "{routing:?} rank {r}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_layer_that_pays_moves_and_one_that_does_not_keeps_its_placement() {
        let (_, current, plan, _) = case();
        // Many iterations to pay back over: the balanced layer moves.
        let (out, moved, sum) = run(&gate(1_000, 44e6, Hardware::A3));
        assert_eq!(moved, [true, false]);
        assert_eq!(out, plan);
        assert_eq!((sum.changed, sum.moved), (1, 1));
        assert!(
            sum.saving_ms_per_iter > 0.0 && sum.stall_ms > 0.0,
            "{sum:?}"
        );
        // One iteration and a huge expert: the stall cannot be paid back; the plan reverts.
        let (out, moved, sum) = run(&gate(1, 44e12, Hardware::A3));
        assert_eq!(moved, [false, false]);
        assert_eq!(out, current);
        assert_eq!((sum.changed, sum.moved), (1, 0));
        assert!(sum.forgone_ms_per_iter > 0.0);
        // The same inputs give the same decision.
        assert_eq!(
            run(&gate(1_000, 44e6, Hardware::A3)),
            run(&gate(1_000, 44e6, Hardware::A3))
        );
    }

    #[test]
    fn a_stall_below_the_step_passes_and_one_above_does_not() {
        // Layer 0's move, paid back over one iteration, with an expert so large that its
        // exchange far exceeds the MoE time: weighed against the MoE time alone it never pays.
        let bytes = 44e10;
        let mut g = gate(1, bytes, Hardware::A3);
        let (shape, current, plan, _) = case();
        let per = shape.slots_per_layer();
        let (mut recv, mut sent) = (vec![0u32; 4], vec![0u32; 4]);
        let (copies, crosses) = busiest_copies(
            &shape,
            &current[..per],
            &plan[..per],
            &mut recv,
            &mut sent,
            &g.model,
        );
        let exchange = exchange_ms(copies as f64 * bytes, crosses, &g.model.hardware).unwrap();
        let (_, moved, moe_only) = run(&g);
        assert_eq!(moved, [false, false], "{moe_only:?}");
        let (moe, saving) = (moe_only.step_ms, moe_only.forgone_ms_per_iter);
        assert!(
            saving > 0.0 && exchange > moe + saving,
            "{exchange} {moe_only:?}"
        );
        // The move pays iff `saving > max(0, exchange - step) + collective`: the threshold on
        // the rest of the step is `exchange - moe + collective - saving`.
        let threshold = exchange - moe + g.model.hardware.collective_ms - saving;
        assert!(threshold > 1.0, "{threshold}");
        g.step_other_ms = threshold + 0.5;
        let (out, moved, sum) = run(&g);
        assert_eq!(moved, [true, false], "{sum:?}");
        assert_eq!(out, plan);
        assert!(
            (sum.step_ms - (moe + threshold + 0.5)).abs() < 1e-9,
            "{sum:?}"
        );
        assert!((sum.saving_share() - saving / sum.step_ms).abs() < 1e-12);
        g.step_other_ms = threshold - 0.5;
        let (out, moved, sum) = run(&g);
        assert_eq!(moved, [false, false], "{sum:?}");
        assert_eq!(out, current);
        assert!(sum.forgone_share() > 0.0 && sum.saving_share() == 0.0);
        // A bad step time is an error, not a decision.
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            g.step_other_ms = bad;
            let (shape, current, mut plan, loads) = case();
            let (f, u) = scratch_len(&shape);
            let (mut fs, mut us, mut m) = (vec![0.0; f], vec![0u32; u], vec![false; 2]);
            let e = g.apply(
                &shape,
                &current,
                &mut plan,
                &loads,
                sc(&mut fs, &mut us),
                &mut m,
            );
            assert!(matches!(e, Err(Error::BadParameter { .. })), "{bad}: {e:?}");
        }
    }

    #[test]
    fn for_step_prices_the_rest_of_the_step() {
        use crate::time::step::Calibration;
        let mut time = TimeModel::new(Hardware::A3, ModelSpec::DEEPSEEK_V3, Role::Decode, 44e6);
        time.tokens_per_rank = 64.0;
        let step = StepModel::new(time, Role::Decode);
        let g = Gate::for_step(&step, 32, 650, Routing::Log2Phy).unwrap();
        let st = step.step_par(32, 1.0).unwrap();
        assert_eq!(
            (g.model, g.iterations, g.routing),
            (time, 650, Routing::Log2Phy)
        );
        assert!(g.step_other_ms > 0.0);
        assert!((g.step_other_ms - (st.attention_ms + st.other_ms)).abs() < 1e-9);
        // A calibration that doubles the backbone and the host lengthens it.
        let mut cal = step;
        cal.calibration = Calibration {
            host: 2.0,
            backbone: 2.0,
            ..Calibration::PRESET
        };
        let g2 = Gate::for_step(&cal, 32, 650, Routing::Log2Phy).unwrap();
        assert!((g2.step_other_ms - 2.0 * g.step_other_ms).abs() < 1e-9 * g.step_other_ms);
        // An overlap never makes it longer.
        let mut ov = step;
        ov.overlap = Overlap::TwoBatch;
        let g3 = Gate::for_step(&ov, 32, 650, Routing::Log2Phy).unwrap();
        assert!(g3.step_other_ms <= g.step_other_ms + 1e-9, "{g3:?}");
        // Bad step inputs are errors.
        let mut bad = step;
        bad.requests_per_rank = f64::NAN;
        assert!(Gate::for_step(&bad, 32, 650, Routing::Log2Phy).is_err());
    }

    #[test]
    fn a_plan_that_saves_nothing_never_moves() {
        let (shape, current, _, _) = case();
        // A plan that only swaps two cold experts between ranks: no saving, some stall.
        let mut plan = current.clone();
        plan.swap(5, 8);
        let loads = vec![1.0; 16];
        let (f, u) = scratch_len(&shape);
        let (mut fs, mut us, mut moved) = (vec![0.0; f], vec![0u32; u], vec![false; 2]);
        let g = gate(u64::MAX, 44e6, Hardware::A3);
        let sum = g
            .apply(
                &shape,
                &current,
                &mut plan,
                &loads,
                sc(&mut fs, &mut us),
                &mut moved,
            )
            .unwrap();
        assert_eq!((sum.changed, sum.moved), (1, 0));
        assert_eq!(plan, current);
    }

    #[test]
    fn bad_lengths_are_errors() {
        let (shape, current, mut plan, loads) = case();
        let (f, u) = scratch_len(&shape);
        let g = gate(10, 44e6, Hardware::A3);
        let (mut fs, mut us, mut moved) = (vec![0.0; f], vec![0u32; u], vec![false; 2]);
        assert!(
            g.apply(
                &shape,
                &current[1..],
                &mut plan,
                &loads,
                sc(&mut fs, &mut us),
                &mut moved
            )
            .is_err()
        );
        assert!(
            g.apply(
                &shape,
                &current,
                &mut plan,
                &loads[1..],
                sc(&mut fs, &mut us),
                &mut moved
            )
            .is_err()
        );
        let mut short = vec![0.0; f - 1];
        assert!(
            g.apply(
                &shape,
                &current,
                &mut plan,
                &loads,
                sc(&mut short, &mut us),
                &mut moved
            )
            .is_err()
        );
        let mut bad = loads.clone();
        bad[3] = f64::NAN;
        assert!(
            g.apply(
                &shape,
                &current,
                &mut plan,
                &bad,
                sc(&mut fs, &mut us),
                &mut moved
            )
            .is_err()
        );
    }
}
