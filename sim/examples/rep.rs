// TEMPORARY debugging aid (to be deleted).
fn main() {
    let seed: u64 = std::env::args().nth(1).unwrap().parse().unwrap();
    let (r, w, _) = model_agent_sim::scenario::swarm_run(seed, None, None);
    println!(
        "cleanups {}/{} live removals {} {} {} orphans {} counters {:?}",
        r.cleanups_done,
        r.cleanups_expected,
        r.label_removals_live,
        r.entry_removals_live,
        r.dir_removals_live,
        w.orphan_links(),
        w.counters
    );
    let live: std::collections::BTreeSet<String> = w.api.objects.values().map(|o| o.uid.as_str().to_string()).collect();
    for (node, uid) in &w.published_ever {
        if live.contains(uid) {
            continue;
        }
        let n = &w.nodes[*node];
        let e = w.api.entries[*node]
            .iter()
            .filter(|(_, e)| e.uid.as_deref() == Some(uid.as_str()))
            .map(|(k, _)| k.clone())
            .collect::<Vec<_>>();
        let d = n
            .dirs
            .iter()
            .filter(|(_, m)| m.iter().any(|u| u.as_str() == uid))
            .map(|(p, m)| format!("{p} {m:?}"))
            .collect::<Vec<_>>();
        let l = n
            .links
            .iter()
            .filter(|(_, l)| l.uid.as_str() == uid)
            .map(|(p, l)| format!("{p} {l:?} gen now {}", n.generation))
            .collect::<Vec<_>>();
        if !e.is_empty() || !d.is_empty() || !l.is_empty() {
            println!("node {node} uid {uid}: entries {e:?} dirs {d:?} links {l:?}");
        }
    }
}
