//! Randomized, truncated exponential backoff as a plain state machine: the CAS spinlock
//! retries a failed CAS after one ([`crate::cas`]), and DSLR clients back off from a lock
//! word whose counters are being reset ([`crate::dslr`], Yoon et al. SIGMOD'18, Appendix
//! A.3 "truncated binary exponential backoff").
//!
//! The `k`-th consecutive delay (`k = 0, 1, ...`) is drawn uniformly from
//! `[ceiling / 2, ceiling]` with `ceiling = min(cap, base * 2^k)`: the range doubles with
//! every failure until it reaches the cap, and the lower half-bound keeps retries from
//! collapsing to zero delay (which would turn the backoff into a spin). The random source
//! is seeded, so a run is reproducible given its seed.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Backoff policy: the first delay's ceiling and the largest ceiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct Backoff {
    /// Ceiling of the first delay (default 1 us). Must be nonzero.
    pub base: Duration,
    /// Largest ceiling any delay can reach (default 100 us). Must be `>= base`.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_micros(1),
            cap: Duration::from_micros(100),
        }
    }
}

impl Backoff {
    /// Check `0 < base <= cap`.
    pub fn validate(&self) -> Result<(), String> {
        if self.base.is_zero() {
            return Err("backoff base must be nonzero".into());
        }
        if self.base > self.cap {
            return Err(format!(
                "backoff base {:?} exceeds cap {:?}",
                self.base, self.cap
            ));
        }
        Ok(())
    }

    /// The ceiling of delay number `k` (0-based): `min(cap, base * 2^k)`, saturating.
    pub fn ceiling(&self, k: u32) -> Duration {
        let factor = 1u32.checked_shl(k.min(31)).unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// A backoff sequence with its own random source seeded by `seed`.
    pub fn start(&self, seed: u64) -> BackoffState {
        BackoffState {
            policy: *self,
            failures: 0,
            rng: SmallRng::seed_from_u64(seed),
        }
    }
}

/// One caller's position in a backoff sequence: how many consecutive failures so far and
/// its random source. Reset it after a success.
#[derive(Clone, Debug)]
pub struct BackoffState {
    policy: Backoff,
    failures: u32,
    rng: SmallRng,
}

impl BackoffState {
    /// The delay to wait after one more failure, in `[ceiling/2, ceiling]` of
    /// [`Backoff::ceiling`]`(failures before this one)`.
    pub fn next_delay(&mut self) -> Duration {
        let c = self.policy.ceiling(self.failures);
        self.failures = self.failures.saturating_add(1);
        let hi = u64::try_from(c.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.rng.random_range(hi / 2..=hi))
    }

    /// Consecutive failures since the start or the last [`Self::reset`].
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Back to the first delay (after a success); the random source keeps its state.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn delays_stay_within_doubling_ceilings_and_the_cap() {
        let p = Backoff {
            base: 2 * US,
            cap: 50 * US,
        };
        let mut s = p.start(7);
        let ceilings = [2, 4, 8, 16, 32, 50, 50, 50, 50];
        for (k, &c) in ceilings.iter().enumerate() {
            assert_eq!(p.ceiling(k as u32), c * US, "ceiling {k}");
            let d = s.next_delay();
            assert!(d <= c * US && d >= c * US / 2, "delay {k}: {d:?}");
        }
        assert_eq!(s.failures(), ceilings.len() as u32);
        s.reset();
        assert!(s.next_delay() <= 2 * US, "reset restarts at base");
        // Huge exponents saturate at the cap instead of overflowing.
        assert_eq!(p.ceiling(1000), 50 * US);
        let big = Backoff {
            base: Duration::from_secs(u64::MAX / 4),
            cap: Duration::MAX,
        };
        assert_eq!(big.ceiling(40), Duration::MAX);
    }

    #[test]
    fn same_seed_same_sequence() {
        let p = Backoff::default();
        let a: Vec<_> = {
            let mut s = p.start(42);
            (0..20).map(|_| s.next_delay()).collect()
        };
        let b: Vec<_> = {
            let mut s = p.start(42);
            (0..20).map(|_| s.next_delay()).collect()
        };
        let c: Vec<_> = {
            let mut s = p.start(43);
            (0..20).map(|_| s.next_delay()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn validation() {
        assert!(Backoff::default().validate().is_ok());
        assert!(Backoff {
            base: Duration::ZERO,
            cap: US
        }
        .validate()
        .is_err());
        assert!(Backoff {
            base: 2 * US,
            cap: US
        }
        .validate()
        .is_err());
    }
}
