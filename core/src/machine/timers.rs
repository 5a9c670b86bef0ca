//! Timers as a table: what each timer key does when it fires.

use super::*;

/// The wait after the first failure of this process's first snapshot, doubling with each
/// failure up to the drift period: an API that fails at the start delays a colliding model's
/// publish this long, not 5 min.
const SNAPSHOT_RETRY_FIRST_MS: u64 = 10_000;

impl State {
    // ------------------------------------------------------------------------------------------
    // Timers
    // ------------------------------------------------------------------------------------------

    pub(super) fn set_timer(&mut self, at: Instant, key: TimerKey) {
        match key {
            TimerKey::ReadDeadline(id) => self.deadlines.insert((at, id)),
            key => self.timers.insert((at, key)),
        };
    }

    pub(super) fn remove_timer(&mut self, at: Instant, key: TimerKey) {
        match key {
            TimerKey::ReadDeadline(id) => self.deadlines.remove(&(at, id)),
            key => self.timers.remove(&(at, key)),
        };
    }

    /// The earliest timer, in the order of one set of (instant, key): at one instant,
    /// incarnations' timers come before reads' deadlines, and those before the rest; the read
    /// windows come last.
    pub(super) fn next_timer(&self) -> Option<(Instant, TimerSource)> {
        let timer = self.timers.get_min();
        let deadline = self.deadlines.get_min();
        let first = match (timer, deadline) {
            (None, None) => None,
            (Some((at, _)), None) => Some((*at, TimerSource::Timers)),
            (None, Some((at, _))) => Some((*at, TimerSource::Deadlines)),
            (Some((t, key)), Some((d, _))) => {
                let timer_first = t < d || (t == d && matches!(key, TimerKey::Inc(_)));
                Some(if timer_first { (*t, TimerSource::Timers) } else { (*d, TimerSource::Deadlines) })
            }
        };
        let mut first = first;
        for kind in Kind::ALL {
            if let Some(at) = self.kinds[kind.index()].window_at
                && first.is_none_or(|(f, _)| at < f)
            {
                first = Some((at, TimerSource::Window(kind)));
            }
        }
        first
    }

    /// Take the earliest timer if it is due at `now`. A read window that closes is taken
    /// here: closing is all it does (the keys that waited go out in `issue_reads`).
    fn take_due_timer(&mut self, now: Instant) -> Option<TimerKey> {
        loop {
            let (at, source) = self.next_timer()?;
            if at > now {
                return None;
            }
            return match source {
                TimerSource::Timers => self.timers.remove_min().map(|(_, key)| key),
                TimerSource::Deadlines => self.deadlines.remove_min().map(|(_, id)| TimerKey::ReadDeadline(id)),
                TimerSource::Window(kind) => {
                    self.kinds[kind.index()].window_at = None;
                    continue;
                }
            };
        }
    }

    /// A snapshot never answered (the API was down) is replaced, not waited for: at most one
    /// is outstanding.
    fn request_snapshot(&mut self, st: &mut Step) {
        if let Some(old) = self.snapshot_inflight.take() {
            self.inflight.remove(&old);
        }
        let requested_seq = st.seq;
        let id = self.emit(st, Op::Snapshot, Some(Owner::Snapshot { requested_seq }));
        self.snapshot_inflight = Some(id);
    }

    /// The snapshot `id` failed (the API or the scan). Before the first one came, it is asked
    /// for again after a wait that doubles with each failure; after, the next drift pass asks.
    pub(super) fn on_snapshot_failed(&mut self, st: &mut Step, id: EffectId, reason: String) {
        self.inflight.remove(&id);
        self.snapshot_inflight = None;
        self.stats.effects_failed += 1;
        let period = self.config.drift_period_ms;
        let retry_in_ms = match self.snapshot_retry {
            _ if self.snapshot_seen.is_some() || self.shutting_down => period,
            Some(at) => at.ms_since(st.now),
            None => {
                let doublings = self.snapshot_failures.min(16);
                self.snapshot_failures += 1;
                let wait_ms = SNAPSHOT_RETRY_FIRST_MS.saturating_mul(1 << doublings).min(period);
                let at = st.now.plus_ms(wait_ms);
                self.snapshot_retry = Some(at);
                self.set_timer(at, TimerKey::SnapshotRetry);
                wait_ms
            }
        };
        st.notes.push(Note::EffectFailed { id, reason, retry_in_ms });
    }

    /// A shared copy lost its last member: a snapshot soon, so the orphan sweep can decide.
    pub(super) fn sweep_soon(&mut self, st: &Step) {
        if !self.sweep_set && !self.shutting_down {
            self.sweep_set = true;
            self.set_timer(st.now.plus_ms(shared::SWEEP_DELAY_MS), TimerKey::Sweep);
        }
    }

    pub(super) fn fire_timers(&mut self, st: &mut Step) {
        while let Some(key) = self.take_due_timer(st.now) {
            match key {
                TimerKey::Inc(IncTimer { key, uid }) => {
                    let Some(slot) = self.slots.get_mut(&key).map(Arc::make_mut) else { continue };
                    let Some(inc) = slot.find_mut(&uid) else { continue };
                    inc.timer_at = WordOption::NONE;
                    inc.wake(st.now);
                    if !in_place!(self, st.now).settle(&key, slot, true) {
                        st.dirty.push(key);
                    }
                }
                TimerKey::ReadDeadline(id) => match self.inflight.get(&id) {
                    Some(Owner::NodeGet { .. }) => self.on_node_read(st, id, None),
                    _ => self.finish_read(st, id, reads::ReadEnd::TimedOut),
                },
                TimerKey::NodeReadRetry => self.node_reads.retry_at = None,
                TimerKey::RootProbe => {
                    // Any probe answer is news, whichever request it answers: no owner is kept,
                    // so unanswered probes leave nothing behind.
                    self.emit(st, Op::ProbeRoot, None);
                    self.set_timer(st.now.plus_ms(self.config.root_probe_period_ms), TimerKey::RootProbe);
                }
                TimerKey::Drift => {
                    self.request_snapshot(st);
                    let period = self.config.drift_period_ms;
                    let jitter = self.prng.up_to(period / 10);
                    self.set_timer(st.now.plus_ms(period - jitter), TimerKey::Drift);
                }
                TimerKey::SnapshotRetry => {
                    // A drift pass may have asked meanwhile: that one is not replaced.
                    self.snapshot_retry = None;
                    if self.snapshot_seen.is_none() && !self.shutting_down && self.snapshot_inflight.is_none() {
                        self.request_snapshot(st);
                    }
                }
                TimerKey::Sweep => {
                    self.sweep_set = false;
                    self.request_snapshot(st);
                }
                TimerKey::Purge(name) => {
                    let due = self.trash.get(&name).is_some_and(|t| *t <= st.now);
                    if due && !self.shutting_down {
                        self.emit(st, Op::PurgeTrash { name: name.clone() }, Some(Owner::Purge { name }));
                    }
                }
            }
        }
    }
}

pub(super) fn sync_timers(timers: &mut RunSet<(Instant, TimerKey)>, key: &ModelKey, slot: &mut Slot) {
    for inc in slot.all_mut() {
        // As `timer_at` keeps it (a saturated instant is one earlier), so that the set holds
        // exactly what the record says it does.
        let want = WordOption::from(inc.wake_at());
        if want == inc.timer_at {
            continue;
        }
        let id = inc_timer(key, inc.uid());
        if let Some(at) = inc.timer_at.get() {
            timers.remove(&(at, id.clone()));
        }
        if let Some(at) = want.get() {
            timers.insert((at, id));
        }
        inc.timer_at = want;
    }
}
