//! Live reads: issuing GETs and coalesced LISTs, and finishing them (answered, failed, timed out).

use super::settle::normalize;
use super::*;

impl State {
    pub(super) fn on_live_read(&mut self, st: &mut Step, id: EffectId, result: ReadResult) {
        let Some(Owner::Get { key, deadline }) = self.inflight.get(&id).cloned() else { return };
        self.inflight.remove(&id);
        self.timers.remove(&(deadline, TimerKey::ReadDeadline(id)));
        self.count_read(&result);
        match result {
            ReadResult::Failed(reason) => {
                self.read_failed(st, id, std::slice::from_ref(&key), key.kind, &reason, false)
            }
            found_or_not => self.apply_read(st, id, &key, found_or_not),
        }
    }

    pub(super) fn on_live_list(&mut self, st: &mut Step, id: EffectId, result: ListResult) {
        let Some(Owner::List { kind, keys, drift, deadline }) = self.inflight.get(&id).cloned() else { return };
        self.inflight.remove(&id);
        self.timers.remove(&(deadline, TimerKey::ReadDeadline(id)));
        let sync = &mut self.kinds[kind.index()];
        if sync.list_inflight == Some(id) {
            sync.list_inflight = None;
        }
        match result {
            ListResult::Failed(reason) => {
                self.stats.reads_failed += 1;
                self.read_failed(st, id, &keys, kind, &reason, true);
                if drift {
                    self.orphan_check = None;
                }
            }
            ListResult::Listed(objects) => {
                self.stats.reads_found += 1;
                let by_key: BTreeMap<&ModelKey, &ModelObject> =
                    objects.iter().filter(|o| o.key.kind == kind).map(|o| (&o.key, o)).collect();
                for key in keys.iter() {
                    let result = match by_key.get(key) {
                        Some(obj) => ReadResult::Found((*obj).clone()),
                        None => ReadResult::NotFound,
                    };
                    self.apply_read(st, id, key, result);
                }
                if drift {
                    self.orphan_list_done(st, id, kind, objects);
                }
            }
        }
    }

    pub(super) fn count_read(&mut self, result: &ReadResult) {
        match result {
            ReadResult::Found(_) => self.stats.reads_found += 1,
            ReadResult::NotFound => self.stats.reads_not_found += 1,
            ReadResult::Failed(_) => self.stats.reads_failed += 1,
        }
    }

    /// A read answered (Found or NotFound) every incarnation of `key` that awaits it.
    pub(super) fn apply_read(&mut self, st: &mut Step, id: EffectId, key: &ModelKey, result: ReadResult) {
        let models_root = &self.config.models_root;
        let Some(slot) = self.slots.get_mut(key).map(Arc::make_mut) else { return };
        let mut confirmed = Vec::new();
        let mut suppressed = Vec::new();
        let found = match result {
            ReadResult::Found(obj) if obj.key == *key => Some(Arc::new(obj)),
            _ => None,
        };
        for inc in slot.all_mut() {
            if !inc.awaits(id) {
                continue;
            }
            let Life::PendingConfirm { cause, .. } = inc.life else { continue };
            match &found {
                None => confirm(inc, Confirmation::NotFound, &mut confirmed),
                Some(obj) if obj.uid != *inc.uid() => confirm(inc, Confirmation::Replaced, &mut confirmed),
                Some(obj) if obj.deleting => {
                    inc.set_obj(obj.clone(), models_root);
                    confirm(inc, Confirmation::Deleting, &mut confirmed);
                }
                Some(obj) => {
                    inc.set_obj(obj.clone(), models_root);
                    inc.life = Life::Observed;
                    if cause == Cause::PlacementExit {
                        inc.exit_confirmed = true;
                    } else {
                        suppressed.push((inc.uid().clone(), cause));
                    }
                }
            }
        }
        self.stats.candidates += normalize(slot, st.now);
        // A uid this node never saw is the live object now: adopt it (below, once the slot is
        // released).
        let adopt = found.filter(|obj| !obj.deleting && slot.all().all(|i| i.uid() != &obj.uid && i.is_confirmed()));
        st.dirty.push(key.clone());
        for (uid, cause) in suppressed {
            self.stats.phantom_deletes_suppressed += 1;
            st.notes.push(Note::PhantomSuppressed { key: key.clone(), uid, cause });
        }
        self.note_confirmed(st, confirmed);
        if let Some(obj) = adopt {
            self.on_object(st, Arc::unwrap_or_clone(obj));
        }
    }

    pub(super) fn read_failed(
        &mut self,
        st: &mut Step,
        id: EffectId,
        keys: &[ModelKey],
        kind: Kind,
        reason: &str,
        shared: bool,
    ) {
        let config = self.config.clone();
        // One delay for a whole LIST keeps its retry coalesced (O(kinds) calls, not O(models)).
        let mut shared_delay = None;
        let mut last_delay = None;
        for key in keys {
            let Some(slot) = self.slots.get_mut(key).map(Arc::make_mut) else { continue };
            for inc in slot.all_mut() {
                if !inc.awaits(id) {
                    continue;
                }
                let Life::PendingConfirm { attempt, read, .. } = &mut inc.life else { continue };
                let delay = match shared_delay {
                    Some(d) => d,
                    None => backoff_ms(*attempt, config.retry_delay_ms_min, config.retry_delay_ms_max, &mut self.prng),
                };
                if shared {
                    shared_delay = Some(delay);
                }
                *attempt = attempt.saturating_add(1);
                *read = ReadState::Waiting { at: st.now.plus_ms(delay) };
                last_delay = Some(delay);
                st.dirty.push(key.clone());
            }
        }
        if let Some(retry_in_ms) = last_delay {
            let key = (!shared).then(|| keys.first().cloned()).flatten();
            st.notes.push(Note::ReadFailed { key, kind, reason: reason.to_string(), retry_in_ms });
        }
    }

    pub(super) fn read_timed_out(&mut self, st: &mut Step, id: EffectId) {
        let reason = format!("live read timed out after {} ms", self.config.live_read_timeout_ms);
        match self.inflight.get(&id).cloned() {
            Some(Owner::Get { key, .. }) => {
                self.inflight.remove(&id);
                self.stats.reads_timed_out += 1;
                self.stats.reads_failed += 1;
                self.read_failed(st, id, std::slice::from_ref(&key), key.kind, &reason, false);
            }
            Some(Owner::List { kind, keys, drift, .. }) => {
                self.inflight.remove(&id);
                if self.kinds[kind.index()].list_inflight == Some(id) {
                    self.kinds[kind.index()].list_inflight = None;
                }
                self.stats.reads_timed_out += 1;
                self.stats.reads_failed += 1;
                self.read_failed(st, id, &keys, kind, &reason, true);
                if drift {
                    self.orphan_check = None;
                }
            }
            _ => {}
        }
    }

    /// Issue the reads that are due: one LIST per kind when enough keys are due (or one is in
    /// flight already and will be followed by another), else one GET per key.
    pub(super) fn issue_reads(&mut self, st: &mut Step) -> Vec<ModelKey> {
        let mut touched = Vec::new();
        for kind in Kind::ALL {
            let sync = &self.kinds[kind.index()];
            if sync.due.is_empty() || sync.list_inflight.is_some() {
                // A LIST in flight does not answer candidates made after it was sent: they are
                // read when it returns.
                continue;
            }
            if sync.due.len() >= self.config.coalesce_keys_min {
                touched.extend(sync.pending.iter().cloned());
                self.issue_list(st, kind, false);
            } else {
                for key in sorted(sync.due.iter().cloned().collect()) {
                    let deadline = st.now.plus_ms(self.config.live_read_timeout_ms);
                    let id = self.emit(
                        st,
                        Op::LiveGet { key: key.clone() },
                        Some(Owner::Get { key: key.clone(), deadline }),
                    );
                    self.set_timer(deadline, TimerKey::ReadDeadline(id));
                    self.stats.live_gets += 1;
                    if let Some(slot) = self.slots.get_mut(&key).map(Arc::make_mut) {
                        for inc in slot.all_mut().filter(|i| i.read_due()) {
                            set_read(inc, ReadState::InFlight { id });
                        }
                    }
                    touched.push(key);
                }
            }
        }
        // Their indexes are brought up to date when each touched key is settled, right after.
        touched
    }

    /// A quorum LIST of `kind` that answers every incarnation of the kind pending now whose read
    /// is not in flight (due or backing off: answering early is harmless).
    pub(super) fn issue_list(&mut self, st: &mut Step, kind: Kind, drift: bool) -> EffectId {
        let keys = sorted(self.kinds[kind.index()].pending.iter().cloned().collect());
        let deadline = st.now.plus_ms(self.config.live_read_timeout_ms);
        let id = self.effect_id();
        let mut covered = Vec::new();
        for key in &keys {
            let Some(slot) = self.slots.get_mut(key).map(Arc::make_mut) else { continue };
            let mut any = false;
            for inc in slot.all_mut() {
                if matches!(inc.life, Life::PendingConfirm { read: ReadState::Due | ReadState::Waiting { .. }, .. }) {
                    set_read(inc, ReadState::InFlight { id });
                    any = true;
                }
            }
            if any {
                covered.push(key.clone());
                st.dirty.push(key.clone());
            }
        }
        let owner = Owner::List { kind, keys: Arc::new(covered), drift, deadline };
        self.inflight.insert(id, owner);
        st.out.push(Effect { id, op: Op::LiveList { kind } });
        self.set_timer(deadline, TimerKey::ReadDeadline(id));
        self.kinds[kind.index()].list_inflight = Some(id);
        self.stats.live_lists += 1;
        id
    }
}
