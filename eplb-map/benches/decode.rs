//! Decoding a DeepSeek-V3-sized placement (58 layers x 32 devices x 9 slots, N = 256) from the
//! expert-map JSON and from the blob.
#![allow(missing_docs)]

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use eplb_core::{Layout, Placement, Shape};
use eplb_map::{blob, map};

fn dsv3() -> (Shape, Vec<u16>) {
    let shape = Shape::new(58, 256, 32, 9).unwrap();
    let mut slots = vec![0u16; shape.placement_len()];
    Layout::Default.fill(&shape, &mut slots).unwrap();
    // Vary layers a little so that the JSON is not all one layout.
    for (l, layer) in slots.chunks_exact_mut(shape.slots_per_layer()).enumerate() {
        layer.rotate_left(l % 7);
    }
    (shape, slots)
}

fn bench(c: &mut Criterion) {
    let (shape, slots) = dsv3();
    let p = Placement::new(shape, &slots).unwrap();
    let json = map::to_json(&p);
    let blob = blob::to_vec(&p);
    eprintln!("json {} bytes, blob {} bytes", json.len(), blob.len());
    let strict = map::ReadOptions::strict().experts(256).ranks(32).layers(58);

    let mut g = c.benchmark_group("decode_dsv3_58x32x9");
    g.bench_function("json_read_strict", |b| {
        b.iter(|| map::read_map_json(black_box(json.as_bytes()), &strict).unwrap())
    });
    let mut out = vec![0u16; shape.placement_len()];
    g.bench_function("blob_decode_into_buffer", |b| {
        b.iter(|| {
            blob::decode(black_box(&blob), &mut out).unwrap();
        })
    });
    g.bench_function("blob_header_only", |b| {
        b.iter(|| blob::header(black_box(&blob)).unwrap())
    });
    g.finish();

    let mut g = c.benchmark_group("encode_dsv3_58x32x9");
    g.bench_function("json_write", |b| b.iter(|| map::to_json(black_box(&p))));
    let mut buf = vec![0u8; blob::max_encoded_len(&shape)];
    g.bench_function("blob_encode_into_buffer", |b| {
        b.iter(|| blob::encode(black_box(&p), &mut buf).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
