// TEMPORARY debugging aid (to be deleted): a swarm seed, action by action.
use model_agent_core::prng::Prng;
use model_agent_sim::scenario::{self, Options};
use model_agent_sim::vocab;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seed: u64 = args[1].parse().unwrap();
    let k = scenario::swarm_knobs(seed, None, None);
    let opts = Options { nodes: k.nodes, models: k.models, seed, record_traces: true, ..Options::default() };
    let mut w = scenario::new_world(&opts);
    for n in 0..k.read_only_nodes {
        w.nodes[n].root_writable = false;
    }
    vocab::label_fleet(&mut w);
    let mut p = Prng::new(seed ^ 0xFA_17);
    let mut names: Vec<usize> = (0..k.models).collect();
    for &name in &names {
        let a = vocab::Action::Create { name, uri: vocab::draw_uri(&mut p), selects: p.up_to(3) == 0 };
        println!("t={} {a:?}", w.now);
        vocab::apply(&mut w, &a);
    }
    let mut next_name = k.models;
    for node in 0..w.nodes.len() {
        w.start(node);
    }
    w.run_for(60_000);
    w.read_timeout_permille = k.read_timeout_permille;
    let latency = vocab::Action::Latency { read_ms_max: k.read_ms_max, node_watch_ms_max: k.node_watch_ms_max };
    vocab::apply(&mut w, &latency);
    'outer: for _minute in 0..k.minutes {
        for a in vocab::draw_minute(&mut p, &k.weights, k.nodes, &mut names, &mut next_name) {
            println!("t={} {a:?}", w.now);
            vocab::apply(&mut w, &a);
            if !w.violations.is_empty() {
                break 'outer;
            }
        }
    }
    if w.violations.is_empty() && args.len() > 2 {
        let node: usize = args[2].parse().unwrap();
        for n in 0..k.nodes {
            w.nodes[n].root_writable = n >= k.read_only_nodes;
            if matches!(w.nodes[n].agent, model_agent_sim::world::Agent::Stopped) {
                w.start(n);
            }
        }
        w.read_timeout_permille = 0;
        w.timing = Default::default();
        w.api.reads_fail = false;
        w.run_for(20 * 60_000);
        w.check_converged();
        println!("node labels {:?} wiped {:?}", w.api.node_labels[node], w.api.wiped_until[node]);
        for o in w.api.objects.values() {
            println!(
                "oracle {} deleting {} placed {} copy {:?}",
                o.key,
                o.deleting,
                w.api.placed(&o.spec, node),
                model_agent_sim::oracle::copy_dir(&o.spec)
            );
        }
        for o in w.api.objects.values() {
            println!(
                "api {} uid {} {} {:?} sel {:?}",
                o.key, o.uid, o.spec.storage_uri, o.spec.path, o.spec.node_selector
            );
        }
        println!("dirs {:?}", w.nodes[node].dirs);
        println!("links {:?}", w.nodes[node].links);
        if let model_agent_sim::world::Agent::Core(s) = &w.nodes[node].agent {
            for v in s.incarnations() {
                println!("core {v:?}");
            }
            let d = format!("{s:?}");
            let k = d.find("dirs: ").unwrap();
            println!("DIRS {}", &d[k..(k + 3000).min(d.len())]);
        }
    }
    for v in &w.violations {
        println!("{v}");
    }
    for l in &w.history_dump {
        println!("{l}");
    }
}
// (appended) nothing
