//! The fold bench's stream once, without criterion, for instruction counts under valgrind
//! (`scripts/bench-core-instructions`). The setup, driver and stream are the bench's own
//! (`benches/common/fold_stream.rs`), and so is the number of inputs.
//!
//! `fold_instructions stream` builds the 10,000 models, lists them to Ready, then folds the
//! bench's 1M inputs; `fold_instructions setup` stops before the stream. The cost per input is
//! the difference of the two counts over the inputs folded. `fold_instructions tally` folds the
//! stream and prints how many inputs of each kind it fed (a closure per input: not for counting).
//! An optional second argument folds that many inputs instead of the bench's number.

use model_agent_core::machine::{Input, WatchEvent};

#[path = "../benches/common/fold_stream.rs"]
mod fold_stream;
use fold_stream::{EVENTS, objects, run, setup};

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
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "stream".to_string());
    let events: u64 = args.next().map(|a| a.parse().expect("a number of inputs")).unwrap_or(EVENTS);
    let objs = objects();
    match mode.as_str() {
        "setup" => {
            let d = setup(&objs, |_| {});
            println!("inputs 0");
            std::hint::black_box(d.state);
        }
        "stream" => {
            let mut d = setup(&objs, |_| {});
            run(&mut d, &objs, events);
            println!("inputs {} outstanding {}", d.events, d.outstanding.len());
            std::hint::black_box(d.state);
        }
        "tally" => {
            let mut tally = std::collections::BTreeMap::<&'static str, u64>::new();
            let mut d = setup(&objs, |input: &Input| *tally.entry(tag(input)).or_insert(0) += 1);
            run(&mut d, &objs, events);
            println!("inputs {} outstanding {}", d.events, d.outstanding.len());
            drop(d);
            for (k, v) in &tally {
                println!("{k} {v}");
            }
        }
        other => {
            eprintln!("usage: fold_instructions [setup|stream|tally] [inputs]; not {other:?}");
            std::process::exit(2);
        }
    }
}
