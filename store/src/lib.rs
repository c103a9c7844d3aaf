//! cube's storage engine: one job, keep acknowledged writes.
//!
//! Every mutation becomes a CRC32C-framed record in an append-only
//! write-ahead log ([`wal`]). One writer thread ([`GroupCommit`]) batches
//! whatever requests are waiting into a single `write` + `fdatasync`, applies
//! the group to the in-memory [`MemStore`], and only then acknowledges. At
//! start, [`recovery`](wal::recover) replays the log, truncating a torn tail
//! and refusing, with file and offset, to start on corruption in the middle.
//!
//! Invariants (asserted in code, not only here):
//! - LSNs are contiguous: record N+1 follows record N, across segments.
//! - A reader of [`MemStore`] never sees a write whose group has not been
//!   synced (under the default [`SyncPolicy::Always`]).
//! - After a failed `write` or `fsync` the writer is latched: it refuses every
//!   later write until restart. It never retries a failed fsync.
//!
//! File formats are specified byte by byte in `docs/storage-format.md`.
#![cfg_attr(test, allow(clippy::unwrap_used))]
// A function past a screen is split into its steps (clippy counts lines
// of code; the limit is in clippy.toml). Tests may run longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

mod cell_value;
mod cells;
pub mod checkpoint;
mod clock_cache;
mod coord_hash;
mod count_marks;
pub mod crypto;
pub mod curve;
mod data_dir;
mod delta_filter;
mod disk_cells;
pub mod disk_tier;
mod edges;
mod error;
mod group_commit;
mod huge_pages;
mod key_index;
pub mod listing;
mod memstore;
mod mutation;
pub mod namespace;
mod prefetch;
pub mod private_files;
pub mod programs;
pub mod run_file;
// Flushing generations (`flush_oldest`) and merging runs in the stack
// (`merge_runs`, `install_run`) are tested but unused by the daemon, whose
// runs come from checkpoint folds (`crate::disk_cells`).
#[cfg_attr(not(test), allow(dead_code))]
mod read_stack;
mod row_cache;
mod scan;
#[cfg(test)]
mod shadow_marks_stress;
#[cfg(any(test, feature = "sim-disk"))]
pub mod sim_disk;
mod stats;
pub mod storage;
mod thread_priority;
pub mod transaction;
pub mod verify;
pub mod wal;

pub use cell_value::{CellValue, INLINE_VALUE_BYTES};
pub use clock_cache::ClockStats;
pub use curve::{
    Curve, hilbert_decode, hilbert_decode_many, hilbert_key, hilbert_keys, morton_decode,
    morton_key,
};
pub use data_dir::{DataDir, sync_dir};
pub use edges::{EdgeKey, PathError, PathOutcome, WalkLimits};
pub use error::{StoreError, WriteError, WriteErrorKind};
pub use group_commit::{
    AnswerBatch, AnswerContext, AnswerOnce, CommitListener, GroupCommit, GroupCommitConfig,
    MAX_NAMESPACES, MAX_TXN_MUTATIONS, NamespaceGuard, Responder, SyncPolicy, TxnAck, WriteAck,
    WriteSession,
};
pub use memstore::{APPLY_SLICE_RECORDS, MemStore, NamespaceMemo, SCAN_SLICE_STEPS};
pub use mutation::Mutation;
pub use programs::{
    MAX_TELEMETRY_KEEP, PROGRAM_OVERHEAD_BYTES, StoredProgram, TELEMETRY_RECORD_CHARGE_BYTES,
    TelemetryChange, TelemetryHead, program_charge_bytes,
};
pub use scan::{ScanLimits, ScanOutcome, Visit};
pub use stats::{StoreStats, StoreStatsSnapshot};
pub use storage::{OpenMode, RealDisk, Storage, StorageFile};
pub use transaction::{Savepoint, TxnView};
pub use wal::{RecoveryOptions, RecoveryReport};

mod engine;
pub use checkpoint::backup::BackupReport;
pub use checkpoint::{CheckpointConfig, CheckpointReport, CompactionReport, CrashPoint, MergeHold};
pub use engine::{CheckpointLoad, Engine, EngineConfig};
