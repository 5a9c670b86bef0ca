//! The one vocabulary of user actions and faults that the swarm draws from a seed and the
//! property tests generate (and shrink): each is an [`Action`], applied to a [`World`] by
//! [`apply`]. Names are small numbers; [`key`] and [`spec`] turn them into objects.

use model_agent_core::model::DownloadPolicy;
use model_agent_core::prng::Prng;
use model_agent_core::{Kind, ModelKey, ModelSpec};

use crate::world::{Agent, ListShape, World};

/// The node label some models select (`gpu=true`); even nodes start with it.
pub const SELECTOR: (&str, &str) = ("gpu", "true");
/// Storage URI shapes [`spec`] knows (0 local, 1 hf, 2 vendor, 3 oci with an empty path, 4 hf
/// with `downloadPolicy: ReuseIfExists`, 5 hf at one path every model of that shape names).
pub const URIS: u8 = 6;

#[cfg(test)]
mod tests {
    #[test]
    fn names_ending_in_8_and_9_collide() {
        use model_agent_core::wire::label_key;
        assert_eq!(label_key(&super::key(18)), label_key(&super::key(19)));
        assert_ne!(label_key(&super::key(17)), label_key(&super::key(18)));
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create a model (no-op when one by that name exists).
    Create {
        name: usize,
        uri: u8,
        selects: bool,
    },
    /// Delete it; without `finalizer` the object goes at once.
    Delete {
        name: usize,
        finalizer: bool,
    },
    /// Delete without a finalizer and create another under the same name (a new uid).
    Recreate {
        name: usize,
        uri: u8,
    },
    /// The user edits the model's placement: selects `gpu=true` or nothing.
    Reselect {
        name: usize,
        selects: bool,
    },
    /// A node gains or loses `gpu=true`.
    NodeLabel {
        node: usize,
        present: bool,
    },
    /// Every label of a node vanishes for `ms`, then comes back (NFD #1802).
    WipeNodeLabels {
        node: usize,
        ms: u64,
    },
    /// A CRD change: every watch of `kind` relists, served as `shape` (0 empty, 1 stale,
    /// 2 part-way, 3 quorum).
    Storm {
        kind: Kind,
        shape: u8,
    },
    Outage {
        ms: u64,
    },
    ReadsFail {
        ms: u64,
    },
    ReadTimeouts {
        permille: u64,
    },
    /// Live-read answers take up to `read_ms_max` after being served; the Node watch lags up
    /// to `node_watch_ms_max`.
    Latency {
        read_ms_max: u64,
        node_watch_ms_max: u64,
    },
    Crash {
        node: usize,
        down_ms: u64,
    },
    Shutdown {
        node: usize,
        exit_ms: u64,
    },
    ReadOnlyRoot {
        node: usize,
        read_only: bool,
    },
    Wait {
        ms: u64,
    },
    /// One of the models at shape 5's directory ([`PAIR_PATH`]) switches its storage URI
    /// between [`PAIR_SOURCES`], keeping its path, while the others there stay (README, "Same
    /// path, same source"): `pick` chooses among them (none there: nothing happens). With
    /// `restart`, the node's agent stops first, the change is made while it is down, and it
    /// starts again `down_ms` later.
    Source {
        pick: usize,
        restart: Option<(usize, u64)>,
    },
    /// Turns the reserve label (`models.ome/reserve-model-artifact`) on or off for one live
    /// model (`pick` modulo their number): its weights outlive its delete.
    Reserve {
        pick: usize,
    },
    /// An operator removes the node's shared copies (`_artifacts/...`) by hand, markers and
    /// all; the links to them stay. The agent must fetch them again for the models using them.
    RemoveCopies {
        node: usize,
    },
}

/// The directory every model of shape 5 names, and the two sources [`Action::Source`] moves
/// them between (the first is shape 5's own).
pub const PAIR_PATH: &str = "/mnt/models/pair";
pub const PAIR_SOURCES: [&str; 2] = ["hf://org/pair", "hf://org/pair-b"];

/// Names `n % 5 == 4` are namespaced BaseModels, the others ClusterBaseModels. Names ending in
/// 8 and 9 collide (issue 7, hole 3): ClusterBaseModel `basemodel.v-0009` and BaseModel `v-0009`
/// in namespace `clusterbasemodel` share one label key and one ConfigMap key.
pub fn key(name: usize) -> ModelKey {
    let n = format!("v-{name:04}");
    match name % 10 {
        8 => ModelKey::cluster(&format!("basemodel.v-{:04}", name + 1)),
        9 => ModelKey::namespaced("clusterbasemodel", &n),
        4 => ModelKey::namespaced("team", &n),
        _ => ModelKey::cluster(&n),
    }
}

/// Shapes 3 and 5 share one directory per node (same source, same path); shape 4 links each
/// model's path to the node's one copy of `org/shared`'s commit (issue 10). Shape 4's paths
/// are apart from shape 1's: a symlink an agent process leaves behind when it stops (a model
/// deleted or re-created meanwhile) is unknown to the next one, as the snapshot does not report
/// symlinks, so a download at that path would stay refused (`World::orphan_links` counts them).
pub fn spec(name: usize, uri: u8, selects: bool) -> ModelSpec {
    let n = format!("v-{name:04}");
    let mut s = match uri % URIS {
        0 => ModelSpec::simple(&format!("local:///mnt/share/{n}"), None),
        1 => ModelSpec::simple("hf://org/weights", Some(&format!("/mnt/models/{n}"))),
        2 => ModelSpec::simple("vendor://nvidia/nim/x", None),
        3 => ModelSpec::simple("oci://n/ns/b/bucket/o/weights", Some("")),
        4 => ModelSpec {
            download_policy: DownloadPolicy::ReuseIfExists,
            ..ModelSpec::simple("hf://org/shared", Some(&format!("/mnt/models/linked/{n}")))
        },
        _ => ModelSpec::simple(PAIR_SOURCES[0], Some(PAIR_PATH)),
    };
    if selects {
        s.node_selector.push((SELECTOR.0.into(), SELECTOR.1.into()));
    }
    s
}

/// Label even nodes `gpu=true` (before they start).
pub fn label_fleet(w: &mut World) {
    for n in (0..w.nodes.len()).step_by(2) {
        w.api.node_labels[n].insert(SELECTOR.0.into(), SELECTOR.1.into());
    }
}

fn shape(code: u8) -> ListShape {
    match code {
        0 => ListShape::Empty,
        1 => ListShape::Stale { lag_rv: 3 },
        2 => ListShape::Partial,
        _ => ListShape::Quorum,
    }
}

/// Apply one action. Faults with a duration run the world for it and then heal.
pub fn apply(w: &mut World, a: &Action) {
    match *a {
        Action::Create { name, uri, selects } => w.create(key(name), spec(name, uri, selects), true),
        Action::Delete { name, finalizer } => {
            if let Some(o) = w.api.objects.get_mut(&key(name)) {
                o.finalizer &= finalizer;
            }
            w.delete(&key(name));
        }
        Action::Recreate { name, uri } => {
            if let Some(o) = w.api.objects.get_mut(&key(name)) {
                o.finalizer = false;
            }
            w.delete(&key(name));
            w.create(key(name), spec(name, uri, false), true);
        }
        Action::Reselect { name, selects } => reselect(w, name, selects),
        Action::NodeLabel { node, present } => w.set_node_label(node, SELECTOR.0, present.then_some(SELECTOR.1)),
        Action::WipeNodeLabels { node, ms } => w.wipe_node_labels(node, ms),
        Action::Storm { kind, shape: code } => w.crd_change(kind, |_, _| shape(code)),
        Action::Outage { ms } => {
            w.set_outage(true);
            w.run_for(ms);
            w.set_outage(false);
        }
        Action::ReadsFail { ms } => {
            w.api.reads_fail = true;
            w.run_for(ms);
            w.api.reads_fail = false;
        }
        Action::ReadTimeouts { permille } => w.read_timeout_permille = permille,
        Action::Latency { read_ms_max, node_watch_ms_max } => {
            w.timing.read_ms_max = read_ms_max.max(w.timing.read_ms_min);
            w.timing.node_watch_ms_max = node_watch_ms_max.max(w.timing.node_watch_ms_min);
        }
        Action::Crash { node, down_ms } => {
            w.stop(node);
            w.run_for(down_ms);
            w.start(node);
        }
        Action::Shutdown { node, exit_ms } => {
            if !matches!(w.nodes[node].agent, Agent::Stopped) {
                w.shutdown(node);
                w.run_for(exit_ms);
                w.stop(node);
                w.start(node);
            }
        }
        Action::ReadOnlyRoot { node, read_only } => w.nodes[node].root_writable = !read_only,
        Action::Wait { ms } => w.run_for(ms),
        Action::Source { pick, restart } => switch_source(w, pick, restart),
        Action::Reserve { pick } => toggle_reserve(w, pick),
        Action::RemoveCopies { node } => w.remove_copies_by_hand(node),
    }
}

fn switch_source(w: &mut World, pick: usize, restart: Option<(usize, u64)>) {
    let at_pair = w.api.objects.values().filter(|o| !o.deleting() && o.spec().path.as_deref() == Some(PAIR_PATH));
    let keys: Vec<ModelKey> = at_pair.map(|o| o.key.clone()).collect();
    let Some(key) = keys.get(pick % keys.len().max(1)) else { return };
    let was = w.api.objects[key].spec();
    let other = if *was.storage_uri == *PAIR_SOURCES[0] { PAIR_SOURCES[1] } else { PAIR_SOURCES[0] };
    let fresh = ModelSpec::simple(other, Some(PAIR_PATH));
    let s = ModelSpec { storage_uri: fresh.storage_uri, uri: fresh.uri, ..(**was).clone() };
    w.counters.source_switches += 1;
    match restart {
        Some((node, down_ms)) if !matches!(w.nodes[node].agent, Agent::Stopped) => {
            w.stop(node);
            w.update(key, s);
            w.run_for(down_ms);
            w.start(node);
        }
        _ => w.update(key, s),
    }
}

fn toggle_reserve(w: &mut World, pick: usize) {
    let live: Vec<ModelKey> = w.api.objects.values().filter(|o| !o.deleting()).map(|o| o.key.clone()).collect();
    let Some(key) = live.get(pick % live.len().max(1)) else { return };
    let mut s = (**w.api.objects[key].spec()).clone();
    s.reserve_artifact = !s.reserve_artifact;
    w.counters.reserve_toggles += 1;
    w.update(key, s);
}

fn reselect(w: &mut World, name: usize, selects: bool) {
    let Some(obj) = w.api.objects.get(&key(name)) else { return };
    let mut s = (**obj.spec()).clone();
    s.node_selector.retain(|(k, _)| k != SELECTOR.0);
    if selects {
        s.node_selector.push((SELECTOR.0.into(), SELECTOR.1.into()));
    }
    w.update(&key(name), s);
}

/// A storage URI shape, each as likely.
pub fn draw_uri(p: &mut Prng) -> u8 {
    p.up_to(u64::from(URIS) - 1) as u8
}

/// Per-mille chances of each action in one swarm minute.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Weights {
    pub storm: u64,
    pub outage: u64,
    pub read_fail: u64,
    pub crash: u64,
    pub shutdown: u64,
    pub delete: u64,
    pub recreate: u64,
    pub create: u64,
    pub reselect: u64,
    pub node_label: u64,
    pub wipe: u64,
    /// [`Action::Source`], drawn by [`draw_source`].
    pub source: u64,
    /// [`Action::Reserve`], drawn by [`draw_reserve`].
    pub reserve: u64,
    /// [`Action::RemoveCopies`], drawn by [`draw_remove_copies`].
    pub remove_copies: u64,
}

/// What the swarm draws for one minute of a run over `nodes` nodes and the model names in
/// `names` (which it keeps up to date); new names start at `next_name`.
pub fn draw_minute(
    p: &mut Prng,
    wt: &Weights,
    nodes: usize,
    names: &mut Vec<usize>,
    next_name: &mut usize,
) -> Vec<Action> {
    let chance = |p: &mut Prng, permille: u64| p.up_to(999) < permille;
    let node = |p: &mut Prng| p.up_to(nodes as u64 - 1) as usize;
    let pick = |p: &mut Prng, names: &[usize]| names[p.up_to(names.len() as u64 - 1) as usize];
    let mut out = Vec::new();
    if chance(p, wt.storm) {
        let kind = if p.up_to(1) == 0 { Kind::ClusterBaseModel } else { Kind::BaseModel };
        out.push(Action::Storm { kind, shape: p.up_to(2) as u8 });
    }
    if chance(p, wt.outage) {
        out.push(Action::Outage { ms: 1_000 + p.up_to(4 * 60_000) });
    }
    if chance(p, wt.read_fail) {
        out.push(Action::ReadsFail { ms: 1_000 + p.up_to(60_000) });
    }
    if chance(p, wt.delete) && !names.is_empty() {
        let name = names.remove(p.up_to(names.len() as u64 - 1) as usize);
        out.push(Action::Delete { name, finalizer: p.up_to(1) == 0 });
    }
    if chance(p, wt.recreate) && !names.is_empty() {
        out.push(Action::Recreate { name: pick(p, names), uri: draw_uri(p) });
    }
    if chance(p, wt.reselect) && !names.is_empty() {
        out.push(Action::Reselect { name: pick(p, names), selects: p.up_to(1) == 0 });
    }
    if chance(p, wt.create) {
        out.push(Action::Create { name: *next_name, uri: draw_uri(p), selects: p.up_to(2) == 0 });
        names.push(*next_name);
        *next_name += 1;
    }
    if chance(p, wt.node_label) {
        out.push(Action::NodeLabel { node: node(p), present: p.up_to(1) == 0 });
    }
    if chance(p, wt.wipe) {
        out.push(Action::WipeNodeLabels { node: node(p), ms: 1_000 + p.up_to(180_000) });
    }
    if chance(p, wt.crash) {
        out.push(Action::Crash { node: node(p), down_ms: 1 + p.up_to(20_000) });
    }
    if chance(p, wt.shutdown) {
        out.push(Action::Shutdown { node: node(p), exit_ms: p.up_to(10_000) });
    }
    out.push(Action::Wait { ms: 60_000 });
    out
}

/// What the swarm draws of [`Action::Source`] for one minute, from a PRNG of its own (so that
/// [`draw_minute`] draws what it drew before this action existed): a restart of a node's agent
/// around the change half the time.
pub fn draw_source(q: &mut Prng, wt: &Weights, nodes: usize) -> Option<Action> {
    if q.up_to(999) >= wt.source {
        return None;
    }
    let pick = q.up_to(63) as usize;
    let restart = (q.up_to(1) == 0).then(|| (q.up_to(nodes as u64 - 1) as usize, 1 + q.up_to(20_000)));
    Some(Action::Source { pick, restart })
}

/// What the swarm draws of [`Action::Reserve`] for one minute, from a PRNG of its own (as
/// [`draw_source`]).
pub fn draw_reserve(r: &mut Prng, wt: &Weights) -> Option<Action> {
    (r.up_to(999) < wt.reserve).then(|| Action::Reserve { pick: r.up_to(63) as usize })
}

/// What the swarm draws of [`Action::RemoveCopies`] for one minute, from a PRNG of its own (as
/// [`draw_source`]).
pub fn draw_remove_copies(c: &mut Prng, wt: &Weights, nodes: usize) -> Option<Action> {
    (c.up_to(999) < wt.remove_copies).then(|| Action::RemoveCopies { node: c.up_to(nodes as u64 - 1) as usize })
}
