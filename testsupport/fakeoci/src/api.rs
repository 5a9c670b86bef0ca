//! The Object Storage operations served: GetNamespace, ListObjects, HeadObject, GetObject; errors as OCI
//! writes them (`{"code", "message"}` JSON with the status).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::header::{CONTENT_TYPE, RANGE};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::Shared;
use crate::fixtures::StoredObject;
use crate::serve::{ObjectRequest, object_response};

/// OCI's cap on `limit` (and its default).
pub(crate) const LIST_LIMIT_MAX: usize = 1000;
/// Every object was "created" at this instant (a fixed time keeps answers reproducible).
pub(crate) const CREATED_UNIX_S: u64 = 1_700_000_000;
const CREATED_RFC3339: &str = "2023-11-14T22:13:20.000Z";
const FIELDS: [&str; 8] =
    ["name", "size", "etag", "timeCreated", "md5", "timeModified", "storageTier", "archivalState"];

/// An error answer as OCI sends it.
pub(crate) fn oci_error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, [(CONTENT_TYPE, "application/json")], json!({ "code": code, "message": message }).to_string())
        .into_response()
}

/// An error not yet turned into its answer (small, for `Result`s).
pub(crate) struct OciError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl IntoResponse for OciError {
    fn into_response(self) -> Response {
        oci_error(self.status, self.code, &self.message)
    }
}

fn bucket_not_found(shared: &Shared, bucket: &str) -> OciError {
    let message = format!(
        "Either the bucket named '{bucket}' does not exist in the namespace '{}' or you are not authorized to access it",
        shared.config.namespace
    );
    OciError { status: StatusCode::NOT_FOUND, code: "BucketNotFound", message }
}

fn invalid_parameter(message: &str) -> OciError {
    OciError { status: StatusCode::BAD_REQUEST, code: "InvalidParameter", message: message.to_owned() }
}

/// The objects of `bucket` in namespace `namespace`, or the 404 OCI answers (for a wrong namespace too).
fn bucket_objects<'a>(
    shared: &'a Shared,
    namespace: &str,
    bucket: &str,
) -> Result<&'a BTreeMap<String, Arc<StoredObject>>, OciError> {
    let found = (namespace == shared.config.namespace).then(|| shared.buckets.get(bucket)).flatten();
    found.ok_or_else(|| bucket_not_found(shared, bucket))
}

/// `GET /n/`: the tenancy's namespace, as a JSON string.
pub(crate) async fn get_namespace(State(shared): State<Arc<Shared>>) -> Response {
    Json(Value::String(shared.config.namespace.clone())).into_response()
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListQuery {
    prefix: Option<String>,
    start: Option<String>,
    end: Option<String>,
    start_after: Option<String>,
    limit: Option<String>,
    delimiter: Option<String>,
    fields: Option<String>,
}

/// What one ListObjects page asks for, checked.
struct ListRequest {
    prefix: String,
    /// Inclusive lower bound: the larger of `start` and `prefix`.
    lower: String,
    end: Option<String>,
    start_after: Option<String>,
    limit: usize,
    fields: BTreeSet<String>,
}

fn list_request(query: ListQuery, page_size: usize) -> Result<ListRequest, OciError> {
    if query.delimiter.is_some() {
        return Err(invalid_parameter("delimiter is not supported by this fake"));
    }
    let limit = match query.limit.as_deref().map(str::parse::<usize>) {
        None => LIST_LIMIT_MAX,
        Some(Ok(limit)) if (1..=LIST_LIMIT_MAX).contains(&limit) => limit,
        Some(_) => return Err(invalid_parameter("limit must be an integer from 1 to 1000")),
    };
    let mut fields = BTreeSet::from(["name".to_owned()]);
    for field in query.fields.as_deref().unwrap_or("").split(',').map(str::trim).filter(|f| !f.is_empty()) {
        if !FIELDS.contains(&field) {
            return Err(invalid_parameter(&format!("unknown field '{field}'")));
        }
        fields.insert(field.to_owned());
    }
    let prefix = query.prefix.unwrap_or_default();
    let lower = query.start.filter(|start| *start > prefix).unwrap_or_else(|| prefix.clone());
    let limit = limit.min(page_size.max(1));
    Ok(ListRequest { prefix, lower, end: query.end, start_after: query.start_after, limit, fields })
}

/// `GET /n/{ns}/b/{bucket}/o`: one page of names in lexicographic order, `nextStartWith` when more follow.
pub(crate) async fn list_objects(
    State(shared): State<Arc<Shared>>,
    Path((namespace, bucket)): Path<(String, String)>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let objects = match bucket_objects(&shared, &namespace, &bucket) {
        Ok(objects) => objects,
        Err(error) => return error.into_response(),
    };
    let query = match query {
        Ok(Query(query)) => query,
        Err(rejection) => return invalid_parameter(&rejection.body_text()).into_response(),
    };
    let request = match list_request(query, shared.config.list_page_size) {
        Ok(request) => request,
        Err(error) => return error.into_response(),
    };
    let mut matching = objects
        .range::<str, _>((Bound::Included(request.lower.as_str()), Bound::Unbounded))
        .filter(|(name, _)| request.start_after.as_deref().is_none_or(|after| name.as_str() > after))
        .take_while(|(name, _)| name.starts_with(&request.prefix))
        .take_while(|(name, _)| request.end.as_deref().is_none_or(|end| name.as_str() < end));
    let page: Vec<Value> = matching.by_ref().take(request.limit).map(|(_, o)| summary(o, &request.fields)).collect();
    let mut body = json!({ "objects": page });
    if let Some((next, _)) = matching.next() {
        body["nextStartWith"] = Value::String(next.clone());
    }
    Json(body).into_response()
}

/// One `ObjectSummary` with the requested fields.
fn summary(object: &StoredObject, fields: &BTreeSet<String>) -> Value {
    let mut entry = Map::new();
    for field in fields {
        let value = match field.as_str() {
            "name" => json!(object.name),
            "size" => json!(object.size_bytes()),
            "etag" => json!(object.etag),
            "md5" => json!(object.listed_md5),
            "timeCreated" | "timeModified" => json!(CREATED_RFC3339),
            "storageTier" => json!("Standard"),
            _ => continue,
        };
        entry.insert(field.clone(), value);
    }
    Value::Object(entry)
}

/// `HEAD|GET /n/{ns}/b/{bucket}/o/{object}`.
pub(crate) async fn object(
    State(shared): State<Arc<Shared>>,
    Path((namespace, bucket, name)): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let objects = match bucket_objects(&shared, &namespace, &bucket) {
        Ok(objects) => objects,
        Err(error) => return error.into_response(),
    };
    let Some(object) = objects.get(&name) else {
        let message = format!("The object '{name}' was not found in the bucket '{bucket}'");
        return oci_error(StatusCode::NOT_FOUND, "ObjectNotFound", &message);
    };
    let range = headers.get(RANGE).and_then(|v| v.to_str().ok());
    object_response(&shared, ObjectRequest { bucket: &bucket, object, head: method == Method::HEAD, range })
}

pub(crate) async fn not_found() -> Response {
    oci_error(StatusCode::NOT_FOUND, "NotFound", "The requested resource is not served by this fake")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_requests_are_checked_like_oci() {
        let query = |limit: Option<&str>, fields: Option<&str>| ListQuery {
            limit: limit.map(str::to_owned),
            fields: fields.map(str::to_owned),
            prefix: Some("m/".into()),
            start: Some("a".into()),
            ..ListQuery::default()
        };
        let request = list_request(query(Some("5"), Some("name,size,md5")), 3).ok().unwrap();
        assert_eq!((request.limit, request.lower.as_str()), (3, "m/"));
        assert_eq!(request.fields.len(), 3);
        assert!(list_request(query(Some("0"), None), 3).is_err());
        assert!(list_request(query(Some("1001"), None), 3).is_err());
        assert!(list_request(query(None, Some("name,owner")), 3).is_err());
    }
}
