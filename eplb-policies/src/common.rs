//! Pieces shared by several policies.

use crate::Error;

/// Marks an empty slot while a row is rebuilt (ids are below `N <= u16::MAX`).
const EMPTY: u16 = u16::MAX;

/// vLLM-Ascend's "local-constraint exchange" for one rank (`research/vllm-ascend-eplb.md` §3.2
/// step 8): every id of `new_row` that `old_row` held keeps its old slot (each old slot claimed
/// once); the other ids fill the remaining slots left to right, in their `new_row` order.
/// `tmp` needs `2 * S` values. The rank's expert *set* is unchanged.
pub fn keep_slots(old_row: &[u16], new_row: &mut [u16], tmp: &mut [u16]) -> Result<(), Error> {
    let s = new_row.len();
    if old_row.len() != s {
        return Err(eplb_core::Error::Length {
            what: "old rank row",
            expected: s,
            got: old_row.len(),
        }
        .into());
    }
    let Some((result, rest)) = tmp.split_at_mut_checked(s) else {
        return Err(Error::Scratch {
            needed: 2 * s,
            got: tmp.len(),
        });
    };
    let Some(leftovers) = rest.get_mut(..s) else {
        return Err(Error::Scratch {
            needed: 2 * s,
            got: tmp.len(),
        });
    };
    result.fill(EMPTY);
    let mut n_left = 0;
    for &id in new_row.iter() {
        let slot = old_row
            .iter()
            .zip(result.iter())
            .position(|(&o, &r)| o == id && r == EMPTY);
        match slot.and_then(|j| result.get_mut(j)) {
            Some(r) => *r = id,
            None => {
                if let Some(x) = leftovers.get_mut(n_left) {
                    *x = id;
                    n_left += 1;
                }
            }
        }
    }
    let mut next = leftovers.iter().take(n_left);
    for r in result.iter_mut() {
        if *r == EMPTY
            && let Some(&id) = next.next()
        {
            *r = id;
        }
    }
    new_row.copy_from_slice(result);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_experts_keep_their_slot() {
        let mut tmp = [0u16; 6];
        let mut row = [5, 0, 7];
        keep_slots(&[0, 1, 2], &mut row, &mut tmp).unwrap();
        assert_eq!(row, [0, 5, 7]);
        let mut row = [2, 1, 0];
        keep_slots(&[0, 1, 2], &mut row, &mut tmp).unwrap();
        assert_eq!(row, [0, 1, 2]);
        let mut row = [9, 8, 7];
        keep_slots(&[0, 1, 2], &mut row, &mut tmp).unwrap();
        assert_eq!(row, [9, 8, 7]);
        assert!(keep_slots(&[0, 1, 2], &mut row, &mut [0u16; 5]).is_err());
    }
}
