//! Settling a step: placement-exit marks, reads, and the next effect of every touched model.

use super::claims::{Contest, contest};
use super::evidence::decide_exit;
use super::tables::{PlacementStep, download_stays, placement_step, trash_awaits_witness, witness_fresh};
use super::watch::displace;
use super::*;

impl State {
    // ------------------------------------------------------------------------------------------
    // Settling a step: re-reads, reads, next effects, timers
    // ------------------------------------------------------------------------------------------

    pub(super) fn settle(&mut self, st: &mut Step) {
        let mut dirty = std::mem::take(&mut st.dirty);
        if dirty.len() > 1 {
            dirty.sort_unstable();
            dirty.dedup();
        }
        for key in &dirty {
            self.prepare_key(st, key);
        }
        // Exits begun above count before any read for them is sent.
        if st.candidates_here > 0 {
            self.count_candidates(st);
        }
        self.issue_node_read(st);
        let mut touched = self.issue_reads(st);
        let more = std::mem::take(&mut st.dirty);
        if touched.is_empty() && more.is_empty() {
            // Sorted and deduplicated already.
            touched = dirty;
        } else {
            touched.extend(dirty);
            touched.extend(more);
            if touched.len() > 1 {
                touched.sort_unstable();
                touched.dedup();
            }
        }
        for key in &touched {
            self.settle_key(st, key);
        }
        // Who owns a shared key may have changed with any of its claimants.
        let mut colliders: Vec<ModelKey> = Vec::new();
        for key in touched.iter().filter(|k| !self.claims.none_collide(k)) {
            colliders.extend(self.claims.colliders(&self.slots, key));
        }
        if !colliders.is_empty() {
            colliders.sort_unstable();
            colliders.dedup();
            colliders.retain(|k| touched.binary_search(k).is_err());
            for key in &colliders {
                self.settle_key(st, key);
            }
        }
        if !st.dir_affected.is_empty() {
            self.settle_dir_members(st);
        }
        if std::mem::take(&mut st.copy_released) {
            self.sweep_soon(st);
        }
        // A trash that began to wait for a Node witness in this step asks for it now.
        self.issue_node_read(st);
        self.hold_late_due(st);
        // Kept for the next step, unless a step that touched many keys made it large.
        const SPARE_KEYS_MAX: usize = 1024;
        if touched.capacity() <= SPARE_KEYS_MAX {
            touched.clear();
            self.spare_keys = touched;
        }
    }

    /// Members of a directory whose membership changed decide again (a download ended, a
    /// member left or joined), until nothing changes; each round settles only the keys the
    /// last one affected, and a key's membership changes at most a few times per step.
    fn settle_dir_members(&mut self, st: &mut Step) {
        const ROUNDS_MAX: usize = 8;
        for _ in 0..ROUNDS_MAX {
            let mut keys = std::mem::take(&mut st.dir_affected);
            if keys.is_empty() {
                return;
            }
            keys.sort_unstable();
            keys.dedup();
            for key in &keys {
                self.settle_key(st, key);
            }
        }
        // What is left is settled by the next step that touches it (a timer wakes it).
        debug_assert!(st.dir_affected.len() < 1_000_000);
    }

    /// With one lookup: placement changes of the current incarnation (`placement_step`), exits
    /// decided by the Node witness, and the indexes.
    pub(super) fn prepare_key(&mut self, st: &mut Step, key: &ModelKey) {
        if self.prepared_already(key) {
            return;
        }
        let State { slots, kinds, node, node_reads, breaker, stats, config, .. } = self;
        let sync = &mut kinds[key.kind.index()];
        let Some(slot) = slots.get_mut(key).map(Arc::make_mut) else {
            reindex_slot(sync, key, None);
            unwait(&mut node_reads.waiting, key);
            return;
        };
        if let Some(inc) = slot.current.as_mut() {
            let eligible = eligible_now(inc, node.as_deref());
            match placement_step(&inc.life, eligible, inc.something_here()) {
                PlacementStep::Stay => {}
                PlacementStep::Exit => {
                    inc.life = pending(Cause::PlacementExit, st.now, st.seq);
                    st.candidates_here += 1;
                }
                PlacementStep::Return => {
                    if inc.is_pending() {
                        st.notes.push(Note::ExitCancelled { key: key.clone(), uid: inc.uid().clone() });
                    }
                    inc.life = Life::Observed;
                }
            }
        }
        let mut waits = false;
        for inc in slot.all_mut() {
            waits |= decide_exit((node_reads, config.live_read_timeout_ms), breaker, stats, st, inc);
        }
        if waits {
            node_reads.waiting.insert(key.clone());
        } else {
            unwait(&mut node_reads.waiting, key);
        }
        reindex_slot(sync, key, Some(slot));
    }

    /// Would `prepare_key` change nothing? Read without copying the record (a timer or a failed
    /// read changes nothing it looks at, nearly always): placement stays, no exit awaits the
    /// Node witness, and the indexes agree with the record.
    fn prepared_already(&self, key: &ModelKey) -> bool {
        let Some(slot) = self.slots.get(key) else { return false };
        let placement_stays = slot.current.as_ref().is_none_or(|inc| {
            placement_step(&inc.life, eligible_now(inc, self.node.as_deref()), inc.something_here())
                == PlacementStep::Stay
        });
        placement_stays
            && !slot.some(Incarnation::awaits_node_witness)
            && slot.some(Incarnation::is_pending) == slot.indexed_pending
            && slot.some(Incarnation::read_due) == slot.indexed_due
            && (self.node_reads.waiting.is_empty() || !self.node_reads.waiting.contains(key))
    }

    /// Drive one touched model with a single map lookup: emit what its incarnations need next,
    /// sync their timers and the per-kind indexes, and drop the record once it is empty.
    pub(super) fn settle_key(&mut self, st: &mut Step, key: &ModelKey) {
        let State {
            slots,
            claims,
            kinds,
            node,
            root,
            config,
            timers,
            inflight,
            effect_id_next,
            shutting_down,
            stats,
            dirs,
            dirs_rested,
            dirs_trashing,
            snapshot_seen,
            node_reads,
            ..
        } = self;
        let contest = contest(slots, claims, (node.as_deref(), snapshot_seen.is_none()), inflight, key);
        let synced = kinds.iter().all(|k| k.synced);
        let sync = &mut kinds[key.kind.index()];
        let Some(shared) = slots.get_mut(key) else {
            reindex_slot(sync, key, None);
            return;
        };
        let slot = Arc::make_mut(shared);
        if contest.is_none() && waits_quietly(slot, synced, node.as_deref(), &config.models_root, st.now) {
            // Nothing to decide and no directory to register: timers and indexes only.
            sync_timers(timers, key, slot);
            reindex_slot(sync, key, Some(slot));
            return;
        }
        let mut emitter = Emitter { next_id: effect_id_next, inflight, out: &mut st.out, notes: &mut st.notes };
        let env = Env {
            node: node.as_deref(),
            root: root.as_ref(),
            config,
            shutting_down: *shutting_down,
            now: st.now,
            seq: st.seq,
            contest: contest.as_ref(),
            synced,
            dirs,
            dirs_trashing,
            markers_seen: *snapshot_seen,
            node_witness_seq: node_reads.witness.as_ref().map(|w| w.sent.seq),
            trash_hold: node_reads.view_changed_seq == Some(st.seq),
        };
        let before = registrations(slot);
        st.copy_released |= drive(&env, &mut emitter, timers, stats, key, slot);
        if slot.all().any(|inc| waits_for_trash_witness(inc, &env)) {
            node_reads.wanted = true;
            node_reads.trash_waiting.insert(key.clone());
        }
        st.dir_affected.extend(unregister_gone((dirs, dirs_rested), &before, slot));
        let node_held = (node.as_deref(), contest.as_ref().is_some_and(|c| c.held_by.is_some()));
        st.dir_affected.extend(shared::register((dirs, dirs_rested), key, slot, &config.models_root, node_held));
        // A copy whose last user left (a delete, a switch to its own download): the sweep decides.
        st.copy_released |= before.iter().any(|(d, _)| shared::copy_parts(d).is_some() && !dirs.contains_key(d));
        sync_timers(timers, key, slot);
        if slot.is_empty() {
            reindex_slot(sync, key, None);
            slots.remove(key);
            claims.remove(key);
        } else {
            reindex_slot(sync, key, Some(slot));
        }
    }
}

/// The parts of the state a decision about one model reads.
pub(super) struct Env<'a> {
    pub(super) node: Option<&'a NodeView>,
    pub(super) root: Option<&'a RootProbe>,
    pub(super) config: &'a Config,
    pub(super) shutting_down: bool,
    pub(super) now: Instant,
    pub(super) seq: u64,
    /// Models whose keys collide with this one's (`claims::contest`); `None` when none do.
    pub(super) contest: Option<&'a Contest>,
    pub(super) synced: bool,
    pub(super) dirs: &'a Map<Arc<str>, Arc<shared::DirUse>>,
    pub(super) dirs_trashing: &'a Set<Arc<str>>,
    /// `State::snapshot_seen`.
    pub(super) markers_seen: Option<u64>,
    /// The step that sent the newest Node witness.
    pub(super) node_witness_seq: Option<u64>,
    /// The Node view changed in this step (`Context::trash_hold`).
    pub(super) trash_hold: bool,
}

/// A leaving incarnation whose trash waits for a Node witness newer than the newest one, or
/// for a step after one that changed the Node view (the witness asked for then wakes it).
fn waits_for_trash_witness(inc: &Incarnation, env: &Env) -> bool {
    let Some(share) = inc.share.as_ref() else { return false };
    let after = share.trash_after_seq;
    share.owned_dir.is_some()
        && inc.inflight.is_none()
        && after.is_some()
        && (env.trash_hold || !witness_fresh(after, env.node_witness_seq))
}

/// Unregisters the incarnations registered before a drive (`before`) that the slot no longer
/// holds; returns the other members of the directories they left.
fn unregister_gone(
    dirs: (&mut shared::Dirs, &mut shared::Dirs),
    before: &FirstAndRest<(Arc<str>, Uid)>,
    slot: &Slot,
) -> Vec<ModelKey> {
    if before.is_empty() {
        return Vec::new();
    }
    let gone: Vec<(Arc<str>, Uid)> =
        before.iter().filter(|(_, uid)| !slot.all().any(|i| i.uid() == uid)).cloned().collect();
    shared::unregister(dirs, &gone)
}

/// The directories a slot's incarnations are registered in.
fn registrations(slot: &Slot) -> FirstAndRest<(Arc<str>, Uid)> {
    let mut out = FirstAndRest::default();
    for inc in slot.all() {
        if let Some((dir, _)) = inc.share.as_ref().and_then(|s| s.registered.as_ref()) {
            out.push((dir.clone(), inc.uid().clone()));
        }
    }
    out
}

/// Emit the next effect of every incarnation of `key` that is free to act, and drop the
/// incarnations that are confirmed gone and fully cleaned up. True when one released a shared
/// copy.
pub(super) fn drive(
    env: &Env,
    emitter: &mut Emitter,
    timers: &mut RunSet<(Instant, TimerKey)>,
    stats: &mut Stats,
    key: &ModelKey,
    slot: &mut Slot,
) -> bool {
    let mut copy_released = false;
    let mut actions = FirstAndRest::default();
    let mut cancels: Vec<Uid> = Vec::new();
    let mut finished: Vec<Uid> = Vec::new();
    // Earlier incarnations first: the current one acts only once none of them is pending, has an
    // effect in flight, or is given one now.
    let mut former_unsettled = false;
    let mut held_by = None;
    for i in 0..slot.former.len() + usize::from(slot.current.is_some()) {
        let is_current = i == slot.former.len();
        let inc = if is_current { slot.current.as_ref() } else { slot.former.get(i) }.expect("in range");
        if !is_current && (inc.is_pending() || inc.inflight.is_some()) {
            former_unsettled = true;
        }
        let running = inc.download.as_deref().is_some_and(|run| !run.cancel_sent);
        if !running && (inc.inflight.is_some() || inc.blocked_until.is_some_and(|t| t > env.now)) {
            continue;
        }
        if !running && holds_quietly(env, inc, is_current) {
            if is_current {
                held_by = None;
            }
            continue;
        }
        // Read when the current one decides: a former one may have just left a directory
        // others use (`share_step`) and be dropped below, with nothing else to wake this key.
        let former_owns_dir = is_current && slot.former.iter().any(owns_unreserved_dir);
        let ctx = context(env, key, slot, inc, is_current, (former_owns_dir, former_unsettled));
        let want = want(inc, &ctx);
        let inc = if is_current { slot.current.as_mut() } else { slot.former.get_mut(i) }.expect("in range");
        copy_released |= share_step(inc, &ctx, &want, env.seq);
        if is_current {
            held_by = want.collides_with().cloned();
        }
        let inc = &*inc;
        if let Some(run) = inc.download.as_deref().filter(|_| running) {
            if !download_stays(&want, &run.plan) {
                cancels.push(inc.uid().clone());
            }
            continue;
        }
        match decide(env, key, inc, &want, &ctx) {
            Decision::Act(op, what) => {
                former_unsettled |= !is_current;
                actions.push((inc.uid().clone(), op, what));
            }
            Decision::Finished => finished.push(inc.uid().clone()),
            Decision::Nothing => {}
        }
    }
    note_collision(emitter, key, slot, held_by);
    emit_cancels(emitter, slot, cancels);
    emit_actions(emitter, key, slot, actions);
    if !finished.is_empty() {
        drop_finished(timers, stats, key, slot, &finished);
        stats.candidates += normalize(slot, env.now, env.seq);
    }
    copy_released
}

#[allow(clippy::large_enum_variant, reason = "one value per decision, moved at once, never stored")]
enum Decision {
    Act(Op, IncOp),
    /// Confirmed gone, nothing of it wanted and nothing left to remove.
    Finished,
    Nothing,
}

/// The next effect of one incarnation free to act.
fn decide(env: &Env, key: &ModelKey, inc: &Incarnation, want: &Want, ctx: &Context) -> Decision {
    match next_op(key, inc, want, ctx, env.now) {
        Some((op, _)) if env.shutting_down && op.is_destructive() => Decision::Nothing,
        Some((op, what)) => {
            // Paired with `invariants()`: destruction only from a confirmed or withdrawn
            // incarnation (or its own symlink when its plan changed), one effect in flight.
            debug_assert!(
                !op.is_destructive()
                    || matches!(inc.life, Life::Confirmed { .. } | Life::Withdrawn)
                    || matches!(op, Op::Unlink { .. }),
                "{key} {}: destructive {op:?} from {:?}",
                inc.uid(),
                inc.life
            );
            debug_assert!(inc.inflight.is_none(), "{key} {}: a second effect in flight", inc.uid());
            Decision::Act(op, what)
        }
        // A held confirmed incarnation is not done: it waits to clean up.
        None if inc.is_confirmed()
            && *want == Want::Absent
            && !trash_awaits_witness(inc, ctx)
            && !tables::reserved_disown_pending(inc, ctx) =>
        {
            Decision::Finished
        }
        None => Decision::Nothing,
    }
}

/// Before deciding: a leaving incarnation releases a directory that is a shared copy or that
/// another live model of the same source uses (it is theirs now; a copy goes through the orphan
/// sweep), and a Ready shared copy whose owner or children changed is published again.
fn share_step(inc: &mut Incarnation, ctx: &Context, want: &Want, seq: u64) -> bool {
    let mut copy_released = false;
    // A trash of a directory other uids' marker names waits for a Node witness sent from now
    // on (`tables::awaits_trash_witness`); anything else forgets the wait.
    let trash_waits = *want == Want::Absent && tables::trash_needs_witness(inc, ctx);
    let after = inc.share.as_ref().and_then(|s| s.trash_after_seq);
    if trash_waits && after.is_none() {
        inc.share_mut().trash_after_seq = Some(seq);
    } else if !trash_waits && after.is_some() {
        inc.share_mut().trash_after_seq = None;
    }
    if let (Want::Absent, Some(dir)) = (want, inc.owned_dir()) {
        let copy = shared::in_artifacts(dir);
        // A reserved model keeps its directory (`trash_blocked`): released, the co-owner's
        // delete would trash the weights the reserve label keeps.
        let reserved = inc.is_reserved();
        let shared = ctx.dir.as_ref().is_some_and(|d| d.shared) && !reserved;
        if copy || shared {
            // What it fetched there is no longer its to vouch for: the others may trash it
            // before it is placed here again, and then it fetches again (as after its own trash).
            let fetched_there =
                matches!(&inc.fetched, Fetched::Done(done) if done.plan.fetch_into().is_some_and(|(_, d)| d == dir));
            if fetched_there {
                inc.fetched = Fetched::No;
            }
            inc.set_owned_dir(None);
            // The sweep is asked for only when no one else uses the copy: every snapshot gives
            // a leaving uid the copy its marker names again.
            copy_released = copy && !shared;
        }
    }
    if let Some(digest) = ctx.dir.as_ref().and_then(|d| d.artifact.as_ref()).map(shared::ArtifactView::digest) {
        let share = inc.share_mut();
        if share.artifact_digest != digest {
            share.artifact_digest = digest;
            if matches!(inc.published, Published::Status { status: ModelStatus::Ready, .. }) {
                inc.published = Published::Unknown;
            }
        }
    }
    copy_released
}

/// What settling one key in place reads and writes: fields of the state apart from `slots`, so
/// that the lookup which changed a record can settle it too.
pub(super) struct InPlace<'a> {
    pub(super) claims: &'a Claims,
    pub(super) kinds: &'a mut [KindSync; 2],
    pub(super) timers: &'a mut RunSet<(Instant, TimerKey)>,
    pub(super) node: Option<&'a NodeView>,
    pub(super) waiting: &'a Set<ModelKey>,
    pub(super) models_root: &'a str,
    pub(super) now: Instant,
}

impl InPlace<'_> {
    /// Settle `key` now, in the lookup that just moved one of its live reads along (a read
    /// failed, a backoff ended, a GET was sent), when the step could only update its timers and
    /// indexes: `settle_key` would take its quiet path (no colliding model, every incarnation
    /// waits quietly) and, with `unprepared`, `prepare_key` would change nothing (placement
    /// stays, no exit awaits the Node witness). No timer it sets can be due in this step. False:
    /// the key must be settled with the step, as before.
    pub(super) fn settle(&mut self, key: &ModelKey, slot: &mut Slot, unprepared: bool) -> bool {
        let synced = self.kinds.iter().all(|k| k.synced);
        let prepared = || {
            let placement_stays = slot.current.as_ref().is_none_or(|inc| {
                placement_step(&inc.life, eligible_now(inc, self.node), inc.something_here()) == PlacementStep::Stay
            });
            placement_stays
                && !slot.some(Incarnation::awaits_node_witness)
                && (self.waiting.is_empty() || !self.waiting.contains(key))
        };
        let quiet = self.claims.none_collide(key)
            && waits_quietly(slot, synced, self.node, self.models_root, self.now)
            && slot.every(|inc| inc.wake_at().is_none_or(|at| at > self.now))
            && (!unprepared || prepared());
        if quiet {
            sync_timers(self.timers, key, slot);
            reindex_slot(&mut self.kinds[key.kind.index()], key, Some(slot));
        }
        quiet
    }
}

/// Would `drive` and `shared::register` leave this slot as it is (with no colliding model)? Every
/// incarnation waits (an effect in flight, a backoff, a live read or every kind's list) and uses
/// no directory, and the current one holds no shared key: `drive` passes over each (see
/// `holds_quietly`) and notes no collision, and `register` finds nothing to join or leave.
/// Inlined into its one caller: called apart, it cost the fold about 20 instructions an input
/// (`scripts/bench-core-instructions`).
#[inline]
fn waits_quietly(slot: &Slot, synced: bool, node: Option<&NodeView>, models_root: &str, now: Instant) -> bool {
    // `member_draft` is none without a download, a directory owned or a spec that downloads.
    let uses_no_dir = |inc: &Incarnation| {
        (inc.owned_dir().is_none() && !inc.obj.spec().is_some_and(|s| s.uri.as_ref().is_ok_and(|u| u.downloads())))
            || shared::member_draft(inc, models_root, (node, None)).is_none()
    };
    let waits = |inc: &Incarnation| {
        inc.share.is_none()
            && inc.download.is_none()
            && (inc.inflight.is_some() || inc.blocked_until.is_some_and(|t| t > now) || !synced || inc.is_pending())
            && uses_no_dir(inc)
    };
    slot.current.as_ref().is_some_and(|c| c.held_by.is_none()) && slot.every(waits)
}

/// Nothing to decide for an incarnation that waits (for a live read, or for every kind's list:
/// `want` holds) and uses no directory (`share_step` has nothing to read): the common case,
/// decided without building its context.
fn holds_quietly(env: &Env, inc: &Incarnation, is_current: bool) -> bool {
    let held = is_current && env.contest.is_some_and(|c| c.held_by.is_some());
    let held = held.then_some(env.dirs);
    (!env.synced || inc.is_pending()) && shared::member_draft(inc, &env.config.models_root, (env.node, held)).is_none()
}

/// What the rest of the state contributes to one incarnation's decision.
fn context<'a>(
    env: &Env<'a>,
    key: &ModelKey,
    slot: &Slot,
    inc: &Incarnation,
    is_current: bool,
    (former_owns_dir, former_unsettled): (bool, bool),
) -> Context<'a> {
    let held_by = env.contest.and_then(|c| c.held_by.as_ref()).filter(|_| is_current);
    Context {
        node: env.node,
        root: env.root,
        models_root: &env.config.models_root,
        label_fenced: label_fenced(env, slot, inc),
        held_by,
        synced: env.synced,
        former_owns_dir: is_current && former_owns_dir,
        // A colliding model's removal in flight may take a shared key: it lands first.
        predecessor_unsettled: is_current && (former_unsettled || env.contest.is_some_and(|c| c.settling)),
        update_model_spec: env.config.update_model_spec,
        dir: shared::member_draft(inc, &env.config.models_root, (env.node, held_by.map(|_| env.dirs)))
            .map(|draft| draft.view(env.dirs, env.dirs_trashing, key, inc.uid())),
        markers_seen: env.markers_seen,
        node_witness_seq: env.node_witness_seq,
        trash_hold: env.trash_hold,
    }
}

/// Ask the shell to stop each download no longer wanted; its outcome comes back as usual, and
/// only then is its directory cleaned up or fetched again.
fn emit_cancels(emitter: &mut Emitter, slot: &mut Slot, cancels: Vec<Uid>) {
    for uid in cancels {
        let Some(run) = slot.find_mut(&uid).and_then(|inc| inc.download.as_deref_mut()) else { continue };
        run.cancel_sent = true;
        let download = run.id;
        emitter.emit(Op::CancelDownload { download }, None);
    }
}

/// Any other incarnation not confirmed gone, of this name or a colliding one, may be the live
/// one and own the label.
fn label_fenced(env: &Env, slot: &Slot, inc: &Incarnation) -> bool {
    env.contest.is_some_and(|c| c.fenced)
        || slot.all().any(|o| o.uid() != inc.uid() && !o.is_confirmed() && o.claims_label())
}

/// A directory it owns that is not kept for a reserved artifact, or its symlink (a download
/// into its path would find the link in the way).
fn owns_unreserved_dir(inc: &Incarnation) -> bool {
    (inc.owned_dir().is_some() && !inc.is_reserved()) || inc.link().is_some()
}

/// A list of one item per incarnation, in order, the first kept inline: a record has one
/// incarnation nearly always, and a vector allocated room for four at every settle.
struct FirstAndRest<T> {
    first: Option<T>,
    rest: Vec<T>,
}

impl<T> Default for FirstAndRest<T> {
    fn default() -> Self {
        FirstAndRest { first: None, rest: Vec::new() }
    }
}

impl<T> FirstAndRest<T> {
    fn push(&mut self, item: T) {
        if self.first.is_none() {
            self.first = Some(item);
        } else {
            self.rest.push(item);
        }
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().chain(&self.rest)
    }
}

impl<T> IntoIterator for FirstAndRest<T> {
    type Item = T;
    type IntoIter = std::iter::Chain<std::option::IntoIter<T>, std::vec::IntoIter<T>>;

    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.rest)
    }
}

/// Emit each decided effect and mark it in flight for its incarnation; a Failed publish is
/// noted once, here.
fn emit_actions(emitter: &mut Emitter, key: &ModelKey, slot: &mut Slot, actions: FirstAndRest<(Uid, Op, IncOp)>) {
    for (uid, op, what) in actions {
        if let IncOp::Publish { status: ModelStatus::Failed, reason } = &what {
            let reason = reason.as_deref().unwrap_or("Failed").to_string();
            let note = Note::ModelFailed { key: key.clone(), uid: uid.clone(), reason };
            emitter.notes.push(note);
        }
        let run = match (&op, &what) {
            (Op::Download { co_owners, reserve, .. }, IncOp::Fetch { plan }) => {
                Some((plan.clone(), co_owners.clone(), *reserve))
            }
            _ => None,
        };
        let owner = Owner::Inc { key: key.clone(), uid: uid.clone(), what };
        let id = emitter.emit(op, Some(owner));
        if let Some(inc) = slot.find_mut(&uid) {
            inc.inflight = Some(id).into();
            inc.download = run.map(|(plan, co_owners, reserve)| {
                Box::new(DownloadRun { id, plan, cancel_sent: false, co_owners, reserve })
            });
        }
    }
}

/// Incarnations confirmed gone with nothing left to remove leave the record, timers and all.
fn drop_finished(
    timers: &mut RunSet<(Instant, TimerKey)>,
    stats: &mut Stats,
    key: &ModelKey,
    slot: &mut Slot,
    finished: &[Uid],
) {
    for uid in finished {
        let timer_at = slot.all().find(|i| i.uid() == uid).and_then(|i| i.timer_at.get());
        if slot.current.as_ref().is_some_and(|c| c.uid() == uid) {
            slot.current = None;
        } else {
            slot.former.retain(|f| f.uid() != uid);
        }
        if let Some(at) = timer_at {
            timers.remove(&(at, inc_timer(key, uid)));
        }
        stats.cleanups_done += 1;
    }
}

/// A current incarnation that starts or stops losing a shared key: noted once, and what it
/// had published is no longer known (the owner writes the shared label and entry).
fn note_collision(emitter: &mut Emitter, key: &ModelKey, slot: &mut Slot, held_by: Option<ModelKey>) {
    let Some(inc) = slot.current.as_mut() else { return };
    if inc.held_by == held_by {
        return;
    }
    if let Some(owner) = &held_by {
        emitter.notes.push(Note::KeyCollision { key: key.clone(), uid: inc.uid().clone(), owner: owner.clone() });
    }
    inc.held_by = held_by;
    inc.published = Published::Unknown;
}

/// Keep a slot's shape true: an incarnation that is alive and unquestioned (`Observed`) is the
/// current one. A former found alive by a live read displaces the current; an empty or
/// confirmed-gone current gives way. A displaced `Observed` current becomes a candidate in turn
/// (returns how many), since two uids cannot both be alive under one name.
pub(super) fn normalize(slot: &mut Slot, now: Instant, seq: u64) -> u64 {
    let Some(pos) = slot.former.iter().position(|f| f.life == Life::Observed) else { return 0 };
    let revived = slot.former.remove(pos);
    let mut candidates = 0;
    if let Some(displaced) = slot.current.replace(revived) {
        slot.former.push(displaced);
        if displace(slot.former.last_mut().expect("just pushed"), now, seq) {
            candidates += 1;
        }
    }
    debug_assert!(slot.former.iter().all(|f| f.life != Life::Observed), "one live incarnation per name");
    candidates
}

/// Take `key` out of the models waiting for the Node witness; nearly always none wait, and an
/// empty set is not even hashed into.
fn unwait(waiting: &mut Set<ModelKey>, key: &ModelKey) {
    if !waiting.is_empty() {
        waiting.remove(key);
    }
}

pub(super) fn reindex_slot(sync: &mut KindSync, key: &ModelKey, slot: Option<&mut Slot>) {
    let Some(slot) = slot else {
        sync.pending.remove(key);
        sync.due.remove(key);
        return;
    };
    let pending = slot.some(Incarnation::is_pending);
    let due = slot.some(Incarnation::read_due);
    set_membership(&mut sync.pending, key, &mut slot.indexed_pending, pending);
    set_membership(&mut sync.due, key, &mut slot.indexed_due, due);
}

/// Make `key`'s membership of `set` equal `member`, touching the set only on a change.
pub(super) fn set_membership(set: &mut Set<ModelKey>, key: &ModelKey, indexed: &mut bool, member: bool) {
    if member == *indexed {
        return;
    }
    *indexed = member;
    if member {
        set.insert(key.clone());
    } else {
        set.remove(key);
    }
}

#[cfg(test)]
mod first_and_rest_tests {
    use super::FirstAndRest;

    /// In the order pushed, borrowed or taken, whether one item or several.
    #[test]
    fn items_come_back_in_the_order_pushed() {
        let mut list = FirstAndRest::default();
        assert!(list.is_empty() && list.iter().next().is_none());
        for item in 1..=3 {
            list.push(item);
            assert!(!list.is_empty());
        }
        assert_eq!(list.iter().copied().collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(list.into_iter().collect::<Vec<_>>(), [1, 2, 3]);
    }
}
