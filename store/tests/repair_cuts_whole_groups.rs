//! Guards `--repair` against keeping part of a commit group: when the damage is in the second record of a
//! three-record group, the repair must cut at the start of the group, not at
//! the damaged record. Cutting at the record kept the group's first record
//! with no group end; the writer then appended after it and the next
//! recovery applied that never-acknowledged record together with the next
//! group.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use cube_protocol::{Coord, NamespaceName};
use cube_store::sim_disk::{FaultPlan, SimDisk};
use cube_store::wal::record::encode_record;
use cube_store::wal::segment::{encode_segment_header, segment_file_name};
use cube_store::wal::{CrcSeed, recover};
use cube_store::{Mutation, OpenMode, RecoveryOptions, Storage};

/// The seed of the hand-written segment's checksums.
const SEED: CrcSeed = CrcSeed::from_u32(0x5eed);

fn put(x: i32) -> Mutation {
    Mutation::Put {
        ns: NamespaceName::new("default").unwrap(),
        coord: Coord::new(x, 0, 0),
        value: format!("v{x}").into_bytes(),
    }
}

/// A segment with groups {1}, {2}, {3, 4, 5}, {6}; a byte of record 4's
/// payload flipped, so a later group follows the damage (not a torn tail).
fn damaged_segment() -> (Vec<u8>, u64) {
    let mut bytes = encode_segment_header(1, SEED, None).to_vec();
    let mut damage_at = 0;
    for (lsn, group_end) in [
        (1, true),
        (2, true),
        (3, false),
        (4, false),
        (5, true),
        (6, true),
    ] {
        if lsn == 4 {
            damage_at = bytes.len() as u64;
        }
        encode_record(&mut bytes, lsn, &put(lsn as i32), group_end, SEED);
    }
    // The last byte of record 4's payload (inside its value).
    let record_4_end = {
        let mut probe = Vec::new();
        encode_record(&mut probe, 4, &put(4), false, SEED);
        damage_at as usize + probe.len()
    };
    bytes[record_4_end - 1] ^= 0x40;
    (bytes, damage_at)
}

fn replayed(disk: &SimDisk, wal: &Path, repair: bool) -> Result<(Vec<u64>, u64), String> {
    let mut lsns = Vec::new();
    let report = recover(disk, wal, 0, &RecoveryOptions { repair }, None, |lsn, _| {
        lsns.push(lsn)
    })
    .map_err(|e| e.to_string())?;
    Ok((lsns, report.next_lsn))
}

/// Writes `bytes` as segment 1 in `wal` and syncs its data (the caller
/// syncs the directory, which may fail under a fault plan).
fn write_segment(disk: &SimDisk, wal: &Path, bytes: &[u8]) -> std::path::PathBuf {
    disk.create_dir_all(wal).unwrap();
    let path = wal.join(segment_file_name(1));
    let mut file = disk.open(&path, OpenMode::CreateNew).unwrap();
    file.write_all_at(bytes, 0).unwrap();
    file.sync_data().unwrap();
    path
}

#[test]
fn repair_cuts_at_the_start_of_the_damaged_group() {
    let (bytes, damage_at) = damaged_segment();
    let disk = SimDisk::new(FaultPlan::default());
    let wal = Path::new("/regression/data/wal");
    write_segment(&disk, wal, &bytes);
    disk.sync_dir(wal).unwrap();

    // Refused, naming the damaged record.
    let refused = replayed(&disk, wal, false).unwrap_err();
    assert!(
        refused.contains(&format!("offset {damage_at}")),
        "{refused}"
    );

    // Repaired: groups {1} and {2} only; the next record is LSN 3.
    let mut lsns = Vec::new();
    let report = recover(
        &disk,
        wal,
        0,
        &RecoveryOptions { repair: true },
        None,
        |lsn, _| lsns.push(lsn),
    )
    .unwrap();
    assert_eq!(lsns, [1, 2]);
    assert_eq!(report.next_lsn, 3, "record 3 began the damaged group");
    let repair = report.repaired.unwrap();
    assert!(repair.offset < damage_at, "{repair:?}");
    assert!(
        repair.reason.contains(&format!("offset {damage_at}")),
        "the reason still names the damage: {repair:?}"
    );

    // What the repair kept recovers cleanly, to the same place.
    assert_eq!(replayed(&disk, wal, false).unwrap(), (vec![1, 2], 3));
}

/// The same damaged segment, but already folded into a checkpoint up to
/// LSN 10 (a crash kept it after the manifest switch): after `--repair`
/// cuts it at LSN 3, new writes must still start after the checkpoint
/// (a past bug: recovery resumed at LSN 3, so the next start skipped
/// those writes as folded).
#[test]
fn repair_inside_the_checkpoint_resumes_after_it() {
    let (bytes, _) = damaged_segment();
    let disk = SimDisk::new(FaultPlan::default());
    let wal = Path::new("/regression/covered/wal");
    let path = write_segment(&disk, wal, &bytes);
    disk.sync_dir(wal).unwrap();

    let mut replayed = Vec::new();
    let report = recover(
        &disk,
        wal,
        10,
        &RecoveryOptions { repair: true },
        None,
        |lsn, _| replayed.push(lsn),
    )
    .unwrap();
    assert!(
        replayed.is_empty(),
        "all inside the checkpoint: {replayed:?}"
    );
    assert_eq!(report.next_lsn, 11);
    assert!(report.tail.is_none(), "a new segment, at LSN 11");
    assert!(disk.file_len(&path).is_err(), "the covered segment is gone");
}

/// `--repair` under directory-fsync failures and a power loss right after:
/// the bytes it cuts are always somewhere, still in the segment or in the
/// saved copy (a past bug: the cut was made durable before the copy's
/// folder was synced, so a power loss could keep the cut and lose the copy).
#[test]
fn a_power_loss_during_repair_never_loses_what_it_cuts() {
    let (bytes, _) = damaged_segment();
    let cut_from = {
        // Records 1 and 2, then the cut at the start of group {3, 4, 5}.
        let mut probe = encode_segment_header(1, SEED, None).to_vec();
        encode_record(&mut probe, 1, &put(1), true, SEED);
        encode_record(&mut probe, 2, &put(2), true, SEED);
        probe.len()
    };
    let cut_bytes = &bytes[cut_from..];
    let mut failed = 0;
    for seed in 0..64 {
        let disk = SimDisk::new(FaultPlan {
            seed,
            dir_sync_eio_ppm: 400_000,
            ..FaultPlan::default()
        });
        let wal = Path::new("/regression/power/wal");
        let path = write_segment(&disk, wal, &bytes);
        if disk.sync_dir(wal).is_err() {
            continue;
        }
        let repaired = recover(
            &disk,
            wal,
            0,
            &RecoveryOptions { repair: true },
            None,
            |_, _| {},
        );
        if repaired.is_ok() {
            continue;
        }
        failed += 1;
        let disk = disk.with_plan(FaultPlan::default());
        let segment = disk.read_file(&path).unwrap_or_default();
        let kept_in_segment = segment.len() >= bytes.len() && segment[cut_from..] == *cut_bytes;
        let saved = disk
            .list_dir(wal)
            .unwrap()
            .into_iter()
            .filter(|name| name.starts_with("repair-"))
            .flat_map(|dir| {
                let dir = wal.join(dir);
                disk.list_dir(&dir)
                    .unwrap()
                    .into_iter()
                    .map(move |name| dir.join(name))
            })
            .any(|file| {
                disk.read_file(&file)
                    .is_ok_and(|b| b.starts_with(cut_bytes))
            });
        assert!(
            kept_in_segment || saved,
            "seed {seed}: the cut bytes are in neither the segment ({} bytes) nor a saved copy",
            segment.len()
        );
    }
    assert!(failed >= 5, "only {failed} seeds failed during the repair");
}
