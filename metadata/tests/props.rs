//! Arbitrary bytes as config.json or as a safetensors header never panic, and never make the
//! parser ask for more than its caps.

mod common;

use std::collections::BTreeMap;

use common::MemTree;
use model_agent_metadata::limits::{CONFIG_JSON_MAX_BYTES, SAFETENSORS_HEADER_MAX_BYTES, SAFETENSORS_PREFIX_BYTES};
use model_agent_metadata::safetensors::{Packing, count_header_params, header_len_bytes};
use model_agent_metadata::{Entry, FsError, ModelFiles, parse_model_dir};
use proptest::prelude::*;

/// Records the largest read any call asked for.
struct Watching {
    inner: MemTree,
    largest_ask_bytes: u64,
}

impl ModelFiles for Watching {
    fn list_dir(&mut self, rel_dir: &str) -> Result<Vec<Entry>, FsError> {
        self.inner.list_dir(rel_dir)
    }
    fn read_file(&mut self, rel_path: &str, cap_bytes: u64) -> Result<Vec<u8>, FsError> {
        self.largest_ask_bytes = self.largest_ask_bytes.max(cap_bytes);
        self.inner.read_file(rel_path, cap_bytes)
    }
    fn read_range(&mut self, rel_path: &str, offset_bytes: u64, len_bytes: u64) -> Result<Vec<u8>, FsError> {
        self.largest_ask_bytes = self.largest_ask_bytes.max(len_bytes);
        self.inner.read_range(rel_path, offset_bytes, len_bytes)
    }
}

fn json_like() -> impl Strategy<Value = Vec<u8>> {
    let pieces = prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"model_type\"",
        "\"llama\"",
        "NaN",
        "Infinity",
        "-Infinity",
        "1e999",
        "-1",
        "0",
        "4096",
        "\"max_position_embeddings\"",
        "\"text_config\"",
        "\"architectures\"",
        "\"\\u",
        "\"quantization_config\"",
        "\"quant_method\"",
        "\"shape\"",
        "\"dtype\"",
        "\"I32\"",
        "null",
        " ",
    ]);
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        prop::collection::vec(pieces, 0..64).prop_map(|p| p.concat().into_bytes()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_config_json_never_panics_nor_asks_beyond_the_caps(config in json_like(), header in json_like(),
                                                                   declared_len in any::<u64>()) {
        let mut st = declared_len.to_le_bytes().to_vec();
        st.extend_from_slice(&header);
        let tree = MemTree::default().with("config.json", config).with("model.safetensors", st);
        let mut watching = Watching { inner: tree, largest_ask_bytes: 0 };
        let _ = parse_model_dir(&mut watching, &BTreeMap::new());
        prop_assert!(watching.largest_ask_bytes <= CONFIG_JSON_MAX_BYTES.max(SAFETENSORS_HEADER_MAX_BYTES));
        if declared_len > SAFETENSORS_HEADER_MAX_BYTES {
            let header_reads = watching.inner.read_ranges.iter().filter(|(_, off, _)| *off == SAFETENSORS_PREFIX_BYTES);
            prop_assert_eq!(header_reads.count(), 0);
        }
    }

    #[test]
    fn arbitrary_safetensors_header_never_panics(header in json_like(), packing in 0u8..4) {
        let packing = [Packing::None, Packing::ScalesOnly, Packing::Int4, Packing::Fp4][packing as usize];
        let _ = count_header_params(&header, packing);
        let _ = header_len_bytes(&header);
    }
}
