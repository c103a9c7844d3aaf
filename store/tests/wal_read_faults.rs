//! Guards WAL recovery against faults of its own reads, on the simulated
//! disk: a read of a segment that fails (EIO), stops short, or returns a
//! bit flipped (the file on disk intact) makes the start refuse with an
//! I/O error naming the segment and an offset; the segment is left exactly
//! as it was; and the next start, reading cleanly, serves every
//! acknowledged write. A flip in the last commit group used to be taken
//! for a torn tail and zeroed, destroying acknowledged writes. Damage
//! that is on disk still meets the rules, `--repair` included.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use cube_protocol::{Coord, NamespaceName};
use cube_store::sim_disk::{FaultPlan, ReadFaultKind, SimDisk};
use cube_store::{Engine, EngineConfig, Mutation, StoreError};

const DATA: &str = "/sim/data";

fn config(disk: &SimDisk, segment_bytes: u64) -> EngineConfig {
    let mut c = common::sim_config(disk);
    c.group_commit.segment_bytes = segment_bytes;
    c
}

fn ns() -> NamespaceName {
    NamespaceName::new("default").unwrap()
}

fn value(k: i32) -> Vec<u8> {
    vec![k as u8; 100]
}

/// A power-cycled disk whose log holds `puts` acknowledged puts, each its
/// own commit group, in segments of `segment_bytes`.
fn disk_with_puts(puts: i32, segment_bytes: u64) -> SimDisk {
    let disk = SimDisk::new(FaultPlan {
        seed: 1,
        ..FaultPlan::default()
    });
    let engine = Engine::open(config(&disk, segment_bytes)).unwrap();
    for k in 0..puts {
        engine
            .session()
            .unwrap()
            .write(Mutation::Put {
                ns: ns(),
                coord: Coord::new(k, 0, 0),
                value: value(k),
            })
            .unwrap();
    }
    engine.close_without_checkpoint();
    drop(engine);
    disk.crash()
}

/// The log's segments with records, oldest first.
fn segments(disk: &SimDisk) -> Vec<PathBuf> {
    let wal = Path::new(DATA).join("wal");
    let mut names: Vec<String> = cube_store::storage::Storage::list_dir(disk, &wal)
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(".wal"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|n| wal.join(n))
        .filter(|p| !record_ends(disk, p).is_empty())
        .collect()
}

fn read(disk: &SimDisk, path: &Path) -> Vec<u8> {
    cube_store::storage::Storage::read_file(disk, path).unwrap()
}

/// Where each record of a segment ends.
fn record_ends(disk: &SimDisk, path: &Path) -> Vec<u64> {
    common::record_ends(&read(disk, path))
}

/// On a fresh disk of `puts` (the same layout each time), aims `kind` at
/// `offset` of the next read of segment `index`, starts (with `--repair`
/// if `repair`), and checks the refusal, the segment left as it was, and a
/// clean start after it serving all `puts`.
fn refused_then_recovered(
    puts: i32,
    segment_bytes: u64,
    index: usize,
    (kind, offset): (ReadFaultKind, u64),
    repair: bool,
) {
    let disk = &disk_with_puts(puts, segment_bytes);
    let segment = &segments(disk)[index];
    let case = format!("{kind:?} at offset {offset} of {}", segment.display());
    let before = read(disk, segment);
    let faults_before = disk.read_fault_log().len();
    disk.fault_next_read_file(segment, kind, offset);
    let mut first_start = config(disk, segment_bytes);
    first_start.recovery.repair = repair;
    match Engine::open(first_start) {
        Err(e @ StoreError::Io { .. }) => {
            let message = e.to_string();
            let StoreError::Io { path, .. } = &e else {
                unreachable!()
            };
            assert_eq!(
                path, segment,
                "{case}: the refusal names another file: {message}"
            );
            assert!(
                message.contains("offset"),
                "{case}: the refusal names no offset: {message}"
            );
        }
        Err(e) => panic!("{case}: refused, but not with an I/O error: {e}"),
        Ok(engine) => {
            assert_all_puts(&engine, puts, &format!("{case}, the start that misread"));
            panic!("{case}: served a start from a read the disk got wrong")
        }
    }
    let fired = &disk.read_fault_log()[faults_before..];
    assert!(
        fired.iter().any(|f| f.whole_file && f.kind == kind),
        "{case}: the fault never fired: {fired:?}"
    );
    assert_eq!(
        read(disk, segment),
        before,
        "{case}: a read fault changed the segment on disk"
    );
    // The refused start may have written (unsynced); power-cycle, read cleanly.
    let clean = disk.crash();
    assert_eq!(read(&clean, segment), before, "{case}: after power loss");
    let engine = Engine::open(config(&clean, segment_bytes)).unwrap();
    assert_all_puts(&engine, puts, &format!("{case}, the clean start after"));
    engine.close_without_checkpoint();
}

fn assert_all_puts(engine: &Engine, puts: i32, case: &str) {
    for k in 0..puts {
        let got = engine.get(&ns(), Coord::new(k, 0, 0)).unwrap().unwrap();
        assert_eq!(
            got.map(|v| v.to_vec()),
            Some(value(k)),
            "{case}: acknowledged put {k} lost"
        );
    }
}

#[test]
fn a_bit_flipped_in_reading_the_last_group_is_not_taken_for_a_torn_tail() {
    const PUTS: i32 = 10;
    // One segment: every group is in the last one, where torn tails are.
    const SEGMENT_BYTES: u64 = 64 * 1024;
    let disk = disk_with_puts(PUTS, SEGMENT_BYTES);
    let segments = segments(&disk);
    assert_eq!(segments.len(), 1);
    let last = &segments[0];
    let ends = record_ends(&disk, last);
    assert_eq!(ends.len(), PUTS as usize);
    let last_record_start = ends[ends.len() - 2];
    let records_end = ends[ends.len() - 1];
    for offset in [
        last_record_start,    // the last group's first byte
        records_end - 1,      // its last byte
        ends[ends.len() - 3], // the group before it (one valid group follows)
        records_end + 100,    // the preallocated zeros after the records
        ends[0] + 5,          // the second group, later groups follow
        2,                    // the segment header
    ] {
        // `--repair` cuts only damage that is on disk, never a misread.
        for repair in [false, true] {
            refused_then_recovered(
                PUTS,
                SEGMENT_BYTES,
                0,
                (ReadFaultKind::Flip, offset),
                repair,
            );
        }
    }
}

#[test]
fn eio_or_a_short_read_of_a_segment_refuses_naming_file_and_offset() {
    const PUTS: i32 = 10;
    const SEGMENT_BYTES: u64 = 64 * 1024;
    let disk = disk_with_puts(PUTS, SEGMENT_BYTES);
    let last = segments(&disk).len() - 1;
    for kind in [ReadFaultKind::Eio, ReadFaultKind::Short] {
        refused_then_recovered(PUTS, SEGMENT_BYTES, last, (kind, 700), false);
    }
}

#[test]
fn a_bit_flipped_in_reading_an_earlier_segment_refuses_and_changes_nothing() {
    const PUTS: i32 = 40;
    // Small segments: the log spans several.
    const SEGMENT_BYTES: u64 = 1024;
    let disk = disk_with_puts(PUTS, SEGMENT_BYTES);
    let segments = segments(&disk);
    assert!(segments.len() >= 3, "{segments:?}");
    let first = &segments[0];
    let ends = record_ends(&disk, first);
    for offset in [ends[0] - 1, *ends.last().unwrap() - 1] {
        refused_then_recovered(PUTS, SEGMENT_BYTES, 0, (ReadFaultKind::Flip, offset), false);
        // `--repair` cuts only damage that is on disk, never a misread.
        refused_then_recovered(PUTS, SEGMENT_BYTES, 0, (ReadFaultKind::Flip, offset), true);
    }
}

/// Damage on disk, not a misread: a later segment's header broken for
/// good. `--repair` sets that segment and the ones after it aside, and the
/// log goes on at the end of the segment before it (recovery's replay of
/// that segment says where; it is not read a third time): what the
/// repaired start served, and what it acknowledged after, survive the
/// next start. On a real temp dir: the simulated disk does not move files
/// between directories, as the repair does.
#[test]
fn repair_of_a_damaged_later_segment_goes_on_where_the_one_before_ends() {
    const PUTS: i32 = 40;
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut c = EngineConfig::new(dir.path());
        c.group_commit.segment_bytes = 1024;
        c.checkpoint.poll_interval = std::time::Duration::from_secs(3600);
        c
    };
    let put = |engine: &Engine, k: i32| {
        engine
            .session()
            .unwrap()
            .write(Mutation::Put {
                ns: ns(),
                coord: Coord::new(k, 0, 0),
                value: value(k),
            })
            .unwrap();
    };
    let engine = Engine::open(config()).unwrap();
    (0..PUTS).for_each(|k| put(&engine, k));
    engine.close_without_checkpoint();
    drop(engine);
    let mut with_records: Vec<PathBuf> = std::fs::read_dir(dir.path().join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .filter(|p| !common::record_ends(&std::fs::read(p).unwrap()).is_empty())
        .collect();
    with_records.sort();
    assert!(with_records.len() >= 3, "{with_records:?}");
    let mut bytes = std::fs::read(&with_records[1]).unwrap();
    bytes[0] ^= 1; // the magic
    std::fs::write(&with_records[1], &bytes).unwrap();

    let mut repairing = config();
    repairing.recovery.repair = true;
    let engine = Engine::open(repairing).unwrap();
    let kept: Vec<i32> = (0..PUTS)
        .filter(|k| {
            engine
                .get(&ns(), Coord::new(*k, 0, 0))
                .unwrap()
                .unwrap()
                .is_some()
        })
        .collect();
    assert!(
        !kept.is_empty()
            && kept.len() < PUTS as usize
            && kept == (0..kept.len() as i32).collect::<Vec<_>>(),
        "the repair keeps the first segment's puts, in order: {kept:?}"
    );
    (PUTS..PUTS + 5).for_each(|k| put(&engine, k));
    engine.close_without_checkpoint();
    drop(engine);

    let engine = Engine::open(config()).unwrap();
    for k in kept.iter().copied().chain(PUTS..PUTS + 5) {
        assert_eq!(
            engine
                .get(&ns(), Coord::new(k, 0, 0))
                .unwrap()
                .unwrap()
                .map(|v| v.to_vec()),
            Some(value(k)),
            "put {k}, served or acknowledged after the repair, is lost"
        );
    }
    engine.close_without_checkpoint();
}
