//! Guards recovery of a torn tail: cutting the log at every byte offset of
//! its last records recovers exactly the records wholly before the cut, and
//! the log then continues at the next LSN; a client's value that holds
//! well-formed records cannot turn a torn tail into a refusal to start.
#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::path::Path;

use common::record_ends;
use cube_protocol::{Coord, NamespaceName};
use cube_store::{Engine, EngineConfig, Mutation};

/// Small preallocated segments keep the per-cut copies cheap.
const SEGMENT_BYTES: u64 = 4096;

fn config(dir: &Path) -> EngineConfig {
    let mut config = EngineConfig::new(dir);
    config.group_commit.segment_bytes = SEGMENT_BYTES;
    config
}

fn nonzero_len(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .rposition(|b| *b != 0)
        .map_or(0, |i| i as u64 + 1)
}

fn ns() -> NamespaceName {
    NamespaceName::new("default").unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    // Private like the original: cubed refuses a data dir others can read.
    let mut private = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(private.recursive(true), 0o700);
    private.create(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

const RECORDS: i32 = 12;
/// Every byte offset of the last few records is tried.
const TORN_RECORDS: i32 = 3;

#[test]
fn every_cut_in_the_last_records_recovers_the_acknowledged_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let original = tmp.path().join("original");
    let segment = original.join("wal").join("00000000000000000001.wal");
    {
        let engine = Engine::open(config(&original)).unwrap();
        let session = engine.session().unwrap();
        for i in 0..RECORDS {
            let m = if i % 4 == 3 {
                Mutation::Del {
                    ns: ns(),
                    coord: Coord::new(i - 1, 0, 0),
                }
            } else {
                Mutation::Put {
                    ns: ns(),
                    coord: Coord::new(i, 0, 0),
                    value: vec![i as u8; (i as usize) * 3],
                }
            };
            let ack = session.write(m).unwrap();
            assert_eq!(ack.lsn, i as u64 + 1);
        }
        engine.close_without_checkpoint();
    }
    let full = fs::read(&segment).unwrap();
    assert_eq!(
        full.len() as u64,
        SEGMENT_BYTES,
        "the segment is preallocated"
    );
    let ends = record_ends(&full);
    assert_eq!(ends.len(), RECORDS as usize);
    let first_cut = ends[(RECORDS - TORN_RECORDS - 1) as usize];
    let last_end = ends[RECORDS as usize - 1];
    // A write torn at `cut` leaves zeros after it in preallocated space, or
    // a short file where the segment grew past its preallocation.
    for (cut, truncate) in (first_cut..last_end).flat_map(|cut| [(cut, false), (cut, true)]) {
        let dir = tmp.path().join(format!("cut-{cut}-{truncate}"));
        copy_dir(&original, &dir);
        let torn_segment = dir.join("wal").join("00000000000000000001.wal");
        let mut torn = full[..cut as usize].to_vec();
        if !truncate {
            torn.resize(full.len(), 0);
        }
        fs::write(&torn_segment, &torn).unwrap();

        let engine = Engine::open(config(&dir)).unwrap();
        let mut whole = ends.iter().filter(|end| **end <= cut).count() as i32;
        // A record whose missing bytes were zeros anyway is whole again once
        // the zeros of preallocated space stand in for them.
        if !truncate
            && full[cut as usize..ends[whole as usize] as usize]
                .iter()
                .all(|b| *b == 0)
        {
            whole += 1;
        }
        let report = engine.recovery_report();
        assert_eq!(report.records_replayed, whole as u64, "cut at {cut}");
        assert_eq!(report.next_lsn, whole as u64 + 1);
        let torn = report.torn_tail.as_ref().map_or(0, |t| t.bytes_truncated);
        let valid_end = ends[whole as usize - 1] as usize;
        let torn_expected = nonzero_len(&full[valid_end..(cut as usize).max(valid_end)]);
        assert_eq!(torn, torn_expected, "cut at {cut}");
        // The state is exactly the first `whole` writes.
        for i in 0..RECORDS {
            let expect_present = i < whole && i % 4 != 3 && !(i % 4 == 2 && i + 1 < whole);
            let got = engine.get(&ns(), Coord::new(i, 0, 0)).unwrap().unwrap();
            assert_eq!(got.is_some(), expect_present, "cut at {cut}, cell {i}");
        }
        // And the log continues at the next LSN.
        let ack = engine
            .session()
            .unwrap()
            .write(Mutation::Put {
                ns: ns(),
                coord: Coord::new(99, 0, 0),
                value: b"next".to_vec(),
            })
            .unwrap();
        assert_eq!(ack.lsn, whole as u64 + 1);
        engine.close_without_checkpoint();
        drop(engine);
        let engine = Engine::open(config(&dir)).unwrap();
        assert_eq!(engine.recovery_report().records_replayed, whole as u64 + 1);
        assert!(engine.recovery_report().torn_tail.is_none());
        engine.close_without_checkpoint();
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_bad_record_in_an_earlier_segment_is_corruption_not_a_torn_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let mut cfg = config(&dir);
    cfg.group_commit.segment_bytes = 200;
    cfg.group_commit.max_group_records = 1;
    {
        let engine = Engine::open(cfg.clone()).unwrap();
        let session = engine.session().unwrap();
        for i in 0..20 {
            session
                .write(Mutation::Put {
                    ns: ns(),
                    coord: Coord::new(i, 0, 0),
                    value: vec![1; 40],
                })
                .unwrap();
        }
        engine.close_without_checkpoint();
    }
    let mut segments: Vec<_> = fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segments.sort();
    assert!(segments.len() >= 3, "{segments:?}");
    // Damage a record of the first segment: in any but the last segment,
    // that is corruption even with nothing valid after it.
    let first = &segments[0];
    let bytes = fs::read(first).unwrap();
    let last_record_end = *record_ends(&bytes).last().unwrap() as usize;
    let mut damaged = bytes.clone();
    damaged[last_record_end - 3] ^= 0x40;
    fs::write(first, &damaged).unwrap();
    let err = Engine::open(cfg.clone()).err().unwrap().to_string();
    assert!(err.contains(&first.display().to_string()), "{err}");
    assert!(err.contains("not the last"), "{err}");

    // Remove a middle segment: an LSN gap.
    fs::write(first, &bytes).unwrap();
    fs::remove_file(&segments[1]).unwrap();
    let err = Engine::open(cfg).err().unwrap().to_string();
    assert!(err.contains("LSN gap"), "{err}");
    assert!(err.contains(&segments[2].display().to_string()), "{err}");
}

/// Regression guard: recovery tells a torn tail from corruption by looking
/// for a valid later commit group after the damage, byte by byte, and a
/// client chooses the bytes of its values. A value holding two well-formed
/// records (a group end, then one more) at the next LSNs, checksummed as a
/// client can (plain CRC32C, or any guess), made a torn write of its own
/// group look like corruption in the middle of the log: cubed refused to
/// start until `--repair`. Each segment's records are now checksummed from
/// a secret seed, so the forgeries are damage like any other.
#[test]
fn a_value_holding_forged_records_is_still_dropped_as_a_torn_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let segment = dir.join("wal").join("00000000000000000001.wal");
    let last_lsn = {
        let engine = Engine::open(config(&dir)).unwrap();
        let session = engine.session().unwrap();
        for x in 0..3 {
            session
                .write(Mutation::Put {
                    ns: ns(),
                    coord: Coord::new(x, 0, 0),
                    value: b"kept".to_vec(),
                })
                .unwrap();
        }
        // The put of the forged value will get LSN 4; its fakes claim 5 and 6.
        let mut forged = Vec::new();
        for (lsn, group_end) in [(5, true), (6, true)] {
            let fake = Mutation::Put {
                ns: ns(),
                coord: Coord::new(50, 0, 0),
                value: b"forged".to_vec(),
            };
            cube_store::wal::record::encode_record(
                &mut forged,
                lsn,
                &fake,
                group_end,
                cube_store::wal::CrcSeed::UNSEEDED,
            );
        }
        let ack = session
            .write(Mutation::Put {
                ns: ns(),
                coord: Coord::new(9, 0, 0),
                value: forged,
            })
            .unwrap();
        engine.close_without_checkpoint();
        ack.lsn
    };
    assert_eq!(last_lsn, 4);
    let mut bytes = fs::read(&segment).unwrap();
    let ends = record_ends(&bytes);
    assert_eq!(ends.len(), 4);
    // Tear the last group: its record's first sector did not reach the disk.
    let torn_from = ends[2] as usize;
    bytes[torn_from..torn_from + 8].fill(0);
    fs::write(&segment, &bytes).unwrap();

    let engine = Engine::open(config(&dir)).expect("a torn tail, not corruption");
    let report = engine.recovery_report();
    assert_eq!((report.records_replayed, report.next_lsn), (3, 4));
    assert_eq!(report.torn_tail.as_ref().unwrap().offset, ends[2]);
    assert!(
        engine
            .get(&ns(), Coord::new(2, 0, 0))
            .unwrap()
            .unwrap()
            .is_some()
    );
    assert!(
        engine
            .get(&ns(), Coord::new(9, 0, 0))
            .unwrap()
            .unwrap()
            .is_none()
    );
    assert!(
        engine
            .get(&ns(), Coord::new(50, 0, 0))
            .unwrap()
            .unwrap()
            .is_none()
    );
    engine.close_without_checkpoint();
}

/// A fresh data dir (so everything else a data dir holds is there), its
/// first segment's path, and the 24-byte header of a version-1 segment
/// starting at LSN 1 (magic, version 1, first LSN, CRC32C of those) to put
/// there in its place.
fn data_dir_with_a_version_1_segment(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
    Engine::open(config(dir))
        .unwrap()
        .close_without_checkpoint();
    let mut v1 = Vec::new();
    v1.extend_from_slice(b"CUBEWAL\0");
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&1u64.to_le_bytes());
    let crc = crc32c::crc32c(&v1);
    v1.extend_from_slice(&crc.to_le_bytes());
    (dir.join("wal").join("00000000000000000001.wal"), v1)
}

/// A data dir written by a build before the checksum seeds (segment format
/// version 1: a 24-byte header, plain CRC32C records) still opens. Its
/// version-1 tail is left as it is and the log goes on in a new version-2
/// segment (a past bug: appending to the tail in version 1 kept the
/// forged-record hole open until the tail filled).
#[test]
fn a_version_1_segment_is_read_and_the_log_goes_on_in_version_2() {
    use cube_store::wal::CrcSeed;
    use cube_store::wal::record::encode_record;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let (segment, mut v1) = data_dir_with_a_version_1_segment(&dir);
    for lsn in 1..=2u64 {
        let put = Mutation::Put {
            ns: ns(),
            coord: Coord::new(lsn as i32, 0, 0),
            value: b"old".to_vec(),
        };
        encode_record(&mut v1, lsn, &put, true, CrcSeed::UNSEEDED);
    }
    v1.resize(SEGMENT_BYTES as usize, 0);
    fs::write(&segment, &v1).unwrap();

    for round in 0..2 {
        let engine = Engine::open(config(&dir)).unwrap();
        let report = engine.recovery_report();
        assert_eq!(report.records_replayed, 2 + round);
        assert!(report.torn_tail.is_none());
        assert_eq!(
            engine
                .get(&ns(), Coord::new(2, 0, 0))
                .unwrap()
                .unwrap()
                .as_deref(),
            Some(&b"old"[..])
        );
        if round == 0 {
            let ack = engine
                .session()
                .unwrap()
                .write(Mutation::Put {
                    ns: ns(),
                    coord: Coord::new(3, 0, 0),
                    value: b"new".to_vec(),
                })
                .unwrap();
            assert_eq!(ack.lsn, 3);
        } else {
            assert_eq!(
                engine
                    .get(&ns(), Coord::new(3, 0, 0))
                    .unwrap()
                    .unwrap()
                    .as_deref(),
                Some(&b"new"[..])
            );
        }
        engine.close_without_checkpoint();
    }
    assert_eq!(
        fs::read(&segment).unwrap(),
        v1,
        "the version-1 segment is untouched"
    );
    let next = fs::read(dir.join("wal").join("00000000000000000003.wal")).unwrap();
    let header = cube_store::wal::segment::parse_segment_header(&next).unwrap();
    assert_ne!(
        header.crc_seed,
        CrcSeed::UNSEEDED,
        "the log goes on in version 2"
    );
    assert_eq!(record_ends(&next).len(), 1);
}

/// A version-1 tail that holds no record yet is replaced by a version-2
/// segment of the same name (the first LSN it would have held).
#[test]
fn an_empty_version_1_tail_is_replaced_by_a_version_2_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let (segment, mut v1) = data_dir_with_a_version_1_segment(&dir);
    v1.resize(SEGMENT_BYTES as usize, 0);
    fs::write(&segment, &v1).unwrap();
    for round in 0..2 {
        let engine = Engine::open(config(&dir)).unwrap();
        if round == 0 {
            let put = Mutation::Put {
                ns: ns(),
                coord: Coord::new(1, 0, 0),
                value: b"v".to_vec(),
            };
            assert_eq!(engine.session().unwrap().write(put).unwrap().lsn, 1);
        } else {
            assert!(
                engine
                    .get(&ns(), Coord::new(1, 0, 0))
                    .unwrap()
                    .unwrap()
                    .is_some()
            );
        }
        engine.close_without_checkpoint();
    }
    let bytes = fs::read(&segment).unwrap();
    let header = cube_store::wal::segment::parse_segment_header(&bytes).unwrap();
    assert_ne!(header.crc_seed, cube_store::wal::CrcSeed::UNSEEDED);
    assert_eq!(fs::read_dir(dir.join("wal")).unwrap().count(), 1);
}
