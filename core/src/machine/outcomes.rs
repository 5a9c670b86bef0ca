//! Effect outcomes: what a finished effect changes in its owner's record.

use super::*;

impl State {
    pub(super) fn on_effect_done(&mut self, st: &mut Step, id: EffectId, outcome: Outcome) {
        let Some(owner) = self.inflight.get(&id).cloned() else { return };
        match owner {
            Owner::Inc { key, uid, what } => {
                self.inflight.remove(&id);
                self.inc_effect_done(st, id, (key, uid), what, outcome);
            }
            Owner::Purge { name } => {
                self.inflight.remove(&id);
                self.purge_done(st, id, name, outcome);
            }
            Owner::Orphan => {
                self.inflight.remove(&id);
                match outcome {
                    Outcome::Done => self.stats.orphans_removed += 1,
                    // The next drift pass finds it again.
                    Outcome::Failed(reason) => {
                        self.stats.effects_failed += 1;
                        let retry_in_ms = self.config.drift_period_ms;
                        st.notes.push(Note::EffectFailed { id, reason, retry_in_ms });
                    }
                }
            }
            // Reads, probes and snapshots answer with their own inputs.
            Owner::Get { .. } | Owner::List { .. } | Owner::NodeGet { .. } | Owner::Snapshot { .. } => {}
        }
    }

    /// An incarnation's effect landed or failed: record what is now true of it.
    fn inc_effect_done(
        &mut self,
        st: &mut Step,
        id: EffectId,
        (key, uid): (ModelKey, Uid),
        what: IncOp,
        outcome: Outcome,
    ) {
        let (now, config) = (st.now, self.config.clone());
        let Some(inc) = self.slots.get_mut(&key).map(Arc::make_mut).and_then(|s| s.find_mut(&uid)) else {
            return;
        };
        inc.inflight = None;
        inc.changed_seq = st.seq;
        st.dirty.push(key.clone());
        match (outcome, what) {
            (Outcome::Done, what) => {
                inc.failures = 0;
                match what {
                    IncOp::Publish { status, reason } => inc.published = Published::Status { status, reason },
                    IncOp::Unpublish => inc.published = Published::Nothing,
                    IncOp::Fetch { plan } => {
                        if let Plan::Download { dest, .. } = &plan {
                            inc.owned_dir = dest.beneath_root.clone();
                        }
                        inc.fetched = Fetched::Done { plan: Box::new(plan) };
                    }
                    IncOp::Trash { name } => {
                        inc.owned_dir = None;
                        let purge_at = now.plus_ms(config.trash_grace_ms);
                        self.trash.insert(name.clone(), purge_at);
                        self.set_timer(purge_at, TimerKey::Purge(name));
                    }
                }
            }
            (Outcome::Failed(reason), IncOp::Fetch { plan }) => {
                // The model is Failed on this node (published, and noted, next), and fetched
                // again later.
                let delay = inc.failed_once(&config, &mut self.prng);
                let reason = Arc::from(reason.as_str());
                inc.fetched = Fetched::Failed { plan: Box::new(plan), reason, retry_at: now.plus_ms(delay) };
            }
            (Outcome::Failed(reason), _) => {
                let delay = inc.failed_once(&config, &mut self.prng);
                inc.blocked_until = Some(now.plus_ms(delay));
                self.stats.effects_failed += 1;
                st.notes.push(Note::EffectFailed { id, reason, retry_in_ms: delay });
            }
        }
    }

    /// A purge that failed is tried again after the longest retry delay.
    fn purge_done(&mut self, st: &mut Step, id: EffectId, name: String, outcome: Outcome) {
        match outcome {
            Outcome::Done => {
                self.trash.remove(&name);
            }
            Outcome::Failed(reason) => {
                let delay = self.config.retry_delay_ms_max;
                self.trash.insert(name.clone(), st.now.plus_ms(delay));
                self.set_timer(st.now.plus_ms(delay), TimerKey::Purge(name));
                self.stats.effects_failed += 1;
                st.notes.push(Note::EffectFailed { id, reason, retry_in_ms: delay });
            }
        }
    }
}
