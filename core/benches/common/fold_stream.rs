//! The fold benchmark's stream, shared by `benches/fold.rs` (criterion) and
//! `examples/fold_instructions.rs` (instruction counts under valgrind), so both measure the same inputs:
//! 10,000 models listed and Ready, then a mixed stream of watch updates, phantom deletes and
//! their live-read answers, relist-style re-applies, effect outcomes and timer ticks.

use std::collections::VecDeque;
use std::sync::Arc;

use model_agent_core::machine::{Input, Op, Outcome, Output, ReadResult, RootProbe, WatchEvent};
use model_agent_core::placement::NodeView;
use model_agent_core::prng::Prng;
use model_agent_core::{Config, Effect, Instant, Kind, ModelKey, ModelObject, ModelSpec, State, Uid};

pub const MODELS: usize = 10_000;
/// Inputs folded after the setup, by the bench and by the instruction count.
pub const EVENTS: u64 = 1_000_000;

/// Shared, as the shell hands each decoded object to the core (an input clones a count).
pub fn objects() -> Vec<Arc<ModelObject>> {
    (0..MODELS)
        .map(|i| {
            let name = format!("model-{i:05}");
            let (key, uri) = if i % 2 == 0 {
                (ModelKey::cluster(&name), format!("local:///mnt/models/{name}"))
            } else {
                (ModelKey::namespaced("team", &name), "vendor://nvidia/nim/x".to_string())
            };
            Arc::new(ModelObject {
                key,
                uid: Uid::new(&format!("uid-{i}")),
                resource_version: Arc::from("1"),
                created: Arc::from(""),
                deleting: false,
                spec: Ok(Arc::new(ModelSpec::simple(&uri, None))),
            })
        })
        .collect()
}

/// Sees what the driver feeds the core and what comes back (the instruction-count harness
/// tallies inputs or digests both; the bench observes nothing, and `()` compiles away).
pub trait Observe {
    fn input(&mut self, _input: &Input) {}
    fn output(&mut self, _output: &Output) {}
}

impl Observe for () {}

/// Answers effects the way a healthy shell would; keeps reads for the stream to answer.
pub struct Driver<O: Observe> {
    pub state: State,
    now: u64,
    pub outstanding: VecDeque<Effect>,
    pub events: u64,
    pub observer: O,
}

impl<O: Observe> Driver<O> {
    fn feed(&mut self, input: Input) {
        self.observer.input(&input);
        let output = self.state.handle(Instant(self.now), input);
        self.observer.output(&output);
        self.events += 1;
        self.outstanding.extend(output.effects);
    }

    fn answer_one(&mut self, objs: &[Arc<ModelObject>]) -> bool {
        let Some(e) = self.outstanding.pop_front() else { return false };
        let input = match &e.op {
            Op::LiveGet { key } => {
                let i: usize = key.name[6..].parse().expect("bench names");
                Input::LiveRead { id: e.id, result: ReadResult::Found(objs[i].clone()) }
            }
            Op::LiveList { kind, .. } => {
                let listed = objs.iter().filter(|o| o.key.kind == *kind).cloned().collect();
                Input::LiveList { id: e.id, result: model_agent_core::machine::ListResult::Listed(listed) }
            }
            Op::ProbeRoot => Input::RootProbed { id: e.id, probe: RootProbe::healthy(false) },
            Op::Snapshot => Input::DriftObserved { id: e.id, snapshot: Default::default() },
            _ => Input::EffectDone { id: e.id, outcome: Outcome::Done },
        };
        self.feed(input);
        true
    }
}

/// A node with 10,000 models listed and Ready.
pub fn setup<O: Observe>(objs: &[Arc<ModelObject>], observer: O) -> Driver<O> {
    let mut d = Driver {
        state: State::new(Config::new("node-1", "/mnt/models")),
        now: 0,
        outstanding: VecDeque::new(),
        events: 0,
        observer,
    };
    d.feed(Input::NodeObserved(NodeView { name: "node-1".into(), labels: Default::default() }));
    for kind in Kind::ALL {
        d.feed(Input::Watch { kind, event: WatchEvent::RelistStarted });
        for o in objs.iter().filter(|o| o.key.kind == kind) {
            d.feed(Input::Watch { kind, event: WatchEvent::RelistItem(o.clone()) });
        }
        d.feed(Input::Watch { kind, event: WatchEvent::RelistDone });
    }
    while d.answer_one(objs) {}
    d.events = 0;
    d
}

/// The mixed stream. Shares: ~35% watch updates, ~15% phantom deletes, ~15% relist-style
/// re-applies, ~10% ticks (time moves 100 ms), and the rest answers to what the core asked.
pub fn run<O: Observe>(d: &mut Driver<O>, objs: &[Arc<ModelObject>], events: u64) {
    let mut prng = Prng::new(42);
    while d.events < events {
        let roll = prng.up_to(99);
        let o = &objs[prng.up_to(MODELS as u64 - 1) as usize];
        match roll {
            0..=34 => d.feed(Input::Watch { kind: o.key.kind, event: WatchEvent::Applied(o.clone()) }),
            35..=49 => d.feed(Input::Watch { kind: o.key.kind, event: WatchEvent::Deleted(o.clone()) }),
            50..=64 => d.feed(Input::Watch { kind: o.key.kind, event: WatchEvent::RelistItem(o.clone()) }),
            65..=74 => {
                d.now += 100;
                d.feed(Input::Tick);
            }
            _ => {
                if !d.answer_one(objs) {
                    d.feed(Input::Tick);
                }
            }
        }
    }
}
