//! cubecrypt's cost per sealed byte: `seal_wal` and `open_wal` of a 1 KiB
//! record payload, and `seal_block` of a 64 KiB checkpoint block. The target
//! (issue 7) is a 1 KiB seal in <= 0.5 us, which needs ring's AES-NI and
//! carry-less-multiply code paths. Keys are derived before timing: a warm
//! keyring is what the writer sees. Figures go to `docs/benchmarks.md`.
#![allow(clippy::unwrap_used)]

#[path = "support/cpu_time.rs"]
mod cpu_time;

use std::hint::black_box;
use std::time::Duration;

use cpu_time::CpuTime;
use criterion::{BatchSize, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use cube_store::crypto::{Keyring, MasterKey, TAG_BYTES};

const NS: u64 = 7;
/// Any nonzero start id: the daemon draws a random one.
const START: u64 = 0x0123_4567_89ab_cdef;
/// Stands in for a record header: authenticated, not encrypted.
const AAD: &[u8] = &[0x5a; 24];
const RECORD: usize = 1024;
const BLOCK: usize = 64 * 1024;

fn keyring() -> Keyring {
    let keyring = Keyring::new(Some(MasterKey::from_bytes([0x42; 32])), START);
    // Derive and cache the namespace's keys outside the timed loops.
    let mut warm = vec![0u8; 16];
    keyring.seal_block(NS, AAD, &mut warm).unwrap();
    keyring
}

fn seal_and_open(c: &mut Criterion<CpuTime>) {
    let keyring = keyring();
    let mut group = c.benchmark_group("cubecrypt");
    group.sampling_mode(SamplingMode::Flat);

    group.throughput(Throughput::Bytes(RECORD as u64));
    group.bench_function("seal_wal 1 KiB", |b| {
        let mut buf = vec![0xa5u8; RECORD + TAG_BYTES];
        let mut lsn = 0u64;
        b.iter(|| {
            // Back to 1 KiB (re-sealing ciphertext costs the same as
            // plaintext) and a fresh LSN, as the writer would.
            buf.truncate(RECORD);
            lsn += 1;
            keyring
                .seal_wal(NS, START, lsn, black_box(AAD), &mut buf)
                .unwrap();
            black_box(&buf);
        });
    });

    let mut sealed = vec![0xa5u8; RECORD];
    keyring.seal_wal(NS, START, 1, AAD, &mut sealed).unwrap();
    group.bench_function("open_wal 1 KiB", |b| {
        // The copy is set-up, outside the timing: opening decrypts in place.
        b.iter_batched_ref(
            || sealed.clone(),
            |buf| {
                let n = keyring.open_wal(NS, START, 1, black_box(AAD), buf).unwrap();
                black_box(n)
            },
            BatchSize::SmallInput,
        );
    });

    group.throughput(Throughput::Bytes(BLOCK as u64));
    group.bench_function("seal_block 64 KiB", |b| {
        let mut buf = vec![0xa5u8; BLOCK + TAG_BYTES];
        b.iter(|| {
            buf.truncate(BLOCK);
            black_box(keyring.seal_block(NS, black_box(AAD), &mut buf).unwrap());
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .with_measurement(CpuTime::new())
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = seal_and_open
}
criterion_main!(benches);
