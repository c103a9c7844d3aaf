//! [`RowCache`]: the values of recently read cells of namespaces on disk,
//! by key, so that a hot `get` costs a hash probe instead of the block path
//! (the run index's fence search, the filter, the block cache, the
//! block's key search).
//!
//! An entry holds what the namespace's runs answer for the key, and only
//! that: reads look in the memtable first, and
//! [`crate::read_stack::ReadStack`] keeps the entries true:
//! - every write the memtable takes removes the key's entry
//!   (`ReadStack::apply`), so once the write is folded into a run no entry
//!   predates it;
//! - a value read from the runs is kept only if, under the namespace's
//!   `disk` read lock after the read, the memtable still lacks the key and
//!   the runs are the ones read (`ReadStack::remember_row`): a write applied
//!   meanwhile, or folded meanwhile, keeps it out.
//!
//! Entries are keyed by the stack's row id ([`next_row_id`], unique per
//! `ReadStack`, never reused), so a dropped namespace's entries are never
//! read again and age out. Only point reads (`get`, `mget`) fill it; scans
//! would push hot cells out for cells read once.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::cell_value::CellValue;
use crate::clock_cache::{ClockCache, ClockStats, TABLE_BYTES_PER_ENTRY};

/// A shard is made only for each this many bytes of budget.
const MIN_SHARD_BYTES: usize = 256 * 1024;

/// The stack's row id and the cell's curve key.
type RowKey = (u64, u128);

/// See the module doc.
pub struct RowCache {
    rows: ClockCache<RowKey, CellValue>,
}

/// Source of the stacks' row ids.
static NEXT_ROW_ID: AtomicU64 = AtomicU64::new(1);

/// A row id for a new `ReadStack`.
pub(crate) fn next_row_id() -> u64 {
    NEXT_ROW_ID.fetch_add(1, Ordering::Relaxed)
}

/// What one kept value costs: its key, the value's handle and its heap
/// bytes (none for a value stored inline), and the tables' share.
pub fn row_charge_bytes(value: &CellValue) -> usize {
    let heap = if value.len() > crate::cell_value::INLINE_VALUE_BYTES {
        value.len()
    } else {
        0
    };
    std::mem::size_of::<RowKey>() + std::mem::size_of::<CellValue>() + heap + TABLE_BYTES_PER_ENTRY
}

impl RowCache {
    pub fn new(budget_bytes: usize) -> RowCache {
        RowCache {
            rows: ClockCache::new(budget_bytes, MIN_SHARD_BYTES),
        }
    }

    /// The value the runs of stack `row_id` hold for `key`, if kept.
    pub(crate) fn get(&self, row_id: u64, key: u128) -> Option<CellValue> {
        self.rows.get(&(row_id, key))
    }

    /// Keeps `value` as what the runs of stack `row_id` hold for `key`.
    /// Only `ReadStack::remember_row` calls it, under the checks above.
    pub(crate) fn insert(&self, row_id: u64, key: u128, value: CellValue) {
        let charge = row_charge_bytes(&value);
        self.rows.insert((row_id, key), value, charge);
    }

    /// Drops `key`'s entry: a write to it was applied.
    pub(crate) fn forget(&self, row_id: u64, key: u128) {
        self.rows.remove(&(row_id, key));
    }

    pub fn stats(&self) -> ClockStats {
        self.rows.stats()
    }
}

impl std::fmt::Debug for RowCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowCache")
            .field("stats", &self.stats())
            .finish()
    }
}
