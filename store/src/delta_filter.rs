//! A filter over the keys of a cell map's live delta, so that a point read
//! of a key the delta does not hold skips the delta's tree.
//!
//! Between merges the delta holds up to an eighth of the base (over 100 k
//! entries for a 1 M-cell namespace), and a `BTreeMap` lookup there is six
//! or seven dependent node visits, about 200 ns once they miss the cache,
//! paid by every read before it even reaches the base. Most reads are of
//! keys the delta does not hold; this filter answers "not here" for them
//! with one load from a table small enough to stay cached.
//!
//! It is a Bloom filter with all of a key's three bits in one 64-bit word
//! (one cache line touched per query), sized at 16 bits per expected entry:
//! about one query in a hundred for an absent key wrongly answers "maybe",
//! which only costs that read the tree lookup it would have done anyway.
//! Keys are never removed (a key deleted from the delta may stay "maybe");
//! the filter is replaced, empty, whenever the delta is, and rebuilt larger
//! when the delta outgrows it (`CellMap::filter_new_delta_key`), so its
//! size follows the delta's and an idle namespace costs a few bytes.

use crate::key_index::{mix, process_seed};

/// Bits of filter per entry the delta is expected to reach.
const BITS_PER_ENTRY: usize = 16;

/// The largest filter, in 64-bit words (8 MiB): beyond it the false
/// positive rate rises, which only slows reads.
const MAX_WORDS: usize = 1 << 20;

pub(crate) struct DeltaFilter {
    words: Vec<u64>,
    /// `words.len() - 1`; the length is a power of two.
    mask: usize,
    seed: u64,
    /// Entries it was sized for.
    capacity: usize,
}

impl DeltaFilter {
    /// An empty filter sized for a delta of up to `entries` keys.
    pub(crate) fn with_capacity(entries: usize) -> DeltaFilter {
        let words = (entries.saturating_mul(BITS_PER_ENTRY) / 64)
            .next_power_of_two()
            .clamp(1, MAX_WORDS);
        DeltaFilter {
            words: vec![0; words],
            mask: words - 1,
            seed: process_seed().rotate_left(17),
            capacity: words * 64 / BITS_PER_ENTRY,
        }
    }

    /// Entries it holds at its designed false-positive rate; past it the
    /// owner rebuilds it larger.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether a larger filter could be made (below [`MAX_WORDS`]).
    pub(crate) fn can_grow(&self) -> bool {
        self.words.len() < MAX_WORDS
    }

    pub(crate) fn insert(&mut self, key: u128) {
        let (word, bits) = self.probe(key);
        self.words[word] |= bits;
    }

    /// `false` only if `key` was never inserted.
    #[inline]
    pub(crate) fn may_contain(&self, key: u128) -> bool {
        let (word, bits) = self.probe(key);
        self.words[word] & bits == bits
    }

    #[inline]
    fn probe(&self, key: u128) -> (usize, u64) {
        let h = mix(key, self.seed);
        // The low bits choose the word, the top eighteen the three bits.
        let bits = (1u64 << (h >> 58)) | (1u64 << ((h >> 52) & 63)) | (1u64 << ((h >> 46) & 63));
        ((h as usize) & self.mask, bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_forgets_a_key_and_rarely_invents_one() {
        let mut filter = DeltaFilter::with_capacity(10_000);
        for key in 0..10_000u128 {
            filter.insert(key * 7);
        }
        assert!((0..10_000u128).all(|key| filter.may_contain(key * 7)));
        let false_positives = (0..100_000u128)
            .filter(|key| filter.may_contain(1 << 80 | key))
            .count();
        // About 1 % expected; 5 % would mean the bits are not spread.
        assert!(false_positives < 5_000, "{false_positives} of 100000");
    }

    #[test]
    fn capacity_follows_the_size_asked_for_up_to_the_cap() {
        assert!(DeltaFilter::with_capacity(0).capacity() >= 1);
        let filter = DeltaFilter::with_capacity(1000);
        assert!(filter.capacity() >= 1000 && filter.can_grow());
        let largest = DeltaFilter::with_capacity(usize::MAX);
        assert!(!largest.can_grow());
    }

    #[test]
    fn empty_filter_holds_nothing() {
        let filter = DeltaFilter::with_capacity(0);
        assert!(!filter.may_contain(0));
        assert!(!filter.may_contain(u128::MAX));
    }
}
