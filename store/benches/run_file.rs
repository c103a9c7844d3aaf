//! Run files (issue 32): a point read from the block cache, from the file
//! (every read misses the cache: `pread` from the page cache, CRC32C,
//! AES-GCM when sealed, and decoding the block), a `pread` of one block
//! alone (the floor of a read from the file), and a range scan of 64 Ki
//! cells from the cache and from the file. Blocks of 4 KiB and 16 KiB, to
//! choose `TARGET_BLOCK_BYTES`. The page cache is not dropped (that needs
//! root and would slow every other process on the machine), so "file" is
//! a read the kernel answers from memory; a cold read from the device adds
//! the device's latency. `get_many` of 64 keys against 64 `get`s: mget's
//! batched read. Figures go to docs/benchmarks.md, "Run files".
//!
//! `absent`: a point read of a key inside the file's key range that the
//! file lacks (every put of a new cell asks each run), with the Bloom
//! filter (format version 2) and from the same cells written as version 1
//! (`RunFileWriter::without_filter`, the build before filters: every such
//! read reads its block). Figures in docs/benchmarks.md, "Run file Bloom
//! filter".
//!
//! `open`: opening a file of 256 Ki cells with its filter read and checked
//! (`RunFileReader::open`: `--verify`, merges) and without
//! (`open_source_lazy`, what the daemon's restart does before a background
//! thread loads the filter): the restart's cost per cell of its runs.
//!
//! `filter`: 4096 absent keys against a 60 MiB filter, probed one key at
//! a time and as a batch whose probes overlap (`may_contain_each`).
//!
//! `filter fill`: a writer's filter (60 MiB) filled with 4096 keys, one
//! key's bits at a time and through `FilterFill` (lines asked for ahead).
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use cube_store::RealDisk;
use cube_store::crypto::{Keyring, MasterKey};
use cube_store::run_file::{BlockCache, Protection, RunFileReader, RunFileWriter};

/// 256 Ki cells of 64 bytes: 21 MiB of file.
const CELLS: u64 = 256 * 1024;
const VALUE_BYTES: usize = 64;
const SCAN_CELLS: u64 = 64 * 1024;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Keys spread like a curve's: every 7th, so a scan's range is dense.
fn key(i: u64) -> u128 {
    u128::from(i) * 7
}

fn sealed() -> Protection {
    Protection::Sealed {
        keyring: Arc::new(Keyring::new(Some(MasterKey::from_bytes([9; 32])), 5)),
        dir_id: [1; 16],
    }
}

fn write(path: &Path, block_bytes: usize, protection: &Protection) {
    write_version(path, block_bytes, protection, true);
}

/// `filter: false` writes format version 1 (no Bloom filter).
fn write_version(path: &Path, block_bytes: usize, protection: &Protection, filter: bool) {
    let mut w = RunFileWriter::create(&RealDisk, path, 1, 1, protection, CELLS)
        .unwrap()
        .with_target_block_bytes(block_bytes);
    if !filter {
        w = w.without_filter();
    }
    let value = [0x5au8; VALUE_BYTES];
    for i in 0..CELLS {
        w.push(key(i), Some(&value)).unwrap();
    }
    w.finish().unwrap();
}

fn point_reads(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("run_file");
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    let cases = [
        ("4K", 4096, Protection::Plain),
        ("16K", 16384, Protection::Plain),
        ("4K sealed", 4096, sealed()),
        ("16K sealed", 16384, sealed()),
    ];
    for (name, block_bytes, protection) in cases {
        let path = tmp.path().join(name.replace(' ', "-"));
        write(&path, block_bytes, &protection);
        let hot =
            RunFileReader::open(&path, &protection, Arc::new(BlockCache::new(256 << 20))).unwrap();
        // A budget of 0 keeps nothing: every read goes to the file.
        let cold = RunFileReader::open(&path, &protection, Arc::new(BlockCache::new(0))).unwrap();
        let mut rng = Rng(0x9e37_79b9);
        group.bench_function(format!("get from cache {name}"), |b| {
            b.iter(|| black_box(hot.get(key(rng.below(CELLS))).unwrap()))
        });
        group.bench_function(format!("get from file {name}"), |b| {
            b.iter(|| black_box(cold.get(key(rng.below(CELLS))).unwrap()))
        });
        let index = cold.index();
        let file = std::fs::File::open(&path).unwrap();
        let mut buf = vec![0u8; block_bytes * 2];
        group.bench_function(format!("pread one block {name}"), |b| {
            b.iter(|| {
                let i = rng.below(index.len() as u64) as usize;
                let len = index.lens[i] as usize;
                file.read_exact_at(&mut buf[..len], index.offsets[i])
                    .unwrap();
                black_box(&buf);
            })
        });
        // mget's path: 64 random keys, one batched read against 64 point
        // reads (from the page cache the hints cannot overlap anything, so
        // this measures the batching's own cost).
        let batch =
            |rng: &mut Rng| -> Vec<u128> { (0..64).map(|_| key(rng.below(CELLS))).collect() };
        group.bench_function(format!("get_many 64 keys from file {name}"), |b| {
            b.iter_batched(
                || batch(&mut rng),
                |keys| black_box(cold.get_many(&keys)),
                criterion::BatchSize::SmallInput,
            )
        });
        group.bench_function(format!("64 gets from file {name}"), |b| {
            b.iter_batched(
                || batch(&mut rng),
                |keys| {
                    for k in keys {
                        black_box(cold.get(k).unwrap());
                    }
                },
                criterion::BatchSize::SmallInput,
            )
        });
        group.throughput(Throughput::Elements(SCAN_CELLS));
        let scan = |reader: &RunFileReader, rng: &mut Rng| {
            let from = rng.below(CELLS - SCAN_CELLS);
            let mut n = 0u64;
            for entry in reader.range(key(from), key(from + SCAN_CELLS - 1)) {
                black_box(entry.unwrap());
                n += 1;
            }
            assert_eq!(n, SCAN_CELLS);
        };
        group.bench_function(format!("scan 64Ki cells from cache {name}"), |b| {
            b.iter(|| scan(&hot, &mut rng))
        });
        group.bench_function(format!("scan 64Ki cells from file {name}"), |b| {
            b.iter(|| scan(&cold, &mut rng))
        });
        group.throughput(Throughput::Elements(1));
        eprintln!(
            "{name}: {} blocks, index {} KiB in memory",
            cold.block_count(),
            cold.resident_bytes() / 1024
        );
    }
    group.finish();
}

/// A point read of an absent key (between two of the file's keys), from
/// the file (a budget-0 cache), with the filter and without (version 1);
/// and a batch of 64 such keys.
fn absent_reads(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("run_file absent");
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    for (name, protection) in [("4K", Protection::Plain), ("4K sealed", sealed())] {
        for (version, filter) in [("v1 no filter", false), ("v3 filter", true)] {
            let path = tmp
                .path()
                .join(format!("{name}-{version}").replace(' ', "-"));
            write_version(&path, 4096, &protection, filter);
            let cold =
                RunFileReader::open(&path, &protection, Arc::new(BlockCache::new(0))).unwrap();
            let mut rng = Rng(0x51ed_270b);
            group.bench_function(format!("get absent from file {name} {version}"), |b| {
                b.iter(|| black_box(cold.get(key(rng.below(CELLS)) + 3).unwrap()))
            });
            group.bench_function(
                format!("get_many 64 absent from file {name} {version}"),
                |b| {
                    b.iter_batched(
                        || -> Vec<u128> { (0..64).map(|_| key(rng.below(CELLS)) + 3).collect() },
                        |keys| black_box(cold.get_many(&keys)),
                        criterion::BatchSize::SmallInput,
                    )
                },
            );
            group.bench_function(format!("get present from file {name} {version}"), |b| {
                b.iter(|| black_box(cold.get(key(rng.below(CELLS))).unwrap()))
            });
            eprintln!(
                "{name} {version}: resident {} KiB (index and filter)",
                cold.resident_bytes() / 1024
            );
        }
    }
    group.finish();
}

/// Opening a file with its filter and without, plain and sealed.
fn opens(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("run_file open");
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    for (name, protection) in [("4K", Protection::Plain), ("4K sealed", sealed())] {
        let path = tmp.path().join(name.replace(' ', "-"));
        write(&path, 4096, &protection);
        let cache = Arc::new(BlockCache::new(0));
        group.bench_function(format!("open with filter {name}"), |b| {
            b.iter(|| {
                black_box(RunFileReader::open(&path, &protection, Arc::clone(&cache)).unwrap())
            })
        });
        group.bench_function(format!("open without filter {name}"), |b| {
            b.iter(|| {
                let file = std::fs::File::open(&path).unwrap();
                let reader = RunFileReader::open_source_lazy(
                    Box::new(file),
                    &path,
                    &protection,
                    Arc::clone(&cache),
                );
                black_box(reader.unwrap())
            })
        });
    }
    group.finish();
}

/// A batch of 4096 absent keys (an import's batch, as the writer's
/// lookups ask each run) against a filter far larger than the CPU's
/// caches (50 M keys, 60 MiB), one key at a time and with the batch's
/// probes overlapped (`may_contain_each`).
fn filter_probes(c: &mut Criterion) {
    use cube_store::run_file::bloom::{BITS_PER_KEY, BloomFilter, key_hash};
    const KEYS: u64 = 50_000_000;
    const BATCH: u64 = 4096;
    let mut filter = BloomFilter::with_bits(KEYS * BITS_PER_KEY);
    for i in 0..KEYS {
        filter.insert(key_hash(key(i)));
    }
    let mut group = c.benchmark_group("run_file filter");
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    group.throughput(Throughput::Elements(BATCH));
    let mut rng = Rng(0x0b10_0f17);
    let mut absent = || -> Vec<u128> { (0..BATCH).map(|_| key(rng.below(KEYS)) + 3).collect() };
    group.bench_function("4096 absent keys, one at a time", |b| {
        b.iter_batched(
            &mut absent,
            |keys| black_box(keys.iter().filter(|&&k| filter.may_contain(k)).count()),
            criterion::BatchSize::SmallInput,
        )
    });
    group.bench_function("4096 absent keys, may_contain_each", |b| {
        b.iter_batched(
            &mut absent,
            |keys| black_box(filter.may_contain_each(&keys)),
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// A writer's filter filled with 4096 keys in key order (a merge's
/// stream) within a filter far larger than the CPU's caches (50 M keys,
/// 60 MiB), one key's bits at a time and with `FilterFill` (the lines of
/// the keys ahead asked for first).
fn filter_fills(c: &mut Criterion) {
    use cube_store::run_file::bloom::{BITS_PER_KEY, BloomFilter, FilterFill, key_hash};
    const KEYS: u64 = 50_000_000;
    const BATCH: u64 = 4096;
    let mut group = c.benchmark_group("run_file filter fill");
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    group.throughput(Throughput::Elements(BATCH));
    let mut filter = Some(BloomFilter::with_bits(KEYS * BITS_PER_KEY));
    let mut next = 0u64;
    let mut batch = move || -> Vec<u64> {
        // Keys spread over the whole key space: each lands anywhere.
        next += 1;
        (0..BATCH)
            .map(|i| key_hash(key(next * BATCH + i)))
            .collect()
    };
    group.bench_function("4096 keys, insert one at a time", |b| {
        let f = filter.as_mut().unwrap();
        b.iter_batched(
            &mut batch,
            |hashes| hashes.iter().for_each(|&h| f.insert(h)),
            criterion::BatchSize::SmallInput,
        )
    });
    group.bench_function("4096 keys, FilterFill", |b| {
        b.iter_batched(
            &mut batch,
            |hashes| {
                let mut fill = FilterFill::new(filter.take().unwrap());
                hashes.iter().for_each(|&h| fill.add(h));
                filter = Some(fill.finish());
            },
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(
    benches,
    point_reads,
    absent_reads,
    opens,
    filter_probes,
    filter_fills
);
criterion_main!(benches);
