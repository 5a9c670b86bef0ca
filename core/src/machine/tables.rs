//! The life-cycle tables of core.md as pure functions, one match arm per row: what a candidate
//! event does (`on_candidate`), what a live read's answer does (`read_verdict`), what a change of
//! placement does (`placement_step`), what the Node witness decides (`witness_verdict`), what an
//! incarnation should look like on this node (`want`), and the next effect that brings it there
//! (`next_op`).

use std::sync::Arc;

use super::io::{Cause, Confirmation, Op, RootProbe};
use super::records::{Fetched, Incarnation, Life, Plan, Published};
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
        (Provisioning::VerifyLocal, Some(dest)) => Want::Fetch(Plan::Verify { path: dest.absolute.clone() }),
        (Provisioning::Download, Some(dest)) => match ctx.root {
            // Unknown (not probed, or the filesystem did not answer): neither fetch nor fail.
            None => Want::Hold,
            Some(root) if !root.answered => Want::Hold,
            Some(root) if !root.writable => Want::Failed(read_only_reason(ctx.models_root, root, uri.scheme())),
            Some(_) if ctx.former_owns_dir => Want::Hold,
            Some(_) => Want::Fetch(Plan::Download { storage_uri: spec.storage_uri.clone(), dest: dest.clone() }),
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
    Publish { status: ModelStatus, reason: Option<Arc<str>> },
    Unpublish,
    Fetch { plan: Plan },
    Trash { name: String },
    FillSpec,
}

/// The next effect an incarnation needs, if any. Pure: one arm per `Want`.
pub fn next_op(key: &ModelKey, inc: &Incarnation, want: &Want, ctx: &Context, now: Instant) -> Option<(Op, IncOp)> {
    match want {
        Want::Hold | Want::Collides(_) => None,
        Want::Absent => withdraw_op(key, inc, ctx, now),
        Want::Failed(reason) => publish_op(key, inc, ModelStatus::Failed, Some(reason)),
        Want::Ready => publish_op(key, inc, ModelStatus::Ready, None),
        Want::Fetch(plan) => match &inc.fetched {
            Fetched::Done { plan: done, .. } if **done == *plan => {
                publish_op(key, inc, ModelStatus::Ready, None).or_else(|| fill_spec_op(key, inc, ctx))
            }
            Fetched::Failed { plan: failed, reason, .. } if **failed == *plan => {
                publish_op(key, inc, ModelStatus::Failed, Some(reason))
            }
            _ => fetch_op(key, inc, plan, ctx),
        },
    }
}

/// Publish `status` (and `reason`) unless that is what is published already.
fn publish_op(key: &ModelKey, inc: &Incarnation, status: ModelStatus, reason: Option<&str>) -> Option<(Op, IncOp)> {
    let reason: Option<Arc<str>> = reason.map(Arc::from);
    let target = Published::Status { status, reason: reason.clone() };
    if inc.published == target {
        return None;
    }
    let entry = ModelEntry {
        uid: Some(inc.uid().as_str().to_string()),
        reason: reason.as_deref().map(str::to_string),
        config: if status == ModelStatus::Ready { ready_config(key, inc) } else { None },
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

/// Once Ready with metadata, and only with `--update-model-spec`: fill the spec's empty fields.
fn fill_spec_op(key: &ModelKey, inc: &Incarnation, ctx: &Context) -> Option<(Op, IncOp)> {
    let Fetched::Done { plan, metadata: Some(_), .. } = &inc.fetched else { return None };
    if !ctx.update_model_spec || inc.spec_filled || ctx.held_by.is_some() {
        return None;
    }
    let dir = match &**plan {
        Plan::Verify { path } => path.clone(),
        Plan::Download { dest, .. } => dest.absolute.clone(),
    };
    Some((Op::FillSpec { key: key.clone(), uid: inc.uid().clone(), dir }, IncOp::FillSpec))
}

/// A Ready entry's `config`: what the model's files say, and for a download what it holds,
/// in OME's shape: the commit, and this model's own key and directory as the parent (no
/// children: one copy per model for now). A check without metadata publishes none; its
/// artifact stays empty, as OME's is for `local://`.
fn ready_config(key: &ModelKey, inc: &Incarnation) -> Option<ModelConfig> {
    let Fetched::Done { plan, commit, metadata } = &inc.fetched else { return None };
    let parsed = || metadata.as_deref().cloned().unwrap_or_default();
    match &**plan {
        Plan::Verify { .. } => metadata.as_deref().map(|m| ModelConfig { artifact: Artifact::default(), ..m.clone() }),
        Plan::Download { dest, .. } => {
            let artifact = Artifact {
                sha: commit.as_deref().unwrap_or_default().to_string(),
                parent_path: Some([(wire::configmap_key(key), dest.absolute.clone())].into()),
                children_paths: Some(Vec::new()),
            };
            Some(ModelConfig { artifact, ..parsed() })
        }
    }
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
    let reserved = inc.obj.spec().is_some_and(|s| s.reserve_artifact);
    match &inc.owned_dir {
        Some(path) if !reserved => {
            let name = format!("{}-{}", inc.uid(), now.as_ms());
            let op = Op::TrashDir {
                key: Some(key.clone()),
                uid: inc.uid().clone(),
                path: path.clone(),
                trash_name: name.clone(),
            };
            Some((op, IncOp::Trash { name }))
        }
        _ => None,
    }
}

/// Fetching: `Updating` first (unless the label already reads Ready after a restart), then the
/// check or the download.
fn fetch_op(key: &ModelKey, inc: &Incarnation, plan: &Plan, ctx: &Context) -> Option<(Op, IncOp)> {
    let settled =
        matches!(inc.published, Published::Status { status: ModelStatus::Updating | ModelStatus::Failed, .. });
    let already_ready = inc.published == Published::Unknown
        && ctx.node.and_then(|n| n.labels.get(&wire::label_key(key))).is_some_and(|v| v == "Ready");
    if !settled && !already_ready {
        return publish_op(key, inc, ModelStatus::Updating, None);
    }
    let parse_metadata = !inc.obj.spec.as_ref().is_ok_and(|s| s.skip_config_parsing);
    let (key, uid) = (key.clone(), inc.uid().clone());
    let op = match plan {
        Plan::Verify { path } => Op::VerifyLocal { key, uid, path: path.clone(), parse_metadata },
        Plan::Download { storage_uri, dest } => {
            Op::Download { key, uid, storage_uri: storage_uri.clone(), dest: dest.clone(), parse_metadata }
        }
    };
    Some((op, IncOp::Fetch { plan: plan.clone() }))
}
