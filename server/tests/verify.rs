//! Guards `cubed --verify`: a clean data dir passes with the right cell
//! count, planted corruption in the log or in a run file is reported
//! with file and offset and a non-zero exit, and a live daemon's data dir
//! is not verified behind its back.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use cube_client::{Coord, LocalDaemon};

fn verify(dir: &Path) -> Output {
    Command::new(LocalDaemon::find_binary().unwrap())
        .arg("--verify")
        .arg(dir)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn verify_passes_clean_dirs_and_reports_planted_corruption() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    for i in 0..300 {
        c.put(
            "default",
            Coord::new(i, 1, 2),
            format!("value-{i:03}").as_bytes(),
        )
        .unwrap();
    }
    c.del("default", Coord::new(0, 1, 2)).unwrap();

    let out = verify(daemon.data_dir());
    assert_eq!(
        out.status.code(),
        Some(1),
        "a running daemon's dir is refused: {}",
        text(&out)
    );
    assert!(text(&out).contains("locked"), "{}", text(&out));

    drop(c);
    // A clean stop folds everything into a checkpoint delta.
    assert!(daemon.terminate().unwrap().success());
    let out = verify(daemon.data_dir());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("cells       299"), "{}", text(&out));

    // More writes that stay in the log (kill -9), then damage the log.
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    for i in 0..100 {
        c.put("default", Coord::new(i, 9, 9), b"in the log only")
            .unwrap();
    }
    drop(c);
    daemon.kill9().unwrap();
    let out = verify(daemon.data_dir());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("cells       399"), "{}", text(&out));

    let wal = daemon.data_dir().join("wal");
    let segment = std::fs::read_dir(&wal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "wal"))
        .unwrap();
    let mut bytes = std::fs::read(&segment).unwrap();
    // A byte inside the records, past the segment's header.
    let header = cube_store::wal::segment::parse_segment_header(&bytes).unwrap();
    bytes[header.header_bytes + 40 * 50] ^= 0x20;
    std::fs::write(&segment, &bytes).unwrap();

    // The cells are in a run file: a byte of its first block (offset 0).
    let checkpoint = daemon.data_dir().join("checkpoint");
    let run = std::fs::read_dir(&checkpoint)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".run"))
        .unwrap();
    let mut bytes = std::fs::read(&run).unwrap();
    bytes[100] ^= 0x01;
    std::fs::write(&run, &bytes).unwrap();

    let out = verify(daemon.data_dir());
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains(&format!("PROBLEM     {}", segment.display())),
        "{report}"
    );
    assert!(
        report.contains(&format!("PROBLEM     {} at offset 0", run.display())),
        "{report}"
    );
    assert!(report.contains("FAILED: 2 problem(s)"), "{report}");
}

/// A segment whose creation a crash cut (empty, or zeros shorter than a
/// header) after a clean stop: recovery removes it and starts, so verify
/// notes it instead of reporting damage.
#[test]
fn verify_notes_a_segment_whose_creation_a_crash_cut() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    c.put("default", Coord::new(1, 2, 3), b"kept").unwrap();
    drop(c);
    assert!(daemon.terminate().unwrap().success());
    let wal = daemon.data_dir().join("wal");
    std::fs::write(wal.join("00000000000000000002.wal"), [0u8; 7]).unwrap();

    let out = verify(daemon.data_dir());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("cells       1"), "{}", text(&out));
    assert!(
        text(&out).contains("creation a crash cut"),
        "{}",
        text(&out)
    );

    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(
        c.get("default", Coord::new(1, 2, 3)).unwrap(),
        Some(b"kept".to_vec())
    );
}
