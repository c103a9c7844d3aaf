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

fn batches(crit: &mut Criterion) {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let writer = WriterClock::of(&daemon);
    let mut client = daemon.client().unwrap();
    let mut group = crit.benchmark_group("writer-bounds/batch");
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    let mut fresh = 0u64;
    group.bench_function("links-65536-16-hubs-applied", |b| {
        b.iter_custom(|iters| {
            timed(
                iters,
                &mut client,
                &writer,
                |client| {
                    fresh += 1;
                    let ns = format!("links{fresh}");
                    new_namespace(client, &ns);
                    (ns, hub_links(DEFAULT_CAP, false))
                },
                |client, (ns, mut ops)| {
                    client.batch(&ns, &mut ops).unwrap();
                },
            )
        })
    });
    new_namespace(&mut client, "refused");
    group.bench_function("links-65536-16-hubs-refused", |b| {
        b.iter_custom(|iters| {
            timed(
                iters,
                &mut client,
                &writer,
                |_| hub_links(DEFAULT_CAP, true),
                |client, mut ops| {
                    client.batch("refused", &mut ops).unwrap_err();
                },
            )
        })
    });
    group.bench_function("puts-65536", |b| {
        b.iter_custom(|iters| {
            timed(
                iters,
                &mut client,
                &writer,
                |_| put_batch(),
                |client, mut ops| {
                    client.batch("default", &mut ops).unwrap();
                },
            )
        })
    });
    group.bench_function("import-chunk-65536-mixed", |b| {
        b.iter_custom(|iters| {
            timed(
                iters,
                &mut client,
                &writer,
                |client| {
                    fresh += 1;
                    let ns = format!("import{fresh}");
                    new_namespace(client, &ns);
                    (ns, import_chunk())
                },
                |client, (ns, mut ops)| {
                    client.batch(&ns, &mut ops).unwrap();
                },
            )
        })
    });
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

/// Links into two hubs at the largest `--max-edges-per-cell`: each new
/// edge is looked for among its hub's (a list) before it is added.
fn hubs_at_the_largest_cap(crit: &mut Criterion) {
    let cap_arg = MAX_CAP.to_string();
    let daemon = LocalDaemon::start_fresh(&["--max-edges-per-cell", &cap_arg]).unwrap();
    let writer = WriterClock::of(&daemon);
    let mut client = daemon.client().unwrap();
    let mut group = crit.benchmark_group("writer-bounds/batch");
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    let mut fresh = 0u64;
    group.bench_function("links-65536-2-hubs-cap-32768-applied", |b| {
        b.iter_custom(|iters| {
            timed(
                iters,
                &mut client,
                &writer,
                |client| {
                    fresh += 1;
                    let ns = format!("hubs{fresh}");
                    new_namespace(client, &ns);
                    (ns, hub_links(MAX_CAP, false))
                },
                |client, (ns, mut ops)| {
                    client.batch(&ns, &mut ops).unwrap();
                },
            )
        })
    });
    new_namespace(&mut client, "relinked");
    client
        .batch("relinked", &mut hub_links(MAX_CAP, false))
        .unwrap();
    group.bench_function("links-65536-2-hubs-cap-32768-relinked", |b| {
        b.iter_custom(|iters| {
            timed(
                iters,
                &mut client,
                &writer,
                |_| hub_links(MAX_CAP, false),
                |client, mut ops| {
                    client.batch("relinked", &mut ops).unwrap();
                },
            )
        })
    });
    group.finish();
}

fn detaches(crit: &mut Criterion) {
    let mut group = crit.benchmark_group("writer-bounds/detach");
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    for (cap, name) in [
        (DEFAULT_CAP, "hub-4096-out-4096-in"),
        (MAX_CAP, "hub-32768-out-32768-in"),
    ] {
        let cap_arg = cap.to_string();
        let daemon = LocalDaemon::start_fresh(&["--max-edges-per-cell", &cap_arg]).unwrap();
        let writer = WriterClock::of(&daemon);
        let mut client = daemon.client().unwrap();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                timed(
                    iters,
                    &mut client,
                    &writer,
                    |client| hub_at_origin(client, "default", cap),
                    |client, ()| {
                        let detached = client.detach("default", c(0, 0, 0)).unwrap();
                        assert_eq!(detached.edges_removed, 2 * cap as u32);
                    },
                )
            })
        });
    }
    group.finish();
}

fn steps(crit: &mut Criterion) {
    let daemon = LocalDaemon::start_fresh(&["--program-step-threads", "1"]).unwrap();
    let writer = WriterClock::of(&daemon);
    let mut client = daemon.client().unwrap();
    // 32 x 32 x 32 counters: the most programs one step runs.
    let side = 32;
    assert_eq!(side * side * side, MAX_STEP_PROGRAMS);
    let mut ops: Vec<BatchOp> = (0..MAX_STEP_PROGRAMS)
        .map(|i| BatchOp::Prog {
            coord: c(i % side, (i / side) % side, i / (side * side)),
            source: b"return cube.rincr(0, 0, 0, 1)".to_vec(),
        })
        .collect();
    client.batch("default", &mut ops).unwrap();
    let mut group = crit.benchmark_group("writer-bounds/step");
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    group.bench_function("programs-32768-counters", |b| {
        b.iter_custom(|iters| {
            timed(
                iters,
                &mut client,
                &writer,
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
            )
        })
    });
    group.finish();
}

criterion_group!(benches, batches, hubs_at_the_largest_cap, detaches, steps);
criterion_main!(benches);
