//! Guards checkpoints end to end: state written before and after checkpoints
//! survives `kill -9` from base + deltas + WAL tail together, restarts after
//! a clean shutdown replay nothing, and a damaged checkpoint file is refused
//! with its file and offset.
#![allow(clippy::unwrap_used)]

mod common;

use common::stat;
use std::process::Command;
use std::time::{Duration, Instant};

use cube_client::{Coord, LocalDaemon};

/// Small segments and a small threshold, so checkpoints happen in seconds.
const DAEMON_ARGS: &[&str] = &[
    "--wal-segment-bytes",
    "65536",
    "--checkpoint-wal-bytes",
    "131072",
    "--delta-compact-bytes",
    "200000",
];

fn value(i: i32, round: u32) -> Vec<u8> {
    format!("round {round} cell {i} {}", "#".repeat(150)).into_bytes()
}

#[test]
fn durable_checkpoint_and_replay() {
    let mut daemon = LocalDaemon::start_fresh(DAEMON_ARGS).unwrap();
    let mut c = daemon.client().unwrap();
    // Round 0 and 1 overwrite the same cells; deletes leave tombstones.
    for round in 0..2 {
        for i in 0..1500 {
            c.put("default", Coord::new(i, -i, round as i32), &value(i, round))
                .unwrap();
        }
    }
    for i in (0..1500).step_by(3) {
        c.del("default", Coord::new(i, -i, 0)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while stat(&mut c, "checkpoint.count") < 1 || stat(&mut c, "checkpoint.compactions") < 1 {
        assert!(
            Instant::now() < deadline,
            "no checkpoint and compaction within 30 s"
        );
        // Keep the writer rolling segments.
        c.put("default", Coord::new(-1, -1, -1), &value(-1, 9))
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(stat(&mut c, "checkpoint.base_bytes") > 0);
    // Group sizes and fsync times are distributions, not only means.
    assert!(stat(&mut c, "wal.group_records_p50") >= 1);
    assert!(stat(&mut c, "wal.fsync_us_p99") >= stat(&mut c, "wal.fsync_us_p50"));
    assert!(stat(&mut c, "wal.fsync_us_p50") >= 1);
    // More writes after the checkpoint: these live only in the WAL tail.
    for i in 0..300 {
        c.put("default", Coord::new(i, -i, 7), &value(i, 7))
            .unwrap();
    }
    drop(c);
    daemon.kill9().unwrap();

    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert!(
        stat(&mut c, "recovery.checkpoint_entries") > 0,
        "state came from checkpoint files"
    );
    for i in 0..1500 {
        let round0 = c.get("default", Coord::new(i, -i, 0)).unwrap();
        let expected0 = (i % 3 != 0).then(|| value(i, 0));
        assert_eq!(round0, expected0, "cell {i} round 0");
        assert_eq!(
            c.get("default", Coord::new(i, -i, 1)).unwrap(),
            Some(value(i, 1))
        );
    }
    for i in 0..300 {
        assert_eq!(
            c.get("default", Coord::new(i, -i, 7)).unwrap(),
            Some(value(i, 7)),
            "tail {i}"
        );
    }
    let log = daemon.log_text();
    assert!(log.contains("entries from checkpoint files"), "{log}");
}

#[test]
fn a_clean_shutdown_checkpoints_everything_and_damaged_checkpoints_are_refused() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    for i in 0..2000 {
        c.put("default", Coord::new(i, 0, 0), format!("v{i}").as_bytes())
            .unwrap();
    }
    drop(c);
    assert!(daemon.terminate().unwrap().success());
    assert!(
        daemon
            .log_text()
            .contains("final checkpoint: folded 2000 records")
    );

    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(
        stat(&mut c, "recovery.records_replayed"),
        0,
        "nothing left to replay"
    );
    assert_eq!(stat(&mut c, "recovery.checkpoint_entries"), 2000);
    assert_eq!(
        c.get("default", Coord::new(1999, 0, 0)).unwrap().unwrap(),
        b"v1999"
    );
    drop(c);
    assert!(daemon.terminate().unwrap().success());

    // The cells are in the namespace's run file.
    let run = run_file(&daemon.data_dir().join("checkpoint"));
    let good = std::fs::read(&run).unwrap();
    let start = |daemon: &LocalDaemon| {
        Command::new(LocalDaemon::find_binary().unwrap())
            .arg("--data")
            .arg(daemon.data_dir())
            .arg("--socket")
            .arg(daemon.socket())
            .output()
            .unwrap()
    };
    // A flipped bit in a block.
    let mut bad = good.clone();
    bad[200] ^= 0x01;
    std::fs::write(&run, &bad).unwrap();
    let out = start(&daemon);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&run.display().to_string()) && err.contains("offset"),
        "{err}"
    );
    assert!(err.contains("checksum"), "{err}");
    // A truncated file.
    std::fs::write(&run, &good[..good.len() - 10]).unwrap();
    let out = start(&daemon);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("footer"), "{err}");
    // Restored, it starts again with everything.
    std::fs::write(&run, &good).unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(
        c.get("default", Coord::new(7, 0, 0)).unwrap().unwrap(),
        b"v7"
    );
}

/// The (first listed) run file in checkpoint dir `dir`.
fn run_file(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("run-"))
        .expect("a run file")
}

/// Puts 300 cells of row y = 1, each `"{what} {i}"`.
fn put_row(c: &mut cube_client::Client, what: &str) {
    for i in 0..300 {
        c.put(
            "default",
            Coord::new(i, 1, 0),
            format!("{what} {i}").as_bytes(),
        )
        .unwrap();
    }
}

/// Issue 32: a bad block in a run file, met by a fold while cubed runs
/// (the fold looks its keys up in the older run to keep the manifest's
/// counts exact), fails that checkpoint request with an error naming the
/// file and offset; the daemon goes on serving reads and writes, and once
/// the block reads well again the checkpoint is retried and succeeds.
#[test]
fn a_bad_block_met_by_a_fold_fails_that_checkpoint_not_the_daemon() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    put_row(&mut c, "old");
    c.checkpoint(false).unwrap();
    let run = run_file(&daemon.data_dir().join("checkpoint"));
    let good = std::fs::read(&run).unwrap();
    let mut bad = good.clone();
    bad[200] ^= 0x01; // in block 0
    std::fs::write(&run, &bad).unwrap();
    // The same keys again: the next fold looks them up in the damaged run.
    put_row(&mut c, "new");
    let err = c.checkpoint(false).unwrap_err().to_string();
    assert!(
        err.contains(&run.display().to_string()) && err.contains("at offset 0"),
        "{err}"
    );
    assert!(err.contains("checksum"), "{err}");
    assert!(!err.contains("refusing to start"), "{err}");
    // The daemon serves on: reads, and writes (the WAL keeps them).
    assert_eq!(
        c.get("default", Coord::new(7, 1, 0)).unwrap().unwrap(),
        b"new 7"
    );
    c.put("default", Coord::new(7, 1, 0), b"newer 7").unwrap();
    // The block reads well again: the checkpoint is retried and succeeds.
    std::fs::write(&run, &good).unwrap();
    c.checkpoint(false).unwrap();
    drop(c);
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(
        c.get("default", Coord::new(7, 1, 0)).unwrap().unwrap(),
        b"newer 7"
    );
    assert_eq!(
        c.get("default", Coord::new(299, 1, 0)).unwrap().unwrap(),
        b"new 299"
    );
}
