//! The data dir is the daemon's alone, against other local users and
//! careless operators (issue 30 H, I; issue 37 item 5), with real `cubed`
//! processes run as root:
//! - whatever the umask, the data dir and every directory in it are 0700
//!   and every file 0600 (log, checkpoints, manifest, LOCK, backups);
//! - a data dir the group or others can read or write is refused with the
//!   `chmod` that fixes it; files an older cubed made 0644 are narrowed;
//! - no symbolic link is followed (LOCK as a link to a root-owned file was
//!   overwritten with the pid), and a data dir, or a file in it, owned by
//!   another uid is refused naming the path; so is such a key file;
//! - stale `.tmp` files are removed at start, with a log line;
//! - `cubec backup` into the live data dir (directly or through a link) or
//!   to a path that cannot be one answers `bad_path`, and writes nothing.
#![allow(clippy::unwrap_used)]

mod common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use cube_client::{Client, ClientError, Coord, ErrorCode, LocalDaemon};

/// Another user (`nobody`); the tests run as root, so they can chown.
const OTHER: u32 = 65534;

/// Only catches a hang; waits below end on events.
const HANG: Duration = Duration::from_secs(60);

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn chown_other(path: &Path) {
    std::os::unix::fs::lchown(path, Some(OTHER), Some(OTHER)).unwrap();
}

/// A data dir with something in it, made by a daemon that then stopped.
fn stopped_data_dir(root: &Path) -> (PathBuf, PathBuf) {
    let data = root.join("data");
    let socket = root.join("cubed.sock");
    let mut daemon = LocalDaemon::start_in(&data, &socket, &[]).unwrap();
    daemon
        .client()
        .unwrap()
        .put("default", Coord::new(1, 1, 1), b"secret")
        .unwrap();
    assert_eq!(daemon.terminate().unwrap().code(), Some(0));
    (data, socket)
}

/// Runs `cubed` where it must refuse to start: what it said on stderr.
fn refused_start(data: &Path, extra: &[&str]) -> String {
    let socket = data.with_file_name("refused.sock");
    let mut args = vec![
        OsStr::new("--data"),
        data.as_os_str(),
        OsStr::new("--socket"),
    ];
    args.push(socket.as_os_str());
    args.extend(extra.iter().map(OsStr::new));
    let Output { status, stderr, .. } = common::cubed_that_must_exit(&args);
    let stderr = String::from_utf8_lossy(&stderr).into_owned();
    assert_eq!(status.code(), Some(1), "{stderr}");
    stderr
}

/// Every directory under `root` (and `root`) 0700, every file 0600.
fn assert_private_tree(root: &Path) {
    assert_eq!(mode(root), 0o700, "{}", root.display());
    for entry in fs::read_dir(root).unwrap() {
        let path = entry.unwrap().path();
        let meta = fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            assert_private_tree(&path);
        } else if meta.is_file() {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }
}

#[test]
fn whatever_the_umask_dirs_are_0700_and_files_0600() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let socket = tmp.path().join("cubed.sock");
    // umask 000 asks for 0777 directories and 0666 files.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("umask 000; exec \"$0\" \"$@\"")
        .arg(LocalDaemon::find_binary().unwrap())
        .arg("--data")
        .arg(&data)
        .arg("--socket")
        .arg(&socket)
        .args(["--wal-segment-bytes", "65536"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut c = loop {
        match Client::connect(&socket) {
            Ok(c) => break c,
            Err(e) => {
                assert!(started.elapsed() < HANG, "cubed never listened: {e}");
                assert!(child.try_wait().unwrap().is_none(), "cubed exited");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    for i in 0..200 {
        c.put("default", Coord::new(i, 0, 0), &[7u8; 1024]).unwrap();
    }
    c.checkpoint(true).unwrap();
    let backup = tmp.path().join("backups/first");
    c.backup(&backup).unwrap();
    drop(c);
    let _ = Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert!(data.join("LOCK").is_file());
    assert!(data.join("checkpoint/MANIFEST").is_file());
    assert_private_tree(&data);
    assert_private_tree(&backup);
}

#[test]
fn a_data_dir_others_can_read_is_refused_with_the_fix_and_old_modes_are_narrowed() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, socket) = stopped_data_dir(tmp.path());
    chmod(&data, 0o755);
    let stderr = refused_start(&data, &[]);
    assert!(
        stderr.contains(&format!("chmod 700 {}", data.display())),
        "{stderr}"
    );
    assert!(stderr.contains("mode 0755"), "{stderr}");
    chmod(&data, 0o770);
    assert!(refused_start(&data, &[]).contains("mode 0770"));

    // Fixed as told; what an older cubed left 0644 is narrowed at start.
    chmod(&data, 0o700);
    let wal = data.join("wal");
    chmod(&wal, 0o755);
    let manifest = data.join("checkpoint/MANIFEST");
    chmod(&manifest, 0o644);
    let daemon = LocalDaemon::start_in(&data, &socket, &[]).unwrap();
    assert_eq!(mode(&wal), 0o700);
    assert_eq!(mode(&manifest), 0o600);
    assert_eq!(
        daemon
            .client()
            .unwrap()
            .get("default", Coord::new(1, 1, 1))
            .unwrap()
            .as_deref(),
        Some(&b"secret"[..])
    );
}

#[test]
fn lock_as_a_symlink_is_refused_and_its_target_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, _) = stopped_data_dir(tmp.path());
    let precious = tmp.path().join("precious");
    fs::write(&precious, b"root's own file").unwrap();
    chmod(&precious, 0o600);
    fs::remove_file(data.join("LOCK")).unwrap();
    symlink(&precious, data.join("LOCK")).unwrap();
    let stderr = refused_start(&data, &[]);
    assert!(stderr.contains("LOCK"), "{stderr}");
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(fs::read(&precious).unwrap(), b"root's own file");
}

#[test]
fn links_inside_the_data_dir_and_a_linked_data_dir_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, _) = stopped_data_dir(tmp.path());
    // wal/ replaced by a link to a directory elsewhere.
    let elsewhere = tmp.path().join("elsewhere");
    fs::rename(data.join("wal"), &elsewhere).unwrap();
    symlink(&elsewhere, data.join("wal")).unwrap();
    let stderr = refused_start(&data, &[]);
    assert!(
        stderr.contains("wal") && stderr.contains("symbolic link"),
        "{stderr}"
    );
    fs::remove_file(data.join("wal")).unwrap();
    fs::rename(&elsewhere, data.join("wal")).unwrap();

    // A file in it as a link.
    let manifest = data.join("checkpoint/MANIFEST");
    let moved = tmp.path().join("moved-manifest");
    fs::rename(&manifest, &moved).unwrap();
    symlink(&moved, &manifest).unwrap();
    let stderr = refused_start(&data, &[]);
    assert!(
        stderr.contains(&manifest.display().to_string()) && stderr.contains("symbolic link"),
        "{stderr}"
    );
    fs::remove_file(&manifest).unwrap();
    fs::rename(&moved, &manifest).unwrap();

    // The data dir itself as a link.
    let linked = tmp.path().join("linked-data");
    symlink(&data, &linked).unwrap();
    let stderr = refused_start(&linked, &[]);
    assert!(stderr.contains("symbolic link"), "{stderr}");
}

#[test]
fn a_data_dir_or_a_file_owned_by_another_user_is_refused_naming_it() {
    if !is_root() {
        eprintln!("SKIPPED: not root, cannot give files to another uid");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (data, socket) = stopped_data_dir(tmp.path());
    let owned = format!("owned by uid {OTHER}");

    chown_other(&data);
    let stderr = refused_start(&data, &[]);
    assert!(stderr.contains(&owned), "{stderr}");
    assert!(stderr.contains(&data.display().to_string()), "{stderr}");
    std::os::unix::fs::lchown(&data, Some(0), Some(0)).unwrap();

    let manifest = data.join("checkpoint/MANIFEST");
    chown_other(&manifest);
    let stderr = refused_start(&data, &[]);
    assert!(
        stderr.contains(&owned) && stderr.contains(&manifest.display().to_string()),
        "{stderr}"
    );
    std::os::unix::fs::lchown(&manifest, Some(0), Some(0)).unwrap();
    LocalDaemon::start_in(&data, &socket, &[]).unwrap();
}

#[test]
fn a_key_file_owned_by_another_user_is_refused() {
    if !is_root() {
        eprintln!("SKIPPED: not root, cannot give files to another uid");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("key");
    fs::write(&key, "11".repeat(32)).unwrap();
    chmod(&key, 0o600);
    chown_other(&key);
    let data = tmp.path().join("data");
    let key_arg = key.display().to_string();
    let stderr = refused_start(&data, &["--key-file", &key_arg]);
    assert!(
        stderr.contains(&format!("owned by uid {OTHER}")) && stderr.contains(&key_arg),
        "{stderr}"
    );
    std::os::unix::fs::lchown(&key, Some(0), Some(0)).unwrap();
    LocalDaemon::start_in(&data, &tmp.path().join("s.sock"), &["--key-file", &key_arg]).unwrap();
}

#[test]
fn stale_tmp_files_are_removed_at_start_with_a_log_line() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, socket) = stopped_data_dir(tmp.path());
    let stale = [
        data.join("checkpoint/delta-00000000000000000009.ckpt.tmp"),
        data.join("checkpoint/MANIFEST.tmp"),
        data.join("wal/next-7.prealloc.tmp"),
    ];
    for path in &stale {
        fs::write(path, vec![0u8; 4096]).unwrap();
    }
    let daemon = LocalDaemon::start_in(&data, &socket, &[]).unwrap();
    let log = daemon.log_text();
    for path in &stale {
        assert!(!path.exists(), "{} is still there", path.display());
        assert!(
            log.contains(&format!("removed {}", path.display())),
            "{log}"
        );
    }
}

fn backup_refusal(c: &mut Client, dest: &str) -> String {
    match c.backup(Path::new(dest)) {
        Err(ClientError::Server(e)) => {
            assert_eq!(e.known_code(), Some(ErrorCode::BadPath), "{dest}: {e}");
            e.message
        }
        other => panic!("backup to {dest}: {other:?}"),
    }
}

#[test]
fn backup_into_the_live_data_dir_or_to_no_path_is_bad_path() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let daemon = LocalDaemon::start_in(&data, &tmp.path().join("cubed.sock"), &[]).unwrap();
    let mut c = daemon.client().unwrap();
    c.put("default", Coord::new(0, 0, 0), b"v").unwrap();
    let inside = |rel: &str| data.join(rel).display().to_string();
    for dest in [inside("wal/b"), inside("checkpoint/b"), inside("b")] {
        let message = backup_refusal(&mut c, &dest);
        assert!(message.contains("inside the live data dir"), "{message}");
        assert!(!Path::new(&dest).exists(), "{dest} was created");
    }
    // Through a link to the data dir's parent.
    let link = tmp.path().join("via");
    symlink(tmp.path(), &link).unwrap();
    let through = link.join("data/wal/b").display().to_string();
    let message = backup_refusal(&mut c, &through);
    assert!(message.contains("inside the live data dir"), "{message}");
    assert!(!data.join("wal/b").exists());

    let nul = format!("{}/a\0b", tmp.path().display());
    assert!(backup_refusal(&mut c, &nul).contains("NUL"));
    let long = format!("{}/{}", tmp.path().display(), "n".repeat(300));
    assert!(backup_refusal(&mut c, &long).contains("at most 255"));
    let file = tmp.path().join("a-file");
    fs::write(&file, b"").unwrap();
    backup_refusal(&mut c, &format!("{}/b", file.display()));

    // A good path still works, and the daemon served throughout.
    c.backup(&tmp.path().join("good")).unwrap();
    assert_eq!(
        c.get("default", Coord::new(0, 0, 0)).unwrap().as_deref(),
        Some(&b"v"[..])
    );
}
