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

/// A buffer size in words, computed with saturating arithmetic: a size that overflows `usize`
/// stays at `usize::MAX`, above every limit, so a shape too large for memory becomes an
/// [`Error::TooLarge`] from [`crate::buffer_lens`], never a wrapped (too small) size.
///
/// Each policy computes its scratch and state sizes in this type, in one function per buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Words(pub usize);

impl Words {
    /// The count as a `usize` (`usize::MAX` when it overflowed).
    pub const fn get(self) -> usize {
        self.0
    }
    /// Words for this many `f64` values.
    pub const fn f64s(self) -> Words {
        self
    }
    /// Words for this many `u64` values (the count itself).
    pub const fn words(self) -> Words {
        self
    }
    /// Words for this many `u32` values.
    pub const fn u32s(self) -> Words {
        Words(self.0.div_ceil(2))
    }
    /// Words for this many `u16` values.
    pub const fn u16s(self) -> Words {
        Words(self.0.div_ceil(4))
    }
    /// Words for this many flags (bytes).
    pub const fn flags(self) -> Words {
        Words(self.0.div_ceil(8))
    }
    /// `ceil(self / d)` (`d >= 1`).
    pub const fn div_ceil(self, d: usize) -> Words {
        if d == 0 {
            Words(usize::MAX)
        } else {
            Words(self.0.div_ceil(d))
        }
    }
    /// The smallest power of two `>= max(self, 1)` (`usize::MAX` when there is none).
    pub const fn next_power_of_two(self) -> Words {
        let n = if self.0 == 0 { 1 } else { self.0 };
        match n.checked_next_power_of_two() {
            Some(p) => Words(p),
            None => Words(usize::MAX),
        }
    }
}

impl core::ops::Add for Words {
    type Output = Words;
    fn add(self, o: Words) -> Words {
        Words(self.0.saturating_add(o.0))
    }
}
impl core::ops::Add<usize> for Words {
    type Output = Words;
    fn add(self, o: usize) -> Words {
        Words(self.0.saturating_add(o))
    }
}
impl core::ops::Mul for Words {
    type Output = Words;
    fn mul(self, o: Words) -> Words {
        Words(self.0.saturating_mul(o.0))
    }
}
impl core::ops::Mul<Words> for usize {
    type Output = Words;
    fn mul(self, o: Words) -> Words {
        Words(self.saturating_mul(o.0))
    }
}
