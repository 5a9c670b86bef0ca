//! How connections leave the node: through the proxies curl's variables name (`HTTPS_PROXY`,
//! `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`), and trusting the system's roots (or `SSL_CERT_FILE`'s)
//! plus an operator's CA bundle (`--ca-bundle`).

use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use http::header::HeaderValue;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::net::TcpStream;
use tower_service::Service;

/// Certificates read from a CA bundle at most (a bundle of every public root is about 150).
const CA_BUNDLE_CERTIFICATES_MAX: usize = 4_096;

/// Proxies and extra trust, the same for every request of a download.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Network {
    pub all_proxy: String,
    pub http_proxy: String,
    pub https_proxy: String,
    /// Hosts, domains (`.example.com`), IPs or CIDRs reached directly; `*` for all.
    pub no_proxy: String,
    /// PEM certificates trusted beside the system's roots.
    pub ca_bundle: Option<PathBuf>,
}

impl fmt::Debug for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Network")
            .field("all_proxy", &without_userinfo(&self.all_proxy))
            .field("http_proxy", &without_userinfo(&self.http_proxy))
            .field("https_proxy", &without_userinfo(&self.https_proxy))
            .field("no_proxy", &self.no_proxy)
            .field("ca_bundle", &self.ca_bundle)
            .finish()
    }
}

impl Network {
    /// The proxy variables as curl reads them (upper case first), and `ca_bundle`.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>, ca_bundle: Option<PathBuf>) -> Network {
        let first = |names: [&str; 2]| names.iter().find_map(|n| env(n)).unwrap_or_default();
        Network {
            all_proxy: first(["ALL_PROXY", "all_proxy"]),
            http_proxy: first(["HTTP_PROXY", "http_proxy"]),
            https_proxy: first(["HTTPS_PROXY", "https_proxy"]),
            no_proxy: first(["NO_PROXY", "no_proxy"]),
            ca_bundle,
        }
    }

    /// Only `http://` proxies are supported (as a URL or a bare `host:port`): an `https://` or
    /// `socks5://` one would otherwise be spoken to in plain HTTP, credentials and all.
    pub fn check(&self) -> Result<(), String> {
        let named =
            [("ALL_PROXY", &self.all_proxy), ("HTTP_PROXY", &self.http_proxy), ("HTTPS_PROXY", &self.https_proxy)];
        for (name, proxy) in named {
            if let Some((scheme, _)) = proxy.split_once("://")
                && !scheme.eq_ignore_ascii_case("http")
            {
                let shown = without_userinfo(proxy);
                return Err(format!(
                    "{name}={shown}: only http:// proxies are supported (https is tunnelled through them)"
                ));
            }
        }
        Ok(())
    }

    /// Why some of the system's roots (or `SSL_CERT_FILE`'s) could not be loaded, for the log.
    pub fn root_certificate_errors() -> Vec<String> {
        rustls_native_certs::load_native_certs().errors.iter().map(|e| e.to_string()).collect()
    }

    pub(super) fn matcher(&self) -> Matcher {
        let builder = Matcher::builder().all(self.all_proxy.clone()).http(self.http_proxy.clone());
        builder.https(self.https_proxy.clone()).no(self.no_proxy.clone()).build()
    }

    /// The system's roots (rustls-native-certs: `SSL_CERT_FILE` or `SSL_CERT_DIR` replace them, as
    /// OpenSSL's do) and the CA bundle's certificates.
    pub(crate) fn tls_config(&self) -> Result<rustls::ClientConfig, String> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        if let Some(path) = &self.ca_bundle {
            for certificate in read_ca_bundle(path)? {
                roots.add(certificate).map_err(|e| format!("CA bundle {}: {e}", path.display()))?;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(config)
    }
}

/// Every certificate of a PEM file; an unreadable file or one without a certificate is an error.
pub fn read_ca_bundle(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let what = || format!("CA bundle {}", path.display());
    let certificates = CertificateDer::pem_file_iter(path).map_err(|e| format!("{}: {e}", what()))?;
    let certificates: Vec<_> = certificates
        .take(CA_BUNDLE_CERTIFICATES_MAX + 1)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", what()))?;
    match certificates.len() {
        0 => Err(format!("{}: no PEM certificate in it", what())),
        n if n > CA_BUNDLE_CERTIFICATES_MAX => {
            Err(format!("{}: more than {CA_BUNDLE_CERTIFICATES_MAX} certificates", what()))
        }
        _ => Ok(certificates),
    }
}

/// `http://user:secret@proxy:3128` as `http://proxy:3128`: proxy credentials are never logged.
fn without_userinfo(proxy: &str) -> String {
    match proxy.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", rest.rsplit_once('@').map_or(rest, |(_, host)| host)),
        None => proxy.rsplit_once('@').map_or(proxy, |(_, host)| host).to_owned(),
    }
}

/// The TCP connector beneath TLS: straight to the destination; or, when a proxy takes it, a
/// CONNECT tunnel through the proxy for https (TLS then runs end to end inside it), or a
/// connection to the proxy itself for http (hyper then sends the absolute URL).
#[derive(Clone)]
pub(super) struct ProxyConnector {
    direct: HttpConnector,
    proxies: Arc<Matcher>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl ProxyConnector {
    pub fn new(direct: HttpConnector, proxies: Arc<Matcher>) -> ProxyConnector {
        ProxyConnector { direct, proxies }
    }
}

impl Service<Uri> for ProxyConnector {
    type Response = ProxiedStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<ProxiedStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, destination: Uri) -> Self::Future {
        let mut direct = self.direct.clone();
        let route = self.proxies.intercept(&destination);
        Box::pin(async move {
            let Some(proxy) = route else {
                return Ok(ProxiedStream { io: direct.call(destination).await?, absolute_form: false });
            };
            if destination.scheme() == Some(&http::uri::Scheme::HTTPS) {
                let mut tunnel = Tunnel::new(proxy.uri().clone(), direct);
                if let Some(auth) = proxy.basic_auth() {
                    tunnel = tunnel.with_auth(auth.clone());
                }
                return Ok(ProxiedStream { io: tunnel.call(destination).await?, absolute_form: false });
            }
            Ok(ProxiedStream { io: direct.call(proxy.uri().clone()).await?, absolute_form: true })
        })
    }
}

/// The `Proxy-Authorization` an http request sent to a proxy carries (a tunnel sends its own).
pub(super) fn proxy_authorization(proxies: &Matcher, destination: &Uri) -> Option<HeaderValue> {
    if destination.scheme() != Some(&http::uri::Scheme::HTTP) {
        return None;
    }
    proxies.intercept(destination)?.basic_auth().cloned()
}

/// A TCP stream that tells hyper whether it leads to an http proxy.
pub(super) struct ProxiedStream {
    io: TokioIo<TcpStream>,
    absolute_form: bool,
}

impl Connection for ProxiedStream {
    fn connected(&self) -> Connected {
        self.io.connected().proxy(self.absolute_form)
    }
}

impl Read for ProxiedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl Write for ProxiedStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_credentials_are_not_in_debug_output() {
        let env = |n: &str| (n == "https_proxy").then(|| "http://user:s3cret@proxy:3128".to_owned());
        let network = Network::from_env(&env, None);
        assert_eq!(network.https_proxy, "http://user:s3cret@proxy:3128");
        let shown = format!("{network:?}");
        assert!(shown.contains("http://proxy:3128") && !shown.contains("s3cret"), "{shown}");
        assert_eq!(without_userinfo("u:p@proxy:1"), "proxy:1");
    }

    #[test]
    fn only_http_proxies_are_accepted() {
        let with = |https_proxy: &str| Network { https_proxy: https_proxy.into(), ..Network::default() }.check();
        assert!(with("").is_ok() && with("http://p:3128").is_ok() && with("p:3128").is_ok());
        let err = with("https://u:secret@p:443").unwrap_err();
        assert!(err.contains("HTTPS_PROXY=https://p:443") && !err.contains("secret"), "{err}");
        assert!(with("socks5://p:1080").is_err());
    }

    #[test]
    fn upper_case_variables_win_and_no_proxy_bypasses() {
        let env = |n: &str| match n {
            "HTTP_PROXY" => Some("http://upper:1".to_owned()),
            "http_proxy" => Some("http://lower:1".to_owned()),
            "NO_PROXY" => Some("direct.example, 10.0.0.0/8".to_owned()),
            _ => None,
        };
        let matcher = Network::from_env(&env, None).matcher();
        let proxied = |url: &str| matcher.intercept(&url.parse().unwrap()).map(|i| i.uri().to_string());
        assert_eq!(proxied("http://hub.example/x").as_deref(), Some("http://upper:1/"));
        assert_eq!(proxied("http://a.direct.example/x"), None);
        assert_eq!(proxied("http://10.1.2.3/x"), None);
        assert_eq!(proxied("https://hub.example/x"), None, "HTTP_PROXY is for http only");
    }

    #[test]
    fn a_bad_ca_bundle_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("ca-bundle-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        assert!(read_ca_bundle(&empty).unwrap_err().contains("no PEM certificate"));
        let missing = dir.join("missing.pem");
        assert!(read_ca_bundle(&missing).unwrap_err().contains("missing.pem"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
