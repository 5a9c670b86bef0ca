//! What must hold after every step (TigerBeetle's `invariants()`): checked by `handle` in debug
//! builds, and by the simulator and the property tests after every step of every node. Each
//! check reads the state directly; none calls the decision code it checks.

use super::*;

impl State {
    /// Every structural promise of the state; the first broken one, described.
    pub fn invariants(&self) -> Result<(), String> {
        self.slot_invariants()?;
        self.inflight_invariants()?;
        self.window_invariants()?;
        // Exactly one retry timer while a retry is kept, at its instant; none once a snapshot came.
        let retry_timers = self.timers.iter().filter(|(_, k)| *k == TimerKey::SnapshotRetry).count();
        let at_its_instant = self.snapshot_retry.is_none_or(|at| self.timers.contains(&(at, TimerKey::SnapshotRetry)));
        let expected = usize::from(self.snapshot_retry.is_some());
        if retry_timers != expected || !at_its_instant || (self.snapshot_seen.is_some() && expected == 1) {
            return Err(format!(
                "the first snapshot's retry {:?} disagrees with its {retry_timers} timers, or outlived it",
                self.snapshot_retry
            ));
        }
        if let Some(key) = self.node_reads.waiting.iter().find(|k| !self.slots.contains_key(*k)) {
            return Err(format!("{key} waits for a Node witness but has no record"));
        }
        self.dir_invariants()
    }

    /// A directory's unknown uids are ones its marker is known to name, none proven gone; those
    /// seen alive are unknown ones.
    fn dir_invariants(&self) -> Result<(), String> {
        for (dir, using) in self.dirs.iter() {
            record_invariants(dir, using)?;
        }
        for (dir, using) in self.dirs_rested.iter() {
            if !using.members.is_empty() || !shared::rest_needed(using) || self.dirs.contains_key(dir) {
                return Err(format!("{dir}: rested with members, with nothing to remember, or in use"));
            }
            record_invariants(dir, using)?;
        }
        Ok(())
    }

    /// Records: shape, per-kind indexes, timers, effects in flight and the collision index agree
    /// with each slot, in one pass over the records.
    fn slot_invariants(&self) -> Result<(), String> {
        let mut ambiguous = 0;
        // Per kind, how many records are pending and read-due: each index must hold exactly those.
        let mut members = [[0usize; 2]; 2];
        for (key, slot) in self.slots.iter() {
            ambiguous += usize::from(claims::has_other_reading(key));
            if slot.is_empty() {
                return Err(format!("{key}: an empty record is kept"));
            }
            if slot.former.iter().any(|f| f.life == Life::Observed) {
                return Err(format!("{key}: a former incarnation is Observed (two live uids under one name)"));
            }
            let pending = slot.all().any(Incarnation::is_pending);
            if pending != slot.indexed_pending {
                return Err(format!("{key}: the pending index disagrees with the record ({pending})"));
            }
            let due = slot.all().any(Incarnation::read_due);
            if due != slot.indexed_due {
                return Err(format!("{key}: the read-due index disagrees with the record ({due})"));
            }
            members[key.kind.index()][0] += usize::from(pending);
            members[key.kind.index()][1] += usize::from(due);
            for inc in slot.all() {
                if let Some(at) = inc.timer_at.get()
                    && !self.timers.contains(&(at, inc_timer(key, inc.uid())))
                {
                    return Err(format!("{key} {}: its timer at {at:?} is not registered", inc.uid()));
                }
                self.inc_inflight_invariants(key, inc)?;
            }
            if wire::is_truncated(key) && !self.claims.indexes(key) {
                return Err(format!("{key}: a truncated key is missing from the collision index"));
            }
        }
        self.indexes_hold(members)?;
        if ambiguous != self.claims.ambiguous() {
            return Err(format!(
                "{ambiguous} models with ambiguous keys, the collision index counts {}",
                self.claims.ambiguous()
            ));
        }
        Ok(())
    }

    /// Each per-kind index holds exactly the records of its kind that it marks (`members`
    /// counts them): every key in it is such a record, and there are as many.
    fn indexes_hold(&self, members: [[usize; 2]; 2]) -> Result<(), String> {
        for kind in Kind::ALL {
            let sync = &self.kinds[kind.index()];
            let [pending, due] = members[kind.index()];
            let marked = |k: &ModelKey, due: bool| {
                k.kind == kind && self.slots.get(k).is_some_and(|s| if due { s.indexed_due } else { s.indexed_pending })
            };
            for (set, n, is_due, what) in
                [(&sync.pending, pending, false, "pending"), (&sync.due, due, true, "read-due")]
            {
                if let Some(key) = set.iter().find(|k| !marked(k, is_due)) {
                    return Err(format!("{key}: the {what} index disagrees with the record (indexed)"));
                }
                if set.len() != n {
                    return Err(format!("the {what} index of {} holds {}, the records {n}", kind.plural(), set.len()));
                }
            }
        }
        Ok(())
    }

    /// Per kind: a key due for a read waits only for a LIST in flight or an open window (whose
    /// timer is the kind's `window_at`).
    fn window_invariants(&self) -> Result<(), String> {
        for kind in Kind::ALL {
            let sync = &self.kinds[kind.index()];
            if let Some(key) = sync.due.iter().next()
                && !sync.reads_held()
            {
                return Err(format!("{key} is due for a read, but no LIST is in flight and no window is open"));
            }
        }
        Ok(())
    }

    /// One incarnation's effect in flight: a download's run is it, and its owner knows it.
    fn inc_inflight_invariants(&self, key: &ModelKey, inc: &Incarnation) -> Result<(), String> {
        // Paired with `emit_actions`: a download's run is the incarnation's effect in flight.
        if let Some(run) = &inc.download
            && (inc.inflight.get() != Some(run.id) || run.plan.fetch_into().is_none())
        {
            return Err(format!("{key} {}: download {:?} is not its effect in flight", inc.uid(), run.id));
        }
        let Some(id) = inc.inflight.get() else { return Ok(()) };
        match self.inflight.get(&id) {
            Some(Owner::Inc { key: k, uid, .. }) if k == key && uid == inc.uid() => Ok(()),
            other => Err(format!("{key} {}: effect {id:?} in flight is owned by {other:?}", inc.uid())),
        }
    }

    /// Effects in flight: at most one per incarnation, and each owner knows its effect.
    fn inflight_invariants(&self) -> Result<(), String> {
        for (id, owner) in self.inflight.iter() {
            if let Owner::Inc { key, uid, .. } = owner {
                let inc = self.slots.get(key).and_then(|s| s.all().find(|i| i.uid() == uid));
                if inc.is_none_or(|i| i.inflight.get() != Some(*id)) {
                    return Err(format!("effect {id:?} of {key} {uid} has no incarnation waiting for it"));
                }
            }
        }
        Ok(())
    }
}

/// One directory's record, in use or at rest: its unknown uids are ones its marker is known to
/// name, none proven gone; those seen alive are unknown ones.
fn record_invariants(dir: &str, using: &shared::DirUse) -> Result<(), String> {
    let sorted = |uids: &[Uid]| uids.windows(2).all(|w| w[0] < w[1]);
    let marked = using.unknown.iter().all(|u| using.marked.binary_search(u).is_ok());
    let undecided = using.unknown.iter().all(|u| using.gone.binary_search(u).is_err());
    let alive = sorted(&using.alive) && using.alive.iter().all(|u| using.unknown.binary_search(u).is_ok());
    if !(sorted(&using.unknown) && sorted(&using.gone) && marked && undecided && alive) {
        return Err(format!(
            "{dir}: unknown uids {:?} disagree with marked {:?} or gone {:?}",
            using.unknown, using.marked, using.gone
        ));
    }
    Ok(())
}
