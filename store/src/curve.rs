//! Space-filling-curve keys: cells are ordered along a 3-D Morton (Z-order)
//! curve so that a box of space maps to few contiguous key ranges.

use cube_protocol::Coord;

/// Maps an `i32` to a `u32` whose unsigned order matches the signed order
/// (flip the sign bit), so negative coordinates sort before positive ones.
#[inline]
fn ordered_bits(v: i32) -> u32 {
    (v as u32) ^ 0x8000_0000
}

/// Spreads the 32 bits of `v` so that bit i lands at bit 3*i.
#[inline]
fn spread3(v: u32) -> u128 {
    // Split into two 16-bit halves, spread each into 48 bits with the
    // classic magic-number sequence, then place the high half above.
    fn spread16(v: u64) -> u64 {
        // The standard 21-bit-to-63-bit sequence; inputs here are 16 bits.
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

/// Inverse of [`spread3`]: gathers every third bit (from bit 0) into 32 bits.
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

/// The coordinate of a Morton key made by [`morton_key`].
#[inline]
pub fn morton_decode(key: u128) -> Coord {
    let unflip = |bits: u32| (bits ^ 0x8000_0000) as i32;
    Coord::new(
        unflip(compact3(key >> 2)),
        unflip(compact3(key >> 1)),
        unflip(compact3(key)),
    )
}

/// The 96-bit Morton key of a coordinate: bit 3i+2 from x, 3i+1 from y, 3i from z.
#[inline]
pub fn morton_key(c: Coord) -> u128 {
    (spread3(ordered_bits(c.x)) << 2)
        | (spread3(ordered_bits(c.y)) << 1)
        | spread3(ordered_bits(c.z))
}

#[cfg(test)]
mod tests {
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
                    assert_eq!(morton_decode(morton_key(c)), c, "{c}");
                }
            }
        }
    }

    #[test]
    fn order_is_monotone_along_each_axis() {
        for v in [-3, -2, -1, 0, 1, 2] {
            assert!(morton_key(Coord::new(v, 0, 0)) < morton_key(Coord::new(v + 1, 0, 0)));
            assert!(morton_key(Coord::new(0, 0, v)) < morton_key(Coord::new(0, 0, v + 1)));
        }
    }
}
