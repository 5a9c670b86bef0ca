//! The simulated API server: ground truth for models, this fleet's node labels and ConfigMaps,
//! and the controller that holds each model's finalizer until no node has an entry for it.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use model_agent_core::machine::DriftSnapshot;
use model_agent_core::placement::NodeView;
use model_agent_core::wire::{self, ModelStatus};
use model_agent_core::{Kind, ModelKey, ModelObject, ModelSpec, Uid};

/// One live object.
#[derive(Clone, Debug)]
pub struct ApiObject {
    /// `key`, `uid`, `created_rv` and `created` are fixed when the object is made (they are
    /// copied into `model`): nothing writes them after.
    pub key: ModelKey,
    pub uid: Uid,
    pub created_rv: u64,
    /// `created_rv` zero-padded, so that text order is creation order, as with RFC 3339
    /// timestamps (made once: every list would otherwise format it again).
    pub created: Arc<str>,
    /// Changed only with `set_rv`, which keeps `rv_text` in step.
    rv: u64,
    /// `rv` as text, made when it changes (every list would otherwise format it again).
    rv_text: Arc<str>,
    /// Private, as `deleting` is: a change goes through `set_spec` or `mark_deleting`, which
    /// make the nodes' copy again.
    spec: Arc<ModelSpec>,
    deleting: bool,
    /// The controller's finalizer (OME's `*.ome.io/finalizer`).
    pub finalizer: bool,
    /// What every node's watch, list and read is handed: made again by `set_rv` (every change
    /// moves the resourceVersion), so that 1,000 nodes share one copy of each version.
    model: Arc<ModelObject>,
}

impl ApiObject {
    fn new(key: ModelKey, uid: Uid, rv: u64, spec: Arc<ModelSpec>, finalizer: bool) -> ApiObject {
        let rv_text: Arc<str> = Arc::from(rv.to_string().as_str());
        let created: Arc<str> = Arc::from(format!("{rv:020}").as_str());
        let model = Arc::new(ModelObject {
            key: key.clone(),
            uid: uid.clone(),
            resource_version: rv_text.clone(),
            created: created.clone(),
            deleting: false,
            spec: Ok(spec.clone()),
        });
        ApiObject { key, uid, created_rv: rv, created, rv, rv_text, spec, deleting: false, finalizer, model }
    }

    pub fn spec(&self) -> &Arc<ModelSpec> {
        &self.spec
    }

    /// A deletionTimestamp is set (the finalizer holds the object).
    pub fn deleting(&self) -> bool {
        self.deleting
    }

    fn set_spec(&mut self, spec: Arc<ModelSpec>, rv: u64) {
        self.spec = spec;
        self.set_rv(rv);
    }

    fn mark_deleting(&mut self, rv: u64) {
        self.deleting = true;
        self.set_rv(rv);
    }

    /// The last step of every change: the new resourceVersion and the nodes' copy.
    fn set_rv(&mut self, rv: u64) {
        self.rv = rv;
        self.rv_text = Arc::from(rv.to_string().as_str());
        self.model = Arc::new(ModelObject {
            resource_version: self.rv_text.clone(),
            deleting: self.deleting,
            spec: Ok(self.spec.clone()),
            ..(*self.model).clone()
        });
    }

    pub fn to_model(&self) -> Arc<ModelObject> {
        debug_assert!(
            self.model.deleting == self.deleting && Arc::ptr_eq(self.model.spec.as_ref().unwrap(), &self.spec)
        );
        self.model.clone()
    }
}

/// A deleted object, kept so that a lagging server can still "see" it.
#[derive(Clone, Debug)]
pub struct Tomb {
    pub obj: ApiObject,
    pub deleted_rv: u64,
}

/// One ConfigMap entry as stored (what the controller and the checks need of it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEntry {
    pub status: ModelStatus,
    /// Shared with every node's entry of that uid (`Api::strings`).
    pub uid: Option<Arc<str>>,
}

/// The simulated ConfigMap is changed by the same rule as the shell's (`wire::apply_entry_writes`).
impl wire::EntryValue for StoredEntry {
    fn owner(&self) -> wire::EntryOwner {
        self.uid.as_deref().map_or(wire::EntryOwner::Anonymous, |u| wire::EntryOwner::Uid(u.to_string()))
    }
}

#[derive(Debug, Default)]
pub struct Api {
    pub rv: u64,
    pub objects: BTreeMap<ModelKey, ApiObject>,
    pub graveyard: Vec<Tomb>,
    /// uid → name of every live object (the checks look objects up by uid on every destructive
    /// effect), by hash and looked up by text: no uid is built for a lookup.
    by_uid: FxHashMap<Arc<str>, ModelKey>,
    /// Per node: its `models.ome.io/` labels, by hash (a sorted map's lookup compared keys
    /// sharing their long prefix ten times; whoever needs them in order sorts them). Keys and
    /// values are shared by every node (one string per text, `strings`).
    pub labels: Vec<FxHashMap<Arc<str>, Arc<str>>>,
    pub strings: Interner,
    /// Per node: its ConfigMap's entries (keys shared like the labels').
    pub entries: Vec<FxHashMap<Arc<str>, StoredEntry>>,
    /// Per node: the Node object's own labels (for eligibility).
    pub node_labels: Vec<BTreeMap<String, String>>,
    /// Per node: until when all its labels are wiped (node-feature-discovery #1802): the Node
    /// shows none, to its watch and to live GETs, and `node_labels` comes back afterwards.
    pub wiped_until: Vec<Option<u64>>,
    /// Per node: its name (`node_name`), made once: placement is asked per model and node.
    names: Vec<String>,
    /// Per node: its label keys and entry keys in order as of its last snapshot, which the next
    /// snapshot reuses when the keys are the same (most snapshots after the first publishes).
    snapshot_order: Vec<[Vec<Arc<str>>; 2]>,
    /// The API server does not answer at all.
    pub down: bool,
    /// GETs and LISTs fail (the watch still works).
    pub reads_fail: bool,
    uid_next: u64,
}

/// One shared copy of each text the fleet's maps hold many times over (label keys, uids).
#[derive(Debug, Default)]
pub struct Interner(FxHashSet<Arc<str>>);

impl Interner {
    pub fn get(&mut self, text: &str) -> Arc<str> {
        if let Some(shared) = self.0.get(text) {
            return shared.clone();
        }
        let shared: Arc<str> = Arc::from(text);
        self.0.insert(shared.clone());
        shared
    }
}

/// `map[key] = value`, taking the key's and the value's shared copies only when the key is new
/// or the value changed (a publish mostly rewrites what is there).
pub fn set_shared(map: &mut FxHashMap<Arc<str>, Arc<str>>, strings: &mut Interner, key: &str, value: &str) {
    match map.get_mut(key) {
        Some(held) if &**held == value => {}
        Some(held) => *held = strings.get(value),
        None => {
            map.insert(strings.get(key), strings.get(value));
        }
    }
}

/// A change the watch streams must carry.
#[derive(Clone, Debug)]
pub enum Change {
    Applied(Arc<ModelObject>),
    Deleted(Arc<ModelObject>),
}

impl Api {
    pub fn new(nodes: usize) -> Api {
        Api {
            labels: vec![FxHashMap::default(); nodes],
            entries: vec![FxHashMap::default(); nodes],
            node_labels: vec![BTreeMap::new(); nodes],
            wiped_until: vec![None; nodes],
            names: (0..nodes).map(node_name).collect(),
            snapshot_order: vec![Default::default(); nodes],
            ..Api::default()
        }
    }

    /// The Node as the API server serves it now.
    pub fn node_view(&self, node: usize) -> NodeView {
        let labels = if self.wiped_until[node].is_some() { BTreeMap::new() } else { self.node_labels[node].clone() };
        NodeView { name: self.names[node].clone(), labels }
    }

    pub fn create(&mut self, key: ModelKey, spec: Arc<ModelSpec>, finalizer: bool) -> Option<Change> {
        if self.objects.contains_key(&key) {
            return None;
        }
        self.rv += 1;
        self.uid_next += 1;
        let uid = Uid::new(&format!("uid-{}-{}", key.name, self.uid_next));
        let obj = ApiObject::new(key.clone(), uid, self.rv, spec, finalizer);
        let model = obj.to_model();
        self.by_uid.insert(Arc::clone(&obj.uid.0), key.clone());
        self.objects.insert(key, obj);
        Some(Change::Applied(model))
    }

    /// A user's delete: with a finalizer the object lingers with a deletionTimestamp.
    pub fn delete(&mut self, key: &ModelKey) -> Vec<Change> {
        let Some(obj) = self.objects.get_mut(key) else { return vec![] };
        if obj.deleting {
            return vec![];
        }
        self.rv += 1;
        if obj.finalizer {
            obj.mark_deleting(self.rv);
            let mut out = vec![Change::Applied(obj.to_model())];
            out.extend(self.controller_check(key));
            out
        } else {
            self.remove(key).into_iter().collect()
        }
    }

    fn remove(&mut self, key: &ModelKey) -> Option<Change> {
        let mut obj = self.objects.remove(key)?;
        self.by_uid.remove(obj.uid.as_str());
        self.rv += 1;
        obj.set_rv(self.rv);
        let model = obj.to_model();
        self.graveyard.push(Tomb { obj, deleted_rv: self.rv });
        Some(Change::Deleted(model))
    }

    /// The controller: a deleting object loses its finalizer once no node's ConfigMap holds an
    /// entry for its key that is not `Deleted` (OME's rule: by key, not uid).
    pub fn controller_check(&mut self, key: &ModelKey) -> Option<Change> {
        let obj = self.objects.get(key)?;
        if !obj.deleting {
            return None;
        }
        let cm_key = wire::configmap_key(key);
        let waiting =
            self.entries.iter().any(|e| e.get(cm_key.as_str()).is_some_and(|s| s.status != ModelStatus::Deleted));
        if waiting { None } else { self.remove(key) }
    }

    pub fn spec_update(&mut self, key: &ModelKey, spec: Arc<ModelSpec>) -> Option<Change> {
        let obj = self.objects.get_mut(key)?;
        self.rv += 1;
        obj.set_spec(spec, self.rv);
        Some(Change::Applied(obj.to_model()))
    }

    pub fn get(&self, key: &ModelKey) -> Option<Arc<ModelObject>> {
        self.objects.get(key).map(ApiObject::to_model)
    }

    /// A quorum list (`at_rv: None`) or the list a server lagging at `at_rv` would serve.
    pub fn list(&self, kind: Kind, at_rv: Option<u64>) -> Vec<Arc<ModelObject>> {
        match at_rv {
            None => self.objects.values().filter(|o| o.key.kind == kind).map(ApiObject::to_model).collect(),
            Some(rv) => {
                let live = self.objects.values().filter(|o| o.created_rv <= rv);
                let dead =
                    self.graveyard.iter().filter(|t| t.obj.created_rv <= rv && rv < t.deleted_rv).map(|t| &t.obj);
                let mut all: Vec<Arc<ModelObject>> =
                    live.chain(dead).filter(|o| o.key.kind == kind).map(ApiObject::to_model).collect();
                all.sort_by(|a, b| a.key.cmp(&b.key));
                all.dedup_by(|a, b| a.key == b.key);
                all
            }
        }
    }

    /// What happened after `rv`, as a watch resumed from it replays it.
    pub fn changes_since(&self, kind: Kind, rv: u64) -> Vec<Change> {
        let mut out: Vec<(u64, Change)> = Vec::new();
        for t in &self.graveyard {
            if t.deleted_rv > rv && t.obj.created_rv <= rv && t.obj.key.kind == kind {
                out.push((t.deleted_rv, Change::Deleted(t.obj.to_model())));
            }
        }
        for o in self.objects.values().filter(|o| o.key.kind == kind && o.rv > rv) {
            out.push((o.rv, Change::Applied(o.to_model())));
        }
        out.sort_by_key(|(rv, _)| *rv);
        out.into_iter().map(|(_, c)| c).collect()
    }

    /// Is an object with this uid alive (not being deleted) and placed on `node`? Decided by
    /// the simulator's own oracle, never by the core's `placement()`.
    pub fn live_here(&self, uid: &str, node: usize) -> Option<&ApiObject> {
        let obj = self.objects.get(self.by_uid.get(uid)?)?;
        (!obj.deleting && self.placed(&obj.spec, node)).then_some(obj)
    }

    /// May `uid`, of `key`, overwrite `other`'s entry? Only as another model whose key collides
    /// and ranks before it (ClusterBaseModel, then older, then smaller uid), or that did when
    /// the write was decided and has been deleted since (the next owner writes again).
    pub fn outranks(&self, key: &ModelKey, uid: &str, other: &ApiObject) -> bool {
        if *key == other.key {
            return false;
        }
        let Some(mine) = self.by_uid.get(uid).and_then(|k| self.objects.get(k)) else { return true };
        let rank = |o: &ApiObject| (o.key.kind != Kind::ClusterBaseModel, o.created_rv, o.uid.as_str().to_string());
        rank(mine) < rank(other)
    }

    /// Does the oracle place `spec` on `node` as the Node is now?
    pub fn placed(&self, spec: &ModelSpec, node: usize) -> bool {
        let labels = if self.wiped_until[node].is_some() { &BTreeMap::new() } else { &self.node_labels[node] };
        crate::oracle::placed(spec, &self.names[node], labels)
    }

    /// The name of the live object with this uid.
    pub fn key_of(&self, uid: &str) -> Option<ModelKey> {
        self.by_uid.get(uid).cloned()
    }

    pub fn snapshot(&mut self, node: usize) -> DriftSnapshot {
        use model_agent_core::machine::EntryView;
        let [label_order, entry_order] = &mut self.snapshot_order[node];
        let labels = in_key_order(&self.labels[node], label_order);
        let entries = in_key_order(&self.entries[node], entry_order);
        DriftSnapshot {
            labels: labels.into_iter().map(|(k, v)| (Arc::clone(k), Arc::clone(v))).collect(),
            entries: entries
                .into_iter()
                .map(|(k, e)| (Arc::clone(k), EntryView { status: Some(e.status), uid: e.uid.clone().map(Uid) }))
                .collect(),
            owned_dirs: vec![],
            trash: vec![],
            unread: vec![],
        }
    }
}

/// A hash map's pairs sorted by key, so that collecting them into a sorted map finds one run
/// (an unstable sort of references, rather than the collector's stable sort of the owned pairs).
/// `order` holds the keys of the previous call in order: when the map holds as many keys and
/// each of them, the keys are the same (a map's keys are distinct) and need no sort.
fn in_key_order<'m, V>(map: &'m FxHashMap<Arc<str>, V>, order: &mut Vec<Arc<str>>) -> Vec<(&'m Arc<str>, &'m V)> {
    if order.len() == map.len()
        && let Some(pairs) = order.iter().map(|k| map.get_key_value(k)).collect::<Option<Vec<_>>>()
    {
        return pairs;
    }
    let mut pairs: Vec<_> = map.iter().collect();
    pairs.sort_unstable_by(|a, b| a.0.cmp(b.0));
    order.clear();
    order.extend(pairs.iter().map(|(k, _)| Arc::clone(k)));
    pairs
}

pub fn node_name(node: usize) -> String {
    format!("node-{node:04}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order a snapshot reuses is always the sorted order of the map's keys now, whatever
    /// changed since the last one (a key added, removed, or replaced by another at the same
    /// count), checked against a sort of its own.
    #[test]
    fn a_reused_key_order_is_the_sorted_order_of_the_keys_now() {
        let mut prng = model_agent_core::prng::Prng::new(3);
        let mut map: FxHashMap<Arc<str>, u64> = FxHashMap::default();
        let mut order = Vec::new();
        for step in 0..3_000u64 {
            let key: Arc<str> = Arc::from(format!("models.ome.io/k{}", prng.up_to(40)).as_str());
            match prng.up_to(3) {
                0 => {
                    map.insert(key, step);
                }
                1 => {
                    map.remove(&key);
                }
                _ => {} // no change: the order is reused
            }
            let got: Vec<(String, u64)> =
                in_key_order(&map, &mut order).into_iter().map(|(k, v)| (k.to_string(), *v)).collect();
            let mut want: Vec<(String, u64)> = map.iter().map(|(k, v)| (k.to_string(), *v)).collect();
            want.sort();
            assert_eq!(got, want, "step {step}");
        }
    }
}
