//! The timeline pictures, read back with an XML parser this project did not write (`roxmltree`):
//! a scenario drawn for both agents and a trace the simulator recorded, through the binary's
//! `--svg` options; and the bounds on a big run's picture.

use std::path::{Path, PathBuf};
use std::process::Command;

use model_agent_sim::scenario::{self, Options};
use model_agent_sim::svg::{self, Band, Glyph, MARKS_DRAWN_MAX, ROWS_PER_BAND_MAX, Row, Timeline};
use roxmltree::{Document, Node};

const SVG_NS: &str = "http://www.w3.org/2000/svg";

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("svg-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn sim(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_model-agent-sim")).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "model-agent-sim {args:?}: {}\n{stderr}", out.status);
}

fn classes<'a>(n: &Node<'a, 'a>) -> Vec<&'a str> {
    n.attribute("class").map(|c| c.split_whitespace().collect()).unwrap_or_default()
}

fn has_class(n: &Node, class: &str) -> bool {
    classes(n).contains(&class)
}

/// Every element below `n` with `class`.
fn with_class<'a>(n: Node<'a, 'a>, class: &'a str) -> impl Iterator<Item = Node<'a, 'a>> {
    n.descendants().filter(move |d| d.is_element() && has_class(d, class))
}

fn text_of(n: &Node) -> String {
    n.children().filter_map(|c| c.text()).collect()
}

/// A well-formed SVG: root `svg` in the SVG namespace, width and height, a viewBox of that size.
fn check_root(doc: &Document) -> (f64, f64) {
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(root.tag_name().namespace(), Some(SVG_NS));
    let number = |name: &str| -> f64 { root.attribute(name).unwrap_or_else(|| panic!("no {name}")).parse().unwrap() };
    let (width, height) = (number("width"), number("height"));
    assert!(width > 500.0 && height > 100.0, "{width} x {height}");
    let view_box: Vec<f64> =
        root.attribute("viewBox").expect("viewBox").split(' ').map(|v| v.parse().unwrap()).collect();
    assert_eq!(view_box, vec![0.0, 0.0, width, height]);
    (width, height)
}

/// The bands by id, in order.
fn bands<'a>(doc: &'a Document<'a>) -> Vec<Node<'a, 'a>> {
    with_class(doc.root_element(), "band").collect()
}

fn band_title(band: &Node) -> String {
    with_class(*band, "band-title").map(|t| text_of(&t)).next().expect("a band title")
}

fn row_labels(band: &Node) -> Vec<String> {
    with_class(*band, "row-label")
        .map(|t| t.children().filter_map(|c| c.text()).next().unwrap_or("").to_string())
        .collect()
}

fn marks(band: &Node, glyph: &str) -> usize {
    with_class(*band, "mark").filter(|m| has_class(m, glyph)).count()
}

/// The axis's tick labels in seconds, increasing, starting at `first`; returns them.
fn check_axis(doc: &Document, first: &str) -> Vec<String> {
    let axis = doc.descendants().find(|n| n.attribute("id") == Some("axis")).expect("an axis");
    let ticks: Vec<String> = with_class(axis, "tick").map(|t| text_of(&t)).collect();
    assert!(ticks.len() >= 3, "ticks {ticks:?}");
    assert_eq!(ticks[0], first, "ticks {ticks:?}");
    let seconds: Vec<f64> = ticks
        .iter()
        .map(|t| t.strip_suffix(" s").unwrap_or_else(|| panic!("tick {t:?} not in seconds")).parse().unwrap())
        .collect();
    assert!(seconds.windows(2).all(|w| w[0] < w[1]), "ticks {ticks:?}");
    ticks
}

fn legend_texts(doc: &Document) -> Vec<String> {
    let legend = doc.descendants().find(|n| n.attribute("id") == Some("legend")).expect("a legend");
    let text = |e: Node| e.descendants().filter(|d| d.has_tag_name((SVG_NS, "text"))).map(|t| text_of(&t)).collect();
    with_class(legend, "legend-entry").map(text).collect()
}

#[test]
fn a_scenario_for_both_agents_draws_two_bands_with_the_upstream_damage() {
    let dir = scratch("both");
    let path = dir.join("crd.svg");
    sim(&["scenario", "crd-ssa", "--agent", "both", "--svg", path.to_str().unwrap()]);
    let text = std::fs::read_to_string(&path).unwrap();
    let doc = Document::parse(&text).expect("well-formed XML");
    check_root(&doc);
    let bands = bands(&doc);
    let ids: Vec<_> = bands.iter().map(|b| b.attribute("id").unwrap_or("")).collect();
    assert_eq!(ids, ["band-core", "band-upstream"]);
    assert!(band_title(&bands[0]).starts_with("core"));
    assert!(band_title(&bands[1]).starts_with("upstream"));
    let nodes: Vec<String> = (0..10).map(|n| format!("node {n}")).collect();
    for band in &bands {
        assert_eq!(row_labels(band), nodes, "{}", band_title(band));
        assert!(marks(band, "relist") > 0, "{}: no relist drawn", band_title(band));
    }
    let (core, upstream) = (&bands[0], &bands[1]);
    for damage in ["damage-label", "damage-entry", "damage-dir"] {
        assert!(marks(upstream, damage) > 0, "the upstream band has no {damage} mark");
        assert_eq!(marks(core, damage), 0, "the core band has a {damage} mark");
    }
    assert!(marks(core, "phantom") > 0, "the core's suppressed phantoms are not drawn");
    check_axis(&doc, "0 s");
    let legend = legend_texts(&doc);
    for g in svg::SCENARIO_LEGEND {
        assert!(legend.iter().any(|l| l == g.meaning()), "legend {legend:?} lacks {:?}", g.meaning());
    }
}

#[test]
fn a_replayed_trace_draws_the_node_and_its_models_over_time() {
    let dir = scratch("trace");
    sim(&["swarm", "--seeds", "1", "--seed", "3", "--dump-traces", dir.to_str().unwrap()]);
    // The trace with the most steps (the largest file).
    let trace = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .expect("traces written");
    let out = dir.join("trace.svg");
    sim(&["replay", trace.to_str().unwrap(), "--svg", out.to_str().unwrap()]);
    let text = std::fs::read_to_string(&out).unwrap();
    let doc = Document::parse(&text).expect("well-formed XML");
    check_root(&doc);
    let bands = bands(&doc);
    assert_eq!(bands.len(), 1);
    assert!(band_title(&bands[0]).starts_with("trace of node node-"));
    let rows = row_labels(&bands[0]);
    assert_eq!(rows[0], "node (lists, breaker)");
    assert!(
        rows.len() > 3
            && rows[1..].iter().all(|r| r.starts_with("cbm ") || r.starts_with("bm ") || r.contains("other"))
    );
    assert!(rows.len() <= ROWS_PER_BAND_MAX);
    let ready = with_class(bands[0], "state-ready").count();
    assert!(ready > 0, "no model drawn Ready");
    for glyph in ["live-read", "label-set", "relist"] {
        assert!(marks(&bands[0], glyph) > 0, "no {glyph} mark");
    }
    check_axis(&doc, "0 s");
    let legend = legend_texts(&doc);
    for expected in ["model state Ready", "model state Updating", "node label removed", "live read (GET or LIST)"] {
        assert!(legend.iter().any(|l| l == expected), "legend {legend:?} lacks {expected:?}");
    }
}

#[test]
fn a_trace_of_many_models_keeps_its_rows_bounded() {
    let opts = Options { nodes: 1, models: 200, record_traces: true, ..Options::default() };
    let (_, world) = scenario::run("real-mass-delete", &opts).unwrap();
    let paths = world.write_traces(&scratch("many"), "many").unwrap();
    let trace = model_agent_core::trace::parse(&std::fs::read_to_string(&paths[0]).unwrap()).unwrap();
    let timeline = svg::trace::timeline(&trace, "many");
    let rows = &timeline.bands[0].rows;
    assert_eq!(rows.len(), ROWS_PER_BAND_MAX);
    assert!(rows.last().unwrap().label.ends_with("other models"), "{:?}", rows.last().unwrap().label);
    let note = timeline.bands[0].note.as_deref().expect("a note on the grouped models");
    assert!(note.starts_with("200 models"), "{note}");
    let doc_text = svg::render(&timeline);
    let doc = Document::parse(&doc_text).unwrap();
    assert!(doc.descendants().filter_map(|n| n.text()).any(|t| t == note));
}

#[test]
fn a_big_run_is_drawn_in_bounded_rows_marks_and_bytes() {
    // 1000 nodes' worth of marks in the most crowded shape: every node, every glyph, every ms.
    let marks: Vec<(u64, Glyph)> =
        (0..20_000u64).map(|i| (i * 45 % 900_000, [Glyph::LiveRead, Glyph::DamageLabel][(i % 2) as usize])).collect();
    let rows: Vec<Row> = (0..ROWS_PER_BAND_MAX)
        .map(|r| Row { label: format!("row {r}"), marks: marks.clone(), spans: vec![] })
        .collect();
    let band = Band { id: "big".into(), title: "big".into(), rows, ..Band::default() };
    let timeline =
        Timeline { title: "big".into(), t_end_ms: 900_000, bands: vec![band.clone(), band], ..Timeline::default() };
    let text = svg::render(&timeline);
    assert!(text.len() < 6_000_000, "{} bytes", text.len());
    let doc = Document::parse(&text).unwrap();
    check_root(&doc);
    let drawn = with_class(doc.root_element(), "mark").count();
    assert_eq!(drawn, MARKS_DRAWN_MAX);
    let said = doc.descendants().filter_map(|n| n.text()).any(|t| t.contains("marks not drawn"));
    assert!(said, "the picture does not say that marks were left out");
}

#[test]
fn a_grouped_fleet_says_so() {
    let opts = Options { nodes: 95, models: 3, timeline: true, ..Options::default() };
    let (report, world) = scenario::run("crd-ssa", &opts).unwrap();
    let band = svg::scenario_band(&report, world.marks.as_deref().unwrap());
    assert_eq!(band.rows.len(), 24, "95 nodes in rows of 4");
    assert_eq!((band.rows[0].label.as_str(), band.rows[23].label.as_str()), ("nodes 0-3", "nodes 92-94"));
    assert_eq!(band.note.as_deref(), Some("95 nodes drawn as 24 rows of up to 4 nodes each"));
}
