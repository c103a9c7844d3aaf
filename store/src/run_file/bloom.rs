//! A run file's Bloom filter: whether a key may be in the file, answered
//! from memory, so that a lookup of a key the file does not hold reads no
//! block (`docs/storage-format.md`, "Run files", "Bloom filter").
//!
//! [`BITS_PER_KEY`] bits per entry (tombstones too) and [`PROBES`] probes:
//! a false positive rate of about 0.8% (measured by
//! `run_file::tests::the_filter_has_no_false_negatives_and_few_false_positives`),
//! where 10 bits and 7 probes are the optimum (k = ln 2 x bits per key).
//!
//! Format version 2 sized the filter by the file's entry count alone
//! ([`filter_bytes`]), which its writer knew only at the end, so it kept
//! every entry's hash until then. Version 3 records the filter's bit
//! count in the filter's own header: its writer sizes the filter from an
//! expected entry count (an upper bound) when it starts and sets bits as
//! entries stream in. A reader accepts [`min_bits`] to [`max_bits`] bits
//! for the file's entry count: fewer would raise the false positive rate
//! silently, more than [`MAX_OVERSIZE`] times is refused as nonsense (the
//! writer folds a filter that oversized, [`BloomFilter::fold`]).
//!
//! The payload begins with the CRC32C that ends the file's stored index,
//! which binds the filter to its own file even in a plain file (whose
//! pieces carry no position): a filter taken from another file with as
//! many entries would otherwise be accepted, and hide cells that file
//! lacks.
//!
//! The hash of a key is two 64-bit halves mixed by the MurmurHash3
//! finalizer ([`fmix64`]); its probes are by double hashing (Kirsch and
//! Mitzenmacher): probe i is `h1 + i * h2`, mapped onto the filter's bits by
//! a multiply-shift, which needs no division and no power-of-two size.

use std::collections::VecDeque;

use crate::huge_pages::huge_vec;
use crate::prefetch::prefetch;

/// Filter bits per entry.
pub const BITS_PER_KEY: u64 = 10;
/// Bits set, and tested, per key.
pub const PROBES: u64 = 7;
/// A version-3 filter is at most this many times [`min_bits`].
pub const MAX_OVERSIZE: u64 = 4;
/// Mixed into the high half of a key before the low half.
const SEED_HIGH: u64 = 0x9e37_79b9_7f4a_7c15;
/// Mixed into h1 to make h2.
const SEED_STEP: u64 = 0xc2b2_ae3d_27d4_eb4f;

/// The index CRC in front of a version-2 filter's bits.
pub const FILTER_HEADER_BYTES: usize = 4;
/// The index CRC and the bit count in front of a version-3 filter's bits.
pub const FILTER_V3_HEADER_BYTES: usize = 12;
/// Room a new filter keeps after its bits for its header and what storing
/// it adds (a MAC and a CRC), so that encoding and storing it move it in
/// place instead of copying it (a quarter of a gigabyte at 200 M cells).
const STORE_SPARE_BYTES: usize = FILTER_V3_HEADER_BYTES + 64;

/// The version-2 filter's bit array length for a file of `entries`
/// entries: ceil(entries x [`BITS_PER_KEY`] / 8) bytes; `None` on overflow.
fn bit_bytes(entries: u64) -> Option<u64> {
    Some(min_bits(entries)?.div_ceil(8))
}

/// The version-2 filter's payload length for a file of `entries`
/// entries: the index CRC and the bits; `None` on overflow.
pub fn filter_bytes(entries: u64) -> Option<u64> {
    bit_bytes(entries)?.checked_add(FILTER_HEADER_BYTES as u64)
}

/// The fewest bits a version-3 filter of `entries` entries has:
/// [`BITS_PER_KEY`] a key; `None` on overflow.
pub fn min_bits(entries: u64) -> Option<u64> {
    entries.checked_mul(BITS_PER_KEY)
}

/// The most bits a version-3 filter of `entries` entries has:
/// [`MAX_OVERSIZE`] x [`min_bits`]; `None` on overflow.
pub fn max_bits(entries: u64) -> Option<u64> {
    min_bits(entries)?.checked_mul(MAX_OVERSIZE)
}

/// The version-3 filter's payload length for a filter of `bits` bits.
pub fn v3_payload_bytes(bits: u64) -> Option<u64> {
    bits.div_ceil(8).checked_add(FILTER_V3_HEADER_BYTES as u64)
}

/// The MurmurHash3 64-bit finalizer: every input bit moves every output
/// bit, and it is a bijection.
pub fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// The 64-bit hash of a key that its probes derive from.
pub fn key_hash(key: u128) -> u64 {
    let (low, high) = (key as u64, (key >> 64) as u64);
    fmix64(low ^ fmix64(high ^ SEED_HIGH))
}

/// A filter's bits in memory of their own, on huge pages when large
/// (`crate::huge_pages`): its probes land anywhere in it, and with 4 KiB
/// pages nearly every one was a TLB miss too.
fn on_huge_pages(bits: &[u8]) -> Vec<u8> {
    let mut bytes = huge_vec(bits.len());
    bytes.extend_from_slice(bits);
    bytes
}

/// How far ahead [`BloomFilter::may_contain_each`] asks for the lines it
/// will probe: enough misses in flight to cover a memory latency.
const PREFETCH_AHEAD_KEYS: usize = 16;

/// The bit a probe value `g` maps to in a filter of `bits` bits.
fn bit_of(g: u64, bits: u64) -> u64 {
    ((u128::from(g) * u128::from(bits)) >> 64) as u64
}

/// The bits of `hash` in a filter of `bits` bits (`bits` > 0).
fn probes(hash: u64, bits: u64) -> impl Iterator<Item = u64> {
    let step = fmix64(hash ^ SEED_STEP);
    (0..PROBES).map(move |i| bit_of(hash.wrapping_add(i.wrapping_mul(step)), bits))
}

/// A filter in memory: `bits` bits, bit b in byte b / 8 at mask
/// 1 << (b % 8); the bits of the last byte past `bits` are zero.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BloomFilter {
    bytes: Vec<u8>,
    bits: u64,
}

impl BloomFilter {
    /// An empty filter of `bits` bits, allocated at once.
    pub fn with_bits(bits: u64) -> BloomFilter {
        let len = usize::try_from(bits.div_ceil(8)).unwrap_or(usize::MAX);
        let mut bytes = huge_vec(len.saturating_add(STORE_SPARE_BYTES));
        bytes.resize(len, 0);
        BloomFilter { bytes, bits }
    }

    /// Adds the key whose [`key_hash`] is `hash`.
    pub fn insert(&mut self, hash: u64) {
        if self.bits == 0 {
            return;
        }
        for b in probes(hash, self.bits) {
            self.bytes[(b / 8) as usize] |= 1 << (b % 8);
        }
    }

    pub fn bits(&self) -> u64 {
        self.bits
    }

    fn is_set(&self, b: u64) -> bool {
        self.bytes[(b / 8) as usize] & (1 << (b % 8)) != 0
    }

    /// This filter as a filter of `bits` bits (fewer than it has), holding
    /// every key it holds: a probe value that lands on bit b here lands,
    /// with `bits` bits, on one of the bits that b's range of probe values
    /// covers there, and each of those is set. When `bits` divides this
    /// filter's size, that is one bit, and the result is the filter built
    /// with `bits` bits directly; otherwise a bit on a boundary sets two,
    /// a few more false positives and never a false negative.
    pub fn fold(&self, bits: u64) -> BloomFilter {
        let mut out = BloomFilter::with_bits(bits.min(self.bits));
        if out.bits == 0 {
            return out;
        }
        let (from, to) = (u128::from(self.bits), u128::from(out.bits));
        let set = self
            .bytes
            .iter()
            .enumerate()
            .filter(|(_, byte)| **byte != 0);
        let set =
            set.flat_map(|(i, _)| (i as u64 * 8..(i as u64 + 1) * 8).filter(|&b| self.is_set(b)));
        for b in set {
            // The probe values g with floor(g x from / 2^64) == b.
            let lo = (u128::from(b) << 64).div_ceil(from);
            let hi = (u128::from(b + 1) << 64).div_ceil(from) - 1;
            let first = ((lo * to) >> 64) as u64;
            let last = ((hi * to) >> 64) as u64;
            for nb in first..=last {
                out.bytes[(nb / 8) as usize] |= 1 << (nb % 8);
            }
        }
        out
    }

    /// A version-2 filter read back, for a file of `entries` entries whose
    /// stored index ends with `index_crc`: its length must be exactly
    /// [`filter_bytes`] and it must name that index (any bits are a valid
    /// filter; the CRC, MAC or tag around it said whether they are the
    /// ones written).
    pub fn decode_v2(
        mut payload: Vec<u8>,
        entries: u64,
        index_crc: u32,
    ) -> Result<BloomFilter, String> {
        let want = filter_bytes(entries);
        if want != Some(payload.len() as u64) {
            return Err(format!(
                "a filter of {} bytes for {entries} entries (expected {})",
                payload.len(),
                want.map_or_else(|| "an overflow".to_string(), |w| w.to_string())
            ));
        }
        let bytes = on_huge_pages(&payload[FILTER_HEADER_BYTES..]);
        payload.truncate(FILTER_HEADER_BYTES);
        check_index_crc(&payload, index_crc)?;
        let bits = bytes.len() as u64 * 8;
        Ok(BloomFilter { bytes, bits })
    }

    /// A version-3 filter read back (`index_crc u32 | bits u64 | bit
    /// array`), for a file of `entries` entries whose stored index ends
    /// with `index_crc`: [`min_bits`] to [`max_bits`] bits, exactly
    /// ceil(bits / 8) bytes of them, the unused bits of the last byte zero,
    /// and naming that index.
    pub fn decode_v3(
        mut payload: Vec<u8>,
        entries: u64,
        index_crc: u32,
    ) -> Result<BloomFilter, String> {
        if payload.len() < FILTER_V3_HEADER_BYTES {
            return Err(format!("a filter of {} bytes", payload.len()));
        }
        let bytes = on_huge_pages(&payload[FILTER_V3_HEADER_BYTES..]);
        payload.truncate(FILTER_V3_HEADER_BYTES);
        let mut count = [0u8; 8];
        count.copy_from_slice(&payload[4..12]);
        let bits = u64::from_le_bytes(count);
        let (min, max) = (min_bits(entries), max_bits(entries));
        if min.is_none_or(|m| bits < m) || max.is_none_or(|m| bits > m) {
            return Err(format!(
                "a filter of {bits} bits for {entries} entries (this build accepts {} to {} \
                 bits: {BITS_PER_KEY} to {} a key)",
                min.unwrap_or(u64::MAX),
                max.unwrap_or(u64::MAX),
                BITS_PER_KEY * MAX_OVERSIZE
            ));
        }
        if bytes.len() as u64 != bits.div_ceil(8) {
            return Err(format!(
                "a filter of {bits} bits in {} bytes (expected {})",
                bytes.len(),
                bits.div_ceil(8)
            ));
        }
        if bits % 8 != 0 && bytes.last().is_some_and(|b| b >> (bits % 8) != 0) {
            return Err(format!("bits set past the filter's {bits} bits"));
        }
        check_index_crc(&payload, index_crc)?;
        Ok(BloomFilter { bytes, bits })
    }

    /// The version-3 payload to store in a file whose stored index ends
    /// with `index_crc`.
    /// The bits move up in their own buffer (no copy of them is made).
    pub fn encode(self, index_crc: u32) -> Vec<u8> {
        let mut out = self.bytes;
        let len = out.len();
        out.extend_from_slice(&[0u8; FILTER_V3_HEADER_BYTES]);
        out.copy_within(0..len, FILTER_V3_HEADER_BYTES);
        out[0..4].copy_from_slice(&index_crc.to_le_bytes());
        out[4..12].copy_from_slice(&self.bits.to_le_bytes());
        out
    }

    /// False only if `key` is certainly not among the keys it was built
    /// of; an empty filter holds no key.
    pub fn may_contain(&self, key: u128) -> bool {
        self.bits > 0 && probes(key_hash(key), self.bits).all(|b| self.is_set(b))
    }

    /// [`Self::may_contain`] of each of `keys`, in their order. In a
    /// large filter every probe is a cache miss, and one key's probes
    /// wait on each other; asking for the lines of the keys
    /// [`PREFETCH_AHEAD_KEYS`] further on before probing this one's lets
    /// the misses of a batch overlap. (The writer's lookups of an
    /// import's batches spent a quarter of the daemon's time in single
    /// probes at 60 M cells.)
    pub fn may_contain_each(&self, keys: &[u128]) -> Vec<bool> {
        if self.bits == 0 {
            return vec![false; keys.len()];
        }
        let hashes: Vec<u64> = keys.iter().map(|&key| key_hash(key)).collect();
        // The first two probes: half the absent keys stop at the first,
        // most of the rest at the second.
        let ask = |hash: u64| {
            for b in probes(hash, self.bits).take(2) {
                prefetch(self.bytes.as_ptr().wrapping_add((b / 8) as usize));
            }
        };
        hashes
            .iter()
            .take(PREFETCH_AHEAD_KEYS)
            .for_each(|&h| ask(h));
        hashes
            .iter()
            .enumerate()
            .map(|(i, &hash)| {
                if let Some(&later) = hashes.get(i + PREFETCH_AHEAD_KEYS) {
                    ask(later);
                }
                probes(hash, self.bits).all(|b| self.is_set(b))
            })
            .collect()
    }

    /// Memory the filter takes.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity()
    }
}

/// A filter being filled in key order by a writer: each key's probe
/// lines are asked for when it is added and its bits set
/// [`PREFETCH_AHEAD_KEYS`] keys later, so that the cache misses of a
/// filter larger than the caches overlap instead of each of a key's
/// [`PROBES`] waiting on the one before. (Setting bits one key at a time
/// was half of the checkpointer's samples during a 200 M-cell import:
/// merges write filters of hundreds of MiB.) The filter it gives back
/// holds exactly the bits [`BloomFilter::insert`] of each key would set.
#[derive(Debug)]
pub struct FilterFill {
    filter: BloomFilter,
    /// Hashes added whose bits are not set yet, oldest first; at most
    /// [`PREFETCH_AHEAD_KEYS`].
    pending: VecDeque<u64>,
}

impl FilterFill {
    pub fn new(filter: BloomFilter) -> FilterFill {
        FilterFill {
            filter,
            pending: VecDeque::with_capacity(PREFETCH_AHEAD_KEYS),
        }
    }

    /// Adds the key whose [`key_hash`] is `hash`.
    pub fn add(&mut self, hash: u64) {
        let bits = self.filter.bits;
        if bits == 0 {
            return;
        }
        if self.pending.len() == PREFETCH_AHEAD_KEYS
            && let Some(oldest) = self.pending.pop_front()
        {
            self.filter.insert(oldest);
        }
        for b in probes(hash, bits) {
            prefetch(self.filter.bytes.as_ptr().wrapping_add((b / 8) as usize));
        }
        self.pending.push_back(hash);
    }

    /// The filter, every key added in it.
    pub fn finish(mut self) -> BloomFilter {
        for hash in self.pending.drain(..) {
            self.filter.insert(hash);
        }
        self.filter
    }
}

/// Checks that a filter header's first 4 bytes name `index_crc`.
fn check_index_crc(header: &[u8], index_crc: u32) -> Result<(), String> {
    let named = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    if named != index_crc {
        return Err(format!(
            "the filter is of an index with CRC {named:#010x}, this file's has \
             {index_crc:#010x}: a filter of another file"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filling_in_order_sets_the_bits_inserting_each_key_sets() {
        for keys in [0u64, 1, 15, 16, 17, 1000] {
            let bits = (keys + 1) * BITS_PER_KEY;
            let mut one_by_one = BloomFilter::with_bits(bits);
            let mut fill = FilterFill::new(BloomFilter::with_bits(bits));
            for k in 0..keys {
                let hash = key_hash(u128::from(k * 7 + 3));
                one_by_one.insert(hash);
                fill.add(hash);
            }
            assert_eq!(fill.finish(), one_by_one, "{keys} keys");
        }
        let mut empty = FilterFill::new(BloomFilter::with_bits(0));
        empty.add(key_hash(5));
        assert_eq!(empty.finish(), BloomFilter::with_bits(0));
    }

    #[test]
    fn probing_a_batch_answers_as_probing_each_key() {
        let mut filter = BloomFilter::with_bits(10 * 1000);
        for k in (0..1000u128).map(|k| k * 3) {
            filter.insert(key_hash(k));
        }
        // Present, absent and a few false positives, in a batch longer
        // than the prefetch distance and in one shorter.
        let keys: Vec<u128> = (0..3000).collect();
        let each: Vec<bool> = keys.iter().map(|&k| filter.may_contain(k)).collect();
        assert_eq!(filter.may_contain_each(&keys), each);
        assert_eq!(filter.may_contain_each(&keys[..5]), each[..5]);
        assert!(each.iter().step_by(3).all(|&maybe| maybe));
        assert!(each.iter().filter(|&&maybe| maybe).count() < 1100);
        assert_eq!(
            BloomFilter::default().may_contain_each(&keys[..3]),
            [false; 3]
        );
    }

    /// The worked example of docs/storage-format.md, "Bloom filter".
    #[test]
    fn the_documented_example_probes() {
        let cases: [(u128, u64, u64, [u64; 7]); 2] = [
            (
                0,
                0x6393_d51c_06c6_18dc,
                0xd42d_681c_3cbb_1165,
                [31, 17, 3, 70, 56, 42, 28],
            ),
            (
                0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
                0xd9c0_47bf_5379_42c1,
                0x3d41_3f59_9e89_c646,
                [68, 7, 26, 45, 64, 3, 22],
            ),
        ];
        for (key, h1, h2, bits) in cases {
            assert_eq!(key_hash(key), h1, "{key:#x}");
            assert_eq!(fmix64(h1 ^ SEED_STEP), h2, "{key:#x}");
            assert_eq!(probes(h1, 80).collect::<Vec<_>>(), bits, "{key:#x}");
        }
        assert_eq!(filter_bytes(8), Some(4 + 10));
    }
}
