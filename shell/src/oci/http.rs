//! The HTTP layer, the stack the Hub client uses: hyper-util's client over rustls with the agent's roots
//! and CA bundle (`Network`), a connect timeout, a stall timeout on answers and body reads, bounded
//! small bodies. Through a proxy (`HTTPS_PROXY`, `NO_PROXY`, …) every connection is a `CONNECT` tunnel,
//! for `http://` endpoints too (the agent's requests carry a signature, never sent in the clear to a
//! proxy). No redirects: Object Storage sends none.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tower_service::Service;

use super::OciError;
use crate::hf::Network;

const IDLE_CONNECTIONS_PER_HOST_MAX: usize = 16;
const IDLE_CONNECTION_TIMEOUT_MS: u64 = 30_000;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Connects directly, or through a `CONNECT` tunnel when a proxy applies to the destination.
#[derive(Clone)]
pub(super) struct TunnelingConnector {
    direct: HttpConnector,
    proxies: Arc<Matcher>,
}

impl Service<Uri> for TunnelingConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<TokioIo<TcpStream>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, destination: Uri) -> Self::Future {
        let mut direct = self.direct.clone();
        let route = self.proxies.intercept(&destination);
        Box::pin(async move {
            let Some(proxy) = route else { return Ok(direct.call(destination).await?) };
            let mut tunnel = Tunnel::new(proxy.uri().clone(), direct);
            if let Some(auth) = proxy.basic_auth() {
                tunnel = tunnel.with_auth(auth.clone());
            }
            Ok(tunnel.call(destination).await?)
        })
    }
}

/// A shared client (cheap to clone; one connection pool). Bodies are whole (`Full`): Object Storage
/// requests have none, the InstancePrincipal's token request a small JSON one.
#[derive(Clone)]
pub(super) struct OciHttp {
    client: Client<HttpsConnector<TunnelingConnector>, Full<Bytes>>,
}

impl OciHttp {
    pub fn new(connect_timeout_ms: u64, network: &Network) -> Result<OciHttp, OciError> {
        network.check().map_err(|reason| OciError::BadConfig { reason })?;
        let mut direct = HttpConnector::new();
        direct.enforce_http(false);
        direct.set_connect_timeout(Some(Duration::from_millis(connect_timeout_ms)));
        direct.set_nodelay(true);
        let proxies = Matcher::builder()
            .all(network.all_proxy.clone())
            .http(network.http_proxy.clone())
            .https(network.https_proxy.clone())
            .no(network.no_proxy.clone())
            .build();
        let connector = TunnelingConnector { direct, proxies: Arc::new(proxies) };
        let tls = network.tls_config().map_err(|reason| OciError::BadConfig { reason })?;
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(IDLE_CONNECTIONS_PER_HOST_MAX)
            .pool_idle_timeout(Duration::from_millis(IDLE_CONNECTION_TIMEOUT_MS))
            .build(https);
        Ok(OciHttp { client })
    }

    /// Sends `request`; no answer head within `stall_timeout_ms` is `Stalled`.
    pub async fn send(
        &self,
        request: Request<Full<Bytes>>,
        stall_timeout_ms: u64,
        what: &str,
    ) -> Result<Response<Incoming>, OciError> {
        let answer = tokio::time::timeout(Duration::from_millis(stall_timeout_ms), self.client.request(request));
        match answer.await {
            Err(_) => Err(OciError::Stalled { what: what.to_owned(), stall_timeout_ms }),
            Ok(Err(error)) => Err(network_error(what, &error)),
            Ok(Ok(response)) => Ok(response),
        }
    }
}

fn network_error(what: &str, error: &hyper_util::client::legacy::Error) -> OciError {
    let mut reason = format!("{what}: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        reason.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    OciError::Network { reason }
}

/// The next data of `body`: `None` at its end.
pub(super) async fn next_data(
    body: &mut Incoming,
    stall_timeout_ms: u64,
    what: &str,
) -> Result<Option<Bytes>, OciError> {
    loop {
        let frame = match tokio::time::timeout(Duration::from_millis(stall_timeout_ms), body.frame()).await {
            Err(_) => return Err(OciError::Stalled { what: what.to_owned(), stall_timeout_ms }),
            Ok(None) => return Ok(None),
            Ok(Some(Err(error))) => return Err(OciError::Cut { what: what.to_owned(), reason: error.to_string() }),
            Ok(Some(Ok(frame))) => frame,
        };
        // Trailers carry nothing we use.
        if let Ok(data) = frame.into_data() {
            return Ok(Some(data));
        }
    }
}

/// A whole (small) body, at most `bytes_max` bytes.
pub(super) async fn read_body(
    mut body: Incoming,
    bytes_max: usize,
    stall_timeout_ms: u64,
    what: &str,
) -> Result<Vec<u8>, OciError> {
    let mut bytes = Vec::new();
    while let Some(data) = next_data(&mut body, stall_timeout_ms, what).await? {
        if bytes.len() + data.len() > bytes_max {
            return Err(OciError::Protocol { reason: format!("{what}: answer larger than {bytes_max} bytes") });
        }
        bytes.extend_from_slice(&data);
    }
    Ok(bytes)
}
