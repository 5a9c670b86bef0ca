//! Live reads: issuing GETs and coalesced LISTs, and finishing them. One function finishes a
//! GET, a LIST or a read that timed out; an answer about something other than what was asked
//! is a failed read.

use super::settle::normalize;
use super::tables::{ReadAnswer, ReadVerdict, read_verdict};
use super::*;

/// How a read ended.
pub(super) enum ReadEnd {
    Get(ReadResult),
    List(ListResult),
    TimedOut,
}

/// The keys a read asks about: a GET's one key (no allocation), or a LIST's.
enum ReadKeys {
    One(ModelKey),
    Many(Arc<Vec<ModelKey>>),
}

impl ReadKeys {
    fn as_slice(&self) -> &[ModelKey] {
        match self {
            ReadKeys::One(key) => std::slice::from_ref(key),
            ReadKeys::Many(keys) => keys,
        }
    }
}

impl State {
    pub(super) fn finish_read(&mut self, st: &mut Step, id: EffectId, end: ReadEnd) {
        let (keys, kind, purpose, deadline, sent) = match self.inflight.get(&id) {
            Some(Owner::Get { key, deadline, sent }) => {
                (ReadKeys::One(key.clone()), key.kind, ListPurpose::Candidates, *deadline, *sent)
            }
            Some(Owner::List { kind, keys, purpose, deadline, sent }) => {
                (ReadKeys::Many(keys.clone()), *kind, *purpose, *deadline, *sent)
            }
            _ => return,
        };
        let is_list = matches!(keys, ReadKeys::Many(_));
        let keys = keys.as_slice();
        self.inflight.remove(&id);
        // A timed-out read's deadline has just fired: the timer is gone already.
        if !matches!(end, ReadEnd::TimedOut) {
            self.remove_timer(deadline, TimerKey::ReadDeadline(id));
        }
        if self.kinds[kind.index()].list_inflight == Some(id) {
            self.kinds[kind.index()].list_inflight = None;
        }
        match self.answers(keys, kind, is_list, end) {
            Err(reason) => {
                self.stats.reads_failed += 1;
                self.read_failed(st, id, keys, kind, reason, is_list);
                if purpose == ListPurpose::OrphanSweep {
                    self.orphan_check = None;
                }
            }
            Ok(objects) => {
                // A GET's answer is its one key's object (`answers` checked it), or nothing.
                let by_key: BTreeMap<&ModelKey, &Arc<ModelObject>> =
                    if is_list { objects.iter().map(|o| (&o.key, o)).collect() } else { BTreeMap::new() };
                for key in keys.iter() {
                    let found = if is_list { by_key.get(key).copied() } else { objects.first() };
                    match found {
                        Some(_) => self.stats.reads_found += 1,
                        None => self.stats.reads_not_found += 1,
                    }
                    self.apply_read(st, id, key, found, sent);
                }
                if purpose == ListPurpose::OrphanSweep {
                    self.orphan_list_done(st, id, kind, objects);
                }
            }
        }
    }

    /// The objects an answer reports, or why it answers nothing: an error, a timeout, or an
    /// answer about something other than what was asked.
    fn answers(
        &mut self,
        keys: &[ModelKey],
        kind: Kind,
        is_list: bool,
        end: ReadEnd,
    ) -> Result<Vec<Arc<ModelObject>>, String> {
        match (end, is_list) {
            (ReadEnd::TimedOut, _) => {
                self.stats.reads_timed_out += 1;
                Err(String::from(&*self.read_timed_out))
            }
            (ReadEnd::Get(ReadResult::Failed(reason)), false) | (ReadEnd::List(ListResult::Failed(reason)), true) => {
                Err(reason)
            }
            (ReadEnd::Get(ReadResult::NotFound), false) => Ok(Vec::new()),
            (ReadEnd::Get(ReadResult::Found(obj)), false) => match keys.first() {
                Some(key) if obj.key == *key => Ok(vec![obj]),
                Some(key) => Err(format!("the live GET of {key} was answered with {}", obj.key)),
                None => Err("a live GET without a key".to_string()),
            },
            (ReadEnd::List(ListResult::Listed(objects)), true) => match objects.iter().find(|o| o.key.kind != kind) {
                Some(other) => Err(format!("the live LIST of {} held {}", kind.plural(), other.key)),
                None => Ok(objects),
            },
            (ReadEnd::Get(_), true) | (ReadEnd::List(_), false) => Err("answered with the wrong kind of result".into()),
        }
    }

    /// A read answered every incarnation of `key` that awaits it: `found` is the live object
    /// under that name, if any.
    fn apply_read(
        &mut self,
        st: &mut Step,
        id: EffectId,
        key: &ModelKey,
        found: Option<&Arc<ModelObject>>,
        sent: Sent,
    ) {
        let models_root = &self.config.models_root;
        let Some(slot) = self.slots.get_mut(key).map(Arc::make_mut) else { return };
        let found = found.cloned();
        let mut suppressed = Vec::new();
        for inc in slot.all_mut().filter(|i| i.awaits(id)) {
            let Life::PendingConfirm { cause, since_seq, .. } = inc.life else { continue };
            let answer = match &found {
                None => ReadAnswer::NotFound,
                Some(obj) if obj.uid != *inc.uid() => ReadAnswer::FoundOther,
                Some(obj) if obj.deleting => ReadAnswer::FoundDeleting,
                Some(_) => ReadAnswer::FoundAlive,
            };
            // Newest view wins: an answer sent before a newer event never replaces its spec.
            let view_newer = inc.view_seq > sent.seq;
            if let Some(obj) = found.as_ref().filter(|o| o.uid == *inc.uid()) {
                inc.set_obj(obj.clone(), sent.seq, models_root);
            }
            match read_verdict(cause, answer, view_newer, since_seq > sent.seq) {
                ReadVerdict::Confirm(confirmation) => st.verdicts.push(Verdict {
                    key: key.clone(),
                    uid: inc.uid().clone(),
                    decision: Decision::Confirm(confirmation),
                    evidence_at: sent.at,
                }),
                ReadVerdict::Suppress => {
                    inc.life = Life::Observed;
                    suppressed.push((inc.uid().clone(), cause));
                }
                ReadVerdict::AwaitNodeWitness => set_read(inc, ReadState::ModelAnswered { sent }),
                ReadVerdict::ReadAgain => set_read(inc, ReadState::Due),
            }
        }
        self.stats.candidates += normalize(slot, st.now, st.seq);
        // A uid this node never saw, while no incarnation here is alive, is the live object now:
        // adopt it (below, once the slot is released), unless a watch event about this name
        // arrived after the read was sent (it may be that uid's deletion: newest view wins).
        let newer_event = slot.event_seq > sent.seq;
        let adopt = found.filter(|obj| {
            !obj.deleting
                && !newer_event
                && slot.all().all(|i| {
                    i.uid() != &obj.uid && matches!(i.life, Life::PendingConfirm { .. } | Life::Confirmed { .. })
                })
        });
        st.dirty.push(key.clone());
        for (uid, cause) in suppressed {
            self.stats.phantom_deletes_suppressed += 1;
            st.notes.push(Note::PhantomSuppressed { key: key.clone(), uid, cause });
        }
        if let Some(obj) = adopt {
            self.on_object(st, obj, sent.seq, None);
        }
    }

    pub(super) fn read_failed(
        &mut self,
        st: &mut Step,
        id: EffectId,
        keys: &[ModelKey],
        kind: Kind,
        reason: String,
        coalesced: bool,
    ) {
        let (delay_min, delay_max) = (self.config.retry_delay_ms_min, self.config.retry_delay_ms_max);
        // One delay for a whole LIST keeps its retry coalesced (O(kinds) calls, not O(models)).
        let mut shared_delay = None;
        let mut last_delay = None;
        for key in keys {
            let Some(slot) = self.slots.get_mut(key).map(Arc::make_mut) else { continue };
            let mut waits = false;
            for inc in slot.all_mut().filter(|i| i.awaits(id)) {
                let Life::PendingConfirm { attempt, read, .. } = &mut inc.life else { continue };
                let delay = match shared_delay {
                    Some(d) => d,
                    None => backoff_ms(*attempt, delay_min, delay_max, &mut self.prng),
                };
                if coalesced {
                    shared_delay = Some(delay);
                }
                *attempt = attempt.saturating_add(1);
                *read = ReadState::Waiting { at: st.now.plus_ms(delay) };
                last_delay = Some(delay);
                waits = true;
            }
            if waits && !in_place!(self, st.now).settle(key, slot, true) {
                st.dirty.push(key.clone());
            }
        }
        if let Some(retry_in_ms) = last_delay {
            let key = (!coalesced).then(|| keys.first().cloned()).flatten();
            st.notes.push(Note::ReadFailed { key, kind, reason, retry_in_ms });
        }
    }

    /// Issue the reads that are due, per kind: none while a LIST of the kind is in flight (it
    /// does not answer candidates made after it was sent: they are read when it returns) or
    /// its coalescing window is open; else one LIST when enough keys are due
    /// (`list_keys_min`), and the window opens, or one GET per key. A window follows a LIST
    /// only: keys that came due together mean a storm, whose stragglers are worth waiting for;
    /// after a lone GET they rarely add up to a LIST, and waiting would only add latency (and
    /// instructions: `scripts/bench-core-instructions`, a steady trickle of deletes).
    pub(super) fn issue_reads(&mut self, st: &mut Step) -> Vec<ModelKey> {
        let mut touched = Vec::new();
        for kind in Kind::ALL {
            let sync = &self.kinds[kind.index()];
            if sync.due.is_empty() || sync.reads_held() {
                continue;
            }
            if sync.due.len() >= self.list_keys_min() {
                touched.extend(sync.pending.iter().cloned());
                self.issue_list(st, kind, ListPurpose::Candidates);
                if self.config.coalesce_window_ms > 0 {
                    self.open_window(st.now.plus_ms(self.config.coalesce_window_ms), kind);
                }
            } else {
                self.issue_gets(st, kind, &mut touched);
            }
        }
        // Their indexes are brought up to date when each touched key is settled, right after.
        touched
    }

    /// The fewest due keys of one kind that one LIST answers: `coalesce_keys_min`, and at least
    /// one per `coalesce_models_per_key_max` models kept (the API server's cost of a LIST).
    fn list_keys_min(&self) -> usize {
        let per_models = match self.config.coalesce_models_per_key_max {
            0 => 0,
            models_per_key => self.slots.len().div_ceil(models_per_key),
        };
        self.config.coalesce_keys_min.max(per_models)
    }

    /// Due keys of `kind` wait until `at` (a timer: `TimerSource::Window`).
    pub(super) fn open_window(&mut self, at: Instant, kind: Kind) {
        debug_assert!(self.kinds[kind.index()].window_at.is_none(), "one window per kind");
        self.kinds[kind.index()].window_at = Some(at);
    }

    /// A key made due after this step's reads went out (a former incarnation revived when
    /// another was dropped) waits for a window, closing at once without one: no due key is
    /// left without a LIST or a timer that sends it.
    pub(super) fn hold_late_due(&mut self, st: &Step) {
        for kind in Kind::ALL {
            let sync = &self.kinds[kind.index()];
            if !sync.due.is_empty() && !sync.reads_held() {
                self.open_window(st.now.plus_ms(self.config.coalesce_window_ms), kind);
            }
        }
    }

    /// One GET per due key of `kind`, in key order.
    fn issue_gets(&mut self, st: &mut Step, kind: Kind, touched: &mut Vec<ModelKey>) {
        let mut due = std::mem::take(&mut self.spare_due);
        due.extend(self.kinds[kind.index()].due.iter().cloned());
        // In an order that is a pure function of the keys, by their hashes first: a window's
        // keys are sorted in a few word comparisons rather than name comparisons.
        due.sort_unstable_by(|a, b| a.fingerprint().cmp(&b.fingerprint()).then_with(|| a.cmp(b)));
        for key in due.drain(..) {
            let deadline = st.now.plus_ms(self.config.live_read_timeout_ms);
            let sent = Sent { seq: st.seq, at: st.now };
            let id =
                self.emit(st, Op::LiveGet { key: key.clone() }, Some(Owner::Get { key: key.clone(), deadline, sent }));
            self.set_timer(deadline, TimerKey::ReadDeadline(id));
            self.stats.live_gets += 1;
            if let Some(slot) = self.slots.get_mut(&key).map(Arc::make_mut) {
                for inc in slot.all_mut().filter(|i| i.read_due()) {
                    set_read(inc, ReadState::InFlight { id });
                }
                if in_place!(self, st.now).settle(&key, slot, false) {
                    continue;
                }
            }
            touched.push(key);
        }
        self.spare_due = due;
    }

    /// A quorum LIST of `kind` that answers every incarnation of the kind pending now whose read
    /// is not in flight (due or backing off: answering early is harmless).
    pub(super) fn issue_list(&mut self, st: &mut Step, kind: Kind, purpose: ListPurpose) -> EffectId {
        let keys = sorted(self.kinds[kind.index()].pending.iter().cloned().collect());
        let timeout_ms = self.list_timeout_ms();
        let deadline = st.now.plus_ms(timeout_ms.unwrap_or(self.config.live_read_timeout_ms));
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
        let sent = Sent { seq: st.seq, at: st.now };
        let owner = Owner::List { kind, keys: Arc::new(covered), purpose, deadline, sent };
        self.inflight.insert(id, owner);
        st.out.push(Effect { id, op: Op::LiveList { kind, timeout_ms } });
        self.set_timer(deadline, TimerKey::ReadDeadline(id));
        self.kinds[kind.index()].list_inflight = Some(id);
        self.stats.live_lists += 1;
        id
    }

    /// A LIST's deadline: a GET's, and `live_list_ms_per_model` for each model kept (the
    /// objects of both kinds: a bound on the kind's), capped; none when not configured.
    fn list_timeout_ms(&self) -> Option<u64> {
        let per_model = self.config.live_list_ms_per_model;
        if per_model == 0 {
            return None;
        }
        let paging_ms = (self.slots.len() as u64).saturating_mul(per_model);
        let timeout_ms = self.config.live_read_timeout_ms.saturating_add(paging_ms);
        Some(timeout_ms.min(LIVE_LIST_TIMEOUT_MS_MAX.max(self.config.live_read_timeout_ms)))
    }
}
