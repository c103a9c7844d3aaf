//! A namespace served from its run files (`crate::disk_tier`): its reads,
//! the writer's slices, and the runs a fold installs.
//!
//! Block reads are done holding no lock wherever the answer allows it: a
//! point read looks the key up in the memtable under the `disk` read lock,
//! then reads the runs it cloned (immutable, `Arc`) without it, so neither
//! the writer nor an installing fold waits behind the disk. The answer is
//! the state at the memtable lookup: runs are swapped only for runs that
//! read alike. Scans walk the stack under the read lock, a slice at a time
//! (`crate::memstore`).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crate::cell_value::CellValue;
use crate::curve::Curve;
use crate::disk_tier::{
    PendingInstall, TIER_DISK, TIER_MEMORY, TIER_MIGRATING, TierStats, resident_cost_bytes,
};
use crate::edges::EdgeGraph;
use crate::error::StoreError;
use crate::memstore::{MemStore, NamespaceCells, read, write};
use crate::mutation::Mutation;
use crate::read_stack::{ReadStack, read_runs};
use crate::run_file::{RunFileError, RunFileReader, Slot};

/// The cell a mutation writes, by curve key: `Some(value)` for a put,
/// `None` for a delete (a detach deletes too); `None` when it writes no
/// cell.
pub(crate) fn cell_write(curve: Curve, mutation: &Mutation) -> Option<(u128, Slot)> {
    match mutation {
        Mutation::Put { coord, value, .. } => {
            Some((curve.key(*coord), Some(CellValue::new(value))))
        }
        Mutation::Del { coord, .. } | Mutation::Detach { coord, .. } => {
            Some((curve.key(*coord), None))
        }
        _ => None,
    }
}

impl NamespaceCells {
    /// Each key's current slot: the memtable and the row cache under the
    /// lock, the runs without it; the values found in the runs are then
    /// kept in the row cache if `keep_rows` (not for the writer's lookups:
    /// it is about to write those keys). `None` if the namespace was
    /// dropped.
    fn disk_slots(
        &self,
        keys: &[u128],
        keep_rows: bool,
    ) -> Option<Vec<Result<Slot, RunFileError>>> {
        let (mut answers, runs, runs_version) = {
            let stack = read(&self.disk);
            if self.is_dropped() {
                return None;
            }
            let answers: Vec<Option<Result<Slot, RunFileError>>> = keys
                .iter()
                .map(|&key| {
                    stack
                        .memtable_slot(key)
                        .cloned()
                        .or_else(|| stack.cached_row(key).map(Some))
                        .map(Ok)
                })
                .collect();
            (answers, stack.runs().to_vec(), stack.runs_version())
        };
        let asked: Vec<bool> = answers.iter().map(Option::is_none).collect();
        read_runs(&runs, keys, &mut answers);
        if !keep_rows {
            return Some(answers.into_iter().map(|a| a.unwrap_or(Ok(None))).collect());
        }
        let stack = read(&self.disk);
        for ((&key, answer), asked) in keys.iter().zip(&answers).zip(asked) {
            if let (true, Some(Ok(Some(value)))) = (asked, answer) {
                stack.remember_row(key, value, runs_version);
            }
        }
        drop(stack);
        Some(
            answers
                .into_iter()
                .map(|answer| answer.unwrap_or(Ok(None)))
                .collect(),
        )
    }

    /// [`crate::MemStore::read_cell`] of a namespace on disk: the hot
    /// path of a `get`, so one key's lookup with nothing allocated on a
    /// hit (memtable or row cache); a miss clones the runs' list, reads
    /// them holding no lock, and keeps the value found in the row cache.
    pub(crate) fn read_disk<R>(
        &self,
        key: u128,
        read_value: impl FnOnce(Option<&CellValue>) -> R,
    ) -> Option<Result<R, StoreError>> {
        let (runs, runs_version) = {
            let stack = read(&self.disk);
            if self.is_dropped() {
                return None;
            }
            if let Some(slot) = stack.memtable_slot(key) {
                return Some(Ok(read_value(slot.as_ref())));
            }
            if let Some(value) = stack.cached_row(key) {
                drop(stack);
                return Some(Ok(read_value(Some(&value))));
            }
            (stack.runs().to_vec(), stack.runs_version())
        };
        for run in &runs {
            match run.get(key) {
                Ok(Some(slot)) => {
                    if let Some(value) = &slot {
                        read(&self.disk).remember_row(key, value, runs_version);
                    }
                    return Some(Ok(read_value(slot.as_ref())));
                }
                Ok(None) => {}
                Err(e) => return Some(Err(e.into())),
            }
        }
        Some(Ok(read_value(None)))
    }

    /// [`crate::MemStore::read_cells`] of a namespace on disk: all or
    /// nothing, so a bad block fails the request rather than leave a gap.
    pub(crate) fn read_disk_many(
        &self,
        keys: &[u128],
        mut visit: impl FnMut(usize, Option<&CellValue>),
    ) -> Option<Result<(), StoreError>> {
        let slots = self.disk_slots(keys, true)?;
        if let Some(e) = slots.iter().find_map(|slot| slot.as_ref().err()) {
            return Some(Err(e.again().into()));
        }
        for (i, slot) in slots.into_iter().enumerate() {
            visit(i, slot.ok().flatten().as_ref());
        }
        Some(Ok(()))
    }

    /// The length of each key's current value, for the writer (which
    /// alone changes what a key reads, so the answers stay true until it
    /// applies them). A failed read counts as no value: the write still
    /// applies (it is durable), and the count may be off by one until the
    /// next restart, which takes the manifest's exact counts.
    fn previous_lengths(
        &self,
        keys: &[u128],
        failures: &std::sync::atomic::AtomicU64,
    ) -> Vec<Option<usize>> {
        let Some(slots) = self.disk_slots(keys, false) else {
            return vec![None; keys.len()];
        };
        slots
            .into_iter()
            .map(|slot| match slot {
                Ok(value) => value.map(|v| v.len()),
                Err(e) => {
                    let before = failures.fetch_add(1, Relaxed);
                    if before.is_power_of_two() || before == 0 {
                        eprintln!(
                            "cubed: looking up a cell's previous value failed ({} so far): {e}; \
                             the write is applied, but cell counts and quotas may be off until \
                             a restart, which re-reads the checkpoint's exact counts; run \
                             `cubed --verify` on the data dir",
                            before + 1
                        );
                    }
                    None
                }
            })
            .collect()
    }
}

impl MemStore {
    /// One slice of a namespace on disk: previous lengths looked up first
    /// (block reads without the write lock), then the slice applied to the
    /// memtable under it.
    pub(crate) fn apply_slice_on_disk(
        &self,
        space: &NamespaceCells,
        edges: &mut EdgeGraph,
        slice: &[&Mutation],
        lsn: u64,
        existed: &mut Vec<bool>,
    ) {
        let writes: Vec<Option<(u128, Slot)>> =
            slice.iter().map(|m| cell_write(space.curve, m)).collect();
        let keys: Vec<u128> = writes.iter().flatten().map(|(key, _)| *key).collect();
        let mut previous = space
            .previous_lengths(&keys, &self.tiering.lookup_failures)
            .into_iter();
        let mut stack = write(&space.disk);
        let memtable_before = stack.memtable_bytes();
        let mut value_bytes = 0i64;
        let mut program_bytes = 0i64;
        for (mutation, cell) in slice.iter().zip(writes) {
            existed.push(match mutation {
                Mutation::ProgramPut { .. }
                | Mutation::ProgramDel { .. }
                | Mutation::Telemetry { .. } => self.programs.apply(mutation, &mut program_bytes),
                Mutation::Link { edge, weight, .. } => edges.link(edge, *weight),
                Mutation::Unlink { edge, .. } => edges.unlink(edge),
                _ => {
                    if let Mutation::Detach {
                        edges: incident, ..
                    } = mutation
                    {
                        edges.unlink_all(incident);
                    }
                    let Some((key, slot)) = cell else {
                        continue;
                    };
                    let looked_up = previous.next().flatten();
                    // A key written earlier in this slice: the lookup
                    // predates that write.
                    let before = match stack.active_slot(key) {
                        Some(slot) => slot.as_ref().map(|v| v.len()),
                        None => looked_up,
                    };
                    value_bytes += slot.as_ref().map_or(0, |v| v.len() as i64)
                        - before.map_or(0, |len| len as i64);
                    stack.apply(key, slot, lsn, before);
                    before.is_some()
                }
            });
        }
        space.add_value_bytes(value_bytes);
        space.add_program_bytes(program_bytes);
        let memtable_after = stack.memtable_bytes();
        drop(stack);
        self.tiering
            .add_memtable(memtable_after as i64 - memtable_before as i64);
    }

    /// Recovery's sorted batch (`MemStore::apply_sorted_cells`) for a
    /// namespace on disk.
    pub(crate) fn apply_sorted_on_disk(
        &self,
        space: &NamespaceCells,
        batch: Vec<(u128, Slot)>,
        lsn: u64,
    ) {
        for chunk in batch.chunks(crate::memstore::APPLY_SLICE_RECORDS) {
            let keys: Vec<u128> = chunk.iter().map(|(key, _)| *key).collect();
            let previous = space.previous_lengths(&keys, &self.tiering.lookup_failures);
            let mut stack = write(&space.disk);
            let memtable_before = stack.memtable_bytes();
            let mut value_bytes = 0i64;
            for ((key, slot), before) in chunk.iter().zip(previous) {
                value_bytes += slot.as_ref().map_or(0, |v| v.len() as i64)
                    - before.map_or(0, |len| len as i64);
                stack.apply(*key, slot.clone(), lsn, before);
            }
            space.add_value_bytes(value_bytes);
            let memtable_after = stack.memtable_bytes();
            drop(stack);
            self.tiering
                .add_memtable(memtable_after as i64 - memtable_before as i64);
        }
    }

    /// After each group: installs the runs that were waiting for it, and
    /// starts moving the largest namespace in memory to disk if the cells
    /// in memory are over their budget.
    pub(crate) fn after_group(&self, lsn: u64) {
        for install in self.tiering.take_ready() {
            self.install_now(install);
        }
        if self.tiering.over_resident_budget() {
            self.start_migrating(lsn);
        }
    }

    /// After recovery: every record up to `lsn` is applied.
    pub(crate) fn recovered_through(&self, lsn: u64) {
        self.tiering.set_applied(lsn);
    }

    /// Moves the largest namespace in memory to the migrating tier: its
    /// writes after `lsn` (the last applied) go to its memtable too, and
    /// the first fold through `lsn` completes the move.
    fn start_migrating(&self, lsn: u64) {
        let largest = self
            .namespaces()
            .into_iter()
            .filter(|space| space.tier.get() == TIER_MEMORY && !space.is_dropped())
            .max_by_key(|space| space.resident_cost());
        let Some(space) = largest else { return };
        let cells = write(&space.cells);
        if space.tier.get() != TIER_MEMORY || space.is_dropped() {
            return;
        }
        let cost = resident_cost_bytes(cells.len() as u64, space.value_bytes.load(Relaxed));
        // The memtable's live count follows the map's from here (each
        // write's previous value comes from the map).
        write(&space.disk).set_len(cells.len());
        space.tier.migrating_since_lsn.store(lsn, Relaxed);
        space.tier.set(TIER_MIGRATING);
        drop(cells);
        self.tiering.add_resident(-(cost as i64));
        self.tiering.migration_started();
    }

    /// The runs a namespace reads (by id), if it reads them: `None` for a
    /// namespace in memory or gone. What the checkpointer reuses when it
    /// opens the runs a manifest now lists.
    pub(crate) fn serving_runs(&self, ns_id: u64) -> Option<Vec<Arc<RunFileReader>>> {
        let space = self.namespace_by_id(ns_id)?;
        let cells = read(&space.cells);
        if space.tier.get() == TIER_MEMORY || space.is_dropped() {
            return None;
        }
        drop(cells);
        Some(read(&space.disk).runs().to_vec())
    }

    /// The ids of the namespaces that read their runs (migrating or on
    /// disk).
    pub(crate) fn serving_namespace_ids(&self) -> Vec<u64> {
        self.namespaces()
            .into_iter()
            .filter(|space| space.tier.get() != TIER_MEMORY && !space.is_dropped())
            .map(|space| space.id)
            .collect()
    }

    fn namespace_by_id(&self, ns_id: u64) -> Option<Arc<NamespaceCells>> {
        self.namespaces()
            .into_iter()
            .find(|space| space.id == ns_id)
    }

    /// Hands namespace `ns_id` the runs the manifest now lists for it,
    /// which hold every write up to `through_lsn`: at once if the writer
    /// has applied that far, else after its next group.
    pub(crate) fn install_runs(&self, ns_id: u64, runs: Vec<Arc<RunFileReader>>, through_lsn: u64) {
        let install = PendingInstall {
            ns_id,
            runs,
            through_lsn,
        };
        if self.tiering.applied_lsn() >= through_lsn {
            self.install_now(install);
        } else {
            self.tiering.park(install);
        }
    }

    fn install_now(&self, install: PendingInstall) {
        let PendingInstall {
            ns_id,
            runs,
            through_lsn,
        } = install;
        let Some(space) = self.namespace_by_id(ns_id) else {
            return;
        };
        let mut cells = write(&space.cells);
        let tier = space.tier.get();
        let since = space.tier.migrating_since_lsn.load(Relaxed);
        if space.is_dropped()
            || tier == TIER_MEMORY
            || (tier == TIER_MIGRATING && through_lsn < since)
        {
            return;
        }
        let mut stack = write(&space.disk);
        let memtable_before = stack.memtable_bytes();
        let (generations, unlisted) = stack.set_runs(runs, through_lsn);
        let retired = (tier == TIER_MIGRATING).then(|| {
            stack.attach_rows(Arc::clone(&self.tiering.rows));
            stack.set_len(cells.len());
            space.tier.set(TIER_DISK);
            cells.take_retired()
        });
        let memtable_after = stack.memtable_bytes();
        drop((stack, cells));
        self.tiering
            .add_memtable(memtable_after as i64 - memtable_before as i64);
        for run in &unlisted {
            self.tiering.cache.forget_file(run.cache_id());
        }
        if retired.is_some() {
            self.tiering.migration_done();
        }
        drop((generations, unlisted, retired));
    }

    /// At start, before any reader: namespace `ns` is served from `runs`
    /// (newest first), which hold `live` cells of `value_bytes` bytes and
    /// every write up to `through_lsn`. `false` if there is no such
    /// namespace.
    pub(crate) fn serve_from_disk(
        &self,
        ns: &cube_protocol::NamespaceName,
        runs: Vec<Arc<RunFileReader>>,
        live: u64,
        value_bytes: u64,
        through_lsn: u64,
    ) -> bool {
        let Some(space) = self.namespace(ns) else {
            return false;
        };
        let cells = write(&space.cells);
        let mut stack = write(&space.disk);
        *stack = ReadStack::new(Vec::new(), 0);
        stack.attach_rows(Arc::clone(&self.tiering.rows));
        let _ = stack.set_runs(runs, through_lsn);
        stack.set_len(usize::try_from(live).unwrap_or(usize::MAX));
        space.value_bytes.store(value_bytes, Relaxed);
        space.tier.set(TIER_DISK);
        drop((stack, cells));
        true
    }

    /// Whether a namespace of this estimated cost still fits in memory at
    /// start (the loader asks smallest first); if so it is counted.
    pub(crate) fn place_in_memory(&self, cost_bytes: u64) -> bool {
        let resident = self.tiering.resident_bytes();
        let fits = resident.saturating_add(cost_bytes) <= self.tiering.config.resident_limit_bytes;
        if fits {
            self.tiering.add_resident(cost_bytes as i64);
        }
        fits
    }

    /// How long the writer should pause after a group of `records`
    /// writes (`Tiering::throttle_us`).
    pub fn write_pause_us(&self, records: usize) -> u64 {
        self.tiering.throttle_us(records)
    }

    /// Whether a fold now would free memory (`Tiering::wants_fold`).
    pub fn wants_fold(&self) -> bool {
        self.tiering.wants_fold()
    }

    /// Called by the checkpointer once the runs of a manifest through
    /// `lsn` are handed to every namespace that reads runs.
    pub(crate) fn runs_published(&self, lsn: u64) {
        self.tiering.set_installed(lsn);
    }

    /// The tiers' figures, for `cubec stats`.
    pub fn tier_stats(&self) -> TierStats {
        let mut stats = TierStats {
            resident_bytes: self.tiering.resident_bytes(),
            resident_limit_bytes: self.tiering.config.resident_limit_bytes,
            memtable_bytes: self.tiering.memtable_bytes(),
            memtable_limit_bytes: self.tiering.config.memtable_limit_bytes,
            cache: self.tiering.cache_stats(),
            rows: self.tiering.rows.stats(),
            migrations: self.tiering.migrations.load(Relaxed),
            lookup_failures: self.tiering.lookup_failures.load(Relaxed),
            ..TierStats::default()
        };
        for space in self.namespaces() {
            match space.tier.get() {
                TIER_MEMORY => stats.namespaces_in_memory += 1,
                TIER_MIGRATING => stats.namespaces_migrating += 1,
                _ => {
                    stats.namespaces_on_disk += 1;
                    stats.run_index_bytes += read(&space.disk)
                        .runs()
                        .iter()
                        .map(|run| run.resident_bytes() as u64)
                        .sum::<u64>();
                }
            }
        }
        stats
    }
}

impl MemStore {
    /// Where namespace `ns` is served from: `"memory"`, `"migrating"` or
    /// `"disk"` (`crate::disk_tier`); `None` if there is no such namespace.
    pub fn namespace_tier(&self, ns: &cube_protocol::NamespaceName) -> Option<&'static str> {
        let space = self.namespace(ns)?;
        let tier = {
            let _cells = read(&space.cells);
            space.tier.get()
        };
        Some(crate::disk_tier::tier_name(tier))
    }
}
