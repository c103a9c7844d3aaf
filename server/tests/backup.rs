//! Guards online backup: `cubec backup DIR` taken under concurrent writes
//! is a consistent, self-contained data dir holding exactly the writes up to
//! the LSN it reports, which `cubed --verify` passes and `cubed` starts on.
//! (`cubec backup` and `cubec checkpoint` are run in client/tests/cli_admin.rs.)
#![allow(clippy::unwrap_used)]

mod common;
use common::wait_for;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use cube_client::{Coord, LocalDaemon, StatsValue};

fn figure(entries: &[cube_client::StatsEntry], name: &str) -> u64 {
    match entries.iter().find(|e| e.name == name).map(|e| &e.value) {
        Some(StatsValue::Count(v)) => *v,
        other => panic!("{name}: {other:?} in {entries:?}"),
    }
}

#[test]
fn backup_under_concurrent_writes_holds_exactly_the_writes_up_to_its_lsn() {
    let daemon = LocalDaemon::start_fresh(&["--wal-segment-bytes", "65536"]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // The highest LSN any writer has had acknowledged so far.
    let acked_lsn = Arc::new(AtomicU64::new(0));
    // Each writer owns its keys; it records every write's LSN and value.
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let mut c = daemon.client().unwrap();
            let stop = stop.clone();
            let acked_lsn = acked_lsn.clone();
            thread::spawn(move || {
                let mut log: Vec<(Coord, u64, Vec<u8>)> = Vec::new();
                let mut i = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let coord = Coord::new(w, (i % 97) as i32, 0);
                    let value = format!("w{w} write {i}").into_bytes();
                    let lsn = c.put("default", coord, &value).unwrap();
                    acked_lsn.fetch_max(lsn, Ordering::Relaxed);
                    log.push((coord, lsn, value));
                    i += 1;
                }
                log
            })
        })
        .collect();
    wait_for("the first writes", || {
        acked_lsn.load(Ordering::Relaxed) > 500
    });
    let mut admin = daemon.client().unwrap();
    let checkpoint = admin.checkpoint(false).unwrap();
    assert!(figure(&checkpoint, "checkpoint.records_folded") > 0);
    let folded_at = acked_lsn.load(Ordering::Relaxed);
    wait_for("writes after the checkpoint", || {
        acked_lsn.load(Ordering::Relaxed) > folded_at + 200
    });

    let dest = daemon.data_dir().parent().unwrap().join("backup-1");
    let report = admin.backup(&dest).unwrap();
    let lsn = figure(&report, "backup.lsn");
    assert!(figure(&report, "backup.files") >= 2);
    wait_for("writes after the backup", || {
        acked_lsn.load(Ordering::Relaxed) > lsn + 200
    });
    stop.store(true, Ordering::Relaxed);
    let logs: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let after_backup = logs.iter().flatten().filter(|(_, l, _)| *l > lsn).count();
    assert!(
        after_backup > 0,
        "writes went on during and after the backup"
    );

    // What the backup must hold: per key, the write with the highest LSN <= lsn.
    let mut expected: BTreeMap<(i32, i32), (u64, Vec<u8>)> = BTreeMap::new();
    for (coord, l, value) in logs.iter().flatten() {
        if *l <= lsn {
            let slot = expected
                .entry((coord.x, coord.y))
                .or_insert((0, Vec::new()));
            if *l > slot.0 {
                *slot = (*l, value.clone());
            }
        }
    }
    assert!(!expected.is_empty());

    let verify = Command::new(LocalDaemon::find_binary().unwrap())
        .arg("--verify")
        .arg(&dest)
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );

    let copy = LocalDaemon::start_in(&dest, &dest.join("cubed.sock"), &[]).unwrap();
    let mut c = copy.client().unwrap();
    for w in 0..4 {
        for y in 0..97 {
            let got = c.get("default", Coord::new(w, y, 0)).unwrap();
            let want = expected.get(&(w, y)).map(|(_, v)| v.clone());
            assert_eq!(got, want, "cell {w},{y} in the backup at LSN {lsn}");
        }
    }
    // The original kept serving throughout.
    admin.ping().unwrap();
    // A second backup to the same place is refused.
    let err = admin.backup(&dest).unwrap_err().to_string();
    assert!(err.contains("already exists"), "{err}");
}

/// A hash of every WAL segment's bytes under `data`, by file name.
fn wal_files(data: &std::path::Path) -> BTreeMap<String, u64> {
    std::fs::read_dir(data.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let mut hasher = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(&std::fs::read(&p).unwrap(), &mut hasher);
            (name, std::hash::Hasher::finish(&hasher))
        })
        .collect()
}

/// A `cubed` started on a backup writes only into the backup: it appends
/// to its newest segment, which must be its own file, not one shared with
/// the original (a past bug: the segments were hard-linked, so the
/// copy's writes went into the original's closed segment).
#[test]
fn a_daemon_on_a_backup_never_writes_into_the_originals_files() {
    let mut original = LocalDaemon::start_fresh(&["--wal-segment-bytes", "65536"]).unwrap();
    let mut c = original.client().unwrap();
    for i in 0..200 {
        c.put(
            "default",
            Coord::new(i, 0, 0),
            format!("original {i}").as_bytes(),
        )
        .unwrap();
    }
    let dest = original.data_dir().parent().unwrap().join("backup-2");
    c.backup(&dest).unwrap();
    drop(c);
    // Stopped without a final fold, so its segments stay as they are.
    original.kill9().unwrap();
    let before = wal_files(original.data_dir());
    assert!(!before.is_empty());

    let copy = LocalDaemon::start_in(&dest, &dest.join("cubed.sock"), &[]).unwrap();
    let mut c = copy.client().unwrap();
    for i in 0..50 {
        c.put("default", Coord::new(i, 1, 0), b"only in the copy")
            .unwrap();
    }
    assert_eq!(wal_files(original.data_dir()), before);

    original.restart().unwrap();
    let mut c = original.client().unwrap();
    assert_eq!(
        c.get("default", Coord::new(199, 0, 0)).unwrap(),
        Some(b"original 199".to_vec())
    );
    assert_eq!(c.get("default", Coord::new(0, 1, 0)).unwrap(), None);
}
