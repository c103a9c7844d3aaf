//! Guards the checkpoint protocol: random puts, deletes, checkpoints,
//! compactions, clean restarts and crashes — including a crash injected at
//! every step of the checkpoint and compaction protocols, run files and
//! their merges included — always recover to exactly the state a
//! `BTreeMap` model holds, in a Morton namespace and in a Hilbert one that
//! is dropped and created again (its runs deleted), with exact cell counts.
//! Each is run twice: with every namespace in memory, and with none (a
//! resident budget of 0 bytes and a block cache of three blocks), so that
//! namespaces move to disk as they are written (`cube_store::disk_tier`),
//! restarts open their runs' indexes only, and every read, scan and
//! `mget` goes through the block cache's eviction.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cube_protocol::{CellBox, Coord, NamespaceName};
use cube_store::curve::Curve;
use cube_store::disk_tier::TierConfig;
use cube_store::namespace::NamespaceMeta;
use cube_store::{CrashPoint, Engine, EngineConfig, Mutation, ScanLimits, StoreError, Visit};
use proptest::prelude::*;

const KEYS: i32 = 24;
/// `default` (Morton) and a Hilbert namespace.
const NAMESPACES: usize = 2;

#[derive(Clone, Debug)]
enum Op {
    Put(usize, i32, u8, usize),
    Del(usize, i32),
    /// Drops the Hilbert namespace and creates it again, empty.
    Recreate,
    Checkpoint,
    Compact,
    Restart,
    Crash,
    CheckpointCrashingAt(usize),
    CompactCrashingAt(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..NAMESPACES, 0..KEYS, any::<u8>(), 0usize..200)
            .prop_map(|(ns, k, b, n)| Op::Put(ns, k, b, n)),
        3 => (0..NAMESPACES, 0..KEYS).prop_map(|(ns, k)| Op::Del(ns, k)),
        1 => Just(Op::Recreate),
        2 => Just(Op::Checkpoint),
        1 => Just(Op::Compact),
        1 => Just(Op::Restart),
        1 => Just(Op::Crash),
        2 => (0..CrashPoint::ALL.len()).prop_map(Op::CheckpointCrashingAt),
        1 => (0..CrashPoint::ALL.len()).prop_map(Op::CompactCrashingAt),
    ]
}

/// Where the cells are served from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tiers {
    Memory,
    /// No resident budget, a three-block cache, a row cache of a few
    /// hundred values (kept across folds: a stale one would be read).
    Disk,
}

fn config(dir: &Path, crash_at: Option<CrashPoint>, tiers: Tiers) -> EngineConfig {
    let mut c = EngineConfig::new(dir);
    if tiers == Tiers::Disk {
        c.tiers = TierConfig {
            resident_limit_bytes: 0,
            block_cache_bytes: 3 * 4096,
            row_cache_bytes: 64 * 1024,
            memtable_limit_bytes: 1 << 20,
        };
    }
    // Small segments: folds span several of them, and rolls happen often.
    c.group_commit.segment_bytes = 600;
    // No background folds: the test decides when checkpoints happen.
    c.checkpoint.poll_interval = Duration::from_secs(3600);
    c.checkpoint.delta_compact_bytes = u64::MAX / 4;
    c.checkpoint.crash_at = crash_at;
    // A keyed run (`run_keyed`) left its key beside the data dir.
    let key = key_path(dir);
    c.key_file = key.exists().then_some(key);
    c
}

fn key_path(dir: &Path) -> std::path::PathBuf {
    dir.with_file_name("master.key")
}

fn ns(i: usize) -> NamespaceName {
    NamespaceName::new(["default", "hilbert"][i]).unwrap()
}

/// Creates the Hilbert namespace (encrypted when the data dir has a key:
/// its runs are sealed).
fn create_hilbert(engine: &Engine, dir: &Path) {
    let mut meta = NamespaceMeta::implicit_default(1000);
    meta.curve = Curve::Hilbert;
    meta.encrypted = key_path(dir).exists();
    engine
        .session()
        .unwrap()
        .write(Mutation::NamespaceCreate { ns: ns(1), meta })
        .unwrap();
}

type Model = BTreeMap<(usize, i32), Vec<u8>>;

fn coord(k: i32) -> Coord {
    Coord::new(k - 12, k * 7, -k)
}

fn assert_matches(engine: &Engine, model: &Model, context: &str) {
    let mem = engine.memstore();
    for i in 0..NAMESPACES {
        for k in 0..KEYS {
            let got = engine
                .get(&ns(i), coord(k))
                .unwrap()
                .unwrap()
                .map(|v| v.to_vec());
            assert_eq!(got.as_ref(), model.get(&(i, k)), "{i}:{k} after {context}");
        }
        // One batched read of every key, and a scan of a box holding them
        // all, in pages of 5 (a page ends inside the runs' blocks).
        let coords: Vec<Coord> = (0..KEYS).map(coord).collect();
        let mut batch = vec![None; coords.len()];
        mem.read_cells(&ns(i), &coords, |at, v| batch[at] = v.map(|v| v.to_vec()))
            .unwrap()
            .unwrap();
        for (k, got) in batch.iter().enumerate() {
            assert_eq!(
                got.as_ref(),
                model.get(&(i, k as i32)),
                "mget {i}:{k} after {context}"
            );
        }
        let region = CellBox::new(Coord::new(-20, 0, -30), Coord::new(20, 200, 0)).unwrap();
        let mut scanned: BTreeMap<(i32, i32, i32), Vec<u8>> = BTreeMap::new();
        let mut after = None;
        loop {
            let limits = ScanLimits {
                max_cells: 5,
                max_steps: ScanLimits::MAX_STEPS,
            };
            let outcome = mem
                .scan(&ns(i), &region, after, limits, |c, v| {
                    assert!(
                        scanned.insert((c.x, c.y, c.z), v.to_vec()).is_none(),
                        "{c:?} scanned twice after {context}"
                    );
                    Visit::Take
                })
                .unwrap()
                .unwrap();
            match outcome.resume_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let want: BTreeMap<(i32, i32, i32), Vec<u8>> = model
            .iter()
            .filter(|((at, _), _)| *at == i)
            .map(|((_, k), v)| {
                let c = coord(*k);
                ((c.x, c.y, c.z), v.clone())
            })
            .collect();
        assert_eq!(scanned, want, "scan of namespace {i} after {context}");
        let usage = engine.memstore().namespace_usage(&ns(i)).unwrap();
        let cells = model.keys().filter(|(at, _)| *at == i).count() as u64;
        assert_eq!(usage.cells, cells, "namespace {i}'s count after {context}");
    }
}

/// Runs `ops`; returns the crash points that fired.
fn run(ops: &[Op], tiers: Tiers) -> Vec<CrashPoint> {
    run_in(tempfile::tempdir().unwrap(), ops, tiers)
}

/// [`run`] with a master key: the Hilbert namespace is encrypted, its
/// runs sealed, the others authenticated.
fn run_keyed(ops: &[Op], tiers: Tiers) -> Vec<CrashPoint> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let key = key_path(&tmp.path().join("data"));
    std::fs::write(&key, "5a".repeat(32)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    run_in(tmp, ops, tiers)
}

fn run_in(tmp: tempfile::TempDir, ops: &[Op], tiers: Tiers) -> Vec<CrashPoint> {
    let mut fired = Vec::new();
    let dir = tmp.path().join("data");
    let mut model = Model::new();
    let mut engine = Engine::open(config(&dir, None, tiers)).unwrap();
    create_hilbert(&engine, &dir);
    for (step, op) in ops.iter().enumerate() {
        let context = format!("step {step}: {op:?}");
        match op {
            Op::Put(i, k, byte, len) => {
                let value = vec![*byte; *len];
                engine
                    .session()
                    .unwrap()
                    .write(Mutation::Put {
                        ns: ns(*i),
                        coord: coord(*k),
                        value: value.clone(),
                    })
                    .unwrap();
                model.insert((*i, *k), value);
            }
            Op::Del(i, k) => {
                let ack = engine
                    .session()
                    .unwrap()
                    .write(Mutation::Del {
                        ns: ns(*i),
                        coord: coord(*k),
                    })
                    .unwrap();
                assert_eq!(ack.existed, model.remove(&(*i, *k)).is_some(), "{context}");
            }
            Op::Recreate => {
                engine
                    .session()
                    .unwrap()
                    .write(Mutation::NamespaceDrop { ns: ns(1) })
                    .unwrap();
                create_hilbert(&engine, &dir);
                model.retain(|(i, _), _| *i != 1);
            }
            Op::Checkpoint => {
                engine.checkpoint().unwrap();
                if tiers == Tiers::Disk {
                    // Over a budget of 0, a written namespace starts
                    // leaving memory after its write, and the fold moves
                    // it onto its runs.
                    for i in 0..NAMESPACES {
                        if model.keys().any(|(at, _)| *at == i) {
                            let tier = engine.memstore().namespace_tier(&ns(i));
                            assert_eq!(tier, Some("disk"), "namespace {i} at {context}");
                        }
                    }
                }
            }
            Op::Compact => {
                engine.compact().unwrap();
            }
            Op::Restart => {
                engine.shutdown().unwrap();
                drop(engine);
                engine = Engine::open(config(&dir, None, tiers)).unwrap();
                assert_eq!(
                    engine.recovery_report().records_replayed,
                    0,
                    "a clean restart replays nothing"
                );
            }
            Op::Crash => {
                engine.close_without_checkpoint();
                drop(engine);
                engine = Engine::open(config(&dir, None, tiers)).unwrap();
            }
            Op::CheckpointCrashingAt(i) | Op::CompactCrashingAt(i) => {
                let point = CrashPoint::ALL[*i];
                engine.close_without_checkpoint();
                drop(engine);
                let crashing = Engine::open(config(&dir, Some(point), tiers)).unwrap();
                let result = if matches!(op, Op::CheckpointCrashingAt(_)) {
                    crashing.checkpoint().map(|_| ())
                } else {
                    crashing.compact().map(|_| ())
                };
                match result {
                    Ok(()) => {}
                    Err(StoreError::SimulatedCrash(_)) => fired.push(point),
                    Err(e) => panic!("{context}: {e}"),
                }
                crashing.close_without_checkpoint();
                drop(crashing);
                engine = Engine::open(config(&dir, None, tiers)).unwrap();
            }
        }
        assert_matches(&engine, &model, &context);
    }
    engine.shutdown().unwrap();
    drop(engine);
    let engine = Engine::open(config(&dir, None, tiers)).unwrap();
    assert_matches(&engine, &model, "the final restart");
    if tiers == Tiers::Disk {
        // Restarted with no resident budget: a namespace holding cells
        // reads its runs (an empty one costs nothing in memory).
        for i in 0..NAMESPACES {
            if model.keys().any(|(at, _)| *at == i) {
                assert_eq!(
                    engine.memstore().namespace_tier(&ns(i)),
                    Some("disk"),
                    "{i}"
                );
            }
        }
    }
    engine.close_without_checkpoint();
    fired
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn incremental_checkpoint_delta_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(&ops, Tiers::Memory);
    }

    /// Namespaces served from their runs through a three-block cache.
    #[test]
    fn incremental_checkpoint_delta_model_on_disk(ops in proptest::collection::vec(op(), 1..60)) {
        run(&ops, Tiers::Disk);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// With a master key: sealed runs (the Hilbert namespace is encrypted)
    /// and authenticated ones, under the authenticated manifest.
    #[test]
    fn incremental_checkpoint_delta_model_keyed(ops in proptest::collection::vec(op(), 1..60)) {
        run_keyed(&ops, Tiers::Memory);
    }

    /// Keyed and on disk: the encrypted namespace's sealed runs decrypted
    /// only into a three-block cache.
    #[test]
    fn incremental_checkpoint_delta_model_keyed_on_disk(ops in proptest::collection::vec(op(), 1..60)) {
        run_keyed(&ops, Tiers::Disk);
    }
}

/// Every crash point, deterministically, after enough writes that both the
/// fold and the compaction have several files and segments to work on;
/// without a master key and with one (sealed and authenticated runs).
#[test]
fn every_crash_point_recovers_the_acknowledged_state() {
    for point in 0..CrashPoint::ALL.len() {
        let mut ops = Vec::new();
        for round in 0..3u8 {
            for i in 0..NAMESPACES {
                for k in 0..KEYS {
                    let byte = round.wrapping_mul(31).wrapping_add(k as u8);
                    ops.push(Op::Put(i, k, byte, 40));
                }
                ops.push(Op::Del(i, round as i32));
            }
            ops.push(Op::Checkpoint);
        }
        // Small runs over a large one: no merge is due at the checkpoint,
        // and the compaction merges (several runs each).
        for i in 0..NAMESPACES {
            ops.push(Op::Put(i, 1, 9, 10));
            ops.push(Op::Del(i, 5));
        }
        ops.push(Op::CheckpointCrashingAt(point));
        for i in 0..NAMESPACES {
            ops.push(Op::Put(i, 2, 8, 10));
            ops.push(Op::Del(i, 6));
        }
        ops.push(Op::Checkpoint);
        ops.push(Op::CompactCrashingAt(point));
        ops.push(Op::Put(0, 3, 7, 10));
        ops.push(Op::Restart);
        // A fold that drops a namespace with runs, and one whose runs are
        // merged because they grew: both remove several run files.
        ops.push(Op::Recreate);
        ops.push(Op::Put(1, 4, 1, 10));
        ops.push(Op::CheckpointCrashingAt(point));
        for k in 0..KEYS {
            ops.push(Op::Put(1, k, 2, 60));
        }
        ops.push(Op::Checkpoint);
        for k in 0..KEYS {
            ops.push(Op::Put(1, k, 3, 60));
        }
        ops.push(Op::CheckpointCrashingAt(point));
        ops.push(Op::Restart);
        let point = CrashPoint::ALL[point];
        for tiers in [Tiers::Memory, Tiers::Disk] {
            assert!(
                run(&ops, tiers).contains(&point),
                "{tiers:?}: {point:?} never fired"
            );
            assert!(
                run_keyed(&ops, tiers).contains(&point),
                "{tiers:?}, keyed: {point:?} never fired"
            );
        }
    }
}

fn largest_run_file(dir: &Path) -> std::path::PathBuf {
    std::fs::read_dir(dir.join("checkpoint"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "run"))
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap()
}

fn run_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("checkpoint"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "run")
        })
        .count()
}

/// Waits until no merge is in flight (the merge thread's last one
/// installed); the bound only catches a hang.
fn merges_settled(engine: &Engine) {
    assert!(
        engine.wait_for_stats(Duration::from_secs(120), |stats| stats.merges_in_flight
            == 0),
        "a merge hangs"
    );
}

/// A fold writes one run per namespace that has cells; a namespace's runs
/// are deleted with it at the next fold; folds keep a namespace's runs
/// few (merging when they grow) and a compaction merges them into one.
#[test]
fn runs_are_per_namespace_deleted_with_it_and_kept_few() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let engine = Engine::open(config(&dir, None, Tiers::Memory)).unwrap();
    create_hilbert(&engine, &dir);
    let put = |i: usize, k: i32, len: usize| {
        engine
            .session()
            .unwrap()
            .write(Mutation::Put {
                ns: ns(i),
                coord: coord(k),
                value: vec![k as u8; len],
            })
            .unwrap();
    };
    for k in 0..KEYS {
        put(0, k, 100);
        put(1, k, 100);
    }
    engine.checkpoint().unwrap();
    assert_eq!(run_files(&dir), 2, "one run per namespace");
    engine
        .session()
        .unwrap()
        .write(Mutation::NamespaceDrop { ns: ns(1) })
        .unwrap();
    put(0, 0, 10);
    engine.checkpoint().unwrap();
    assert_eq!(run_files(&dir), 2, "the default namespace's two runs");
    let base = largest_run_file(&dir);
    for round in 0..12 {
        put(0, round % KEYS, 10);
        engine.checkpoint().unwrap();
        // A merge the fold found due runs on the merge thread.
        merges_settled(&engine);
        let runs = run_files(&dir);
        assert!(runs <= 5, "round {round}: {runs} runs");
        // Small runs over a large one: only the small ones are merged;
        // the large one is not rewritten.
        assert!(base.exists(), "round {round}: the oldest run was rewritten");
    }
    engine.compact().unwrap();
    assert_eq!(run_files(&dir), 1, "compacted to one run");
    engine.shutdown().unwrap();
    drop(engine);
    let engine = Engine::open(config(&dir, None, Tiers::Memory)).unwrap();
    let usage = engine.memstore().namespace_usage(&ns(0)).unwrap();
    assert_eq!(usage.cells, KEYS as u64);
    assert!(engine.memstore().namespace_usage(&ns(1)).is_none());
    engine.close_without_checkpoint();
}

/// A fold takes the counts it records from the writer's mark at its last
/// record (no lookup of each folded key in the older runs), after a crash
/// too, and they are the cells': a restart with the namespaces loaded
/// into memory recounts them against the manifest (and refuses a
/// mismatch), and one from their runs reports the manifest's. Debug
/// builds also check each marked count against the lookups it replaces.
#[test]
fn a_fold_counts_from_the_writers_mark_and_a_restart_agrees() {
    for tiers in [Tiers::Memory, Tiers::Disk] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let mut engine = Engine::open(config(&dir, None, tiers)).unwrap();
        create_hilbert(&engine, &dir);
        let mut model = Model::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut write_some = |engine: &Engine, model: &mut Model, writes: usize| {
            for _ in 0..writes {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let (i, k) = ((seed % 2) as usize, (seed >> 8) as i32 % KEYS);
                let mutation = if seed.is_multiple_of(5) {
                    model.remove(&(i, k));
                    Mutation::Del {
                        ns: ns(i),
                        coord: coord(k),
                    }
                } else {
                    let value = vec![k as u8; (seed >> 20) as usize % 90];
                    model.insert((i, k), value.clone());
                    Mutation::Put {
                        ns: ns(i),
                        coord: coord(k),
                        value,
                    }
                };
                engine.session().unwrap().write(mutation).unwrap();
            }
        };
        let assert_counts = |engine: &Engine, model: &Model, context: &str| {
            for i in 0..NAMESPACES {
                let usage = engine.memstore().namespace_usage(&ns(i)).unwrap();
                let mine = model.iter().filter(|((at, _), _)| *at == i);
                let cells = mine.clone().count() as u64;
                let bytes: u64 = mine.map(|(_, v)| v.len() as u64).sum();
                assert_eq!((usage.cells, usage.bytes), (cells, bytes), "{i} {context}");
            }
        };
        // Over several segments, overwrites and deletes of cells the
        // older runs hold.
        for round in 0..3 {
            write_some(&engine, &mut model, 150);
            let report = engine.checkpoint().unwrap();
            assert!(report.segments_folded > 1, "{tiers:?} {round}: {report:?}");
            assert_eq!(
                report.namespaces_counted_by_writer, NAMESPACES,
                "{tiers:?} round {round}: both namespaces counted from the mark"
            );
        }
        // A crash: the records since the last fold are replayed (their
        // previous values looked up as the writer does), and the roll of
        // the recovered segment marks the counts; then replayed records
        // and new ones in one fold.
        for new_writes in [0, 150] {
            write_some(&engine, &mut model, 150);
            engine.close_without_checkpoint();
            drop(engine);
            engine = Engine::open(config(&dir, None, tiers)).unwrap();
            assert!(engine.recovery_report().records_replayed > 0);
            write_some(&engine, &mut model, new_writes);
            let report = engine.checkpoint().unwrap();
            assert_eq!(
                report.namespaces_counted_by_writer, NAMESPACES,
                "{tiers:?} after a crash, {new_writes} new writes: {report:?}"
            );
        }
        assert_counts(&engine, &model, "before the restarts");
        engine.shutdown().unwrap();
        drop(engine);
        for reopen in [Tiers::Memory, Tiers::Disk] {
            let engine = Engine::open(config(&dir, None, reopen)).unwrap();
            assert_counts(&engine, &model, &format!("{tiers:?}, reopened {reopen:?}"));
            engine.close_without_checkpoint();
        }
    }
}
