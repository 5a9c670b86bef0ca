// TEMPORARY debugging aid (to be deleted).
use model_agent_sim::scenario::{self, Options};
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seed: u64 = args[1].parse().unwrap();
    let node: usize = args[2].parse().unwrap();
    let name = &args[3];
    let opts = Options { seed, record_traces: true, ..Options::default() };
    let (_, w) = scenario::run("shared-copy", &opts).unwrap();
    println!("node labels {:?}", w.api.node_labels[node]);
    for o in w.api.objects.values().filter(|o| o.key.name.contains(name.as_str())) {
        println!(
            "api {} {} {:?} {:?} {:?} deleting {}",
            o.key, o.uid, o.spec.storage_uri, o.spec.path, o.spec.download_policy, o.deleting
        );
    }
    println!(
        "dirs {:?}",
        w.nodes[node]
            .dirs
            .iter()
            .filter(|(p, _)| p.contains("artifacts") || p.contains(name.as_str()))
            .collect::<Vec<_>>()
    );
    println!("links {:?}", w.nodes[node].links);
    if let model_agent_sim::world::Agent::Core(s) = &w.nodes[node].agent {
        for v in s.incarnations().iter().filter(|v| v.key.name.contains(name.as_str())) {
            println!("core {v:?}");
        }
    }
    w.write_traces(std::path::Path::new("/tmp/scn"), "scn").unwrap();
}
