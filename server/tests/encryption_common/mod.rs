//! Helpers the encryption tests share: a data dir with key files, a daemon
//! that must refuse to start, `--verify`, and the layouts they edit.
#![allow(clippy::unwrap_used, dead_code)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use cube_client::{
    Client, LocalDaemon, NamespaceInfo, NamespaceName, NamespaceSpec, Request, Response,
};
use tempfile::TempDir;

/// A small segment size keeps the whole-directory byte scans cheap.
pub const SEGMENT_BYTES: &str = "1048576";
pub const RECORD_HEADER_BYTES: usize = 17;
pub const SEALED_RECORD_BIT: u8 = 0x40;
pub const CKPT_HEADER_BYTES: usize = 44;
pub const CKPT_FOOTER_BYTES: usize = 40;
pub const SEALED_BLOCK_BIT: u32 = 1 << 31;
/// ns_id, start id, counter in front of a sealed block's ciphertext.
pub const SEALED_BLOCK_PREFIX: usize = 24;
/// ns_id, start id after the namespace of a sealed WAL payload.
pub const SEALED_RECORD_PREFIX: usize = 16;
/// How long a daemon that should refuse to start may take to exit.
pub const REFUSE_DEADLINE: Duration = Duration::from_secs(20);

/// A data dir, a socket and key files in one temporary directory.
pub struct Setup {
    pub tmp: TempDir,
}

impl Setup {
    pub fn new() -> Setup {
        let tmp = tempfile::Builder::new()
            .prefix("cube-enc-")
            .tempdir()
            .unwrap();
        let setup = Setup { tmp };
        write_key(&setup.key(), &hex_key(0x11), 0o600);
        write_key(&setup.other_key(), &hex_key(0x77), 0o600);
        setup
    }

    pub fn data(&self) -> PathBuf {
        self.tmp.path().join("data")
    }

    pub fn socket(&self) -> PathBuf {
        self.tmp.path().join("cubed.sock")
    }

    pub fn key(&self) -> PathBuf {
        self.tmp.path().join("master.key")
    }

    pub fn other_key(&self) -> PathBuf {
        self.tmp.path().join("other.key")
    }

    pub fn args<'a>(&self, key: Option<&'a str>) -> Vec<&'a str> {
        let mut args = vec!["--wal-segment-bytes", SEGMENT_BYTES];
        if let Some(key) = key {
            args.extend(["--key-file", key]);
        }
        args
    }

    /// Starts cubed with the master key.
    pub fn start(&self) -> LocalDaemon {
        let key = self.key();
        let key = key.to_str().unwrap();
        LocalDaemon::start_in(&self.data(), &self.socket(), &self.args(Some(key))).unwrap()
    }

    /// Runs cubed with `extra` and expects it to refuse to start: returns
    /// its exit code and everything it printed.
    pub fn refused(&self, extra: &[&str]) -> (Option<i32>, String) {
        let out_path = self.tmp.path().join("refused.out");
        let out = fs::File::create(&out_path).unwrap();
        let mut child = Command::new(LocalDaemon::find_binary().unwrap())
            .arg("--data")
            .arg(self.data())
            .arg("--socket")
            .arg(self.socket())
            .args(self.args(None))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + REFUSE_DEADLINE;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "cubed {extra:?} started instead of refusing:\n{}",
                    fs::read_to_string(&out_path).unwrap_or_default()
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        (status.code(), fs::read_to_string(&out_path).unwrap())
    }

    pub fn verify(&self, extra: &[&str]) -> (Option<i32>, String) {
        let out = Command::new(LocalDaemon::find_binary().unwrap())
            .arg("--verify")
            .arg(self.data())
            .args(extra)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    }
}

pub fn hex_key(seed: u8) -> Vec<u8> {
    let mut text: String = (0..32u8)
        .map(|i| format!("{:02x}", seed.wrapping_mul(31).wrapping_add(i * 7) ^ 0x5a))
        .collect();
    text.push('\n');
    text.into_bytes()
}

pub fn write_key(path: &Path, bytes: &[u8], mode: u32) {
    fs::write(path, bytes).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

pub fn name(ns: &str) -> NamespaceName {
    NamespaceName::new(ns).unwrap()
}

pub fn create(c: &mut Client, ns: &str, encrypted: bool) -> NamespaceInfo {
    let request = Request::NsCreate {
        ns: name(ns),
        spec: NamespaceSpec {
            encrypted,
            ..Default::default()
        },
    };
    match c.call(&request).unwrap() {
        Response::NsCreated(info) => {
            assert_eq!(info.encrypted, encrypted, "{info:?}");
            info
        }
        other => panic!("ns-create answered {other:?}"),
    }
}

pub fn wal_segments(data: &Path) -> Vec<PathBuf> {
    let mut segments: Vec<PathBuf> = fs::read_dir(data.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    segments.sort();
    segments
}

/// `(offset, payload_len, sealed)` of every block of a checkpoint file.
pub fn blocks(bytes: &[u8]) -> Vec<(usize, usize, bool)> {
    let end = bytes.len() - CKPT_FOOTER_BYTES;
    let mut out = Vec::new();
    let mut at = CKPT_HEADER_BYTES;
    while at < end {
        let field = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let len = (field & !SEALED_BLOCK_BIT) as usize;
        out.push((at, len, field & SEALED_BLOCK_BIT != 0));
        at += 8 + len;
    }
    assert_eq!(at, end, "blocks end at the footer");
    out
}

/// Copies a stopped daemon's data dir, file by file.
pub fn copy_dir(from: &Path, to: &Path) {
    // Private like the original: cubed refuses a data dir others can read.
    let mut private = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(private.recursive(true), 0o700);
    private.create(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_dir(&entry.path(), &target);
        } else if kind.is_file() {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}
