//! Colliding wire keys (core.md, "Label keys can collide"). OME's truncation lets two models map
//! to one node label or ConfigMap key: ClusterBaseModel `basemodel.x` and BaseModel `x` in
//! namespace `clusterbasemodel` both map to `models.ome.io/clusterbasemodel.basemodel.x`. Such a
//! key is shared: one model owns its value, and it is removed only when no other model that
//! may have it remains.

use super::*;
use std::hash::{Hash, Hasher};

/// An index of the models whose keys OME truncates (a hash and a suffix): their colliders
/// cannot be derived from the key text. Every other model's colliders are found by parsing its
/// key back into the names that could produce it (`preimages`), so ordinary models cost nothing
/// here. Keyed by a hash of the label key and of the ConfigMap key; a hash collision only costs
/// a comparison.
#[derive(Clone, Debug, Default)]
pub(super) struct Claims {
    truncated: Map<u64, Arc<Vec<ModelKey>>>,
    /// How many models kept have a key with another reading (`has_other_reading`). While none
    /// has and nothing is indexed, no two untruncated keys can collide.
    ambiguous: usize,
}

/// What the other models mapping to this model's keys mean for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Contest {
    /// Another model placed here ranks first for a key this one maps to: it owns the value, and
    /// this one writes nothing.
    pub(super) held_by: Option<ModelKey>,
    /// Another model not confirmed gone may have the label, or is placed here and maps to it:
    /// never remove it.
    pub(super) fenced: bool,
    /// Another model has an effect in flight that may write the shared keys: a leaving one's
    /// (its removal of the shared label, say), or, for a model no other holds, a live one's
    /// publish or removal (sent before this model outranked it). Nothing is written to the
    /// shared keys until it lands, or the earlier write could land over the later one (an
    /// executor that does not keep writes in order).
    pub(super) settling: bool,
}

/// A model's node label key and ConfigMap key, computed once per lookup.
struct WireKeys {
    label: String,
    cm: String,
}

impl WireKeys {
    fn of(key: &ModelKey) -> WireKeys {
        WireKeys { label: wire::label_key(key), cm: wire::configmap_key(key) }
    }

    fn hashes(&self) -> [u64; 2] {
        let hash = |tag: u8, s: &str| {
            let mut h = rustc_hash::FxHasher::default();
            tag.hash(&mut h);
            s.hash(&mut h);
            h.finish()
        };
        [hash(0, &self.label), hash(1, &self.cm)]
    }

    /// Does `other` share the node label or the ConfigMap key?
    fn shared_with(&self, other: &ModelKey) -> bool {
        wire::label_key(other) == self.label || wire::configmap_key(other) == self.cm
    }
}

fn hashes(key: &ModelKey) -> [u64; 2] {
    WireKeys::of(key).hashes()
}

/// The untruncated model keys other than `key` whose entry key could be `cm_key`-shaped `text`:
/// a ClusterBaseModel after `clusterbasemodel.`, and a BaseModel at every `.basemodel.` split.
/// `key`'s own reading (nearly always the only one) is skipped without being built.
fn preimages_besides(text: &str, key: &ModelKey, out: &mut Vec<ModelKey>) {
    let is_key = |kind: Kind, ns: &str, name: &str| key.kind == kind && &*key.namespace == ns && &*key.name == name;
    if let Some(name) = text.strip_prefix("clusterbasemodel.").filter(|n| !n.is_empty())
        && !is_key(Kind::ClusterBaseModel, "", name)
    {
        out.push(ModelKey::cluster(name));
    }
    for (at, _) in text.match_indices(".basemodel.") {
        let (ns, name) = (&text[..at], &text[at + ".basemodel.".len()..]);
        if !ns.is_empty() && !name.is_empty() && !is_key(Kind::BaseModel, ns, name) {
            out.push(ModelKey::namespaced(ns, name));
        }
    }
}

/// Could `preimages_besides` find anything for `key`'s wire keys? Only for a truncated key, or
/// when its namespace or name contains `basemodel`: the key text of an untruncated key is
/// `clusterbasemodel.<name>` or `<ns>.basemodel.<name>`, and any other `.basemodel.` in it, or a
/// `clusterbasemodel.` prefix of a BaseModel's, must overlap the namespace or the name in at
/// least the `basemodel` part (the separators' dots cannot line up otherwise).
pub(super) fn has_other_reading(key: &ModelKey) -> bool {
    let has = |s: &str| s.as_bytes().windows(b"basemodel".len()).any(|w| w == b"basemodel");
    wire::is_truncated(key) || has(&key.name) || has(&key.namespace)
}

impl Claims {
    pub(super) fn add(&mut self, key: &ModelKey) {
        self.ambiguous += usize::from(has_other_reading(key));
        if !wire::is_truncated(key) {
            return;
        }
        for h in hashes(key) {
            let mut keys = self.truncated.get(&h).map(|ks| (**ks).clone()).unwrap_or_default();
            if !keys.contains(key) {
                keys.push(key.clone());
                self.truncated.insert(h, Arc::new(keys));
            }
        }
    }

    pub(super) fn remove(&mut self, key: &ModelKey) {
        self.ambiguous -= usize::from(has_other_reading(key));
        if !wire::is_truncated(key) {
            return;
        }
        for h in hashes(key) {
            let Some(keys) = self.truncated.get(&h) else { continue };
            let rest: Vec<ModelKey> = keys.iter().filter(|k| *k != key).cloned().collect();
            if rest.is_empty() {
                self.truncated.remove(&h);
            } else {
                self.truncated.insert(h, Arc::new(rest));
            }
        }
    }

    /// How many models kept the index counts as having a key with another reading.
    pub(super) fn ambiguous(&self) -> usize {
        self.ambiguous
    }

    /// Is `key` in the index (under its label key's hash)?
    pub(super) fn indexes(&self, key: &ModelKey) -> bool {
        self.truncated.get(&hashes(key)[0]).is_some_and(|ks| ks.contains(key))
    }

    /// Nearly always true: nothing indexed, and no model kept (or the key's text) has another
    /// reading, so no other model can share `key`'s wire keys. Decided without building them,
    /// with `colliders`' answer: a model that shares an untruncated key's text reads it two
    /// ways, so it has another reading too, and otherwise `preimages_besides` finds nothing.
    #[inline]
    pub(super) fn none_collide(&self, key: &ModelKey) -> bool {
        self.truncated.is_empty() && ((self.ambiguous == 0 && !wire::is_truncated(key)) || !has_other_reading(key))
    }

    /// The other known models whose label key or ConfigMap key equals one of `key`'s.
    pub(super) fn colliders(&self, slots: &Map<ModelKey, Arc<Slot>>, key: &ModelKey) -> Vec<ModelKey> {
        if self.none_collide(key) {
            return Vec::new();
        }
        let mine = WireKeys::of(key);
        let collides = |k: &ModelKey| k != key && mine.shared_with(k);
        let label_suffix = mine.label.strip_prefix(wire::LABEL_DOMAIN).and_then(|r| r.strip_prefix('/')).unwrap_or("");
        let mut out = Vec::new();
        preimages_besides(label_suffix, key, &mut out);
        if label_suffix != mine.cm {
            preimages_besides(&mine.cm, key, &mut out);
        }
        out.retain(|k| slots.contains_key(k) && collides(k));
        // Only models with truncated keys are indexed: usually none.
        if !self.truncated.is_empty() {
            for h in mine.hashes() {
                if let Some(keys) = self.truncated.get(&h) {
                    out.extend(keys.iter().filter(|k| collides(k)).cloned());
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Static rank of a claim, first wins: a ClusterBaseModel (cluster-admin intent) before a
/// BaseModel, then the older creationTimestamp, then the smaller uid. Every node and every
/// restart agree on it.
type Rank = (bool, Arc<str>, Uid);

fn rank(key: &ModelKey, inc: &Incarnation) -> Rank {
    (key.kind != Kind::ClusterBaseModel, inc.obj.created.clone(), inc.uid().clone())
}

/// An incarnation of `slot` alive as far as the core knows and placed here (or still with
/// something here), the current one first: only such a model can own a shared key. A former
/// one counts too, since which uid of a name is alive may be unknown for a while (a stale
/// relist can show an old uid after a new one). After a start (`unsnapshotted`), until the
/// first snapshot says what a previous run left on the node, a model the Node's view does not
/// place may still have its label and entry here (a wiped Node, say): a colliding model it
/// outranks must not write over them meanwhile.
fn claimant<'a>(slot: &'a Slot, (node, unsnapshotted): (Option<&NodeView>, bool)) -> Option<&'a Incarnation> {
    let claims = |inc: &&Incarnation| {
        let alive = inc.may_stay();
        let maybe_here = inc.something_here() || (unsnapshotted && inc.published == Published::Unknown);
        alive && (eligible_now(inc, node) == Some(true) || maybe_here)
    };
    slot.current.iter().chain(slot.former.iter()).find(claims)
}

/// How the models colliding with `key` bear on it. `None` when nothing collides (nearly always).
pub(super) fn contest(
    slots: &Map<ModelKey, Arc<Slot>>,
    claims: &Claims,
    (node, unsnapshotted): (Option<&NodeView>, bool),
    inflight: &Map<EffectId, Owner>,
    key: &ModelKey,
) -> Option<Contest> {
    if claims.none_collide(key) {
        return None;
    }
    let colliders = claims.colliders(slots, key);
    if colliders.is_empty() {
        return None;
    }
    let mut contest = Contest::default();
    let mut writes_in_flight = false;
    let mine = slots.get(key).and_then(|s| claimant(s, (node, unsnapshotted))).map(|inc| rank(key, inc));
    let mut best: Option<(Rank, &ModelKey)> = None;
    for other in &colliders {
        let Some(slot) = slots.get(other) else { continue };
        // Removed only when no other model that may have it, or is placed here, maps to it.
        // A withdrawn or confirmed model is leaving too: it never fences (two leaving models
        // would each wait for the other).
        let alive = Incarnation::may_stay;
        contest.fenced |= slot.all().any(|i| alive(i) && i.claims_label());
        contest.settling |= slot.all().any(|i| !alive(i) && i.inflight.is_some());
        writes_in_flight |= slot.all().any(|i| alive(i) && writes_keys_in_flight(i, inflight));
        if let Some(inc) = claimant(slot, (node, unsnapshotted)) {
            contest.fenced = true;
            let r = rank(other, inc);
            if best.as_ref().is_none_or(|(b, _)| r < *b) {
                best = Some((r, other));
            }
        }
    }
    if let (Some(mine), Some((theirs, owner))) = (mine, best)
        && theirs < mine
    {
        contest.held_by = Some(owner.clone());
    }
    // Only the model that would write the shared keys next waits for them: a held one writes
    // nothing, and must go on being reported as held.
    contest.settling |= writes_in_flight && contest.held_by.is_none();
    Some(contest)
}

/// Is the effect `inc` has in flight a write of its label and entry (a publish or a removal)?
fn writes_keys_in_flight(inc: &Incarnation, inflight: &Map<EffectId, Owner>) -> bool {
    let what = inc.inflight.get().and_then(|id| inflight.get(&id));
    matches!(what, Some(Owner::Inc { what: IncOp::Publish { .. } | IncOp::Unpublish, .. }))
}

/// Why a model that loses a shared key is Failed on this node.
pub fn collision_reason(key: &ModelKey, owner: &ModelKey) -> String {
    format!(
        "node label {} or ConfigMap key {} is also the key of {owner}, which ranks first \
         (ClusterBaseModel, then older, then smaller uid); {key} is not reported on this node",
        wire::label_key(key),
        wire::configmap_key(key)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names and namespaces from fragments that can form the separators across the boundaries.
    fn texts() -> Vec<String> {
        let parts = ["a", ".", "basemodel", "base", "model.", "cluster", "clusterbasemodel", ".basemodel"];
        let mut out = vec![String::new()];
        for _ in 0..3 {
            let longer: Vec<String> = out.iter().flat_map(|t| parts.iter().map(move |p| format!("{t}{p}"))).collect();
            out.extend(longer);
        }
        out.sort();
        out.dedup();
        out.retain(|t| !t.is_empty());
        out
    }

    /// The fast path of `colliders` gives the slow path's answer: a key without another
    /// reading has no preimage besides itself.
    #[test]
    fn no_other_reading_means_no_preimage() {
        let ts = texts();
        let mut keys: Vec<ModelKey> = ts.iter().map(|n| ModelKey::cluster(n)).collect();
        for ns in ts.iter().filter(|t| t.len() <= 20) {
            keys.extend(ts.iter().filter(|t| t.len() <= 20).map(|n| ModelKey::namespaced(ns, n)));
        }
        let mut checked = 0;
        for key in keys.iter().filter(|k| !has_other_reading(k)) {
            let label = wire::label_key(key);
            let suffix = label.strip_prefix("models.ome.io/").expect("label prefix");
            let mut out = Vec::new();
            preimages_besides(suffix, key, &mut out);
            preimages_besides(&wire::configmap_key(key), key, &mut out);
            assert!(out.is_empty(), "{key}: {out:?}");
            checked += 1;
        }
        assert!(checked > 100 && checked < keys.len(), "{checked} of {}", keys.len());
    }
}
