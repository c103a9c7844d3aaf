//! Candidates for a namespace's ordered cell map, on the same 1 M cells
//! (a dense 100^3 cube, Morton keys): point get, overwrite, and an in-order
//! walk of 80 000 consecutive keys (what a 40^3 box scan iterates).
//!
//! - `btree-random-order`: `std` `BTreeMap` filled in coordinate order, so
//!   its leaves are allocated in no particular key order (what a store
//!   written by clients looks like).
//! - `btree-key-order`: the same map filled in key order (what a load from
//!   a checkpoint, which is in key order, produces).
//! - `sorted-array`: keys and values in two sorted `Vec`s, the read side of
//!   a sorted-runs design (writes would go to a small delta and be merged).
//! - `sharded-16`: 16 `BTreeMap`s split by key range, each under its own
//!   lock, so a writer holds up only readers of one shard.
//!
//! After the criterion groups, the binary also measures how long readers
//! wait behind the writer: get latencies on one thread while another
//! applies 4096-record groups, with the write lock held per group (the old
//! behaviour) and per slice of `APPLY_SLICE_RECORDS`.
#![allow(clippy::unwrap_used)]

#[path = "support/cpu_time.rs"]
mod cpu_time;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use cpu_time::CpuTime;
use criterion::{Criterion, SamplingMode, Throughput};
use cube_protocol::Coord;
use cube_store::APPLY_SLICE_RECORDS;
use cube_store::curve::morton_key;

const SIDE: i32 = 100;
const WALK: usize = 80_000;

type Value = Arc<[u8]>;

fn cube_coords() -> Vec<Coord> {
    (0..SIDE)
        .flat_map(|x| (0..SIDE).flat_map(move |y| (0..SIDE).map(move |z| Coord::new(x, y, z))))
        .collect()
}

fn value(c: Coord) -> Value {
    Arc::from((c.x ^ c.y ^ c.z).to_le_bytes().as_slice())
}

struct SortedArray {
    keys: Vec<u128>,
    values: Vec<Value>,
}

impl SortedArray {
    fn get(&self, key: u128) -> Option<&Value> {
        self.keys.binary_search(&key).ok().map(|i| &self.values[i])
    }

    fn walk(&self, from: u128, n: usize) -> usize {
        let start = self.keys.partition_point(|k| *k < from);
        self.values[start..(start + n).min(self.values.len())]
            .iter()
            .map(|v| v.len())
            .sum()
    }
}

struct Sharded {
    /// The first key of each shard after the first.
    bounds: Vec<u128>,
    shards: Vec<RwLock<BTreeMap<u128, Value>>>,
}

impl Sharded {
    fn shard(&self, key: u128) -> usize {
        self.bounds.partition_point(|b| *b <= key)
    }

    fn get(&self, key: u128) -> Option<Value> {
        self.shards[self.shard(key)]
            .read()
            .unwrap()
            .get(&key)
            .cloned()
    }

    fn walk(&self, from: u128, n: usize) -> usize {
        let mut left = n;
        let mut sum = 0;
        for shard in &self.shards[self.shard(from)..] {
            let map = shard.read().unwrap();
            for (_, v) in map.range(from..).take(left) {
                sum += v.len();
                left -= 1;
            }
            if left == 0 {
                break;
            }
        }
        sum
    }
}

fn walk_btree(map: &BTreeMap<u128, Value>, from: u128, n: usize) -> usize {
    map.range(from..).take(n).map(|(_, v)| v.len()).sum()
}

fn structures(c: &mut Criterion<CpuTime>) {
    let coords = cube_coords();
    let mut random_order = BTreeMap::new();
    for c in &coords {
        random_order.insert(morton_key(*c), value(*c));
    }
    let mut sorted: Vec<(u128, Value)> =
        coords.iter().map(|c| (morton_key(*c), value(*c))).collect();
    sorted.sort_by_key(|(k, _)| *k);
    let key_order: BTreeMap<u128, Value> = sorted.iter().cloned().collect();
    let array = SortedArray {
        keys: sorted.iter().map(|(k, _)| *k).collect(),
        values: sorted.iter().map(|(_, v)| v.clone()).collect(),
    };
    let bounds: Vec<u128> = (1..16).map(|i| sorted[i * sorted.len() / 16].0).collect();
    let sharded = Sharded {
        shards: (0..16).map(|_| RwLock::new(BTreeMap::new())).collect(),
        bounds,
    };
    for (k, v) in &sorted {
        sharded.shards[sharded.shard(*k)]
            .write()
            .unwrap()
            .insert(*k, v.clone());
    }
    let random_btree = RwLock::new(random_order);
    let key_btree = RwLock::new(key_order);

    let mut seed = 17u64;
    let probes: Vec<u128> = (0..4096)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let i = (seed % coords.len() as u64) as usize;
            morton_key(coords[i])
        })
        .collect();
    let walk_from = morton_key(Coord::new(30, 30, 30));

    let mut group = c.benchmark_group("structure-get-1M");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(probes.len() as u64));
    group.bench_function("btree-random-order", |b| {
        b.iter(|| {
            probes
                .iter()
                .filter(|k| random_btree.read().unwrap().get(k).is_some())
                .count()
        })
    });
    group.bench_function("btree-key-order", |b| {
        b.iter(|| {
            probes
                .iter()
                .filter(|k| key_btree.read().unwrap().get(k).is_some())
                .count()
        })
    });
    group.bench_function("sorted-array", |b| {
        b.iter(|| probes.iter().filter(|k| array.get(**k).is_some()).count())
    });
    group.bench_function("sharded-16", |b| {
        b.iter(|| probes.iter().filter(|k| sharded.get(**k).is_some()).count())
    });
    group.finish();

    let mut group = c.benchmark_group("structure-put-1M");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(probes.len() as u64));
    let fresh: Vec<Value> = probes
        .iter()
        .map(|_| Arc::from([1u8; 8].as_slice()))
        .collect();
    group.bench_function("btree-random-order", |b| {
        b.iter(|| {
            let mut map = random_btree.write().unwrap();
            for (k, v) in probes.iter().zip(&fresh) {
                map.insert(*k, v.clone());
            }
        })
    });
    group.bench_function("sharded-16", |b| {
        b.iter(|| {
            for (k, v) in probes.iter().zip(&fresh) {
                sharded.shards[sharded.shard(*k)]
                    .write()
                    .unwrap()
                    .insert(*k, v.clone());
            }
        })
    });
    group.finish();

    let mut group = c.benchmark_group("structure-walk-80k");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(WALK as u64));
    group.bench_function("btree-random-order", |b| {
        b.iter(|| walk_btree(&random_btree.read().unwrap(), black_box(walk_from), WALK))
    });
    group.bench_function("btree-key-order", |b| {
        b.iter(|| walk_btree(&key_btree.read().unwrap(), black_box(walk_from), WALK))
    });
    group.bench_function("sorted-array", |b| {
        b.iter(|| array.walk(black_box(walk_from), WALK))
    });
    group.bench_function("sharded-16", |b| {
        b.iter(|| sharded.walk(black_box(walk_from), WALK))
    });
    group.finish();
}

/// Get latencies on this thread while a writer applies groups of 4096
/// overwrites, holding the write lock for `slice` records at a time.
fn reader_wait(slice: usize) -> Vec<Duration> {
    let coords = cube_coords();
    let map: Arc<RwLock<BTreeMap<u128, Value>>> = Arc::new(RwLock::new(
        coords.iter().map(|c| (morton_key(*c), value(*c))).collect(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (map, stop) = (Arc::clone(&map), Arc::clone(&stop));
        let keys: Vec<u128> = coords.iter().step_by(7).map(|c| morton_key(*c)).collect();
        std::thread::spawn(move || {
            let mut group_start = 0;
            while !stop.load(Ordering::Relaxed) {
                let group = &keys[group_start..(group_start + 4096).min(keys.len())];
                for part in group.chunks(slice) {
                    let mut m = map.write().unwrap();
                    for k in part {
                        m.insert(*k, Arc::from([2u8; 8].as_slice()));
                    }
                }
                group_start = (group_start + 4096) % (keys.len() - 4096);
                // The writer's fdatasync between groups.
                std::thread::sleep(Duration::from_micros(100));
            }
        })
    };
    let mut latencies = Vec::with_capacity(200_000);
    let started = Instant::now();
    let mut i = 0usize;
    while started.elapsed() < Duration::from_secs(2) {
        let key = morton_key(coords[(i * 7919) % coords.len()]);
        let t = Instant::now();
        black_box(map.read().unwrap().get(&key).cloned());
        latencies.push(t.elapsed());
        i += 1;
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    latencies.sort();
    latencies
}

fn print_reader_wait() {
    println!("\nreader wait behind the writer (get latency while 4096-record groups apply):");
    println!(
        "{:>24} {:>10} {:>10} {:>10} {:>10}",
        "write lock held per", "p50", "p99", "p99.9", "max"
    );
    for slice in [4096, APPLY_SLICE_RECORDS] {
        let l = reader_wait(slice);
        let q = |f: f64| l[((l.len() - 1) as f64 * f) as usize];
        println!(
            "{:>17} records {:>10.2?} {:>10.2?} {:>10.2?} {:>10.2?}",
            slice,
            q(0.5),
            q(0.99),
            q(0.999),
            l[l.len() - 1]
        );
    }
}

fn main() {
    let mut c = Criterion::default()
        .with_measurement(CpuTime::new())
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();
    structures(&mut c);
    c.final_summary();
    print_reader_wait();
}
