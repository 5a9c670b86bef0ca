// TEMPORARY debugging aid (to be deleted): time each scenario.
use model_agent_sim::scenario::{self, Options, SCENARIOS};
fn main() {
    for name in SCENARIOS {
        let t = std::time::Instant::now();
        let (r, _) = scenario::run(name, &Options { nodes: 6, models: 40, seed: 7, ..Options::default() }).unwrap();
        println!("{name}: {:.2}s clean {} extra {:?}", t.elapsed().as_secs_f64(), r.clean(), r.extra);
    }
}
