//! Traces: every core input with its `now` and the effects and notes the core returned, as JSON
//! lines. The first line records the configuration (seed included). Replaying the inputs through
//! a fresh core must give the recorded output byte for byte.

use serde::{Deserialize, Serialize};

use crate::machine::{Config, Effect, Input, Note, Output, State};
use crate::time::Instant;

/// 2: notes are recorded apart from effects.
pub const TRACE_VERSION: u32 = 2;

/// One line of a trace file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TraceLine {
    Header {
        version: u32,
        config: Config,
    },
    Step {
        now: Instant,
        input: Input,
        effects: Vec<Effect>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        notes: Vec<Note>,
    },
}

/// A parsed trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub config: Config,
    pub steps: Vec<TraceStep>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TraceStep {
    pub now: Instant,
    pub input: Input,
    pub output: Output,
}

pub fn header_line(config: &Config) -> String {
    serde_json::to_string(&TraceLine::Header { version: TRACE_VERSION, config: config.clone() })
        .expect("config serialises")
}

pub fn step_line(now: Instant, input: &Input, output: &Output) -> String {
    // Serialised by reference: recording must not clone the input on the agent's hot path.
    #[derive(Serialize)]
    #[serde(tag = "type", rename = "step")]
    struct StepRef<'a> {
        now: Instant,
        input: &'a Input,
        effects: &'a [Effect],
        #[serde(skip_serializing_if = "<[Note]>::is_empty")]
        notes: &'a [Note],
    }
    let line = StepRef { now, input, effects: &output.effects, notes: &output.notes };
    serde_json::to_string(&line).expect("inputs and effects serialise")
}

/// Parse a whole trace. Blank lines are skipped; anything else malformed is an error with its
/// line number.
pub fn parse(text: &str) -> Result<Trace, String> {
    let mut config = None;
    let mut steps = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed: TraceLine = serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        match parsed {
            TraceLine::Header { version, config: c } => {
                if version != TRACE_VERSION {
                    return Err(format!("line {}: trace version {version}, this build reads {TRACE_VERSION}", i + 1));
                }
                if config.replace(c).is_some() {
                    return Err(format!("line {}: a second header", i + 1));
                }
            }
            TraceLine::Step { now, input, effects, notes } => {
                if config.is_none() {
                    return Err(format!("line {}: a step before the header", i + 1));
                }
                steps.push(TraceStep { now, input, output: Output { effects, notes } });
            }
        }
    }
    let config = config.ok_or("the trace has no header line")?;
    Ok(Trace { config, steps })
}

/// The first step whose replayed effects differ from the recorded ones.
#[derive(Clone, Debug, PartialEq)]
pub struct Divergence {
    pub step: usize,
    pub recorded: String,
    pub replayed: String,
}

/// Replay a trace through a fresh core; returns the replayed output of every step and the
/// first divergence from the recording, if any.
pub fn replay(trace: &Trace) -> (Vec<Output>, Option<Divergence>) {
    let mut state = State::new(trace.config.clone());
    let mut all = Vec::with_capacity(trace.steps.len());
    let mut divergence = None;
    for (i, s) in trace.steps.iter().enumerate() {
        let output = state.handle(s.now, s.input.clone());
        if divergence.is_none() {
            let recorded = step_line(s.now, &s.input, &s.output);
            let replayed = step_line(s.now, &s.input, &output);
            if recorded != replayed {
                divergence = Some(Divergence { step: i, recorded, replayed });
            }
        }
        all.push(output);
    }
    (all, divergence)
}

/// Records a run as trace text (the shell writes the lines to a file as they come).
pub struct Recorder {
    pub lines: Vec<String>,
}

impl Recorder {
    pub fn new(config: &Config) -> Recorder {
        Recorder { lines: vec![header_line(config)] }
    }

    pub fn record(&mut self, now: Instant, input: &Input, output: &Output) {
        self.lines.push(step_line(now, input, output));
    }

    pub fn text(&self) -> String {
        let mut s = self.lines.join("\n");
        s.push('\n');
        s
    }
}
