//! One exponential backoff for every retry loop: a step that doubles from a floor to a cap and
//! falls back to the floor on success, and the jitter that keeps a fleet from retrying in step.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// A retry delay that doubles after each failure, from `min` up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    /// A backoff whose first delay is `min` and whose delays never exceed `max`.
    pub const fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            step: min,
        }
    }

    /// The delay for this failure; the next one is twice as long, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.step;
        self.step = self.step.saturating_mul(2).min(self.max);
        delay
    }

    /// After a success: the next failure waits the floor again.
    pub fn reset(&mut self) {
        self.step = self.min;
    }

    /// The delay before retry `n` (from 1) of a fresh backoff: what [`Self::next_delay`]
    /// returns on its `n`-th call.
    pub fn nth(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(31);
        self.min.saturating_mul(1u32 << doublings).min(self.max)
    }
}

/// A uniform sample from `[0, 1)`, different on every call and in every process: std's
/// randomly keyed SipHash over nothing, so no random-number crate is needed for jitter.
pub fn jitter() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    // The top 53 bits fill an f64 mantissa exactly.
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// `d` stretched by up to a quarter, at random: nodes that failed together retry apart.
pub fn jittered(d: Duration) -> Duration {
    stretch(d, jitter())
}

/// `d` stretched by `jitter` (in `[0, 1)`) quarters: [`jittered`] with the sample given.
pub fn stretch(d: Duration, jitter: f64) -> Duration {
    d.mul_f64(1.0 + jitter / 4.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn doubles_to_the_cap_and_resets_to_the_floor() {
        let mut b = Backoff::new(s(1), s(5));
        let seen: Vec<Duration> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(seen, vec![s(1), s(2), s(4), s(5), s(5)]);
        b.reset();
        assert_eq!(b.next_delay(), s(1));
    }

    #[test]
    fn nth_is_the_nth_delay_of_a_fresh_backoff() {
        let fresh = Backoff::new(s(10), s(300));
        let mut b = fresh;
        for n in 1..=40 {
            assert_eq!(fresh.nth(n), b.next_delay(), "retry {n}");
        }
        assert_eq!(fresh.nth(0), s(10), "retry 0 is the first");
        assert_eq!(fresh.nth(u32::MAX), s(300), "no overflow past the cap");
    }

    #[test]
    fn jitter_is_uniform_enough() {
        let samples: Vec<f64> = (0..2000).map(|_| jitter()).collect();
        assert!(samples.iter().all(|j| (0.0..1.0).contains(j)));
        let low = samples.iter().filter(|j| **j < 0.5).count();
        // Binomial(2000, 0.5) has sd 22; 800..1200 fails only if the source is broken.
        assert!((800..1200).contains(&low), "{low} of 2000 below 0.5");
        let stretched = jittered(s(100));
        assert!((s(100)..=s(125)).contains(&stretched), "{stretched:?}");
    }
}
