//! The initial placements vLLM-Ascend starts from.

use crate::placement::{check_len, validate_layer};
use crate::{Error, ExpertId, Shape};

/// Which initial layout to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// vLLM-Ascend HEAD's layout (PR #12650, matching upstream vLLM's weight loader): the flat
    /// list `[0..N-1] ++ [0..X-1] mod N`, reshaped row-major to `[R][S]`.
    #[default]
    Default,
    /// vLLM-Ascend 0.23's layout: `0..N-1` split into `R` contiguous groups (the first `N % R`
    /// one longer); redundant copy `i` goes to group `R-1 - i % R` and is the group's last id + 1
    /// (mod `N`). N=8, R=2, X=2 gives `[[0,1,2,3,4],[4,5,6,7,0]]`.
    Contiguous,
}

impl Layout {
    /// Writes this layout for every layer of `shape` into `out` (`[L][R][S]`).
    pub fn fill(self, shape: &Shape, out: &mut [ExpertId]) -> Result<(), Error> {
        check_len("placement [L][R][S]", shape.placement_len(), out.len())?;
        let per_layer = shape.slots_per_layer();
        let mut chunks = out.chunks_exact_mut(per_layer);
        let Some(first) = chunks.next() else {
            return Ok(());
        };
        self.fill_layer(shape, first)?;
        for chunk in chunks {
            chunk.copy_from_slice(first);
        }
        Ok(())
    }

    /// Writes this layout for one layer (`[R][S]`) into `out`.
    pub fn fill_layer(self, shape: &Shape, out: &mut [ExpertId]) -> Result<(), Error> {
        check_len("placement layer [R][S]", shape.slots_per_layer(), out.len())?;
        let n = shape.experts();
        match self {
            Layout::Default => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = (i % n) as ExpertId;
                }
            }
            Layout::Contiguous => contiguous(shape, out)?,
        }
        validate_layer(shape, 0, out, None).map(|_| ())
    }
}

fn contiguous(shape: &Shape, out: &mut [ExpertId]) -> Result<(), Error> {
    let (n, r, s) = (shape.experts(), shape.ranks(), shape.slots_per_rank());
    let x = shape.redundant();
    let (base, extra) = (n / r, n % r);
    for (g, row) in out.chunks_exact_mut(s).enumerate() {
        let start = g * base + g.min(extra);
        let len = base + usize::from(g < extra);
        let mut filled: usize = 0;
        for (o, e) in row.iter_mut().zip(start..start + len) {
            *o = e as ExpertId;
            filled += 1;
        }
        // Redundant copies i with R-1 - i%R == g, in increasing i.
        let mut i = r - 1 - g;
        while i < x {
            let value = match filled.checked_sub(1).and_then(|k| row.get(k)) {
                Some(&last) => (usize::from(last) + 1) % n,
                // vLLM-Ascend 0.23's branch for an empty group.
                None => i % r + 1,
            };
            let slot = row.get_mut(filled).ok_or(Error::Overflow {
                what: "contiguous layout row",
            })?;
            *slot = u16::try_from(value).map_err(|_| Error::Overflow {
                what: "contiguous layout id",
            })?;
            filled += 1;
            i += r;
        }
        if filled != s {
            return Err(Error::Length {
                what: "contiguous layout row",
                expected: s,
                got: filled,
            });
        }
    }
    Ok(())
}
