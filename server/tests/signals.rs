//! What signals do to a real `cubed` (`docs/operations.md`, "Signals"):
//! the terminating signals nobody should send a daemon take the clean
//! shutdown (exit 0, a log line naming the signal, a final checkpoint);
//! SIGHUP only logs; and under a file-size limit (`ulimit -f`) SIGXFSZ no
//! longer kills it in the middle of a checkpoint: the checkpoint fails
//! with EFBIG, is retried with back-off, logged once, and works again once
//! the limit is lifted. Before, each of these killed cubed at once.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::{stat, wait_for};
use cube_client::{Coord, LocalDaemon};

fn send(daemon: &LocalDaemon, signal: &str) {
    let status = Command::new("kill")
        .args(["-s", signal, &daemon.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -s {signal}");
}

#[test]
fn terminating_signals_take_the_clean_shutdown_with_a_log_line() {
    for signal in [
        "USR1", "USR2", "ALRM", "VTALRM", "PROF", "IO", "PWR", "XCPU", "SYS",
    ] {
        let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
        let mut c = daemon.client().unwrap();
        c.put("default", Coord::new(1, 2, 3), b"kept").unwrap();
        drop(c);
        send(&daemon, signal);
        wait_for(&format!("cubed to exit after SIG{signal}"), || {
            !daemon.is_running()
        });
        // Already exited: this reads its status and sends nothing.
        let status = daemon.terminate().unwrap();
        let log = daemon.log_text();
        assert_eq!(status.code(), Some(0), "SIG{signal}: {status}\n{log}");
        assert!(
            log.contains(&format!("SIG{signal} received: shutting down cleanly")),
            "{log}"
        );
        assert!(log.contains("stopped cleanly"), "{log}");
        daemon.restart().unwrap();
        let mut c = daemon.client().unwrap();
        assert_eq!(
            c.get("default", Coord::new(1, 2, 3)).unwrap().as_deref(),
            Some(&b"kept"[..])
        );
    }
}

#[test]
fn sighup_is_logged_and_changes_nothing() {
    let mut daemon = LocalDaemon::start_fresh(&[]).unwrap();
    send(&daemon, "HUP");
    wait_for("the SIGHUP log line", || {
        daemon.log_text().contains("SIGHUP received")
    });
    assert!(daemon.is_running());
    let mut c = daemon.client().unwrap();
    c.put("default", Coord::new(0, 0, 0), b"after hup").unwrap();
    assert_eq!(
        c.get("default", Coord::new(0, 0, 0)).unwrap().as_deref(),
        Some(&b"after hup"[..])
    );
    drop(c);
    assert_eq!(daemon.terminate().unwrap().code(), Some(0));
}

fn set_file_size_limit(daemon: &LocalDaemon, limit: &str) {
    let status = Command::new("prlimit")
        // The soft limit only: raising a hard limit back needs privilege.
        .args([
            "--pid",
            &daemon.pid().to_string(),
            &format!("--fsize={limit}:"),
        ])
        .status()
        .unwrap();
    assert!(status.success(), "prlimit --fsize={limit}");
}

#[test]
fn a_file_size_limit_fails_checkpoints_with_back_off_instead_of_killing() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no prlimit(1) here to set a running daemon's file-size limit");
        return;
    }
    let mut daemon = LocalDaemon::start_fresh(&[
        "--wal-segment-bytes",
        "1048576",
        "--checkpoint-wal-bytes",
        "2621440",
    ])
    .unwrap();
    // WAL segments (1 MiB) fit under the limit; a fold of the 2.5 MiB or
    // more of closed segments does not.
    set_file_size_limit(&daemon, "2097152");
    let mut c = daemon.client().unwrap();
    let value = |i: i32| vec![i as u8; 128 * 1024];
    for i in 0..32 {
        c.put("default", Coord::new(i, 0, 0), &value(i)).unwrap();
    }
    wait_for("three failed checkpoints", || {
        stat(&mut c, "checkpoint.failures") >= 3
    });
    assert!(daemon.is_running(), "SIGXFSZ killed cubed");
    let log = daemon.log_text();
    assert_eq!(
        log.matches("checkpoint failed").count(),
        1,
        "a failure after a failure is logged again:\n{log}"
    );
    assert!(log.contains("File too large"), "{log}");
    assert_eq!(log.matches("SIGXFSZ received").count(), 1, "{log}");
    // Reads and writes go on meanwhile.
    c.put("default", Coord::new(99, 0, 0), b"still writing")
        .unwrap();

    set_file_size_limit(&daemon, "unlimited");
    wait_for("a checkpoint once the limit is lifted", || {
        stat(&mut c, "checkpoint.count") >= 1
    });
    wait_for("the recovery log line", || {
        daemon.log_text().contains("checkpoints work again")
    });
    drop(c);
    assert_eq!(daemon.terminate().unwrap().code(), Some(0));
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    for i in 0..32 {
        assert_eq!(
            c.get("default", Coord::new(i, 0, 0)).unwrap(),
            Some(value(i)),
            "cell {i}"
        );
    }
}

#[test]
fn a_file_size_limit_latches_the_writer_and_loses_nothing_acknowledged() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no prlimit(1) here to set a running daemon's file-size limit");
        return;
    }
    let mut daemon = LocalDaemon::start_fresh(&["--wal-segment-bytes", "1048576"]).unwrap();
    // The live segment is preallocated to 1 MiB; writes past 256 KiB in it
    // cross the limit (it bounds the offset written, not the file's size).
    set_file_size_limit(&daemon, "262144");
    let mut c = daemon.client().unwrap();
    let value = |i: i32| vec![i as u8; 16 * 1024];
    let mut acknowledged = 0;
    let refused = loop {
        match c.put(
            "default",
            Coord::new(acknowledged, 0, 0),
            &value(acknowledged),
        ) {
            Ok(_) => acknowledged += 1,
            Err(e) => break e,
        }
        assert!(acknowledged < 64, "1 MiB written under a 256 KiB limit");
    };
    assert!(daemon.is_running(), "SIGXFSZ killed cubed");
    assert!(refused.to_string().contains("File too large"), "{refused}");
    // Latched: later writes are refused, reads go on.
    let later = c.put("default", Coord::new(-1, 0, 0), b"x").unwrap_err();
    assert!(later.to_string().contains("writes are disabled"), "{later}");
    assert_eq!(
        c.get("default", Coord::new(0, 0, 0)).unwrap(),
        Some(value(0))
    );
    drop(c);

    set_file_size_limit(&daemon, "unlimited");
    assert_eq!(daemon.terminate().unwrap().code(), Some(0));
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    for i in 0..acknowledged {
        assert_eq!(
            c.get("default", Coord::new(i, 0, 0)).unwrap(),
            Some(value(i)),
            "cell {i}"
        );
    }
}
