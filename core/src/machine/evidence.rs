//! Evidence before destruction: the blast-radius breaker's count, the one gate every
//! destructive decision passes, and the second witness of placement exits (a live read of this
//! agent's Node).

use super::breaker::Count;
use super::tables::{WitnessVerdict, witness_verdict};
use super::*;

impl State {
    /// Count this step's candidates; the breaker may trip before any of them is decided.
    pub(super) fn count_candidates(&mut self, st: &mut Step) {
        let candidates = std::mem::take(&mut st.candidates_here);
        if candidates == 0 {
            return;
        }
        let records = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        let counted = self.breaker.count(&self.config, st.now, candidates, records, || placed_here(&self.slots));
        if let Count::Tripped { candidates, placed, until } = counted {
            st.notes.push(Note::BreakerTripped { candidates, placed, until });
        }
    }

    /// Take this step's destructive decisions, each through the breaker's gate.
    pub(super) fn apply_verdicts(&mut self, st: &mut Step) {
        for verdict in std::mem::take(&mut st.verdicts) {
            let Some(slot) = self.slots.get_mut(&verdict.key).map(Arc::make_mut) else { continue };
            let Some(inc) = slot.find_mut(&verdict.uid) else { continue };
            gate(&mut self.breaker, &mut self.stats, st, inc, verdict.decision, verdict.evidence_at);
            st.dirty.push(verdict.key);
        }
    }

    /// A view of this Node as of step `seq` (a watch event, or a live read sent then).
    pub(super) fn adopt_node(&mut self, st: &mut Step, node: NodeView, seq: u64) {
        if seq < self.node_seq {
            return;
        }
        self.node_seq = seq;
        if self.node.as_deref() != Some(&node) {
            let wiped = self.node.as_ref().and_then(|old| breaker::labels_wiped(&old.labels, &node.labels));
            if let Some(vanished) = wiped {
                let until = self.breaker.trip(&self.config, st.now);
                let had = self.node.as_ref().map_or(0, |n| n.labels.len());
                st.notes.push(Note::NodeLabelsVanished { vanished, had, until });
            }
            // A wipe trips the breaker: every model is settled again, as on any other change.
            let only_model_labels =
                wiped.is_none() && self.node.as_deref().is_some_and(|old| changes_only_model_labels(old, &node));
            self.node = Some(Arc::new(node));
            self.node_reads.view_changed_seq = Some(st.seq);
            if only_model_labels {
                self.dirty_readers_of_model_labels(st);
            } else {
                st.dirty.extend(self.slots.keys().cloned());
            }
        }
    }

    /// The echo of this agent's own label writes changes only model labels, and those matter
    /// to a model only through a placement that names one, or through its own label's value
    /// while its published state is unknown (`tables::skips_updating`'s `already_ready`; its
    /// `first_check` reads it for Nothing too, but only when it emits an effect at once). Settling
    /// every model on each echo cost O(models) per label write (12–17 ms of the loop at 10,000
    /// models, `scripts/bench-agent`).
    fn dirty_readers_of_model_labels(&self, st: &mut Step) {
        let reads = |inc: &Incarnation| {
            inc.published == Published::Unknown
                || inc.obj.spec().is_some_and(|spec| crate::placement::reads_label(spec, wire::is_model_label))
        };
        for (key, slot) in self.slots.iter() {
            if slot.all().any(reads) {
                st.dirty.push(key.clone());
            }
        }
    }

    /// A live read of the Node ended (`None`: it timed out).
    pub(super) fn on_node_read(&mut self, st: &mut Step, id: EffectId, result: Option<NodeReadResult>) {
        let Some(Owner::NodeGet { deadline, sent }) = self.inflight.get(&id).cloned() else { return };
        self.inflight.remove(&id);
        self.remove_timer(deadline, TimerKey::ReadDeadline(id));
        if self.node_reads.inflight.is_some_and(|(i, _)| i == id) {
            self.node_reads.inflight = None;
        }
        let reason = match result {
            Some(NodeReadResult::Found(node)) if node.name == self.config.node_name => {
                self.node_reads.attempt = 0;
                self.node_reads.witness = Some(NodeWitness { node: Arc::new(node.clone()), sent });
                self.node_reads.wanted = false;
                st.dirty.extend(self.node_reads.waiting.iter().cloned());
                st.dirty.extend(std::mem::take(&mut self.node_reads.trash_waiting));
                self.adopt_node(st, node, sent.seq);
                self.resume_orphan_check(st);
                return;
            }
            Some(NodeReadResult::Found(node)) => {
                format!("the live GET of this Node was answered with Node {}", node.name)
            }
            Some(NodeReadResult::Failed(reason)) => reason,
            None => format!("live read of the Node timed out after {} ms", self.config.live_read_timeout_ms),
        };
        // Copies parked for a Node witness are decided on the read sent for them or not at all:
        // a retry answers a backoff later, when the check's LISTs may be older than a change
        // of a model that may use them (swarm seed 7003956: a nodeSelector removed 1 s after
        // the LISTs, the copy trashed 14 s later). They wait for the next sweep.
        if self.orphan_check.as_ref().is_some_and(|c| c.parked) {
            self.orphan_check = None;
        }
        let config = &self.config;
        let delay =
            backoff_ms(self.node_reads.attempt, config.retry_delay_ms_min, config.retry_delay_ms_max, &mut self.prng);
        self.node_reads.attempt = self.node_reads.attempt.saturating_add(1);
        let at = st.now.plus_ms(delay);
        self.node_reads.retry_at = Some(at);
        self.set_timer(at, TimerKey::NodeReadRetry);
        self.stats.reads_failed += 1;
        st.notes.push(Note::NodeReadFailed { reason, retry_in_ms: delay });
    }

    /// Ask for a Node witness when a waiting exit needs one and none is in flight.
    pub(super) fn issue_node_read(&mut self, st: &mut Step) {
        let reads = &self.node_reads;
        if !reads.wanted || reads.inflight.is_some() || reads.retry_at.is_some_and(|t| t > st.now) {
            return;
        }
        let sent = Sent { seq: st.seq, at: st.now };
        let deadline = st.now.plus_ms(self.config.live_read_timeout_ms);
        let id = self.emit(st, Op::LiveGetNode, Some(Owner::NodeGet { deadline, sent }));
        self.set_timer(deadline, TimerKey::ReadDeadline(id));
        self.node_reads.inflight = Some((id, sent));
        self.stats.live_gets += 1;
    }
}

/// What a held decision waits as. Evidence that the model is gone or going outranks a
/// placement exit: were it kept as an exit, the Node coming back would cancel it and the
/// deletion would be lost (the simulator's swarm, seed 275).
pub(super) fn held_cause(cause: Cause, decision: &Decision) -> Cause {
    match (cause, decision) {
        (Cause::PlacementExit, Decision::Confirm(Confirmation::Deleting)) => Cause::MarkedDeleting,
        (Cause::PlacementExit, Decision::Confirm(_)) => Cause::WatchDeleted,
        (cause, _) => cause,
    }
}

/// The one gate of destruction: a decision whose evidence was sent before the breaker's hold
/// ends is held, and read again once the hold is over.
pub(super) fn gate(
    breaker: &mut Breaker,
    stats: &mut Stats,
    st: &mut Step,
    inc: &mut Incarnation,
    decision: Decision,
    evidence_at: Instant,
) {
    if inc.is_confirmed() {
        return;
    }
    let key = inc.obj.key.clone();
    if let Some(until) = breaker.holds(evidence_at) {
        let (cause, attempt, since, since_seq) = match inc.life {
            Life::PendingConfirm { cause, attempt, since, since_seq, .. } => (cause, attempt, since, since_seq),
            _ => (Cause::MarkedDeleting, 0, st.now, st.seq),
        };
        let cause = held_cause(cause, &decision);
        inc.life = Life::PendingConfirm {
            cause,
            attempt,
            since,
            since_seq,
            fresh_after: until,
            read: ReadState::Waiting { at: until },
        };
        breaker.held += 1;
        st.notes.push(Note::BreakerHeld { key, uid: inc.uid().clone(), until });
        return;
    }
    match decision {
        Decision::Confirm(confirmation) => {
            inc.life = Life::Confirmed { confirmation };
            stats.deletes_confirmed += 1;
            st.notes.push(Note::DeleteConfirmed { key, uid: inc.uid().clone(), confirmation });
        }
        Decision::Withdraw => inc.life = Life::Withdrawn,
    }
}

/// A placement exit whose model read agreed: decide with the Node witness if one was sent after
/// the exit began (and after any hold), and within `pair_within_ms` of the model read; else ask
/// for one, or read the model again. Returns whether it still waits.
pub(super) fn decide_exit(
    (reads, pair_within_ms): (&mut NodeReads, u64),
    breaker: &mut Breaker,
    stats: &mut Stats,
    st: &mut Step,
    inc: &mut Incarnation,
) -> bool {
    let Life::PendingConfirm { since_seq, fresh_after, read: ReadState::ModelAnswered { sent: model }, .. } = inc.life
    else {
        return false;
    };
    // A model read sent before the breaker's hold ends (a LIST may answer a held exit early)
    // decides nothing, whatever the Node says: read both again once the hold is over.
    if model.at < fresh_after {
        return read_model_again(inc, fresh_after);
    }
    // The two witnesses speak of one moment: the Node read is sent no earlier than the model
    // read that agreed (a retried model read never pairs with an older round's Node read).
    let fresh = |w: &&NodeWitness| w.sent.seq >= since_seq.max(model.seq) && w.sent.at >= fresh_after;
    let Some(witness) = reads.witness.as_ref().filter(fresh) else {
        reads.wanted = true;
        return true;
    };
    // ... and no later than one read's timeout after it: a Node read retried long after (the
    // Node did not answer) pairs with a new model read, as the spec may have changed meanwhile
    // (the simulator's swarm, seed 10004629: a model re-placed during a wipe lost its label).
    if witness.sent.at > model.at.plus_ms(pair_within_ms) {
        return read_model_again(inc, st.now);
    }
    let eligible = inc.obj.spec().is_none_or(|spec| placement(spec, &witness.node).is_eligible());
    match witness_verdict(eligible) {
        WitnessVerdict::Cancel => {
            inc.life = Life::Observed;
            st.notes.push(Note::ExitCancelled { key: inc.obj.key.clone(), uid: inc.uid().clone() });
        }
        WitnessVerdict::Withdraw => {
            let evidence_at = model.at.min(witness.sent.at);
            gate(breaker, stats, st, inc, Decision::Withdraw, evidence_at);
        }
    }
    false
}

/// The exit's model read decides nothing: read the model again at `at` (and the Node after it).
/// Returns false: the exit does not wait for the Node witness meanwhile.
fn read_model_again(inc: &mut Incarnation, at: Instant) -> bool {
    if let Life::PendingConfirm { read, .. } = &mut inc.life {
        *read = ReadState::Waiting { at };
    }
    false
}

/// Current incarnations with something on this node. O(models): asked only when the breaker's
/// count could trip.
fn placed_here(slots: &Map<ModelKey, Arc<Slot>>) -> u32 {
    let placed = slots.values().filter(|s| s.current.as_ref().is_some_and(Incarnation::something_here));
    u32::try_from(placed.count()).unwrap_or(u32::MAX)
}

/// Same name, and every label that differs (added, removed or changed) is a model label.
pub(super) fn changes_only_model_labels(old: &NodeView, new: &NodeView) -> bool {
    let all_model_labels = |a: &BTreeMap<String, String>, b: &BTreeMap<String, String>| {
        a.iter().filter(|(k, v)| b.get(k.as_str()) != Some(*v)).all(|(k, _)| wire::is_model_label(k))
    };
    old.name == new.name && all_model_labels(&old.labels, &new.labels) && all_model_labels(&new.labels, &old.labels)
}
