//! The placement blob: a versioned postcard encoding of a [`Placement`] with its [`Shape`], for
//! the AICPU and for hand-over between processes. The byte layout is in `SPEC.md`.
//!
//! [`encode`] writes into a caller's byte slice and [`decode`] reads into a caller's `u16` slice;
//! neither allocates. [`header`] reads just the shape, so a caller can size its buffer first
//! ([`Shape::placement_len`]). With the `std` feature, `to_vec` and `from_bytes` wrap them.

use eplb_core::{Placement, Shape};
use serde::{Deserialize, Serialize};

use crate::Error;

/// The first four bytes of every blob.
pub const MAGIC: [u8; 4] = *b"EPLB";

/// The format version this build writes and reads.
pub const VERSION: u8 = 1;

/// Bytes of the CRC-32 trailer.
const CRC_LEN: usize = 4;

/// Upper bound of the header: magic, version, six `u16` varints, the `u64` length varint.
const HEADER_MAX: usize = 4 + 1 + 6 * 3 + 10;

#[derive(Serialize, Deserialize)]
struct ShapeHeader {
    layers: u16,
    experts: u16,
    ranks: u16,
    slots_per_rank: u16,
    ranks_per_node: u16,
    groups: u16,
}

impl ShapeHeader {
    fn of(shape: &Shape) -> Self {
        // Every dimension of a `Shape` came from a `u16`.
        let narrow = |v: usize| u16::try_from(v).unwrap_or(u16::MAX);
        Self {
            layers: narrow(shape.layers()),
            experts: narrow(shape.experts()),
            ranks: narrow(shape.ranks()),
            slots_per_rank: narrow(shape.slots_per_rank()),
            ranks_per_node: narrow(shape.ranks_per_node()),
            groups: narrow(shape.groups()),
        }
    }

    fn fields(&self) -> [u16; 6] {
        [
            self.layers,
            self.experts,
            self.ranks,
            self.slots_per_rank,
            self.ranks_per_node,
            self.groups,
        ]
    }
}

#[derive(Serialize)]
struct BlobRef<'a> {
    magic: [u8; 4],
    version: u8,
    shape: ShapeHeader,
    slots: &'a [u16],
}

/// Bytes of the LEB128 varint of `v`, as postcard writes it.
const fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// An upper bound of the encoded size of any placement of `shape` (3 bytes per slot).
pub fn max_encoded_len(shape: &Shape) -> usize {
    shape
        .placement_len()
        .saturating_mul(3)
        .saturating_add(HEADER_MAX + CRC_LEN)
}

/// The exact encoded size of `placement`.
pub fn encoded_len(placement: &Placement<'_>) -> usize {
    let header = ShapeHeader::of(placement.shape());
    let mut n = MAGIC.len() + 1;
    for f in header.fields() {
        n += varint_len(u64::from(f));
    }
    let slots = placement.as_slice();
    n += varint_len(slots.len() as u64);
    for &s in slots {
        n += varint_len(u64::from(s));
    }
    n + CRC_LEN
}

/// Writes `placement` as a blob into `out`; returns the number of bytes written
/// ([`encoded_len`]). A short `out` is [`Error::BufferTooSmall`]; nothing allocates.
pub fn encode(placement: &Placement<'_>, out: &mut [u8]) -> Result<usize, Error> {
    let needed = encoded_len(placement);
    if out.len() < needed {
        return Err(Error::BufferTooSmall {
            what: "placement blob",
            needed,
            got: out.len(),
        });
    }
    let blob = BlobRef {
        magic: MAGIC,
        version: VERSION,
        shape: ShapeHeader::of(placement.shape()),
        slots: placement.as_slice(),
    };
    let got = out.len();
    let used = postcard::to_slice(&blob, out)
        .map_err(|_| Error::BufferTooSmall {
            what: "placement blob",
            needed,
            got,
        })?
        .len();
    let crc = crc32(out.get(..used).unwrap_or(&[]));
    let tail = out
        .get_mut(used..used + CRC_LEN)
        .ok_or(Error::BufferTooSmall {
            what: "placement blob",
            needed,
            got: used,
        })?;
    tail.copy_from_slice(&crc.to_le_bytes());
    Ok(used + CRC_LEN)
}

/// A cursor over the input that keeps the byte offset for errors.
struct Reader<'b> {
    bytes: &'b [u8],
    offset: usize,
}

impl<'b> Reader<'b> {
    fn take<T: Deserialize<'b>>(&mut self, what: &'static str) -> Result<T, Error> {
        let rest = self.bytes.get(self.offset..).unwrap_or(&[]);
        match postcard::take_from_bytes::<T>(rest) {
            Ok((v, left)) => {
                self.offset = self.bytes.len() - left.len();
                Ok(v)
            }
            Err(postcard::Error::DeserializeUnexpectedEnd) => Err(Error::Truncated {
                offset: self.offset,
                what,
            }),
            Err(_) => Err(Error::BadVarint {
                offset: self.offset,
                what,
            }),
        }
    }
}

impl Reader<'_> {
    /// One postcard `u16` (LEB128, at most 3 bytes), decoded by hand: the hot loop of [`decode`].
    /// Accepts exactly what postcard's `u16` accepts.
    fn varint_u16(&mut self, what: &'static str) -> Result<u16, Error> {
        let start = self.offset;
        let mut value: u32 = 0;
        for i in 0..3 {
            let Some(&byte) = self.bytes.get(self.offset) else {
                return Err(Error::Truncated {
                    offset: self.offset,
                    what,
                });
            };
            self.offset += 1;
            value |= u32::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return u16::try_from(value).map_err(|_| Error::BadVarint {
                    offset: start,
                    what,
                });
            }
        }
        Err(Error::BadVarint {
            offset: start,
            what,
        })
    }
}

/// Reads magic, version, shape and slot count; leaves the reader at the first slot.
fn read_header(r: &mut Reader<'_>) -> Result<(Shape, usize), Error> {
    if r.bytes.len() < MAGIC.len() {
        let mut found = [0u8; 4];
        for (f, &b) in found.iter_mut().zip(r.bytes) {
            *f = b;
        }
        if !MAGIC.starts_with(r.bytes) {
            return Err(Error::BadMagic { found });
        }
        return Err(Error::Truncated {
            offset: r.bytes.len(),
            what: "magic",
        });
    }
    let magic: [u8; 4] = r.take("magic")?;
    if magic != MAGIC {
        return Err(Error::BadMagic { found: magic });
    }
    let version: u8 = r.take("version")?;
    if version != VERSION {
        return Err(Error::UnsupportedVersion {
            found: version,
            supported: VERSION,
        });
    }
    let h: ShapeHeader = r.take("shape header")?;
    let shape = Shape::with_topology(
        h.layers,
        h.experts,
        h.ranks,
        h.slots_per_rank,
        h.ranks_per_node,
        h.groups,
    )?;
    let count: u64 = r.take("slot count")?;
    let expected = shape.placement_len();
    if count != expected as u64 {
        return Err(Error::SlotCount {
            expected: expected as u64,
            got: count,
        });
    }
    Ok((shape, expected))
}

/// Reads the shape from a blob's header, so that the caller can size the buffer for [`decode`]
/// (`shape.placement_len()` ids). Checks magic, version and the shape only.
pub fn header(bytes: &[u8]) -> Result<Shape, Error> {
    let mut r = Reader { bytes, offset: 0 };
    read_header(&mut r).map(|(shape, _)| shape)
}

/// Decodes a blob into `out` (at least `shape.placement_len()` ids; see [`header`]) and returns
/// the placement as a view of the front of `out`. Nothing allocates.
///
/// Checks, in order: magic, version, shape, slot count, buffer size, every id, the CRC-32, no
/// trailing bytes, and the placement's structure (ids below `N`, every expert present).
/// Co-located copies are structurally valid and are accepted; see
/// [`Placement::colocated_rows`].
pub fn decode<'o>(bytes: &[u8], out: &'o mut [u16]) -> Result<Placement<'o>, Error> {
    let mut r = Reader { bytes, offset: 0 };
    let (shape, count) = read_header(&mut r)?;
    if out.len() < count {
        return Err(Error::BufferTooSmall {
            what: "placement ids",
            needed: count,
            got: out.len(),
        });
    }
    for o in out.iter_mut().take(count) {
        *o = r.varint_u16("placement slots")?;
    }
    let body_end = r.offset;
    let stored: [u8; 4] = r.take("checksum")?;
    let stored = u32::from_le_bytes(stored);
    let computed = crc32(bytes.get(..body_end).unwrap_or(&[]));
    if stored != computed {
        return Err(Error::Checksum { stored, computed });
    }
    if r.offset < bytes.len() {
        return Err(Error::TrailingBytes {
            offset: r.offset,
            count: bytes.len() - r.offset,
        });
    }
    let out: &'o [u16] = out;
    let slots = out.get(..count).unwrap_or(&[]);
    Ok(Placement::new(shape, slots)?)
}

/// Encodes `placement` into a new vector.
#[cfg(feature = "std")]
pub fn to_vec(placement: &Placement<'_>) -> std::vec::Vec<u8> {
    let mut v = std::vec![0u8; encoded_len(placement)];
    // `v` has exactly `encoded_len` bytes, so `encode` cannot fail; keep whatever it wrote.
    let n = encode(placement, &mut v).unwrap_or(0);
    v.truncate(n);
    v
}

/// Decodes a blob into an owned placement.
#[cfg(feature = "std")]
pub fn from_bytes(bytes: &[u8]) -> Result<crate::OwnedPlacement, Error> {
    let shape = header(bytes)?;
    let mut slots = std::vec![0u16; shape.placement_len()];
    decode(bytes, &mut slots)?;
    crate::OwnedPlacement::new(shape, slots)
}

/// CRC-32 (IEEE 802.3, reflected polynomial `0xEDB88320`, as zlib's `crc32`).
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        let i = ((crc ^ u32::from(b)) & 0xff) as usize;
        crc = CRC_TABLE.get(i).copied().unwrap_or(0) ^ (crc >> 8);
    }
    !crc
}

#[allow(clippy::indexing_slicing)] // compile-time table, indices below 256
const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn varint_lengths() {
        assert_eq!(varint_len(0), 1);
        assert_eq!(varint_len(127), 1);
        assert_eq!(varint_len(128), 2);
        assert_eq!(varint_len(16383), 2);
        assert_eq!(varint_len(16384), 3);
        assert_eq!(varint_len(u64::from(u16::MAX)), 3);
    }
}
