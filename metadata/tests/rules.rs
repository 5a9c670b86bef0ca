//! FormatParamCount, capability rules, skip annotation, failure reasons, caps, baseline fixes.

mod common;

use std::collections::BTreeMap;

use common::{MemTree, safetensors_file};
use model_agent_metadata::capabilities::{self as caps, Facts, capabilities, has_token_run};
use model_agent_metadata::safetensors::{Packing, count_header_params, header_len_bytes};
use model_agent_metadata::{Outcome, format_param_count, parse_model_dir, spec_merge_patch, to_go_json};
use serde_json::json;

fn parse(tree: &mut MemTree) -> Outcome {
    parse_model_dir(tree, &BTreeMap::new())
}

fn parsed(tree: &mut MemTree) -> model_agent_metadata::Metadata {
    match parse(tree) {
        Outcome::Parsed(m) => *m,
        other => panic!("{other:?}"),
    }
}

#[test]
fn format_param_count_table_matches_upstream() {
    let table: &[(i64, &str)] = &[
        (0, "0"),
        (999, "999"),
        (1_000, "1K"),
        (1_500, "1.5K"),
        (1_500_000, "1.5M"),
        (7_620_000_000, "7.6B"),
        (3_210_000_000, "3.2B"),
        (7_615_616_512, "7.62B"),
        (8_030_261_248, "8.03B"),
        (685_000_000_000, "685B"),
        (1_000_000_000_000, "1T"),
        (1_234_000_000_000, "1.23T"),
        (110_000_000, "110M"),
        (20_914_757_184, "20.91B"),
    ];
    for (n, want) in table {
        assert_eq!(format_param_count(*n), *want, "{n}");
    }
}

fn facts<'a>(architecture: &'a str, model_type: &'a str) -> Facts<'a> {
    Facts { architecture, model_type, diffusion_pipeline: None, has_vision: false, is_embedding: false }
}

#[test]
fn every_capability_rule_first_match_wins() {
    let diffusion = |a| Facts { diffusion_pipeline: Some(true), has_vision: true, ..facts(a, "diffusers") };
    assert_eq!(capabilities(&diffusion("QwenImageEditPipeline")), [caps::IMAGE_TEXT_TO_IMAGE]);
    assert_eq!(capabilities(&diffusion("StableDiffusionInstructPix2PixPipeline")), [caps::IMAGE_TEXT_TO_IMAGE]);
    assert_eq!(capabilities(&diffusion("StableDiffusionXLImg2ImgPipeline")), [caps::IMAGE_TEXT_TO_IMAGE]);
    assert_eq!(capabilities(&diffusion("StableDiffusionInpaintPipeline")), [caps::IMAGE_TEXT_TO_IMAGE]);
    assert_eq!(capabilities(&diffusion("QwenImagePipeline")), [caps::TEXT_TO_IMAGE]);
    assert_eq!(capabilities(&diffusion("StableDiffusionXLPipeline")), [caps::TEXT_TO_IMAGE]);
    assert_eq!(capabilities(&diffusion("PixArtSigmaPipeline")), [caps::TEXT_TO_IMAGE]);
    assert_eq!(capabilities(&diffusion("TextToVideoSDPipeline")), [caps::TEXT_TO_VIDEO]);
    assert_eq!(capabilities(&diffusion("WanT2VPipeline")), [caps::TEXT_TO_VIDEO]);
    assert_eq!(capabilities(&diffusion("StableVideoDiffusionPipeline")), [caps::IMAGE_TEXT_TO_VIDEO]);
    // Upstream: a pipeline matching none of them falls through to the vision rule.
    assert_eq!(capabilities(&diffusion("FluxPipeline")), [caps::IMAGE_TEXT_TO_TEXT]);
    let no_pipeline = Facts { diffusion_pipeline: Some(false), ..facts("QwenImagePipeline", "diffusers") };
    assert!(capabilities(&no_pipeline).is_empty());
    assert_eq!(
        capabilities(&facts("NemotronH_Nano_VL_V2", "nemotronh_nano_vl_v2")),
        [caps::IMAGE_TEXT_TO_TEXT, caps::TEXT_TO_TEXT, caps::AUDIO_TO_TEXT]
    );
    let vision = Facts { has_vision: true, ..facts("Qwen2VLForConditionalGeneration", "qwen2_vl") };
    assert_eq!(capabilities(&vision), [caps::IMAGE_TEXT_TO_TEXT]);
    assert_eq!(capabilities(&facts("Qwen2_5OmniModel", "qwen2_5_omni")).len(), 5);
    for asr in ["WhisperForConditionalGeneration", "Wav2Vec2ForCTC", "HubertForCTC", "Speech2TextForSpeechToText"] {
        assert_eq!(capabilities(&facts(asr, "x")), [caps::AUDIO_TO_TEXT], "{asr}");
    }
    assert_eq!(capabilities(&facts("Speech2TextForConditionalGeneration", "x")), [caps::TEXT_TO_TEXT]);
    let embedding = Facts { is_embedding: true, ..facts("BertModel", "x") };
    assert_eq!(capabilities(&embedding), [caps::EMBEDDING]);
    assert_eq!(capabilities(&facts("GteEmbeddingModel", "x")), [caps::EMBEDDING]);
    assert_eq!(capabilities(&facts("SentenceTransformer", "x")), [caps::EMBEDDING]);
    assert_eq!(capabilities(&facts("XLMRobertaModel", "xlm-roberta")), [caps::EMBEDDING]);
    assert_eq!(capabilities(&facts("DistilBertModel", "distilbert")), [caps::EMBEDDING]);
    assert_eq!(capabilities(&facts("MistralModel", "mistral")), [caps::EMBEDDING]);
    assert_eq!(capabilities(&facts("LlamaForCausalLM", "llama")), [caps::TEXT_TO_TEXT]);
}

#[test]
fn capability_patterns_match_whole_tokens_where_the_baseline_matched_substrings() {
    // Baseline: strings.Contains, so "Demonic" was an omni model and "Pixtral" a pix pipeline.
    assert!(!has_token_run("DemonicForCausalLM", "omni"));
    assert!(has_token_run("Qwen2_5OmniForConditionalGeneration", "omni"));
    assert!(has_token_run("Qwen3OmniMoeForConditionalGeneration", "omni"));
    assert!(!has_token_run("PixtralPipeline", "pix"));
    assert!(has_token_run("StableDiffusionXLImg2ImgPipeline", "img2img"));
    assert!(has_token_run("Wav2Vec2ForCTC", "wav2vec2"));
    assert!(!has_token_run("EmbeddingsLessModel", "embedding"));
    assert!(!has_token_run("libertas", "bert"));
    assert_eq!(capabilities(&facts("DemonicForCausalLM", "demonic")), [caps::TEXT_TO_TEXT]);
    assert_eq!(capabilities(&facts("OmnibusForCausalLM", "omnibus")), [caps::TEXT_TO_TEXT]);
}

#[test]
fn mistral_for_causal_lm_is_text_to_text_baseline_said_embedding_fixed_later_upstream() {
    let mut tree = common::load_fixture("mistral_7b_instruct_v0_3");
    let m = parsed(&mut tree);
    assert_eq!(m.config.model_capabilities, ["TEXT_TO_TEXT"]);
    assert!(!m.config.decoded_model_configuration.is_embedding);
    let mut e5 = common::load_fixture("e5_mistral_7b_instruct");
    assert_eq!(parsed(&mut e5).config.model_capabilities, ["EMBEDDING"]);
}

#[test]
fn max_tokens_is_set_from_context_keys_and_nested_configs_baseline_never_set_it() {
    let cases = [
        (json!({"model_type": "x", "max_position_embeddings": 0, "max_sequence_length": 2048}), 2048),
        (json!({"model_type": "x", "max_seq_len": 4096}), 4096),
        (json!({"model_type": "x", "seq_length": 8192, "model_max_length": 99}), 8192),
        (json!({"model_type": "x", "model_max_length": 512}), 512),
        (json!({"model_type": "x", "text_config": {"max_position_embeddings": 131072}}), 131072),
        (json!({"model_type": "x", "llm_config": {"seq_length": 32768}}), 32768),
        (json!({"model_type": "x", "language_config": {"max_sequence_length": 16384}}), 16384),
        (json!({"model_type": "x", "max_position_embeddings": 4096.0}), 4096),
        (json!({"model_type": "x"}), 0),
    ];
    for (config, want) in cases {
        let mut tree = MemTree::default().with("config.json", config.to_string());
        assert_eq!(parsed(&mut tree).config.max_tokens, want, "{config}");
    }
}

#[test]
fn packed_int4_and_fp4_weights_are_counted_quant_aware_baseline_under_counted() {
    let t = |n: &str, d: &str, s: &[u64]| (n.to_string(), d.to_string(), s.to_vec());
    let file = safetensors_file(&[
        t("a.qweight", "I32", &[8, 4]),
        t("b.weight_packed", "I16", &[2, 2]),
        t("c.weight", "U8", &[3]),
        t("c.weight_scale", "BF16", &[100]),
        t("c.scales", "F16", &[100]),
        t("c.qzeros", "I32", &[100]),
        t("d.weight", "BF16", &[10]),
    ]);
    let header = &file[8..8 + header_len_bytes(&file[..8]).unwrap() as usize];
    assert_eq!(count_header_params(header, Packing::Int4).unwrap(), 32 * 8 + 4 * 4 + 3 * 2 + 10);
    let fp4 = safetensors_file(&[t("e.blocks", "U8", &[4, 4]), t("e.scales", "U8", &[4]), t("f", "I8", &[5])]);
    let header = &fp4[8..8 + header_len_bytes(&fp4[..8]).unwrap() as usize];
    assert_eq!(count_header_params(header, Packing::Fp4).unwrap(), 16 * 2 + 10);
    // Unquantised checkpoints count every tensor once, "scale" names included (norm scales).
    assert_eq!(count_header_params(header, Packing::None).unwrap(), 16 + 4 + 5);
    let mut awq = common::load_fixture("llama3_8b_awq");
    assert_eq!(parsed(&mut awq).config.model_parameter_size, "2.93B");
}

#[test]
fn nan_and_infinity_in_config_json_are_accepted_as_upstream_sanitises_them() {
    let raw = r#"{"model_type": "nemotron_h", "a": NaN, "b": [Infinity, -Infinity, NaN], "s": "NaN, Infinity",
        "max_position_embeddings": 8192}"#;
    let mut tree = MemTree::default().with("config.json", raw);
    assert_eq!(parsed(&mut tree).config.max_tokens, 8192);
    let clean = model_agent_metadata::json::sanitize_non_finite(raw.as_bytes());
    let v: serde_json::Value = serde_json::from_slice(&clean).unwrap();
    assert_eq!(v["b"], json!([1e308, -1e308, null]));
    assert_eq!(v["s"], "NaN, Infinity");
}

#[test]
fn skip_annotation_true_in_any_case_skips_parsing() {
    let mut tree = common::load_fixture("llama3_1_8b_instruct");
    for value in ["true", "TRUE", "True"] {
        let ann = BTreeMap::from([("ome.oracle.com/skip-config-parsing".to_string(), value.to_string())]);
        assert_eq!(parse_model_dir(&mut tree, &ann), Outcome::Skipped);
    }
    let ann = BTreeMap::from([("ome.oracle.com/skip-config-parsing".to_string(), "yes".to_string())]);
    assert!(matches!(parse_model_dir(&mut tree, &ann), Outcome::Parsed(_)));
}

#[test]
fn malformed_or_missing_config_is_ready_without_config_with_a_reason() {
    let cases: [(MemTree, &str); 5] = [
        (MemTree::default().with("config.json", "{\"model_type\": \"llama\","), "config.json: not valid JSON"),
        (MemTree::default().with("config.json", "[1, 2]"), "config.json: not a JSON object"),
        (MemTree::default().with("config.json", "{\"hidden_size\": 1}"), "model_type is missing"),
        (MemTree::default().with("README.md", "hi"), "no model_index.json or config.json found"),
        (MemTree::default().with("model_index.json", "{\"_foo\": 1}"), "no diffusion pipeline metadata"),
    ];
    for (mut tree, want) in cases {
        match parse(&mut tree) {
            Outcome::WithoutConfig { reason } => assert!(reason.contains(want), "{reason:?} lacks {want:?}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_20_mib_safetensors_header_is_refused_without_reading_it() {
    let mut prefix = (20u64 * 1024 * 1024).to_le_bytes().to_vec();
    prefix.extend_from_slice(b"{\"x\":");
    let mut tree = MemTree::default()
        .with("config.json", r#"{"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28}"#)
        .with("model.safetensors", prefix);
    let m = parsed(&mut tree);
    assert!(m.parameter_source.contains("over the 10485760-byte cap; not read"), "{}", m.parameter_source);
    // Only the 8-byte length was read from the safetensors file.
    let reads: Vec<_> = tree.read_ranges.iter().filter(|(p, _, _)| p == "model.safetensors").collect();
    assert_eq!(reads, [&("model.safetensors".to_string(), 0, 8)]);
    assert!(header_len_bytes(&(10u64 * 1024 * 1024).to_le_bytes()).is_ok());
    assert!(header_len_bytes(&(10u64 * 1024 * 1024 + 1).to_le_bytes()).is_err());
}

#[test]
fn oversized_config_json_is_refused_by_size_not_read() {
    let mut tree = MemTree::default();
    tree.sizes_only.insert("config.json".into(), 5 * 1024 * 1024);
    match parse(&mut tree) {
        Outcome::WithoutConfig { reason } => assert!(reason.contains("cap; not read"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn discovery_order_model_index_then_root_then_subdirs_then_bounded_search() {
    let cfg = |t: &str| format!("{{\"model_type\": \"{t}\"}}");
    let index = r#"{"_class_name": "QwenImagePipeline", "_diffusers_version": "0.35.0"}"#;
    let mut tree = MemTree::default().with("config.json", cfg("root")).with("deep/er/model_index.json", index);
    assert_eq!(parsed(&mut tree).config_path, "deep/er/model_index.json");
    let mut tree = MemTree::default().with("config.json", cfg("root")).with("model/config.json", cfg("sub"));
    assert_eq!(parsed(&mut tree).config_path, "config.json");
    let mut tree = MemTree::default().with("model/config.json", cfg("m")).with("pytorch_model/config.json", cfg("p"));
    assert_eq!(parsed(&mut tree).config_path, "pytorch_model/config.json");
    let mut tree = MemTree::default().with("a/config.json", cfg("a")).with("b/config.json", cfg("b"));
    assert_eq!(parsed(&mut tree).config_path, "a/config.json", "first hit wins (baseline kept the last directory's)");
    let mut tree = MemTree::default().with(".cache/config.json", cfg("hidden"));
    assert!(matches!(parse(&mut tree), Outcome::WithoutConfig { .. }));
    let mut tree = MemTree::default().with("1/2/3/4/config.json", cfg("deep"));
    assert_eq!(parsed(&mut tree).config_path, "1/2/3/4/config.json");
    let mut tree = MemTree::default().with("1/2/3/4/5/config.json", cfg("too-deep"));
    assert!(matches!(parse(&mut tree), Outcome::WithoutConfig { .. }), "the search stops 4 directories down");
}

#[test]
fn index_shards_are_preferred_over_other_safetensors_files() {
    let mut tree = common::load_fixture("llama3_1_8b_instruct");
    // A stray consolidated file beside the index is not counted.
    tree.files.insert("consolidated.safetensors".into(), safetensors_file(&[("x".into(), "BF16".into(), vec![1000])]));
    assert_eq!(parsed(&mut tree).config.model_parameter_size, "8.03B");
}

#[test]
fn go_escaping_of_html_characters_is_kept() {
    let mut tree = MemTree::default().with("config.json", r#"{"model_type": "a<b>&c", "architectures": ["X\u2028"]}"#);
    let json = to_go_json(&parsed(&mut tree).config);
    assert!(json.starts_with(r#"{"modelType":"a\u003cb\u003e\u0026c","modelArchitecture":"X\u2028""#), "{json}");
}

#[test]
fn artifact_is_always_present_and_empty_fields_are_omitted() {
    let mut tree = MemTree::default().with("config.json", r#"{"model_type": "llama"}"#);
    let json = to_go_json(&parsed(&mut tree).config);
    assert_eq!(
        json,
        concat!(
            r#"{"modelType":"llama","modelFramework":{"name":"transformers"},"#,
            r#""modelFormat":{"name":"safetensors","version":"1.0.0"},"modelParameterSize":"0","#,
            r#""modelCapabilities":["TEXT_TO_TEXT"],"decodedModelConfiguration":{"architecture":"","#,
            r#""context_length":0,"has_vision":false,"is_embedding":false,"model_size_bytes":0,"#,
            r#""model_type":"llama","parameter_count":"0","torch_dtype":"","transformers_version":""},"#,
            r#""artifact":{"sha":"","parentPath":null,"childrenPaths":null}}"#
        )
    );
}

#[test]
fn spec_patch_fills_only_empty_fields_with_a_resource_version_precondition() {
    let mut tree = common::load_fixture("qwen2_5_7b_instruct");
    let m = parsed(&mut tree);
    let spec = json!({"storage": {"storageUri": "local:///m"}, "modelType": "custom", "modelFormat": {"name": ""},
        "modelCapabilities": []});
    let patch = spec_merge_patch(spec.as_object().unwrap(), "42", &m).unwrap();
    assert_eq!(patch["metadata"]["resourceVersion"], "42");
    let s = patch["spec"].as_object().unwrap();
    assert!(!s.contains_key("modelType"), "a set field is never overwritten");
    assert_eq!(s["modelFormat"], json!({"name": "safetensors", "version": "1.0.0"}));
    assert_eq!(s["modelCapabilities"], json!(["TEXT_TO_TEXT"]));
    assert_eq!(s["modelParameterSize"], "7.62B");
    assert!(!s.contains_key("maxTokens") && !s.contains_key("quantization") && !s.contains_key("diffusionPipeline"));
    assert_eq!(
        serde_json::to_string(&s["modelConfiguration"]).unwrap().len(),
        serde_json::to_string(&m.config.decoded_model_configuration).unwrap().len()
    );
    // Once filled, nothing is left to write: a second node's plan is empty.
    let mut filled = spec.as_object().unwrap().clone();
    filled.extend(s.clone());
    assert_eq!(spec_merge_patch(&filled, "43", &m), None);
}

#[test]
fn diffusion_pipeline_goes_into_the_spec_patch() {
    let mut tree = common::load_fixture("flux1_dev");
    let m = parsed(&mut tree);
    let patch = spec_merge_patch(&serde_json::Map::new(), "1", &m).unwrap();
    let p = &patch["spec"]["diffusionPipeline"];
    assert_eq!(p["className"], "FluxPipeline");
    assert_eq!(p["transformer"], json!({"library": "diffusers", "type": "FluxTransformer2DModel"}));
    assert_eq!(p["additionalComponents"]["text_encoder_2"]["type"], "T5EncoderModel");
}
