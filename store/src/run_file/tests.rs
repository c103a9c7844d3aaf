//! Run files against a `BTreeMap` model through a cache of a few blocks,
//! damaged files, encrypted files, and failing reads.

use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::format::Mode;
use super::*;
use crate::crypto::{Keyring, MasterKey};
use crate::sim_disk::{FaultPlan, SimDisk};
use crate::storage::{RealDisk, Storage};

mod filter;
mod lazy;
mod page_layout;
mod read_ahead;
mod seek;
mod writer_memory;

type Model = BTreeMap<u128, Option<Vec<u8>>>;
type Entries = Vec<(u128, Option<Vec<u8>>)>;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Keys in a few clusters, so that ranges find neighbours.
    fn key(&mut self) -> u128 {
        let cluster = u128::from(self.below(4)) << 100;
        cluster | u128::from(self.below(1 << 20))
    }
}

const DIR_ID: [u8; 16] = [0x42; 16];

fn keyring(start: u64) -> Arc<Keyring> {
    Arc::new(Keyring::new(Some(MasterKey::from_bytes([7u8; 32])), start))
}

fn protection(mode: Mode) -> Protection {
    match mode {
        Mode::Plain => Protection::Plain,
        Mode::Authenticated => Protection::Authenticated {
            keyring: keyring(11),
            dir_id: DIR_ID,
        },
        Mode::Sealed => Protection::Sealed {
            keyring: keyring(11),
            dir_id: DIR_ID,
        },
    }
}

/// A reader's protection: the same key under another start id (what a
/// later start of the daemon has).
fn read_protection(mode: Mode) -> Protection {
    match protection(mode) {
        Protection::Authenticated { dir_id, .. } => Protection::Authenticated {
            keyring: keyring(99),
            dir_id,
        },
        Protection::Sealed { dir_id, .. } => Protection::Sealed {
            keyring: keyring(99),
            dir_id,
        },
        p => p,
    }
}

fn random_model(rng: &mut Rng, entries: usize) -> Model {
    let mut model = Model::new();
    while model.len() < entries {
        let key = rng.key();
        let value = match rng.below(10) {
            0 => None,
            // Larger than a block: a block of its own.
            1 => Some(vec![b'L'; 300 + rng.below(700) as usize]),
            _ => Some(format!("secret-{key:x}-{}", rng.below(1000)).into_bytes()),
        };
        model.insert(key, value);
    }
    model
}

fn write(
    storage: &dyn Storage,
    path: &Path,
    model: &Model,
    mode: Mode,
    block_bytes: usize,
) -> RunSummary {
    let mut w = RunFileWriter::create(storage, path, 17, 5, &protection(mode), model.len() as u64)
        .unwrap()
        .with_target_block_bytes(block_bytes);
    for (k, v) in model {
        w.push(*k, v.as_deref()).unwrap();
    }
    w.finish().unwrap()
}

fn slot(v: &Option<Vec<u8>>) -> Slot {
    v.as_deref().map(crate::CellValue::new)
}

fn collect(range: RunFileRange<'_>) -> Result<Entries, RunFileError> {
    range
        .map(|r| r.map(|(k, v)| (k, v.map(|v| v.to_vec()))))
        .collect()
}

fn model_range(model: &Model, lo: u128, hi: u128) -> Entries {
    if lo > hi {
        return Vec::new();
    }
    model
        .range((Bound::Included(lo), Bound::Included(hi)))
        .map(|(k, v)| (*k, v.clone()))
        .collect()
}

fn check_against_model(reader: &RunFileReader, model: &Model, rng: &mut Rng, what: &str) {
    let keys: Vec<u128> = model.keys().copied().collect();
    for _ in 0..400 {
        let key = if !keys.is_empty() && rng.below(2) == 0 {
            keys[rng.below(keys.len() as u64) as usize]
        } else {
            rng.key()
        };
        let want = model.get(&key).map(slot);
        assert_eq!(reader.get(key).unwrap(), want, "{what}: get {key:#x}");
    }
    for _ in 0..60 {
        let (a, b) = (rng.key(), rng.key());
        let (lo, hi) = if rng.below(8) == 0 {
            (b, a)
        } else {
            (a.min(b), a.max(b))
        };
        let got = collect(reader.range(lo, hi)).unwrap();
        assert_eq!(
            got,
            model_range(model, lo, hi),
            "{what}: range {lo:#x}..={hi:#x}"
        );
    }
    let all = collect(reader.range(0, u128::MAX)).unwrap();
    assert_eq!(all, model_range(model, 0, u128::MAX), "{what}: everything");
}

/// Random files, read through a cache of about three blocks: every read
/// goes through eviction, and point reads and ranges match the model.
#[test]
fn reads_match_a_model_through_a_tiny_cache() {
    let tmp = tempfile::tempdir().unwrap();
    for seed in 1..=12u64 {
        let mode = [Mode::Plain, Mode::Authenticated, Mode::Sealed][seed as usize % 3];
        let mut rng = Rng(seed * 0x9e37_79b9);
        let entries = [0, 1, 2, 50, 700, 2500][rng.below(6) as usize];
        let model = random_model(&mut rng, entries);
        let path = tmp.path().join(format!("run-{seed}"));
        let summary = write(&RealDisk, &path, &model, mode, 256);
        assert_eq!(summary.entries, model.len() as u64);
        assert_eq!(summary.mac.is_some(), mode != Mode::Plain);
        let cache = Arc::new(BlockCache::new(3 * 700));
        let reader =
            RunFileReader::open(&path, &read_protection(mode), Arc::clone(&cache)).unwrap();
        assert_eq!(reader.entry_count(), model.len() as u64);
        assert_eq!(reader.mac(), summary.mac);
        check_against_model(&reader, &model, &mut rng, &format!("seed {seed} {mode:?}"));
        assert!(reader.verify().is_empty(), "seed {seed}");
        let stats = cache.stats();
        assert!(stats.bytes <= stats.budget_bytes, "{stats:?}");
        // (No hits asked for: the lookups of absent keys that used to
        // find their block cached now read none, the filter ruling them out.)
        if reader.block_count() > 10 {
            assert!(stats.evictions > 0, "seed {seed}: {stats:?}");
        }
    }
}

/// A larger file read by several threads at once through one small
/// sharded cache.
#[test]
fn concurrent_readers_share_one_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng(77);
    let model = Arc::new(random_model(&mut rng, 20_000));
    let path = tmp.path().join("run");
    write(&RealDisk, &path, &model, Mode::Sealed, TARGET_BLOCK_BYTES);
    let cache = Arc::new(BlockCache::new(4 << 20));
    let reader = Arc::new(
        RunFileReader::open(&path, &read_protection(Mode::Sealed), Arc::clone(&cache)).unwrap(),
    );
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (reader, model) = (Arc::clone(&reader), Arc::clone(&model));
            std::thread::spawn(move || {
                let mut rng = Rng(t + 1000);
                check_against_model(&reader, &model, &mut rng, &format!("thread {t}"));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(cache.stats().hits > 0);
}

/// A sealed file holds no value and no key in plaintext.
#[test]
fn a_sealed_file_holds_no_plaintext() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng(5);
    let model = random_model(&mut rng, 300);
    let path = tmp.path().join("sealed");
    write(&RealDisk, &path, &model, Mode::Sealed, 512);
    let bytes = std::fs::read(&path).unwrap();
    let contains = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(!contains(b"secret-"), "a value in plaintext");
    for key in model.keys() {
        assert!(!contains(&key.to_le_bytes()), "key {key:#x} in plaintext");
    }
    // The same entries in a plain file are there to be found.
    let plain = tmp.path().join("plain");
    write(&RealDisk, &plain, &model, Mode::Plain, 512);
    assert!(
        std::fs::read(&plain)
            .unwrap()
            .windows(7)
            .any(|w| w == b"secret-")
    );
}

fn small_file(mode: Mode) -> (Vec<u8>, Model) {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng(3);
    let mut model = Model::new();
    for i in 0..40u128 {
        let v = (rng.below(5) != 0).then(|| format!("value {i}").into_bytes());
        model.insert(i * 1000 + 7, v);
    }
    let path = tmp.path().join("small");
    write(&RealDisk, &path, &model, mode, 96);
    (std::fs::read(&path).unwrap(), model)
}

fn open_bytes(bytes: Vec<u8>, mode: Mode) -> Result<RunFileReader, RunFileError> {
    let cache = Arc::new(BlockCache::new(2 * 400));
    RunFileReader::open_source(
        Box::new(bytes),
        Path::new("damaged.run"),
        &read_protection(mode),
        cache,
    )
}

/// Flips one bit in every byte of the file in turn: a flip in the footer,
/// the index or the filter fails the open, naming the footer's, the
/// index's or the filter's offset; a flip in a block fails the reads of that block, naming its
/// offset, and every other read still answers right. No flip ever yields
/// a wrong value.
#[test]
fn every_flipped_bit_is_an_error_naming_its_place_never_wrong_data() {
    for mode in [Mode::Plain, Mode::Authenticated, Mode::Sealed] {
        let (good, model) = small_file(mode);
        let clean = open_bytes(good.clone(), mode).unwrap();
        let blocks: Vec<(u64, u64)> = (0..clean.block_count())
            .map(|i| (clean.index().offsets[i], u64::from(clean.index().lens[i])))
            .collect();
        assert!(blocks.len() > 5, "{mode:?}: {} blocks", blocks.len());
        let index_at = clean.footer().index_offset;
        let filter_at = clean.footer().filter_offset();
        let footer_at = good.len() as u64 - FOOTER_BYTES as u64;
        for pos in 0..good.len() {
            let mut bad = good.clone();
            bad[pos] ^= 1 << (pos % 8);
            let pos = pos as u64;
            let what = format!("{mode:?} byte {pos}");
            let reader = match open_bytes(bad, mode) {
                Err(RunFileError::Corrupt { path, offset, .. }) => {
                    assert_eq!(path, Path::new("damaged.run"), "{what}");
                    if pos >= footer_at {
                        assert_eq!(offset, footer_at, "{what}");
                    } else {
                        assert!(pos >= index_at, "{what}: a block flip failed the open");
                        // The file MAC (at the footer) is checked first.
                        let piece_at = if pos >= filter_at {
                            filter_at
                        } else {
                            index_at
                        };
                        assert!(
                            offset == piece_at || (mode != Mode::Plain && offset == footer_at),
                            "{what}: {offset}"
                        );
                    }
                    continue;
                }
                Err(e) => panic!("{what}: {e}"),
                Ok(reader) => reader,
            };
            assert!(pos < index_at, "{what}: a damaged index or footer opened");
            let (block_at, _) = *blocks
                .iter()
                .find(|(at, len)| (*at..at + len).contains(&pos))
                .unwrap();
            let mut failed = 0;
            for (key, value) in &model {
                match reader.get(*key) {
                    Ok(got) => assert_eq!(got, Some(slot(value)), "{what}: key {key}"),
                    Err(RunFileError::Corrupt { offset, .. }) => {
                        assert_eq!(offset, block_at, "{what}: key {key}");
                        failed += 1;
                    }
                    Err(e) => panic!("{what}: {e}"),
                }
            }
            assert!(failed > 0, "{what}: the damaged block was never noticed");
            let mut seen = model.iter();
            for item in reader.range(0, u128::MAX) {
                match item {
                    Ok((k, v)) => {
                        let (mk, mv) = seen.next().unwrap();
                        assert_eq!((k, v), (*mk, slot(mv)), "{what}");
                    }
                    Err(RunFileError::Corrupt { offset, .. }) => {
                        assert_eq!(offset, block_at, "{what}")
                    }
                    Err(e) => panic!("{what}: {e}"),
                }
            }
            assert_eq!(reader.verify().len(), 1, "{what}");
        }
    }
}

/// Two sealed blocks of the same length swapped (each intact, CRC and
/// all) fail to open: a block's offset is in its associated data.
#[test]
fn a_moved_block_fails_authentication() {
    for mode in [Mode::Authenticated, Mode::Sealed] {
        let (mut bytes, _) = small_file(mode);
        let reader = open_bytes(bytes.clone(), mode).unwrap();
        let idx = reader.index();
        let (a, b) = (0..idx.len())
            .flat_map(|a| (a + 1..idx.len()).map(move |b| (a, b)))
            .find(|&(a, b)| idx.lens[a] == idx.lens[b])
            .expect("two blocks of one length");
        let len = idx.lens[a] as usize;
        let (oa, ob) = (idx.offsets[a] as usize, idx.offsets[b] as usize);
        let block_a = bytes[oa..oa + len].to_vec();
        bytes.copy_within(ob..ob + len, oa);
        bytes[ob..ob + len].copy_from_slice(&block_a);
        let moved = open_bytes(bytes, mode).unwrap();
        for i in [a, b] {
            let key = moved.index().first_keys[i];
            match moved.get(key) {
                Err(RunFileError::Corrupt { offset, reason, .. }) => {
                    assert_eq!(offset, moved.index().offsets[i]);
                    assert!(
                        reason.contains("MAC") || reason.contains("decrypt"),
                        "{reason}"
                    );
                }
                other => panic!("{mode:?}: a moved block read as {other:?}"),
            }
        }
    }
}

/// A file opened with less or more protection than it has is refused;
/// a wrong key or another data dir's id fails the MAC.
#[test]
fn protection_must_match_and_the_key_must_be_right() {
    let (plain, _) = small_file(Mode::Plain);
    let (sealed, _) = small_file(Mode::Sealed);
    let refused = |bytes: &Vec<u8>, p: Protection| {
        RunFileReader::open_source(
            Box::new(bytes.clone()),
            Path::new("f"),
            &p,
            Arc::new(BlockCache::new(1 << 16)),
        )
        .unwrap_err()
    };
    let e = refused(&plain, read_protection(Mode::Sealed));
    assert!(matches!(e, RunFileError::Key { .. }), "{e}");
    assert!(e.to_string().contains("requires Sealed"), "{e}");
    let e = refused(&sealed, Protection::Plain);
    assert!(e.to_string().contains("--key-file"), "{e}");
    let wrong_key = Arc::new(Keyring::new(Some(MasterKey::from_bytes([8u8; 32])), 0));
    let e = refused(
        &sealed,
        Protection::Sealed {
            keyring: wrong_key,
            dir_id: DIR_ID,
        },
    );
    assert!(
        matches!(e, RunFileError::Corrupt { .. }) && e.to_string().contains("MAC"),
        "{e}"
    );
    let e = refused(
        &sealed,
        Protection::Sealed {
            keyring: keyring(1),
            dir_id: [1; 16],
        },
    );
    assert!(e.to_string().contains("MAC"), "{e}");
}

/// Reads fail with EIO at one block's offset: only the reads of that
/// block fail, with an I/O error naming it; the reader keeps answering.
struct FailingAt {
    bytes: Vec<u8>,
    bad: std::ops::Range<u64>,
}

impl BlockSource for FailingAt {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        if offset < self.bad.end && self.bad.start < end {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.bytes.read_exact_at(buf, offset)
    }

    fn len(&self) -> io::Result<u64> {
        BlockSource::len(&self.bytes)
    }
}

#[test]
fn an_eio_fails_only_the_reads_of_its_block() {
    let (bytes, model) = small_file(Mode::Sealed);
    let clean = open_bytes(bytes.clone(), Mode::Sealed).unwrap();
    let bad_block = clean.block_count() / 2;
    let bad_at = clean.index().offsets[bad_block];
    let source = FailingAt {
        bytes,
        bad: bad_at..bad_at + 1,
    };
    let reader = RunFileReader::open_source(
        Box::new(source),
        Path::new("eio.run"),
        &read_protection(Mode::Sealed),
        Arc::new(BlockCache::new(1 << 16)),
    )
    .unwrap();
    for (key, value) in &model {
        let in_bad = clean.index().block_for(*key) == Some(bad_block);
        match reader.get(*key) {
            Err(RunFileError::Io {
                path,
                offset,
                source,
            }) => {
                assert!(in_bad, "key {key}");
                assert_eq!((path.as_path(), offset), (Path::new("eio.run"), bad_at));
                assert_eq!(source.raw_os_error(), Some(libc::EIO));
            }
            Ok(got) => {
                assert!(!in_bad, "key {key}");
                assert_eq!(got, Some(slot(value)));
            }
            Err(e) => panic!("{e}"),
        }
    }
    // A range reads ahead in one pread; that fails, so it reads block by
    // block and delivers everything before the bad block, then the error.
    let got: Vec<_> = reader.range(0, u128::MAX).collect();
    let good = got.iter().take_while(|r| r.is_ok()).count();
    let before_bad = model
        .keys()
        .filter(|k| **k < clean.index().first_keys[bad_block])
        .count();
    assert_eq!(good, before_bad);
    assert!(matches!(got.last(), Some(Err(RunFileError::Io { offset, .. })) if *offset == bad_at));
}

/// Written through the simulated disk, read through it; a file cut short
/// (a lost tail) is refused at open with its offset, never read.
#[test]
fn the_simulated_disk_writes_and_reads_and_a_cut_file_is_refused() {
    let disk = SimDisk::new(FaultPlan::default());
    disk.create_dir_all(Path::new("/sim/runs")).unwrap();
    let mut rng = Rng(9);
    let model = random_model(&mut rng, 500);
    let path = PathBuf::from("/sim/runs/000001.run");
    write(&disk, &path, &model, Mode::Authenticated, 512);
    assert!(
        !disk
            .list_dir(Path::new("/sim/runs"))
            .unwrap()
            .iter()
            .any(|n| n.ends_with(".tmp"))
    );
    // The file and its directory entry were synced: a power cut keeps it.
    let after_crash = disk.crash();
    let cache = Arc::new(BlockCache::new(4096));
    let reader = RunFileReader::open_storage(
        &after_crash,
        &path,
        &read_protection(Mode::Authenticated),
        cache,
    )
    .unwrap();
    check_against_model(&reader, &model, &mut rng, "sim disk");
    drop(reader);
    let mut file = after_crash
        .open(&path, crate::storage::OpenMode::Existing)
        .unwrap();
    let len = file.len().unwrap();
    file.set_len(len - 10).unwrap();
    drop(file);
    let e = RunFileReader::open_storage(
        &after_crash,
        &path,
        &read_protection(Mode::Authenticated),
        Arc::new(BlockCache::new(4096)),
    )
    .unwrap_err();
    assert!(
        matches!(&e, RunFileError::Corrupt { offset, .. } if *offset == len - 10 - FOOTER_BYTES as u64),
        "{e}"
    );
    assert!(e.to_string().contains("/sim/runs/000001.run"), "{e}");
}

#[test]
fn the_writer_refuses_keys_out_of_order_and_makes_a_private_file() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("r");
    let mut w = RunFileWriter::create(&RealDisk, &path, 1, 1, &Protection::Plain, 3).unwrap();
    w.push(5, Some(b"a")).unwrap();
    for key in [5, 4] {
        let e = w.push(key, Some(b"b")).unwrap_err();
        assert!(matches!(e, RunFileError::Refused { .. }), "{e}");
    }
    w.finish().unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(!tmp.path().join("r.tmp").exists());
}

#[test]
fn the_cache_keeps_its_budget_and_counts() {
    let mut rng = Rng(21);
    let model = random_model(&mut rng, 3000);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("r");
    write(&RealDisk, &path, &model, Mode::Plain, 1024);
    let cache = Arc::new(BlockCache::new(8 * 1024 * 1024));
    let reader = RunFileReader::open(&path, &Protection::Plain, Arc::clone(&cache)).unwrap();
    collect(reader.range(0, u128::MAX)).unwrap();
    let first = cache.stats();
    assert_eq!(first.misses, reader.block_count() as u64);
    assert_eq!(first.blocks, reader.block_count() as u64);
    collect(reader.range(0, u128::MAX)).unwrap();
    let second = cache.stats();
    assert_eq!(second.hits, reader.block_count() as u64, "{second:?}");
    cache.forget_file(reader.cache_id());
    assert_eq!(cache.stats().bytes, 0);
}

/// Reads from a simulated disk that fails reads with EIO, cuts them
/// short and flips bits in what they return, over many seeds: the open
/// and every read answer right or fail with an error naming the file,
/// never a wrong value.
#[test]
fn simulated_read_faults_never_yield_wrong_data() {
    let mut rng = Rng(31);
    let model = random_model(&mut rng, 400);
    let path = PathBuf::from("/sim/runs/000002.run");
    let (mut errors, mut answers) = (0u64, 0u64);
    for seed in 1..=40u64 {
        let mode = [Mode::Plain, Mode::Authenticated, Mode::Sealed][seed as usize % 3];
        let disk = SimDisk::new(FaultPlan::default());
        disk.create_dir_all(Path::new("/sim/runs")).unwrap();
        write(&disk, &path, &model, mode, 256);
        let faulty = disk.with_plan(FaultPlan {
            seed,
            read_eio_ppm: 30_000,
            read_short_ppm: 30_000,
            read_flip_ppm: 60_000,
            ..FaultPlan::default()
        });
        let cache = Arc::new(BlockCache::new(2 * 600));
        let what = format!("seed {seed} {mode:?}");
        let reader =
            match RunFileReader::open_storage(&faulty, &path, &read_protection(mode), cache) {
                Ok(reader) => reader,
                Err(e) => {
                    assert!(e.to_string().contains("000002.run"), "{what}: {e}");
                    errors += 1;
                    continue;
                }
            };
        for _ in 0..200 {
            let key = *model
                .keys()
                .nth(rng.below(model.len() as u64) as usize)
                .unwrap();
            match reader.get(key) {
                Ok(got) => {
                    assert_eq!(got, Some(slot(&model[&key])), "{what}: key {key:#x}");
                    answers += 1;
                }
                Err(e @ (RunFileError::Corrupt { .. } | RunFileError::Io { .. })) => {
                    assert!(e.to_string().contains("000002.run"), "{what}: {e}");
                    errors += 1;
                }
                Err(e) => panic!("{what}: {e}"),
            }
        }
        let (lo, hi) = (rng.key(), rng.key());
        let want = model_range(&model, lo.min(hi), lo.max(hi));
        let mut got = Vec::new();
        for item in reader.range(lo.min(hi), lo.max(hi)) {
            match item {
                Ok((k, v)) => got.push((k, v.map(|v| v.to_vec()))),
                Err(_) => {
                    errors += 1;
                    break;
                }
            }
        }
        assert_eq!(
            got[..],
            want[..got.len()],
            "{what}: a range yielded a wrong entry"
        );
    }
    assert!(
        errors > 0 && answers > 0,
        "errors {errors}, answers {answers}"
    );
}

/// Layers: what a key holds is its newest layer's entry.
fn layered(layers: &[Model], drop_tombstones: bool) -> Model {
    let mut out = Model::new();
    for layer in layers.iter().rev() {
        for (k, v) in layer {
            out.insert(*k, v.clone());
        }
    }
    if drop_tombstones {
        out.retain(|_, v| v.is_some());
    }
    out
}

fn model_source(model: &Model) -> merge::Source<'_> {
    Box::new(model.iter().map(|(k, v)| Ok((*k, slot(v)))))
}

/// A memtable over two run files, merged newest first into a new run
/// file: it reads back as the layers say, with and without tombstones.
#[test]
fn merging_a_memtable_and_runs_matches_the_layers() {
    let tmp = tempfile::tempdir().unwrap();
    for seed in 1..=6u64 {
        let mut rng = Rng(seed * 7919);
        // Overlapping layers: draw from one pool of keys.
        let pool = random_model(&mut rng, 1500);
        let keys: Vec<u128> = pool.keys().copied().collect();
        let layer = |n: usize, rng: &mut Rng| -> Model {
            (0..n)
                .map(|_| {
                    let k = keys[rng.below(keys.len() as u64) as usize];
                    let v = (rng.below(4) != 0)
                        .then(|| format!("v{seed}-{}", rng.below(1000)).into_bytes());
                    (k, v)
                })
                .collect()
        };
        let (memtable, newer, older) = (
            layer(200, &mut rng),
            layer(600, &mut rng),
            layer(900, &mut rng),
        );
        let cache = Arc::new(BlockCache::new(3 * 700));
        let mode = [Mode::Plain, Mode::Sealed][seed as usize % 2];
        let mut readers = Vec::new();
        for (i, m) in [&newer, &older].into_iter().enumerate() {
            let path = tmp.path().join(format!("in-{seed}-{i}"));
            write(&RealDisk, &path, m, mode, 256);
            readers.push(
                RunFileReader::open(&path, &read_protection(mode), Arc::clone(&cache)).unwrap(),
            );
        }
        for drop_tombstones in [false, true] {
            let sources: Vec<merge::Source<'_>> = vec![
                model_source(&memtable),
                Box::new(readers[0].range(0, u128::MAX)),
                Box::new(readers[1].range(0, u128::MAX)),
            ];
            let merged = Merge::new(sources, drop_tombstones).unwrap();
            let out = tmp.path().join(format!("out-{seed}-{drop_tombstones}"));
            let expected = (memtable.len() + newer.len() + older.len()) as u64;
            let writer =
                RunFileWriter::create(&RealDisk, &out, 100 + seed, 5, &protection(mode), expected)
                    .unwrap()
                    .with_target_block_bytes(256);
            let summary = write_all(writer, merged).unwrap();
            let want = layered(
                &[memtable.clone(), newer.clone(), older.clone()],
                drop_tombstones,
            );
            assert_eq!(summary.entries, want.len() as u64, "seed {seed}");
            let reader =
                RunFileReader::open(&out, &read_protection(mode), Arc::clone(&cache)).unwrap();
            check_against_model(
                &reader,
                &want,
                &mut rng,
                &format!("merge seed {seed} {drop_tombstones}"),
            );
        }
    }
}

/// A source that fails ends the merge with its error, and the writer's
/// file is never put in place.
#[test]
fn a_failing_source_ends_the_merge_and_writes_no_file() {
    let tmp = tempfile::tempdir().unwrap();
    let failing: merge::Source<'_> = Box::new(
        [(1u128, Some(crate::CellValue::new(b"a")))]
            .into_iter()
            .map(Ok)
            .chain(std::iter::once(Err(RunFileError::Io {
                path: PathBuf::from("bad.run"),
                offset: 4096,
                source: io::Error::from_raw_os_error(libc::EIO),
            }))),
    );
    let merged = Merge::new(vec![failing], false).unwrap();
    let out = tmp.path().join("out");
    let writer = RunFileWriter::create(&RealDisk, &out, 1, 1, &Protection::Plain, 1 << 20).unwrap();
    let e = write_all(writer, merged).unwrap_err();
    assert!(matches!(e, RunFileError::Io { offset: 4096, .. }), "{e}");
    assert!(!out.exists());
}

/// A batched read answers each key as a point read would, through a tiny
/// cache, with absent and repeated keys; a failing block fails only the
/// keys it holds.
#[test]
fn get_many_answers_like_get() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng(404);
    let model = random_model(&mut rng, 1500);
    let keys: Vec<u128> = model.keys().copied().collect();
    let path = tmp.path().join("r");
    write(&RealDisk, &path, &model, Mode::Sealed, 256);
    let reader = RunFileReader::open(
        &path,
        &read_protection(Mode::Sealed),
        Arc::new(BlockCache::new(3 * 700)),
    )
    .unwrap();
    for _ in 0..50 {
        let batch: Vec<u128> = (0..rng.below(80))
            .map(|_| match rng.below(3) {
                0 => rng.key(),
                _ => keys[rng.below(keys.len() as u64) as usize],
            })
            .collect();
        let got = reader.get_many(&batch);
        assert_eq!(got.len(), batch.len());
        for (key, answer) in batch.iter().zip(got) {
            assert_eq!(answer.unwrap(), model.get(key).map(slot), "key {key:#x}");
        }
    }
    let (bytes, small) = small_file(Mode::Plain);
    let clean = open_bytes(bytes.clone(), Mode::Plain).unwrap();
    let bad_block = 2;
    let bad_at = clean.index().offsets[bad_block];
    let failing = RunFileReader::open_source(
        Box::new(FailingAt {
            bytes,
            bad: bad_at..bad_at + 1,
        }),
        Path::new("eio.run"),
        &Protection::Plain,
        Arc::new(BlockCache::new(1 << 16)),
    )
    .unwrap();
    let batch: Vec<u128> = small.keys().copied().collect();
    for (key, answer) in batch.iter().zip(failing.get_many(&batch)) {
        if clean.index().block_for(*key) == Some(bad_block) {
            assert!(
                matches!(answer, Err(RunFileError::Io { offset, ref source, .. })
                if offset == bad_at && source.raw_os_error() == Some(libc::EIO)),
                "{answer:?}"
            );
        } else {
            assert_eq!(answer.unwrap(), Some(slot(&small[key])));
        }
    }
}

/// A power cut before `finish` leaves no run file under its name (at most
/// a `.tmp`, which the next writer of that name empties); a cut right
/// after `finish` keeps the whole file.
#[test]
fn a_power_cut_keeps_a_finished_file_and_never_a_partial_one() {
    let disk = SimDisk::new(FaultPlan::default());
    disk.create_dir_all(Path::new("/sim/runs")).unwrap();
    let path = PathBuf::from("/sim/runs/000003.run");
    let mut rng = Rng(8);
    let model = random_model(&mut rng, 300);
    let mut w = RunFileWriter::create(&disk, &path, 3, 5, &Protection::Plain, 300)
        .unwrap()
        .with_target_block_bytes(256);
    for (k, v) in &model {
        w.push(*k, v.as_deref()).unwrap();
    }
    drop(w);
    let cut = disk.crash();
    let names = cut.list_dir(Path::new("/sim/runs")).unwrap();
    assert!(!names.iter().any(|n| n == "000003.run"), "{names:?}");
    // The next attempt writes over the stale .tmp and finishes.
    write(&cut, &path, &model, Mode::Plain, 256);
    let after = cut.crash();
    let reader = RunFileReader::open_storage(
        &after,
        &path,
        &Protection::Plain,
        Arc::new(BlockCache::new(4096)),
    )
    .unwrap();
    check_against_model(&reader, &model, &mut rng, "after a power cut");
    assert_eq!(
        after.list_dir(Path::new("/sim/runs")).unwrap(),
        vec!["000003.run".to_string()]
    );
}

/// A reader checks a file against what the manifest lists: its id, its
/// namespace and its MAC.
#[test]
fn expect_refuses_a_file_the_manifest_does_not_list() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng(12);
    let model = random_model(&mut rng, 100);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let summary = write(&RealDisk, &a, &model, Mode::Authenticated, 256);
    // The same file id and namespace, one value changed: another version.
    let mut changed = model.clone();
    let first = *changed.keys().next().unwrap();
    changed.insert(first, Some(b"changed".to_vec()));
    let other = write(&RealDisk, &b, &changed, Mode::Authenticated, 256);
    let cache = Arc::new(BlockCache::new(1 << 16));
    let reader = RunFileReader::open(&a, &read_protection(Mode::Authenticated), cache).unwrap();
    reader.expect(17, 5, summary.mac.as_ref()).unwrap();
    for (file_id, ns_id, mac, words) in [
        (18, 5, summary.mac, "lists file 18"),
        (17, 6, summary.mac, "of namespace 6"),
        (17, 5, other.mac, "MAC is not the one"),
    ] {
        let e = reader.expect(file_id, ns_id, mac.as_ref()).unwrap_err();
        assert!(matches!(e, RunFileError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains(words), "{e}");
    }
    assert_ne!(
        summary.mac, other.mac,
        "each seal and MAC is of its own file"
    );
}

/// A stored fixture file's bytes, from `testdata/`.
fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/run_file/testdata")
        .join(name);
    std::fs::read(path).unwrap()
}

/// Opens a fixture's bytes with its filter read at the open, or
/// (`lazy`) as the daemon opens the runs it serves.
fn open_fixture(bytes: &[u8], name: &str, mode: Mode, lazy: bool) -> RunFileReader {
    let cache = Arc::new(BlockCache::new(2 * 400));
    let (source, path) = (Box::new(bytes.to_vec()), Path::new(name));
    if lazy {
        RunFileReader::open_source_lazy(source, path, &read_protection(mode), cache)
    } else {
        RunFileReader::open_source(source, path, &read_protection(mode), cache)
    }
    .unwrap()
}

/// The model of the stored version-1 fixtures.
fn v1_fixture_model() -> Model {
    let mut rng = Rng(0x5eed_0001);
    random_model(&mut rng, 200)
}
