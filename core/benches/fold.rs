//! Folds a mixed stream of one million inputs over 10,000 models through the core and reports
//! inputs per second: watch updates, phantom deletes and their live-read answers, relist-style
//! re-applies, effect outcomes and timer ticks. `cargo bench -p model-agent-core`.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

use model_agent_core::machine::{Input, WatchEvent};
use model_agent_core::prng::Prng;
use model_agent_core::{Instant, step};

#[path = "common/fold_stream.rs"]
mod fold_stream;
use fold_stream::{EVENTS, MODELS, objects, run, setup};

fn bench(c: &mut Criterion) {
    let objs = objects();
    let mut g = c.benchmark_group("fold");
    g.sample_size(10);
    g.throughput(Throughput::Elements(EVENTS));
    g.bench_function("handle_1M_events_10k_models", |b| {
        b.iter_batched(|| setup(&objs, ()), |mut d| run(&mut d, &objs, EVENTS), BatchSize::PerIteration)
    });
    // The persistent fold as the simulator uses it: every step returns a new state while the
    // previous one is still alive (structural sharing, copy on write).
    g.throughput(Throughput::Elements(100_000));
    g.bench_function("step_100k_events_10k_models_keeping_previous_state", |b| {
        b.iter_batched(
            || setup(&objs, ()),
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
