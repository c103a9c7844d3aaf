//! A namespace's cells as the disk-bounded store reads them (issue 32,
//! phase 2): recent writes in memory (the *memtable*, in generations) over
//! run files on disk read through the shared [`BlockCache`].
//!
//! ```text
//!   active generation   BTreeMap, written by the writer        newest
//!   frozen generations  BTreeMaps, read-only, each tagged with
//!                       the last LSN it holds
//!   run files           Arc<RunFileReader>, newest first             oldest
//! ```
//!
//! A read looks at the layers newest first and stops at the first that
//! holds the key (a value, or a tombstone: deleted). A range read merges
//! every layer's range ([`Merge`], newest wins, tombstones dropped), so it
//! streams blocks in key order with the readers' bounded read-ahead and
//! never holds a box's blocks at once.
//!
//! The layers change in two ways only, each a pointer swap under the
//! namespace's write lock, with the file I/O done before it without any
//! lock ([`flush_oldest`], [`merge_runs`]):
//! - a frozen generation is replaced by a run file holding exactly its
//!   entries (a *flush*), or, by [`ReadStack::install_run`], the
//!   generations wholly at or below an LSN by a run a checkpoint fold
//!   wrote from the WAL segments those generations came from;
//! - the oldest runs are replaced by one run that merges them (a *merge*).
//!
//! Either way every key reads the same before and after the swap, so a
//! reader holding the read lock sees one consistent state, and a reader
//! of the old layers (a range in progress holds `Arc`s) still reads the
//! state it started with.
//!
//! [`ReadStack`] itself is not synchronised: like `CellMap`, the
//! namespace's `RwLock` guards it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::cell_value::CellValue;
use crate::curve::region::KeyRange;
use crate::row_cache::{RowCache, next_row_id};
use crate::run_file::{
    BlockCache, Merge, Protection, RunFileError, RunFileRange, RunFileReader, RunFileWriter,
    RunSummary, Slot, Source, write_all,
};
use crate::storage::Storage;

/// What a memtable entry costs beyond its value's bytes, for the
/// memtable's byte count: the key (16), the slot (24), and the entry's
/// share of its B-tree node (a node holds up to 11 entries in about 600
/// bytes; nodes are two-thirds full on average).
pub(crate) const MEMTABLE_ENTRY_OVERHEAD_BYTES: usize = 64;

/// One generation of the memtable: the writes of a span of the log.
pub(crate) struct Generation {
    cells: BTreeMap<u128, Slot>,
    /// The LSN of the last mutation applied to it (0: none yet).
    last_lsn: u64,
    /// Its cost by [`entry_bytes`].
    bytes: usize,
}

impl Generation {
    fn new() -> Generation {
        Generation {
            cells: BTreeMap::new(),
            last_lsn: 0,
            bytes: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.cells.len()
    }

    pub(crate) fn last_lsn(&self) -> u64 {
        self.last_lsn
    }

    /// The generation's entries in key order, tombstones included: what a
    /// flush writes.
    fn source(&self) -> Source<'_> {
        Box::new(self.cells.iter().map(|(k, slot)| Ok((*k, slot.clone()))))
    }

    fn range_source(&self, lo: u128, hi: u128) -> Source<'_> {
        if lo > hi {
            return Box::new(std::iter::empty());
        }
        Box::new(
            self.cells
                .range(lo..=hi)
                .map(|(k, slot)| Ok((*k, slot.clone()))),
        )
    }
}

/// What one memtable entry is charged.
fn entry_bytes(slot: &Slot) -> usize {
    MEMTABLE_ENTRY_OVERHEAD_BYTES + slot.as_ref().map_or(0, |v| v.len())
}

/// See the module doc.
pub(crate) struct ReadStack {
    active: Generation,
    /// Newest first.
    frozen: Vec<Arc<Generation>>,
    /// Newest first.
    runs: Vec<Arc<RunFileReader>>,
    /// Live cells (tombstones and hidden values not counted).
    live: usize,
    /// The largest LSN installed runs hold every write up to
    /// ([`ReadStack::install_run`]).
    persisted_lsn: u64,
    /// Where the values read from the runs are kept, once the namespace
    /// is on disk (`crate::row_cache`), and this stack's key in it.
    rows: Option<Arc<RowCache>>,
    row_id: u64,
    /// Counts changes of `runs`: a value read from one list is kept only
    /// while it is still the list ([`ReadStack::remember_row`]).
    runs_version: u64,
}

impl ReadStack {
    /// A stack over `runs` (newest first), as a restart finds them, which
    /// hold `live` live cells (the manifest records it: counting would
    /// read every block).
    pub(crate) fn new(runs: Vec<Arc<RunFileReader>>, live: usize) -> ReadStack {
        ReadStack {
            active: Generation::new(),
            frozen: Vec::new(),
            runs,
            live,
            persisted_lsn: 0,
            rows: None,
            row_id: next_row_id(),
            runs_version: 0,
        }
    }

    /// From now on, values read from the runs may be kept in `rows`, and
    /// every write drops its key's (the namespace is on disk).
    pub(crate) fn attach_rows(&mut self, rows: Arc<RowCache>) {
        self.rows = Some(rows);
    }

    /// The value the runs hold for `key`, if the row cache kept it. The
    /// caller has looked in the memtable first.
    pub(crate) fn cached_row(&self, key: u128) -> Option<CellValue> {
        self.rows.as_ref()?.get(self.row_id, key)
    }

    /// Which list of runs `runs()` is ([`ReadStack::remember_row`]).
    pub(crate) fn runs_version(&self) -> u64 {
        self.runs_version
    }

    /// Keeps `value`, read for `key` from the runs when they were at
    /// `runs_version`, in the row cache, unless a write of `key` was
    /// applied since (the memtable has it) or the runs changed (a fold
    /// may hold one). Called under the `disk` read lock, which the writer
    /// needs to apply a write: so no write slips between the check and the
    /// insert, and any later one drops the entry (`ReadStack::apply`).
    pub(crate) fn remember_row(&self, key: u128, value: &CellValue, runs_version: u64) {
        let Some(rows) = &self.rows else { return };
        if runs_version == self.runs_version && self.memtable_slot(key).is_none() {
            rows.insert(self.row_id, key, value.clone());
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// The memtable's cost, all generations (what `--memtable-bytes`
    /// bounds).
    pub(crate) fn memtable_bytes(&self) -> usize {
        self.active.bytes + self.frozen.iter().map(|g| g.bytes).sum::<usize>()
    }

    pub(crate) fn active_len(&self) -> usize {
        self.active.len()
    }

    /// The run files, newest first.
    pub(crate) fn runs(&self) -> &[Arc<RunFileReader>] {
        &self.runs
    }

    /// The frozen generations, newest first.
    pub(crate) fn frozen(&self) -> &[Arc<Generation>] {
        &self.frozen
    }

    /// What the layers below the active generation hold for `key`:
    /// `None` if none has it, `Some(None)` for a tombstone.
    fn older_slot(&self, key: u128) -> Result<Option<Slot>, RunFileError> {
        for generation in &self.frozen {
            if let Some(slot) = generation.cells.get(&key) {
                return Ok(Some(slot.clone()));
            }
        }
        for run in &self.runs {
            if let Some(slot) = run.get(key)? {
                return Ok(Some(slot));
            }
        }
        Ok(None)
    }

    /// What the memtable holds for `key` (newest generation first):
    /// `None` if nothing, `Some(None)` for a tombstone. For readers that
    /// then read the runs holding no lock ([`ReadStack::runs`], cloned).
    pub(crate) fn memtable_slot(&self, key: u128) -> Option<&Slot> {
        std::iter::once(&self.active)
            .chain(self.frozen.iter().map(|g| &**g))
            .find_map(|g| g.cells.get(&key))
    }

    /// What the active generation holds for `key`.
    pub(crate) fn active_slot(&self, key: u128) -> Option<&Slot> {
        self.active.cells.get(&key)
    }

    /// The current value of `key`, if it has one.
    pub(crate) fn get(&self, key: u128) -> Result<Option<CellValue>, RunFileError> {
        if let Some(slot) = self.active.cells.get(&key) {
            return Ok(slot.clone());
        }
        Ok(self.older_slot(key)?.flatten())
    }

    /// [`ReadStack::get`] of each of `keys`, in their order. The keys the
    /// memtable does not answer go to each run in one
    /// [`RunFileReader::get_many`], newest run first, so that the block reads
    /// of a batch overlap; a failed block read fails only the keys it
    /// would have answered.
    pub(crate) fn get_many(&self, keys: &[u128]) -> Vec<Result<Option<CellValue>, RunFileError>> {
        let mut answers: Vec<Option<Result<Slot, RunFileError>>> = keys
            .iter()
            .map(|&key| self.memtable_slot(key).cloned().map(Ok))
            .collect();
        read_runs(&self.runs, keys, &mut answers);
        answers
            .into_iter()
            .map(|answer| answer.unwrap_or(Ok(None)))
            .collect()
    }

    /// The live cells with keys in `lo..=hi`, in key order. Each run
    /// streams its blocks with bounded read-ahead; an error ends the range.
    pub(crate) fn range(&self, lo: u128, hi: u128) -> StackRange<'_> {
        let mut sources: Vec<Source<'_>> =
            Vec::with_capacity(1 + self.frozen.len() + self.runs.len());
        sources.push(self.active.range_source(lo, hi));
        for generation in &self.frozen {
            sources.push(generation.range_source(lo, hi));
        }
        for run in &self.runs {
            sources.push(Box::new(run.range(lo, hi)));
        }
        StackRange {
            merge: Some(Merge::new(sources, true)),
        }
    }

    /// Calls `visit(key, value)` for each live cell with a key in
    /// `lo..=hi`, in key order, until it returns false: what
    /// [`ReadStack::range`] yields, but when at most one run holds keys in
    /// the range (the common case: a region under one run, with or without
    /// recent writes in it) that run's blocks are walked directly, its
    /// values borrowed from them, and the memtable's entries spliced in:
    /// no merge heap and no copy per cell of the run.
    pub(crate) fn visit_range(
        &self,
        lo: u128,
        hi: u128,
        visit: impl FnMut(u128, &[u8]) -> bool,
    ) -> Result<(), RunFileError> {
        self.visit_range_seeking(&mut None, lo, hi, visit)
    }

    /// [`ReadStack::visit_range`] for a caller that visits ranges in
    /// increasing key order (a scan's curve runs): where one run alone
    /// answers, `cursor` keeps that run's range between calls and seeks it
    /// forward ([`RunFileRange::seek_forward`]), so curve runs that share
    /// a block look it up once. Each `lo` must be above every key an
    /// earlier call's range reached.
    pub(crate) fn visit_range_seeking<'s>(
        &'s self,
        cursor: &mut Option<RunFileRange<'s>>,
        lo: u128,
        hi: u128,
        visit: impl FnMut(u128, &[u8]) -> bool,
    ) -> Result<(), RunFileError> {
        if lo > hi {
            return Ok(());
        }
        let mut runs = self.runs.iter().filter(|run| {
            run.key_range()
                .is_some_and(|(first, last)| first <= hi && lo <= last)
        });
        match (runs.next(), runs.next()) {
            (run, None) => self.visit_over_one_run(cursor, run.map(|r| &**r), lo, hi, visit),
            (Some(first), Some(second)) => {
                let runs: Vec<&RunFileReader> = [first, second]
                    .into_iter()
                    .chain(runs)
                    .map(|r| &**r)
                    .collect();
                self.visit_over_runs(&runs, lo, hi, visit)
            }
            (None, Some(_)) => Ok(()),
        }
    }

    /// The memtable's entries in `lo..=hi`: newest generation winning,
    /// tombstones kept (they hide runs' cells).
    fn memtable_entries(
        &self,
        lo: u128,
        hi: u128,
    ) -> Result<std::iter::Peekable<impl Iterator<Item = (u128, Slot)> + '_>, RunFileError> {
        let layers: Vec<Source<'_>> = std::iter::once(&self.active)
            .chain(self.frozen.iter().map(|g| &**g))
            .map(|g| g.range_source(lo, hi))
            .collect();
        // Memtable sources never fail.
        Ok(Merge::new(layers, false)?.flatten().peekable())
    }

    /// [`ReadStack::visit_range`] over several runs (newest first): each
    /// run's range stepped as a cursor, values borrowed from its blocks,
    /// the smallest key taken from the newest layer that holds it. A
    /// linear pass over the cursors per cell: a namespace keeps its runs
    /// few.
    fn visit_over_runs(
        &self,
        runs: &[&RunFileReader],
        lo: u128,
        hi: u128,
        mut visit: impl FnMut(u128, &[u8]) -> bool,
    ) -> Result<(), RunFileError> {
        let mut memtable = self.memtable_entries(lo, hi)?;
        let mut cursors = Vec::with_capacity(runs.len());
        for run in runs {
            let mut cursor = run.range(lo, hi);
            if cursor.advance()? {
                cursors.push(cursor);
            }
        }
        loop {
            let smallest = cursors
                .iter()
                .filter_map(|c| c.entry().map(|(k, _)| k))
                .chain(memtable.peek().map(|(k, _)| *k))
                .min();
            let Some(key) = smallest else {
                return Ok(());
            };
            let mut answered = false;
            if let Some((_, slot)) = memtable.next_if(|(k, _)| *k == key) {
                answered = true;
                if let Some(v) = slot
                    && !visit(key, &v)
                {
                    return Ok(());
                }
            }
            // Newest first: the first cursor at `key` answers, the rest
            // are hidden; each at `key` moves on.
            let mut i = 0;
            while i < cursors.len() {
                let cursor = &mut cursors[i];
                if let Some((k, value)) = cursor.entry()
                    && k == key
                {
                    if !answered {
                        answered = true;
                        if let Some(v) = value
                            && !visit(key, v)
                        {
                            return Ok(());
                        }
                    }
                    if !cursor.advance()? {
                        cursors.remove(i);
                        continue;
                    }
                }
                i += 1;
            }
        }
    }

    /// [`ReadStack::visit_range`] where `run` (if any) is the only run with
    /// keys in the range: the memtable's entries (newest generation winning,
    /// tombstones kept, since they hide the run's cells) merged with the
    /// run's as it streams. A tombstone in the run hides nothing there.
    fn visit_over_one_run<'s>(
        &'s self,
        cursor: &mut Option<RunFileRange<'s>>,
        run: Option<&'s RunFileReader>,
        lo: u128,
        hi: u128,
        mut visit: impl FnMut(u128, &[u8]) -> bool,
    ) -> Result<(), RunFileError> {
        let memtable_has_keys = std::iter::once(&self.active)
            .chain(self.frozen.iter().map(|g| &**g))
            .any(|g| g.cells.range(lo..=hi).next().is_some());
        if let Some(run) = run
            && !memtable_has_keys
        {
            // The run alone: no splicing at all.
            let range = match cursor {
                Some(range) if range.reads(run) => {
                    range.seek_forward(lo, hi);
                    range
                }
                _ => cursor.insert(run.range(lo, hi)),
            };
            return range.visit(|key, value| value.is_none_or(|v| visit(key, v)));
        }
        let mut memtable = self.memtable_entries(lo, hi)?;
        let mut go_on = true;
        if let Some(run) = run {
            // The memtable's next key, so that a run cell before it costs
            // one compare (the memtable is touched only at its own keys).
            let mut next_in_memtable = memtable.peek().map(|(k, _)| *k);
            run.range(lo, hi).visit(|key, value| {
                if next_in_memtable.is_none_or(|m| key < m) {
                    go_on = value.is_none_or(|v| visit(key, v));
                    return go_on;
                }
                while let Some((k, slot)) = memtable.next_if(|(k, _)| *k < key) {
                    if let Some(v) = slot
                        && !visit(k, &v)
                    {
                        go_on = false;
                        return false;
                    }
                }
                let newer = memtable.next_if(|(k, _)| *k == key);
                next_in_memtable = memtable.peek().map(|(k, _)| *k);
                go_on = match (newer, value) {
                    (Some((_, slot)), _) => slot.is_none_or(|v| visit(key, &v)),
                    (None, Some(v)) => visit(key, v),
                    (None, None) => true,
                };
                go_on
            })?;
        }
        if go_on {
            for (k, slot) in memtable {
                if let Some(v) = slot
                    && !visit(k, &v)
                {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Asks the kernel to start reading the blocks of `ranges`
    /// (increasing, disjoint) that the cache lacks, in every run, from
    /// the first range on until about `budget_bytes` of blocks have been
    /// looked at ([`RunFileReader::will_read`]). Returns the key through
    /// which every run's blocks were looked at: at least the first range's
    /// first key, so a caller that goes on from the key after it always
    /// moves forward.
    pub(crate) fn read_ahead(&self, ranges: &[KeyRange], budget_bytes: u64) -> u128 {
        let Some(first) = ranges.first() else {
            return u128::MAX;
        };
        // Per run, the end of the blocks looked at so far: ranges that
        // share a block look at it once.
        let mut looked_to = vec![0usize; self.runs.len()];
        let mut looked_bytes = 0u64;
        for range in ranges {
            let mut through = range.end;
            for (run, looked_to) in self.runs.iter().zip(&mut looked_to) {
                let blocks = run.blocks_of(range.start, range.end);
                let from = blocks.start.max(*looked_to);
                if from >= blocks.end {
                    continue;
                }
                let left = budget_bytes.saturating_sub(looked_bytes);
                let (bytes, end) = run.will_read(from..blocks.end, left);
                looked_bytes += bytes;
                *looked_to = end;
                if end < blocks.end {
                    through = through.min(run.last_key_of_block(end - 1));
                }
            }
            if through < range.end || looked_bytes >= budget_bytes {
                return through.max(first.start);
            }
        }
        ranges[ranges.len() - 1].end
    }

    /// The smallest key above `after` that any layer holds: a live cell,
    /// a tombstone, or a value a newer layer hides. Never past the next
    /// live cell, so a region scan may jump straight to the curve run that
    /// holds it (as `cells::Seeker::next_key_after` does for the base).
    /// Reads at most one block per run, through the cache.
    pub(crate) fn next_key_after(&self, after: u128) -> Result<Option<u128>, RunFileError> {
        let Some(from) = after.checked_add(1) else {
            return Ok(None);
        };
        let mut next = std::iter::once(&self.active)
            .chain(self.frozen.iter().map(|g| &**g))
            .filter_map(|g| g.cells.range(from..).next().map(|(k, _)| *k))
            .min();
        for run in &self.runs {
            let upper = next.unwrap_or(u128::MAX);
            // A cursor: the key alone, no copy of its value.
            let mut range = run.range(from, upper);
            if range.advance()? {
                next = range.entry().map(|(key, _)| key);
            }
        }
        Ok(next)
    }

    /// The length of `key`'s current value, if it has one: what the writer
    /// passes to [`ReadStack::apply`]. Asked under the read lock, so that
    /// the block read it may need never holds the write lock (readers would
    /// wait behind the disk); the answer cannot change before the write
    /// lock is taken because the writer is the only thread that changes
    /// what a key reads (flushes and merges swap layers that read alike).
    pub(crate) fn current_len(&self, key: u128) -> Result<Option<usize>, RunFileError> {
        Ok(self.get(key)?.map(|v| v.len()))
    }

    /// Applies the writer's mutation of `key` (`None` deletes) at `lsn`,
    /// given `previous`, the length of the value it replaces
    /// ([`ReadStack::current_len`]), for the live count. A delete always
    /// leaves a tombstone: an older layer may hold the key, and finding
    /// out would be a read.
    pub(crate) fn apply(&mut self, key: u128, slot: Slot, lsn: u64, previous: Option<usize>) {
        debug_assert!(
            self.active
                .cells
                .get(&key)
                .is_none_or(|old| old.as_ref().map(|v| v.len()) == previous),
            "the writer's lookup of {key:#x} is stale"
        );
        if let Some(rows) = &self.rows {
            rows.forget(self.row_id, key);
        }
        let new_bytes = entry_bytes(&slot);
        let is_value = slot.is_some();
        if let Some(old) = self.active.cells.insert(key, slot) {
            self.active.bytes -= entry_bytes(&old);
        }
        self.active.bytes += new_bytes;
        self.active.last_lsn = self.active.last_lsn.max(lsn);
        match (previous.is_some(), is_value) {
            (false, true) => self.live += 1,
            (true, false) => self.live -= 1,
            _ => {}
        }
    }

    /// Moves the active generation aside (read-only) so that it can be
    /// flushed; a new, empty one takes writes. Nothing if it is empty. A
    /// generation whose writes a fold has already installed is not kept
    /// but handed back, for the caller to free outside the lock.
    pub(crate) fn freeze(&mut self) -> Option<Generation> {
        if self.active.cells.is_empty() {
            return None;
        }
        let generation = std::mem::replace(&mut self.active, Generation::new());
        if generation.last_lsn <= self.persisted_lsn {
            return Some(generation);
        }
        self.frozen.insert(0, Arc::new(generation));
        None
    }

    /// Replaces the runs with `runs` (newest first), which the manifest now
    /// lists for the namespace and which hold every write up to and
    /// including `through_lsn` (a fold's or a merge's result, or the
    /// runs a namespace leaving memory starts reading): the generations
    /// wholly at or below it are dropped, the active one first frozen so
    /// that its writes after `through_lsn` stay. Returns the dropped
    /// generations and the runs no longer listed, for the caller to free
    /// outside the lock. The caller makes sure the writer has applied
    /// every write up to `through_lsn`: a run ahead of the memtable would
    /// make the writer's next lookup of a key it holds stale.
    pub(crate) fn set_runs(
        &mut self,
        runs: Vec<Arc<RunFileReader>>,
        through_lsn: u64,
    ) -> (Vec<Arc<Generation>>, Vec<Arc<RunFileReader>>) {
        self.persisted_lsn = self.persisted_lsn.max(through_lsn);
        let mut dropped = Vec::new();
        if let Some(generation) = self.freeze() {
            dropped.push(Arc::new(generation));
        }
        let keep = self
            .frozen
            .iter()
            .position(|g| g.last_lsn <= self.persisted_lsn)
            .unwrap_or(self.frozen.len());
        dropped.extend(self.frozen.split_off(keep));
        let old = std::mem::replace(&mut self.runs, runs);
        self.runs_version += 1;
        let unlisted = old
            .into_iter()
            .filter(|run| !self.runs.iter().any(|r| Arc::ptr_eq(r, run)))
            .collect();
        (dropped, unlisted)
    }

    /// Sets the live count: a namespace leaving memory takes its map's.
    pub(crate) fn set_len(&mut self, live: usize) {
        self.live = live;
    }

    /// Installs `run`, which a checkpoint fold wrote from the log up to
    /// and including `through_lsn` and which the manifest now lists: the
    /// frozen generations wholly at or below it are dropped (the run holds
    /// their writes, or newer ones of the same keys that a newer generation
    /// also holds), and the run goes above every older run. Returns the
    /// dropped generations, for the caller to free outside the lock.
    pub(crate) fn install_run(
        &mut self,
        run: Arc<RunFileReader>,
        through_lsn: u64,
    ) -> Vec<Arc<Generation>> {
        let keep = self
            .frozen
            .iter()
            .position(|g| g.last_lsn <= through_lsn)
            .unwrap_or(self.frozen.len());
        let dropped = self.frozen.split_off(keep);
        self.runs.insert(0, run);
        self.runs_version += 1;
        self.persisted_lsn = self.persisted_lsn.max(through_lsn);
        dropped
    }
}

/// A range of a [`ReadStack`]: live cells only, in key order; after an
/// error it ends.
pub(crate) struct StackRange<'a> {
    merge: Option<Result<Merge<'a>, RunFileError>>,
}

impl Iterator for StackRange<'_> {
    type Item = Result<(u128, CellValue), RunFileError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let merge = match self.merge.as_mut()? {
                Ok(merge) => merge,
                Err(_) => return self.merge.take().and_then(Result::err).map(Err),
            };
            match merge.next() {
                Some(Ok((key, Some(value)))) => return Some(Ok((key, value))),
                // The merge drops tombstones: never met.
                Some(Ok((_, None))) => continue,
                Some(Err(e)) => {
                    self.merge = None;
                    return Some(Err(e));
                }
                None => {
                    self.merge = None;
                    return None;
                }
            }
        }
    }
}

/// Where a flush or a merge writes its run file, and how to open it.
pub(crate) struct RunTarget<'a> {
    pub(crate) storage: &'a dyn Storage,
    pub(crate) path: &'a Path,
    /// Unique in the data dir, never reused.
    pub(crate) file_id: u64,
    pub(crate) ns_id: u64,
    pub(crate) protection: &'a Protection,
    pub(crate) cache: &'a Arc<BlockCache>,
    /// Block size target (tests use tiny blocks); `None`: the format's.
    pub(crate) block_bytes: Option<usize>,
}

impl RunTarget<'_> {
    /// Writes `entries` to the target's file and opens it.
    fn write(
        &self,
        entries: impl Iterator<Item = Result<(u128, Slot), RunFileError>>,
        expected_entries: u64,
    ) -> Result<(Arc<RunFileReader>, RunSummary), RunFileError> {
        let mut writer = RunFileWriter::create(
            self.storage,
            self.path,
            self.file_id,
            self.ns_id,
            self.protection,
            expected_entries,
        )?;
        if let Some(bytes) = self.block_bytes {
            writer = writer.with_target_block_bytes(bytes);
        }
        let summary = write_all(writer, entries)?;
        let reader = RunFileReader::open_storage(
            self.storage,
            self.path,
            self.protection,
            Arc::clone(self.cache),
        )?;
        reader.expect(self.file_id, self.ns_id, summary.mac.as_ref())?;
        Ok((Arc::new(reader), summary))
    }
}

/// Each key's newest slot in `runs` (newest first) for the keys whose
/// `answers` entry is `None`, in one [`RunFileReader::get_many`] per run so
/// that a batch's block reads overlap. A failed block read fails the keys
/// it would have answered, and only those. Readers call it holding no lock
/// (on runs they cloned) or under the stack's.
pub(crate) fn read_runs(
    runs: &[Arc<RunFileReader>],
    keys: &[u128],
    answers: &mut [Option<Result<Slot, RunFileError>>],
) {
    let mut pending: Vec<usize> = (0..keys.len()).filter(|&i| answers[i].is_none()).collect();
    for run in runs {
        if pending.is_empty() {
            return;
        }
        let batch: Vec<u128> = pending.iter().map(|&i| keys[i]).collect();
        let mut still = Vec::with_capacity(pending.len());
        for (&i, found) in pending.iter().zip(run.get_many(&batch)) {
            match found {
                Ok(None) => still.push(i),
                Ok(Some(slot)) => answers[i] = Some(Ok(slot)),
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        pending = still;
    }
}

/// Writes the oldest frozen generation of `stack` to a run file and swaps
/// the file in for it, holding the lock only to pick the generation and to
/// swap. Returns what was written, or `None` when no generation is frozen.
/// Tombstones are kept: older runs may hold what they hide.
pub(crate) fn flush_oldest(
    stack: &RwLock<ReadStack>,
    target: &RunTarget<'_>,
) -> Result<Option<RunSummary>, RunFileError> {
    let Some(generation) = read(stack).frozen.last().cloned() else {
        return Ok(None);
    };
    let (run, summary) = target.write(generation.source(), generation.len() as u64)?;
    let dropped = {
        let mut stack = write(stack);
        // Only this thread removes frozen generations, and the writer only
        // adds newer ones: the generation is still the oldest.
        let oldest = stack.frozen.pop();
        assert!(
            oldest.as_ref().is_some_and(|g| Arc::ptr_eq(g, &generation)),
            "a frozen generation was removed by someone else during its flush"
        );
        // Above every run (all older), below every remaining generation.
        stack.runs.insert(0, run);
        stack.runs_version += 1;
        oldest
    };
    drop((dropped, generation));
    Ok(Some(summary))
}

/// What [`merge_runs`] replaced, and what it wrote in their place.
pub(crate) type Merged = (Vec<Arc<RunFileReader>>, RunSummary);

/// Merges the `count` oldest runs of `stack` into one run file and swaps it
/// in for them, holding the lock only to pick them and to swap. The oldest
/// run is among them, so tombstones are dropped. Returns the replaced runs
/// (for the caller to delete once nothing lists them, and to forget in the
/// cache) and what was written; `None` when there are fewer than two runs.
pub(crate) fn merge_runs(
    stack: &RwLock<ReadStack>,
    count: usize,
    target: &RunTarget<'_>,
) -> Result<Option<Merged>, RunFileError> {
    let inputs: Vec<Arc<RunFileReader>> = {
        let stack = read(stack);
        let count = count.min(stack.runs.len());
        if count < 2 {
            return Ok(None);
        }
        stack.runs[stack.runs.len() - count..].to_vec()
    };
    let sources: Vec<Source<'_>> = inputs
        .iter()
        .map(|run| Box::new(run.range(0, u128::MAX)) as Source<'_>)
        .collect();
    let expected = inputs.iter().map(|run| run.entry_count()).sum();
    let (run, summary) = target.write(Merge::new(sources, true)?, expected)?;
    let mut stack = write(stack);
    let at = stack.runs.len() - inputs.len();
    // Only this thread removes runs, and flushes add them at the front.
    assert!(
        stack.runs[at..]
            .iter()
            .zip(&inputs)
            .all(|(a, b)| Arc::ptr_eq(a, b)),
        "the runs being merged changed during the merge"
    );
    stack.runs.truncate(at);
    stack.runs.push(run);
    stack.runs_version += 1;
    Ok(Some((inputs, summary)))
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests;
