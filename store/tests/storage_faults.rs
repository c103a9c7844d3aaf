//! Guards the engine against storage faults, deterministically: on a
//! simulated disk that loses unsynced data on power loss, tears writes into
//! sectors, fails writes and syncs (EIO, ENOSPC) and "succeeds" on a retried
//! failed fsync, random operations, faults and crashes never lose an
//! acknowledged write, never return garbage, and never panic. Odd seeds
//! write into an encrypted namespace, so sealed records and sealed
//! checkpoint blocks go through the same faults.
//!
//! CI runs a fixed set of seeds. `CUBE_SIM_SEEDS=N` runs N seeds
//! (`make sim SEEDS=N`); `CUBE_SIM_SEED=S` replays one seed.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cube_protocol::{Coord, NamespaceName};
use cube_store::sim_disk::{FaultPlan, SimDisk};
use cube_store::{Engine, EngineConfig, Mutation, StoreError, WriteErrorKind};

const KEYS: u64 = 40;
const STEPS: usize = 300;
const CI_SEEDS: u64 = 24;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn config(disk: &SimDisk, key_file: &Path) -> EngineConfig {
    let mut c = EngineConfig::new(Path::new("/sim/data"));
    c.storage = Arc::new(disk.clone());
    // The key file is read from the real disk; the data dir is simulated.
    c.key_file = Some(key_file.to_path_buf());
    c.group_commit.segment_bytes = 2048;
    c.checkpoint.poll_interval = Duration::from_secs(3600);
    c.checkpoint.delta_compact_bytes = 4096;
    c
}

/// Odd seeds use an encrypted namespace, even seeds `default`.
fn ns(seed: u64) -> NamespaceName {
    NamespaceName::new(if seed % 2 == 1 { "sealed" } else { "default" }).unwrap()
}

/// A 0600 key file in a real temp dir (kept alive by the returned guard).
fn key_file() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.key");
    std::fs::write(&path, "5a".repeat(32)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (dir, path)
}

fn coord(k: u64) -> Coord {
    Coord::new(k as i32, -(k as i32), 3)
}

/// What a key may hold: the acknowledged value, or (after a write that
/// failed) possibly the failed write's value.
#[derive(Default)]
struct Model {
    acked: BTreeMap<u64, Vec<u8>>,
    maybe: BTreeMap<u64, Option<Vec<u8>>>,
}

/// Opens the engine, retrying when an injected fault hits recovery itself
/// (an I/O error is a fine answer; garbage or a panic is not).
fn open(disk: &mut SimDisk, key: &Path, seed: u64, step: usize) -> Engine {
    for attempt in 0..50 {
        match Engine::open(config(disk, key)) {
            Ok(engine) => return engine,
            Err(StoreError::Io { .. }) => {
                // The failed attempt may have written; power-cycle and retry.
                *disk = disk.crash();
            }
            Err(e) => panic!("seed {seed} step {step} attempt {attempt}: recovery refused: {e}"),
        }
    }
    panic!("seed {seed} step {step}: recovery kept failing on injected I/O errors");
}

fn verify(engine: &Engine, model: &mut Model, seed: u64, step: usize) {
    for k in 0..KEYS {
        let got = engine
            .get(&ns(seed), coord(k))
            .unwrap_or_else(|| {
                panic!("seed {seed} step {step}: the acknowledged namespace is gone")
            })
            .map(|v| v.to_vec());
        let acked = model.acked.get(&k).cloned();
        let ok = got == acked || model.maybe.get(&k).is_some_and(|m| *m == got);
        assert!(
            ok,
            "seed {seed} step {step}: key {k} holds {got:?}; acknowledged {acked:?}, or maybe {:?}. \
             Replay: CUBE_SIM_SEED={seed} cargo test -p cube-store --test storage_faults",
            model.maybe.get(&k)
        );
        // What recovery shows is now the truth.
        match got {
            Some(v) => model.acked.insert(k, v),
            None => model.acked.remove(&k),
        };
    }
    model.maybe.clear();
}

fn simulate(seed: u64) {
    let plan = FaultPlan {
        seed,
        write_eio_ppm: 2_000,
        write_enospc_ppm: 1_000,
        sync_eio_ppm: 3_000,
        dir_sync_eio_ppm: 2_000,
        ..FaultPlan::default()
    };
    let mut disk = SimDisk::new(plan);
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut model = Model::default();
    let (_key_dir, key) = key_file();
    let mut engine = open(&mut disk, &key, seed, 0);
    if seed % 2 == 1 {
        // Create the encrypted namespace, through faults if need be.
        let mut meta = cube_store::namespace::NamespaceMeta::implicit_default(0);
        meta.encrypted = true;
        loop {
            let created = engine.session().unwrap().write(Mutation::NamespaceCreate {
                ns: ns(seed),
                meta: meta.clone(),
            });
            match created {
                Ok(_) => break,
                Err(e) if e.kind == WriteErrorKind::NamespaceExists => break,
                Err(_) => {
                    let crashed = disk.crash();
                    engine.close_without_checkpoint();
                    drop(engine);
                    disk = crashed;
                    engine = open(&mut disk, &key, seed, 0);
                }
            }
        }
    }
    if seed % 2 == 1 {
        assert!(engine.memstore().sealed_id(&ns(seed)).is_some());
    }
    let mut latched = false;
    for step in 0..STEPS {
        let roll = rng.below(100);
        if roll < 70 && !latched {
            let k = rng.below(KEYS);
            let (mutation, value) = if rng.below(4) == 0 {
                (
                    Mutation::Del {
                        ns: ns(seed),
                        coord: coord(k),
                    },
                    None,
                )
            } else {
                let len = rng.below(300) as usize;
                let v = vec![(seed as u8).wrapping_add(step as u8); len];
                (
                    Mutation::Put {
                        ns: ns(seed),
                        coord: coord(k),
                        value: v.clone(),
                    },
                    Some(v),
                )
            };
            match engine.session().unwrap().write(mutation) {
                Ok(_) => {
                    match value {
                        Some(v) => model.acked.insert(k, v),
                        None => model.acked.remove(&k),
                    };
                    model.maybe.remove(&k);
                }
                Err(e) => {
                    assert!(
                        matches!(
                            e.kind,
                            WriteErrorKind::StorageIo
                                | WriteErrorKind::DiskFull
                                | WriteErrorKind::WritesDisabled
                        ),
                        "seed {seed} step {step}: unexpected write error {e:?}"
                    );
                    if e.kind != WriteErrorKind::WritesDisabled {
                        model.maybe.insert(k, value);
                    }
                    latched = true;
                }
            }
        } else if roll < 80 && !latched {
            // A checkpoint may fail on an injected fault; that must not lose anything.
            let _ = engine.checkpoint();
        } else {
            // Power loss at this moment (also the only way out of a latched writer).
            let crashed = disk.crash();
            engine.close_without_checkpoint();
            drop(engine);
            disk = crashed;
            engine = open(&mut disk, &key, seed, step);
            verify(&engine, &mut model, seed, step);
            latched = false;
        }
    }
    let crashed = disk.crash();
    engine.close_without_checkpoint();
    drop(engine);
    disk = crashed.with_plan(FaultPlan {
        seed,
        ..FaultPlan::default()
    });
    let engine = open(&mut disk, &key, seed, STEPS);
    verify(&engine, &mut model, seed, STEPS);
    engine.close_without_checkpoint();
}

#[test]
fn random_operations_faults_and_power_loss_never_lose_acknowledged_writes() {
    let seeds: Vec<u64> = match (
        std::env::var("CUBE_SIM_SEED"),
        std::env::var("CUBE_SIM_SEEDS"),
    ) {
        (Ok(one), _) => vec![one.parse().unwrap()],
        (_, Ok(n)) => (1..=n.parse::<u64>().unwrap()).collect(),
        _ => (1..=CI_SEEDS).collect(),
    };
    for seed in seeds {
        simulate(seed);
    }
}
