//! Timeline pictures: bands of rows (one band per agent, or one per trace) on one time axis in
//! seconds, with marks for relists, live reads, phantoms, confirmed deletes, cleanups and damage,
//! coloured spans for a model's state, and a legend. A person sees an incident at a glance.
//!
//! The picture stays bounded for big runs: a band has at most [`ROWS_PER_BAND_MAX`] rows (nodes
//! or models are grouped into rows beyond that), marks of one kind in one 3-pixel column of a row
//! are drawn once (the count in its tooltip), and at most [`MARKS_DRAWN_MAX`] marks are drawn;
//! the picture says so when it groups or drops anything.

pub mod trace;

use std::collections::BTreeMap;
use std::fmt::Write;

use model_agent_core::wire::ModelStatus;

use crate::scenario::Report;
use crate::world::{AgentKind, Mark, MarkKind, Removed};

/// Rows of one band at most; more nodes (or models) share rows.
pub const ROWS_PER_BAND_MAX: usize = 30;
/// Marks drawn in the whole picture at most (after merging those of one column).
pub const MARKS_DRAWN_MAX: usize = 20_000;
/// Marks of one kind closer than this on one row are drawn as one.
const COLUMN_PX: f64 = 3.0;
const LEFT_PX: f64 = 160.0;
const PLOT_PX: f64 = 1100.0;
/// Room right of the plot, and for each row's damage counts when there is damage.
const RIGHT_PX: f64 = 30.0;
const RIGHT_DAMAGE_PX: f64 = 220.0;
const ROW_PX: f64 = 24.0;
/// A row label longer than this is cut (the whole label is its tooltip).
const ROW_LABEL_CHARS_MAX: usize = 22;
const CHAR_PX: f64 = 6.7;

/// Colours and strokes of every mark and state, shared by the bands and the legend.
const STYLE: &str = "\
text{font-family:monospace;font-size:11px;fill:#222}
.title{font-size:15px;font-weight:bold}
.count{font-size:10px;fill:#b00}
.band-title{font-size:13px;font-weight:bold}
.grid{stroke:#ddd;stroke-width:1}
.axis{stroke:#444;stroke-width:1}
.relist{stroke:#9467bd;stroke-width:1.5}
.live-read{fill:#1f77b4}
.phantom{fill:#ff7f0e;fill-opacity:0.7}
.confirmed{fill:#8c564b}
.cleanup{fill:#7f7f7f}
.label-set{fill:#2ca02c}
.download{fill:#17becf}
.breaker{fill:#bcbd22;stroke:#6b6b10;stroke-width:0.5}
.model-failed{fill:#d62728}
.label-removed,.entry-removed,.dir-trashed{stroke:#555;stroke-width:1.5;fill:none}
.damage-dir{stroke:#000;stroke-width:2;fill:none}
.damage-entry{fill:#e377c2;stroke:#7b1f5c;stroke-width:0.8}
.damage-label{stroke:#d62728;stroke-width:2.5;fill:none}
.state-ready{fill:#98df8a}
.state-updating{fill:#aec7e8}
.state-failed{fill:#ff9896}
.state-deleted{fill:#c7c7c7}
";

/// One kind of mark. The order is the drawing order: damage is drawn last, on top.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Glyph {
    Relist,
    Phantom,
    Confirmed,
    Cleanup,
    LabelSet,
    Download,
    Breaker,
    ModelFailed,
    /// Small, so drawn over the circles of the phantoms its answers reveal.
    LiveRead,
    LabelRemoved,
    EntryRemoved,
    DirTrashed,
    DamageDir,
    DamageEntry,
    DamageLabel,
}

impl Glyph {
    /// The CSS class (also how a test or a script finds the marks).
    pub fn class(self) -> &'static str {
        match self {
            Glyph::Relist => "relist",
            Glyph::LiveRead => "live-read",
            Glyph::Phantom => "phantom",
            Glyph::Confirmed => "confirmed",
            Glyph::Cleanup => "cleanup",
            Glyph::LabelSet => "label-set",
            Glyph::Download => "download",
            Glyph::Breaker => "breaker",
            Glyph::ModelFailed => "model-failed",
            Glyph::LabelRemoved => "label-removed",
            Glyph::EntryRemoved => "entry-removed",
            Glyph::DirTrashed => "dir-trashed",
            Glyph::DamageDir => "damage-dir",
            Glyph::DamageEntry => "damage-entry",
            Glyph::DamageLabel => "damage-label",
        }
    }

    /// What the mark means, for the legend and the tooltips.
    pub fn meaning(self) -> &'static str {
        match self {
            Glyph::Relist => "relist (watch restarted)",
            Glyph::LiveRead => "live read (GET or LIST)",
            Glyph::Phantom => "phantom delete suppressed",
            Glyph::Confirmed => "delete confirmed",
            Glyph::Cleanup => "cleanup of a deleted model",
            Glyph::LabelSet => "node label written",
            Glyph::Download => "download started",
            Glyph::Breaker => "breaker holds removals",
            Glyph::ModelFailed => "model failed",
            Glyph::LabelRemoved => "node label removed",
            Glyph::EntryRemoved => "ConfigMap entry removed",
            Glyph::DirTrashed => "directory moved to trash",
            Glyph::DamageDir => "DAMAGE: weights of a live model removed",
            Glyph::DamageEntry => "DAMAGE: ConfigMap entry of a live model removed",
            Glyph::DamageLabel => "DAMAGE: label of a live model removed",
        }
    }

    /// A damage mark's index among label, entry and directory removals (`None` for any other).
    fn damaged(self) -> Option<usize> {
        match self {
            Glyph::DamageLabel => Some(0),
            Glyph::DamageEntry => Some(1),
            Glyph::DamageDir => Some(2),
            _ => None,
        }
    }

    /// Removals sit in the lower half of a row, everything else in the upper half.
    fn y_offset_px(self) -> f64 {
        match self {
            Glyph::LabelRemoved
            | Glyph::EntryRemoved
            | Glyph::DirTrashed
            | Glyph::DamageDir
            | Glyph::DamageEntry
            | Glyph::DamageLabel => 16.0,
            _ => 7.0,
        }
    }

    /// The element drawing this mark at (cx, cy), with `class` and, when given, a tooltip.
    fn element(self, cx: f64, cy: f64, class: &str, tooltip: Option<&str>) -> String {
        let (name, geometry) = self.shape(cx, cy);
        match tooltip {
            Some(t) => format!(r#"<{name} {geometry} class="{class}"><title>{}</title></{name}>"#, escape(t)),
            None => format!(r#"<{name} {geometry} class="{class}"/>"#),
        }
    }

    /// The element's name and geometry attributes at (cx, cy).
    fn shape(self, cx: f64, cy: f64) -> (&'static str, String) {
        let square = |h: f64| {
            ("rect", format!(r#"x="{:.1}" y="{:.1}" width="{}" height="{}""#, cx - h, cy - h, 2.0 * h, 2.0 * h))
        };
        let cross =
            |h: f64| ("path", format!(r#"d="M{:.1} {:.1}l{h} {h}m0 -{h}l-{h} {h}""#, cx - h / 2.0, cy - h / 2.0));
        let diamond = |h: f64| ("path", format!(r#"d="M{cx:.1} {:.1}l{h} {h}l-{h} {h}l-{h} -{h}z""#, cy - h));
        let circle = |r: f64| ("circle", format!(r#"cx="{cx:.1}" cy="{cy:.1}" r="{r}""#));
        let path = |d: String| ("path", format!(r#"d="{d}""#));
        match self {
            Glyph::Relist => path(format!("M{cx:.1} {:.1}v14", cy - 7.0)),
            Glyph::LiveRead => circle(1.8),
            Glyph::Phantom | Glyph::Confirmed => circle(4.0),
            Glyph::Cleanup => square(2.5),
            Glyph::LabelSet => path(format!("M{cx:.1} {:.1}l4 7h-8z", cy - 4.0)),
            Glyph::Download => path(format!("M{:.1} {:.1}l7 4l-7 4z", cx - 3.0, cy - 4.0)),
            Glyph::Breaker => ("rect", format!(r#"x="{:.1}" y="{:.1}" width="3" height="12""#, cx - 1.5, cy - 6.0)),
            Glyph::ModelFailed => path(format!("M{:.1} {:.1}h8l-4 7z", cx - 4.0, cy - 3.5)),
            Glyph::LabelRemoved => cross(7.0),
            Glyph::EntryRemoved => diamond(4.0),
            Glyph::DirTrashed => square(5.0),
            Glyph::DamageDir => square(6.0),
            Glyph::DamageEntry => diamond(5.5),
            Glyph::DamageLabel => cross(8.0),
        }
    }
}

/// The legend of a simulator run.
pub const SCENARIO_LEGEND: &[Glyph] = &[
    Glyph::Relist,
    Glyph::LiveRead,
    Glyph::Phantom,
    Glyph::Confirmed,
    Glyph::Cleanup,
    Glyph::DamageLabel,
    Glyph::DamageEntry,
    Glyph::DamageDir,
];

/// A model's state from `from_ms` to `to_ms` (its ConfigMap entry's status on this node).
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub from_ms: u64,
    pub to_ms: u64,
    pub status: ModelStatus,
}

fn state_class(status: ModelStatus) -> &'static str {
    match status {
        ModelStatus::Ready => "state-ready",
        ModelStatus::Updating => "state-updating",
        ModelStatus::Failed => "state-failed",
        ModelStatus::Deleted => "state-deleted",
    }
}

#[derive(Clone, Debug, Default)]
pub struct Row {
    pub label: String,
    pub marks: Vec<(u64, Glyph)>,
    pub spans: Vec<Span>,
}

impl Row {
    pub fn new(label: String) -> Row {
        Row { label, ..Row::default() }
    }
}

/// One agent's (or one trace's) rows under a title; `id` names the band in the SVG
/// (`band-<id>`).
#[derive(Clone, Debug, Default)]
pub struct Band {
    pub id: String,
    pub title: String,
    pub summary: String,
    /// Said under the band when rows were grouped.
    pub note: Option<String>,
    pub rows: Vec<Row>,
}

#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub title: String,
    pub axis_caption: String,
    /// The time axis runs from `t_start_ms` to `t_end_ms`.
    pub t_start_ms: u64,
    pub t_end_ms: u64,
    pub bands: Vec<Band>,
    pub legend: Vec<Glyph>,
    /// The legend explains the state colours (a trace's model rows).
    pub states_in_legend: bool,
}

fn glyph_of(what: MarkKind) -> Glyph {
    match what {
        MarkKind::Relist => Glyph::Relist,
        MarkKind::Read => Glyph::LiveRead,
        MarkKind::Phantom => Glyph::Phantom,
        MarkKind::Confirmed => Glyph::Confirmed,
        MarkKind::Cleanup => Glyph::Cleanup,
        MarkKind::Damage(Removed::Label) => Glyph::DamageLabel,
        MarkKind::Damage(Removed::Entry) => Glyph::DamageEntry,
        MarkKind::Damage(Removed::Dir) => Glyph::DamageDir,
    }
}

/// The band of one scenario run: one row per node (or per group of nodes), with the report's
/// damage counts in its summary.
pub fn scenario_band(report: &Report, marks: &[Mark]) -> Band {
    let nodes = report.nodes.max(1);
    let per_row = nodes.div_ceil(ROWS_PER_BAND_MAX);
    let rows_n = nodes.div_ceil(per_row);
    let label = |r: usize| match (r * per_row, ((r + 1) * per_row).min(nodes) - 1) {
        (a, b) if a == b => format!("node {a}"),
        (a, b) => format!("nodes {a}-{b}"),
    };
    let mut rows: Vec<Row> = (0..rows_n).map(|r| Row::new(label(r))).collect();
    for m in marks.iter().filter(|m| m.node < nodes) {
        rows[m.node / per_row].marks.push((m.t, glyph_of(m.what)));
    }
    let title = match report.agent {
        AgentKind::Core => "core: this agent",
        AgentKind::Upstream => "upstream: a model of OME's agent",
    };
    let summary = format!(
        "damage to live models: {} label, {} ConfigMap entry, {} directory removals; {} phantom deletes \
         suppressed; {} live GETs, {} LISTs; cleanups done {} of {}",
        report.label_removals_live,
        report.entry_removals_live,
        report.dir_removals_live,
        report.phantom_deletes_suppressed,
        report.api_get,
        report.api_list,
        report.cleanups_done,
        report.cleanups_expected
    );
    let note = (per_row > 1).then(|| format!("{nodes} nodes drawn as {rows_n} rows of up to {per_row} nodes each"));
    Band { id: report.agent.as_str().to_string(), title: title.to_string(), summary, note, rows }
}

/// The picture of a scenario run by one or more agents (one band each, in the order given).
pub fn scenario_timeline(runs: &[(&Report, &[Mark], u64)]) -> Timeline {
    let r0 = runs.first().map(|r| r.0);
    let title = r0.map_or_else(String::new, |r| {
        format!("{}: {} nodes, {} models, seed {}", r.scenario, r.nodes, r.models, r.seed)
    });
    Timeline {
        title,
        axis_caption: "virtual time (s)".into(),
        t_start_ms: 0,
        t_end_ms: runs.iter().map(|r| r.2).max().unwrap_or(0),
        bands: runs.iter().map(|(report, marks, _)| scenario_band(report, marks)).collect(),
        legend: SCENARIO_LEGEND.to_vec(),
        states_in_legend: false,
    }
}

/// Where things go on the page.
struct Layout {
    t_start_ms: u64,
    /// Above `t_start_ms`.
    t_end_ms: u64,
}

impl Layout {
    fn new(t: &Timeline) -> Layout {
        Layout { t_start_ms: t.t_start_ms, t_end_ms: t.t_end_ms.max(t.t_start_ms + 1) }
    }

    fn x(&self, t_ms: u64) -> f64 {
        let (from, span) =
            (t_ms.clamp(self.t_start_ms, self.t_end_ms) - self.t_start_ms, self.t_end_ms - self.t_start_ms);
        LEFT_PX + PLOT_PX * from as f64 / span as f64
    }

    fn column(&self, t_ms: u64) -> usize {
        ((self.x(t_ms) - LEFT_PX) / COLUMN_PX) as usize
    }
}

/// Count of marks drawn so far and of those left out for the cap.
#[derive(Default)]
struct Budget {
    drawn: usize,
    dropped: usize,
}

/// The whole picture as SVG text.
pub fn render(t: &Timeline) -> String {
    let layout = Layout::new(t);
    let mut body = String::new();
    let _ = writeln!(body, r#"<text class="title" x="10" y="22">{}</text>"#, escape(&t.title));
    let mut y = 40.0;
    let plot_top = y;
    let mut budget = Budget::default();
    for band in &t.bands {
        y = draw_band(&mut body, &layout, band, y, &mut budget);
    }
    y = draw_axis(&mut body, &layout, &t.axis_caption, plot_top, y);
    y = draw_legend(&mut body, t, y + 14.0);
    let mut notes = vec![format!(
        "Marks of one kind within {COLUMN_PX} px of one row are drawn once; hover a mark for its count and times."
    )];
    if budget.dropped > 0 {
        notes.push(format!("{} marks not drawn: the picture draws {MARKS_DRAWN_MAX} at most.", budget.dropped));
    }
    for note in notes {
        y += 16.0;
        let _ = writeln!(body, r#"<text class="note" x="10" y="{y}">{}</text>"#, escape(&note));
    }
    let right_px = if t.bands.iter().any(has_damage) { RIGHT_DAMAGE_PX } else { RIGHT_PX };
    let (width, height) = (LEFT_PX + PLOT_PX + right_px, y + 14.0);
    let mut s = String::with_capacity(body.len() + 2048);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">"#
    );
    let _ = writeln!(s, "<style>\n{STYLE}</style>");
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    s.push_str(&body);
    s.push_str("</svg>\n");
    s
}

fn has_damage(band: &Band) -> bool {
    band.rows.iter().any(|r| r.marks.iter().any(|m| m.1.damaged().is_some()))
}

/// One band from `top`; returns the y below it.
fn draw_band(s: &mut String, layout: &Layout, band: &Band, top: f64, budget: &mut Budget) -> f64 {
    let _ = writeln!(s, r#"<g class="band" id="band-{}">"#, escape(&band.id));
    let _ = writeln!(s, r#"<text class="band-title" x="10" y="{}">{}</text>"#, top + 14.0, escape(&band.title));
    let _ = writeln!(s, r#"<text class="band-summary" x="10" y="{}">{}</text>"#, top + 30.0, escape(&band.summary));
    if has_damage(band) {
        let x = LEFT_PX + PLOT_PX + 8.0;
        let _ = writeln!(s, r#"<text class="count" x="{x}" y="{}">damage per row</text>"#, top + 30.0);
    }
    let mut y = top + 38.0;
    for (i, row) in band.rows.iter().enumerate() {
        draw_row(s, layout, row, y, i % 2 == 0, budget);
        y += ROW_PX;
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT_PX}" y="{}" width="{PLOT_PX}" height="{}" fill="none" stroke="#999"/>"##,
        top + 38.0,
        y - top - 38.0
    );
    if let Some(note) = &band.note {
        y += 14.0;
        let _ = writeln!(s, r#"<text class="band-note" x="{LEFT_PX}" y="{y}">{}</text>"#, escape(note));
    }
    s.push_str("</g>\n");
    y + 12.0
}

fn draw_row(s: &mut String, layout: &Layout, row: &Row, top: f64, shaded: bool, budget: &mut Budget) {
    let _ = writeln!(s, r#"<g class="row">"#);
    if shaded {
        let _ = writeln!(s, r##"<rect x="{LEFT_PX}" y="{top}" width="{PLOT_PX}" height="{ROW_PX}" fill="#f4f4f4"/>"##);
    }
    let label = cut(&row.label, ROW_LABEL_CHARS_MAX);
    let _ = writeln!(
        s,
        r#"<text class="row-label" x="10" y="{}">{}<title>{}</title></text>"#,
        top + 16.0,
        escape(&label),
        escape(&row.label)
    );
    draw_spans(s, layout, &row.spans, top);
    // One mark per (glyph, column): its count, first and last time.
    let mut merged: BTreeMap<(Glyph, usize), (usize, u64, u64)> = BTreeMap::new();
    for &(t, glyph) in &row.marks {
        let e = merged.entry((glyph, layout.column(t))).or_insert((0, t, t));
        *e = (e.0 + 1, e.1.min(t), e.2.max(t));
    }
    let mut damage = [0; 3];
    for ((glyph, _), (count, first, last)) in merged {
        if budget.drawn >= MARKS_DRAWN_MAX {
            budget.dropped += count;
            continue;
        }
        budget.drawn += 1;
        let (cx, cy) = (layout.x(first), top + glyph.y_offset_px());
        let tip = tooltip(glyph, count, first, last);
        let _ = writeln!(s, "{}", glyph.element(cx, cy, &format!("mark {}", glyph.class()), Some(&tip)));
        if let Some(i) = glyph.damaged() {
            damage[i] += count;
        }
    }
    if damage != [0; 3] {
        let x = LEFT_PX + PLOT_PX + 8.0;
        let _ = writeln!(s, r#"<text class="count" x="{x}" y="{}">{}</text>"#, top + 15.0, damage_text(&damage));
    }
    s.push_str("</g>\n");
}

/// A row's damage counts, spelled out right of the plot for readers of a still image.
fn damage_text(counts: &[usize; 3]) -> String {
    let parts = counts.iter().zip(["label", "entry", "dir"]).filter(|(n, _)| **n > 0);
    parts.map(|(n, what)| format!("{n} {what}")).collect::<Vec<_>>().join(", ")
}

fn tooltip(glyph: Glyph, count: usize, first_ms: u64, last_ms: u64) -> String {
    let secs = |ms: u64| ms as f64 / 1000.0;
    match count {
        1 => format!("{} at {:.3} s", glyph.meaning(), secs(first_ms)),
        n => format!("{n} × {} at {:.3}-{:.3} s", glyph.meaning(), secs(first_ms), secs(last_ms)),
    }
}

/// State spans as the row's background, one rectangle per run of one state on whole pixels.
fn draw_spans(s: &mut String, layout: &Layout, spans: &[Span], top: f64) {
    let mut runs: Vec<(i64, i64, ModelStatus)> = Vec::new();
    for span in spans {
        let (a, b) = (layout.x(span.from_ms).round() as i64, layout.x(span.to_ms).round() as i64);
        if b <= a {
            continue;
        }
        match runs.last_mut() {
            Some(last) if last.2 == span.status && last.1 >= a => last.1 = last.1.max(b),
            _ => runs.push((a, b, span.status)),
        }
    }
    for (a, b, status) in runs {
        let _ = writeln!(
            s,
            r#"<rect class="state {}" x="{a}" y="{}" width="{}" height="{}"><title>{}</title></rect>"#,
            state_class(status),
            top + 2.0,
            b - a,
            ROW_PX - 4.0,
            status.as_str()
        );
    }
}

/// Round tick steps, in ms.
const TICK_STEPS_MS: &[u64] = &[
    100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000, 900_000, 1_800_000,
    3_600_000, 7_200_000, 21_600_000, 43_200_000, 86_400_000,
];
/// Ticks on the axis at most.
const TICKS_MAX: u64 = 12;

/// The smallest round step that gives at most [`TICKS_MAX`] ticks over `span_ms`.
fn tick_step_ms(span_ms: u64) -> u64 {
    let fits = |step: &&u64| span_ms / **step < TICKS_MAX;
    let last = *TICK_STEPS_MS.last().expect("steps");
    TICK_STEPS_MS.iter().find(fits).copied().unwrap_or_else(|| span_ms.div_ceil(TICKS_MAX * last).max(1) * last)
}

/// `ms` in seconds, with as many decimals as it needs (at most 3).
fn seconds_label(ms: u64) -> String {
    match ms % 1000 {
        0 => format!("{} s", ms / 1000),
        frac => format!("{}.{} s", ms / 1000, format!("{frac:03}").trim_end_matches('0')),
    }
}

/// The time axis under the bands, with grid lines through them; returns the y below it.
fn draw_axis(s: &mut String, layout: &Layout, caption: &str, plot_top: f64, bottom: f64) -> f64 {
    let axis_y = bottom + 4.0;
    let step = tick_step_ms(layout.t_end_ms - layout.t_start_ms);
    let _ = writeln!(s, r#"<g id="axis">"#);
    let _ = writeln!(s, r#"<path class="axis" d="M{LEFT_PX} {axis_y}h{PLOT_PX}"/>"#);
    let first_ms = layout.t_start_ms.div_ceil(step) * step;
    // A trace starting between ticks gets its start labelled too, when there is room.
    let start = (layout.x(first_ms) - LEFT_PX > 60.0).then_some(layout.t_start_ms);
    for tick_ms in start.into_iter().chain((first_ms..=layout.t_end_ms).step_by(step as usize)) {
        let x = layout.x(tick_ms);
        let _ = writeln!(s, r#"<path class="grid" d="M{x:.1} {plot_top}V{axis_y}"/>"#);
        let _ = writeln!(s, r#"<path class="axis" d="M{x:.1} {axis_y}v5"/>"#);
        let _ = writeln!(
            s,
            r#"<text class="tick" x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            axis_y + 17.0,
            seconds_label(tick_ms)
        );
    }
    let _ = writeln!(
        s,
        r#"<text class="axis-caption" x="{}" y="{}" text-anchor="middle">{}</text>"#,
        LEFT_PX + PLOT_PX / 2.0,
        axis_y + 33.0,
        escape(caption)
    );
    s.push_str("</g>\n");
    axis_y + 33.0
}

/// The legend from `top`, wrapped to the page; returns the y below it.
fn draw_legend(s: &mut String, t: &Timeline, top: f64) -> f64 {
    let mut entries: Vec<(String, &str)> =
        t.legend.iter().map(|g| (g.element(0.0, 0.0, g.class(), None), g.meaning())).collect();
    let mut states = Vec::new();
    if t.states_in_legend {
        for status in [ModelStatus::Updating, ModelStatus::Ready, ModelStatus::Failed] {
            let swatch = format!(r#"<rect x="-6" y="-6" width="12" height="12" class="{}"/>"#, state_class(status));
            states.push((swatch, format!("model state {}", status.as_str())));
        }
    }
    entries.extend(states.iter().map(|(swatch, meaning)| (swatch.clone(), meaning.as_str())));
    let _ = writeln!(s, r#"<g id="legend">"#);
    let _ = writeln!(s, r#"<text class="legend-title" x="10" y="{}">legend</text>"#, top + 12.0);
    let (mut x, mut y) = (LEFT_PX, top + 12.0);
    for (glyph, meaning) in entries {
        let entry_px = 14.0 + CHAR_PX * meaning.chars().count() as f64 + 24.0;
        if x + entry_px > LEFT_PX + PLOT_PX && x > LEFT_PX {
            (x, y) = (LEFT_PX, y + 20.0);
        }
        let _ = writeln!(
            s,
            r#"<g class="legend-entry" transform="translate({x:.1} {})">{glyph}<text x="12" y="4">{}</text></g>"#,
            y - 4.0,
            escape(meaning)
        );
        x += entry_px;
    }
    s.push_str("</g>\n");
    y
}

fn cut(label: &str, chars_max: usize) -> String {
    match label.chars().count() > chars_max {
        true => label.chars().take(chars_max - 1).chain(['…']).collect(),
        false => label.to_string(),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
