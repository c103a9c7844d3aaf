//! Cell programs and their telemetry, as data.
//!
//! The store never runs a program (Lua lives in the server); it keeps a
//! program's source at its coordinate, durably like a cell, and each
//! cell's run telemetry: the exact count of runs and failures and the last
//! `keep` records. Both arrive as ordinary mutations in the writer's
//! groups, so a `run`'s writes and its telemetry record commit together.
//!
//! Why telemetry mutations carry explicit effects: the checkpoint fold is
//! last-write-wins per state key and sees records, never state. So a run's
//! record names its own key `(ns, coord, seq)` and the range of older keys
//! it trims (`trim_from ..= seq - keep`), and the writer computes `seq`
//! from the state it sees when the run executes. The count is the newest
//! record's `seq` (trimming never removes the newest record), and the
//! failure count travels in every record, so both are exact after any
//! restart, from the WAL or from checkpoint files.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use byteorder::{ByteOrder, LittleEndian};
use cube_protocol::{
    CellBox, Coord, MAX_OUTCOME_MESSAGE_BYTES, NamespaceName, RunOutcome, RunRecord,
};

use crate::coord_hash::{CoordHashBuilder, bucket_order};
use crate::error::StoreError;
use crate::memstore::MemStore;
use crate::mutation::Mutation;

/// The most records kept per cell, whatever `keep` a record asks for: the
/// server's `--program-telemetry-keep` is capped at this, so one cell's
/// telemetry stays within a few megabytes.
pub const MAX_TELEMETRY_KEEP: u32 = 100_000;

/// The most older records one append may trim. In steady state an append
/// trims exactly one (`seq - keep`); after `keep` was lowered, the excess
/// goes this many per run, so one record never carries an unbounded list.
pub const MAX_TRIM_PER_APPEND: u64 = 64;

/// An empty range of seqs (seqs start at 1).
#[allow(clippy::reversed_empty_ranges)]
const NOTHING_TRIMMED: std::ops::RangeInclusive<u64> = 1..=0;

/// Version byte of a stored telemetry record.
const RECORD_VERSION: u8 = 1;

/// A cell's identity across namespaces.
type CellId = (NamespaceName, Coord);

/// What a telemetry mutation does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TelemetryChange {
    /// A run's record. In the log, `keep` is the server's setting and the
    /// record trims `trim_from ..= seq - keep`; loaded from a checkpoint,
    /// `keep` is 0 (trim nothing: the checkpoint already holds only what
    /// was kept).
    Append {
        record: RunRecord,
        /// Failed runs at this cell up to and including this one.
        failures: u64,
        keep: u32,
        trim_from: u64,
    },
    /// A checkpoint tombstone: the record `seq` was trimmed. Never logged.
    Drop { seq: u64 },
}

impl TelemetryChange {
    /// The record keys (seqs) this change removes, from the state and from
    /// memory alike (so both always hold the same records): the oldest
    /// ones from `trim_from` (the writer passes the oldest kept record) up
    /// to `seq - keep`, at most [`MAX_TRIM_PER_APPEND`] of them.
    pub(crate) fn trimmed(&self) -> std::ops::RangeInclusive<u64> {
        match self {
            TelemetryChange::Append {
                record,
                keep,
                trim_from,
                ..
            } if *keep > 0 && record.seq > u64::from(*keep) => {
                let first = (*trim_from).max(1);
                let last = (record.seq - u64::from(*keep))
                    .min(first.saturating_add(MAX_TRIM_PER_APPEND - 1));
                first..=last
            }
            TelemetryChange::Drop { seq } => *seq..=*seq,
            TelemetryChange::Append { .. } => NOTHING_TRIMMED,
        }
    }
}

/// The newest telemetry of a cell: what the next run builds on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TelemetryHead {
    /// The newest record's seq: the number of runs ever recorded.
    pub runs: u64,
    /// Failed runs ever recorded.
    pub failures: u64,
    /// The oldest record still kept (0 when none is).
    pub oldest_seq: u64,
}

#[derive(Default)]
struct CellTelemetry {
    /// Oldest first, seqs strictly increasing.
    records: VecDeque<RunRecord>,
    failures: u64,
    /// The seqs of the newest and oldest record, kept beside the counts:
    /// every run reads its cell's head, and reading it from the records'
    /// two ends cost two cache misses per run among thousands of cells.
    newest_seq: u64,
    oldest_seq: u64,
}

impl CellTelemetry {
    fn head(&self) -> TelemetryHead {
        TelemetryHead {
            runs: self.newest_seq,
            failures: self.failures,
            oldest_seq: self.oldest_seq,
        }
    }

    /// Brings the kept seqs up to date after `records` changed.
    fn refresh_ends(&mut self) {
        self.newest_seq = self.records.back().map_or(0, |r| r.seq);
        self.oldest_seq = self.records.front().map_or(0, |r| r.seq);
    }
}

/// Per namespace, then per coordinate: a lookup by `&NamespaceName`
/// needs no clone of the name (runs look up programs and telemetry on
/// every call).
type ByCell<T> = HashMap<NamespaceName, HashMap<Coord, T, CoordHashBuilder>, CoordHashBuilder>;

/// Programs and telemetry of every namespace. Only the writer (and
/// recovery) changes them; `stats NS X,Y,Z` and the writer read them.
#[derive(Default)]
pub(crate) struct ProgramTable {
    programs: RwLock<ByCell<Arc<[u8]>>>,
    telemetry: RwLock<ByCell<CellTelemetry>>,
    interned: Mutex<InternedSources>,
}

/// What one program counts against its namespace's `max-bytes` quota
/// besides its source: its key and the table entry that holds it.
pub const PROGRAM_OVERHEAD_BYTES: u64 = 64;

/// What one kept telemetry record counts against `max-bytes`: its fixed
/// fields and the longest message it may carry (messages are cut to
/// [`MAX_OUTCOME_MESSAGE_BYTES`]), whatever its message's length, so that
/// the charge is an upper bound of the memory and checkpoint bytes.
pub const TELEMETRY_RECORD_CHARGE_BYTES: u64 = 64 + MAX_OUTCOME_MESSAGE_BYTES as u64;

/// What a program of `source_len` bytes counts against `max-bytes`.
pub fn program_charge_bytes(source_len: usize) -> u64 {
    source_len as u64 + PROGRAM_OVERHEAD_BYTES
}

/// The change a telemetry mutation makes to its cell's kept records (each
/// charged [`TELEMETRY_RECORD_CHARGE_BYTES`]): one more for a run's
/// record, fewer by what it trims. Writer-made logs keep a cell's seqs
/// contiguous, so every seq in the trimmed range is a kept record.
pub(crate) fn telemetry_record_change(change: &TelemetryChange) -> i64 {
    let trimmed = change.trimmed();
    let trimmed = if trimmed.is_empty() {
        0
    } else {
        (trimmed.end() - trimmed.start() + 1) as i64
    };
    match change {
        TelemetryChange::Append { .. } => 1 - trimmed,
        TelemetryChange::Drop { .. } => -trimmed,
    }
}

/// One allocation per distinct program source. A rule stored at every
/// cell of a region is then one `Arc`: memory is one copy, and the
/// server's compiled-function cache (by source address) finds it without
/// reading or hashing the source, which a step over 32 768 cells would
/// otherwise do 32 768 times from cold memory.
#[derive(Default)]
struct InternedSources {
    sources: HashSet<Arc<[u8]>>,
    /// Sources nobody else holds are swept when the set reaches this.
    sweep_at: usize,
}

/// The least `sweep_at`: small sets are never swept.
const INTERN_SWEEP_MIN: usize = 1024;

impl InternedSources {
    fn intern(&mut self, source: &[u8]) -> Arc<[u8]> {
        if let Some(found) = self.sources.get(source) {
            return Arc::clone(found);
        }
        if self.sources.len() >= self.sweep_at.max(INTERN_SWEEP_MIN) {
            // Amortised: the set at least doubles between two sweeps.
            self.sources.retain(|held| Arc::strong_count(held) > 1);
            self.sweep_at = 2 * self.sources.len();
        }
        let source: Arc<[u8]> = Arc::from(source);
        self.sources.insert(Arc::clone(&source));
        source
    }
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ProgramTable {
    /// Applies a program or telemetry mutation; returns whether the cell
    /// had a program before (program mutations) or `false` (telemetry).
    /// Adds to `charge` the change in what the namespace's programs and
    /// telemetry count against `max-bytes` ([`program_charge_bytes`],
    /// [`TELEMETRY_RECORD_CHARGE_BYTES`]).
    pub(crate) fn apply(&self, mutation: &Mutation, charge_delta: &mut i64) -> bool {
        match mutation {
            Mutation::ProgramPut { ns, coord, source } => {
                let mut programs = write(&self.programs);
                let cells = match programs.get_mut(ns) {
                    Some(cells) => cells,
                    None => programs.entry(ns.clone()).or_default(),
                };
                let added = program_charge_bytes(source.len());
                let source = self
                    .interned
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .intern(source);
                let old = cells.insert(*coord, source);
                let refund = old
                    .as_ref()
                    .map_or(0, |old| program_charge_bytes(old.len()));
                *charge_delta += added as i64 - refund as i64;
                old.is_some()
            }
            Mutation::ProgramDel { ns, coord } => {
                let old = write(&self.programs)
                    .get_mut(ns)
                    .and_then(|cells| cells.remove(coord));
                if let Some(old) = &old {
                    *charge_delta -= program_charge_bytes(old.len()) as i64;
                }
                old.is_some()
            }
            Mutation::Telemetry { ns, coord, change } => {
                let mut telemetry = write(&self.telemetry);
                let cells = match telemetry.get_mut(ns) {
                    Some(cells) => cells,
                    None => telemetry.entry(ns.clone()).or_default(),
                };
                let cell = cells.entry(*coord).or_default();
                let before = cell.records.len() as i64;
                apply_telemetry(cell, change);
                let after = cell.records.len() as i64;
                if cell.records.is_empty() && cell.failures == 0 {
                    cells.remove(coord);
                }
                *charge_delta += (after - before) * TELEMETRY_RECORD_CHARGE_BYTES as i64;
                false
            }
            _ => false,
        }
    }

    /// Forgets a dropped namespace's programs and telemetry.
    pub(crate) fn drop_namespace(&self, ns: &NamespaceName) {
        write(&self.programs).remove(ns);
        write(&self.telemetry).remove(ns);
    }
}

fn apply_telemetry(cell: &mut CellTelemetry, change: &TelemetryChange) {
    let trimmed = change.trimmed();
    match change {
        TelemetryChange::Append {
            record, failures, ..
        } => {
            let newest = cell.records.back().is_none_or(|last| last.seq < record.seq);
            if newest {
                cell.failures = *failures;
                cell.records.push_back(record.clone());
            } else {
                // Only a damaged or hand-made checkpoint could do this;
                // keep the order rather than trust it.
                let at = cell.records.partition_point(|r| r.seq < record.seq);
                match cell.records.get(at) {
                    Some(r) if r.seq == record.seq => cell.records[at] = record.clone(),
                    _ => cell.records.insert(at, record.clone()),
                }
            }
            drop_range(cell, &trimmed);
        }
        TelemetryChange::Drop { .. } => drop_range(cell, &trimmed),
    }
    while cell.records.len() > MAX_TELEMETRY_KEEP as usize {
        cell.records.pop_front();
    }
    cell.refresh_ends();
}

/// Removes the records whose seq is in `range` (normally the oldest).
fn drop_range(cell: &mut CellTelemetry, range: &std::ops::RangeInclusive<u64>) {
    if range.is_empty() {
        return;
    }
    while cell.records.front().is_some_and(|r| range.contains(&r.seq)) {
        cell.records.pop_front();
    }
    // Seqs ascend, so records in the range can remain only if the oldest
    // is older than the range (never in logs the writer makes).
    if cell.records.front().is_some_and(|r| r.seq < *range.start()) {
        cell.records.retain(|r| !range.contains(&r.seq));
    }
}

impl MemStore {
    /// Calls `visit` with each of `coords` and its stored value (if any),
    /// under one hold of the namespace's read lock: a program reading its
    /// neighbourhood pays for one lock, not one per cell. `visit` runs
    /// under the lock, so it must be quick. `None`: no such namespace; an
    /// error: a namespace on disk whose block could not be read (nothing
    /// was visited).
    pub fn get_each(
        &self,
        ns: &NamespaceName,
        coords: &[Coord],
        mut visit: impl FnMut(Coord, Option<&[u8]>),
    ) -> Option<Result<(), StoreError>> {
        let space = self.namespace(ns)?;
        let cells = read(&space.cells);
        // Retired but not yet out of the table: already gone.
        if space.is_dropped() {
            return None;
        }
        if space.on_disk() {
            drop(cells);
            return self.read_cells(ns, coords, |i, value| {
                visit(coords[i], value.map(|v| v.as_ref()));
            });
        }
        for &coord in coords {
            visit(
                coord,
                cells.get(&space.curve.key(coord)).map(|v| v.as_ref()),
            );
        }
        Some(Ok(()))
    }

    /// The source of the program stored at a cell, if any.
    pub fn program(&self, ns: &NamespaceName, coord: Coord) -> Option<Arc<[u8]>> {
        read(&self.programs.programs).get(ns)?.get(&coord).cloned()
    }

    /// Programs stored in one namespace.
    pub fn program_count_in(&self, ns: &NamespaceName) -> u64 {
        read(&self.programs.programs)
            .get(ns)
            .map_or(0, |cells| cells.len() as u64)
    }

    /// Programs stored, across namespaces.
    pub fn program_count(&self) -> u64 {
        read(&self.programs.programs)
            .values()
            .map(|cells| cells.len() as u64)
            .sum()
    }

    /// A cell's run counts and its oldest kept record; `None` if it was
    /// never run.
    pub fn telemetry_head(&self, ns: &NamespaceName, coord: Coord) -> Option<TelemetryHead> {
        read(&self.programs.telemetry)
            .get(ns)?
            .get(&coord)
            .map(CellTelemetry::head)
    }

    /// [`MemStore::telemetry_head`] of each of `coords`, under one lock
    /// and in the map's bucket order (a step reads thousands).
    pub(crate) fn telemetry_heads(
        &self,
        ns: &NamespaceName,
        coords: &[Coord],
    ) -> Vec<Option<TelemetryHead>> {
        let mut heads = vec![None; coords.len()];
        let telemetry = read(&self.programs.telemetry);
        let Some(cells) = telemetry.get(ns) else {
            return heads;
        };
        for i in bucket_order(cells.hasher(), cells.capacity(), coords.iter()) {
            heads[i] = cells.get(&coords[i]).map(CellTelemetry::head);
        }
        heads
    }

    /// A cell's counts and its `limit` most recent records, oldest first.
    pub fn telemetry(
        &self,
        ns: &NamespaceName,
        coord: Coord,
        limit: usize,
    ) -> (TelemetryHead, Vec<RunRecord>) {
        let telemetry = read(&self.programs.telemetry);
        match telemetry.get(ns).and_then(|cells| cells.get(&coord)) {
            None => (TelemetryHead::default(), Vec::new()),
            Some(cell) => {
                let skip = cell.records.len().saturating_sub(limit);
                (
                    cell.head(),
                    cell.records.iter().skip(skip).cloned().collect(),
                )
            }
        }
    }
}

/// A program as a listing hands it out: where, and its source.
pub type StoredProgram = (Coord, Arc<[u8]>);

impl MemStore {
    /// The programs stored in `region` of `ns`, at most `limit` of them
    /// (unordered), and whether more were left out. A box much smaller
    /// than the namespace's program count is probed cell by cell; a bigger
    /// one costs one pass over the namespace's programs, so a huge box
    /// never costs its volume.
    pub(crate) fn programs_in(
        &self,
        ns: &NamespaceName,
        region: &CellBox,
        limit: usize,
    ) -> (Vec<StoredProgram>, bool) {
        let programs = read(&self.programs.programs);
        let Some(cells) = programs.get(ns) else {
            return (Vec::new(), false);
        };
        let mut found = Vec::new();
        // A probe of a map much bigger than the cache costs a miss, some
        // 100-200 ns; a pass visits each entry in order, some 5-10 ns.
        if region.volume().saturating_mul(PROBE_COST_IN_VISITS) <= cells.len() as u128 {
            let (lo, hi) = (region.lo(), region.hi());
            for x in lo.x..=hi.x {
                for y in lo.y..=hi.y {
                    for z in lo.z..=hi.z {
                        let coord = Coord::new(x, y, z);
                        if let Some(source) = cells.get(&coord) {
                            if found.len() == limit {
                                return (found, true);
                            }
                            found.push((coord, Arc::clone(source)));
                        }
                    }
                }
            }
        } else {
            for (coord, source) in cells {
                if region.contains(*coord) {
                    if found.len() == limit {
                        return (found, true);
                    }
                    found.push((*coord, Arc::clone(source)));
                }
            }
        }
        (found, false)
    }
}

/// What probing a program map for one cell costs, in entries a pass over
/// it visits in the same time (see [`MemStore::programs_in`]).
const PROBE_COST_IN_VISITS: u128 = 16;

impl ProgramTable {
    /// Up to `max_items` programs of `ns` with coordinates strictly after
    /// `after` (in `Coord` order: x, then y, then z), smallest first, and
    /// whether more follow. One pass over the namespace's programs under
    /// the read lock (a partial selection, not a full sort): programs are
    /// few next to cells, and the sources are `Arc`s, so nothing is copied
    /// while the lock is held (`crate::listing`, `cubec export`).
    pub(crate) fn page_after(
        &self,
        ns: &NamespaceName,
        after: Option<Coord>,
        max_items: usize,
    ) -> (Vec<StoredProgram>, bool) {
        let programs = read(&self.programs);
        let Some(cells) = programs.get(ns) else {
            return (Vec::new(), false);
        };
        let mut candidates: Vec<StoredProgram> = cells
            .iter()
            .filter(|(coord, _)| after.is_none_or(|after| **coord > after))
            .map(|(coord, source)| (*coord, Arc::clone(source)))
            .collect();
        drop(programs);
        let more = candidates.len() > max_items;
        if more && max_items > 0 {
            candidates.select_nth_unstable_by_key(max_items - 1, |(coord, _)| *coord);
        }
        candidates.truncate(max_items);
        candidates.sort_unstable_by_key(|(coord, _)| *coord);
        (candidates, more)
    }
}

/// Program and telemetry changes of the writer's current group that are
/// not yet in the store, so a transaction sees a program stored (or a run
/// recorded) earlier in its own group.
#[derive(Default)]
pub(crate) struct PendingPrograms {
    sources: HashMap<CellId, Option<Arc<[u8]>>, CoordHashBuilder>,
    heads: HashMap<CellId, PendingHead, CoordHashBuilder>,
}

/// What an appended telemetry record changes in its cell's pending head.
struct HeadAppend<'m> {
    ns: &'m NamespaceName,
    coord: Coord,
    seq: u64,
    failures: u64,
    /// The newest seq the append trims, if any.
    trimmed_through: Option<u64>,
}

impl HeadAppend<'_> {
    fn of(mutation: &Mutation) -> Option<HeadAppend<'_>> {
        let Mutation::Telemetry {
            ns,
            coord,
            change:
                change @ TelemetryChange::Append {
                    record, failures, ..
                },
        } = mutation
        else {
            return None;
        };
        let trimmed = change.trimmed();
        Some(HeadAppend {
            ns,
            coord: *coord,
            seq: record.seq,
            failures: *failures,
            trimmed_through: (!trimmed.is_empty()).then(|| *trimmed.end()),
        })
    }
}

/// What the group's pending appends at one cell add to its telemetry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingHead {
    runs: u64,
    failures: u64,
    /// The seq of the group's first pending record at this cell.
    first_seq: u64,
    /// The newest seq the pending appends trim (0: none).
    trimmed_through: u64,
}

/// An overlay entry a transaction replaced, to restore on rollback.
pub(crate) enum ProgramUndo {
    Source(CellId, Option<Option<Arc<[u8]>>>),
    Head(CellId, Option<PendingHead>),
}

impl PendingPrograms {
    pub(crate) fn reserve_heads(&mut self, additional: usize) {
        self.heads.reserve(additional);
    }

    pub(crate) fn clear(&mut self) {
        self.sources.clear();
        self.heads.clear();
    }

    /// Records a mutation's effect on programs and telemetry (others are
    /// ignored); with `undo`, remembers what it replaced.
    pub(crate) fn record(&mut self, mutation: &Mutation, undo: Option<&mut Vec<ProgramUndo>>) {
        match mutation {
            Mutation::ProgramPut { ns, coord, source } => {
                let key = (ns.clone(), *coord);
                let previous = self
                    .sources
                    .insert(key.clone(), Some(Arc::from(source.as_slice())));
                if let Some(undo) = undo {
                    undo.push(ProgramUndo::Source(key, previous));
                }
            }
            Mutation::ProgramDel { ns, coord } => {
                let key = (ns.clone(), *coord);
                let previous = self.sources.insert(key.clone(), None);
                if let Some(undo) = undo {
                    undo.push(ProgramUndo::Source(key, previous));
                }
            }
            Mutation::Telemetry { .. } => self.record_head(mutation, undo),
            _ => {}
        }
    }

    /// The telemetry arm of [`PendingPrograms::record`]: an appended
    /// record moves its cell's pending head.
    fn record_head(&mut self, mutation: &Mutation, undo: Option<&mut Vec<ProgramUndo>>) {
        if let Some(append) = HeadAppend::of(mutation) {
            self.record_append(&append, undo);
        }
    }

    fn record_append(&mut self, append: &HeadAppend<'_>, undo: Option<&mut Vec<ProgramUndo>>) {
        // One probe of the map (a step records tens of thousands of
        // cells, each a likely cache miss).
        let entry = self.heads.entry((append.ns.clone(), append.coord));
        let previous = match &entry {
            Entry::Occupied(found) => Some(*found.get()),
            Entry::Vacant(_) => None,
        };
        let mut head = previous.unwrap_or(PendingHead {
            runs: 0,
            failures: 0,
            first_seq: append.seq,
            trimmed_through: 0,
        });
        if append.seq >= head.runs {
            head.runs = append.seq;
            head.failures = append.failures;
        }
        if let Some(last) = append.trimmed_through {
            head.trimmed_through = head.trimmed_through.max(last);
        }
        let key = match entry {
            Entry::Occupied(mut found) => {
                found.insert(head);
                undo.is_some().then(|| found.key().clone())
            }
            Entry::Vacant(slot) => {
                let key = undo.is_some().then(|| slot.key().clone());
                slot.insert(head);
                key
            }
        };
        if let (Some(undo), Some(key)) = (undo, key) {
            undo.push(ProgramUndo::Head(key, previous));
        }
    }

    /// [`PendingPrograms::record`] of every mutation in `mutations`, the
    /// telemetry heads in the map's bucket order instead of the
    /// mutations' (see [`bucket_order`]): the same heads and, for each
    /// cell, the same undo entries in the same order.
    pub(crate) fn record_all(&mut self, mutations: &[Mutation], undo: &mut Vec<ProgramUndo>) {
        // What the heads need, compact and in order, so that visiting it
        // out of order stays in cache.
        let mut appends: Vec<HeadAppend<'_>> = Vec::new();
        for mutation in mutations {
            match HeadAppend::of(mutation) {
                Some(mut append) => {
                    // The name read out of order from one place that stays
                    // in cache, not from each mutation's copy.
                    if let Some(last) = appends.last()
                        && last.ns == append.ns
                    {
                        append.ns = last.ns;
                    }
                    appends.push(append);
                }
                None => self.record(mutation, Some(undo)),
            }
        }
        // Grown first: the order is that of the table the heads go into.
        self.heads.reserve(appends.len());
        undo.reserve(appends.len());
        let keys = appends.iter().map(|a| (a.ns, a.coord));
        for i in bucket_order(self.heads.hasher(), self.heads.capacity(), keys) {
            self.record_append(&appends[i], Some(undo));
        }
    }

    pub(crate) fn restore(&mut self, undo: impl Iterator<Item = ProgramUndo>) {
        for entry in undo {
            match entry {
                ProgramUndo::Source(key, Some(previous)) => {
                    self.sources.insert(key, previous);
                }
                ProgramUndo::Source(key, None) => {
                    self.sources.remove(&key);
                }
                ProgramUndo::Head(key, Some(previous)) => {
                    self.heads.insert(key, previous);
                }
                ProgramUndo::Head(key, None) => {
                    self.heads.remove(&key);
                }
            }
        }
    }

    pub(crate) fn program(
        &self,
        mem: &MemStore,
        ns: &NamespaceName,
        coord: Coord,
    ) -> Option<Arc<[u8]>> {
        if !self.sources.is_empty()
            && let Some(pending) = self.sources.get(&(ns.clone(), coord))
        {
            return pending.clone();
        }
        mem.program(ns, coord)
    }

    /// The programs in `region` of `ns` with the group's pending changes
    /// applied, at most `limit` (unordered); `None` when there are more.
    pub(crate) fn programs_in(
        &self,
        mem: &MemStore,
        ns: &NamespaceName,
        region: &CellBox,
        limit: usize,
    ) -> Option<Vec<StoredProgram>> {
        let pending: Vec<(Coord, &Option<Arc<[u8]>>)> = self
            .sources
            .iter()
            .filter(|((at_ns, coord), _)| at_ns == ns && region.contains(*coord))
            .map(|((_, coord), source)| (*coord, source))
            .collect();
        // Pending removals may shrink the stored set back under the
        // limit, so read that many more before judging.
        let removals = pending.iter().filter(|(_, s)| s.is_none()).count();
        let (stored, more) = mem.programs_in(ns, region, limit.saturating_add(removals));
        if more {
            return None;
        }
        if pending.is_empty() {
            return (stored.len() <= limit).then_some(stored);
        }
        let mut merged: HashMap<Coord, Arc<[u8]>> = stored.into_iter().collect();
        for (coord, source) in pending {
            match source {
                Some(source) => {
                    merged.insert(coord, Arc::clone(source));
                }
                None => {
                    merged.remove(&coord);
                }
            }
        }
        (merged.len() <= limit).then(|| merged.into_iter().collect())
    }

    pub(crate) fn telemetry_head(
        &self,
        mem: &MemStore,
        ns: &NamespaceName,
        coord: Coord,
    ) -> Option<TelemetryHead> {
        self.merge_head(mem.telemetry_head(ns, coord), ns, coord)
    }

    /// [`PendingPrograms::telemetry_head`] of each of `coords`, the
    /// store's heads read in one pass (see [`MemStore::telemetry_heads`]).
    pub(crate) fn telemetry_heads(
        &self,
        mem: &MemStore,
        ns: &NamespaceName,
        coords: &[Coord],
    ) -> Vec<Option<TelemetryHead>> {
        let stored = mem.telemetry_heads(ns, coords);
        if self.heads.is_empty() {
            return stored;
        }
        stored
            .into_iter()
            .zip(coords)
            .map(|(stored, coord)| self.merge_head(stored, ns, *coord))
            .collect()
    }

    /// A cell's head: the store's, moved by the group's pending appends.
    fn merge_head(
        &self,
        stored: Option<TelemetryHead>,
        ns: &NamespaceName,
        coord: Coord,
    ) -> Option<TelemetryHead> {
        let pending = if self.heads.is_empty() {
            None
        } else {
            self.heads.get(&(ns.clone(), coord))
        };
        let Some(pending) = pending else {
            return stored;
        };
        // Trimming removes the oldest records first, so the oldest left is
        // the oldest before the group, or past what the group trimmed.
        let before = stored
            .map(|h| h.oldest_seq)
            .filter(|seq| *seq > 0)
            .unwrap_or(pending.first_seq);
        Some(TelemetryHead {
            runs: pending.runs,
            failures: pending.failures,
            oldest_seq: before.max(pending.trimmed_through + 1).min(pending.runs),
        })
    }
}

// ---------------------------------------------------------------------------
// Encodings: WAL payloads and checkpoint state keys.
// ---------------------------------------------------------------------------

/// Kind-10 payload flag: an appended record, or (checkpoint loads only)
/// a dropped one.
const CHANGE_APPEND: u8 = 0;
const CHANGE_DROP: u8 = 1;

/// Bytes of a stored record after its seq (see [`put_record`]).
fn record_len(record: &RunRecord) -> usize {
    1 + 8 * 4 + 4 + 8 + 1 + 2 + message_of(record).len()
}

fn message_of(record: &RunRecord) -> &str {
    let text = record.message.as_str();
    let mut end = text.len().min(MAX_OUTCOME_MESSAGE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A stored record: `version u8 | started_unix_us u64 | duration_ns u64 |
/// instructions u64 | failures u64 | cells_written u32 | reserved u64 (0)
/// | outcome u8 | message_len u16 | message`. The seq is in the key.
fn put_record(out: &mut Vec<u8>, record: &RunRecord, failures: u64) {
    out.push(RECORD_VERSION);
    out.extend_from_slice(&record.started_unix_us.to_le_bytes());
    out.extend_from_slice(&record.duration_ns.to_le_bytes());
    out.extend_from_slice(&record.instructions.to_le_bytes());
    out.extend_from_slice(&failures.to_le_bytes());
    out.extend_from_slice(&record.cells_written.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.push(record.outcome as u8);
    let message = message_of(record);
    out.extend_from_slice(&(message.len() as u16).to_le_bytes());
    out.extend_from_slice(message.as_bytes());
}

/// Reads a stored record (all of `bytes`); returns it and the failure count.
fn read_record(seq: u64, bytes: &[u8]) -> Result<(RunRecord, u64), String> {
    let fixed = 1 + 8 * 4 + 4 + 8 + 1 + 2;
    if bytes.len() < fixed {
        return Err(format!(
            "telemetry record of {} bytes is truncated",
            bytes.len()
        ));
    }
    if bytes[0] != RECORD_VERSION {
        return Err(format!("telemetry record version {} is unknown", bytes[0]));
    }
    let u64_at = |at: usize| LittleEndian::read_u64(&bytes[at..at + 8]);
    let outcome = RunOutcome::from_u8(bytes[45])
        .ok_or_else(|| format!("telemetry outcome {} is unknown", bytes[45]))?;
    let message_len = usize::from(LittleEndian::read_u16(&bytes[46..48]));
    if message_len > MAX_OUTCOME_MESSAGE_BYTES || bytes.len() != fixed + message_len {
        return Err(format!(
            "telemetry record of {} bytes does not match its message length {message_len}",
            bytes.len()
        ));
    }
    let message = std::str::from_utf8(&bytes[fixed..])
        .map_err(|_| "telemetry message not UTF-8")?
        .to_owned();
    Ok((
        RunRecord {
            seq,
            started_unix_us: u64_at(1),
            duration_ns: u64_at(9),
            instructions: u64_at(17),
            cells_written: LittleEndian::read_u32(&bytes[33..37]),
            outcome,
            message,
        },
        u64_at(25),
    ))
}

/// Payload bytes after `ns` and `coord` for a telemetry mutation.
pub(crate) fn telemetry_payload_len(change: &TelemetryChange) -> usize {
    match change {
        TelemetryChange::Append { record, .. } => 1 + 8 + 4 + 8 + record_len(record),
        TelemetryChange::Drop { .. } => 1 + 8,
    }
}

/// `flag u8`, then for an append `seq u64 | keep u32 | trim_from u64 |
/// record`, for a drop `seq u64`.
pub(crate) fn put_telemetry_payload(out: &mut Vec<u8>, change: &TelemetryChange) {
    match change {
        TelemetryChange::Append {
            record,
            failures,
            keep,
            trim_from,
        } => {
            out.push(CHANGE_APPEND);
            out.extend_from_slice(&record.seq.to_le_bytes());
            out.extend_from_slice(&keep.to_le_bytes());
            out.extend_from_slice(&trim_from.to_le_bytes());
            put_record(out, record, *failures);
        }
        TelemetryChange::Drop { seq } => {
            out.push(CHANGE_DROP);
            out.extend_from_slice(&seq.to_le_bytes());
        }
    }
}

/// Decodes what [`put_telemetry_payload`] wrote (all of `rest`).
pub(crate) fn read_telemetry_payload(rest: &[u8]) -> Result<TelemetryChange, String> {
    let (&flag, rest) = rest
        .split_first()
        .ok_or("telemetry payload without a flag")?;
    match flag {
        CHANGE_APPEND if rest.len() >= 20 => {
            let seq = LittleEndian::read_u64(&rest[0..8]);
            let keep = LittleEndian::read_u32(&rest[8..12]);
            let trim_from = LittleEndian::read_u64(&rest[12..20]);
            let (record, failures) = read_record(seq, &rest[20..])?;
            Ok(TelemetryChange::Append {
                record,
                failures,
                keep,
                trim_from,
            })
        }
        CHANGE_DROP if rest.len() == 8 => Ok(TelemetryChange::Drop {
            seq: LittleEndian::read_u64(rest),
        }),
        _ => Err(format!(
            "telemetry payload with flag {flag} and {} more bytes is malformed",
            rest.len()
        )),
    }
}

/// State key tags (`docs/storage-format.md`, "State keys").
pub(crate) const TAG_PROGRAM: u8 = 0x30;
pub(crate) const TAG_TELEMETRY: u8 = 0x40;

fn cell_part(key: &mut Vec<u8>, ns_id: u64, coord: Coord) {
    key.extend_from_slice(&ns_id.to_be_bytes());
    key.extend_from_slice(&crate::curve::morton_key(coord).to_be_bytes()[4..]);
}

/// `0x30 | ns_id (8, BE) | morton key (12, BE)`.
pub(crate) fn program_key(ns_id: u64, coord: Coord) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + 8 + 12);
    key.push(TAG_PROGRAM);
    cell_part(&mut key, ns_id, coord);
    key
}

/// `0x40 | ns_id (8, BE) | morton key (12, BE) | seq (8, BE)`: a cell's
/// records sort together, oldest first.
pub(crate) fn telemetry_key(ns_id: u64, coord: Coord, seq: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + 8 + 20);
    key.push(TAG_TELEMETRY);
    cell_part(&mut key, ns_id, coord);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// State updates of a program or telemetry mutation.
pub(crate) fn state_updates(
    mutation: &Mutation,
    ns_id: u64,
    out: &mut Vec<(Vec<u8>, Option<Vec<u8>>)>,
) {
    match mutation {
        Mutation::ProgramPut { coord, source, .. } => {
            out.push((program_key(ns_id, *coord), Some(source.clone())));
        }
        Mutation::ProgramDel { coord, .. } => out.push((program_key(ns_id, *coord), None)),
        Mutation::Telemetry { coord, change, .. } => {
            for seq in change.trimmed() {
                out.push((telemetry_key(ns_id, *coord, seq), None));
            }
            if let TelemetryChange::Append {
                record, failures, ..
            } = change
            {
                let mut value = Vec::with_capacity(record_len(record));
                put_record(&mut value, record, *failures);
                out.push((telemetry_key(ns_id, *coord, record.seq), Some(value)));
            }
        }
        _ => {}
    }
}

/// The mutation that re-creates a program or telemetry state entry;
/// `rest` is the key after its tag and namespace id.
pub(crate) fn entry_to_mutation(
    tag: u8,
    ns: NamespaceName,
    rest: &[u8],
    value: Option<Vec<u8>>,
) -> Result<Mutation, String> {
    let tail = if tag == TAG_TELEMETRY { 20 } else { 12 };
    if rest.len() != tail {
        return Err(format!("state key with tag 0x{tag:02x} is malformed"));
    }
    let mut morton = [0u8; 16];
    morton[4..].copy_from_slice(&rest[..12]);
    let coord = crate::curve::morton_decode(u128::from_be_bytes(morton));
    if tag == TAG_PROGRAM {
        return Ok(match value {
            Some(source) => Mutation::ProgramPut { ns, coord, source },
            None => Mutation::ProgramDel { ns, coord },
        });
    }
    let seq = u64::from_be_bytes(
        rest[12..]
            .try_into()
            .map_err(|_| "telemetry key without a seq")?,
    );
    let change = match value {
        None => TelemetryChange::Drop { seq },
        Some(bytes) => {
            let (record, failures) = read_record(seq, &bytes)?;
            TelemetryChange::Append {
                record,
                failures,
                keep: 0,
                trim_from: 0,
            }
        }
    };
    Ok(Mutation::Telemetry { ns, coord, change })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, outcome: RunOutcome, message: &str) -> RunRecord {
        RunRecord {
            seq,
            started_unix_us: 1_700_000_000_000_000 + seq,
            duration_ns: 1234,
            instructions: 5000,
            cells_written: 2,
            outcome,
            message: message.to_owned(),
        }
    }

    fn append(seq: u64, keep: u32, trim_from: u64) -> Mutation {
        Mutation::Telemetry {
            ns: NamespaceName::new("default").unwrap(),
            coord: Coord::new(1, -2, 3),
            change: TelemetryChange::Append {
                record: record(seq, RunOutcome::Ok, ""),
                failures: seq / 2,
                keep,
                trim_from,
            },
        }
    }

    #[test]
    fn identical_sources_share_one_allocation_and_unheld_ones_are_swept() {
        let table = ProgramTable::default();
        let ns = NamespaceName::new("default").unwrap();
        let put = |x: i32, source: &[u8]| Mutation::ProgramPut {
            ns: ns.clone(),
            coord: Coord::new(x, 0, 0),
            source: source.to_vec(),
        };
        table.apply(&put(0, b"return 1"), &mut 0);
        table.apply(&put(1, b"return 1"), &mut 0);
        table.apply(&put(2, b"return 2"), &mut 0);
        let programs = read(&table.programs);
        let cells = &programs[&ns];
        let at = |x: i32| &cells[&Coord::new(x, 0, 0)];
        assert!(Arc::ptr_eq(at(0), at(1)));
        assert!(!Arc::ptr_eq(at(0), at(2)));
        drop(programs);
        // Replace every program many times with distinct sources: the set
        // of interned sources stays bounded by the sweep.
        for i in 0..5 * INTERN_SWEEP_MIN {
            table.apply(
                &put((i % 3) as i32, format!("return {i}").as_bytes()),
                &mut 0,
            );
        }
        let interned = table.interned.lock().unwrap().sources.len();
        assert!(interned <= 2 * INTERN_SWEEP_MIN, "{interned} sources kept");
    }

    #[test]
    fn payloads_and_state_entries_round_trip() {
        for change in [
            TelemetryChange::Append {
                record: record(7, RunOutcome::Fuel, "ran out of fuel é"),
                failures: 3,
                keep: 1000,
                trim_from: 0,
            },
            TelemetryChange::Drop { seq: 99 },
        ] {
            let mut out = Vec::new();
            put_telemetry_payload(&mut out, &change);
            assert_eq!(out.len(), telemetry_payload_len(&change));
            assert_eq!(read_telemetry_payload(&out).unwrap(), change);
            for cut in 0..out.len() {
                assert!(read_telemetry_payload(&out[..cut]).is_err());
            }
        }
        let m = append(5, 3, 2);
        let mut updates = Vec::new();
        state_updates(&m, 4, &mut updates);
        // Trims seq 2, then writes seq 5.
        assert_eq!(updates.len(), 2);
        assert_eq!(updates[0].1, None);
        let (key, value) = updates[1].clone();
        let ns = NamespaceName::new("default").unwrap();
        let loaded = entry_to_mutation(key[0], ns.clone(), &key[9..], value).unwrap();
        let Mutation::Telemetry {
            change:
                TelemetryChange::Append {
                    record: r,
                    failures,
                    keep,
                    ..
                },
            ..
        } = loaded
        else {
            panic!("not an append");
        };
        assert_eq!((r.seq, failures, keep), (5, 2, 0));
        let (key, _) = updates[0].clone();
        assert!(matches!(
            entry_to_mutation(key[0], ns, &key[9..], None).unwrap(),
            Mutation::Telemetry {
                change: TelemetryChange::Drop { seq: 2 },
                ..
            }
        ));
    }

    #[test]
    fn the_ring_keeps_the_last_records_and_exact_counts() {
        let table = ProgramTable::default();
        // The charge follows the kept records, and the writer's estimate
        // of each append (`telemetry_record_change`) matches it.
        let mut charge = 0;
        for seq in 1..=10 {
            let change = append(seq, 4, seq.saturating_sub(4));
            let before = charge;
            table.apply(&change, &mut charge);
            let Mutation::Telemetry { change, .. } = &change else {
                unreachable!()
            };
            assert_eq!(
                charge - before,
                telemetry_record_change(change) * TELEMETRY_RECORD_CHARGE_BYTES as i64,
                "append {seq}"
            );
        }
        assert_eq!(charge, 4 * TELEMETRY_RECORD_CHARGE_BYTES as i64);
        let telemetry = read(&table.telemetry);
        let cell = telemetry.values().next().unwrap().values().next().unwrap();
        let seqs: Vec<u64> = cell.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [7, 8, 9, 10]);
        assert_eq!(cell.head().runs, 10);
        assert_eq!(cell.head().failures, 5);
    }

    #[test]
    fn trimming_after_keep_was_lowered_is_bounded_per_append() {
        let range = TelemetryChange::Append {
            record: record(1000, RunOutcome::Ok, ""),
            failures: 0,
            keep: 10,
            trim_from: 1,
        }
        .trimmed();
        assert_eq!(range.clone().count() as u64, MAX_TRIM_PER_APPEND);
        assert_eq!((*range.start(), *range.end()), (1, 64));
        let none = TelemetryChange::Append {
            record: record(3, RunOutcome::Ok, ""),
            failures: 0,
            keep: 10,
            trim_from: 1,
        }
        .trimmed();
        assert_eq!(none.count(), 0);
    }

    #[test]
    fn a_batch_records_and_undoes_what_one_by_one_does() {
        let names = [
            NamespaceName::new("default").unwrap(),
            NamespaceName::new("other").unwrap(),
        ];
        let at = |i: u64| Coord::new((i % 700) as i32, (i % 3) as i32, -((i % 5) as i32));
        let mem = MemStore::new();
        // Cells with stored telemetry beside those with none.
        for i in (0..700).step_by(3) {
            mem.programs.apply(
                &Mutation::Telemetry {
                    ns: names[0].clone(),
                    coord: at(i),
                    change: TelemetryChange::Append {
                        record: record(1, RunOutcome::Ok, ""),
                        failures: 0,
                        keep: 3,
                        trim_from: 1,
                    },
                },
                &mut 0,
            );
        }
        let mut runs: HashMap<CellId, u64> = HashMap::new();
        let mut mutations = Vec::new();
        for i in 0..3000u64 {
            let ns = names[(i % 7 == 0) as usize].clone();
            if i % 100 == 0 {
                mutations.push(Mutation::ProgramPut {
                    ns: ns.clone(),
                    coord: at(i),
                    source: format!("return {i}").into_bytes(),
                });
            }
            let seq = runs.entry((ns.clone(), at(i))).or_insert(1);
            *seq += 1;
            mutations.push(Mutation::Telemetry {
                ns,
                coord: at(i),
                change: TelemetryChange::Append {
                    record: record(*seq, RunOutcome::Ok, ""),
                    failures: i % 4,
                    keep: 3,
                    trim_from: 1,
                },
            });
        }
        let group = || {
            let mut pending = PendingPrograms::default();
            for i in 0..50 {
                pending.record(&append(i + 1, 3, 1), None);
                pending.record(
                    &Mutation::ProgramPut {
                        ns: names[1].clone(),
                        coord: at(i),
                        source: b"return 0".to_vec(),
                    },
                    None,
                );
            }
            pending
        };
        let (mut one, mut batch) = (group(), group());
        let (mut one_undo, mut batch_undo) = (Vec::new(), Vec::new());
        for mutation in &mutations {
            one.record(mutation, Some(&mut one_undo));
        }
        batch.record_all(&mutations, &mut batch_undo);
        assert_eq!(one.heads, batch.heads);
        assert_eq!(one.sources, batch.sources);
        for ns in &names {
            let coords: Vec<Coord> = (0..800).map(at).collect();
            let singles: Vec<_> = coords
                .iter()
                .map(|c| one.telemetry_head(&mem, ns, *c))
                .collect();
            assert_eq!(batch.telemetry_heads(&mem, ns, &coords), singles);
            assert!(singles.iter().any(Option::is_none) && singles.iter().any(Option::is_some));
        }
        one.restore(one_undo.into_iter().rev());
        batch.restore(batch_undo.into_iter().rev());
        let before = group();
        assert_eq!(one.heads, before.heads);
        assert_eq!(batch.heads, before.heads);
        assert_eq!(batch.sources, before.sources);
    }
}
