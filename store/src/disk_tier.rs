//! Which namespaces are served from memory and which from their run files
//! (issue 32, step 2), and the bookkeeping that keeps the two in step.
//!
//! A namespace is in one of three tiers, kept in `NamespaceCells::tier`
//! and changed only under its `cells` write lock, always forward:
//!
//! ```text
//!   Memory ──(resident cells over budget)──> Migrating ──(runs installed)──> Disk
//! ```
//!
//! - **Memory**: the cells live in a `CellMap`, the fastest structure we
//!   have; its run files exist (every fold writes them) but are not read.
//! - **Migrating**: still served from the `CellMap`, but every write since
//!   `migrating_since_lsn` is also put in the namespace's `ReadStack`
//!   memtable. Its runs hold every write up to a fold's LSN, so once a
//!   fold through at least `migrating_since_lsn` is installed, runs plus
//!   memtable read exactly like the map, and the map is dropped.
//! - **Disk**: served by the `ReadStack` (memtable over run files read
//!   through the daemon's one [`BlockCache`]).
//!
//! The writer picks the namespace to move (the largest in memory) when the
//! in-memory cells' estimated cost passes [`TierConfig::resident_limit_bytes`];
//! a restart puts namespaces in memory smallest first while they fit, and
//! the rest on disk, opening their runs' indexes only. A namespace never
//! moves back to memory while the daemon runs.
//!
//! Runs reach a stack only after the manifest lists them and the writer
//! has applied every write they hold ([`Tiering::install`]): a run ahead of
//! the memtable would make the writer's lookup of a key's previous value
//! (for exact counts) see the write it is applying.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use crate::ClockStats;
use crate::count_marks::CountMarks;
use crate::memstore::lock;
use crate::row_cache::RowCache;
use crate::run_file::{BlockCache, CacheStats, RunFileReader};

/// What a cell in memory costs beyond its value's bytes: key, value
/// handle, index and map overhead. Measured: 1 M cells of 64 bytes hold
/// 145 MiB in memory (docs/benchmarks.md, "Allocator"), 88 bytes a cell
/// beyond the 64 of its value.
pub const RESIDENT_CELL_OVERHEAD_BYTES: u64 = 88;

/// The tiers, as stored in `NamespaceCells::tier`.
pub(crate) const TIER_MEMORY: u8 = 0;
pub(crate) const TIER_MIGRATING: u8 = 1;
pub(crate) const TIER_DISK: u8 = 2;

/// The memory budgets of cell storage (`cubed --cache-bytes`,
/// `--memtable-bytes`).
#[derive(Clone, Debug)]
pub struct TierConfig {
    /// Estimated bytes of cells kept in memory (the `CellMap` tier) before
    /// the largest namespace moves to its run files (a quarter of
    /// `--cache-bytes`).
    pub resident_limit_bytes: u64,
    /// The block cache's budget, for namespaces served from disk.
    pub block_cache_bytes: u64,
    /// The row cache's budget: values read by `get` and `mget` from
    /// namespaces served from disk (`crate::row_cache`).
    pub row_cache_bytes: u64,
    /// The memtables of namespaces served from disk, all together: past
    /// half of it a fold is asked for; past all of it the writer slows down.
    pub memtable_limit_bytes: u64,
}

impl TierConfig {
    /// Everything in memory (tests, `--verify`): the disk tier is never used.
    pub fn all_in_memory() -> TierConfig {
        TierConfig {
            resident_limit_bytes: u64::MAX,
            block_cache_bytes: 1 << 20,
            row_cache_bytes: 1 << 20,
            memtable_limit_bytes: u64::MAX,
        }
    }

    /// `cubed --cache-bytes`: a quarter for cells in memory; of the rest,
    /// for the namespaces on disk, a third for the row cache (the values
    /// point reads ask for again: a hot `get` is a hash probe there, not
    /// the block path) and two thirds for the block cache (scans, and the
    /// rows around those). A quarter in memory, because the estimate
    /// counts cells at rest: measured at 20 M cells with 2 GiB, a namespace
    /// leaving memory at half (1 GiB of cells) took the import's RSS to
    /// 3.1 GiB, with the compactor's merge of its base (two copies at
    /// once) and its memtable until the fold (docs/benchmarks.md, "Scale").
    pub fn from_cache_bytes(cache_bytes: u64, memtable_limit_bytes: u64) -> TierConfig {
        TierConfig {
            resident_limit_bytes: cache_bytes / 4,
            row_cache_bytes: cache_bytes / 4,
            block_cache_bytes: cache_bytes - cache_bytes / 4 - cache_bytes / 4,
            memtable_limit_bytes,
        }
    }
}

/// What a namespace in memory is charged against the resident budget.
pub(crate) fn resident_cost_bytes(cells: u64, value_bytes: u64) -> u64 {
    cells
        .saturating_mul(RESIDENT_CELL_OVERHEAD_BYTES)
        .saturating_add(value_bytes)
}

/// Runs a fold or merge wrote for a namespace not yet able to take them
/// (the writer had not applied every write they hold).
pub(crate) struct PendingInstall {
    pub(crate) ns_id: u64,
    pub(crate) runs: Vec<Arc<RunFileReader>>,
    pub(crate) through_lsn: u64,
}

/// The store-wide side of the tiers. Counters are estimates kept by the
/// writer (and the installer), read by stats and the checkpointer.
pub(crate) struct Tiering {
    pub(crate) config: TierConfig,
    /// The block cache every served run reads through.
    pub(crate) cache: Arc<BlockCache>,
    /// The row cache of every namespace on disk.
    pub(crate) rows: Arc<RowCache>,
    /// Estimated cost of the namespaces in memory (not those migrating).
    resident_bytes: AtomicI64,
    /// Memtable bytes of the namespaces migrating or on disk.
    memtable_bytes: AtomicI64,
    /// The last LSN the writer (or recovery) applied.
    applied_lsn: AtomicU64,
    /// The LSN the last installed runs hold every write up to.
    installed_lsn: AtomicU64,
    migrating: AtomicU64,
    pending: Mutex<Vec<PendingInstall>>,
    has_pending: AtomicBool,
    /// Namespaces moved to disk since start, and previous-value lookups
    /// that failed (their counts may be off until the next restart).
    pub(crate) migrations: AtomicU64,
    pub(crate) lookup_failures: AtomicU64,
    /// The writer's counts at its segment rolls, for folds.
    pub(crate) count_marks: CountMarks,
}

impl Tiering {
    pub(crate) fn new(config: TierConfig) -> Tiering {
        let cache_bytes = usize::try_from(config.block_cache_bytes).unwrap_or(usize::MAX);
        let row_bytes = usize::try_from(config.row_cache_bytes).unwrap_or(usize::MAX);
        Tiering {
            cache: Arc::new(BlockCache::new(cache_bytes)),
            rows: Arc::new(RowCache::new(row_bytes)),
            config,
            resident_bytes: AtomicI64::new(0),
            memtable_bytes: AtomicI64::new(0),
            applied_lsn: AtomicU64::new(0),
            installed_lsn: AtomicU64::new(0),
            migrating: AtomicU64::new(0),
            pending: Mutex::new(Vec::new()),
            has_pending: AtomicBool::new(false),
            migrations: AtomicU64::new(0),
            lookup_failures: AtomicU64::new(0),
            count_marks: CountMarks::default(),
        }
    }

    pub(crate) fn add_resident(&self, delta: i64) {
        if delta != 0 {
            self.resident_bytes.fetch_add(delta, Relaxed);
        }
    }

    pub(crate) fn add_memtable(&self, delta: i64) {
        if delta != 0 {
            self.memtable_bytes.fetch_add(delta, Relaxed);
        }
    }

    pub(crate) fn resident_bytes(&self) -> u64 {
        self.resident_bytes.load(Relaxed).max(0) as u64
    }

    pub(crate) fn memtable_bytes(&self) -> u64 {
        self.memtable_bytes.load(Relaxed).max(0) as u64
    }

    /// Whether the cells in memory cost more than their budget.
    pub(crate) fn over_resident_budget(&self) -> bool {
        self.resident_bytes() > self.config.resident_limit_bytes
    }

    pub(crate) fn migration_started(&self) {
        self.migrating.fetch_add(1, Relaxed);
    }

    pub(crate) fn migration_done(&self) {
        self.migrating.fetch_sub(1, Relaxed);
        self.migrations.fetch_add(1, Relaxed);
    }

    pub(crate) fn migrating(&self) -> u64 {
        self.migrating.load(Relaxed)
    }

    pub(crate) fn set_applied(&self, lsn: u64) {
        self.applied_lsn.fetch_max(lsn, Relaxed);
    }

    pub(crate) fn applied_lsn(&self) -> u64 {
        self.applied_lsn.load(Relaxed)
    }

    pub(crate) fn set_installed(&self, lsn: u64) {
        self.installed_lsn.fetch_max(lsn, Relaxed);
    }

    /// Whether a fold would free memory now: a namespace waits to leave
    /// memory, or the memtables are past half their budget, and there are
    /// writes the installed runs do not hold yet.
    pub(crate) fn wants_fold(&self) -> bool {
        let pressure =
            self.migrating() > 0 || self.memtable_bytes() > self.config.memtable_limit_bytes / 2;
        pressure && self.applied_lsn() > self.installed_lsn.load(Relaxed)
    }

    /// How long the writer pauses after a group of `records` writes,
    /// growing with how far the memtables are past their budget: nothing
    /// below it, then 1 µs a record per 1/16 of the budget beyond (at
    /// twice the budget, 16 µs a record: about 60 000 writes a second),
    /// at most [`MAX_THROTTLE_US`] a group. Never a wait for a fold to
    /// finish: writes slow down smoothly while memory stays near its
    /// budget.
    pub(crate) fn throttle_us(&self, records: usize) -> u64 {
        let limit = self.config.memtable_limit_bytes;
        let used = self.memtable_bytes();
        if used <= limit {
            return 0;
        }
        let step = (limit / 16).max(1);
        let per_record_us = (used - limit) / step + 1;
        per_record_us
            .saturating_mul(records as u64)
            .min(MAX_THROTTLE_US)
    }

    pub(crate) fn park(&self, install: PendingInstall) {
        let mut pending = lock(&self.pending);
        // One per namespace, the newest: it lists the runs that replaced
        // an older install's.
        if pending
            .iter()
            .any(|p| p.ns_id == install.ns_id && p.through_lsn >= install.through_lsn)
        {
            return;
        }
        pending.retain(|p| p.ns_id != install.ns_id);
        pending.push(install);
        self.has_pending.store(true, Relaxed);
    }

    /// The parked installs the writer can now take (their writes applied).
    pub(crate) fn take_ready(&self) -> Vec<PendingInstall> {
        if !self.has_pending.load(Relaxed) {
            return Vec::new();
        }
        let applied = self.applied_lsn();
        let mut pending = lock(&self.pending);
        let (ready, waiting): (Vec<_>, Vec<_>) =
            pending.drain(..).partition(|p| p.through_lsn <= applied);
        *pending = waiting;
        self.has_pending.store(!pending.is_empty(), Relaxed);
        ready
    }

    pub(crate) fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }
}

/// The longest pause the writer takes after a group for memtables over
/// their budget: a quarter of a second, so no write waits seconds.
pub(crate) const MAX_THROTTLE_US: u64 = 250_000;

/// What `cubec stats` shows of the tiers.
#[derive(Clone, Debug, Default)]
pub struct TierStats {
    pub namespaces_in_memory: u64,
    pub namespaces_migrating: u64,
    pub namespaces_on_disk: u64,
    pub resident_bytes: u64,
    pub resident_limit_bytes: u64,
    pub memtable_bytes: u64,
    pub memtable_limit_bytes: u64,
    pub cache: CacheStats,
    pub rows: ClockStats,
    pub migrations: u64,
    pub lookup_failures: u64,
    /// Bytes of the indexes (and filters) of runs open for serving.
    pub run_index_bytes: u64,
}

/// A namespace's tier, as stored.
pub(crate) fn tier_name(tier: u8) -> &'static str {
    match tier {
        TIER_MEMORY => "memory",
        TIER_MIGRATING => "migrating",
        _ => "disk",
    }
}

/// The per-namespace tier fields.
pub(crate) struct NamespaceTier {
    pub(crate) tier: AtomicU8,
    /// Migrating: every write after this LSN is in the memtable too.
    pub(crate) migrating_since_lsn: AtomicU64,
}

impl NamespaceTier {
    pub(crate) fn new() -> NamespaceTier {
        NamespaceTier {
            tier: AtomicU8::new(TIER_MEMORY),
            migrating_since_lsn: AtomicU64::new(0),
        }
    }

    /// Meaningful under the namespace's `cells` lock (changed only under
    /// its write lock, and only forward).
    pub(crate) fn get(&self) -> u8 {
        self.tier.load(Relaxed)
    }

    pub(crate) fn set(&self, tier: u8) {
        debug_assert!(tier >= self.get(), "a tier only moves forward");
        self.tier.store(tier, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiering(memtable_limit_bytes: u64) -> Tiering {
        Tiering::new(TierConfig {
            resident_limit_bytes: 0,
            block_cache_bytes: 1 << 20,
            row_cache_bytes: 1 << 20,
            memtable_limit_bytes,
        })
    }

    #[test]
    fn the_writer_slows_smoothly_with_the_memtables_excess_and_never_for_seconds() {
        let t = tiering(1600);
        t.add_memtable(1600);
        assert_eq!(t.throttle_us(1000), 0, "within budget: no pause");
        t.add_memtable(1);
        assert_eq!(t.throttle_us(1000), 1000, "just over: 1 µs a write");
        t.add_memtable(799);
        assert_eq!(t.throttle_us(1000), 9000, "half over: 9 µs a write");
        let mut last = 0;
        for _ in 0..64 {
            t.add_memtable(100);
            let pause = t.throttle_us(4096);
            assert!(pause >= last, "the pause never shrinks as the excess grows");
            assert!(pause <= MAX_THROTTLE_US);
            last = pause;
        }
        assert_eq!(last, MAX_THROTTLE_US);
    }

    #[test]
    fn a_fold_is_wanted_only_for_writes_the_installed_runs_lack() {
        let t = tiering(1000);
        t.migration_started();
        assert!(!t.wants_fold(), "nothing applied yet");
        t.set_applied(10);
        assert!(t.wants_fold());
        t.set_installed(10);
        assert!(!t.wants_fold(), "the runs hold every write");
        t.migration_done();
        t.set_applied(11);
        assert!(!t.wants_fold(), "no pressure");
        t.add_memtable(501);
        assert!(t.wants_fold(), "memtables past half their budget");
    }

    #[test]
    fn parked_installs_wait_for_the_writes_they_hold() {
        let t = tiering(1000);
        t.set_applied(5);
        for through_lsn in [6, 8, 7] {
            t.park(PendingInstall {
                ns_id: 1,
                runs: Vec::new(),
                through_lsn,
            });
        }
        t.set_applied(7);
        assert!(
            t.take_ready().is_empty(),
            "the newest install (through 8) replaced the others and waits"
        );
        t.set_applied(8);
        let ready = t.take_ready();
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].through_lsn, 8);
        assert!(t.take_ready().is_empty());
    }
}
