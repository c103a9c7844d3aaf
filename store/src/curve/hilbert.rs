//! The 3-D Hilbert curve over the whole `i32` cube, as a finite-state machine.
//!
//! The curve is John Skilling's ("Programming the Hilbert curve", AIP Conf.
//! Proc. 707, 2004): transform the three coordinates level by level from the
//! top bit down, Gray-code the result and interleave it (x highest). Done
//! literally that costs ~30 dependent, branchy steps per level. Instead, the
//! transform that Skilling's loop has accumulated above a level is always a
//! *signed permutation* of the axes (his "invert" and "exchange" operations
//! compose to one), and his final Gray-code correction is the parity of the
//! higher Gray bits. So (signed permutation, parity) is a state, and one
//! level is a table lookup `(state, octant) -> (digit, next state)`. 48 of
//! the 96 such states are reachable and they behave as 24 (merged at
//! compile time by partition refinement, see [`MACHINE`]).
//!
//! The tables are built at compile time from Skilling's per-level rules
//! ([`raw_step`]), so there is no hand-typed table to get wrong, and
//! [`tests`] compare the machine against a literal transcription of his
//! algorithm. Encoding looks up three levels at a time (a 24 KiB table that
//! stays in L1), after one lookup for the top two levels; the octree walks
//! in `region.rs` use the one-level tables. The batch functions walk many
//! keys side by side over the same tables, as scalar lanes or, where the
//! CPU has AVX-512, as vector lanes whose table lookups are gathers; with
//! VBMI and GFNI too, encoding walks 64 coordinates a level at a time with
//! the one-level table in registers instead (`hilbert/avx512.rs`, the
//! only place here with `unsafe`).
//!
//! Two words of this file: a **stride** is three levels of the curve, one
//! lookup in the three-level table; a **lane** is one of the walks a batch
//! runs side by side, in the SIMD sense (a vector lane in the AVX-512
//! paths, its scalar imitation otherwise), nothing to do with a program
//! `step` or its threads.

use cube_protocol::Coord;

use super::morton::{morton_decode, morton_decode_many, morton_key, morton_keys};

/// The six orderings of the axes (x = 0, y = 1, z = 2).
const PERMS: [[usize; 3]; 6] = [
    [0, 1, 2],
    [0, 2, 1],
    [1, 0, 2],
    [1, 2, 0],
    [2, 0, 1],
    [2, 1, 0],
];

/// Every combination of axis order, axis flips and Gray parity; half are
/// unreachable from the start state, see [`MACHINE`].
const RAW_STATES: usize = 6 * 8 * 2;

const fn perm_index(p: [usize; 3]) -> usize {
    let mut i = 0;
    while i < PERMS.len() {
        if PERMS[i][0] == p[0] && PERMS[i][1] == p[1] && PERMS[i][2] == p[2] {
            return i;
        }
        i += 1;
    }
    panic!("not a permutation")
}

const fn raw_parts(raw: usize) -> ([usize; 3], usize, usize) {
    (PERMS[raw / 16], (raw / 2) % 8, raw % 2)
}

const fn raw_of(perm: [usize; 3], flips: usize, parity: usize) -> usize {
    perm_index(perm) * 16 + flips * 2 + parity
}

/// Skilling's operations at one level, given the level's bits as his loop
/// sees them (`t`, after the transform of the levels above): for each axis
/// i, a set bit inverts the lower bits of axis 0, a clear bit exchanges the
/// lower bits of axes 0 and i. Returns the transform for the levels below.
const fn apply_level_ops(
    mut perm: [usize; 3],
    mut flips: usize,
    t: [usize; 3],
) -> ([usize; 3], usize) {
    let mut i = 0;
    while i < 3 {
        if t[i] == 1 {
            flips ^= 1;
        } else if i != 0 {
            let p = perm[0];
            perm[0] = perm[i];
            perm[i] = p;
            let f0 = flips & 1;
            let fi = (flips >> i) & 1;
            flips = (flips & !(1 | (1 << i))) | fi | (f0 << i);
        }
        i += 1;
    }
    (perm, flips)
}

/// One level of encoding: the octant's bits (x in bit 2, y bit 1, z bit 0)
/// in state `raw` give the key digit and the state for the next level down.
const fn raw_step(raw: usize, octant: usize) -> (usize, usize) {
    let (perm, flips, parity) = raw_parts(raw);
    let o = [(octant >> 2) & 1, (octant >> 1) & 1, octant & 1];
    // The transform so far: axis j now holds original axis perm[j], flipped
    // if bit j of `flips` is set.
    let t = [
        o[perm[0]] ^ (flips & 1),
        o[perm[1]] ^ ((flips >> 1) & 1),
        o[perm[2]] ^ ((flips >> 2) & 1),
    ];
    // Gray code across the axes, then Skilling's correction: flip all
    // three bits when the higher levels' last Gray bits XOR to 1.
    let g = [t[0], t[1] ^ t[0], t[2] ^ t[1] ^ t[0]];
    let digit = ((g[0] ^ parity) << 2) | ((g[1] ^ parity) << 1) | (g[2] ^ parity);
    let (perm, flips) = apply_level_ops(perm, flips, t);
    (digit, raw_of(perm, flips, parity ^ g[2]))
}

/// The inverse of [`raw_step`]: a key digit back to the octant.
const fn raw_unstep(raw: usize, digit: usize) -> (usize, usize) {
    let (perm, flips, parity) = raw_parts(raw);
    let g = [
        ((digit >> 2) & 1) ^ parity,
        ((digit >> 1) & 1) ^ parity,
        (digit & 1) ^ parity,
    ];
    let t = [g[0], g[1] ^ g[0], g[2] ^ g[1]];
    let mut o = [0usize; 3];
    o[perm[0]] = t[0] ^ (flips & 1);
    o[perm[1]] = t[1] ^ ((flips >> 1) & 1);
    o[perm[2]] = t[2] ^ ((flips >> 2) & 1);
    let octant = (o[0] << 2) | (o[1] << 1) | o[2];
    let (perm, flips) = apply_level_ops(perm, flips, t);
    (octant, raw_of(perm, flips, parity ^ g[2]))
}

/// The state every key starts in: no transform, parity 0.
const START_RAW: usize = 0;

/// The machine's states: the reachable signed permutations, with those
/// that behave identically (same digit for every octant, equivalent next
/// states) merged by Moore's partition refinement. 48 are reachable;
/// they collapse to 24 classes, which halves the tables (the three-level
/// table is then 24 KiB and stays in a 32 KiB L1 cache).
struct Machine {
    /// The class (the machine's state number) of each raw state.
    class_of_raw: [usize; RAW_STATES],
    count: usize,
}

const fn same_outputs(a: usize, b: usize) -> bool {
    let mut octant = 0;
    while octant < 8 {
        if raw_step(a, octant).0 != raw_step(b, octant).0 {
            return false;
        }
        octant += 1;
    }
    true
}

const fn same_successor_classes(class: &[usize; RAW_STATES], a: usize, b: usize) -> bool {
    let mut octant = 0;
    while octant < 8 {
        if class[raw_step(a, octant).1] != class[raw_step(b, octant).1] {
            return false;
        }
        octant += 1;
    }
    true
}

const MACHINE: Machine = {
    let mut reachable = [false; RAW_STATES];
    let mut queue = [0usize; RAW_STATES];
    let (mut head, mut tail) = (0, 1);
    reachable[START_RAW] = true;
    queue[0] = START_RAW;
    while head < tail {
        let raw = queue[head];
        head += 1;
        let mut octant = 0;
        while octant < 8 {
            let (_, next) = raw_step(raw, octant);
            if !reachable[next] {
                reachable[next] = true;
                queue[tail] = next;
                tail += 1;
            }
            octant += 1;
        }
    }
    // Start from "same outputs", then split classes whose members lead to
    // different classes, until nothing splits. Classes are numbered in
    // order of their lowest raw state, so the start state is class 0.
    let mut class = [usize::MAX; RAW_STATES];
    let mut count = 0;
    let mut raw = 0;
    while raw < RAW_STATES {
        if reachable[raw] {
            let mut earlier = 0;
            while earlier < raw && !(reachable[earlier] && same_outputs(earlier, raw)) {
                earlier += 1;
            }
            if earlier < raw {
                class[raw] = class[earlier];
            } else {
                class[raw] = count;
                count += 1;
            }
        }
        raw += 1;
    }
    loop {
        let mut refined = [usize::MAX; RAW_STATES];
        let mut refined_count = 0;
        let mut raw = 0;
        while raw < RAW_STATES {
            if reachable[raw] {
                let mut earlier = 0;
                while earlier < raw
                    && !(reachable[earlier]
                        && class[earlier] == class[raw]
                        && same_successor_classes(&class, earlier, raw))
                {
                    earlier += 1;
                }
                if earlier < raw {
                    refined[raw] = refined[earlier];
                } else {
                    refined[raw] = refined_count;
                    refined_count += 1;
                }
            }
            raw += 1;
        }
        let stable = refined_count == count;
        class = refined;
        count = refined_count;
        if stable {
            break;
        }
    }
    Machine {
        class_of_raw: class,
        count,
    }
};

/// How many states the machine has (24).
pub(crate) const STATES: usize = MACHINE.count;

/// One raw state of each class, to compute the class's table rows from.
const RAW_OF_DENSE: [usize; STATES] = {
    let mut raws = [usize::MAX; STATES];
    let mut raw = 0;
    while raw < RAW_STATES {
        let class = MACHINE.class_of_raw[raw];
        if class != usize::MAX && raws[class] == usize::MAX {
            raws[class] = raw;
        }
        raw += 1;
    }
    raws
};

/// One level: index `state << 3 | input digit`, entry `output digit |
/// next state << 3`. `forward` picks encode or decode.
const fn build_one(forward: bool) -> [u16; STATES * 8] {
    let mut table = [0u16; STATES * 8];
    let mut state = 0;
    while state < STATES {
        let mut input = 0;
        while input < 8 {
            let raw = RAW_OF_DENSE[state];
            let (output, next) = if forward {
                raw_step(raw, input)
            } else {
                raw_unstep(raw, input)
            };
            table[(state << 3) | input] = (output | (MACHINE.class_of_raw[next] << 3)) as u16;
            input += 1;
        }
        state += 1;
    }
    table
}

/// Rows in the three-level tables: the states, rounded up to a power of
/// two so that an index `(entry & STATE_BITS) | chunk` is provably in
/// bounds (no bounds check on the hot chain). The padding rows are never
/// read, so they cost no cache.
const THREE_ROWS: usize = STATES.next_power_of_two();

/// The state part of a three-level entry (`next state << 9`), masked to
/// [`THREE_ROWS`].
const STATE_BITS: usize = (THREE_ROWS - 1) << 9;

/// Three levels at once, composed from the one-level table: index
/// `state << 9 | three input digits`, entry `three output digits | next
/// state << 9`.
const fn build_three(one: &[u16; STATES * 8]) -> [u16; THREE_ROWS * 512] {
    const { assert!(THREE_ROWS << 9 <= 1 << 16, "entries fit in u16") };
    let mut table = [0u16; THREE_ROWS * 512];
    let mut state = 0;
    while state < STATES {
        let mut input = 0;
        while input < 512 {
            let mut current = state;
            let mut output = 0;
            let mut level = 0;
            while level < 3 {
                let shift = 3 * (2 - level);
                let entry = one[(current << 3) | ((input >> shift) & 7)] as usize;
                output |= (entry & 7) << shift;
                current = entry >> 3;
                level += 1;
            }
            table[(state << 9) | input] = (output | (current << 9)) as u16;
            input += 1;
        }
        state += 1;
    }
    table
}

const ENCODE_1_TABLE: [u16; STATES * 8] = build_one(true);
const DECODE_1_TABLE: [u16; STATES * 8] = build_one(false);

/// One level, decode: `(state << 3 | digit) -> octant | next << 3`.
static DECODE_1: [u16; STATES * 8] = DECODE_1_TABLE;
static ENCODE_3: [u16; THREE_ROWS * 512] = build_three(&ENCODE_1_TABLE);
static DECODE_3: [u16; THREE_ROWS * 512] = build_three(&DECODE_1_TABLE);

/// The start state's number.
pub(crate) const START_STATE: usize = MACHINE.class_of_raw[START_RAW];

/// The machine's walk through the top two levels (bits 95..=90) from the
/// start state, for all 64 inputs: the six output bits and the state, as
/// `digits | state << 6`. One load instead of two dependent ones.
const fn build_top(one: &[u16; STATES * 8]) -> [u16; 64] {
    let mut table = [0u16; 64];
    let mut input = 0;
    while input < 64 {
        let first = one[(START_STATE << 3) | (input >> 3)] as usize;
        let second = one[(first & !7) | (input & 7)] as usize;
        let digits = ((first & 7) << 3) | (second & 7);
        table[input] = (digits | ((second >> 3) << 6)) as u16;
        input += 1;
    }
    table
}

static ENCODE_TOP: [u16; 64] = build_top(&ENCODE_1_TABLE);
static DECODE_TOP: [u16; 64] = build_top(&DECODE_1_TABLE);

/// Runs `strides` (at most 10) three-level strides of the machine from `state`
/// over the low `9 * strides` bits of `input` (a 96-bit string of octal
/// digits), top first, and returns their output in the same bits. The
/// loads form one dependent chain, so this is where the time goes; the
/// rest is kept to constant shifts on `u64` halves (strides 9..=6 are bits
/// 54..=89, strides 5..=0 bits 0..=53), each half left-aligned so that the
/// next chunk is always its top nine bits.
#[inline(always)]
fn run_strides(state: usize, strides: u32, input: u128, three: &[u16; THREE_ROWS * 512]) -> u128 {
    debug_assert!(strides <= 10);
    let hi_strides = strides.saturating_sub(6);
    let lo_strides = strides - hi_strides;
    let mut base = state << 9;
    let mut half = |mut bits: u64, count: u32| -> u64 {
        let mut out = 0u64;
        for _ in 0..count {
            let entry = usize::from(three[base | (bits >> 55) as usize]);
            bits <<= 9;
            out = (out << 9) | (entry & 0x1ff) as u64;
            base = entry & STATE_BITS;
        }
        out
    };
    let hi = half(
        ((input >> 54) as u64).unbounded_shl(64 - 9 * hi_strides),
        hi_strides,
    );
    let lo = half(
        (input as u64).unbounded_shl(64 - 9 * lo_strides),
        lo_strides,
    );
    (u128::from(hi) << 54) | u128::from(lo)
}

/// The octant and state of the child with key digit `digit` of an octree
/// node in `state`.
#[inline]
pub(crate) fn child(state: u8, digit: u8) -> (u8, u8) {
    let entry = DECODE_1[(usize::from(state) << 3) | usize::from(digit)];
    ((entry & 7) as u8, (entry >> 3) as u8)
}

/// The short cut for coordinates near the origin. In order-preserving bits
/// a small value is its sign bit followed by a long run of the opposite
/// bit (`1000...0xyz` or `0111...1xyz`), so when all three axes are small
/// the top levels are octant `s` (the signs) and then `7 - s` over and over,
/// and the machine's walk through them is the same for every such cell. For
/// each `s` and each `j` in 0..=10, this holds the walk through the top
/// `32 - 3j` levels: the state it ends in, the key digits it produced and
/// the Morton bits it consumed (both in place). The remaining `3j` levels
/// take `j` table strides instead of 12: 5 dependent loads instead of 12 for
/// coordinates within +-2^11.
struct Shortcut {
    state: [[u8; 11]; 8],
    key_top: [[u128; 11]; 8],
    morton_top: [[u128; 11]; 8],
}

const SHORTCUT: Shortcut = {
    let mut shortcut = Shortcut {
        state: [[0; 11]; 8],
        key_top: [[0; 11]; 8],
        morton_top: [[0; 11]; 8],
    };
    let mut sign = 0;
    while sign < 8 {
        let mut j = 0;
        while j < 11 {
            let mut state = START_STATE;
            let (mut key, mut morton) = (0u128, 0u128);
            let mut level = 31;
            while level >= 3 * j {
                let octant = if level == 31 { sign } else { 7 - sign };
                let entry = ENCODE_1_TABLE[(state << 3) | octant] as usize;
                key |= ((entry & 7) as u128) << (3 * level);
                morton |= (octant as u128) << (3 * level);
                state = entry >> 3;
                if level == 0 {
                    break;
                }
                level -= 1;
            }
            shortcut.state[sign][j] = state as u8;
            shortcut.key_top[sign][j] = key;
            shortcut.morton_top[sign][j] = morton;
            j += 1;
        }
        sign += 1;
    }
    shortcut
};

/// Levels below the top whose bits, on every axis, only repeat the
/// opposite of the sign bit.
#[inline]
fn sign_extension_levels(c: Coord) -> u32 {
    magnitude_bits(c).leading_zeros() - 1
}

/// Per axis, `v ^ sign`, whose leading zeros less the sign bit are the
/// axis's sign-extension levels; ORed over the axes (and over coordinates,
/// in a batch), so that one count gives the minimum.
#[inline]
fn magnitude_bits(c: Coord) -> u32 {
    let magnitude = |v: i32| (v ^ (v >> 31)) as u32;
    magnitude(c.x) | magnitude(c.y) | magnitude(c.z)
}

/// The 96-bit Hilbert key of a coordinate. Like the Morton key it starts
/// from the order-preserving (sign-flipped) bits, so the key's top digit
/// says which octant around the origin the cell is in.
#[inline]
pub fn hilbert_key(c: Coord) -> u128 {
    let morton = morton_key(c);
    // Levels left after the sign level and the sign extension, in strides
    // of three (rounded up).
    let j = (31 - sign_extension_levels(c)).div_ceil(3);
    if j >= 10 {
        // Two copies of the strides: this one, with a constant count, is
        // unrolled.
        let entry = usize::from(ENCODE_TOP[(morton >> 90) as usize & 63]);
        return (((entry & 63) as u128) << 90) | run_strides(entry >> 6, 10, morton, &ENCODE_3);
    }
    let sign = (morton >> 93) as usize & 7;
    let state = usize::from(SHORTCUT.state[sign][j as usize]);
    SHORTCUT.key_top[sign][j as usize] | run_strides(state, j, morton, &ENCODE_3)
}

/// The coordinate of a key made by [`hilbert_key`]. Bits above 96 are
/// ignored.
#[inline]
pub fn hilbert_decode(key: u128) -> Coord {
    let key = key & super::KEY_MASK;
    // The top digit gives the signs; then count how many top digits match
    // the all-sign-extension pattern for them.
    let sign = usize::from(DECODE_1[(START_STATE << 3) | ((key >> 93) as usize & 7)] & 7);
    let matched_levels = ((key ^ SHORTCUT.key_top[sign][0]).leading_zeros() - 32) / 3;
    let j = (32 - matched_levels).div_ceil(3);
    let morton = if j >= 10 {
        // As in `hilbert_key`: a constant count, unrolled.
        let entry = usize::from(DECODE_TOP[(key >> 90) as usize & 63]);
        (((entry & 63) as u128) << 90) | run_strides(entry >> 6, 10, key, &DECODE_3)
    } else {
        let state = usize::from(SHORTCUT.state[sign][j as usize]);
        SHORTCUT.morton_top[sign][j as usize] | run_strides(state, j, key, &DECODE_3)
    };
    morton_decode(morton)
}

/// How many coordinates (or keys) the batch functions walk side by side.
/// One walk is a single chain of dependent loads (~7 cycles per step, 11
/// strides), which leaves the CPU mostly idle; interleaving independent walks
/// in one loop lets their loads overlap. Fewer (4) or more (12, 16) lanes
/// measured no faster; 8 fit x86-64's 16 registers at one word per lane.
const BATCH_LANES: usize = 8;

// A batch lane keeps the machine's state in the low five bits of its word.
const _: () = assert!(STATES <= 32, "batch lanes hold the state in five bits");

/// The three-level tables re-encoded for the batch walk
/// ([`run_strides_lanes`]), same index `state << 9 | three input digits`.
/// There a lane's whole walk is one `u64` word: the input digits still to
/// walk at the top, the output digits so far below them and the state in
/// the low five bits. A stride rotates the word left by nine, which brings
/// the next chunk to bits 0..=8 with the state above it: the word's low 14
/// bits are then the table index, and the entry is XORed into them to
/// replace the state with the next one (bits 0..=4) and the index's upper
/// nine bits with the output digits (bits 5..=13). That is one rotate, one
/// AND, one load and one XOR per stride, with one live register per lane;
/// the obvious form (separate state and bits, with masks and shifts, as in
/// [`run_strides`]) measured about half the speed in isolation.
const fn build_word(three: &[u16; THREE_ROWS * 512]) -> [u16; THREE_ROWS * 512] {
    let mut table = [0u16; THREE_ROWS * 512];
    let mut index = 0;
    while index < THREE_ROWS * 512 {
        let entry = three[index] as usize;
        let (digits, next) = (entry & 0x1ff, entry >> 9);
        table[index] = ((next ^ (index & 31)) | ((digits ^ (index >> 5)) << 5)) as u16;
        index += 1;
    }
    table
}

/// A [`build_word`] table with four spare entries after it, so that the
/// AVX-512 walk's gathers, which read eight bytes at an entry, stay inside
/// the static for every 14-bit index.
#[repr(C)]
struct WordTable {
    entries: [u16; THREE_ROWS * 512],
    tail: [u16; 4],
}

// The gathers' indices are 14 bits (`walk` masks them with 0x3fff), so the
// table must have an entry for each, or the reads would leave the static.
const _: () = assert!(THREE_ROWS * 512 >= 1 << 14);

static ENCODE_WORD: WordTable = WordTable {
    entries: build_word(&build_three(&ENCODE_1_TABLE)),
    tail: [0; 4],
};
static DECODE_WORD: WordTable = WordTable {
    entries: build_word(&build_three(&DECODE_1_TABLE)),
    tail: [0; 4],
};

/// [`run_strides`] for [`BATCH_LANES`] walks at once, all over the same
/// number of strides, with the same bit layout, ORed into `out`. The lanes'
/// strides are interleaved level by level, so that each level issues
/// independent loads (see [`build_word`] for the one-word lane). A word
/// holds at most six strides of input besides the state, so the walk is
/// split like [`run_strides`]: strides 9..=6 (bits 54..=89), then 5..=0.
#[inline(always)]
fn run_strides_lanes(
    state: &[usize; BATCH_LANES],
    strides: u32,
    input: &[u128; BATCH_LANES],
    table: &[u16; THREE_ROWS * 512],
    out: &mut [u128; BATCH_LANES],
) {
    debug_assert!(strides <= 10);
    let mut word = [0u64; BATCH_LANES];
    for lane in 0..BATCH_LANES {
        word[lane] = (state[lane] & 31) as u64;
    }
    // Near the origin (six strides or fewer) there is no upper part to walk.
    if strides > 6 {
        let hi_strides = strides - 6;
        for lane in 0..BATCH_LANES {
            word[lane] |= ((input[lane] >> 54) as u64) << (64 - 9 * hi_strides);
        }
        walk_lanes(&mut word, hi_strides, table);
    }
    let lo_strides = strides.min(6);
    for lane in 0..BATCH_LANES {
        if strides > 6 {
            out[lane] |= u128::from(word[lane] >> 5) << 54;
        }
        // Two shifts, as the count can be 64 (no strides).
        let digits = ((input[lane] as u64) << 1) << (63 - 9 * lo_strides);
        word[lane] = digits | (word[lane] & 31);
    }
    walk_lanes(&mut word, lo_strides, table);
    for lane in 0..BATCH_LANES {
        out[lane] |= u128::from(word[lane] >> 5);
    }
}

/// [`run_strides_lanes`] for all ten strides (after [`ENCODE_TOP`] or
/// [`DECODE_TOP`]), the usual case away from the origin: the words laid
/// out by constant shifts, not the general case's variable ones (measured
/// ~10 % faster).
#[inline(always)]
fn run_ten_strides_lanes(
    state: &[usize; BATCH_LANES],
    input: &[u128; BATCH_LANES],
    table: &[u16; THREE_ROWS * 512],
    out: &mut [u128; BATCH_LANES],
) {
    let mut word = [0u64; BATCH_LANES];
    for lane in 0..BATCH_LANES {
        word[lane] = (((input[lane] >> 54) as u64) << 28) | (state[lane] & 31) as u64;
    }
    walk_lanes(&mut word, 4, table);
    for lane in 0..BATCH_LANES {
        out[lane] |= u128::from(word[lane] >> 5) << 54;
        word[lane] = ((input[lane] as u64) << 10) | (word[lane] & 31);
    }
    walk_lanes(&mut word, 6, table);
    for lane in 0..BATCH_LANES {
        out[lane] |= u128::from(word[lane] >> 5);
    }
}

/// `count` strides of each lane's word (see [`build_word`]).
#[inline(always)]
fn walk_lanes(word: &mut [u64; BATCH_LANES], count: u32, table: &[u16; THREE_ROWS * 512]) {
    for _ in 0..count {
        for w in word.iter_mut() {
            let turned = w.rotate_left(9);
            *w = turned ^ u64::from(table[(turned & 0x3fff) as usize]);
        }
    }
}

/// [`hilbert_key`] of [`BATCH_LANES`] coordinates, whose Morton keys
/// `out` holds on entry (see [`hilbert_keys`]). The lanes share one
/// stride count, the largest any of them needs: a lane that needs fewer
/// starts from the short cut for more sign-extension levels than it has,
/// which is the same walk (its levels there are sign extension too).
#[inline(always)]
fn hilbert_key_lanes(coords: &[Coord; BATCH_LANES], out: &mut [u128; BATCH_LANES]) {
    let morton = *out;
    let mut magnitudes = 0u32;
    for c in coords {
        magnitudes |= magnitude_bits(*c);
    }
    let j = (32 - magnitudes.leading_zeros()).div_ceil(3);
    let mut state = [0usize; BATCH_LANES];
    if j >= 10 {
        for lane in 0..BATCH_LANES {
            let entry = usize::from(ENCODE_TOP[(morton[lane] >> 90) as usize & 63]);
            out[lane] = ((entry & 63) as u128) << 90;
            state[lane] = entry >> 6;
        }
        run_ten_strides_lanes(&state, &morton, &ENCODE_WORD.entries, out);
    } else {
        for lane in 0..BATCH_LANES {
            let sign = (morton[lane] >> 93) as usize & 7;
            out[lane] = SHORTCUT.key_top[sign][j as usize];
            state[lane] = usize::from(SHORTCUT.state[sign][j as usize]);
        }
        run_strides_lanes(&state, j, &morton, &ENCODE_WORD.entries, out);
    }
}

/// The Morton keys of [`hilbert_decode`] of [`BATCH_LANES`] keys (see
/// [`hilbert_decode_many`]), sharing one stride count as
/// in [`hilbert_key_lanes`]: a key whose top digits match the short cut's
/// walk for more levels than the shared count needs starts from the short
/// cut for that count, whose digits it also matches.
#[inline(always)]
fn hilbert_decode_lanes(keys: &[u128; BATCH_LANES], morton: &mut [u128; BATCH_LANES]) {
    let mut key = [0u128; BATCH_LANES];
    let mut sign = [0usize; BATCH_LANES];
    let mut matched_levels = 32;
    for lane in 0..BATCH_LANES {
        key[lane] = keys[lane] & super::KEY_MASK;
        sign[lane] =
            usize::from(DECODE_1[(START_STATE << 3) | ((key[lane] >> 93) as usize & 7)] & 7);
        matched_levels = matched_levels
            .min(((key[lane] ^ SHORTCUT.key_top[sign[lane]][0]).leading_zeros() - 32) / 3);
    }
    let j = (32 - matched_levels).div_ceil(3);
    let mut state = [0usize; BATCH_LANES];
    if j >= 10 {
        for lane in 0..BATCH_LANES {
            let entry = usize::from(DECODE_TOP[(key[lane] >> 90) as usize & 63]);
            morton[lane] = ((entry & 63) as u128) << 90;
            state[lane] = entry >> 6;
        }
        run_ten_strides_lanes(&state, &key, &DECODE_WORD.entries, morton);
    } else {
        for lane in 0..BATCH_LANES {
            morton[lane] = SHORTCUT.morton_top[sign[lane]][j as usize];
            state[lane] = usize::from(SHORTCUT.state[sign[lane]][j as usize]);
        }
        run_strides_lanes(&state, j, &key, &DECODE_WORD.entries, morton);
    }
}

/// The batch walks with AVX-512, where the CPU has it (`hilbert/avx512.rs`).
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Keys decoded per block by [`hilbert_decode_many`]: its Morton keys
/// wait in a stack buffer of this many (4 KiB).
const DECODE_BLOCK: usize = 256;

/// [`hilbert_key`] of every coordinate in `coords`, into `out` (same
/// length): bit-identical, but about twice the throughput for long slices
/// (`docs/curve-bakeoff.md`), because [`BATCH_LANES`] independent walks run
/// interleaved instead of one dependent chain at a time. With AVX-512
/// (`avx512`) it walks blocks in vector lanes instead: about 1.3 times the
/// scalar lanes' throughput with gathers, 3 times with VBMI and GFNI. For
/// bulk loads and scans.
///
/// Two passes, all the Morton keys first (into `out`), then the walks, so
/// that the walk loop holds no out-of-line call (the Morton step's BMI2
/// function) to spill the lanes around; the vector path takes them a
/// block at a time, as nothing is live between its blocks.
///
/// # Panics
///
/// If `coords` and `out` differ in length.
pub fn hilbert_keys(coords: &[Coord], out: &mut [u128]) {
    hilbert_keys_with(coords, out, Walk::Fastest);
}

/// Which batch walks may be used: all that the CPU has, or (so that tests
/// reach each of them on any CPU) not the byte lanes, or only the portable
/// one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    Fastest,
    // Only tests ask for it.
    #[cfg_attr(not(test), allow(dead_code))]
    Gathers,
    Portable,
}

/// [`hilbert_keys`] with the walks that `walk` allows.
fn hilbert_keys_with(coords: &[Coord], out: &mut [u128], walk: Walk) {
    assert_eq!(coords.len(), out.len(), "one key per coordinate");
    #[cfg(target_arch = "x86_64")]
    let done = if walk == Walk::Portable {
        0
    } else {
        avx512::try_keys(coords, out, walk == Walk::Fastest)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = walk;
        0
    };
    let (coords, out) = (&coords[done..], &mut out[done..]);
    let (coord_groups, coord_rest) = coords.as_chunks::<BATCH_LANES>();
    let (key_groups, key_rest) = out.as_chunks_mut::<BATCH_LANES>();
    let grouped = coord_groups.len() * BATCH_LANES;
    morton_keys(&coords[..grouped], key_groups.as_flattened_mut());
    for (group, keys) in coord_groups.iter().zip(key_groups) {
        hilbert_key_lanes(group, keys);
    }
    for (c, key) in coord_rest.iter().zip(key_rest) {
        *key = hilbert_key(*c);
    }
}

/// [`hilbert_decode`] of every key in `keys`, into `out` (same length):
/// bit-identical, batched like [`hilbert_keys`] (the walks of a block,
/// then its Morton decodes).
///
/// # Panics
///
/// If `keys` and `out` differ in length.
pub fn hilbert_decode_many(keys: &[u128], out: &mut [Coord]) {
    hilbert_decode_many_with(keys, out, Walk::Fastest);
}

/// [`hilbert_decode_many`] with the walks that `walk` allows (there are
/// no byte lanes for decoding).
fn hilbert_decode_many_with(keys: &[u128], out: &mut [Coord], walk: Walk) {
    assert_eq!(keys.len(), out.len(), "one coordinate per key");
    let mut morton = [[0u128; BATCH_LANES]; DECODE_BLOCK / BATCH_LANES];
    for (block, coords) in keys.chunks(DECODE_BLOCK).zip(out.chunks_mut(DECODE_BLOCK)) {
        let (key_groups, key_rest) = block.as_chunks::<BATCH_LANES>();
        let morton = &mut morton[..key_groups.len()];
        #[cfg(target_arch = "x86_64")]
        let done = if walk != Walk::Portable {
            avx512::try_decode(key_groups.as_flattened(), morton.as_flattened_mut()) / BATCH_LANES
        } else {
            0
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = {
            let _ = walk;
            0
        };
        for (group, m) in key_groups.iter().zip(morton.iter_mut()).skip(done) {
            hilbert_decode_lanes(group, m);
        }
        let (coords, coord_rest) = coords.split_at_mut(BATCH_LANES * key_groups.len());
        morton_decode_many(morton.as_flattened(), coords);
        for (c, key) in coord_rest.iter_mut().zip(key_rest) {
            *c = hilbert_decode(*key);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Skilling's `AxestoTranspose` followed by the interleave, written out
    /// as published (for n = 3, b = 32), as the reference.
    fn skilling_key(c: Coord) -> u128 {
        let flip = |v: i32| (v as u32) ^ 0x8000_0000;
        let mut x = [flip(c.x), flip(c.y), flip(c.z)];
        let m: u32 = 1 << 31;
        let mut q = m;
        while q > 1 {
            let p = q - 1;
            for i in 0..3 {
                if x[i] & q != 0 {
                    x[0] ^= p;
                } else {
                    let t = (x[0] ^ x[i]) & p;
                    x[0] ^= t;
                    x[i] ^= t;
                }
            }
            q >>= 1;
        }
        x[1] ^= x[0];
        x[2] ^= x[1];
        let mut t = 0;
        let mut q = m;
        while q > 1 {
            if x[2] & q != 0 {
                t ^= q - 1;
            }
            q >>= 1;
        }
        for v in &mut x {
            *v ^= t;
        }
        let unflip = |v: u32| (v ^ 0x8000_0000) as i32;
        morton_key(Coord::new(unflip(x[0]), unflip(x[1]), unflip(x[2])))
    }

    #[test]
    fn the_machine_has_the_expected_states() {
        assert_eq!(STATES, 24);
        // 32 rows of 512 entries, of which the 24 used (24 KiB) fit in L1.
        assert_eq!(std::mem::size_of_val(&ENCODE_3), 32 * 1024);
        assert_eq!(STATES * 512 * 2, 24 * 1024, "fits in L1");
    }

    #[test]
    fn matches_skilling_on_edge_values() {
        let samples = [
            0,
            1,
            -1,
            2,
            -2,
            7,
            -8,
            1000,
            i32::MIN,
            i32::MAX,
            0x5555_5555,
        ];
        for &x in &samples {
            for &y in &samples {
                for &z in &samples {
                    let c = Coord::new(x, y, z);
                    assert_eq!(hilbert_key(c), skilling_key(c), "{c}");
                    assert_eq!(hilbert_decode(hilbert_key(c)), c, "{c}");
                }
            }
        }
    }

    /// Every cell of a small cube around the origin round-trips, and within
    /// an aligned 8x8x8 block the keys are exactly 512 consecutive numbers
    /// whose cells form one unbroken path of unit steps.
    #[test]
    fn exhaustive_small_cubes_round_trip_and_walk_in_unit_strides() {
        for base in [
            Coord::new(0, 0, 0),
            Coord::new(-8, -8, -8),
            Coord::new(8, -16, 24),
        ] {
            let mut keys: Vec<(u128, Coord)> = Vec::new();
            for x in 0..8 {
                for y in 0..8 {
                    for z in 0..8 {
                        let c = Coord::new(base.x + x, base.y + y, base.z + z);
                        let key = hilbert_key(c);
                        assert_eq!(hilbert_decode(key), c);
                        keys.push((key, c));
                    }
                }
            }
            keys.sort();
            for pair in keys.windows(2) {
                assert_eq!(pair[1].0, pair[0].0 + 1, "aligned block is one key range");
                let (a, b) = (pair[0].1, pair[1].1);
                let step = (a.x - b.x).abs() + (a.y - b.y).abs() + (a.z - b.z).abs();
                assert_eq!(step, 1, "{a} -> {b}");
            }
        }
        for x in -4..4 {
            for y in -4..4 {
                for z in -4..4 {
                    let c = Coord::new(x, y, z);
                    assert_eq!(hilbert_decode(hilbert_key(c)), c);
                }
            }
        }
    }

    /// The fast paths switch on how many top levels are sign extension
    /// (a table for the top two levels, or the short cut, then 1..=10
    /// three-level strides split over two `u64` halves). Every magnitude
    /// boundary, on every axis and sign, against the reference.
    #[test]
    fn every_stride_count_and_sign_matches_skilling() {
        let mut values = vec![0, -1, i32::MIN, i32::MAX];
        for bit in 0..31 {
            let p = 1i32 << bit;
            values.extend([p, p - 1, -p, -p - 1, p | 1, -(p | 1)]);
        }
        let others = [0, -1, 5, -6, i32::MIN, i32::MAX];
        for &v in &values {
            for &o in &others {
                for c in [
                    Coord::new(v, o, o),
                    Coord::new(o, v, o),
                    Coord::new(o, o, v),
                    Coord::new(v, v, v),
                ] {
                    let key = hilbert_key(c);
                    assert_eq!(key, skilling_key(c), "{c}");
                    assert_eq!(hilbert_decode(key), c, "{c}");
                    // Bits above 96 are ignored.
                    assert_eq!(hilbert_decode(key | (0xabcd << 100)), c, "{c}");
                }
            }
        }
    }

    /// [`hilbert_keys`] and [`hilbert_decode_many`] against the scalar
    /// functions, element by element, and the decode round trip.
    /// Every walk (those the CPU has).
    fn assert_batch_matches_scalar(coords: &[Coord]) {
        for walk in [Walk::Fastest, Walk::Gathers, Walk::Portable] {
            let mut keys = vec![0u128; coords.len()];
            hilbert_keys_with(coords, &mut keys, walk);
            for (c, key) in coords.iter().zip(&keys) {
                assert_eq!(*key, hilbert_key(*c), "{c}");
            }
            let mut back = vec![Coord::new(0, 0, 0); coords.len()];
            hilbert_decode_many_with(&keys, &mut back, walk);
            assert_eq!(back, coords);
            // Bits above 96 are ignored, as by `hilbert_decode`.
            let dirty: Vec<u128> = keys.iter().map(|k| k | (0xabcd << 100)).collect();
            hilbert_decode_many_with(&dirty, &mut back, walk);
            assert_eq!(back, coords);
        }
    }

    #[test]
    fn batch_matches_scalar_on_a_small_cube() {
        let mut coords = Vec::new();
        for x in -8..8 {
            for y in -8..8 {
                for z in -8..8 {
                    coords.push(Coord::new(x, y, z));
                }
            }
        }
        assert_batch_matches_scalar(&coords);
        // Every length up to a few groups, so every remainder and every
        // mix of short-cut depths within a group.
        for len in 0..=3 * BATCH_LANES + 1 {
            assert_batch_matches_scalar(&coords[coords.len() / 2 - 3..][..len]);
        }
    }

    /// Every magnitude boundary (as in the scalar test above), with the
    /// group's shared stride count set by its largest member.
    #[test]
    fn batch_matches_scalar_near_the_limits_and_at_every_stride_count() {
        let mut values = vec![0, -1, 1, i32::MIN, i32::MIN + 1, i32::MAX, i32::MAX - 1];
        for bit in 0..31 {
            let p = 1i32 << bit;
            values.extend([p, p - 1, -p, -p - 1]);
        }
        let mut coords = Vec::new();
        for &v in &values {
            for &o in &[0, -1, 5, i32::MIN, i32::MAX] {
                coords.extend([
                    Coord::new(v, o, o),
                    Coord::new(o, v, o),
                    Coord::new(o, o, v),
                ]);
            }
            coords.push(Coord::new(v, v, v));
        }
        assert_batch_matches_scalar(&coords);
        // Groups (and vector blocks) that are all small but one, at each
        // position.
        let block = 64;
        #[cfg(target_arch = "x86_64")]
        assert!(block >= avx512::LANES.max(avx512::bytes::LANES));
        for far in 0..block {
            let mut group = vec![Coord::new(3, -2, 1); block];
            group[far] = Coord::new(i32::MIN, 7, i32::MAX);
            assert_batch_matches_scalar(&group);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any lengths (remainders included), full-range coordinates mixed
        /// with small ones (so groups mix short-cut depths).
        #[test]
        fn batch_matches_scalar_everywhere(
            coords in prop::collection::vec((any::<i32>(), any::<i32>(), any::<i32>(), 0u32..32), 0..100),
        ) {
            let coords: Vec<Coord> = coords
                .into_iter()
                .map(|(x, y, z, shift)| Coord::new(x >> shift, y >> shift, z >> shift))
                .collect();
            assert_batch_matches_scalar(&coords);
        }

        /// Any keys, decoded in a batch, equal the scalar decode.
        #[test]
        fn batch_decode_matches_scalar(keys in prop::collection::vec(any::<u128>(), 0..40)) {
            let mut coords = vec![Coord::new(0, 0, 0); keys.len()];
            hilbert_decode_many(&keys, &mut coords);
            for (key, c) in keys.iter().zip(&coords) {
                prop_assert_eq!(*c, hilbert_decode(*key));
            }
        }

        /// Near the origin the short cut is taken; every magnitude of
        /// sign extension must agree with the reference.
        #[test]
        fn short_cut_matches_skilling(shift in 0u32..31, x: i32, y: i32, z: i32) {
            let c = Coord::new(x >> shift, y >> shift, z >> shift);
            prop_assert_eq!(hilbert_key(c), skilling_key(c));
            prop_assert_eq!(hilbert_decode(hilbert_key(c)), c);
        }

        #[test]
        fn round_trips_and_matches_skilling_everywhere(x: i32, y: i32, z: i32) {
            let c = Coord::new(x, y, z);
            prop_assert_eq!(hilbert_key(c), skilling_key(c));
            prop_assert_eq!(hilbert_decode(hilbert_key(c)), c);
        }

        /// The defining property: consecutive keys are lattice neighbours,
        /// anywhere on the 96-bit curve.
        #[test]
        fn consecutive_keys_are_neighbours(key in 0u128..(1u128 << 96) - 1) {
            let (a, b) = (hilbert_decode(key), hilbert_decode(key + 1));
            let step = (i64::from(a.x) - i64::from(b.x)).abs()
                + (i64::from(a.y) - i64::from(b.y)).abs()
                + (i64::from(a.z) - i64::from(b.z)).abs();
            prop_assert_eq!(step, 1, "{} -> {}", a, b);
            prop_assert_eq!(hilbert_key(a), key);
        }
    }
}

#[cfg(test)]
/// Every batch length around the vector blocks, through every walk.
mod batch_lengths {
    use super::*;

    fn xorshift(seed: u64, len: usize, shift_mix: bool) -> Vec<Coord> {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            s.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        (0..len)
            .map(|_| {
                let r = next();
                let sh = if shift_mix { (r % 32) as u32 } else { 0 };
                Coord::new(
                    (next() as i32) >> sh,
                    (next() as i32) >> sh,
                    (next() as i32) >> sh,
                )
            })
            .collect()
    }

    /// Every length around the vector blocks (32 gathers, 64 bytes) and the
    /// decode block (256), every walk, arbitrary u128 keys for decode.
    #[test]
    fn every_length_every_walk_agrees_with_the_single_key_functions() {
        let mut lens: Vec<usize> = (0..=200).collect();
        lens.extend([255, 256, 257, 287, 288, 289, 511, 512, 513, 1000]);
        for &len in &lens {
            let coords = xorshift(len as u64 + 7, len, true);
            for walk in [Walk::Fastest, Walk::Gathers, Walk::Portable] {
                let mut keys = vec![0u128; len];
                hilbert_keys_with(&coords, &mut keys, walk);
                for (c, k) in coords.iter().zip(&keys) {
                    assert_eq!(*k, hilbert_key(*c), "len {len} {c}");
                }
                let noisy: Vec<u128> = keys
                    .iter()
                    .enumerate()
                    .map(|(i, k)| k | ((i as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15) << 96))
                    .collect();
                let mut back = vec![Coord::new(0, 0, 0); len];
                hilbert_decode_many_with(&noisy, &mut back, walk);
                assert_eq!(back, coords, "len {len}");
            }
        }
    }
}
