//! Writer time of each request type at the largest size the limits allow,
//! through a real `cubed` (`--sync always`): the writer thread is shared by
//! every namespace, so the time one request holds it is the longest any
//! other client's write can wait behind it (issue 37).
//!
//! What is measured is the CPU time of the daemon's `cube-writer` thread
//! across the request (`/proc/PID/task/TID/schedstat`), one request at a
//! time on an otherwise idle daemon: on the project's shared 2-core
//! machines a wall clock measures the other sessions' builds as much as
//! cube. It leaves out the fdatasync wait (the thread sleeps) and what
//! the connection thread does (decoding the request). Steps run with
//! `--program-step-threads 1`, so every run is on the writer's clock.
//! Each request's wall-clock round trip is printed beside it. Figures go
//! to `docs/benchmarks.md` ("Writer time per request") and the bounds to
//! `docs/robustness.md`.
//!
//! Runaway cell programs (`writer-bounds/run`): how long each budget takes
//! to stop one, the speed `server/tests/programs.rs` leaves to this bench.
//!
//! Run: `cargo bench -p cube-server --bench writer_bounds` (release, like
//! every benchmark; it starts the `cubed` built beside it).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use cube_client::{Client, Coord, LocalDaemon};
use cube_protocol::{BatchOp, EdgeLabel, MAX_BATCH_OPS, NamespaceName, NamespaceSpec};

/// The daemon's default `--max-edges-per-cell`, and its largest.
const DEFAULT_CAP: i32 = 4096;
const MAX_CAP: i32 = 32_768;
/// The most programs one `step` runs (`server/src/programs/step.rs`).
const MAX_STEP_PROGRAMS: i32 = 32_768;

fn c(x: i32, y: i32, z: i32) -> Coord {
    Coord::new(x, y, z)
}

fn link(from: Coord, to: Coord) -> BatchOp {
    BatchOp::Link {
        from,
        to,
        label: EdgeLabel::default(),
        weight: 1.0,
    }
}

/// `MAX_BATCH_OPS` links out of `MAX_BATCH_OPS / cap` hubs, each linked
/// up to `cap`; with `refused`, the last one is one link past the cap of
/// the first hub, so the whole batch is refused after the writer checked
/// every link before it.
fn hub_links(cap: i32, refused: bool) -> Vec<BatchOp> {
    let total = MAX_BATCH_OPS as i32;
    let mut ops: Vec<BatchOp> = (0..total)
        .map(|i| link(c(i / cap, 0, 0), c(i / cap, 1, i % cap)))
        .collect();
    if refused {
        ops.pop();
        ops.push(link(c(0, 0, 0), c(0, 2, 0)));
    }
    ops
}

/// What `cubec import` sends at its largest: a full batch of an export's
/// records, cells (32-byte values), links and programs in thirds.
fn import_chunk() -> Vec<BatchOp> {
    (0..MAX_BATCH_OPS as i32)
        .map(|i| {
            let at = c(i % 64, (i / 64) % 64, i / 4096);
            match i % 3 {
                0 => BatchOp::Put {
                    coord: at,
                    value: vec![b'v'; 32],
                },
                1 => link(at, c(i % 64 + 1, (i / 64) % 64, i / 4096)),
                _ => BatchOp::Prog {
                    coord: at,
                    source: b"return cube.rincr(0, 0, 0, 1)".to_vec(),
                },
            }
        })
        .collect()
}

/// A full batch of puts, as many bytes as a batch may carry.
fn put_batch() -> Vec<BatchOp> {
    let value_bytes = 100;
    (0..MAX_BATCH_OPS as i32)
        .map(|i| BatchOp::Put {
            coord: c(i % 256, i / 256, 0),
            value: vec![b'p'; value_bytes],
        })
        .collect()
}

fn new_namespace(client: &mut Client, name: &str) {
    client
        .ns_create(
            &NamespaceName::new(name).unwrap(),
            &NamespaceSpec::default(),
        )
        .unwrap();
}

/// The run time of the daemon's writer thread.
struct WriterClock {
    schedstat: PathBuf,
}

impl WriterClock {
    fn of(daemon: &LocalDaemon) -> WriterClock {
        let tasks = PathBuf::from(format!("/proc/{}/task", daemon.pid()));
        for task in std::fs::read_dir(&tasks).unwrap() {
            let task = task.unwrap().path();
            let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            if name.trim() == "cube-writer" {
                return WriterClock {
                    schedstat: task.join("schedstat"),
                };
            }
        }
        panic!("no cube-writer thread in {}", tasks.display());
    }

    /// Nanoseconds the writer has been on a CPU.
    fn ns(&self) -> u64 {
        let text = std::fs::read_to_string(&self.schedstat).unwrap();
        text.split_whitespace().next().unwrap().parse().unwrap()
    }
}

/// The writer's time for `request`, `iters` times, each after an untimed
/// `setup`; prints the mean round trip.
fn timed<S>(
    iters: u64,
    client: &mut Client,
    writer: &WriterClock,
    mut setup: impl FnMut(&mut Client) -> S,
    mut request: impl FnMut(&mut Client, S),
) -> Duration {
    let (mut cpu_ns, mut wall) = (0u64, Duration::ZERO);
    for _ in 0..iters {
        let state = setup(client);
        let (started, started_ns) = (Instant::now(), writer.ns());
        request(client, state);
        cpu_ns += writer.ns().saturating_sub(started_ns);
        wall += started.elapsed();
    }
    eprintln!(
        "  (round trip {:.1} ms a request over {iters})",
        wall.as_secs_f64() * 1e3 / iters as f64
    );
    Duration::from_nanos(cpu_ns)
}

/// A daemon to measure, its writer's clock and a client.
struct Bench {
    // Dropped last: it kills the daemon.
    _daemon: LocalDaemon,
    writer: WriterClock,
    client: Client,
    /// Namespaces made so far (each fresh one gets the next number).
    namespaces: u64,
}

type Group<'a> = criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>;

impl Bench {
    fn start(args: &[&str]) -> Bench {
        let daemon = LocalDaemon::start_fresh(args).unwrap();
        Bench {
            writer: WriterClock::of(&daemon),
            client: daemon.client().unwrap(),
            _daemon: daemon,
            namespaces: 0,
        }
    }

    /// Measures `request`, each after an untimed `setup`.
    fn requests<S>(
        &mut self,
        group: &mut Group<'_>,
        name: &str,
        mut setup: impl FnMut(&mut Client) -> S,
        mut request: impl FnMut(&mut Client, S),
    ) {
        let Bench { writer, client, .. } = self;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| timed(iters, client, writer, &mut setup, &mut request))
        });
    }

    /// Each request a batch of `ops()` into a namespace of its own.
    fn fresh_batches(&mut self, group: &mut Group<'_>, name: &str, ops: impl Fn() -> Vec<BatchOp>) {
        let mut made = self.namespaces;
        self.requests(
            group,
            name,
            |client| {
                made += 1;
                let ns = format!("fresh{made}");
                new_namespace(client, &ns);
                (ns, ops())
            },
            |client, (ns, mut ops)| {
                client.batch(&ns, &mut ops).unwrap();
            },
        );
        self.namespaces = made;
    }

    /// Each request a batch of `ops()` into `ns`; `refused`: each is.
    fn batches(
        &mut self,
        group: &mut Group<'_>,
        name: &str,
        ns: &str,
        refused: bool,
        ops: impl Fn() -> Vec<BatchOp>,
    ) {
        self.requests(
            group,
            name,
            |_| ops(),
            |client, mut ops| {
                assert_eq!(client.batch(ns, &mut ops).is_err(), refused);
            },
        );
    }
}

fn batches(crit: &mut Criterion) {
    let mut bench = Bench::start(&[]);
    let mut group = group(crit, "writer-bounds/batch");
    bench.fresh_batches(&mut group, "links-65536-16-hubs-applied", || {
        hub_links(DEFAULT_CAP, false)
    });
    new_namespace(&mut bench.client, "refused");
    bench.batches(
        &mut group,
        "links-65536-16-hubs-refused",
        "refused",
        true,
        || hub_links(DEFAULT_CAP, true),
    );
    bench.batches(&mut group, "puts-65536", "default", false, put_batch);
    bench.fresh_batches(&mut group, "import-chunk-65536-mixed", import_chunk);
    group.finish();
}

/// Links into two hubs at the largest `--max-edges-per-cell`: each edge
/// is looked for among its hub's before it is added or its weight set.
fn hubs_at_the_largest_cap(crit: &mut Criterion) {
    let mut bench = Bench::start(&["--max-edges-per-cell", &MAX_CAP.to_string()]);
    let mut group = group(crit, "writer-bounds/batch");
    bench.fresh_batches(&mut group, "links-65536-2-hubs-cap-32768-applied", || {
        hub_links(MAX_CAP, false)
    });
    new_namespace(&mut bench.client, "relinked");
    bench
        .client
        .batch("relinked", &mut hub_links(MAX_CAP, false))
        .unwrap();
    bench.batches(
        &mut group,
        "links-65536-2-hubs-cap-32768-relinked",
        "relinked",
        false,
        || hub_links(MAX_CAP, false),
    );
    group.finish();
}

/// Links `cap` edges out of the hub at the origin and `cap` into it.
fn hub_at_origin(client: &mut Client, ns: &str, cap: i32) {
    let hub = c(0, 0, 0);
    let mut ops: Vec<BatchOp> = (0..cap)
        .flat_map(|i| [link(hub, c(1, 0, i)), link(c(2, 0, i), hub)])
        .collect();
    for chunk in ops.chunks_mut(MAX_BATCH_OPS as usize) {
        let mut chunk = chunk.to_vec();
        client.batch(ns, &mut chunk).unwrap();
    }
    ops.clear();
}

fn group<'a>(crit: &'a mut Criterion, name: &str) -> Group<'a> {
    let mut group = crit.benchmark_group(name);
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    group
}

fn detaches(crit: &mut Criterion) {
    let mut group = group(crit, "writer-bounds/detach");
    for (cap, name) in [
        (DEFAULT_CAP, "hub-4096-out-4096-in"),
        (MAX_CAP, "hub-32768-out-32768-in"),
    ] {
        let mut bench = Bench::start(&["--max-edges-per-cell", &cap.to_string()]);
        bench.requests(
            &mut group,
            name,
            |client| hub_at_origin(client, "default", cap),
            |client, ()| {
                let detached = client.detach("default", c(0, 0, 0)).unwrap();
                assert_eq!(detached.edges_removed, 2 * cap as u32);
            },
        );
    }
    group.finish();
}

fn steps(crit: &mut Criterion) {
    let mut bench = Bench::start(&["--program-step-threads", "1"]);
    // 32 x 32 x 32 counters: the most programs one step runs.
    let side = 32;
    assert_eq!(side * side * side, MAX_STEP_PROGRAMS);
    let mut ops: Vec<BatchOp> = (0..MAX_STEP_PROGRAMS)
        .map(|i| BatchOp::Prog {
            coord: c(i % side, (i / side) % side, i / (side * side)),
            source: b"return cube.rincr(0, 0, 0, 1)".to_vec(),
        })
        .collect();
    bench.client.batch("default", &mut ops).unwrap();
    let mut group = group(crit, "writer-bounds/step");
    bench.requests(
        &mut group,
        "programs-32768-counters",
        |_| (),
        |client, ()| {
            let reply = client
                .step("default", c(0, 0, 0), c(side - 1, side - 1, side - 1), &[])
                .unwrap();
            assert_eq!(
                (reply.programs, reply.failed),
                (MAX_STEP_PROGRAMS as u32, 0)
            );
        },
    );
    group.finish();
}

/// Runaway programs, each stopped by a budget: how long each holds the
/// writer is the speed claim `server/tests/programs.rs` checks only for
/// hangs (its tests assert that the right budget stopped each one).
fn runaway_runs(crit: &mut Criterion) {
    let mut bench = Bench::start(&[]);
    let mut group = group(crit, "writer-bounds/run");
    let runaways: [(&str, &[u8]); 4] = [
        // Stopped by fuel: a library loop whose size is a numeric string.
        (
            "fuel-library-loop",
            b"table.move({}, '1', '30000000', 1, {})",
        ),
        // Stopped by fuel: a plain find's quadratic worst case.
        (
            "fuel-plain-find",
            b"local h = string.rep('a', 1 << 19) local n = string.rep('a', 1 << 18) .. 'b' \
              return string.find(h, n, 1, true)",
        ),
        // Stopped by the 250 ms writer-time backstop: each comparison
        // works on megabytes (the patched Lua compares with memcmp).
        (
            "backstop-zero-byte-compare",
            b"local a = string.rep('\\0', 4000000) local b = a .. '\\0' while a < b do end",
        ),
        // Refused before it is copied whole: a result over the frame.
        (
            "result-over-the-frame",
            b"local s = string.rep('x', 1 << 20) local t = {} \
              for i = 1, 4096 do t[i] = s end return t",
        ),
    ];
    for (i, (name, source)) in runaways.into_iter().enumerate() {
        let at = c(i as i32, 0, 0);
        bench.client.prog("default", at, source).unwrap();
        bench.requests(
            &mut group,
            name,
            |_| (),
            |client, ()| {
                client.run("default", at, &[]).unwrap_err();
            },
        );
    }
    group.finish();
}

criterion_group!(
    benches,
    batches,
    hubs_at_the_largest_cap,
    detaches,
    steps,
    runaway_runs
);
criterion_main!(benches);
