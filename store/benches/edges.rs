//! Edges and walks on a 100x100x100 lattice (1 M coordinates, each linked
//! to its 6 neighbours: 5.94 M edges) built in a `MemStore` the way the
//! writer builds it (groups of 4096 links): a 3-hop and a 10-hop walk from
//! the centre (with and without values), a 50-hop cheapest path, and the
//! corner-to-corner path that settles the whole lattice. Throughput is in
//! edges examined per second. Figures go to `docs/benchmarks.md` ("Edges
//! and walks").
#![allow(clippy::unwrap_used)]

#[path = "support/cpu_time.rs"]
mod cpu_time;

use std::hint::black_box;
use std::time::{Duration, Instant};

use cpu_time::CpuTime;
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use cube_protocol::{Coord, Direction, EdgeLabel, EdgeWeight, NamespaceName};
use cube_store::{EdgeKey, MemStore, Mutation, WalkLimits};

const SIDE: i32 = 100;

fn ns() -> NamespaceName {
    NamespaceName::new("default").unwrap()
}

fn unlimited() -> WalkLimits {
    WalkLimits {
        max_depth: u32::MAX,
        max_nodes: u32::MAX,
        max_work: u64::MAX,
        max_answer_bytes: usize::MAX,
    }
}

fn resident_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Every coordinate of the cube gets an 8-byte value and an edge to each
/// of its (up to) 6 neighbours, applied in groups of 4096 like the writer.
fn lattice() -> MemStore {
    let store = MemStore::new();
    let before = resident_mib();
    let started = Instant::now();
    let mut existed = Vec::new();
    let mut batch: Vec<Mutation> = Vec::with_capacity(4096);
    let mut flush = |batch: &mut Vec<Mutation>| {
        let refs: Vec<&Mutation> = batch.iter().collect();
        store.apply_group(&refs, 0, &mut existed);
        batch.clear();
    };
    let mut edges = 0u64;
    for x in 0..SIDE {
        for y in 0..SIDE {
            for z in 0..SIDE {
                let from = Coord::new(x, y, z);
                batch.push(Mutation::Put {
                    ns: ns(),
                    coord: from,
                    value: (x as u64 ^ (y as u64) << 20 ^ (z as u64) << 40)
                        .to_le_bytes()
                        .to_vec(),
                });
                for (dx, dy, dz) in [
                    (1, 0, 0),
                    (-1, 0, 0),
                    (0, 1, 0),
                    (0, -1, 0),
                    (0, 0, 1),
                    (0, 0, -1),
                ] {
                    let to = Coord::new(x + dx, y + dy, z + dz);
                    if [to.x, to.y, to.z].iter().any(|v| !(0..SIDE).contains(v)) {
                        continue;
                    }
                    batch.push(Mutation::Link {
                        ns: ns(),
                        edge: EdgeKey::new(from, to, EdgeLabel::default()),
                        weight: EdgeWeight::DEFAULT,
                    });
                    edges += 1;
                }
                if batch.len() >= 4096 {
                    flush(&mut batch);
                }
            }
        }
    }
    flush(&mut batch);
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(store.edge_count(), edges);
    let memory = match (before, resident_mib()) {
        (Some(a), Some(b)) => format!(", resident memory +{:.0} MiB", b - a),
        _ => String::new(),
    };
    eprintln!(
        "lattice: {edges} edges and 1 M cells applied in {seconds:.1} s \
         ({:.2} M edges/s){memory}",
        edges as f64 / seconds / 1e6
    );
    // Let the cell compactor settle.
    std::thread::sleep(Duration::from_secs(1));
    store
}

/// Interior coordinates (at least `margin` from every face) in a fixed
/// pseudo-random order, so that repeated walks do not all hit the same
/// cached neighbourhood.
fn starts(margin: i32, count: usize) -> Vec<Coord> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let span = (SIDE - 2 * margin) as u64;
    (0..count)
        .map(|_| {
            let mut next = || {
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                margin + (state.wrapping_mul(0x2545_f491_4f6c_dd1d) % span) as i32
            };
            Coord::new(next(), next(), next())
        })
        .collect()
}

fn walks_and_paths(c: &mut Criterion<CpuTime>) {
    let store = lattice();
    let mut group = c.benchmark_group("edges-lattice-1M");
    group.sampling_mode(SamplingMode::Flat);
    // Warm: the same 64 starts every iteration, so their neighbourhoods
    // stay cached. Cold: 64 new starts each iteration out of 65 536, so
    // nearly every node a walk touches comes from memory, as in a daemon
    // serving walks from anywhere.
    for (depth, values, pool) in [
        (3, false, 64),
        (3, false, 65_536),
        (3, true, 65_536),
        (10, false, 65_536),
    ] {
        let mut limits = unlimited();
        limits.max_depth = depth;
        let from = starts(depth as i32, pool);
        let (mut nodes, mut examined) = (0, 0);
        for start in &from[..64] {
            let probe = store
                .walk(&ns(), *start, Direction::Out, None, values, limits)
                .unwrap()
                .unwrap();
            nodes += probe.nodes.len();
            examined += probe.edges_examined;
        }
        eprintln!(
            "walk depth {depth}{}: {} nodes, {} edges examined per walk",
            if values { " with values" } else { "" },
            nodes / 64,
            examined / 64
        );
        group.throughput(Throughput::Elements(examined));
        let name = format!(
            "walk-{depth}-hop{}-{}-x64",
            if values { "-values" } else { "" },
            if pool == 64 { "warm" } else { "cold" }
        );
        let mut at = 0;
        group.bench_function(BenchmarkId::new(name, nodes / 64), |b| {
            b.iter(|| {
                let mut reached = 0;
                for _ in 0..64 {
                    let walk = store
                        .walk(&ns(), from[at], Direction::Out, None, values, limits)
                        .unwrap()
                        .unwrap();
                    at = (at + 1) % from.len();
                    reached += walk.nodes.len();
                }
                black_box(reached)
            })
        });
    }
    let origin = Coord::new(0, 0, 0);
    for (name, to) in [
        ("path-50-hop", Coord::new(17, 17, 16)),
        (
            "path-297-hop-corners",
            Coord::new(SIDE - 1, SIDE - 1, SIDE - 1),
        ),
    ] {
        let probe = store
            .path(&ns(), origin, to, None, f64::INFINITY, unlimited())
            .unwrap()
            .unwrap();
        let hops = probe.path.as_ref().unwrap().coords.len() - 1;
        eprintln!(
            "{name}: {hops} hops, cost {}, {} edges examined",
            probe.path.as_ref().unwrap().cost,
            probe.edges_examined
        );
        group.throughput(Throughput::Elements(probe.edges_examined));
        if hops > 100 {
            group.sample_size(10);
        }
        group.bench_function(BenchmarkId::new(name, hops), |b| {
            b.iter(|| {
                let found = store
                    .path(&ns(), origin, to, None, f64::INFINITY, unlimited())
                    .unwrap()
                    .unwrap();
                black_box(found.edges_examined)
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
    targets = walks_and_paths
}
criterion_main!(benches);
