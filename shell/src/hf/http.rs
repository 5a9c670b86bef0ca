//! The HTTP layer: hyper-util's client over rustls, redirects followed here so that the token only ever
//! goes to the endpoint's own origin, and bodies read with a stall timeout.

use std::time::Duration;

use std::sync::Arc;

use http::header::{AUTHORIZATION, LOCATION, PROXY_AUTHORIZATION, RANGE, USER_AGENT};
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioExecutor;

use super::HfError;
use super::network::{Network, ProxyConnector, proxy_authorization};

/// Redirects followed per request (the Hub uses one, to its CDN; a renamed repo adds one).
const REDIRECTS_MAX: usize = 5;
/// Idle connections kept per host, for the many small files of a repo.
const IDLE_CONNECTIONS_PER_HOST_MAX: usize = 16;
const IDLE_CONNECTION_TIMEOUT_MS: u64 = 30_000;
const USER_AGENT_VALUE: &str = concat!("model-agent/", env!("CARGO_PKG_VERSION"));

/// A shared client (cheap to clone; one connection pool).
#[derive(Clone)]
pub(super) struct HttpClient {
    client: Client<HttpsConnector<ProxyConnector>, Empty<Bytes>>,
    proxies: Arc<Matcher>,
}

/// Scheme, lowercase host and port (default ports filled in): the unit credentials are scoped to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl Origin {
    pub fn of(uri: &Uri) -> Option<Origin> {
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        let host = uri.host()?.to_ascii_lowercase();
        Some(Origin { port: uri.port_u16().unwrap_or(default_port), scheme, host })
    }
}

/// The token and the one origin it may be sent to.
pub(super) struct Credentials<'a> {
    pub origin: &'a Origin,
    pub token: Option<&'a str>,
}

impl Credentials<'_> {
    fn token_for(&self, uri: &Uri) -> Option<&str> {
        self.token.filter(|_| Origin::of(uri).as_ref() == Some(self.origin))
    }
}

/// The bytes a ranged GET asks for: from `start` to `end` (exclusive), or to the end of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ByteRange {
    pub start: u64,
    pub end: Option<u64>,
}

impl ByteRange {
    fn header_value(self) -> String {
        match self.end {
            Some(end) => format!("bytes={}-{}", self.start, end.saturating_sub(1)),
            None => format!("bytes={}-", self.start),
        }
    }
}

/// One step of reading a body.
pub(super) enum BodyEvent {
    Data(Bytes),
    End,
    Stalled,
    Cut(String),
}

impl HttpClient {
    /// A client that goes through `network`'s proxies and trusts its roots; a CA bundle that
    /// cannot be read is the error.
    pub fn new(connect_timeout_ms: u64, network: &Network) -> Result<HttpClient, String> {
        network.check()?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(Duration::from_millis(connect_timeout_ms)));
        http.set_nodelay(true);
        let proxies = Arc::new(network.matcher());
        let connector = ProxyConnector::new(http, proxies.clone());
        let tls = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(network.tls_config()?);
        let https = tls.https_or_http().enable_http1().wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(IDLE_CONNECTIONS_PER_HOST_MAX)
            .pool_idle_timeout(Duration::from_millis(IDLE_CONNECTION_TIMEOUT_MS))
            .build(https);
        Ok(HttpClient { client, proxies })
    }

    /// GET `url` (bytes `range` when given), following redirects; the token is attached only
    /// to requests for the credentials' origin, so a CDN on another host never sees it. Returns the last
    /// answer, whatever its status, and whether the token went with it.
    pub async fn get(
        &self,
        url: Uri,
        credentials: &Credentials<'_>,
        range: Option<ByteRange>,
        stall_timeout_ms: u64,
    ) -> Result<(Response<Incoming>, bool), HfError> {
        let mut url = url;
        for _ in 0..=REDIRECTS_MAX {
            let token = credentials.token_for(&url);
            let mut request = Request::get(url.clone()).header(USER_AGENT, USER_AGENT_VALUE);
            if let Some(token) = token {
                request = request.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            if let Some(range) = range {
                request = request.header(RANGE, range.header_value());
            }
            if let Some(proxy_auth) = proxy_authorization(&self.proxies, &url) {
                request = request.header(PROXY_AUTHORIZATION, proxy_auth);
            }
            let request = request.body(Empty::new()).map_err(|e| HfError::Protocol { reason: e.to_string() })?;
            let answer = tokio::time::timeout(Duration::from_millis(stall_timeout_ms), self.client.request(request));
            let response = match answer.await {
                Err(_) => {
                    return Err(HfError::Stalled { what: format!("GET {}", url_for_humans(&url)), stall_timeout_ms });
                }
                Ok(Err(error)) => return Err(network_error(&url, &error)),
                Ok(Ok(response)) => response,
            };
            if !response.status().is_redirection() || response.status() == http::StatusCode::NOT_MODIFIED {
                return Ok((response, token.is_some()));
            }
            let location = response.headers().get(LOCATION).and_then(|l| l.to_str().ok());
            let Some(location) = location else {
                return Err(HfError::Protocol {
                    reason: format!("redirect without Location from {}", url_for_humans(&url)),
                });
            };
            url = resolve_location(&url, location)?;
        }
        Err(HfError::Protocol { reason: format!("more than {REDIRECTS_MAX} redirects") })
    }
}

/// A URL without its query (signed CDN URLs carry signatures there).
pub(super) fn url_for_humans(url: &Uri) -> String {
    format!("{}://{}{}", url.scheme_str().unwrap_or("?"), url.authority().map_or("?", |a| a.as_str()), url.path())
}

fn network_error(url: &Uri, error: &hyper_util::client::legacy::Error) -> HfError {
    let mut reason = format!("GET {}: {error}", url_for_humans(url));
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        reason.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    HfError::Network { reason }
}

/// A `Location` (absolute, scheme-relative, absolute-path or relative) against the URL that sent it.
pub(super) fn resolve_location(base: &Uri, location: &str) -> Result<Uri, HfError> {
    let scheme = base.scheme_str().unwrap_or("https");
    let authority = base.authority().map_or("", |a| a.as_str());
    let has_scheme = location.split('/').next().is_some_and(|first| first.contains(':'));
    let absolute = if has_scheme {
        location.to_owned()
    } else if let Some(rest) = location.strip_prefix("//") {
        format!("{scheme}://{rest}")
    } else if location.starts_with('/') {
        format!("{scheme}://{authority}{location}")
    } else {
        let directory = base.path().rsplit_once('/').map_or("", |(dir, _)| dir);
        format!("{scheme}://{authority}{directory}/{location}")
    };
    absolute
        .parse::<Uri>()
        .ok()
        .filter(|uri| Origin::of(uri).is_some())
        .ok_or_else(|| HfError::Protocol { reason: format!("unusable redirect or link target {location:?}") })
}

/// The next piece of `body`, or why there is none.
pub(super) async fn next_body_event(body: &mut Incoming, stall_timeout_ms: u64) -> BodyEvent {
    loop {
        let frame = match tokio::time::timeout(Duration::from_millis(stall_timeout_ms), body.frame()).await {
            Err(_) => return BodyEvent::Stalled,
            Ok(None) => return BodyEvent::End,
            Ok(Some(Err(error))) => return BodyEvent::Cut(error.to_string()),
            Ok(Some(Ok(frame))) => frame,
        };
        // Trailers carry nothing we use.
        if let Ok(data) = frame.into_data() {
            return BodyEvent::Data(data);
        }
    }
}

/// A whole (small) body, at most `bytes_max` bytes.
pub(super) async fn read_body(
    mut body: Incoming,
    bytes_max: usize,
    stall_timeout_ms: u64,
    what: &str,
) -> Result<Vec<u8>, HfError> {
    let mut bytes = Vec::new();
    loop {
        match next_body_event(&mut body, stall_timeout_ms).await {
            BodyEvent::Data(data) if bytes.len() + data.len() > bytes_max => {
                return Err(HfError::Protocol { reason: format!("{what}: answer larger than {bytes_max} bytes") });
            }
            BodyEvent::Data(data) => bytes.extend_from_slice(&data),
            BodyEvent::End => return Ok(bytes),
            BodyEvent::Stalled => return Err(HfError::Stalled { what: what.to_owned(), stall_timeout_ms }),
            BodyEvent::Cut(reason) => return Err(HfError::Network { reason: format!("{what}: {reason}") }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_resolve_against_the_sender() {
        let base: Uri = "http://hub:8080/org/m/resolve/abc/dir/f.bin?x=1".parse().unwrap();
        let resolve = |l| resolve_location(&base, l).unwrap().to_string();
        assert_eq!(resolve("https://cdn.example/a?s=1"), "https://cdn.example/a?s=1");
        assert_eq!(resolve("//cdn:9/a"), "http://cdn:9/a");
        assert_eq!(resolve("/api/x"), "http://hub:8080/api/x");
        assert_eq!(resolve("g.bin"), "http://hub:8080/org/m/resolve/abc/dir/g.bin");
        assert!(resolve_location(&base, "ftp://x/y").is_err());
    }

    #[test]
    fn the_token_goes_to_its_origin_only() {
        let origin = Origin::of(&"https://Hub.example".parse().unwrap()).unwrap();
        let credentials = Credentials { origin: &origin, token: Some("t") };
        assert_eq!(credentials.token_for(&"https://hub.example:443/api".parse().unwrap()), Some("t"));
        assert_eq!(credentials.token_for(&"http://hub.example/api".parse().unwrap()), None);
        assert_eq!(credentials.token_for(&"https://hub.example:8443/api".parse().unwrap()), None);
        assert_eq!(credentials.token_for(&"https://cdn.example/api".parse().unwrap()), None);
    }
}
