//! Time as data. The core never reads a clock: every input comes with `now`.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Milliseconds since an epoch the shell chooses (process start, or virtual time in the
/// simulator). Monotonic by contract: inputs carry non-decreasing instants.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Instant(pub u64);

impl Instant {
    pub const ZERO: Instant = Instant(0);

    pub fn from_ms(ms: u64) -> Instant {
        Instant(ms)
    }

    pub fn as_ms(self) -> u64 {
        self.0
    }

    pub fn plus_ms(self, ms: u64) -> Instant {
        Instant(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`, zero if `earlier` is later.
    pub fn ms_since(self, earlier: Instant) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}
