//! A small reference model of the upstream OME agent (v1.2.x as seen in #834), for side-by-side
//! comparison. It lives here, never in `core/`. What it does (`ome-model-agent.md` §3.1, §3.2.4):
//!
//! - Add (a watch add, or a listed object it did not know) of an eligible model: label and entry
//!   `Updating`, fetch, then `Ready` (or `Failed`).
//! - Any Deleted notification (a watch DELETED, or a relist tombstone, which the #834 agent acted
//!   on) and any update carrying a deletionTimestamp: remove the label and entry at once and
//!   `RemoveAll` the path of a downloaded model. No live read, no uid check.
//! - Update of a known model (`scout.go@493d8c99`): eligible before and not now → the same
//!   removal as a delete; not eligible before and eligible now → add. Both sides are judged
//!   against the one cached Node.
//! - The Node: upstream has no Node watch. It GETs the Node at start and again on every add of
//!   a model eligible on the Node it has cached (`downloadBaseModel`), and keeps what it got.
//!   Here the GET answer is the newest Node the simulated watch showed (`node_latest`).
//! - No live reads at all: read latency cannot reach it; it trusts the watch as it arrives.
//! - Readiness: synced, and the models root writable (`unix.Access(root, W_OK)`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use model_agent_core::dest_path::dest_path;
use model_agent_core::machine::{Effect, EffectId, Input, Op, Outcome, WatchEvent};
use model_agent_core::placement::{NodeView, placement};
use model_agent_core::storage_uri::Provisioning;
use model_agent_core::wire::{self, ModelEntry, ModelStatus};
use model_agent_core::{Instant, ModelKey, ModelObject};

pub struct Upstream {
    models_root: String,
    /// `w.nodeInfo`: the Node as last fetched.
    node: Option<NodeView>,
    /// What a GET of the Node would return now.
    node_latest: Option<NodeView>,
    known: BTreeMap<ModelKey, Arc<ModelObject>>,
    relisting: [Option<BTreeSet<ModelKey>>; 2],
    synced: [bool; 2],
    fetching: BTreeMap<EffectId, Arc<ModelObject>>,
    /// Publishes of `Updating`, and what follows each once it is written.
    after_updating: BTreeMap<EffectId, (Arc<ModelObject>, Option<Op>)>,
    next_id: u64,
}

impl Upstream {
    pub fn new(models_root: &str) -> Upstream {
        Upstream {
            models_root: models_root.to_string(),
            node: None,
            node_latest: None,
            known: BTreeMap::new(),
            relisting: [None, None],
            synced: [false, false],
            fetching: BTreeMap::new(),
            after_updating: BTreeMap::new(),
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

    fn publish(&mut self, out: &mut Vec<Effect>, obj: &ModelObject, status: ModelStatus) -> EffectId {
        let op = Op::Publish {
            key: obj.key.clone(),
            uid: obj.uid.clone(),
            label_key: wire::label_key(&obj.key),
            label: Some(status),
            cm_key: wire::configmap_key(&obj.key),
            entry: Box::new(ModelEntry::new(&obj.key.name, status)),
        };
        self.emit(out, op)
    }

    fn eligible(&self, obj: &ModelObject) -> bool {
        match (&self.node, obj.spec()) {
            (Some(node), Some(spec)) => placement(spec, node).is_eligible(),
            _ => false,
        }
    }

    fn add(&mut self, out: &mut Vec<Effect>, obj: Arc<ModelObject>) {
        let old = self.known.insert(obj.key.clone(), obj.clone());
        if obj.deleting {
            return self.delete(out, &obj);
        }
        match old {
            None if self.eligible(&obj) => {
                // Refresh the node info, then download without checking again.
                self.node = self.node_latest.clone().or(self.node.take());
                self.fetch(out, obj)
            }
            Some(old) => match (self.eligible(&old), self.eligible(&obj)) {
                (true, false) => {
                    self.delete(out, &obj);
                    self.known.insert(obj.key.clone(), obj);
                }
                (false, true) => self.fetch(out, obj),
                _ => {}
            },
            None => {}
        }
    }

    fn fetch(&mut self, out: &mut Vec<Effect>, obj: Arc<ModelObject>) {
        let Some(spec) = obj.spec() else { return };
        let Ok(uri) = &spec.uri else {
            self.publish(out, &obj, ModelStatus::Failed);
            return;
        };
        let dest = dest_path(spec, &self.models_root).ok().flatten();
        let op = match (uri.provisioning(), dest) {
            (Provisioning::VerifyLocal, Some(d)) => {
                let (key, uid) = (obj.key.clone(), obj.uid.clone());
                Some(Op::VerifyLocal { key, uid, path: d.absolute().to_string(), parse_metadata: false })
            }
            (Provisioning::Download, Some(d)) => Some(Op::Download {
                co_owners: Vec::new(),
                keep_marked: false,
                other_source: Vec::new(),
                reserve: false,
                key: obj.key.clone(),
                uid: obj.uid.clone(),
                storage_uri: spec.storage_uri.to_string(),
                dest: d,
                parse_metadata: false,
            }),
            _ => None,
        };
        // The gopher works one step after the other: the fetch starts once Updating is written.
        let id = self.publish(out, &obj, ModelStatus::Updating);
        self.after_updating.insert(id, (obj, op));
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
            && let Some(path) = dest.beneath_root()
        {
            let trash_name = format!("{}-upstream-removeall", obj.uid);
            self.emit(
                out,
                Op::TrashDir { key: Some(obj.key.clone()), uid: obj.uid.clone(), path: path.to_string(), trash_name },
            );
        }
    }

    pub fn handle(&mut self, _now: Instant, input: Input) -> Vec<Effect> {
        let mut out = Vec::new();
        match input {
            Input::NodeObserved(node) => {
                // The start's GET; later Node changes only reach it through the next add.
                if self.node.is_none() {
                    self.node = Some(node.clone());
                }
                self.node_latest = Some(node);
            }
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
                        let gone: Vec<Arc<ModelObject>> = self
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
            Input::EffectDone { id, outcome: _ } if self.after_updating.contains_key(&id) => {
                let (obj, op) = self.after_updating.remove(&id).expect("checked");
                if self.known.get(&obj.key).is_none_or(|k| k.uid != obj.uid) {
                    return out;
                }
                match op {
                    Some(op) => {
                        let id = self.emit(&mut out, op);
                        self.fetching.insert(id, obj);
                    }
                    None => {
                        self.publish(&mut out, &obj, ModelStatus::Ready);
                    }
                }
            }
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
