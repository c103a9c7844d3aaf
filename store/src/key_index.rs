//! A hash index over a sorted run's keys: key → position, for point reads.
//!
//! The run's own two-level fence index finds a key in about twenty
//! dependent loads, most of them cache misses once the run outgrows the
//! cache (measured 120-250 ns of a 0.65 µs random get over 1 M cells).
//! This table answers in one slot load plus the key comparison. It is an
//! accelerator only: the run is the truth, a run without its index is read
//! through the fences, and the index is built off the critical path (the
//! compactor builds it for every merged run, and after recovery for the
//! runs recovery made), so loads and replays do not wait for it.
//!
//! Layout: open addressing with linear probing over `u32` slots, at most
//! half full, `u32::MAX` marking an empty one. A slot holds the key's
//! position in its low bits (as many as the run's length needs) and a tag
//! of the key's hash in the bits above (11 for a million keys, at least
//! one): a probe compares the key itself, a cache miss in the run's keys,
//! only where the tag matches. At half load a hit otherwise read about 1.5
//! keys and a miss about 2.5 (absent cells are common reads in a sparse
//! world); with the tag, a hit reads one key and a miss almost never any.
//! The top bit of a used slot is the key's *shadow mark*: set when a newer
//! layer of the cell map (its delta) may hold the key too, so that a point
//! read that finds an unmarked key in a run whose marks are complete can
//! answer without consulting the delta at all (`crate::cells`). Slots are
//! chosen by a keyed mix of the key (a random key per process), so clients
//! who choose coordinates cannot aim many keys at one slot; and no key may
//! sit more than [`MAX_PROBE`] slots from its home: a build that would
//! break that bound gives up, and the run keeps using its fences. That
//! bound is also what lets a miss stop after [`MAX_PROBE`] slots.

use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;

use crate::huge_pages::huge_vec;
use crate::prefetch::prefetch;

/// The longest probe sequence a lookup walks; see the module comment.
/// Twice the longest seen at the table's highest load (1/2) up to 8 M
/// keys, so a build gives up only on keys aimed at the mix.
pub(crate) const MAX_PROBE: usize = 128;

/// Runs with this many keys or more are not indexed: a position takes at
/// most 30 bits, leaving at least one tag bit beside the shadow mark.
pub(crate) const MAX_INDEXED_KEYS: usize = 1 << 30;

const EMPTY: u32 = u32::MAX;

/// A used slot's shadow mark (see the module comment).
const SHADOW: u32 = 1 << 31;

pub(crate) struct KeyIndex {
    /// Atomic only for the shadow marks, which are set while readers
    /// probe; positions and tags never change after the build. Relaxed
    /// loads compile to plain loads.
    slots: Box<[AtomicU32]>,
    /// `slots.len() - 1`; the length is a power of two.
    mask: usize,
    seed: u64,
    /// No key sits further than this from its home slot.
    max_probe: usize,
    /// The low bits of a slot that hold a position; the bits above, up to
    /// the shadow mark, hold the key's tag. Positions are below `1 <<
    /// position_bits` minus one, so a used slot is never [`EMPTY`].
    position_bits: u32,
}

impl KeyIndex {
    /// Indexes `keys` (each once). `None` if there are too many keys or
    /// the probe bound cannot be kept.
    pub(crate) fn build(keys: &[u128]) -> Option<KeyIndex> {
        KeyIndex::build_bounded(keys, MAX_PROBE)
    }

    fn build_bounded(keys: &[u128], max_probe: usize) -> Option<KeyIndex> {
        if keys.len() >= MAX_INDEXED_KEYS {
            return None;
        }
        // Load factor in (1/4, 1/2]: 8-16 bytes per key. At up to 2/3 the
        // longest probe passed 64 slots for many run sizes (72 at 2 730
        // keys, 87 at 699 050, 102 at 2.8 M), so their builds gave up; at
        // 1/2 it stayed at or under 55 up to 8 M keys, over repeated builds
        // (`probe_lengths` below).
        let len = (2 * keys.len()).next_power_of_two().max(16);
        // The fewest bits that hold every position and leave the all-ones
        // value unused (`keys.len() < 1 << position_bits`): at most 30.
        let position_bits = usize::BITS - keys.len().leading_zeros();
        let mut index = KeyIndex {
            slots: {
                let mut slots = huge_vec(len);
                slots.resize_with(len, || AtomicU32::new(EMPTY));
                slots.into_boxed_slice()
            },
            mask: len - 1,
            seed: process_seed(),
            max_probe,
            position_bits,
        };
        assert!(position_bits < u32::BITS - 1, "{} keys", keys.len());
        for (position, &key) in keys.iter().enumerate() {
            let hash = index.hash(key);
            let tag = index.tag(hash);
            let mask = index.mask;
            let mut slot = index.home(hash);
            let mut probes = 0;
            while *index.slots[slot].get_mut() != EMPTY {
                probes += 1;
                if probes >= max_probe {
                    return None;
                }
                slot = (slot + 1) & mask;
            }
            let entry = tag | position as u32;
            debug_assert!(entry != EMPTY && entry & SHADOW == 0);
            *index.slots[slot].get_mut() = entry;
        }
        Some(index)
    }

    /// The position of `key` in `keys`, the slice this index was built
    /// over.
    #[inline]
    pub(crate) fn find(&self, keys: &[u128], key: u128) -> Option<usize> {
        self.find_from(keys, key, self.hash(key))
    }

    /// [`KeyIndex::find`] with `key`'s hash already worked out
    /// ([`KeyIndex::hash`]), as a batched read has.
    #[inline]
    pub(crate) fn find_from(&self, keys: &[u128], key: u128, hash: u64) -> Option<usize> {
        self.find_slot(keys, key, hash)
            .map(|(_, entry)| (entry & self.position_mask()) as usize)
    }

    /// [`KeyIndex::find`] that also says whether the key's slot carries
    /// the shadow mark.
    #[inline]
    pub(crate) fn find_marked(&self, keys: &[u128], key: u128) -> Option<(usize, bool)> {
        self.find_slot(keys, key, self.hash(key))
            .map(|(_, entry)| ((entry & self.position_mask()) as usize, entry & SHADOW != 0))
    }

    /// Sets the shadow mark of `key`'s slot, if the index holds the key.
    /// Marks are never cleared: a stale mark only sends a read to the
    /// delta, which does not have the key, and on to the run.
    pub(crate) fn mark_shadowed(&self, keys: &[u128], key: u128) {
        if let Some((slot, entry)) = self.find_slot(keys, key, self.hash(key))
            && entry & SHADOW == 0
        {
            self.slots[slot].fetch_or(SHADOW, Relaxed);
        }
    }

    /// The slot holding `key` and its entry.
    #[inline]
    fn find_slot(&self, keys: &[u128], key: u128, hash: u64) -> Option<(usize, u32)> {
        let tag = self.tag(hash);
        let tag_bits = !self.position_mask() & !SHADOW;
        let mut slot = self.home(hash);
        for _ in 0..self.max_probe {
            let entry = self.slots[slot].load(Relaxed);
            if entry == EMPTY {
                return None;
            }
            if entry & tag_bits == tag {
                let position = (entry & self.position_mask()) as usize;
                if keys.get(position) == Some(&key) {
                    return Some((slot, entry));
                }
            }
            slot = (slot + 1) & self.mask;
        }
        None
    }

    /// Starts loading a key's home slot ([`crate::MemStore::read_cells`]).
    #[inline]
    pub(crate) fn prefetch_slot(&self, hash: u64) {
        prefetch(&self.slots[self.home(hash)]);
    }

    /// Where the key of `hash` most likely is, for a prefetch: the first
    /// slot with its tag among the home slot and the three after it
    /// (usually the home slot's cache line, already loaded).
    #[inline]
    pub(crate) fn likely_position(&self, hash: u64) -> Option<usize> {
        let tag = self.tag(hash);
        let mut slot = self.home(hash);
        for _ in 0..4 {
            let entry = self.slots[slot].load(Relaxed);
            if entry == EMPTY {
                return None;
            }
            if entry & !self.position_mask() & !SHADOW == tag {
                return Some((entry & self.position_mask()) as usize);
            }
            slot = (slot + 1) & self.mask;
        }
        None
    }

    /// Bytes of memory the table holds.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<AtomicU32>()
    }

    /// `key`'s hash: its home slot ([`KeyIndex::home`]) and its tag.
    #[inline]
    pub(crate) fn hash(&self, key: u128) -> u64 {
        mix(key, self.seed)
    }

    /// Where the probe of a key with this hash starts: its low bits.
    #[inline]
    fn home(&self, hash: u64) -> usize {
        (hash as usize) & self.mask
    }

    /// The tag of a key with this hash, in a slot's tag bits: the hash's
    /// high half, independent of the low bits that chose the home slot.
    #[inline]
    fn tag(&self, hash: u64) -> u32 {
        (((hash >> 32) as u32) << self.position_bits) & !SHADOW
    }

    #[inline]
    fn position_mask(&self) -> u32 {
        (1u32 << self.position_bits) - 1
    }
}

/// murmur3's 64-bit finaliser over the folded key and a seed: every key
/// bit reaches every output bit.
#[inline]
pub(crate) fn mix(key: u128, seed: u64) -> u64 {
    let mut x = (key as u64) ^ ((key >> 64) as u64).rotate_left(29) ^ seed;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// One random seed per process, from the standard library's own
/// randomly keyed hasher state.
pub(crate) fn process_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(0x6375_6265);
        hasher.finish()
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The index agrees with a binary search, for keys present and
        /// absent.
        #[test]
        fn finds_what_binary_search_finds(
            mut keys in prop::collection::vec(any::<u128>(), 0..500),
            probes in prop::collection::vec(any::<u128>(), 0..50),
        ) {
            keys.sort_unstable();
            keys.dedup();
            let index = KeyIndex::build(&keys).unwrap();
            for (i, &key) in keys.iter().enumerate() {
                prop_assert_eq!(index.find(&keys, key), Some(i));
            }
            for key in probes {
                prop_assert_eq!(index.find(&keys, key), keys.binary_search(&key).ok());
            }
        }
    }

    #[test]
    fn dense_morton_like_keys_index_within_the_probe_bound() {
        let keys: Vec<u128> = (0..200_000u128).map(|i| i * 3).collect();
        let index = KeyIndex::build(&keys).unwrap();
        assert!(index.bytes() <= keys.len() * 16);
        for i in (0..keys.len()).step_by(997) {
            assert_eq!(index.find(&keys, keys[i]), Some(i));
            assert_eq!(index.find(&keys, keys[i] + 1), None);
        }
    }

    #[test]
    fn a_build_that_breaks_the_probe_bound_gives_up() {
        let keys: Vec<u128> = (0..1000).collect();
        // 1000 keys in 2048 slots cannot all sit in their home slots.
        assert!(KeyIndex::build_bounded(&keys, 1).is_none());
        let index = KeyIndex::build_bounded(&keys, 1000).unwrap();
        assert_eq!(index.find(&keys, 999), Some(999));
    }

    #[test]
    fn tags_leave_every_position_reachable_at_the_bit_boundaries() {
        // Lengths where the position field grows a bit (and the tag
        // shrinks one): every key is found, and absent neighbours are not.
        for len in [1usize, 2, 3, 255, 256, 257, 65_535, 65_536] {
            let keys: Vec<u128> = (0..len as u128).map(|k| k * 5 + 2).collect();
            let index = KeyIndex::build(&keys).unwrap();
            for (i, &key) in keys.iter().enumerate() {
                assert_eq!(index.find(&keys, key), Some(i), "len {len}");
                assert_eq!(index.find(&keys, key + 1), None, "len {len}");
            }
            assert!(
                index
                    .slots
                    .iter()
                    .map(|s| s.load(Relaxed))
                    .all(|s| s == EMPTY || (s & index.position_mask()) < len as u32)
            );
        }
    }

    #[test]
    fn the_likely_position_is_the_key_for_nearly_every_key() {
        let keys: Vec<u128> = (0..10_000u128).map(|k| k * 7).collect();
        let index = KeyIndex::build(&keys).unwrap();
        let right = keys
            .iter()
            .enumerate()
            .filter(|&(i, &key)| index.likely_position(index.hash(key)) == Some(i))
            .count();
        assert!(right * 100 >= keys.len() * 95, "{right} of {}", keys.len());
    }

    #[test]
    fn shadow_marks_stick_to_their_keys_and_change_no_answer() {
        for len in [1usize, 3, 256, 257, 10_000] {
            let keys: Vec<u128> = (0..len as u128).map(|k| k * 5 + 2).collect();
            let index = KeyIndex::build(&keys).unwrap();
            let marked = |i: usize| i.is_multiple_of(3);
            let likely: Vec<Option<usize>> = keys
                .iter()
                .map(|&k| index.likely_position(index.hash(k)))
                .collect();
            for (i, &key) in keys.iter().enumerate() {
                if marked(i) {
                    index.mark_shadowed(&keys, key);
                    // Twice is the same as once.
                    index.mark_shadowed(&keys, key);
                }
                // Absent keys have no slot to mark.
                index.mark_shadowed(&keys, key + 1);
            }
            for (i, &key) in keys.iter().enumerate() {
                assert_eq!(index.find(&keys, key), Some(i), "len {len}");
                assert_eq!(
                    index.find_marked(&keys, key),
                    Some((i, marked(i))),
                    "len {len}"
                );
                assert_eq!(index.find_marked(&keys, key + 1), None, "len {len}");
                assert_eq!(index.likely_position(index.hash(key)), likely[i]);
            }
        }
    }

    #[test]
    fn empty_run_finds_nothing() {
        let index = KeyIndex::build(&[]).unwrap();
        assert_eq!(index.find(&[], 7), None);
    }
}

#[cfg(test)]
mod probe_lengths {
    use super::*;

    /// Prints the longest probe of a table over `PROBE_SIZES` keys (comma
    /// separated; by default sizes at the table's highest load), for
    /// choosing the load factor and [`MAX_PROBE`].
    #[test]
    #[ignore = "measurement"]
    fn longest_probe_at_the_worst_load() {
        let sizes: Vec<usize> = std::env::var("PROBE_SIZES").map_or_else(
            |_| vec![1024, 4096, 32_768, 262_144, 1 << 20, 1 << 22, 1 << 23],
            |s| s.split(',').map(|n| n.parse().unwrap()).collect(),
        );
        for n in sizes {
            let mut keys: Vec<u128> = (0..n as u128)
                .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835))
                .collect();
            keys.sort_unstable();
            keys.dedup();
            let index = KeyIndex::build_bounded(&keys, usize::MAX).unwrap();
            let mut longest = 0;
            for &key in &keys {
                let mut slot = index.home(index.hash(key));
                let mut probes = 0;
                while keys[(index.slots[slot].load(Relaxed) & index.position_mask()) as usize]
                    != key
                {
                    slot = (slot + 1) & index.mask;
                    probes += 1;
                }
                longest = longest.max(probes);
            }
            println!(
                "{n} keys, {} slots: longest probe {longest}",
                index.slots.len()
            );
        }
    }
}
