//! Directories several models use (issue #10): the node's one copy of a commit under
//! `_artifacts/<org>/<repo>/<commit>` (`downloadPolicy: ReuseIfExists` on `hf://`), with a
//! relative symlink from each model's path, and one destination named by models with the same
//! source and path. Who uses a directory is the core's own record (`State::dirs`, every
//! incarnation of either kind), never a walk of the filesystem for symlinks.
//!
//! - One download into a directory at a time; each member runs its own (the second finds the
//!   files in place and checks them), so every member's uid ends up in the directory's marker.
//! - A member leaving never trashes a directory another live member uses. A copy is never
//!   trashed by a member at all: once no member is left, an early snapshot finds it unclaimed and
//!   the orphan sweep trashes it after fresh LISTs of both kinds show no model that may use it.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};

use super::*;
use crate::dest_path::DestPath;
use crate::model::DownloadPolicy;
use crate::storage_uri::StorageUri;

/// The shared copies' folder beneath the models root.
pub const ARTIFACTS_DIR: &str = "_artifacts";
/// A snapshot follows a copy's last member leaving after this long.
pub const SWEEP_DELAY_MS: u64 = 1_000;

/// What one incarnation is to a directory it fetches into or owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub key: ModelKey,
    pub uid: Uid,
    /// What it fetches into the directory; `None` when it only owns it from an earlier plan.
    pub source: Option<Arc<str>>,
    /// Not confirmed gone.
    pub alive: bool,
    /// A download of it into the directory is in flight.
    pub downloading: bool,
    /// Its files are there: its download from `source` into the directory completed in this run.
    pub holds: bool,
    /// Leaving, with an effect in flight: it may be moving the directory to the trash.
    pub trashing: bool,
    /// Its symlink to the directory (absolute), for the artifact's `childrenPaths`.
    pub link_abs: Option<Box<str>>,
}

/// Who uses each directory beneath the root (`State::dirs`).
pub type Dirs = Map<Arc<str>, Arc<DirUse>>;

/// Everyone using one directory beneath the root.
#[derive(Clone, Debug, Default)]
pub struct DirUse {
    /// Sorted by key, then uid.
    pub members: Vec<Member>,
    /// Uids the directory's marker is known to name (download outcomes, snapshots).
    pub marked: Vec<Uid>,
    /// Of those, the ones no record knew when the last snapshot showed them (nearly always
    /// none; sorted): a model not known here yet (an unsynced empty list at start, a lagging
    /// watch) or one gone. Their source unknown, no download replaces files of another source
    /// there (`Op::Download::other_source`) until a record knows them, a snapshot no longer
    /// shows them, or an orphan check's LISTs show them gone (swarm seed 102822).
    pub unknown: Vec<Uid>,
    /// Uids of the marker that an orphan check's LISTs showed gone (a uid never comes back):
    /// never unknown again here. They stay in `marked`: a model of the same name recreated
    /// adopts the directory its predecessor's marker names.
    pub gone: Vec<Uid>,
    /// Of `unknown`, the uids an orphan check's LISTs showed alive (not being deleted): a live
    /// model's files, as far as the core can tell. The directory counts as shared while one
    /// that is not a member is here (a member's delete releases it rather than trash it), and a
    /// disown keeps them in the marker (a review found both holes).
    pub alive: Vec<Uid>,
    /// The step at which an effect of this agent last changed the marker (a download's owners,
    /// a disown): a snapshot asked for before it shows an older marker.
    pub marked_seq: u64,
}

/// What one incarnation's decision reads of the directory it uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DirView {
    /// Another member's download into it is in flight.
    pub busy: bool,
    /// Another model (another name: a recreated one waits for its predecessor's directory to
    /// go, unless the marker names it already) of the same source, not confirmed gone, uses it
    /// (of any source when this one's is unknown), or any live member whose files are there.
    pub shared: bool,
    /// Uids an `Op::Download` may find in the marker and writes into it with its own.
    pub co_owners: Vec<Uid>,
    /// Being trashed (by the sweep, or by a member leaving): nothing is fetched into it until
    /// that lands.
    pub trashing: bool,
    /// For a shared copy's Ready entry: the owner's ConfigMap key and the children's links.
    pub artifact: Option<ArtifactView>,
    /// Another live member holds its files there from another source (not in a shared copy,
    /// whose path names its source): this one must not download over them.
    pub other_source_holder: Option<(ModelKey, Arc<str>)>,
    /// Live members of another source (or of none known), whether or not their files count as
    /// there in this run: a download may not replace files of another source its marker names
    /// one of them for (`Op::Download::other_source`, checked by the shell against the manifest).
    pub other_source: Vec<Uid>,
    /// Its marker is known to name another uid: a trash by this one waits for a fresh Node
    /// witness (`tables::awaits_trash_witness`).
    pub named_by_others: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ArtifactView {
    pub owner_cm_key: String,
    /// Empty unless this incarnation is the owner.
    pub children: Vec<String>,
}

impl ArtifactView {
    pub fn digest(&self) -> u64 {
        let mut h = rustc_hash::FxHasher::default();
        self.hash(&mut h);
        h.finish().max(1)
    }
}

/// Is `rel` (beneath the root) the shared copies' folder or inside it?
pub fn in_artifacts(rel: &str) -> bool {
    rel == ARTIFACTS_DIR || rel.starts_with("_artifacts/")
}

/// A revision that is a commit already needs no resolving.
pub fn is_commit(revision: &str) -> bool {
    (7..=64).contains(&revision.len()) && revision.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The copy of `org/repo` at `commit`, beneath the root, or why there can be none.
pub fn copy_dest(models_root: &str, org: &str, repo: &str, commit: &str) -> Result<DestPath, String> {
    if !is_commit(commit) {
        return Err(format!("the Hub answered {commit:?}, not a commit"));
    }
    for part in [org, repo] {
        if part.is_empty() || part == "." || part == ".." || part.contains('/') || part.len() > 255 {
            return Err(format!("{org}/{repo} cannot name a shared copy"));
        }
    }
    let root = models_root.trim_end_matches('/');
    let absolute = format!("{root}/{ARTIFACTS_DIR}/{org}/{repo}/{commit}");
    if absolute.len() > crate::dest_path::PATH_BYTES_MAX {
        return Err(format!("the copy of {org}/{repo} would be a path of {} bytes", absolute.len()));
    }
    Ok(DestPath::under_root(&absolute, root))
}

/// `(org, repo, commit)` of a copy's path beneath the root.
pub fn copy_parts(rel: &str) -> Option<(&str, &str, &str)> {
    let mut it = rel.strip_prefix("_artifacts/")?.split('/');
    let parts = (it.next()?, it.next()?, it.next()?);
    it.next().is_none().then_some(parts)
}

/// The plan a download's spec asks for, placement and root aside (`want` adds those). `Err`:
/// the reason the model is Failed.
pub fn planned(
    inc: &Incarnation,
    spec: &crate::model::ModelSpec,
    dest: &DestPath,
    models_root: &str,
) -> Result<Plan, String> {
    Ok(match choose_plan(inc, spec, dest, models_root)? {
        Choice::Own => Plan::Download { storage_uri: spec.storage_uri.clone(), dest: dest.clone() },
        Choice::Other(plan) => plan,
    })
}

/// `planned`, with the common answer (its own download) made by no one: `member_draft` only
/// borrows it.
enum Choice {
    Own,
    Other(Plan),
}

fn choose_plan(
    inc: &Incarnation,
    spec: &crate::model::ModelSpec,
    dest: &DestPath,
    models_root: &str,
) -> Result<Choice, String> {
    let rel = dest.beneath_root().unwrap_or_default();
    if in_artifacts(rel) {
        return Err(format!(
            "spec.storage.path {:?} is inside {ARTIFACTS_DIR}/, where the agent keeps shared copies",
            dest.absolute()
        ));
    }
    let refused = inc.share.as_ref().and_then(|s| s.refused_at.as_deref()) == Some(rel);
    let (Ok(StorageUri::HuggingFace { org, repo, revision }), DownloadPolicy::ReuseIfExists, false) =
        (&spec.uri, spec.download_policy, refused)
    else {
        return Ok(Choice::Own);
    };
    let commit = match inc.resolved_for(&spec.storage_uri) {
        Some(commit) => commit,
        None if is_commit(revision) => revision.as_str(),
        None => return Ok(Choice::Other(Plan::Resolve { storage_uri: spec.storage_uri.clone() })),
    };
    let copy = copy_dest(models_root, org, repo, commit)?;
    let storage_uri = format!("hf://{org}/{repo}@{commit}");
    Ok(Choice::Other(Plan::Shared { storage_uri: storage_uri.into(), copy, link: dest.clone() }))
}

/// The directory an incarnation uses now and what it is to it, borrowed from the incarnation
/// wherever it can be, so that it is compared with what is registered before anything is made
/// (most settles change nothing), and read by `view` without making anything.
pub struct MemberDraft<'a> {
    dir: Cow<'a, str>,
    /// Shared with the spec or the plan it comes from: a member made from it allocates none.
    source: Option<Cow<'a, Arc<str>>>,
    alive: bool,
    downloading: bool,
    holds: bool,
    trashing: bool,
    /// Its symlink to `dir`, beneath the root.
    link_at: Option<&'a str>,
}

/// The directory an incarnation uses now: the one its plan fetches into, else the one it owns.
///
/// Only an incarnation that may be placed here fetches (a withdrawn or confirmed one, one the
/// Node does not place, or one whose keys a colliding model `held` writes nothing, uses only
/// what it owns, once any download of it has ended). A held one that owns the directory it would
/// fetch into (its uid in the marker: it fetched there before a restart, say) stays a member
/// of it as a fetching member would: a member leaving must not trash its weights (its Ready
/// entry may still be on the node).
pub fn member_draft<'a>(
    inc: &'a Incarnation,
    models_root: &str,
    (node, held): (Option<&NodeView>, Option<&Dirs>),
) -> Option<MemberDraft<'a>> {
    let placed = || inc.may_stay() && eligible_now(inc, node) != Some(false);
    let plan = || match (inc.obj.spec(), &inc.dest) {
        (Some(spec), Ok(Some(dest))) if spec.uri.as_ref().is_ok_and(|u| u.downloads()) && placed() => {
            match choose_plan(inc, spec, dest, models_root) {
                Ok(Choice::Own) => {
                    dest.beneath_root().map(|dir| (Cow::Borrowed(&spec.storage_uri), Cow::Borrowed(dir)))
                }
                Ok(Choice::Other(plan)) => {
                    plan.fetch_into().map(|(u, d)| (Cow::Owned(Arc::clone(u)), Cow::Owned(d.to_owned())))
                }
                Err(_) => None,
            }
        }
        _ => None,
    };
    // Held (`held`: the directories, to read what their markers are known to name), it fetches
    // nothing, but stays a member of its own destination while placed here if the marker there
    // names it: a member leaving must not trash its weights (swarm seed 82997: withdrawn, it had
    // released the directory; placed again but held, it never joined it back, and a co-owner's
    // delete trashed them).
    let own_dest = |dir: &str| inc.dest.as_ref().ok().and_then(|d| d.as_ref()?.beneath_root()) == Some(dir);
    let named_in =
        |dirs: &Dirs, dir: &str| own_dest(dir) && dirs.get(dir).is_some_and(|d| d.marked.contains(inc.uid()));
    let keeps = |dir: &str| held.is_none_or(|dirs| inc.owned_dir() == Some(dir) || named_in(dirs, dir));
    let plan = || plan().filter(|(_, dir)| keeps(dir));
    // A download still running (being cancelled, say) keeps it in that directory until it ends:
    // nothing else is decided for it meanwhile.
    let running = inc.download.as_ref().and_then(|run| run.plan.fetch_into());
    let (source, dir, trashing) = match running.map(|(u, d)| (Cow::Borrowed(u), Cow::Borrowed(d))).or_else(plan) {
        Some((uri, dir)) => (Some(uri), dir, false),
        // Leaving: what it owns, from the source it fetched it with.
        None => {
            let dir = inc.owned_dir()?;
            let fetched = match &inc.fetched {
                Fetched::Done(done) => done.plan.fetch_into().filter(|(_, d)| *d == dir).map(|(u, _)| Cow::Borrowed(u)),
                _ => None,
            };
            // A reserved model away counts as of the source its spec names there, as it would
            // here: files it fetched from an earlier source are not held against a model of its
            // source now, which it would replace itself (swarm seed 44142).
            let fetched = reserved_source(inc, dir).map(Cow::Borrowed).or(fetched);
            // A trash waiting for its Node witness counts as one under way: nothing is fetched
            // into the directory meanwhile.
            let waits = inc.share.as_ref().is_some_and(|s| s.trash_after_seq.is_some());
            (fetched, Cow::Borrowed(dir), inc.inflight.is_some() || waits)
        }
    };
    let downloading = running.is_some_and(|(_, d)| d == dir);
    let holds = match (&inc.fetched, source.as_deref()) {
        (Fetched::Done(done), Some(source)) => done.plan.fetch_into() == Some((source, &*dir)),
        _ => false,
    };
    let link_at = inc.link().filter(|(_, to)| *to == *dir).map(|(at, _)| at.as_str());
    Some(MemberDraft { dir, source, alive: !inc.is_confirmed(), downloading, holds, trashing, link_at })
}

/// A live reserved model keeps its directory while it is away from the node (`trash_blocked`),
/// and counts as of the source its spec names for that directory: what it fetched there may not
/// be known (a restart, or it never fetched on this node), and, of no source, it would count as
/// another source's to every model, so that a model of its own source would be refused the
/// directory for as long as it stays away (swarm seed 1238); or it may be of a source its spec
/// no longer names (seed 44142).
fn reserved_source<'a>(inc: &'a Incarnation, dir: &str) -> Option<&'a Arc<str>> {
    let spec = inc.obj.spec().filter(|_| inc.is_reserved() && !inc.is_confirmed())?;
    let dest = inc.dest.as_ref().ok()?.as_ref()?;
    (dest.beneath_root() == Some(dir)).then_some(&spec.storage_uri)
}

impl MemberDraft<'_> {
    /// The directory and the member, made.
    pub fn made(self, key: &ModelKey, uid: &Uid, models_root: &str) -> (Arc<str>, Member) {
        let link_abs = self.link_at.map(|at| format!("{}/{at}", models_root.trim_end_matches('/')).into_boxed_str());
        let source = self.source.map(Cow::into_owned);
        let (alive, downloading, holds, trashing) = (self.alive, self.downloading, self.holds, self.trashing);
        let member =
            Member { key: key.clone(), uid: uid.clone(), source, alive, downloading, holds, trashing, link_abs };
        (Arc::from(&*self.dir), member)
    }

    /// What the draft's directory means for the incarnation (`key`, `uid`) it was drawn from.
    pub fn view(
        &self,
        dirs: &Map<Arc<str>, Arc<DirUse>>,
        trashing: &Set<Arc<str>>,
        key: &ModelKey,
        uid: &Uid,
    ) -> DirView {
        dir_view(dirs, trashing, &self.dir, &MemberRef { key, uid, source: self.source_str() })
    }

    fn source_str(&self) -> Option<&str> {
        self.source.as_deref().map(|s| &**s)
    }

    /// Would `made` equal `registered`?
    fn same_as(&self, key: &ModelKey, uid: &Uid, models_root: &str, (dir, m): &(Arc<str>, Member)) -> bool {
        let root = models_root.trim_end_matches('/');
        let link_same = match (self.link_at, m.link_abs.as_deref()) {
            (None, None) => true,
            (Some(at), Some(abs)) => abs.strip_prefix(root).and_then(|r| r.strip_prefix('/')) == Some(at),
            _ => false,
        };
        **dir == *self.dir
            && m.key == *key
            && m.uid == *uid
            && m.source.as_deref() == self.source_str()
            && (m.alive, m.downloading, m.holds, m.trashing)
                == (self.alive, self.downloading, self.holds, self.trashing)
            && link_same
    }
}

/// A member as `dir_view` reads it, borrowed from its draft: a view makes nothing.
struct MemberRef<'a> {
    key: &'a ModelKey,
    uid: &'a Uid,
    source: Option<&'a str>,
}

/// What `dirs[dir]` means for `me`.
fn dir_view(dirs: &Map<Arc<str>, Arc<DirUse>>, trashing: &Set<Arc<str>>, dir: &str, me: &MemberRef) -> DirView {
    let Some(using) = dirs.get(dir) else {
        return DirView { trashing: trashing.contains(dir), ..DirView::default() };
    };
    let others = || using.members.iter().filter(|m| m.uid != *me.uid);
    let same = |m: &&Member| m.source.is_some() && m.source.as_deref() == me.source;
    // A copy's path names what is in it: whoever its marker names or owns it shares it.
    let copy = copy_parts(dir).is_some();
    let other_source: Vec<&Uid> = others().filter(|m| !copy && !same(m)).map(|m| &m.uid).collect();
    let mut co_owners: Vec<Uid> = others().filter(|m| copy || same(m)).map(|m| m.uid.clone()).collect();
    co_owners.extend(using.marked.iter().filter(|u| *u != me.uid && !other_source.contains(u)).cloned());
    co_owners.sort();
    co_owners.dedup();
    // A member that only owns the directory (nothing fetched in this run: its source is
    // unknown) shares it with every other member that fetches into it or fetched it. Another
    // incarnation of the same name shares it only once the marker names it (a stale list can
    // bring back an older uid after the newer one downloaded there).
    let shares = |m: &&Member| same(m) || (me.source.is_none() && m.source.is_some());
    // Whatever its source, a live member whose files are there shares it: it may have
    // downloaded its own source there with this one as a co-owner, this one's source then
    // still the one it last fetched with.
    let named = |m: &&Member| using.marked.contains(&m.uid);
    let sharer = |m: &&Member| m.alive && (m.holds || ((m.key != *me.key || named(m)) && shares(m)));
    let other_holder = |m: &Member| match &m.source {
        Some(source) if !copy && m.alive && m.holds && !same(&m) => Some((m.key.clone(), Arc::clone(source))),
        _ => None,
    };
    // A uid no record knows (`DirUse::unknown`), other than this one's, that no member has.
    let stranger = |u: &&Uid| **u != *me.uid && !using.members.iter().any(|m| m.uid == **u);
    DirView {
        busy: others().any(|m| m.downloading),
        shared: others().any(|m| sharer(&m)) || using.alive.iter().any(|u| stranger(&u)),
        co_owners,
        trashing: trashing.contains(dir) || others().any(|m| m.trashing),
        artifact: copy_parts(dir).map(|_| artifact_view(using, me)),
        other_source_holder: others().find_map(other_holder),
        other_source: others()
            .filter(|m| m.alive && other_source.contains(&&m.uid))
            .map(|m| m.uid.clone())
            .chain(using.unknown.iter().filter(stranger).cloned())
            .collect(),
        named_by_others: using.marked.iter().any(|u| u != me.uid),
    }
}

/// The owner is the first member of the same source not gone (the others are its children).
fn artifact_view(using: &DirUse, me: &MemberRef) -> ArtifactView {
    let same: Vec<&Member> = using.members.iter().filter(|m| m.alive && m.source.as_deref() == me.source).collect();
    let owner = same.first().map_or(me.key, |m| &m.key);
    let children = if owner == me.key {
        let mut links: Vec<String> = same
            .iter()
            .filter(|m| m.uid != *me.uid)
            .filter_map(|m| m.link_abs.as_deref().map(str::to_string))
            .collect();
        links.sort();
        links
    } else {
        Vec::new()
    };
    ArtifactView { owner_cm_key: wire::configmap_key(owner), children }
}

/// Move `key`'s incarnations to the directories they use now (`held`: a colliding model holds
/// the current one's keys). Returns the other members of every directory whose membership
/// changed: their decisions read it.
pub(super) fn register(
    (dirs, rested): (&mut Dirs, &mut Dirs),
    key: &ModelKey,
    slot: &mut Slot,
    models_root: &str,
    (node, held): (Option<&NodeView>, bool),
) -> Vec<ModelKey> {
    let mut affected = Vec::new();
    let held_current = held.then(|| slot.current.as_ref().map(|i| i.uid().clone())).flatten();
    for inc in slot.all_mut() {
        let held = (held_current.as_ref() == Some(inc.uid())).then_some(&*dirs);
        let draft = member_draft(inc, models_root, (node, held));
        let before = inc.share.as_ref().and_then(|s| s.registered.as_ref());
        let unchanged = match (&draft, before) {
            (None, None) => true,
            (Some(draft), Some(before)) => draft.same_as(key, inc.uid(), models_root, before),
            _ => false,
        };
        if unchanged {
            continue;
        }
        let now = draft.map(|d| d.made(key, inc.uid(), models_root));
        if let Some((dir, old)) = before {
            // Staying in the same directory keeps its record (what its marker is known to name),
            // unless it fetches another source there now: the uids marked for the files it
            // replaces are not co-owners of its download (`DirView::co_owners`), which would
            // write them into the marker over files not of their source.
            let stays = now.as_ref().is_some_and(|(d, m)| d == dir && m.source == old.source);
            leave((dirs, rested), dir, &old.uid, &mut affected, !stays);
        }
        if let Some((dir, member)) = &now {
            join((dirs, rested), dir, member.clone(), &mut affected);
        }
        if now.is_some() || inc.share.is_some() {
            inc.share_mut().registered = now;
        }
    }
    if !affected.is_empty() {
        affected.retain(|k| k != key);
    }
    affected
}

/// Remove uids no longer in `slot` (dropped incarnations: confirmed deleted) from the
/// directories they used. A directory others still use remembers them gone, so that its
/// marker naming them sends no orphan check to find that out (`DirUse::gone`).
pub(super) fn unregister((dirs, rested): (&mut Dirs, &mut Dirs), gone: &[(Arc<str>, Uid)]) -> Vec<ModelKey> {
    let mut affected = Vec::new();
    for (dir, uid) in gone {
        leave((dirs, rested), dir, uid, &mut affected, true);
        // A directory left at rest remembers it too: its record comes back with the next member.
        if let Some(using) = dirs.get_mut(dir).or(rested.get_mut(dir))
            && let Err(at) = using.gone.binary_search(uid)
        {
            let using = Arc::make_mut(using);
            using.gone.insert(at, uid.clone());
            using.unknown.retain(|u| u != uid);
            using.alive.retain(|u| u != uid);
        }
        unrest_if_done(rested, dir);
    }
    affected
}

/// Is a record at rest still worth keeping: its marker names a uid no record knows, or one the
/// orphan check's LISTs showed gone (else each snapshot would make it afresh with that uid
/// unknown, and the check would LIST for it every drift period: a review)?
pub(super) fn rest_needed(using: &DirUse) -> bool {
    !using.unknown.is_empty() || using.gone.iter().any(|g| using.marked.binary_search(g).is_ok())
}

/// Forgets the record at rest of `dir` once it has nothing to remember.
pub(super) fn unrest_if_done(rested: &mut Dirs, dir: &str) {
    if rested.get(dir).is_some_and(|using| !rest_needed(using)) {
        rested.remove(dir);
    }
}

/// A directory no model used comes into use with the record it was left at rest with, if any
/// (`State::dirs_rested`).
fn join((dirs, rested): (&mut Dirs, &mut Dirs), dir: &Arc<str>, member: Member, affected: &mut Vec<ModelKey>) {
    if !dirs.contains_key(dir)
        && let Some(record) = rested.remove(dir)
    {
        dirs.insert(dir.clone(), record);
    }
    let using = Arc::make_mut(dirs.entry(dir.clone()).or_default());
    affected.extend(using.members.iter().map(|m| m.key.clone()));
    let at = using.members.partition_point(|m| (&m.key, &m.uid) < (&member.key, &member.uid));
    // Most directories have one member: a vector grown by doubling would hold room for four.
    // Past the first, by doubling (a copy many models share is joined once by each).
    if using.members.is_empty() {
        using.members.reserve_exact(1);
    }
    using.members.insert(at, member);
}

/// The last member to leave a directory whose marker names a uid no record knows leaves its
/// record at rest (`State::dirs_rested`): a model that comes back to it before the next
/// snapshot must not take those files for its own.
fn leave(
    (dirs, rested): (&mut Dirs, &mut Dirs),
    dir: &Arc<str>,
    uid: &Uid,
    affected: &mut Vec<ModelKey>,
    drop_empty: bool,
) {
    let Some(shared) = dirs.get_mut(dir) else { return };
    let using = Arc::make_mut(shared);
    using.members.retain(|m| m.uid != *uid);
    affected.extend(using.members.iter().map(|m| m.key.clone()));
    if drop_empty
        && using.members.is_empty()
        && let Some(record) = dirs.remove(dir)
        && !record.unknown.is_empty()
    {
        rested.insert(dir.clone(), record);
    }
}

/// A download into `dir` (a directory a known model uses) ended at step `seq` with its marker
/// naming `uids`: recorded, with the step the marker changed (`DirUse::marked_seq`).
pub(super) fn marked(dirs: &mut Map<Arc<str>, Arc<DirUse>>, dir: &str, uids: &[Uid], seq: u64) {
    let Some(shared) = dirs.get_mut(dir) else { return };
    let using = Arc::make_mut(shared);
    using.marked_seq = seq;
    if uids.iter().all(|u| using.marked.binary_search(u).is_ok()) {
        return;
    }
    using.marked.extend_from_slice(uids);
    using.marked.sort();
    using.marked.dedup();
}

/// What the last snapshot showed of each used directory's marker: the uids no record knows
/// (`DirUse::unknown`), by path; directories it showed no such uid for have none.
pub(super) fn set_unknown(dirs: &mut Map<Arc<str>, Arc<DirUse>>, unknown: &FxHashMap<&str, Vec<Uid>>) {
    let stale = |d: &Arc<str>, u: &DirUse| !u.unknown.is_empty() && !unknown.contains_key(&**d);
    let changed: Vec<Arc<str>> = dirs.iter().filter(|(d, u)| stale(d, u)).map(|(d, _)| d.clone()).collect();
    for dir in changed {
        if let Some(using) = dirs.get_mut(&dir) {
            let using = Arc::make_mut(using);
            using.unknown.clear();
            using.alive.clear();
        }
    }
    for (dir, uids) in unknown {
        let Some(using) = dirs.get_mut(*dir) else { continue };
        if using.unknown != *uids {
            let using = Arc::make_mut(using);
            using.unknown = uids.clone();
            using.alive.retain(|u| uids.contains(u));
        }
    }
}

/// An orphan check's LISTs, sent after a snapshot showed `gone` unknown in `dir`'s marker, did
/// not list them alive: those models are deleted, and hold no download back there.
pub(super) fn forget_gone(dirs: &mut Map<Arc<str>, Arc<DirUse>>, dir: &str, gone: &[Uid]) {
    let Some(shared) = dirs.get_mut(dir) else { return };
    let using = Arc::make_mut(shared);
    using.unknown.retain(|u| !gone.contains(u));
    using.gone.extend_from_slice(gone);
    using.gone.sort();
    using.gone.dedup();
}

/// What a snapshot asked for at step `requested_seq` shows each used directory's marker naming
/// (`shown`, by path; nothing for a directory without one): the record of a directory no effect
/// has changed since is what it shows, so that uids a download wrote out of the marker leave
/// it (a held model kept a path whose marker no longer named it, and the directory stayed for
/// good: swarm seed 82997 on another run). One changed since, or under what the scan could not
/// read (`unread`), gains what it shows and loses nothing.
pub(super) fn refresh_marked(
    dirs: &mut Map<Arc<str>, Arc<DirUse>>,
    shown: &FxHashMap<&str, Vec<Uid>>,
    requested_seq: u64,
    unread: &[String],
) {
    let under_unread = |d: &str| {
        unread.iter().any(|u| u.is_empty() || d == u || d.strip_prefix(u.as_str()).is_some_and(|r| r.starts_with('/')))
    };
    let none = Vec::new();
    let changed: Vec<Arc<str>> = dirs
        .iter()
        .filter(|(d, using)| {
            let uids = shown.get(&***d).unwrap_or(&none);
            match using.marked_seq < requested_seq && !under_unread(d) {
                true => using.marked != *uids,
                false => uids.iter().any(|u| using.marked.binary_search(u).is_err()),
            }
        })
        .map(|(d, _)| d.clone())
        .collect();
    for dir in changed {
        let uids = shown.get(&*dir).unwrap_or(&none);
        let Some(shared) = dirs.get_mut(&dir) else { continue };
        let using = Arc::make_mut(shared);
        if using.marked_seq < requested_seq && !under_unread(&dir) {
            using.marked = uids.clone();
        } else {
            using.marked.extend_from_slice(uids);
            using.marked.sort();
            using.marked.dedup();
        }
        using.unknown.retain(|u| using.marked.binary_search(u).is_ok());
        using.alive.retain(|u| using.marked.binary_search(u).is_ok());
    }
}

/// What a snapshot asked for at step `requested_seq` shows of the directories no model uses
/// (`shown`, as for `refresh_marked`; `unused`, those of them whose marker names a uid `known`
/// does not): each whose marker names such a uid (not one remembered gone there) is kept at
/// rest with that record, so that a model coming to use one before the next snapshot does not
/// take those files for its own (a download into a directory that came into use after the
/// last snapshot had no record of its marker). The rest are forgotten: nearly always every one.
pub(super) fn rest_shown(
    rested: &mut Dirs,
    (shown, unused): (&FxHashMap<&str, Vec<Uid>>, &[&str]),
    (requested_seq, unread): (u64, &[String]),
    known: impl Fn(&Uid) -> bool,
) {
    refresh_marked(rested, shown, requested_seq, unread);
    let strangers = |using: &DirUse| -> Vec<Uid> {
        let stranger = |u: &&Uid| !known(u) && using.gone.binary_search(u).is_err();
        using.marked.iter().filter(stranger).cloned().collect()
    };
    let keys: Vec<Arc<str>> = rested.keys().cloned().collect();
    for dir in keys {
        let Some(shared) = rested.get_mut(&dir) else { continue };
        let unknown = strangers(shared);
        if unknown != shared.unknown {
            let using = Arc::make_mut(shared);
            using.alive.retain(|u| unknown.binary_search(u).is_ok());
            using.unknown = unknown;
        }
        if !rest_needed(shared) {
            rested.remove(&dir);
        }
    }
    for path in unused {
        if rested.contains_key(*path) {
            continue;
        }
        let using = DirUse { marked: shown.get(path).cloned().unwrap_or_default(), ..DirUse::default() };
        let unknown = strangers(&using);
        if !unknown.is_empty() {
            rested.insert(Arc::from(*path), Arc::new(DirUse { unknown, ..using }));
        }
    }
}

/// An orphan check's LISTs showed `alive` (unknown in `dir`'s marker) alive.
pub(super) fn seen_alive(dirs: &mut Map<Arc<str>, Arc<DirUse>>, dir: &str, alive: &[Uid]) {
    let Some(shared) = dirs.get_mut(dir) else { return };
    let fresh = |u: &Uid| shared.unknown.contains(u) && !shared.alive.contains(u);
    if !alive.iter().any(fresh) {
        return;
    }
    let using = Arc::make_mut(shared);
    using.alive.extend(alive.iter().filter(|u| using.unknown.contains(u)).cloned());
    using.alive.sort();
    using.alive.dedup();
}

/// `uid` gave `dir` up (`Op::DisownDir`). Other uids the marker lost, of models gone, go again
/// at the next disown if a download writes them back.
pub(super) fn unmarked(dirs: &mut Map<Arc<str>, Arc<DirUse>>, dir: &str, uid: &Uid, seq: u64) {
    let Some(shared) = dirs.get_mut(dir).filter(|using| using.marked.binary_search(uid).is_ok()) else { return };
    let using = Arc::make_mut(shared);
    using.marked.retain(|u| u != uid);
    using.unknown.retain(|u| u != uid);
    using.alive.retain(|u| u != uid);
    using.marked_seq = seq;
}

/// May a model listed (or known) use the copy `rel`? Conservative: an `hf://` model of the same
/// repository with `ReuseIfExists` uses it unless it is known to have resolved to another commit.
pub fn may_use_copy(obj: &ModelObject, known_commit: Option<&str>, rel: &str) -> bool {
    let Some((org, repo, commit)) = copy_parts(rel) else { return false };
    let Some(spec) = obj.spec() else { return false };
    let Ok(StorageUri::HuggingFace { org: o, repo: r, revision }) = &spec.uri else { return false };
    if spec.download_policy != DownloadPolicy::ReuseIfExists || o != org || r != repo {
        return false;
    }
    match known_commit {
        Some(known) => known == commit,
        None => !is_commit(revision) || revision == commit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uids(names: &[&str]) -> Vec<Uid> {
        names.iter().map(|n| Uid::new(n)).collect()
    }

    /// One used directory `d` whose record names `marked`, last changed by an effect at `seq`.
    fn dirs_with(marked: &[&str], seq: u64) -> Dirs {
        let mut dirs = Dirs::default();
        let using = DirUse { marked: uids(marked), marked_seq: seq, ..DirUse::default() };
        dirs.insert(Arc::from("d"), Arc::new(using));
        dirs
    }

    /// The last member to leave a directory whose marker names a uid no record knows leaves the
    /// record at rest, and the next to come takes it; a directory with no such uid is
    /// forgotten. A snapshot keeps at rest what it shows of unused directories with such uids,
    /// and forgets those whose uids all became known or are not shown any more.
    #[test]
    fn a_directory_s_record_rests_while_no_model_uses_it_and_comes_back_with_the_next() {
        let member = |uid: &str| Member {
            key: ModelKey::cluster(uid),
            uid: Uid::new(uid),
            source: Some(Arc::from("hf://org/a")),
            alive: true,
            downloading: false,
            holds: true,
            trashing: false,
            link_abs: None,
        };
        let (mut dirs, mut rested, mut affected) = (Dirs::default(), Dirs::default(), Vec::new());
        let d: Arc<str> = Arc::from("d");
        let using = DirUse {
            members: vec![member("m1")],
            marked: uids(&["m1", "x1"]),
            unknown: uids(&["x1"]),
            ..DirUse::default()
        };
        dirs.insert(d.clone(), Arc::new(using));
        leave((&mut dirs, &mut rested), &d, &Uid::new("m1"), &mut affected, true);
        assert!(dirs.is_empty());
        assert_eq!(rested["d"].unknown, uids(&["x1"]));
        join((&mut dirs, &mut rested), &d, member("m1"), &mut affected);
        assert!(rested.is_empty());
        assert_eq!((dirs["d"].marked.clone(), dirs["d"].unknown.clone()), (uids(&["m1", "x1"]), uids(&["x1"])));
        dirs = dirs_with(&["m1"], 0);
        Arc::make_mut(dirs.get_mut("d").unwrap()).members.push(member("m1"));
        leave((&mut dirs, &mut rested), &d, &Uid::new("m1"), &mut affected, true);
        assert!(dirs.is_empty() && rested.is_empty(), "no unknown uid: nothing to keep");

        let shown: FxHashMap<&str, Vec<Uid>> =
            [("d", uids(&["m1", "x1"])), ("e", uids(&["m2"])), ("f", uids(&["x3"]))].into_iter().collect();
        let known = |u: &Uid| u.as_str().starts_with('m');
        rest_shown(&mut rested, (&shown, &["d", "f"]), (1, &[]), known);
        let mut at_rest: Vec<(&str, Vec<Uid>)> = rested.iter().map(|(d, u)| (&**d, u.unknown.clone())).collect();
        at_rest.sort();
        assert_eq!(at_rest, vec![("d", uids(&["x1"])), ("f", uids(&["x3"]))]);
        let shown: FxHashMap<&str, Vec<Uid>> = [("d", uids(&["m1", "x1"]))].into_iter().collect();
        rest_shown(&mut rested, (&shown, &[]), (2, &[]), |_: &Uid| true);
        assert!(rested.is_empty(), "x1 known, f's marker gone: {rested:?}");
    }

    /// Swarm seed 82997 (on the run after the unknown-uid rule): the record kept a uid a
    /// download had written out of the marker, a held model stayed a member for it, and the
    /// directory stayed for good. A snapshot asked for after the last change is what the marker
    /// names; one asked for before it, or under what the scan could not read, only adds.
    #[test]
    fn a_fresh_snapshot_is_what_the_marker_names_and_a_stale_one_only_adds() {
        let shown: FxHashMap<&str, Vec<Uid>> = [("d", uids(&["a", "c"]))].into_iter().collect();
        let mut fresh = dirs_with(&["a", "b"], 5);
        refresh_marked(&mut fresh, &shown, 6, &[]);
        assert_eq!(fresh["d"].marked, uids(&["a", "c"]));
        let mut stale = dirs_with(&["a", "b"], 6);
        refresh_marked(&mut stale, &shown, 6, &[]);
        assert_eq!(stale["d"].marked, uids(&["a", "b", "c"]));
        for unread in ["", "d"] {
            let mut hidden = dirs_with(&["a", "b"], 5);
            refresh_marked(&mut hidden, &FxHashMap::default(), 6, &[unread.to_string()]);
            assert_eq!(hidden["d"].marked, uids(&["a", "b"]), "unread {unread:?}");
        }
        let mut gone = dirs_with(&["a", "b"], 5);
        refresh_marked(&mut gone, &FxHashMap::default(), 6, &["dd".to_string()]);
        assert!(gone["d"].marked.is_empty(), "no marker there now, and `dd` is not above `d`");
    }
}
