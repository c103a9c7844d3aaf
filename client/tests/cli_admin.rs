//! Guards the admin commands as a user runs them: `cubec checkpoint`
//! (plain and `--compact`) reports what it folded, and `cubec backup DIR`
//! with a relative DIR makes a copy that `cubed` starts on.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use cube_client::{Coord, LocalDaemon};

fn cubec(daemon: &LocalDaemon, args: &[&str], cwd: &std::path::Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cubec"))
        .current_dir(cwd)
        .arg("--socket")
        .arg(daemon.socket())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn checkpoint_and_backup_from_the_command_line() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    for i in 0..50 {
        c.put("default", Coord::new(i, 0, 0), format!("v{i}").as_bytes())
            .unwrap();
    }
    let cwd = daemon.data_dir().parent().unwrap().to_path_buf();

    let (code, out, err) = cubec(&daemon, &["checkpoint"], &cwd);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("checkpoint.records_folded") && out.contains("50"),
        "{out}"
    );
    let (code, out, err) = cubec(&daemon, &["--json", "checkpoint", "--compact"], &cwd);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with('{') && out.contains("\"compaction.base_bytes\":"),
        "{out}"
    );

    c.put("default", Coord::new(-1, 0, 0), b"after the checkpoint")
        .unwrap();
    let (code, out, err) = cubec(&daemon, &["backup", "snap"], &cwd);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("backup.lsn"), "{out}");
    let snap = cwd.join("snap");
    assert!(snap.join("checkpoint").join("MANIFEST").exists());

    let (code, _, err) = cubec(&daemon, &["backup", "snap"], &cwd);
    assert_eq!(code, 3, "an existing destination is refused: {err}");
    assert!(err.contains("already exists"), "{err}");

    let copy = LocalDaemon::start_in(&snap, &cwd.join("snap.sock"), &[]).unwrap();
    let mut copy_client = copy.client().unwrap();
    assert_eq!(
        copy_client
            .get("default", Coord::new(49, 0, 0))
            .unwrap()
            .unwrap(),
        b"v49"
    );
    assert_eq!(
        copy_client
            .get("default", Coord::new(-1, 0, 0))
            .unwrap()
            .unwrap(),
        b"after the checkpoint"
    );
}

#[test]
fn stats_for_prometheus_and_in_watch_mode() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut c = daemon.client().unwrap();
    c.put("default", Coord::new(1, 2, 3), b"x").unwrap();
    let cwd = daemon.data_dir().parent().unwrap().to_path_buf();

    let (code, out, err) = cubec(&daemon, &["stats", "--prometheus"], &cwd);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("# TYPE cube_wal_records_total counter\ncube_wal_records_total 1\n"),
        "{out}"
    );
    assert!(
        out.contains("cube_command_duration_seconds_count{command=\"put\"} 1\n"),
        "{out}"
    );
    assert!(
        out.contains("cube_server_sync_info{value=\"always\"} 1"),
        "{out}"
    );
    for line in out.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split([' ', '{']).next().unwrap();
        assert!(
            name.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_'),
            "bad metric name {name:?}"
        );
    }

    // --watch redraws until stopped: read until the third screen starts.
    let mut watcher = Command::new(env!("CARGO_BIN_EXE_cubec"))
        .arg("--socket")
        .arg(daemon.socket())
        .args(["stats", "--watch", "100ms"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = watcher.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    while String::from_utf8_lossy(&seen).matches("\x1b[2J").count() < 3 {
        let n = std::io::Read::read(&mut stdout, &mut chunk).unwrap();
        assert!(n > 0, "cubec stats --watch stopped by itself");
        seen.extend_from_slice(&chunk[..n]);
    }
    watcher.kill().unwrap();
    watcher.wait().unwrap();
}
