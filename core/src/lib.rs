//! `model-agent-core`: the pure, deterministic heart of the model agent.
//!
//! Inputs (watch events, relist boundaries, live-read results, effect outcomes, probes, time)
//! fold into per-model states; effects come out as plain data. No I/O, no clock, no OS
//! randomness: the same config, seed and inputs always give the same effects.
//!
//! - [`model`], [`lean`], [`storage_uri`], [`placement`], [`dest_path`]: the model domain (and
//!   its lean decoding from the API's JSON).
//! - [`wire`]: OME's label keys, ConfigMap keys and `ModelEntry` JSON, byte for byte.
//! - [`machine`]: the state machine (`step`, `next_deadline`, readiness).
//! - [`trace`]: recording and replaying the inputs of a run.

pub mod compact;
pub mod dest_path;
pub mod lean;
pub mod machine;
pub mod model;
pub mod pcoll;
pub mod placement;
pub mod prng;
pub mod storage_uri;
pub mod time;
pub mod trace;
pub mod wire;

pub use machine::{Config, Effect, EffectId, Input, Op, State, next_deadline, step};
pub use model::{Kind, ModelKey, ModelObject, ModelSpec, Uid};
pub use time::Instant;
