//! A small seeded pseudo-random generator (SplitMix64): reproducible runs
//! with `--seed`, no dependency, and a few nanoseconds per draw so the
//! driver measures the target, not itself.

#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// A generator for one of several threads sharing a run seed: streams
    /// of different `stream` values do not overlap in practice.
    pub fn for_stream(seed: u64, stream: u64) -> Rng {
        let mut mixer = Rng::new(seed ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        Rng::new(mixer.next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// Uniform in `0..bound`; `bound` must be positive.
    pub fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// True with probability `p` (clamped to 0..=1).
    pub fn chance(&mut self, p: f64) -> bool {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        unit < p
    }
}

/// The SplitMix64 finalizer: a good 64-bit hash of `z`.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = Rng::for_stream(7, 3);
        let mut b = Rng::for_stream(7, 3);
        let mut c = Rng::for_stream(7, 4);
        let a: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let b: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        let c: Vec<u64> = (0..4).map(|_| c.next_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut rng = Rng::new(1);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let v = rng.below(5);
            assert!(v < 5);
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn chance_is_roughly_p() {
        let mut rng = Rng::new(2);
        let hits = (0..10_000).filter(|_| rng.chance(0.9)).count();
        assert!((8_800..9_200).contains(&hits), "{hits}");
        assert!(!(0..1000).any(|_| rng.chance(0.0)));
        assert!((0..1000).all(|_| rng.chance(1.0)));
    }
}
