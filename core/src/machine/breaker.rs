//! The blast-radius breaker (core.md, "Views, ordering and evidence"): when many models placed
//! here become candidates for withdrawal or cleanup at once, every destructive decision waits
//! for live evidence sent after a hold. A real mass delete completes later; a transient wipe of
//! the Node's labels does nothing.

use serde::{Deserialize, Serialize};

use super::io::Config;
use crate::time::Instant;

/// A Node view in which more than this share (percent) of the previous view's labels vanished
/// trips the breaker by itself: the signature of a wipe (node-feature-discovery #1802), which
/// the counts miss on a node with fewer models than `breaker_models_min`.
pub const NODE_LABELS_VANISHED_PERCENT: usize = 50;

/// Did more than `NODE_LABELS_VANISHED_PERCENT` of `before`'s labels vanish in `after`?
pub fn labels_wiped(
    before: &std::collections::BTreeMap<String, String>,
    after: &std::collections::BTreeMap<String, String>,
) -> Option<usize> {
    let vanished = before.keys().filter(|k| !after.contains_key(*k)).count();
    (vanished > 0 && vanished * 100 > NODE_LABELS_VANISHED_PERCENT * before.len()).then_some(vanished)
}

/// Candidates are counted in this many buckets spanning the window.
pub const BREAKER_BUCKETS: usize = 16;

/// A ring of candidate counts over the last `breaker_window_ms`, and the current hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breaker {
    /// (bucket number since the epoch, candidates counted in it).
    buckets: [(u64, u32); BREAKER_BUCKETS],
    /// Destructive decisions whose evidence was sent before this instant are held.
    pub hold_until: Option<Instant>,
    pub trips: u64,
    pub held: u64,
}

/// What counting candidates did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    Quiet,
    /// `placed`: the models placed here it was compared against.
    Tripped {
        candidates: u32,
        placed: u32,
        until: Instant,
    },
}

impl Breaker {
    fn bucket_ms(config: &Config) -> u64 {
        (config.breaker_window_ms / BREAKER_BUCKETS as u64).max(1)
    }

    /// Candidates counted within the window ending at `now`.
    pub fn in_window(&self, config: &Config, now: Instant) -> u32 {
        let current = now.as_ms() / Self::bucket_ms(config);
        let oldest = current.saturating_sub(BREAKER_BUCKETS as u64 - 1);
        self.buckets.iter().filter(|(n, _)| *n >= oldest && *n <= current).map(|(_, c)| *c).sum()
    }

    /// Count `candidates` new candidates at `now`, of `placed` models placed here; trip when
    /// the window's count crosses both thresholds.
    /// `placed` is asked only when `placed_at_most` (an upper bound, e.g. the records kept) could
    /// trip it: it costs O(models), and most steps with a candidate are nowhere near tripping.
    pub fn count(
        &mut self,
        config: &Config,
        now: Instant,
        candidates: u32,
        placed_at_most: u32,
        placed: impl FnOnce() -> u32,
    ) -> Count {
        if candidates == 0 {
            return Count::Quiet;
        }
        let current = now.as_ms() / Self::bucket_ms(config);
        let slot = &mut self.buckets[(current % BREAKER_BUCKETS as u64) as usize];
        if slot.0 != current {
            *slot = (current, 0);
        }
        slot.1 = slot.1.saturating_add(candidates);
        let count = self.in_window(config, now);
        let exceeds = |placed: u32| u64::from(count) * 100 > u64::from(config.breaker_percent) * u64::from(placed);
        // `exceeds` only falls as `placed` grows, so the bound is checked first, exactly.
        if count < config.breaker_models_min || !exceeds(placed_at_most) {
            return Count::Quiet;
        }
        let placed = placed();
        if !exceeds(placed) {
            return Count::Quiet;
        }
        let until = self.trip(config, now);
        Count::Tripped { candidates: count, placed, until }
    }

    /// Trip at `now` whatever the counts (a Node view that lost most of its labels at once).
    pub fn trip(&mut self, config: &Config, now: Instant) -> Instant {
        let until = now.plus_ms(config.breaker_hold_ms);
        self.hold_until = Some(self.hold_until.map_or(until, |h| h.max(until)));
        self.trips += 1;
        until
    }

    /// May a destructive decision based on evidence sent at `evidence_at` go ahead? `None` if
    /// so; else the instant from which fresh evidence counts.
    pub fn holds(&self, evidence_at: Instant) -> Option<Instant> {
        self.hold_until.filter(|h| evidence_at < *h)
    }

    /// Is a hold in force at `now` (for readiness' verbose output and metrics)?
    pub fn holding_at(&self, now: Instant) -> Option<Instant> {
        self.hold_until.filter(|h| now < *h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::new("n", "/m")
    }

    #[test]
    fn trips_only_above_both_the_fraction_and_the_minimum() {
        let c = config();
        let mut b = Breaker::default();
        // 4 of 8 is 50 % but under the minimum of 5.
        assert_eq!(b.count(&c, Instant(0), 4, 8, || 8), Count::Quiet);
        // 5 of 20 is exactly 25 %: not more than 25 %.
        let mut b2 = Breaker::default();
        assert_eq!(b2.count(&c, Instant(0), 5, 20, || 20), Count::Quiet);
        // 5 of 8 trips, holding for 5 minutes.
        assert_eq!(
            b.count(&c, Instant(1000), 1, 8, || 8),
            Count::Tripped { candidates: 5, placed: 8, until: Instant(301_000) }
        );
        assert_eq!(b.holds(Instant(300_999)), Some(Instant(301_000)));
        assert_eq!(b.holds(Instant(301_000)), None);
    }

    #[test]
    fn a_node_that_loses_most_of_its_labels_is_a_wipe() {
        let labels = |ks: &[&str]| ks.iter().map(|k| (k.to_string(), "v".to_string())).collect();
        assert_eq!(labels_wiped(&labels(&["a", "b", "c", "d"]), &labels(&[])), Some(4));
        assert_eq!(labels_wiped(&labels(&["a", "b", "c", "d"]), &labels(&["a", "b"])), None, "half is not more");
        assert_eq!(labels_wiped(&labels(&["a", "b", "c", "d"]), &labels(&["a"])), Some(3));
        assert_eq!(labels_wiped(&labels(&[]), &labels(&[])), None);
        assert_eq!(labels_wiped(&labels(&["a"]), &labels(&["a", "z"])), None, "additions never trip");
    }

    #[test]
    fn placed_is_counted_only_when_the_bound_could_trip() {
        let c = config();
        let mut b = Breaker::default();
        let never = || -> u32 { panic!("placed must not be counted: 5 of at most 1,000 cannot trip") };
        assert_eq!(b.count(&c, Instant(0), 5, 1_000, never), Count::Quiet);
        let mut asked = false;
        let counted = b.count(&c, Instant(0), 5, 12, || {
            asked = true;
            8
        });
        assert!(asked, "10 of at most 12 could trip: the real count decides");
        assert!(matches!(counted, Count::Tripped { candidates: 10, placed: 8, .. }), "{counted:?}");
    }

    #[test]
    fn the_window_forgets_old_candidates() {
        let c = config();
        let mut b = Breaker::default();
        b.count(&c, Instant(0), 4, 10, || 10);
        assert_eq!(b.in_window(&c, Instant(59_000)), 4);
        assert_eq!(b.in_window(&c, Instant(61_000)), 0);
        assert_eq!(b.count(&c, Instant(61_000), 4, 10, || 10), Count::Quiet);
    }
}
