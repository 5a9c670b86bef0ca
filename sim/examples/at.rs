// TEMPORARY debugging aid (to be deleted): pending incarnations around step N.
use model_agent_core::State;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let text = std::fs::read_to_string(&args[1]).unwrap();
    let n: usize = args[2].parse().unwrap();
    let trace = model_agent_core::trace::parse(&text).unwrap();
    let mut state = State::new(trace.config.clone());
    for (i, s) in trace.steps.iter().enumerate() {
        let out = state.handle(s.now, s.input.clone());
        if i >= n && i < n + 2 {
            println!("#{i} in {}", &format!("{:?}", s.input)[..200.min(format!("{:?}", s.input).len())]);
            for e in &out.effects {
                println!("  out {:?}", e.op);
            }
            for nt in &out.notes {
                println!("  note {:?}", nt);
            }
            for v in state.incarnations() {
                if !matches!(v.life, model_agent_core::machine::Life::Observed) {
                    println!(
                        "  view {:?} {:?} {:?} pub {:?} owned {:?} busy {}",
                        v.key, v.uid, v.life, v.published, v.owned_dir, v.busy
                    );
                }
            }
            let d = format!("{state:?}");
            let k = d.find("node_reads").unwrap();
            println!("  {}", &d[k..(k + 600).min(d.len())]);
        }
    }
}
