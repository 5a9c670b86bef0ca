//! What must hold after every step (TigerBeetle's `invariants()`): checked by `handle` in debug
//! builds, and by the simulator and the property tests after every step of every node. Each
//! check reads the state directly; none calls the decision code it checks.

use super::*;

impl State {
    /// Every structural promise of the state; the first broken one, described.
    pub fn invariants(&self) -> Result<(), String> {
        self.slot_invariants()?;
        self.inflight_invariants()?;
        if let Some(key) = self.node_reads.waiting.iter().find(|k| !self.slots.contains_key(*k)) {
            return Err(format!("{key} waits for a Node witness but has no record"));
        }
        Ok(())
    }

    /// Records: shape, per-kind indexes, timers and the collision index agree with each slot.
    fn slot_invariants(&self) -> Result<(), String> {
        for (key, slot) in self.slots.iter() {
            if slot.is_empty() {
                return Err(format!("{key}: an empty record is kept"));
            }
            if slot.former.iter().any(|f| f.life == Life::Observed) {
                return Err(format!("{key}: a former incarnation is Observed (two live uids under one name)"));
            }
            let sync = &self.kinds[key.kind.index()];
            let pending = slot.all().any(Incarnation::is_pending);
            if pending != sync.pending.contains(key) || pending != slot.indexed_pending {
                return Err(format!("{key}: the pending index disagrees with the record ({pending})"));
            }
            let due = slot.all().any(Incarnation::read_due);
            if due != sync.due.contains(key) || due != slot.indexed_due {
                return Err(format!("{key}: the read-due index disagrees with the record ({due})"));
            }
            for inc in slot.all() {
                if let Some(at) = inc.timer_at
                    && !self.timers.contains(&(at, TimerKey::Inc(Arc::new((key.clone(), inc.uid().clone())))))
                {
                    return Err(format!("{key} {}: its timer at {at:?} is not registered", inc.uid()));
                }
            }
            if wire::is_truncated(key) && !self.claims.indexes(key) {
                return Err(format!("{key}: a truncated key is missing from the collision index"));
            }
        }
        let ambiguous = self.slots.keys().filter(|k| claims::has_other_reading(k)).count();
        if ambiguous != self.claims.ambiguous() {
            return Err(format!(
                "{ambiguous} models with ambiguous keys, the collision index counts {}",
                self.claims.ambiguous()
            ));
        }
        Ok(())
    }

    /// Effects in flight: at most one per incarnation, and each owner knows its effect.
    fn inflight_invariants(&self) -> Result<(), String> {
        for (key, slot) in self.slots.iter() {
            for inc in slot.all() {
                // Paired with `emit_actions`: a download's run is the incarnation's effect in flight.
                if let Some(run) = &inc.download
                    && (inc.inflight != Some(run.id) || !matches!(run.plan, Plan::Download { .. }))
                {
                    return Err(format!("{key} {}: download {:?} is not its effect in flight", inc.uid(), run.id));
                }
                let Some(id) = inc.inflight else { continue };
                match self.inflight.get(&id) {
                    Some(Owner::Inc { key: k, uid, .. }) if k == key && uid == inc.uid() => {}
                    other => return Err(format!("{key} {}: effect {id:?} in flight is owned by {other:?}", inc.uid())),
                }
            }
        }
        for (id, owner) in self.inflight.iter() {
            if let Owner::Inc { key, uid, .. } = owner {
                let inc = self.slots.get(key).and_then(|s| s.all().find(|i| i.uid() == uid));
                if inc.is_none_or(|i| i.inflight != Some(*id)) {
                    return Err(format!("effect {id:?} of {key} {uid} has no incarnation waiting for it"));
                }
            }
        }
        Ok(())
    }
}
