//! Profiling aid for WAL replay (issue 4): `replay_profile build DIR CELLS RECORDS`
//! writes a checkpointed base of CELLS and a WAL tail of RECORDS overwrites;
//! `replay_profile open DIR` opens it (run that one under `perf record`).
//! A copy of the data dir is made per open by the caller (opening replays
//! and keeps the tail, so reopening measures the same work).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Instant;

use cube_protocol::{Coord, NamespaceName};
use cube_store::{Engine, EngineConfig, Mutation, SyncPolicy};

fn config(dir: &std::path::Path) -> EngineConfig {
    let mut c = EngineConfig::new(dir);
    c.group_commit.sync = SyncPolicy::Never;
    c.checkpoint.checkpoint_wal_bytes = u64::MAX;
    c
}

fn fill(engine: &Arc<Engine>, count: u64) {
    let threads = 8u64;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let engine = Arc::clone(engine);
            std::thread::spawn(move || {
                let session = engine.session().unwrap();
                let ns = NamespaceName::new("default").unwrap();
                for i in 0..count / threads {
                    let n = t * (count / threads) + i;
                    let coord =
                        Coord::new((n % 256) as i32, (n / 256 % 256) as i32, (n / 65536) as i32);
                    session
                        .write(Mutation::Put {
                            ns: ns.clone(),
                            coord,
                            value: vec![(n % 251) as u8; 64],
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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = std::path::PathBuf::from(&args[1]);
    if args[0] == "build" {
        let cells: u64 = args[2].parse().unwrap();
        let records: u64 = args[3].parse().unwrap();
        let engine = Arc::new(Engine::open(config(&dir)).unwrap());
        fill(&engine, cells);
        engine.compact().unwrap();
        fill(&engine, records);
        engine.close_without_checkpoint();
        return;
    }
    let started = Instant::now();
    let engine = Engine::open(config(&dir)).unwrap();
    let r = engine.recovery_report();
    println!(
        "open {:.3} s; WAL replay: {} records in {:.3} s = {:.2} M records/s",
        started.elapsed().as_secs_f64(),
        r.records_replayed,
        r.duration.as_secs_f64(),
        r.records_replayed as f64 / r.duration.as_secs_f64() / 1e6
    );
    engine.close_without_checkpoint();
}
