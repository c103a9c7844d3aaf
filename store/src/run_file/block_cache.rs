//! [`BlockCache`]: decoded run-file blocks within a byte budget, shared by
//! every reader.
//!
//! CLOCK (second chance) per shard: a hit sets the entry's reference bit;
//! the hand clears set bits and evicts the first entry whose bit is clear.
//! That is LRU's hit rate on the scans and skewed reads that matter here,
//! with a hit that only flips a bit (no list to relink). The cache is
//! split into up to [`MAX_SHARDS`] shards by block, each behind its own
//! mutex, so concurrent readers rarely meet; every shard has an equal
//! share of the budget, and a small cache has fewer shards so that each
//! still holds several blocks.
//!
//! The budget counts each block's buffers ([`DecodedBlock::charge_bytes`]);
//! the cache's own tables add about 100 bytes per block. A block larger
//! than a shard's share is handed to its reader but not kept.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::format::DecodedBlock;

/// Most shards of one cache.
pub const MAX_SHARDS: usize = 16;
/// A shard is made only for each this many bytes of budget.
const MIN_SHARD_BYTES: usize = 1024 * 1024;

/// Which block: the reader's cache id (unique per opened file, never
/// reused, so a file deleted and another made in its place never alias)
/// and the block's offset.
type BlockKey = (u64, u64);

/// Counters of a cache since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub budget_bytes: u64,
    pub bytes: u64,
    pub blocks: u64,
    pub hits: u64,
    pub misses: u64,
    pub inserted_bytes: u64,
    pub evictions: u64,
}

struct Entry {
    key: BlockKey,
    block: Arc<DecodedBlock>,
    charge: usize,
    referenced: bool,
}

#[derive(Default)]
struct Shard {
    map: HashMap<BlockKey, usize>,
    entries: Vec<Entry>,
    hand: usize,
    bytes: usize,
}

impl Shard {
    /// Evicts until `charge` more bytes fit in `budget`.
    fn make_room(&mut self, charge: usize, budget: usize) -> u64 {
        let mut evicted = 0;
        while self.bytes + charge > budget && !self.entries.is_empty() {
            if self.hand >= self.entries.len() {
                self.hand = 0;
            }
            let entry = &mut self.entries[self.hand];
            if entry.referenced {
                entry.referenced = false;
                self.hand += 1;
                continue;
            }
            let gone = self.entries.swap_remove(self.hand);
            self.map.remove(&gone.key);
            self.bytes -= gone.charge;
            if let Some(moved) = self.entries.get(self.hand) {
                self.map.insert(moved.key, self.hand);
            }
            evicted += 1;
        }
        evicted
    }

    fn remove_where(&mut self, mut gone: impl FnMut(&BlockKey) -> bool) {
        let mut i = 0;
        while i < self.entries.len() {
            if gone(&self.entries[i].key) {
                let e = self.entries.swap_remove(i);
                self.map.remove(&e.key);
                self.bytes -= e.charge;
                if let Some(moved) = self.entries.get(i) {
                    self.map.insert(moved.key, i);
                }
            } else {
                i += 1;
            }
        }
    }
}

/// See the module doc.
pub struct BlockCache {
    shards: Box<[Mutex<Shard>]>,
    budget_bytes: usize,
    shard_budget_bytes: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    inserted_bytes: AtomicU64,
    evictions: AtomicU64,
}

impl std::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Source of the readers' cache ids.
static NEXT_CACHE_ID: AtomicU64 = AtomicU64::new(1);

/// A cache id for a newly opened file.
pub(super) fn next_cache_id() -> u64 {
    NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed)
}

impl BlockCache {
    pub fn new(budget_bytes: usize) -> BlockCache {
        let shards = (budget_bytes / MIN_SHARD_BYTES).clamp(1, MAX_SHARDS);
        BlockCache {
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            budget_bytes,
            shard_budget_bytes: budget_bytes / shards,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            inserted_bytes: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: BlockKey) -> MutexGuard<'_, Shard> {
        // splitmix64 of both halves: offsets are multiples of nothing in
        // particular, but cache ids are small and consecutive.
        let mut x = key.0.rotate_left(32) ^ key.1;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        let i = (x % self.shards.len() as u64) as usize;
        // A panic while a shard is held leaves it consistent (no step of
        // an update panics midway), so a poisoned lock is still usable.
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The block, if cached; counts a hit or a miss.
    pub fn get(&self, cache_id: u64, offset: u64) -> Option<Arc<DecodedBlock>> {
        let found = self.lookup(cache_id, offset);
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// The block, if cached, marked referenced (for CLOCK); counts nothing.
    fn lookup(&self, cache_id: u64, offset: u64) -> Option<Arc<DecodedBlock>> {
        let key = (cache_id, offset);
        let mut shard = self.shard(key);
        shard.map.get(&key).copied().map(|i| {
            let entry = &mut shard.entries[i];
            entry.referenced = true;
            Arc::clone(&entry.block)
        })
    }

    /// Keeps `block`, evicting others as needed. A block already there
    /// (another reader read it too) stays as it is.
    pub fn insert(&self, cache_id: u64, offset: u64, block: &Arc<DecodedBlock>) {
        let charge = block.charge_bytes();
        if charge > self.shard_budget_bytes {
            return;
        }
        let key = (cache_id, offset);
        let mut shard = self.shard(key);
        if shard.map.contains_key(&key) {
            return;
        }
        let evicted = shard.make_room(charge, self.shard_budget_bytes);
        let i = shard.entries.len();
        shard.entries.push(Entry {
            key,
            block: Arc::clone(block),
            charge,
            referenced: false,
        });
        shard.map.insert(key, i);
        shard.bytes += charge;
        drop(shard);
        self.evictions.fetch_add(evicted, Ordering::Relaxed);
        self.inserted_bytes
            .fetch_add(charge as u64, Ordering::Relaxed);
    }

    /// Drops every block of one file (it was deleted after a merge).
    pub fn forget_file(&self, cache_id: u64) {
        for shard in self.shards.iter() {
            shard
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove_where(|key| key.0 == cache_id);
        }
    }

    pub fn stats(&self) -> CacheStats {
        let (mut bytes, mut blocks) = (0u64, 0u64);
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            bytes += shard.bytes as u64;
            blocks += shard.entries.len() as u64;
        }
        CacheStats {
            budget_bytes: self.budget_bytes as u64,
            bytes,
            blocks,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            inserted_bytes: self.inserted_bytes.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}
