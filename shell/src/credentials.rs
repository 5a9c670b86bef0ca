//! The Hub token for one model, in OME's order (first hit wins): the Secret named by
//! `spec.storage.key` (in the model's namespace; the agent's for a ClusterBaseModel), data key
//! `spec.storage.parameters.secretKey` (default `token`); then `parameters.token`; then the
//! agent's `HF_TOKEN`. Read at each attempt, never kept, never given to the core or a trace.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use serde::Deserialize;

use model_agent_core::{Kind, ModelKey};

use crate::kubeio::{LIVE_READ_TIMEOUT, model_resource};

/// Only the fields the token needs: the rest of a tenant's spec is skipped, never built.
#[derive(Debug, Default, Deserialize)]
struct AuthObject {
    #[serde(default)]
    metadata: AuthMeta,
    #[serde(default)]
    spec: AuthSpec,
}

#[derive(Debug, Default, Deserialize)]
struct AuthMeta {
    #[serde(default)]
    uid: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct AuthSpec {
    #[serde(default)]
    storage: Option<AuthStorage>,
    #[serde(default, rename = "modelFormat")]
    model_format: Option<NameOnly>,
    #[serde(default, rename = "additionalMetadata")]
    additional_metadata: Option<std::collections::BTreeMap<String, serde_json::Value>>,
}

#[derive(Debug, Default, Deserialize)]
struct NameOnly {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct AuthStorage {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    parameters: Option<AuthParameters>,
}

/// `spec.storage.parameters`: short strings only, so a tenant's megabyte of parameters is parsed
/// borrowed and never copied.
type AuthParameters = std::collections::BTreeMap<String, ShortText>;

fn parameter(parameters: &AuthParameters, name: &str) -> Option<String> {
    parameters.get(name).and_then(|v| v.0.clone()).filter(|v| !v.is_empty())
}

/// A parameter's value when it is a string of at most `PARAMETER_BYTES_MAX`; anything else
/// (longer, a number, an object) is consumed without being kept.
#[derive(Debug, Default)]
struct ShortText(Option<String>);

const PARAMETER_BYTES_MAX: usize = 4096;

impl<'de> Deserialize<'de> for ShortText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<ShortText, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ShortText;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ShortText, E> {
                Ok(ShortText((v.len() <= PARAMETER_BYTES_MAX).then(|| v.to_string())))
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<ShortText, E> {
                Ok(ShortText(None))
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<ShortText, E> {
                Ok(ShortText(None))
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<ShortText, E> {
                Ok(ShortText(None))
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<ShortText, E> {
                Ok(ShortText(None))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<ShortText, E> {
                Ok(ShortText(None))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ShortText, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(ShortText(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ShortText, A::Error> {
                while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(ShortText(None))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Where the token comes from, read from the live object (`uid` must still be its uid).
#[derive(Debug, PartialEq, Eq)]
pub struct TokenSource {
    pub secret: Option<(String, String, String)>,
    pub inline: Option<String>,
}

fn token_source(object: AuthObject, key: &ModelKey, uid: &str, agent_namespace: &str) -> Result<TokenSource, String> {
    if object.metadata.uid.as_deref() != Some(uid) {
        return Err(format!("{key} uid {uid} is gone (its token cannot be read)"));
    }
    let storage = object.spec.storage.unwrap_or_default();
    let parameters = storage.parameters.unwrap_or_default();
    let namespace = match key.kind {
        Kind::BaseModel => key.namespace.to_string(),
        Kind::ClusterBaseModel => agent_namespace.to_string(),
    };
    let data_key = parameter(&parameters, "secretKey").unwrap_or_else(|| "token".into());
    let secret = storage.key.filter(|k| !k.is_empty()).map(|name| (namespace, name, data_key));
    Ok(TokenSource { secret, inline: parameter(&parameters, "token") })
}

/// The token for `key` (uid `uid`), or `None` when nothing names one. A Secret that is named
/// but cannot be read is an error that says which: a missing Secret or key, or the RBAC binding
/// the agent lacks.
pub async fn hf_token(
    client: &Client,
    key: &ModelKey,
    uid: &str,
    agent_namespace: &str,
) -> Result<Option<String>, String> {
    let source = token_source(live_auth_object(client, key).await?, key, uid, agent_namespace)?;
    if let Some((namespace, name, data_key)) = &source.secret {
        return secret_value(client, namespace, name, data_key).await.map(Some);
    }
    Ok(source.inline.or_else(|| std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty())))
}

/// What an object store download needs from the live model (the same uid): its string
/// parameters, and the whole Secret `spec.storage.key` names (in the model's namespace, the
/// agent's for a ClusterBaseModel) as text. Values are never logged.
pub async fn store_auth(
    client: &Client,
    key: &ModelKey,
    uid: &str,
    agent_namespace: &str,
) -> Result<crate::store::StoreAuth, String> {
    let object = live_auth_object(client, key).await?;
    let model_format = object.spec.model_format.as_ref().and_then(|f| f.name.clone());
    let metadata = object.spec.additional_metadata.as_ref();
    let metadata_type = metadata.and_then(|m| m.get("type")).and_then(|t| t.as_str()).map(str::to_string);
    let (parameters, secret) = store_source(object, key, uid, agent_namespace)?;
    let mut auth = crate::store::StoreAuth { parameters, model_format, metadata_type, ..Default::default() };
    if let Some((namespace, name)) = secret {
        auth.secret = secret_data(client, &namespace, &name).await?;
        auth.secret_name = Some(format!("{namespace}/{name}"));
    }
    Ok(auth)
}

type Parameters = std::collections::BTreeMap<String, String>;

fn store_source(
    object: AuthObject,
    key: &ModelKey,
    uid: &str,
    agent_namespace: &str,
) -> Result<(Parameters, Option<(String, String)>), String> {
    if object.metadata.uid.as_deref() != Some(uid) {
        return Err(format!("{key} uid {uid} is gone (its credentials cannot be read)"));
    }
    let storage = object.spec.storage.unwrap_or_default();
    let p = storage.parameters.unwrap_or_default();
    let parameters: Parameters = p.into_iter().filter_map(|(k, v)| v.0.map(|v| (k, v))).collect();
    let namespace = match key.kind {
        Kind::BaseModel => key.namespace.to_string(),
        Kind::ClusterBaseModel => agent_namespace.to_string(),
    };
    Ok((parameters, storage.key.filter(|k| !k.is_empty()).map(|name| (namespace, name))))
}

/// Every key of a Secret, as text (a value that is not UTF-8 is an error naming its key).
async fn secret_data(client: &Client, namespace: &str, name: &str) -> Result<Parameters, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let got = tokio::time::timeout(LIVE_READ_TIMEOUT, api.get(name))
        .await
        .map_err(|_| format!("reading Secret {namespace}/{name} timed out"))?;
    let secret = got.map_err(|e| secret_error(namespace, name, &e))?;
    let mut data = Parameters::new();
    for (k, v) in secret.data.unwrap_or_default() {
        let text = String::from_utf8(v.0).map_err(|_| format!("Secret {namespace}/{name} key {k:?} is not text"))?;
        data.insert(k, text.trim().to_string());
    }
    Ok(data)
}

async fn live_auth_object(client: &Client, key: &ModelKey) -> Result<AuthObject, String> {
    use kube::core::{DynamicObject, Resource, params::GetParams};
    let resource = model_resource(key.kind);
    let namespace = match key.kind {
        Kind::ClusterBaseModel => None,
        Kind::BaseModel => Some(key.namespace.as_ref()),
    };
    let path = DynamicObject::url_path(&resource, namespace);
    let request =
        kube::core::Request::new(path).get(&key.name, &GetParams::default()).map_err(|e| format!("GET {key}: {e}"))?;
    let text = tokio::time::timeout(LIVE_READ_TIMEOUT, client.request_text(request))
        .await
        .map_err(|_| format!("GET {key} (for its token) timed out"))?
        .map_err(|e| format!("GET {key} (for its token): {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("GET {key} (for its token): {e}"))
}

async fn secret_value(client: &Client, namespace: &str, name: &str, data_key: &str) -> Result<String, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let got = tokio::time::timeout(LIVE_READ_TIMEOUT, api.get(name))
        .await
        .map_err(|_| format!("reading Secret {namespace}/{name} timed out"))?;
    let secret = got.map_err(|e| secret_error(namespace, name, &e))?;
    let value = secret.data.as_ref().and_then(|d| d.get(data_key)).map(|v| v.0.clone());
    let value = value
        .ok_or(format!("Secret {namespace}/{name} has no key {data_key:?} (spec.storage.parameters.secretKey)"))?;
    let token =
        String::from_utf8(value).map_err(|_| format!("Secret {namespace}/{name} key {data_key:?} is not text"))?;
    Ok(token.trim().to_string())
}

fn secret_error(namespace: &str, name: &str, error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if status.code == 403 => format!(
            "the agent may not read Secret {namespace}/{name}: add a RoleBinding in namespace {namespace} granting \
             the agent's ServiceAccount get on secrets (deploy/optional/secrets-in-namespace.yaml)"
        ),
        kube::Error::Api(status) if status.code == 404 => {
            format!("Secret {namespace}/{name} (spec.storage.key) not found")
        }
        other => format!("reading Secret {namespace}/{name}: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(json: &str) -> AuthObject {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn the_secret_comes_first_in_the_model_s_namespace_or_the_agent_s() {
        let o = r#"{"metadata":{"uid":"u"},"spec":{"storage":{"key":"hf","parameters":{"secretKey":"tk","token":"inline","blob":[1,2]}}}}"#;
        let base = ModelKey::namespaced("team", "m");
        let s = token_source(object(o), &base, "u", "ome").unwrap();
        assert_eq!(s.secret, Some(("team".into(), "hf".into(), "tk".into())));
        assert_eq!(s.inline.as_deref(), Some("inline"));
        let s = token_source(object(o), &ModelKey::cluster("m"), "u", "ome").unwrap();
        assert_eq!(s.secret.unwrap().0, "ome");
    }

    #[test]
    fn the_data_key_defaults_to_token_and_an_inline_token_is_second() {
        let o = r#"{"metadata":{"uid":"u"},"spec":{"storage":{"key":"hf"}}}"#;
        assert_eq!(token_source(object(o), &ModelKey::cluster("m"), "u", "ome").unwrap().secret.unwrap().2, "token");
        let o = r#"{"metadata":{"uid":"u"},"spec":{"storage":{"parameters":{"token":"t"}}}}"#;
        let s = token_source(object(o), &ModelKey::cluster("m"), "u", "ome").unwrap();
        assert_eq!((s.secret, s.inline.as_deref()), (None, Some("t")));
        let o = r#"{"metadata":{"uid":"u"},"spec":{}}"#;
        assert_eq!(
            token_source(object(o), &ModelKey::cluster("m"), "u", "ome").unwrap(),
            TokenSource { secret: None, inline: None }
        );
    }

    #[test]
    fn a_store_gets_its_string_parameters_and_its_secret_s_place() {
        let long = "x".repeat(PARAMETER_BYTES_MAX + 1);
        let o = &format!(
            r#"{{"metadata":{{"uid":"u"}},"spec":{{"storage":{{"key":"s3","parameters":{{"endpoint":"http://x","region":"r","secretKey":"sa.json","n":[1,{{"a":2}}],"blob":"{long}","t":true}}}}}}}}"#
        );
        let (parameters, secret) = store_source(object(o), &ModelKey::namespaced("team", "m"), "u", "ome").unwrap();
        let got: Vec<(&str, &str)> = parameters.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, vec![("endpoint", "http://x"), ("region", "r"), ("secretKey", "sa.json")]);
        assert_eq!(secret, Some(("team".into(), "s3".into())));
        let (_, secret) = store_source(object(o), &ModelKey::cluster("m"), "u", "ome").unwrap();
        assert_eq!(secret.unwrap().0, "ome");
        assert!(store_source(object(o), &ModelKey::cluster("m"), "v", "ome").unwrap_err().contains("gone"));
    }

    #[test]
    fn another_uid_under_the_name_gives_no_token() {
        let o = r#"{"metadata":{"uid":"other"},"spec":{"storage":{"parameters":{"token":"t"}}}}"#;
        assert!(token_source(object(o), &ModelKey::cluster("m"), "u", "ome").unwrap_err().contains("gone"));
    }
}
