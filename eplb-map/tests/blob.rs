//! The placement blob: golden bytes (pinned by `SPEC.md`), round trips and every decode error.

use eplb_core::{Placement, Shape};
use eplb_map::{Error, blob};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The §4 fixture: N = 8, R = 2, S = 5, ranks per node 2, one group.
fn fixture() -> (Shape, Vec<u16>) {
    (
        Shape::with_topology(1, 8, 2, 5, 2, 1).unwrap(),
        vec![7, 2, 0, 3, 5, 6, 1, 4, 7, 2],
    )
}

/// Independently computed (Python: LEB128 varints and `zlib.crc32`); also in `SPEC.md`.
const FIXTURE_BLOB: &str = "45504c42010108020502010a070200030506010407024ca4b85b";

#[test]
fn golden_bytes() {
    let (shape, slots) = fixture();
    let p = Placement::new(shape, &slots).unwrap();
    let mut buf = [0u8; 64];
    let n = blob::encode(&p, &mut buf).unwrap();
    assert_eq!(&buf[..n], hex(FIXTURE_BLOB).as_slice());
    assert_eq!(n, blob::encoded_len(&p));
    assert!(n <= blob::max_encoded_len(&shape));
    assert_eq!(blob::to_vec(&p), hex(FIXTURE_BLOB));
}

#[test]
fn golden_bytes_with_two_byte_varints() {
    // 1 layer, 200 experts on one rank: ids >= 128 take two bytes.
    let shape = Shape::new(1, 200, 1, 200).unwrap();
    let slots: Vec<u16> = (0..200).collect();
    let p = Placement::new(shape, &slots).unwrap();
    let b = blob::to_vec(&p);
    assert_eq!(b.len(), 291);
    assert_eq!(&b[..16], hex("45504c420101c80101c8010101c80100").as_slice());
    assert_eq!(&b[b.len() - 8..], hex("c601c701cbd9d69d").as_slice());
}

#[test]
fn decode_into_a_caller_buffer() {
    let bytes = hex(FIXTURE_BLOB);
    let shape = blob::header(&bytes).unwrap();
    assert_eq!(shape, fixture().0);
    let mut out = vec![0u16; shape.placement_len() + 3];
    let p = blob::decode(&bytes, &mut out).unwrap();
    assert_eq!(p.as_slice(), fixture().1.as_slice());
    assert_eq!(*p.shape(), shape);
    let owned = blob::from_bytes(&bytes).unwrap();
    assert_eq!(owned.as_slice(), fixture().1.as_slice());
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = hex(FIXTURE_BLOB);
    let mut out = [0u16; 16];
    for cut in 0..bytes.len() {
        let e = blob::decode(&bytes[..cut], &mut out).unwrap_err();
        assert!(matches!(e, Error::Truncated { .. }), "cut at {cut}: {e:?}");
    }
    assert_eq!(
        blob::decode(&bytes[..20], &mut out).unwrap_err(),
        Error::Truncated {
            offset: 20,
            what: "placement slots"
        }
    );
}

#[test]
fn bad_magic_version_checksum_trailing_and_buffers() {
    let good = hex(FIXTURE_BLOB);
    let mut out = [0u16; 16];

    let mut b = good.clone();
    b[0] = b'X';
    assert_eq!(
        blob::decode(&b, &mut out).unwrap_err(),
        Error::BadMagic { found: *b"XPLB" }
    );
    assert_eq!(
        blob::decode(b"{\"", &mut out).unwrap_err(),
        Error::BadMagic {
            found: [b'{', b'"', 0, 0]
        }
    );

    let mut b = good.clone();
    b[4] = 2;
    assert_eq!(
        blob::decode(&b, &mut out).unwrap_err(),
        Error::UnsupportedVersion {
            found: 2,
            supported: 1
        }
    );

    let mut b = good.clone();
    b[14] = 3; // slot 2: expert 0 -> 3; the checksum is checked first
    assert!(matches!(
        blob::decode(&b, &mut out).unwrap_err(),
        Error::Checksum { .. }
    ));

    let mut b = good.clone();
    b.push(0);
    assert_eq!(
        blob::decode(&b, &mut out).unwrap_err(),
        Error::TrailingBytes {
            offset: 26,
            count: 1
        }
    );

    assert_eq!(
        blob::decode(&good, &mut out[..9]).unwrap_err(),
        Error::BufferTooSmall {
            what: "placement ids",
            needed: 10,
            got: 9
        }
    );
    let (shape, slots) = fixture();
    let p = Placement::new(shape, &slots).unwrap();
    let mut small = [0u8; 25];
    assert_eq!(
        blob::encode(&p, &mut small).unwrap_err(),
        Error::BufferTooSmall {
            what: "placement blob",
            needed: 26,
            got: 25
        }
    );
}

#[test]
fn header_errors() {
    let mut out = [0u16; 16];
    // Zero layers.
    let mut b = hex(FIXTURE_BLOB);
    b[5] = 0;
    assert_eq!(
        blob::decode(&b, &mut out).unwrap_err(),
        Error::Core(eplb_core::Error::ZeroDimension { what: "layers" })
    );
    // Slot count 11 instead of 10.
    let mut b = hex(FIXTURE_BLOB);
    b[11] = 11;
    assert_eq!(
        blob::decode(&b, &mut out).unwrap_err(),
        Error::SlotCount {
            expected: 10,
            got: 11
        }
    );
    // A u16 varint with a third byte that overflows.
    let mut b = hex(FIXTURE_BLOB);
    b.splice(6..7, [0xff, 0xff, 0x7f]);
    assert_eq!(
        blob::decode(&b, &mut out).unwrap_err(),
        Error::BadVarint {
            offset: 5,
            what: "shape header"
        }
    );
}

#[test]
fn slot_varints_are_checked() {
    let mut out = [0u16; 16];
    // Slot 0 as a 3-byte varint above u16::MAX.
    let mut b = hex(FIXTURE_BLOB);
    b.splice(12..13, [0xff, 0xff, 0x7f]);
    assert_eq!(
        blob::decode(&b, &mut out).unwrap_err(),
        Error::BadVarint {
            offset: 12,
            what: "placement slots"
        }
    );
    // A 4-byte varint.
    let mut b = hex(FIXTURE_BLOB);
    b.splice(12..13, [0x87, 0x80, 0x80, 0x00]);
    assert!(matches!(
        blob::decode(&b, &mut out).unwrap_err(),
        Error::BadVarint { offset: 12, .. }
    ));
    // An over-long but in-range varint (7 as 87 80 00), with its checksum, is accepted as
    // postcard accepts it; re-encoding gives the minimal form.
    let mut b = hex(FIXTURE_BLOB);
    b.truncate(b.len() - 4);
    b.splice(12..13, [0x87, 0x80, 0x00]);
    let crc = blob::crc32(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    let p = blob::decode(&b, &mut out).unwrap();
    assert_eq!(p.as_slice(), fixture().1.as_slice());
    assert_eq!(blob::to_vec(&p), hex(FIXTURE_BLOB));
}

#[test]
fn a_structurally_invalid_body_with_a_right_checksum_is_rejected() {
    // Expert 3 replaced by 2 everywhere, checksum recomputed: expert 3 is missing.
    let mut b = hex(FIXTURE_BLOB);
    b.truncate(b.len() - 4);
    b[15] = 2;
    let crc = blob::crc32(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    let mut out = [0u16; 16];
    assert_eq!(
        blob::decode(&b, &mut out).unwrap_err(),
        Error::Core(eplb_core::Error::MissingExpert {
            layer: 0,
            expert: 3
        })
    );
}

#[test]
fn colocated_copies_decode_and_are_counted() {
    let shape = Shape::new(1, 4, 2, 3).unwrap();
    let slots = [0, 1, 0, 2, 3, 1];
    let p = Placement::new(shape, &slots).unwrap();
    let b = blob::to_vec(&p);
    let mut out = [0u16; 6];
    let q = blob::decode(&b, &mut out).unwrap();
    assert_eq!(q.colocated_rows(), 1);
}
