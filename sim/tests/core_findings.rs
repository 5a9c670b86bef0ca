//! What the simulator found in the core: each test is the deterministic reproduction of a bug
//! the swarm found, kept once the core was fixed so that it stays fixed.

use model_agent_core::{ModelKey, ModelSpec};
use model_agent_sim::scenario::{Options, new_world};

/// Swarm seed 83, reduced. Six models placed by `gpu=true` on one node; the node's labels are
/// wiped, so all six become placement-exit candidates and the breaker holds them (6 of 6 > 25 %).
/// During the hold one of them is really deleted (no finalizer): the watch DELETED finds the
/// key already pending and adds no read. The labels come back; the Node watch's view cancels
/// the exits (`ExitCancelled`), and with them the delete candidate: the deleted model's label
/// and entry stay on the node for good (no read, relist or drift pass removes them).
/// Fixed by the `Recause` row of `on_candidate`.
#[test]
fn a_delete_during_a_held_placement_exit_is_not_lost() {
    let opts = Options { nodes: 1, models: 6, seed: 1, ..Options::default() };
    let mut w = new_world(&opts);
    w.api.node_labels[0].insert("gpu".into(), "true".into());
    let keys: Vec<ModelKey> = (0..6).map(|i| ModelKey::cluster(&format!("g-{i}"))).collect();
    for (i, key) in keys.iter().enumerate() {
        let mut spec = ModelSpec::simple(&format!("local:///mnt/share/g-{i}"), None);
        spec.node_selector = vec![("gpu".into(), "true".into())];
        w.create(key.clone(), spec, false);
    }
    w.start(0);
    w.run_for(60_000);
    w.wipe_node_labels(0, 120_000);
    w.run_for(30_000);
    w.delete(&keys[0]);
    w.run_for(20 * 60_000);
    w.check_converged();
    assert!(w.violations.is_empty(), "{:#?}\n{}", w.violations, w.history_dump.join("\n"));
}
