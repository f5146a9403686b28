//! The per-layer scratch buffers of one call. Each buffer is declared once, with its element
//! type and its length, in `work!`: the struct, its carving from the arena and the scratch
//! size (`Work::words`) are all generated from that one list, so they cannot drift apart.

use super::*;

/// Declares `Work`: `buffers` (name, element type, arena method, length in the size names
/// `n`, `r`, `s`, `mw`, which are `Words`) and `scalars` (name, type, initial value).
macro_rules! work {
    (
        sizes($shape:ident => $n:ident, $r:ident, $s:ident, $mw:ident);
        buffers { $( $(#[$bd:meta])* $b:ident: $bt:ty = $m:ident($len:expr), )* }
        scalars { $( $(#[$sd:meta])* $f:ident: $ft:ty = $init:expr, )* }
    ) => {
        /// Per-layer working buffers.
        pub(super) struct Work<'a> {
            $( $(#[$bd])* pub(super) $b: &'a mut [$bt], )*
            $( $(#[$sd])* pub(super) $f: $ft, )*
        }

        impl<'a> Work<'a> {
            /// Carves every buffer from `arena`.
            pub(super) fn carve(arena: &mut Arena<'a>, $shape: &Shape) -> Result<Self, Error> {
                let ($n, $r, $s, $mw) = sizes($shape);
                Ok(Self {
                    $( $b: arena.$m(($len).get())?, )*
                    $( $f: $init, )*
                })
            }

            /// Scratch words of one call (checked: saturates, see [`Words`]).
            pub(super) fn words($shape: &Shape) -> Words {
                let ($n, $r, $s, $mw) = sizes($shape);
                let mut total = Words(0);
                $( total = total + ($len).$m(); )*
                total
            }
        }
    };
}

/// `N`, `R`, `S` and the bitset words per expert, as [`Words`].
fn sizes(shape: &Shape) -> (Words, Words, Words, Words) {
    (
        Words(shape.experts()),
        Words(shape.ranks()),
        Words(shape.slots_per_rank()),
        Words(mask_words(shape)),
    )
}

work! {
    sizes(shape => n, r, s, mw);
    buffers {
        /// Predicted per-window load per expert.
        est: f64 = f64s(n),
        /// The previous estimate (the history) and the recent windows' estimate, per expert.
        old: f64 = f64s(n),
        rec: f64 = f64s(n),
        /// Per-window variance per expert (for the shift tests).
        var: f64 = f64s(n),
        /// Centered per-window samples, expert-major `[N][stride]`: `T <= MAX_WINDOWS` window
        /// rows, then the past cycles' deviations.
        xc: f64 = f64s(ROWS * n),
        /// Predicted load per rank.
        load: f64 = f64s(r),
        /// Centered per-window load per rank `[R][stride]`.
        y: f64 = f64s(ROWS * r),
        /// Per-candidate deltas per rank: load, share of expert a, share of expert b.
        dmu: f64 = f64s(r),
        da: f64 = f64s(r),
        db: f64 = f64s(r),
        /// Rank values, for ordering.
        val: f64 = f64s(r),
        /// Per rank, the sum of its squared centered loads `sum_i y_i^2`.
        syy: f64 = f64s(r),
        /// Per expert, `sum_i x_i^2` of its centered samples.
        gd: f64 = f64s(n),
        /// Per step, `sum_i y_i x_i` of the heaviest rank and each expert it may trade with (NaN
        /// until needed).
        cp: f64 = f64s(n),
        /// Per slot `[R][S]`, `sum_i y_i x_i` of the rank and the slot's expert, and the norm of
        /// the rank's centered loads without that expert (NaN until needed; reset when the rank
        /// changes).
        cq: f64 = f64s(r * s),
        nu: f64 = f64s(r * s),
        /// Per expert, the norm of its centered samples, `sqrt(gd)`.
        nx: f64 = f64s(n),
        /// Per step: the share of each partner slot's expert on its rank (`[partners][S]`).
        psh: f64 = f64s(r * s),
        /// Per step: each partner's largest slot load (`[partners]`).
        pmax: f64 = f64s(r),
        /// Per step: each partner's largest load in a slot whose expert has another copy
        /// (`f64::MIN` without one).
        prep: f64 = f64s(r),
        /// Per step: the least load any of a partner's experts brings to another rank.
        pminp: f64 = f64s(r),
        /// Per step: `prep` over the slots a replicate of a single-copy expert may take.
        prep_strict: f64 = f64s(r),
        /// Per step, per partner slot `[partners][S]`, the other holders' largest new load when
        /// the slot's expert leaves the partner (a replicate over it; `f64::MAX` without other
        /// holders).
        rep_mu: f64 = f64s(r * s),
        /// Per step, per partner slot `[partners][S]`, the terms of the slot filter: the
        /// partner's load without the slot's expert (`f_u`; `f_rep` is the same, or infinity
        /// where the expert has no other copy), `f_u` plus the triangle bound on its spread
        /// (`f_rho`), the least load the expert brings to the heaviest rank (`f_m`) and that
        /// minus the most spread it can take off it (`f_kap`).
        f_u: f64 = f64s(r * s),
        f_rep: f64 = f64s(r * s),
        /// `f_rep` where the slot's expert also sits on the heaviest rank, infinity elsewhere.
        f_rep_onp: f64 = f64s(r * s),
        f_rho: f64 = f64s(r * s),
        f_m: f64 = f64s(r * s),
        f_kap: f64 = f64s(r * s),
        /// Per slot `[R][S]`, kept across the steps of a layer (`partners.rs`): the index of
        /// its rank among the holders of its expert (in rank order), the expert's share on the
        /// rank and the load it gives, the rank's load without it (`k_u`) and that plus the
        /// triangle bound on its spread (`k_rho`), the least load the expert brings to another
        /// rank (`k_m`) and that minus the most spread it can take off it (`k_kap`), and the
        /// other holders' largest new load when it leaves (`k_rmu`; `f64::MAX` without other
        /// holders).
        spos: u16 = u16s(r * s),
        k_sh: f64 = f64s(r * s),
        k_give: f64 = f64s(r * s),
        k_u: f64 = f64s(r * s),
        /// `k_u` where the slot's expert has another copy, infinity elsewhere.
        k_rep: f64 = f64s(r * s),
        k_rho: f64 = f64s(r * s),
        k_m: f64 = f64s(r * s),
        k_kap: f64 = f64s(r * s),
        k_rmu: f64 = f64s(r * s),
        /// Per rank, kept likewise: its largest slot load, its largest in a slot whose expert
        /// has another copy, and the least load any of its experts brings to another rank.
        q_pmax: f64 = f64s(r),
        q_prep: f64 = f64s(r),
        q_pmin: f64 = f64s(r),
        /// The ranks and the experts whose entries a move made stale (nonzero).
        kdirty: u16 = u16s(r),
        edirty: u16 = u16s(n),
        /// Per step, each rank's position among the partners (`u16::MAX` for none).
        opos: u16 = u16s(r),
        /// Scratch of one expert's holders (`[R]`) for [`Work::leave_sweep`]: their ranks, their
        /// leave loads, and the effect on each of a holder below it leaving.
        hr: u16 = u16s(r),
        hv: f64 = f64s(r),
        hb: f64 = f64s(r),
        /// Per mover, per rank, the mover's holders below the rank.
        abl: u16 = u16s(r),
        /// Per expert, its first entry in the per-holder tables (the prefix sum of `copies`),
        /// and which of its tables the step has built (bits by [`Work::effect`]'s table index).
        hoff: u32 = u32s(n),
        built: u16 = u16s(n),
        /// Per step, per holder of each expert (`hoff[e] + j`, holders in rank order), the other
        /// holders' largest new load and value when the expert leaves that holder (`lv_*`) or
        /// moves from it to the heaviest rank (`tp_*`) ([`Work::effect`]; filled on first use).
        lv_mu: f64 = f64s(r * s),
        lv_val: f64 = f64s(r * s),
        tp_mu: f64 = f64s(r * s),
        tp_val: f64 = f64s(r * s),
        /// Per mover, by the partner's position among its holders (`[d + 1]`), the other
        /// holders' largest new load and value when the partner joins them (`jn_*`, a
        /// replicate) or takes the mover from the heaviest rank (`fp_*`, a swap).
        jn_mu: f64 = f64s(r + 1),
        jn_val: f64 = f64s(r + 1),
        fp_mu: f64 = f64s(r + 1),
        fp_val: f64 = f64s(r + 1),
        /// Per mover with other copies, the partner slots whose leave load the filter sets
        /// aside and their values (each slot at most once), and per expert the mover that
        /// last visited it (`ex_stamp`).
        ex_slot: u32 = u32s(r * s),
        ex_val: f64 = f64s(r * s),
        ex_mark: u32 = u32s(n),
        /// Per mover, the partner slots that pass the filter, in partner order (`qi << 16 | j`).
        surv: u32 = u32s(r * s + 1),
        /// Per expert, the bitset of the ranks that hold it (`[N][mw]`).
        mask: u64 = words(n * mw),
        /// Per expert, its distinct holders.
        copies: u16 = u16s(n),
        /// The ranks a candidate touches.
        touched: u16 = u16s(2 * r + 4),
        /// The ranks by value, ascending.
        order: u16 = u16s(r),
        /// Scratch of `common::keep_slots`.
        keep: u16 = u16s(2 * s),
        /// The cold start (`construct`): replica counts, experts by load per copy (a heap
        /// while counting), their positions there and their load per copy (`[N]`); the
        /// packed ranks' loads and fill (reused as the current ranks' owners in the matching),
        /// the heap of packed ranks with room, their heap positions and the ranks that sit out
        /// an expert (these three reused by the augmenting paths) (`[R]`), the packed ranks
        /// (`[R][S]`), their order and their current rank (`[R]`).
        c_cnt: u16 = u16s(n),
        c_ord: u16 = u16s(n),
        c_at: u16 = u16s(n),
        c_u: f64 = f64s(n),
        c_load: f64 = f64s(r),
        c_fill: u16 = u16s(r),
        c_heap: u16 = u16s(r),
        c_pos: u16 = u16s(r),
        c_hold: u16 = u16s(r),
        c_tgt: u16 = u16s(r * s),
        c_rord: u16 = u16s(r),
        c_map: u16 = u16s(r),
        /// The count shifts after the packing: per expert, its heaviest and second heaviest
        /// packed holder's load, and the heaviest holder.
        c_top: f64 = f64s(2 * n),
        c_arg: u16 = u16s(n),
        /// The matching: per packed rank, the experts its current rank keeps.
        c_keep: u16 = u16s(r),
        /// The layer before the search and after it, while a stalled layer is rebuilt.
        c_old: u16 = u16s(r * s),
        c_res: u16 = u16s(r * s),
    }
    scalars {
        /// Rows in `xc` and `y`.
        t: usize = 0,
        /// Row stride of `xc` and `y` for this layer (at most `ROWS`): the rows this layer can
        /// use, so the samples stay dense in cache.
        stride: usize = ROWS,
        /// Slots per rank.
        s: usize = shape.slots_per_rank(),
        /// The rank count and its tabulated shares.
        rr: Ranks = Ranks::new(shape.ranks()),
        /// Which of the mover's tables (`jn_*`, `fp_*`) the mover has built.
        a_built: u16 = 0,
        /// The mover's stamp in `ex_mark`.
        ex_stamp: u32 = 0,
    }
}
