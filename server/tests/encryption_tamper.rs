//! Encryption at rest against someone who can write the data dir while
//! cubed is stopped and has no key (a disk taken and returned, a backup
//! restored by someone else): each attack of issue 36 on a real data dir,
//! edited between a stop and a restart, must be refused at start with the
//! file and offset, and reported by `cubed --verify --key-file`.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};

use cube_client::{Coord, LocalDaemon};
use cube_store::Mutation;
use cube_store::namespace::NamespaceMeta;
use cube_store::wal::CrcSeed;
use cube_store::wal::record::{decode_record, encode_record, parse_record};
use cube_store::wal::segment::{encode_segment_header, parse_segment_header};

mod encryption_common;
use encryption_common::*;

/// Starts cubed with the master key on a tampered data dir, expects it to
/// refuse, and returns what it printed.
fn refused(setup: &Setup) -> String {
    let key = setup.key();
    let (code, text) = setup.refused(&["--key-file", key.to_str().unwrap()]);
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}: {text}");
    text
}

/// `cubed --verify DIR --key-file KEY`: exit code and output.
fn verify(setup: &Setup) -> (Option<i32>, String) {
    let key = setup.key();
    setup.verify(&["--key-file", key.to_str().unwrap()])
}

/// Cubed refuses to start, naming `file` and `why`, and `--verify` with the
/// key fails saying `why`.
fn refused_and_reported(setup: &Setup, file: &Path, why: &str) {
    let text = refused(setup);
    assert!(
        text.contains(&format!("corruption in {}", file.display())) && text.contains(why),
        "start: names {} and {why:?}: {text}",
        file.display()
    );
    let (code, text) = verify(setup);
    assert_eq!(code, Some(1), "--verify fails: {text}");
    assert!(text.contains(why), "--verify says {why:?}: {text}");
}

/// The daemon's arguments with the master key.
fn keyed_args(setup: &Setup) -> Vec<String> {
    let key = setup.key();
    setup
        .args(Some(key.to_str().unwrap()))
        .into_iter()
        .map(String::from)
        .collect()
}

/// A record of a segment: where it ends, its LSN, and its mutation if
/// it is not sealed.
struct Found {
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
        let plain = decode_record(&record, None, None).ok();
        out.push(Found {
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
        let header = encode_segment_header(next_lsn, CrcSeed::from_u32(0x5eed), None);
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

        // With a key the log is chained, so the forged group, which has
        // no MAC (or sits in a segment that does not continue the chain),
        // is refused first; the rule against changing `encrypted` is the
        // second line, for logs that are not chained
        // (wal/sealing_rule.rs tests it on its own).
        let why = [
            "encryption of namespace \"secret\"",
            "does not end with its MAC",
            "unchained segment where the log is chained",
        ];
        let text = refused(&setup);
        assert!(
            text.contains(&format!("corruption in {}", segment.display()))
                && why.iter().any(|w| text.contains(w)),
            "{stage:?}: names the file and why: {text}"
        );
        if let Stage::Wal = stage {
            assert!(text.contains(&format!("at offset {at}")), "{text}");
        }
        let (code, text) = verify(&setup);
        assert_eq!(code, Some(1), "{stage:?}: --verify fails: {text}");
        assert!(
            text.contains(&segment.display().to_string()) && why.iter().any(|w| text.contains(w)),
            "{stage:?}: --verify names the file and why: {text}"
        );
    }
}

/// Bytes of each cell value the tests write.
const CELL_VALUE_BYTES: usize = 1000;

/// The run files (cells), oldest first.
fn run_files(data: &Path) -> Vec<PathBuf> {
    files_ending(data, "run")
}

fn files_ending(data: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(data.join("checkpoint"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == extension))
        .collect();
    files.sort();
    files
}

/// A stopped daemon whose encrypted namespace holds 300 cells of 1000
/// bytes, folded into one run file by a clean stop.
fn folded_secret(setup: &Setup) -> LocalDaemon {
    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "secret", true);
    for i in 0..300 {
        c.put("secret", Coord::new(i, 0, 0), &[b's'; CELL_VALUE_BYTES])
            .unwrap();
    }
    drop(c);
    assert!(daemon.terminate().unwrap().success());
    daemon
}

fn cell_count(daemon: &mut LocalDaemon) -> usize {
    let mut c = daemon.client().unwrap();
    (0..300)
        .filter(|i| c.get("secret", Coord::new(*i, 0, 0)).unwrap().is_some())
        .count()
}

/// Issue 36, attack 2, on run files: the encrypted namespace's run
/// replaced by a plain one that someone without the key wrote (the same
/// file id and namespace, a third of the cells, every checksum right).
/// Before run files, a sealed checkpoint block replaced by an empty plain
/// one lost 60-odd of the 300 cells while `--verify --key-file` said OK;
/// the run is refused, since its namespace's runs must be sealed, and the
/// manifest's MAC for it would not match either.
#[test]
fn a_sealed_run_replaced_by_a_plain_one_is_refused() {
    use cube_store::run_file::format::Footer;
    use cube_store::run_file::{FOOTER_BYTES, Protection, RunFileWriter};
    let setup = Setup::new();
    let mut daemon = folded_secret(&setup);
    let files = run_files(&setup.data());
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    let good = fs::read(file).unwrap();
    let footer = Footer::decode(&good[good.len() - FOOTER_BYTES..], good.len() as u64).unwrap();
    let mut forged = RunFileWriter::create(
        &cube_store::RealDisk,
        file,
        footer.file_id,
        footer.ns_id,
        &Protection::Plain,
        100,
    )
    .unwrap();
    for i in 0..100u128 {
        forged.push(i, Some(&[b's'; CELL_VALUE_BYTES])).unwrap();
    }
    forged.finish().unwrap();

    let text = refused(&setup);
    let why = "refusing a file that may have been put in place of the protected one";
    assert!(
        text.contains(&file.display().to_string()) && text.contains(why),
        "start: {text}"
    );
    let (code, text) = verify(&setup);
    assert_eq!(code, Some(1), "--verify fails: {text}");
    assert!(
        text.contains(&format!("PROBLEM     {}", file.display()))
            && text.contains("Plain run file named by a manifest that is authenticated"),
        "{text}"
    );
    // Control: the untouched file opens with every cell.
    fs::write(file, &good).unwrap();
    daemon.restart().unwrap();
    assert_eq!(cell_count(&mut daemon), 300);
}

/// The manifest was CRC-only: dropping the newest delta from it (CRC
/// recomputed) rolled the namespace back silently. Its tag now fails; so
/// it does for the newest run dropped from a version-3 manifest.
#[test]
fn a_manifest_rewritten_without_the_key_is_refused() {
    let setup = Setup::new();
    let mut daemon = folded_secret(&setup);
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    c.put("secret", Coord::new(500, 0, 0), b"in the second delta")
        .unwrap();
    drop(c);
    assert!(daemon.terminate().unwrap().success());
    let path = setup.data().join("checkpoint").join("MANIFEST");
    let good = fs::read(&path).unwrap();
    // Version 3: 48 bytes, delta ids, then the namespace entries (the
    // secret namespace's alone: 28 bytes, then 40 per run, newest first).
    assert_eq!(u32::from_le_bytes(good[8..12].try_into().unwrap()), 3);
    let deltas = u32::from_le_bytes(good[40..44].try_into().unwrap()) as usize;
    assert_eq!(u32::from_le_bytes(good[44..48].try_into().unwrap()), 1);
    let entry = 48 + 8 * deltas;
    let runs = u32::from_le_bytes(good[entry + 24..entry + 28].try_into().unwrap());
    assert!(runs >= 2, "{runs} runs");
    // Forget the newest run: the second write is rolled back.
    let mut bad = good[..entry + 28].to_vec();
    bad[entry + 24..entry + 28].copy_from_slice(&(runs - 1).to_le_bytes());
    bad.extend_from_slice(&good[entry + 28 + 40..good.len() - 4]);
    let crc = crc32c::crc32c(&bad);
    bad.extend_from_slice(&crc.to_le_bytes());
    fs::write(&path, &bad).unwrap();

    let text = refused(&setup);
    assert!(
        text.contains(&path.display().to_string()) && text.contains("tag does not verify"),
        "{text}"
    );
    let (code, text) = verify(&setup);
    assert_eq!(code, Some(1), "--verify fails: {text}");
    assert!(text.contains("tag does not verify"), "{text}");
    // Nothing was deleted on the forged manifest's word.
    fs::write(&path, &good).unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(
        c.get("secret", Coord::new(500, 0, 0)).unwrap().unwrap(),
        b"in the second delta"
    );
    assert_eq!(cell_count(&mut daemon), 300);
}

/// Issue 36, attack 3: a copy of the data dir (a restored backup) runs on
/// and writes its own checkpoint file under the same file id; that file,
/// put in place of the original's, was opened and applied. Now it does
/// not match the MAC the original's manifest holds.
#[test]
fn a_checkpoint_file_from_another_copy_of_the_data_dir_is_refused() {
    let setup = Setup::new();
    let mut daemon = folded_secret(&setup);
    let copy = setup.tmp.path().join("copy");
    copy_dir(&setup.data(), &copy);
    let args = keyed_args(&setup);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for (dir, value) in [
        (setup.data(), b"the original's".as_slice()),
        (copy.clone(), b"the copy's".as_slice()),
    ] {
        let socket = setup.tmp.path().join("copy.sock");
        let mut run = LocalDaemon::start_in(&dir, &socket, &args).unwrap();
        let mut c = run.client().unwrap();
        c.put("secret", Coord::new(7, 7, 7), value).unwrap();
        drop(c);
        assert!(run.terminate().unwrap().success());
    }
    // The cells are in run files: the newest one of each copy has the
    // same file id, and its blocks verify in either (same data dir id).
    let ours = run_files(&setup.data());
    let theirs = run_files(&copy);
    let newest = ours.last().unwrap().clone();
    let spliced = theirs.last().unwrap();
    assert_eq!(newest.file_name(), spliced.file_name(), "same file id");
    let good = fs::read(&newest).unwrap();
    fs::copy(spliced, &newest).unwrap();

    refused_and_reported(&setup, &newest, "MAC is not the one the manifest lists");
    fs::write(&newest, &good).unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(
        c.get("secret", Coord::new(7, 7, 7)).unwrap().unwrap(),
        b"the original's"
    );
}

/// Every record of the data dir's log, with its segment and raw bytes.
struct RawAt {
    segment: PathBuf,
    offset: usize,
    lsn: u64,
    kind: u8,
    sealed: bool,
    group_end: bool,
    bytes: Vec<u8>,
}

fn log_records(data: &Path) -> Vec<RawAt> {
    let mut out = Vec::new();
    for segment in wal_segments(data) {
        let bytes = fs::read(&segment).unwrap();
        let header = parse_segment_header(&bytes).unwrap();
        let mut at = header.header_bytes;
        while let Ok(record) = parse_record(&bytes[at..], header.crc_seed) {
            out.push(RawAt {
                segment: segment.clone(),
                offset: at,
                lsn: record.lsn,
                kind: record.kind & 0x3f,
                sealed: record.kind & 0x40 != 0,
                group_end: record.group_end,
                bytes: bytes[at..at + record.total_bytes].to_vec(),
            });
            at += record.total_bytes;
        }
    }
    out
}

/// Issue 36, attack 2: a sealed record in the middle of the log replaced,
/// at the same LSN, by a plaintext put into another namespace (checksum
/// right). The sealing rule judged only the record's own namespace, so it
/// was accepted and the sealed write was gone; now its group's MAC fails.
#[test]
fn a_sealed_record_replaced_by_a_plain_put_elsewhere_is_refused() {
    let setup = Setup::new();
    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "plain", false);
    create(&mut c, "secret", true);
    for i in 0..10 {
        c.put("secret", Coord::new(i, 0, 0), b"sealed").unwrap();
    }
    drop(c);
    daemon.kill9().unwrap();
    let records = log_records(&setup.data());
    let victim = records.iter().filter(|r| r.sealed).nth(4).unwrap();
    let (segment, at) = (victim.segment.clone(), victim.offset);
    let mut bytes = fs::read(&segment).unwrap();
    let header = parse_segment_header(&bytes).unwrap();
    let mut forged = Vec::new();
    let put = Mutation::Put {
        ns: name("plain"),
        coord: Coord::new(1, 1, 1),
        value: b"a plaintext put in its place".to_vec(),
    };
    encode_record(
        &mut forged,
        victim.lsn,
        &put,
        victim.group_end,
        header.crc_seed,
    );
    // The rest of the segment moves up or down with the new length.
    let mut out = bytes[..at].to_vec();
    out.extend_from_slice(&forged);
    out.extend_from_slice(&bytes[at + victim.bytes.len()..]);
    out.resize(bytes.len().max(out.len()), 0);
    bytes = out;
    fs::write(&segment, &bytes).unwrap();

    refused_and_reported(&setup, &segment, "commit group MAC mismatch");
}

/// A crash tears the last group: recovery drops it and starts, as without
/// a key. A group removed from the middle of the log, the later records
/// renumbered and re-checksummed (what a writer without the key can do),
/// was accepted when the records after it were plaintext; now the next
/// group's MAC no longer follows. A whole last group zeroed reads as a log
/// that ends earlier (docs/operations.md says so), unless something later
/// carries the chain past it.
#[test]
fn a_torn_tail_is_dropped_but_a_group_removed_from_the_middle_is_refused() {
    let setup = Setup::new();
    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "secret", true);
    create(&mut c, "plain", false);
    for i in 0..3 {
        c.put("secret", Coord::new(i, 0, 0), b"sealed").unwrap();
    }
    for i in 0..10 {
        c.put("plain", Coord::new(i, 0, 0), b"plain").unwrap();
    }
    drop(c);
    daemon.kill9().unwrap();
    let segment = wal_segments(&setup.data()).pop().unwrap();
    let good = fs::read(&segment).unwrap();
    let records = log_records(&setup.data());

    // Torn: the last group's chain record half written.
    let last = records.last().unwrap();
    assert_eq!(last.kind, 0x3f, "a chain record ends the log");
    let mut torn = good.clone();
    let half = last.offset + last.bytes.len() / 2;
    torn[half..last.offset + last.bytes.len()].fill(0);
    fs::write(&segment, &torn).unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(c.get("plain", Coord::new(9, 0, 0)).unwrap(), None);
    assert_eq!(
        c.get("plain", Coord::new(8, 0, 0)).unwrap().unwrap(),
        b"plain"
    );
    assert_eq!(
        c.get("secret", Coord::new(2, 0, 0)).unwrap().unwrap(),
        b"sealed"
    );
    drop(c);
    daemon.kill9().unwrap();

    // Removed from the middle: the group of the 5th plain put (its record
    // and chain record) cut out, later LSNs renumbered, CRCs recomputed.
    fs::write(&segment, &good).unwrap();
    let header = parse_segment_header(&good).unwrap();
    let puts: Vec<&RawAt> = records
        .iter()
        .filter(|r| r.kind == 1 && !r.sealed)
        .collect();
    assert_eq!(puts.len(), 10);
    let cut_from = puts[4].offset;
    let chain_after = records
        .iter()
        .find(|r| r.offset > cut_from && r.group_end)
        .unwrap();
    let cut_to = chain_after.offset + chain_after.bytes.len();
    let mut out = good[..cut_from].to_vec();
    for r in records.iter().filter(|r| r.offset >= cut_to) {
        let mut bytes = r.bytes.clone();
        bytes[8..16].copy_from_slice(&(r.lsn - 2).to_le_bytes());
        let crc = header.crc_seed.checksum(&bytes[4..]);
        bytes[0..4].copy_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    out.resize(good.len(), 0);
    fs::write(&segment, &out).unwrap();
    refused_and_reported(&setup, &segment, "commit group MAC mismatch");
    fs::write(&segment, &good).unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(
        c.get("plain", Coord::new(4, 0, 0)).unwrap().unwrap(),
        b"plain"
    );
    assert_eq!(
        c.get("plain", Coord::new(9, 0, 0)).unwrap().unwrap(),
        b"plain"
    );
}

/// Issue 36, attack 3: a copy of the data dir runs on and writes a group
/// at the same LSN; that group, put in the original's place in the middle
/// of its log, was accepted (it is sealed under the same master key). Now
/// the original's next group no longer follows it.
#[test]
fn a_group_spliced_from_another_copy_of_the_data_dir_is_refused() {
    let setup = Setup::new();
    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "secret", true);
    c.put("secret", Coord::new(0, 0, 0), b"before the copy")
        .unwrap();
    drop(c);
    daemon.kill9().unwrap();
    let copy = setup.tmp.path().join("copy");
    copy_dir(&setup.data(), &copy);
    let args = keyed_args(&setup);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for (dir, who) in [(setup.data(), "original"), (copy.clone(), "copy....")] {
        let socket = setup.tmp.path().join("copy.sock");
        let mut run = LocalDaemon::start_in(&dir, &socket, &args).unwrap();
        let mut c = run.client().unwrap();
        for i in 1..=3 {
            c.put(
                "secret",
                Coord::new(i, 0, 0),
                format!("{who} {i}").as_bytes(),
            )
            .unwrap();
        }
        drop(c);
        run.kill9().unwrap();
    }
    let ours = log_records(&setup.data());
    let theirs = log_records(&copy);
    let mine = ours.iter().filter(|r| r.sealed).nth(1).unwrap();
    let spliced = theirs
        .iter()
        .find(|r| r.sealed && r.lsn == mine.lsn)
        .unwrap();
    assert_eq!(mine.bytes.len(), spliced.bytes.len());
    assert_ne!(mine.bytes, spliced.bytes);
    let chain_mine = ours.iter().find(|r| r.lsn == mine.lsn + 1).unwrap();
    let chain_theirs = theirs.iter().find(|r| r.lsn == mine.lsn + 1).unwrap();
    assert_eq!(chain_mine.kind, 0x3f);
    let segment = mine.segment.clone();
    let good = fs::read(&segment).unwrap();
    let mut bad = good.clone();
    let header = parse_segment_header(&good).unwrap();
    for (at, from) in [(mine.offset, spliced), (chain_mine.offset, chain_theirs)] {
        let mut bytes = from.bytes.clone();
        let crc = header.crc_seed.checksum(&bytes[4..]);
        bytes[0..4].copy_from_slice(&crc.to_le_bytes());
        bad[at..at + bytes.len()].copy_from_slice(&bytes);
    }
    fs::write(&segment, &bad).unwrap();

    let text = refused(&setup);
    let next_chain = ours.iter().find(|r| r.lsn == mine.lsn + 3).unwrap();
    assert!(
        text.contains(&format!(
            "corruption in {} at offset {}",
            segment.display(),
            next_chain.offset
        )) && text.contains("commit group MAC mismatch"),
        "the original's next group no longer follows: {text}"
    );
    fs::write(&segment, &good).unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(
        c.get("secret", Coord::new(1, 0, 0)).unwrap().unwrap(),
        b"original 1"
    );
}

/// A data dir written without a key (unchained segments, an
/// unauthenticated manifest, version-2 checkpoint files and plain runs) opens with a key, goes on in a
/// chained segment, and is authenticated at its next fold, keeping every
/// value; from then on it does not start without the key.
#[test]
fn a_data_dir_from_before_is_upgraded_by_the_first_keyed_start_and_fold() {
    let setup = Setup::new();
    let plain_args = setup.args(None);
    let mut old = LocalDaemon::start_in(&setup.data(), &setup.socket(), &plain_args).unwrap();
    let mut c = old.client().unwrap();
    for i in 0..5 {
        c.put("default", Coord::new(i, 0, 0), b"from before")
            .unwrap();
    }
    drop(c);
    assert!(old.terminate().unwrap().success());
    let manifest = setup.data().join("checkpoint").join("MANIFEST");
    let bytes = fs::read(&manifest).unwrap();
    assert_eq!((bytes[8], bytes[12]), (3, 0), "an unauthenticated manifest");

    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    c.put("default", Coord::new(9, 0, 0), b"after the key")
        .unwrap();
    drop(c);
    daemon.kill9().unwrap();
    let chained = wal_segments(&setup.data())
        .iter()
        .filter_map(|s| parse_segment_header(&fs::read(s).unwrap()).ok())
        .any(|h| h.chain.is_some());
    assert!(chained, "the keyed start goes on in a chained segment");
    daemon.restart().unwrap();
    assert!(daemon.terminate().unwrap().success());
    assert_eq!(
        fs::read(&manifest).unwrap()[12],
        1,
        "authenticated by the fold (its plain runs rewritten with MACs)"
    );

    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    for i in 0..5 {
        assert_eq!(
            c.get("default", Coord::new(i, 0, 0)).unwrap().unwrap(),
            b"from before"
        );
    }
    assert_eq!(
        c.get("default", Coord::new(9, 0, 0)).unwrap().unwrap(),
        b"after the key"
    );
    drop(c);
    assert!(daemon.terminate().unwrap().success());
    let (code, text) = setup.refused(&[]);
    assert!(matches!(code, Some(c) if c != 0), "{text}");
    assert!(text.contains("--key-file"), "without the key: {text}");
    let (code, text) = verify(&setup);
    assert_eq!(code, Some(0), "--verify with the key: {text}");
}
