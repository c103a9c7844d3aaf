//! The engine: a locked data dir, the recovered in-memory store, the writer
//! thread and the checkpointer, opened and closed as one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cube_protocol::{Coord, NamespaceName};

use crate::cell_value::CellValue;
use crate::checkpoint::backup::BackupReport;
use crate::checkpoint::checkpointer::{Checkpointer, record};
use crate::checkpoint::{CheckpointConfig, CheckpointReport, CheckpointStore};
use crate::crypto::{Keyring, load_key_file};
use crate::curve::Curve;
use crate::data_dir::DataDir;
use crate::data_dir::sync_dir;
use crate::disk_tier::TierConfig;
use crate::error::StoreError;
use crate::group_commit::{GroupCommit, GroupCommitConfig, WriteSession};
use crate::memstore::{MemStore, NamespaceMemo, lock};
use crate::mutation::Mutation;
use crate::stats::{StoreStats, StoreStatsSnapshot};
use crate::storage::{RealDisk, Storage};
use crate::wal::chain::ChainState;
use crate::wal::segment::WalSegment;
use crate::wal::{CrcSeed, SegmentSeeds};
use crate::wal::{RecoveryOptions, RecoveryReport, SealingRule, list_segments, recover_with};

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    /// The disk: [`RealDisk`] in production, a simulated one in fault tests.
    pub storage: Arc<dyn Storage>,
    pub group_commit: GroupCommitConfig,
    pub recovery: RecoveryOptions,
    pub checkpoint: CheckpointConfig,
    /// The master key for encrypted namespaces (`cubed --key-file`).
    pub key_file: Option<PathBuf>,
    /// Memory for cells: in memory, in the block cache, in memtables
    /// (`cubed --cache-bytes`, `--memtable-bytes`; `crate::disk_tier`).
    pub tiers: TierConfig,
}

impl EngineConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> EngineConfig {
        EngineConfig {
            data_dir: data_dir.into(),
            storage: Arc::new(RealDisk),
            group_commit: GroupCommitConfig::default(),
            recovery: RecoveryOptions::default(),
            checkpoint: CheckpointConfig::default(),
            key_file: None,
            tiers: TierConfig::all_in_memory(),
        }
    }
}

/// Recovery applies records in batches of this many, taking each
/// namespace's lock once per batch rather than once per record.
const RECOVERY_BATCH_RECORDS: usize = 4096;

/// What startup loaded from checkpoint files.
#[derive(Clone, Debug, Default)]
pub struct CheckpointLoad {
    pub entries: u64,
    pub checkpoint_lsn: u64,
    pub base_bytes: u64,
    pub delta_bytes: u64,
    pub delta_files: usize,
    pub duration: Duration,
}

pub struct Engine {
    storage: Arc<dyn Storage>,
    data_dir: DataDir,
    mem: Arc<MemStore>,
    stats: Arc<StoreStats>,
    writer: GroupCommit,
    checkpointer: Mutex<Checkpointer>,
    checkpoint_load: CheckpointLoad,
    recovery: RecoveryReport,
    /// For reading sealed history back (`read_history`).
    keyring: Option<Arc<Keyring>>,
}

/// Applies replayed mutations to the store in batches. Cell puts and
/// deletes (nearly all of a log) are not applied one by one: they are
/// buffered per namespace, sorted, and merged into the namespace's sorted
/// base in one pass (`CellMap::apply_sorted`), which is several times
/// cheaper than a tree insert each. Nothing reads the store yet, so only
/// the final state matters, and order is kept where it matters: a detach
/// (which deletes a cell) and namespace changes flush the cell buffers
/// first; links, programs and telemetry touch no cell.
struct BatchApplier<'a> {
    mem: &'a MemStore,
    batch: Vec<Mutation>,
    existed: Vec<bool>,
    /// The LSN of the last record pushed (0 for a checkpoint's records,
    /// which the runs hold): what buffered writes are tagged with.
    lsn: u64,
    /// Per namespace: its curve and the buffered writes in log order.
    cells: Vec<(NamespaceName, Curve, CellWrites)>,
    /// Where each namespace is in `cells`, and the last one written.
    index: HashMap<NamespaceName, usize>,
    last: Option<usize>,
    buffered: usize,
}

/// Cell writes by curve key (`None` deletes).
type CellWrites = Vec<(u128, Option<CellValue>)>;

/// Buffered cell writes are merged once this many are waiting (bounds the
/// memory they hold; each merge rewrites the namespace's base once).
const RECOVERY_CELL_BUFFER: usize = 1 << 21;

impl<'a> BatchApplier<'a> {
    fn new(mem: &'a MemStore) -> BatchApplier<'a> {
        BatchApplier {
            mem,
            batch: Vec::with_capacity(RECOVERY_BATCH_RECORDS),
            existed: Vec::with_capacity(RECOVERY_BATCH_RECORDS),
            lsn: 0,
            cells: Vec::new(),
            index: HashMap::new(),
            last: None,
            buffered: 0,
        }
    }

    fn push(&mut self, lsn: u64, mutation: Mutation) {
        self.lsn = self.lsn.max(lsn);
        match mutation {
            Mutation::Put { ns, coord, value } => {
                self.buffer(ns, coord, Some(CellValue::from(value)))
            }
            Mutation::Del { ns, coord } => self.buffer(ns, coord, None),
            Mutation::Detach { .. } => {
                self.flush_cells();
                self.batch.push(mutation);
                self.flush_batch();
            }
            other if other.is_namespace_change() => {
                // A namespace change is applied at once, after everything
                // before it: cells bulk-loaded next (outside this batch)
                // must land in the namespace it creates.
                self.flush();
                self.batch.push(other);
                self.flush_batch();
            }
            other => {
                self.batch.push(other);
                if self.batch.len() == RECOVERY_BATCH_RECORDS {
                    self.flush_batch();
                }
            }
        }
    }

    fn buffer(&mut self, ns: NamespaceName, coord: Coord, value: Option<CellValue>) {
        // Logs are mostly runs of one namespace: compare with the last one
        // before hashing the name.
        let at = match self.last {
            Some(at) if self.cells[at].0 == ns => at,
            _ => match self.index.get(&ns) {
                Some(&at) => at,
                None => {
                    // A namespace missing here was refused by the writer,
                    // so its records cannot be in the log; any curve will
                    // do (the writes are ignored on apply).
                    let curve = self.mem.curve(&ns).unwrap_or(Curve::DEFAULT);
                    self.index.insert(ns.clone(), self.cells.len());
                    self.cells.push((ns, curve, Vec::new()));
                    self.cells.len() - 1
                }
            },
        };
        self.last = Some(at);
        let (_, curve, writes) = &mut self.cells[at];
        writes.push((curve.key(coord), value));
        self.buffered += 1;
        if self.buffered >= RECOVERY_CELL_BUFFER {
            self.flush_cells();
        }
    }

    fn flush_cells(&mut self) {
        self.index.clear();
        self.last = None;
        for (ns, _, mut writes) in self.cells.drain(..) {
            // Stable: for a key written twice, the later write stays later.
            writes.sort_by_key(|(key, _)| *key);
            let mut last_wins: CellWrites = Vec::with_capacity(writes.len());
            for write in writes {
                match last_wins.last_mut() {
                    Some(last) if last.0 == write.0 => *last = write,
                    _ => last_wins.push(write),
                }
            }
            self.mem.apply_sorted_cells(&ns, last_wins, self.lsn);
        }
        self.buffered = 0;
    }

    fn flush_batch(&mut self) {
        let refs: Vec<&Mutation> = self.batch.iter().collect();
        self.mem.apply_group(&refs, self.lsn, &mut self.existed);
        self.batch.clear();
    }

    fn flush(&mut self) {
        self.flush_cells();
        self.flush_batch();
    }
}

impl Engine {
    /// Locks the data dir, loads the checkpoint, replays the WAL tail, and
    /// starts the writer and the checkpointer.
    pub fn open(config: EngineConfig) -> Result<Engine, StoreError> {
        let storage = Arc::clone(&config.storage);
        let data_dir = DataDir::open(storage.as_ref(), &config.data_dir)?;
        let wal_dir = data_dir.wal_dir();
        let keyring = start_keyring(config.key_file.as_deref())?;
        let mem = Arc::new(MemStore::with_tiers(config.tiers.clone()));
        let mut applier = BatchApplier::new(&mem);
        let (mut checkpoints, checkpoint_load) =
            load_checkpoint(&config, &data_dir, keyring.clone(), &mut applier)?;
        let recovery = replay_log(
            &config,
            &wal_dir,
            keyring.as_deref(),
            &checkpoints,
            &mut applier,
        )?;

        // Secret per start: a client's value can never hold a record that
        // recovery would take for one of this start's (wal/crc_seed.rs).
        let seeds = SegmentSeeds::from_system_rng()?;
        // With a key, the log is chained (wal/chain.rs): it goes on from
        // where recovery left the chain, or starts it in this data dir.
        let chain = chain_to_continue(keyring.as_deref(), recovery.chain, &mut checkpoints)?;
        let segment = open_log_segment(
            storage.as_ref(),
            &wal_dir,
            &recovery,
            &seeds,
            chain.as_ref(),
            config.group_commit.segment_bytes,
        )?;
        let stats = Arc::new(StoreStats::default());
        stats.last_lsn.store(recovery.next_lsn - 1, Relaxed);
        record(&stats, &checkpoints, &Ok(CheckpointReport::default()));
        let writer = GroupCommit::start(
            Arc::clone(&storage),
            wal_dir.clone(),
            segment,
            recovery.next_lsn,
            Arc::clone(&mem),
            Arc::clone(&stats),
            config.group_commit.clone(),
            keyring.clone(),
            seeds,
            chain,
        )
        .map_err(|e| StoreError::io(&wal_dir, e))?;
        let roller = writer.roller().ok_or_else(|| {
            StoreError::WritesDisabled("the writer stopped while starting".into())
        })?;
        checkpoints.serve(Arc::clone(&mem));
        let checkpointer =
            Checkpointer::start(checkpoints, roller, wal_dir.clone(), Arc::clone(&stats))
                .map_err(|e| StoreError::io(&wal_dir, e))?;
        Ok(Engine {
            storage,
            data_dir,
            mem,
            stats,
            writer,
            checkpointer: Mutex::new(checkpointer),
            checkpoint_load,
            recovery,
            keyring,
        })
    }

    /// The last LSN the log holds (at open: the last one recovered).
    pub fn last_lsn(&self) -> u64 {
        self.stats.last_lsn.load(Relaxed)
    }

    /// Hands over the log's records `from..=until` still on disk
    /// ([`crate::wal::read_history`]); `until` must be applied already.
    pub fn read_history(
        &self,
        from: u64,
        until: u64,
        each: impl FnMut(u64, Mutation, bool) -> bool,
    ) -> Result<crate::wal::History, StoreError> {
        crate::wal::read_history(
            self.storage.as_ref(),
            &self.data_dir.wal_dir(),
            self.keyring.as_deref(),
            from,
            until,
            each,
        )
    }

    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    pub fn checkpoint_load(&self) -> &CheckpointLoad {
        &self.checkpoint_load
    }

    pub fn data_dir(&self) -> &std::path::Path {
        self.data_dir.root()
    }

    /// Reads never wait on the writer. `None` means no such namespace; an
    /// error, a block of a namespace on disk that could not be read.
    pub fn get(
        &self,
        ns: &NamespaceName,
        coord: Coord,
    ) -> Option<Result<Option<CellValue>, StoreError>> {
        self.mem.get(ns, coord)
    }

    /// The value at `coord` copied out under the lock
    /// ([`MemStore::read_cell_memo`]: a connection keeps one `memo` for all
    /// its reads); `None` if there is no such namespace.
    pub fn get_copy(
        &self,
        memo: &mut NamespaceMemo,
        ns: &NamespaceName,
        coord: Coord,
    ) -> Option<Result<Option<Vec<u8>>, StoreError>> {
        self.mem
            .read_cell_memo(memo, ns, coord, |value| value.map(|v| v.to_vec()))
    }

    pub fn memstore(&self) -> &Arc<MemStore> {
        &self.mem
    }

    /// A handle for one connection's writes; `None` once shutdown began.
    pub fn session(&self) -> Option<WriteSession> {
        self.writer.session()
    }

    /// Closes the current WAL segment and folds every closed one into a
    /// delta (compacting if the deltas are due). Waits for it to finish.
    pub fn checkpoint(&self) -> Result<CheckpointReport, StoreError> {
        lock(&self.checkpointer).checkpoint_now(false)
    }

    /// A checkpoint followed by merging base + deltas into a new base.
    pub fn compact(&self) -> Result<CheckpointReport, StoreError> {
        lock(&self.checkpointer).checkpoint_now(true)
    }

    /// Copies a consistent data dir to `dest` while writes go on; see
    /// [`crate::checkpoint::backup`].
    pub fn backup(&self, dest: &std::path::Path) -> Result<BackupReport, StoreError> {
        lock(&self.checkpointer).backup(dest)
    }

    /// Waits until `done` holds of the stats, checking them again each time
    /// a checkpoint's outcome is recorded or a background merge settles;
    /// false if `timeout` passed first. For tests and tools that wait on
    /// the background threads without polling.
    pub fn wait_for_stats(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&StoreStatsSnapshot) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        let mut held = self.stats.background_guard();
        loop {
            if done(&self.stats()) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            held = self.stats.wait_background(held, deadline - now);
        }
    }

    pub fn stats(&self) -> StoreStatsSnapshot {
        let mut snapshot = self.stats.snapshot();
        snapshot.wal_disk_bytes =
            list_segments(self.storage.as_ref(), &self.data_dir.wal_dir(), false)
                .map(|segments| {
                    segments
                        .iter()
                        .map(|(_, path)| self.storage.file_len(path).unwrap_or(0))
                        .sum()
                })
                .unwrap_or(0);
        snapshot
    }

    /// Commits what is queued, syncs, stops the writer, then folds the whole
    /// WAL into the checkpoint so the next start replays nothing. Not after
    /// a storage failure latched the writer: its last group may be in the
    /// page cache only, its `fdatasync` having failed, and a fold would
    /// write it into a durable checkpoint as if it had been stored. The log
    /// is left as it is, for recovery at the next start.
    pub fn shutdown(&self) -> Result<Option<CheckpointReport>, StoreError> {
        self.writer.shutdown();
        let Some(mut store) = lock(&self.checkpointer).stop() else {
            return Ok(None);
        };
        if let Some(reason) = self.stats.snapshot().writer_failure {
            eprintln!(
                "cubed: no final checkpoint, since writes failed ({reason}); the next start recovers from the log"
            );
            return Ok(None);
        }
        // The writer has stopped and synced: every segment is closed.
        let result = store.fold(u64::MAX).map(Option::unwrap_or_default);
        record(&self.stats, &store, &result);
        result.map(Some)
    }

    /// Stops the threads without the final checkpoint: what a crash leaves
    /// behind (minus unsynced writes, of which `--sync always` has none).
    /// For crash tests.
    pub fn close_without_checkpoint(&self) {
        self.writer.shutdown();
        let _ = lock(&self.checkpointer).stop();
    }
}

/// This start's keyring, from the master key in `key_file` (`None`
/// without one).
fn start_keyring(key_file: Option<&Path>) -> Result<Option<Arc<Keyring>>, StoreError> {
    let Some(path) = key_file else {
        return Ok(None);
    };
    let master = load_key_file(path).map_err(|e| StoreError::Key(e.to_string()))?;
    // A random start id before anything is sealed: this run's keys are its
    // own, unlike any earlier run's or a copy's (crypto.rs).
    let keyring = Keyring::for_new_start(master).map_err(|e| StoreError::Key(e.to_string()))?;
    Ok(Some(Arc::new(keyring)))
}

/// The data dir's checkpoint store, its files loaded into the store
/// through `applier`, and what the load took.
fn load_checkpoint(
    config: &EngineConfig,
    data_dir: &DataDir,
    keyring: Option<Arc<Keyring>>,
    applier: &mut BatchApplier<'_>,
) -> Result<(CheckpointStore, CheckpointLoad), StoreError> {
    let mem = applier.mem;
    let load_started = Instant::now();
    let mut checkpoints = CheckpointStore::open(
        Arc::clone(&config.storage),
        &data_dir.checkpoint_dir(),
        &data_dir.wal_dir(),
        config.checkpoint.clone(),
        keyring,
    )?;
    let entries = checkpoints.load(
        |mutation| applier.push(0, mutation),
        |ns, cells| {
            mem.load_sorted_cells(ns, cells);
        },
    )?;
    applier.flush();
    let entries = entries + checkpoints.load_runs(mem)?;
    let (base_bytes, delta_bytes) = checkpoints.sizes();
    let checkpoint_load = CheckpointLoad {
        entries,
        checkpoint_lsn: checkpoints.checkpoint_lsn(),
        base_bytes,
        delta_bytes,
        delta_files: checkpoints.delta_count(),
        duration: load_started.elapsed(),
    };
    Ok((checkpoints, checkpoint_load))
}

/// Replays the log past the checkpoint into the store through `applier`,
/// and marks the store recovered through its last record.
fn replay_log(
    config: &EngineConfig,
    wal_dir: &Path,
    keyring: Option<&Keyring>,
    checkpoints: &CheckpointStore,
    applier: &mut BatchApplier<'_>,
) -> Result<RecoveryReport, StoreError> {
    let mem = applier.mem;
    // The log must seal exactly the records of the namespaces that are
    // encrypted at each point, starting from the checkpoint's.
    let mut sealing = SealingRule::new(mem.namespace_list());
    let recovery = recover_with(
        config.storage.as_ref(),
        wal_dir,
        checkpoints.checkpoint_lsn(),
        &config.recovery,
        keyring,
        &mut sealing,
        checkpoints.chain_anchor(),
        |lsn, mutation| applier.push(lsn, mutation),
    )?;
    applier.flush();
    // Every record up to here is applied, the chain records after the
    // last mutation included (they change nothing): runs a fold writes
    // through them may be installed.
    mem.recovered_through(recovery.next_lsn.saturating_sub(1));
    mem.index_after_recovery();
    Ok(recovery)
}

/// The chain state the log goes on from: `None` without a key, else the
/// one recovery reached (`recovered`) or the chain's start in this data
/// dir.
fn chain_to_continue(
    keyring: Option<&Keyring>,
    recovered: Option<ChainState>,
    checkpoints: &mut CheckpointStore,
) -> Result<Option<ChainState>, StoreError> {
    Ok(match (keyring.filter(|k| k.has_key()), recovered) {
        (None, _) => None,
        (Some(_), Some(state)) => {
            checkpoints.adopt_dir_id(state.dir_id);
            Some(state)
        }
        (Some(_), None) => {
            let dir_id = checkpoints
                .writing_dir_id()?
                .ok_or_else(|| StoreError::Key("no data dir id".into()))?;
            let prev = checkpoints
                .chain_anchor()
                .at
                .map_or([0; crate::crypto::MAC_BYTES], |(_, at)| at.prev);
            Some(ChainState { dir_id, prev })
        }
    })
}

/// The segment the writer appends to: the log's tail as recovery left it,
/// or a new segment at `recovery.next_lsn`.
fn open_log_segment(
    storage: &dyn Storage,
    wal_dir: &Path,
    recovery: &RecoveryReport,
    seeds: &SegmentSeeds,
    chain: Option<&ChainState>,
    segment_bytes: u64,
) -> Result<WalSegment, StoreError> {
    let new_segment = || {
        WalSegment::create(
            storage,
            wal_dir,
            recovery.next_lsn,
            seeds.for_segment(recovery.next_lsn),
            chain,
            segment_bytes,
        )
    };
    match &recovery.tail {
        // A version-1 tail has plain CRCs: appending to it would leave
        // the forged-record hole open until it fills; an unchained tail
        // cannot take chained groups. It stays as it is (recovery left
        // it ending on a whole group) and the log goes on in a new
        // segment; one that holds no record is removed, since the new
        // one takes its name.
        Some(tail)
            if tail.header.crc_seed == CrcSeed::UNSEEDED
                || tail.header.chain.is_some() != chain.is_some() =>
        {
            if tail.len_bytes == tail.header.header_bytes as u64 {
                storage
                    .remove_file(&tail.path)
                    .map_err(|e| StoreError::io(&tail.path, e))?;
                sync_dir(storage, wal_dir)?;
            }
            new_segment()
        }
        Some(tail) => WalSegment::open_for_append(storage, &tail.path, tail.header, tail.len_bytes),
        None => new_segment(),
    }
}
