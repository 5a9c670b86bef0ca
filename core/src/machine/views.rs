//! Read-only views of the state, for the shell, the simulator, tests and logs.

use super::*;

/// A view of one incarnation, for tests, the simulator and logs.
#[derive(Clone, Debug, PartialEq)]
pub struct IncarnationView {
    pub key: ModelKey,
    pub uid: Uid,
    pub current: bool,
    pub life: Life,
    pub published: Published,
    pub fetched: Fetched,
    pub owned_dir: Option<String>,
    pub busy: bool,
}

impl State {
    // ------------------------------------------------------------------------------------------
    // Views
    // ------------------------------------------------------------------------------------------

    pub fn incarnations(&self) -> Vec<IncarnationView> {
        sorted(self.slots.keys().cloned().collect()).iter().flat_map(|key| views(key, &self.slots[key])).collect()
    }

    pub fn incarnation(&self, key: &ModelKey, uid: &Uid) -> Option<IncarnationView> {
        views(key, self.slots.get(key)?).find(|v| &v.uid == uid)
    }

    /// Where the incarnation's finished download went (its source and its directory beneath
    /// the models root), borrowed: the simulator checks it at every Ready publish, where a
    /// view would copy the record.
    pub fn fetched_into(&self, key: &ModelKey, uid: &Uid) -> Option<(&str, &str)> {
        let inc = self.slots.get(key)?.all().find(|i| i.uid() == uid)?;
        match &inc.fetched {
            Fetched::Done(done) => done.plan.fetch_into().map(|(source, dir)| (&**source, dir)),
            _ => None,
        }
    }

    pub fn model_count(&self) -> usize {
        self.slots.len()
    }

    /// Pending confirmations: how many, and since when the oldest waits.
    pub fn pending_confirmations(&self) -> (usize, Option<Instant>) {
        let mut count = 0;
        let mut oldest: Option<Instant> = None;
        for kind in Kind::ALL {
            for key in self.kinds[kind.index()].pending.iter() {
                for inc in self.slots.get(key).into_iter().flat_map(|s| s.all()) {
                    if let Life::PendingConfirm { since, cause, .. } = inc.life
                        && cause != Cause::PlacementExit
                    {
                        count += 1;
                        oldest = Some(oldest.map_or(since, |o| o.min(since)));
                    }
                }
            }
        }
        (count, oldest)
    }

    /// The shared copies (`_artifacts/...`) models on this node use now, for the metrics: how
    /// many models reference each (not confirmed gone) and its bytes once downloaded.
    pub fn shared_copies(&self) -> Vec<CopyUse> {
        let copies = self.dirs.iter().filter(|(dir, _)| shared::copy_parts(dir).is_some());
        copies
            .map(|(dir, using)| {
                let references = using.members.iter().filter(|m| m.alive).count();
                let bytes_of = |m: &shared::Member| {
                    let inc = self.slots.get(&m.key)?.all().find(|i| *i.uid() == m.uid)?;
                    match &inc.fetched {
                        Fetched::Done(done) if done.plan.fetch_into().is_some_and(|(_, d)| d == &**dir) => {
                            Some(done.bytes)
                        }
                        _ => None,
                    }
                };
                let bytes = using.members.iter().filter_map(bytes_of).max().unwrap_or(0);
                CopyUse { path: dir.to_string(), references, bytes }
            })
            .collect()
    }
}

/// One shared copy as the metrics show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyUse {
    /// Beneath the models root: `_artifacts/<org>/<repo>/<commit>`.
    pub path: String,
    /// Models not confirmed gone that use it.
    pub references: usize,
    /// The bytes of its files, once a download of it finished (0 before).
    pub bytes: u64,
}

/// The views of one slot's incarnations, current first.
pub(super) fn views<'a>(key: &'a ModelKey, slot: &'a Slot) -> impl Iterator<Item = IncarnationView> + 'a {
    slot.all().map(move |inc| IncarnationView {
        key: key.clone(),
        uid: inc.uid().clone(),
        current: slot.current.as_ref().is_some_and(|c| c.uid() == inc.uid()),
        life: inc.life.clone(),
        published: inc.published.clone(),
        fetched: inc.fetched.clone(),
        owned_dir: inc.owned_dir().map(str::to_string),
        busy: inc.inflight.is_some(),
    })
}
