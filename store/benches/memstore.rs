//! The in-memory store with 1 M cells, for each curve: point get and put,
//! a scan of a fully populated 40x40x40 box, counts, and scans of sparse
//! data whose time should follow the cells returned, not the box volume.
//! Figures go to `docs/benchmarks.md` ("In-memory store and curves").
#![allow(clippy::unwrap_used)]

#[path = "support/cpu_time.rs"]
mod cpu_time;

use std::hint::black_box;
use std::time::Duration;

use cpu_time::CpuTime;
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use cube_protocol::{CellBox, Coord, NamespaceName};
use cube_store::{Curve, MemStore, Mutation, ScanLimits, Visit};

/// The dense store: every cell of a 100x100x100 cube at the origin.
const SIDE: i32 = 100;
/// The sparse store: 1 M cells spread uniformly over this cube's side.
const SPARSE_SIDE: i32 = 10_000;
const CELLS: usize = 1_000_000;

fn ns(curve: Curve) -> NamespaceName {
    NamespaceName::new(curve.name()).unwrap()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: i32) -> i32 {
        (self.next() % n as u64) as i32
    }
}

fn load(store: &MemStore, curve: Curve, coords: impl Iterator<Item = Coord>) {
    let mut existed = Vec::new();
    let mut batch = Vec::with_capacity(4096);
    let mut flush = |batch: &mut Vec<Mutation>| {
        let refs: Vec<&Mutation> = batch.iter().collect();
        store.apply_group(&refs, 0, &mut existed);
        batch.clear();
    };
    for c in coords {
        batch.push(Mutation::Put {
            ns: ns(curve),
            coord: c,
            value: (c.x as u64 ^ (c.y as u64) << 20 ^ (c.z as u64) << 40)
                .to_le_bytes()
                .to_vec(),
        });
        if batch.len() == 4096 {
            flush(&mut batch);
        }
    }
    flush(&mut batch);
}

/// Loads happen as clients would write (groups of 4096 puts); then the
/// background merge is given time to finish, so the settled layout is
/// what gets measured.
fn settle() {
    std::thread::sleep(Duration::from_secs(1));
}

fn dense_store() -> MemStore {
    let store = MemStore::new();
    for curve in Curve::ALL {
        store.create_namespace(&ns(curve), curve);
        load(
            &store,
            curve,
            (0..SIDE).flat_map(|x| {
                (0..SIDE).flat_map(move |y| (0..SIDE).map(move |z| Coord::new(x, y, z)))
            }),
        );
    }
    settle();
    store
}

fn sparse_store() -> MemStore {
    let store = MemStore::new();
    for curve in Curve::ALL {
        store.create_namespace(&ns(curve), curve);
        let mut rng = Rng(99);
        load(
            &store,
            curve,
            (0..CELLS).map(|_| {
                Coord::new(
                    rng.below(SPARSE_SIDE),
                    rng.below(SPARSE_SIDE),
                    rng.below(SPARSE_SIDE),
                )
            }),
        );
    }
    settle();
    store
}

fn unlimited() -> ScanLimits {
    ScanLimits {
        max_cells: u64::MAX,
        max_steps: u64::MAX,
    }
}

/// Scans a box to the end, touching every value; returns cells seen.
fn scan_box(store: &MemStore, curve: Curve, region: &CellBox) -> u64 {
    let mut bytes = 0usize;
    let outcome = store
        .scan(&ns(curve), region, None, unlimited(), |c, v| {
            bytes += v.len() + c.x as usize;
            Visit::Take
        })
        .unwrap()
        .unwrap();
    black_box(bytes);
    outcome.cells
}

fn point_ops(c: &mut Criterion<CpuTime>) {
    let store = dense_store();
    let mut rng = Rng(5);
    let probes: Vec<Coord> = (0..4096)
        .map(|_| Coord::new(rng.below(SIDE), rng.below(SIDE), rng.below(SIDE)))
        .collect();
    // Probes inside one 16x16x16 block: a read pattern with locality, whose
    // cells stay in cache (random probes over 1 M cells are bound by DRAM
    // latency instead).
    let local: Vec<Coord> = (0..4096)
        .map(|_| Coord::new(40 + rng.below(16), 40 + rng.below(16), 40 + rng.below(16)))
        .collect();
    // Cells next to the populated cube, none of them stored.
    let absent: Vec<Coord> = probes
        .iter()
        .map(|c| Coord::new(c.x + SIDE, c.y, c.z))
        .collect();
    let mut group = c.benchmark_group("memstore-1M");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(probes.len() as u64));
    // The floor for a random `get`: loads from random indices of an array
    // the size of the store's key array (1 M u128, 16 MiB). `floor-load`
    // issues them independently (the CPU overlaps the misses), as the get
    // loop could at best; `floor-chase` makes each index depend on the
    // last load, which is one full memory latency per probe.
    let array: Vec<u128> = (0..CELLS as u128).map(|i| i * 0x9e37_79b9).collect();
    let indices: Vec<usize> = (0..4096)
        .map(|_| rng.below(CELLS as i32) as usize)
        .collect();
    group.bench_function("floor-load", |b| {
        b.iter(|| {
            indices
                .iter()
                .map(|&i| array[i] as u64)
                .fold(0, u64::wrapping_add)
        })
    });
    group.bench_function("floor-chase", |b| {
        b.iter(|| {
            let mut at = 0usize;
            for &i in &indices {
                at = (i ^ (array[at] as usize & 1)) % CELLS;
            }
            at
        })
    });
    for curve in Curve::ALL {
        let name = ns(curve);
        group.bench_function(BenchmarkId::new("get-local", curve.name()), |b| {
            b.iter(|| {
                let mut found = 0usize;
                for c in &local {
                    found += store
                        .get(&name, *c)
                        .unwrap()
                        .unwrap()
                        .map_or(0, |v| v.len());
                }
                found
            })
        });
        group.bench_function(BenchmarkId::new("get", curve.name()), |b| {
            b.iter(|| {
                let mut found = 0usize;
                for c in &probes {
                    found += store
                        .get(&name, *c)
                        .unwrap()
                        .unwrap()
                        .map_or(0, |v| v.len());
                }
                found
            })
        });
        // One `read_cell` each: the bytes read (here summed; the server
        // copies them into the reply) under the lock, no `Arc` clone.
        group.bench_function(BenchmarkId::new("get-borrowed", curve.name()), |b| {
            b.iter(|| {
                let mut found = 0usize;
                for c in &probes {
                    found += store
                        .read_cell(&name, *c, |v| v.map_or(0, |v| v.len() + usize::from(v[0])))
                        .unwrap()
                        .unwrap();
                }
                found
            })
        });
        // What the server's `get` does since connections remember their
        // namespace: `get-borrowed` without the namespace table's lock and
        // the name's hash.
        group.bench_function(BenchmarkId::new("get-memo", curve.name()), |b| {
            let mut memo = cube_store::NamespaceMemo::default();
            b.iter(|| {
                let mut found = 0usize;
                for c in &probes {
                    found += store
                        .read_cell_memo(&mut memo, &name, *c, |v| {
                            v.map_or(0, |v| v.len() + usize::from(v[0]))
                        })
                        .unwrap()
                        .unwrap();
                }
                found
            })
        });
        // `get-memo` without touching the value's bytes (only the length,
        // which the pointer to them carries): what a get would cost if
        // small values lived inline instead of behind a pointer.
        group.bench_function(BenchmarkId::new("get-memo-len", curve.name()), |b| {
            let mut memo = cube_store::NamespaceMemo::default();
            b.iter(|| {
                let mut found = 0usize;
                for c in &probes {
                    found += store
                        .read_cell_memo(&mut memo, &name, *c, |v| v.map_or(0, |v| v.len()))
                        .unwrap()
                        .unwrap();
                }
                found
            })
        });
        // Reads of empty cells (just outside the populated cube), common
        // in a sparse world: the index answers "absent" from its slots.
        group.bench_function(BenchmarkId::new("get-absent", curve.name()), |b| {
            let mut memo = cube_store::NamespaceMemo::default();
            b.iter(|| {
                let mut found = 0usize;
                for c in &absent {
                    found += store
                        .read_cell_memo(&mut memo, &name, *c, |v| v.map_or(1, |v| v.len()))
                        .unwrap()
                        .unwrap();
                }
                found
            })
        });
        // A batched read (the server's `mget`), 256 cells per call: the
        // same bytes as `get-borrowed`, with the lookups' misses overlapped.
        group.bench_function(BenchmarkId::new("get-many", curve.name()), |b| {
            b.iter(|| {
                let mut found = 0usize;
                for batch in probes.chunks(256) {
                    store
                        .read_cells(&name, batch, |_, v| {
                            found += v.map_or(0, |v| v.len() + usize::from(v[0]));
                        })
                        .unwrap()
                        .unwrap();
                }
                found
            })
        });
        group.bench_function(BenchmarkId::new("get-many-local", curve.name()), |b| {
            b.iter(|| {
                let mut found = 0usize;
                for batch in local.chunks(256) {
                    store
                        .read_cells(&name, batch, |_, v| {
                            found += v.map_or(0, |v| v.len() + usize::from(v[0]));
                        })
                        .unwrap()
                        .unwrap();
                }
                found
            })
        });
        // Overwrites of existing cells, applied as the writer does: one
        // group (here 64 mutations) at a time.
        let puts: Vec<Mutation> = probes
            .iter()
            .map(|c| Mutation::Put {
                ns: name.clone(),
                coord: *c,
                value: vec![7; 8],
            })
            .collect();
        let groups: Vec<Vec<&Mutation>> = puts.chunks(64).map(|g| g.iter().collect()).collect();
        group.bench_function(BenchmarkId::new("put-grouped", curve.name()), |b| {
            let mut existed = Vec::with_capacity(64);
            b.iter(|| {
                for g in &groups {
                    store.apply_group(g, 0, &mut existed);
                }
            })
        });
        group.bench_function(BenchmarkId::new("put-single", curve.name()), |b| {
            b.iter(|| {
                for m in &puts {
                    store.apply(m);
                }
            })
        });
    }
    group.finish();
}

fn dense_scans(c: &mut Criterion<CpuTime>) {
    let store = dense_store();
    let full = CellBox::new(Coord::new(30, 30, 30), Coord::new(69, 69, 69)).unwrap();
    let mut group = c.benchmark_group("scan-dense-40x40x40");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(64_000));
    for curve in Curve::ALL {
        assert_eq!(scan_box(&store, curve, &full), 64_000);
        group.bench_function(BenchmarkId::new("scan", curve.name()), |b| {
            b.iter(|| scan_box(&store, curve, &full))
        });
        // What the server's scan does with each value: copy its bytes
        // into the answer.
        group.bench_function(BenchmarkId::new("scan-copy", curve.name()), |b| {
            let mut out = Vec::with_capacity(64_000 * 16);
            b.iter(|| {
                out.clear();
                store
                    .scan(&ns(curve), &full, None, unlimited(), |c, v| {
                        out.extend_from_slice(&c.x.to_le_bytes());
                        out.extend_from_slice(v);
                        Visit::Take
                    })
                    .unwrap()
                    .unwrap();
                black_box(out.len())
            })
        });
        group.bench_function(BenchmarkId::new("count", curve.name()), |b| {
            b.iter(|| {
                store
                    .count(&ns(curve), &full, None, unlimited())
                    .unwrap()
                    .unwrap()
                    .cells
            })
        });
    }
    group.finish();
    // Thin shapes of 64 000 cells: a slab and a line bundle.
    let mut group = c.benchmark_group("scan-dense-shapes");
    group.sampling_mode(SamplingMode::Flat);
    for (label, lo, hi) in [
        (
            "slab-100x100x6",
            Coord::new(0, 0, 47),
            Coord::new(99, 99, 52),
        ),
        (
            "line-100x1x1",
            Coord::new(0, 50, 50),
            Coord::new(99, 50, 50),
        ),
    ] {
        let region = CellBox::new(lo, hi).unwrap();
        group.throughput(Throughput::Elements(region.volume() as u64));
        for curve in Curve::ALL {
            group.bench_function(BenchmarkId::new(label, curve.name()), |b| {
                b.iter(|| scan_box(&store, curve, &region))
            });
        }
    }
    group.finish();
}

fn sparse_scans(c: &mut Criterion<CpuTime>) {
    let store = sparse_store();
    let mut group = c.benchmark_group("scan-sparse-1M-in-10000^3");
    group.sampling_mode(SamplingMode::Flat);
    // Expected cells = side^3 * 1e-6: about 10, 100, 1000 and 10 000.
    for side in [215, 464, 1000, 2154] {
        let lo = 3000;
        let region = CellBox::new(
            Coord::new(lo, lo, lo),
            Coord::new(lo + side - 1, lo + side - 1, lo + side - 1),
        )
        .unwrap();
        for curve in Curve::ALL {
            let cells = scan_box(&store, curve, &region);
            group.throughput(Throughput::Elements(cells.max(1)));
            group.bench_function(
                BenchmarkId::new(format!("side-{side}-cells-{cells}"), curve.name()),
                |b| b.iter(|| scan_box(&store, curve, &region)),
            );
        }
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
    targets = point_ops, dense_scans, sparse_scans
}
criterion_main!(benches);
