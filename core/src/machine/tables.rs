//! The life-cycle tables of core.md as pure functions, one match arm per row: what a candidate
//! event does (`on_candidate`), what a live read's answer does (`read_verdict`), what a change of
//! placement does (`placement_step`), what the Node witness decides (`witness_verdict`), what an
//! incarnation should look like on this node (`want`), and the next effect that brings it there
//! (`next_op`).

use std::sync::Arc;

use super::io::{Cause, Confirmation, Op, RootProbe};
use super::records::{FetchDone, Fetched, Incarnation, Life, Plan, Published};
use super::shared::{self, DirView};
use crate::model::ModelKey;
use crate::placement::{NodeView, placement};
use crate::storage_uri::Provisioning;
use crate::time::Instant;
use crate::wire::{self, Artifact, ModelConfig, ModelEntry, ModelStatus};

/// What an incarnation should look like on this node.
#[derive(Clone, Debug, PartialEq)]
pub enum Want {
    /// Leave things as they are (pending, not yet known).
    Hold,
    /// Nothing of this uid should remain: label, entry, owned directory.
    Absent,
    Failed(String),
    Ready,
    Fetch(Plan),
    /// Placed here, but a key it maps to is owned by this other model: write nothing.
    Collides(ModelKey),
}

impl Want {
    /// The model that owns a key this one maps to, when they collide.
    pub fn collides_with(&self) -> Option<&ModelKey> {
        match self {
            Want::Collides(owner) => Some(owner),
            _ => None,
        }
    }
}

/// What the whole state contributes to one decision.
pub struct Context<'a> {
    pub node: Option<&'a NodeView>,
    pub root: Option<&'a RootProbe>,
    pub models_root: &'a str,
    /// Another incarnation of this name, or another model whose key collides, not confirmed
    /// gone, claims the node label: keep it.
    pub label_fenced: bool,
    /// A colliding model that ranks first owns the shared label and entry (`claims::contest`).
    pub held_by: Option<&'a ModelKey>,
    /// The first list of every kind has completed: until then a model that shares a key may
    /// not be known yet, so nothing is published or removed.
    pub synced: bool,
    /// An earlier incarnation still has a directory to move away first.
    pub former_owns_dir: bool,
    /// An earlier incarnation of this name awaits confirmation or has an effect in flight.
    /// Which uid is the live one may be unknown (a stale list can show an old uid after a new
    /// one), and an earlier effect may still land after a new one: publish nothing that would
    /// overwrite the other's label or entry until it has settled.
    pub predecessor_unsettled: bool,
    /// `--update-model-spec`.
    pub update_model_spec: bool,
    /// The directory this incarnation downloads into or owns, as the others using it see it.
    pub dir: Option<DirView>,
    /// The step that asked for the newest snapshot observed, once this process's first has
    /// come: what the markers name is known.
    pub markers_seen: Option<u64>,
    /// The step that sent the newest live read of this Node that answered.
    pub node_witness_seq: Option<u64>,
    /// The Node view changed in this step: no trash waiting for a witness goes in it.
    pub trash_hold: bool,
}

/// Is the model placed on this node now? `None` when that cannot be known yet.
pub fn eligible_now(inc: &Incarnation, node: Option<&NodeView>) -> Option<bool> {
    let node = node?;
    match inc.obj.spec() {
        Some(spec) => Some(placement(spec, node).is_eligible()),
        // A malformed spec is reported Failed everywhere: that is the clear error.
        None => Some(true),
    }
}

/// An event that questions an incarnation's existence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CandidateEvent {
    /// Watch DELETED, relist-vanished, or another uid under the name.
    Questioned(Cause),
    /// The object carries a deletionTimestamp.
    MarkedDeleting,
}

/// What a candidate event does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CandidateStep {
    /// No change (already pending or confirmed: a second candidate adds no read).
    Stay,
    /// PendingConfirm with a live read.
    Pend(Cause),
    /// Positive evidence: confirmed (through the breaker).
    Confirm(Confirmation),
    /// A placement exit in progress is questioned for existence: it stays pending, now for
    /// `cause`, so that the Node coming back (which cancels exits) cannot drop the candidate.
    Recause(Cause),
}

/// core.md, first table: an event on a model in state Observed (or Withdrawn: alive, withdrawn).
pub fn on_candidate(life: &Life, event: CandidateEvent) -> CandidateStep {
    match (life, event) {
        (Life::Observed | Life::Withdrawn, CandidateEvent::Questioned(cause)) => CandidateStep::Pend(cause),
        (Life::Observed | Life::Withdrawn | Life::PendingConfirm { .. }, CandidateEvent::MarkedDeleting) => {
            CandidateStep::Confirm(Confirmation::Deleting)
        }
        (Life::PendingConfirm { cause: Cause::PlacementExit, .. }, CandidateEvent::Questioned(cause))
            if cause != Cause::PlacementExit =>
        {
            CandidateStep::Recause(cause)
        }
        (Life::PendingConfirm { .. } | Life::Confirmed { .. }, CandidateEvent::Questioned(_)) => CandidateStep::Stay,
        (Life::Confirmed { .. }, CandidateEvent::MarkedDeleting) => CandidateStep::Stay,
    }
}

/// What a live read says about one pending uid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadAnswer {
    NotFound,
    FoundOther,
    FoundDeleting,
    FoundAlive,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadVerdict {
    Confirm(Confirmation),
    /// A phantom: the uid is alive (counted and noted), back to Observed.
    Suppress,
    /// A placement exit's model witness agrees: the Node witness decides.
    AwaitNodeWitness,
    /// The answer was sent before a newer view of the model arrived: read again.
    ReadAgain,
}

/// core.md, second table: a live read answering a PendingConfirm. (A failed or timed-out read
/// is a retry with backoff, in `read_failed`: never a verdict.)
pub fn read_verdict(
    cause: Cause,
    answer: ReadAnswer,
    view_newer_than_read: bool,
    questioned_after_read: bool,
) -> ReadVerdict {
    match (answer, cause) {
        (ReadAnswer::NotFound, _) => ReadVerdict::Confirm(Confirmation::NotFound),
        (ReadAnswer::FoundOther, _) => ReadVerdict::Confirm(Confirmation::Replaced),
        (ReadAnswer::FoundDeleting, _) => ReadVerdict::Confirm(Confirmation::Deleting),
        (ReadAnswer::FoundAlive, Cause::PlacementExit) if view_newer_than_read => ReadVerdict::ReadAgain,
        (ReadAnswer::FoundAlive, Cause::PlacementExit) => ReadVerdict::AwaitNodeWitness,
        // A Deleted (or vanishing) seen after the read was sent: the answer is older than it.
        (ReadAnswer::FoundAlive, _) if questioned_after_read => ReadVerdict::ReadAgain,
        (ReadAnswer::FoundAlive, _) => ReadVerdict::Suppress,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementStep {
    Stay,
    /// Stopped matching with something here: PendingConfirm(PlacementExit), two witnesses.
    Exit,
    /// Matches again: back to Observed (trusting a view is never destructive).
    Return,
}

/// Placement changes, from the newest views of the model and of the Node.
pub fn placement_step(life: &Life, eligible: Option<bool>, something_here: bool) -> PlacementStep {
    match (life, eligible) {
        (Life::Observed, Some(false)) if something_here => PlacementStep::Exit,
        (Life::PendingConfirm { cause: Cause::PlacementExit, .. }, Some(true)) => PlacementStep::Return,
        (Life::Withdrawn, Some(true)) => PlacementStep::Return,
        _ => PlacementStep::Stay,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WitnessVerdict {
    /// The live Node still places the model: the Node watch lagged; cancel the exit.
    Cancel,
    /// Both witnesses agree: withdraw (through the breaker).
    Withdraw,
}

/// The second witness of a placement exit: the model's newest spec on the live Node.
pub fn witness_verdict(eligible_on_live_node: bool) -> WitnessVerdict {
    match eligible_on_live_node {
        true => WitnessVerdict::Cancel,
        false => WitnessVerdict::Withdraw,
    }
}

pub fn want(inc: &Incarnation, ctx: &Context) -> Want {
    // Until every kind is listed, a model sharing this one's keys may be unknown: neither a
    // publish nor a removal can know whose the key is.
    if !ctx.synced {
        return Want::Hold;
    }
    match inc.life {
        Life::Confirmed { .. } | Life::Withdrawn => return Want::Absent,
        Life::PendingConfirm { .. } => return Want::Hold,
        Life::Observed => {}
    }
    if ctx.predecessor_unsettled {
        return Want::Hold;
    }
    let Some(node) = ctx.node else { return Want::Hold };
    // Before anything that publishes, a malformed spec's Failed included: a shared key is
    // written only by its owner.
    if let Some(owner) = ctx.held_by {
        return Want::Collides(owner.clone());
    }
    let spec = match &inc.obj.spec {
        Err(reason) => return Want::Failed(format!("invalid model: {reason}")),
        Ok(spec) => spec,
    };
    if !placement(spec, node).is_eligible() {
        // Withdrawn only through two witnesses (`placement_step`, `witness_verdict`).
        return Want::Hold;
    }
    let uri = match &spec.uri {
        Err(reason) => return Want::Failed(reason.clone()),
        Ok(uri) => uri,
    };
    let dest = match &inc.dest {
        Err(reason) => return Want::Failed(reason.clone()),
        Ok(dest) => dest.as_ref(),
    };
    match (uri.provisioning(), dest) {
        (Provisioning::Nothing, _) => Want::Ready,
        (Provisioning::NotOnNodes, _) => Want::Hold,
        (Provisioning::VerifyLocal, Some(dest)) => Want::Fetch(Plan::Verify { path: dest.absolute_shared().clone() }),
        (Provisioning::Download, Some(dest)) => match ctx.root {
            // Unknown (not probed, or the filesystem did not answer): neither fetch nor fail.
            None => Want::Hold,
            Some(root) if !root.answered => Want::Hold,
            Some(root) if !root.writable => Want::Failed(read_only_reason(ctx.models_root, root, uri.scheme())),
            Some(_) if ctx.former_owns_dir => Want::Hold,
            Some(_) => match shared::planned(inc, spec, dest, ctx.models_root) {
                Ok(plan) => Want::Fetch(plan),
                Err(reason) => Want::Failed(reason),
            },
        },
        (_, None) => Want::Failed("no destination path".into()),
    }
}

/// Does a download in flight go on? Only while the same plan is wanted, or nothing can be
/// known yet (a pending candidate may be a phantom: it keeps downloading until confirmed).
pub fn download_stays(want: &Want, running: &Plan) -> bool {
    match want {
        Want::Hold => true,
        Want::Fetch(plan) => plan == running,
        Want::Absent | Want::Failed(_) | Want::Ready | Want::Collides(_) => false,
    }
}

pub fn read_only_reason(models_root: &str, root: &RootProbe, scheme: &str) -> String {
    let detail = if root.detail.is_empty() { String::new() } else { format!(" ({})", root.detail) };
    format!("models root {models_root} is read-only{detail}; {scheme}:// models need write access to download")
}

/// What an effect in flight does for its incarnation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IncOp {
    Publish {
        status: ModelStatus,
        reason: Option<Arc<str>>,
    },
    Unpublish,
    /// Shared with the download's `DownloadRun`.
    Fetch {
        plan: Arc<Plan>,
    },
    Trash {
        name: String,
    },
    Disown,
    FillSpec,
    RecordReserve {
        reserved: bool,
    },
    /// Boxed, as it is rare: every effect in flight is kept with its `IncOp`.
    Link {
        paths: Box<LinkPaths>,
    },
    Unlink,
}

/// The symlink an `Op::Link` makes (`link`) and the copy it points at, both beneath the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkPaths {
    pub link: String,
    pub copy: String,
}

/// The next effect an incarnation needs, if any. Pure: one arm per `Want`.
pub fn next_op(key: &ModelKey, inc: &Incarnation, want: &Want, ctx: &Context, now: Instant) -> Option<(Op, IncOp)> {
    match want {
        Want::Hold | Want::Collides(_) => None,
        Want::Absent => withdraw_op(key, inc, ctx, now),
        Want::Failed(reason) => publish_op(key, inc, ModelStatus::Failed, Some(reason), ctx),
        Want::Ready => publish_op(key, inc, ModelStatus::Ready, None, ctx),
        Want::Fetch(plan) => unlink_op(key, inc, Some(plan)).or_else(|| match &inc.fetched {
            Fetched::Done(done) if done.plan == *plan => link_op(key, inc, plan)
                .or_else(|| publish_op(key, inc, ModelStatus::Ready, None, ctx))
                .or_else(|| record_reserve_op(key, inc, done, ctx))
                .or_else(|| fill_spec_op(key, inc, ctx)),
            Fetched::Failed(failed) if failed.plan == *plan => {
                publish_op(key, inc, ModelStatus::Failed, Some(&failed.reason), ctx)
            }
            _ => fetch_op(key, inc, plan, ctx),
        }),
    }
}

/// This uid's symlink, when `plan` (`None`: leaving) does not keep it: removed first, only if
/// it still points at the copy it was made for.
fn unlink_op(key: &ModelKey, inc: &Incarnation, plan: Option<&Plan>) -> Option<(Op, IncOp)> {
    let (link, copy) = inc.link()?;
    let kept = match plan {
        Some(Plan::Shared { copy: c, link: l, .. }) => {
            l.beneath_root() == Some(link.as_str()) && c.beneath_root() == Some(copy.as_str())
        }
        _ => false,
    };
    if kept {
        return None;
    }
    let op = Op::Unlink { key: key.clone(), uid: inc.uid().clone(), link: link.clone(), copy: copy.clone() };
    Some((op, IncOp::Unlink))
}

/// A shared copy in place: this model's symlink to it, if it is not there yet.
fn link_op(key: &ModelKey, inc: &Incarnation, plan: &Plan) -> Option<(Op, IncOp)> {
    let Plan::Shared { copy, link, .. } = plan else { return None };
    let (link, copy) = (link.beneath_root().map(str::to_string)?, copy.beneath_root().map(str::to_string)?);
    if inc.link() == Some(&(link.clone(), copy.clone())) {
        return None;
    }
    let op = Op::Link { key: key.clone(), uid: inc.uid().clone(), link: link.clone(), copy: copy.clone() };
    Some((op, IncOp::Link { paths: Box::new(LinkPaths { link, copy }) }))
}

/// Publish `status` (and `reason`) unless that is what is published already.
fn publish_op(
    key: &ModelKey,
    inc: &Incarnation,
    status: ModelStatus,
    reason: Option<&str>,
    ctx: &Context,
) -> Option<(Op, IncOp)> {
    let reason: Option<Arc<str>> = reason.map(|r| Arc::from(wire::bounded_reason(r)));
    let target = Published::Status { status, reason: reason.clone() };
    if inc.published == target {
        return None;
    }
    let entry = ModelEntry {
        uid: Some(inc.uid().as_str().to_string()),
        reason: reason.as_deref().map(str::to_string),
        config: if status == ModelStatus::Ready { ready_config(key, inc, ctx) } else { None },
        ..ModelEntry::new(&key.name, status)
    };
    let op = Op::Publish {
        key: key.clone(),
        uid: inc.uid().clone(),
        label_key: wire::label_key(key),
        label: Some(status),
        cm_key: wire::configmap_key(key),
        entry: Box::new(entry),
    };
    Some((op, IncOp::Publish { status, reason }))
}

/// No `Updating` before a fetch when the label already reads Ready after a restart, nor before
/// the check of a `local://` model whose label is absent and which has published nothing (or
/// nothing known yet): that check is a stat and a parse, each with a deadline (after a fetch
/// permit, as OME's queue), and an Updating write in front of it was a second Node patch on the
/// way to Ready (16 ms with 1,000 labels, issue 14). To OME's controller and scheduler an absent
/// label and Updating are the same (neither counts the node).
fn skips_updating(key: &ModelKey, inc: &Incarnation, plan: &Plan, ctx: &Context) -> bool {
    let label = ctx.node.map(|n| n.labels.get(&wire::label_key(key)));
    let already_ready = inc.published == Published::Unknown && label.flatten().is_some_and(|v| v == "Ready");
    let first_check = matches!(plan, Plan::Verify { .. })
        && matches!(inc.published, Published::Nothing | Published::Unknown)
        && label == Some(None);
    already_ready || first_check
}

/// The last root probe answered, and found the root read-only.
fn root_known_read_only(ctx: &Context) -> bool {
    ctx.root.is_some_and(|r| r.answered && !r.writable)
}

/// A model whose reserve label changed since the marker of the directory it downloaded into
/// recorded it: the marker records it again, so that a sweep after a delete no agent sees gives
/// the weights up or trashes them as the label says (`OwnedDir::reserved`). Not for a shared
/// copy (its users keep it), nor while another member's download writes the marker or the
/// directory is being trashed, nor on a root known to be read-only.
fn record_reserve_op(key: &ModelKey, inc: &Incarnation, done: &FetchDone, ctx: &Context) -> Option<(Op, IncOp)> {
    // Asked of every Ready model each time it settles: the common answer first.
    let reserved = inc.is_reserved();
    if done.reserve_recorded == reserved {
        return None;
    }
    let (_, dir) = done.plan.fetch_into()?;
    let read_only = root_known_read_only(ctx);
    let writing = ctx.dir.as_ref().is_some_and(|d| d.busy || d.trashing);
    let owned = inc.owned_dir() == Some(dir) && !shared::in_artifacts(dir);
    if !owned || read_only || writing {
        return None;
    }
    let op = Op::RecordReserve { key: key.clone(), uid: inc.uid().clone(), path: dir.to_string(), reserved };
    Some((op, IncOp::RecordReserve { reserved }))
}

/// Once Ready with metadata, and only with `--update-model-spec`: fill the spec's empty fields.
fn fill_spec_op(key: &ModelKey, inc: &Incarnation, ctx: &Context) -> Option<(Op, IncOp)> {
    let Fetched::Done(done) = &inc.fetched else { return None };
    let FetchDone { plan, metadata: Some(_), .. } = &**done else { return None };
    if !ctx.update_model_spec || inc.spec_filled || ctx.held_by.is_some() {
        return None;
    }
    let dir = match plan {
        Plan::Verify { path } => path.to_string(),
        Plan::Download { dest, .. } | Plan::Shared { copy: dest, .. } => dest.absolute().to_string(),
        Plan::Resolve { .. } => return None,
    };
    Some((Op::FillSpec { key: key.clone(), uid: inc.uid().clone(), dir }, IncOp::FillSpec))
}

/// A Ready entry's `config`: what the model's files say, and for a download what it holds,
/// in OME's v1.2.2 shape: the commit, and as the parent the key of the model that owns the
/// directory with its path. An own download is its own parent, with no children; a shared
/// copy's parent is its first member, whose `childrenPaths` lists the others' symlinks. A
/// check without metadata publishes none; its artifact stays empty, as OME's is for `local://`.
fn ready_config(key: &ModelKey, inc: &Incarnation, ctx: &Context) -> Option<ModelConfig> {
    let Fetched::Done(done) = &inc.fetched else { return None };
    let FetchDone { plan, commit, metadata, .. } = &**done;
    let parsed = || metadata.as_deref().cloned().unwrap_or_default();
    let sha = commit.as_deref().unwrap_or_default().to_string();
    let (parent, dir, children) = match plan {
        Plan::Verify { .. } | Plan::Resolve { .. } => {
            return metadata.as_deref().map(|m| ModelConfig { artifact: Artifact::default(), ..m.clone() });
        }
        Plan::Download { dest, .. } => (wire::configmap_key(key), dest, Vec::new()),
        Plan::Shared { copy, .. } => match ctx.dir.as_ref().and_then(|d| d.artifact.as_ref()) {
            Some(view) => (view.owner_cm_key.clone(), copy, view.children.clone()),
            None => (wire::configmap_key(key), copy, Vec::new()),
        },
    };
    let artifact = Artifact {
        sha,
        parent_path: Some([(parent, dir.absolute().to_string())].into()),
        children_paths: Some(children),
    };
    Some(ModelConfig { artifact, ..parsed() })
}

/// Leaving: first the label and entry, then the directory it owns (unless its artifact is
/// reserved).
fn withdraw_op(key: &ModelKey, inc: &Incarnation, ctx: &Context, now: Instant) -> Option<(Op, IncOp)> {
    if inc.published != Published::Nothing {
        let op = Op::Unpublish {
            key: key.clone(),
            uid: inc.uid().clone(),
            label_key: wire::label_key(key),
            remove_label: !ctx.label_fenced,
            cm_key: wire::configmap_key(key),
        };
        return Some((op, IncOp::Unpublish));
    }
    if let Some(unlink) = unlink_op(key, inc, None) {
        return Some(unlink);
    }
    match inc.owned_dir() {
        Some(path) if disowns(inc, ctx) => {
            // `keep` is filled in at the end of the step (`State::fill_disowns`), when every
            // model's record is settled.
            let op = Op::DisownDir {
                key: Some(key.clone()),
                uid: inc.uid().clone(),
                path: path.to_string(),
                keep: Vec::new(),
            };
            Some((op, IncOp::Disown))
        }
        Some(path) if !trash_blocked(inc, ctx) && !awaits_trash_witness(inc, ctx) => {
            let name = format!("{}-{}", inc.uid(), now.as_ms());
            let op = Op::TrashDir {
                key: Some(key.clone()),
                uid: inc.uid().clone(),
                path: path.to_string(),
                trash_name: name.clone(),
            };
            Some((op, IncOp::Trash { name }))
        }
        _ => None,
    }
}

/// A reserved model confirmed gone gives its directory up (`Op::DisownDir`), so that no sweep
/// trashes it later as an orphan's: not before the first snapshot has shown what the markers
/// name (`State::fill_disowns` keeps those of live models), nor while another member's download
/// writes the marker, nor on a root known to be read-only (where nothing can trash it either,
/// and a retry would keep the incarnation for good).
fn disowns(inc: &Incarnation, ctx: &Context) -> bool {
    let reserved = inc.is_reserved();
    let read_only = root_known_read_only(ctx);
    let busy = ctx.dir.as_ref().is_some_and(|d| d.busy);
    reserved && inc.is_confirmed() && ctx.markers_seen.is_some() && !read_only && !busy
}

/// A reserved model confirmed gone stays until it has given its directory up: while another
/// member's download writes the marker or the root is read-only (swarm seed 7002657: forgotten
/// then, the sweep took the weights later), and, with no directory known, until a snapshot
/// asked for since it last changed has shown which directory its marker names, at most a drift
/// period (seeds 1486: the model was being deleted when the agent started; 200002605: it was
/// deleted, and a candidate, while the first snapshot was out). Each snapshot wakes it.
pub fn reserved_disown_pending(inc: &Incarnation, ctx: &Context) -> bool {
    let unseen = ctx.markers_seen.is_none_or(|seq| inc.changed_seq > seq);
    let disowned = inc.share.as_ref().is_some_and(|s| s.disowned);
    inc.is_reserved() && !disowned && (inc.owned_dir().is_some() || unseen)
}

/// A reserved artifact (kept), or a directory another member still uses (released instead by
/// `drive`) or is writing to (the trash waits for that download to end).
fn trash_blocked(inc: &Incarnation, ctx: &Context) -> bool {
    let reserved = inc.is_reserved();
    reserved || ctx.dir.as_ref().is_some_and(|d| d.busy || d.shared)
}

/// Leaving, would it trash a directory whose marker names other uids (once the Node is
/// witnessed)?
pub fn trash_needs_witness(inc: &Incarnation, ctx: &Context) -> bool {
    inc.owned_dir().is_some() && !trash_blocked(inc, ctx) && ctx.dir.as_ref().is_some_and(|d| d.named_by_others)
}

/// Leaving, is its trash due but waiting for a Node witness (`awaits_trash_witness`)? A
/// confirmed incarnation stays until it is done.
pub fn trash_awaits_witness(inc: &Incarnation, ctx: &Context) -> bool {
    trash_needs_witness(inc, ctx) && awaits_trash_witness(inc, ctx)
}

/// Would a trash of the directory it owns destroy weights another uid its marker names may
/// need? Such a uid may be placed here again by a Node change whose watch event has not come
/// (its exit was witnessed earlier, or never here): the trash waits for a live read of this
/// Node sent once the wait began; a Node view that places it again brings it back to the
/// directory, which it then shares.
fn awaits_trash_witness(inc: &Incarnation, ctx: &Context) -> bool {
    let named_by_others = ctx.dir.as_ref().is_some_and(|d| d.named_by_others);
    let after = inc.share.as_ref().and_then(|s| s.trash_after_seq);
    named_by_others && (ctx.trash_hold || !witness_fresh(after, ctx.node_witness_seq))
}

/// A Node witness sent at or after the step a trash began to wait (`Share::trash_after_seq`).
pub fn witness_fresh(waiting_since_seq: Option<u64>, witness_sent_seq: Option<u64>) -> bool {
    matches!((waiting_since_seq, witness_sent_seq), (Some(since), Some(sent)) if sent >= since)
}

/// Fetching: `Updating` first (unless `skips_updating`), then the check or the download.
fn fetch_op(key: &ModelKey, inc: &Incarnation, plan: &Plan, ctx: &Context) -> Option<(Op, IncOp)> {
    // Never over another live model's files of another source (its storage URI changed, say,
    // while it shared the path): Failed, with no Updating before it, until that model no longer
    // holds them there. (A shared copy's path names its source: it has no such holder.)
    if let (Some((holder, source)), Plan::Download { storage_uri, dest }) =
        (ctx.dir.as_ref().and_then(|d| d.other_source_holder.as_ref()), plan)
    {
        let reason = format!(
            "{} holds {holder}'s files from {source}; {storage_uri} is downloaded there once it does not",
            dest.absolute()
        );
        return publish_op(key, inc, ModelStatus::Failed, Some(&reason), ctx);
    }
    let settled =
        matches!(inc.published, Published::Status { status: ModelStatus::Updating | ModelStatus::Failed, .. });
    if !settled && !skips_updating(key, inc, plan, ctx) {
        return publish_op(key, inc, ModelStatus::Updating, None, ctx);
    }
    // One download into a directory at a time, and none into one being trashed.
    if ctx.dir.as_ref().is_some_and(|d| d.busy || d.trashing) && plan.fetch_into().is_some() {
        return None;
    }
    let parse_metadata = !inc.obj.spec.as_ref().is_ok_and(|s| s.skip_config_parsing);
    let co_owners = ctx.dir.as_ref().map(|d| d.co_owners.clone()).unwrap_or_default();
    let other_source = ctx.dir.as_ref().map(|d| d.other_source.clone()).unwrap_or_default();
    let (key, uid) = (key.clone(), inc.uid().clone());
    let op = match plan {
        Plan::Verify { path } => Op::VerifyLocal { key, uid, path: path.to_string(), parse_metadata },
        Plan::Download { storage_uri, dest } | Plan::Shared { storage_uri, copy: dest, .. } => Op::Download {
            key,
            uid,
            storage_uri: storage_uri.to_string(),
            dest: dest.clone(),
            parse_metadata,
            co_owners,
            keep_marked: ctx.markers_seen.is_none(),
            other_source,
            reserve: inc.is_reserved(),
        },
        Plan::Resolve { storage_uri } => {
            let link = match &inc.dest {
                Ok(Some(dest)) => dest.beneath_root().map(str::to_string).unwrap_or_default(),
                _ => String::new(),
            };
            Op::Resolve { key, uid, storage_uri: storage_uri.to_string(), link }
        }
    };
    Some((op, IncOp::Fetch { plan: Arc::new(plan.clone()) }))
}
