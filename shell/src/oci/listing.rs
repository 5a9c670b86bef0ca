//! ListObjects over every page: `fields=name,size,md5,etag`, then `start=<nextStartWith>` until a page
//! has none. Limits on pages, objects and page bytes; a server that does not move forward, or names an
//! object outside the prefix, is a protocol error.

use ::http::{Method, StatusCode};
use serde::Deserialize;

use super::{OciClient, OciError, encode, http};

/// Objects asked for per page (OCI's maximum).
const PAGE_OBJECTS_MAX: usize = 1000;

/// How much one listing may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListLimits {
    pub objects_max: usize,
    pub pages_max: usize,
    /// One page's JSON at most.
    pub page_bytes_max: usize,
}

impl Default for ListLimits {
    /// 100,000 objects (a model has hundreds at most), in at most 1,000 pages of at most 4 MiB.
    fn default() -> Self {
        ListLimits { objects_max: 100_000, pages_max: 1_000, page_bytes_max: 4 << 20 }
    }
}

/// One object as ListObjects reports it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct ObjectSummary {
    /// The whole object name (prefix included).
    pub name: String,
    #[serde(rename = "size")]
    pub size_bytes: u64,
    /// Base64 MD5 for objects uploaded whole; `<base64>-<parts>` for multipart uploads (not the content's).
    pub md5: Option<String>,
    pub etag: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    objects: Vec<ObjectSummary>,
    next_start_with: Option<String>,
}

impl OciClient {
    /// Every object of `bucket` whose name starts with `prefix`, in the server's (lexicographic) order.
    pub async fn list_objects(
        &self,
        bucket: &str,
        prefix: &str,
        limits: ListLimits,
    ) -> Result<Vec<ObjectSummary>, OciError> {
        let mut objects: Vec<ObjectSummary> = Vec::new();
        let mut start: Option<String> = None;
        for _ in 0..limits.pages_max {
            let page = self.list_page(bucket, prefix, start.as_deref(), limits.page_bytes_max).await?;
            if let Some(outside) = page.objects.iter().find(|o| !o.name.starts_with(prefix)) {
                let reason =
                    format!("ListObjects of {bucket:?} returned {:?}, outside prefix {prefix:?}", outside.name);
                return Err(OciError::Protocol { reason });
            }
            if objects.len() + page.objects.len() > limits.objects_max {
                let reason = format!("more than {} objects under {bucket}/{prefix}", limits.objects_max);
                return Err(OciError::Protocol { reason });
            }
            objects.extend(page.objects);
            let Some(next) = page.next_start_with else { return Ok(objects) };
            // nextStartWith names the next object: after everything listed so far.
            let floor = objects.last().map(|o| o.name.as_str()).or(start.as_deref()).unwrap_or("");
            if next.as_str() <= floor {
                let reason = format!("ListObjects of {bucket:?}: nextStartWith {next:?} does not move past {floor:?}");
                return Err(OciError::Protocol { reason });
            }
            start = Some(next);
        }
        Err(OciError::Protocol {
            reason: format!("more than {} ListObjects pages under {bucket}/{prefix}", limits.pages_max),
        })
    }

    async fn list_page(
        &self,
        bucket: &str,
        prefix: &str,
        start: Option<&str>,
        page_bytes_max: usize,
    ) -> Result<Page, OciError> {
        let path = self.objects_path(bucket);
        let what = format!("GET {path}");
        let mut query = format!("?prefix={}&limit={PAGE_OBJECTS_MAX}&fields=name%2Csize%2Cmd5%2Cetag", encode(prefix));
        if let Some(start) = start {
            query.push_str(&format!("&start={}", encode(start)));
        }
        let response = self.signed(Method::GET, format!("{path}{query}"), None, &what).await?;
        let body = self.expect(response, &[StatusCode::OK], &what).await?.into_body();
        let bytes = http::read_body(body, page_bytes_max, self.stall_timeout_ms, &what).await?;
        serde_json::from_slice(&bytes).map_err(|e| OciError::Protocol { reason: format!("{what}: {e}") })
    }
}
