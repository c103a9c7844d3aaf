//! Guards encryption at rest end to end, on a real `cubed`: no plaintext of an encrypted namespace in any file under the data dir (WAL, delta, base), its data surviving kill -9, checkpoint and compaction, a missing, wrong or too-open key refused naming the namespace, tampered ciphertext (checksums fixed up) refused as corruption with file and offset, a dropped namespace's name reused with a fresh, empty namespace, and two copies of a data dir that run on under one key never sealing under the same key.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cube_client::{CellBox, Client, Coord, LocalDaemon, Request, Response};

mod encryption_common;
use encryption_common::*;

fn checkpoint(c: &mut Client, compact: bool) {
    match c.call(&Request::Checkpoint { compact }).unwrap() {
        Response::Checkpoint(_) => {}
        other => panic!("checkpoint answered {other:?}"),
    }
}

/// 40 random-looking printable bytes, different per `tag`.
fn marker(tag: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in tag.bytes() {
        state = (state ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (0..40)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(ALPHABET[(state % ALPHABET.len() as u64) as usize])
        })
        .collect()
}

/// Writes `marker` into `ns` as values, an edge label and a program.
fn write_marked(c: &mut Client, ns: &str, marker: &str) {
    for i in 0..20 {
        let value = format!("row {i}: {marker} :end");
        c.put(ns, Coord::new(i, -i, 3), value.as_bytes()).unwrap();
    }
    c.link(ns, Coord::new(0, 0, 3), Coord::new(1, -1, 3), marker, 2.5)
        .unwrap();
    c.link(ns, Coord::new(1, -1, 3), Coord::new(2, -2, 3), "", 1.0)
        .unwrap();
    let source = format!("-- {marker}\nreturn \"{marker}\"");
    match c
        .call(&Request::Prog {
            ns: name(ns),
            coord: Coord::new(7, 7, 7),
            source: source.into_bytes(),
        })
        .unwrap()
    {
        Response::Prog { .. } => {}
        other => panic!("prog answered {other:?}"),
    }
    c.run(ns, Coord::new(7, 7, 7), &[marker.as_bytes()])
        .unwrap();
}

/// Every regular file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                // A file can vanish between listing and reading (a
                // checkpoint deleting what it folded); that is fine.
                let Ok(bytes) = fs::read(entry.path()) else {
                    continue;
                };
                if contains(&bytes, needle) {
                    hits.push(entry.path());
                }
            }
        }
    }
    hits
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let first = needle[0];
    hay.iter().enumerate().any(|(i, &b)| {
        b == first && hay.len() - i >= needle.len() && &hay[i..i + needle.len()] == needle
    })
}

/// The secret marker is nowhere, and no 16-byte piece of it either.
fn assert_no_plaintext(data: &Path, secret: &str, stage: &str) {
    for piece in secret.as_bytes().windows(16).step_by(8) {
        let hits = files_containing(data, piece);
        assert!(
            hits.is_empty(),
            "{stage}: plaintext {:?} of the encrypted namespace found in {hits:?}",
            String::from_utf8_lossy(piece)
        );
    }
}

fn checkpoint_files(data: &Path, prefix: &str) -> Vec<PathBuf> {
    fs::read_dir(data.join("checkpoint"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(prefix) && n.ends_with(".ckpt")
        })
        .collect()
}

/// Everything a namespace holds: values, edges, programs.
#[derive(Debug, PartialEq)]
struct Contents {
    cells: Vec<(Coord, Vec<u8>)>,
    edges: Vec<(Coord, Coord, String, u64)>,
    programs: Vec<(Coord, Vec<u8>)>,
}

fn contents(c: &mut Client, ns: &str) -> Contents {
    let everything = CellBox::new(
        Coord::new(-1000, -1000, -1000),
        Coord::new(1000, 1000, 1000),
    )
    .unwrap();
    let mut cells: Vec<(Coord, Vec<u8>)> = c
        .scan(ns, everything, 1000)
        .map(|cell| {
            let cell = cell.unwrap();
            (cell.coord, cell.value)
        })
        .collect();
    cells.sort_by_key(|(coord, _)| (coord.x, coord.y, coord.z));
    let mut edges = Vec::new();
    let mut after = None;
    loop {
        let page = c.edge_page(ns, 1000, after).unwrap();
        edges.extend(page.edges.into_iter().map(|e| {
            (
                e.from,
                e.to,
                e.label.as_str().to_owned(),
                e.weight.to_bits(),
            )
        }));
        match page.resume_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    edges.sort_by_key(|(from, to, label, _)| {
        (from.x, from.y, from.z, to.x, to.y, to.z, label.clone())
    });
    let mut programs = Vec::new();
    let mut after = None;
    loop {
        let page = c.program_page(ns, 1000, after).unwrap();
        programs.extend(page.programs.into_iter().map(|p| (p.coord, p.source)));
        match page.resume_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    Contents {
        cells,
        edges,
        programs,
    }
}

#[test]
fn no_file_under_the_data_dir_holds_plaintext_of_an_encrypted_namespace() {
    let setup = Setup::new();
    let daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "plain", false);
    create(&mut c, "secret", true);
    let secret = marker("secret");
    let control = marker("control");
    write_marked(&mut c, "secret", &secret);
    write_marked(&mut c, "plain", &control);
    let data = setup.data();

    // In the log only.
    assert!(checkpoint_files(&data, "delta-").is_empty());
    let hits = files_containing(&data, control.as_bytes());
    assert!(
        hits.iter()
            .any(|p| p.extension().is_some_and(|x| x == "wal")),
        "the scan finds the unencrypted namespace's marker in the WAL: {hits:?}"
    );
    assert_no_plaintext(&data, &secret, "WAL");

    // Folded into a delta.
    checkpoint(&mut c, false);
    assert!(!checkpoint_files(&data, "delta-").is_empty());
    let hits = files_containing(&data, control.as_bytes());
    assert!(
        hits.iter().any(|p| p
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("delta-")),
        "the scan finds the unencrypted namespace's marker in a delta: {hits:?}"
    );
    assert_no_plaintext(&data, &secret, "delta");

    // More writes, then merged into a base.
    write_marked(&mut c, "secret", &format!("{secret}-2"));
    checkpoint(&mut c, true);
    assert!(!checkpoint_files(&data, "base-").is_empty());
    let hits = files_containing(&data, control.as_bytes());
    assert!(
        hits.iter().any(|p| p
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("base-")),
        "the scan finds the unencrypted namespace's marker in a base: {hits:?}"
    );
    assert_no_plaintext(&data, &secret, "base");

    // The data is still readable through the daemon, of course.
    let got = contents(&mut c, "secret");
    assert_eq!(got.cells.len(), 20);
    assert!(got.edges.iter().any(|e| e.2 == format!("{secret}-2")));
    assert!(contains(&got.programs[0].1, secret.as_bytes()));
}

#[test]
fn encrypted_data_survives_kill9_checkpoint_compaction_and_restart() {
    let setup = Setup::new();
    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "secret", true);
    create(&mut c, "plain", false);
    write_marked(&mut c, "secret", &marker("a"));
    write_marked(&mut c, "plain", &marker("b"));
    c.del("secret", Coord::new(3, -3, 3)).unwrap();
    c.unlink("secret", Coord::new(1, -1, 3), Coord::new(2, -2, 3), "")
        .unwrap();
    let secret = contents(&mut c, "secret");
    let plain = contents(&mut c, "plain");
    assert_eq!(
        (
            secret.cells.len(),
            secret.edges.len(),
            secret.programs.len()
        ),
        (19, 1, 1),
        "{secret:?}"
    );
    drop(c);

    // Everything in the WAL.
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(contents(&mut c, "secret"), secret, "after kill -9 (WAL)");
    assert_eq!(contents(&mut c, "plain"), plain);

    // Part in a delta, part in the WAL.
    checkpoint(&mut c, false);
    for i in 100..110 {
        c.put(
            "secret",
            Coord::new(i, i, i),
            format!("late {i}").as_bytes(),
        )
        .unwrap();
    }
    let secret = contents(&mut c, "secret");
    drop(c);
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(contents(&mut c, "secret"), secret, "after delta + WAL");

    // Compacted into a base, then more in the WAL.
    checkpoint(&mut c, true);
    assert!(!checkpoint_files(&setup.data(), "base-").is_empty());
    c.put("secret", Coord::new(-5, -5, -5), b"after compaction")
        .unwrap();
    c.link(
        "secret",
        Coord::new(-5, -5, -5),
        Coord::new(100, 100, 100),
        "x",
        0.5,
    )
    .unwrap();
    let secret = contents(&mut c, "secret");
    let plain = contents(&mut c, "plain");
    drop(c);
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(contents(&mut c, "secret"), secret, "after base + WAL");
    assert_eq!(contents(&mut c, "plain"), plain);

    // A clean stop folds everything; the next start replays nothing.
    drop(c);
    assert!(daemon.terminate().unwrap().success());
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(contents(&mut c, "secret"), secret, "after a clean stop");
    assert_eq!(contents(&mut c, "plain"), plain);
    // And the store still takes sealed writes after all that.
    c.put("secret", Coord::new(9, 9, 9), b"still writable")
        .unwrap();
    assert_eq!(
        c.get("secret", Coord::new(9, 9, 9)).unwrap().unwrap(),
        b"still writable"
    );
}

/// Where the encrypted namespace's data is when the daemon is refused.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// Only in the WAL (kill -9 before any checkpoint).
    Wal,
    /// Only in checkpoint files (a clean stop folds the whole log).
    Checkpoint,
}

/// A stopped daemon whose encrypted namespace `secret` holds data at
/// `stage`, and that data.
fn stopped_with_secret(stage: Stage) -> (Setup, LocalDaemon, Contents) {
    let setup = Setup::new();
    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "plain", false);
    create(&mut c, "secret", true);
    write_marked(&mut c, "secret", &marker("k"));
    let before = contents(&mut c, "secret");
    drop(c);
    match stage {
        Stage::Wal => {
            daemon.kill9().unwrap();
            assert!(checkpoint_files(&setup.data(), "").is_empty());
        }
        Stage::Checkpoint => {
            assert!(daemon.terminate().unwrap().success());
            assert!(!checkpoint_files(&setup.data(), "").is_empty());
            let segments = wal_segments(&setup.data());
            assert!(
                segments
                    .iter()
                    .all(|s| record_offsets(&fs::read(s).unwrap()).is_empty()),
                "the log was folded whole: {segments:?}"
            );
        }
    }
    (setup, daemon, before)
}

/// None of the refusals changed anything: the right key still opens it all.
fn assert_opens_with_the_right_key(daemon: &mut LocalDaemon, before: &Contents) {
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(&contents(&mut c, "secret"), before);
}

#[test]
fn a_missing_key_is_refused_naming_the_namespace() {
    for stage in [Stage::Wal, Stage::Checkpoint] {
        let (setup, mut daemon, before) = stopped_with_secret(stage);
        let (code, text) = setup.refused(&[]);
        assert!(
            matches!(code, Some(c) if c != 0),
            "{stage:?}: exit {code:?}: {text}"
        );
        assert!(
            text.contains("namespace \"secret\"") && text.contains("--key-file"),
            "{stage:?}: without a key, names the namespace and --key-file: {text}"
        );
        assert_opens_with_the_right_key(&mut daemon, &before);
    }
}

#[test]
fn a_wrong_key_is_refused_naming_the_namespace_not_as_corruption() {
    for stage in [Stage::Wal, Stage::Checkpoint] {
        let (setup, mut daemon, before) = stopped_with_secret(stage);
        let other = setup.other_key();
        let (code, text) = setup.refused(&["--key-file", other.to_str().unwrap()]);
        assert!(
            matches!(code, Some(c) if c != 0),
            "{stage:?}: exit {code:?}: {text}"
        );
        assert!(
            text.contains("namespace \"secret\""),
            "{stage:?}: a wrong key names the namespace: {text}"
        );
        assert!(
            !text.contains("corruption") && !text.contains("--repair"),
            "{stage:?}: a wrong key is not reported as damage to repair: {text}"
        );
        // Nor does --repair cut anything because of a wrong key.
        let (code, text) = setup.refused(&["--repair", "--key-file", other.to_str().unwrap()]);
        assert!(
            matches!(code, Some(c) if c != 0),
            "{stage:?}: --repair: {code:?}: {text}"
        );
        assert_opens_with_the_right_key(&mut daemon, &before);
    }
}

#[test]
fn a_key_file_others_can_read_is_refused_with_the_chmod_that_fixes_it() {
    let (setup, mut daemon, before) = stopped_with_secret(Stage::Wal);
    let open_key = setup.tmp.path().join("open.key");
    write_key(&open_key, &hex_key(0x11), 0o644);
    let (code, text) = setup.refused(&["--key-file", open_key.to_str().unwrap()]);
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}: {text}");
    assert!(
        text.contains("chmod") && text.contains("0644"),
        "says the mode and the chmod that fixes it: {text}"
    );
    // The same bytes at mode 0600 are the right key.
    fs::set_permissions(&open_key, fs::Permissions::from_mode(0o600)).unwrap();
    let mut fixed = LocalDaemon::start_in(
        &setup.data(),
        &setup.socket(),
        &setup.args(Some(open_key.to_str().unwrap())),
    )
    .unwrap();
    let mut c = fixed.client().unwrap();
    assert_eq!(contents(&mut c, "secret"), before);
    drop(c);
    fixed.kill9().unwrap();
    assert_opens_with_the_right_key(&mut daemon, &before);
}

/// The header of one WAL segment: where its records start, and the seed
/// of their checksums.
fn segment_header(bytes: &[u8]) -> cube_store::wal::segment::SegmentHeader {
    cube_store::wal::segment::parse_segment_header(bytes).unwrap()
}

/// Offsets of the records of one WAL segment, up to the zeros.
fn record_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut at = segment_header(bytes).header_bytes;
    while at + RECORD_HEADER_BYTES <= bytes.len() && bytes[at..at + 8] != [0u8; 8] {
        offsets.push(at);
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        at += RECORD_HEADER_BYTES + len;
    }
    offsets
}

#[test]
fn a_tampered_sealed_wal_record_with_a_valid_crc_is_refused_as_corruption() {
    let setup = Setup::new();
    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "secret", true);
    for i in 0..30 {
        c.put(
            "secret",
            Coord::new(i, 0, 0),
            format!("sealed value {i:02}").as_bytes(),
        )
        .unwrap();
    }
    let before = contents(&mut c, "secret");
    drop(c);
    daemon.kill9().unwrap();

    let segments = wal_segments(&setup.data());
    let segment = &segments[0];
    let good = fs::read(segment).unwrap();
    let sealed: Vec<usize> = record_offsets(&good)
        .into_iter()
        .filter(|&at| good[at + 16] & SEALED_RECORD_BIT != 0)
        .collect();
    assert_eq!(sealed.len(), 30, "every put of the namespace is sealed");
    let at = sealed[15];
    let len = u32::from_le_bytes(good[at + 4..at + 8].try_into().unwrap()) as usize;
    // ns_len | "secret" | ns_id | start | ciphertext | tag
    let ciphertext = at + RECORD_HEADER_BYTES + 1 + 6 + SEALED_RECORD_PREFIX;
    let mut bad = good.clone();
    bad[ciphertext + 3] ^= 0x01;
    let crc = segment_header(&good)
        .crc_seed
        .checksum(&bad[at + 4..at + RECORD_HEADER_BYTES + len]);
    bad[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    fs::write(segment, &bad).unwrap();

    let file = segment.display().to_string();
    let (code, text) = setup.refused(&["--key-file", setup.key().to_str().unwrap()]);
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}: {text}");
    assert!(
        text.contains(&format!("corruption in {file} at offset {at}")),
        "names the file and the record's offset {at}: {text}"
    );
    assert!(
        text.contains("authentication") && !text.contains("checksum mismatch"),
        "only AES-GCM caught it: {text}"
    );

    let key = setup.key();
    let (code, text) = setup.verify(&["--key-file", key.to_str().unwrap()]);
    assert_eq!(code, Some(1), "--verify with the key fails: {text}");
    assert!(
        text.contains(&file) && text.contains(&format!("offset {at}")),
        "--verify names the file and offset: {text}"
    );

    // Control: the untouched bytes start fine, with every value.
    fs::write(segment, &good).unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(contents(&mut c, "secret"), before);
}

/// Recomputes every block CRC, the footer's chain of them and the
/// footer's own CRC, as if the file had been written this way.
fn fix_checkpoint_crcs(bytes: &mut [u8]) {
    let mut chain = 0u32;
    for (at, len, _) in blocks(bytes) {
        let crc = crc32c::crc32c(&bytes[at + 8..at + 8 + len]);
        bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        chain = crc32c::crc32c_append(chain, &crc.to_le_bytes());
    }
    let footer = bytes.len() - CKPT_FOOTER_BYTES;
    bytes[footer + 32..footer + 36].copy_from_slice(&chain.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[footer..footer + 36]);
    bytes[footer + 36..footer + 40].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn a_tampered_sealed_checkpoint_block_with_valid_crcs_is_refused_as_corruption() {
    let setup = Setup::new();
    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "plain", false);
    create(&mut c, "secret", true);
    write_marked(&mut c, "plain", &marker("p"));
    write_marked(&mut c, "secret", &marker("s"));
    checkpoint(&mut c, true);
    let before = contents(&mut c, "secret");
    drop(c);
    daemon.kill9().unwrap();

    let bases = checkpoint_files(&setup.data(), "base-");
    assert_eq!(bases.len(), 1, "{bases:?}");
    let base = &bases[0];
    let good = fs::read(base).unwrap();
    let mut untouched = good.clone();
    fix_checkpoint_crcs(&mut untouched);
    assert_eq!(
        untouched, good,
        "the CRC fix-up reproduces what cubed wrote"
    );
    let sealed: Vec<(usize, usize, bool)> = blocks(&good).into_iter().filter(|b| b.2).collect();
    assert!(
        !sealed.is_empty(),
        "the encrypted namespace's blocks are sealed"
    );
    let (at, len, _) = sealed[0];
    let mut bad = good.clone();
    bad[at + 8 + SEALED_BLOCK_PREFIX + (len - SEALED_BLOCK_PREFIX) / 2] ^= 0x80;
    fix_checkpoint_crcs(&mut bad);
    fs::write(base, &bad).unwrap();

    let file = base.display().to_string();
    let (code, text) = setup.refused(&["--key-file", setup.key().to_str().unwrap()]);
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}: {text}");
    assert!(
        text.contains(&format!("corruption in {file} at offset {at}")),
        "names the file and the block's offset {at}: {text}"
    );
    assert!(
        text.contains("authentication") && !text.contains("checksum mismatch"),
        "only AES-GCM caught it: {text}"
    );
    let key = setup.key();
    let (code, text) = setup.verify(&["--key-file", key.to_str().unwrap()]);
    assert_eq!(code, Some(1), "--verify with the key fails: {text}");
    assert!(
        text.contains(&file) && text.contains(&format!("offset {at}")),
        "--verify names the file and offset: {text}"
    );

    fs::write(base, &good).unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(contents(&mut c, "secret"), before);
}

/// Writes to an encrypted namespace that is dropped before the fold that
/// takes them: the fold ends with the namespace gone from its catalog, yet
/// the writes are in its delta and must be sealed (a past bug: they
/// were written in clear).
#[test]
fn writes_of_an_encrypted_namespace_dropped_before_their_fold_are_sealed() {
    let setup = Setup::new();
    let daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "secret", true);
    checkpoint(&mut c, false);
    let secret = marker("dropped before its fold");
    write_marked(&mut c, "secret", &secret);
    c.ns_drop(&name("secret")).unwrap();
    checkpoint(&mut c, false);
    assert!(!checkpoint_files(&setup.data(), "delta-").is_empty());
    assert_no_plaintext(&setup.data(), &secret, "the fold after the drop");
}

#[test]
fn a_dropped_encrypted_namespace_comes_back_empty_under_a_new_id() {
    let setup = Setup::new();
    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    let first = create(&mut c, "secret", true);
    write_marked(&mut c, "secret", &marker("old"));
    checkpoint(&mut c, false); // some of the old data in a delta ...
    c.put("secret", Coord::new(50, 50, 50), b"old, in the WAL")
        .unwrap(); // ... and some in the log
    c.ns_drop(&name("secret")).unwrap();

    let empty = Contents {
        cells: Vec::new(),
        edges: Vec::new(),
        programs: Vec::new(),
    };
    let second = create(&mut c, "secret", true);
    assert_ne!(second.id, first.id, "a new namespace, a new id");
    assert_eq!(contents(&mut c, "secret"), empty, "re-created encrypted");
    c.put("secret", Coord::new(1, 1, 1), b"second life")
        .unwrap();
    c.ns_drop(&name("secret")).unwrap();

    let third = create(&mut c, "secret", false);
    assert!(third.id != first.id && third.id != second.id);
    assert_eq!(contents(&mut c, "secret"), empty, "re-created unencrypted");
    c.put("secret", Coord::new(2, 2, 2), b"plain now").unwrap();
    c.link("secret", Coord::new(2, 2, 2), Coord::new(1, 1, 1), "", 1.0)
        .unwrap();
    let now = contents(&mut c, "secret");
    assert_eq!(now.cells.len(), 1);
    drop(c);

    // Nothing of the old namespaces comes back after a crash ...
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(contents(&mut c, "secret"), now, "after kill -9");
    let info = c.ns_info(&name("secret")).unwrap();
    assert_eq!((info.id, info.encrypted), (third.id, false));
    // ... nor after folding and compacting it all.
    checkpoint(&mut c, true);
    drop(c);
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(contents(&mut c, "secret"), now, "after compaction");
    assert_eq!(c.ns_info(&name("secret")).unwrap().id, third.id);
}

/// A sealed WAL record of namespace "secret": its LSN, the start id stored
/// in it, and its ciphertext and tag.
#[derive(Debug)]
struct SealedRecord {
    lsn: u64,
    start: u64,
    sealed: Vec<u8>,
}

/// Every sealed record in the data dir's WAL, in LSN order.
fn sealed_records(data: &Path) -> Vec<SealedRecord> {
    let mut out = Vec::new();
    for segment in wal_segments(data) {
        let bytes = fs::read(&segment).unwrap();
        for at in record_offsets(&bytes) {
            if bytes[at + 16] & SEALED_RECORD_BIT == 0 {
                continue;
            }
            let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
            let payload = &bytes[at + RECORD_HEADER_BYTES..at + RECORD_HEADER_BYTES + len];
            assert_eq!(&payload[..7], b"\x06secret");
            out.push(SealedRecord {
                lsn: u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap()),
                start: u64::from_le_bytes(payload[15..23].try_into().unwrap()),
                sealed: payload[7 + SEALED_RECORD_PREFIX..].to_vec(),
            });
        }
    }
    out
}

/// A put payload after its namespace: coord, value length, value.
fn put_plaintext(coord: Coord, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in [coord.x, coord.y, coord.z] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(value);
    out
}

/// A restored backup or a file-system snapshot that runs on next to (or
/// after) its original, under the same master key: each start draws its own
/// start id, so the two seal the same LSN under different keys. Under a
/// per-data-dir counter they would have reused (key, nonce), and the XOR of
/// the two ciphertexts would have been the XOR of the two plaintexts.
#[test]
fn two_copies_of_a_data_dir_never_seal_under_the_same_key() {
    let setup = Setup::new();
    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "secret", true);
    for i in 0..5 {
        c.put("secret", Coord::new(i, 0, 0), b"before the copy")
            .unwrap();
    }
    drop(c);
    daemon.kill9().unwrap();
    let copy = setup.tmp.path().join("copy");
    copy_dir(&setup.data(), &copy);
    let first_run = sealed_records(&setup.data());
    assert_eq!(first_run.len(), 5, "{first_run:?}");

    // Both run on, under the same key, and write at the same LSN.
    let coord = Coord::new(9, 9, 9);
    let values: [&[u8]; 2] = [
        b"written by the original: AAAAAAAA",
        b"written by the copy: BBBBBBBBBBBB",
    ];
    let key = setup.key();
    let args = setup.args(Some(key.to_str().unwrap()));
    let dirs = [setup.data(), copy.clone()];
    let mut last = Vec::new();
    for (dir, value) in dirs.iter().zip(values) {
        let socket = setup.tmp.path().join("copy.sock");
        let mut run = LocalDaemon::start_in(dir, &socket, &args).unwrap();
        let mut c = run.client().unwrap();
        c.put("secret", coord, value).unwrap();
        assert_eq!(c.get("secret", coord).unwrap().unwrap(), value);
        drop(c);
        run.kill9().unwrap();
        let records = sealed_records(dir);
        assert_eq!(records.len(), 6, "{records:?}");
        last.push(records.into_iter().next_back().unwrap());
    }
    let (a, b) = (&last[0], &last[1]);
    assert_eq!(a.lsn, b.lsn, "the copies sealed the same LSN");
    assert_eq!(a.sealed.len(), b.sealed.len());
    assert_ne!(a.start, 0);
    assert_ne!(a.start, b.start, "each start draws its own start id");
    assert!(
        first_run
            .iter()
            .all(|r| r.start == first_run[0].start && r.start != a.start && r.start != b.start),
        "a new start id at every start"
    );
    let xor = |x: &[u8], y: &[u8]| -> Vec<u8> { x.iter().zip(y).map(|(p, q)| p ^ q).collect() };
    let plain_xor = xor(
        &put_plaintext(coord, values[0]),
        &put_plaintext(coord, values[1]),
    );
    let cipher_xor = xor(&a.sealed, &b.sealed);
    assert_ne!(
        cipher_xor[..plain_xor.len()],
        plain_xor[..],
        "no shared keystream between the copies"
    );
    // The coordinate and length are the same plaintext in both: under one
    // (key, nonce) they would have been the same ciphertext.
    assert_ne!(a.sealed[..16], b.sealed[..16]);

    // Each copy still opens what both of its starts sealed.
    for (dir, value) in dirs.iter().zip(values) {
        let socket = setup.tmp.path().join("copy.sock");
        let mut run = LocalDaemon::start_in(dir, &socket, &args).unwrap();
        let mut c = run.client().unwrap();
        assert_eq!(c.get("secret", coord).unwrap().unwrap(), value);
        let before = c.get("secret", Coord::new(4, 0, 0)).unwrap().unwrap();
        assert_eq!(before, b"before the copy");
        drop(c);
        run.kill9().unwrap();
    }
}

/// Rewrites a WAL segment record by record: `change` may replace a record
/// (given its LSN and decoded mutation, for plaintext records) by another
/// encoding; every other record is copied byte for byte, sealed ones
/// included (their checksums and AAD do not depend on their offsets).
fn rewrite_segment(
    segment: &Path,
    mut change: impl FnMut(u64, Option<&cube_store::Mutation>, bool) -> Option<cube_store::Mutation>,
) {
    use cube_store::wal::record::{decode_record, encode_record, parse_record};
    let good = fs::read(segment).unwrap();
    let header = segment_header(&good);
    let mut out = good[..header.header_bytes].to_vec();
    for at in record_offsets(&good) {
        let record = parse_record(&good[at..], header.crc_seed).unwrap();
        let sealed = record.kind & SEALED_RECORD_BIT != 0;
        let chain = record.kind == cube_store::wal::chain::KIND_CHAIN;
        let plain = (!sealed && !chain).then(|| decode_record(&record, None, None).unwrap());
        match change(record.lsn, plain.as_ref(), sealed) {
            Some(mutation) => encode_record(
                &mut out,
                record.lsn,
                &mutation,
                record.group_end,
                header.crc_seed,
            ),
            None => out.extend_from_slice(&good[at..at + record.total_bytes]),
        }
    }
    out.resize(good.len().max(out.len()), 0);
    fs::write(segment, &out).unwrap();
}

/// Without the key, a plaintext record put in the place of a sealed one
/// (checksum right) would be taken as the namespace's data; cubed seals
/// every record of an encrypted namespace, so an unsealed one there is
/// refused as corruption (a past bug: `get` returned the forgery).
#[test]
fn a_plaintext_record_in_an_encrypted_namespace_is_refused() {
    let setup = Setup::new();
    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "secret", true);
    for i in 0..5 {
        c.put("secret", Coord::new(i, 0, 0), b"sealed").unwrap();
    }
    drop(c);
    daemon.kill9().unwrap();
    let segment = wal_segments(&setup.data())[0].clone();
    let last_sealed = {
        let bytes = fs::read(&segment).unwrap();
        let at = *record_offsets(&bytes)
            .iter()
            .rfind(|&&at| bytes[at + 16] & SEALED_RECORD_BIT != 0)
            .unwrap();
        u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap())
    };
    rewrite_segment(&segment, |lsn, _, _| {
        (lsn == last_sealed).then(|| cube_store::Mutation::Put {
            ns: name("secret"),
            coord: Coord::new(4, 0, 0),
            value: b"FORGED".to_vec(),
        })
    });
    let (code, text) = setup.refused(&["--key-file", setup.key().to_str().unwrap()]);
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}: {text}");
    assert!(
        text.contains("corruption") && text.contains("unsealed record in encrypted namespace"),
        "{text}"
    );
}

/// Clearing the `encrypted` flag of a namespace in its create record
/// (checksum right) would make its later writes plaintext while its sealed
/// records still opened; a sealed record in a namespace the metadata calls
/// unencrypted is refused as corruption.
#[test]
fn an_encrypted_flag_cleared_on_disk_is_refused() {
    let setup = Setup::new();
    let mut daemon = setup.start();
    let mut c = daemon.client().unwrap();
    create(&mut c, "secret", true);
    c.put("secret", Coord::new(1, 1, 1), b"sealed").unwrap();
    drop(c);
    daemon.kill9().unwrap();
    let segment = wal_segments(&setup.data())[0].clone();
    let mut cleared = false;
    rewrite_segment(&segment, |_, plain, _| match plain {
        Some(cube_store::Mutation::NamespaceCreate { ns, meta }) if meta.encrypted => {
            cleared = true;
            let mut meta = meta.clone();
            meta.encrypted = false;
            Some(cube_store::Mutation::NamespaceCreate {
                ns: ns.clone(),
                meta,
            })
        }
        _ => None,
    });
    assert!(cleared, "the create record was in the segment");
    let (code, text) = setup.refused(&["--key-file", setup.key().to_str().unwrap()]);
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}: {text}");
    assert!(
        text.contains("corruption") && text.contains("metadata was altered"),
        "{text}"
    );
}
