//! The core's only randomness: a seeded SplitMix64 kept in the state, so one seed reproduces a
//! whole run (jitter included).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prng {
    state: u64,
}

impl Prng {
    pub fn new(seed: u64) -> Prng {
        Prng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=max` (tiny modulo bias is irrelevant for jitter).
    pub fn up_to(&mut self, max: u64) -> u64 {
        if max == u64::MAX { self.next_u64() } else { self.next_u64() % (max + 1) }
    }
}

/// Exponential backoff with jitter: `min * 2^attempt`, capped at `max`, then up to a quarter
/// taken off at random so a fleet that failed together does not retry in step (even at the cap).
pub fn backoff_ms(attempt: u32, delay_ms_min: u64, delay_ms_max: u64, prng: &mut Prng) -> u64 {
    let base = delay_ms_min.saturating_mul(1u64 << attempt.min(30)).min(delay_ms_max);
    base - prng.up_to(base / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let (mut a, mut b) = (Prng::new(7), Prng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Prng::new(7).next_u64(), Prng::new(8).next_u64());
    }

    #[test]
    fn backoff_doubles_from_1s_to_5min_with_bounded_jitter() {
        let mut p = Prng::new(1);
        for attempt in 0..40 {
            let base = (1000u64 << attempt.min(30)).min(300_000);
            for _ in 0..50 {
                let d = backoff_ms(attempt, 1000, 300_000, &mut p);
                assert!(d <= base && d >= base - base / 4, "attempt {attempt}: {d}");
            }
        }
        // At the cap the delays still spread out.
        let spread: std::collections::BTreeSet<u64> = (0..50).map(|_| backoff_ms(30, 1000, 300_000, &mut p)).collect();
        assert!(spread.len() > 10);
    }
}
