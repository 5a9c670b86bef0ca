//! Object stores end to end (#11): `s3://` from s3s-fs, `gs://` from gcp-storage-emulator, `az://`
//! from Azurite, servers the project did not write, started by `scripts/e2e` through
//! `scripts/object-stores` (their endpoints and keys in the environment). The real agent and the
//! real apiserver.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::hf::{status, trash_entries};
use super::{Agent, apply, entries, kubectl, node, repo, scratch, var, wait_until};

const BUCKET: &str = "e2e-models";
const PREFIX: &str = "llama/v1";
const BIG_BYTES: usize = 6 << 20;

/// The fixture: a config, a nested file and a big one (over one 8 MiB chunk boundary, no).
fn fixture(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let big: Vec<u8> = (0..BIG_BYTES).map(|i| (i * 7 % 251) as u8).collect();
    let files = vec![
        ("config.json".to_string(), br#"{"model_type":"llama","architectures":["LlamaForCausalLM"]}"#.to_vec()),
        ("tokenizer/vocab.txt".to_string(), b"a\nb\nc\n".to_vec()),
        ("model-00001.safetensors".to_string(), big),
    ];
    for (path, bytes) in &files {
        let file = dir.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, bytes).unwrap();
    }
    files
}

/// Uploads the fixture under `BUCKET/PREFIX` of `scheme` with `scripts/object-stores put-tree`.
fn upload(scheme: &str, dir: &Path) {
    let status = Command::new(repo().join("scripts/object-stores"))
        .args(["put-tree", scheme, BUCKET, PREFIX, dir.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success(), "uploading the fixture to {scheme}");
}

fn assert_same_files(files: &[(String, Vec<u8>)], dest: &Path) {
    for (path, bytes) in files {
        let got = std::fs::read(dest.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(got == *bytes, "{path}: other bytes");
    }
    assert!(dest.join(".model-agent-owner").is_file() && !dest.join(".model-agent-partial").exists());
}

fn model(name: &str, n: &str, uri: &str, dest: &Path, storage_extra: &str) -> String {
    format!(
        "apiVersion: ome.io/v1beta1\nkind: ClusterBaseModel\nmetadata:\n  name: {name}\nspec:\n  storage: {{storageUri: \"{uri}\", path: \"{}\", nodeSelector: {{e2e: {n}}}{storage_extra}}}\n",
        dest.display()
    )
}

fn secret(name: &str, data: &[(&str, &str)]) -> String {
    let lines: String = data.iter().map(|(k, v)| format!("  {k}: \"{v}\"\n")).collect();
    format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: ome\nstringData:\n{lines}")
}

fn reason(n: &str, name: &str) -> String {
    let e = entries(n).get(&format!("clusterbasemodel.{name}")).cloned().unwrap_or_default();
    e["reason"].as_str().unwrap_or_default().to_string()
}

/// One scheme: Ready with every file's bytes, the entry's metadata; wrong credentials Failed
/// with the reason; a delete trashes the directory.
fn one_scheme(scheme: &str, uri: &str, (good, bad): (&str, &str), bad_says: &str) {
    super::setup();
    let n = format!("e2e-store-{scheme}");
    node(&n);
    let (root, fixtures) = (scratch(&format!("{n}-root")), scratch(&format!("{n}-fixture")));
    let files = fixture(&fixtures);
    upload(scheme, &fixtures);
    let command = Command::new(env!("CARGO_BIN_EXE_model-agent"));
    let agent = Agent::launch(command, &var("AGENT_KUBECONFIG"), &n, &root, &[]);
    let (ok, denied) = (format!("{n}-ok"), format!("{n}-denied"));
    let dest: PathBuf = root.join("ok");
    apply(&model(&ok, &n, uri, &dest, good));
    apply(&model(&denied, &n, uri, &root.join("denied"), bad));
    wait_until("the model Ready", Duration::from_secs(90), || status(&n, &ok) == "Ready");
    assert_same_files(&files, &dest);
    let e = entries(&n)[&format!("clusterbasemodel.{ok}")].clone();
    assert_eq!(e["config"]["modelType"], "llama", "{e}");
    wait_until("wrong credentials Failed", Duration::from_secs(90), || status(&n, &denied) == "Failed");
    let why = reason(&n, &denied);
    assert!(why.contains(bad_says), "{why}");
    kubectl(&["delete", "clusterbasemodel", &ok, &denied]);
    wait_until("the directory trashed", Duration::from_secs(30), || !dest.exists() && trash_entries(&root) == 1);
    agent.stop();
}

#[test]
#[ignore = "needs a real kube-apiserver and the object stores: run by scripts/e2e"]
fn t25_s3_from_s3s_fs_with_a_secret_and_a_wrong_one() {
    super::setup();
    let endpoint = var("S3_ENDPOINT");
    apply(&secret(
        "e2e-s3",
        &[("AWS_ACCESS_KEY_ID", &var("S3_ACCESS_KEY")), ("AWS_SECRET_ACCESS_KEY", &var("S3_SECRET_KEY"))],
    ));
    apply(&secret("e2e-s3-bad", &[("AWS_ACCESS_KEY_ID", &var("S3_ACCESS_KEY")), ("AWS_SECRET_ACCESS_KEY", "wrong")]));
    let params = format!(", parameters: {{endpoint: \"{endpoint}\", region: us-east-1}}");
    let (good, bad) = (format!(", key: e2e-s3{params}"), format!(", key: e2e-s3-bad{params}"));
    one_scheme("s3", &format!("s3://{BUCKET}/{PREFIX}"), (&good, &bad), "access denied");
}

#[test]
#[ignore = "needs a real kube-apiserver and the object stores: run by scripts/e2e"]
fn t26_gs_from_the_gcs_emulator_anonymous_and_a_missing_secret() {
    // The emulator checks no credentials: a Secret that does not exist stands for the refusal.
    let good = format!(", parameters: {{endpoint: \"{}\", anonymous: \"true\"}}", var("GCS_ENDPOINT"));
    let bad = format!(", key: e2e-gs-missing{good}");
    one_scheme("gs", &format!("gs://{BUCKET}/{PREFIX}"), (&good, &bad), "not found");
}

#[test]
#[ignore = "needs a real kube-apiserver and the object stores: run by scripts/e2e"]
fn t27_az_from_azurite_with_an_account_key_and_a_wrong_one() {
    super::setup();
    let (endpoint, account) = (var("AZURE_ENDPOINT"), var("AZURE_ACCOUNT"));
    apply(&secret("e2e-az", &[("AZURE_STORAGE_KEY", &var("AZURE_KEY"))]));
    apply(&secret("e2e-az-bad", &[("AZURE_STORAGE_KEY", "d3Jvbmcta2V5LXdyb25nLWtleQ==")]));
    let params = format!(", parameters: {{endpoint: \"{endpoint}\"}}");
    let (good, bad) = (format!(", key: e2e-az{params}"), format!(", key: e2e-az-bad{params}"));
    one_scheme("az", &format!("az://{account}/{BUCKET}/{PREFIX}"), (&good, &bad), "access denied");
}
