//! The Bloom filter of format version 2: no false negatives, a measured
//! false positive rate, lookups of absent keys that read no block, a
//! damaged or swapped filter refused, and version-1 files (no filter)
//! still read.

use proptest::prelude::*;

use super::super::bloom::{BloomFilter, key_hash};
use super::super::format::{
    CRC_BYTES, FORMAT_VERSION_FIXED_FILTER, FORMAT_VERSION_NO_FILTER, Footer, filter_trailer_bytes,
};
use super::*;

/// The version-1 files under `testdata/`, written by the writer of the
/// build before filters (`write` of [`v1_fixture_model`], blocks of 512
/// bytes, file 17 of namespace 5, the test key): they must keep opening.
const V1_FIXTURES: [(Mode, &str); 3] = [
    (Mode::Plain, "v1_plain.run"),
    (Mode::Authenticated, "v1_authenticated.run"),
    (Mode::Sealed, "v1_sealed.run"),
];

/// Block lookups a reader's cache saw (hits and misses): every lookup
/// the filter let through.
fn block_lookups(cache: &BlockCache) -> u64 {
    let stats = cache.stats();
    stats.hits + stats.misses
}

/// The filter of `keys` at 10 bits a key.
fn build(keys: &[u128]) -> BloomFilter {
    let mut filter = BloomFilter::with_bits(keys.len() as u64 * 10);
    for k in keys {
        filter.insert(key_hash(*k));
    }
    filter
}

/// False positives among `absent` keys of a filter of `present` keys.
fn false_positives(present: &[u128], absent: impl Iterator<Item = u128>) -> usize {
    let filter = build(present);
    absent.filter(|k| filter.may_contain(*k)).count()
}

/// 10 bits a key and 7 probes give about 0.82% in theory ((1 - e^-0.7)^7);
/// measured here over 100,000 absent keys, for keys in a row (a box of a
/// curve) and for random ones. The bound is the theory plus ten standard
/// deviations (sd = sqrt(100,000 x 0.0082) = 29): a worse hash fails it.
#[test]
fn the_filter_has_no_false_negatives_and_few_false_positives() {
    const KEYS: u128 = 100_000;
    let in_a_row: Vec<u128> = (0..KEYS).map(|i| i * 2).collect();
    let fp_row = false_positives(&in_a_row, (0..KEYS).map(|i| i * 2 + 1));
    let mut rng = Rng(0xb100_f11e);
    let random: Vec<u128> = (0..KEYS)
        .map(|_| u128::from(rng.next()) << 64 | u128::from(rng.next()))
        .collect();
    let fp_random = false_positives(
        &random,
        (0..KEYS).map(|_| u128::from(rng.next()) << 64 | u128::from(rng.next())),
    );
    let mut clustered = BTreeMap::new();
    while clustered.len() < KEYS as usize {
        clustered.insert(rng.key(), ());
    }
    let clustered: Vec<u128> = clustered.into_keys().collect();
    let fp_clustered = false_positives(
        &clustered,
        (0..)
            .map(|_| rng.key())
            .filter(|k| clustered.binary_search(k).is_err())
            .take(KEYS as usize),
    );
    println!(
        "false positives per 100,000 absent keys: in a row {fp_row}, random {fp_random}, \
         clustered {fp_clustered}"
    );
    for (what, fp) in [
        ("in a row", fp_row),
        ("random", fp_random),
        ("clustered", fp_clustered),
    ] {
        assert!((500..1_110).contains(&fp), "{what}: {fp} false positives");
    }
    for keys in [&in_a_row, &random, &clustered] {
        let filter = build(keys);
        assert!(keys.iter().all(|k| filter.may_contain(*k)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every key a file holds, tombstones too, passes its filter and is
    /// found, over random key sets (around the ends of u128 too).
    #[test]
    fn every_key_of_a_file_passes_its_filter(
        keys in proptest::collection::btree_set(
            prop_oneof![
                any::<u128>(),
                0..4096u128,
                (u128::MAX - 4096)..=u128::MAX,
            ],
            0..600,
        ),
        tombstone_every in 1..8usize,
    ) {
        let model: Model = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, (i % tombstone_every != 0).then(|| vec![b'v'; i % 40])))
            .collect();
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("r");
        write(&RealDisk, &path, &model, Mode::Plain, 256);
        let reader = open_bytes(std::fs::read(&path).unwrap(), Mode::Plain).unwrap();
        for (k, v) in &model {
            prop_assert!(reader.may_contain(*k));
            prop_assert_eq!(reader.get(*k).unwrap(), Some(slot(v)));
        }
        let all: Vec<u128> = model.keys().copied().collect();
        for (got, (_, v)) in reader.get_many(&all).into_iter().zip(&model) {
            prop_assert_eq!(got.unwrap(), Some(slot(v)));
        }
        prop_assert!(reader.verify().is_empty());
    }
}

/// A lookup of a key inside a file's key range that the file lacks used
/// to read and check a block; now the filter answers, and at most the
/// false positives (about 1%) reach a block, for `get` and `get_many`
/// alike. A version-1 file (no filter) still reads a block for each.
#[test]
fn a_lookup_of_an_absent_key_reads_no_block() {
    let model: Model = (0..20_000u128)
        .map(|i| (i * 2, Some(format!("v{i}").into_bytes())))
        .collect();
    let absent: Vec<u128> = (0..20_000u128).map(|i| i * 2 + 1).collect();
    for mode in [Mode::Plain, Mode::Authenticated, Mode::Sealed] {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("r");
        write(&RealDisk, &path, &model, mode, 1024);
        let bytes = std::fs::read(&path).unwrap();
        // No cache: every block lookup is a read.
        let cache = Arc::new(BlockCache::new(0));
        let reader = RunFileReader::open_source(
            Box::new(bytes),
            Path::new("r"),
            &read_protection(mode),
            Arc::clone(&cache),
        )
        .unwrap();
        for key in &absent {
            assert_eq!(reader.get(*key).unwrap(), None, "{mode:?}");
        }
        let reads = block_lookups(&cache);
        assert!(
            reads < 220,
            "{mode:?}: {reads} block reads for 20,000 absent keys"
        );
        assert!(
            reader
                .get_many(&absent)
                .iter()
                .all(|r| matches!(r, Ok(None)))
        );
        let batched = block_lookups(&cache) - reads;
        assert!(batched < 220, "{mode:?}: get_many read {batched} blocks");
        // A present key still reads its block.
        assert_eq!(reader.get(4).unwrap(), Some(slot(&model[&4])));
        assert_eq!(block_lookups(&cache), reads + batched + 1);
    }
    let (mode, name) = V1_FIXTURES[0];
    let cache = Arc::new(BlockCache::new(0));
    let reader = RunFileReader::open_source(
        Box::new(fixture(name)),
        Path::new(name),
        &read_protection(mode),
        Arc::clone(&cache),
    )
    .unwrap();
    let (lo, hi) = reader.key_range().unwrap();
    let model = v1_fixture_model();
    let inside: Vec<u128> = (lo..hi)
        .filter(|k| !model.contains_key(k))
        .take(50)
        .collect();
    for key in &inside {
        assert_eq!(reader.get(*key).unwrap(), None);
    }
    assert_eq!(block_lookups(&cache), inside.len() as u64, "version 1");
}

/// Files written by the build before filters (format version 1) open
/// and answer every read, of each protection, with every lookup "maybe".
#[test]
fn version_1_files_open_and_read() {
    let model = v1_fixture_model();
    for (mode, name) in V1_FIXTURES {
        let bytes = fixture(name);
        let footer = Footer::decode(&bytes[bytes.len() - FOOTER_BYTES..], bytes.len() as u64);
        assert_eq!(footer.unwrap().version, FORMAT_VERSION_NO_FILTER, "{name}");
        let reader = open_bytes(bytes, mode).unwrap();
        assert!(
            reader.may_contain(1) && reader.may_contain(u128::MAX),
            "{name}"
        );
        let mut rng = Rng(41);
        check_against_model(&reader, &model, &mut rng, name);
        assert!(reader.verify().is_empty(), "{name}");
        assert_eq!(reader.entry_count(), model.len() as u64, "{name}");
    }
}

/// The version-2 files under `testdata/` (a filter sized by the entry
/// count alone), written by the writer of the build before version 3 as
/// the version-1 ones were: they open, eagerly and lazily, and answer
/// every read, their filters in use.
const V2_FIXTURES: [(Mode, &str); 3] = [
    (Mode::Plain, "v2_plain.run"),
    (Mode::Authenticated, "v2_authenticated.run"),
    (Mode::Sealed, "v2_sealed.run"),
];

#[test]
fn version_2_files_open_and_read() {
    let model = v1_fixture_model();
    for (mode, name) in V2_FIXTURES {
        let bytes = fixture(name);
        let footer = Footer::decode(&bytes[bytes.len() - FOOTER_BYTES..], bytes.len() as u64);
        assert_eq!(
            footer.unwrap().version,
            FORMAT_VERSION_FIXED_FILTER,
            "{name}"
        );
        for lazy in [false, true] {
            let what = format!("{name} lazy {lazy}");
            let reader = open_fixture(&bytes, name, mode, lazy);
            // A protected version-2 file's MAC covers its filter: read at open.
            assert_eq!(
                reader.filter_loaded(),
                !lazy || mode != Mode::Plain,
                "{what}"
            );
            reader.load_filter().unwrap();
            assert!(model.keys().all(|k| reader.may_contain(*k)), "{what}");
            assert!((0..1000u128).any(|k| !reader.may_contain(k)), "{what}");
            let mut rng = Rng(41);
            check_against_model(&reader, &model, &mut rng, &what);
            assert!(reader.verify().is_empty(), "{what}");
        }
    }
}

/// Where a file's filter is, stored: `(offset, end)`.
fn filter_span(bytes: &[u8], mode: Mode) -> (usize, usize) {
    let reader = open_bytes(bytes.to_vec(), mode).unwrap();
    let at = reader.footer().filter_offset() as usize;
    (at, bytes.len() - FOOTER_BYTES)
}

/// A flipped bit anywhere in the filter fails the open (its checksum, MAC
/// or tag; in its trailer of a protected file, which the file MAC covers,
/// the file MAC first), naming the filter's offset or the footer's, and
/// the file: a damaged filter would hide cells.
#[test]
fn a_flipped_bit_in_the_filter_is_refused_at_open() {
    for mode in [Mode::Plain, Mode::Authenticated, Mode::Sealed] {
        let (good, _) = small_file(mode);
        let (filter_at, footer_at) = filter_span(&good, mode);
        assert!(footer_at - filter_at > mode.overhead_bytes(), "{mode:?}");
        for pos in filter_at..footer_at {
            for bit in [0, 5] {
                let mut bad = good.clone();
                bad[pos] ^= 1 << bit;
                let what = format!("{mode:?} byte {pos} bit {bit}");
                match open_bytes(bad, mode) {
                    Err(RunFileError::Corrupt { path, offset, .. }) => {
                        assert_eq!(path, Path::new("damaged.run"), "{what}");
                        let trailer = filter_trailer_bytes(mode);
                        let want = if mode == Mode::Plain || pos < footer_at - trailer {
                            filter_at
                        } else {
                            footer_at
                        };
                        assert_eq!(offset, want as u64, "{what}");
                    }
                    Err(e) => panic!("{what}: {e}"),
                    Ok(_) => panic!("{what}: opened"),
                }
            }
        }
    }
}

/// Rewrites a plain file's footer fields with `change` (its CRC
/// repaired).
fn refooter(bytes: &mut [u8], change: impl FnOnce(&mut Footer)) {
    let at = bytes.len() - FOOTER_BYTES;
    let mut footer = Footer::decode(&bytes[at..], bytes.len() as u64).unwrap();
    change(&mut footer);
    bytes[at..].copy_from_slice(&footer.encode());
}

/// A plain file with its filter's payload replaced by `change`'s (the
/// filter's checksum repaired; the footer stays, the filter's length
/// follows from where the footer is).
fn refilter(good: &[u8], change: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let (filter_at, footer_at) = filter_span(good, Mode::Plain);
    let mut payload = good[filter_at..footer_at - CRC_BYTES].to_vec();
    change(&mut payload);
    let mut out = good[..filter_at].to_vec();
    out.extend_from_slice(&payload);
    out.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    out.extend_from_slice(&good[footer_at..]);
    out
}

/// Sets a version-3 filter payload's bit count.
fn set_bits(payload: &mut [u8], bits: u64) {
    payload[4..12].copy_from_slice(&bits.to_le_bytes());
}

/// A filter of fewer bits than 10 a key (which would raise the false
/// positive rate silently), of more than 40 a key, of a length its bit
/// count does not give, with bits set past its bit count, or an entry
/// count the blocks cannot hold (which would size a huge filter), is
/// refused, before anything is allocated for it when the footer shows it,
/// naming the file and the offset (the footer's, or the filter's).
#[test]
fn a_filter_of_the_wrong_size_is_refused() {
    let (good, model) = small_file(Mode::Plain);
    let entries = model.len() as u64;
    let (filter_at, _) = filter_span(&good, Mode::Plain);
    let footer_of = |bytes: &[u8]| (bytes.len() - FOOTER_BYTES) as u64;
    let longer = refilter(&good, |p| p.extend_from_slice(&[0xff; 8]));
    let fewer_bits = refilter(&good, |p| set_bits(p, entries * 10 - 1));
    // 42 bits a key: a longer filter with a bit count to match.
    let oversized = refilter(&good, |p| {
        p.resize(12 + (entries * 42).div_ceil(8) as usize, 0);
        set_bits(p, entries * 42);
    });
    let past_the_end = refilter(&good, |p| {
        set_bits(p, entries * 10 + 3);
        p.push(1 << 3);
    });
    let mut more_entries = good.clone();
    refooter(&mut more_entries, |f| f.entry_count += 1);
    let mut huge = good.clone();
    refooter(&mut huge, |f| f.entry_count = u64::MAX / 2);
    let at_filter = filter_at as u64;
    for (what, bytes, offset, reason) in [
        ("longer", longer, at_filter, "bits in"),
        (
            "fewer bits",
            fewer_bits,
            at_filter,
            "accepts 400 to 1600 bits",
        ),
        (
            "oversized",
            oversized.clone(),
            footer_of(&oversized),
            "a filter of",
        ),
        ("past the end", past_the_end, at_filter, "bits set past"),
        (
            "more entries",
            more_entries,
            footer_of(&good),
            "a filter of",
        ),
        ("huge", huge, footer_of(&good), "entries cannot fit"),
    ] {
        match open_bytes(bytes, Mode::Plain) {
            Err(e @ RunFileError::Corrupt { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains("damaged.run")
                        && text.contains(&format!("offset {offset}"))
                        && text.contains(reason),
                    "{what}: {text}"
                );
            }
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what}: opened"),
        }
    }
}

/// Two files of the same ids and entry count, different keys: the filter
/// of one put in the other, intact (checksum, tag and all), is refused
/// in every mode. A plain file's filter names its index by the index's
/// CRC; a protected file's is under the file MAC.
#[test]
fn a_filter_swapped_between_files_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for mode in [Mode::Plain, Mode::Authenticated, Mode::Sealed] {
        let files: Vec<Vec<u8>> = [0u128, 1]
            .iter()
            .map(|shift| {
                let model: Model = (0..300u128)
                    .map(|i| (i * 4 + shift, Some(b"value".to_vec())))
                    .collect();
                let path = tmp.path().join(format!("{mode:?}-{shift}"));
                write(&RealDisk, &path, &model, mode, 512);
                std::fs::read(&path).unwrap()
            })
            .collect();
        let (a_at, a_end) = filter_span(&files[0], mode);
        let (b_at, b_end) = filter_span(&files[1], mode);
        assert_eq!((a_at, a_end), (b_at, b_end), "{mode:?}: same layout");
        assert_ne!(files[0][a_at..a_end], files[1][b_at..b_end], "{mode:?}");
        let mut swapped = files[0].clone();
        swapped[a_at..a_end].copy_from_slice(&files[1][b_at..b_end]);
        match open_bytes(swapped, mode) {
            Err(e @ RunFileError::Corrupt { .. }) => {
                let text = e.to_string();
                let why = if mode == Mode::Plain {
                    "a filter of another file"
                } else {
                    "do not match their MAC"
                };
                assert!(text.contains(why), "{mode:?}: {text}");
            }
            Err(e) => panic!("{mode:?}: {e}"),
            Ok(_) => panic!("{mode:?}: a swapped filter opened"),
        }
    }
}

/// A plain file whose filter was changed and its checksum repaired (what
/// no accident does) hides keys from lookups: `verify` reports it,
/// naming the filter's offset.
#[test]
fn verify_reports_a_filter_that_lacks_a_key() {
    let (good, _) = small_file(Mode::Plain);
    let (filter_at, footer_at) = filter_span(&good, Mode::Plain);
    let mut bad = good.clone();
    // Clear every bit (the index CRC and bit count in front kept), then
    // repair the CRC.
    bad[filter_at + 12..footer_at - CRC_BYTES].fill(0);
    let crc = crc32c::crc32c(&bad[filter_at..footer_at - CRC_BYTES]);
    bad[footer_at - CRC_BYTES..footer_at].copy_from_slice(&crc.to_le_bytes());
    let reader = open_bytes(bad, Mode::Plain).unwrap();
    let problems = reader.verify();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        matches!(&problems[0], RunFileError::Corrupt { offset, reason, .. }
            if *offset == filter_at as u64 && reason.contains("lacks key")),
        "{}",
        problems[0]
    );
}

/// The filter is in memory for the reader's life, and counted.
#[test]
fn resident_bytes_count_the_filter() {
    let model: Model = (0..10_000u128).map(|i| (i, None)).collect();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("r");
    write(&RealDisk, &path, &model, Mode::Plain, 4096);
    let reader = open_bytes(std::fs::read(&path).unwrap(), Mode::Plain).unwrap();
    let filter_bytes = 10_000 * 10 / 8;
    assert!(
        reader.resident_bytes() >= filter_bytes + reader.index().heap_bytes(),
        "{}",
        reader.resident_bytes()
    );
}

/// The filter as docs/storage-format.md ("Bloom filter") specifies it,
/// computed here from that text alone over a plain file's bytes: every
/// key's 7 bits are set, and the payload starts with the index's CRC. So
/// the spec is enough for another implementation to check a key.
#[test]
fn the_stored_filter_is_the_one_the_spec_describes() {
    fn fmix64(mut x: u64) -> u64 {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51afd7ed558ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ceb9fe1a85ec53);
        x ^= x >> 33;
        x
    }
    let (bytes, model) = small_file(Mode::Plain);
    let footer = &bytes[bytes.len() - FOOTER_BYTES..];
    let u64_at = |at: usize| u64::from_le_bytes(footer[at..at + 8].try_into().unwrap());
    let (entries, index_at, index_len) = (u64_at(32), u64_at(56), u64_at(64));
    assert_eq!(entries, model.len() as u64);
    let filter_at = (index_at + index_len) as usize;
    let stored = &bytes[filter_at..bytes.len() - FOOTER_BYTES];
    let (payload, crc) = stored.split_at(stored.len() - 4);
    assert_eq!(crc, crc32c::crc32c(payload).to_le_bytes());
    assert_eq!(payload[..4], bytes[filter_at - 4..filter_at]);
    let m = u64::from_le_bytes(payload[4..12].try_into().unwrap());
    assert_eq!(m, entries * 10, "sized for as many entries as written");
    let bits = &payload[12..];
    assert_eq!(bits.len() as u64, m.div_ceil(8));
    let m = u128::from(m);
    let set = |b: u64| bits[(b / 8) as usize] & (1 << (b % 8)) != 0;
    let probes = |key: u128| {
        let h1 = fmix64(key as u64 ^ fmix64((key >> 64) as u64 ^ 0x9e3779b97f4a7c15));
        let h2 = fmix64(h1 ^ 0xc2b2ae3d27d4eb4f);
        (0..7u64).map(move |i| ((u128::from(h1.wrapping_add(i.wrapping_mul(h2))) * m) >> 64) as u64)
    };
    for key in model.keys() {
        assert!(probes(*key).all(set), "key {key}");
    }
    let reader = open_bytes(bytes.clone(), Mode::Plain).unwrap();
    for key in (0..50_000u128).filter(|k| !model.contains_key(k)) {
        assert_eq!(reader.may_contain(key), probes(key).all(set), "key {key}");
    }
}

/// `without_filter` writes what the build before filters wrote: byte for
/// byte the stored plain version-1 fixture (plain files are
/// deterministic), so the benchmark's "before" is that build's file.
#[test]
fn without_filter_writes_the_version_1_format() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("v1");
    let mut w = RunFileWriter::create(&RealDisk, &path, 17, 5, &Protection::Plain, 200)
        .unwrap()
        .with_target_block_bytes(512)
        .without_filter();
    for (k, v) in &v1_fixture_model() {
        w.push(*k, v.as_deref()).unwrap();
    }
    w.finish().unwrap();
    assert!(std::fs::read(&path).unwrap() == fixture(V1_FIXTURES[0].1));
}
