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
//! in `region.rs` use the one-level tables.

use cube_protocol::Coord;

use super::morton::{morton_decode, morton_key};

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

/// Runs `steps` (at most 10) three-level steps of the machine from `state`
/// over the low `9 * steps` bits of `input` (a 96-bit string of octal
/// digits), top first, and returns their output in the same bits. The
/// loads form one dependent chain, so this is where the time goes; the
/// rest is kept to constant shifts on `u64` halves (steps 9..=6 are bits
/// 54..=89, steps 5..=0 bits 0..=53), each half left-aligned so that the
/// next chunk is always its top nine bits.
#[inline(always)]
fn run_steps(state: usize, steps: u32, input: u128, three: &[u16; THREE_ROWS * 512]) -> u128 {
    debug_assert!(steps <= 10);
    let hi_steps = steps.saturating_sub(6);
    let lo_steps = steps - hi_steps;
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
        ((input >> 54) as u64).unbounded_shl(64 - 9 * hi_steps),
        hi_steps,
    );
    let lo = half((input as u64).unbounded_shl(64 - 9 * lo_steps), lo_steps);
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
/// take `j` table steps instead of 12: 5 dependent loads instead of 12 for
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
    // Per axis, the leading zeros of `v ^ sign` less the sign bit; the
    // minimum over the axes is that of their OR (one count, not three).
    let magnitude = |v: i32| (v ^ (v >> 31)) as u32;
    (magnitude(c.x) | magnitude(c.y) | magnitude(c.z)).leading_zeros() - 1
}

/// The 96-bit Hilbert key of a coordinate. Like the Morton key it starts
/// from the order-preserving (sign-flipped) bits, so the key's top digit
/// says which octant around the origin the cell is in.
#[inline]
pub fn hilbert_key(c: Coord) -> u128 {
    let morton = morton_key(c);
    // Levels left after the sign level and the sign extension, in steps
    // of three (rounded up).
    let j = (31 - sign_extension_levels(c)).div_ceil(3);
    if j >= 10 {
        // Two copies of the steps: this one, with a constant count, is
        // unrolled.
        let entry = usize::from(ENCODE_TOP[(morton >> 90) as usize & 63]);
        return (((entry & 63) as u128) << 90) | run_steps(entry >> 6, 10, morton, &ENCODE_3);
    }
    let sign = (morton >> 93) as usize & 7;
    let state = usize::from(SHORTCUT.state[sign][j as usize]);
    SHORTCUT.key_top[sign][j as usize] | run_steps(state, j, morton, &ENCODE_3)
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
        (((entry & 63) as u128) << 90) | run_steps(entry >> 6, 10, key, &DECODE_3)
    } else {
        let state = usize::from(SHORTCUT.state[sign][j as usize]);
        SHORTCUT.morton_top[sign][j as usize] | run_steps(state, j, key, &DECODE_3)
    };
    morton_decode(morton)
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
    fn exhaustive_small_cubes_round_trip_and_walk_in_unit_steps() {
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
    /// three-level steps split over two `u64` halves). Every magnitude
    /// boundary, on every axis and sign, against the reference.
    #[test]
    fn every_step_count_and_sign_matches_skilling() {
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

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
