//! The core's persistent collections, in one place so a change of library is one file.
//!
//! Hash maps (HAMTs) with a fixed hasher: a lookup hashes the key once instead of comparing
//! strings at every level of a B-tree, and iteration order is a pure function of the contents,
//! so runs stay deterministic. Wherever iteration order reaches an effect, the core sorts first.

pub type Map<K, V> = imbl::GenericHashMap<K, V, rustc_hash::FxBuildHasher, imbl::shared_ptr::DefaultSharedPtr>;
pub type Set<K> = imbl::GenericHashSet<K, rustc_hash::FxBuildHasher, imbl::shared_ptr::DefaultSharedPtr>;
