//! Every fixture directory parses to the golden `config` JSON, byte for byte (Go's encoding).
//! Regenerate with `UPDATE_GOLDEN=1 cargo test -p model-agent-metadata --test golden` and
//! review the diff.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use model_agent_metadata::{Outcome, parse_model_dir, to_go_json};

fn golden_path(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(format!("{name}.json"))
}

fn parsed_json(name: &str) -> String {
    let mut tree = common::load_fixture(name);
    match parse_model_dir(&mut tree, &BTreeMap::new()) {
        Outcome::Parsed(m) => format!("{}\n", to_go_json(&m.config)),
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn at_least_twenty_architectures_match_their_golden_json_byte_for_byte() {
    let names = common::fixture_names();
    assert!(names.len() >= 20, "{} fixtures", names.len());
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut mismatched = Vec::new();
    for name in &names {
        let got = parsed_json(name);
        let path = golden_path(name);
        if update {
            std::fs::write(&path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|_| panic!("no golden for {name}"));
        if got != want {
            mismatched.push(format!("{name}:\n  got  {got}  want {want}"));
        }
    }
    assert!(mismatched.is_empty(), "{}", mismatched.join("\n"));
}
