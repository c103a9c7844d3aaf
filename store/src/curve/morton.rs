//! The 3-D Morton (Z-order) curve: interleave the bits of x, y and z.
//!
//! Three ways to spread a coordinate's bits are kept, because the bake-off
//! measures them: multiply-free "magic number" shifts and masks, byte
//! lookup tables (the portable path), and BMI2 `pdep`/`pext`, one
//! instruction per axis and key half. [`morton_key`] and [`morton_decode`]
//! take BMI2 when the CPU has it and implements it in hardware (checked
//! once at run time, see [`bmi2_is_fast`]) and the portable path otherwise;
//! all paths give bit-identical results (tests below, and
//! `docs/curve-bakeoff.md` for the timings).

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
/// BMI2 where it is fast, else the byte tables ([`morton_key_lut`]).
#[inline]
pub fn morton_key(c: Coord) -> u128 {
    #[cfg(target_arch = "x86_64")]
    if let Some(key) = bmi2::try_key(c) {
        return key;
    }
    morton_key_lut(c)
}

/// [`morton_key`] of every coordinate in `coords`, into `out` (same
/// length). With BMI2 the whole loop runs inside one `bmi2` function, so
/// the instructions inline and no call is paid per coordinate (a single
/// [`morton_key`] is an out-of-line call, ~2.5 ns, because code built for
/// any x86-64 cannot inline BMI2).
///
/// # Panics
///
/// If `coords` and `out` differ in length.
pub fn morton_keys(coords: &[Coord], out: &mut [u128]) {
    assert_eq!(coords.len(), out.len(), "one key per coordinate");
    #[cfg(target_arch = "x86_64")]
    if bmi2::try_keys(coords, out) {
        return;
    }
    for (c, key) in coords.iter().zip(out) {
        *key = morton_key_lut(*c);
    }
}

/// [`morton_decode`] of every key in `keys`, into `out` (same length);
/// batched like [`morton_keys`].
///
/// # Panics
///
/// If `keys` and `out` differ in length.
pub fn morton_decode_many(keys: &[u128], out: &mut [Coord]) {
    assert_eq!(keys.len(), out.len(), "one coordinate per key");
    #[cfg(target_arch = "x86_64")]
    if bmi2::try_decode_many(keys, out) {
        return;
    }
    for (key, c) in keys.iter().zip(out) {
        *c = morton_decode_magic(*key);
    }
}

/// The coordinate of a Morton key made by [`morton_key`]. Bits above 96
/// are ignored. BMI2 where it is fast, else [`morton_decode_magic`].
#[inline]
pub fn morton_decode(key: u128) -> Coord {
    #[cfg(target_arch = "x86_64")]
    if let Some(c) = bmi2::try_decode(key) {
        return c;
    }
    morton_decode_magic(key)
}

/// [`morton_decode`] with magic-number bit gathering (portable).
#[inline]
pub fn morton_decode_magic(key: u128) -> Coord {
    Coord::new(
        from_ordered_bits(compact3(key >> 2)),
        from_ordered_bits(compact3(key >> 1)),
        from_ordered_bits(compact3(key)),
    )
}

/// The Morton key through BMI2 `pdep`, or `None` where BMI2 is missing or
/// slow (see [`morton_key`]); for tests and benchmarks.
#[inline]
pub fn morton_key_bmi2(c: Coord) -> Option<u128> {
    #[cfg(target_arch = "x86_64")]
    return bmi2::try_key(c);
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// [`morton_decode`] through BMI2 `pext`, or `None` where BMI2 is missing
/// or slow; for tests and benchmarks.
#[inline]
pub fn morton_decode_bmi2(key: u128) -> Option<Coord> {
    #[cfg(target_arch = "x86_64")]
    return bmi2::try_decode(key);
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Whether this CPU has BMI2 and runs `pdep`/`pext` in hardware, decided
/// once per process. AMD before Zen 3 (family 0x19) and Hygon implement
/// them in microcode whose time grows with the set bits of the mask (tens
/// to hundreds of cycles for these ~20-bit masks), far slower than the
/// tables, so those CPUs keep the portable path.
#[cfg(target_arch = "x86_64")]
#[inline]
fn bmi2_is_fast() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    const UNKNOWN: u8 = 0;
    const NO: u8 = 1;
    const YES: u8 = 2;
    static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
    match STATE.load(Ordering::Relaxed) {
        YES => true,
        NO => false,
        _ => {
            let fast = std::is_x86_feature_detected!("bmi2") && !microcoded_pdep();
            STATE.store(if fast { YES } else { NO }, Ordering::Relaxed);
            fast
        }
    }
}

/// AMD families before 0x19 (Zen 1 and 2, and older), and Hygon (Zen 1).
#[cfg(target_arch = "x86_64")]
#[cold]
fn microcoded_pdep() -> bool {
    use std::arch::x86_64::__cpuid;
    let vendor = __cpuid(0);
    let vendor = (vendor.ebx, vendor.edx, vendor.ecx);
    // "AuthenticAMD" and "HygonGenuine", as cpuid returns them.
    let amd = vendor == (0x6874_7541, 0x6974_6e65, 0x444d_4163);
    let hygon = vendor == (0x6f67_7948, 0x6e65_476e, 0x656e_6975);
    let eax = __cpuid(1).eax;
    let family = (eax >> 8) & 0xf;
    let family = if family == 0xf {
        family + ((eax >> 20) & 0xff)
    } else {
        family
    };
    hygon || (amd && family < 0x19)
}

/// BMI2 `pdep`/`pext`: one instruction deposits (or gathers) one axis's
/// bits for one half of the key. Key bits 0..=63 hold z bits 0..=21 and
/// x, y bits 0..=20; key bits 64..=95 hold the rest.
#[cfg(target_arch = "x86_64")]
mod bmi2 {
    use std::arch::x86_64::{_pdep_u32, _pdep_u64, _pext_u32, _pext_u64};

    use cube_protocol::Coord;

    use super::{bmi2_is_fast, from_ordered_bits, ordered_bits};

    /// Key bits 0, 3, ... 63 (z); shifted by 1 for y, by 2 for x.
    const LO_Z: u64 = 0x9249_2492_4924_9249;
    const LO_Y: u64 = LO_Z << 1;
    const LO_X: u64 = LO_Z << 2;
    /// Key bits 64, 67, ... 94 (y bits 21..=31), relative to bit 64; x
    /// sits one above, z two above (z bits 22..=31).
    const HI_Y: u32 = 0x4924_9249;
    const HI_X: u32 = HI_Y << 1;
    const HI_Z: u32 = HI_Y << 2;

    /// The key of the order-preserving bits `x, y, z`. Scalars in and out
    /// (not a `Coord`, which this out-of-line call would pass through
    /// memory, a store-forwarding stall on a dependent chain).
    #[target_feature(enable = "bmi2")]
    fn key(x: u32, y: u32, z: u32) -> u128 {
        let lo = _pdep_u64(u64::from(x), LO_X)
            | _pdep_u64(u64::from(y), LO_Y)
            | _pdep_u64(u64::from(z), LO_Z);
        let hi = _pdep_u32(x >> 21, HI_X) | _pdep_u32(y >> 21, HI_Y) | _pdep_u32(z >> 22, HI_Z);
        u128::from(lo) | (u128::from(hi) << 64)
    }

    /// The order-preserving bits of a key's cell, packed `x | y << 32 | z
    /// << 64` so that they come back in registers.
    #[target_feature(enable = "bmi2")]
    fn decode(key: u128) -> u128 {
        let (lo, hi) = (key as u64, (key >> 64) as u32);
        let x = _pext_u64(lo, LO_X) as u32 | (_pext_u32(hi, HI_X) << 21);
        let y = _pext_u64(lo, LO_Y) as u32 | (_pext_u32(hi, HI_Y) << 21);
        let z = _pext_u64(lo, LO_Z) as u32 | (_pext_u32(hi, HI_Z) << 22);
        u128::from(x) | (u128::from(y) << 32) | (u128::from(z) << 64)
    }

    /// [`key`] if this CPU runs BMI2 fast ([`bmi2_is_fast`]), callable
    /// without the `bmi2` target feature. The workspace denies `unsafe`;
    /// it is allowed here because this path measured 1.4-1.7x faster than
    /// the byte tables per call in `benches/curves.rs` (decode 2x faster
    /// than the magic numbers; `docs/benchmarks.md`), and the only unsafe
    /// operation is calling a `#[target_feature]` function, whose sole
    /// requirement (the CPU has the feature) is checked just before.
    #[allow(unsafe_code)]
    #[inline]
    pub(super) fn try_key(c: Coord) -> Option<u128> {
        if !bmi2_is_fast() {
            return None;
        }
        let (x, y, z) = (ordered_bits(c.x), ordered_bits(c.y), ordered_bits(c.z));
        // SAFETY: `bmi2_is_fast()` implies `is_x86_feature_detected!("bmi2")`.
        Some(unsafe { key(x, y, z) })
    }

    /// [`key`] over a slice, in one `bmi2` function so that `key` inlines.
    #[target_feature(enable = "bmi2")]
    fn keys(coords: &[Coord], out: &mut [u128]) {
        for (c, k) in coords.iter().zip(out) {
            *k = key(ordered_bits(c.x), ordered_bits(c.y), ordered_bits(c.z));
        }
    }

    /// [`decode`] over a slice, in one `bmi2` function.
    #[target_feature(enable = "bmi2")]
    fn decode_all(keys: &[u128], out: &mut [Coord]) {
        for (k, c) in keys.iter().zip(out) {
            let bits = decode(*k);
            *c = Coord::new(
                from_ordered_bits(bits as u32),
                from_ordered_bits((bits >> 32) as u32),
                from_ordered_bits((bits >> 64) as u32),
            );
        }
    }

    /// [`keys`] if this CPU runs BMI2 fast (`false`: nothing written);
    /// see [`try_key`] for why this `unsafe` is allowed.
    #[allow(unsafe_code)]
    pub(super) fn try_keys(coords: &[Coord], out: &mut [u128]) -> bool {
        if !bmi2_is_fast() {
            return false;
        }
        // SAFETY: `bmi2_is_fast()` implies `is_x86_feature_detected!("bmi2")`.
        unsafe { keys(coords, out) };
        true
    }

    /// [`decode_all`] if this CPU runs BMI2 fast (`false`: nothing
    /// written); see [`try_key`] for why this `unsafe` is allowed.
    #[allow(unsafe_code)]
    pub(super) fn try_decode_many(keys: &[u128], out: &mut [Coord]) -> bool {
        if !bmi2_is_fast() {
            return false;
        }
        // SAFETY: `bmi2_is_fast()` implies `is_x86_feature_detected!("bmi2")`.
        unsafe { decode_all(keys, out) };
        true
    }

    /// [`decode`] if this CPU runs BMI2 fast; see [`try_key`] for why this
    /// `unsafe` is allowed.
    #[allow(unsafe_code)]
    #[inline]
    pub(super) fn try_decode(key: u128) -> Option<Coord> {
        if !bmi2_is_fast() {
            return None;
        }
        // SAFETY: `bmi2_is_fast()` implies `is_x86_feature_detected!("bmi2")`.
        let bits = unsafe { decode(key) };
        Some(Coord::new(
            from_ordered_bits(bits as u32),
            from_ordered_bits((bits >> 32) as u32),
            from_ordered_bits((bits >> 64) as u32),
        ))
    }
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
                    assert_eq!(morton_key_lut(c), slow_key(c), "{c}");
                    assert_eq!(morton_decode(morton_key(c)), c, "{c}");
                    assert_eq!(morton_decode_magic(slow_key(c)), c, "{c}");
                    if let Some(key) = morton_key_bmi2(c) {
                        assert_eq!(key, slow_key(c), "{c}");
                        assert_eq!(morton_decode_bmi2(key), Some(c), "{c}");
                    }
                }
            }
        }
    }

    /// Every path agrees bit for bit (keys are on disk in checkpoints), on
    /// every cell of cubes at the origin and at both ends of the range.
    #[test]
    fn all_paths_agree_on_exhaustive_small_cubes() {
        let bmi2 = morton_key_bmi2(Coord::new(0, 0, 0)).is_some();
        eprintln!("BMI2 path in use: {bmi2}");
        for base in [-8, i32::MIN, i32::MAX - 15, -(1 << 21) - 8, (1 << 22) - 8] {
            for x in 0..16 {
                for y in 0..16 {
                    for z in 0..16 {
                        let c = Coord::new(base + x, base.wrapping_add(y * 7), base + z);
                        let key = slow_key(c);
                        assert_eq!(morton_key(c), key, "{c}");
                        assert_eq!(morton_key_lut(c), key, "{c}");
                        assert_eq!(morton_decode(key), c, "{c}");
                        assert_eq!(morton_decode_magic(key), c, "{c}");
                        if bmi2 {
                            assert_eq!(morton_key_bmi2(c), Some(key), "{c}");
                            assert_eq!(morton_decode_bmi2(key), Some(c), "{c}");
                        }
                    }
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

        /// The batch functions are the single ones, over any coordinates
        /// and any length.
        #[test]
        fn batch_matches_single(coords in prop::collection::vec(any::<(i32, i32, i32)>(), 0..40)) {
            let coords: Vec<Coord> = coords.into_iter().map(|(x, y, z)| Coord::new(x, y, z)).collect();
            let mut keys = vec![0u128; coords.len()];
            morton_keys(&coords, &mut keys);
            prop_assert!(coords.iter().zip(&keys).all(|(c, k)| morton_key(*c) == *k));
            let mut back = vec![Coord::new(0, 0, 0); keys.len()];
            morton_decode_many(&keys, &mut back);
            prop_assert_eq!(back, coords);
        }

        #[test]
        fn both_spreads_agree_and_round_trip_everywhere(x: i32, y: i32, z: i32) {
            let c = Coord::new(x, y, z);
            prop_assert_eq!(morton_key_lut(c), slow_key(c));
            prop_assert_eq!(morton_key_magic(c), slow_key(c));
            prop_assert_eq!(morton_key(c), slow_key(c));
            prop_assert_eq!(morton_decode(morton_key(c)), c);
            prop_assert_eq!(morton_decode_magic(slow_key(c)), c);
        }

        /// The BMI2 path against the bit-by-bit definition and the
        /// portable decode, over the full range (skipped without BMI2).
        #[test]
        fn bmi2_matches_the_portable_paths(x: i32, y: i32, z: i32, high: u128) {
            let c = Coord::new(x, y, z);
            if let Some(key) = morton_key_bmi2(c) {
                prop_assert_eq!(key, slow_key(c));
                prop_assert_eq!(morton_decode_bmi2(key), Some(c));
                // Bits above 96 are ignored by every decoder.
                let noisy = key | (high << 96);
                prop_assert_eq!(morton_decode_bmi2(noisy), Some(c));
                prop_assert_eq!(morton_decode_magic(noisy), c);
            }
        }

        #[test]
        fn every_96_bit_key_is_a_cell(key in 0u128..(1u128 << 96)) {
            prop_assert_eq!(morton_key(morton_decode(key)), key);
            prop_assert_eq!(morton_key_lut(morton_decode_magic(key)), key);
            if let Some(c) = morton_decode_bmi2(key) {
                prop_assert_eq!(c, morton_decode_magic(key));
            }
        }
    }
}
