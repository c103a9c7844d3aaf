//! The engine: a locked data dir, the recovered in-memory store, and the
//! writer thread, opened and closed as one.

use std::path::PathBuf;
use std::sync::Arc;

use cube_protocol::{Coord, NamespaceName};

use crate::data_dir::DataDir;
use crate::error::StoreError;
use crate::group_commit::{GroupCommit, GroupCommitConfig, WriteSession};
use crate::memstore::MemStore;
use crate::mutation::Mutation;
use crate::stats::{StoreStats, StoreStatsSnapshot};
use crate::wal::segment::WalSegment;
use crate::wal::{RecoveryOptions, RecoveryReport, recover};

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    pub group_commit: GroupCommitConfig,
    pub recovery: RecoveryOptions,
}

/// Recovery applies records in batches of this many, taking each
/// namespace's lock once per batch rather than once per record.
const RECOVERY_BATCH_RECORDS: usize = 4096;

pub struct Engine {
    data_dir: DataDir,
    mem: Arc<MemStore>,
    stats: Arc<StoreStats>,
    writer: GroupCommit,
    recovery: RecoveryReport,
}

impl Engine {
    /// Locks the data dir, replays the log, and starts the writer.
    pub fn open(config: EngineConfig) -> Result<Engine, StoreError> {
        let data_dir = DataDir::open(&config.data_dir)?;
        let wal_dir = data_dir.wal_dir();
        let mem = Arc::new(MemStore::new());
        let mut batch: Vec<Mutation> = Vec::with_capacity(RECOVERY_BATCH_RECORDS);
        let mut existed = Vec::with_capacity(RECOVERY_BATCH_RECORDS);
        let flush = |batch: &mut Vec<Mutation>, existed: &mut Vec<bool>| {
            let refs: Vec<&Mutation> = batch.iter().collect();
            mem.apply_group(&refs, existed);
            batch.clear();
        };
        let recovery = recover(&wal_dir, &config.recovery, |_lsn, mutation| {
            batch.push(mutation);
            if batch.len() == RECOVERY_BATCH_RECORDS {
                flush(&mut batch, &mut existed);
            }
        })?;
        flush(&mut batch, &mut existed);

        let segment = match &recovery.tail {
            Some(tail) => WalSegment::open_for_append(&tail.path, tail.first_lsn, tail.len_bytes)?,
            None => WalSegment::create(
                &wal_dir,
                recovery.next_lsn,
                config.group_commit.segment_bytes,
            )?,
        };
        let stats = Arc::new(StoreStats::default());
        stats
            .last_lsn
            .store(recovery.next_lsn - 1, std::sync::atomic::Ordering::Relaxed);
        let writer = GroupCommit::start(
            wal_dir.clone(),
            segment,
            recovery.next_lsn,
            Arc::clone(&mem),
            Arc::clone(&stats),
            config.group_commit.clone(),
        )
        .map_err(|e| StoreError::io(&wal_dir, e))?;
        Ok(Engine {
            data_dir,
            mem,
            stats,
            writer,
            recovery,
        })
    }

    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    pub fn data_dir(&self) -> &std::path::Path {
        self.data_dir.root()
    }

    /// Reads never wait on the writer. `None` means no such namespace.
    pub fn get(&self, ns: &NamespaceName, coord: Coord) -> Option<Option<Arc<[u8]>>> {
        self.mem.get(ns, coord)
    }

    pub fn memstore(&self) -> &Arc<MemStore> {
        &self.mem
    }

    /// A handle for one connection's writes; `None` once shutdown began.
    pub fn session(&self) -> Option<WriteSession> {
        self.writer.session()
    }

    pub fn stats(&self) -> StoreStatsSnapshot {
        self.stats.snapshot()
    }

    /// Commits what is queued, syncs, and stops the writer.
    pub fn shutdown(&self) {
        self.writer.shutdown();
    }
}
