//! Watch events: objects seen alive, deletion candidates, relist boundaries.

use super::tables::{CandidateEvent, CandidateStep, on_candidate};
use super::*;

impl State {
    pub(super) fn on_watch(&mut self, st: &mut Step, kind: Kind, event: WatchEvent) {
        let sync = &mut self.kinds[kind.index()];
        match event {
            WatchEvent::Applied(obj) if obj.key.kind == kind => self.on_object(st, obj, st.seq, None),
            WatchEvent::Deleted(obj) if obj.key.kind == kind => {
                self.candidate(st, &obj.key, Some(&obj.uid), CandidateEvent::Questioned(Cause::WatchDeleted));
            }
            WatchEvent::RelistStarted => {
                // Wraps after 2^32 relists of one kind (a century at one a second): then a record
                // not listed since the previous wrap could pass for listed, once.
                sync.relist_at = sync.relist_at.wrapping_add(1).max(1);
                sync.relisting = true;
            }
            WatchEvent::RelistItem(obj) if obj.key.kind == kind => {
                let listing = sync.relisting.then_some(sync.relist_at);
                if let Some(relist) = listing
                    && self.listed_unchanged(&obj, relist)
                {
                    return;
                }
                self.on_object(st, obj, st.seq, listing);
            }
            WatchEvent::RelistDone => {
                if std::mem::take(&mut sync.relisting) {
                    let relist = sync.relist_at;
                    let vanished: Vec<ModelKey> = self
                        .slots
                        .iter()
                        .filter(|(k, s)| {
                            k.kind == kind
                                && s.listed_in != relist
                                && s.current
                                    .as_ref()
                                    .is_some_and(|c| matches!(c.life, Life::Observed | Life::Withdrawn))
                        })
                        .map(|(k, _)| k.clone())
                        .collect();
                    for key in sorted(vanished) {
                        self.candidate(st, &key, None, CandidateEvent::Questioned(Cause::RelistVanished));
                    }
                }
                let was_synced = Kind::ALL.iter().all(|k| self.kinds[k.index()].synced);
                self.kinds[kind.index()].synced = true;
                if !was_synced && Kind::ALL.iter().all(|k| self.kinds[k.index()].synced) {
                    // Every model known may publish now: none can be outranked by one not listed.
                    st.dirty.extend(self.slots.keys().cloned());
                }
                if !self.drift_started && Kind::ALL.iter().all(|k| self.kinds[k.index()].synced) {
                    // The first snapshot comes as soon as every kind is synced: it tells what a
                    // previous run left on the node.
                    self.drift_started = true;
                    self.set_timer(st.now, TimerKey::Drift);
                }
            }
            // An object on the wrong stream: a shell bug. Ignored rather than guessed at.
            WatchEvent::Applied(_) | WatchEvent::Deleted(_) | WatchEvent::RelistItem(_) => {}
        }
    }

    /// An object seen alive (watch, relist or live read), as of step `seq`; `listed` by that
    /// relist (its record then carries the number: `Slot::listed_in`).
    pub(super) fn on_object(&mut self, st: &mut Step, obj: Arc<ModelObject>, seq: u64, listed: Option<u32>) {
        // The common steady-state event changes nothing the core uses: no work to do.
        // (A read-only look: no copy-on-write path is taken for it. `same_object` written out:
        // as a call it cost about nine instructions an input on the bench stream.)
        if let Some(inc) = self.slots.get(&obj.key).and_then(|s| s.current.as_ref())
            && inc.uid() == &obj.uid
            && inc.obj.deleting == obj.deleting
            && inc.obj.spec == obj.spec
        {
            return;
        }
        let key = obj.key.clone();
        st.dirty.push(key.clone());
        if !self.slots.contains_key(&key) {
            self.claims.add(&key);
        }
        let slot = Arc::make_mut(self.slots.entry(key.clone()).or_insert_with(|| {
            Arc::new(Slot {
                current: None,
                former: thin_vec::ThinVec::new(),
                indexed_pending: false,
                indexed_due: false,
                listed_in: 0,
                event_seq: 0,
            })
        }));
        slot.event_seq = slot.event_seq.max(seq);
        if let Some(relist) = listed {
            slot.listed_in = relist;
        }
        if let Some(inc) = slot.find_mut(&obj.uid) {
            // A uid already known: refresh, unless it is confirmed gone (a stale view).
            if !inc.is_confirmed() {
                inc.set_obj(obj.clone(), seq, &self.config.models_root);
            }
        } else {
            let inc = Incarnation::new(obj.clone(), seq, &self.config.models_root);
            if let Some(old) = slot.current.replace(inc) {
                let here = old.something_here();
                slot.former.push(old);
                let old = slot.former.last_mut().expect("just pushed");
                if displace(old, st.now, st.seq) {
                    self.stats.candidates += 1;
                    st.candidates_here += u32::from(here);
                }
            }
        }
        if obj.deleting {
            self.candidate(st, &key, Some(&obj.uid), CandidateEvent::MarkedDeleting);
        }
    }

    /// A listed object that changes nothing the core uses (nearly every item of a relist):
    /// its record is marked listed by relist `relist` in one lookup. False when it changes
    /// something or is new: `on_object` takes it. Each relist has a new number, so under a kept
    /// history every listed record is copied once per relist.
    fn listed_unchanged(&mut self, obj: &ModelObject, relist: u32) -> bool {
        let Some(slot) = self.slots.get_mut(&obj.key) else { return false };
        let unchanged = slot.current.as_ref().is_some_and(|inc| same_object(inc, obj));
        if unchanged && slot.listed_in != relist {
            Arc::make_mut(slot).listed_in = relist;
        }
        unchanged
    }

    /// A candidate event for the incarnation with `uid` (the current one when `None`).
    pub(super) fn candidate(&mut self, st: &mut Step, key: &ModelKey, uid: Option<&Uid>, event: CandidateEvent) {
        let Some(slot) = self.slots.get_mut(key).map(Arc::make_mut) else { return };
        slot.event_seq = slot.event_seq.max(st.seq);
        let inc = match uid {
            Some(uid) => slot.find_mut(uid),
            None => slot.current.as_mut(),
        };
        let Some(inc) = inc else { return };
        let fresh = matches!(inc.life, Life::Observed | Life::Withdrawn);
        match on_candidate(&inc.life, event) {
            CandidateStep::Stay => {
                // Questioned again while pending: an answer sent before now cannot clear it.
                if let (Life::PendingConfirm { since_seq, .. }, CandidateEvent::Questioned(_)) = (&mut inc.life, event)
                {
                    *since_seq = st.seq;
                }
                return;
            }
            CandidateStep::Pend(cause) => inc.life = pending(cause, st.now, st.seq),
            CandidateStep::Recause(new_cause) => {
                // The read in flight or the hold keeps going; its answer now decides existence,
                // but one sent before this event cannot clear it (swarm seed 107671: a Found
                // sent before the DELETED suppressed it, and the label stayed for good).
                if let Life::PendingConfirm { cause, read, since_seq, .. } = &mut inc.life {
                    *cause = new_cause;
                    *since_seq = st.seq;
                    // An answer that only waited for the Node witness says nothing about
                    // existence now: read again.
                    if matches!(read, ReadState::ModelAnswered { .. }) {
                        *read = ReadState::Due;
                    }
                }
                st.dirty.push(key.clone());
                return;
            }
            CandidateStep::Confirm(confirmation) => st.verdicts.push(Verdict {
                key: key.clone(),
                uid: inc.uid().clone(),
                decision: Decision::Confirm(confirmation),
                evidence_at: st.now,
            }),
        }
        if fresh {
            self.stats.candidates += 1;
            st.candidates_here += u32::from(inc.something_here());
        }
        st.dirty.push(key.clone());
    }
}

/// `obj` is `inc`'s object as far as the core looks.
fn same_object(inc: &Incarnation, obj: &ModelObject) -> bool {
    inc.uid() == &obj.uid && inc.obj.deleting == obj.deleting && inc.obj.spec == obj.spec
}

/// An incarnation displaced by a new uid under its name becomes a candidate (returns whether it
/// just did): two uids cannot both be alive under one name. A placement exit in progress is
/// questioned afresh, since its answers now concern another uid.
pub(super) fn displace(old: &mut Incarnation, now: Instant, seq: u64) -> bool {
    match old.life {
        Life::Observed | Life::Withdrawn => {
            old.life = pending(Cause::UidChanged, now, seq);
            true
        }
        Life::PendingConfirm { cause: Cause::PlacementExit, .. } => {
            old.life = pending(Cause::UidChanged, now, seq);
            false
        }
        Life::PendingConfirm { .. } | Life::Confirmed { .. } => false,
    }
}
