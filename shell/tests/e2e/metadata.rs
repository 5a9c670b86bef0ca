//! Model metadata in the ConfigMap entry: a `local://` model's config files, parsed on the node,
//! reach its Ready entry's `config` in OME's shape.

use std::path::{Path, PathBuf};
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

/// A Llama 3.1 directory in scratch `name`: its published config.json and one safetensors file of
/// two 128256 x 4096 tensors (1.05B parameters by the header).
fn llama_dir(name: &str) -> PathBuf {
    let dir = scratch(name).join("llama");
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = repo().join("metadata/tests/fixtures/llama3_1_8b_instruct/config.json");
    std::fs::copy(fixture, dir.join("config.json")).unwrap();
    let embed: &[u64] = &[128_256, 4096];
    let tensors = [("model.embed_tokens.weight", "BF16", embed), ("lm_head.weight", "BF16", embed)];
    safetensors(&dir.join("model.safetensors"), &tensors);
    dir
}

fn spec(name: &str) -> serde_json::Value {
    let out = kubectl(&["get", "clusterbasemodel", name, "-o", "json"]);
    serde_json::from_str::<serde_json::Value>(&out).unwrap()["spec"].clone()
}

#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t20_a_local_models_entry_carries_the_metadata_its_files_give() {
    super::setup();
    let (n, name) = ("e2e-meta", "e2e-meta-llama");
    node(n);
    let dir = llama_dir("meta-share");
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
    // Every write names its field manager: the managed fields say who set the label and entry.
    for (kind, namespace, field) in [
        ("node", None, format!("f:{}", label_key(name))),
        ("configmap", Some("ome"), format!("f:clusterbasemodel.{name}")),
    ] {
        let mut args = vec!["get", kind, n, "-o", "json", "--show-managed-fields"];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        let object: serde_json::Value = serde_json::from_str(&kubectl(&args)).unwrap();
        let managers = object["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
        let ours = managers.iter().find(|m| m["manager"] == "model-agent");
        let owned = ours.is_some_and(|m| m["fieldsV1"].to_string().contains(&field));
        assert!(owned, "{kind} {n}: no managedFields entry of model-agent with {field}: {managers:?}");
    }
    // Without --update-model-spec the agent never writes a model.
    std::thread::sleep(Duration::from_secs(1));
    assert!(spec(name).get("modelType").is_none(), "{}", spec(name));
    kubectl(&["delete", "clusterbasemodel", name]);
    agent.stop();
}

/// An optional component of deploy/, applied for one test and deleted after it, whatever
/// happens (t6 checks the agent's RBAC without it).
struct Optional(PathBuf);

impl Optional {
    fn apply(rel: &str) -> Optional {
        let path = repo().join(rel);
        kubectl(&["apply", "-f", path.to_str().unwrap()]);
        Optional(path)
    }
}

impl Drop for Optional {
    fn drop(&mut self) {
        let _ = super::kubectl_as(&super::var("ADMIN_KUBECONFIG"), &["delete", "-f", self.0.to_str().unwrap()], None);
    }
}

#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t21_update_model_spec_fills_the_empty_fields_once_across_two_nodes() {
    super::setup();
    let _binding = Optional::apply("deploy/components/update-model-spec/update-model-spec.yaml");
    let name = "e2e-fill-llama";
    let nodes = ["e2e-fill-a", "e2e-fill-b"];
    for n in nodes {
        node(n);
        kubectl(&["label", "node", n, "e2e-fill=yes", "--overwrite"]);
    }
    let dir = llama_dir("fill-share");
    let agents: Vec<Agent> =
        nodes.iter().map(|n| Agent::start(n, &scratch(&format!("{n}-root")), &["--update-model-spec"])).collect();
    // The user named the architecture: that field is theirs and stays.
    apply(&format!(
        "apiVersion: ome.io/v1beta1\nkind: ClusterBaseModel\nmetadata:\n  name: {name}\nspec:\n  modelArchitecture: UserSaid\n  storage: {{storageUri: \"local://{}\", nodeSelector: {{e2e-fill: \"yes\"}}}}\n",
        dir.display()
    ));
    for n in nodes {
        wait_until("label Ready", Duration::from_secs(30), || {
            labels(n).get(&label_key(name)).map(String::as_str) == Some("Ready")
        });
    }
    wait_until("spec.modelType filled", Duration::from_secs(30), || spec(name)["modelType"] == "llama");
    let filled = spec(name);
    assert_eq!(filled["modelArchitecture"], "UserSaid", "a field the user set is never overwritten");
    let size_and_format = (filled["modelParameterSize"].as_str(), filled["modelFormat"]["name"].as_str());
    assert_eq!(size_and_format, (Some("1.05B"), Some("safetensors")), "{filled}");
    assert!(filled.get("maxTokens").is_none(), "maxTokens is the controller's to fill: {filled}");
    // Each agent tried once; one write won, the other found nothing left to fill.
    let said = |pattern: &str| {
        let logs = nodes.map(|n| std::fs::read_to_string(Agent::scratch_dir(n).join("agent.log")).unwrap_or_default());
        logs.iter().map(|l| l.matches(pattern).count()).sum::<usize>()
    };
    wait_until("both agents report their write-back", Duration::from_secs(30), || said("spec write-back") == 2);
    assert_eq!(said("spec write-back: filled"), 1);
    assert_eq!(said("no empty field to fill"), 1);
    kubectl(&["delete", "clusterbasemodel", name]);
    drop(agents);
}
