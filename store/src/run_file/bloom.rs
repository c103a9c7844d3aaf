//! A run file's Bloom filter (format version 2): whether a key may be in
//! the file, answered from memory, so that a lookup of a key the file does
//! not hold reads no block (`docs/storage-format.md`, "Run files", "Bloom
//! filter").
//!
//! [`BITS_PER_KEY`] bits per entry (tombstones too) and [`PROBES`] probes:
//! a false positive rate of about 0.8% (measured by
//! `run_file::tests::the_filter_has_no_false_negatives_and_few_false_positives`),
//! where 10 bits and 7 probes are the optimum (k = ln 2 x bits per key). The
//! filter's size follows from the file's entry count alone
//! ([`filter_bytes`]), so a reader knows it from the footer and accepts
//! exactly one length.
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

/// Filter bits per entry.
pub const BITS_PER_KEY: u64 = 10;
/// Bits set, and tested, per key.
pub const PROBES: u64 = 7;
/// Mixed into the high half of a key before the low half.
const SEED_HIGH: u64 = 0x9e37_79b9_7f4a_7c15;
/// Mixed into h1 to make h2.
const SEED_STEP: u64 = 0xc2b2_ae3d_27d4_eb4f;

/// The index CRC in front of the bits.
pub const FILTER_HEADER_BYTES: usize = 4;

/// The filter's bit array length for a file of `entries` entries:
/// ceil(entries x [`BITS_PER_KEY`] / 8) bytes; `None` on overflow.
fn bit_bytes(entries: u64) -> Option<u64> {
    Some(entries.checked_mul(BITS_PER_KEY)?.div_ceil(8))
}

/// The filter's payload length for a file of `entries` entries: the
/// index CRC and the bits; `None` on overflow.
pub fn filter_bytes(entries: u64) -> Option<u64> {
    bit_bytes(entries)?.checked_add(FILTER_HEADER_BYTES as u64)
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

/// The 64-bit hash a filter keeps of a key while the file is written.
pub fn key_hash(key: u128) -> u64 {
    let (low, high) = (key as u64, (key >> 64) as u64);
    fmix64(low ^ fmix64(high ^ SEED_HIGH))
}

/// The bits of `hash` in a filter of `bits` bits (`bits` > 0).
fn probes(hash: u64, bits: u64) -> impl Iterator<Item = u64> {
    let step = fmix64(hash ^ SEED_STEP);
    (0..PROBES).map(move |i| {
        let g = hash.wrapping_add(i.wrapping_mul(step));
        ((u128::from(g) * u128::from(bits)) >> 64) as u64
    })
}

/// A filter in memory: its payload as stored, bit b in byte b / 8 at
/// mask 1 << (b % 8).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BloomFilter {
    bytes: Vec<u8>,
}

impl BloomFilter {
    /// The filter of the keys whose [`key_hash`]es are `hashes`.
    pub fn build(hashes: &[u64]) -> BloomFilter {
        let len = bit_bytes(hashes.len() as u64).unwrap_or(0) as usize;
        let mut bytes = vec![0u8; len];
        let bits = len as u64 * 8;
        if bits > 0 {
            for &h in hashes {
                for b in probes(h, bits) {
                    bytes[(b / 8) as usize] |= 1 << (b % 8);
                }
            }
        }
        BloomFilter { bytes }
    }

    /// A filter read back, for a file of `entries` entries whose stored
    /// index ends with `index_crc`: its length must be exactly
    /// [`filter_bytes`] and it must name that index (any bits are a valid
    /// filter; the CRC, MAC or tag around it said whether they are the
    /// ones written).
    pub fn decode(
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
        let bytes = payload.split_off(FILTER_HEADER_BYTES);
        let named = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
        if named != index_crc {
            return Err(format!(
                "the filter is of an index with CRC {named:#010x}, this file's has \
                 {index_crc:#010x}: a filter of another file"
            ));
        }
        Ok(BloomFilter { bytes })
    }

    /// The payload to store in a file whose stored index ends with
    /// `index_crc`.
    pub fn encode(self, index_crc: u32) -> Vec<u8> {
        let mut out = Vec::with_capacity(FILTER_HEADER_BYTES + self.bytes.len());
        out.extend_from_slice(&index_crc.to_le_bytes());
        out.extend_from_slice(&self.bytes);
        out
    }

    /// False only if `key` is certainly not among the keys it was built
    /// of; an empty filter holds no key.
    pub fn may_contain(&self, key: u128) -> bool {
        let bits = self.bytes.len() as u64 * 8;
        bits > 0
            && probes(key_hash(key), bits)
                .all(|b| self.bytes[(b / 8) as usize] & (1 << (b % 8)) != 0)
    }

    /// Memory the filter takes.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
