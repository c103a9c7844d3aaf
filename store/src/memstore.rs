//! The in-memory store that readers are served from.
//!
//! Per namespace, cells live in a [`CellMap`] (sorted runs: an immutable
//! sorted array plus a small delta, merged in the background) keyed by
//! their key along the namespace's space-filling [`Curve`], so region reads
//! become range scans ([`MemStore::scan`]). Only the writer thread mutates it, and only with
//! groups that are already durable; readers take a shared lock and never
//! wait on the log.
//!
//! Nobody holds a namespace's lock for long: the writer applies a group in
//! slices of [`APPLY_SLICE_RECORDS`], and a scan reads in slices of
//! [`SCAN_SLICE_STEPS`], releasing the lock in between. A reader therefore
//! waits at most one slice (tens of microseconds), whatever the group or
//! the box. The structure was chosen by measurement; see
//! `docs/benchmarks.md` ("In-memory store and curves").

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cube_protocol::{CellBox, Coord, NamespaceName};

use crate::cell_value::CellValue;
use crate::cells::{BaseRead, BaseReader, CellMap, Compactor};
use crate::coord_hash::CoordHashBuilder;
use crate::curve::Curve;
use crate::disk_cells::cell_write;
use crate::disk_tier::{
    NamespaceTier, TIER_DISK, TIER_MEMORY, TierConfig, Tiering, resident_cost_bytes,
};
use crate::edges::EdgeGraph;
use crate::error::StoreError;
use crate::mutation::Mutation;
use crate::namespace::{NamespaceMeta, Quota, Usage};
use crate::read_stack::ReadStack;
use crate::scan::{ChunkEnd, Decoder, ScanLimits, ScanOutcome, ScanState, Visit, start_key};

/// The writer applies at most this many mutations per hold of a
/// namespace's write lock (a group can be 4096): about 40 us of inserts, so
/// a reader waits at most that long (measured: `docs/benchmarks.md`).
pub const APPLY_SLICE_RECORDS: usize = 256;

/// A scan examines at most this many stored keys per hold of a read lock,
/// then lets a waiting writer in and carries on from where it was.
pub const SCAN_SLICE_STEPS: u64 = 4096;

/// [`SCAN_SLICE_STEPS`] for a namespace on disk, whose slice may wait for
/// block reads while it holds the read lock.
pub const DISK_SCAN_SLICE_STEPS: u64 = 1024;

type Cells = CellMap;

pub(crate) struct NamespaceCells {
    /// Fixed at creation: every key in `cells` is along this curve.
    pub(crate) curve: Curve,
    /// Fixed at creation; unique forever (`crate::namespace`).
    pub(crate) id: u64,
    /// Fixed at creation (copies of `meta`'s, read on every write).
    pub(crate) quota: Quota,
    pub(crate) encrypted: bool,
    /// Owner, grants, quotas. Only the writer (and recovery) changes it.
    pub(crate) meta: RwLock<NamespaceMeta>,
    /// The cells while the namespace is in memory or migrating
    /// (`crate::disk_tier`); empty once it is on disk.
    pub(crate) cells: RwLock<Cells>,
    /// The cells once the namespace is on disk (memtable over its runs);
    /// while migrating, the writes since `tier.migrating_since_lsn`; else
    /// empty. Lock order: `cells`, then `disk`.
    pub(crate) disk: RwLock<ReadStack>,
    /// Which of the two serves reads. Changed only under the `cells`
    /// write lock, and only forward.
    pub(crate) tier: NamespaceTier,
    /// Bytes of all cell values, for `max-bytes` quotas and `ns info`.
    /// Changed only under the `cells` write lock.
    pub(crate) value_bytes: AtomicU64,
    /// What its programs and kept telemetry count against `max-bytes`
    /// (`crate::programs::program_charge_bytes`); changed only by the
    /// writer (and recovery), under the `cells` write lock.
    program_bytes: AtomicU64,
    /// The namespace's edges (`crate::edges`). Lock order: `edges`, then
    /// `cells`; the writer holds `edges` for a whole group's run.
    pub(crate) edges: RwLock<EdgeGraph>,
    /// Set, under the `edges` and `cells` write locks, when the namespace
    /// is dropped or replaced by one of the same name, and its cells and
    /// edges are released at the same time. A [`NamespaceMemo`] may still
    /// hold the `Arc`, and a graph read may have looked it up just before
    /// the drop; both check this under the read lock they take anyway, so
    /// neither reads a dropped namespace, and a memo never keeps its cells
    /// alive.
    dropped: AtomicBool,
}

impl NamespaceCells {
    fn new(meta: NamespaceMeta) -> NamespaceCells {
        NamespaceCells {
            curve: meta.curve,
            id: meta.id,
            quota: meta.quota,
            encrypted: meta.encrypted,
            meta: RwLock::new(meta),
            cells: RwLock::default(),
            disk: RwLock::new(ReadStack::new(Vec::new(), 0)),
            tier: NamespaceTier::new(),
            value_bytes: AtomicU64::new(0),
            program_bytes: AtomicU64::new(0),
            edges: RwLock::default(),
            dropped: AtomicBool::new(false),
        }
    }

    /// Marks a namespace that has left the table dropped and releases its
    /// cells and edges, which any `Arc` still held (a memo, a scan in
    /// progress) would otherwise keep in memory. Runs on the writer,
    /// which applies the drop; the memory is freed after the locks are
    /// released, so readers do not wait for it.
    fn retire(&self, tiering: &Tiering) {
        // Both locks (in their order) while the flag is set, so a reader
        // holding either one sees the flag whenever it sees the emptied
        // maps.
        let (edges, cells, stack) = {
            let mut edges = write(&self.edges);
            let mut cells = write(&self.cells);
            let mut stack = write(&self.disk);
            self.dropped.store(true, Ordering::Relaxed);
            if self.tier.get() == TIER_MEMORY {
                let cost = resident_cost_bytes(
                    cells.len() as u64,
                    self.value_bytes.load(Ordering::Relaxed),
                );
                tiering.add_resident(-(cost as i64));
            }
            tiering.add_memtable(-(stack.memtable_bytes() as i64));
            self.value_bytes.store(0, Ordering::Relaxed);
            self.program_bytes.store(0, Ordering::Relaxed);
            (
                std::mem::take(&mut *edges),
                cells.take_retired(),
                std::mem::replace(&mut *stack, ReadStack::new(Vec::new(), 0)),
            )
        };
        for run in stack.runs() {
            tiering.cache.forget_file(run.cache_id());
        }
        drop((edges, cells, stack));
    }

    /// What the namespace's cells cost in memory, by the estimate the
    /// resident budget counts (`crate::disk_tier`). Under the `cells` lock.
    pub(crate) fn resident_cost(&self) -> u64 {
        resident_cost_bytes(
            read(&self.cells).len() as u64,
            self.value_bytes.load(Ordering::Relaxed),
        )
    }

    /// Whether reads go to `disk`. Meaningful under the `cells` lock; once
    /// true it stays true.
    pub(crate) fn on_disk(&self) -> bool {
        self.tier.get() == TIER_DISK
    }

    /// Whether the namespace was dropped (or replaced). Meaningful under
    /// its `cells` or `edges` lock, which `retire` holds while setting it.
    pub(crate) fn is_dropped(&self) -> bool {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Adds `delta` to the value byte count. Callers hold the `cells`
    /// write lock, so no other thread changes the count meanwhile and a
    /// plain load and store do (no locked read-modify-write).
    pub(crate) fn add_value_bytes(&self, delta: i64) {
        let total = self.value_bytes.load(Ordering::Relaxed) as i64 + delta;
        debug_assert!(total >= 0, "value bytes went negative: {total}");
        self.value_bytes
            .store(total.max(0) as u64, Ordering::Relaxed);
    }

    /// Adds `delta` to the programs' charge (see `add_value_bytes`).
    pub(crate) fn add_program_bytes(&self, delta: i64) {
        if delta == 0 {
            return;
        }
        let total = self.program_bytes.load(Ordering::Relaxed) as i64 + delta;
        debug_assert!(total >= 0, "program bytes went negative: {total}");
        self.program_bytes
            .store(total.max(0) as u64, Ordering::Relaxed);
    }

    /// Live cells, from whichever tier serves them.
    pub(crate) fn cell_count(&self) -> u64 {
        let cells = read(&self.cells);
        if self.on_disk() {
            drop(cells);
            return read(&self.disk).len() as u64;
        }
        cells.len() as u64
    }

    pub(crate) fn usage(&self) -> Usage {
        // One lock at a time, each released at the end of its statement: in
        // one struct literal the cells guard lived on while the edges lock
        // was taken, against the lock order, and deadlocked the writer
        // (which holds `edges` and then wants `cells`).
        let edges = read(&self.edges).edge_count();
        let cells = self.cell_count();
        Usage {
            cells,
            bytes: self.value_bytes.load(Ordering::Relaxed),
            edges,
        }
    }
}

/// One namespace's cells from a checkpoint base, in Morton key order, as
/// the loader collects them: keys and values apart (the run's own layout)
/// and their value bytes counted on the way.
#[derive(Default)]
pub(crate) struct SortedCells {
    /// Sorted keys, one per value: Morton keys from a checkpoint file (for
    /// `load_sorted_cells`), the namespace's curve keys from its runs (for
    /// `load_curve_cells`).
    pub keys: Vec<u128>,
    pub values: Vec<CellValue>,
    pub value_bytes: u64,
}

/// One reader's note of the namespace it read last, so that a stream of
/// point reads (a connection's `get`s) skips the namespace table: its
/// shared read lock and the name's hash cost about as much as the lookup
/// itself (`memstore-1M/get-memo` against `get-borrowed` in
/// `store/benches/memstore.rs`). It also holds a [`BaseReader`] of the
/// namespace's base run, which answers most reads of stored cells without
/// the cells' lock. The note is checked on every use: the base reader
/// against the run being replaced, the namespace against its `dropped`
/// flag (a drop also replaces the run), so it is never stale. What it
/// keeps in memory after a drop or a merge (the replaced run) it lets go
/// of at its next read, or at [`NamespaceMemo::forget`]. Owned by one
/// reader (not shared), and cheap to create.
#[derive(Default)]
pub struct NamespaceMemo {
    last: Option<MemoEntry>,
}

struct MemoEntry {
    name: NamespaceName,
    space: Arc<NamespaceCells>,
    base: BaseReader,
}

impl NamespaceMemo {
    /// Lets go of the namespace and its base run, so an idle reader keeps
    /// nothing alive that a drop or a merge has replaced; the next read
    /// looks the namespace up again.
    pub fn forget(&mut self) {
        self.last = None;
    }

    /// Whether the memo holds a namespace (for tests of who calls
    /// [`NamespaceMemo::forget`]).
    pub fn is_empty(&self) -> bool {
        self.last.is_none()
    }
}

/// Cells of every namespace. Cheap to share: clone the `Arc`.
pub struct MemStore {
    namespaces: RwLock<HashMap<NamespaceName, Arc<NamespaceCells>, CoordHashBuilder>>,
    /// Merges namespaces' frozen deltas into their sorted bases.
    compactor: Compactor,
    /// Cell programs and their run telemetry (`crate::programs`).
    pub(crate) programs: crate::programs::ProgramTable,
    /// Which namespaces are in memory and which on disk.
    pub(crate) tiering: Tiering,
}

/// A poisoned lock means a thread panicked while holding it; the data under
/// it is plain maps that a panic cannot leave half-updated in a way that
/// matters more than stopping service, so keep serving.
pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A `Mutex`'s lock, by the same rule as [`read`] and [`write`].
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl MemStore {
    /// A store holding only the empty `default` namespace.
    pub fn new() -> MemStore {
        MemStore::with_tiers(TierConfig::all_in_memory())
    }

    /// A store whose cells move to their run files past `config`'s budget.
    pub fn with_tiers(config: TierConfig) -> MemStore {
        let store = MemStore {
            namespaces: RwLock::new(HashMap::default()),
            compactor: Compactor::start(),
            programs: Default::default(),
            tiering: Tiering::new(config),
        };
        if let Ok(default) = NamespaceName::new("default") {
            write(&store.namespaces).insert(
                default,
                Arc::new(NamespaceCells::new(NamespaceMeta::implicit_default(0))),
            );
        }
        store
    }

    /// A namespace's metadata, or `None` if it does not exist.
    pub fn namespace_meta(&self, ns: &NamespaceName) -> Option<NamespaceMeta> {
        Some(read(&self.namespace(ns)?.meta).clone())
    }

    /// A namespace's quota, or `None` if it does not exist.
    pub fn namespace_quota(&self, ns: &NamespaceName) -> Option<Quota> {
        Some(self.namespace(ns)?.quota)
    }

    /// The id of an encrypted namespace (`None`: not encrypted, or absent).
    pub fn sealed_id(&self, ns: &NamespaceName) -> Option<u64> {
        let space = self.namespace(ns)?;
        space.encrypted.then_some(space.id)
    }

    /// A namespace's id, or `None` if it does not exist.
    pub fn namespace_id(&self, ns: &NamespaceName) -> Option<u64> {
        Some(self.namespace(ns)?.id)
    }

    /// What a namespace holds, or `None` if it does not exist.
    /// A namespace's use; `bytes` is what counts against `max-bytes`:
    /// cell values, programs, kept telemetry and edges
    /// (`crate::namespace::Usage`).
    pub fn namespace_usage(&self, ns: &NamespaceName) -> Option<Usage> {
        let space = self.namespace(ns)?;
        let mut usage = space.usage();
        usage.bytes = usage
            .bytes
            .saturating_add(space.program_bytes.load(Ordering::Relaxed))
            .saturating_add(
                usage
                    .edges
                    .saturating_mul(crate::namespace::EDGE_CHARGE_BYTES),
            );
        Some(usage)
    }

    /// How many namespaces `uid` owns (for the per-owner limit): no
    /// metadata is copied.
    pub fn namespaces_owned_by(&self, uid: u32) -> usize {
        read(&self.namespaces)
            .values()
            .filter(|space| read(&space.meta).owner_uid == uid)
            .count()
    }

    /// Every namespace with its metadata, sorted by name.
    pub fn namespace_list(&self) -> Vec<(NamespaceName, NamespaceMeta)> {
        let mut list: Vec<(NamespaceName, NamespaceMeta)> = read(&self.namespaces)
            .iter()
            .map(|(name, space)| (name.clone(), read(&space.meta).clone()))
            .collect();
        list.sort_by(|a, b| a.0.cmp(&b.0));
        list
    }

    /// Applies a namespace record: creates (replacing a namespace of the
    /// same name but another id, as a drop would have), alters or drops.
    fn apply_namespace_change(&self, mutation: &Mutation) -> bool {
        match mutation {
            Mutation::NamespaceCreate { ns, meta } => {
                let namespaces = read(&self.namespaces);
                if let Some(space) = namespaces.get(ns)
                    && space.id == meta.id
                {
                    *write(&space.meta) = meta.clone();
                    return true;
                }
                // The old namespace is retired before the table changes (as
                // for a drop, below), so no read can see the new namespace
                // and then the old one's cells.
                let replaced = namespaces.get(ns).cloned();
                drop(namespaces);
                if let Some(old) = &replaced {
                    old.retire(&self.tiering);
                    self.programs.drop_namespace(ns);
                }
                write(&self.namespaces)
                    .insert(ns.clone(), Arc::new(NamespaceCells::new(meta.clone())));
                replaced.is_some()
            }
            Mutation::NamespaceAlter { ns, meta } => match self.namespace(ns) {
                Some(space) => {
                    *write(&space.meta) = meta.clone();
                    true
                }
                None => false,
            },
            Mutation::NamespaceDrop { ns } => {
                // Retired (flagged and emptied) before it leaves the table.
                // The other way round, a read through the table could find
                // the namespace gone while a connection's memo, which skips
                // the table, still answered from the old cells until the
                // flag was set: a later read seeing an earlier state. Now
                // every path sees the flag first; table readers check it
                // under the cells lock. Only this thread changes the table,
                // so the namespace found is the one removed.
                let dropped = self.namespace(ns);
                if let Some(old) = &dropped {
                    old.retire(&self.tiering);
                    let removed = write(&self.namespaces).remove(ns);
                    assert!(
                        removed.is_some_and(|removed| Arc::ptr_eq(&removed, old)),
                        "namespace {ns} changed in the table while it was dropped"
                    );
                }
                self.programs.drop_namespace(ns);
                dropped.is_some()
            }
            _ => false,
        }
    }

    pub(crate) fn namespace(&self, ns: &NamespaceName) -> Option<Arc<NamespaceCells>> {
        read(&self.namespaces).get(ns).cloned()
    }

    pub(crate) fn namespaces(&self) -> Vec<Arc<NamespaceCells>> {
        read(&self.namespaces).values().cloned().collect()
    }

    pub fn namespace_count(&self) -> usize {
        read(&self.namespaces).len()
    }

    pub fn has_namespace(&self, ns: &NamespaceName) -> bool {
        read(&self.namespaces).contains_key(ns)
    }

    /// Creates an empty namespace whose cells are ordered along `curve`.
    /// Returns `false` (and changes nothing) if it already exists.
    pub fn create_namespace(&self, ns: &NamespaceName, curve: Curve) -> bool {
        let mut namespaces = write(&self.namespaces);
        if namespaces.contains_key(ns) {
            return false;
        }
        let mut meta = NamespaceMeta::implicit_default(0);
        meta.curve = curve;
        meta.id = u64::MAX - namespaces.len() as u64;
        namespaces.insert(ns.clone(), Arc::new(NamespaceCells::new(meta)));
        true
    }

    /// Loads a namespace's cells from a checkpoint base, given in Morton
    /// key order. An empty Morton namespace gets them as one sorted run
    /// (no per-cell inserts); otherwise they are inserted one by one under
    /// the namespace's own curve. Only for startup, before any reader.
    /// Returns `false` if the namespace does not exist.
    pub(crate) fn load_sorted_cells(&self, ns: &NamespaceName, sorted: SortedCells) -> bool {
        let Some(space) = self.namespace(ns) else {
            return false;
        };
        let mut cells = write(&space.cells);
        space
            .value_bytes
            .fetch_add(sorted.value_bytes, Ordering::Relaxed);
        // A version-1/2 checkpoint's cells are always loaded into memory
        // (its next compaction writes them as runs).
        self.tiering
            .add_resident(resident_cost_bytes(sorted.keys.len() as u64, sorted.value_bytes) as i64);
        if space.curve == Curve::Morton && cells.len() == 0 {
            *cells = Cells::from_sorted_columns(sorted.keys, sorted.values);
        } else {
            for (morton, value) in sorted.keys.into_iter().zip(sorted.values) {
                let coord = crate::curve::morton_decode(morton);
                cells.insert(space.curve.key(coord), value);
            }
        }
        true
    }

    /// Loads a namespace's cells from its run files, given in the
    /// namespace's own curve key order (each key once, no deletes): into
    /// an empty namespace as one sorted run, otherwise merged over what it
    /// holds. Only for startup, before any reader. Returns `false` if the
    /// namespace does not exist.
    pub(crate) fn load_curve_cells(&self, ns: &NamespaceName, sorted: SortedCells) -> bool {
        let Some(space) = self.namespace(ns) else {
            return false;
        };
        let mut cells = write(&space.cells);
        if cells.len() == 0 {
            space
                .value_bytes
                .fetch_add(sorted.value_bytes, Ordering::Relaxed);
            *cells = Cells::from_sorted_columns(sorted.keys, sorted.values);
        } else {
            let batch = sorted
                .keys
                .into_iter()
                .zip(sorted.values.into_iter().map(Some))
                .collect();
            let bytes = cells.apply_sorted(batch);
            space.add_value_bytes(bytes);
        }
        true
    }

    /// After recovery: has the compactor index every namespace's base run
    /// for point reads (and merge any delta that recovery left due), in
    /// the background, so the daemon starts serving without waiting.
    pub(crate) fn index_after_recovery(&self) {
        for space in read(&self.namespaces).values() {
            self.compactor.index_later(space, |space| &space.cells);
        }
    }

    /// Applies cell writes sorted by curve key, each key once (`None`
    /// deletes), in one merge (`CellMap::apply_sorted`): for replay at
    /// startup. `false` if the namespace does not exist.
    pub(crate) fn apply_sorted_cells(
        &self,
        ns: &NamespaceName,
        batch: Vec<(u128, Option<CellValue>)>,
        lsn: u64,
    ) -> bool {
        let Some(space) = self.namespace(ns) else {
            return false;
        };
        let mut cells = write(&space.cells);
        if space.on_disk() {
            // Each write goes to the memtable, counted against what the
            // runs hold.
            drop(cells);
            self.apply_sorted_on_disk(&space, batch, lsn);
            self.tiering.set_applied(lsn);
            return true;
        }
        if space.tier.get() != TIER_MEMORY {
            // Migrating: the memtable gets the writes too.
            let mut stack = write(&space.disk);
            let memtable_before = stack.memtable_bytes();
            for (key, slot) in &batch {
                let previous = cells.get(key).map(|v| v.len());
                stack.apply(*key, slot.clone(), lsn, previous);
            }
            self.tiering
                .add_memtable(stack.memtable_bytes() as i64 - memtable_before as i64);
        }
        let len_before = cells.len();
        let bytes = cells.apply_sorted(batch);
        space.add_value_bytes(bytes);
        let cells_delta = cells.len() as i64 - len_before as i64;
        let in_memory = space.tier.get() == TIER_MEMORY;
        drop(cells);
        if in_memory {
            self.tiering.add_resident(
                cells_delta * crate::disk_tier::RESIDENT_CELL_OVERHEAD_BYTES as i64 + bytes,
            );
        }
        self.tiering.set_applied(lsn);
        self.after_group(lsn);
        true
    }

    /// The curve a namespace was created with.
    pub fn curve(&self, ns: &NamespaceName) -> Option<Curve> {
        Some(self.namespace(ns)?.curve)
    }

    /// Reads the cells of `region` in curve order, starting strictly after
    /// the position `after` (a cursor from an earlier page) or at the start.
    /// `visit` is called for each stored cell inside the box, under the
    /// namespace's read lock, so it must be quick (copy the value out; do
    /// no I/O). Stops at `limits` and returns a cursor. `None` means no such
    /// namespace.
    ///
    /// Not a snapshot: a scan concurrent with writes sees each cell either
    /// before or after each write to it, never a torn value, and never a
    /// write that is not durable (the writer applies only synced groups).
    pub fn scan(
        &self,
        ns: &NamespaceName,
        region: &CellBox,
        after: Option<Coord>,
        limits: ScanLimits,
        mut visit: impl FnMut(Coord, &[u8]) -> Visit,
    ) -> Option<Result<ScanOutcome, StoreError>> {
        let space = self.namespace(ns)?;
        let mut decoder = Decoder::new(space.curve);
        Some(scan_space(
            &space,
            region,
            after,
            limits,
            &mut |key, value: &[u8]| visit(decoder.decode(key), value),
        ))
    }

    /// Counts the cells of `region` (after `after`), like [`MemStore::scan`]
    /// but without decoding or copying anything: time is proportional to
    /// the stored cells met, never to the box's volume.
    pub fn count(
        &self,
        ns: &NamespaceName,
        region: &CellBox,
        after: Option<Coord>,
        limits: ScanLimits,
    ) -> Option<Result<ScanOutcome, StoreError>> {
        let space = self.namespace(ns)?;
        Some(scan_space(&space, region, after, limits, &mut |_, _| {
            Visit::Take
        }))
    }

    /// `None` for a missing namespace, `Some(Ok(None))` for a missing
    /// cell, `Some(Err)` for a run file that could not be read (a namespace
    /// on disk: the error names the file and offset).
    pub fn get(
        &self,
        ns: &NamespaceName,
        coord: Coord,
    ) -> Option<Result<Option<CellValue>, StoreError>> {
        self.read_cell(ns, coord, |value| value.cloned())
    }

    /// Calls `read` with the value at `coord` (`None`: no cell) under the
    /// namespace's read lock, and returns what it returns; `None` if there
    /// is no such namespace. For readers that copy the bytes out anyway
    /// (the server's `get` reply): no `Arc` clone and drop, which are two
    /// locked writes to the value's cold cache line, and which stop the
    /// CPU from overlapping one read's cache misses with the next's.
    /// `read` runs under the lock, so it must be short.
    pub fn read_cell<R>(
        &self,
        ns: &NamespaceName,
        coord: Coord,
        read_value: impl FnOnce(Option<&CellValue>) -> R,
    ) -> Option<Result<R, StoreError>> {
        // The namespace is borrowed under the map's read lock rather than
        // its `Arc` cloned (`MemStore::namespace`): that is two fewer
        // locked read-modify-writes. Lock order `namespaces` then `cells`,
        // as `cell_count`; nothing takes `namespaces` while holding a
        // `cells` write lock.
        let namespaces = read(&self.namespaces);
        let space = namespaces.get(ns)?;
        let cells = read(&space.cells);
        // Retired but not yet out of the table: already gone.
        if space.is_dropped() {
            return None;
        }
        if space.on_disk() {
            // The disk read is done holding neither lock.
            let space = Arc::clone(space);
            drop(cells);
            drop(namespaces);
            return space.read_disk(space.curve.key(coord), read_value);
        }
        Some(Ok(read_value(cells.get(&space.curve.key(coord)))))
    }

    /// [`MemStore::read_cell`] for a reader that reads many cells one at a
    /// time: the namespace comes from `memo` while it is still the live
    /// one, and the table is consulted (and `memo` updated) only when the
    /// name changes or the namespace was dropped.
    pub fn read_cell_memo<R>(
        &self,
        memo: &mut NamespaceMemo,
        ns: &NamespaceName,
        coord: Coord,
        read_value: impl FnOnce(Option<&CellValue>) -> R,
    ) -> Option<Result<R, StoreError>> {
        if let Some(MemoEntry { name, space, base }) = &mut memo.last
            && name == ns
        {
            let key = space.curve.key(coord);
            let not_in_run = match base.get(key) {
                BaseRead::Current(value) => return Some(Ok(read_value(Some(value)))),
                BaseRead::NotInBase => true,
                BaseRead::AskTheMap => false,
            };
            let cells = read(&space.cells);
            if !space.is_dropped() && space.on_disk() {
                drop(cells);
                return space.read_disk(key, read_value);
            }
            if !space.is_dropped() {
                let value = if not_in_run {
                    cells.get_beyond(key, base)
                } else {
                    cells.get(&key)
                };
                let answer = read_value(value);
                if !base.is_current() {
                    *base = cells.base_reader();
                }
                return Some(Ok(answer));
            }
        }
        memo.last = None;
        let space = self.namespace(ns)?;
        let (found, base) = {
            let cells = read(&space.cells);
            // Dropped since the table lookup: it is gone.
            if space.is_dropped() {
                return None;
            }
            if space.on_disk() {
                drop(cells);
                let found = space.read_disk(space.curve.key(coord), read_value);
                // The memo's base reader is the emptied map's: it answers
                // nothing, and the next read finds the tier again.
                let base = read(&space.cells).base_reader();
                memo.last = Some(MemoEntry {
                    name: ns.clone(),
                    space,
                    base,
                });
                return found;
            }
            (
                Ok(read_value(cells.get(&space.curve.key(coord)))),
                cells.base_reader(),
            )
        };
        memo.last = Some(MemoEntry {
            name: ns.clone(),
            space,
            base,
        });
        Some(found)
    }

    /// Calls `visit(i, value)` with the value at each `coords[i]` (`None`:
    /// no cell), in order, all under one hold of the namespace's read lock,
    /// so the answers come from one state of the store; `None` if there is
    /// no such namespace. Several times faster per cell than one
    /// [`MemStore::read_cell`] each on a store that outgrows the cache,
    /// because the lookups' cache misses overlap (`CellMap::get_many`).
    /// The lock is held for the whole batch, so callers bound its length
    /// (the server's `mget`: `cube_protocol::MAX_MGET_CELLS`), and `visit`
    /// must be short.
    pub fn read_cells(
        &self,
        ns: &NamespaceName,
        coords: &[Coord],
        visit: impl FnMut(usize, Option<&CellValue>),
    ) -> Option<Result<(), StoreError>> {
        let namespaces = read(&self.namespaces);
        let space = namespaces.get(ns)?;
        let mut keys = vec![0u128; coords.len()];
        space.curve.keys(coords, &mut keys);
        let cells = read(&space.cells);
        // Retired but not yet out of the table: already gone.
        if space.is_dropped() {
            return None;
        }
        if space.on_disk() {
            let space = Arc::clone(space);
            drop(cells);
            drop(namespaces);
            return space.read_disk_many(&keys, visit);
        }
        cells.get_many(&keys, visit);
        Some(Ok(()))
    }

    /// Applies a durable group in order; `existed` gets, per mutation,
    /// whether the cell (for an edge mutation: the edge) existed before it.
    /// Called only by the writer (and recovery). A run of same-namespace
    /// mutations takes that namespace's cell write lock once per
    /// [`APPLY_SLICE_RECORDS`], so cell readers wait at most one slice, not
    /// a whole group. The run holds the namespace's graph write lock
    /// throughout, so a walk (which holds its read lock) sees either none
    /// or all of the run.
    ///
    /// `lsn` is the group's last LSN: writes to a namespace on disk (or
    /// migrating) are tagged with it, and runs holding it are installed
    /// only once it is applied (`crate::disk_tier`).
    pub fn apply_group(&self, group: &[&Mutation], lsn: u64, existed: &mut Vec<bool>) {
        existed.clear();
        let mut start = 0;
        while start < group.len() {
            if group[start].is_namespace_change() {
                existed.push(self.apply_namespace_change(group[start]));
                start += 1;
                continue;
            }
            let ns = group[start].namespace();
            let end = start
                + group[start..]
                    .iter()
                    .take_while(|m| m.namespace() == ns && !m.is_namespace_change())
                    .count();
            match self.namespace(ns) {
                Some(space) => {
                    let mut edges = write(&space.edges);
                    for slice in group[start..end].chunks(APPLY_SLICE_RECORDS) {
                        let cells = write(&space.cells);
                        if space.on_disk() {
                            drop(cells);
                            self.apply_slice_on_disk(&space, &mut edges, slice, lsn, existed);
                        } else {
                            self.apply_slice_in_memory(
                                &space, cells, &mut edges, slice, lsn, existed,
                            );
                        }
                    }
                    drop(edges);
                    if !space.on_disk() {
                        self.compactor.after_write(&space, |space| &space.cells);
                    }
                }
                // The writer checks namespaces before logging; recovery only
                // sees records that passed that check.
                None => existed.extend(std::iter::repeat_n(false, end - start)),
            }
            start = end;
        }
        debug_assert_eq!(existed.len(), group.len());
        self.tiering.set_applied(lsn);
        self.after_group(lsn);
    }

    /// One slice of a namespace in memory (or migrating: its memtable
    /// gets the cell writes too), under its `cells` write lock.
    fn apply_slice_in_memory(
        &self,
        space: &NamespaceCells,
        mut cells: RwLockWriteGuard<'_, Cells>,
        edges: &mut EdgeGraph,
        slice: &[&Mutation],
        lsn: u64,
        existed: &mut Vec<bool>,
    ) {
        let migrating = space.tier.get() != TIER_MEMORY;
        let mut stack = migrating.then(|| write(&space.disk));
        let memtable_before = stack.as_ref().map_or(0, |s| s.memtable_bytes());
        let cells_before = cells.len();
        let mut value_bytes = 0i64;
        let mut program_bytes = 0i64;
        for mutation in slice {
            if let Some(stack) = stack.as_mut()
                && let Some((key, slot)) = cell_write(space.curve, mutation)
            {
                let previous = cells.get(&key).map(|v| v.len());
                stack.apply(key, slot, lsn, previous);
            }
            existed.push(match mutation {
                Mutation::ProgramPut { .. }
                | Mutation::ProgramDel { .. }
                | Mutation::Telemetry { .. } => self.programs.apply(mutation, &mut program_bytes),
                _ => apply_one(&mut cells, edges, space, mutation, &mut value_bytes),
            });
        }
        // Value bytes change only here, under the cells write lock: one
        // atomic per slice, not two per put.
        space.add_value_bytes(value_bytes);
        space.add_program_bytes(program_bytes);
        if migrating {
            let after = stack.as_ref().map_or(0, |s| s.memtable_bytes());
            self.tiering
                .add_memtable(after as i64 - memtable_before as i64);
        } else {
            let cells_delta = cells.len() as i64 - cells_before as i64;
            self.tiering.add_resident(
                cells_delta * crate::disk_tier::RESIDENT_CELL_OVERHEAD_BYTES as i64 + value_bytes,
            );
        }
    }

    pub fn apply(&self, mutation: &Mutation) -> bool {
        let mut existed = Vec::with_capacity(1);
        self.apply_group(&[mutation], 0, &mut existed);
        existed.first().copied().unwrap_or(false)
    }

    /// Total cells across namespaces (for stats; takes each read lock briefly).
    pub fn cell_count(&self) -> u64 {
        read(&self.namespaces)
            .values()
            .map(|space| space.cell_count())
            .sum()
    }
}

impl Default for MemStore {
    fn default() -> MemStore {
        MemStore::new()
    }
}

/// Applies one cell or edge mutation; adds the change in value bytes to
/// `value_bytes` (the caller publishes a slice's total at once, still under
/// the cells write lock).
fn apply_one(
    cells: &mut Cells,
    edges: &mut EdgeGraph,
    space: &NamespaceCells,
    mutation: &Mutation,
    value_bytes: &mut i64,
) -> bool {
    let curve = space.curve;
    let mut removed = |old_len: Option<usize>| match old_len {
        Some(len) => {
            *value_bytes -= len as i64;
            true
        }
        None => false,
    };
    match mutation {
        Mutation::Put { coord, value, .. } => {
            let old = cells.insert(curve.key(*coord), CellValue::new(value));
            let existed = removed(old);
            *value_bytes += value.len() as i64;
            existed
        }
        Mutation::Del { coord, .. } => removed(cells.remove(&curve.key(*coord))),
        Mutation::Link { edge, weight, .. } => edges.link(edge, *weight),
        Mutation::Unlink { edge, .. } => edges.unlink(edge),
        Mutation::Detach {
            coord,
            edges: incident,
            ..
        } => {
            edges.unlink_all(incident);
            removed(cells.remove(&curve.key(*coord)))
        }
        // Applied by `MemStore::apply_group` through its program table or
        // as namespace changes.
        Mutation::ProgramPut { .. }
        | Mutation::ProgramDel { .. }
        | Mutation::Telemetry { .. }
        | Mutation::NamespaceCreate { .. }
        | Mutation::NamespaceDrop { .. }
        | Mutation::NamespaceAlter { .. } => false,
    }
}

/// One page of a scan: slices of at most [`SCAN_SLICE_STEPS`] under the
/// read lock, until the box, the page or the step budget ends.
fn scan_space(
    space: &NamespaceCells,
    region: &CellBox,
    after: Option<Coord>,
    limits: ScanLimits,
    visit: &mut impl FnMut(u128, &[u8]) -> Visit,
) -> Result<ScanOutcome, StoreError> {
    let Some(from) = start_key(space.curve, after) else {
        return Ok(ScanOutcome::default());
    };
    let max_steps = limits.max_steps.max(1);
    let max_cells = limits.max_cells.max(1);
    let mut state = ScanState::new(space.curve, region, from);
    loop {
        let steps = (max_steps - state.outcome.visited).min(SCAN_SLICE_STEPS);
        let end = {
            let cells = read(&space.cells);
            if space.on_disk() {
                drop(cells);
                // Block reads may happen under this lock (the writer waits
                // for the slice), so a slice on disk is shorter.
                let steps = steps.min(DISK_SCAN_SLICE_STEPS);
                let stack = read(&space.disk);
                state.chunk_stack(&stack, steps, max_cells, visit)?
            } else {
                state.chunk(&cells, steps, max_cells, &mut |key, value: &CellValue| {
                    visit(key, value)
                })
            }
        };
        let resume_after = match end {
            ChunkEnd::Done => return Ok(state.outcome),
            ChunkEnd::Stopped(key) => key,
            ChunkEnd::Paused(key) if state.outcome.visited >= max_steps => key,
            ChunkEnd::Paused(_) => continue,
        };
        let mut outcome = state.outcome;
        outcome.resume_after = Some(space.curve.decode(resume_after));
        return Ok(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_del_and_missing_namespace() {
        let store = MemStore::new();
        let ns = NamespaceName::new("default").unwrap();
        let c = Coord::new(1, -1, 0);
        assert_eq!(store.get(&ns, c).map(Result::unwrap), Some(None));
        let put = Mutation::Put {
            ns: ns.clone(),
            coord: c,
            value: b"v".to_vec(),
        };
        assert!(!store.apply(&put));
        assert!(store.apply(&put));
        assert_eq!(store.get(&ns, c).unwrap().unwrap().unwrap().as_ref(), b"v");
        assert!(store.apply(&Mutation::Del {
            ns: ns.clone(),
            coord: c
        }));
        assert_eq!(store.get(&ns, c).map(Result::unwrap), Some(None));
        assert_eq!(
            store
                .get(&NamespaceName::new("other").unwrap(), c)
                .map(Result::unwrap),
            None
        );
    }

    fn put(ns: &NamespaceName, c: Coord, value: &[u8]) -> Mutation {
        Mutation::Put {
            ns: ns.clone(),
            coord: c,
            value: value.to_vec(),
        }
    }

    fn create(ns: &NamespaceName, id: u64) -> Mutation {
        let mut meta = NamespaceMeta::implicit_default(0);
        meta.id = id;
        Mutation::NamespaceCreate {
            ns: ns.clone(),
            meta,
        }
    }

    fn memo_read(
        store: &MemStore,
        memo: &mut NamespaceMemo,
        ns: &NamespaceName,
        c: Coord,
    ) -> Option<Option<Vec<u8>>> {
        store
            .read_cell_memo(memo, ns, c, |v| v.map(|v| v.to_vec()))
            .map(Result::unwrap)
    }

    #[test]
    fn a_memo_reads_like_the_table_and_follows_writes_and_names() {
        let store = MemStore::new();
        let (a, b) = (
            NamespaceName::new("a").unwrap(),
            NamespaceName::new("b").unwrap(),
        );
        let c = Coord::new(i32::MIN, 0, i32::MAX);
        let mut memo = NamespaceMemo::default();
        assert_eq!(memo_read(&store, &mut memo, &a, c), None);
        store.apply(&create(&a, 10));
        store.apply(&create(&b, 11));
        assert_eq!(memo_read(&store, &mut memo, &a, c), Some(None));
        store.apply(&put(&a, c, b"in a"));
        store.apply(&put(&b, c, b"in b"));
        for _ in 0..2 {
            assert_eq!(
                memo_read(&store, &mut memo, &a, c),
                Some(Some(b"in a".to_vec()))
            );
            assert_eq!(
                memo_read(&store, &mut memo, &b, c),
                Some(Some(b"in b".to_vec()))
            );
        }
        store.apply(&put(&a, c, b"again"));
        assert_eq!(
            memo_read(&store, &mut memo, &a, c),
            Some(Some(b"again".to_vec()))
        );
        assert_eq!(
            memo_read(&store, &mut memo, &NamespaceName::new("c").unwrap(), c),
            None
        );
    }

    #[test]
    fn a_memo_never_reads_a_dropped_or_replaced_namespace_nor_keeps_its_cells() {
        let store = MemStore::new();
        let ns = NamespaceName::new("gone").unwrap();
        let c = Coord::new(-5, 6, -7);
        store.apply(&create(&ns, 20));
        // Longer than the inline limit: the store shares its allocation.
        let old = [b'o'; 40];
        store.apply(&put(&ns, c, &old));
        let mut memo = NamespaceMemo::default();
        assert_eq!(
            memo_read(&store, &mut memo, &ns, c),
            Some(Some(old.to_vec()))
        );
        let value = store.get(&ns, c).unwrap().unwrap().unwrap();
        assert_eq!(value.shared_count(), Some(2), "the store and this test");

        store.apply(&Mutation::NamespaceDrop { ns: ns.clone() });
        // The memo still holds the dropped namespace, but not the delta
        // that held the value (a base run it holds: the next test).
        assert_eq!(value.shared_count(), Some(1));
        assert_eq!(memo_read(&store, &mut memo, &ns, c), None);
        assert!(memo.is_empty());

        store.apply(&create(&ns, 21));
        assert_eq!(memo_read(&store, &mut memo, &ns, c), Some(None));
        store.apply(&put(&ns, c, &[b's'; 40]));
        assert_eq!(
            memo_read(&store, &mut memo, &ns, c),
            Some(Some(vec![b's'; 40]))
        );

        // A create under another id replaces the namespace, as a drop would.
        let value = store.get(&ns, c).unwrap().unwrap().unwrap();
        store.apply(&create(&ns, 22));
        assert_eq!(memo_read(&store, &mut memo, &ns, c), Some(None));
        assert_eq!(value.shared_count(), Some(1));

        // Forgetting lets go of the live namespace's run too.
        store.apply(&put(&ns, c, &[b'f'; 40]));
        assert!(memo_read(&store, &mut memo, &ns, c).is_some());
        assert!(!memo.is_empty());
        memo.forget();
        assert!(memo.is_empty());
    }
    /// Loads `cells` as `ns`'s base run, as recovery does from a checkpoint
    /// (Morton namespaces only).
    fn load_base(store: &MemStore, ns: &NamespaceName, cells: Vec<(Coord, Vec<u8>)>) {
        let value_bytes = cells.iter().map(|(_, v)| v.len() as u64).sum();
        let mut keyed: Vec<(u128, CellValue)> = cells
            .into_iter()
            .map(|(c, v)| (Curve::Morton.key(c), CellValue::new(&v)))
            .collect();
        keyed.sort_unstable_by_key(|(k, _)| *k);
        let (morton_keys, values) = keyed.into_iter().unzip();
        assert!(store.load_sorted_cells(
            ns,
            SortedCells {
                keys: morton_keys,
                values,
                value_bytes,
            },
        ));
    }

    /// Waits (up to 20 s) for the compactor to finish any merge and give
    /// `ns`'s base its index and complete marks, so that memo reads take
    /// the path without the lock.
    fn wait_for_marks(store: &MemStore, ns: &NamespaceName) {
        let space = store.namespace(ns).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !read(&space.cells).settled_with_marks() {
            assert!(
                std::time::Instant::now() < deadline,
                "marks never completed"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn a_memo_reads_a_base_without_the_lock_and_lets_go_of_it_when_replaced() {
        let store = MemStore::new();
        let ns = NamespaceName::new("based").unwrap();
        store.apply(&create(&ns, 30));
        let coords: Vec<Coord> = (0..64).map(|i| Coord::new(i, -i, 3)).collect();
        let value = |i: usize| vec![b'a' + (i % 26) as u8; 40];
        let cells = coords.iter().enumerate().map(|(i, c)| (*c, value(i)));
        load_base(&store, &ns, cells.collect());
        store.index_after_recovery();
        wait_for_marks(&store, &ns);

        let mut memo = NamespaceMemo::default();
        for (i, c) in coords.iter().enumerate() {
            assert_eq!(memo_read(&store, &mut memo, &ns, *c), Some(Some(value(i))));
        }
        // A write after the marks completed marks its key: the memo must
        // see it, not the base's older value.
        store.apply(&put(&ns, coords[7], b"new"));
        assert_eq!(
            memo_read(&store, &mut memo, &ns, coords[7]),
            Some(Some(b"new".to_vec()))
        );
        store.apply(&Mutation::Del {
            ns: ns.clone(),
            coord: coords[8],
        });
        assert_eq!(memo_read(&store, &mut memo, &ns, coords[8]), Some(None));

        // After a drop the memo still holds the old run (the value's only
        // other holder) but never answers from it; its next read finds the
        // namespace gone and lets go.
        let held = store.get(&ns, coords[0]).unwrap().unwrap().unwrap();
        assert_eq!(held.shared_count(), Some(2), "the base run and this test");
        store.apply(&Mutation::NamespaceDrop { ns: ns.clone() });
        assert_eq!(held.shared_count(), Some(2), "the memo's run");
        assert_eq!(memo_read(&store, &mut memo, &ns, coords[0]), None);
        assert_eq!(held.shared_count(), Some(1));
        assert!(memo.is_empty());
    }

    /// A drop (or a replacing create) held up half way, as a walk holding
    /// the graph's read lock holds it: every reader, through the table or
    /// through a memo that skips it, must still see the old namespace, and
    /// all see it gone once the drop is through. Regression guard: the table
    /// used to change first, so a table read said "gone" while a memo still
    /// answered from the old cells.
    #[test]
    fn a_drop_held_up_half_way_is_seen_alike_through_the_table_and_a_memo() {
        for replace in [false, true] {
            let store = Arc::new(MemStore::new());
            let ns = NamespaceName::new("held").unwrap();
            store.apply(&create(&ns, 40));
            let c = Coord::new(2, 3, 4);
            load_base(&store, &ns, vec![(c, b"old-value".to_vec())]);
            store.index_after_recovery();
            wait_for_marks(&store, &ns);
            let mut memo = NamespaceMemo::default();
            let old = Some(Some(b"old-value".to_vec()));
            assert_eq!(memo_read(&store, &mut memo, &ns, c), old);

            let space = store.namespace(&ns).unwrap();
            let walk = read(&space.edges);
            let change = if replace {
                create(&ns, 41)
            } else {
                Mutation::NamespaceDrop { ns: ns.clone() }
            };
            let writer = {
                let store = Arc::clone(&store);
                std::thread::spawn(move || store.apply(&change))
            };
            // Long enough for the writer to reach the graph's lock.
            std::thread::sleep(std::time::Duration::from_millis(200));
            assert!(!writer.is_finished(), "the drop waits for the walk");
            let table = store
                .get(&ns, c)
                .map(Result::unwrap)
                .map(|v| v.map(|v| v.as_ref().to_vec()));
            assert_eq!(table, old, "replace {replace}: a table read mid-drop");
            assert_eq!(memo_read(&store, &mut memo, &ns, c), old);
            drop(walk);
            assert!(writer.join().unwrap());
            let gone = if replace { Some(None) } else { None };
            let table = store
                .get(&ns, c)
                .map(Result::unwrap)
                .map(|v| v.map(|v| v.as_ref().to_vec()));
            assert_eq!(table, gone);
            assert_eq!(memo_read(&store, &mut memo, &ns, c), gone);
        }
    }

    /// `usage` (for `stats`, `ns info`, `ns drop`) never holds the cells'
    /// lock while it waits for the graph's, which the writer takes first
    /// (a past bug: a `stats` under writes deadlocked the writer).
    #[test]
    fn usage_keeps_the_lock_order_of_the_writer() {
        let store = Arc::new(MemStore::new());
        let ns = NamespaceName::new("ordered").unwrap();
        store.apply(&create(&ns, 50));
        let space = store.namespace(&ns).unwrap();
        let writer_graph = write(&space.edges);
        let reader = {
            let store = Arc::clone(&store);
            let ns = ns.clone();
            std::thread::spawn(move || store.namespace_usage(&ns))
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!reader.is_finished(), "usage waits for the graph");
        // What the writer does next: take the cells with the graph held.
        assert!(
            space.cells.try_write().is_ok(),
            "usage holds the cells' lock while it waits for the graph's"
        );
        drop(writer_graph);
        assert!(reader.join().unwrap().is_some());
    }

    #[test]
    fn a_memo_follows_a_merge_and_forgets_on_request() {
        let store = MemStore::new();
        let ns = NamespaceName::new("merged").unwrap();
        store.apply(&create(&ns, 40));
        let c = Coord::new(1, 2, 3);
        store.apply(&put(&ns, c, &[b'x'; 40]));
        // Enough writes that the delta freezes and merges into the base.
        let mut existed = Vec::new();
        for round in 0..4 {
            let group: Vec<Mutation> = (0..crate::cells::MIN_DELTA_ENTRIES)
                .map(|i| put(&ns, Coord::new(i as i32, round, 9), b"v"))
                .collect();
            let refs: Vec<&Mutation> = group.iter().collect();
            store.apply_group(&refs, 0, &mut existed);
        }
        wait_for_marks(&store, &ns);
        let mut memo = NamespaceMemo::default();
        assert_eq!(
            memo_read(&store, &mut memo, &ns, c),
            Some(Some(vec![b'x'; 40]))
        );
        let held = store.get(&ns, c).unwrap().unwrap().unwrap();
        assert_eq!(held.shared_count(), Some(2), "the base run and this test");
        // Another merge replaces the run the memo holds.
        for round in 4..8 {
            let group: Vec<Mutation> = (0..crate::cells::MIN_DELTA_ENTRIES)
                .map(|i| put(&ns, Coord::new(i as i32, round, 9), b"v"))
                .collect();
            let refs: Vec<&Mutation> = group.iter().collect();
            store.apply_group(&refs, 0, &mut existed);
        }
        wait_for_marks(&store, &ns);
        // The replaced run shares the value with the new one; the memo's
        // next read moves to the new run and the old one is freed.
        assert_eq!(held.shared_count(), Some(3), "new run, old run, test");
        assert_eq!(
            memo_read(&store, &mut memo, &ns, c),
            Some(Some(vec![b'x'; 40]))
        );
        assert_eq!(held.shared_count(), Some(2));
        memo.forget();
        assert!(memo.is_empty());
        assert_eq!(
            memo_read(&store, &mut memo, &ns, c),
            Some(Some(vec![b'x'; 40]))
        );
    }
}

#[cfg(test)]
mod point_read_probe {
    use super::*;
    use crate::mutation::Mutation;
    use std::time::Instant;

    const SIDE: i32 = 100;

    fn value(c: Coord) -> Vec<u8> {
        (c.x as u64 ^ (c.y as u64) << 20 ^ (c.z as u64) << 40)
            .to_le_bytes()
            .to_vec()
    }

    fn cube() -> impl Iterator<Item = Coord> {
        (0..SIDE)
            .flat_map(|x| (0..SIDE).flat_map(move |y| (0..SIDE).map(move |z| Coord::new(x, y, z))))
    }

    /// A random `get` (through a connection's memo) on a 1 M-cell
    /// Morton namespace in two states, measured alternately in one
    /// process: written as clients write (groups of 4096 puts; the last
    /// ~66 k cells are still in the delta, as in `benches/memstore.rs`),
    /// and restored from a checkpoint (everything in the base). The gap
    /// is what a live delta costs reads that do not hit it. Prints ns a
    /// read.
    #[test]
    #[ignore = "timing probe"]
    fn get_with_and_without_a_delta() {
        let ns = NamespaceName::new("m").unwrap();
        let live = MemStore::new();
        live.create_namespace(&ns, Curve::Morton);
        let mut existed = Vec::new();
        let puts: Vec<Mutation> = cube()
            .map(|c| Mutation::Put {
                ns: ns.clone(),
                coord: c,
                value: value(c),
            })
            .collect();
        for group in puts.chunks(4096) {
            let refs: Vec<&Mutation> = group.iter().collect();
            live.apply_group(&refs, 0, &mut existed);
        }
        let restored = MemStore::new();
        restored.create_namespace(&ns, Curve::Morton);
        let mut cells: Vec<(u128, CellValue)> = cube()
            .map(|c| (crate::curve::morton_key(c), CellValue::new(&value(c))))
            .collect();
        cells.sort_unstable_by_key(|(k, _)| *k);
        let (morton_keys, values) = cells.into_iter().unzip();
        restored.load_sorted_cells(
            &ns,
            SortedCells {
                keys: morton_keys,
                values,
                value_bytes: 0,
            },
        );
        restored.index_after_recovery();
        // The compactor's merges, indexes and marks.
        std::thread::sleep(std::time::Duration::from_secs(2));
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % SIDE as u64) as i32
        };
        let probes: Vec<Coord> = (0..4096)
            .map(|_| Coord::new(next(), next(), next()))
            .collect();
        let rounds = 50;
        let mut times: [Vec<f64>; 2] = Default::default();
        for _ in 0..16 {
            for (i, store) in [&live, &restored].into_iter().enumerate() {
                let mut memo = NamespaceMemo::default();
                let mut sum = 0usize;
                let t = Instant::now();
                for _ in 0..rounds {
                    for c in &probes {
                        sum += store
                            .read_cell_memo(&mut memo, &ns, *c, |v| {
                                v.map_or(0, |v| v.len() + usize::from(v[0]))
                            })
                            .unwrap()
                            .unwrap();
                    }
                }
                times[i].push(t.elapsed().as_nanos() as f64 / (rounds * probes.len()) as f64);
                std::hint::black_box(sum);
            }
        }
        for (name, mut t) in ["live delta", "restored"].into_iter().zip(times) {
            t.sort_by(f64::total_cmp);
            println!(
                "{name}: ns a get: min {:.1}, p25 {:.1}, median {:.1}",
                t[0],
                t[t.len() / 4],
                t[t.len() / 2]
            );
        }
    }

    /// A random `get` of a 1 M-cell namespace restored from a checkpoint
    /// (all in an indexed, fully marked base), two ways alternately in one
    /// process: through the memo as the server reads (the base reader, no
    /// lock), and through the same namespace under the cells' read lock
    /// (the memo's read before the base reader); stored cells, then empty
    /// ones. For each curve, prints ns a get and the ratios of the
    /// medians.
    #[test]
    #[ignore = "timing probe"]
    fn get_without_and_with_the_lock() {
        for curve in Curve::ALL {
            let ns = NamespaceName::new("m").unwrap();
            let store = MemStore::new();
            store.create_namespace(&ns, curve);
            let mut cells: Vec<(u128, CellValue)> = cube()
                .map(|c| (crate::curve::morton_key(c), CellValue::new(&value(c))))
                .collect();
            cells.sort_unstable_by_key(|(k, _)| *k);
            let (morton_keys, values) = cells.into_iter().unzip();
            store.load_sorted_cells(
                &ns,
                SortedCells {
                    keys: morton_keys,
                    values,
                    value_bytes: 0,
                },
            );
            store.index_after_recovery();
            let space = store.namespace(&ns).unwrap();
            while !read(&space.cells).settled_with_marks() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % SIDE as u64) as i32
            };
            let hits: Vec<Coord> = (0..4096)
                .map(|_| Coord::new(next(), next(), next()))
                .collect();
            // Next to the cube: no such cells.
            let absent: Vec<Coord> = hits
                .iter()
                .map(|c| Coord::new(c.x + SIDE, c.y, c.z))
                .collect();
            let read_value = |v: Option<&CellValue>| v.map_or(0, |v| v.len() + usize::from(v[0]));
            let rounds = 50;
            let mut times: [Vec<f64>; 4] = Default::default();
            for _ in 0..24 {
                for (way, t_way) in times.iter_mut().enumerate() {
                    let probes = if way < 2 { &hits } else { &absent };
                    let mut memo = NamespaceMemo::default();
                    let mut sum = 0usize;
                    let t = Instant::now();
                    for _ in 0..rounds {
                        for c in probes {
                            sum += if way % 2 == 0 {
                                store
                                    .read_cell_memo(&mut memo, &ns, *c, read_value)
                                    .unwrap()
                                    .unwrap()
                            } else {
                                let cells = read(&space.cells);
                                read_value(cells.get(&space.curve.key(*c)))
                            };
                        }
                    }
                    t_way.push(t.elapsed().as_nanos() as f64 / (rounds * probes.len()) as f64);
                    std::hint::black_box(sum);
                }
            }
            let mut medians = [0.0; 4];
            let names = [
                "no lock",
                "read lock",
                "absent, no lock",
                "absent, read lock",
            ];
            for (i, (name, t)) in names.into_iter().zip(&mut times).enumerate() {
                t.sort_by(f64::total_cmp);
                medians[i] = t[t.len() / 2];
                println!(
                    "{curve:?} {name}: ns a get: min {:.1}, p25 {:.1}, median {:.1}, p75 {:.1}",
                    t[0],
                    t[t.len() / 4],
                    t[t.len() / 2],
                    t[t.len() * 3 / 4]
                );
            }
            println!(
                "{curve:?} no lock / read lock: hits {:.2}, absent {:.2}",
                medians[0] / medians[1],
                medians[2] / medians[3]
            );
        }
    }
}
