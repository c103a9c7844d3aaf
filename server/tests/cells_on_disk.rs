//! Issue 32: a real `cubed` whose namespace outgrows its memory share
//! (`--cache-bytes`) serves it from its run files: writes go on, the next
//! checkpoint moves it onto its runs, reads (get, mget, scan, count) stay
//! exact through `kill -9` and restarts (which open the runs' indexes
//! only), and a damaged block fails the requests that need it, with its
//! file and offset, while every other read and write goes on.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use cube_client::{BatchOp, CellBox, Client, Coord, LocalDaemon};

/// The smallest cache: 4 MiB for cells in memory, 12 MiB of blocks.
const CACHE_BYTES: &str = "16777216";
/// 36 000 cells of 200 bytes: about 10 MiB by the resident estimate
/// (88 bytes a cell beside its value), past the 4 MiB share.
const CELLS: i32 = 36_000;
const SIDE: i32 = 60;

fn coord(i: i32) -> Coord {
    Coord::new(i % SIDE, (i / SIDE) % SIDE, i / (SIDE * SIDE))
}

fn value(i: i32, round: u32) -> Vec<u8> {
    let mut v = format!("cell {i} round {round} ").into_bytes();
    v.resize(200, b'.');
    v
}

fn import(c: &mut Client, round: u32) {
    for chunk in (0..CELLS).collect::<Vec<_>>().chunks(2000) {
        let mut ops: Vec<BatchOp> = chunk
            .iter()
            .map(|&i| BatchOp::Put {
                coord: coord(i),
                value: value(i, round),
            })
            .collect();
        c.batch("default", &mut ops).unwrap();
    }
}

fn stat(c: &mut Client, name: &str) -> u64 {
    common::stat(c, name)
}

fn whole_box() -> CellBox {
    CellBox::new(Coord::new(0, 0, 0), Coord::new(SIDE, SIDE, SIDE)).unwrap()
}

/// Every cell against `model`, by get (a sample), mget (all) and scan (all).
fn assert_cells(c: &mut Client, model: &BTreeMap<i32, Vec<u8>>, context: &str) {
    for i in (0..CELLS).step_by(997) {
        assert_eq!(
            c.get("default", coord(i)).unwrap().as_ref(),
            model.get(&i),
            "get {i} {context}"
        );
    }
    let all: Vec<i32> = (0..CELLS).collect();
    for chunk in all.chunks(1000) {
        let coords: Vec<Coord> = chunk.iter().map(|&i| coord(i)).collect();
        let got = c.mget("default", &coords).unwrap();
        for (&i, got) in chunk.iter().zip(got) {
            assert_eq!(got.as_ref(), model.get(&i), "mget {i} {context}");
        }
    }
    let mut scanned = 0usize;
    for cell in c.scan("default", whole_box(), 4096) {
        let cell = cell.unwrap();
        let c = cell.coord;
        let i = c.x + c.y * SIDE + c.z * SIDE * SIDE;
        assert_eq!(Some(&cell.value), model.get(&i), "scan {i} {context}");
        scanned += 1;
    }
    assert_eq!(scanned, model.len(), "cells scanned {context}");
    assert_eq!(
        c.scan_count("default", &whole_box()).unwrap(),
        model.len() as u64,
        "count {context}"
    );
}

/// A cell program's reads (`cube.get`, `cube.count`, `cube.sum` over a
/// box) and a walk with values see the cells on disk.
fn assert_programs_and_walks_read_the_disk(c: &mut Client, model: &BTreeMap<i32, Vec<u8>>) {
    let home = coord(CELLS + 100);
    let source = format!(
        "local v = cube.get({x}, {y}, {z}) or 'nil'\n\
         return v .. '|' .. cube.count(0, 0, 0, 9, 9, 0)",
        x = coord(12).x,
        y = coord(12).y,
        z = coord(12).z
    );
    c.prog("default", home, source.as_bytes()).unwrap();
    let reply = c.run("default", home, &[]).unwrap();
    let in_box = (0..CELLS)
        .filter(|&i| {
            let p = coord(i);
            p.x <= 9 && p.y <= 9 && p.z == 0 && model.contains_key(&i)
        })
        .count();
    let mut want = model.get(&12).cloned().unwrap_or_else(|| b"nil".to_vec());
    want.extend_from_slice(format!("|{in_box}").as_bytes());
    assert_eq!(
        reply.value,
        cube_client::ProgramValue::Bytes(want),
        "the program's reads"
    );
    c.link("default", coord(1), coord(2), "", 1.0).unwrap();
    c.link("default", coord(2), coord(4), "", 1.0).unwrap();
    let walk = c
        .walk(
            "default",
            coord(1),
            &cube_client::WalkOptions {
                with_values: true,
                ..cube_client::WalkOptions::default()
            },
        )
        .unwrap();
    let got: Vec<(Coord, Option<Vec<u8>>)> =
        walk.nodes.into_iter().map(|n| (n.coord, n.value)).collect();
    assert_eq!(
        got,
        vec![
            (coord(2), model.get(&2).cloned()),
            (coord(4), model.get(&4).cloned())
        ],
        "a walk's values"
    );
}

#[test]
fn a_namespace_past_its_memory_share_is_served_from_its_runs_across_kill_9() {
    let mut daemon = LocalDaemon::start_fresh(&["--cache-bytes", CACHE_BYTES]).unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(stat(&mut c, "storage.resident_limit_bytes"), 4 << 20);
    let mut model: BTreeMap<i32, Vec<u8>> = BTreeMap::new();
    import(&mut c, 1);
    model.extend((0..CELLS).map(|i| (i, value(i, 1))));
    // Past its share, the namespace has left memory, or is leaving it: the
    // checkpointer folds at once for it (it may have already), and a
    // checkpoint hands it its runs.
    let tiers = c.stats().unwrap();
    let count = |name: &str| match tiers.iter().find(|e| e.name == name).map(|e| &e.value) {
        Some(cube_client::StatsValue::Count(n)) => *n,
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(count("storage.namespaces_in_memory"), 0);
    assert_eq!(
        count("storage.namespaces_migrating") + count("storage.namespaces_on_disk"),
        1,
        "from one snapshot of the stats"
    );
    c.checkpoint(false).unwrap();
    assert_eq!(stat(&mut c, "storage.namespaces_on_disk"), 1);
    assert_eq!(stat(&mut c, "storage.namespaces_migrating"), 0);
    assert_eq!(stat(&mut c, "storage.migrations"), 1);
    assert_eq!(stat(&mut c, "store.cells"), CELLS as u64);
    assert_cells(&mut c, &model, "after the move to disk");
    assert!(stat(&mut c, "storage.cache_misses") > 0);

    // Writes to it now go to its memtable: overwrite some, delete some,
    // add some; the counts stay exact.
    for i in (0..CELLS).step_by(7) {
        c.put("default", coord(i), &value(i, 2)).unwrap();
        model.insert(i, value(i, 2));
    }
    for i in (3..CELLS).step_by(11) {
        let existed = c.del("default", coord(i)).unwrap();
        assert_eq!(existed, model.remove(&i).is_some(), "del {i}");
    }
    assert_eq!(stat(&mut c, "store.cells"), model.len() as u64);
    assert!(stat(&mut c, "storage.memtable_bytes") > 0);
    assert_cells(&mut c, &model, "with writes in the memtable");

    assert_programs_and_walks_read_the_disk(&mut c, &model);

    // kill -9 with those writes only in the log: the restart opens the
    // runs' indexes and replays the log into the memtable.
    drop(c);
    daemon.kill9().unwrap();
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(stat(&mut c, "storage.namespaces_on_disk"), 1);
    assert_eq!(stat(&mut c, "store.cells"), model.len() as u64);
    assert_cells(&mut c, &model, "after kill -9");
    assert!(
        daemon.log_text().contains("1 on disk"),
        "{}",
        daemon.log_text()
    );

    // A fold and a compaction while it is served from disk.
    c.checkpoint(true).unwrap();
    assert_eq!(stat(&mut c, "storage.memtable_bytes"), 0);
    assert_cells(&mut c, &model, "after a compaction");
    drop(c);
    assert!(daemon.terminate().unwrap().success());
    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_cells(&mut c, &model, "after a clean restart");
}

/// The run file of the data dir (one, after a compaction).
fn only_run_file(dir: &std::path::Path) -> std::path::PathBuf {
    let runs: Vec<_> = std::fs::read_dir(dir.join("checkpoint"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "run"))
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs.into_iter().next().unwrap()
}

/// A daemon whose one namespace was imported and compacted onto one run
/// file, stopped cleanly.
fn stopped_on_disk() -> LocalDaemon {
    let mut daemon = LocalDaemon::start_fresh(&["--cache-bytes", CACHE_BYTES]).unwrap();
    let mut c = daemon.client().unwrap();
    import(&mut c, 1);
    c.checkpoint(true).unwrap();
    assert_eq!(stat(&mut c, "storage.namespaces_on_disk"), 1);
    drop(c);
    assert!(daemon.terminate().unwrap().success());
    daemon
}

/// What `cubed --verify` says of the daemon's data dir, which it must
/// find damaged.
fn failed_verify(daemon: &LocalDaemon) -> String {
    let out = Command::new(LocalDaemon::find_binary().unwrap())
        .arg("--verify")
        .arg(daemon.data_dir())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(out.status.code(), Some(0), "{text}");
    text
}

#[test]
fn a_damaged_block_fails_the_reads_that_need_it_and_nothing_else() {
    let mut daemon = stopped_on_disk();

    // One flipped bit in the middle of the run's blocks.
    let run = only_run_file(daemon.data_dir());
    let mut bytes = std::fs::read(&run).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&run, &bytes).unwrap();

    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    assert_eq!(stat(&mut c, "storage.namespaces_on_disk"), 1);
    let path = run.display().to_string();
    let mut failed = Vec::new();
    for i in 0..CELLS {
        match c.get("default", coord(i)) {
            Ok(got) => assert_eq!(got, Some(value(i, 1)), "get {i}"),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains(&path) && e.contains("offset"), "{e}");
                assert!(e.contains("--verify"), "{e}");
                failed.push(i);
            }
        }
    }
    // The cells of the one damaged block (a block holds about 4 KiB).
    assert!(
        !failed.is_empty() && failed.len() <= 20,
        "{} cells failed",
        failed.len()
    );
    // A batch or a scan needing that block fails whole; others answer.
    let bad = coord(failed[0]);
    assert!(c.mget("default", &[coord(0), bad]).is_err());
    let scan_err = c
        .scan("default", whole_box(), 4096)
        .find_map(Result::err)
        .expect("the scan meets the damaged block");
    assert!(scan_err.to_string().contains(&path), "{scan_err}");
    // Writes go on, even to the damaged block's cells (the new value hides
    // the unreadable one).
    c.put("default", bad, b"rewritten").unwrap();
    assert_eq!(c.get("default", bad).unwrap().unwrap(), b"rewritten");
    c.put("default", coord(CELLS + 5), b"new").unwrap();
    assert_eq!(c.get("default", coord(CELLS + 5)).unwrap().unwrap(), b"new");
    drop(c);
    daemon.kill9().unwrap();

    // --verify lists the block.
    let text = failed_verify(&daemon);
    assert!(text.contains(&path), "{text}");
}

/// A restart opens the runs it serves without their Bloom filters and
/// loads them afterwards: a filter damaged on disk is then not used (every
/// read answers right, reading blocks), `cubed` says so once on stderr
/// with the file, the offset and `--verify`, and `--verify` reports it.
/// (When filters were read at the open, the damage failed the restart.)
#[test]
fn a_damaged_filter_is_served_without_and_reported() {
    use cube_store::run_file::FOOTER_BYTES;
    use cube_store::run_file::format::Footer;
    let mut daemon = stopped_on_disk();

    // One flipped bit in the middle of the run's filter.
    let run = only_run_file(daemon.data_dir());
    let mut bytes = std::fs::read(&run).unwrap();
    let footer_at = bytes.len() - FOOTER_BYTES;
    let footer = Footer::decode(&bytes[footer_at..], bytes.len() as u64).unwrap();
    let filter_at = footer.filter_offset() as usize;
    bytes[(filter_at + footer_at) / 2] ^= 0x10;
    std::fs::write(&run, &bytes).unwrap();

    daemon.restart().unwrap();
    let mut c = daemon.client().unwrap();
    let model: BTreeMap<i32, Vec<u8>> = (0..CELLS).map(|i| (i, value(i, 1))).collect();
    assert_cells(&mut c, &model, "with a damaged filter");
    for i in (0..CELLS).step_by(13) {
        assert_eq!(
            c.get("default", coord(i + CELLS)).unwrap(),
            None,
            "absent {i}"
        );
    }
    let path = run.display().to_string();
    let said = |log: &str| log.contains("without its Bloom filter") && log.contains(&path);
    common::wait_for("the damaged filter reported", || said(&daemon.log_text()));
    // A filter that failed its checks still counts as loaded: the loader
    // is done with it.
    common::wait_for("no filter load pending", || {
        stat(&mut c, "storage.filter_loads_pending") == 0
    });
    let log = daemon.log_text();
    assert!(
        log.contains(&format!("offset {filter_at}")) && log.contains("--verify"),
        "{log}"
    );
    assert_eq!(log.matches("without its Bloom filter").count(), 1, "{log}");
    drop(c);
    assert!(daemon.terminate().unwrap().success());

    let text = failed_verify(&daemon);
    assert!(
        text.contains(&path) && text.contains("Bloom filter"),
        "{text}"
    );
}
