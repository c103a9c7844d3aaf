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
//!
//! The batch functions ([`morton_keys`], [`morton_decode_many`]) have a
//! fourth path, taken first where the CPU has AVX-512 (F, BW), VBMI and
//! GFNI (Ice Lake, Zen 4 and later; checked once at run time): four keys
//! per register, each key byte a GF(2) bit-matrix product of one byte per
//! axis (`vgf2p8affineqb`). On Zen 4 it measured ~0.46 ns per coordinate
//! both ways, against ~2.5 ns (encode) and ~1.8 ns (decode) for the BMI2
//! loop, whose 6 `pdep` (or `pext`) per key issue at most one per cycle.
//! Where AVX-512 is missing, the BMI2 encode loop takes the key's high 32
//! bits from a table instead of three of those `pdep`s, so loads and
//! `pdep`s overlap (~1.9 ns, from ~2.7, on a Zen without AVX-512).

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

/// `table[v]`: the bits of `v` (at most 11, so `N` <= 2048) moved to bits
/// 0, 3, 6, ...
const fn spread3_table<const N: usize>() -> [u32; N] {
    assert!(N <= 2048, "11 bits spread to 33 do not fit a u32");
    let mut table = [0u32; N];
    let mut v = 0;
    while v < N {
        let mut bit = 0;
        while bit < 11 {
            table[v] |= (((v >> bit) & 1) as u32) << (3 * bit);
            bit += 1;
        }
        v += 1;
    }
    table
}

/// `SPREAD_BYTE[b]`: the 8 bits of `b` moved to bits 0, 3, 6, ... 21.
const SPREAD_BYTE: [u32; 256] = spread3_table::<256>();

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
/// length). AVX-512 with GFNI where the CPU has it (see the module
/// comment), else BMI2 with the whole loop inside one `bmi2` function, so
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
    if avx512::try_keys(coords, out) || bmi2::try_keys(coords, out) {
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
    if avx512::try_decode_many(keys, out) || bmi2::try_decode_many(keys, out) {
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

    /// `SPREAD_HIGH[v]`: the 11 bits of `v` moved to bits 0, 3, ... 30,
    /// the pattern of [`HI_Y`] (8 KiB, stays in L1 during a batch).
    static SPREAD_HIGH: [u32; 2048] = super::spread3_table::<2048>();

    /// [`key`] with the high 32 key bits from [`SPREAD_HIGH`] instead of
    /// three more `pdep`s. `pdep` issues at most once per cycle, so six per
    /// key bound the batch at six cycles a key; three `pdep`s and three
    /// table loads run on different ports and overlap (~2.7 to ~1.9 ns per
    /// coordinate on a Zen without AVX-512, `docs/curve-bakeoff.md`). Only
    /// for batches: a single key would pay the table's cache misses.
    #[target_feature(enable = "bmi2")]
    fn key_with_table(x: u32, y: u32, z: u32) -> u128 {
        let lo = _pdep_u64(u64::from(x), LO_X)
            | _pdep_u64(u64::from(y), LO_Y)
            | _pdep_u64(u64::from(z), LO_Z);
        // The shifts leave 11, 11 and 10 bits: always inside the table.
        let hi = SPREAD_HIGH[(y >> 21) as usize]
            | (SPREAD_HIGH[(x >> 21) as usize] << 1)
            | (SPREAD_HIGH[(z >> 22) as usize] << 2);
        debug_assert_eq!(
            hi,
            _pdep_u32(x >> 21, HI_X) | _pdep_u32(y >> 21, HI_Y) | _pdep_u32(z >> 22, HI_Z)
        );
        u128::from(lo) | (u128::from(hi) << 64)
    }

    /// [`key_with_table`] over a slice, in one `bmi2` function so that it
    /// inlines.
    #[target_feature(enable = "bmi2")]
    fn keys(coords: &[Coord], out: &mut [u128]) {
        for (c, k) in coords.iter().zip(out) {
            *k = key_with_table(ordered_bits(c.x), ordered_bits(c.y), ordered_bits(c.z));
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

/// The batch paths with AVX-512, four keys per register. Key bits 24m to
/// 24m+23 are byte m of x, y and z interleaved, so each key byte is a
/// fixed GF(2)-linear function of one byte of each axis: `vgf2p8affineqb`
/// multiplies every byte by an 8x8 bit matrix (one matrix per 64-bit
/// lane), and `vpermb` brings each coordinate byte to a lane holding the
/// right matrix, and the results back into key order. Per four keys that
/// is 3 byte shuffles, 3 matrix products, a 3-way XOR and a shuffle, where
/// BMI2 needs 24 `pdep` (at most one per cycle).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::{
        __m512i, _mm512_gf2p8affine_epi64_epi8, _mm512_loadu_si512, _mm512_mask_storeu_epi8,
        _mm512_maskz_loadu_epi8, _mm512_permutexvar_epi8, _mm512_set_epi64, _mm512_storeu_si512,
        _mm512_ternarylogic_epi64, _mm512_xor_si512,
    };
    use std::mem::{offset_of, size_of};

    use cube_protocol::Coord;

    use crate::curve::cpu::has_avx512_gfni;

    /// The shuffles address a coordinate's bytes through these, so any
    /// field order works, but they assume three 4-byte fields and no
    /// padding; otherwise the other paths run (a test insists it holds).
    pub(super) const LAYOUT_OK: bool = size_of::<Coord>() == 12;
    const OFFSET: [usize; 3] = [
        offset_of!(Coord, x),
        offset_of!(Coord, y),
        offset_of!(Coord, z),
    ];
    /// Bit i of axis a (x, y, z) is key bit 3i + SHIFT[a].
    const SHIFT: [usize; 3] = [2, 1, 0];
    /// Keys per register, and the bytes of that many coordinates and keys.
    const LANES: usize = 4;
    const COORD_BYTES: usize = 12;
    const KEY_BYTES: usize = 16;
    /// In the intermediate registers, bytes 16r..16r+15 (lanes 2r and
    /// 2r+1) hold byte class r of both directions (key byte 3m+r when
    /// encoding, axis r when decoding), at 4j+m for key j and byte m of the
    /// axis; lanes 6 and 7 get a zero matrix, so byte `ZERO` reads as 0.
    const ZERO: u8 = 48;

    type Bytes = [u8; 64];
    type Qwords = [u64; 8];

    /// Where class byte p comes from: key j, axis byte m.
    const fn slot(p: usize) -> (usize, usize) {
        (p % 16 / 4, p % 4)
    }

    /// Encoding, for axis a: class byte p reads byte m of axis a of
    /// coordinate j.
    const fn encode_gather(a: usize) -> Bytes {
        let mut t = [ZERO; 64];
        let mut p = 0;
        while p < 48 {
            let (j, m) = slot(p);
            t[p] = (COORD_BYTES * j + OFFSET[a] + m) as u8;
            p += 1;
        }
        t
    }

    /// Encoding, for axis a: lane pair r spreads an axis byte into key
    /// byte 3m+r. Output bit i takes the matrix's byte 7-i as its row.
    const fn encode_matrices(a: usize) -> Qwords {
        let mut lanes = [0u64; 8];
        let mut r = 0;
        while r < 3 {
            let mut matrix = 0u64;
            let mut i = 0;
            while i < 8 {
                let t = 8 * r + i;
                if t % 3 == SHIFT[a] {
                    matrix |= (1u64 << (t / 3)) << (8 * (7 - i));
                }
                i += 1;
            }
            lanes[2 * r] = matrix;
            lanes[2 * r + 1] = matrix;
            r += 1;
        }
        lanes
    }

    /// Encoding: key j's byte k (3m+r) is class byte 16r+4j+m; bytes 12 to
    /// 15 of a key are 0.
    const fn encode_scatter() -> Bytes {
        let mut t = [ZERO; 64];
        let mut o = 0;
        while o < 64 {
            let (j, k) = (o / KEY_BYTES, o % KEY_BYTES);
            if k < 12 {
                t[o] = (16 * (k % 3) + 4 * j + k / 3) as u8;
            }
            o += 1;
        }
        t
    }

    /// The sign bits [`super::ordered_bits`] flips, in coordinate bytes.
    const fn encode_flip() -> Bytes {
        let mut t = [0u8; 64];
        let mut j = 0;
        while j < LANES {
            let mut a = 0;
            while a < 3 {
                t[COORD_BYTES * j + OFFSET[a] + 3] = 0x80;
                a += 1;
            }
            j += 1;
        }
        t
    }

    /// Decoding, for key byte class r: class byte p (axis p/16) reads key
    /// j's byte 3m+r.
    const fn decode_gather(r: usize) -> Bytes {
        let mut t = [0u8; 64];
        let mut p = 0;
        while p < 48 {
            let (j, m) = slot(p);
            t[p] = (KEY_BYTES * j + 3 * m + r) as u8;
            p += 1;
        }
        t
    }

    /// Decoding, for key byte class r: lane pair a gathers the bits of
    /// axis a held by key byte 3m+r.
    const fn decode_matrices(r: usize) -> Qwords {
        let mut lanes = [0u64; 8];
        let mut a = 0;
        while a < 3 {
            let mut matrix = 0u64;
            let mut b = 0;
            while b < 8 {
                let t = 3 * b + SHIFT[a];
                if t / 8 == r {
                    matrix |= (1u64 << (t % 8)) << (8 * (7 - b));
                }
                b += 1;
            }
            lanes[2 * a] = matrix;
            lanes[2 * a + 1] = matrix;
            a += 1;
        }
        lanes
    }

    /// Decoding: coordinate j's byte f (byte m of axis a) is class byte
    /// 16a+4j+m.
    const fn decode_scatter() -> Bytes {
        let mut t = [ZERO; 64];
        let mut o = 0;
        while o < COORD_BYTES * LANES {
            let (j, f) = (o / COORD_BYTES, o % COORD_BYTES);
            let mut a = 0;
            while a < 3 {
                if OFFSET[a] <= f && f < OFFSET[a] + 4 {
                    t[o] = (16 * a + 4 * j + f - OFFSET[a]) as u8;
                }
                a += 1;
            }
            o += 1;
        }
        t
    }

    /// The sign bits of x, y and z in a key (bits 95, 94, 93).
    const fn decode_flip() -> Bytes {
        let mut t = [0u8; 64];
        let mut j = 0;
        while j < LANES {
            t[KEY_BYTES * j + 11] = 0xe0;
            j += 1;
        }
        t
    }

    const fn bytes_to_qwords(b: Bytes) -> Qwords {
        let mut q = [0u64; 8];
        let mut i = 0;
        while i < 64 {
            q[i / 8] |= (b[i] as u64) << (8 * (i % 8));
            i += 1;
        }
        q
    }

    #[target_feature(enable = "avx512f")]
    fn vector(q: Qwords) -> __m512i {
        let q = q.map(|v| v as i64);
        _mm512_set_epi64(q[7], q[6], q[5], q[4], q[3], q[2], q[1], q[0])
    }

    /// The first `bytes` bytes of a register (all 64 from 64 on).
    fn byte_mask(bytes: usize) -> u64 {
        if bytes >= 64 {
            u64::MAX
        } else {
            (1u64 << bytes) - 1
        }
    }

    /// The constants of one direction, as register contents.
    struct TableBits {
        flip: Qwords,
        gather: [Qwords; 3],
        matrices: [Qwords; 3],
        scatter: Qwords,
    }

    /// Evaluated at compile time (a `const` item), so a batch call only
    /// loads them.
    const ENCODE: TableBits = TableBits {
        flip: bytes_to_qwords(encode_flip()),
        gather: [
            bytes_to_qwords(encode_gather(0)),
            bytes_to_qwords(encode_gather(1)),
            bytes_to_qwords(encode_gather(2)),
        ],
        matrices: [encode_matrices(0), encode_matrices(1), encode_matrices(2)],
        scatter: bytes_to_qwords(encode_scatter()),
    };

    const DECODE: TableBits = TableBits {
        flip: bytes_to_qwords(decode_flip()),
        gather: [
            bytes_to_qwords(decode_gather(0)),
            bytes_to_qwords(decode_gather(1)),
            bytes_to_qwords(decode_gather(2)),
        ],
        matrices: [decode_matrices(0), decode_matrices(1), decode_matrices(2)],
        scatter: bytes_to_qwords(decode_scatter()),
    };

    /// [`TableBits`] in registers, for the length of a batch call.
    struct Tables {
        flip: __m512i,
        gather: [__m512i; 3],
        matrices: [__m512i; 3],
        scatter: __m512i,
    }

    impl Tables {
        #[target_feature(enable = "avx512f")]
        fn new(bits: &TableBits) -> Tables {
            Tables {
                flip: vector(bits.flip),
                gather: bits.gather.map(|q| vector(q)),
                matrices: bits.matrices.map(|q| vector(q)),
                scatter: vector(bits.scatter),
            }
        }

        /// Both directions are the same steps with other tables.
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
        #[inline]
        fn apply(&self, v: __m512i) -> __m512i {
            let v = _mm512_xor_si512(v, self.flip);
            let part = |i: usize| {
                _mm512_gf2p8affine_epi64_epi8::<0>(
                    _mm512_permutexvar_epi8(self.gather[i], v),
                    self.matrices[i],
                )
            };
            let sum = _mm512_ternarylogic_epi64::<0x96>(part(0), part(1), part(2));
            _mm512_permutexvar_epi8(self.scatter, sum)
        }
    }

    /// `unsafe` inside for the register loads and stores, which take
    /// pointers: references cannot express a masked (partial) access.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
    fn keys(coords: &[Coord], out: &mut [u128]) {
        // The tail's masked store is sized by `coords`, so this is what
        // keeps it inside `out`.
        assert_eq!(coords.len(), out.len(), "one key per coordinate");
        let tables = Tables::new(&ENCODE);
        let (whole, rest) = coords.as_chunks::<LANES>();
        let (out_whole, out_rest) = out.as_chunks_mut::<LANES>();
        for (c, k) in whole.iter().zip(out_whole) {
            // SAFETY: the mask reads the 48 bytes of `c` only (masked-off
            // bytes do not fault), and `k` is 64 writable bytes; `Coord` is
            // three `i32`s without padding (`LAYOUT_OK`), and every byte
            // pattern is a valid `u128`.
            unsafe {
                let v = _mm512_maskz_loadu_epi8(byte_mask(48), c.as_ptr().cast());
                _mm512_storeu_si512(k.as_mut_ptr().cast(), tables.apply(v));
            }
        }
        if !rest.is_empty() {
            let n = rest.len();
            // SAFETY: as above, with the masks cut to `n` coordinates and
            // `n` keys (`out_rest` has the same length as `rest`, asserted
            // on entry).
            unsafe {
                let v = _mm512_maskz_loadu_epi8(byte_mask(COORD_BYTES * n), rest.as_ptr().cast());
                _mm512_mask_storeu_epi8(
                    out_rest.as_mut_ptr().cast(),
                    byte_mask(KEY_BYTES * n),
                    tables.apply(v),
                );
            }
        }
    }

    /// `unsafe` inside like [`keys`].
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
    fn decode_all(keys: &[u128], out: &mut [Coord]) {
        // As in [`keys`]: keeps the tail's store inside `out`.
        assert_eq!(keys.len(), out.len(), "one coordinate per key");
        let tables = Tables::new(&DECODE);
        let (whole, rest) = keys.as_chunks::<LANES>();
        let (out_whole, out_rest) = out.as_chunks_mut::<LANES>();
        for (k, c) in whole.iter().zip(out_whole) {
            // SAFETY: `k` is 64 readable bytes; the mask writes the 48
            // bytes of `c` only. `Coord` is three `i32`s without padding
            // (`LAYOUT_OK`), for which every byte pattern is valid.
            unsafe {
                let v = _mm512_loadu_si512(k.as_ptr().cast());
                _mm512_mask_storeu_epi8(c.as_mut_ptr().cast(), byte_mask(48), tables.apply(v));
            }
        }
        if !rest.is_empty() {
            let n = rest.len();
            // SAFETY: as above, with the masks cut to `n` keys and `n`
            // coordinates (`out_rest` is as long as `rest`, asserted on
            // entry).
            unsafe {
                let v = _mm512_maskz_loadu_epi8(byte_mask(KEY_BYTES * n), rest.as_ptr().cast());
                _mm512_mask_storeu_epi8(
                    out_rest.as_mut_ptr().cast(),
                    byte_mask(COORD_BYTES * n),
                    tables.apply(v),
                );
            }
        }
    }

    /// [`keys`] if the CPU has the features (`false`: nothing written).
    /// The only unsafe operation is calling a `#[target_feature]`
    /// function, whose requirement is checked just before; the workspace
    /// denies `unsafe` otherwise, and this path is ~4-5x faster than the
    /// BMI2 loop (see the module comment).
    #[allow(unsafe_code)]
    pub(super) fn try_keys(coords: &[Coord], out: &mut [u128]) -> bool {
        if !LAYOUT_OK || !has_avx512_gfni() {
            return false;
        }
        // SAFETY: `has_avx512_gfni()` detected every feature `keys`
        // enables.
        unsafe { keys(coords, out) };
        true
    }

    /// [`decode_all`] if the CPU has the features (`false`: nothing
    /// written); see [`try_keys`] for why this `unsafe` is allowed.
    #[allow(unsafe_code)]
    pub(super) fn try_decode_many(keys: &[u128], out: &mut [Coord]) -> bool {
        if !LAYOUT_OK || !has_avx512_gfni() {
            return false;
        }
        // SAFETY: `has_avx512_gfni()` detected every feature
        // `decode_all` enables.
        unsafe { decode_all(keys, out) };
        true
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

    /// The AVX-512 batch paths (run only where the CPU has them) against
    /// the portable single-key functions, for `coords`.
    #[cfg(target_arch = "x86_64")]
    fn check_avx512(coords: &[Coord]) -> Result<(), TestCaseError> {
        let mut keys = vec![0u128; coords.len()];
        if !avx512::try_keys(coords, &mut keys) {
            return Ok(());
        }
        for (c, k) in coords.iter().zip(&keys) {
            prop_assert_eq!(*k, morton_key_lut(*c), "{}", c);
            prop_assert_eq!(*k, morton_key_magic(*c), "{}", c);
        }
        // Bits above 96 are ignored, as by every decoder.
        let noisy: Vec<u128> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| k | ((i as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15) << 96))
            .collect();
        let mut back = vec![Coord::new(0, 0, 0); coords.len()];
        prop_assert!(avx512::try_decode_many(&noisy, &mut back));
        prop_assert_eq!(&back[..], coords);
        Ok(())
    }

    fn xorshift_coords(seed: u64, len: usize) -> Vec<Coord> {
        let mut s = seed;
        let mut next = move || {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            s.wrapping_mul(0x2545_f491_4f6c_dd1d) as i32
        };
        (0..len)
            .map(|_| Coord::new(next(), next(), next()))
            .collect()
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_layout_assumption_holds() {
        // Otherwise the batch functions silently fall back to BMI2.
        const { assert!(avx512::LAYOUT_OK) };
        eprintln!(
            "AVX-512 path in use: {}",
            crate::curve::cpu::has_avx512_gfni()
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_edge_values() {
        let edges = [i32::MIN, i32::MIN + 1, -1, 0, 1, i32::MAX - 1, i32::MAX];
        let mut coords = Vec::new();
        for &x in &edges {
            for &y in &edges {
                for &z in &edges {
                    coords.push(Coord::new(x, y, z));
                }
            }
        }
        check_avx512(&coords).unwrap();
        // Each edge cell alone, so it also goes through the partial tail.
        for c in coords {
            check_avx512(&[c]).unwrap();
        }
    }

    /// Lengths around the 4-key register: none, a tail only, tails after
    /// whole registers, and the bench's batch plus one.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_any_length() {
        for len in [0, 1, 2, 3, 4, 5, 7, 8, 9, 4096, 4097] {
            check_avx512(&xorshift_coords(len as u64 + 1, len)).unwrap();
        }
        // The public functions, whichever path they take.
        let coords = xorshift_coords(99, 4097);
        let mut keys = vec![0u128; coords.len()];
        morton_keys(&coords, &mut keys);
        assert!(
            coords
                .iter()
                .zip(&keys)
                .all(|(c, k)| morton_key_lut(*c) == *k)
        );
        let mut back = vec![Coord::new(0, 0, 0); keys.len()];
        morton_decode_many(&keys, &mut back);
        assert_eq!(back, coords);
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

        /// The AVX-512 paths over full-range coordinates and any length.
        #[cfg(target_arch = "x86_64")]
        #[test]
        fn avx512_matches_the_portable_paths(coords in prop::collection::vec(any::<(i32, i32, i32)>(), 0..40)) {
            let coords: Vec<Coord> = coords.into_iter().map(|(x, y, z)| Coord::new(x, y, z)).collect();
            check_avx512(&coords)?;
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

#[cfg(test)]
/// Every batch length, through every path, never writes past its output.
mod batch_lengths {
    use super::*;

    #[test]
    fn every_length_round_trips_and_writes_nothing_past_its_output() {
        let mut s = 0x1234_5678_9abc_def1u64;
        let mut next = move || {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            s.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for len in 0..=300usize {
            let coords: Vec<Coord> = (0..len)
                .map(|_| Coord::new(next() as i32, next() as i32, next() as i32))
                .collect();
            // Sentinels after the output, to catch a write past `len`.
            let mut keys = vec![0xdead_u128; len + 8];
            morton_keys(&coords, &mut keys[..len]);
            assert!(keys[len..].iter().all(|k| *k == 0xdead), "len {len}");
            for (c, k) in coords.iter().zip(&keys) {
                assert_eq!(*k, morton_key_lut(*c), "len {len}");
            }
            let mut back = vec![Coord::new(7, 7, 7); len + 8];
            morton_decode_many(&keys[..len], &mut back[..len]);
            assert!(
                back[len..].iter().all(|c| *c == Coord::new(7, 7, 7)),
                "len {len}"
            );
            assert_eq!(&back[..len], &coords[..]);
            #[cfg(target_arch = "x86_64")]
            {
                let mut k2 = vec![0xdead_u128; len + 8];
                if avx512::try_keys(&coords, &mut k2[..len]) {
                    assert_eq!(&k2[..len], &keys[..len]);
                    assert!(k2[len..].iter().all(|k| *k == 0xdead));
                }
                let mut b2 = vec![Coord::new(7, 7, 7); len + 8];
                if avx512::try_decode_many(&keys[..len], &mut b2[..len]) {
                    assert_eq!(&b2[..len], &coords[..]);
                    assert!(b2[len..].iter().all(|c| *c == Coord::new(7, 7, 7)));
                }
            }
        }
    }
}

#[cfg(all(test, target_os = "linux", target_arch = "x86_64"))]
#[allow(unsafe_code)]
/// Masked tails read and write nothing past a slice's end: the slices end
/// at a page the test maps without access, so one byte too far faults.
mod guard_pages {
    use super::*;

    /// Slices that end exactly at a PROT_NONE page: any read or write past
    /// the end (an unmasked byte) faults.
    #[test]
    fn masked_tails_stay_before_a_guard_page() {
        const PAGE: usize = 4096;
        if !crate::curve::cpu::has_avx512_gfni() {
            eprintln!("no AVX-512 with VBMI and GFNI here: no masked tails to guard");
            return;
        }
        // SAFETY: the slices lie inside a private anonymous mapping this
        // test owns (pages 0 and 2 readable and writable, zero-filled, so
        // valid `Coord`s and `u128`s), are used one length at a time, and
        // the mapping is unmapped only after the last use.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                4 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            assert_ne!(base as *mut libc::c_void, libc::MAP_FAILED);
            // Pages: [coords][guard][keys][guard]
            assert_eq!(
                libc::mprotect(base.add(PAGE).cast(), PAGE, libc::PROT_NONE),
                0
            );
            assert_eq!(
                libc::mprotect(base.add(3 * PAGE).cast(), PAGE, libc::PROT_NONE),
                0
            );
            for len in 0..=40usize {
                // 4096 is a multiple of 4 (Coord align) and 16 (u128 align).
                let coords_ptr = base.add(PAGE - 12 * len) as *mut Coord;
                let keys_ptr = base.add(3 * PAGE - 16 * len) as *mut u128;
                let coords = std::slice::from_raw_parts_mut(coords_ptr, len);
                for (i, c) in coords.iter_mut().enumerate() {
                    *c = Coord::new(i as i32 * 7919 - 5, -(i as i32) * 31, i32::MAX - i as i32);
                }
                let keys = std::slice::from_raw_parts_mut(keys_ptr, len);
                assert!(avx512::try_keys(coords, keys));
                for (c, k) in coords.iter().zip(keys.iter()) {
                    assert_eq!(*k, morton_key_lut(*c));
                }
                let expect: Vec<Coord> = coords.to_vec();
                for c in coords.iter_mut() {
                    *c = Coord::new(0, 0, 0);
                }
                assert!(avx512::try_decode_many(keys, coords));
                assert_eq!(&coords[..], &expect[..]);
            }
            libc::munmap(base.cast(), 4 * PAGE);
        }
    }
}
