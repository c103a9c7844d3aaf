//! Cells on disk (issue 32, increment b): each namespace's cells are run
//! files (`crate::run_file`) that the manifest lists newest first, with
//! the namespace's live cell count and value bytes.
//!
//! - A fold writes the cells it gathered as one new run per namespace
//!   ([`CheckpointStore::write_fold_runs`]), keyed by the namespace's curve
//!   key so that a Hilbert namespace's blocks are in scan order. Deletes
//!   stay as tombstones while an older run may hold the cell; the counts
//!   stay exact by looking each folded key up in the older runs (through
//!   the checkpointer's small block cache).
//! - A restart loads each namespace's runs into memory through a [`Merge`]
//!   of their ranges, tombstones dropped ([`CheckpointStore::load_runs`]),
//!   and checks the result against the manifest's counts.
//! - A merge ([`CheckpointStore::merge_runs`]) streams a window of a
//!   namespace's runs into one ([`merge_due`]: all of them as it doubles,
//!   else runs of like size four or more at a time; tombstones dropped
//!   when the window reaches the oldest run); a compaction asked for
//!   merges each namespace to one run. While the merge thread rewrites a
//!   namespace, the runs folded since are merged on a second merge thread
//!   ([`FOLDED_MERGE_AT_RUNS`]); a fold of a namespace with
//!   [`FOLD_WAITS_AT_RUNS`] runs first waits for the merges in flight.
//!
//! Runs of an encrypted namespace are sealed, those of a data dir with a
//! master key authenticated (their footer MAC is in the manifest), others
//! plain: `run_file::Protection`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use cube_protocol::NamespaceName;

use super::manifest::{Manifest, NamespaceRuns, RunRef, run_file_name};
use super::merge_job::{
    MergeJob, MergedNamespace, NamespaceMerge, count_mismatch, discard_outputs, run_merge_job,
};
use super::{CheckpointStore, CompactionReport, CrashPoint, SortedCells};
use crate::cell_value::CellValue;
use crate::count_marks::CountMark;
use crate::crypto::{DIR_ID_BYTES, MAC_BYTES};
use crate::curve::{Curve, MAX_KEY, morton_decode};
use crate::data_dir::sync_dir;
use crate::disk_tier::resident_cost_bytes;
use crate::error::StoreError;
use crate::memstore::MemStore;
use crate::namespace::NamespaceCatalog;
use crate::run_file::{
    BlockCache, Merge, Protection, RunFileError, RunFileReader, RunFileWriter, RunSummary, Source,
};
use crate::wal::sealing_rule::must_seal;

/// The checkpointer's block cache: folds look folded keys up in older
/// runs, merges and loads stream them.
pub(super) const RUN_CACHE_BYTES: usize = 8 * 1024 * 1024;

/// Folded keys looked up in an older run at once: bounds the blocks a
/// lookup holds (at most this many).
const LOOKUP_SLICE_KEYS: usize = 256;

/// A fold's cells of one namespace: Morton key and value (`None` deletes),
/// in Morton order.
pub(super) type FoldedCells = Vec<(u128, Option<Vec<u8>>)>;

/// What [`CheckpointStore::write_fold_runs`] did.
#[derive(Default)]
pub(super) struct FoldRunsWritten {
    /// Entries written to runs.
    pub(super) entries: u64,
    /// Namespaces whose counts came from the writer's mark.
    pub(super) counted_by_writer: usize,
}

impl From<RunFileError> for StoreError {
    fn from(e: RunFileError) -> StoreError {
        match e {
            RunFileError::Corrupt {
                path,
                offset,
                reason,
            } => StoreError::Corruption {
                path,
                offset,
                reason,
            },
            // The offset goes into the message, so that an I/O error names
            // where in the file it struck, as a corruption does.
            RunFileError::Io {
                path,
                offset,
                source,
            } => StoreError::Io {
                path,
                source: std::io::Error::new(
                    source.kind(),
                    format!("reading or writing at offset {offset} failed: {source}"),
                ),
            },
            RunFileError::Key { .. } => StoreError::Key(e.to_string()),
            RunFileError::Refused { path, reason } => StoreError::Corruption {
                path,
                offset: 0,
                reason: format!("refused by the run file writer: {reason}"),
            },
        }
    }
}

/// Which of a namespace's runs (newest first) a merge rewrites into one:
/// `runs[start..end]`, next to each other, so the merged run takes their
/// place in the order. Tombstones are dropped only when the window
/// reaches the oldest run (no run older than the window may hold what
/// they hide).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MergeScope {
    pub(super) start: usize,
    pub(super) end: usize,
}

impl MergeScope {
    /// Every run of a namespace that has `run_count`.
    pub(super) fn all(run_count: usize) -> MergeScope {
        MergeScope {
            start: 0,
            end: run_count,
        }
    }

    pub(super) fn window(self) -> std::ops::Range<usize> {
        self.start..self.end
    }

    /// Whether the window ends with the oldest of `run_count` runs.
    pub(super) fn reaches_oldest(self, run_count: usize) -> bool {
        self.end == run_count
    }

    /// Whether the window is all of `run_count` runs.
    pub(super) fn is_all(self, run_count: usize) -> bool {
        self == MergeScope::all(run_count)
    }
}

/// Runs of like size merged at once: a window of fewer waits for more.
pub(crate) const MERGE_WIDTH_RUNS: usize = 4;

/// A namespace with more runs than this merges all but its oldest at the
/// next chance, whatever their sizes.
pub(crate) const MAX_UNMERGED_RUNS: usize = 12;

/// From this many runs a fold of the namespace waits for the merges in
/// flight (the folded lane's first), then merges on its own thread, before
/// adding its run: the manifest lists at most `manifest::MAX_RUNS` a
/// namespace, and a long merge must not let folds pile runs up to it.
pub(crate) const FOLD_WAITS_AT_RUNS: usize = 2 * MAX_UNMERGED_RUNS;

/// A run this process wrote with at most this many entries (a fold's; a
/// filter of at most 10 MiB) is served with its filter loaded.
const FILTER_LOADED_AT_INSTALL_MAX_ENTRIES: u64 = 8 << 20;

/// From this many runs, while the merge thread merges older ones, the
/// runs folded since are merged on the folded lane's thread
/// (`CheckpointStore::start_merge_of_folded_runs`).
pub(crate) const FOLDED_MERGE_AT_RUNS: usize = 8;
const _: () = assert!(FOLDED_MERGE_AT_RUNS < FOLD_WAITS_AT_RUNS);
const _: () = assert!(FOLD_WAITS_AT_RUNS < super::manifest::MAX_RUNS);

/// The merge a namespace whose run files (newest first) are `sizes`
/// bytes is due, if any (universal, or size-tiered, compaction):
///
/// 1. all of them once the newer together outgrow the oldest: the
///    namespace is rewritten whole (tombstones and overwritten values
///    dropped) as it doubles, no more often;
/// 2. else the newest window of at least [`MERGE_WIDTH_RUNS`] runs in
///    which each run is no larger than the newer ones of the window
///    together (plus 1 %): runs of like size, so a cell is rewritten
///    about once per fourfold growth of its run, never once per fold;
/// 3. else, past [`MAX_UNMERGED_RUNS`] runs, all but the oldest.
///
/// The policy it replaced merged all the newer runs into one every third
/// fold: its cost grew with the square of the data between full merges
/// (docs/benchmarks.md, "200 M cells on disk").
pub(super) fn merge_due(sizes: &[u64]) -> Option<MergeScope> {
    let (&oldest, newer) = sizes.split_last()?;
    if newer.is_empty() {
        return None;
    }
    if newer.iter().sum::<u64>() >= oldest {
        return Some(MergeScope::all(sizes.len()));
    }
    for start in 0..sizes.len() {
        let mut together = sizes[start];
        let mut end = start + 1;
        while end < sizes.len() && sizes[end] <= together + together / 100 {
            together += sizes[end];
            end += 1;
        }
        if end - start >= MERGE_WIDTH_RUNS {
            return Some(MergeScope { start, end });
        }
    }
    (sizes.len() > MAX_UNMERGED_RUNS).then_some(MergeScope {
        start: 0,
        end: sizes.len() - 1,
    })
}

/// Which namespaces' runs a merge rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MergeWhen {
    /// Those with a merge due ([`merge_due`], after a fold).
    Due,
    /// Every namespace with more than one run (a compaction asked for).
    ManyRuns,
    /// Every namespace (their protection changes: a data dir being
    /// authenticated for the first time).
    All,
}

impl CheckpointStore {
    pub(super) fn run_path(&self, file_id: u64) -> PathBuf {
        self.dir.join(run_file_name(file_id))
    }

    /// A run file's size (0 if it cannot be read: sizes only steer merges
    /// and stats).
    fn run_bytes(&self, run: &RunRef) -> u64 {
        self.storage
            .file_len(&self.run_path(run.file_id))
            .unwrap_or(0)
    }

    /// The protection of runs bound to `dir_id` (`None`: no master key).
    fn protection(
        &self,
        encrypted: bool,
        dir_id: Option<[u8; DIR_ID_BYTES]>,
    ) -> Result<Protection, StoreError> {
        let keyring = self.keyring.clone().filter(|k| k.has_key());
        match (dir_id, keyring) {
            (Some(dir_id), Some(keyring)) if encrypted => {
                Ok(Protection::Sealed { keyring, dir_id })
            }
            (Some(dir_id), Some(keyring)) => Ok(Protection::Authenticated { keyring, dir_id }),
            (None, _) if !encrypted => Ok(Protection::Plain),
            _ => Err(StoreError::Key(format!(
                "{}: the run files of an {} namespace need the master key; start cubed with \
                 --key-file",
                self.dir.display(),
                if encrypted {
                    "encrypted"
                } else {
                    "authenticated data dir's"
                }
            ))),
        }
    }

    /// A new run's file id (taken from `next`), path and protection.
    fn new_run(
        &mut self,
        next: &mut Manifest,
        encrypted: bool,
    ) -> Result<(u64, PathBuf, Protection), StoreError> {
        let file_id = next.next_file_id;
        next.next_file_id += 1;
        let protection = self.write_protection(encrypted)?;
        Ok((file_id, self.run_path(file_id), protection))
    }

    /// How new runs of a namespace are written now.
    fn write_protection(&mut self, encrypted: bool) -> Result<Protection, StoreError> {
        let dir_id = self.writing_dir_id()?;
        self.protection(encrypted, dir_id)
    }

    /// Whether namespace `ns_id` of the catalog is encrypted; `None` when
    /// it is not live.
    fn encrypted(catalog: &NamespaceCatalog, ns_id: u64) -> Option<bool> {
        catalog.meta_of(ns_id).map(must_seal)
    }

    /// Opens the runs of namespace `entry`, newest first, each checked
    /// against the manifest (file id, namespace, MAC in an authenticated
    /// manifest). They stay open only while the result lives: a data dir
    /// with many namespaces must not hold a descriptor per run.
    fn open_runs(&self, entry: &NamespaceRuns, encrypted: bool) -> Result<OpenRuns, StoreError> {
        self.open_run_refs(entry.ns_id, &entry.runs, encrypted, &[])
    }

    /// [`Self::open_runs`] of some of namespace `ns_id`'s runs, taking
    /// those in `held` (readers open already, by file id) as they are.
    fn open_run_refs(
        &self,
        ns_id: u64,
        refs: &[RunRef],
        encrypted: bool,
        held: &[Arc<RunFileReader>],
    ) -> Result<OpenRuns, StoreError> {
        let mut runs = OpenRuns {
            readers: Vec::with_capacity(refs.len()),
            cache: Arc::clone(&self.run_cache),
        };
        if refs.is_empty() {
            // A namespace's first run: no protection to ask for yet (a
            // data dir's first keyed fold has no authenticated manifest).
            return Ok(runs);
        }
        let dir_id = self.manifest.auth.as_ref().map(|a| a.dir_id);
        let protection = self.protection(encrypted, dir_id)?;
        for run in refs {
            if let Some(open) = held.iter().find(|r| r.file_id() == run.file_id) {
                runs.readers.push(Arc::clone(open));
                continue;
            }
            let reader = RunFileReader::open_storage(
                self.storage.as_ref(),
                &self.run_path(run.file_id),
                &protection,
                Arc::clone(&self.run_cache),
            )?;
            reader.expect(run.file_id, ns_id, dir_id.map(|_| &run.mac))?;
            runs.readers.push(Arc::new(reader));
        }
        Ok(runs)
    }

    /// Removes run files no longer listed (after the manifest that drops
    /// them is durable) and syncs the directory.
    pub(super) fn remove_runs(&mut self, file_ids: &[u64]) -> Result<(), StoreError> {
        for (i, id) in file_ids.iter().enumerate() {
            if i == 1 {
                self.crash_check(CrashPoint::OldRunsPartlyRemoved)?;
            }
            let path = self.run_path(*id);
            self.storage
                .remove_file(&path)
                .map_err(|e| StoreError::io(&path, e))?;
        }
        if !file_ids.is_empty() {
            sync_dir(self.storage.as_ref(), &self.dir)?;
        }
        Ok(())
    }

    /// Writes each namespace's folded cells as its newest run, and sets
    /// `next`'s entries (runs, exact counts: from `marked`, the writer's
    /// counts at the fold's last record, where it has them). `catalog`:
    /// the namespaces at the fold's end (cells of others are not
    /// written).
    pub(super) fn write_fold_runs(
        &mut self,
        catalog: &NamespaceCatalog,
        cells: BTreeMap<u64, FoldedCells>,
        marked: Option<CountMark>,
        next: &mut Manifest,
    ) -> Result<FoldRunsWritten, StoreError> {
        let mut written = FoldRunsWritten::default();
        for (ns_id, folded) in cells {
            let Some(meta) = catalog.meta_of(ns_id) else {
                continue;
            };
            let (curve, encrypted) = (meta.curve, must_seal(meta));
            let mut entries: Vec<(u128, Option<Vec<u8>>)> = folded
                .into_iter()
                .map(|(morton, value)| (curve.key(morton_decode(morton)), value))
                .collect();
            if curve != Curve::Morton {
                entries.sort_unstable_by_key(|(key, _)| *key);
            }
            let mut entry = next.namespace(ns_id).cloned().unwrap_or(NamespaceRuns {
                ns_id,
                ..NamespaceRuns::default()
            });
            match marked.as_ref().and_then(|mark| mark.get(ns_id)) {
                Some(count) => {
                    #[cfg(debug_assertions)]
                    self.assert_marked_count(&entry, &entries, encrypted, count)?;
                    entry.live_cells = count.live_cells;
                    entry.value_bytes = count.value_bytes;
                    written.counted_by_writer += 1;
                }
                None => self.count_over_older(&mut entry, &entries, encrypted)?,
            }
            // With no older run, a delete hides nothing.
            if entry.runs.is_empty() {
                entries.retain(|(_, value)| value.is_some());
            }
            if entries.is_empty() {
                next.set_namespace(entry);
                continue;
            }
            let (file_id, path, protection) = self.new_run(next, encrypted)?;
            let mut writer = RunFileWriter::create(
                self.storage.as_ref(),
                &path,
                file_id,
                ns_id,
                &protection,
                entries.len() as u64,
            )?;
            for (key, value) in &entries {
                writer.push(*key, value.as_deref())?;
            }
            if self.config.crash_at == Some(CrashPoint::RunTempWritten) {
                // The temp file stays behind, as after a real crash.
                drop(writer);
                return Err(StoreError::SimulatedCrash("RunTempWritten".into()));
            }
            let summary = writer.finish()?;
            written.entries += summary.entries;
            entry.runs.insert(0, run_ref(file_id, &summary));
            next.set_namespace(entry);
        }
        self.crash_check(CrashPoint::RunRenamed)?;
        Ok(written)
    }

    /// Tests and debug builds check every count a fold takes from the
    /// writer against the lookups it stands in for.
    #[cfg(debug_assertions)]
    fn assert_marked_count(
        &mut self,
        entry: &NamespaceRuns,
        entries: &[(u128, Option<Vec<u8>>)],
        encrypted: bool,
        marked: crate::count_marks::NamespaceCount,
    ) -> Result<(), StoreError> {
        let mut looked_up = entry.clone();
        self.count_over_older(&mut looked_up, entries, encrypted)?;
        assert_eq!(
            (marked.live_cells, marked.value_bytes),
            (looked_up.live_cells, looked_up.value_bytes),
            "namespace {}: the writer's counts (left) differ from the runs' (right)",
            entry.ns_id
        );
        Ok(())
    }

    /// Moves `entry`'s counts from the state of its runs to that state
    /// with `entries` (curve key order) written over it.
    fn count_over_older(
        &mut self,
        entry: &mut NamespaceRuns,
        entries: &[(u128, Option<Vec<u8>>)],
        encrypted: bool,
    ) -> Result<(), StoreError> {
        // The runs the daemon serves are open already (their index read,
        // their filter loaded or on its way): opening the namespace's
        // largest run again on every fold read and checked its whole
        // index and filter each time.
        let held = self
            .serving
            .as_ref()
            .and_then(|mem| mem.serving_runs(entry.ns_id))
            .unwrap_or_default();
        let runs = self.open_run_refs(entry.ns_id, &entry.runs, encrypted, &held)?;
        let keys: Vec<u128> = entries.iter().map(|(key, _)| *key).collect();
        // Each key's newest slot in the older runs: `None` if none holds it.
        let mut older: Vec<Option<Option<CellValue>>> = vec![None; keys.len()];
        for reader in &runs.readers {
            let pending: Vec<usize> = (0..keys.len()).filter(|&i| older[i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            // In slices: `get_many` holds every block it reads at once.
            for slice in pending.chunks(LOOKUP_SLICE_KEYS) {
                let asked: Vec<u128> = slice.iter().map(|&i| keys[i]).collect();
                for (&i, found) in slice.iter().zip(reader.get_many(&asked)) {
                    older[i] = found?;
                }
            }
        }
        for ((_, value), old) in entries.iter().zip(older) {
            // Saturating: counts that are already wrong are refused at the
            // next load, which recounts them.
            if let Some(old) = old.flatten() {
                entry.live_cells = entry.live_cells.saturating_sub(1);
                entry.value_bytes = entry.value_bytes.saturating_sub(old.len() as u64);
            }
            if let Some(value) = value {
                entry.live_cells += 1;
                entry.value_bytes += value.len() as u64;
            }
        }
        Ok(())
    }

    /// Loads each live namespace's cells: smallest first, into memory
    /// while they fit `mem`'s resident budget (their runs merged, newest
    /// winning, deletes dropped, and checked against the manifest's
    /// counts), the rest served from their runs, of which only the
    /// indexes are read (`crate::disk_tier`). Returns the cells loaded
    /// or opened.
    pub(crate) fn load_runs(&mut self, mem: &MemStore) -> Result<u64, StoreError> {
        let mut loaded = 0;
        let mut entries: Vec<(NamespaceName, NamespaceRuns)> = self
            .manifest
            .namespaces
            .iter()
            .filter_map(|entry| Some((self.catalog.name_of(entry.ns_id)?, entry.clone())))
            .collect();
        let cost = |entry: &NamespaceRuns| resident_cost_bytes(entry.live_cells, entry.value_bytes);
        entries.sort_by_key(|(_, entry)| cost(entry));
        for (ns, entry) in entries {
            let encrypted = Self::encrypted(&self.catalog, entry.ns_id).unwrap_or(true);
            if !mem.place_in_memory(cost(&entry)) {
                let runs = self.open_serving_runs(&entry, encrypted, &[], &mem.tiering.cache)?;
                let lsn = self.checkpoint_lsn();
                mem.serve_from_disk(&ns, runs, entry.live_cells, entry.value_bytes, lsn);
                loaded += entry.live_cells;
                continue;
            }
            let runs = self.open_runs(&entry, encrypted)?;
            let mut cells = SortedCells::default();
            for item in Merge::new(runs.sources(), true)? {
                let (key, value) = item?;
                if let Some(value) = value {
                    cells.value_bytes += value.len() as u64;
                    cells.keys.push(key);
                    cells.values.push(value);
                }
            }
            let counted = (cells.values.len() as u64, cells.value_bytes);
            if counted != (entry.live_cells, entry.value_bytes) {
                return Err(count_mismatch(&self.dir, &entry, counted));
            }
            loaded += counted.0;
            mem.load_curve_cells(&ns, cells);
        }
        Ok(loaded)
    }

    /// Opens namespace `entry`'s runs for serving, newest first, each
    /// checked against the manifest, reading through the daemon's `cache`;
    /// a run already open in `held` (by file id) is reused.
    fn open_serving_runs(
        &self,
        entry: &NamespaceRuns,
        encrypted: bool,
        held: &[Arc<RunFileReader>],
        cache: &Arc<BlockCache>,
    ) -> Result<Vec<Arc<RunFileReader>>, StoreError> {
        if entry.runs.is_empty() {
            return Ok(Vec::new());
        }
        let dir_id = self.manifest.auth.as_ref().map(|a| a.dir_id);
        let protection = self.protection(encrypted, dir_id)?;
        let mut runs = Vec::with_capacity(entry.runs.len());
        for run in &entry.runs {
            if let Some(open) = held.iter().find(|r| r.file_id() == run.file_id) {
                runs.push(Arc::clone(open));
                continue;
            }
            let reader = RunFileReader::open_serving(
                self.storage.as_ref(),
                &self.run_path(run.file_id),
                &protection,
                Arc::clone(cache),
            )?;
            reader.expect(run.file_id, entry.ns_id, dir_id.map(|_| &run.mac))?;
            runs.push(Arc::new(reader));
        }
        Ok(runs)
    }

    /// After a manifest switch: hands every namespace that reads its runs
    /// (on disk, or migrating there) the runs the manifest now lists,
    /// which hold every write up to its checkpoint LSN. A namespace whose
    /// new runs cannot be opened keeps its earlier ones, which with its
    /// memtable still read right: it only holds more memory until a later
    /// switch succeeds.
    pub(super) fn publish_runs(&self) {
        let Some(mem) = &self.serving else {
            return;
        };
        let lsn = self.checkpoint_lsn();
        for ns_id in mem.serving_namespace_ids() {
            let Some(held) = mem.serving_runs(ns_id) else {
                continue;
            };
            let Some(encrypted) = Self::encrypted(&self.catalog, ns_id) else {
                continue;
            };
            let entry = self
                .manifest
                .namespace(ns_id)
                .cloned()
                .unwrap_or(NamespaceRuns {
                    ns_id,
                    ..NamespaceRuns::default()
                });
            match self.open_serving_runs(&entry, encrypted, &held, &mem.tiering.cache) {
                Ok(runs) => {
                    // A small run this process just wrote (a fold's) goes
                    // in with its filter (read back from the page cache
                    // here, off the writer): until a filter is loaded every
                    // lookup its key range covers reads a block, and the
                    // writer looks up each new cell. A merge's large run
                    // loads after, in the background, so its filter and
                    // those of the runs it replaces are not all held at
                    // once. A filter that fails is reported by the
                    // background loader; the run is served without it.
                    let new = |r: &&Arc<RunFileReader>| !held.iter().any(|h| Arc::ptr_eq(h, r));
                    for run in runs.iter().filter(new) {
                        if run.entry_count() <= FILTER_LOADED_AT_INSTALL_MAX_ENTRIES {
                            let _ = run.load_filter();
                        }
                    }
                    mem.install_runs(ns_id, runs, lsn)
                }
                Err(e) => eprintln!(
                    "cubed: namespace id {ns_id} goes on reading its earlier run files, since \
                     opening the ones checkpoint LSN {lsn} lists failed: {e}"
                ),
            }
        }
        mem.runs_published(lsn);
    }

    /// Whether the daemon's memory waits on a fold (`MemStore::wants_fold`).
    pub(crate) fn wants_fold(&self) -> bool {
        self.serving.as_ref().is_some_and(|mem| mem.wants_fold())
    }

    /// Lets each manifest switch hand its runs to `mem`'s namespaces on
    /// disk.
    pub(crate) fn serve(&mut self, mem: Arc<MemStore>) {
        self.serving = Some(mem);
    }

    /// The merge namespace `entry` is due after a fold ([`merge_due`]).
    fn merge_due(&self, entry: &NamespaceRuns) -> Option<MergeScope> {
        let sizes: Vec<u64> = entry.runs.iter().map(|run| self.run_bytes(run)).collect();
        merge_due(&sizes)
    }

    /// Before a fold adds a run to each of namespaces `ns_ids`: hands the
    /// folded lane a merge of the runs folded since the merge in flight
    /// began, if there are many ([`Self::start_merge_of_folded_runs`]);
    /// then, if one still has [`FOLD_WAITS_AT_RUNS`] runs, waits for the
    /// folded lane's merge (seconds), then for every merge in flight
    /// (installing them), then, if one still has as many, merges on this
    /// thread what is due ([`merge_due`] always picks a namespace with
    /// more than [`MAX_UNMERGED_RUNS`]).
    pub(super) fn make_room_for_runs(
        &mut self,
        ns_ids: &[u64],
        report: &mut CompactionReport,
    ) -> Result<(), StoreError> {
        let crowded = |store: &Self| {
            ns_ids.iter().any(|&id| {
                store
                    .manifest
                    .namespace(id)
                    .is_some_and(|entry| entry.runs.len() >= FOLD_WAITS_AT_RUNS)
            })
        };
        for &ns_id in ns_ids {
            self.start_merge_of_folded_runs(ns_id)?;
        }
        if !crowded(self) {
            return Ok(());
        }
        self.settle_folded_merge(report)?;
        if !crowded(self) {
            return Ok(());
        }
        self.settle_merge(false, report)?;
        if crowded(self) {
            // Past MAX_UNMERGED_RUNS a merge is always due.
            self.merge_runs(MergeWhen::Due, report)?;
        }
        Ok(())
    }

    /// While the merge thread is busy with a long merge of namespace
    /// `ns_id`'s older runs, folds keep adding runs above them: once it
    /// has [`FOLDED_MERGE_AT_RUNS`], the runs folded since that merge
    /// began are handed to the folded lane's thread (if it is idle): what
    /// [`merge_due`] finds due among them alone (four like runs as they
    /// come, seconds each), or all of them past twice as many runs;
    /// tombstones kept (older runs lie below). So folds neither wait
    /// minutes for the merge in flight nor merge themselves (a fold that
    /// merged on the checkpointer's thread took 7-10 s at 100-200 M cells,
    /// and the writer slowed meanwhile), and the writer's lookups (each
    /// new cell asks every run) stay cheap.
    fn start_merge_of_folded_runs(&mut self, ns_id: u64) -> Result<(), StoreError> {
        if !self.folded_lane_free() {
            return Ok(());
        }
        let Some(entry) = self.manifest.namespace(ns_id).cloned() else {
            return Ok(());
        };
        let merging = self.runs_merging();
        let free = entry
            .runs
            .iter()
            .take_while(|run| !merging.contains(&run.file_id))
            .count();
        if entry.runs.len() < FOLDED_MERGE_AT_RUNS
            || free == entry.runs.len()
            || free < MERGE_WIDTH_RUNS
        {
            return Ok(());
        }
        let sizes: Vec<u64> = entry.runs[..free]
            .iter()
            .map(|run| self.run_bytes(run))
            .collect();
        // Like runs four at a time as they come (seconds each); all of
        // them only once there are many.
        let scope = match merge_due(&sizes) {
            Some(scope) => scope,
            None if entry.runs.len() >= 2 * FOLDED_MERGE_AT_RUNS => MergeScope::all(free),
            None => return Ok(()),
        };
        let Some(mut job) = self.merge_job(vec![(entry, scope)])? else {
            return Ok(());
        };
        // The test hook holds the due lane's jobs, not these.
        job.hold = None;
        self.start_folded_merge(job)
    }

    /// Picks the namespaces `when` asks for and makes their merge job:
    /// their runs opened now, a new run's file id reserved for each (in
    /// the manifest in memory, stored by the next switch; a crash before
    /// leaves an unlisted file that the next start removes). `None` when
    /// no namespace needs one.
    pub(super) fn pick_merge(&mut self, when: MergeWhen) -> Result<Option<MergeJob>, StoreError> {
        let picked: Vec<(NamespaceRuns, MergeScope)> = self
            .manifest
            .namespaces
            .iter()
            .filter_map(|entry| {
                let scope = match when {
                    MergeWhen::Due => self.merge_due(entry)?,
                    MergeWhen::ManyRuns => {
                        (entry.runs.len() > 1).then_some(MergeScope::all(entry.runs.len()))?
                    }
                    MergeWhen::All => MergeScope::all(entry.runs.len()),
                };
                Some((entry.clone(), scope))
            })
            .collect();
        self.merge_job(picked)
    }

    /// The merge job of `picked` namespaces' windows: their runs opened
    /// now, a new run's file id reserved for each.
    fn merge_job(
        &mut self,
        picked: Vec<(NamespaceRuns, MergeScope)>,
    ) -> Result<Option<MergeJob>, StoreError> {
        let mut parts = Vec::with_capacity(picked.len());
        for (entry, scope) in picked {
            let Some(encrypted) = Self::encrypted(&self.catalog, entry.ns_id) else {
                continue;
            };
            // Opened afresh even when served: a merge streams its runs
            // through the checkpointer's cache, not the serving one.
            let window = &entry.runs[scope.window()];
            let runs = self.open_run_refs(entry.ns_id, window, encrypted, &[])?;
            let protection = self.write_protection(encrypted)?;
            let file_id = self.manifest.next_file_id;
            self.manifest.next_file_id += 1;
            parts.push(NamespaceMerge {
                entry,
                scope,
                runs,
                file_id,
                protection,
            });
        }
        if parts.is_empty() {
            return Ok(None);
        }
        Ok(Some(MergeJob {
            storage: Arc::clone(&self.storage),
            dir: self.dir.clone(),
            parts,
            crash_at: self.config.crash_at,
            hold: self.config.merge_hold.clone(),
            stop: Arc::new(AtomicBool::new(false)),
        }))
    }

    /// Merges the runs of the namespaces `when` picks, each into one run,
    /// on this thread, then installs them (one manifest switch).
    pub(super) fn merge_runs(
        &mut self,
        when: MergeWhen,
        report: &mut CompactionReport,
    ) -> Result<(), StoreError> {
        let Some(job) = self.pick_merge(when)? else {
            return Ok(());
        };
        self.merge_here(job, report)
    }

    /// Runs `job` on this thread, then installs what it wrote (or removes
    /// it, if it was cancelled).
    fn merge_here(
        &mut self,
        job: MergeJob,
        report: &mut CompactionReport,
    ) -> Result<(), StoreError> {
        let _in_flight = self.merges_in_flight.clone().map(MergeInFlight::start);
        self.settle_job(run_merge_job(job), report)
    }

    /// Installs a finished merge with one manifest switch: each merged run
    /// replaces exactly the runs it read (runs folded meanwhile stay above
    /// it), the namespace's counts stay its current ones (a merge changes
    /// no cell); then the runs replaced are removed. A merged run whose
    /// namespace was dropped, or whose inputs are no longer listed (a
    /// compaction rewrote them), is discarded instead.
    pub(super) fn install_merge(
        &mut self,
        merged: Vec<MergedNamespace>,
        report: &mut CompactionReport,
    ) -> Result<(), StoreError> {
        self.check_usable()?;
        let mut next = self.manifest.clone();
        let mut old = Vec::new();
        let mut discarded = Vec::new();
        let mut installed = 0;
        for m in merged {
            let read = &m.entry.runs[m.scope.window()];
            let live = Self::encrypted(&self.catalog, m.entry.ns_id).is_some();
            let current = next.namespace(m.entry.ns_id).filter(|_| live).cloned();
            let Some((mut current, at)) = current.and_then(|current| {
                let at = if read.is_empty() {
                    0
                } else {
                    current
                        .runs
                        .windows(read.len())
                        .position(|window| window == read)?
                };
                Some((current, at))
            }) else {
                discarded.push(m.file_id);
                continue;
            };
            let mut runs = current.runs[..at].to_vec();
            if m.summary.entries == 0 {
                // A merged run that holds nothing is listed by no one.
                old.push(m.file_id);
            } else {
                runs.push(run_ref(m.file_id, &m.summary));
            }
            runs.extend_from_slice(&current.runs[at + read.len()..]);
            current.runs = runs;
            old.extend(read.iter().map(|run| run.file_id));
            next.set_namespace(current);
            installed += 1;
            report.runs_merged += read.len();
            report.entries_written += m.summary.entries;
            report.base_bytes += m.summary.file_bytes;
        }
        if installed == 0 {
            return discard_outputs(self.storage.as_ref(), &self.dir, &discarded);
        }
        self.crash_check(CrashPoint::MergeRenamed)?;
        let next = self.authenticate(next, None)?;
        self.switch_manifest(next)?;
        self.publish_runs();
        self.crash_check(CrashPoint::MergeManifestSwitched)?;
        self.remove_runs(&old)?;
        discard_outputs(self.storage.as_ref(), &self.dir, &discarded)
    }

    /// Writes one namespace's cells (curve key order, no deletes) as its
    /// only run: a compaction moving a version-1/2 data dir's cells out
    /// of its checkpoint files.
    pub(super) fn write_base_run(
        &mut self,
        ns_id: u64,
        cells: &[(u128, Vec<u8>)],
        next: &mut Manifest,
    ) -> Result<(), StoreError> {
        let Some(encrypted) = Self::encrypted(&self.catalog, ns_id) else {
            return Ok(());
        };
        if cells.is_empty() {
            return Ok(());
        }
        let (file_id, path, protection) = self.new_run(next, encrypted)?;
        let mut writer = RunFileWriter::create(
            self.storage.as_ref(),
            &path,
            file_id,
            ns_id,
            &protection,
            cells.len() as u64,
        )?;
        for (key, value) in cells {
            writer.push(*key, Some(value))?;
        }
        let summary = writer.finish()?;
        next.set_namespace(NamespaceRuns {
            ns_id,
            live_cells: summary.entries,
            value_bytes: cells.iter().map(|(_, v)| v.len() as u64).sum(),
            runs: vec![run_ref(file_id, &summary)],
        });
        Ok(())
    }

    /// Drops from `next` the namespaces `catalog` no longer holds; returns
    /// their runs' file ids (to remove once `next` is durable).
    pub(super) fn drop_gone_namespaces(
        catalog: &NamespaceCatalog,
        next: &mut Manifest,
    ) -> Vec<u64> {
        let mut gone = Vec::new();
        next.namespaces.retain(|entry| {
            let live = catalog.meta_of(entry.ns_id).is_some();
            if !live {
                gone.extend(entry.runs.iter().map(|r| r.file_id));
            }
            live
        });
        gone
    }

    /// Bytes of each namespace's oldest run, and of the newer ones.
    pub(super) fn run_sizes(&self) -> (u64, u64) {
        let size = |run: &RunRef| self.run_bytes(run);
        let mut sizes = (0, 0);
        for entry in &self.manifest.namespaces {
            if let Some((oldest, newer)) = entry.runs.split_last() {
                sizes.0 += size(oldest);
                sizes.1 += newer.iter().map(size).sum::<u64>();
            }
        }
        sizes
    }

    /// The checkpointer's block cache (for folds, merges and loads).
    pub(super) fn new_run_cache() -> Arc<BlockCache> {
        Arc::new(BlockCache::new(RUN_CACHE_BYTES))
    }
}

/// Counts a merge in the stats while it lives (an error path included).
pub(super) struct MergeInFlight(Arc<crate::stats::StoreStats>);

impl MergeInFlight {
    pub(super) fn start(stats: Arc<crate::stats::StoreStats>) -> MergeInFlight {
        stats
            .merges_in_flight
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        MergeInFlight(stats)
    }
}

impl Drop for MergeInFlight {
    fn drop(&mut self) {
        self.0
            .merges_in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.0.notify_background();
    }
}

/// A namespace's runs, open while this lives; their blocks leave the
/// cache when it is dropped.
pub(super) struct OpenRuns {
    /// Newest first.
    pub(super) readers: Vec<Arc<RunFileReader>>,
    cache: Arc<BlockCache>,
}

impl OpenRuns {
    /// Each run's whole range, newest first: the sources of a [`Merge`].
    pub(super) fn sources(&self) -> Vec<Source<'_>> {
        self.readers
            .iter()
            .map(|r| Box::new(r.range(0, MAX_KEY)) as Source<'_>)
            .collect()
    }
}

impl Drop for OpenRuns {
    fn drop(&mut self) {
        for reader in &self.readers {
            self.cache.forget_file(reader.cache_id());
        }
    }
}

fn run_ref(file_id: u64, summary: &RunSummary) -> RunRef {
    RunRef {
        file_id,
        mac: summary.mac.unwrap_or([0; MAC_BYTES]),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::fs;

    use super::MergeScope;
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    use std::path::Path;

    use cube_protocol::{Coord, NamespaceName};

    use crate::checkpoint::file::{CheckpointWriter, FileHeader, FileKind};
    use crate::checkpoint::manifest::{MANIFEST_NAME, delta_file_name};
    use crate::checkpoint::state_key::{StateUpdate, state_updates};
    use crate::curve::Curve;
    use crate::engine::{Engine, EngineConfig};
    use crate::mutation::Mutation;
    use crate::namespace::NamespaceMeta;
    use crate::storage::RealDisk;

    const HILBERT_ID: u64 = 7;
    const LSN: u64 = 40;

    /// A run file's read error keeps its offset and kind as a store error
    /// (the message a refused start or a failed fold reports).
    #[test]
    fn merge_due_rewrites_a_namespace_whole_as_it_doubles() {
        assert_eq!(super::merge_due(&[]), None);
        assert_eq!(super::merge_due(&[100]), None);
        assert_eq!(super::merge_due(&[99, 100]), None);
        assert_eq!(super::merge_due(&[100, 100]), Some(MergeScope::all(2)));
        assert_eq!(
            super::merge_due(&[30, 30, 40, 100]),
            Some(MergeScope::all(4))
        );
    }

    #[test]
    fn merge_due_merges_four_runs_of_like_size_in_their_place() {
        let scope = |start, end| Some(MergeScope { start, end });
        // Three like runs wait for a fourth.
        assert_eq!(super::merge_due(&[10, 10, 10, 1000]), None);
        assert_eq!(super::merge_due(&[10, 10, 10, 10, 1000]), scope(0, 4));
        // A run larger than the newer ones together ends the window.
        assert_eq!(super::merge_due(&[10, 10, 10, 40, 1000]), None);
        assert_eq!(super::merge_due(&[10, 10, 10, 10, 40, 1000]), scope(0, 5));
        // A small newest run does not hold back like runs behind it.
        assert_eq!(super::merge_due(&[1, 10, 10, 10, 10, 1000]), scope(1, 5));
        // The newest window that qualifies.
        assert_eq!(
            super::merge_due(&[5, 5, 5, 5, 100, 100, 100, 100, 10_000]),
            scope(0, 4)
        );
    }

    #[test]
    fn merge_due_bounds_the_runs_whatever_their_sizes() {
        // Each run twice the next newer: no like sizes, never a window.
        let growing: Vec<u64> = (0..11).map(|i| 1u64 << i).chain([1 << 40]).collect();
        assert_eq!(growing.len(), super::MAX_UNMERGED_RUNS);
        assert_eq!(super::merge_due(&growing), None);
        let more: Vec<u64> = (0..12).map(|i| 1u64 << i).chain([1 << 40]).collect();
        assert_eq!(
            super::merge_due(&more),
            Some(MergeScope { start: 0, end: 12 })
        );
        assert_eq!(MergeScope::all(3).window(), 0..3);
        assert!(MergeScope { start: 1, end: 3 }.reaches_oldest(3));
        assert!(!MergeScope { start: 0, end: 2 }.reaches_oldest(3));
    }

    #[test]
    fn a_run_file_io_error_names_its_file_and_offset() {
        let e = crate::StoreError::from(crate::run_file::RunFileError::Io {
            path: Path::new("/data/checkpoint/run-7").to_path_buf(),
            offset: 4096,
            source: std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
        });
        let crate::StoreError::Io { source, .. } = &e else {
            panic!("not an I/O error: {e}");
        };
        assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof);
        let message = e.to_string();
        assert!(
            message.contains("/data/checkpoint/run-7") && message.contains("offset 4096"),
            "{message}"
        );
    }

    fn coord(i: i32) -> Coord {
        Coord::new(i * 3 - 20, i % 5, -i)
    }

    fn value(i: i32) -> Vec<u8> {
        format!("cell {i}").into_bytes()
    }

    /// A data dir as the release before run files wrote it: a version-1
    /// manifest naming one delta that holds a Hilbert namespace and its
    /// cells (keyed by Morton key, as checkpoint files are).
    fn write_version_1_dir(data: &Path) {
        fs::DirBuilder::new().mode(0o700).create(data).unwrap();
        let checkpoint = data.join("checkpoint");
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&checkpoint)
            .unwrap();
        let ns = NamespaceName::new("hilbert").unwrap();
        let mut meta = NamespaceMeta::implicit_default(0);
        meta.id = HILBERT_ID;
        meta.curve = Curve::Hilbert;
        let mut entries: Vec<StateUpdate> = Vec::new();
        state_updates(
            &Mutation::NamespaceCreate {
                ns: ns.clone(),
                meta,
            },
            HILBERT_ID,
            &mut entries,
        );
        for i in 0..30 {
            let put = Mutation::Put {
                ns: ns.clone(),
                coord: coord(i),
                value: value(i),
            };
            state_updates(&put, HILBERT_ID, &mut entries);
        }
        entries.sort();
        let header = FileHeader {
            kind: FileKind::Delta,
            file_id: 1,
            lsn_from: 1,
            lsn_to: LSN,
            authenticated: false,
        };
        let path = checkpoint.join(delta_file_name(1));
        let mut writer = CheckpointWriter::create(&RealDisk, &path, header, None, None).unwrap();
        for (key, value) in &entries {
            writer.add(key, value.as_deref()).unwrap();
        }
        writer.finish().unwrap();
        let mut manifest = b"CUBEMANI".to_vec();
        manifest.extend_from_slice(&1u32.to_le_bytes());
        manifest.extend_from_slice(&LSN.to_le_bytes());
        manifest.extend_from_slice(&2u64.to_le_bytes());
        manifest.extend_from_slice(&0u64.to_le_bytes());
        manifest.extend_from_slice(&1u32.to_le_bytes());
        manifest.extend_from_slice(&1u64.to_le_bytes());
        let crc = crc32c::crc32c(&manifest);
        manifest.extend_from_slice(&crc.to_le_bytes());
        let manifest_path = checkpoint.join(MANIFEST_NAME);
        fs::write(&manifest_path, &manifest).unwrap();
        fs::set_permissions(&manifest_path, fs::Permissions::from_mode(0o600)).unwrap();
    }

    fn assert_cells(engine: &Engine) {
        let ns = NamespaceName::new("hilbert").unwrap();
        for i in 0..30 {
            let got = engine
                .get(&ns, coord(i))
                .unwrap()
                .unwrap()
                .map(|v| v.to_vec());
            assert_eq!(got, Some(value(i)), "cell {i}");
        }
        assert_eq!(engine.memstore().namespace_usage(&ns).unwrap().cells, 30);
    }

    /// A version-1 data dir's Hilbert namespace: its cells load from the
    /// checkpoint file, and the next compaction writes them as one run in
    /// Hilbert order (the writer refuses keys out of order) that a restart
    /// loads back.
    #[test]
    fn a_version_1_hilbert_namespace_becomes_one_run_in_its_curve_order() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        write_version_1_dir(&data);
        let engine = Engine::open(EngineConfig::new(&data)).unwrap();
        assert_cells(&engine);
        engine.compact().unwrap();
        engine.shutdown().unwrap();
        drop(engine);
        let runs: Vec<_> = fs::read_dir(data.join("checkpoint"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".run"))
            .collect();
        assert_eq!(runs.len(), 1, "{runs:?}");
        let manifest = fs::read(data.join("checkpoint").join(MANIFEST_NAME)).unwrap();
        assert_eq!(manifest[8..12], 3u32.to_le_bytes());
        let engine = Engine::open(EngineConfig::new(&data)).unwrap();
        assert_cells(&engine);
        engine.close_without_checkpoint();
    }
}
