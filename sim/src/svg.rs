//! A timeline picture of a run: one row per node; phantom candidates, confirmed deletes, live
//! reads, relists, cleanups and damage as marks, so a person sees an incident at a glance.

use std::fmt::Write;

use crate::world::{Mark, MarkKind};

/// Rows drawn at most (the picture of a 1,000-node fleet shows its first nodes).
pub const ROWS_MAX: usize = 60;

pub fn render(title: &str, marks: &[Mark], nodes: usize, t_end_ms: u64) -> String {
    let rows = nodes.min(ROWS_MAX);
    let (left, top, width, row_h) = (90.0, 50.0, 1100.0, 16.0);
    let height = top + rows as f64 * row_h + 60.0;
    let t_end = t_end_ms.max(1) as f64;
    let x = |t: u64| left + width * t as f64 / t_end;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="monospace" font-size="11">"#,
        left + width + 20.0
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="10" y="20" font-size="14">{}</text>"#, escape(title));
    for r in 0..rows {
        let y = top + r as f64 * row_h;
        let _ = writeln!(s, r#"<text x="10" y="{}">node {r}</text>"#, y + 11.0);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="#eee"/>"##,
            y + 8.0,
            left + width,
            y + 8.0
        );
    }
    for m in marks.iter().filter(|m| m.node < rows) {
        let (cx, cy) = (x(m.t), top + m.node as f64 * row_h + 8.0);
        mark(&mut s, m.what, cx, cy);
    }
    let legend_y = top + rows as f64 * row_h + 30.0;
    let legend = [
        ("#9467bd", "relist"),
        ("#1f77b4", "live read"),
        ("#ff7f0e", "phantom candidate (suppressed)"),
        ("#d62728", "delete confirmed"),
        ("#555", "cleanup"),
        ("black", "X = damage to a live model"),
    ];
    let mut lx = left;
    for (colour, label) in legend {
        let _ = writeln!(s, r#"<rect x="{lx}" y="{}" width="10" height="10" fill="{colour}"/>"#, legend_y - 9.0);
        let _ = writeln!(s, r#"<text x="{}" y="{legend_y}">{label}</text>"#, lx + 14.0);
        lx += 30.0 + 7.0 * label.len() as f64;
    }
    let _ = writeln!(s, r#"<text x="{left}" y="{}">0 s</text>"#, legend_y + 20.0);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}">{:.0} s (virtual)</text>"#,
        left + width - 120.0,
        legend_y + 20.0,
        t_end / 1000.0
    );
    s.push_str("</svg>\n");
    s
}

/// One mark's shape at (cx, cy).
fn mark(s: &mut String, what: MarkKind, cx: f64, cy: f64) {
    let _ = match what {
        MarkKind::Relist => {
            writeln!(s, r##"<line x1="{cx}" y1="{}" x2="{cx}" y2="{}" stroke="#9467bd"/>"##, cy - 7.0, cy + 7.0)
        }
        MarkKind::Read => writeln!(s, r##"<circle cx="{cx}" cy="{cy}" r="1.5" fill="#1f77b4"/>"##),
        MarkKind::Phantom => {
            writeln!(s, r##"<circle cx="{cx}" cy="{cy}" r="4" fill="#ff7f0e" fill-opacity="0.6"/>"##)
        }
        MarkKind::Confirmed => writeln!(s, r##"<circle cx="{cx}" cy="{cy}" r="4" fill="#d62728"/>"##),
        MarkKind::Cleanup => {
            writeln!(s, r##"<rect x="{}" y="{}" width="4" height="4" fill="#555"/>"##, cx - 2.0, cy - 2.0)
        }
        MarkKind::Damage => writeln!(
            s,
            r##"<path d="M{} {} L{} {} M{} {} L{} {}" stroke="black" stroke-width="2"/>"##,
            cx - 5.0,
            cy - 5.0,
            cx + 5.0,
            cy + 5.0,
            cx - 5.0,
            cy + 5.0,
            cx + 5.0,
            cy - 5.0
        ),
    };
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
