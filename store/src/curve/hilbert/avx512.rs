//! The batch walks with AVX-512, where the CPU has it: eight lanes to a
//! vector, each lane the same one-word walk as [`super::walk_lanes`] over the
//! same tables, with the table stride a gather, so a stride is four
//! instructions for eight lanes where the scalar lanes take five for one.
//! On a Zen 4 this measured ~7.5 ns per full-range coordinate against
//! ~10 ns for the scalar lanes, and ~4.5 ns against ~6.5 ns near the
//! origin (`benches/curves.rs`, `hilbert-batch`). Encoding prefers
//! [`bytes`] where the CPU has it (~3 ns for both); decoding has only
//! the gathers.
//!
//! The only `unsafe` of the curves' Hilbert code is here: calls of
//! `#[target_feature]` functions after the CPU check, and the vector loads,
//! stores and gathers, each within its array.

use std::arch::x86_64::{
    __m512i, _mm512_and_si512, _mm512_i64gather_epi64, _mm512_loadu_si512, _mm512_or_si512,
    _mm512_permutex2var_epi16, _mm512_permutex2var_epi64, _mm512_permutexvar_epi64,
    _mm512_rol_epi64, _mm512_set_epi64, _mm512_set1_epi64, _mm512_setzero_si512, _mm512_slli_epi64,
    _mm512_sllv_epi64, _mm512_srli_epi64, _mm512_storeu_si512, _mm512_ternarylogic_epi64,
};

use cube_protocol::Coord;

use crate::curve::cpu::{has_avx512, has_avx512_gfni};

use super::{
    BATCH_LANES, DECODE_1, DECODE_1_TABLE, DECODE_TOP, DECODE_WORD, ENCODE_TOP, ENCODE_WORD,
    SHORTCUT, START_STATE, WordTable, magnitude_bits, morton_keys,
};

/// Vectors walked side by side, so that their gathers' latencies
/// overlap: 2 measured ~20 % slower, 8 no faster.
const VECTORS: usize = 4;

/// Keys (or Morton keys) per block.
pub(super) const LANES: usize = 8 * VECTORS;

const _: () = assert!(LANES.is_multiple_of(BATCH_LANES), "blocks are whole groups");

type Lanes = [__m512i; VECTORS];

/// [`SHORTCUT`] laid out for `vpermq`: for each stride count `j`, one
/// vector per field, indexed by the input's top digit (for encoding
/// the signs; for decoding the key digit they give).
struct Short {
    state: [[u64; 8]; 11],
    lo: [[u64; 8]; 11],
    hi: [[u64; 8]; 11],
}

const fn build_short(decode: bool) -> Short {
    let mut short = Short {
        state: [[0; 8]; 11],
        lo: [[0; 8]; 11],
        hi: [[0; 8]; 11],
    };
    let mut j = 0;
    while j < 11 {
        let mut top = 0;
        while top < 8 {
            let (sign, out) = if decode {
                let sign = (DECODE_1_TABLE[(START_STATE << 3) | top] & 7) as usize;
                (sign, SHORTCUT.morton_top[sign][j])
            } else {
                (top, SHORTCUT.key_top[top][j])
            };
            short.state[j][top] = SHORTCUT.state[sign][j] as u64;
            short.lo[j][top] = out as u64;
            short.hi[j][top] = (out >> 64) as u64;
            top += 1;
        }
        j += 1;
    }
    short
}

static ENCODE_SHORT: Short = build_short(false);
static DECODE_SHORT: Short = build_short(true);

/// `count` strides of each lane (see [`super::build_word`]).
#[inline]
#[target_feature(enable = "avx512f")]
fn walk(word: &mut Lanes, count: u32, table: &WordTable) {
    let index_mask = _mm512_set1_epi64(0x3fff);
    let entry_mask = _mm512_set1_epi64(0xffff);
    // From the whole table (`entries` is at offset 0), so that the
    // reads into `tail` stay within the pointer's provenance.
    let base: *const i64 = std::ptr::from_ref(table).cast();
    for _ in 0..count {
        for w in word.iter_mut() {
            let turned = _mm512_rol_epi64::<9>(*w);
            let index = _mm512_and_si512(turned, index_mask);
            // SAFETY: the indices are below 2^14 and each read is
            // eight bytes at `2 * index`, which `tail` keeps inside
            // the table.
            #[allow(unsafe_code)]
            let entry = unsafe { _mm512_i64gather_epi64::<2>(index, base) };
            // turned ^ (entry & 0xffff): the gather read three
            // neighbouring entries too.
            *w = _mm512_ternarylogic_epi64::<0x78>(turned, entry, entry_mask);
        }
    }
}

/// Loads one field of a [`Short`] (eight `u64`).
#[inline]
#[target_feature(enable = "avx512f")]
fn load_u64x8(values: &[u64; 8]) -> __m512i {
    // SAFETY: 64 bytes, the whole array.
    #[allow(unsafe_code)]
    unsafe {
        _mm512_loadu_si512(values.as_ptr().cast())
    }
}

/// [`super::run_strides_lanes`] and [`super::run_ten_strides_lanes`] with
/// the top stride or the short cut before them, for a block of inputs
/// (Morton keys or keys, replaced by the output) over a shared stride
/// count `strides` (as in [`super::hilbert_key_lanes`]).
#[target_feature(enable = "avx512f,avx512bw")]
fn walk_block(
    io: &mut [u128; LANES],
    strides: u32,
    top: &[u16; 64],
    short: &Short,
    table: &WordTable,
) {
    let (lo, hi) = load_block(io);
    let walked = if strides >= 10 {
        walk_with_top(&lo, &hi, top, table)
    } else {
        walk_with_short_cut(&lo, &hi, strides, short, table)
    };
    store_block(io, &walked);
}

/// A block's inputs split into their low and high 64 bits, one vector of
/// eight lanes per field (bits above 96 dropped: keys to decode may have
/// them).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn load_block(io: &[u128; LANES]) -> (Lanes, Lanes) {
    let zero = _mm512_setzero_si512();
    let (mut lo, mut hi) = ([zero; VECTORS], [zero; VECTORS]);
    let (quads, _) = io.as_chunks::<4>();
    let even = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
    let odd = _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1);
    let low_32 = _mm512_set1_epi64(0xffff_ffff);
    for v in 0..VECTORS {
        // SAFETY: 64 bytes each, the whole of one `[u128; 4]`.
        #[allow(unsafe_code)]
        let (a, b) = unsafe {
            (
                _mm512_loadu_si512(quads[2 * v].as_ptr().cast()),
                _mm512_loadu_si512(quads[2 * v + 1].as_ptr().cast()),
            )
        };
        lo[v] = _mm512_permutex2var_epi64(a, even, b);
        hi[v] = _mm512_and_si512(_mm512_permutex2var_epi64(a, odd, b), low_32);
    }
    (lo, hi)
}

/// A walk's output so far: the high and low bits placed, and each lane's
/// word (its state in the low five bits).
struct Walked {
    out_lo: Lanes,
    out_hi: Lanes,
    word: Lanes,
}

/// Ten or eleven strides: the top stride looked up in `top`, then four
/// and six strides walked.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn walk_with_top(lo: &Lanes, hi: &Lanes, top: &[u16; 64], table: &WordTable) -> Walked {
    let zero = _mm512_setzero_si512();
    let (mut out_lo, mut out_hi, mut word) = ([zero; VECTORS], [zero; VECTORS], [zero; VECTORS]);
    let state_mask = _mm512_set1_epi64(31);
    let (top_lo, top_hi) = top.split_at(32);
    // SAFETY: 64 bytes each, the two halves of `top`.
    #[allow(unsafe_code)]
    let (top_lo, top_hi) = unsafe {
        (
            _mm512_loadu_si512(top_lo.as_ptr().cast()),
            _mm512_loadu_si512(top_hi.as_ptr().cast()),
        )
    };
    for v in 0..VECTORS {
        // The index in each lane's low 16-bit word: the words above it
        // look up entry 0, masked off after.
        let index = _mm512_and_si512(_mm512_srli_epi64::<26>(hi[v]), _mm512_set1_epi64(63));
        let entry = _mm512_and_si512(
            _mm512_permutex2var_epi16(top_lo, index, top_hi),
            _mm512_set1_epi64(0xffff),
        );
        out_hi[v] = _mm512_slli_epi64::<26>(_mm512_and_si512(entry, _mm512_set1_epi64(63)));
        word[v] = _mm512_or_si512(
            _mm512_or_si512(
                _mm512_slli_epi64::<38>(hi[v]),
                _mm512_slli_epi64::<28>(_mm512_srli_epi64::<54>(lo[v])),
            ),
            _mm512_srli_epi64::<6>(entry),
        );
    }
    walk(&mut word, 4, table);
    for v in 0..VECTORS {
        let digits = _mm512_srli_epi64::<5>(word[v]);
        out_lo[v] = _mm512_slli_epi64::<54>(digits);
        out_hi[v] = _mm512_or_si512(out_hi[v], _mm512_srli_epi64::<10>(digits));
        word[v] = _mm512_or_si512(
            _mm512_slli_epi64::<10>(lo[v]),
            _mm512_and_si512(word[v], state_mask),
        );
    }
    walk(&mut word, 6, table);
    Walked {
        out_lo,
        out_hi,
        word,
    }
}

/// Fewer than ten strides: the top digit's short cut from `short`, then
/// the strides above the low six, then the low six (or fewer).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn walk_with_short_cut(
    lo: &Lanes,
    hi: &Lanes,
    strides: u32,
    short: &Short,
    table: &WordTable,
) -> Walked {
    let zero = _mm512_setzero_si512();
    let (mut out_lo, mut out_hi, mut word) = ([zero; VECTORS], [zero; VECTORS], [zero; VECTORS]);
    let state_mask = _mm512_set1_epi64(31);
    let j = strides as usize;
    let states = load_u64x8(&short.state[j]);
    let top_lo = load_u64x8(&short.lo[j]);
    let top_hi = load_u64x8(&short.hi[j]);
    for v in 0..VECTORS {
        let digit = _mm512_srli_epi64::<29>(hi[v]);
        word[v] = _mm512_permutexvar_epi64(digit, states);
        out_lo[v] = _mm512_permutexvar_epi64(digit, top_lo);
        out_hi[v] = _mm512_permutexvar_epi64(digit, top_hi);
    }
    if strides > 6 {
        let shift = _mm512_set1_epi64(i64::from(64 - 9 * (strides - 6)));
        for v in 0..VECTORS {
            let input = _mm512_or_si512(
                _mm512_slli_epi64::<10>(hi[v]),
                _mm512_srli_epi64::<54>(lo[v]),
            );
            word[v] = _mm512_or_si512(word[v], _mm512_sllv_epi64(input, shift));
        }
        walk(&mut word, strides - 6, table);
        for v in 0..VECTORS {
            let digits = _mm512_srli_epi64::<5>(word[v]);
            out_lo[v] = _mm512_or_si512(out_lo[v], _mm512_slli_epi64::<54>(digits));
            out_hi[v] = _mm512_or_si512(out_hi[v], _mm512_srli_epi64::<10>(digits));
            word[v] = _mm512_and_si512(word[v], state_mask);
        }
    }
    let lo_strides = strides.min(6);
    // A count of 64 (no strides) shifts everything out.
    let shift = _mm512_set1_epi64(i64::from(64 - 9 * lo_strides));
    for v in 0..VECTORS {
        word[v] = _mm512_or_si512(word[v], _mm512_sllv_epi64(lo[v], shift));
    }
    walk(&mut word, lo_strides, table);
    Walked {
        out_lo,
        out_hi,
        word,
    }
}

/// Writes the walk's outputs (their last digits still in the words) back
/// over the block's inputs.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn store_block(io: &mut [u128; LANES], walked: &Walked) {
    let first = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
    let second = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
    let (quads, _) = io.as_chunks_mut::<4>();
    for v in 0..VECTORS {
        let lo = _mm512_or_si512(walked.out_lo[v], _mm512_srli_epi64::<5>(walked.word[v]));
        let a = _mm512_permutex2var_epi64(lo, first, walked.out_hi[v]);
        let b = _mm512_permutex2var_epi64(lo, second, walked.out_hi[v]);
        // SAFETY: 64 bytes each, the whole of one `[u128; 4]`.
        #[allow(unsafe_code)]
        unsafe {
            _mm512_storeu_si512(quads[2 * v].as_mut_ptr().cast(), a);
            _mm512_storeu_si512(quads[2 * v + 1].as_mut_ptr().cast(), b);
        }
    }
}

/// Byte-lane encoding for CPUs that also have VBMI and GFNI: 64
/// coordinates to a vector, one byte each, and the machine stepped one
/// level at a time with the one-level table held in registers (192
/// one-byte entries `digit | next state << 3`, looked up by `vpermi2b`
/// and `vpermb`), so there are no gathers and no Morton pass. GFNI's
/// bit-matrix multiply picks each level's bits out of the coordinates'
/// bytes and puts the digits into the key's bytes.
pub(super) mod bytes {
    use std::arch::x86_64::{
        __m512i, _mm512_gf2p8affine_epi64_epi8, _mm512_loadu_si512, _mm512_mask_permutexvar_epi8,
        _mm512_mask_permutexvar_epi32, _mm512_maskz_permutex2var_epi32, _mm512_movepi8_mask,
        _mm512_or_si512, _mm512_permutex2var_epi8, _mm512_permutexvar_epi8, _mm512_set1_epi8,
        _mm512_set1_epi64, _mm512_setzero_si512, _mm512_shuffle_i64x2, _mm512_storeu_si512,
        _mm512_ternarylogic_epi64, _mm512_xor_si512,
    };

    use cube_protocol::Coord;

    use super::super::{ENCODE_1_TABLE, START_STATE};

    /// Coordinates per block.
    pub(in super::super) const LANES: usize = 64;

    /// The one-level encode table as bytes, in three vectors.
    static TABLE: [u8; 192] = {
        let mut table = [0u8; 192];
        let mut i = 0;
        while i < 192 {
            table[i] = ENCODE_1_TABLE[i] as u8;
            i += 1;
        }
        table
    };

    const _: () = assert!(super::super::STATES * 8 == 192, "three vectors of entries");
    const _: () = assert!(START_STATE == 0, "the walk starts from entry 0");

    /// The GF(2) matrix that moves `count` bits from `from` up in each
    /// byte to `to` up (and clears the rest): output bit `i` is the
    /// parity of the input ANDed with byte `7 - i`.
    const fn matrix(from: u32, to: u32, count: u32) -> i64 {
        let mut m = 0u64;
        let mut i = 0;
        while i < count {
            m |= (1u64 << (from + i)) << (8 * (7 - (to + i)));
            i += 1;
        }
        m as i64
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
    fn pick(v: __m512i, from: u32, to: u32, count: u32) -> __m512i {
        _mm512_gf2p8affine_epi64_epi8::<0>(v, _mm512_set1_epi64(matrix(from, to, count)))
    }

    /// Swaps 128-bit lane `j` of vector `b` with lane `b` of vector `j`
    /// (its own inverse).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
    fn lane_transpose(a: [__m512i; 4]) -> [__m512i; 4] {
        let t0 = _mm512_shuffle_i64x2::<0x44>(a[0], a[1]);
        let t1 = _mm512_shuffle_i64x2::<0xee>(a[0], a[1]);
        let t2 = _mm512_shuffle_i64x2::<0x44>(a[2], a[3]);
        let t3 = _mm512_shuffle_i64x2::<0xee>(a[2], a[3]);
        [
            _mm512_shuffle_i64x2::<0x88>(t0, t2),
            _mm512_shuffle_i64x2::<0xdd>(t0, t2),
            _mm512_shuffle_i64x2::<0x88>(t1, t3),
            _mm512_shuffle_i64x2::<0xdd>(t1, t3),
        ]
    }

    /// Byte `16 b + c` from byte `4 c + b`: 128-bit lane `b` gets byte
    /// `b` of each of sixteen `u32`.
    static GROUP: [u8; 64] = {
        let mut index = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            index[i] = ((i % 16) * 4 + i / 16) as u8;
            i += 1;
        }
        index
    };

    /// The inverse of [`GROUP`].
    static UNGROUP: [u8; 64] = {
        let mut index = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            index[(i % 16) * 4 + i / 16] = i as u8;
            i += 1;
        }
        index
    };

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
    fn load64(bytes: &[u8; 64]) -> __m512i {
        // SAFETY: 64 bytes, the whole array.
        #[allow(unsafe_code)]
        unsafe {
            _mm512_loadu_si512(bytes.as_ptr().cast())
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
    fn to_byte_vectors(values: &[u32; LANES]) -> [__m512i; 4] {
        let group = load64(&GROUP);
        let (quarters, _) = values.as_chunks::<16>();
        let mut a = [_mm512_setzero_si512(); 4];
        for (v, quarter) in a.iter_mut().zip(quarters) {
            // SAFETY: 64 bytes, the whole of one `[u32; 16]`.
            #[allow(unsafe_code)]
            let loaded = unsafe { _mm512_loadu_si512(quarter.as_ptr().cast()) };
            *v = _mm512_permutexvar_epi8(group, loaded);
        }
        lane_transpose(a)
    }

    /// The inverse of [`to_byte_vectors`]: four vectors of 16 `u32`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
    fn from_byte_vectors(b: [__m512i; 4]) -> [__m512i; 4] {
        let ungroup = load64(&UNGROUP);
        let mut words = lane_transpose(b);
        for v in &mut words {
            *v = _mm512_permutexvar_epi8(ungroup, *v);
        }
        words
    }

    /// One level `K` (31 down to 0) of the machine for every byte lane.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
    fn level<const K: u32>(
        entry: &mut __m512i,
        key: &mut [__m512i; 12],
        axes: &[[__m512i; 4]; 3],
        table: &[__m512i; 3],
    ) {
        let (byte, bit) = ((K / 8) as usize, K % 8);
        let octant = _mm512_ternarylogic_epi64::<0xfe>(
            pick(axes[0][byte], bit, 2, 1),
            pick(axes[1][byte], bit, 1, 1),
            pick(axes[2][byte], bit, 0, 1),
        );
        // (entry & 0xf8) | octant: the state part of the last entry.
        let index =
            _mm512_ternarylogic_epi64::<0xea>(*entry, _mm512_set1_epi8(0xf8u8 as i8), octant);
        let low = _mm512_permutex2var_epi8(table[0], index, table[1]);
        *entry = _mm512_mask_permutexvar_epi8(low, _mm512_movepi8_mask(index), index, table[2]);
        let (out, shift) = ((3 * K / 8) as usize, 3 * K % 8);
        if shift <= 5 {
            key[out] = _mm512_or_si512(key[out], pick(*entry, 0, shift, 3));
        } else {
            let here = 8 - shift;
            key[out] = _mm512_or_si512(key[out], pick(*entry, 0, shift, here));
            key[out + 1] = _mm512_or_si512(key[out + 1], pick(*entry, here, 0, 3 - here));
        }
    }

    /// The keys of 64 coordinates. Always all 32 levels: the short cut
    /// near the origin would save levels, but this measured faster
    /// than the gathers' short cut there anyway.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
    pub(in super::super) fn block(coords: &[Coord; LANES], out: &mut [u128; LANES]) {
        let mut values = [[0u32; LANES]; 3];
        for (i, c) in coords.iter().enumerate() {
            values[0][i] = c.x as u32;
            values[1][i] = c.y as u32;
            values[2][i] = c.z as u32;
        }
        // The order-preserving bits: the sign bits flipped.
        let flip = _mm512_set1_epi8(0x80u8 as i8);
        // A loop, not `map`: a closure would not inline here (it
        // lacks the target features), costing a call per axis.
        let mut axes = [[_mm512_setzero_si512(); 4]; 3];
        for (bytes, v) in axes.iter_mut().zip(&values) {
            *bytes = to_byte_vectors(v);
            bytes[3] = _mm512_xor_si512(bytes[3], flip);
        }
        let (thirds, _) = TABLE.as_chunks::<64>();
        let table = [load64(&thirds[0]), load64(&thirds[1]), load64(&thirds[2])];
        let mut entry = _mm512_setzero_si512();
        let mut key = [_mm512_setzero_si512(); 12];
        macro_rules! levels {
            ($($k:literal)*) => { $( level::<$k>(&mut entry, &mut key, &axes, &table); )* };
        }
        levels!(31 30 29 28 27 26 25 24 23 22 21 20 19 18 17 16 15 14 13 12 11 10 9 8 7 6 5 4 3 2 1 0);
        let words = [
            from_byte_vectors([key[0], key[1], key[2], key[3]]),
            from_byte_vectors([key[4], key[5], key[6], key[7]]),
            from_byte_vectors([key[8], key[9], key[10], key[11]]),
        ];
        let (quads, _) = out.as_chunks_mut::<4>();
        for (q, quad) in quads.iter_mut().enumerate() {
            let (j, part) = (q / 4, (q % 4) as i32 * 4);
            // Dwords 4i, 4i + 1 from the first two words of key
            // `part + i`, 4i + 2 from the third, 4i + 3 zero.
            let pair = pair_index(part);
            let lo = _mm512_maskz_permutex2var_epi32(0x3333, words[0][j], pair, words[1][j]);
            let all = _mm512_mask_permutexvar_epi32(lo, 0x4444, pair, words[2][j]);
            // SAFETY: 64 bytes, the whole of one `[u128; 4]`.
            #[allow(unsafe_code)]
            unsafe {
                _mm512_storeu_si512(quad.as_mut_ptr().cast(), all)
            };
        }
    }

    /// Dword `4i + 0` and `4i + 2` pick `part + i` of the first source
    /// (and of the third, by `vpermd`), `4i + 1` picks it of the second.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn pair_index(part: i32) -> __m512i {
        let p = part;
        std::arch::x86_64::_mm512_set_epi32(
            0,
            p + 3,
            16 + p + 3,
            p + 3,
            0,
            p + 2,
            16 + p + 2,
            p + 2,
            0,
            p + 1,
            16 + p + 1,
            p + 1,
            0,
            p,
            16 + p,
            p,
        )
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
fn bytes_keys(coords: &[Coord], out: &mut [u128]) {
    let (key_blocks, _) = out.as_chunks_mut::<{ bytes::LANES }>();
    for (block, keys) in coords
        .as_chunks::<{ bytes::LANES }>()
        .0
        .iter()
        .zip(key_blocks)
    {
        bytes::block(block, keys);
    }
}

#[target_feature(enable = "avx512f,avx512bw")]
fn keys(coords: &[Coord], out: &mut [u128]) {
    let (key_blocks, _) = out.as_chunks_mut::<LANES>();
    for (block, keys) in coords.as_chunks::<LANES>().0.iter().zip(key_blocks) {
        let mut magnitudes = 0u32;
        for c in block {
            magnitudes |= magnitude_bits(*c);
        }
        let j = (32 - magnitudes.leading_zeros()).div_ceil(3);
        morton_keys(block, keys);
        walk_block(keys, j, &ENCODE_TOP, &ENCODE_SHORT, &ENCODE_WORD);
    }
}

#[target_feature(enable = "avx512f,avx512bw")]
fn decode(keys: &[u128], morton: &mut [u128]) {
    let (morton_blocks, _) = morton.as_chunks_mut::<LANES>();
    for (block, m) in keys.as_chunks::<LANES>().0.iter().zip(morton_blocks) {
        let mut matched_levels = 32;
        for key in block {
            let key = key & super::super::KEY_MASK;
            let sign = usize::from(DECODE_1[(START_STATE << 3) | ((key >> 93) as usize & 7)] & 7);
            matched_levels =
                matched_levels.min(((key ^ SHORTCUT.key_top[sign][0]).leading_zeros() - 32) / 3);
        }
        let j = (32 - matched_levels).div_ceil(3);
        *m = *block;
        walk_block(m, j, &DECODE_TOP, &DECODE_SHORT, &DECODE_WORD);
    }
}

/// The Hilbert keys of the leading whole blocks of `coords`, into
/// `out`, if this CPU has AVX-512 (by [`bytes`] where it also has VBMI
/// and GFNI and `allow_bytes`): how many were done (0 without it). The
/// workspace denies `unsafe`; it is allowed here because the vector
/// walks measured 1.3x (gathers) to 3x (bytes) the throughput of the
/// scalar lanes (`benches/curves.rs`), and the unsafe operations are
/// calling `#[target_feature]` functions, whose requirement is checked
/// just before, and the loads, stores and gathers, each within its
/// array.
#[allow(unsafe_code)]
pub(super) fn try_keys(coords: &[Coord], out: &mut [u128], allow_bytes: bool) -> usize {
    if !has_avx512() {
        return 0;
    }
    let mut done = 0;
    if allow_bytes && has_avx512_gfni() {
        // SAFETY: `has_avx512_gfni()` checked the features.
        unsafe { bytes_keys(coords, out) };
        done = coords.len() / bytes::LANES * bytes::LANES;
    }
    let (coords, out) = (&coords[done..], &mut out[done..]);
    // SAFETY: `has_avx512()` checked the features.
    unsafe { keys(coords, out) };
    done + coords.len() / LANES * LANES
}

/// The Morton keys of the cells of the whole blocks of `keys`, into
/// `morton`, if this CPU has AVX-512: how many were done (0 without
/// it); see [`try_keys`] for the `unsafe`.
#[allow(unsafe_code)]
pub(super) fn try_decode(keys: &[u128], morton: &mut [u128]) -> usize {
    if !has_avx512() {
        return 0;
    }
    // SAFETY: `has_avx512()` checked the features.
    unsafe { decode(keys, morton) };
    keys.len() / LANES * LANES
}
