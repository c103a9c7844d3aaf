//! The per-segment seed of the record checksums.
//!
//! Recovery tells a torn tail from corruption by looking for a valid
//! commit group *after* the damage (`later_group_follows`), scanning byte
//! by byte. A client controls the bytes of its values, so with a plain
//! CRC32C it could store a value that holds well-formed records; if a crash
//! then tore the group around that value, the scan would find them and
//! recovery would refuse to start (corruption) instead of dropping the
//! unacknowledged group. Every record's CRC therefore starts from a secret,
//! random seed written in its segment's header (format version 2), which
//! no client ever sees: a forged record passes with probability 2^-32, the
//! same as random damage.
//!
//! Segments of format version 1 have no seed ([`CrcSeed::UNSEEDED`]): their
//! CRCs are plain CRC32C, and they are still read.

use ring::rand::{SecureRandom, SystemRandom};

use crate::error::StoreError;

/// The initial CRC32C state of every record in one segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrcSeed(u32);

impl CrcSeed {
    /// Plain CRC32C: the records of a version-1 segment.
    pub const UNSEEDED: CrcSeed = CrcSeed(0);

    pub const fn from_u32(seed: u32) -> CrcSeed {
        CrcSeed(seed)
    }

    pub const fn to_u32(self) -> u32 {
        self.0
    }

    /// The checksum of `bytes` in a segment with this seed.
    pub fn checksum(self, bytes: &[u8]) -> u32 {
        crc32c::crc32c_append(self.0, bytes)
    }
}

/// Hands out the seeds of the segments one daemon start creates: a secret
/// drawn once from the system RNG, mixed with each segment's first LSN, so
/// that two segments of one start differ and nothing a client can learn
/// predicts any of them.
#[derive(Clone, Copy, Debug)]
pub struct SegmentSeeds {
    secret: u64,
}

impl SegmentSeeds {
    /// [`StoreError::Random`] if the system RNG fails.
    pub fn from_system_rng() -> Result<SegmentSeeds, StoreError> {
        let mut bytes = [0u8; 8];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| StoreError::Random("drawing the WAL checksum seed".into()))?;
        Ok(SegmentSeeds {
            secret: u64::from_le_bytes(bytes),
        })
    }

    /// A fixed secret: for tests and tools that write segments by hand.
    pub fn fixed(secret: u64) -> SegmentSeeds {
        SegmentSeeds { secret }
    }

    /// The seed of the segment that starts at `first_lsn`; never
    /// [`CrcSeed::UNSEEDED`], which marks version-1 segments.
    pub fn for_segment(&self, first_lsn: u64) -> CrcSeed {
        // splitmix64: every input bit reaches every output bit.
        let mut z = self.secret ^ first_lsn.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        match (z >> 32) as u32 {
            0 => CrcSeed(1),
            seed => CrcSeed(seed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unseeded_is_plain_crc32c_and_a_seed_changes_every_checksum() {
        let data = b"a record's bytes after its crc field";
        assert_eq!(CrcSeed::UNSEEDED.checksum(data), crc32c::crc32c(data));
        let seeds = SegmentSeeds::fixed(7);
        let seed = seeds.for_segment(1);
        assert_ne!(seed, CrcSeed::UNSEEDED);
        assert_ne!(seed.checksum(data), crc32c::crc32c(data));
        assert_ne!(seeds.for_segment(2), seed);
        assert_ne!(SegmentSeeds::fixed(8).for_segment(1), seed);
        // As docs/storage-format.md specifies it for other implementations:
        // standard CRC32C with the register started at !seed (computed
        // bit by bit, independently of the crate).
        assert_eq!(CrcSeed::UNSEEDED.checksum(b"123456789"), 0xE306_9283);
        assert_eq!(
            CrcSeed::from_u32(0x1234_5678).checksum(b"123456789"),
            0x27D8_7B6A
        );
    }
}
