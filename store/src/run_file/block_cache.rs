//! [`BlockCache`]: decoded run-file blocks within a byte budget, shared by
//! every reader: a [`ClockCache`] (CLOCK per shard, up to sixteen
//! shards) keyed by file and offset.
//!
//! The budget counts each block's buffers ([`DecodedBlock::charge_bytes`]);
//! the cache's own tables add about 100 bytes per block. A block larger
//! than a shard's share is handed to its reader but not kept.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::format::DecodedBlock;
use crate::clock_cache::ClockCache;

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

/// See the module doc.
pub struct BlockCache {
    blocks: ClockCache<BlockKey, Arc<DecodedBlock>>,
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
        BlockCache {
            blocks: ClockCache::new(budget_bytes, MIN_SHARD_BYTES),
        }
    }

    /// The block, if cached; counts a hit or a miss.
    pub fn get(&self, cache_id: u64, offset: u64) -> Option<Arc<DecodedBlock>> {
        self.blocks.get(&(cache_id, offset))
    }

    /// Whether the block is cached; counts nothing (a look ahead).
    pub fn contains(&self, cache_id: u64, offset: u64) -> bool {
        self.blocks.contains(&(cache_id, offset))
    }

    /// Keeps `block`, evicting others as needed. A block already there
    /// (another reader read it too) stays as it is.
    pub fn insert(&self, cache_id: u64, offset: u64, block: &Arc<DecodedBlock>) {
        self.blocks
            .insert((cache_id, offset), Arc::clone(block), block.charge_bytes());
    }

    /// Drops every block of one file (it was deleted after a merge).
    pub fn forget_file(&self, cache_id: u64) {
        self.blocks.remove_where(|key| key.0 == cache_id);
    }

    pub fn stats(&self) -> CacheStats {
        let s = self.blocks.stats();
        CacheStats {
            budget_bytes: s.budget_bytes,
            bytes: s.bytes,
            blocks: s.entries,
            hits: s.hits,
            misses: s.misses,
            inserted_bytes: s.inserted_bytes,
            evictions: s.evictions,
        }
    }
}
