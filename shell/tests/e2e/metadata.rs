//! Model metadata in the ConfigMap entry: a `local://` model's config files, parsed on the node,
//! reach its Ready entry's `config` in OME's shape.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{Agent, apply, entries, kubectl, label_key, labels, model, node, repo, scratch, wait_until};

/// A safetensors file with a real header and sparse (zero) tensor data: `tensors` are
/// (name, dtype, shape); every dtype here is 2 bytes wide.
fn safetensors(path: &Path, tensors: &[(&str, &str, &[u64])]) {
    let (mut header, mut offset) = (serde_json::Map::new(), 0u64);
    for (name, dtype, shape) in tensors {
        let bytes = 2 * shape.iter().product::<u64>();
        let entry = serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes]});
        header.insert(name.to_string(), entry);
        offset += bytes;
    }
    let header = serde_json::Value::Object(header).to_string().into_bytes();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    std::fs::write(path, &bytes).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(bytes.len() as u64 + offset).unwrap();
}

#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t20_a_local_models_entry_carries_the_metadata_its_files_give() {
    super::setup();
    let (n, name) = ("e2e-meta", "e2e-meta-llama");
    node(n);
    let share = scratch("meta-share");
    let dir = share.join("llama");
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = repo().join("metadata/tests/fixtures/llama3_1_8b_instruct/config.json");
    std::fs::copy(fixture, dir.join("config.json")).unwrap();
    let embed: &[u64] = &[128_256, 4096];
    safetensors(
        &dir.join("model.safetensors"),
        &[("model.embed_tokens.weight", "BF16", embed), ("lm_head.weight", "BF16", embed)],
    );
    let root = scratch("meta-root");
    let agent = Agent::start(n, &root, &[]);
    apply(&model(name, n, &format!("local://{}", dir.display()), None, false));
    wait_until("label Ready", Duration::from_secs(30), || {
        labels(n).get(&label_key(name)).map(String::as_str) == Some("Ready")
    });
    let entry = entries(n)[&format!("clusterbasemodel.{name}")].clone();
    let config = &entry["config"];
    assert_eq!(config["modelType"], "llama", "{entry}");
    assert_eq!(config["modelArchitecture"], "LlamaForCausalLM");
    assert_eq!(config["maxTokens"], 131072, "max_position_embeddings");
    assert_eq!(config["modelFormat"]["name"], "safetensors");
    assert_eq!(config["artifact"], serde_json::json!({"sha": "", "parentPath": null, "childrenPaths": null}));
    // The same as `model-agent inspect` says for the directory.
    let out = Command::new(env!("CARGO_BIN_EXE_model-agent")).arg("inspect").arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let inspected: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(*config, inspected["config"]);
    assert_eq!(config["modelParameterSize"], "1.05B", "two 128256 x 4096 tensors from the header");
    kubectl(&["delete", "clusterbasemodel", name]);
    agent.stop();
}
