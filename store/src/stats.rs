//! Counters the writer and recovery keep, read lock-free by `stats`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use hdrhistogram::Histogram;

/// Values above this are clamped (an hour in microseconds; far more
/// records than a group may hold).
const HISTOGRAM_MAX: u64 = 3_600_000_000;

fn record_into(slot: &Mutex<Option<Histogram<u64>>>, value: u64) {
    let mut guard = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if guard.is_none() {
        *guard = Histogram::new_with_bounds(1, HISTOGRAM_MAX, 2).ok();
    }
    if let Some(h) = guard.as_mut() {
        h.saturating_record(value.clamp(1, HISTOGRAM_MAX));
    }
}

#[derive(Default)]
pub struct StoreStats {
    pub(crate) wal_records: AtomicU64,
    pub(crate) wal_bytes: AtomicU64,
    pub(crate) wal_fsyncs: AtomicU64,
    pub(crate) wal_groups: AtomicU64,
    pub(crate) group_records_max: AtomicU64,
    pub(crate) fsync_us_total: AtomicU64,
    pub(crate) fsync_us_max: AtomicU64,
    pub(crate) segments_created: AtomicU64,
    pub(crate) last_lsn: AtomicU64,
    pub(crate) write_errors: AtomicU64,
    pub(crate) writer_failure: Mutex<Option<String>>,
    /// Distributions, recorded only by the writer thread (so the locks are
    /// uncontended except against `stats`).
    pub(crate) group_records_histogram: Mutex<Option<Histogram<u64>>>,
    pub(crate) fsync_us_histogram: Mutex<Option<Histogram<u64>>>,
    pub(crate) checkpoints: AtomicU64,
    pub(crate) compactions: AtomicU64,
    pub(crate) checkpoint_failures: AtomicU64,
    pub(crate) last_checkpoint_us: AtomicU64,
    pub(crate) last_checkpoint_bytes: AtomicU64,
    pub(crate) last_compaction_us: AtomicU64,
    pub(crate) last_compaction_bytes: AtomicU64,
    pub(crate) base_bytes: AtomicU64,
    pub(crate) delta_bytes: AtomicU64,
    pub(crate) delta_files: AtomicU64,
    pub(crate) checkpoint_lsn: AtomicU64,
    pub(crate) checkpoint_failure: Mutex<Option<String>>,
    /// Microseconds the writer paused for memtables over their budget.
    pub(crate) write_pause_us: AtomicU64,
    /// 1 while the checkpointer folds (or compacts), else 0.
    pub(crate) folds_in_flight: AtomicU64,
    /// 1 while the checkpointer merges a namespace's runs, else 0.
    pub(crate) merges_in_flight: AtomicU64,
    /// Signalled, under `background_lock`, after the counters of a
    /// checkpoint's outcome or of a merge settling changed: what
    /// [`crate::Engine::wait_for_stats`] waits on.
    background_changed: Condvar,
    background_lock: Mutex<()>,
}

impl StoreStats {
    /// Wakes the waiters of [`crate::Engine::wait_for_stats`]; called after
    /// the counters changed, so a waiter that checks them holding the lock
    /// misses no change.
    pub(crate) fn notify_background(&self) {
        let _held = self.background_guard();
        self.background_changed.notify_all();
    }

    pub(crate) fn background_guard(&self) -> MutexGuard<'_, ()> {
        self.background_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits on the next [`StoreStats::notify_background`], at most
    /// `timeout`.
    pub(crate) fn wait_background<'a>(
        &self,
        held: MutexGuard<'a, ()>,
        timeout: std::time::Duration,
    ) -> MutexGuard<'a, ()> {
        self.background_changed
            .wait_timeout(held, timeout)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }
}

/// A consistent-enough copy of the counters (each read is atomic; the set
/// is not a snapshot across counters, which stats do not need).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreStatsSnapshot {
    pub wal_records: u64,
    pub wal_bytes: u64,
    pub wal_fsyncs: u64,
    pub wal_groups: u64,
    pub group_records_mean: f64,
    pub group_records_max: u64,
    pub fsync_us_mean: f64,
    pub fsync_us_max: u64,
    pub segments_created: u64,
    pub last_lsn: u64,
    pub write_errors: u64,
    pub writer_failure: Option<String>,
    pub checkpoints: u64,
    pub compactions: u64,
    pub checkpoint_failures: u64,
    pub last_checkpoint_us: u64,
    pub last_checkpoint_bytes: u64,
    pub last_compaction_us: u64,
    pub last_compaction_bytes: u64,
    pub base_bytes: u64,
    pub delta_bytes: u64,
    pub delta_files: u64,
    pub checkpoint_lsn: u64,
    pub last_checkpoint_failure: Option<String>,
    /// Size of the WAL segment files now on disk (filled by the engine).
    pub wal_disk_bytes: u64,
    pub group_records_p50: u64,
    pub group_records_p99: u64,
    pub fsync_us_p50: u64,
    pub fsync_us_p99: u64,
    pub write_pause_us: u64,
    pub folds_in_flight: u64,
    pub merges_in_flight: u64,
}

impl StoreStats {
    pub(crate) fn record_group(&self, records: u64, bytes: u64, last_lsn: u64) {
        self.wal_records.fetch_add(records, Relaxed);
        self.wal_bytes.fetch_add(bytes, Relaxed);
        self.wal_groups.fetch_add(1, Relaxed);
        self.group_records_max.fetch_max(records, Relaxed);
        self.last_lsn.store(last_lsn, Relaxed);
        record_into(&self.group_records_histogram, records);
    }

    pub(crate) fn record_fsync(&self, micros: u64) {
        self.wal_fsyncs.fetch_add(1, Relaxed);
        self.fsync_us_total.fetch_add(micros, Relaxed);
        self.fsync_us_max.fetch_max(micros, Relaxed);
        record_into(&self.fsync_us_histogram, micros);
    }

    pub(crate) fn set_failure(&self, reason: &str) {
        let mut slot = self
            .writer_failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        slot.get_or_insert_with(|| reason.to_string());
    }

    pub(crate) fn set_checkpoint_failure(&self, reason: &str) {
        *self
            .checkpoint_failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(reason.to_string());
    }

    pub fn snapshot(&self) -> StoreStatsSnapshot {
        let quantiles = |h: &Mutex<Option<Histogram<u64>>>| {
            let guard = h.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            guard.as_ref().map_or((0, 0), |h| {
                (h.value_at_quantile(0.5), h.value_at_quantile(0.99))
            })
        };
        let (group_records_p50, group_records_p99) = quantiles(&self.group_records_histogram);
        let (fsync_us_p50, fsync_us_p99) = quantiles(&self.fsync_us_histogram);
        let groups = self.wal_groups.load(Relaxed);
        let fsyncs = self.wal_fsyncs.load(Relaxed);
        let records = self.wal_records.load(Relaxed);
        StoreStatsSnapshot {
            wal_records: records,
            wal_bytes: self.wal_bytes.load(Relaxed),
            wal_fsyncs: fsyncs,
            wal_groups: groups,
            group_records_mean: if groups == 0 {
                0.0
            } else {
                records as f64 / groups as f64
            },
            group_records_max: self.group_records_max.load(Relaxed),
            fsync_us_mean: if fsyncs == 0 {
                0.0
            } else {
                self.fsync_us_total.load(Relaxed) as f64 / fsyncs as f64
            },
            fsync_us_max: self.fsync_us_max.load(Relaxed),
            segments_created: self.segments_created.load(Relaxed),
            last_lsn: self.last_lsn.load(Relaxed),
            write_errors: self.write_errors.load(Relaxed),
            writer_failure: self
                .writer_failure
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
            checkpoints: self.checkpoints.load(Relaxed),
            compactions: self.compactions.load(Relaxed),
            checkpoint_failures: self.checkpoint_failures.load(Relaxed),
            last_checkpoint_us: self.last_checkpoint_us.load(Relaxed),
            last_checkpoint_bytes: self.last_checkpoint_bytes.load(Relaxed),
            last_compaction_us: self.last_compaction_us.load(Relaxed),
            last_compaction_bytes: self.last_compaction_bytes.load(Relaxed),
            base_bytes: self.base_bytes.load(Relaxed),
            delta_bytes: self.delta_bytes.load(Relaxed),
            delta_files: self.delta_files.load(Relaxed),
            checkpoint_lsn: self.checkpoint_lsn.load(Relaxed),
            last_checkpoint_failure: self
                .checkpoint_failure
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
            wal_disk_bytes: 0,
            group_records_p50,
            group_records_p99,
            fsync_us_p50,
            fsync_us_p99,
            write_pause_us: self.write_pause_us.load(Relaxed),
            folds_in_flight: self.folds_in_flight.load(Relaxed),
            merges_in_flight: self.merges_in_flight.load(Relaxed),
        }
    }
}
