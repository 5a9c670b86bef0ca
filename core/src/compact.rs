//! Compact forms for what every model's record holds (README, "bytes per model"): an
//! `Option` of a one-word value takes two words; `WordOption` takes one.

use std::fmt;
use std::marker::PhantomData;

use crate::machine::EffectId;
use crate::time::Instant;

/// A value held in one `u64`, of which `u64::MAX` is never one (`WordOption`'s none).
pub trait Word: Copy {
    fn to_word(self) -> u64;
    fn from_word(word: u64) -> Self;
}

/// An instant 584 million years on is one millisecond earlier: `Instant(u64::MAX)` (a
/// saturated `plus_ms`) is kept as the instant before it, never as none.
impl Word for Instant {
    fn to_word(self) -> u64 {
        self.0.min(u64::MAX - 1)
    }
    fn from_word(word: u64) -> Self {
        Instant(word)
    }
}

/// Effect ids count up from one, one per effect: `u64::MAX` is never reached.
impl Word for EffectId {
    fn to_word(self) -> u64 {
        debug_assert!(self.0 != u64::MAX, "an effect id at the counter's end");
        self.0
    }
    fn from_word(word: u64) -> Self {
        EffectId(word)
    }
}

/// `Option<T>` in one word.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct WordOption<T: Word> {
    word: u64,
    of: PhantomData<T>,
}

impl<T: Word> WordOption<T> {
    pub const NONE: Self = WordOption { word: u64::MAX, of: PhantomData };

    pub fn new(value: Option<T>) -> Self {
        WordOption { word: value.map_or(u64::MAX, T::to_word), of: PhantomData }
    }

    #[inline]
    pub fn get(self) -> Option<T> {
        (self.word != u64::MAX).then(|| T::from_word(self.word))
    }

    #[inline]
    pub fn is_some(self) -> bool {
        self.word != u64::MAX
    }

    #[inline]
    pub fn is_none(self) -> bool {
        self.word == u64::MAX
    }

    #[inline]
    pub fn is_some_and(self, f: impl FnOnce(T) -> bool) -> bool {
        self.get().is_some_and(f)
    }
}

impl<T: Word> From<Option<T>> for WordOption<T> {
    fn from(value: Option<T>) -> Self {
        WordOption::new(value)
    }
}

impl<T: Word + fmt::Debug> fmt::Debug for WordOption<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_round_trips_and_none_stays_none() {
        for ms in [0, 1, 1_000, u64::MAX - 2, u64::MAX - 1] {
            assert_eq!(WordOption::new(Some(Instant(ms))).get(), Some(Instant(ms)));
        }
        assert_eq!(WordOption::<Instant>::new(None).get(), None);
        assert_eq!(WordOption::<Instant>::NONE, WordOption::new(None));
        assert_eq!(WordOption::new(Some(EffectId(7))).get(), Some(EffectId(7)));
        assert!(WordOption::new(Some(EffectId(0))).is_some() && WordOption::<EffectId>::NONE.is_none());
    }

    #[test]
    fn a_saturated_instant_is_kept_as_the_one_before_it_not_as_none() {
        let far = Instant(5).plus_ms(u64::MAX);
        assert_eq!(far, Instant(u64::MAX));
        assert_eq!(WordOption::new(Some(far)).get(), Some(Instant(u64::MAX - 1)));
    }

    #[test]
    fn it_takes_one_word() {
        assert_eq!(std::mem::size_of::<WordOption<Instant>>(), 8);
        assert_eq!(std::mem::size_of::<Option<Instant>>(), 16);
    }
}
