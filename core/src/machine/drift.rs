//! Drift reconciliation: snapshots of the node compared with the core's records, and the
//! orphan sweep (what no known model claims, confirmed by fresh LISTs).

use super::*;

/// An orphan check: things on the node no known model claims, waiting for fresh LISTs.
#[derive(Clone, Debug, Default)]
pub(super) struct OrphanCheck {
    pub(super) labels: Vec<String>,
    pub(super) entries: Vec<(String, Option<Uid>)>,
    /// Directories with their marker's uids, none of them known.
    pub(super) dirs: Vec<(String, Vec<Uid>)>,
    /// Of those, the ones whose marker records a reserved uid, with that uid: given up, never
    /// trashed (`OwnedDir::reserved`).
    pub(super) reserved: Vec<(String, Uid)>,
    /// Directories known models use whose marker names uids no record knows
    /// (`DirUse::unknown`): the LISTs tell which are gone.
    pub(super) unknown: Vec<(String, Vec<Uid>)>,
    pub(super) lists: [Option<EffectId>; 2],
    pub(super) listed: [Option<Arc<Vec<Arc<ModelObject>>>>; 2],
    /// The step it began: a copy that only a model the Node view does not place may use waits
    /// for a live read of the Node sent from then on (`copies_awaiting_witness`).
    pub(super) began_seq: u64,
    /// Decided but for such copies, waiting for that read; a new check replaces it.
    pub(super) parked: bool,
}

impl State {
    // ------------------------------------------------------------------------------------------
    // Drift
    // ------------------------------------------------------------------------------------------

    pub(super) fn on_snapshot(&mut self, st: &mut Step, requested_seq: u64, snap: DriftSnapshot) {
        let claimed = self.observe_snapshot(st, requested_seq, &snap);
        // Models it showed to have nothing here stop being claimants (`claims::contest`); those
        // it changed decide again, and the keys colliding with theirs with them.
        self.snapshot_seen = Some(self.snapshot_seen.map_or(requested_seq, |seq| seq.max(requested_seq)));
        if let Some(at) = self.snapshot_retry.take() {
            self.remove_timer(at, TimerKey::SnapshotRetry);
        }
        let mut shown: FxHashMap<&str, Vec<Uid>> = FxHashMap::default();
        for dir in &snap.owned_dirs {
            shown.entry(dir.path.as_str()).or_default().push(dir.uid.clone());
        }
        for uids in shown.values_mut() {
            uids.sort();
            uids.dedup();
        }
        shared::refresh_marked(&mut self.dirs, &shown, requested_seq, &snap.unread);
        let (mut unknown, unused) = self.unknown_marked(&shown, &claimed);
        shared::set_unknown(&mut self.dirs, &unknown);
        let known = |u: &Uid| claimed.uids.contains(u);
        let seen = (&shown, &unused[..]);
        shared::rest_shown(&mut self.dirs_rested, seen, (requested_seq, &snap.unread), known);
        // The orphan check's LISTs tell which of a rested record's unknown uids are alive (the
        // directory then counts as shared once a model comes to use it) and which gone (a
        // review: a record at rest never learnt it, and a delete trashed a live uid's files).
        // Nearly always none at rest: walked, not the snapshot's every directory.
        for (dir, using) in self.dirs_rested.iter().filter(|(_, using)| !using.unknown.is_empty()) {
            if let Some((path, _)) = shown.get_key_value(&**dir) {
                unknown.insert(*path, using.unknown.clone());
            }
        }
        for name in &snap.trash {
            if !self.trash.contains_key(name) {
                let purge_at = st.now.plus_ms(self.config.trash_grace_ms);
                self.trash.insert(name.clone(), purge_at);
                self.set_timer(purge_at, TimerKey::Purge(name.clone()));
            }
        }
        self.begin_orphan_check(st, &snap, &claimed, unknown);
    }

    /// The uids each used directory's marker names (`shown`, sorted) that no record knows, by
    /// path, and the unused directories whose marker names such a uid (nearly always none of
    /// either). A shared copy's path names its source: its marker's uids are left out.
    fn unknown_marked<'s>(
        &self,
        shown: &FxHashMap<&'s str, Vec<Uid>>,
        claimed: &Claimed,
    ) -> (FxHashMap<&'s str, Vec<Uid>>, Vec<&'s str>) {
        let (mut unknown, mut unused): (FxHashMap<&str, Vec<Uid>>, Vec<&str>) = Default::default();
        for (path, uids) in shown.iter().filter(|(path, _)| shared::copy_parts(path).is_none()) {
            let Some(using) = self.dirs.get(*path) else {
                if uids.iter().any(|u| !claimed.uids.contains(u)) {
                    unused.push(*path);
                }
                continue;
            };
            let undecided = |u: &&Uid| using.gone.binary_search(u).is_err() && !claimed.uids.contains(*u);
            let strangers: Vec<Uid> = uids.iter().filter(undecided).cloned().collect();
            if !strangers.is_empty() {
                unknown.insert(*path, strangers);
            }
        }
        (unknown, unused)
    }

    /// Every incarnation the snapshot is not stale for takes what it shows: published or
    /// drifted, its directory found or gone. Returns what the known models claim.
    fn observe_snapshot(&mut self, st: &mut Step, requested_seq: u64, snap: &DriftSnapshot) -> Claimed {
        // Hash sets with a fixed hasher: this pass is O(models) per node every period.
        // A uid may be in more than one marker (one it left keeps naming it until a download
        // rewrites it): every path of a uid, and every path the snapshot shows a marker at.
        let mut owned_by_uid: FxHashMap<&Uid, Vec<&str>> = FxHashMap::default();
        for d in &snap.owned_dirs {
            owned_by_uid.entry(&d.uid).or_default().push(&d.path);
        }
        let marked_paths: FxHashSet<&str> = snap.owned_dirs.iter().map(|d| d.path.as_str()).collect();
        // Nearly always empty: the markers' reserve records.
        let reserved: FxHashSet<(&Uid, &str)> =
            snap.owned_dirs.iter().filter(|d| d.reserved).map(|d| (&d.uid, d.path.as_str())).collect();
        let mut claimed = Claimed::new(self.slots.len(), snap);
        // Looked up by hash: a sorted map's search compares keys that share a long prefix
        // about ten times per lookup. Each with its place in the snapshot's order.
        let labels: FxHashMap<&str, (usize, &Arc<str>)> =
            snap.labels.iter().enumerate().map(|(at, (k, v))| (&**k, (at, v))).collect();
        let entries: FxHashMap<&str, (usize, &EntryView)> =
            snap.entries.iter().enumerate().map(|(at, (k, e))| (&**k, (at, e))).collect();
        let (mut label_key, mut cm_key) = (String::new(), String::new());
        for (key, shared) in self.slots.iter_mut() {
            let slot = Arc::make_mut(shared);
            wire::write_label_key(key, &mut label_key);
            wire::write_configmap_key(key, &mut cm_key);
            let label = labels.get(label_key.as_str()).copied();
            let entry = entries.get(cm_key.as_str()).copied();
            let seen = Seen {
                label: label.and_then(|(_, v)| ModelStatus::parse(v)),
                label_present: label.is_some(),
                entry: entry.map(|(_, e)| e),
            };
            // Only what the snapshot shows can be an orphan: a claim of a key it lacks is moot.
            if let Some((at, _)) = label {
                claimed.labels[at] = true;
            }
            if let Some((at, _)) = entry {
                claimed.entries[at] = true;
            }
            let has_current = slot.current.is_some();
            for (i, inc) in slot.current.iter_mut().chain(slot.former.iter_mut()).enumerate() {
                claimed.uids.insert(inc.uid().clone());
                let dirs = DirsSeen {
                    named: owned_by_uid.get(inc.uid()).map_or(&[], Vec::as_slice),
                    marked: &marked_paths,
                    unread: &snap.unread,
                };
                // A reserved model gone learns the directory its marker names however stale the
                // snapshot is for it otherwise (no marker gains a uid confirmed gone), so that it
                // gives the directory up (`DisownDir`); one gone before the first snapshot waited
                // for it (`tables::reserved_disown_pending`) and decides now.
                if inc.is_confirmed() && inc.is_reserved() {
                    let dir = dirs.named.iter().find(|d| !shared::in_artifacts(d));
                    if let Some(dir) = dir.filter(|_| inc.owned_dir().is_none()) {
                        inc.set_owned_dir(Some(dir.to_string()));
                    }
                    st.dirty.push(key.clone());
                }
                // Stale for this incarnation: something changed since the snapshot was asked for.
                if inc.inflight.is_some() || inc.changed_seq > requested_seq {
                    continue;
                }
                let label_is_its = i == 0 || !has_current;
                let record_known = knows_reserve_record(inc, &dirs, &reserved);
                if observe_incarnation(inc, &seen, label_is_its, &dirs) || !record_known {
                    st.dirty.push(key.clone());
                }
            }
        }
        claimed
    }

    /// Orphans: what no known model claims. Only fresh LISTs of every kind can make them
    /// removable; a snapshot alone never removes anything.
    fn begin_orphan_check(
        &mut self,
        st: &mut Step,
        snap: &DriftSnapshot,
        claimed: &Claimed,
        unknown: FxHashMap<&str, Vec<Uid>>,
    ) {
        let mut check = OrphanCheck {
            labels: snap
                .labels
                .iter()
                .zip(&claimed.labels)
                // Claimed first: nearly every label is, and its shape need not be parsed.
                .filter(|((l, v), claimed)| !**claimed && wire::is_model_status_label(l, v))
                .map(|((l, _), _)| l.to_string())
                .collect(),
            entries: snap
                .entries
                .iter()
                .zip(&claimed.entries)
                .filter(|((k, e), claimed_key)| {
                    (!**claimed_key || e.uid.as_ref().is_some_and(|u| !claimed.uids.contains(u)))
                        && wire::is_model_entry_key(k)
                })
                .map(|((k, e), _)| (k.to_string(), e.uid.clone()))
                .collect(),
            dirs: unclaimed_dirs(&snap.owned_dirs, &claimed.uids, &self.dirs),
            reserved: Vec::new(),
            unknown: unknown.into_iter().map(|(path, uids)| (path.to_string(), uids)).collect(),
            began_seq: st.seq,
            ..OrphanCheck::default()
        };
        // The reserve records of the unclaimed directories only (nearly always none).
        let unclaimed = |d: &&OwnedDir| d.reserved && check.dirs.iter().any(|(path, _)| *path == d.path);
        check.reserved = snap.owned_dirs.iter().filter(unclaimed).map(|d| (d.path.clone(), d.uid.clone())).collect();
        let any = !check.labels.is_empty()
            || !check.entries.is_empty()
            || !check.dirs.is_empty()
            || !check.unknown.is_empty();
        let idle = self.orphan_check.as_ref().is_none_or(|c| c.parked);
        if any && !self.shutting_down && idle {
            for kind in Kind::ALL {
                check.lists[kind.index()] = Some(self.issue_list(st, kind, ListPurpose::OrphanSweep));
            }
            self.orphan_check = Some(Arc::new(check));
        }
    }

    pub(super) fn orphan_list_done(&mut self, st: &mut Step, id: EffectId, kind: Kind, objects: Vec<Arc<ModelObject>>) {
        let Some(check) = self.orphan_check.as_mut() else { return };
        if check.lists[kind.index()] != Some(id) {
            return;
        }
        Arc::make_mut(check).listed[kind.index()] = Some(Arc::new(objects));
        if check.listed.iter().any(Option::is_none) {
            return;
        }
        self.resume_orphan_check(st);
    }

    /// Once its LISTs are in, the orphan check decides, but for the copies that wait for a
    /// fresh Node witness (`copies_awaiting_witness`): those stay in the check, parked.
    pub(super) fn resume_orphan_check(&mut self, st: &mut Step) {
        let listed = self.orphan_check.as_ref().is_some_and(|c| c.listed.iter().all(Option::is_some));
        if !listed || self.shutting_down {
            return;
        }
        let mut check = Arc::unwrap_or_clone(self.orphan_check.take().expect("checked above"));
        let waiting = self.copies_awaiting_witness(&check);
        let (parked, decided): (Vec<_>, Vec<_>) = check.dirs.drain(..).partition(|(path, _)| waiting.contains(path));
        check.dirs = decided;
        self.finish_orphan_check(st, &check);
        if !parked.is_empty() {
            self.node_reads.wanted = true;
            let check = OrphanCheck { labels: Vec::new(), entries: Vec::new(), dirs: parked, parked: true, ..check };
            self.orphan_check = Some(Arc::new(check));
        }
    }

    /// Copies that a live model may use, were it placed here, while the Node view does not place
    /// it: that view may be old (the label back, its watch event not yet come), as the core's
    /// exit evidence was (swarm seed 7006201). Decided only on a Node witness sent since the
    /// check began, with the model placed by either view keeping the copy.
    fn copies_awaiting_witness(&self, check: &OrphanCheck) -> Vec<String> {
        if self.fresh_witness(check.began_seq).is_some() {
            return Vec::new();
        }
        let listed: Vec<&ModelObject> = check.listed.iter().flatten().flat_map(|v| v.iter().map(|o| &**o)).collect();
        let awaits = |path: &str| {
            shared::copy_parts(path).is_some()
                && !self.dirs.contains_key(path)
                && !self.copy_may_be_used(&listed, path, Some(None))
                && self.copy_may_be_used(&listed, path, None)
        };
        check.dirs.iter().map(|(path, _)| path).filter(|p| awaits(p)).cloned().collect()
    }

    /// The Node as a live read sent at or after step `since_seq` showed it.
    fn fresh_witness(&self, since_seq: u64) -> Option<&NodeView> {
        let witness = self.node_reads.witness.as_ref()?;
        tables::witness_fresh(Some(since_seq), Some(witness.sent.seq)).then_some(&*witness.node)
    }

    fn finish_orphan_check(&mut self, st: &mut Step, check: &OrphanCheck) {
        let listed = check.listed.iter().flatten().flat_map(|v| v.iter());
        let mut labels = BTreeSet::new();
        let mut entries = BTreeSet::new();
        let mut uids = BTreeSet::new();
        for obj in listed {
            // One being deleted (its finalizer still held) claims no label: that is final, and
            // its cleanup removes only a label it wrote, so a colliding model's label it fenced
            // would stay for good (swarm seed 10005080).
            if !obj.deleting {
                labels.insert(wire::label_key(&obj.key));
            }
            entries.insert(wire::configmap_key(&obj.key));
            uids.insert(obj.uid.clone());
        }
        for (key, slot) in self.slots.iter() {
            labels.insert(wire::label_key(key));
            entries.insert(wire::configmap_key(key));
            uids.extend(slot.all().map(|i| i.uid().clone()));
        }
        for label_key in check.labels.iter().filter(|l| !labels.contains(*l)) {
            self.emit(
                st,
                Op::RemoveOrphanLabel { label_key: label_key.clone() },
                Some(Owner::Orphan { dir: None, gives_up: false }),
            );
        }
        for (cm_key, uid) in &check.entries {
            let orphan = match uid {
                Some(u) => !uids.contains(u),
                None => !entries.contains(cm_key),
            };
            if orphan {
                self.emit(
                    st,
                    Op::RemoveOrphanEntry { cm_key: cm_key.clone(), uid: uid.clone() },
                    Some(Owner::Orphan { dir: None, gives_up: false }),
                );
            }
        }
        self.forget_unknown_gone(st, check);
        self.sweep_orphan_dirs(st, check, &uids);
    }

    /// The check's directories that no known model uses and no live uid keeps (a copy: no
    /// model that may use it) go to the trash, or are given up when their marker records a
    /// reserved uid.
    fn sweep_orphan_dirs(&mut self, st: &mut Step, check: &OrphanCheck, uids: &BTreeSet<Uid>) {
        let listed: Vec<&ModelObject> = check.listed.iter().flatten().flat_map(|v| v.iter().map(|o| &**o)).collect();
        for (path, marker_uids) in &check.dirs {
            // A copy is kept by its users, not by the uids in its marker: a model that switched
            // to its own download still lives, and its marker uid must not keep the copy.
            let kept = match shared::copy_parts(path) {
                Some(_) => self.copy_may_be_used(&listed, path, Some(self.fresh_witness(check.began_seq))),
                None => marker_uids.iter().any(|u| uids.contains(u)),
            };
            if kept || self.dirs.contains_key(path.as_str()) {
                continue;
            }
            // A model deleted while no agent ran, whose marker says it was reserved: its files
            // stay, as upstream leaves them, and the marker goes (a later model may adopt them).
            // A copy is its users' (above), whatever its marker records.
            let reserved = check.reserved.iter().find(|(p, u)| p == path && marker_uids.contains(u));
            // Either way nothing is fetched into it until the outcome: a download reading the
            // marker before the disown lands would find it another model's.
            let dir: Arc<str> = Arc::from(path.as_str());
            self.dirs_trashing.insert(dir.clone());
            if let Some((_, uid)) = reserved.filter(|_| shared::copy_parts(path).is_none()) {
                let op = Op::DisownDir { key: None, uid: uid.clone(), path: path.clone(), keep: Vec::new() };
                self.emit(st, op, Some(Owner::Orphan { dir: Some(dir), gives_up: true }));
                continue;
            }
            let uid = marker_uids[0].clone();
            let trash_name = format!("{uid}-{}", st.now.as_ms());
            let op = Op::TrashDir { key: None, uid, path: path.clone(), trash_name };
            self.emit(st, op, Some(Owner::Orphan { dir: Some(dir), gives_up: false }));
        }
    }

    /// The uids the check found unknown in used directories' markers that no record knows:
    /// those its LISTs show gone (not listed, or listed being deleted: final) are forgotten
    /// there, those they show alive recorded so, and the directories' members decide again.
    fn forget_unknown_gone(&mut self, st: &mut Step, check: &OrphanCheck) {
        if check.unknown.is_empty() {
            return;
        }
        let listed = check.listed.iter().flatten().flat_map(|v| v.iter());
        let alive: FxHashSet<&Uid> = listed.filter(|o| !o.deleting).map(|o| &o.uid).collect();
        let known: FxHashSet<&Uid> = self.slots.values().flat_map(|s| s.all()).map(|i| i.uid()).collect();
        for (path, marked) in &check.unknown {
            let (seen, gone): (Vec<Uid>, Vec<Uid>) =
                marked.iter().filter(|u| !known.contains(u)).cloned().partition(|u| alive.contains(u));
            shared::seen_alive(&mut self.dirs, path, &seen);
            shared::seen_alive(&mut self.dirs_rested, path, &seen);
            if gone.is_empty() && seen.is_empty() {
                continue;
            }
            shared::forget_gone(&mut self.dirs, path, &gone);
            shared::forget_gone(&mut self.dirs_rested, path, &gone);
            shared::unrest_if_done(&mut self.dirs_rested, path);
            if let Some(using) = self.dirs.get(path.as_str()) {
                st.dirty.extend(using.members.iter().map(|m| m.key.clone()));
            }
        }
    }

    /// Each `Op::DisownDir` of the step keeps in the marker the uids of the directory (its
    /// members and what its marker is known to name) that may be of live models placed here: a
    /// known incarnation neither withdrawn from this node, nor a candidate, nor confirmed gone
    /// (or reserved and not confirmed gone: away, it keeps its directory), or, before every
    /// kind is listed, a uid no known model has. Any other uid in the marker is of a model gone,
    /// and would make the directory an orphan's; or of one away from the node, whose delete
    /// would then make the files the disowning reserved model kept an orphan's (swarm seed
    /// 12709). A marker left naming no one goes: a directory without one is never trashed, and
    /// a model placed again adopts it. Filled when every record of the step is settled, so that no live model is left
    /// out for the order in which keys settle (a second review found that hole in a `keep` read
    /// during settling).
    pub(super) fn fill_disowns(&self, st: &mut Step) {
        // Nearly every step has none: a look, no list made.
        if !st.out.iter().any(|e| matches!(e.op, Op::DisownDir { .. })) {
            return;
        }
        let paths: Vec<String> = st
            .out
            .iter()
            .filter_map(|e| if let Op::DisownDir { path, .. } = &e.op { Some(path.clone()) } else { None })
            .collect();
        // One pass over the records: which uids may stay here, and which such models' specs name a
        // disowned path (such a model may be in the marker though the record does not say so:
        // a download that kept the marker's uids before the first snapshot).
        let mut staying: FxHashMap<&Uid, bool> = FxHashMap::default();
        let mut naming: Vec<(&str, &Uid)> = Vec::new();
        for inc in self.slots.values().flat_map(|s| s.all()) {
            // A reserved model away keeps its directory while it lives (a second review). A
            // candidate (its delete or exit not yet confirmed) is not kept: if it is gone, the
            // files would be an orphan's and the sweep's (swarm seed 37744); if it lives, it
            // fetches them again. A reserved one gives the directory up itself once confirmed.
            let stays = (inc.may_stay() && !inc.is_pending()) || (inc.is_reserved() && !inc.is_confirmed());
            *staying.entry(inc.uid()).or_default() |= stays;
            let dest = inc.dest.as_ref().ok().and_then(|d| d.as_ref()?.beneath_root());
            if let Some(path) = dest.filter(|d| stays && paths.iter().any(|p| p == d)) {
                naming.push((path, inc.uid()));
            }
        }
        let synced = self.kinds.iter().all(|k| k.synced);
        for e in st.out.iter_mut() {
            let Op::DisownDir { uid, path, keep, .. } = &mut e.op else { continue };
            let using = self.dirs.get(path.as_str());
            let recorded = using.into_iter().flat_map(|d| d.marked.iter().chain(d.members.iter().map(|m| &m.uid)));
            // A uid no record knows that the LISTs showed alive stays too (a review).
            let alive = |u: &Uid| using.is_some_and(|d| d.alive.contains(u));
            let recorded_staying = recorded.filter(|u| staying.get(*u).copied().unwrap_or(!synced || alive(u)));
            let named = naming.iter().filter(|(p, _)| *p == path.as_str()).map(|(_, u)| *u);
            let mut kept: Vec<Uid> = recorded_staying.chain(named).filter(|u| *u != uid).cloned().collect();
            kept.sort();
            kept.dedup();
            *keep = kept;
        }
    }

    /// May a model listed now or known use the copy `rel` (`shared::may_use_copy`)? With
    /// `placed: Some(witness)`, only one placed here by the Node view or by that witness; with
    /// `None`, wherever it is placed.
    fn copy_may_be_used(&self, listed: &[&ModelObject], rel: &str, placed: Option<Option<&NodeView>>) -> bool {
        let node = self.node.as_deref();
        let eligible = |spec: &crate::model::ModelSpec, on: Option<&NodeView>| {
            on.is_some_and(|n| placement(spec, n).is_eligible())
        };
        let placed = |obj: &ModelObject| match (obj.spec(), node, placed) {
            (Some(spec), Some(_), Some(witness)) => eligible(spec, node) || eligible(spec, witness),
            _ => true,
        };
        let known_commit = |obj: &ModelObject| {
            let inc = self.slots.get(&obj.key)?.all().find(|i| *i.uid() == obj.uid)?;
            inc.resolved_for(&obj.spec()?.storage_uri).map(str::to_string)
        };
        // A model being deleted (its finalizer still held) never uses it again.
        let listed_uses =
            listed.iter().any(|o| !o.deleting && placed(o) && shared::may_use_copy(o, known_commit(o).as_deref(), rel));
        listed_uses
            || self.slots.values().flat_map(|s| s.all()).any(|i| {
                i.may_stay() && placed(&i.obj) && shared::may_use_copy(&i.obj, known_commit(&i.obj).as_deref(), rel)
            })
    }
}

/// What the process believes the marker of the directory an incarnation downloaded into records
/// of its reserve label, set to what the snapshot shows where the marker names it (a record that
/// failed, or one a download could not write, is then sent again). False when it changed.
fn knows_reserve_record(inc: &mut Incarnation, dirs: &DirsSeen, reserved: &FxHashSet<(&Uid, &str)>) -> bool {
    let Fetched::Done(done) = &inc.fetched else { return true };
    // Nearly always no marker records anything and the process believes none does.
    if reserved.is_empty() && !done.reserve_recorded {
        return true;
    }
    let Some((_, dir)) = done.plan.fetch_into().filter(|(_, dir)| dirs.named.contains(dir)) else { return true };
    let recorded = reserved.contains(&(inc.uid(), dir));
    if done.reserve_recorded == recorded {
        return true;
    }
    if let Fetched::Done(done) = &mut inc.fetched {
        done.reserve_recorded = recorded;
    }
    false
}

/// Directories whose marker names no known uid (any copy) and that no known model uses, grouped
/// by path.
fn unclaimed_dirs(
    owned: &[OwnedDir],
    claimed: &FxHashSet<Uid>,
    dirs: &Map<Arc<str>, Arc<shared::DirUse>>,
) -> Vec<(String, Vec<Uid>)> {
    // Nearly every directory is claimed: it is set aside before any grouping. A copy's marker
    // uids do not claim it (its users do: `dirs`, then the LISTs).
    let claimed_paths: FxHashSet<&str> =
        owned.iter().filter(|d| claimed.contains(&d.uid)).map(|d| d.path.as_str()).collect();
    let mut by_path: BTreeMap<&str, Vec<Uid>> = BTreeMap::new();
    for d in owned {
        let path = d.path.as_str();
        let claimed_here = claimed_paths.contains(path) && shared::copy_parts(path).is_none();
        if !claimed_here && !dirs.contains_key(path) {
            by_path.entry(path).or_default().push(d.uid.clone());
        }
    }
    by_path.into_iter().map(|(path, uids)| (path.to_string(), uids)).collect()
}

/// What a snapshot shows under one model's keys.
struct Seen<'a> {
    label: Option<ModelStatus>,
    label_present: bool,
    entry: Option<&'a EntryView>,
}

/// What the known models claim: their uids, and which of the snapshot's labels and ConfigMap
/// entries are theirs (a flag per place in the snapshot's order, not a set of borrowed keys).
struct Claimed {
    uids: FxHashSet<Uid>,
    labels: Vec<bool>,
    entries: Vec<bool>,
}

impl Claimed {
    /// The uids sized for `models` up front: growing the set by doubling on every pass costs
    /// more than the pass's own comparisons.
    fn new(models: usize, snap: &DriftSnapshot) -> Self {
        Claimed {
            uids: FxHashSet::with_capacity_and_hasher(models, Default::default()),
            labels: vec![false; snap.labels.len()],
            entries: vec![false; snap.entries.len()],
        }
    }
}

/// What a snapshot shows of one uid's directories: the paths whose marker names it, and every
/// path with a marker.
struct DirsSeen<'a> {
    named: &'a [&'a str],
    marked: &'a FxHashSet<&'a str>,
    /// What the scan could not read (`DriftSnapshot::unread`).
    unread: &'a [String],
}

impl DirsSeen<'_> {
    /// Could the scan have missed a marker at `path`?
    fn may_miss(&self, path: &str) -> bool {
        self.unread.iter().any(|u| {
            u.is_empty() || path == u || path.strip_prefix(u.as_str()).is_some_and(|rest| rest.starts_with('/'))
        })
    }
}

/// One incarnation takes what the snapshot shows; true if anything about it changed.
fn observe_incarnation(inc: &mut Incarnation, seen: &Seen, label_is_its: bool, dirs: &DirsSeen) -> bool {
    let mut changed = false;
    let entry_is_its = seen.entry.is_some_and(|e| e.is_of(inc.uid().as_str()));
    let observed = match (label_is_its && seen.label_present, entry_is_its) {
        (false, false) => Published::Nothing,
        (true, true) => match (&inc.published, seen.label, seen.entry.and_then(|e| e.status)) {
            (Published::Status { status, .. }, Some(l), Some(e)) if *status == l && *status == e => {
                inc.published.clone()
            }
            _ => Published::Drifted,
        },
        _ => Published::Drifted,
    };
    if observed != inc.published {
        inc.published = observed;
        changed = true;
    }
    let named = |path: &str| dirs.named.contains(&path);
    // A leaving incarnation is not given a shared copy its marker names: it would release it
    // at once, ask for the sweep, and the sweep's snapshot would give it the copy again (a
    // snapshot a second while the copy stays). Copies are the sweep's to remove, not a member's.
    let first = dirs.named.iter().copied().find(|d| inc.may_stay() || !shared::in_artifacts(d));
    match (first, &inc.fetched) {
        (Some(first), _) if inc.owned_dir().is_none() => {
            // Where it would fetch, if a marker names it there; else the first that does.
            let own = match &inc.dest {
                Ok(Some(dest)) => dest.beneath_root().filter(|d| named(d)),
                _ => None,
            };
            inc.set_owned_dir(Some(own.unwrap_or(first).to_string()));
            changed = true;
        }
        // Ready, but the weights are gone from disk: fetch again (#834's drift). Not where the
        // scan could not read: a marker missed there proves nothing.
        (None, Fetched::Done(done))
            if matches!(done.plan, Plan::Download { .. })
                && !done.plan.fetch_into().is_some_and(|(_, dir)| dirs.may_miss(dir)) =>
        {
            inc.set_owned_dir(None);
            inc.fetched = Fetched::No;
            changed = true;
        }
        // The snapshot shows a marker at its path that does not name it (another uid's download
        // took the path): it owns nothing there, and keeps no one else's weights as its own.
        // Only on that evidence: a scan that missed the marker proves nothing. A shared copy's
        // marker is read apart (its users are its marker's uids and its links).
        _ if inc.owned_dir().is_some_and(|d| !shared::in_artifacts(d) && !named(d) && dirs.marked.contains(d)) => {
            inc.set_owned_dir(None);
            changed = true;
        }
        _ => {}
    }
    // The same for a shared copy, whose marker need not name every model using it: no marker
    // at the copy's path at all, where the scan read everything. Apart from the match: a marker
    // naming it elsewhere (an old download of its own) does not put this off a drift period.
    if let Fetched::Done(done) = &inc.fetched
        && matches!(done.plan, Plan::Shared { .. })
        && done.plan.fetch_into().is_some_and(|(_, copy)| !dirs.marked.contains(copy) && !dirs.may_miss(copy))
    {
        inc.fetched = Fetched::No;
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `unclaimed_dirs` returned before it set claimed directories aside: every directory
    /// grouped by path, then the groups filtered. Kept as the checker of the faster one.
    fn unclaimed_dirs_by_grouping(
        owned: &[OwnedDir],
        claimed: &FxHashSet<Uid>,
        dirs: &Map<Arc<str>, Arc<shared::DirUse>>,
    ) -> Vec<(String, Vec<Uid>)> {
        let mut by_path: BTreeMap<&str, Vec<Uid>> = BTreeMap::new();
        for d in owned {
            by_path.entry(d.path.as_str()).or_default().push(d.uid.clone());
        }
        let unclaimed =
            |path: &str, uids: &[Uid]| shared::copy_parts(path).is_some() || !uids.iter().any(|u| claimed.contains(u));
        by_path
            .into_iter()
            .filter(|(path, uids)| unclaimed(path, uids) && !dirs.contains_key(*path))
            .map(|(path, uids)| (path.to_string(), uids))
            .collect()
    }

    /// The drift pass's shortcut keeps the one ownership rule: for every shape of entry.
    #[test]
    fn an_entry_is_of_a_uid_as_the_ownership_rule_says() {
        for status in [None, Some(ModelStatus::Ready), Some(ModelStatus::Failed)] {
            for uid in [None, Some(Uid::new("a"))] {
                let view = EntryView { status, uid: uid.clone() };
                for asked in ["a", "b", ""] {
                    let rule = wire::entry_is_of(&view.owner(), asked);
                    assert_eq!(view.is_of(asked), rule, "{view:?} asked for {asked:?}");
                }
            }
        }
    }

    #[test]
    fn unclaimed_dirs_agree_with_grouping_first() {
        let copy = format!("_artifacts/org/repo/{}", "a".repeat(40));
        let paths = ["b", "a", copy.as_str(), "c", "in-use"];
        let uids = ["u1", "u2", "u3"];
        let mut prng = crate::prng::Prng::new(7);
        let mut dirs: Map<Arc<str>, Arc<shared::DirUse>> = Map::default();
        dirs.insert(Arc::from("in-use"), Arc::default());
        let mut groups_seen = 0;
        for _ in 0..2_000 {
            let owned: Vec<OwnedDir> = (0..prng.up_to(7))
                .map(|_| OwnedDir {
                    path: paths[prng.up_to(paths.len() as u64 - 1) as usize].to_string(),
                    uid: Uid::new(uids[prng.up_to(uids.len() as u64 - 1) as usize]),
                    reserved: false,
                })
                .collect();
            let claimed: FxHashSet<Uid> = uids.iter().filter(|_| prng.up_to(1) == 0).map(|u| Uid::new(u)).collect();
            let expected = unclaimed_dirs_by_grouping(&owned, &claimed, &dirs);
            groups_seen += expected.len();
            assert_eq!(unclaimed_dirs(&owned, &claimed, &dirs), expected, "{owned:?} {claimed:?}");
        }
        assert!(groups_seen > 1_000, "the cases reach unclaimed groups: {groups_seen}");
    }
}
