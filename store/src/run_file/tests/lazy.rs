//! Format version 3 (a filter sized up front, its bit count in its
//! header) and filters loaded after the open: a round trip in every mode,
//! a writer told too few or far too many entries, answers alike before and
//! after a filter is loaded, and a damaged filter loaded late never used.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::super::bloom::{BloomFilter, key_hash};
use super::super::format::{FORMAT_VERSION, Footer, filter_trailer_bytes};
use super::*;

const MODES: [Mode; 3] = [Mode::Plain, Mode::Authenticated, Mode::Sealed];

/// A file's bytes, counting what is read of them.
struct Counted(Vec<u8>, Arc<AtomicU64>);

impl BlockSource for Counted {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.1.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.0.read_exact_at(buf, offset)
    }

    fn len(&self) -> io::Result<u64> {
        BlockSource::len(&self.0)
    }
}

fn open_lazy(bytes: Vec<u8>, mode: Mode) -> Result<RunFileReader, RunFileError> {
    RunFileReader::open_source_lazy(
        Box::new(bytes),
        Path::new("lazy.run"),
        &read_protection(mode),
        Arc::new(BlockCache::new(2 * 400)),
    )
}

fn model_file(mode: Mode, entries: usize) -> (Vec<u8>, Model) {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x1a2b);
    let model = random_model(&mut rng, entries);
    let path = tmp.path().join("r");
    write(&RealDisk, &path, &model, mode, 256);
    (std::fs::read(&path).unwrap(), model)
}

/// Every answer `reader` gives for the model's keys and for absent keys,
/// by `get` and by `get_many`, agrees with the model.
fn answers_right(reader: &RunFileReader, model: &Model, what: &str) {
    let mut rng = Rng(77);
    check_against_model(reader, model, &mut rng, what);
    let keys: Vec<u128> = model.keys().flat_map(|k| [*k, k.wrapping_add(1)]).collect();
    for (key, got) in keys.iter().zip(reader.get_many(&keys)) {
        let want = model.get(key).map(slot);
        assert_eq!(got.unwrap(), want, "{what}: get_many {key:#x}");
        assert_eq!(reader.get(*key).unwrap(), want, "{what}: get {key:#x}");
    }
}

/// A file of this build is of version 3 and reads back in every mode,
/// opened with its filter or without it; once the filter is loaded, the
/// answers are the same, and the filter rules absent keys out.
#[test]
fn version_3_round_trips_and_answers_alike_before_and_after_the_filter_loads() {
    for mode in MODES {
        let (bytes, model) = model_file(mode, 500);
        let footer = Footer::decode(&bytes[bytes.len() - FOOTER_BYTES..], bytes.len() as u64);
        assert_eq!(footer.unwrap().version, FORMAT_VERSION, "{mode:?}");
        let eager = open_bytes(bytes.clone(), mode).unwrap();
        assert!(eager.filter_loaded(), "{mode:?}");
        answers_right(&eager, &model, &format!("{mode:?} eager"));
        let lazy = open_lazy(bytes, mode).unwrap();
        assert!(!lazy.filter_loaded(), "{mode:?}");
        assert!((0..1000u128).all(|k| lazy.may_contain(k)), "{mode:?}");
        answers_right(&lazy, &model, &format!("{mode:?} before the load"));
        lazy.load_filter().unwrap();
        assert!(lazy.filter_loaded(), "{mode:?}");
        assert!(model.keys().all(|k| lazy.may_contain(*k)), "{mode:?}");
        let ruled_out = (0..10_000u128).filter(|k| !lazy.may_contain(*k)).count();
        assert!(ruled_out > 9_000, "{mode:?}: {ruled_out}");
        answers_right(&lazy, &model, &format!("{mode:?} after the load"));
        assert!(lazy.verify().is_empty(), "{mode:?}");
    }
}

/// Opening without the filter reads the footer and the index, and in a
/// protected file the filter's trailer the file MAC covers: not the
/// filter.
#[test]
fn a_lazy_open_reads_no_filter() {
    for mode in MODES {
        let (bytes, _) = model_file(mode, 2_000);
        let read = Arc::new(AtomicU64::new(0));
        let reader = RunFileReader::open_source_lazy(
            Box::new(Counted(bytes, Arc::clone(&read))),
            Path::new("r"),
            &read_protection(mode),
            Arc::new(BlockCache::new(0)),
        )
        .unwrap();
        let footer = reader.footer();
        let trailer = if mode == Mode::Plain {
            0
        } else {
            filter_trailer_bytes(mode) as u64
        };
        assert!(footer.filter_len().unwrap() > 2_000 * 10 / 8, "{mode:?}");
        assert_eq!(
            read.load(Ordering::Relaxed),
            FOOTER_BYTES as u64 + footer.index_len + trailer,
            "{mode:?}"
        );
        reader.load_filter().unwrap();
        assert_eq!(
            read.load(Ordering::Relaxed),
            FOOTER_BYTES as u64 + footer.index_len + trailer + footer.filter_len().unwrap(),
            "{mode:?}"
        );
    }
}

/// A filter damaged on disk, loaded after the open: the load fails with
/// an error naming the file and the filter's offset, the filter is never
/// used (every key "maybe", every answer right), and `verify` reports it.
/// Opened eagerly, the same file is refused.
#[test]
fn a_damaged_filter_loaded_late_is_not_used_and_verify_reports_it() {
    for mode in MODES {
        let (good, model) = model_file(mode, 300);
        let at = open_bytes(good.clone(), mode)
            .unwrap()
            .footer()
            .filter_offset() as usize;
        let mut bad = good;
        // In the bits, before the trailer the file MAC covers.
        bad[at + 40] ^= 0x10;
        assert!(open_bytes(bad.clone(), mode).is_err(), "{mode:?}");
        let reader = open_lazy(bad, mode).unwrap();
        let what = format!("{mode:?}");
        match reader.load_filter() {
            Err(RunFileError::Corrupt { path, offset, .. }) => {
                assert_eq!((path.as_path(), offset), (Path::new("lazy.run"), at as u64));
            }
            other => panic!("{what}: {other:?}"),
        }
        assert!(!reader.filter_loaded(), "{what}");
        assert!(reader.load_filter().is_err(), "{what}: the same each call");
        assert!((0..1000u128).all(|k| reader.may_contain(k)), "{what}");
        answers_right(&reader, &model, &what);
        let problems = reader.verify();
        assert!(
            matches!(&problems[..], [RunFileError::Corrupt { offset, reason, .. }]
                if *offset == at as u64 && reason.contains("Bloom filter")),
            "{what}: {problems:?}"
        );
    }
}

/// A writer given fewer entries than it is pushed refuses the one past
/// its count (its filter, sized for them, would have fewer than 10 bits a
/// key, which a reader refuses) and leaves no file in place; exactly its
/// count is fine.
#[test]
fn a_writer_refuses_more_entries_than_it_was_created_for() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("r");
    let mut w = RunFileWriter::create(&RealDisk, &path, 1, 1, &Protection::Plain, 5).unwrap();
    for key in 0..5 {
        w.push(key, Some(b"v")).unwrap();
    }
    let e = w.push(5, Some(b"v")).unwrap_err();
    assert!(
        matches!(&e, RunFileError::Refused { reason, .. } if reason.contains("more entries than the 5")),
        "{e}"
    );
    drop(w);
    assert!(!path.exists());
    let mut w = RunFileWriter::create(&RealDisk, &path, 1, 1, &Protection::Plain, 5).unwrap();
    for key in 0..5 {
        w.push(key, Some(b"v")).unwrap();
    }
    assert_eq!(w.finish().unwrap().entries, 5);
    let reader = open_bytes(std::fs::read(&path).unwrap(), Mode::Plain).unwrap();
    assert_eq!(reader.get(4).unwrap(), Some(slot(&Some(b"v".to_vec()))));
}

/// The filter's bit count as stored in a plain file.
fn stored_bits(bytes: &[u8]) -> u64 {
    let reader = open_bytes(bytes.to_vec(), Mode::Plain).unwrap();
    let at = reader.footer().filter_offset() as usize;
    u64::from_le_bytes(bytes[at + 4..at + 12].try_into().unwrap())
}

/// A writer expecting more entries than it gets keeps its filter while it
/// is at most 4 times what the entries need (more bits a key, fewer false
/// positives), and folds a larger one to 20 bits a key: every file opens,
/// and every key passes its filter.
#[test]
fn a_writer_given_far_fewer_entries_folds_its_filter() {
    let tmp = tempfile::tempdir().unwrap();
    let model: Model = (0..1_000u128)
        .map(|i| (i * 7, Some(b"v".to_vec())))
        .collect();
    for (expected, bits) in [
        (1_000u64, 10_000u64),
        (3_000, 30_000),
        (4_000, 40_000),
        (4_001, 20_000),
        (1_000_000, 20_000),
    ] {
        let path = tmp.path().join(format!("r{expected}"));
        let mut w =
            RunFileWriter::create(&RealDisk, &path, 1, 1, &Protection::Plain, expected).unwrap();
        for (k, v) in &model {
            w.push(*k, v.as_deref()).unwrap();
        }
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(stored_bits(&bytes), bits, "expected {expected}");
        let reader = open_bytes(bytes, Mode::Plain).unwrap();
        assert!(model.keys().all(|k| reader.may_contain(*k)), "{expected}");
        let fp = (0..7_000u128)
            .filter(|k| k % 7 != 0 && reader.may_contain(*k))
            .count();
        assert!(
            fp < 60,
            "expected {expected}: {fp} false positives of 6,000"
        );
        assert!(reader.verify().is_empty(), "{expected}");
    }
    let path = tmp.path().join("empty");
    let w = RunFileWriter::create(&RealDisk, &path, 1, 1, &Protection::Plain, 50).unwrap();
    w.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(stored_bits(&bytes), 0);
}

/// Folding a filter to a size that divides its own gives the filter built
/// at that size; to any other size, a filter that still holds every key.
#[test]
fn a_folded_filter_holds_every_key() {
    let mut rng = Rng(0xf01d);
    let keys: Vec<u128> = (0..500).map(|_| u128::from(rng.next()) << 3).collect();
    let built = |bits: u64| {
        let mut f = BloomFilter::with_bits(bits);
        for k in &keys {
            f.insert(key_hash(*k));
        }
        f
    };
    let big = built(24_000);
    for bits in [12_000, 8_000, 6_000, 4_000] {
        assert_eq!(big.fold(bits), built(bits), "{bits}");
    }
    for bits in [11_111, 7_001, 5_003, 1] {
        let folded = big.fold(bits);
        assert_eq!(folded.bits(), bits);
        assert!(keys.iter().all(|k| folded.may_contain(*k)), "{bits}");
    }
    assert_eq!(big.fold(0).bits(), 0);
}

/// The daemon's open of a run file on the real disk returns before its
/// filter is read, and a background thread loads it.
#[test]
fn open_serving_loads_the_filter_in_the_background() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("r");
    let model: Model = (0..5_000u128).map(|i| (i * 2, None)).collect();
    write(&RealDisk, &path, &model, Mode::Plain, 4096);
    let cache = Arc::new(BlockCache::new(1 << 20));
    let reader = RunFileReader::open_serving(&RealDisk, &path, &Protection::Plain, cache).unwrap();
    assert_eq!(reader.get(2).unwrap(), Some(None));
    // Wait for the event (the filter in use), with a bound that only
    // catches a loader that never runs.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reader.filter_loaded() {
        assert!(Instant::now() < deadline, "the filter never loaded");
        std::thread::yield_now();
    }
    assert!((0..5_000u128).any(|k| !reader.may_contain(k * 2 + 1)));
    assert!(reader.verify().is_empty());
}
