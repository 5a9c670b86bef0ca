//! A bounded history per node: the last [`HISTORY_STEPS`] steps, each with its input, what came
//! out, and the core's `State` after it. `State` is a persistent value (imbl maps behind `Arc`s),
//! so keeping one per step costs O(1); that is its reason to exist. When a checker finds a
//! violation, the last steps of the node it is about are printed, oldest first.

use std::collections::VecDeque;

use model_agent_core::machine::{Effect, Input, Note};
use model_agent_core::{ModelKey, State};

/// Steps kept per node.
pub const HISTORY_STEPS: usize = 64;
/// Steps printed before a violation (the rest stay available to a debugger or a test).
pub const HISTORY_PRINTED: usize = 16;
/// Characters of one input or effect printed.
const SHOWN_CHARS_MAX: usize = 240;

pub struct Step {
    pub t: u64,
    pub input: Input,
    pub effects: Vec<Effect>,
    pub notes: Vec<Note>,
    /// The core's state after this step (`None` for the upstream model).
    pub state: Option<State>,
}

#[derive(Default)]
pub struct History {
    steps: VecDeque<Step>,
}

impl History {
    pub fn push(&mut self, step: Step) {
        if self.steps.len() == HISTORY_STEPS {
            self.steps.pop_front();
        }
        self.steps.push_back(step);
    }

    pub fn steps(&self) -> impl DoubleEndedIterator<Item = &Step> {
        self.steps.iter()
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    pub fn clear(&mut self) {
        self.steps.clear();
    }

    /// The last `last` steps, oldest first, one block per step; with `key`, each step also
    /// shows what the state then held for that model.
    pub fn dump(&self, node: usize, key: Option<&ModelKey>, last: usize) -> Vec<String> {
        let skip = self.steps.len().saturating_sub(last);
        let mut out = vec![format!("last {} steps of node {node} (of {} kept):", self.steps.len() - skip, self.len())];
        for s in self.steps.iter().skip(skip) {
            out.push(format!("  t={}ms in: {}", s.t, short(&format!("{:?}", s.input))));
            for e in &s.effects {
                out.push(format!("    out: {}", short(&format!("{:?} {:?}", e.id, e.op))));
            }
            for n in &s.notes {
                out.push(format!("    note: {}", short(&format!("{n:?}"))));
            }
            if let Some(state) = &s.state {
                out.push(format!("    state: {}", summary(state, key)));
            }
        }
        out
    }
}

fn summary(state: &State, key: Option<&ModelKey>) -> String {
    let (pending, _) = state.pending_confirmations();
    let mut text = format!(
        "models={} pending={pending} inflight={} backlog={}",
        state.model_count(),
        state.inflight_count(),
        state.backlog_len()
    );
    if let Some(key) = key {
        for v in state.incarnations().iter().filter(|v| &v.key == key) {
            text.push_str(&short(&format!(
                "; {} uid {}: {:?}, {:?}, current={}",
                v.key, v.uid, v.life, v.published, v.current
            )));
        }
    }
    text
}

fn short(s: &str) -> String {
    match s.char_indices().nth(SHOWN_CHARS_MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}
