//! `model-agent-sim`: a deterministic, single-threaded discrete-event simulation of a fleet of
//! nodes, each running the real core (or a model of the upstream agent) against a simulated API
//! server with scripted faults. One seed reproduces a whole run.

pub mod api;
pub mod history;
pub mod oracle;
pub mod profile;
pub mod scenario;
pub mod svg;
pub mod upstream;
pub mod vocab;
pub mod world;
