//! Guards recovery against damage: a flipped bit in the middle of the log
//! makes `cubed` refuse to start, naming the file and offset, and
//! `cubed --repair` then starts, reporting and saving what it dropped.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use cube_client::{Coord, LocalDaemon};

const RECORDS: i32 = 100;
const BAD_RECORD: i32 = 50;
/// Segment header + a put record of namespace "default" and a 9-byte value:
/// 17 (record header) + 1 + 7 (namespace) + 12 (coord) + 4 + 9 (value).
const SEGMENT_HEADER: u64 = 32;
const RECORD_BYTES: u64 = 50;

#[test]
fn a_flipped_bit_mid_log_is_refused_with_file_and_offset_and_repair_cuts_there() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    for i in 0..RECORDS {
        c.put(
            "default",
            Coord::new(i, 0, 0),
            format!("value-{i:03}").as_bytes(),
        )
        .unwrap();
    }
    drop(c);
    // kill -9, not a clean stop: a clean stop would fold the log into a
    // checkpoint, and this test is about damage inside the log.
    daemon.kill9().unwrap();

    let segment = daemon
        .data_dir()
        .join("wal")
        .join("00000000000000000001.wal");
    let mut bytes = std::fs::read(&segment).unwrap();
    // Records end where the segment's preallocated zeros begin.
    let records_end = (SEGMENT_HEADER + RECORD_BYTES * RECORDS as u64) as usize;
    assert!(bytes[records_end - 1] != 0 && bytes[records_end..].iter().all(|b| *b == 0));
    let bad_offset = SEGMENT_HEADER + RECORD_BYTES * BAD_RECORD as u64;
    bytes[bad_offset as usize + 30] ^= 0x10;
    std::fs::write(&segment, &bytes).unwrap();

    let out = Command::new(LocalDaemon::find_binary().unwrap())
        .arg("--data")
        .arg(daemon.data_dir())
        .arg("--socket")
        .arg(daemon.socket())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "refuses to start");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&segment.display().to_string()),
        "names the file: {err}"
    );
    assert!(
        err.contains(&format!("offset {bad_offset}")),
        "names the offset: {err}"
    );
    assert!(err.contains("--repair"), "says what to do next: {err}");

    let mut repaired =
        LocalDaemon::start_in(daemon.data_dir(), daemon.socket(), &["--repair"]).unwrap();
    let log = repaired.log_text();
    assert!(log.contains("REPAIRED"), "{log}");
    assert!(log.contains(&format!("offset {bad_offset}")), "{log}");
    let mut c = repaired.client().unwrap();
    for i in 0..RECORDS {
        let v = c.get("default", Coord::new(i, 0, 0)).unwrap();
        if i < BAD_RECORD {
            assert_eq!(v.unwrap(), format!("value-{i:03}").as_bytes());
        } else {
            assert_eq!(v, None, "record {i} is past the cut");
        }
    }
    // The log continues cleanly after the cut, and survives a crash.
    let lsn = c
        .put("default", Coord::new(-1, -1, -1), b"after repair")
        .unwrap();
    assert_eq!(lsn, BAD_RECORD as u64 + 1);
    drop(c);
    repaired.kill9().unwrap();
    let saved: Vec<_> = std::fs::read_dir(daemon.data_dir().join("wal"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        saved.iter().any(|n| n.starts_with("repair-")),
        "dropped bytes saved: {saved:?}"
    );
    repaired.restart().unwrap();
    let mut c = repaired.client().unwrap();
    assert_eq!(
        c.get("default", Coord::new(-1, -1, -1)).unwrap().unwrap(),
        b"after repair"
    );
}
