//! The fold bench's stream once, without criterion, for instruction counts under valgrind
//! (`scripts/bench-core-instructions`). The setup, driver and stream are the bench's own
//! (`benches/common/fold_stream.rs`), and so is the number of inputs.
//!
//! `fold_instructions stream` builds the 10,000 models, lists them to Ready, then folds the
//! bench's 1M inputs; `fold_instructions setup` stops before the stream. The cost per input is
//! the difference of the two counts over the inputs folded. Not for counting, as they observe
//! every step: `fold_instructions tally` prints how many inputs of each kind it fed, and
//! `fold_instructions digest` a SHA-256 of every input and output in order (serde JSON) and the
//! final counters, so that a change meant to keep the core's behaviour can be checked to.
//! An optional second argument folds that many inputs instead of the bench's number.

use std::collections::BTreeMap;

use model_agent_core::machine::{Input, Output};
use sha2::{Digest, Sha256};

#[path = "../benches/common/fold_stream.rs"]
mod fold_stream;
use fold_stream::{EVENTS, Observe, objects, run, setup};

/// Counts the inputs of each kind.
#[derive(Default)]
struct Tally(BTreeMap<&'static str, u64>);

impl Observe for Tally {
    fn input(&mut self, input: &Input) {
        *self.0.entry(input.kind_name()).or_insert(0) += 1;
    }
}

/// Hashes every input and output, in order.
#[derive(Default)]
struct Digester(Sha256);

impl Observe for Digester {
    fn input(&mut self, input: &Input) {
        self.0.update(serde_json::to_vec(input).expect("inputs serialise"));
    }
    fn output(&mut self, output: &Output) {
        self.0.update(serde_json::to_vec(output).expect("outputs serialise"));
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "stream".to_string());
    let events: u64 = args.next().map(|a| a.parse().expect("a number of inputs")).unwrap_or(EVENTS);
    let objs = objects();
    match mode.as_str() {
        "setup" => {
            let d = setup(&objs, ());
            println!("inputs 0");
            std::hint::black_box(d.state);
        }
        "stream" => {
            let mut d = setup(&objs, ());
            run(&mut d, &objs, events);
            println!("inputs {} outstanding {}", d.events, d.outstanding.len());
            std::hint::black_box(d.state);
        }
        "tally" => {
            let mut d = setup(&objs, Tally::default());
            d.observer.0.clear();
            run(&mut d, &objs, events);
            println!("inputs {} outstanding {}", d.events, d.outstanding.len());
            for (k, v) in &d.observer.0 {
                println!("{k} {v}");
            }
        }
        "digest" => {
            let mut d = setup(&objs, Digester::default());
            run(&mut d, &objs, events);
            println!("inputs {} outstanding {}", d.events, d.outstanding.len());
            let digest: String = d.observer.0.finalize().iter().map(|b| format!("{b:02x}")).collect();
            println!("digest {digest}");
            println!("stats {:?}", d.state.stats());
        }
        other => {
            eprintln!("usage: fold_instructions [setup|stream|tally|digest] [inputs]; not {other:?}");
            std::process::exit(2);
        }
    }
}
