//! Encryption at rest against someone who can write the data dir while
//! cubed is stopped and has no key (a disk taken and returned, a backup
//! restored by someone else): each attack of issue 36 on a real data dir,
//! edited between a stop and a restart, must be refused at start with the
//! file and offset, and reported by `cubed --verify --key-file`.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use cube_client::{Client, Coord, LocalDaemon, NamespaceName, NamespaceSpec, Request, Response};
use cube_store::Mutation;
use cube_store::namespace::NamespaceMeta;
use cube_store::wal::CrcSeed;
use cube_store::wal::record::{decode_record, encode_record, parse_record};
use cube_store::wal::segment::{encode_segment_header, parse_segment_header};
use tempfile::TempDir;

/// A small segment size keeps the files small.
const SEGMENT_BYTES: &str = "1048576";
/// How long a daemon that should refuse to start may take to exit.
const REFUSE_DEADLINE: Duration = Duration::from_secs(20);

/// A data dir, a socket and a key file in one temporary directory.
struct Setup {
    tmp: TempDir,
}

impl Setup {
    fn new() -> Setup {
        let tmp = tempfile::Builder::new()
            .prefix("cube-tamper-")
            .tempdir()
            .unwrap();
        let key = tmp.path().join("master.key");
        let text: String = (0..32u8).map(|i| format!("{:02x}", i * 7 + 3)).collect();
        fs::write(&key, format!("{text}\n")).unwrap();
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
        Setup { tmp }
    }

    fn data(&self) -> PathBuf {
        self.tmp.path().join("data")
    }

    fn socket(&self) -> PathBuf {
        self.tmp.path().join("cubed.sock")
    }

    fn key(&self) -> String {
        self.tmp.path().join("master.key").display().to_string()
    }

    fn args(&self) -> Vec<String> {
        vec![
            "--wal-segment-bytes".into(),
            SEGMENT_BYTES.into(),
            "--key-file".into(),
            self.key(),
        ]
    }

    fn start(&self) -> LocalDaemon {
        let args = self.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        LocalDaemon::start_in(&self.data(), &self.socket(), &args).unwrap()
    }

    /// Runs cubed with the key and expects it to refuse to start: returns
    /// everything it printed.
    fn refused(&self) -> String {
        let out_path = self.tmp.path().join("refused.out");
        let out = fs::File::create(&out_path).unwrap();
        let mut child = Command::new(LocalDaemon::find_binary().unwrap())
            .arg("--data")
            .arg(self.data())
            .arg("--socket")
            .arg(self.socket())
            .args(self.args())
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
                    "cubed started on a tampered data dir instead of refusing:\n{}",
                    fs::read_to_string(&out_path).unwrap_or_default()
                );
            }
            // Polling a child that should exit on its own; the deadline
            // above only catches a hang.
            thread::sleep(Duration::from_millis(10));
        };
        let text = fs::read_to_string(&out_path).unwrap();
        assert!(!status.success(), "exit {status:?}: {text}");
        text
    }

    /// `cubed --verify DIR --key-file KEY`: exit code and output.
    fn verify(&self) -> (Option<i32>, String) {
        let out = Command::new(LocalDaemon::find_binary().unwrap())
            .arg("--verify")
            .arg(self.data())
            .arg("--key-file")
            .arg(self.key())
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

fn name(ns: &str) -> NamespaceName {
    NamespaceName::new(ns).unwrap()
}

fn create(c: &mut Client, ns: &str, encrypted: bool) {
    let request = Request::NsCreate {
        ns: name(ns),
        spec: NamespaceSpec {
            encrypted,
            ..Default::default()
        },
    };
    match c.call(&request).unwrap() {
        Response::NsCreated(info) => assert_eq!(info.encrypted, encrypted),
        other => panic!("ns-create answered {other:?}"),
    }
}

fn wal_segments(data: &Path) -> Vec<PathBuf> {
    let mut segments: Vec<PathBuf> = fs::read_dir(data.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    segments.sort();
    segments
}

/// A record of a segment: where it starts, its LSN, and its mutation if
/// it is not sealed.
struct Found {
    offset: usize,
    end: usize,
    lsn: u64,
    plain: Option<Mutation>,
}

/// Every record of one segment, up to the preallocated zeros.
fn records(bytes: &[u8]) -> Vec<Found> {
    let header = parse_segment_header(bytes).unwrap();
    let mut at = header.header_bytes;
    let mut out = Vec::new();
    while let Ok(record) = parse_record(&bytes[at..], header.crc_seed) {
        let plain = decode_record(&record, None).ok();
        out.push(Found {
            offset: at,
            end: at + record.total_bytes,
            lsn: record.lsn,
            plain,
        });
        at += record.total_bytes;
    }
    out
}

/// The LSN after the last record of the log.
fn next_lsn(data: &Path) -> u64 {
    let segment = wal_segments(data).pop().unwrap();
    records(&fs::read(&segment).unwrap()).last().unwrap().lsn + 1
}

/// The metadata of namespace `ns` from its create record in the log.
fn created_meta(data: &Path, ns: &str) -> NamespaceMeta {
    for segment in wal_segments(data) {
        for found in records(&fs::read(&segment).unwrap()) {
            if let Some(Mutation::NamespaceCreate { ns: n, meta }) = found.plain
                && n.as_str() == ns
            {
                return meta;
            }
        }
    }
    panic!("no create record of {ns} in the log");
}

/// Appends `mutation` as a commit group of its own after the last record
/// of the log, checksummed right: what someone with the data dir but no
/// key can write. Returns the segment and the record's offset.
/// Without a segment (a clean stop folded and removed them), creates the
/// one a start would, at `next_lsn`.
fn append_group(data: &Path, next_lsn: u64, mutation: &Mutation) -> (PathBuf, usize) {
    let segment = wal_segments(data).pop().unwrap_or_else(|| {
        let path = data.join("wal").join(format!("{next_lsn:020}.wal"));
        let header = encode_segment_header(next_lsn, CrcSeed::from_u32(0x5eed));
        fs::write(&path, header).unwrap();
        path
    });
    let mut bytes = fs::read(&segment).unwrap();
    let header = parse_segment_header(&bytes).unwrap();
    let found = records(&bytes);
    let (at, lsn) = found
        .last()
        .map_or((header.header_bytes, header.first_lsn), |r| {
            (r.end, r.lsn + 1)
        });
    let mut record = Vec::new();
    encode_record(&mut record, lsn, mutation, true, header.crc_seed);
    if bytes.len() < at + record.len() {
        bytes.resize(at + record.len(), 0);
    }
    bytes[at..at + record.len()].copy_from_slice(&record);
    fs::write(&segment, &bytes).unwrap();
    (segment, at)
}

/// Where the namespace's data is when the forged record is appended.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// In the log (kill -9 before any fold).
    Wal,
    /// In checkpoint files (a clean stop folds the whole log).
    Checkpoint,
}

/// Issue 36, attack 1 (high): a `NamespaceAlter` that clears `encrypted`
/// of a namespace holding data, appended with a right checksum. Before the
/// fix recovery accepted it, and the next fold wrote the namespace's data
/// to a plaintext checkpoint; now it is refused at start and by --verify,
/// wherever the namespace's data is.
#[test]
fn a_forged_alter_clearing_encrypted_is_refused() {
    for stage in [Stage::Wal, Stage::Checkpoint] {
        let setup = Setup::new();
        let mut daemon = setup.start();
        let mut c = daemon.client().unwrap();
        create(&mut c, "secret", true);
        for i in 0..10 {
            c.put("secret", Coord::new(i, 0, 0), b"sealed value")
                .unwrap();
        }
        drop(c);
        daemon.kill9().unwrap();
        let meta = created_meta(&setup.data(), "secret");
        let next = next_lsn(&setup.data());
        assert!(meta.encrypted);
        if let Stage::Checkpoint = stage {
            daemon.restart().unwrap();
            assert!(daemon.terminate().unwrap().success());
        }
        let mut cleared = meta.clone();
        cleared.encrypted = false;
        cleared.key_check = [0; 16];
        let forged = Mutation::NamespaceAlter {
            ns: name("secret"),
            meta: cleared,
        };
        let (segment, at) = append_group(&setup.data(), next, &forged);

        let text = setup.refused();
        assert!(
            text.contains(&format!(
                "corruption in {} at offset {at}",
                segment.display()
            )) && text.contains("encryption of namespace \"secret\""),
            "{stage:?}: names the file, the offset and the change: {text}"
        );
        let (code, text) = setup.verify();
        assert_eq!(code, Some(1), "{stage:?}: --verify fails: {text}");
        assert!(
            text.contains(&segment.display().to_string())
                && text.contains("encryption of namespace \"secret\""),
            "{stage:?}: --verify names the file and the change: {text}"
        );
    }
}
