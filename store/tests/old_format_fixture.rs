//! The data dir in `tests/fixtures/v1_data_dir`, written by the cubed and
//! cubec of the release before run files (issue 32; how it was made:
//! `tests/fixtures/README.md`), opens and holds every cell it was given:
//! a plain namespace and an encrypted one, half of their cells in a
//! checkpoint file and half (with deletes) in the write-ahead log. Whatever
//! the store's files become, this data dir must keep opening, and the next
//! fold must upgrade it.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use cube_protocol::{Coord, NamespaceName};
use cube_store::{Engine, EngineConfig};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/v1_data_dir");
const KEY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/v1_master.key");

/// Copies the fixture (dirs 0700, files 0600, as cubed requires), so that
/// opening it never changes the committed files.
fn copy_private(from: &Path, to: &Path) {
    fs::DirBuilder::new().mode(0o700).create(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_private(&entry.path(), &dest);
        } else {
            fs::copy(entry.path(), &dest).unwrap();
            fs::set_permissions(&dest, fs::Permissions::from_mode(0o600)).unwrap();
        }
    }
}

/// What make_v1_data_dir.sh stored at (x, y, z) of `ns`: `None` where it
/// deleted the cell again.
fn expected(ns: &str, x: i32, y: i32, z: i32) -> Option<Vec<u8>> {
    if y == 2 && x % 2 == 0 {
        return None;
    }
    let one = format!("{ns} {x},{y},{z}");
    Some(if x == 3 { one.repeat(8) } else { one }.into_bytes())
}

/// A private copy of the fixture and its key, and how to open it.
fn fixture(tmp: &Path) -> EngineConfig {
    let data = tmp.join("data");
    copy_private(Path::new(FIXTURE), &data);
    let key = tmp.join("master.key");
    fs::copy(KEY, &key).unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    let mut config = EngineConfig::new(&data);
    config.key_file = Some(key);
    config
}

#[test]
fn the_v1_fixture_opens_with_every_cell() {
    let tmp = tempfile::tempdir().unwrap();
    let engine = Engine::open(fixture(tmp.path())).unwrap();
    assert!(
        engine.recovery_report().records_replayed > 0,
        "the fixture's log tail was replayed: {:?}",
        engine.recovery_report()
    );
    assert!(
        engine.checkpoint_load().entries > 0,
        "the fixture's checkpoint files were loaded"
    );
    assert_every_cell(&engine);
    engine.close_without_checkpoint();
}

/// Its next compaction moves its cells out of the checkpoint files into
/// one run file per namespace (the encrypted one's sealed) under a
/// version-3 manifest, and a restart reads the same cells back.
#[test]
fn the_v1_fixture_is_upgraded_to_run_files_by_its_next_compaction() {
    let tmp = tempfile::tempdir().unwrap();
    let config = fixture(tmp.path());
    let checkpoint = config.data_dir.join("checkpoint");
    let engine = Engine::open(config.clone()).unwrap();
    let report = engine.compact().unwrap();
    assert!(report.compaction.is_some(), "{report:?}");
    assert_every_cell(&engine);
    engine.shutdown().unwrap();
    drop(engine);
    let manifest = fs::read(checkpoint.join("MANIFEST")).unwrap();
    assert_eq!(manifest[8..12], 3u32.to_le_bytes(), "a version-3 manifest");
    let runs: Vec<Vec<u8>> = fs::read_dir(&checkpoint)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "run"))
        .map(|p| fs::read(p).unwrap())
        .collect();
    assert_eq!(runs.len(), 2, "one run per namespace");
    let shows = |word: &[u8]| {
        runs.iter()
            .filter(|run| run.windows(word.len()).any(|w| w == word))
            .count()
    };
    assert_eq!(
        shows(b"default "),
        1,
        "the plain namespace's run is readable"
    );
    assert_eq!(
        shows(b"vault "),
        0,
        "the encrypted namespace's run is sealed"
    );
    let engine = Engine::open(config).unwrap();
    assert_eq!(
        engine.recovery_report().records_replayed,
        0,
        "a clean restart replays nothing"
    );
    assert_every_cell(&engine);
    engine.close_without_checkpoint();
}

/// Every cell the fixture holds, and no other, in both namespaces.
fn assert_every_cell(engine: &Engine) {
    for name in ["default", "vault"] {
        let ns = NamespaceName::new(name).unwrap();
        let mut cells = 0;
        for x in -4..=3 {
            for y in 0..4 {
                for z in -1..=0 {
                    let got = engine
                        .get(&ns, Coord::new(x, y, z))
                        .map(Result::unwrap)
                        .unwrap_or_else(|| panic!("namespace {name} is missing"))
                        .map(|v| v.to_vec());
                    let want = expected(name, x, y, z);
                    cells += u64::from(want.is_some());
                    assert_eq!(got, want, "{name} {x},{y},{z}");
                }
            }
        }
        let usage = engine.memstore().namespace_usage(&ns).unwrap();
        assert_eq!(usage.cells, cells, "{name}: no cell beyond those written");
    }
    let vault = NamespaceName::new("vault").unwrap();
    assert!(
        engine.memstore().sealed_id(&vault).is_some(),
        "vault is encrypted"
    );
}
