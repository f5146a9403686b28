//! The placement blob decoder: never panics; whatever it accepts encodes back to a blob that
//! decodes to the same placement.
#![no_main]

use eplb_map::blob;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = blob::header(data);
    let mut small = [0u16; 16];
    let _ = blob::decode(data, &mut small);
    let mut out = vec![0u16; 1 << 16];
    if let Ok(p) = blob::decode(data, &mut out) {
        let shape = *p.shape();
        let slots = p.as_slice().to_vec();
        let mut buf = vec![0u8; blob::max_encoded_len(&shape)];
        let n = blob::encode(&p, &mut buf).expect("fits max_encoded_len");
        assert_eq!(n, blob::encoded_len(&p));
        let mut again = vec![0u16; shape.placement_len()];
        let q = blob::decode(&buf[..n], &mut again).expect("re-encoded blob decodes");
        assert_eq!(q.as_slice(), slots.as_slice());
        assert_eq!(*q.shape(), shape);
        // A canonical blob (as we write them) is byte-identical.
        if n == data.len() {
            assert_eq!(&buf[..n], data);
        }
    }
});
