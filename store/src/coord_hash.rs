//! The hasher of every hot map keyed by coordinates or namespace names
//! (edges, programs, telemetry, a group's pending cells, the namespace
//! table that every read goes through).
//!
//! SipHash, `std`'s default, costs several times more per lookup than a
//! multiply-rotate per word, and walks and steps are mostly lookups. The
//! state starts from a per-process random seed so that clients cannot
//! choose coordinates that collide.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// A fast hasher for coordinates (three `i32` words): an FxHash-style
/// multiply-rotate per word and a murmur3 finaliser so the low bits (the
/// bucket) depend on every input bit. SipHash, `std`'s default, costs
/// several times more per lookup, and a walk is mostly lookups. The state
/// starts from a per-process random seed so that clients cannot choose
/// coordinates that collide.
#[derive(Clone, Copy)]
pub(crate) struct CoordHashBuilder {
    seed: u64,
}

impl CoordHashBuilder {
    pub(crate) fn new() -> CoordHashBuilder {
        CoordHashBuilder {
            seed: RandomState::new().hash_one(0x6564_6765_u64),
        }
    }
}

impl Default for CoordHashBuilder {
    fn default() -> CoordHashBuilder {
        CoordHashBuilder::new()
    }
}

impl BuildHasher for CoordHashBuilder {
    type Hasher = CoordHasher;

    fn build_hasher(&self) -> CoordHasher {
        CoordHasher(self.seed)
    }
}

pub(crate) struct CoordHasher(u64);

impl CoordHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for CoordHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_i32(&mut self, i: i32) {
        self.add(u64::from(i as u32));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

/// Indices of `keys` in the order of the buckets they hash to in a
/// `std` map of `capacity`, equal keys in their given order.
///
/// A step records and reads tens of thousands of cells in maps of
/// megabytes; visited in the callers' (curve) order each visit is a cache
/// and TLB miss (about 200 ns on the development VM, against 90 ns when
/// the map fits in cache). In bucket order the visits walk the table
/// once, front to back. The bucket of a hash is its low bits below the
/// table's power-of-two bucket count, as in `hashbrown`, which `std`'s
/// map is; were that to change, only the speed would, never the result.
pub(crate) fn bucket_order<K: std::hash::Hash>(
    builder: &CoordHashBuilder,
    capacity: usize,
    keys: impl Iterator<Item = K>,
) -> Vec<usize> {
    // hashbrown keeps a table at most 7/8 full, in a power-of-two count.
    let buckets = (capacity.saturating_mul(8) / 7).max(1).next_power_of_two() as u64;
    // Bucket and index packed in one word; a table of more than 2^32
    // buckets (never, here) only sorts by fewer bits.
    let mut order: Vec<u64> = keys
        .enumerate()
        .map(|(index, key)| {
            assert!(index <= u32::MAX as usize, "at most 2^32 keys at once");
            let bucket = builder.hash_one(key) & (buckets - 1) & u64::from(u32::MAX);
            bucket << 32 | index as u64
        })
        .collect();
    let bucket_bits = buckets.trailing_zeros().min(32);
    radix_sort_high_bits(&mut order, bucket_bits);
    order
        .into_iter()
        .map(|packed| (packed & u64::from(u32::MAX)) as usize)
        .collect()
}

/// Sorts `words` by their bits `32..32 + bits`, stably: a byte per pass,
/// a few passes over the slice instead of a comparison sort's n log n
/// (tens of thousands of keys: ~0.15 ms against ~0.9 ms).
fn radix_sort_high_bits(words: &mut Vec<u64>, bits: u32) {
    let mut spare = vec![0u64; words.len()];
    let mut shift = 32;
    while shift < 32 + bits {
        let mut starts = [0usize; 257];
        for word in words.iter() {
            starts[((word >> shift) & 0xff) as usize + 1] += 1;
        }
        for digit in 0..256 {
            starts[digit + 1] += starts[digit];
        }
        for word in words.iter() {
            let digit = ((word >> shift) & 0xff) as usize;
            spare[starts[digit]] = *word;
            starts[digit] += 1;
        }
        std::mem::swap(words, &mut spare);
        shift += 8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_order_sorts_by_bucket_then_index() {
        let builder = CoordHashBuilder::new();
        for (count, capacity) in [
            (0u32, 0usize),
            (5, 3),
            (1000, 1792),
            (3000, 57_344),
            (70_000, 114_688),
        ] {
            // Repeated keys keep their given order.
            let keys: Vec<u32> = (0..count).map(|i| i % 997).collect();
            let buckets = (capacity * 8 / 7).max(1).next_power_of_two() as u64;
            let mut expected: Vec<usize> = (0..keys.len()).collect();
            expected.sort_by_key(|i| (builder.hash_one(keys[*i]) & (buckets - 1), *i));
            assert_eq!(bucket_order(&builder, capacity, keys.iter()), expected);
        }
    }
}
