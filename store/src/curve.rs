//! Space-filling-curve keys: cells are ordered along a 3-D curve so that a
//! box of space maps to few contiguous key ranges.
//!
//! Two curves, both over the whole `i32` cube and both 96-bit keys in a
//! `u128`: [Morton](morton) (Z-order: interleaved bits, cheapest to compute)
//! and [Hilbert](hilbert) (consecutive keys are always lattice neighbours,
//! so a box splits into fewer, longer runs). Each namespace picks one at
//! creation and keeps it: keys of different curves are not comparable.
//! [`region`] turns a box into runs of keys for either curve.
//! `docs/curve-bakeoff.md` has the measurements behind [`Curve::DEFAULT`].

#[cfg(target_arch = "x86_64")]
mod cpu;
pub(crate) mod hilbert;
mod morton;
pub mod region;

use std::fmt;
use std::str::FromStr;

use cube_protocol::Coord;

pub use hilbert::{hilbert_decode, hilbert_decode_many, hilbert_key, hilbert_keys};
pub use morton::{
    morton_decode, morton_decode_bmi2, morton_decode_magic, morton_decode_many, morton_key,
    morton_key_bmi2, morton_key_lut, morton_key_magic, morton_keys,
};

/// The 96 bits a key can use.
pub const KEY_MASK: u128 = (1u128 << 96) - 1;

/// The largest key (the last cell along either curve).
pub const MAX_KEY: u128 = KEY_MASK;

/// A namespace's space-filling curve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Curve {
    Morton,
    Hilbert,
}

impl Curve {
    pub const ALL: [Curve; 2] = [Curve::Morton, Curve::Hilbert];

    /// The curve of namespaces created without choosing one (including
    /// `default`): the one the bake-off found faster for region reads.
    pub const DEFAULT: Curve = Curve::Morton;

    #[inline]
    pub fn key(self, c: Coord) -> u128 {
        match self {
            Curve::Morton => morton_key(c),
            Curve::Hilbert => hilbert_key(c),
        }
    }

    #[inline]
    pub fn decode(self, key: u128) -> Coord {
        match self {
            Curve::Morton => morton_decode(key),
            Curve::Hilbert => hilbert_decode(key),
        }
    }

    /// [`Curve::key`] of every coordinate in `coords`, into `out` (same
    /// length). For bulk conversions: Hilbert walks several coordinates
    /// side by side ([`hilbert_keys`]), about twice as fast per coordinate
    /// as calling [`Curve::key`] in a loop; Morton is that loop.
    ///
    /// # Panics
    ///
    /// If `coords` and `out` differ in length.
    pub fn keys(self, coords: &[Coord], out: &mut [u128]) {
        match self {
            Curve::Morton => morton_keys(coords, out),
            Curve::Hilbert => hilbert_keys(coords, out),
        }
    }

    /// [`Curve::decode`] of every key in `keys`, into `out` (same length),
    /// batched like [`Curve::keys`].
    ///
    /// # Panics
    ///
    /// If `keys` and `out` differ in length.
    pub fn decode_many(self, keys: &[u128], out: &mut [Coord]) {
        match self {
            Curve::Morton => morton_decode_many(keys, out),
            Curve::Hilbert => hilbert_decode_many(keys, out),
        }
    }

    /// The indices of `coords` in curve order (equal coordinates in their
    /// given order). A step orders tens of thousands of programs: the
    /// keys of one box share their high bits, so past the smallest they
    /// mostly fit 32 bits and sort packed with their index in one word,
    /// several times faster than 128-bit keys do.
    pub fn order(self, coords: &[Coord]) -> Vec<usize> {
        let mut keys = vec![0u128; coords.len()];
        self.keys(coords, &mut keys);
        let (Some(min), Some(max)) = (keys.iter().min(), keys.iter().max()) else {
            return Vec::new();
        };
        if max - min <= u128::from(u32::MAX) && coords.len() <= u32::MAX as usize {
            let mut packed: Vec<u64> = keys
                .iter()
                .enumerate()
                .map(|(i, key)| ((key - min) as u64) << 32 | i as u64)
                .collect();
            packed.sort_unstable();
            return packed
                .into_iter()
                .map(|p| (p & u64::from(u32::MAX)) as usize)
                .collect();
        }
        let mut order: Vec<usize> = (0..coords.len()).collect();
        order.sort_by_key(|i| keys[*i]);
        order
    }

    /// The name used by `--curve` and in stats.
    pub fn name(self) -> &'static str {
        match self {
            Curve::Morton => "morton",
            Curve::Hilbert => "hilbert",
        }
    }
}

impl Default for Curve {
    fn default() -> Curve {
        Curve::DEFAULT
    }
}

impl fmt::Display for Curve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Curve {
    type Err = String;

    fn from_str(text: &str) -> Result<Curve, String> {
        Curve::ALL
            .into_iter()
            .find(|c| c.name() == text)
            .ok_or_else(|| format!("unknown curve {text:?}: use morton or hilbert"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for curve in Curve::ALL {
            assert_eq!(curve.name().parse::<Curve>(), Ok(curve));
        }
        assert!("peano".parse::<Curve>().is_err());
    }

    #[test]
    fn keys_stay_within_96_bits() {
        let max = Coord::new(i32::MAX, i32::MAX, i32::MAX);
        for curve in Curve::ALL {
            for c in [max, Coord::new(i32::MIN, i32::MAX, -1)] {
                assert!(curve.key(c) <= MAX_KEY);
                assert_eq!(curve.decode(curve.key(c)), c);
            }
        }
        assert_eq!(morton_key(max), MAX_KEY);
    }

    #[test]
    fn order_is_the_order_of_the_keys() {
        let near: Vec<Coord> = (0..300)
            .map(|i| Coord::new(i % 7, (i * 13) % 11, (i * 29) % 5))
            .collect();
        let far: Vec<Coord> = (-20..20)
            .map(|i| Coord::new(i * 7919, -i, i32::MAX - 20 - i))
            .collect();
        for coords in [near, far, Vec::new()] {
            for curve in Curve::ALL {
                let order = curve.order(&coords);
                let mut expected: Vec<usize> = (0..coords.len()).collect();
                expected.sort_by_key(|i| (curve.key(coords[*i]), *i));
                assert_eq!(order, expected, "{curve}");
            }
        }
    }

    #[test]
    fn batch_methods_match_single_calls() {
        let coords: Vec<Coord> = (-20..20)
            .map(|i| Coord::new(i * 7919, -i, i32::MAX - 20 - i))
            .collect();
        for curve in Curve::ALL {
            let mut keys = vec![0u128; coords.len()];
            curve.keys(&coords, &mut keys);
            let single: Vec<u128> = coords.iter().map(|c| curve.key(*c)).collect();
            assert_eq!(keys, single);
            let mut back = vec![Coord::new(0, 0, 0); keys.len()];
            curve.decode_many(&keys, &mut back);
            assert_eq!(back, coords);
        }
    }
}
