//! A small reference model of the upstream OME agent (v1.2.x as seen in #834), for side-by-side
//! comparison. It lives here, never in `core/`. What it does (`ome-model-agent.md` §3.1, §3.2.4):
//!
//! - Add (a watch add, or a listed object it did not know) of an eligible model: label and entry
//!   `Updating`, fetch, then `Ready` (or `Failed`).
//! - Any Deleted notification (a watch DELETED, or a relist tombstone, which the #834 agent acted
//!   on) and any update carrying a deletionTimestamp: remove the label and entry at once and
//!   `RemoveAll` the path of a downloaded model. No live read, no uid check.
//! - Readiness: synced, and the models root writable (`unix.Access(root, W_OK)`).

use std::collections::{BTreeMap, BTreeSet};

use model_agent_core::dest_path::dest_path;
use model_agent_core::machine::{Effect, EffectId, Input, Op, Outcome, WatchEvent};
use model_agent_core::placement::{NodeView, placement};
use model_agent_core::storage_uri::Provisioning;
use model_agent_core::wire::{self, ModelEntry, ModelStatus};
use model_agent_core::{Instant, ModelKey, ModelObject};

pub struct Upstream {
    models_root: String,
    node: Option<NodeView>,
    known: BTreeMap<ModelKey, ModelObject>,
    relisting: [Option<BTreeSet<ModelKey>>; 2],
    synced: [bool; 2],
    fetching: BTreeMap<EffectId, ModelObject>,
    next_id: u64,
}

impl Upstream {
    pub fn new(models_root: &str) -> Upstream {
        Upstream {
            models_root: models_root.to_string(),
            node: None,
            known: BTreeMap::new(),
            relisting: [None, None],
            synced: [false, false],
            fetching: BTreeMap::new(),
            next_id: 1,
        }
    }

    pub fn synced(&self) -> bool {
        self.synced.iter().all(|s| *s)
    }

    fn emit(&mut self, out: &mut Vec<Effect>, op: Op) -> EffectId {
        let id = EffectId(self.next_id);
        self.next_id += 1;
        out.push(Effect { id, op });
        id
    }

    fn publish(&mut self, out: &mut Vec<Effect>, obj: &ModelObject, status: ModelStatus) {
        let op = Op::Publish {
            key: obj.key.clone(),
            uid: obj.uid.clone(),
            label_key: wire::label_key(&obj.key),
            label: Some(status),
            cm_key: wire::configmap_key(&obj.key),
            entry: Box::new(ModelEntry::new(&obj.key.name, status)),
        };
        self.emit(out, op);
    }

    fn add(&mut self, out: &mut Vec<Effect>, obj: ModelObject) {
        let fresh = !self.known.contains_key(&obj.key);
        self.known.insert(obj.key.clone(), obj.clone());
        if obj.deleting {
            return self.delete(out, &obj);
        }
        let (Some(node), Some(spec)) = (&self.node, obj.spec()) else { return };
        if !fresh || !placement(spec, node).is_eligible() {
            return;
        }
        let Ok(uri) = &spec.uri else { return self.publish(out, &obj, ModelStatus::Failed) };
        let dest = dest_path(spec, &self.models_root).ok().flatten();
        self.publish(out, &obj, ModelStatus::Updating);
        let op = match (uri.provisioning(), dest) {
            (Provisioning::VerifyLocal, Some(d)) => {
                Op::VerifyLocal { key: obj.key.clone(), uid: obj.uid.clone(), path: d.absolute }
            }
            (Provisioning::Download, Some(d)) => Op::Download {
                key: obj.key.clone(),
                uid: obj.uid.clone(),
                storage_uri: spec.storage_uri.clone(),
                dest: d,
            },
            _ => return self.publish(out, &obj, ModelStatus::Ready),
        };
        let id = self.emit(out, op);
        self.fetching.insert(id, obj);
    }

    fn delete(&mut self, out: &mut Vec<Effect>, obj: &ModelObject) {
        self.known.remove(&obj.key);
        let op = Op::Unpublish {
            key: obj.key.clone(),
            uid: obj.uid.clone(),
            label_key: wire::label_key(&obj.key),
            remove_label: true,
            cm_key: wire::configmap_key(&obj.key),
        };
        self.emit(out, op);
        let downloaded = obj.spec().and_then(|s| s.uri.as_ref().ok()).is_some_and(|u| u.downloads());
        if let (true, Some(spec)) = (downloaded, obj.spec())
            && let Ok(Some(dest)) = dest_path(spec, &self.models_root)
            && let Some(path) = dest.beneath_root
        {
            let trash_name = format!("{}-upstream-removeall", obj.uid);
            self.emit(out, Op::TrashDir { key: Some(obj.key.clone()), uid: obj.uid.clone(), path, trash_name });
        }
    }

    pub fn handle(&mut self, _now: Instant, input: Input) -> Vec<Effect> {
        let mut out = Vec::new();
        match input {
            Input::NodeObserved(node) => self.node = Some(node),
            Input::Watch { kind, event } => match event {
                WatchEvent::Applied(obj) => self.add(&mut out, obj),
                WatchEvent::Deleted(obj) => self.delete(&mut out, &obj),
                WatchEvent::RelistStarted => self.relisting[kind.index()] = Some(BTreeSet::new()),
                WatchEvent::RelistItem(obj) => {
                    if let Some(seen) = &mut self.relisting[kind.index()] {
                        seen.insert(obj.key.clone());
                    }
                    self.add(&mut out, obj);
                }
                WatchEvent::RelistDone => {
                    if let Some(seen) = self.relisting[kind.index()].take() {
                        let gone: Vec<ModelObject> = self
                            .known
                            .values()
                            .filter(|o| o.key.kind == kind && !seen.contains(&o.key))
                            .cloned()
                            .collect();
                        for obj in gone {
                            self.delete(&mut out, &obj);
                        }
                    }
                    self.synced[kind.index()] = true;
                }
            },
            Input::EffectDone { id, outcome } => {
                if let Some(obj) = self.fetching.remove(&id)
                    && self.known.get(&obj.key).is_some_and(|k| k.uid == obj.uid)
                {
                    let status = if outcome == Outcome::Done { ModelStatus::Ready } else { ModelStatus::Failed };
                    self.publish(&mut out, &obj, status);
                }
            }
            _ => {}
        }
        out
    }
}
