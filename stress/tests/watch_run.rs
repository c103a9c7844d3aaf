//! Guards `cube-stress --workload watch` end to end: a short real run of
//! the binary, its watchers followed by a few polling threads, finds that
//! every watcher saw exactly its tile's acknowledged writes, and the
//! `--from 1` replay delivers the log.
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn a_short_watch_run_checks_every_watcher_and_replays_the_log() {
    let output = Command::new(env!("CARGO_BIN_EXE_cube-stress"))
        .args([
            "--workload",
            "watch",
            "--duration",
            "1",
            "--clients",
            "4",
            "--watchers",
            "60",
            "--stalled",
            "1",
            "--follower-threads",
            "2",
            "--replay-changes",
            "3000",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("check: every watcher saw exactly its tile's acknowledged writes"),
        "{stdout}"
    );
    assert!(stdout.contains("replay --from 1: "), "{stdout}");
}
