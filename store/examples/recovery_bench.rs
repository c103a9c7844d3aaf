//! Restart-time benchmark for checkpoints (issue 4): how fast a restart
//! loads checkpoint files (cells/s) and replays a WAL tail (records/s).
//!
//! Run: `cargo run --release -p cube-store --example recovery_bench -- [CELLS] [WAL_RECORDS]`
//! (defaults 10_000_000 and 2_000_000). Writes use `--sync never` semantics
//! to build the data quickly; only the restarts are timed.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::thread;
use std::time::Instant;

use cube_protocol::{Coord, NamespaceName};
use cube_store::{Engine, EngineConfig, Mutation, SyncPolicy};

const WRITER_THREADS: u64 = 16;

fn fill(engine: &Arc<Engine>, first: u64, count: u64) {
    let per_thread = count / WRITER_THREADS;
    let handles: Vec<_> = (0..WRITER_THREADS)
        .map(|t| {
            let engine = Arc::clone(engine);
            thread::spawn(move || {
                let session = engine.session().unwrap();
                let ns = NamespaceName::new("default").unwrap();
                for i in 0..per_thread {
                    let n = first + t * per_thread + i;
                    // A dense cube, 64 bytes per value.
                    let coord =
                        Coord::new((n % 256) as i32, (n / 256 % 256) as i32, (n / 65536) as i32);
                    let value = vec![(n % 251) as u8; 64];
                    session
                        .write(Mutation::Put {
                            ns: ns.clone(),
                            coord,
                            value,
                        })
                        .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

fn config(dir: &std::path::Path) -> EngineConfig {
    let mut c = EngineConfig::new(dir);
    c.group_commit.sync = SyncPolicy::Never;
    // Only the explicit compaction folds the log, so the WAL tail measured
    // at the end is all of the second fill.
    c.checkpoint.checkpoint_wal_bytes = u64::MAX;
    c
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let cells = args.first().copied().unwrap_or(10_000_000);
    let wal_records = args.get(1).copied().unwrap_or(2_000_000);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");

    let started = Instant::now();
    let engine = Arc::new(Engine::open(config(&dir)).unwrap());
    fill(&engine, 0, cells);
    eprintln!(
        "wrote {cells} cells in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let report = engine.compact().unwrap();
    eprintln!("checkpoint + compaction: {report:?}");
    engine.shutdown().unwrap();
    drop(engine);

    let started = Instant::now();
    let engine = Engine::open(config(&dir)).unwrap();
    let load = engine.checkpoint_load().clone();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "checkpoint load: {} cells ({} MiB base) in {:.3} s = {:.2} M cells/s (whole open {:.3} s)",
        load.entries,
        load.base_bytes >> 20,
        load.duration.as_secs_f64(),
        load.entries as f64 / load.duration.as_secs_f64() / 1e6,
        secs
    );
    let engine = Arc::new(engine);
    fill(&engine, 0, wal_records);
    engine.close_without_checkpoint();
    drop(engine);

    let engine = Engine::open(config(&dir)).unwrap();
    let r = engine.recovery_report();
    println!(
        "WAL replay: {} records in {:.3} s = {:.2} M records/s",
        r.records_replayed,
        r.duration.as_secs_f64(),
        r.records_replayed as f64 / r.duration.as_secs_f64() / 1e6
    );
    engine.close_without_checkpoint();
}
