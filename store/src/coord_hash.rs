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
