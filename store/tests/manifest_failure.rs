//! Guards the checkpointer after a failed manifest store: the rename may or
//! may not have happened, so the manifest in memory may not be the one on
//! disk. The checkpointer must stop (a past bug: a retried fold
//! reused a file id the disk's manifest named, and the next start refused
//! the data dir), and a restart must recover every acknowledged write.
#![allow(clippy::unwrap_used)]

mod common;

use common::sim_config as config;

use std::collections::BTreeMap;

use cube_protocol::{Coord, NamespaceName};
use cube_store::sim_disk::{FaultPlan, SimDisk};
use cube_store::{Engine, Mutation, StoreError};

#[test]
fn a_failed_manifest_store_stops_checkpoints_and_loses_nothing() {
    let ns = NamespaceName::new("default").unwrap();
    let mut latched = 0;
    for seed in 0..200 {
        // Only directory fsyncs fail: the manifest's, and the WAL's at a
        // segment roll (which latches the writer; such seeds end early).
        let disk = SimDisk::new(FaultPlan {
            seed,
            dir_sync_eio_ppm: 250_000,
            ..FaultPlan::default()
        });
        let Ok(engine) = Engine::open(config(&disk)) else {
            continue;
        };
        let session = engine.session().unwrap();
        let mut acked: BTreeMap<i32, Vec<u8>> = BTreeMap::new();
        let mut off = None;
        'rounds: for round in 0..6 {
            for i in 0..20 {
                let value = format!("seed {seed} round {round} key {i}").into_bytes();
                let put = Mutation::Put {
                    ns: ns.clone(),
                    coord: Coord::new(i, 0, 0),
                    value: value.clone(),
                };
                match session.write(put) {
                    Ok(_) => {
                        acked.insert(i, value);
                    }
                    Err(_) => break 'rounds,
                }
            }
            // Failed checkpoints are followed by more writes and more
            // checkpoints, as the daemon's own timer would try.
            if let Err(StoreError::WritesDisabled(why)) = engine.checkpoint()
                && why.contains("storing the manifest failed")
            {
                off = Some(why);
            }
        }
        drop(session);
        if off.is_some() {
            latched += 1;
            // Stays off, for checkpoints and compactions alike.
            assert!(matches!(
                engine.checkpoint(),
                Err(StoreError::WritesDisabled(_))
            ));
            assert!(matches!(
                engine.compact(),
                Err(StoreError::WritesDisabled(_))
            ));
        }
        engine.close_without_checkpoint();

        // Power loss, then a start without faults: every acknowledged write.
        let disk = disk.with_plan(FaultPlan::default());
        let engine = Engine::open(config(&disk))
            .unwrap_or_else(|e| panic!("seed {seed}: the next start refused: {e}"));
        for (i, value) in &acked {
            let got = engine.get(&ns, Coord::new(*i, 0, 0)).unwrap().unwrap();
            assert_eq!(
                got.as_deref(),
                Some(value.as_slice()),
                "seed {seed} key {i}"
            );
        }
        // And checkpoints work again.
        engine.checkpoint().unwrap();
        engine.shutdown().unwrap();
    }
    assert!(latched >= 3, "only {latched} seeds failed a manifest store");
}
