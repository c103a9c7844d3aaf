//! A namespace's ordered cell map: sorted runs (`SortedRun`: a sorted
//! array of cells; not a program's run).
//!
//! Measured (`store/benches/ordered_structures.rs`, `docs/benchmarks.md`):
//! walking keys in order through a `std` `BTreeMap` that clients filled is
//! pointer chasing across leaves scattered in memory, 10-50x slower than
//! streaming a sorted array, and point reads suffer the same way. So the
//! cells live mostly in one immutable sorted array (the *base*), and
//! recent writes in a small `BTreeMap` (the *delta*, where a delete is a
//! tombstone). When the delta grows past an eighth of the base it is
//! *frozen* (moved aside, still readable) and a background thread merges
//! it with the base into a new base, then swaps it in. The merge runs
//! without any lock held; the swap is a pointer exchange. Readers never
//! wait for a merge and the writer never performs one, so neither sees the
//! merge's cost as latency; the amortised cost is about eight entry copies
//! per write on the other core.
//!
//! [`CellMap`] itself is not synchronised: the namespace's `RwLock` guards
//! it, and [`Compactor`] takes that lock only to read the pieces it merges
//! and to install the result.

use std::collections::BTreeMap;
use std::collections::btree_map;
use std::iter::Peekable;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::thread::JoinHandle;

use crossbeam_channel::{Sender, unbounded};

use crate::delta_filter::DeltaFilter;
use crate::huge_pages::huge_vec;
use crate::key_index::KeyIndex;
use crate::prefetch::prefetch;

pub(crate) type Value = crate::cell_value::CellValue;

/// A delta entry: a value, or a tombstone hiding an older value.
type Slot = Option<Value>;

/// The delta is frozen for merging once it holds this many entries or an
/// eighth of the base, whichever is more: small enough that the delta stays
/// cache-resident, large enough that each merge rewrites the base only
/// after ~base/8 writes.
pub(crate) const MIN_DELTA_ENTRIES: usize = 16 * 1024;
const BASE_TO_DELTA_RATIO: usize = 8;

/// How many keys ahead of its lookup a batched read starts each stage of
/// prefetching ([`CellMap::get_many`]): far enough that a stage's lines
/// arrive before the next stage needs them, near enough that they are
/// still cached.
const PREFETCH_DISTANCE: usize = 8;

/// Keys per fence: the index keeps every 64th key, and every 64th of those.
const FENCE: usize = 64;

/// Keys of each layer [`complete_shadow_marks`] marks per hold of the read
/// lock (a mark is an index lookup, up to ~100 ns cold), so that the writer
/// never waits behind it longer than behind one of its own slices of 256
/// mutations.
const MARK_PASS_CHUNK: usize = 256;

/// Frozen keys whose shadow marks the compactor checks before a merge
/// ([`assert_frozen_keys_marked`]): about 0.4 ms at most, against a merge
/// that copies at least 16 Ki entries and usually a whole base.
const MAX_MARK_CHECKS: usize = 4096;

/// A forward search that has galloped this far goes to the index instead.
const GALLOP_LIMIT: usize = FENCE * FENCE;

/// An overlay layer (delta or frozen delta) met by a [`Seeker`] further
/// back than this many keys is found again by a descent rather than by
/// stepping.
const LAYER_STEPS: usize = 8;

/// An immutable sorted run: keys and values in parallel arrays, so a
/// search touches only keys, plus a two-level index of every 64th key and
/// every 64th of those. A plain binary search over 1 M keys (16 MiB) misses
/// the cache and the TLB on most of its 20 probes (measured 0.5-0.9 us on
/// this project's VMs); with the index, the top two levels stay cached
/// (4 KiB and 256 KiB) and the last search covers 1 KiB of keys. Point
/// reads go faster still through a hash index ([`KeyIndex`]) that the
/// compactor thread adds once the run exists; until then (or if it could
/// not be built) they use the fences.
#[derive(Default)]
struct SortedRun {
    keys: Vec<u128>,
    values: Vec<Value>,
    fence: Vec<u128>,
    top: Vec<u128>,
    /// Set once, off the read and write paths (`SortedRun::build_index`);
    /// `Some(None)`: tried, and the run is read through its fences.
    index: OnceLock<Option<KeyIndex>>,
    /// Whether the index's shadow marks are complete: every key that the
    /// cell map's delta or frozen delta holds, and this run too, is
    /// marked. Then a point read that finds an unmarked key here answers
    /// at once, without the delta's filter and tree (a further cache miss
    /// or more on every read while a delta exists). Set by
    /// [`complete_shadow_marks`] once the index exists, and true from then
    /// on: the writer marks each key entering the delta
    /// ([`CellMap::note_new_delta_key`]), and a merge makes a new run.
    shadows_complete: AtomicBool,
    /// Set, under the map's write lock, once the run is no longer its
    /// map's base (a merge replaced it, or the map was retired or
    /// dropped), and never cleared. From then on the writer marks new
    /// delta keys in the new base only, so a [`BaseReader`] must stop
    /// answering from this run.
    superseded: AtomicBool,
}

impl SortedRun {
    fn new(keys: Vec<u128>, values: Vec<Value>) -> SortedRun {
        let fence: Vec<u128> = keys.iter().step_by(FENCE).copied().collect();
        let top: Vec<u128> = fence.iter().step_by(FENCE).copied().collect();
        SortedRun {
            keys,
            values,
            fence,
            top,
            index: OnceLock::new(),
            shadows_complete: AtomicBool::new(false),
            superseded: AtomicBool::new(false),
        }
    }

    /// Builds the point-read index if it is not there yet. Costs about
    /// 25 ms per million keys, so only the compactor thread calls it.
    fn build_index(&self) {
        self.index.get_or_init(|| KeyIndex::build(&self.keys));
    }

    /// The index of `key`, if the run holds it: through the hash index
    /// when it is built, else through the fences.
    #[inline]
    fn find(&self, key: u128) -> Option<usize> {
        match self.index.get() {
            Some(Some(index)) => index.find(&self.keys, key),
            _ => self.position(key).ok(),
        }
    }

    /// Like `binary_search` on `keys`.
    #[inline]
    fn position(&self, key: u128) -> Result<usize, usize> {
        let t = self.top.partition_point(|k| *k <= key);
        if t == 0 {
            return Err(0);
        }
        let f_lo = (t - 1) * FENCE;
        let f_hi = (t * FENCE).min(self.fence.len());
        // fence[f_lo] == top[t - 1] <= key, so f >= f_lo + 1.
        let f = f_lo + self.fence[f_lo..f_hi].partition_point(|k| *k <= key);
        let k_lo = (f - 1) * FENCE;
        let k_hi = (f * FENCE).min(self.keys.len());
        match self.keys[k_lo..k_hi].binary_search(&key) {
            Ok(i) => Ok(k_lo + i),
            Err(i) => Err(k_lo + i),
        }
    }

    /// The first index at or after `from` whose key is >= `key`, given
    /// that every key before `from` is < `key`. A scan moves forward
    /// through the box's runs, so it gallops from where it is: the cost is
    /// the log of the distance travelled (a few probes in cached lines),
    /// not a descent from the top; past [`GALLOP_LIMIT`] the indexed
    /// search is cheaper.
    fn lower_bound_from(&self, from: usize, key: u128) -> usize {
        let keys = &self.keys;
        let len = keys.len();
        if from >= len || keys[from] >= key {
            return from.min(len);
        }
        debug_assert!(from == 0 || keys[from - 1] < key);
        // keys[lo] < key throughout; the answer is in (lo, hi].
        let mut lo = from;
        let mut step = 1;
        let hi = loop {
            let probe = lo + step;
            if probe >= len {
                break len;
            }
            if keys[probe] >= key {
                break probe;
            }
            lo = probe;
            if step >= GALLOP_LIMIT {
                return self.position(key).unwrap_or_else(|i| i);
            }
            step *= 2;
        };
        lo + 1 + keys[lo + 1..hi].partition_point(|k| *k < key)
    }

    fn get(&self, key: u128) -> Option<&Value> {
        self.find(key).map(|i| &self.values[i])
    }

    /// Marks `key` as held by a newer layer too, if this run holds it and
    /// its index is built (before that, the run's marks are incomplete and
    /// [`complete_shadow_marks`] will mark it).
    fn mark_shadowed(&self, key: u128) {
        if let Some(Some(index)) = self.index.get() {
            index.mark_shadowed(&self.keys, key);
        }
    }

    /// The base merged with a frozen delta: newer slots win, tombstones
    /// drop the key.
    fn merge(&self, delta: &BTreeMap<u128, Slot>) -> SortedRun {
        let mut keys = huge_vec(self.keys.len() + delta.len());
        let mut values = huge_vec(self.keys.len() + delta.len());
        let mut base = self.keys.iter().zip(&self.values).peekable();
        for (&key, slot) in delta {
            while let Some((&k, v)) = base.next_if(|(k, _)| **k < key) {
                keys.push(k);
                values.push(v.clone());
            }
            base.next_if(|(k, _)| **k == key);
            if let Some(v) = slot {
                keys.push(key);
                values.push(v.clone());
            }
        }
        for (&k, v) in base {
            keys.push(k);
            values.push(v.clone());
        }
        SortedRun::new(keys, values)
    }
}

/// One reader's own handle on a namespace's base run, which answers most
/// point reads without the cell map's lock.
///
/// Why: a read lock is two locked read-modify-writes per `get`, and a
/// locked instruction is a full barrier on x86, so one read's cache
/// misses cannot overlap the next one's; the lock was a third of a random
/// `get` (`docs/benchmarks-history.md`, "Point reads without the lock").
///
/// Sound because a base run never changes but for its shadow marks, which
/// are only ever added: while the run is its map's base, a key it holds
/// without a mark is in no newer layer, so the run's value is the current
/// one. Once the run is replaced, `superseded` is set (under the map's
/// write lock, before any write the new base alone would record), and the
/// reader falls back to the lock. A read racing the replacement may still
/// answer from the old run, which is then the state at the read's start,
/// so reads stay linearisable.
///
/// Holding the `Arc` keeps a replaced run in memory until the reader's
/// next read (which lets go of it) or [`crate::NamespaceMemo::forget`];
/// the server calls that when a connection goes idle.
pub(crate) struct BaseReader(Arc<SortedRun>);

/// What a [`BaseReader`] found.
pub(crate) enum BaseRead<'a> {
    /// The run's value for the key, which is the current one.
    Current(&'a Value),
    /// The run (still the base) does not hold the key: only a delta can,
    /// so [`CellMap::get_beyond`] need not search the run again.
    NotInBase,
    /// The run cannot say: ask the map under its lock.
    AskTheMap,
}

impl BaseReader {
    /// Reads `key` from the run alone where that is sound: it holds the key
    /// unmarked, is still the base, and its marks are complete.
    #[inline]
    pub(crate) fn get(&self, key: u128) -> BaseRead<'_> {
        let base = &*self.0;
        // Both before the slot is read: a slot read after them shows every
        // mark made before the run was replaced or its marks completed.
        if base.superseded.load(Ordering::Acquire) || !base.shadows_complete.load(Ordering::Acquire)
        {
            return BaseRead::AskTheMap;
        }
        let Some(Some(index)) = base.index.get() else {
            return BaseRead::AskTheMap;
        };
        match index.find_marked(&base.keys, key) {
            Some((position, false)) => BaseRead::Current(&base.values[position]),
            Some((_, true)) => BaseRead::AskTheMap,
            None => BaseRead::NotInBase,
        }
    }

    /// Whether the run is still its map's base.
    pub(crate) fn is_current(&self) -> bool {
        !self.0.superseded.load(Ordering::Acquire)
    }
}

/// The ordered cells of one namespace; see the module comment.
pub(crate) struct CellMap {
    base: Arc<SortedRun>,
    /// Being merged into the base by the compactor; read like the base.
    frozen: Option<Arc<BTreeMap<u128, Slot>>>,
    delta: BTreeMap<u128, Slot>,
    /// Every key `delta` holds (and maybe a few it no longer does).
    delta_filter: DeltaFilter,
    live: usize,
}

impl Drop for CellMap {
    fn drop(&mut self) {
        self.base.superseded.store(true, Ordering::Release);
    }
}

impl Default for CellMap {
    fn default() -> CellMap {
        CellMap {
            base: Arc::default(),
            frozen: None,
            delta: BTreeMap::new(),
            delta_filter: DeltaFilter::with_capacity(0),
            live: 0,
        }
    }
}

impl CellMap {
    /// A map holding `cells`, which must be in strictly increasing key
    /// order (as a checkpoint stores them); built straight into the base,
    /// which is the fastest load and leaves the best layout.
    #[cfg(test)]
    pub(crate) fn from_sorted(cells: impl IntoIterator<Item = (u128, Value)>) -> CellMap {
        let (keys, values): (Vec<u128>, Vec<Value>) = cells.into_iter().unzip();
        CellMap::from_sorted_columns(keys, values)
    }

    /// [`CellMap::from_sorted`] from keys and values already apart (the
    /// checkpoint loader builds them so: no second pass to split pairs).
    pub(crate) fn from_sorted_columns(keys: Vec<u128>, values: Vec<Value>) -> CellMap {
        assert_eq!(keys.len(), values.len(), "one value per key");
        // The checkpoint reader already refuses keys out of order; this
        // guards other callers.
        debug_assert!(
            keys.windows(2).all(|w| w[0] < w[1]),
            "cells not in key order"
        );
        let base = Arc::new(SortedRun::new(keys, values));
        CellMap {
            live: base.keys.len(),
            delta_filter: DeltaFilter::with_capacity(0),
            base,
            frozen: None,
            delta: BTreeMap::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// A handle on the current base for reads without the lock.
    pub(crate) fn base_reader(&self) -> BaseReader {
        BaseReader(Arc::clone(&self.base))
    }

    /// Installs `base` as the base and returns the old one, marked
    /// superseded (readers holding it go back to the lock). Every
    /// replacement of the base goes through here.
    fn replace_base(&mut self, base: Arc<SortedRun>) -> Arc<SortedRun> {
        self.base.superseded.store(true, Ordering::Release);
        std::mem::replace(&mut self.base, base)
    }

    /// Empties the map, as a dropped namespace's: returns its contents
    /// (for the caller to free outside the lock) with the base marked
    /// superseded first, so no [`BaseReader`] answers from it after this.
    pub(crate) fn take_retired(&mut self) -> CellMap {
        self.base.superseded.store(true, Ordering::Release);
        std::mem::take(self)
    }

    pub(crate) fn get(&self, key: &u128) -> Option<&Value> {
        let base = &*self.base;
        // Before the slot is read, so that the slot shows every mark the
        // completing pass made.
        let marks_complete = base.shadows_complete.load(Ordering::Acquire);
        let Some(Some(index)) = base.index.get() else {
            return match self.overlay_slot(*key) {
                Some(slot) => slot,
                None => base.get(*key),
            };
        };
        let found = index.find_marked(&base.keys, *key);
        if let Some((position, false)) = found
            && marks_complete
        {
            // A key in a delta but unmarked here would be answered with
            // the base's stale value. Checked here in debug builds only: the
            // check is a second delta lookup on the fast path, and as
            // `assert!` it measured +14 % and +17 % on
            // `memstore-1M/get/morton` (docs/benchmarks.md). Release builds
            // assert the same invariant off the read path, on the compactor
            // before each merge (`assert_frozen_keys_marked`).
            debug_assert!(
                self.overlay_slot(*key).is_none(),
                "key {key:#x} is in a delta but not marked in the base"
            );
            return Some(&base.values[position]);
        }
        match self.overlay_slot(*key) {
            Some(slot) => slot,
            None => found.map(|(position, _)| &base.values[position]),
        }
    }

    /// Whether no merge is pending and the base has its index and all its
    /// marks; for tests that wait for the compactor.
    #[cfg(test)]
    pub(crate) fn settled_with_marks(&self) -> bool {
        self.frozen.is_none() && self.base_marks_complete()
    }

    /// Whether the base has its index and all its shadow marks, so that
    /// `get` may answer from it alone; for tests that must show the fast
    /// path was live.
    #[cfg(test)]
    pub(crate) fn base_marks_complete(&self) -> bool {
        matches!(self.base.index.get(), Some(Some(_)))
            && self.base.shadows_complete.load(Ordering::Acquire)
    }

    /// [`CellMap::get`] for a key that `reader` found absent from its run
    /// ([`BaseRead::NotInBase`]): if that run is still the base, only the
    /// deltas are searched (an absent cell costs one index probe, not
    /// two); else a full `get`.
    pub(crate) fn get_beyond(&self, key: u128, reader: &BaseReader) -> Option<&Value> {
        if Arc::ptr_eq(&self.base, &reader.0) {
            return self.overlay_slot(key).flatten();
        }
        self.get(&key)
    }

    /// What the delta, else the frozen delta, holds for `key`:
    /// `Some(None)` for a tombstone, `None` if neither has the key.
    fn overlay_slot(&self, key: u128) -> Option<Option<&Value>> {
        if self.delta_filter.may_contain(key)
            && let Some(slot) = self.delta.get(&key)
        {
            return Some(slot.as_ref());
        }
        if let Some(frozen) = &self.frozen
            && let Some(slot) = frozen.get(&key)
        {
            return Some(slot.as_ref());
        }
        None
    }

    /// Calls `visit(i, value)` for each of `keys` in order, like
    /// [`CellMap::get`] of each, but with the misses of nearby keys
    /// overlapped: a random read of a large map is a chain of dependent
    /// cache misses (index slot, key, value pointer, value bytes), so one
    /// `get` after another costs four memory latencies each. Here each key
    /// goes through a pipeline of prefetches, [`PREFETCH_DISTANCE`] keys
    /// apart (slot; key and value pointer; lookup and value bytes; visit),
    /// so each stage finds its lines (mostly) cached, and the misses of
    /// about three stages' worth of keys are in flight at once.
    pub(crate) fn get_many(&self, keys: &[u128], mut visit: impl FnMut(usize, Option<&Value>)) {
        let base = &*self.base;
        let Some(Some(index)) = base.index.get() else {
            // Read through the fences: a run only lacks its index for a
            // moment after a merge or recovery.
            for (i, key) in keys.iter().enumerate() {
                visit(i, self.get(key));
            }
            return;
        };
        const D: usize = PREFETCH_DISTANCE;
        // Key hashes (home slot and tag), worked out once per key, read D
        // and 2D keys later.
        let mut hashes = [0u64; 4 * D];
        // Lookups done, waiting D keys for their value bytes to arrive.
        let mut found: [Option<&Value>; D] = [None; D];
        let overlays = self.frozen.is_some();
        for i in 0..keys.len() + 3 * D {
            if let Some(&key) = keys.get(i) {
                let hash = index.hash(key);
                hashes[i % (4 * D)] = hash;
                index.prefetch_slot(hash);
            }
            if let Some(j) = i.checked_sub(D)
                && j < keys.len()
                && let Some(position) = index.likely_position(hashes[j % (4 * D)])
                && position < base.keys.len()
            {
                prefetch(&base.keys[position]);
                prefetch(&base.values[position]);
            }
            if let Some(j) = i.checked_sub(3 * D)
                && j < keys.len()
            {
                visit(j, found[j % D]);
            }
            if let Some(j) = i.checked_sub(2 * D)
                && let Some(&key) = keys.get(j)
            {
                let value = if overlays || self.delta_filter.may_contain(key) {
                    self.get(&key)
                } else {
                    index
                        .find_from(&base.keys, key, hashes[j % (4 * D)])
                        .map(|p| &base.values[p])
                };
                if let Some(value) = value {
                    prefetch(value.as_ptr());
                }
                found[j % D] = value;
            }
        }
    }

    /// The value a layer below the delta holds for `key`: `Some(None)`
    /// for a tombstone in the frozen delta, `None` if no layer has it.
    fn older_slot(&self, key: u128) -> Option<Option<&Value>> {
        older_slot(self.frozen.as_deref(), &self.base, key)
    }

    /// Stores `value` at `key`; returns the length of the value it
    /// replaced, if there was one. Only lengths come back (for the value
    /// byte count): handing back the old value would mean cloning its
    /// `Arc` when it lives in an older layer, an atomic write to a cold
    /// line on every put.
    pub(crate) fn insert(&mut self, key: u128, value: Value) -> Option<usize> {
        let previous = match self.delta.entry(key) {
            btree_map::Entry::Occupied(mut slot) => slot.insert(Some(value)).map(|old| old.len()),
            btree_map::Entry::Vacant(slot) => {
                slot.insert(Some(value));
                self.note_new_delta_key(key);
                older_slot(self.frozen.as_deref(), &self.base, key)
                    .flatten()
                    .map(|v| v.len())
            }
        };
        if previous.is_none() {
            self.live += 1;
        }
        previous
    }

    /// Records a key just added to the delta: marks it in the base's
    /// index (a read must not answer from the base without looking at
    /// the delta), and adds it to the filter. A filter the delta has
    /// outgrown is rebuilt four times larger from the delta's keys
    /// (amortised: each key is re-added about 1/3 time on average), so an
    /// empty or small namespace keeps a filter of a few bytes.
    fn note_new_delta_key(&mut self, key: u128) {
        self.base.mark_shadowed(key);
        if self.delta.len() <= self.delta_filter.capacity() || !self.delta_filter.can_grow() {
            self.delta_filter.insert(key);
            return;
        }
        let mut filter = DeltaFilter::with_capacity(self.delta.len().saturating_mul(4));
        for &k in self.delta.keys() {
            filter.insert(k);
        }
        self.delta_filter = filter;
    }

    /// Deletes `key`; returns the length of the value it held, if any.
    pub(crate) fn remove(&mut self, key: &u128) -> Option<usize> {
        // Looked up once: what older layers hold decides both the answer
        // (when the delta has no entry) and whether a tombstone is needed.
        let older = self.older_slot(*key).map(|slot| slot.map(|v| v.len()));
        let previous = match self.delta.get(key) {
            Some(slot) => slot.as_ref().map(|v| v.len()),
            None => older.flatten(),
        }?;
        // A tombstone is needed only where an older layer holds the key.
        if older.is_some() {
            if self.delta.insert(*key, None).is_none() {
                self.note_new_delta_key(*key);
            }
        } else {
            self.delta.remove(key);
        }
        self.live -= 1;
        Some(previous)
    }

    /// The live cells with key >= `from`, in key order.
    pub(crate) fn range(&self, from: u128) -> Range<'_> {
        let start = self.base.position(from).unwrap_or_else(|i| i);
        Range::new(
            &self.base,
            start,
            self.delta.range(from..),
            self.frozen.as_ref().map(|f| f.range(from..)),
        )
    }

    /// A forward-only reader for region scans, starting at key `from`.
    pub(crate) fn seeker(&self, from: u128) -> Seeker<'_> {
        Seeker {
            base: &self.base,
            pos: self.base.position(from).unwrap_or_else(|i| i),
            delta: Layer::new(&self.delta, from),
            frozen: self.frozen.as_deref().map(|f| Layer::new(f, from)),
        }
    }

    /// All live cells in key order.
    // For the checkpoint writer, which is being written beside this.
    #[allow(dead_code)]
    pub(crate) fn iter(&self) -> Range<'_> {
        self.range(0)
    }

    /// Applies a batch of writes sorted by key, each key once (`None`
    /// deletes), by merging it with every layer into a new base in one
    /// pass. For replay at startup, where records arrive far faster than
    /// one tree insert each allows. Returns the change in value bytes.
    pub(crate) fn apply_sorted(&mut self, batch: Vec<(u128, Slot)>) -> i64 {
        debug_assert!(batch.windows(2).all(|w| w[0].0 < w[1].0));
        // One layer first: the base with the frozen and live deltas in it.
        // (A merge the compactor is running on the old pieces is discarded
        // when it sees the base changed: `compact`.)
        let mut base = Arc::clone(&self.base);
        if let Some(frozen) = self.frozen.take() {
            base = Arc::new(base.merge(&frozen));
        }
        if !self.delta.is_empty() {
            base = Arc::new(base.merge(&std::mem::take(&mut self.delta)));
        }
        self.delta_filter = DeltaFilter::with_capacity(0);
        let mut bytes = 0i64;
        let mut keys = huge_vec(base.keys.len() + batch.len());
        let mut values = huge_vec(base.keys.len() + batch.len());
        let mut old = base.keys.iter().zip(&base.values).peekable();
        for (key, slot) in batch {
            while let Some((&k, v)) = old.next_if(|(k, _)| **k < key) {
                keys.push(k);
                values.push(v.clone());
            }
            if let Some((_, v)) = old.next_if(|(k, _)| **k == key) {
                bytes -= v.len() as i64;
            }
            if let Some(v) = slot {
                bytes += v.len() as i64;
                keys.push(key);
                values.push(v);
            }
        }
        for (&k, v) in old {
            keys.push(k);
            values.push(v.clone());
        }
        self.live = keys.len();
        self.replace_base(Arc::new(SortedRun::new(keys, values)));
        bytes
    }

    /// Whether the delta should be frozen for merging now.
    fn wants_freeze(&self) -> bool {
        self.frozen.is_none() && self.delta.len() >= freeze_threshold(&self.base)
    }

    pub(crate) fn freeze(&mut self) {
        let delta = std::mem::take(&mut self.delta);
        // Sized for the next delta, which freezes at about this one's size.
        self.delta_filter = DeltaFilter::with_capacity(delta.len());
        self.frozen = Some(Arc::new(delta));
    }
}

/// The delta size at which it is frozen for merging into `base`.
fn freeze_threshold(base: &SortedRun) -> usize {
    MIN_DELTA_ENTRIES.max(base.keys.len() / BASE_TO_DELTA_RATIO)
}

/// What the frozen delta, else the base, holds for `key` (see
/// [`CellMap::older_slot`]); apart from the map so that the writer can ask
/// while it holds an entry of the live delta.
fn older_slot<'a>(
    frozen: Option<&'a BTreeMap<u128, Slot>>,
    base: &'a SortedRun,
    key: u128,
) -> Option<Option<&'a Value>> {
    if let Some(slot) = frozen.and_then(|f| f.get(&key)) {
        return Some(slot.as_ref());
    }
    base.get(key).map(Some)
}

/// A merged, in-order walk over the delta, the frozen delta and the base:
/// for a key in several, the newest layer wins; tombstones are skipped.
///
/// Built for the common case of a scan through a region with no recent
/// writes: `overlay_next` caches the smallest key any delta still holds, so
/// until the base reaches it, a step is an index increment and one compare.
pub(crate) struct Range<'a> {
    base_keys: &'a [u128],
    base_values: &'a [Value],
    pos: usize,
    delta: Peekable<btree_map::Range<'a, u128, Slot>>,
    frozen: Option<Peekable<btree_map::Range<'a, u128, Slot>>>,
    /// The smallest key left in `delta` or `frozen` (`None`: none left).
    overlay_next: Option<u128>,
}

impl<'a> Range<'a> {
    fn new(
        base: &'a SortedRun,
        start: usize,
        delta: btree_map::Range<'a, u128, Slot>,
        frozen: Option<btree_map::Range<'a, u128, Slot>>,
    ) -> Range<'a> {
        let mut range = Range {
            base_keys: &base.keys,
            base_values: &base.values,
            pos: start,
            delta: delta.peekable(),
            frozen: frozen.map(Iterator::peekable),
            overlay_next: None,
        };
        range.overlay_next = range.overlay_head();
        range
    }

    fn overlay_head(&mut self) -> Option<u128> {
        let delta = self.delta.peek().map(|(k, _)| **k);
        let frozen = self
            .frozen
            .as_mut()
            .and_then(|f| f.peek().map(|(k, _)| **k));
        match (delta, frozen) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The entry for `key`, the smallest overlay key: the delta's slot if
    /// it has one, else the frozen delta's; the same key is dropped from
    /// the older layers.
    #[cold]
    fn take_overlay(&mut self, key: u128) -> Option<(&'a u128, Option<&'a Value>)> {
        let mut found = None;
        if let Some((k, slot)) = self.delta.next_if(|(k, _)| **k == key) {
            found = Some((k, slot.as_ref()));
        }
        if let Some(frozen) = self.frozen.as_mut()
            && let Some((k, slot)) = frozen.next_if(|(k, _)| **k == key)
            && found.is_none()
        {
            found = Some((k, slot.as_ref()));
        }
        if self.base_keys.get(self.pos) == Some(&key) {
            if found.is_none() {
                found = Some((&self.base_keys[self.pos], Some(&self.base_values[self.pos])));
            }
            self.pos += 1;
        }
        self.overlay_next = self.overlay_head();
        found
    }
}

impl<'a> Iterator for Range<'a> {
    type Item = (&'a u128, &'a Value);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let base_key = self.base_keys.get(self.pos);
            let overlay = match (base_key, self.overlay_next) {
                (Some(k), overlay) if overlay.is_none_or(|o| *k < o) => {
                    let value = &self.base_values[self.pos];
                    self.pos += 1;
                    return Some((k, value));
                }
                (_, Some(overlay)) => overlay,
                (_, None) => return None,
            };
            match self.take_overlay(overlay) {
                Some((k, Some(v))) => return Some((k, v)),
                // A tombstone: the key is deleted; carry on.
                _ => continue,
            }
        }
    }
}

/// One overlay layer as a [`Seeker`] passes it: its smallest key at or
/// after the seeker's position.
struct Layer<'a> {
    map: &'a BTreeMap<u128, Slot>,
    iter: btree_map::Range<'a, u128, Slot>,
    head: Option<u128>,
}

impl<'a> Layer<'a> {
    fn new(map: &'a BTreeMap<u128, Slot>, from: u128) -> Layer<'a> {
        let mut iter = map.range(from..);
        let head = iter.next().map(|(k, _)| *k);
        Layer { map, iter, head }
    }

    /// Moves the head to the first key >= `from` (never backwards).
    #[inline]
    fn advance(&mut self, from: u128) {
        let mut stepped = 0;
        while let Some(head) = self.head
            && head < from
        {
            if stepped == LAYER_STEPS {
                *self = Layer::new(self.map, from);
                return;
            }
            self.head = self.iter.next().map(|(k, _)| *k);
            stepped += 1;
        }
    }
}

/// The live cells of one key range, as [`Seeker::span`] finds them.
pub(crate) enum Span<'a> {
    /// No overlay layer has a key in the range: the base's slices are the
    /// answer, walked with no merging at all (the common case: recent
    /// writes are few and elsewhere).
    Base {
        keys: &'a [u128],
        values: &'a [Value],
    },
    /// The layers merged, from the range's start; it runs past the range's
    /// end, so the caller stops at the end.
    Merged(Range<'a>),
}

/// Reads a [`CellMap`] range by range in increasing key order, for region
/// scans: each range is found by galloping forward from the last, and a
/// range with no recent writes in it comes back as plain slices of the
/// base.
pub(crate) struct Seeker<'a> {
    base: &'a SortedRun,
    /// Every base key before `pos` is below the ranges still to come.
    pos: usize,
    delta: Layer<'a>,
    frozen: Option<Layer<'a>>,
}

impl<'a> Seeker<'a> {
    fn overlay_head(&mut self, from: u128) -> Option<u128> {
        self.delta.advance(from);
        let delta = self.delta.head;
        let frozen = self.frozen.as_mut().and_then(|f| {
            f.advance(from);
            f.head
        });
        match (delta, frozen) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The live cells with keys in `start..=end`. Calls must come in
    /// increasing order of `start`, each past the previous `end`.
    pub(crate) fn span(&mut self, start: u128, end: u128) -> Span<'a> {
        debug_assert!(start <= end);
        let base = self.base;
        self.pos = base.lower_bound_from(self.pos, start);
        let lo = self.pos;
        // Keys are distinct, so the range holds at most end - start + 1 of
        // them: when the key at that offset is still inside, the range is
        // full (every cell of a dense run is stored) and no search is
        // needed.
        let most = usize::try_from(end - start).map_or(usize::MAX, |d| d.saturating_add(1));
        let cap = lo.saturating_add(most).min(base.keys.len());
        let hi = if cap > lo && base.keys[cap - 1] <= end {
            cap
        } else {
            match end.checked_add(1) {
                Some(after) => base.lower_bound_from(lo, after),
                None => base.keys.len(),
            }
        };
        self.pos = hi;
        match self.overlay_head(start) {
            Some(overlay) if overlay <= end => Span::Merged(Range::new(
                base,
                lo,
                self.delta.map.range(start..),
                self.frozen.as_ref().map(|f| f.map.range(start..)),
            )),
            _ => Span::Base {
                keys: &base.keys[lo..hi],
                values: &base.values[lo..hi],
            },
        }
    }

    /// The smallest key above `after` in any layer: a live cell, a
    /// tombstone or a cell a tombstone hides (so possibly nothing to
    /// return, but never past a live cell).
    pub(crate) fn next_key_after(&mut self, after: u128) -> Option<u128> {
        let from = after.checked_add(1)?;
        self.pos = self.base.lower_bound_from(self.pos, from);
        let base = self.base.keys.get(self.pos).copied();
        match (base, self.overlay_head(from)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Merges one namespace's frozen delta into its base, holding the lock
/// only to read the two pieces and to swap the result in.
fn compact(map: &RwLock<CellMap>) {
    let (base, frozen) = {
        let cells = read(map);
        match &cells.frozen {
            Some(frozen) => (Arc::clone(&cells.base), Arc::clone(frozen)),
            None => return,
        }
    };
    assert_frozen_keys_marked(&base, &frozen, MAX_MARK_CHECKS);
    let merged = base.merge(&frozen);
    merged.build_index();
    let merged = Arc::new(merged);
    let (old_base, old_frozen) = {
        let mut cells = write(map);
        let unchanged = Arc::ptr_eq(&cells.base, &base)
            && cells
                .frozen
                .as_ref()
                .is_some_and(|f| Arc::ptr_eq(f, &frozen));
        if !unchanged {
            // `apply_sorted` folded the pieces in meanwhile: the merge is
            // stale, and installing it would lose its writes.
            drop(cells);
            drop((merged, base, frozen));
            return;
        }
        (cells.replace_base(merged), cells.frozen.take())
    };
    // Dropping a large run releases a reference per shared value; do it here,
    // outside the lock.
    drop((old_base, old_frozen, base, frozen));
}

/// The shadow-mark invariant, asserted in release builds where it costs
/// nothing on the read path: if `base`'s marks are complete, every key of
/// `frozen` (the delta it overlaid until now) that `base` holds is marked,
/// or reads have been answering that key with `base`'s stale value. A
/// stride over the frozen keys checks at most `max_checks` of them (an
/// index probe each, up to ~100 ns cold), so that the check stays a small
/// fraction of the merge it precedes.
fn assert_frozen_keys_marked(base: &SortedRun, frozen: &BTreeMap<u128, Slot>, max_checks: usize) {
    // Before the marks are read, so that they show every mark the
    // completing pass made.
    if !base.shadows_complete.load(Ordering::Acquire) {
        return;
    }
    let Some(Some(index)) = base.index.get() else {
        return;
    };
    let stride = frozen.len().div_ceil(max_checks.max(1)).max(1);
    for key in frozen.keys().step_by(stride) {
        if let Some((_, marked)) = index.find_marked(&base.keys, *key) {
            assert!(
                marked,
                "key {key:#x} is in the delta but not marked in the base it overlays"
            );
        }
    }
}

/// Completes the shadow marks of `map`'s base run (see
/// `SortedRun::shadows_complete`): marks every key the delta and the frozen delta
/// hold, `chunk` keys of each per hold of the read lock, then declares the
/// marks complete, in the same hold as the last chunk so that no write
/// comes between. Keys entering the delta between holds are marked by the
/// writer itself, since the index exists by then, so the pass covers only
/// keys up to the largest one the layers held at its first hold: a writer
/// adding keys above it cannot keep the pass (and the compactions queued
/// behind it) going. Runs on the compactor, after it has built a base's
/// index. Stops if the base is replaced: the new one gets its own pass
/// from whoever installs it.
fn complete_shadow_marks(map: &RwLock<CellMap>, chunk: usize) {
    assert!(chunk > 0);
    let mut from = 0u128;
    // The run being marked and the pass's last key. The `Weak` keeps the
    // run's allocation, so no later run can take its address and be
    // mistaken for it.
    let mut pass: Option<(Weak<SortedRun>, u128)> = None;
    loop {
        let cells = read(map);
        let base = &cells.base;
        let Some(Some(index)) = base.index.get() else {
            return;
        };
        if base.shadows_complete.load(Ordering::Relaxed) {
            return;
        }
        let layers = || {
            [Some(&cells.delta), cells.frozen.as_deref()]
                .into_iter()
                .flatten()
        };
        let last = match &pass {
            Some((run, last)) => {
                if run.as_ptr() != Arc::as_ptr(base) {
                    return;
                }
                *last
            }
            None => {
                let last = layers()
                    .filter_map(|layer| layer.keys().next_back().copied())
                    .max();
                let Some(last) = last else {
                    // Nothing newer than the base: every mark is there.
                    base.shadows_complete.store(true, Ordering::Release);
                    return;
                };
                pass = Some((Arc::downgrade(base), last));
                last
            }
        };
        // This hold ends where either layer has `chunk` keys past `from`.
        let end = layers()
            .filter_map(|layer| layer.range(from..=last).nth(chunk).map(|(k, _)| *k))
            .min();
        for layer in layers() {
            let keys = match end {
                Some(end) => layer.range(from..end),
                None => layer.range(from..=last),
            };
            for (&key, _) in keys {
                index.mark_shadowed(&base.keys, key);
            }
        }
        match end {
            Some(end) => from = end,
            None => {
                base.shadows_complete.store(true, Ordering::Release);
                return;
            }
        }
    }
}

type Job = Arc<dyn Fn() + Send + Sync>;

/// The background thread that merges frozen deltas. One per store; the
/// writer hands it work with [`Compactor::after_write`] and never waits.
pub(crate) struct Compactor {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Compactor {
    pub(crate) fn start() -> Compactor {
        let (tx, rx) = unbounded::<Job>();
        let thread = std::thread::Builder::new()
            .name("cube-compactor".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            });
        match thread {
            Ok(thread) => Compactor {
                jobs: Some(tx),
                thread: Some(thread),
            },
            // Without a thread, merges run inline on the writer (slower
            // writes now and then, nothing lost).
            Err(_) => Compactor {
                jobs: None,
                thread: None,
            },
        }
    }

    /// Called by the writer after it released `map`'s write lock: if the
    /// delta is due, freezes it and queues its merge.
    pub(crate) fn after_write<T: Send + Sync + 'static>(
        &self,
        owner: &Arc<T>,
        map: fn(&T) -> &RwLock<CellMap>,
    ) {
        if !read(map(owner)).wants_freeze() {
            return;
        }
        {
            let mut cells = write(map(owner));
            if !cells.wants_freeze() {
                return;
            }
            cells.freeze();
        }
        let owner = Arc::clone(owner);
        self.queue(Arc::new(move || {
            compact(map(&owner));
            complete_shadow_marks(map(&owner), MARK_PASS_CHUNK);
        }));
    }

    /// Queues the point-read index build for `map`'s base, for runs made
    /// outside the compactor (checkpoint load, replay). Freezes a delta
    /// that is due first, so a store recovered into its delta is merged
    /// too.
    pub(crate) fn index_later<T: Send + Sync + 'static>(
        &self,
        owner: &Arc<T>,
        map: fn(&T) -> &RwLock<CellMap>,
    ) {
        self.after_write(owner, map);
        let owner = Arc::clone(owner);
        self.queue(Arc::new(move || {
            // Built without the lock: readers keep using the fences until
            // it is published.
            let base = Arc::clone(&read(map(&owner)).base);
            base.build_index();
            complete_shadow_marks(map(&owner), MARK_PASS_CHUNK);
        }));
    }

    fn queue(&self, job: Job) {
        match &self.jobs {
            Some(jobs) => {
                if let Err(unsent) = jobs.send(job) {
                    (unsent.0)();
                }
            }
            None => job(),
        }
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A base of keys 0..1000 with its index and complete marks, where
    /// `marked` keys are marked shadowed.
    fn marked_base(marked: &[u128]) -> SortedRun {
        let keys: Vec<u128> = (0..1000).collect();
        let values = keys.iter().map(|_| v(1)).collect();
        let base = SortedRun::new(keys, values);
        base.build_index();
        for key in marked {
            base.mark_shadowed(*key);
        }
        base.shadows_complete.store(true, Ordering::Release);
        base
    }

    fn frozen_of(keys: &[u128]) -> BTreeMap<u128, Slot> {
        keys.iter().map(|key| (*key, Some(v(2)))).collect()
    }

    #[test]
    fn the_merge_check_passes_marked_and_new_keys() {
        // 5000 is not in the base at all, so it needs no mark.
        let base = marked_base(&[3, 500]);
        assert_frozen_keys_marked(&base, &frozen_of(&[3, 500, 5000]), MAX_MARK_CHECKS);
    }

    #[test]
    #[should_panic(expected = "not marked in the base it overlays")]
    fn the_merge_check_catches_a_missed_mark() {
        let base = marked_base(&[3]);
        assert_frozen_keys_marked(&base, &frozen_of(&[3, 500]), MAX_MARK_CHECKS);
    }

    #[test]
    #[should_panic(expected = "not marked in the base it overlays")]
    fn the_merge_check_samples_the_frozen_keys_with_a_stride() {
        // 100 frozen keys, 10 checks: every tenth key from the first, and
        // key 10, the one left unmarked, is among them.
        let frozen: Vec<u128> = (0..100).collect();
        let marked: Vec<u128> = frozen.iter().copied().filter(|k| *k != 10).collect();
        let base = marked_base(&marked);
        assert_frozen_keys_marked(&base, &frozen_of(&frozen), 10);
    }

    #[test]
    fn the_merge_check_skips_a_base_whose_marks_are_incomplete() {
        let base = marked_base(&[]);
        base.shadows_complete.store(false, Ordering::Release);
        assert_frozen_keys_marked(&base, &frozen_of(&[3, 500]), MAX_MARK_CHECKS);
    }

    /// Lengths vary with `n`, so the lengths `insert` and `remove`
    /// return tell values apart.
    fn v(n: u8) -> Value {
        Value::new(&vec![n; 1 + usize::from(n % 4)])
    }

    #[derive(Clone, Debug)]
    enum Op {
        Put(u8, u8),
        Del(u8),
        Freeze,
        Merge,
        /// Builds the base's point-read index, as after recovery.
        Index,
        /// Completes the base's shadow marks, in holds of this many keys.
        Mark(usize),
        /// Replay's bulk path: writes sorted and deduplicated first.
        Bulk(Vec<(u8, Option<u8>)>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<u8>(), any::<u8>()).prop_map(|(k, v)| Op::Put(k % 64, v)),
            2 => any::<u8>().prop_map(|k| Op::Del(k % 64)),
            1 => Just(Op::Freeze),
            1 => Just(Op::Merge),
            1 => Just(Op::Index),
            1 => (1usize..4).prop_map(Op::Mark),
            1 => prop::collection::vec((any::<u8>(), any::<Option<u8>>()), 0..20)
                .prop_map(|w| Op::Bulk(w.into_iter().map(|(k, v)| (k % 64, v)).collect())),
        ]
    }

    proptest! {
        /// Any interleaving of writes, freezes and merges reads exactly
        /// like a plain BTreeMap: get, len, and in-order ranges.
        #[test]
        fn layers_read_like_one_map(ops in prop::collection::vec(op(), 0..200), from in 0u128..70) {
            let lock = RwLock::new(CellMap::default());
            let mut model: BTreeMap<u128, Value> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Put(k, n) => {
                        let got = write(&lock).insert(u128::from(k), v(n));
                        prop_assert_eq!(got, model.insert(u128::from(k), v(n)).map(|old| old.len()));
                    }
                    Op::Del(k) => {
                        let got = write(&lock).remove(&u128::from(k));
                        prop_assert_eq!(got, model.remove(&u128::from(k)).map(|old| old.len()));
                    }
                    Op::Freeze => {
                        let mut cells = write(&lock);
                        if cells.frozen.is_none() {
                            cells.freeze();
                        }
                    }
                    Op::Merge => compact(&lock),
                    // What the compactor does after recovery.
                    Op::Index => read(&lock).base.build_index(),
                    Op::Mark(chunk) => complete_shadow_marks(&lock, chunk),
                    Op::Bulk(writes) => {
                        let mut batch: BTreeMap<u128, Option<Value>> = BTreeMap::new();
                        for (k, n) in writes {
                            batch.insert(u128::from(k), n.map(v));
                        }
                        let mut expected_bytes = 0i64;
                        for (k, slot) in &batch {
                            expected_bytes -= model.get(k).map_or(0, |old| old.len() as i64);
                            match slot {
                                Some(value) => {
                                    expected_bytes += value.len() as i64;
                                    model.insert(*k, value.clone());
                                }
                                None => {
                                    model.remove(k);
                                }
                            }
                        }
                        let bytes = write(&lock).apply_sorted(batch.into_iter().collect());
                        prop_assert_eq!(bytes, expected_bytes);
                    }
                }
                let cells = read(&lock);
                prop_assert_eq!(cells.len(), model.len());
                let got: Vec<(u128, Value)> = cells.range(from).map(|(k, v)| (*k, v.clone())).collect();
                let want: Vec<(u128, Value)> = model.range(from..).map(|(k, v)| (*k, v.clone())).collect();
                prop_assert_eq!(got, want);
                for k in 0..64u128 {
                    prop_assert_eq!(cells.get(&k), model.get(&k));
                }
                // The batched read: every key (present, deleted, never
                // written, repeated), in an order that is not key order.
                let keys: Vec<u128> = (0..70u128).rev().chain(0..70).map(|k| (k * 37) % 70).collect();
                let mut seen = 0;
                cells.get_many(&keys, |i, value| {
                    assert_eq!(i, seen, "visited in order");
                    assert_eq!(value, model.get(&keys[i]), "key {}", keys[i]);
                    seen += 1;
                });
                prop_assert_eq!(seen, keys.len());
            }
        }
    }

    #[test]
    fn from_sorted_builds_the_base_and_the_compactor_merges() {
        let map = Arc::new(RwLock::new(CellMap::from_sorted(
            (0..100u128).map(|k| (k * 2, v(k as u8))),
        )));
        assert_eq!(read(&map).len(), 100);
        let compactor = Compactor::start();
        for k in 0..MIN_DELTA_ENTRIES as u128 {
            write(&map).insert(k * 2 + 1, v(1));
        }
        compactor.after_write(&map, |m| m);
        drop(compactor); // joins, so the merge is done
        let cells = read(&map);
        assert!(cells.frozen.is_none() && cells.delta.is_empty());
        assert_eq!(cells.len(), 100 + MIN_DELTA_ENTRIES);
        assert_eq!(cells.base.keys.len(), 100 + MIN_DELTA_ENTRIES);
        assert!(
            cells.iter().map(|(k, _)| *k).eq((0..100)
                .map(|k| k * 2)
                .chain((0..MIN_DELTA_ENTRIES as u128).map(|k| k * 2 + 1))
                .collect::<std::collections::BTreeSet<_>>())
        );
    }
}

#[cfg(test)]
mod probe {
    use super::*;
    use std::time::Instant;

    #[test]
    #[ignore = "timing probe"]
    fn probe_iteration_costs() {
        let n = 1_000_000u128;
        for delta_entries in [0u128, 1000, 100_000] {
            let mut map = CellMap::from_sorted((0..n).map(|k| (k * 4, Value::new(&[1u8; 8]))));
            for k in 0..delta_entries {
                map.insert(n * 8 + k, Value::new(&[2u8; 8]));
            }
            let t = Instant::now();
            let mut s = 0usize;
            for _ in 0..10 {
                s += map
                    .range(1000)
                    .take(80_000)
                    .map(|(_, v)| v.len())
                    .sum::<usize>();
            }
            let walk = t.elapsed() / 10;
            let t = Instant::now();
            for i in 0..100_000u128 {
                s += map.get(&((i * 7919 % n) * 4)).map_or(0, |v| v.len());
            }
            let get = t.elapsed() / 100_000;
            let t = Instant::now();
            for i in 0..100_000u128 {
                s += map
                    .base
                    .keys
                    .binary_search(&((i * 7919 % n) * 4))
                    .unwrap_or(0);
            }
            let bs = t.elapsed() / 100_000;
            let t = Instant::now();
            for i in 0..100_000u128 {
                s += map.base.position((i * 7919 % n) * 4).unwrap_or(0);
            }
            let indexed = t.elapsed() / 100_000;
            let t = Instant::now();
            for i in 0..10_000u128 {
                s += map
                    .range((i * 7919 % n) * 4)
                    .next()
                    .map_or(0, |(_, v)| v.len());
            }
            let seek = t.elapsed() / 10_000;
            println!(
                "delta {delta_entries}: walk 80k {walk:?} get {get:?} binary-search {bs:?} indexed {indexed:?} seek {seek:?} ({s})"
            );
        }
    }
}

#[cfg(test)]
pub(crate) mod point_read_probe {
    use super::*;
    use std::time::Instant;

    /// 4096 keys of cells `k * 4` for `k` below `n`, chosen by a fixed
    /// xorshift: the same random reads for every timing probe.
    pub(crate) fn random_probe_keys(n: u128) -> Vec<u128> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        (0..4096)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                u128::from(state % n as u64) * 4
            })
            .collect()
    }

    /// Where a single random get's time goes on 1 M cells (values behind
    /// their own allocations, as in the store): the same 4096 keys read
    /// one lock each (what `MemStore::read_cell` pays, less the namespace
    /// table), all under one lock with no prefetching, and batched. For
    /// choosing between lock-free reads and layout work; prints ns a read.
    #[test]
    #[ignore = "timing probe"]
    fn single_get_costs() {
        let n = 1_000_000u128;
        let lock = RwLock::new(CellMap::from_sorted(
            (0..n).map(|k| (k * 4, Value::new(&k.to_le_bytes()[..8]))),
        ));
        read(&lock).base.build_index();
        let keys = random_probe_keys(n);
        let rounds = 200;
        for _ in 0..3 {
            let mut sum = 0usize;
            let t = Instant::now();
            for _ in 0..rounds {
                for key in &keys {
                    sum += read(&lock).get(key).map_or(0, |v| usize::from(v[0]));
                }
            }
            let locked = t.elapsed().as_nanos() as f64 / (rounds * keys.len()) as f64;
            let t = Instant::now();
            for _ in 0..rounds {
                let cells = read(&lock);
                for key in &keys {
                    sum += cells.get(key).map_or(0, |v| usize::from(v[0]));
                }
            }
            let unlocked = t.elapsed().as_nanos() as f64 / (rounds * keys.len()) as f64;
            let t = Instant::now();
            for _ in 0..rounds {
                read(&lock).get_many(&keys, |_, v| sum += v.map_or(0, |v| usize::from(v[0])));
            }
            let batched = t.elapsed().as_nanos() as f64 / (rounds * keys.len()) as f64;
            println!(
                "ns a read: a lock each {locked:.0}, one lock {unlocked:.0}, batched {batched:.0} ({sum})"
            );
        }
    }
}

#[cfg(test)]
mod index_tests {
    use super::*;

    #[test]
    fn indexed_search_agrees_with_binary_search() {
        for len in [0usize, 1, 2, 63, 64, 65, 4095, 4096, 4097, 10_000] {
            let keys: Vec<u128> = (0..len as u128).map(|k| k * 3 + 1).collect();
            let values = vec![Value::new(&[0u8]); len];
            let run = SortedRun::new(keys.clone(), values);
            for probe in 0..(len as u128 * 3 + 5) {
                assert_eq!(
                    run.position(probe),
                    keys.binary_search(&probe),
                    "len {len} probe {probe}"
                );
            }
        }
    }
}
