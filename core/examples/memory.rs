//! Bytes and allocations the core keeps per model: 10,000 ClusterBaseModels listed, none placed
//! on this node (the shape of `scripts/bench-agent`'s 10,000-model memory figure); then 20
//! BaseModels of 1 MiB of `parameters` each, decoded from JSON as the shell decodes them, which
//! the core keeps as identity plus a Failed reason (core.md, "Bounded state").
//! `cargo run --release --example memory -p model-agent-core`
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static COUNT: AtomicUsize = AtomicUsize::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        COUNT.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        COUNT.fetch_sub(1, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
}
#[global_allocator]
static A: Counting = Counting;
use model_agent_core::machine::{Input, WatchEvent};
use model_agent_core::*;
fn main() {
    let mut s = State::new(Config::new("n", "/mnt/models"));
    s.handle(
        Instant(0),
        Input::NodeObserved(model_agent_core::placement::NodeView { name: "n".into(), labels: Default::default() }),
    );
    let before = (LIVE.load(Ordering::Relaxed), COUNT.load(Ordering::Relaxed));
    s.handle(Instant(0), Input::Watch { kind: Kind::ClusterBaseModel, event: WatchEvent::RelistStarted });
    for i in 0..10_000 {
        let mut spec = ModelSpec::simple("local:///tmp/model-agent-bench.XXXXXX/share", None);
        spec.node_selector.push(("bench".into(), "no".into()));
        let o = ModelObject {
            key: ModelKey::cluster(&format!("bench-{i:05}")),
            uid: Uid::new("0a1b2c3d-1234-5678-9abc-def012345678"),
            resource_version: Arc::from("123456"),
            created: Arc::from(""),
            deleting: false,
            spec: Ok(Arc::new(spec)),
        };
        s.handle(Instant(0), Input::Watch { kind: Kind::ClusterBaseModel, event: WatchEvent::RelistItem(o.into()) });
    }
    let after = (LIVE.load(Ordering::Relaxed), COUNT.load(Ordering::Relaxed));
    println!(
        "10k unplaced models: {} bytes live ({} per model), {} allocations ({} per model)",
        after.0 - before.0,
        (after.0 - before.0) / 10_000,
        after.1 - before.1,
        (after.1 - before.1) / 10_000
    );
    huge_objects(&mut s);
}

/// 20 objects of 1 MiB each: what the core retains must stay under 10 MiB.
fn huge_objects(s: &mut State) {
    const OBJECTS: usize = 20;
    const RETAINED_BYTES_MAX: usize = 10 << 20;
    let before = LIVE.load(Ordering::Relaxed);
    for i in 0..OBJECTS {
        let json = serde_json::json!({
            "metadata": {"name": format!("huge-{i:02}"), "namespace": "tenant", "uid": format!("uid-{i}")},
            "spec": {"storage": {"storageUri": "hf://org/repo", "parameters": {"blob": "x".repeat(1 << 20)}}},
        });
        let o = ModelObject::from_json(Kind::BaseModel, &json).expect("identified");
        drop(json);
        s.handle(Instant(0), Input::Watch { kind: Kind::BaseModel, event: WatchEvent::Applied(o.into()) });
    }
    let retained = LIVE.load(Ordering::Relaxed) - before;
    println!(
        "{OBJECTS} objects of 1 MiB: {retained} bytes retained ({} per object; limit {RETAINED_BYTES_MAX})",
        retained / OBJECTS
    );
    assert!(retained < RETAINED_BYTES_MAX, "the core retains {retained} bytes for {OBJECTS} huge objects");
}
