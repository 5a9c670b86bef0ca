//! Instruction-count harness for valgrind: the fold bench's stream for a fixed number of inputs,
//! without criterion. `fold_count N` folds N inputs after the setup and prints how many of each
//! kind; the cost per input is the difference of the counts for N and for 0, divided by N.
//! `valgrind --tool=cachegrind --cache-sim=no target/release/examples/fold_count 100000`.
//! The setup, driver and stream are the bench's own (`benches/common/fold_stream.rs`).

use model_agent_core::machine::{Input, WatchEvent};

#[path = "../benches/common/fold_stream.rs"]
mod fold_stream;
use fold_stream::{objects, run, setup};

static TALLY: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn tag(i: &Input) -> &'static str {
    match i {
        Input::Watch { event: WatchEvent::Applied(_), .. } => "applied",
        Input::Watch { event: WatchEvent::Deleted(_), .. } => "deleted",
        Input::Watch { event: WatchEvent::RelistItem(_), .. } => "relist_item",
        Input::Watch { .. } => "watch_other",
        Input::Tick => "tick",
        Input::LiveRead { .. } => "live_read",
        Input::LiveList { .. } => "live_list",
        Input::EffectDone { .. } => "effect_done",
        Input::RootProbed { .. } => "root_probed",
        Input::DriftObserved { .. } => "drift",
        _ => "other",
    }
}

fn main() {
    let events: u64 = std::env::args().nth(1).map(|a| a.parse().expect("count")).unwrap_or(100_000);
    let objs = objects();
    let mut d = setup(&objs, |input: &Input| *TALLY.lock().unwrap().entry(tag(input)).or_insert(0) += 1);
    TALLY.lock().unwrap().clear();
    run(&mut d, &objs, events);
    eprintln!("events {} outstanding {}", d.events, d.outstanding.len());
    for (k, v) in TALLY.lock().unwrap().iter() {
        eprintln!("{k} {v}");
    }
    std::hint::black_box(d.state);
}
