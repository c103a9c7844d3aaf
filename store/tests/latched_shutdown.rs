//! Guards the shutdown of a latched writer: after a failed `fdatasync` the
//! last group may exist only in the page cache, so a clean shutdown must
//! not fold the log into a durable checkpoint (a past bug: it did, so
//! a write its client was told had failed came back after a power loss).
#![allow(clippy::unwrap_used)]

mod common;

use common::sim_config as config;

use cube_protocol::{Coord, NamespaceName};
use cube_store::sim_disk::{FaultPlan, SimDisk};
use cube_store::{Engine, Mutation, WriteErrorKind};

fn put(i: i32) -> Mutation {
    Mutation::Put {
        ns: NamespaceName::new("default").unwrap(),
        coord: Coord::new(i, 0, 0),
        value: format!("value {i}").into_bytes(),
    }
}

#[test]
fn a_latched_writer_shuts_down_without_folding_the_log() {
    let mut latched = 0;
    // Syncs fail at random: each seed either fails at startup (skipped) or
    // latches on some put; take the seeds where a put was refused.
    for seed in 0..64 {
        let disk = SimDisk::new(FaultPlan {
            seed,
            sync_eio_ppm: 200_000,
            ..FaultPlan::default()
        });
        let Ok(engine) = Engine::open(config(&disk)) else {
            continue;
        };
        let session = engine.session().unwrap();
        let mut refused = None;
        for i in 0..50 {
            match session.write(put(i)) {
                Ok(_) => {}
                Err(e) => {
                    assert!(
                        matches!(e.kind, WriteErrorKind::StorageIo | WriteErrorKind::DiskFull),
                        "seed {seed}: {e}"
                    );
                    refused = Some(i);
                    break;
                }
            }
        }
        drop(session);
        let Some(refused) = refused else {
            continue;
        };
        latched += 1;
        assert_eq!(
            engine.shutdown().unwrap(),
            None,
            "seed {seed}: no final fold"
        );

        // After a power loss the refused write is gone: nothing synced it.
        let disk = disk.with_plan(FaultPlan::default());
        let engine = Engine::open(config(&disk)).unwrap();
        let ns = NamespaceName::new("default").unwrap();
        assert_eq!(
            engine
                .get(&ns, Coord::new(refused, 0, 0))
                .map(Result::unwrap),
            Some(None),
            "seed {seed}: put {refused} was refused, and nothing synced it since"
        );
        engine.shutdown().unwrap();
    }
    assert!(latched >= 5, "only {latched} seeds latched the writer");
}
