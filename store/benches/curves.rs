//! Curve encode/decode cost per coordinate, for both curves and both
//! Morton bit-spreading methods. Each iteration converts a batch of 4096
//! coordinates, so figures are throughput (ns per coordinate with the CPU
//! overlapping independent coordinates), which is how scans and bulk loads
//! use the curves; single-call latency is higher for Hilbert, whose table
//! walk is one dependent chain (see `docs/curve-bakeoff.md`). The `-batch`
//! cases convert the same coordinates through the slice API
//! (`hilbert_keys`, `Curve::keys`, ...), which walks several Hilbert keys
//! side by side.
#![allow(clippy::unwrap_used)]

#[path = "support/cpu_time.rs"]
mod cpu_time;

use std::hint::black_box;
use std::time::Duration;

use cpu_time::CpuTime;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use cube_protocol::Coord;
use cube_store::curve::{
    Curve, hilbert_decode, hilbert_decode_many, hilbert_key, hilbert_keys, morton_decode,
    morton_decode_magic, morton_key, morton_key_lut, morton_key_magic,
};

/// A named encoder, and a named decoder with the curve whose keys it reads.
type Encoder = (&'static str, fn(Coord) -> u128);
type Decoder = (&'static str, fn(u128) -> Coord, Curve);

const BATCH: usize = 4096;

/// xorshift64*: deterministic, dependency-free.
fn random_coords(seed: u64, span: Option<i32>) -> Vec<Coord> {
    let mut s = seed;
    let mut next = move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    (0..BATCH)
        .map(|_| {
            let mut axis = || match span {
                None => next() as i32,
                Some(span) => (next() % (2 * span as u64)) as i32 - span,
            };
            Coord::new(axis(), axis(), axis())
        })
        .collect()
}

fn encode(c: &mut Criterion<CpuTime>) {
    for (label, span) in [("full-range", None), ("near-origin", Some(500))] {
        let coords = random_coords(7, span);
        let mut group = c.benchmark_group(format!("encode/{label}"));
        group.sampling_mode(SamplingMode::Flat);
        group.throughput(Throughput::Elements(BATCH as u64));
        let encoders: [Encoder; 5] = [
            // The loop itself (an indirect call per coordinate and the
            // XOR), to read the others against: ~1.5-2 ns of each figure.
            ("harness", |c: Coord| (c.x ^ c.y ^ c.z) as u128),
            // `morton_key`: what stores and checkpoints call (BMI2 `pdep`
            // where fast, else `morton-lut`); the others are candidates.
            ("morton", morton_key),
            ("morton-lut", morton_key_lut),
            ("morton-magic", morton_key_magic),
            ("hilbert", hilbert_key),
        ];
        for (name, f) in encoders {
            group.bench_function(name, |b| {
                b.iter(|| {
                    let mut acc = 0u128;
                    for c in black_box(&coords) {
                        acc ^= f(*c);
                    }
                    acc
                })
            });
        }
        // The batch API: the whole slice in one call, keys written out
        // (no per-coordinate indirect call or XOR to subtract).
        let mut keys = vec![0u128; BATCH];
        group.bench_function("morton-batch", |b| {
            b.iter(|| Curve::Morton.keys(black_box(&coords), black_box(&mut keys)))
        });
        group.bench_function("hilbert-batch", |b| {
            b.iter(|| hilbert_keys(black_box(&coords), black_box(&mut keys)))
        });
        group.finish();
    }
}

fn decode(c: &mut Criterion<CpuTime>) {
    let coords = random_coords(11, None);
    let mut group = c.benchmark_group("decode/full-range");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(BATCH as u64));
    let decoders: [Decoder; 3] = [
        // `morton_decode` (BMI2 `pext` where fast); `morton-magic` is the
        // portable path it falls back to.
        ("morton", morton_decode, Curve::Morton),
        ("morton-magic", morton_decode_magic, Curve::Morton),
        ("hilbert", hilbert_decode, Curve::Hilbert),
    ];
    for (name, f, curve) in decoders {
        let keys: Vec<u128> = coords.iter().map(|c| curve.key(*c)).collect();
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut acc = 0i32;
                for k in black_box(&keys) {
                    let c = f(*k);
                    acc ^= c.x ^ c.y ^ c.z;
                }
                acc
            })
        });
    }
    let mut out = vec![Coord::new(0, 0, 0); BATCH];
    let keys: Vec<u128> = coords.iter().map(|c| morton_key(*c)).collect();
    group.bench_function("morton-batch", |b| {
        b.iter(|| Curve::Morton.decode_many(black_box(&keys), black_box(&mut out)))
    });
    let keys: Vec<u128> = coords.iter().map(|c| hilbert_key(*c)).collect();
    group.bench_function("hilbert-batch", |b| {
        b.iter(|| hilbert_decode_many(black_box(&keys), black_box(&mut out)))
    });
    group.finish();
}

/// One coordinate at a time, each depending on the last: latency, not
/// throughput.
fn encode_latency(c: &mut Criterion<CpuTime>) {
    let mut group = c.benchmark_group("encode-latency");
    group.sampling_mode(SamplingMode::Flat);
    for curve in Curve::ALL {
        group.bench_function(curve.name(), |b| {
            let mut coord = Coord::new(123_456, -98_765, 42);
            b.iter(|| {
                let key = curve.key(coord);
                // The next input depends on the whole key.
                coord = Coord::new(
                    coord.y,
                    coord.z,
                    (key ^ (key >> 37) ^ (key >> 71)) as i32 & 0x3ff,
                );
                key
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .with_measurement(CpuTime::new())
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = encode, decode, encode_latency
}
criterion_main!(benches);
