//! [`ClockCache`]: a sharded CLOCK (second chance) cache within a byte
//! budget, the mechanism under the block cache
//! (`crate::run_file::BlockCache`) and the row cache
//! (`crate::row_cache::RowCache`).
//!
//! A hit sets the entry's reference bit; the hand clears set bits and
//! evicts the first entry whose bit is clear. That is LRU's hit rate on the
//! scans and skewed reads that matter here, with a hit that only sets a
//! bit (no list to relink), so a hit takes its shard's lock shared: the
//! bit is atomic, and set only if clear (no write to a hot entry's line).
//! Concurrent hits never wait for each other, which matters with more
//! connection threads than cores (a thread preempted holding an exclusive
//! lock stalls every reader of its shard: measured, a mutex per shard made
//! the row cache's lookup 13 % of the daemon's time in hot gets). Entries
//! are split into up to [`MAX_SHARDS`] shards by a keyed hash of their
//! key, so no one can choose keys that all land in one shard; every shard
//! has an equal share of the budget, and a small cache has fewer shards so
//! that each still holds several entries. Each shard counts its own hits
//! and misses, on its own cache line.
//!
//! The budget counts what the caller says each entry costs; the tables add
//! about [`TABLE_BYTES_PER_ENTRY`] per entry, which callers include. An
//! entry larger than a shard's share is not kept.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Most shards of one cache.
pub const MAX_SHARDS: usize = 16;

/// What a cache's own tables cost per entry beyond the key and value: the
/// hash table's slot (key and index, at its load factor) and the entry's
/// hand bookkeeping.
pub const TABLE_BYTES_PER_ENTRY: usize = 48;

/// Counters of a cache since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockStats {
    pub budget_bytes: u64,
    pub bytes: u64,
    pub entries: u64,
    pub hits: u64,
    pub misses: u64,
    pub inserted_bytes: u64,
    pub evictions: u64,
}

struct Entry<K, V> {
    key: K,
    value: V,
    charge: usize,
    referenced: AtomicBool,
}

struct Shard<K, V> {
    map: HashMap<K, usize>,
    entries: Vec<Entry<K, V>>,
    hand: usize,
    bytes: usize,
}

impl<K: Hash + Eq + Copy, V> Shard<K, V> {
    fn new() -> Shard<K, V> {
        Shard {
            map: HashMap::new(),
            entries: Vec::new(),
            hand: 0,
            bytes: 0,
        }
    }

    /// Evicts until `charge` more bytes fit in `budget`.
    fn make_room(&mut self, charge: usize, budget: usize) -> u64 {
        let mut evicted = 0;
        while self.bytes + charge > budget && !self.entries.is_empty() {
            if self.hand >= self.entries.len() {
                self.hand = 0;
            }
            let entry = &mut self.entries[self.hand];
            if *entry.referenced.get_mut() {
                *entry.referenced.get_mut() = false;
                self.hand += 1;
                continue;
            }
            self.remove_at(self.hand);
            evicted += 1;
        }
        evicted
    }

    /// Removes entry `i`, moving the last entry into its place.
    fn remove_at(&mut self, i: usize) {
        let gone = self.entries.swap_remove(i);
        self.map.remove(&gone.key);
        self.bytes -= gone.charge;
        if let Some(moved) = self.entries.get(i) {
            self.map.insert(moved.key, i);
        }
    }

    fn remove_where(&mut self, mut gone: impl FnMut(&K) -> bool) {
        let mut i = 0;
        while i < self.entries.len() {
            if gone(&self.entries[i].key) {
                self.remove_at(i);
            } else {
                i += 1;
            }
        }
    }
}

/// A shard and its counters, on cache lines of their own.
#[repr(align(128))]
struct ShardSlot<K, V> {
    shard: RwLock<Shard<K, V>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// See the module doc.
pub struct ClockCache<K, V> {
    shards: Box<[ShardSlot<K, V>]>,
    /// Picks a key's shard; keyed per cache, like the shards' own tables.
    shard_hasher: RandomState,
    budget_bytes: usize,
    shard_budget_bytes: usize,
    inserted_bytes: AtomicU64,
    evictions: AtomicU64,
}

impl<K: Hash + Eq + Copy, V: Clone> ClockCache<K, V> {
    /// A cache of `budget_bytes`, with one shard for each `min_shard_bytes`
    /// of it (at least one, at most [`MAX_SHARDS`]).
    pub fn new(budget_bytes: usize, min_shard_bytes: usize) -> ClockCache<K, V> {
        let shards = (budget_bytes / min_shard_bytes.max(1)).clamp(1, MAX_SHARDS);
        ClockCache {
            shards: (0..shards)
                .map(|_| ShardSlot {
                    shard: RwLock::new(Shard::new()),
                    hits: AtomicU64::new(0),
                    misses: AtomicU64::new(0),
                })
                .collect(),
            shard_hasher: RandomState::new(),
            budget_bytes,
            shard_budget_bytes: budget_bytes / shards,
            inserted_bytes: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    fn slot(&self, key: &K) -> &ShardSlot<K, V> {
        let i = (self.shard_hasher.hash_one(key) % self.shards.len() as u64) as usize;
        &self.shards[i]
    }

    /// The value, if cached, marked referenced; counts a hit or a miss.
    pub fn get(&self, key: &K) -> Option<V> {
        let slot = self.slot(key);
        let found = {
            let shard = read(&slot.shard);
            shard.map.get(key).map(|&i| {
                let entry = &shard.entries[i];
                if !entry.referenced.load(Ordering::Relaxed) {
                    entry.referenced.store(true, Ordering::Relaxed);
                }
                entry.value.clone()
            })
        };
        let counter = if found.is_some() {
            &slot.hits
        } else {
            &slot.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Whether `key` is cached, without marking it referenced or counting
    /// a hit or a miss (a look ahead, not a read).
    pub fn contains(&self, key: &K) -> bool {
        read(&self.slot(key).shard).map.contains_key(key)
    }

    /// Keeps `value` at a cost of `charge` bytes, evicting others as
    /// needed. A key already there (another reader read it too) keeps the
    /// value it has: callers only ever insert what the key reads.
    pub fn insert(&self, key: K, value: V, charge: usize) {
        if charge > self.shard_budget_bytes {
            return;
        }
        let mut shard = write(&self.slot(&key).shard);
        if shard.map.contains_key(&key) {
            return;
        }
        let evicted = shard.make_room(charge, self.shard_budget_bytes);
        let i = shard.entries.len();
        shard.entries.push(Entry {
            key,
            value,
            charge,
            referenced: AtomicBool::new(false),
        });
        shard.map.insert(key, i);
        shard.bytes += charge;
        drop(shard);
        self.evictions.fetch_add(evicted, Ordering::Relaxed);
        self.inserted_bytes
            .fetch_add(charge as u64, Ordering::Relaxed);
    }

    /// Drops `key`'s entry, if any.
    pub fn remove(&self, key: &K) {
        let mut shard = write(&self.slot(key).shard);
        if let Some(i) = shard.map.get(key).copied() {
            shard.remove_at(i);
        }
    }

    /// Drops every entry whose key `gone` picks (every shard is visited).
    pub fn remove_where(&self, mut gone: impl FnMut(&K) -> bool) {
        for slot in self.shards.iter() {
            write(&slot.shard).remove_where(&mut gone);
        }
    }

    pub fn stats(&self) -> ClockStats {
        let (mut bytes, mut entries, mut hits, mut misses) = (0u64, 0u64, 0u64, 0u64);
        for slot in self.shards.iter() {
            let shard = read(&slot.shard);
            bytes += shard.bytes as u64;
            entries += shard.entries.len() as u64;
            hits += slot.hits.load(Ordering::Relaxed);
            misses += slot.misses.load(Ordering::Relaxed);
        }
        ClockStats {
            budget_bytes: self.budget_bytes as u64,
            bytes,
            entries,
            hits,
            misses,
            inserted_bytes: self.inserted_bytes.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}

// A panic while a shard is held leaves it consistent (no step of an
// update panics midway), so a poisoned lock is still usable.
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_referenced_entry_gets_a_second_chance() {
        // One shard of 3 bytes: entries 1, 2, 3 of one byte each.
        let cache: ClockCache<u32, u32> = ClockCache::new(3, 1 << 20);
        for k in 1..=3 {
            cache.insert(k, k * 10, 1);
        }
        assert_eq!(cache.get(&1), Some(10));
        cache.insert(4, 40, 1);
        assert_eq!(cache.get(&1), Some(10), "referenced: kept");
        assert_eq!(cache.get(&2), None, "the first unreferenced: evicted");
        assert_eq!(cache.get(&4), Some(40));
        let stats = cache.stats();
        assert_eq!((stats.entries, stats.bytes, stats.evictions), (3, 3, 1));
        assert_eq!((stats.hits, stats.misses), (3, 1));
    }

    #[test]
    fn removed_entries_are_gone_and_their_bytes_freed() {
        let cache: ClockCache<(u64, u64), u64> = ClockCache::new(1 << 20, 1 << 20);
        for i in 0..100 {
            cache.insert((i % 3, i), i, 10);
        }
        cache.remove(&(0, 0));
        assert_eq!(cache.get(&(0, 0)), None);
        cache.remove_where(|key| key.0 == 1);
        assert!(
            (0..100)
                .filter(|i| i % 3 == 1)
                .all(|i| cache.get(&(1, i)).is_none())
        );
        assert_eq!(cache.get(&(2, 2)), Some(2));
        let stats = cache.stats();
        assert_eq!(stats.entries, 100 - 1 - 33);
        assert_eq!(stats.bytes, stats.entries * 10);
    }

    #[test]
    fn an_entry_larger_than_a_shard_is_not_kept_and_a_present_key_keeps_its_value() {
        let cache: ClockCache<u8, u8> = ClockCache::new(100, 1 << 20);
        cache.insert(1, 1, 101);
        assert_eq!(cache.get(&1), None);
        cache.insert(2, 2, 10);
        cache.insert(2, 3, 10);
        assert_eq!(cache.get(&2), Some(2));
        assert_eq!(cache.stats().bytes, 10);
    }
}
