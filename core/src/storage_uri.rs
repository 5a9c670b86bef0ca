//! `spec.storage.storageUri`: every scheme OME knows, and whether it downloads onto the node.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A parsed storage URI.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StorageUri {
    /// `oci://n/{namespace}/b/{bucket}/o/{prefix}`
    Oci { namespace: String, bucket: String, prefix: String },
    /// `hf://{org}/{repo}[@{revision}]`, revision `main` when absent.
    HuggingFace { org: String, repo: String, revision: String },
    /// `local://{path}`: weights already on the node (often a read-only share).
    Local { path: String },
    /// `vendor://{vendor}/{type}/{path}`: weights provided by the platform.
    Vendor { vendor: String, resource_type: String, path: String },
    /// `pvc://[{namespace}:]{pvc}/{subpath}`: served from a PVC by the controller, never by the agent.
    Pvc { namespace: Option<String>, name: String, subpath: String },
    /// `s3://{bucket}/{prefix}`
    S3 { bucket: String, prefix: String },
    /// `gs://{bucket}/{prefix}`
    Gcs { bucket: String, prefix: String },
    /// `az://{account}/{container}/{prefix}`
    Azure { account: String, container: String, prefix: String },
    /// `github://{owner}/{repo}[@{revision}]`
    GitHub { owner: String, repo: String, revision: String },
}

/// Why a storage URI was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UriError {
    pub uri: String,
    pub reason: String,
}

impl fmt::Display for UriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid storageUri {:?}: {}", self.uri, self.reason)
    }
}

impl std::error::Error for UriError {}

const KNOWN: &str = "oci://, hf://, local://, vendor://, pvc://, s3://, gs://, az://, github://";

impl StorageUri {
    pub fn parse(uri: &str) -> Result<StorageUri, UriError> {
        let err = |reason: String| UriError { uri: uri.to_string(), reason };
        if uri.contains('\0') {
            return Err(err("contains a NUL byte".into()));
        }
        if uri.chars().any(char::is_whitespace) {
            return Err(err("contains white space".into()));
        }
        let (scheme, rest) = uri.split_once("://").ok_or_else(|| err(format!("no scheme; expected one of {KNOWN}")))?;
        match scheme {
            "oci" => parse_oci(rest),
            "hf" => parse_hf(rest),
            "local" => nonempty(&[rest], "local://{path}").map(|()| StorageUri::Local { path: rest.to_string() }),
            "vendor" => parse_vendor(rest),
            "pvc" => parse_pvc(rest),
            "s3" | "gs" => parse_bucket(scheme, rest),
            "az" => parse_azure(rest),
            "github" => parse_github(rest),
            other => Err(format!("unknown scheme {other:?}; expected one of {KNOWN}")),
        }
        .map_err(err)
    }

    pub fn scheme(&self) -> &'static str {
        match self {
            StorageUri::Oci { .. } => "oci",
            StorageUri::HuggingFace { .. } => "hf",
            StorageUri::Local { .. } => "local",
            StorageUri::Vendor { .. } => "vendor",
            StorageUri::Pvc { .. } => "pvc",
            StorageUri::S3 { .. } => "s3",
            StorageUri::Gcs { .. } => "gs",
            StorageUri::Azure { .. } => "az",
            StorageUri::GitHub { .. } => "github",
        }
    }

    /// Does this scheme write weights onto the node (and so need a writable models root)?
    pub fn downloads(&self) -> bool {
        match self {
            StorageUri::Oci { .. }
            | StorageUri::HuggingFace { .. }
            | StorageUri::S3 { .. }
            | StorageUri::Gcs { .. }
            | StorageUri::Azure { .. }
            | StorageUri::GitHub { .. } => true,
            StorageUri::Local { .. } | StorageUri::Vendor { .. } | StorageUri::Pvc { .. } => false,
        }
    }

    /// How the agent makes the model available on an eligible node.
    pub fn provisioning(&self) -> Provisioning {
        match self {
            StorageUri::Local { .. } => Provisioning::VerifyLocal,
            StorageUri::Vendor { .. } => Provisioning::Nothing,
            StorageUri::Pvc { .. } => Provisioning::NotOnNodes,
            _ => Provisioning::Download,
        }
    }
}

/// The three ways a model becomes available on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Provisioning {
    /// Weights are fetched into a directory the agent owns.
    Download,
    /// Weights are already on the node; the agent checks the directory and never touches it.
    VerifyLocal,
    /// Ready without I/O (`vendor://`).
    Nothing,
    /// Never placed on nodes by the agent (`pvc://`).
    NotOnNodes,
}

/// Every part present, else the scheme's shape as the reason.
fn nonempty(parts: &[&str], shape: &str) -> Result<(), String> {
    if parts.iter().any(|p| p.is_empty()) { Err(format!("expected {shape}")) } else { Ok(()) }
}

fn parse_oci(rest: &str) -> Result<StorageUri, String> {
    let shape = "oci://n/{namespace}/b/{bucket}/o/{prefix}";
    let parts: Vec<&str> = rest.splitn(6, '/').collect();
    if parts.len() != 6 || parts[0] != "n" || parts[2] != "b" || parts[4] != "o" {
        return Err(format!("expected {shape}"));
    }
    let prefix = parts[5].trim_end_matches('/');
    nonempty(&[parts[1], parts[3], prefix], shape)?;
    Ok(StorageUri::Oci { namespace: parts[1].to_string(), bucket: parts[3].to_string(), prefix: prefix.to_string() })
}

fn parse_hf(rest: &str) -> Result<StorageUri, String> {
    let shape = "hf://{org}/{repo}[@{revision}]";
    let (id, revision) = match rest.split_once('@') {
        Some((id, rev)) => {
            nonempty(&[rev], shape)?;
            (id, rev)
        }
        None => (rest, "main"),
    };
    let (org, repo) = id.split_once('/').ok_or_else(|| format!("expected {shape}"))?;
    if repo.contains('/') {
        return Err(format!("the model id must be org/repo; expected {shape}"));
    }
    nonempty(&[org, repo], shape)?;
    Ok(StorageUri::HuggingFace { org: org.into(), repo: repo.into(), revision: revision.into() })
}

fn parse_vendor(rest: &str) -> Result<StorageUri, String> {
    let shape = "vendor://{vendor}/{type}/{path}";
    let parts: Vec<&str> = rest.splitn(3, '/').collect();
    if parts.len() != 3 {
        return Err(format!("expected {shape}"));
    }
    nonempty(&parts, shape)?;
    Ok(StorageUri::Vendor { vendor: parts[0].into(), resource_type: parts[1].into(), path: parts[2].into() })
}

fn parse_pvc(rest: &str) -> Result<StorageUri, String> {
    let shape = "pvc://[{namespace}:]{pvc}/{subpath}";
    let (head, subpath) = rest.split_once('/').ok_or_else(|| format!("expected {shape}"))?;
    let (namespace, name) = match head.split_once(':') {
        Some((ns, name)) => {
            nonempty(&[ns], shape)?;
            (Some(ns.to_string()), name)
        }
        None => (None, head),
    };
    nonempty(&[name, subpath], shape)?;
    Ok(StorageUri::Pvc { namespace, name: name.into(), subpath: subpath.into() })
}

/// `s3://{bucket}/{prefix}` and `gs://{bucket}/{prefix}`.
fn parse_bucket(scheme: &str, rest: &str) -> Result<StorageUri, String> {
    let shape = if scheme == "s3" { "s3://{bucket}/{prefix}" } else { "gs://{bucket}/{prefix}" };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    nonempty(&[bucket], shape)?;
    let (bucket, prefix) = (bucket.to_string(), prefix.trim_end_matches('/').to_string());
    Ok(if scheme == "s3" { StorageUri::S3 { bucket, prefix } } else { StorageUri::Gcs { bucket, prefix } })
}

fn parse_azure(rest: &str) -> Result<StorageUri, String> {
    let shape = "az://{account}/{container}/{prefix}";
    let parts: Vec<&str> = rest.splitn(3, '/').collect();
    if parts.len() < 2 {
        return Err(format!("expected {shape}"));
    }
    nonempty(&parts[..2], shape)?;
    Ok(StorageUri::Azure {
        account: parts[0].into(),
        container: parts[1].into(),
        prefix: parts.get(2).unwrap_or(&"").trim_end_matches('/').into(),
    })
}

fn parse_github(rest: &str) -> Result<StorageUri, String> {
    let shape = "github://{owner}/{repo}[@{revision}]";
    let (id, revision) = rest.split_once('@').unwrap_or((rest, "main"));
    let (owner, repo) = id.split_once('/').ok_or_else(|| format!("expected {shape}"))?;
    if repo.contains('/') {
        return Err(format!("expected {shape}"));
    }
    nonempty(&[owner, repo, revision], shape)?;
    Ok(StorageUri::GitHub { owner: owner.into(), repo: repo.into(), revision: revision.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(uri: &str) -> StorageUri {
        StorageUri::parse(uri).unwrap_or_else(|e| panic!("{uri}: {e}"))
    }

    fn bad(uri: &str) -> String {
        StorageUri::parse(uri).expect_err(uri).to_string()
    }

    #[test]
    fn oci() {
        assert_eq!(
            ok("oci://n/ns1/b/bucket/o/models/llama/"),
            StorageUri::Oci { namespace: "ns1".into(), bucket: "bucket".into(), prefix: "models/llama".into() }
        );
        assert!(ok("oci://n/a/b/c/o/d").downloads());
        assert!(bad("oci://n/a/b/c").contains("oci://n/{namespace}"));
        assert!(bad("oci://x/a/b/c/o/d").contains("expected"));
        assert!(bad("oci://n//b/c/o/d").contains("expected"));
    }

    #[test]
    fn hugging_face() {
        assert_eq!(
            ok("hf://meta-llama/Llama-3.1-8B"),
            StorageUri::HuggingFace { org: "meta-llama".into(), repo: "Llama-3.1-8B".into(), revision: "main".into() }
        );
        assert_eq!(
            ok("hf://org/repo@refs-pr-1"),
            StorageUri::HuggingFace { org: "org".into(), repo: "repo".into(), revision: "refs-pr-1".into() }
        );
        assert_eq!(ok("hf://a/b").provisioning(), Provisioning::Download);
        assert!(bad("hf://just-a-repo").contains("hf://{org}/{repo}"));
        assert!(bad("hf://a/b/c").contains("org/repo"));
        assert!(bad("hf://a/b@").contains("expected"));
    }

    #[test]
    fn local_vendor_pvc_do_not_download() {
        let local = ok("local:///mnt/models/example");
        assert_eq!(local, StorageUri::Local { path: "/mnt/models/example".into() });
        assert!(!local.downloads());
        assert_eq!(local.provisioning(), Provisioning::VerifyLocal);

        let vendor = ok("vendor://nvidia/nim/llama");
        assert_eq!(
            vendor,
            StorageUri::Vendor { vendor: "nvidia".into(), resource_type: "nim".into(), path: "llama".into() }
        );
        assert_eq!(vendor.provisioning(), Provisioning::Nothing);
        assert!(bad("vendor://nvidia/nim").contains("vendor://"));

        assert_eq!(
            ok("pvc://team:models-pvc/llama/8b"),
            StorageUri::Pvc { namespace: Some("team".into()), name: "models-pvc".into(), subpath: "llama/8b".into() }
        );
        let pvc = ok("pvc://models-pvc/llama");
        assert_eq!(pvc, StorageUri::Pvc { namespace: None, name: "models-pvc".into(), subpath: "llama".into() });
        assert_eq!(pvc.provisioning(), Provisioning::NotOnNodes);
        assert!(!pvc.downloads());
        assert!(bad("pvc://models-pvc").contains("pvc://"));
        assert!(bad("local://").contains("local://"));
    }

    #[test]
    fn object_stores_and_github_download() {
        assert_eq!(ok("s3://bucket/a/b/"), StorageUri::S3 { bucket: "bucket".into(), prefix: "a/b".into() });
        assert_eq!(ok("gs://bucket"), StorageUri::Gcs { bucket: "bucket".into(), prefix: "".into() });
        assert_eq!(
            ok("az://acct/cont/p"),
            StorageUri::Azure { account: "acct".into(), container: "cont".into(), prefix: "p".into() }
        );
        assert_eq!(
            ok("github://owner/repo@v1"),
            StorageUri::GitHub { owner: "owner".into(), repo: "repo".into(), revision: "v1".into() }
        );
        for uri in ["s3://b/p", "gs://b/p", "az://a/c", "github://o/r"] {
            assert!(ok(uri).downloads(), "{uri}");
            assert_eq!(ok(uri).provisioning(), Provisioning::Download);
        }
        assert!(bad("s3:///p").contains("s3://"));
        assert!(bad("az://acct").contains("az://"));
    }

    #[test]
    fn unknown_and_hostile_uris_are_clear_errors() {
        assert!(bad("ftp://x/y").contains("unknown scheme \"ftp\""));
        assert!(bad("/mnt/models/x").contains("no scheme"));
        assert!(bad("hf://a/b\0").contains("NUL"));
        assert!(bad("hf://a/b c").contains("white space"));
    }
}
