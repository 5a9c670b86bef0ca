//! The picture of a recorded trace (`model-agent --record-trace`, or `swarm --dump-traces`):
//! what one node's core saw and did. A node row carries relists, LISTs, Node reads, the breaker
//! and removals of orphans; each model's row carries its state over time (the status of the
//! entry the core published) and its marks: live GETs, label writes, removals, downloads,
//! phantoms, confirmed deletes, failures. Marks sit at the step that decided them.

use std::collections::BTreeMap;

use model_agent_core::machine::{Effect, Input, Note, Op, WatchEvent};
use model_agent_core::trace::Trace;
use model_agent_core::wire::ModelStatus;
use model_agent_core::{Kind, ModelKey};

use super::{Band, Glyph, ROWS_PER_BAND_MAX, Row, Span, Timeline};

/// The legend of a trace.
pub const TRACE_LEGEND: &[Glyph] = &[
    Glyph::Relist,
    Glyph::LiveRead,
    Glyph::Phantom,
    Glyph::Confirmed,
    Glyph::Breaker,
    Glyph::LabelSet,
    Glyph::Download,
    Glyph::ModelFailed,
    Glyph::LabelRemoved,
    Glyph::EntryRemoved,
    Glyph::DirTrashed,
];

/// One model's row as it is built.
#[derive(Default)]
struct Track {
    marks: Vec<(u64, Glyph)>,
    spans: Vec<Span>,
    /// The state published last and since when.
    open: Option<(u64, ModelStatus)>,
    label: Option<ModelStatus>,
}

impl Track {
    fn set_state(&mut self, t: u64, status: Option<ModelStatus>) {
        if self.open.map(|(_, s)| s) == status {
            return;
        }
        self.close(t);
        self.open = status.map(|s| (t, s));
    }

    fn close(&mut self, t: u64) {
        if let Some((from_ms, status)) = self.open.take() {
            self.spans.push(Span { from_ms, to_ms: t, status });
        }
    }
}

#[derive(Default)]
struct Tracks {
    node: Vec<(u64, Glyph)>,
    models: BTreeMap<ModelKey, Track>,
}

impl Tracks {
    fn model(&mut self, key: &ModelKey) -> &mut Track {
        self.models.entry(key.clone()).or_default()
    }

    fn mark(&mut self, t: u64, key: Option<&ModelKey>, glyph: Glyph) {
        match key {
            Some(k) => self.model(k).marks.push((t, glyph)),
            None => self.node.push((t, glyph)),
        }
    }

    fn input(&mut self, t: u64, input: &Input) {
        if let Input::Watch { event: WatchEvent::RelistStarted, .. } = input {
            self.node.push((t, Glyph::Relist));
        }
    }

    fn effect(&mut self, t: u64, effect: &Effect) {
        match &effect.op {
            Op::LiveGet { key } => self.mark(t, Some(key), Glyph::LiveRead),
            Op::LiveList { .. } | Op::LiveGetNode => self.mark(t, None, Glyph::LiveRead),
            Op::Publish { key, label, entry, .. } => {
                let track = self.model(key);
                if label.is_some() && *label != track.label {
                    track.marks.push((t, Glyph::LabelSet));
                }
                track.label = *label;
                track.set_state(t, Some(entry.status));
            }
            Op::Unpublish { key, remove_label, .. } => {
                let track = self.model(key);
                if *remove_label {
                    track.marks.push((t, Glyph::LabelRemoved));
                    track.label = None;
                }
                track.marks.push((t, Glyph::EntryRemoved));
                track.set_state(t, None);
            }
            Op::Download { key, .. } => self.mark(t, Some(key), Glyph::Download),
            Op::TrashDir { key, .. } => self.mark(t, key.as_ref(), Glyph::DirTrashed),
            Op::RemoveOrphanLabel { .. } => self.mark(t, None, Glyph::LabelRemoved),
            Op::RemoveOrphanEntry { .. } => self.mark(t, None, Glyph::EntryRemoved),
            _ => {}
        }
    }

    fn note(&mut self, t: u64, note: &Note) {
        match note {
            Note::PhantomSuppressed { key, .. } => self.mark(t, Some(key), Glyph::Phantom),
            Note::DeleteConfirmed { key, .. } => self.mark(t, Some(key), Glyph::Confirmed),
            Note::ModelFailed { key, .. } => self.mark(t, Some(key), Glyph::ModelFailed),
            Note::BreakerHeld { key, .. } => self.mark(t, Some(key), Glyph::Breaker),
            Note::BreakerTripped { .. } | Note::NodeLabelsVanished { .. } => self.mark(t, None, Glyph::Breaker),
            _ => {}
        }
    }
}

/// A short row label: `cbm NAME` or `bm NAMESPACE/NAME`.
fn model_label(key: &ModelKey) -> String {
    match key.kind {
        Kind::ClusterBaseModel => format!("cbm {}", key.name),
        Kind::BaseModel => format!("bm {}/{}", key.namespace, key.name),
    }
}

/// The picture of a trace; `title` names it (the file, usually).
pub fn timeline(trace: &Trace, title: &str) -> Timeline {
    let mut tracks = Tracks::default();
    for step in &trace.steps {
        let t = step.now.as_ms();
        tracks.input(t, &step.input);
        step.output.effects.iter().for_each(|e| tracks.effect(t, e));
        step.output.notes.iter().for_each(|n| tracks.note(t, n));
    }
    let t_start_ms = trace.steps.first().map_or(0, |s| s.now.as_ms());
    let t_end_ms = trace.steps.last().map_or(0, |s| s.now.as_ms());
    let models_n = tracks.models.len();
    let (rows, note) = rows(tracks, t_end_ms);
    let summary = format!(
        "{} steps, {models_n} models, {:.0} s recorded from {:.0} s",
        trace.steps.len(),
        (t_end_ms - t_start_ms) as f64 / 1000.0,
        t_start_ms as f64 / 1000.0
    );
    let band =
        Band { id: "trace".into(), title: format!("trace of node {}", trace.config.node_name), summary, note, rows };
    Timeline {
        title: title.to_string(),
        axis_caption: "time as recorded (s): the agent counts from its start, the simulator from the run's".into(),
        t_start_ms,
        t_end_ms,
        bands: vec![band],
        legend: TRACE_LEGEND.to_vec(),
        states_in_legend: true,
    }
}

/// The node row, then one row per model; with more models than fit, the ones with the most
/// marks get rows and the rest share one (marks only).
fn rows(tracks: Tracks, t_end_ms: u64) -> (Vec<Row>, Option<String>) {
    let mut node = Row::new("node (lists, breaker)".into());
    node.marks = tracks.node;
    let room = ROWS_PER_BAND_MAX - 2;
    let mut models: Vec<(ModelKey, Track)> = tracks.models.into_iter().collect();
    let total = models.len();
    let mut rest = Row::default();
    if total > room + 1 {
        // Most marks first, then by key: a stable choice of who gets a row.
        models.sort_by(|a, b| b.1.marks.len().cmp(&a.1.marks.len()).then_with(|| a.0.cmp(&b.0)));
        for (_, track) in models.drain(room..) {
            rest.marks.extend(track.marks);
        }
        models.sort_by(|a, b| a.0.cmp(&b.0));
        rest.label = format!("{} other models", total - room);
    }
    let mut rows = vec![node];
    for (key, mut track) in models {
        track.close(t_end_ms);
        rows.push(Row { label: model_label(&key), marks: track.marks, spans: track.spans });
    }
    let note = (!rest.label.is_empty()).then(|| {
        format!(
            "{total} models: the {room} with the most marks have rows; the last row carries the marks of the others"
        )
    });
    if note.is_some() {
        rows.push(rest);
    }
    (rows, note)
}
