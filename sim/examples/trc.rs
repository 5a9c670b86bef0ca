// TEMPORARY debugging aid (to be deleted): replay a trace, show one model's story.
use model_agent_core::State;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let text = std::fs::read_to_string(&args[1]).unwrap();
    let name = &args[2];
    let trace = model_agent_core::trace::parse(&text).unwrap();
    let mut state = State::new(trace.config.clone());
    let mut last = String::new();
    for (i, s) in trace.steps.iter().enumerate() {
        let out = state.handle(s.now, s.input.clone());
        let views: Vec<String> = state
            .incarnations()
            .iter()
            .filter(|v| v.key.name.contains(name.as_str()))
            .map(|v| format!("{v:?}"))
            .collect();
        let input = format!("{:?}", s.input);
        let effects: Vec<String> = out
            .effects
            .iter()
            .map(|e| format!("{:?} {:?}", e.id, e.op))
            .filter(|e| e.contains(name.as_str()))
            .collect();
        let now = views.join("\n      ");
        if now != last || !effects.is_empty() || input.contains(name.as_str()) {
            println!("#{i} t={} in: {}", s.now.as_ms(), &input[..input.len().min(400)]);
            for e in &effects {
                println!("   out: {}", &e[..e.len().min(400)]);
            }
            if now != last {
                println!("   views: {now}");
            }
            last = now;
        }
    }
}
