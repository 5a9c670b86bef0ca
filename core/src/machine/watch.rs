//! Watch events: objects seen alive, deletion candidates, relist boundaries.

use super::*;

impl State {
    pub(super) fn on_watch(&mut self, st: &mut Step, kind: Kind, event: WatchEvent) {
        let sync = &mut self.kinds[kind.index()];
        match event {
            WatchEvent::Applied(obj) if obj.key.kind == kind => self.on_object(st, obj),
            WatchEvent::Deleted(obj) if obj.key.kind == kind => {
                self.make_candidate(st, &obj.key, Some(&obj.uid), Cause::WatchDeleted);
            }
            WatchEvent::RelistStarted => sync.relisting = Some(Set::default()),
            WatchEvent::RelistItem(obj) if obj.key.kind == kind => {
                if let Some(seen) = &mut sync.relisting {
                    seen.insert(obj.key.clone());
                }
                self.on_object(st, obj);
            }
            WatchEvent::RelistDone => {
                if let Some(seen) = sync.relisting.take() {
                    let vanished: Vec<ModelKey> = self
                        .slots
                        .iter()
                        .filter(|(k, s)| {
                            k.kind == kind
                                && !seen.contains(*k)
                                && s.current.as_ref().is_some_and(|c| c.life == Life::Observed)
                        })
                        .map(|(k, _)| k.clone())
                        .collect();
                    for key in sorted(vanished) {
                        self.make_candidate(st, &key, None, Cause::RelistVanished);
                    }
                }
                self.kinds[kind.index()].synced = true;
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

    /// An object seen alive (watch, relist or live read).
    pub(super) fn on_object(&mut self, st: &mut Step, obj: ModelObject) {
        // The common steady-state event changes nothing the core uses: no work to do.
        // (A read-only look: no copy-on-write path is taken for it.)
        if let Some(inc) = self.slots.get(&obj.key).and_then(|s| s.current.as_ref())
            && inc.uid() == &obj.uid
            && inc.obj.deleting == obj.deleting
            && inc.obj.spec == obj.spec
        {
            return;
        }
        let key = obj.key.clone();
        let obj = Arc::new(obj);
        let now = st.now;
        st.dirty.push(key.clone());
        let slot = Arc::make_mut(self.slots.entry(key.clone()).or_insert_with(|| {
            Arc::new(Slot { current: None, former: Vec::new(), indexed_pending: false, indexed_due: false })
        }));
        let mut confirmed = Vec::new();
        if let Some(inc) = slot.find_mut(&obj.uid) {
            // A uid already known: refresh, unless it is confirmed gone (a stale view).
            if !inc.is_confirmed() {
                inc.set_obj(obj.clone(), &self.config.models_root);
                if obj.deleting {
                    confirm(inc, Confirmation::Deleting, &mut confirmed);
                }
            }
        } else {
            let mut inc = Incarnation::new(obj.clone(), self.effect_id_next, &self.config.models_root);
            if obj.deleting {
                confirm(&mut inc, Confirmation::Deleting, &mut confirmed);
            }
            if let Some(mut old) = slot.current.replace(inc) {
                if old.life == Life::Observed {
                    old.life = pending(Cause::UidChanged, now);
                    self.stats.candidates += 1;
                }
                slot.former.push(old);
            }
        }
        self.note_confirmed(st, confirmed);
    }

    /// The incarnation with `uid` (the current one when `None`) becomes a deletion candidate.
    /// (Placement exits are marked by `prepare_key` and never counted as candidates.)
    pub(super) fn make_candidate(&mut self, st: &mut Step, key: &ModelKey, uid: Option<&Uid>, cause: Cause) {
        let Some(slot) = self.slots.get_mut(key).map(Arc::make_mut) else { return };
        let inc = match uid {
            Some(uid) => slot.find_mut(uid),
            None => slot.current.as_mut(),
        };
        let Some(inc) = inc else { return };
        if inc.life == Life::Observed {
            debug_assert_ne!(cause, Cause::PlacementExit);
            inc.life = pending(cause, st.now);
            self.stats.candidates += 1;
            st.dirty.push(key.clone());
        }
    }
}
