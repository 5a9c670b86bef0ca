//! How long one load waits when the next address depends on it, over a working set of a given
//! size: the floor under any step that must find a record in state that is not in the cache.
//! README's simulator paragraphs compare the agents' time per input with it.
//!
//! `cargo run --release -p model-agent-sim --example memory_latency [MIB ...]` (by default 1, 16,
//! 256 and 1,024 MiB). The chain visits every slot once in an order drawn from a fixed seed
//! (Sattolo's shuffle: one cycle), so the hardware cannot guess the next address.

use model_agent_core::prng::Prng;

// The simulator's allocator, so that the working set is laid out as the simulator's heap is (on
// a host whose transparent huge pages are `madvise`-only, in 4 KiB pages: the larger sets then
// pay page walks too, as the simulator does).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const LOADS_TIMED: usize = 20_000_000;
const SEED: u64 = 14;

fn main() {
    let sizes_mib: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("a size in MiB")).collect();
    let sizes_mib = if sizes_mib.is_empty() { vec![1, 16, 256, 1024] } else { sizes_mib };
    println!("working set      ns per dependent load");
    for size_mib in sizes_mib {
        let chain = one_cycle(size_mib * 1024 * 1024 / std::mem::size_of::<usize>());
        println!("{size_mib:>7} MiB {:>20.1}", nanos_per_load(&chain));
    }
}

/// `next[i]` is the slot after `i`; following it from any slot visits every slot once.
fn one_cycle(slots: usize) -> Vec<usize> {
    assert!(slots >= 2, "a chain needs two slots");
    let mut next: Vec<usize> = (0..slots).collect();
    let mut prng = Prng::new(SEED);
    for i in (1..slots).rev() {
        let j = prng.up_to(i as u64 - 1) as usize;
        next.swap(i, j);
    }
    next
}

fn nanos_per_load(next: &[usize]) -> f64 {
    let mut at = 0;
    // Up to one lap before the clock starts, so that the caches hold what they would in a run.
    for _ in 0..next.len().min(LOADS_TIMED) {
        at = next[at];
    }
    let started = std::time::Instant::now();
    for _ in 0..LOADS_TIMED {
        at = next[at];
    }
    let nanos = started.elapsed().as_nanos() as f64;
    // Keeps the chain from being optimised away.
    std::hint::black_box(at);
    nanos / LOADS_TIMED as f64
}
