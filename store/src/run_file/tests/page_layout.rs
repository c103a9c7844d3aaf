//! Format version 4's block placement: a block of up to a page never
//! crosses one when at most [`MAX_PAD_BYTES`] zeros get it to the next, the
//! zeros are checked by `verify`, each version's placement is the only one
//! its reader accepts, and version-3 files (blocks back to back) still
//! open and read.

use super::super::format::{FORMAT_VERSION, FORMAT_VERSION_PACKED_BLOCKS, Footer, block_offset};
use super::*;

/// The version-3 files under `testdata/`, written by the writer of the
/// build before version 4 as the version-1 and -2 ones were (`write` of
/// [`v1_fixture_model`], blocks of 512 bytes): they must keep opening.
const V3_FIXTURES: [(Mode, &str); 3] = [
    (Mode::Plain, "v3_plain.run"),
    (Mode::Authenticated, "v3_authenticated.run"),
    (Mode::Sealed, "v3_sealed.run"),
];

fn footer_of(bytes: &[u8]) -> Footer {
    Footer::decode(&bytes[bytes.len() - FOOTER_BYTES..], bytes.len() as u64).unwrap()
}

/// A model of `cells` cells with values of `value_bytes`, keys in a row.
fn model_of(cells: u128, value_bytes: usize) -> Model {
    (0..cells)
        .map(|k| (k * 3 + 1, Some(vec![(k % 251) as u8; value_bytes])))
        .collect()
}

fn written(model: &Model, mode: Mode, block_bytes: usize) -> Vec<u8> {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("paged");
    write(&RealDisk, &path, model, mode, block_bytes);
    std::fs::read(&path).unwrap()
}

/// Every block of 64-byte values lies inside one page, in every mode (a
/// cold point read is one page from the device), the zeros before each
/// cost under 2 % of the file (8 bytes a page plain, 61 protected), and
/// every read answers.
#[test]
fn blocks_of_small_values_each_fit_in_one_page() {
    let model = model_of(5_000, 64);
    for mode in [Mode::Plain, Mode::Authenticated, Mode::Sealed] {
        let bytes = written(&model, mode, TARGET_BLOCK_BYTES);
        assert_eq!(footer_of(&bytes).version, FORMAT_VERSION, "{mode:?}");
        let reader = open_bytes(bytes, mode).unwrap();
        let index = reader.index();
        let mut padding = 0u64;
        let mut end = 0u64;
        for (&offset, &len) in index.offsets.iter().zip(&index.lens) {
            let last = offset + u64::from(len) - 1;
            assert!(u64::from(len) <= PAGE_BYTES, "{mode:?}: a block of {len}");
            assert_eq!(
                offset / PAGE_BYTES,
                last / PAGE_BYTES,
                "{mode:?} at {offset}"
            );
            padding += offset - end;
            end = offset + u64::from(len);
        }
        assert!(
            padding * 50 < end,
            "{mode:?}: {padding} bytes of padding in {end}"
        );
        let mut rng = Rng(7);
        check_against_model(&reader, &model, &mut rng, &format!("{mode:?}"));
        assert!(reader.verify().is_empty(), "{mode:?}");
    }
}

/// Blocks that would waste more than [`MAX_PAD_BYTES`] to start at a page
/// (values of 1 KiB: three to a block) lie back to back, crossing pages;
/// larger blocks start at a page when that costs little. Never more than
/// the bound is padding.
#[test]
fn padding_never_passes_its_bound() {
    for value_bytes in [1_000, 1_024, 1_500, 3_000, 5_000, 9_000] {
        let model = model_of(200, value_bytes);
        let bytes = written(&model, Mode::Plain, TARGET_BLOCK_BYTES);
        let reader = open_bytes(bytes, Mode::Plain).unwrap();
        let index = reader.index();
        let mut end = 0u64;
        for (&offset, &len) in index.offsets.iter().zip(&index.lens) {
            let pad = offset - end;
            assert!(pad <= MAX_PAD_BYTES, "values of {value_bytes}: {pad} bytes");
            if pad > 0 {
                assert_eq!(offset % PAGE_BYTES, 0, "values of {value_bytes}");
            }
            end = offset + u64::from(len);
        }
        let mut rng = Rng(9);
        check_against_model(&reader, &model, &mut rng, &format!("{value_bytes}"));
        assert!(reader.verify().is_empty(), "values of {value_bytes}");
    }
}

/// The rule itself, at its edges.
#[test]
fn block_offset_places_a_block_at_the_next_page_only_when_it_pays() {
    let v4 = FORMAT_VERSION;
    // Fits where it is: stays.
    assert_eq!(block_offset(v4, 100, 3_996), Some(100));
    assert_eq!(block_offset(v4, 4_096, 4_096), Some(4_096));
    // Would cross; 96 bytes get it to the page.
    assert_eq!(block_offset(v4, 4_000, 200), Some(4_096));
    // Exactly the bound, and one past it.
    assert_eq!(block_offset(v4, 4_096 - 512, 600), Some(4_096));
    assert_eq!(block_offset(v4, 4_096 - 513, 600), Some(4_096 - 513));
    // A block larger than a page starts at one when that is cheap.
    assert_eq!(block_offset(v4, 8_000, 10_000), Some(8_192));
    // Older versions: back to back.
    assert_eq!(
        block_offset(FORMAT_VERSION_PACKED_BLOCKS, 4_000, 200),
        Some(4_000)
    );
    assert_eq!(block_offset(v4, u64::MAX - 10, 100), None);
}

/// A padding byte that is not zero changes no read (none uses it) but is
/// listed by `verify`, with its offset: each file has one encoding.
#[test]
fn verify_lists_a_nonzero_padding_byte() {
    let model = model_of(400, 64);
    let good = written(&model, Mode::Plain, TARGET_BLOCK_BYTES);
    let reader = open_bytes(good.clone(), Mode::Plain).unwrap();
    let index = reader.index();
    let (i, end) = (1..index.len())
        .map(|i| (i, index.offsets[i - 1] + u64::from(index.lens[i - 1])))
        .find(|&(i, end)| index.offsets[i] > end)
        .expect("a block after padding");
    let mut bad = good;
    bad[end as usize] = 0x5a;
    let reader = open_bytes(bad, Mode::Plain).unwrap();
    let mut rng = Rng(11);
    check_against_model(&reader, &model, &mut rng, "padded");
    let problems = reader.verify();
    assert_eq!(problems.len(), 1, "{problems:?}");
    match &problems[0] {
        RunFileError::Corrupt { offset, reason, .. } => {
            assert_eq!(*offset, end);
            assert!(reason.contains(&format!("before block {i}")), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// Sets a plain file's footer version and its checksum.
fn relabel(bytes: &mut [u8], version: u32) {
    let at = bytes.len() - FOOTER_BYTES;
    bytes[at + 8..at + 12].copy_from_slice(&version.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[at..at + 104]);
    bytes[at + 104..at + 108].copy_from_slice(&crc.to_le_bytes());
}

/// A version-4 file called version 3, or a version-3 file called version
/// 4, is refused at the open: its blocks are not where that version puts
/// them.
#[test]
fn each_version_accepts_only_its_own_placement() {
    let mut v4 = written(&model_of(400, 64), Mode::Plain, TARGET_BLOCK_BYTES);
    relabel(&mut v4, FORMAT_VERSION_PACKED_BLOCKS);
    let e = open_bytes(v4, Mode::Plain).unwrap_err().to_string();
    assert!(e.contains("expected"), "{e}");
    let mut v3 = fixture(V3_FIXTURES[0].1);
    relabel(&mut v3, FORMAT_VERSION);
    let e = open_bytes(v3, Mode::Plain).unwrap_err().to_string();
    assert!(e.contains("expected"), "{e}");
}

/// Files written by the build before version 4 open, eagerly and lazily,
/// and answer every read with their filters in use.
#[test]
fn version_3_files_open_and_read() {
    let model = v1_fixture_model();
    for (mode, name) in V3_FIXTURES {
        let bytes = fixture(name);
        assert_eq!(
            footer_of(&bytes).version,
            FORMAT_VERSION_PACKED_BLOCKS,
            "{name}"
        );
        for lazy in [false, true] {
            let what = format!("{name} lazy {lazy}");
            let reader = open_fixture(&bytes, name, mode, lazy);
            reader.load_filter().unwrap();
            assert!(model.keys().all(|k| reader.may_contain(*k)), "{what}");
            let mut rng = Rng(43);
            check_against_model(&reader, &model, &mut rng, &what);
            assert!(reader.verify().is_empty(), "{what}");
        }
    }
}
