//! Folds a mixed stream of one million inputs over 10,000 models through the core and reports
//! inputs per second: watch updates, phantom deletes and their live-read answers, relist-style
//! re-applies, effect outcomes and timer ticks. `cargo bench -p model-agent-core`.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use std::collections::VecDeque;
use std::sync::Arc;

use model_agent_core::machine::{Input, Op, Outcome, ReadResult, RootProbe, WatchEvent};
use model_agent_core::placement::NodeView;
use model_agent_core::prng::Prng;
use model_agent_core::{Config, Effect, Instant, Kind, ModelKey, ModelObject, ModelSpec, State, Uid, step};

const MODELS: usize = 10_000;
const EVENTS: u64 = 1_000_000;

fn objects() -> Vec<ModelObject> {
    (0..MODELS)
        .map(|i| {
            let name = format!("model-{i:05}");
            let (key, uri) = if i % 2 == 0 {
                (ModelKey::cluster(&name), format!("local:///mnt/models/{name}"))
            } else {
                (ModelKey::namespaced("team", &name), "vendor://nvidia/nim/x".to_string())
            };
            ModelObject {
                key,
                uid: Uid::new(&format!("uid-{i}")),
                resource_version: Arc::from("1"),
                created: Arc::from(""),
                deleting: false,
                spec: Ok(Arc::new(ModelSpec::simple(&uri, None))),
            }
        })
        .collect()
}

/// Answers effects the way a healthy shell would; keeps reads for the stream to answer.
struct Driver {
    state: State,
    now: u64,
    outstanding: VecDeque<Effect>,
    events: u64,
}

impl Driver {
    fn feed(&mut self, input: Input) {
        let effects = self.state.handle(Instant(self.now), input).effects;
        self.events += 1;
        self.outstanding.extend(effects);
    }

    fn answer_one(&mut self, objs: &[ModelObject]) -> bool {
        let Some(e) = self.outstanding.pop_front() else { return false };
        let input = match &e.op {
            Op::LiveGet { key } => {
                let i: usize = key.name[6..].parse().expect("bench names");
                Input::LiveRead { id: e.id, result: ReadResult::Found(objs[i].clone()) }
            }
            Op::LiveList { kind } => {
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
fn setup(objs: &[ModelObject]) -> Driver {
    let mut d = Driver {
        state: State::new(Config::new("node-1", "/mnt/models")),
        now: 0,
        outstanding: VecDeque::new(),
        events: 0,
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
fn run(d: &mut Driver, objs: &[ModelObject], events: u64) {
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

fn bench(c: &mut Criterion) {
    let objs = objects();
    let mut g = c.benchmark_group("fold");
    g.sample_size(10);
    g.throughput(Throughput::Elements(EVENTS));
    g.bench_function("handle_1M_events_10k_models", |b| {
        b.iter_batched(|| setup(&objs), |mut d| run(&mut d, &objs, EVENTS), BatchSize::PerIteration)
    });
    // The persistent fold as the simulator uses it: every step returns a new state while the
    // previous one is still alive (structural sharing, copy on write).
    g.throughput(Throughput::Elements(100_000));
    g.bench_function("step_100k_events_10k_models_keeping_previous_state", |b| {
        b.iter_batched(
            || setup(&objs),
            |d| {
                let mut state = d.state;
                let mut prev = state.clone();
                let mut prng = Prng::new(7);
                for i in 0..100_000u64 {
                    let o = &objs[prng.up_to(MODELS as u64 - 1) as usize];
                    let input = Input::Watch { kind: o.key.kind, event: WatchEvent::Applied(o.clone()) };
                    let (next, effects) = step(&state, Instant(i), input);
                    std::hint::black_box(effects);
                    prev = std::mem::replace(&mut state, next);
                }
                std::hint::black_box(prev);
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
