//! The core's persistent collections, in one place so a change of library is one file.
//!
//! Hash maps (HAMTs) with a fixed hasher: a lookup hashes the key once instead of comparing
//! strings at every level of a B-tree, and iteration order is a pure function of the contents,
//! so runs stay deterministic. Wherever iteration order reaches an effect, the core sorts first.
//!
//! [`RunSet`], an ordered set for the timers, where a B-tree spent a thousand instructions on
//! each insertion and each removal of the smallest element.

use std::cmp::Ordering;
use std::fmt;

/// The shared pointer of the persistent collections (triomphe's `Arc`, through imbl): no weak
/// count, so a copy-on-write check is one load.
pub type Shared<T> = imbl::shared_ptr::SharedPointer<T, imbl::shared_ptr::DefaultSharedPtr>;

pub type Map<K, V> = imbl::GenericHashMap<K, V, rustc_hash::FxBuildHasher, imbl::shared_ptr::DefaultSharedPtr>;
pub type Set<K> = imbl::GenericHashSet<K, rustc_hash::FxBuildHasher, imbl::shared_ptr::DefaultSharedPtr>;

/// Elements per run; a full run splits in two, and a run under a quarter of this merges with a
/// neighbour that has room.
const RUN_MAX: usize = 32;

/// A persistent ordered set: sorted runs of at most `RUN_MAX` elements, each shared, in a
/// shared list. A clone is one reference count. A change copies the list (one pointer per run)
/// and the run it changes only when a clone still shares them, as when the simulator keeps the
/// previous state. The whole sequence is kept in descending order, so the smallest element is
/// the last of the last run: reading it is O(1) and taking it is a pop. Insertion and removal
/// are two binary searches and a move within one run.
#[derive(Clone)]
pub struct RunSet<T> {
    runs: Shared<Vec<Shared<Vec<T>>>>,
    len: usize,
}

impl<T> Default for RunSet<T> {
    fn default() -> Self {
        RunSet { runs: Shared::new(Vec::new()), len: 0 }
    }
}

impl<T: Ord + Clone> RunSet<T> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get_min(&self) -> Option<&T> {
        self.runs.last().and_then(|run| run.last())
    }

    /// In ascending order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.runs.iter().rev().flat_map(|run| run.iter().rev())
    }

    /// Where `x` is or would go: the run (`runs.len()` when `x` is smaller than every element)
    /// and the position in it.
    fn locate(&self, x: &T) -> (usize, usize) {
        // Runs are descending, and so are their last (smallest) elements.
        let run = self.runs.partition_point(|r| r.last().is_some_and(|last| last.cmp(x) == Ordering::Greater));
        let at = self.runs.get(run).map_or(0, |r| r.partition_point(|e| e.cmp(x) == Ordering::Greater));
        (run, at)
    }

    pub fn contains(&self, x: &T) -> bool {
        let (run, at) = self.locate(x);
        self.runs.get(run).and_then(|r| r.get(at)) == Some(x)
    }

    /// Adds `x`; false when it was there already.
    pub fn insert(&mut self, x: T) -> bool {
        // A new largest element goes first in the first run, without a search.
        let largest = self.runs.first().and_then(|r| r.first()).is_some_and(|max| x.cmp(max) == Ordering::Greater);
        let (run, at) = if largest { (0, 0) } else { self.locate(&x) };
        let runs = Shared::make_mut(&mut self.runs);
        let (run, at) = match runs.get(run) {
            Some(r) if r.get(at) == Some(&x) => return false,
            Some(_) => (run, at),
            // Smaller than everything: the end of the last run, or a first run.
            None if runs.is_empty() => {
                runs.push(Shared::new(vec![x]));
                self.len += 1;
                return true;
            }
            None => (runs.len() - 1, runs[runs.len() - 1].len()),
        };
        let elements = Shared::make_mut(&mut runs[run]);
        elements.insert(at, x);
        if elements.len() > RUN_MAX {
            let upper = elements.split_off(RUN_MAX / 2);
            runs.insert(run + 1, Shared::new(upper));
        }
        self.len += 1;
        true
    }

    /// Removes `x`; false when it was not there.
    pub fn remove(&mut self, x: &T) -> bool {
        let (run, at) = self.locate(x);
        if self.runs.get(run).and_then(|r| r.get(at)) != Some(x) {
            return false;
        }
        let runs = Shared::make_mut(&mut self.runs);
        Shared::make_mut(&mut runs[run]).remove(at);
        self.len -= 1;
        merge_small(runs, run);
        true
    }

    pub fn remove_min(&mut self) -> Option<T> {
        let runs = Shared::make_mut(&mut self.runs);
        let last = runs.len().checked_sub(1)?;
        let min = Shared::make_mut(&mut runs[last]).pop();
        self.len -= usize::from(min.is_some());
        merge_small(runs, last);
        min
    }
}

/// A run left empty goes; one under a quarter full joins its smaller neighbour if both fit in
/// one run, so the list stays within about four times the fewest runs.
fn merge_small<T: Clone>(runs: &mut Vec<Shared<Vec<T>>>, run: usize) {
    let len = runs[run].len();
    if len == 0 {
        runs.remove(run);
        return;
    }
    if len >= RUN_MAX / 4 || run + 1 >= runs.len() {
        return;
    }
    if len + runs[run + 1].len() <= RUN_MAX {
        let smaller = runs.remove(run + 1);
        Shared::make_mut(&mut runs[run]).extend(smaller.iter().cloned());
    }
}

impl<T: Ord + Clone + fmt::Debug> fmt::Debug for RunSet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prng::Prng;
    use std::collections::BTreeSet;

    /// Random inserts, removals and removals of the minimum agree with a `BTreeSet`, and a clone
    /// kept across the changes is left as it was.
    #[test]
    fn agrees_with_a_btree_set_and_clones_stay_unchanged() {
        for seed in 0..20 {
            let mut prng = Prng::new(seed);
            let range = 50 + prng.up_to(3_000);
            let (mut set, mut model) = (RunSet::new(), BTreeSet::new());
            let mut kept: Vec<(RunSet<u64>, Vec<u64>)> = Vec::new();
            for step in 0..5_000 {
                let x = prng.up_to(range);
                match prng.up_to(9) {
                    0..=4 => assert_eq!(set.insert(x), model.insert(x)),
                    5..=6 => assert_eq!(set.remove(&x), model.remove(&x)),
                    7 => assert_eq!(set.remove_min(), model.pop_first()),
                    _ => assert_eq!(set.contains(&x), model.contains(&x)),
                }
                assert_eq!(set.len(), model.len());
                assert_eq!(set.get_min(), model.first());
                if step % 500 == 0 {
                    kept.push((set.clone(), model.iter().copied().collect()));
                }
            }
            assert!(set.iter().copied().eq(model.iter().copied()), "seed {seed}");
            for (old, contents) in kept {
                assert!(old.iter().copied().eq(contents.iter().copied()), "seed {seed}: a clone changed");
            }
            assert!(set.runs.iter().all(|r| !r.is_empty() && r.len() <= RUN_MAX));
        }
    }

    #[test]
    fn many_elements_split_into_runs_and_drain_in_order() {
        let mut set = RunSet::new();
        for x in (0..10_000u64).rev().step_by(3).chain((0..10_000).step_by(7)) {
            set.insert(x);
        }
        assert!(set.runs.len() > 10_000 / 3 / RUN_MAX);
        let mut drained = Vec::new();
        while let Some(x) = set.remove_min() {
            drained.push(x);
        }
        let expected: BTreeSet<u64> = (0..10_000).filter(|x| x % 3 == 9_999 % 3 || x % 7 == 0).collect();
        assert_eq!(drained, expected.into_iter().collect::<Vec<_>>());
        assert!(set.is_empty() && set.runs.is_empty());
    }
}
