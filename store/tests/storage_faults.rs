//! Guards the engine against storage faults, deterministically: on a
//! simulated disk that loses unsynced data on power loss, tears writes into
//! sectors, fails writes and syncs (EIO, ENOSPC) and "succeeds" on a retried
//! failed fsync, random operations, faults and crashes never lose an
//! acknowledged write, never return garbage, and never panic. Odd seeds
//! write into an encrypted namespace, so sealed records and sealed
//! checkpoint blocks go through the same faults.
//!
//! Every third seed also fails reads (EIO, short reads, flipped bits; the
//! stored bytes stay intact): a fold or merge that meets one fails and is
//! retried at a later checkpoint, never recording wrong cells or counts;
//! a start that meets one comes up with exactly the acknowledged state or
//! refuses with an I/O error or a corruption naming file and offset, and
//! the start after it, with reads clean, recovers everything.
//!
//! The same seeds fail whole-file reads too, WAL recovery's reads of
//! segments among them: a start whose segment read fails, stops short or
//! returns a flipped bit refuses with an I/O error (or a corruption) that
//! names that segment and an offset, and changes nothing; the start after
//! it, with reads clean, recovers everything.
//!
//! CI runs a fixed set of seeds. `CUBE_SIM_SEEDS=N` runs N seeds
//! (`make sim SEEDS=N`); `CUBE_SIM_SEED=S` replays one seed.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cube_protocol::{Coord, NamespaceName};
use cube_store::sim_disk::{FaultPlan, InjectedReadFault, ReadFaultKind, SimDisk};
use cube_store::{Engine, EngineConfig, Mutation, StoreError, WriteErrorKind};

const KEYS: u64 = 40;
const STEPS: usize = 300;
const CI_SEEDS: u64 = 24;
/// Read fault rates of the seeds that have them, per read: high, as a
/// small data dir reads few blocks.
const READ_EIO_PPM: u32 = 5_000;
const READ_SHORT_PPM: u32 = 3_000;
const READ_FLIP_PPM: u32 = 8_000;

/// Seeds whose disk also fails reads.
fn read_faults_on(seed: u64) -> bool {
    seed.is_multiple_of(3)
}

/// What the read faults did, over the seeds run (printed, and checked so
/// that the test cannot pass by never injecting them).
#[derive(Debug, Default)]
struct ReadFaultTally {
    seeds: u64,
    seeds_fired: u64,
    eio: u64,
    short: u64,
    flip: u64,
    starts_served: u64,
    starts_refused_io: u64,
    starts_refused_corruption: u64,
    checkpoints_done: u64,
    /// Run files merged by the compactions that succeeded under read faults.
    runs_merged: u64,
    /// Checkpoints failed by a read fault (not a write fault)...
    checkpoints_failed_on_read: u64,
    /// ... and later ones of the same engine that succeeded: a fold or
    /// merge that met a bad read is retried, not given up.
    checkpoints_retried: u64,
    /// Faults of whole-file reads of WAL segments (at starts and folds).
    wal_eio: u64,
    wal_short: u64,
    wal_flip: u64,
    /// Starts whose last read fault was in reading a WAL segment: refused
    /// with an I/O error naming the segment and an offset...
    wal_starts_refused_io: u64,
    /// ... or with a corruption naming them...
    wal_starts_refused_corruption: u64,
    /// ... never served: recovery reads a segment again before it acts on
    /// damage, and two reads that differ refuse the start.
    wal_starts_served: u64,
}

/// The last read fault injected since the log held `before` entries, if
/// it was in a whole-file read of a WAL segment.
fn last_wal_read_fault(disk: &SimDisk, before: usize) -> Option<InjectedReadFault> {
    disk.read_fault_log()
        .get(before..)
        .and_then(|new| new.last().cloned())
        .filter(|f| f.whole_file && f.file.ends_with(".wal"))
}

/// Checks that a start refused after a read fault in WAL segment `fault`
/// names that segment and an offset.
fn assert_names_segment(e: &StoreError, fault: &InjectedReadFault, seed: u64, step: usize) {
    let (StoreError::Io { path, .. } | StoreError::Corruption { path, .. }) = e else {
        panic!("seed {seed} step {step}: a WAL read fault ({fault:?}) refused the start with {e}")
    };
    let message = e.to_string();
    assert!(
        path.starts_with("/sim/data/wal")
            && path.file_name().is_some_and(|n| *n == *fault.file)
            && message.contains("offset"),
        "seed {seed} step {step}: a refusal after a WAL read fault ({fault:?}) that does not \
         name the segment and an offset: {message}"
    );
}

/// Whether a checkpoint's error comes from a failed read: an injected
/// EIO, a short read, or a flipped bit caught as corruption.
fn read_fault_error(e: &StoreError) -> bool {
    let message = e.to_string();
    matches!(e, StoreError::Corruption { .. })
        || message.contains("simulated EIO on read")
        || message.contains("unexpected end of file")
}

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
    // Merges on the merge thread, but waited for: one order of I/O per seed.
    c.checkpoint.wait_for_merges = true;
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
/// (an I/O error is a fine answer; garbage or a panic is not). A start
/// that meets a read fault may also refuse with a corruption naming the
/// file and offset: then the next start reads cleanly (the bytes on disk
/// are intact) and must recover everything.
fn open(
    disk: &mut SimDisk,
    key: &Path,
    seed: u64,
    step: usize,
    tally: &mut ReadFaultTally,
) -> Engine {
    for attempt in 0..50 {
        let reads_fail = disk.plan().read_eio_ppm > 0;
        let faults_before = disk.read_fault_log().len();
        let started = Engine::open(config(disk, key));
        let wal_fault = last_wal_read_fault(disk, faults_before);
        if let (Err(e), Some(fault)) = (&started, &wal_fault) {
            assert_names_segment(e, fault, seed, step);
        }
        match started {
            Ok(engine) => {
                tally.starts_served += u64::from(reads_fail);
                tally.wal_starts_served += u64::from(wal_fault.is_some());
                // Every misread of a segment looks like damage (CRCs, the
                // zeros after the records); served, recovery acted on it,
                // e.g. zeroed acknowledged groups as a "torn tail".
                assert!(
                    wal_fault.is_none(),
                    "seed {seed} step {step}: a start served after its read of a WAL segment \
                     went wrong ({wal_fault:?}): recovery acted on bytes it read once"
                );
                return engine;
            }
            Err(StoreError::Io { .. }) if wal_fault.is_some() => {
                tally.starts_refused_io += 1;
                tally.wal_starts_refused_io += 1;
                // The segment is intact: the next start reads it cleanly
                // and must recover everything.
                *disk = disk.with_plan(FaultPlan {
                    read_eio_ppm: 0,
                    read_short_ppm: 0,
                    read_flip_ppm: 0,
                    ..disk.plan()
                });
            }
            Err(StoreError::Io { .. }) => {
                tally.starts_refused_io += u64::from(reads_fail);
                // The failed attempt may have written; power-cycle and retry.
                *disk = disk.crash();
            }
            Err(e @ StoreError::Corruption { .. }) if reads_fail => {
                let StoreError::Corruption { path, offset, .. } = &e else {
                    unreachable!()
                };
                let message = e.to_string();
                assert!(
                    message.contains(&path.display().to_string())
                        && message.contains(&format!("offset {offset}"))
                        && path.starts_with("/sim/data"),
                    "seed {seed} step {step}: a refusal that does not name file and offset: {message}"
                );
                tally.starts_refused_corruption += 1;
                tally.wal_starts_refused_corruption += u64::from(wal_fault.is_some());
                *disk = disk.with_plan(FaultPlan {
                    read_eio_ppm: 0,
                    read_short_ppm: 0,
                    read_flip_ppm: 0,
                    ..disk.plan()
                });
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
            .map(Result::unwrap)
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

fn simulate(seed: u64, tally: &mut ReadFaultTally) {
    let mut plan = FaultPlan {
        seed,
        write_eio_ppm: 2_000,
        write_enospc_ppm: 1_000,
        sync_eio_ppm: 3_000,
        dir_sync_eio_ppm: 2_000,
        ..FaultPlan::default()
    };
    if read_faults_on(seed) {
        plan.read_eio_ppm = READ_EIO_PPM;
        plan.read_short_ppm = READ_SHORT_PPM;
        plan.read_flip_ppm = READ_FLIP_PPM;
    }
    let mut disk = SimDisk::new(plan);
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut model = Model::default();
    let (_key_dir, key) = key_file();
    let mut engine = open(&mut disk, &key, seed, 0, tally);
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
                    engine = open(&mut disk, &key, seed, 0, tally);
                }
            }
        }
    }
    if seed % 2 == 1 {
        assert!(engine.memstore().sealed_id(&ns(seed)).is_some());
    }
    let mut latched = false;
    // A checkpoint of this engine failed on a read fault, not yet retried.
    let mut fold_to_retry = false;
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
            // A checkpoint may fail on an injected fault; that must not lose
            // anything, and a later one retries what it did not fold.
            let reads_fail = disk.plan().read_eio_ppm > 0;
            // Seeds with read faults also compact (merging every namespace's
            // runs), on odd steps: no roll of `rng`, so other seeds replay.
            let done = if read_faults_on(seed) && step % 2 == 1 {
                engine.compact()
            } else {
                engine.checkpoint()
            };
            if done.is_ok() && fold_to_retry {
                tally.checkpoints_retried += 1;
                fold_to_retry = false;
            }
            if reads_fail && let Ok(report) = &done {
                tally.checkpoints_done += 1;
                tally.runs_merged += report
                    .compaction
                    .as_ref()
                    .map_or(0, |c| c.runs_merged as u64);
            }
            if let Err(e) = done {
                assert!(
                    match e {
                        StoreError::Io { .. } | StoreError::WritesDisabled(_) => true,
                        // Only a flipped bit read back may look corrupt.
                        StoreError::Corruption { .. } => reads_fail,
                        _ => false,
                    },
                    "seed {seed} step {step}: unexpected checkpoint error {e}"
                );
                if reads_fail && read_fault_error(&e) {
                    tally.checkpoints_failed_on_read += 1;
                    fold_to_retry = true;
                }
            }
        } else {
            // Power loss at this moment (also the only way out of a latched writer).
            let crashed = disk.crash();
            engine.close_without_checkpoint();
            drop(engine);
            // Read faults back on if a refused start turned them off.
            disk = if crashed.plan() == plan {
                crashed
            } else {
                crashed.with_plan(plan)
            };
            engine = open(&mut disk, &key, seed, step, tally);
            verify(&engine, &mut model, seed, step);
            latched = false;
            fold_to_retry = false;
        }
    }
    let crashed = disk.crash();
    engine.close_without_checkpoint();
    drop(engine);
    disk = crashed.with_plan(FaultPlan {
        seed,
        ..FaultPlan::default()
    });
    let engine = open(&mut disk, &key, seed, STEPS, tally);
    verify(&engine, &mut model, seed, STEPS);
    engine.close_without_checkpoint();
    if read_faults_on(seed) {
        let fired = disk.read_faults();
        tally.seeds += 1;
        tally.seeds_fired += u64::from(fired.eio + fired.short + fired.flip > 0);
        tally.eio += fired.eio;
        tally.short += fired.short;
        tally.flip += fired.flip;
        for fault in disk.read_fault_log() {
            if fault.whole_file && fault.file.ends_with(".wal") {
                *match fault.kind {
                    ReadFaultKind::Eio => &mut tally.wal_eio,
                    ReadFaultKind::Short => &mut tally.wal_short,
                    ReadFaultKind::Flip => &mut tally.wal_flip,
                } += 1;
            }
        }
    }
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
    let mut tally = ReadFaultTally::default();
    for seed in &seeds {
        simulate(*seed, &mut tally);
    }
    eprintln!("{} seeds; read faults: {tally:?}", seeds.len());
    if tally.seeds >= 4 {
        assert!(
            tally.seeds_fired * 4 >= tally.seeds * 3
                && tally.flip > 0
                && tally.starts_refused_corruption > 0
                && tally.checkpoints_retried > 0,
            "read faults fired in too few seeds to test anything: {tally:?}"
        );
    }
    if tally.seeds >= 8 {
        assert!(
            tally.wal_eio + tally.wal_short > 0
                && tally.wal_flip > 0
                && tally.wal_starts_refused_io > 0,
            "read faults met WAL recovery's segment reads too rarely to test them: {tally:?}"
        );
    }
}
