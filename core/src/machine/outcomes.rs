//! Effect outcomes: what a finished effect changes in its owner's record.

use super::*;

impl State {
    pub(super) fn on_effect_done(&mut self, st: &mut Step, id: EffectId, outcome: Outcome) {
        // Looked up only on a failure: the common path stays one lookup.
        if let Outcome::Failed(reason) = &outcome
            && matches!(self.inflight.get(&id), Some(Owner::Snapshot { .. }))
        {
            return self.on_snapshot_failed(st, id, reason.clone());
        }
        // Reads, probes and snapshots answer with their own inputs (an `EffectDone` for one is
        // a shell bug, but a snapshot's failure): their owners stay where they are.
        let answers_itself = |o: &Owner| {
            matches!(o, Owner::Get { .. } | Owner::List { .. } | Owner::NodeGet { .. } | Owner::Snapshot { .. })
        };
        // Taken, not cloned (a fetch's owner holds its whole plan), and put back in the rare
        // case it answers itself: one lookup on the common path.
        let Some(owner) = self.inflight.remove(&id) else { return };
        if answers_itself(&owner) {
            self.inflight.insert(id, owner);
            return;
        }
        match owner {
            Owner::Inc { key, uid, what } => {
                if let Some(dir) = self.inc_effect_done(st, id, (key, uid), what, outcome) {
                    self.forget_fetches_into(st, &dir);
                }
            }
            Owner::Purge { name } => self.purge_done(st, id, name, outcome),
            Owner::Orphan { dir, gives_up } => {
                if let Some(dir) = &dir {
                    self.dirs_trashing.remove(dir);
                    // Whoever waited to fetch into it decides again.
                    if let Some(using) = self.dirs.get(dir) {
                        st.dirty.extend(using.members.iter().map(|m| m.key.clone()));
                    }
                }
                match outcome {
                    // Given up, the files stay: what was fetched there still is.
                    Outcome::Done | Outcome::Downloaded(_) | Outcome::Resolved { .. } if gives_up => {
                        self.stats.orphans_given_up += 1;
                    }
                    Outcome::Done | Outcome::Downloaded(_) | Outcome::Resolved { .. } => {
                        self.stats.orphans_removed += 1;
                        if let Some(dir) = dir {
                            self.forget_fetches_into(st, &dir);
                        }
                    }
                    // The next drift pass finds it again.
                    Outcome::Failed(reason) | Outcome::Occupied(reason) => {
                        self.stats.effects_failed += 1;
                        let retry_in_ms = self.config.drift_period_ms;
                        st.notes.push(Note::EffectFailed { id, reason, retry_in_ms });
                    }
                }
            }
            // Left in place above.
            Owner::Get { .. } | Owner::List { .. } | Owner::NodeGet { .. } | Owner::Snapshot { .. } => {}
        }
    }

    /// A directory went to the trash: nobody's files are there any more, whoever fetched them.
    /// An incarnation that was no member of it then (one whose keys a colliding model held,
    /// say) kept its fetch as done and was published Ready on nothing (swarm seed 600000047).
    fn forget_fetches_into(&mut self, st: &mut Step, dir: &str) {
        let fetched_there = |inc: &Incarnation| matches!(&inc.fetched, Fetched::Done(done) if done.plan.fetch_into().is_some_and(|(_, d)| d == dir));
        let keys: Vec<ModelKey> =
            self.slots.iter().filter(|(_, slot)| slot.all().any(fetched_there)).map(|(k, _)| k.clone()).collect();
        self.forget_fetches(st, keys, fetched_there);
    }

    /// `uid`'s download from `source` into `dir` landed: what the directory's other members
    /// fetched there from another source is replaced, and they fetch again (swarm seed 14278:
    /// a member switched back to the source it had fetched before, and was Ready over the
    /// other source's files a co-owner had fetched since). Not in a shared copy, whose path
    /// names its commit.
    fn forget_other_sources_in(&mut self, st: &mut Step, dir: &str, source: &str, uid: &Uid) {
        if shared::in_artifacts(dir) {
            return;
        }
        let Some(using) = self.dirs.get(dir).filter(|u| u.members.iter().any(|m| m.uid != *uid)) else { return };
        let keys: Vec<ModelKey> = using.members.iter().filter(|m| m.uid != *uid).map(|m| m.key.clone()).collect();
        let replaced = |inc: &Incarnation| {
            inc.uid() != uid
                && matches!(&inc.fetched, Fetched::Done(done)
                    if done.plan.fetch_into().is_some_and(|(s, d)| d == dir && **s != *source))
        };
        self.forget_fetches(st, keys, replaced);
    }

    /// The incarnations of `keys` for which `gone` holds fetch again.
    fn forget_fetches(&mut self, st: &mut Step, mut keys: Vec<ModelKey>, gone: impl Fn(&Incarnation) -> bool) {
        keys.dedup();
        for key in keys {
            // A look first: no copy-on-write path for a key with nothing to forget.
            if !self.slots.get(&key).is_some_and(|s| s.all().any(&gone)) {
                continue;
            }
            let Some(slot) = self.slots.get_mut(&key).map(Arc::make_mut) else { continue };
            for inc in slot.all_mut().filter(|inc| gone(inc)) {
                inc.fetched = Fetched::No;
                inc.changed_seq = st.seq;
            }
            st.dirty.push(key);
        }
    }

    /// An incarnation's effect landed or failed: record what is now true of it. Returns the
    /// directory a trash of its moved away.
    fn inc_effect_done(
        &mut self,
        st: &mut Step,
        id: EffectId,
        (key, uid): (ModelKey, Uid),
        what: IncOp,
        outcome: Outcome,
    ) -> Option<String> {
        let now = st.now;
        let State { slots, config, prng, stats, trash, timers, dirs, .. } = self;
        let inc = slots.get_mut(&key).map(Arc::make_mut).and_then(|s| s.find_mut(&uid))?;
        inc.inflight = WordOption::NONE;
        let run = inc.download.take();
        inc.changed_seq = st.seq;
        st.dirty.push(key.clone());
        match (outcome, what) {
            (outcome, IncOp::Fetch { plan }) => {
                let landed = fetch_outcome(inc, &uid, (config, prng, dirs), (now, st.seq), (run, plan), outcome);
                if let Some((dir, source)) = landed {
                    self.forget_other_sources_in(st, &dir, &source, &uid);
                }
            }
            (Outcome::Occupied(reason), IncOp::Link { paths }) => {
                st.notes.push(Note::LinkRefused { key: key.clone(), uid: uid.clone(), reason });
                inc.share_mut().refused_at = Some(paths.link.into_boxed_str());
            }
            // Best effort (the controller fills the same fields from the entry): a failure, logged
            // by the shell, is not retried for this incarnation and holds back nothing else.
            (Outcome::Failed(_), IncOp::FillSpec) => {
                inc.spec_filled = true;
                stats.effects_failed += 1;
            }
            // Landed or not, taken as recorded: a failure holds back nothing else either (a model's
            // own effects would wait on its backoff); a snapshot that shows the marker's record
            // otherwise sends it again (`drift::knows_reserve_record`), once a drift period.
            (outcome, IncOp::RecordReserve { reserved }) => {
                if let Fetched::Done(done) = &mut inc.fetched {
                    done.reserve_recorded = reserved;
                }
                match outcome {
                    Outcome::Failed(reason) | Outcome::Occupied(reason) => {
                        stats.effects_failed += 1;
                        st.notes.push(Note::EffectFailed { id, reason, retry_in_ms: config.drift_period_ms });
                    }
                    Outcome::Done | Outcome::Downloaded(_) | Outcome::Resolved { .. } => inc.failures = 0,
                }
            }
            (Outcome::Failed(reason) | Outcome::Occupied(reason), what) => {
                inc.effect_failed(&what);
                let delay = inc.failed_once(config, prng);
                inc.blocked_until = Some(now.plus_ms(delay)).into();
                stats.effects_failed += 1;
                st.notes.push(Note::EffectFailed { id, reason, retry_in_ms: delay });
            }
            (Outcome::Done | Outcome::Downloaded(_) | Outcome::Resolved { .. }, what) => {
                inc.failures = 0;
                let trash_at = |name: String| {
                    let purge_at = now.plus_ms(config.trash_grace_ms);
                    trash.insert(name.clone(), purge_at);
                    timers.insert((purge_at, TimerKey::Purge(name)));
                };
                return landed(inc, &uid, what, (dirs, st.seq), trash_at);
            }
        }
        None
    }

    /// A download's progress goes into its entry (the label stays Updating): only while the
    /// model is here, Updating, undisputed and not being cancelled. Fire and forget: a lost
    /// write is replaced by the next report, and the writer keeps effects in order, so it
    /// never lands after the final Ready, Failed or withdrawal.
    pub(super) fn on_download_progress(&mut self, st: &mut Step, id: EffectId, progress: wire::DownloadProgress) {
        let Some(Owner::Inc { key, uid, .. }) = self.inflight.get(&id).cloned() else { return };
        let Some(inc) = self.slots.get(&key).and_then(|s| s.current.as_ref()).filter(|i| *i.uid() == uid) else {
            return;
        };
        let running = inc.download.as_ref().is_some_and(|run| run.id == id && !run.cancel_sent);
        let updating = matches!(inc.published, Published::Status { status: ModelStatus::Updating, .. });
        if !(running && updating && inc.life == Life::Observed && inc.held_by.is_none()) {
            return;
        }
        let entry = wire::ModelEntry {
            uid: Some(uid.as_str().to_string()),
            progress: Some(progress),
            ..wire::ModelEntry::new(&key.name, ModelStatus::Updating)
        };
        let op = Op::Publish {
            label_key: wire::label_key(&key),
            label: None,
            cm_key: wire::configmap_key(&key),
            entry: Box::new(entry),
            key,
            uid,
        };
        self.emit(st, op, None);
    }

    /// A purge that failed is tried again after the longest retry delay.
    fn purge_done(&mut self, st: &mut Step, id: EffectId, name: String, outcome: Outcome) {
        match outcome {
            Outcome::Done | Outcome::Downloaded(_) | Outcome::Resolved { .. } => {
                self.trash.remove(&name);
            }
            Outcome::Failed(reason) | Outcome::Occupied(reason) => {
                let delay = self.config.retry_delay_ms_max;
                self.trash.insert(name.clone(), st.now.plus_ms(delay));
                self.set_timer(st.now.plus_ms(delay), TimerKey::Purge(name));
                self.stats.effects_failed += 1;
                st.notes.push(Note::EffectFailed { id, reason, retry_in_ms: delay });
            }
        }
    }
}

/// What an incarnation's effect that landed makes true of it (`trash_at` schedules the purge of
/// a trash entry). Returns the directory a trash of its moved away.
fn landed(
    inc: &mut Incarnation,
    uid: &Uid,
    what: IncOp,
    (dirs, seq): (&mut Map<Arc<str>, Arc<shared::DirUse>>, u64),
    trash_at: impl FnOnce(String),
) -> Option<String> {
    match what {
        IncOp::Publish { status, reason } => inc.published = Published::Status { status, reason },
        IncOp::Unpublish => inc.published = Published::Nothing,
        IncOp::Trash { name } => {
            trash_at(name);
            // What anyone fetched there is gone (`forget_fetches_into`).
            return inc.share.as_mut().and_then(|s| s.owned_dir.take());
        }
        IncOp::Disown => {
            if let Some(dir) = inc.share.as_mut().and_then(|s| s.owned_dir.take()) {
                shared::unmarked(dirs, &dir, uid, seq);
            }
            inc.share_mut().disowned = true;
        }
        IncOp::FillSpec => inc.spec_filled = true,
        IncOp::Link { paths } => inc.share_mut().link = Some(Box::new((paths.link, paths.copy))),
        IncOp::Unlink => inc.share_mut().link = None,
        IncOp::Fetch { .. } | IncOp::RecordReserve { .. } => unreachable!("matched before"),
    }
    None
}

/// A fetch's outcome: recorded (`fetch_done`), and the directory now marked for `uid` noted with
/// the run's co-owners. Returns that directory and the source, when the fetch landed there.
fn fetch_outcome(
    inc: &mut Incarnation,
    uid: &Uid,
    (config, prng, dirs): (&Config, &mut Prng, &mut Map<Arc<str>, Arc<shared::DirUse>>),
    (now, seq): (Instant, u64),
    (run, plan): (Option<Box<DownloadRun>>, Arc<Plan>),
    outcome: Outcome,
) -> Option<(String, Arc<str>)> {
    let reserve = run.as_ref().is_some_and(|r| r.reserve);
    let mut owners = run.map(|r| r.co_owners).unwrap_or_default();
    // The run is dropped: the plan is this one's alone, and moves without a copy.
    let plan = Arc::unwrap_or_clone(plan);
    let source = plan.fetch_into().map(|(source, _)| Arc::clone(source));
    let dir = fetch_done(inc, (config, prng), now, (plan, reserve), outcome)?;
    owners.push(uid.clone());
    shared::marked(dirs, &dir, &owners, seq);
    let landed = matches!(inc.fetched, Fetched::Done(_));
    source.filter(|_| landed).map(|source| (dir, source))
}

/// A check, a download or a resolve ended. Failed: the model is Failed on this node (published,
/// and noted, next) and fetched again after the backoff, or after the source's own delay when
/// that is longer. Cancelled: nothing to wait for (the core asked; what follows decides).
/// Returns the directory now marked for this uid.
fn fetch_done(
    inc: &mut Incarnation,
    (config, prng): (&Config, &mut Prng),
    now: Instant,
    (plan, reserve): (Plan, bool),
    outcome: Outcome,
) -> Option<String> {
    let dest = plan.fetch_into().map(|(_, dir)| dir.to_string());
    let (marked, result) = match outcome {
        // A plain outcome (the simulator's, or a trace's) for a download: marked when done.
        Outcome::Done => (true, DownloadResult::Done { commit: String::new(), metadata: None, bytes: 0 }),
        Outcome::Failed(reason) | Outcome::Occupied(reason) => {
            (false, DownloadResult::Failed { reason, retry_after_ms: None })
        }
        Outcome::Downloaded(end) => (end.marked, end.result),
        Outcome::Resolved { commit } => return resolved(inc, (config, prng), now, plan, commit),
    };
    if let Plan::Resolve { .. } = plan
        && let DownloadResult::Done { .. } = result
    {
        return resolved(inc, (config, prng), now, plan, String::new());
    }
    if marked && dest.is_some() {
        inc.set_owned_dir(dest.clone());
    }
    match result {
        DownloadResult::Done { commit, metadata, bytes } => {
            inc.failures = 0;
            let commit = Some(commit).filter(|c| !c.is_empty()).map(|c| Arc::from(c.as_str()));
            let metadata = metadata.filter(|m| wire::model_config_fits(m)).map(|m| Arc::new(*m));
            let reserve_recorded = reserve && marked;
            inc.fetched = Fetched::Done(Box::new(FetchDone { plan, commit, metadata, bytes, reserve_recorded }));
        }
        DownloadResult::Failed { reason, retry_after_ms } => {
            let delay = inc.failed_once(config, prng).max(retry_after_ms.unwrap_or(0));
            let reason = Arc::from(reason.as_str());
            inc.fetched = Fetched::Failed(Box::new(FetchFailed { plan, reason, retry_at: now.plus_ms(delay) }));
        }
        DownloadResult::Cancelled => inc.fetched = Fetched::No,
    }
    dest.filter(|_| marked)
}

/// A revision resolved: the plan becomes the copy of that commit. A commit that cannot name a
/// copy is the model's Failed reason, tried again after the backoff.
fn resolved(
    inc: &mut Incarnation,
    (config, prng): (&Config, &mut Prng),
    now: Instant,
    plan: Plan,
    commit: String,
) -> Option<String> {
    let Plan::Resolve { storage_uri } = &plan else {
        let reason = Arc::from("a resolve answered an effect that was not one");
        inc.fetched = Fetched::Failed(Box::new(FetchFailed { plan, reason, retry_at: now }));
        return None;
    };
    if !shared::is_commit(&commit) {
        let delay = inc.failed_once(config, prng);
        let reason = Arc::from(format!("resolving {storage_uri} gave {commit:?}, not a commit").as_str());
        inc.fetched = Fetched::Failed(Box::new(FetchFailed { plan, reason, retry_at: now.plus_ms(delay) }));
        return None;
    }
    inc.share_mut().resolved = Some(Box::new((storage_uri.to_string(), commit)));
    inc.failures = 0;
    inc.fetched = Fetched::No;
    None
}
