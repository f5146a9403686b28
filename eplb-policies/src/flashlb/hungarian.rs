//! A minimum-cost perfect assignment on a square matrix (the Hungarian method, in its
//! shortest-augmenting-path form with row and column potentials), over caller scratch.
//!
//! Rows are added one at a time; each addition runs a Dijkstra-like search over the columns with
//! reduced costs until it reaches a free column, then flips the alternating path. `O(n^3)` in
//! the worst case, `O(n^2)` when every row's cheapest reduced column is free (the common case
//! for FlashLB, where most new rows share experts with one old row only). Ties are resolved by
//! the lowest column index, so the result is deterministic.

use crate::Error;
use crate::arena::{Arena, Words};

/// Scratch of [`assign`] for `n x n`.
pub(super) struct Hungarian<'a> {
    u: &'a mut [f64],
    v: &'a mut [f64],
    minv: &'a mut [f64],
    /// Row (1-based, 0 = none) matched to each column (1-based; index 0 is the virtual column).
    p: &'a mut [u16],
    way: &'a mut [u16],
    used: &'a mut [u8],
}

impl<'a> Hungarian<'a> {
    /// Words needed for `n x n`.
    /// Scratch words for `n` (checked: saturates, see [`Words`]).
    pub(super) fn words(n: Words) -> Words {
        3 * (n + 1).f64s() + 2 * (n + 1).u16s() + (n + 1).flags()
    }

    pub(super) fn take(arena: &mut Arena<'a>, n: usize) -> Result<Self, Error> {
        Ok(Self {
            u: arena.f64s(n + 1)?,
            v: arena.f64s(n + 1)?,
            minv: arena.f64s(n + 1)?,
            p: arena.u16s(n + 1)?,
            way: arena.u16s(n + 1)?,
            used: arena.bools(n + 1)?,
        })
    }
}

fn at<T: Copy + Default>(s: &[T], i: usize) -> T {
    s.get(i).copied().unwrap_or_default()
}

fn put<T>(s: &mut [T], i: usize, v: T) {
    if let Some(x) = s.get_mut(i) {
        *x = v;
    }
}

/// Solves `min sum cost[i][assign[i]]` over permutations for the row-major `n x n` `cost`,
/// writing the column of each row to `assign` (`[n]`). `n` must fit `u16` minus one.
pub(super) fn assign(
    cost: &[f64],
    n: usize,
    h: &mut Hungarian<'_>,
    assign: &mut [u16],
) -> Result<(), Error> {
    if cost.len() != n * n || assign.len() != n || h.p.len() != n + 1 || n >= usize::from(u16::MAX)
    {
        return Err(Error::NoPlacement {
            layer: 0,
            why: "assignment buffers do not match the matrix",
        });
    }
    h.u.fill(0.0);
    h.v.fill(0.0);
    h.p.fill(0);
    h.way.fill(0);
    for i in 1..=n {
        put(h.p, 0, i as u16);
        let mut j0 = 0usize;
        h.minv.fill(f64::INFINITY);
        h.used.fill(0);
        loop {
            put(h.used, j0, 1);
            let i0 = usize::from(at(h.p, j0));
            let row = cost
                .get(i0.saturating_sub(1) * n..i0 * n)
                .unwrap_or_default();
            let ui0 = at(h.u, i0);
            let mut delta = f64::INFINITY;
            let mut j1 = 0usize;
            for (j, (((mv, &vj), &used), w)) in h
                .minv
                .iter_mut()
                .zip(h.v.iter())
                .zip(h.used.iter())
                .zip(h.way.iter_mut())
                .enumerate()
                .skip(1)
            {
                if used != 0 {
                    continue;
                }
                let c = at(row, j - 1) - ui0 - vj;
                if c < *mv {
                    *mv = c;
                    *w = j0 as u16;
                }
                // On ties prefer a free column: the search ends there.
                if *mv < delta || (*mv == delta && at(h.p, j) == 0 && at(h.p, j1) != 0) {
                    delta = *mv;
                    j1 = j;
                }
            }
            if j1 == 0 {
                return Err(Error::NoPlacement {
                    layer: 0,
                    why: "assignment search found no column",
                });
            }
            for (j, ((&used, vj), mv)) in h
                .used
                .iter()
                .zip(h.v.iter_mut())
                .zip(h.minv.iter_mut())
                .enumerate()
            {
                if used != 0 {
                    let pj = usize::from(at(h.p, j));
                    if let Some(u) = h.u.get_mut(pj) {
                        *u += delta;
                    }
                    *vj -= delta;
                } else {
                    *mv -= delta;
                }
            }
            j0 = j1;
            if at(h.p, j0) == 0 {
                break;
            }
        }
        loop {
            let j1 = usize::from(at(h.way, j0));
            put(h.p, j0, at(h.p, j1));
            j0 = j1;
            if j0 == 0 {
                break;
            }
        }
    }
    for (j, &row) in h.p.iter().enumerate().skip(1) {
        put(assign, usize::from(row).wrapping_sub(1), (j - 1) as u16);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    fn brute(cost: &[f64], n: usize) -> f64 {
        fn go(cost: &[f64], n: usize, row: usize, used: &mut Vec<bool>) -> f64 {
            if row == n {
                return 0.0;
            }
            let mut best = f64::INFINITY;
            for j in 0..n {
                if !used[j] {
                    used[j] = true;
                    best = best.min(cost[row * n + j] + go(cost, n, row + 1, used));
                    used[j] = false;
                }
            }
            best
        }
        go(cost, n, 0, &mut vec![false; n])
    }

    #[test]
    fn matches_brute_force() {
        let mut x = 12345u64;
        for n in 1..=7 {
            for _ in 0..30 {
                let cost: Vec<f64> = (0..n * n)
                    .map(|_| {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ((x >> 33) % 6) as f64
                    })
                    .collect();
                let mut buf = vec![0u64; Hungarian::words(Words(n)).get()];
                let mut arena = Arena::new(&mut buf);
                let mut h = Hungarian::take(&mut arena, n).unwrap();
                assert_eq!(arena.remaining(), 0);
                let mut a = vec![0u16; n];
                assign(&cost, n, &mut h, &mut a).unwrap();
                let mut seen = vec![false; n];
                let mut total = 0.0;
                for (i, &j) in a.iter().enumerate() {
                    assert!(!seen[j as usize]);
                    seen[j as usize] = true;
                    total += cost[i * n + j as usize];
                }
                assert_eq!(total, brute(&cost, n));
            }
        }
    }
}
