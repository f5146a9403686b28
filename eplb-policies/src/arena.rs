//! Carving typed buffers out of the caller's `u64` scratch, without `unsafe`.

use crate::Error;

/// Words (`u64`) needed for `n` `f64` values.
pub const fn words_f64(n: usize) -> usize {
    n
}
/// Words (`u64`) needed for `n` `u32` values.
pub const fn words_u32(n: usize) -> usize {
    n.div_ceil(2)
}
/// Words (`u64`) needed for `n` `u16` values.
pub const fn words_u16(n: usize) -> usize {
    n.div_ceil(4)
}

/// A bump allocator over a caller's `u64` slice: each take splits off the front.
///
/// The sizes a policy takes must add up to what its `scratch_len` promised; taking more is
/// [`Error::Scratch`], never a panic.
#[derive(Debug)]
pub struct Arena<'a> {
    rest: &'a mut [u64],
    taken: usize,
}

impl<'a> Arena<'a> {
    /// An arena over `buf`.
    pub fn new(buf: &'a mut [u64]) -> Self {
        Self {
            rest: buf,
            taken: 0,
        }
    }

    /// Words taken so far.
    pub fn taken(&self) -> usize {
        self.taken
    }

    /// Words left.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// `n` raw words.
    pub fn words(&mut self, n: usize) -> Result<&'a mut [u64], Error> {
        let rest = core::mem::take(&mut self.rest);
        if n > rest.len() {
            let have = rest.len();
            self.rest = rest;
            return Err(Error::Scratch {
                needed: self.taken + n,
                got: self.taken + have,
            });
        }
        let (head, tail) = rest.split_at_mut(n);
        self.rest = tail;
        self.taken += n;
        Ok(head)
    }

    /// `n` `f64` values, zeroed.
    pub fn f64s(&mut self, n: usize) -> Result<&'a mut [f64], Error> {
        let w = self.words(words_f64(n))?;
        let v: &mut [f64] = bytemuck::cast_slice_mut(w);
        v.fill(0.0);
        Ok(v)
    }

    /// `n` `u32` values, zeroed.
    pub fn u32s(&mut self, n: usize) -> Result<&'a mut [u32], Error> {
        let w = self.words(words_u32(n))?;
        let v: &mut [u32] = bytemuck::cast_slice_mut(w);
        let v = v.get_mut(..n).unwrap_or_default();
        v.fill(0);
        Ok(v)
    }

    /// `n` `u16` values, zeroed.
    pub fn u16s(&mut self, n: usize) -> Result<&'a mut [u16], Error> {
        let w = self.words(words_u16(n))?;
        let v: &mut [u16] = bytemuck::cast_slice_mut(w);
        let v = v.get_mut(..n).unwrap_or_default();
        v.fill(0);
        Ok(v)
    }

    /// `n` flags, cleared.
    pub fn bools(&mut self, n: usize) -> Result<&'a mut [u8], Error> {
        let w = self.words(n.div_ceil(8))?;
        let v: &mut [u8] = bytemuck::cast_slice_mut(w);
        let v = v.get_mut(..n).unwrap_or_default();
        v.fill(0);
        Ok(v)
    }
}
