//! Guards the checkpoint protocol: random puts, deletes, checkpoints,
//! compactions, clean restarts and crashes — including a crash injected at
//! every step of the checkpoint and compaction protocols — always recover
//! to exactly the state a `BTreeMap` model holds.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cube_protocol::{Coord, NamespaceName};
use cube_store::{CrashPoint, Engine, EngineConfig, Mutation, StoreError};
use proptest::prelude::*;

const KEYS: i32 = 24;

#[derive(Clone, Debug)]
enum Op {
    Put(i32, u8, usize),
    Del(i32),
    Checkpoint,
    Compact,
    Restart,
    Crash,
    CheckpointCrashingAt(usize),
    CompactCrashingAt(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..KEYS, any::<u8>(), 0usize..200).prop_map(|(k, b, n)| Op::Put(k, b, n)),
        3 => (0..KEYS).prop_map(Op::Del),
        2 => Just(Op::Checkpoint),
        1 => Just(Op::Compact),
        1 => Just(Op::Restart),
        1 => Just(Op::Crash),
        2 => (0..CrashPoint::ALL.len()).prop_map(Op::CheckpointCrashingAt),
        1 => (0..CrashPoint::ALL.len()).prop_map(Op::CompactCrashingAt),
    ]
}

fn config(dir: &Path, crash_at: Option<CrashPoint>) -> EngineConfig {
    let mut c = EngineConfig::new(dir);
    // Small segments: folds span several of them, and rolls happen often.
    c.group_commit.segment_bytes = 600;
    // No background folds: the test decides when checkpoints happen.
    c.checkpoint.poll_interval = Duration::from_secs(3600);
    c.checkpoint.delta_compact_bytes = u64::MAX / 4;
    c.checkpoint.crash_at = crash_at;
    c
}

fn ns() -> NamespaceName {
    NamespaceName::new("default").unwrap()
}

fn coord(k: i32) -> Coord {
    Coord::new(k - 12, k * 7, -k)
}

fn assert_matches(engine: &Engine, model: &BTreeMap<i32, Vec<u8>>, context: &str) {
    for k in 0..KEYS {
        let got = engine.get(&ns(), coord(k)).unwrap().map(|v| v.to_vec());
        assert_eq!(got.as_ref(), model.get(&k), "key {k} after {context}");
    }
}

fn run(ops: &[Op]) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut model: BTreeMap<i32, Vec<u8>> = BTreeMap::new();
    let mut engine = Engine::open(config(&dir, None)).unwrap();
    for (step, op) in ops.iter().enumerate() {
        let context = format!("step {step}: {op:?}");
        match op {
            Op::Put(k, byte, len) => {
                let value = vec![*byte; *len];
                engine
                    .session()
                    .unwrap()
                    .write(Mutation::Put {
                        ns: ns(),
                        coord: coord(*k),
                        value: value.clone(),
                    })
                    .unwrap();
                model.insert(*k, value);
            }
            Op::Del(k) => {
                let ack = engine
                    .session()
                    .unwrap()
                    .write(Mutation::Del {
                        ns: ns(),
                        coord: coord(*k),
                    })
                    .unwrap();
                assert_eq!(ack.existed, model.remove(k).is_some(), "{context}");
            }
            Op::Checkpoint => {
                engine.checkpoint().unwrap();
            }
            Op::Compact => {
                engine.compact().unwrap();
            }
            Op::Restart => {
                engine.shutdown().unwrap();
                drop(engine);
                engine = Engine::open(config(&dir, None)).unwrap();
                assert_eq!(
                    engine.recovery_report().records_replayed,
                    0,
                    "a clean restart replays nothing"
                );
            }
            Op::Crash => {
                engine.close_without_checkpoint();
                drop(engine);
                engine = Engine::open(config(&dir, None)).unwrap();
            }
            Op::CheckpointCrashingAt(i) | Op::CompactCrashingAt(i) => {
                let point = CrashPoint::ALL[*i];
                engine.close_without_checkpoint();
                drop(engine);
                let crashing = Engine::open(config(&dir, Some(point))).unwrap();
                let result = if matches!(op, Op::CheckpointCrashingAt(_)) {
                    crashing.checkpoint().map(|_| ())
                } else {
                    crashing.compact().map(|_| ())
                };
                match result {
                    Ok(()) | Err(StoreError::SimulatedCrash(_)) => {}
                    Err(e) => panic!("{context}: {e}"),
                }
                crashing.close_without_checkpoint();
                drop(crashing);
                engine = Engine::open(config(&dir, None)).unwrap();
            }
        }
        assert_matches(&engine, &model, &context);
    }
    engine.shutdown().unwrap();
    drop(engine);
    let engine = Engine::open(config(&dir, None)).unwrap();
    assert_matches(&engine, &model, "the final restart");
    engine.close_without_checkpoint();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn incremental_checkpoint_delta_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(&ops);
    }
}

/// Every crash point, deterministically, after enough writes that both the
/// fold and the compaction have several files and segments to work on.
#[test]
fn every_crash_point_recovers_the_acknowledged_state() {
    for point in 0..CrashPoint::ALL.len() {
        let mut ops = Vec::new();
        for round in 0..3u8 {
            for k in 0..KEYS {
                ops.push(Op::Put(k, round.wrapping_mul(31).wrapping_add(k as u8), 40));
            }
            ops.push(Op::Del(round as i32));
            ops.push(Op::Checkpoint);
        }
        ops.push(Op::Put(1, 9, 10));
        ops.push(Op::CheckpointCrashingAt(point));
        ops.push(Op::Put(2, 8, 10));
        ops.push(Op::Checkpoint);
        ops.push(Op::CompactCrashingAt(point));
        ops.push(Op::Put(3, 7, 10));
        ops.push(Op::Restart);
        run(&ops);
    }
}
