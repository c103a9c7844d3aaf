//! Checkpoints: base + delta files for the non-cell state and run files for
//! each namespace's cells, so that a restart loads sorted state at disk
//! speed and replays only the WAL tail, and so that the log does not grow
//! forever.
//!
//! - **fold**: closed WAL segments (the writer has moved past them and
//!   synced them) are read from disk, folded last-write-wins into a sorted
//!   **delta** file (namespaces, edges, programs, telemetry) and one new
//!   **run** per namespace for its cells ([`runs`]), the manifest is
//!   switched to include them, and the segments are removed. The writer is
//!   never blocked and the live store is never snapshotted: only what is
//!   already durable is read.
//! - **compact**: when the deltas outgrow `delta_compact_bytes` (or half
//!   the base, whichever is larger), base + deltas are merged into a new
//!   **base**, dropping tombstones; a namespace's runs are merged into one
//!   when they grow many ([`runs`]).
//!
//! Every step is crash-safe because nothing is removed until the manifest
//! that no longer needs it is durable; recovery deletes files the manifest
//! does not name and WAL segments wholly below `checkpoint_lsn`.
//! Formats: [`file`], [`manifest`], [`state_key`]; `docs/storage-format.md`.

pub(crate) mod backup;
pub(crate) mod checkpointer;
pub(crate) mod file;
mod fold;
pub(crate) mod manifest;
mod merge_job;
mod merge_worker;
mod runs;
pub(crate) mod state_key;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cell_value::CellValue;
use crate::crypto::Keyring;
use crate::crypto::{DIR_ID_BYTES, MAC_BYTES, new_dir_id};
use crate::curve::{Curve, morton_decode};
use crate::data_dir::sync_dir;
use crate::error::StoreError;
use crate::memstore::SortedCells;
use crate::mutation::Mutation;
use crate::namespace::{NamespaceCatalog, check_namespace_key};
use crate::run_file::BlockCache;
use crate::storage::Storage;
use crate::wal::chain::ChainState;
use crate::wal::recovery::ChainAnchor;
use crate::wal::sealing_rule::{check_meta_change, must_seal};
use crate::wal::{list_segments, read_closed_segment};
use cube_protocol::NamespaceName;
use file::{
    BlockSealer, CheckpointReader, CheckpointWriter, Entry, FileAuth, FileHeader, FileKind,
    ReadAuth, file_mac,
};
use fold::Fold;
use manifest::{MAX_DELTAS, Manifest, ManifestAuth, base_file_name, delta_file_name};
pub use merge_job::MergeHold;
use merge_worker::MergeWorker;
use runs::{FoldedCells, MergeWhen};
use state_key::{TAG_NAMESPACE, cell_key_parts, entry_ns_id, entry_to_mutation, namespace_key};

#[derive(Clone, Debug)]
pub struct CheckpointConfig {
    /// Fold closed WAL segments once they hold this many bytes.
    pub checkpoint_wal_bytes: u64,
    /// Merge deltas into a new base once they hold more than this many
    /// bytes, or more than half the base, whichever is larger.
    pub delta_compact_bytes: u64,
    /// How often the checkpointer looks at the WAL size.
    pub poll_interval: Duration,
    /// Test hook: stop the protocol at this step as a crash would.
    #[doc(hidden)]
    pub crash_at: Option<CrashPoint>,
    /// Test hook: holds each merge job after its first entry.
    #[doc(hidden)]
    pub merge_hold: Option<MergeHold>,
    /// Test hook: a fold waits for the merges it starts (still run on the
    /// merge thread, installed as ever), so that a simulated disk sees one
    /// order of I/O and `make sim` replays a seed.
    #[doc(hidden)]
    pub wait_for_merges: bool,
}

impl Default for CheckpointConfig {
    fn default() -> CheckpointConfig {
        CheckpointConfig {
            checkpoint_wal_bytes: 64 * 1024 * 1024,
            delta_compact_bytes: 64 * 1024 * 1024,
            poll_interval: Duration::from_millis(200),
            crash_at: None,
            merge_hold: None,
            wait_for_merges: false,
        }
    }
}

/// The steps of the checkpoint and compaction protocols at which a crash is
/// simulated by the model test. A fold writes its runs (`Run*`), then its
/// delta (`Delta*`, whose manifest switch lists both); a compaction writes
/// a base (`Base*`), then merges runs (`Merge*`, `OldRunsPartlyRemoved`,
/// which a fold that drops a namespace's runs also passes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    RunTempWritten,
    RunRenamed,
    DeltaTempWritten,
    DeltaRenamed,
    DeltaManifestSwitched,
    SegmentsPartlyRemoved,
    BaseTempWritten,
    BaseRenamed,
    BaseManifestSwitched,
    OldFilesPartlyRemoved,
    MergeTempWritten,
    MergeRenamed,
    MergeManifestSwitched,
    OldRunsPartlyRemoved,
}

impl CrashPoint {
    pub const ALL: [CrashPoint; 14] = [
        CrashPoint::RunTempWritten,
        CrashPoint::RunRenamed,
        CrashPoint::DeltaTempWritten,
        CrashPoint::DeltaRenamed,
        CrashPoint::DeltaManifestSwitched,
        CrashPoint::SegmentsPartlyRemoved,
        CrashPoint::BaseTempWritten,
        CrashPoint::BaseRenamed,
        CrashPoint::BaseManifestSwitched,
        CrashPoint::OldFilesPartlyRemoved,
        CrashPoint::MergeTempWritten,
        CrashPoint::MergeRenamed,
        CrashPoint::MergeManifestSwitched,
        CrashPoint::OldRunsPartlyRemoved,
    ];
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointReport {
    pub segments_folded: usize,
    pub records_folded: u64,
    pub entries_written: u64,
    /// Namespaces written by the fold whose counts came from the writer's
    /// mark at the fold's last record (`crate::count_marks`); the others'
    /// were moved by looking their folded keys up in their older runs.
    pub namespaces_counted_by_writer: usize,
    pub delta_bytes: u64,
    pub checkpoint_lsn: u64,
    pub compaction: Option<CompactionReport>,
    pub duration: Duration,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactionReport {
    /// Checkpoint files merged into a new base.
    pub files_merged: usize,
    /// Run files merged (each namespace's into one).
    pub runs_merged: usize,
    pub entries_written: u64,
    pub base_bytes: u64,
    pub duration: Duration,
}

/// One namespace's base cells, in Morton order, on their way to the store.
type NamespaceRun = (u64, NamespaceName, SortedCells);

/// A version-1/2 data dir's cells, met in Morton order while compacting its
/// checkpoint files: the namespace, and its cells by curve key.
type LegacyCells = Option<(u64, Vec<(u128, Vec<u8>)>)>;

/// The checkpoint files of one data dir and the protocol that changes them.
pub(crate) struct CheckpointStore {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    wal_dir: PathBuf,
    manifest: Manifest,
    pub(crate) config: CheckpointConfig,
    /// The namespaces as of `manifest.checkpoint_lsn` (set by `load`, moved
    /// forward by each fold).
    catalog: NamespaceCatalog,
    keyring: Option<Arc<Keyring>>,
    /// Set when storing a manifest failed. The rename may or may not have
    /// happened, so `manifest` may no longer match the disk: a later fold
    /// would reuse a file id the disk's manifest names. No more folds,
    /// compactions or backups until a restart reads the manifest again
    /// (the WAL keeps every write meanwhile).
    manifest_failure: Option<String>,
    /// Why the authenticated manifest's tag did not verify (wrong key or
    /// tampering), reported at the end of `load`.
    bad_tag: Option<String>,
    /// The id drawn for a data dir being authenticated for the first time.
    new_dir_id: Option<[u8; DIR_ID_BYTES]>,
    /// The checkpointer's block cache, for the runs it reads.
    run_cache: Arc<BlockCache>,
    /// The daemon's cells, whose namespaces on disk read the runs each
    /// manifest switch lists (`CheckpointStore::publish_runs`); `None`
    /// offline and in model tests.
    serving: Option<Arc<crate::memstore::MemStore>>,
    /// Where merges in flight are counted (the daemon's stats).
    pub(crate) merges_in_flight: Option<Arc<crate::stats::StoreStats>>,
    /// Who runs the merges a fold finds due.
    merges: Merges,
}

/// Who runs the merges a fold finds due (`CheckpointStore::compact_if_needed`).
enum Merges {
    /// The fold itself, before it returns (offline, model tests).
    Inline,
    /// The merge threads, while the checkpointer goes on folding
    /// (the daemon); the checkpointer installs what it wrote.
    Background(Box<MergeWorker>),
    /// Nobody: the merge thread has stopped (shutdown), so a final fold
    /// does not wait on a merge that the next start can do.
    Deferred,
}

impl CheckpointStore {
    /// Reads the manifest and deletes what a crash left unreferenced.
    pub(crate) fn open(
        storage: Arc<dyn Storage>,
        dir: &Path,
        wal_dir: &Path,
        config: CheckpointConfig,
        keyring: Option<Arc<Keyring>>,
    ) -> Result<CheckpointStore, StoreError> {
        let (manifest, bad_tag) = Manifest::load(storage.as_ref(), dir, keyring.as_deref())?;
        let has_key = keyring.as_ref().is_some_and(|k| k.has_key());
        // A crash between the manifest's rename and the directory's fsync
        // leaves a rename that this start can read but a power loss could
        // still undo. Recovery is about to delete what this manifest no
        // longer needs (files here, WAL segments it covers), so make the
        // rename durable first: the deletions must never outlive it.
        if storage.file_len(&dir.join(manifest::MANIFEST_NAME)).is_ok() {
            sync_dir(storage.as_ref(), dir)?;
        }
        // Only a manifest that is known good may decide what to delete: a
        // forged one naming no file must not make cubed remove them all.
        let trusted = bad_tag.is_none() && (manifest.auth.is_none() || has_key);
        if trusted {
            manifest.remove_unreferenced(storage.as_ref(), dir)?;
        }
        Ok(CheckpointStore {
            run_cache: CheckpointStore::new_run_cache(),
            storage,
            dir: dir.to_path_buf(),
            wal_dir: wal_dir.to_path_buf(),
            manifest,
            config,
            catalog: NamespaceCatalog::with_implicit_default(),
            keyring,
            manifest_failure: None,
            bad_tag,
            new_dir_id: None,
            serving: None,
            merges_in_flight: None,
            merges: Merges::Inline,
        })
    }

    /// How a reader checks file `id`: against the authenticated manifest's
    /// MAC for it (not when the manifest's own tag failed: that is
    /// reported instead, at the end of `load`).
    fn read_auth(&self, id: u64) -> Option<ReadAuth<'_>> {
        let auth = self.manifest.auth.as_ref()?;
        Some(ReadAuth {
            keyring: self.keyring.as_deref().filter(|_| self.bad_tag.is_none()),
            dir_id: auth.dir_id,
            mac: self.manifest.file_mac(id).unwrap_or([0; MAC_BYTES]),
        })
    }

    /// Where the log's chain must continue from: the authenticated
    /// manifest's chain value at its checkpoint LSN.
    pub(crate) fn chain_anchor(&self) -> ChainAnchor {
        let Some(auth) = &self.manifest.auth else {
            return ChainAnchor::default();
        };
        ChainAnchor {
            at: Some((
                self.manifest.checkpoint_lsn,
                ChainState {
                    dir_id: auth.dir_id,
                    prev: auth.chain,
                },
            )),
            key_confirmed: self.bad_tag.is_none()
                && self.keyring.as_ref().is_some_and(|k| k.has_key()),
        }
    }

    /// Takes the data dir id a chained log carries, when the manifest has
    /// none yet (a data dir whose first fold has not happened).
    pub(crate) fn adopt_dir_id(&mut self, dir_id: [u8; DIR_ID_BYTES]) {
        if self.manifest.auth.is_none() {
            self.new_dir_id = Some(dir_id);
        }
    }

    /// The data dir id new files are bound to, when there is a key. A data
    /// dir not yet authenticated gets its id here (kept until the manifest
    /// that carries it is stored).
    pub(crate) fn writing_dir_id(&mut self) -> Result<Option<[u8; DIR_ID_BYTES]>, StoreError> {
        if !self.keyring.as_ref().is_some_and(|k| k.has_key()) {
            return Ok(None);
        }
        if let Some(auth) = &self.manifest.auth {
            return Ok(Some(auth.dir_id));
        }
        let id = match self.new_dir_id {
            Some(id) => id,
            None => new_dir_id().map_err(|e| StoreError::Key(e.to_string()))?,
        };
        self.new_dir_id = Some(id);
        Ok(Some(id))
    }

    /// `next`, authenticated when there is a key: the data dir's id, the
    /// chain value, and a MAC for every file it lists (`written`: the one
    /// just written; files from before the data dir was authenticated are
    /// hashed as they are, once).
    fn authenticate(
        &self,
        mut next: Manifest,
        written: Option<(u64, [u8; MAC_BYTES])>,
    ) -> Result<Manifest, StoreError> {
        let Some(keyring) = self.keyring.as_deref().filter(|k| k.has_key()) else {
            return Ok(next);
        };
        let mut auth = match (&self.manifest.auth, self.new_dir_id) {
            (Some(auth), _) => auth.clone(),
            (None, Some(dir_id)) => ManifestAuth {
                dir_id,
                chain: [0; MAC_BYTES],
                file_macs: Default::default(),
            },
            (None, None) => return Err(StoreError::Key("no data dir id drawn".into())),
        };
        if let Some((id, mac)) = written {
            auth.file_macs.insert(id, mac);
        }
        let listed = next.file_ids();
        auth.file_macs.retain(|id, _| listed.contains(id));
        for (id, path) in listed.iter().zip(next.files(&self.dir)) {
            if !auth.file_macs.contains_key(id) {
                let file_auth = FileAuth {
                    keyring,
                    dir_id: auth.dir_id,
                };
                let mac = file_mac(self.storage.as_ref(), &path, &file_auth)?;
                auth.file_macs.insert(*id, mac);
            }
        }
        next.auth = Some(auth);
        Ok(next)
    }

    /// What to seal: every encrypted namespace in `catalog` plus `extra`.
    fn sealer<'k>(
        keyring: Option<&'k Keyring>,
        catalog: &NamespaceCatalog,
        extra: impl IntoIterator<Item = u64>,
    ) -> Option<BlockSealer<'k>> {
        let keyring = keyring?;
        let mut encrypted_ids: std::collections::HashSet<u64> = catalog
            .iter()
            .filter(|(_, meta)| must_seal(meta))
            .map(|(_, meta)| meta.id)
            .collect();
        encrypted_ids.extend(extra);
        (!encrypted_ids.is_empty()).then_some(BlockSealer {
            keyring,
            encrypted_ids,
        })
    }

    pub(crate) fn storage(&self) -> &dyn Storage {
        self.storage.as_ref()
    }

    pub(crate) fn checkpoint_lsn(&self) -> u64 {
        self.manifest.checkpoint_lsn
    }

    /// Bytes of the base and of all deltas, each namespace's oldest run
    /// counted with the base and its newer runs with the deltas.
    pub(crate) fn sizes(&self) -> (u64, u64) {
        let (files_base, files_deltas) = self.file_sizes();
        let (runs_base, runs_deltas) = self.run_sizes();
        (files_base + runs_base, files_deltas + runs_deltas)
    }

    /// Bytes of the base checkpoint file and of the delta files.
    fn file_sizes(&self) -> (u64, u64) {
        let size = |path: &Path| self.storage.file_len(path).unwrap_or(0);
        let base = self
            .manifest
            .base_file_id
            .map_or(0, |id| size(&self.dir.join(base_file_name(id))));
        let deltas = self
            .manifest
            .delta_file_ids
            .iter()
            .map(|id| size(&self.dir.join(delta_file_name(*id))))
            .sum();
        (base, deltas)
    }

    pub(crate) fn delta_count(&self) -> usize {
        self.manifest.delta_file_ids.len()
    }

    /// The kind of file the manifest expects as its `i`-th (a base first
    /// if it names one), checked against the file's header; the last file
    /// must also reach the manifest's `checkpoint_lsn`.
    fn check_file_header(
        &self,
        path: &Path,
        header: &FileHeader,
        i: usize,
        is_last: bool,
    ) -> Result<FileKind, StoreError> {
        let expected_kind = if i == 0 && self.manifest.base_file_id.is_some() {
            FileKind::Base
        } else {
            FileKind::Delta
        };
        let lsn = self.manifest.checkpoint_lsn;
        if header.kind != expected_kind || (is_last && header.lsn_to != lsn) {
            return Err(StoreError::Corruption {
                path: path.to_path_buf(),
                offset: 0,
                reason: format!(
                    "file is a {:?} reaching LSN {}, but the manifest expects a {expected_kind:?}{}",
                    header.kind,
                    header.lsn_to,
                    if is_last {
                        format!(" reaching LSN {lsn}")
                    } else {
                        String::new()
                    }
                ),
            });
        }
        Ok(expected_kind)
    }

    /// Streams base then deltas into the store: the base's cells, already in
    /// Morton order per namespace, go to `bulk_cells` a namespace at a time
    /// (no per-cell decode into a `Mutation`); everything else goes to
    /// `apply` as mutations, namespace entries first (they sort first in
    /// every file). Entries of namespaces that are no longer live are
    /// skipped. Every block's checksum is verified (and every sealed
    /// block's tag); a damaged file is an error with file and offset.
    pub(crate) fn load(
        &mut self,
        mut apply: impl FnMut(Mutation),
        mut bulk_cells: impl FnMut(&NamespaceName, SortedCells),
    ) -> Result<u64, StoreError> {
        let mut entries = 0;
        let files = self.manifest.files(&self.dir);
        let last = files.len().saturating_sub(1);
        let mut catalog = NamespaceCatalog::with_implicit_default();
        if self.manifest.base_file_id.is_some() {
            // A base names every live namespace, `default` included.
            if let Ok(default) = NamespaceName::new("default") {
                catalog.apply(&Mutation::NamespaceDrop {
                    ns: default.clone(),
                });
                apply(Mutation::NamespaceDrop { ns: default });
            }
        }
        let keyring = self.keyring.as_deref();
        let ids = self.manifest.file_ids();
        for (i, path) in files.iter().enumerate() {
            let mut reader = CheckpointReader::open(
                self.storage.as_ref(),
                path,
                keyring,
                self.read_auth(ids[i]),
            )?;
            let expected_kind = self.check_file_header(path, &reader.header, i, i == last)?;
            let file = FileLoad {
                path,
                catalog: &mut catalog,
                keyring,
                is_base: expected_kind == FileKind::Base,
                legacy_cells: self.manifest.legacy_cells,
                run: None,
                failure: None,
                entries: 0,
            };
            entries += file.read(&mut reader, &mut apply, &mut bulk_cells)?;
        }
        self.check_loaded_auth()?;
        self.catalog = catalog;
        Ok(entries)
    }

    /// Refuses a load whose authenticated manifest's tag did not verify, or
    /// that had no key for it.
    fn check_loaded_auth(&self) -> Result<(), StoreError> {
        if let Some(reason) = &self.bad_tag {
            return Err(StoreError::Key(format!(
                "{}: {reason}",
                self.dir.join(manifest::MANIFEST_NAME).display()
            )));
        }
        if self.manifest.auth.is_some() && !self.keyring.as_deref().is_some_and(Keyring::has_key) {
            return Err(StoreError::Key(format!(
                "{} is authenticated with a master key (its checkpoint files and log are bound \
                 to this data dir); start cubed with --key-file PATH (the key it was written with)",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// Refuses to go on after a manifest store failed (`manifest_failure`).
    pub(crate) fn check_usable(&self) -> Result<(), StoreError> {
        match &self.manifest_failure {
            Some(reason) => Err(StoreError::WritesDisabled(format!(
                "checkpoints are off until cubed restarts, since storing the manifest failed: {reason}"
            ))),
            None => Ok(()),
        }
    }

    /// Stores `next` as the manifest and makes it the current one; on
    /// failure latches the store (`manifest_failure`).
    fn switch_manifest(&mut self, next: Manifest) -> Result<(), StoreError> {
        if let Err(e) = next.store(self.storage.as_ref(), &self.dir, self.keyring.as_deref()) {
            self.manifest_failure = Some(e.to_string());
            return Err(e);
        }
        self.manifest = next;
        Ok(())
    }

    fn crash_check(&self, point: CrashPoint) -> Result<(), StoreError> {
        if self.config.crash_at == Some(point) {
            return Err(StoreError::SimulatedCrash(format!("{point:?}")));
        }
        Ok(())
    }

    /// Bytes in WAL segments that start below `boundary` (closed ones).
    pub(crate) fn closed_wal_bytes(&self, boundary: u64) -> Result<u64, StoreError> {
        let mut total = 0;
        for (first, path) in list_segments(self.storage.as_ref(), &self.wal_dir, false)? {
            if first < boundary {
                total += self.storage.file_len(&path).unwrap_or(0);
            }
        }
        Ok(total)
    }

    /// Folds every segment that starts below `boundary` (all of them must be
    /// closed: synced, and never written again) into a new delta.
    pub(crate) fn fold(&mut self, boundary: u64) -> Result<Option<CheckpointReport>, StoreError> {
        self.check_usable()?;
        let started = Instant::now();
        let closed: Vec<(u64, PathBuf)> =
            list_segments(self.storage.as_ref(), &self.wal_dir, false)?
                .into_iter()
                .filter(|(first, _)| *first < boundary)
                .collect();
        if closed.is_empty() {
            return Ok(None);
        }
        // Cells still in checkpoint files (a version-1/2 data dir), or
        // plain runs in a data dir now given a key, are rewritten first:
        // a version-3 manifest lists neither.
        let rewritten = if self.needs_rewrite() {
            Some(self.compact()?)
        } else {
            None
        };
        let from_lsn = self.manifest.checkpoint_lsn + 1;
        let mut fold = Fold::new(from_lsn, &self.catalog);
        let keyring = self.keyring.clone();
        for (_, path) in &closed {
            read_closed_segment(
                self.storage.as_ref(),
                path,
                keyring.as_deref(),
                |lsn, record| fold.record(path, lsn, record),
            )?;
        }
        fold.refuse_damage()?;
        let mut report = CheckpointReport {
            segments_folded: closed.len(),
            records_folded: fold.records,
            checkpoint_lsn: fold.last_lsn(),
            ..CheckpointReport::default()
        };
        if fold.records > 0 {
            self.write_delta(fold, from_lsn, keyring.as_deref(), &mut report)?;
        }
        self.remove_folded(&closed)?;
        // A merge the fold waited for (`make_room_for_runs`) is reported
        // when nothing later is.
        let merged_first = report.compaction.take();
        report.compaction = self.compact_if_needed()?.or(rewritten).or(merged_first);
        report.duration = started.elapsed();
        Ok(Some(report))
    }

    /// Writes what `fold` gathered (records `from_lsn` on) as new runs
    /// (its cells) and the next delta file (the rest), and switches the
    /// manifest to them.
    fn write_delta(
        &mut self,
        mut fold: Fold,
        from_lsn: u64,
        keyring: Option<&Keyring>,
        report: &mut CheckpointReport,
    ) -> Result<(), StoreError> {
        let lsn_to = fold.last_lsn();
        let cells = fold.cells_by_namespace();
        let Fold {
            folded: state,
            catalog,
            encrypted_ids,
            chain,
            ..
        } = fold;
        if let Some(merged) = self.make_room_for_fold(&catalog, &cells)? {
            report.compaction = Some(merged);
        }
        let mut next = self.manifest.clone();
        next.checkpoint_lsn = lsn_to;
        let marked = self
            .serving
            .as_ref()
            .and_then(|mem| mem.take_count_mark(lsn_to));
        let folded = self.write_fold_runs(&catalog, cells, marked, &mut next)?;
        report.entries_written = folded.entries;
        report.namespaces_counted_by_writer = folded.counted_by_writer;
        let sealer = Self::sealer(keyring, &catalog, encrypted_ids);
        let (id, mac) = self.write_delta_file(
            &mut next,
            from_lsn,
            &state,
            sealer.as_ref(),
            keyring,
            report,
        )?;
        self.crash_check(CrashPoint::DeltaRenamed)?;
        // A namespace dropped during the fold: its runs go with it.
        let gone = Self::drop_gone_namespaces(&catalog, &mut next);
        let mut next = self.authenticate(next, mac.map(|mac| (id, mac)))?;
        if let (Some(auth), Some(chain)) = (next.auth.as_mut(), chain) {
            auth.chain = chain;
        }
        self.switch_manifest(next)?;
        self.catalog = catalog;
        self.publish_runs();
        self.crash_check(CrashPoint::DeltaManifestSwitched)?;
        self.remove_runs(&gone)
    }

    /// Before a fold's runs are written: a merge reading a namespace the
    /// fold drops is cancelled (or, finished, installed), so the fold then
    /// removes the runs it read; and namespaces with too many runs for one
    /// more are merged first. What was merged, if anything.
    fn make_room_for_fold(
        &mut self,
        catalog: &NamespaceCatalog,
        cells: &BTreeMap<u64, FoldedCells>,
    ) -> Result<Option<CompactionReport>, StoreError> {
        let dropping =
            self.manifest.namespaces.iter().any(|entry| {
                catalog.meta_of(entry.ns_id).is_none() && self.merge_reads(entry.ns_id)
            });
        if dropping {
            let mut merged = CompactionReport::default();
            self.settle_merge(true, &mut merged)?;
        }
        let folded_ids: Vec<u64> = cells.keys().copied().collect();
        let mut merged = CompactionReport::default();
        self.make_room_for_runs(&folded_ids, &mut merged)?;
        Ok((merged.runs_merged > 0).then_some(merged))
    }

    /// Writes the fold's other state (`state`: namespaces, edges,
    /// programs) as the next delta file, numbered in `next`. Its id and,
    /// authenticated, its MAC.
    fn write_delta_file(
        &mut self,
        next: &mut Manifest,
        from_lsn: u64,
        state: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        sealer: Option<&BlockSealer<'_>>,
        keyring: Option<&Keyring>,
        report: &mut CheckpointReport,
    ) -> Result<(u64, Option<[u8; MAC_BYTES]>), StoreError> {
        let id = next.next_file_id;
        next.next_file_id = id + 1;
        next.delta_file_ids.push(id);
        let path = self.dir.join(delta_file_name(id));
        let header = FileHeader {
            kind: FileKind::Delta,
            file_id: id,
            lsn_from: from_lsn,
            lsn_to: next.checkpoint_lsn,
            authenticated: false,
        };
        let dir_id = self.writing_dir_id()?;
        let auth = keyring
            .zip(dir_id)
            .map(|(keyring, dir_id)| FileAuth { keyring, dir_id });
        let mut writer =
            CheckpointWriter::create(self.storage.as_ref(), &path, header, sealer, auth)?;
        for (key, value) in state {
            writer.add(key, value.as_deref())?;
        }
        report.entries_written += state.len() as u64;
        if self.config.crash_at == Some(CrashPoint::DeltaTempWritten) {
            // The temp file stays behind, as after a real crash.
            drop(writer);
            return Err(StoreError::SimulatedCrash("DeltaTempWritten".into()));
        }
        let (bytes, mac) = writer.finish()?;
        report.delta_bytes = bytes;
        Ok((id, mac))
    }

    /// Removes the folded segments (the manifest no longer needs them).
    fn remove_folded(&self, closed: &[(u64, PathBuf)]) -> Result<(), StoreError> {
        for (i, (_, path)) in closed.iter().enumerate() {
            if i == 1 {
                self.crash_check(CrashPoint::SegmentsPartlyRemoved)?;
            }
            self.storage
                .remove_file(path)
                .map_err(|e| StoreError::io(path, e))?;
        }
        sync_dir(self.storage.as_ref(), &self.wal_dir)
    }

    /// Whether the files must be rewritten before a fold stores a
    /// version-3 manifest: cells in checkpoint files (a version-1/2 data
    /// dir), or plain runs in a data dir being authenticated for the first
    /// time (its runs must carry a MAC).
    fn needs_rewrite(&self) -> bool {
        let authenticating =
            self.manifest.auth.is_none() && self.keyring.as_ref().is_some_and(|k| k.has_key());
        self.manifest.legacy_cells || (authenticating && !self.manifest.namespaces.is_empty())
    }

    /// Compacts when the deltas have grown past their allowance, and
    /// merges the runs of namespaces that have many.
    pub(crate) fn compact_if_needed(&mut self) -> Result<Option<CompactionReport>, StoreError> {
        let started = Instant::now();
        let (base, deltas) = self.file_sizes();
        let allowance = self.config.delta_compact_bytes.max(base / 2);
        let mut report = if self.manifest.delta_file_ids.is_empty()
            || (deltas <= allowance && self.manifest.delta_file_ids.len() < MAX_DELTAS)
        {
            None
        } else {
            Some(self.compact_files()?)
        };
        let mut merged = CompactionReport::default();
        match self.merges {
            Merges::Inline => self.merge_runs(MergeWhen::Due, &mut merged)?,
            Merges::Background(_) => {
                self.start_due_merge()?;
                if self.config.wait_for_merges {
                    self.drain_merges(&mut merged)?;
                }
            }
            Merges::Deferred => {}
        }
        if merged.runs_merged > 0 {
            let total = report.get_or_insert_with(CompactionReport::default);
            total.runs_merged += merged.runs_merged;
            total.entries_written += merged.entries_written;
            total.base_bytes += merged.base_bytes;
        }
        if let Some(report) = report.as_mut() {
            report.duration = started.elapsed();
        }
        Ok(report)
    }

    /// A full compaction: base + deltas into a new base (cells of a
    /// version-1/2 data dir into one run per namespace), then each
    /// namespace's runs into one.
    pub(crate) fn compact(&mut self) -> Result<CompactionReport, StoreError> {
        self.check_usable()?;
        let started = Instant::now();
        let mut report = CompactionReport::default();
        // A merge in flight is cancelled: this compaction rewrites what it
        // reads anyway, and waiting would write it twice. One that has
        // already finished is installed.
        self.settle_merge(true, &mut report)?;
        // Plain runs in a data dir being authenticated are rewritten with
        // MACs first, in the switch that authenticates the manifest: a
        // manifest switched by the base's compaction first would be
        // authenticated while listing plain runs, which no start reads.
        let rewrite_runs = self.needs_rewrite() && !self.manifest.legacy_cells;
        if rewrite_runs {
            self.merge_runs(MergeWhen::All, &mut report)?;
        }
        if !self.manifest.delta_file_ids.is_empty() || self.manifest.legacy_cells {
            let files = self.compact_files()?;
            report.files_merged = files.files_merged;
            report.entries_written += files.entries_written;
            report.base_bytes += files.base_bytes;
        }
        if !rewrite_runs {
            self.merge_runs(MergeWhen::ManyRuns, &mut report)?;
        }
        report.duration = started.elapsed();
        Ok(report)
    }

    /// Merges base + deltas into a new base (newest entry per key wins;
    /// tombstones are dropped because nothing older remains under them).
    /// A version-1/2 data dir's cells are written as one run per
    /// namespace instead.
    fn compact_files(&mut self) -> Result<CompactionReport, StoreError> {
        self.check_usable()?;
        let started = Instant::now();
        let inputs = self.manifest.files(&self.dir);
        let id = self.manifest.next_file_id;
        let path = self.dir.join(base_file_name(id));
        let header = FileHeader {
            kind: FileKind::Base,
            file_id: id,
            lsn_from: 1,
            lsn_to: self.manifest.checkpoint_lsn,
            authenticated: false,
        };
        let storage = Arc::clone(&self.storage);
        let keyring = self.keyring.clone();
        let sealer = Self::sealer(keyring.as_deref(), &self.catalog, []);
        let dir_id = self.writing_dir_id()?;
        let auth = keyring
            .as_deref()
            .zip(dir_id)
            .map(|(keyring, dir_id)| FileAuth { keyring, dir_id });
        let mut writer =
            CheckpointWriter::create(storage.as_ref(), &path, header, sealer.as_ref(), auth)?;
        let readers = self.open_inputs(storage.as_ref(), keyring.as_deref(), &inputs)?;
        // The catalog as of `checkpoint_lsn` is exactly the live namespaces:
        // write it first (namespace keys sort first), then keep only
        // entries of those namespaces' ids. That drops what dropped and
        // replaced namespaces left behind, and writes `default` explicitly.
        let mut entries = self.write_catalog(&mut writer)?;
        let catalog = self.catalog.clone();
        let mut next = Manifest {
            checkpoint_lsn: self.manifest.checkpoint_lsn,
            next_file_id: id + 1,
            base_file_id: Some(id),
            delta_file_ids: Vec::new(),
            auth: self.manifest.auth.clone(),
            namespaces: self.manifest.namespaces.clone(),
            legacy_cells: false,
        };
        entries += self.merge_into_base(readers, &catalog, &mut writer, &mut next)?;
        if self.config.crash_at == Some(CrashPoint::BaseTempWritten) {
            drop(writer);
            return Err(StoreError::SimulatedCrash("BaseTempWritten".into()));
        }
        let (base_bytes, mac) = writer.finish()?;
        self.crash_check(CrashPoint::BaseRenamed)?;
        let gone = Self::drop_gone_namespaces(&catalog, &mut next);
        let next = self.authenticate(next, mac.map(|mac| (id, mac)))?;
        self.install_base(next, &gone, &inputs)?;
        Ok(CompactionReport {
            files_merged: inputs.len(),
            runs_merged: 0,
            entries_written: entries,
            base_bytes,
            duration: started.elapsed(),
        })
    }

    /// A reader for each checkpoint file the manifest names (`inputs`,
    /// base first).
    fn open_inputs<'k>(
        &self,
        storage: &dyn Storage,
        keyring: Option<&'k Keyring>,
        inputs: &[PathBuf],
    ) -> Result<Vec<CheckpointReader<'k>>, StoreError> {
        let ids = self.manifest.file_ids();
        inputs
            .iter()
            .zip(&ids)
            .map(|(p, id)| CheckpointReader::open(storage, p, keyring, self.read_auth(*id)))
            .collect()
    }

    /// Writes the newest entry per key of `readers` to the new base, the
    /// entries of live namespaces only (`catalog`); a version-1/2 data
    /// dir's cells go to runs instead, which `next` lists. Returns how many
    /// entries were kept.
    fn merge_into_base(
        &mut self,
        readers: Vec<CheckpointReader<'_>>,
        catalog: &NamespaceCatalog,
        writer: &mut CheckpointWriter<'_>,
        next: &mut Manifest,
    ) -> Result<u64, StoreError> {
        let live = |key: &[u8]| {
            key.first() != Some(&TAG_NAMESPACE)
                && entry_ns_id(key).is_some_and(|id| catalog.meta_of(id).is_some())
        };
        let mut entries = 0;
        let mut legacy: LegacyCells = None;
        let mut merge = NewestWins::start(readers)?;
        while let Some((key, winner)) = merge.next_entry()? {
            if let Some(value) = winner
                && live(&key)
            {
                if let Some((ns_id, morton)) = cell_key_parts(&key) {
                    // Only a version-1/2 data dir's files hold cells.
                    if legacy.as_ref().is_none_or(|(id, _)| *id != ns_id) {
                        self.flush_legacy_cells(legacy.take(), next)?;
                        legacy = Some((ns_id, Vec::new()));
                    }
                    if let Some((_, cells)) = legacy.as_mut() {
                        let curve = catalog.meta_of(ns_id).map_or(Curve::DEFAULT, |m| m.curve);
                        cells.push((curve.key(morton_decode(morton)), value));
                    }
                } else {
                    writer.add(&key, Some(&value))?;
                }
                entries += 1;
            }
        }
        self.flush_legacy_cells(legacy.take(), next)?;
        Ok(entries)
    }
    /// Writes the catalog's namespace entries, in key order, to a new
    /// base; returns how many.
    fn write_catalog(&self, writer: &mut CheckpointWriter<'_>) -> Result<u64, StoreError> {
        let mut namespace_entries: Vec<(Vec<u8>, Vec<u8>)> = self
            .catalog
            .iter()
            .map(|(ns, meta)| {
                let mut value = Vec::with_capacity(meta.encoded_len());
                meta.encode(&mut value);
                (namespace_key(ns), value)
            })
            .collect();
        namespace_entries.sort();
        for (key, value) in &namespace_entries {
            writer.add(key, Some(value))?;
        }
        Ok(namespace_entries.len() as u64)
    }

    /// Makes a compaction's base current: switches to `next` (which names
    /// it), then removes the runs of dropped namespaces (`gone`) and the
    /// checkpoint files it replaced (`inputs`), and syncs the directory.
    fn install_base(
        &mut self,
        next: Manifest,
        gone: &[u64],
        inputs: &[PathBuf],
    ) -> Result<(), StoreError> {
        self.switch_manifest(next)?;
        self.publish_runs();
        self.crash_check(CrashPoint::BaseManifestSwitched)?;
        self.remove_runs(gone)?;
        for (i, old) in inputs.iter().enumerate() {
            if i == 1 {
                self.crash_check(CrashPoint::OldFilesPartlyRemoved)?;
            }
            self.storage
                .remove_file(old)
                .map_err(|e| StoreError::io(old, e))?;
        }
        sync_dir(self.storage.as_ref(), &self.dir)
    }

    /// Writes one namespace's cells met in a version-1/2 checkpoint file
    /// as its base run (sorted by its curve key first).
    fn flush_legacy_cells(
        &mut self,
        legacy: LegacyCells,
        next: &mut Manifest,
    ) -> Result<(), StoreError> {
        let Some((ns_id, mut cells)) = legacy else {
            return Ok(());
        };
        cells.sort_unstable_by_key(|(key, _)| *key);
        self.write_base_run(ns_id, &cells, next)
    }
}

/// One checkpoint file's entries on their way into the store
/// (`CheckpointStore::load`).
struct FileLoad<'a> {
    path: &'a Path,
    /// The namespaces as of the entries taken so far.
    catalog: &'a mut NamespaceCatalog,
    keyring: Option<&'a Keyring>,
    /// A base's cells go to the store a namespace at a time (`run`).
    is_base: bool,
    /// Cells are in checkpoint files (a version-1/2 manifest).
    legacy_cells: bool,
    /// The namespace whose base cells are being gathered, and them.
    run: Option<NamespaceRun>,
    /// The first problem met in an entry; the entries after it are skipped.
    failure: Option<StoreError>,
    entries: u64,
}

impl FileLoad<'_> {
    /// Takes every entry `reader` holds; returns how many it took.
    fn read(
        mut self,
        reader: &mut CheckpointReader<'_>,
        apply: &mut impl FnMut(Mutation),
        bulk_cells: &mut impl FnMut(&NamespaceName, SortedCells),
    ) -> Result<u64, StoreError> {
        let read = reader.for_each_entry(|key, value, sealed| {
            if self.failure.is_some() {
                return;
            }
            self.entries += 1;
            if let Err(e) = self.entry(key, value, sealed, apply, bulk_cells) {
                self.failure = Some(e);
            }
        });
        // A problem found in an entry (a key check that failed, say)
        // explains what the reader hit after it: report it first.
        if let Some(failure) = self.failure.take() {
            return Err(failure);
        }
        read?;
        if let Some((_, ns, cells)) = self.run.take() {
            bulk_cells(&ns, cells);
        }
        Ok(self.entries)
    }

    /// Takes one entry: a base's cell into `run`, anything else to `apply`
    /// as a mutation, once its sealing and its namespace check out.
    fn entry(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        sealed: bool,
        apply: &mut impl FnMut(Mutation),
        bulk_cells: &mut impl FnMut(&NamespaceName, SortedCells),
    ) -> Result<(), StoreError> {
        if let Some(reason) = seal_mismatch(self.catalog, key, sealed) {
            return Err(self.bad_entry(reason));
        }
        if !self.legacy_cells && cell_key_parts(key).is_some() {
            return Err(self.bad_entry(
                "a cell entry in a checkpoint file of a version-3 manifest, whose \
                 cells are in run files"
                    .into(),
            ));
        }
        if self.is_base
            && let (Some((ns_id, morton)), Some(value)) = (cell_key_parts(key), value)
        {
            self.base_cell(ns_id, morton, value, bulk_cells);
            return Ok(());
        }
        let name_of = |id: u64| self.catalog.name_of(id);
        let mutation = match entry_to_mutation(key, value.map(<[u8]>::to_vec), &name_of) {
            Ok(Some(mutation)) => mutation,
            Ok(None) => return Ok(()),
            Err(reason) => return Err(self.bad_entry(reason)),
        };
        if let Mutation::NamespaceCreate { ns, meta } = &mutation {
            check_namespace_key(ns, meta, self.keyring)?;
            // An entry for a namespace the earlier files hold, under the
            // same id, is an alter folded.
            if let Some(old) = self.catalog.get(ns)
                && let Err(reason) = check_meta_change(ns, old, meta, false)
            {
                return Err(self.bad_entry(reason));
            }
        }
        self.catalog.apply(&mutation);
        apply(mutation);
        Ok(())
    }

    /// Adds a base's cell to its namespace's run, handing the run before
    /// (another namespace's) to `bulk_cells`; a namespace that is no
    /// longer live gathers none.
    fn base_cell(
        &mut self,
        ns_id: u64,
        morton: u128,
        value: &[u8],
        bulk_cells: &mut impl FnMut(&NamespaceName, SortedCells),
    ) {
        if self.run.as_ref().is_none_or(|(id, _, _)| *id != ns_id) {
            if let Some((_, ns, cells)) = self.run.take() {
                bulk_cells(&ns, cells);
            }
            self.run = self
                .catalog
                .name_of(ns_id)
                .map(|ns| (ns_id, ns, SortedCells::default()));
        }
        if let Some((id, _, cells)) = self.run.as_mut()
            && *id == ns_id
        {
            cells.keys.push(morton);
            cells.values.push(CellValue::from(value));
            cells.value_bytes += value.len() as u64;
        }
    }

    /// A damaged entry of this file.
    fn bad_entry(&self, reason: String) -> StoreError {
        StoreError::Corruption {
            path: self.path.to_path_buf(),
            offset: 0,
            reason: format!("bad state entry: {reason}"),
        }
    }
}

/// Checkpoint files merged by key: each key once, with the value of the
/// newest file that holds it (`None`: a tombstone).
struct NewestWins<'k> {
    readers: Vec<CheckpointReader<'k>>,
    /// Min-heap on key; among equal keys the newest input (highest index) wins.
    heap: BinaryHeap<Reverse<(Vec<u8>, Reverse<usize>)>>,
    /// The value of each input's entry in `heap`.
    current: Vec<Option<Option<Vec<u8>>>>,
    /// The inputs whose entries the last key took: read on at the next
    /// call, so that the caller handles a key before the next is read.
    advance: Vec<usize>,
}

impl<'k> NewestWins<'k> {
    /// Reads each input's first entry.
    fn start(readers: Vec<CheckpointReader<'k>>) -> Result<NewestWins<'k>, StoreError> {
        let mut merge = NewestWins {
            heap: BinaryHeap::new(),
            current: vec![None; readers.len()],
            readers,
            advance: Vec::new(),
        };
        for i in 0..merge.readers.len() {
            merge.read_on(i)?;
        }
        Ok(merge)
    }

    /// The next key and its newest value, once the inputs the key before
    /// it took have been read on.
    fn next_entry(&mut self) -> Result<Option<Entry>, StoreError> {
        for i in std::mem::take(&mut self.advance) {
            self.read_on(i)?;
        }
        let Some(Reverse((key, Reverse(newest)))) = self.heap.pop() else {
            return Ok(None);
        };
        let winner = self.current[newest].take().flatten();
        self.advance.push(newest);
        while let Some(Reverse((next_key, _))) = self.heap.peek() {
            if *next_key != key {
                break;
            }
            if let Some(Reverse((_, Reverse(older)))) = self.heap.pop() {
                self.current[older] = None;
                self.advance.push(older);
            }
        }
        Ok(Some((key, winner)))
    }

    /// Reads input `i`'s next entry, if it has one, into the heap.
    fn read_on(&mut self, i: usize) -> Result<(), StoreError> {
        if let Some((key, value)) = self.readers[i].next_entry()? {
            self.current[i] = Some(value);
            self.heap.push(Reverse((key, Reverse(i))));
        }
        Ok(())
    }
}

/// Why a checkpoint entry's sealing disagrees with its namespace's
/// metadata, if it does: an entry is sealed exactly when its namespace is
/// encrypted (the namespace entries, tag 0x01, come first and are plain).
fn seal_mismatch(catalog: &NamespaceCatalog, key: &[u8], sealed: bool) -> Option<String> {
    let ns_id = entry_ns_id(key)?;
    let meta = catalog.meta_of(ns_id)?;
    if key.first() == Some(&TAG_NAMESPACE) || must_seal(meta) == sealed {
        return None;
    }
    let name = catalog
        .name_of(ns_id)
        .map(|n| n.as_str().to_owned())
        .unwrap_or_default();
    Some(if sealed {
        format!(
            "a sealed block of namespace {name:?}, whose metadata says it is not encrypted: \
             the metadata was altered"
        )
    } else {
        format!(
            "an unsealed entry of encrypted namespace {name:?}: cubed seals every block of it, \
             so this one was written by something else"
        )
    })
}
