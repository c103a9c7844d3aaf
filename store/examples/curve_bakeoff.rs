//! The curve bake-off: Morton against Hilbert on the same data and queries.
//!
//! ```text
//! cargo run --release -p cube-store --example curve_bakeoff > bakeoff.md
//! ```
//!
//! Prints markdown tables (the ones in `docs/curve-bakeoff.md`): encode and
//! decode cost, ranges per query, stored cells visited per cell returned,
//! scan time, and edge-walk locality (key distance between lattice
//! neighbours). Times are this thread's CPU time (other processes on a
//! shared machine do not count), on whatever machine
//! runs it; the machine and its load are printed first.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

#[path = "../benches/support/cpu_time.rs"]
#[allow(dead_code)]
mod cpu_time;

use cube_protocol::{CellBox, Coord, NamespaceName};
use cube_store::curve::region::Runs;
use cube_store::curve::{
    hilbert_decode, hilbert_key, morton_decode, morton_decode_magic, morton_key, morton_key_bmi2,
    morton_key_lut, morton_key_magic,
};
use cube_store::{Curve, MemStore, Mutation, ScanLimits, Visit};

/// A named encoder, and a named decoder with the curve whose keys it reads.
type Encoder = (&'static str, fn(Coord) -> u128);
type Decoder = (&'static str, fn(u128) -> Coord, Curve);

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

/// This thread's CPU time in ns (wall time where `/proc` is missing):
/// other processes on a shared machine then do not count.
fn now_ns(epoch: Instant) -> u64 {
    cpu_time::thread_cpu_ns().unwrap_or_else(|| epoch.elapsed().as_nanos() as u64)
}

/// CPU ns per item of `f` (which handles `items` items), repeating `f`
/// until at least 300 ms of CPU time have passed so the kernel's 4 ms
/// accounting tick does not matter.
fn ns_per_item(items: usize, mut f: impl FnMut()) -> f64 {
    let epoch = Instant::now();
    let start = now_ns(epoch);
    let mut rounds = 0u64;
    while now_ns(epoch) - start < 300_000_000 || rounds < 3 {
        f();
        rounds += 1;
    }
    (now_ns(epoch) - start) as f64 / (rounds as f64 * items as f64)
}

fn coords(rng: &mut Rng, n: usize, span: Option<i32>) -> Vec<Coord> {
    (0..n)
        .map(|_| {
            let mut axis = || match span {
                None => rng.next() as i32,
                Some(s) => rng.below(2 * s) - s,
            };
            Coord::new(axis(), axis(), axis())
        })
        .collect()
}

fn encode_decode() {
    println!("## Encode and decode\n");
    println!("CPU ns per coordinate over 1 M coordinates (throughput: independent coordinates");
    println!(
        "overlap in the CPU), and the latency of one call whose input depends on the previous"
    );
    println!("result.");
    let fast = if morton_key_bmi2(Coord::new(0, 0, 0)).is_some() {
        "BMI2 `pdep`/`pext`"
    } else {
        "the portable fallbacks (no fast BMI2 on this CPU)"
    };
    println!("`morton_key` and `morton_decode` (used) run {fast} here.\n");
    println!("| operation | near origin (|v| < 2^10) | full i32 range |");
    println!("| --- | ---: | ---: |");
    let mut rng = Rng(1);
    let near = coords(&mut rng, 1 << 20, Some(1 << 10));
    let full = coords(&mut rng, 1 << 20, None);
    let encoders: [Encoder; 4] = [
        ("Morton encode (`morton_key`, used)", morton_key),
        (
            "Morton encode (byte tables, portable fallback)",
            morton_key_lut,
        ),
        ("Morton encode (magic numbers)", morton_key_magic),
        ("Hilbert encode", hilbert_key),
    ];
    for (name, f) in encoders {
        let run = |set: &[Coord]| {
            ns_per_item(set.len(), || {
                let mut acc = 0u128;
                for c in set {
                    acc ^= f(*c);
                }
                black_box(acc);
            })
        };
        println!("| {name} | {:.2} | {:.2} |", run(&near), run(&full));
    }
    let decoders: [Decoder; 3] = [
        (
            "Morton decode (`morton_decode`, used)",
            morton_decode,
            Curve::Morton,
        ),
        (
            "Morton decode (magic numbers, portable fallback)",
            morton_decode_magic,
            Curve::Morton,
        ),
        ("Hilbert decode", hilbert_decode, Curve::Hilbert),
    ];
    for (name, f, curve) in decoders {
        let run = |set: &[Coord]| {
            let keys: Vec<u128> = set.iter().map(|c| curve.key(*c)).collect();
            ns_per_item(keys.len(), || {
                let mut acc = 0i32;
                for k in &keys {
                    let c = f(*k);
                    acc ^= c.x ^ c.y ^ c.z;
                }
                black_box(acc);
            })
        };
        println!("| {name} | {:.2} | {:.2} |", run(&near), run(&full));
    }
    for curve in Curve::ALL {
        let latency = ns_per_item(1 << 20, || {
            let mut c = Coord::new(123, -456, 789);
            for _ in 0..1 << 20 {
                let k = curve.key(c);
                c = Coord::new(c.y, c.z, (k ^ (k >> 37) ^ (k >> 71)) as i32 & 0x3ff);
            }
            black_box(c);
        });
        println!(
            "| {} encode, one dependent call | {latency:.2} | |",
            curve.name()
        );
    }
    println!();
}

/// A data set: a store with one namespace per curve holding the same cells.
struct DataSet {
    name: &'static str,
    store: MemStore,
    /// Where queries are placed: boxes lie inside 0..extent on each axis.
    extent: i32,
}

fn ns(curve: Curve) -> NamespaceName {
    NamespaceName::new(curve.name()).unwrap()
}

fn data_set(name: &'static str, extent: i32, cells: &[Coord]) -> DataSet {
    let store = MemStore::new();
    for curve in Curve::ALL {
        store.create_namespace(&ns(curve), curve);
        let mut existed = Vec::new();
        for chunk in cells.chunks(4096) {
            let group: Vec<Mutation> = chunk
                .iter()
                .map(|c| Mutation::Put {
                    ns: ns(curve),
                    coord: *c,
                    value: vec![0; 8],
                })
                .collect();
            let refs: Vec<&Mutation> = group.iter().collect();
            store.apply_group(&refs, 0, &mut existed);
        }
    }
    // Let the background merges finish so both curves are measured on a
    // settled store.
    std::thread::sleep(Duration::from_millis(500));
    DataSet {
        name,
        store,
        extent,
    }
}

fn data_sets() -> Vec<DataSet> {
    let mut rng = Rng(42);
    let dense: Vec<Coord> = (0..100)
        .flat_map(|x| (0..100).flat_map(move |y| (0..100).map(move |z| Coord::new(x, y, z))))
        .collect();
    let tenth: Vec<Coord> = dense
        .iter()
        .copied()
        .filter(|_| rng.below(10) == 0)
        .collect();
    let sparse: Vec<Coord> = (0..1_000_000)
        .map(|_| Coord::new(rng.below(10_000), rng.below(10_000), rng.below(10_000)))
        .collect();
    vec![
        data_set("full (100^3, every cell)", 100, &dense),
        data_set("10 % (100^3, random tenth)", 100, &tenth),
        data_set("sparse (1 M in 10 000^3)", 10_000, &sparse),
    ]
}

/// Query shapes, scaled to the data set's extent.
fn shapes(extent: i32) -> Vec<(String, [i32; 3])> {
    let s = extent / 100;
    vec![
        (format!("cube {0}x{0}x{0}", 4 * s), [4 * s, 4 * s, 4 * s]),
        (
            format!("cube {0}x{0}x{0}", 16 * s),
            [16 * s, 16 * s, 16 * s],
        ),
        (
            format!("cube {0}x{0}x{0}", 40 * s),
            [40 * s, 40 * s, 40 * s],
        ),
        (
            format!("slab {0}x{0}x{1}", 100 * s, 4 * s),
            [100 * s, 100 * s, 4 * s],
        ),
        (format!("line {}x1x1 (along x)", 100 * s), [100 * s, 1, 1]),
        (format!("line 1x1x{} (along z)", 100 * s), [1, 1, 100 * s]),
    ]
}

/// Runs counted per box at most: a box's run count grows with its surface,
/// and the scan itself never enumerates them.
const RANGES_CAP: u64 = 100_000;

fn region_reads(sets: &[DataSet]) {
    println!("## Region reads\n");
    println!(
        "Each row: 40 boxes of that shape at random places inside the data, the same boxes for"
    );
    println!(
        "both curves. *Ranges* is the number of maximal key runs the box decomposes into (the"
    );
    println!(
        "work a range-per-run scan would do); *visited per returned* counts stored keys the scan"
    );
    println!(
        "examined (including ones outside the box it stepped over) per cell returned (per query"
    );
    println!("when none are returned); times are");
    println!("CPU time per query (all 40 scans repeated for at least 300 ms of CPU).\n");
    println!(
        "| data | query | cells/query | Morton ranges | Hilbert ranges | Morton visited/returned | Hilbert visited/returned | Morton µs | Hilbert µs |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let limits = ScanLimits {
        max_cells: u64::MAX,
        max_steps: u64::MAX,
    };
    for set in sets {
        for (shape, size) in shapes(set.extent) {
            let mut rng = Rng(7);
            let boxes: Vec<CellBox> = (0..40)
                .map(|_| {
                    let lo: Vec<i32> = size.iter().map(|s| rng.below(set.extent - s + 1)).collect();
                    CellBox::new(
                        Coord::new(lo[0], lo[1], lo[2]),
                        Coord::new(
                            lo[0] + size[0] - 1,
                            lo[1] + size[1] - 1,
                            lo[2] + size[2] - 1,
                        ),
                    )
                    .unwrap()
                })
                .collect();
            let mut row = Vec::new();
            let mut cells_per_query = 0.0;
            for curve in Curve::ALL {
                let ranges: u64 = boxes
                    .iter()
                    .map(|b| Runs::count(curve, b, RANGES_CAP))
                    .sum();
                let (mut cells, mut visited) = (0u64, 0u64);
                for b in &boxes {
                    let o = set
                        .store
                        .scan(&ns(curve), b, None, limits, |_, _| Visit::Take)
                        .unwrap()
                        .unwrap();
                    cells += o.cells;
                    visited += o.visited;
                }
                let micros = ns_per_item(boxes.len(), || {
                    for b in &boxes {
                        let mut sum = 0usize;
                        set.store
                            .scan(&ns(curve), b, None, limits, |c, v| {
                                sum += v.len() ^ c.x as usize;
                                Visit::Take
                            })
                            .unwrap()
                            .unwrap();
                        black_box(sum);
                    }
                }) / 1000.0;
                cells_per_query = cells as f64 / boxes.len() as f64;
                row.push((
                    ranges as f64 / boxes.len() as f64,
                    visited as f64 / cells.max(boxes.len() as u64) as f64,
                    micros,
                ));
            }
            let ranges = |r: f64| {
                if r >= RANGES_CAP as f64 {
                    format!("> {RANGES_CAP}")
                } else {
                    format!("{r:.0}")
                }
            };
            println!(
                "| {} | {shape} | {cells_per_query:.0} | {} | {} | {:.2} | {:.2} | {:.1} | {:.1} |",
                set.name,
                ranges(row[0].0),
                ranges(row[1].0),
                row[0].1,
                row[1].1,
                row[0].2,
                row[1].2
            );
        }
    }
    println!();
}

fn edge_walk() {
    println!("## Edge-walk locality\n");
    println!(
        "Key distance |key(c) - key(c + step)| between a cell and its lattice neighbour, over"
    );
    println!("100 000 random cells near the origin (|v| < 2^10), for each axis direction.");
    println!("*Same 64-key run* is the share of neighbours whose keys differ by less than 64 (a");
    println!("neighbour a walk finds without a new seek).\n");
    println!("| curve | axis | median log2 distance | p90 log2 distance | same 64-key run |");
    println!("| --- | --- | ---: | ---: | ---: |");
    let mut rng = Rng(3);
    let cells = coords(&mut rng, 100_000, Some(1 << 10));
    for curve in Curve::ALL {
        for (axis, step) in [
            ("x", Coord::new(1, 0, 0)),
            ("y", Coord::new(0, 1, 0)),
            ("z", Coord::new(0, 0, 1)),
        ] {
            let mut logs: Vec<f64> = Vec::new();
            let mut near = 0;
            for c in &cells {
                let n = Coord::new(c.x + step.x, c.y + step.y, c.z + step.z);
                let d = curve.key(*c).abs_diff(curve.key(n));
                if d < 64 {
                    near += 1;
                }
                logs.push((d as f64).log2());
            }
            logs.sort_by(f64::total_cmp);
            println!(
                "| {} | {axis} | {:.1} | {:.1} | {:.0} % |",
                curve.name(),
                logs[logs.len() / 2],
                logs[logs.len() * 9 / 10],
                100.0 * f64::from(near) / cells.len() as f64
            );
        }
    }
    println!();
}

fn main() {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "<!-- generated by `cargo run --release -p cube-store --example curve_bakeoff`; cores: {}, load average at start: {} -->\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    encode_decode();
    edge_walk();
    let sets = data_sets();
    region_reads(&sets);
}
