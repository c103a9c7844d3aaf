//! The 3-D Morton (Z-order) curve: interleave the bits of x, y and z.
//!
//! Two ways to spread a coordinate's bits are kept, because the bake-off
//! measures both: multiply-free "magic number" shifts and masks, and byte
//! lookup tables. Both are portable and need no CPU feature; BMI2's
//! `pdep`/`pext` would need `unsafe` (the workspace denies it) and, on the
//! AMD parts this project is measured on, is not faster than the tables
//! (see `docs/curve-bakeoff.md`). [`morton_key`] uses whichever measured
//! faster.

use cube_protocol::Coord;

/// Maps an `i32` to a `u32` whose unsigned order matches the signed order
/// (flip the sign bit), so negative coordinates sort before positive ones.
#[inline]
pub(crate) fn ordered_bits(v: i32) -> u32 {
    (v as u32) ^ 0x8000_0000
}

/// The inverse of [`ordered_bits`].
#[inline]
pub(crate) fn from_ordered_bits(bits: u32) -> i32 {
    (bits ^ 0x8000_0000) as i32
}

/// Spreads the 32 bits of `v` so that bit i lands at bit 3*i.
#[inline]
fn spread3_magic(v: u32) -> u128 {
    // Split into two 16-bit halves, spread each into 48 bits with the
    // classic magic-number sequence, then place the high half above.
    fn spread16(v: u64) -> u64 {
        let mut x = v & 0xffff;
        x = (x | (x << 16)) & 0x001f_0000_ff00_00ff;
        x = (x | (x << 8)) & 0x100f_00f0_0f00_f00f;
        x = (x | (x << 4)) & 0x10c3_0c30_c30c_30c3;
        x = (x | (x << 2)) & 0x1249_2492_4924_9249;
        x
    }
    let lo = spread16(u64::from(v & 0xffff));
    let hi = spread16(u64::from(v >> 16));
    u128::from(lo) | (u128::from(hi) << 48)
}

/// Inverse of the spread: gathers every third bit (from bit 0) into 32 bits.
#[inline]
fn compact3(v: u128) -> u32 {
    fn compact16(v: u64) -> u64 {
        let mut x = v & 0x1249_2492_4924_9249;
        x = (x | (x >> 2)) & 0x10c3_0c30_c30c_30c3;
        x = (x | (x >> 4)) & 0x100f_00f0_0f00_f00f;
        x = (x | (x >> 8)) & 0x001f_0000_ff00_00ff;
        x = (x | (x >> 16)) & 0xffff;
        x
    }
    let lo = compact16((v & 0xffff_ffff_ffff) as u64);
    let hi = compact16(((v >> 48) & 0xffff_ffff_ffff) as u64);
    (lo | (hi << 16)) as u32
}

/// `SPREAD_BYTE[b]`: the 8 bits of `b` moved to bits 0, 3, 6, ... 21.
const SPREAD_BYTE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut b = 0;
    while b < 256 {
        let mut bit = 0;
        while bit < 8 {
            table[b] |= (((b >> bit) & 1) as u32) << (3 * bit);
            bit += 1;
        }
        b += 1;
    }
    table
};

/// The Morton key with one table lookup per byte of each axis: each byte
/// triple becomes 24 consecutive key bits.
#[inline]
pub fn morton_key_lut(c: Coord) -> u128 {
    let (x, y, z) = (ordered_bits(c.x), ordered_bits(c.y), ordered_bits(c.z));
    let chunk = |shift: u32| -> u64 {
        let byte = |v: u32| SPREAD_BYTE[((v >> shift) & 0xff) as usize];
        u64::from((byte(x) << 2) | (byte(y) << 1) | byte(z))
    };
    // Two 48-bit halves, each built in a u64, so no u128 shifts in the
    // hot part.
    let lo = chunk(0) | (chunk(8) << 24);
    let hi = chunk(16) | (chunk(24) << 24);
    u128::from(lo) | (u128::from(hi) << 48)
}

/// The Morton key with magic-number bit spreading (no memory access).
#[inline]
pub fn morton_key_magic(c: Coord) -> u128 {
    (spread3_magic(ordered_bits(c.x)) << 2)
        | (spread3_magic(ordered_bits(c.y)) << 1)
        | spread3_magic(ordered_bits(c.z))
}

/// The 96-bit Morton key of a coordinate: bit 3i+2 from x, 3i+1 from y, 3i
/// from z, after the sign flip of [`ordered_bits`]. Key order is the order
/// checkpoints store cells in, so this function's results never change.
#[inline]
pub fn morton_key(c: Coord) -> u128 {
    morton_key_lut(c)
}

/// The coordinate of a Morton key made by [`morton_key`]. Bits above 96
/// are ignored.
#[inline]
pub fn morton_decode(key: u128) -> Coord {
    Coord::new(
        from_ordered_bits(compact3(key >> 2)),
        from_ordered_bits(compact3(key >> 1)),
        from_ordered_bits(compact3(key)),
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn slow_key(c: Coord) -> u128 {
        let (x, y, z) = (ordered_bits(c.x), ordered_bits(c.y), ordered_bits(c.z));
        let mut key = 0u128;
        for i in 0..32 {
            key |= u128::from((x >> i) & 1) << (3 * i + 2);
            key |= u128::from((y >> i) & 1) << (3 * i + 1);
            key |= u128::from(z >> i & 1) << (3 * i);
        }
        key
    }

    #[test]
    fn matches_the_bit_by_bit_definition() {
        let samples = [
            0,
            1,
            -1,
            2,
            7,
            -8,
            1000,
            -12345,
            i32::MIN,
            i32::MAX,
            0x5555_5555,
            -0x2aaa_aaab,
        ];
        for &x in &samples {
            for &y in &samples {
                for &z in &samples {
                    let c = Coord::new(x, y, z);
                    assert_eq!(morton_key(c), slow_key(c), "{c}");
                    assert_eq!(morton_key_magic(c), slow_key(c), "{c}");
                    assert_eq!(morton_decode(morton_key(c)), c, "{c}");
                }
            }
        }
    }

    #[test]
    fn exhaustive_small_cube_round_trips_in_key_order() {
        let mut keys = Vec::new();
        for x in -8..8 {
            for y in -8..8 {
                for z in -8..8 {
                    let c = Coord::new(x, y, z);
                    assert_eq!(morton_decode(morton_key(c)), c);
                    keys.push(morton_key(c));
                }
            }
        }
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), 16 * 16 * 16, "distinct cells, distinct keys");
    }

    #[test]
    fn order_is_monotone_along_each_axis() {
        for v in [-3, -2, -1, 0, 1, 2] {
            assert!(morton_key(Coord::new(v, 0, 0)) < morton_key(Coord::new(v + 1, 0, 0)));
            assert!(morton_key(Coord::new(0, 0, v)) < morton_key(Coord::new(0, 0, v + 1)));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn both_spreads_agree_and_round_trip_everywhere(x: i32, y: i32, z: i32) {
            let c = Coord::new(x, y, z);
            prop_assert_eq!(morton_key_lut(c), slow_key(c));
            prop_assert_eq!(morton_key_magic(c), slow_key(c));
            prop_assert_eq!(morton_decode(morton_key(c)), c);
        }

        #[test]
        fn every_96_bit_key_is_a_cell(key in 0u128..(1u128 << 96)) {
            prop_assert_eq!(morton_key(morton_decode(key)), key);
        }
    }
}
