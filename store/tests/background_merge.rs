//! Merges run on the merge threads (`cube-merge`, and `cube-merge-new` for
//! the runs folded during a long merge), off the fold path: a fold (and so
//! the writer, which waits on folds when memory is full) completes while a
//! merge is in flight, the merge is installed afterwards under the run the
//! fold wrote, and a restart reads the same cells. A merge held mid-way is
//! cancelled by shutdown, leaving no stray file.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Sender, bounded};
use cube_protocol::{Coord, NamespaceName};
use cube_store::{CrashPoint, Engine, EngineConfig, MergeHold, Mutation, StoreStatsSnapshot};

/// Generous: only catches a hang.
const HANG_BOUND: Duration = Duration::from_secs(120);

type Model = BTreeMap<i32, Vec<u8>>;

fn ns() -> NamespaceName {
    NamespaceName::new("default").unwrap()
}

fn write(engine: &Engine, mutation: Mutation) {
    engine.session().unwrap().write(mutation).unwrap();
}

fn config(data: &Path, hold: Option<MergeHold>) -> EngineConfig {
    crashing_config(data, hold, None)
}

fn crashing_config(
    data: &Path,
    hold: Option<MergeHold>,
    crash_at: Option<CrashPoint>,
) -> EngineConfig {
    let mut c = EngineConfig::new(data);
    // Folds only when asked; installs are looked for often.
    c.checkpoint.poll_interval = Duration::from_millis(10);
    c.checkpoint.merge_hold = hold;
    c.checkpoint.crash_at = crash_at;
    c
}

/// A merge hold, and the sender whose drop releases it.
fn hold() -> (MergeHold, crossbeam_channel::Receiver<()>, Sender<()>) {
    let (reached, reached_rx) = bounded(16);
    let (release, release_rx) = bounded(0);
    let hold = MergeHold {
        reached,
        release: release_rx,
    };
    (hold, reached_rx, release)
}

fn coord(i: i32) -> Coord {
    Coord::new(i, i % 7, -i)
}

fn put(engine: &Engine, model: &mut Model, i: i32, round: u32) {
    let value = format!("cell {i} round {round}").into_bytes();
    engine
        .session()
        .unwrap()
        .write(Mutation::Put {
            ns: ns(),
            coord: coord(i),
            value: value.clone(),
        })
        .unwrap();
    model.insert(i, value);
}

fn delete(engine: &Engine, model: &mut Model, i: i32) {
    engine
        .session()
        .unwrap()
        .write(Mutation::Del {
            ns: ns(),
            coord: coord(i),
        })
        .unwrap();
    model.remove(&i);
}

fn assert_cells(engine: &Engine, model: &Model, upto: i32) {
    for i in 0..upto {
        let got = engine
            .get(&ns(), coord(i))
            .unwrap()
            .unwrap()
            .map(|v| v.to_vec());
        assert_eq!(got.as_ref(), model.get(&i), "cell {i}");
    }
}

/// Waits until the stats show `done` (woken by the checkpointer and the
/// merge thread, not by a clock); the bound only catches a hang.
fn wait_until(engine: &Engine, what: &str, done: impl FnMut(&StoreStatsSnapshot) -> bool) {
    assert!(
        engine.wait_for_stats(HANG_BOUND, done),
        "timed out waiting for {what}"
    );
}

/// No temp file is left; the cells match the model before a clean
/// shutdown and after a restart.
fn shut_down_and_restart(engine: Engine, data: &Path, model: &Model) {
    assert!(files_ending(data, ".tmp").is_empty());
    assert_cells(&engine, model, 320);
    engine.shutdown().unwrap();
    drop(engine);
    let engine = Engine::open(config(data, None)).unwrap();
    assert_cells(&engine, model, 320);
    engine.close_without_checkpoint();
}

fn data_dir(tmp: &Path) -> std::path::PathBuf {
    let data = tmp.join("data");
    fs::DirBuilder::new().mode(0o700).create(&data).unwrap();
    data
}

fn files_ending(data: &Path, suffix: &str) -> Vec<String> {
    fs::read_dir(data.join("checkpoint"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(suffix))
        .collect()
}

/// Two folds of similar size: the second run outgrows half the first, so
/// a merge of all runs is due and starts on the merge thread, where the
/// hold stops it after its first entry.
fn start_held_merge(engine: &Engine, model: &mut Model, reached: &crossbeam_channel::Receiver<()>) {
    for i in 0..200 {
        put(engine, model, i, 1);
    }
    engine.checkpoint().unwrap();
    for i in 100..300 {
        put(engine, model, i, 2);
    }
    for i in 0..20 {
        delete(engine, model, i);
    }
    engine.checkpoint().unwrap();
    reached.recv_timeout(HANG_BOUND).unwrap();
    assert_eq!(engine.stats().merges_in_flight, 1);
}

/// A data dir whose engine has a merge held mid-way (see
/// [`start_held_merge`]); dropping the sender releases it.
fn held_merge() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Engine,
    Model,
    Sender<()>,
) {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(tmp.path());
    let (hold, reached, release) = hold();
    let mut model = Model::new();
    let engine = Engine::open(config(&data, Some(hold))).unwrap();
    start_held_merge(&engine, &mut model, &reached);
    (tmp, data, engine, model, release)
}

#[test]
fn a_fold_completes_while_a_merge_is_in_flight() {
    let (_tmp, data, engine, mut model, release) = held_merge();
    let compactions = engine.stats().compactions;

    // The merge is held: this fold must not wait for it.
    for i in 290..310 {
        put(&engine, &mut model, i, 3);
    }
    delete(&engine, &mut model, 150);
    let report = engine.checkpoint().unwrap();
    assert!(report.segments_folded > 0, "{report:?}");
    assert_eq!(engine.stats().merges_in_flight, 1);
    assert_eq!(files_ending(&data, ".run").len(), 3);

    drop(release);
    wait_until(&engine, "the merge to be installed", |stats| {
        stats.merges_in_flight == 0 && stats.compactions > compactions
    });
    // The merged run replaced the two it read; the fold's run stays above.
    assert_eq!(files_ending(&data, ".run").len(), 2);
    shut_down_and_restart(engine, &data, &model);
}

#[test]
fn shutdown_with_a_merge_in_flight_leaves_no_stray_file() {
    let (_tmp, data, engine, model, release) = held_merge();
    // Released while shutdown is on its way: the merge is cancelled or, if
    // it finishes first, installed; either way nothing is left behind.
    let stopping = std::thread::spawn(move || {
        engine.shutdown().unwrap();
        engine
    });
    drop(release);
    let engine = stopping.join().unwrap();
    assert_eq!(engine.stats().merges_in_flight, 0);
    drop(engine);
    assert!(files_ending(&data, ".tmp").is_empty());
    let mut runs = files_ending(&data, ".run");
    runs.sort();

    let engine = Engine::open(config(&data, None)).unwrap();
    assert_cells(&engine, &model, 320);
    engine.close_without_checkpoint();
    // The start removed no file (it removes unlisted ones), and opened
    // every listed one: no run left unlisted, none listed but missing.
    let mut after = files_ending(&data, ".run");
    after.sort();
    assert_eq!(runs, after);
}

/// A namespace dropped while its merge is in flight: the fold that drops
/// it cancels the merge (or, finished, installs it first) and removes its
/// runs, so no run of it is left, listed or not.
#[test]
fn a_namespace_dropped_during_its_merge_leaves_no_run() {
    let (_tmp, data, engine, mut model, release) = held_merge();
    write(&engine, Mutation::NamespaceDrop { ns: ns() });
    write(
        &engine,
        Mutation::NamespaceCreate {
            ns: ns(),
            meta: cube_store::namespace::NamespaceMeta::implicit_default(1000),
        },
    );
    model.clear();
    put(&engine, &mut model, 5, 4);
    drop(release);
    engine.checkpoint().unwrap();
    wait_until(&engine, "no merge in flight", |stats| {
        stats.merges_in_flight == 0
    });
    // The new namespace's one run only.
    assert_eq!(files_ending(&data, ".run").len(), 1);
    shut_down_and_restart(engine, &data, &model);
}

/// A merge that fails on the merge thread is reported as a failed fold is
/// (`checkpoint_failures`, the failure's message) and loses nothing: its
/// runs stay listed, and a restart reads every cell.
#[test]
fn a_failed_background_merge_is_reported_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(tmp.path());
    let mut model = Model::new();
    let failing = crashing_config(&data, None, Some(CrashPoint::MergeTempWritten));
    let engine = Engine::open(failing).unwrap();
    // Two similar folds: a merge is due, and fails at its temp file.
    for round in 1..=2 {
        for i in 0..200 {
            put(&engine, &mut model, i + 100 * round as i32 - 100, round);
        }
        engine.checkpoint().unwrap();
    }
    wait_until(&engine, "the merge's failure", |stats| {
        stats.checkpoint_failures > 0
    });
    let stats = engine.stats();
    let message = stats.last_checkpoint_failure.unwrap_or_default();
    assert!(message.contains("MergeTempWritten"), "{message}");
    assert_eq!(files_ending(&data, ".run").len(), 2);
    assert_cells(&engine, &model, 320);
    engine.close_without_checkpoint();
    drop(engine);
    let engine = Engine::open(config(&data, None)).unwrap();
    assert!(files_ending(&data, ".tmp").is_empty());
    assert_cells(&engine, &model, 320);
    engine.close_without_checkpoint();
}

/// Folds `folds` times on another thread, 10 new cells each (keys from
/// 1000 on, `round`), sending the run files on disk after each fold;
/// returns the cells it wrote.
fn fold_on_a_thread(
    engine: &Arc<Engine>,
    data: &Path,
    folds: i32,
    round: u32,
) -> (
    std::thread::JoinHandle<Model>,
    crossbeam_channel::Receiver<usize>,
) {
    let (folded, folded_rx) = bounded(folds as usize);
    let engine = Arc::clone(engine);
    let data = data.to_path_buf();
    let folding = std::thread::spawn(move || {
        let mut model = Model::new();
        for fold in 0..folds {
            for i in 0..10 {
                put(&engine, &mut model, 1000 + fold * 10 + i, round);
            }
            engine.checkpoint().unwrap();
            folded.send(files_ending(&data, ".run").len()).unwrap();
        }
        model
    });
    (folding, folded_rx)
}

/// The cells from key 1000 on read as `model` has them.
fn assert_folded_cells(engine: &Engine, model: &Model) {
    for (i, value) in model.range(1000..) {
        let got = engine.get(&ns(), coord(*i)).unwrap().unwrap();
        assert_eq!(got.map(|v| v.to_vec()).as_ref(), Some(value), "cell {i}");
    }
}

/// Shuts `engine` down while merges may still start or run (shutdown
/// cancels one in flight and removes its file), then checks that no temp
/// file is left and a restart reads every cell of `model`.
fn shut_down_during_merges_and_restart(engine: Engine, data: &Path, model: &Model) {
    engine.shutdown().unwrap();
    drop(engine);
    assert!(files_ending(data, ".tmp").is_empty());
    let engine = Engine::open(config(data, None)).unwrap();
    assert_cells(&engine, model, 320);
    assert_folded_cells(&engine, model);
    engine.close_without_checkpoint();
}

/// Folds go on while a merge is held, far past the manifest's 64 runs a
/// namespace: from 8 runs those folded since the held merge began are
/// merged on the second merge thread (`start_merge_of_folded_runs`), and
/// a fold that still finds 24 (`FOLD_WAITS_AT_RUNS`) waits for the merges
/// in flight, so every fold succeeds, the run count stays under the cap,
/// and no cell is lost.
#[test]
fn folds_past_the_run_cap_wait_for_the_merge_in_flight() {
    const FOLDS: i32 = 70;
    const FOLD_WAITS_AT_RUNS: usize = 24;
    let (_tmp, data, engine, mut model, release) = held_merge();
    let engine = Arc::new(engine);
    let (folding, folded) = fold_on_a_thread(&engine, &data, FOLDS, 5);
    let mut release = Some(release);
    for fold in 0..FOLDS {
        let runs = folded
            .recv_timeout(HANG_BOUND)
            .unwrap_or_else(|e| panic!("fold {fold} did not complete: {e}"));
        // Listed runs, and at most a merged one not yet listed.
        assert!(runs <= FOLD_WAITS_AT_RUNS + 1, "{runs} runs");
        // The two held runs and one per fold: the next fold may wait.
        if runs + 1 >= FOLD_WAITS_AT_RUNS {
            drop(release.take());
        }
    }
    drop(release);
    model.extend(folding.join().unwrap());
    let engine = Arc::into_inner(engine).unwrap();
    assert_folded_cells(&engine, &model);
    shut_down_during_merges_and_restart(engine, &data, &model);
}

/// While the merge thread is held on a merge of the older runs, the runs
/// folded since are merged on the second merge thread (from 8 runs), so
/// no fold waits for the held merge and the run count stays under the
/// folds' wait; the held merge is installed afterwards below them, and
/// nothing is lost.
#[test]
fn folds_during_a_long_merge_merge_their_own_runs() {
    const FOLDS: i32 = 40;
    const FOLD_WAITS_AT_RUNS: usize = 24;
    let (_tmp, data, engine, mut model, release) = held_merge();
    let compactions = engine.stats().compactions;
    let engine = Arc::new(engine);
    let (folding, folded) = fold_on_a_thread(&engine, &data, FOLDS, 6);
    // Every fold completes with the merge still held.
    for fold in 0..FOLDS {
        let runs = folded
            .recv_timeout(HANG_BOUND)
            .unwrap_or_else(|e| panic!("fold {fold} did not complete: {e}"));
        assert!(runs <= FOLD_WAITS_AT_RUNS, "{runs} runs after fold {fold}");
    }
    // The held merge, and perhaps one of the runs folded meanwhile.
    assert!(engine.stats().merges_in_flight >= 1);
    model.extend(folding.join().unwrap());
    drop(release);
    wait_until(&engine, "the held merge to be installed", |stats| {
        stats.merges_in_flight == 0 && stats.compactions > compactions
    });
    let engine = Arc::into_inner(engine).unwrap();
    assert_folded_cells(&engine, &model);
    shut_down_during_merges_and_restart(engine, &data, &model);
}
