//! Downloads through a forward proxy and over TLS with an operator's CA. The proxy and the TLS
//! front are the tests' own (the one seam: a proxy and a certificate authority), each checked
//! with curl, an independent client, first.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::tests::{REPO, Root, assert_all_files, finished, hub, hub_with, job, opts, run};
use crate::hf::Network;

/// Bytes of a request head the proxy reads at most.
const HEAD_BYTES_MAX: usize = 64 << 10;

/// Serves `serve` for each connection accepted on a loopback port, on a runtime of its own.
fn serve_on_own_runtime<F, Fut>(serve: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        runtime.block_on(async move {
            let listener = TcpListener::from_std(listener).unwrap();
            let serve = Arc::new(serve);
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn((serve.clone())(stream));
            }
        });
    });
    addr
}

/// A forward proxy: CONNECT tunnels, and absolute-form requests relayed in origin form. Records
/// each request line with its `Proxy-Authorization`.
struct Proxy {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    fn start() -> Proxy {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let addr = serve_on_own_runtime(move |client| {
            let log = log.clone();
            async move {
                if let Err(e) = relay(client, &log).await {
                    eprintln!("test proxy: {e}");
                }
            }
        });
        Proxy { url: format!("http://{addr}"), seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// The head of a request (through its blank line) and the bytes read after it.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = bytes.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&bytes).into_owned(), rest));
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 || bytes.len() > HEAD_BYTES_MAX {
            return Err(std::io::Error::other("no whole request head"));
        }
        bytes.extend_from_slice(&buf[..n]);
    }
}

async fn relay(mut client: TcpStream, seen: &Mutex<Vec<String>>) -> std::io::Result<()> {
    let (head, rest) = read_head(&mut client).await?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let mut headers: Vec<&str> = lines.filter(|l| !l.is_empty()).collect();
    let auth = headers
        .iter()
        .find_map(|h| h.strip_prefix("proxy-authorization: ").or(h.strip_prefix("Proxy-Authorization: ")));
    let mut parts = request_line.split(' ');
    let (method, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    seen.lock().unwrap().push(format!("{method} {target} auth={}", auth.unwrap_or("-")));
    if method == "CONNECT" {
        let mut upstream = TcpStream::connect(target).await?;
        client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
        return Ok(());
    }
    let uri: http::Uri = target.parse().map_err(std::io::Error::other)?;
    let authority = uri.authority().ok_or_else(|| std::io::Error::other("not absolute-form"))?.to_string();
    let mut upstream = TcpStream::connect(authority).await?;
    headers.retain(|h| !h.to_ascii_lowercase().starts_with("proxy-authorization:"));
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let forwarded = format!("{method} {path} HTTP/1.1\r\n{}\r\n\r\n", headers.join("\r\n"));
    upstream.write_all(forwarded.as_bytes()).await?;
    upstream.write_all(&rest).await?;
    // Later requests on this connection (same destination: hyper pools by it) pass as they are.
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA and a server certificate it signed for 127.0.0.1, in `dir`: (ca.crt, server.crt, server.key).
fn certificate_authority(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let ca = ["-keyout", &path("ca.key"), "-out", &path("ca.crt")];
    openssl(&[&["req", "-x509"][..], &ec, &["-days", "1", "-subj", "/CN=model-agent test CA"], &ca].concat());
    let csr = ["-keyout", &path("server.key"), "-out", &path("server.csr")];
    openssl(&[&["req"][..], &ec, &["-subj", "/CN=127.0.0.1"], &csr].concat());
    std::fs::write(dir.join("ext"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n").unwrap();
    let sign = ["-CA", &path("ca.crt"), "-CAkey", &path("ca.key"), "-CAcreateserial", "-days", "1"];
    let (csr, out, ext) = (path("server.csr"), path("server.crt"), path("ext"));
    openssl(&[&["x509", "-req", "-in", &csr][..], &sign, &["-out", &out, "-extfile", &ext]].concat());
    (dir.join("ca.crt"), dir.join("server.crt"), dir.join("server.key"))
}

/// TLS in front of `upstream` (plain http) with `cert` and `key`; returns its https URL.
fn tls_front(upstream: SocketAddr, cert: &Path, key: &Path) -> String {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer> = CertificateDer::pem_file_iter(cert).unwrap().map(Result::unwrap).collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let addr = serve_on_own_runtime(move |client| {
        let acceptor = acceptor.clone();
        async move {
            // A client that rejects the certificate ends the handshake: nothing to relay.
            let Ok(mut tls) = acceptor.accept(client).await else { return };
            if let Ok(mut plain) = TcpStream::connect(upstream).await {
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            }
        }
    });
    format!("https://{addr}")
}

fn hub_addr(endpoint: &str) -> SocketAddr {
    endpoint.trim_start_matches("http://").trim_end_matches('/').parse().unwrap()
}

fn curl(args: &[&str]) -> String {
    let out = Command::new("curl").args(["-sS", "--fail", "--max-time", "10"]).args(args).output().expect("curl");
    assert!(out.status.success(), "curl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn curl_goes_through_the_test_proxy_and_trusts_the_test_ca() {
    let hub = hub();
    let proxy = Proxy::start();
    let revision = format!("{}/api/models/{REPO}/revision/main", hub.endpoint());
    assert!(curl(&["-x", &proxy.url, &revision]).contains("\"sha\""));
    let root = Root::new("curl-ca");
    let (ca, cert, key) = certificate_authority(&root.0);
    let front = tls_front(hub_addr(hub.endpoint()), &cert, &key);
    let over_tls = format!("{front}/api/models/{REPO}/revision/main");
    assert!(curl(&["--cacert", ca.to_str().unwrap(), &over_tls]).contains("\"sha\""));
    assert!(curl(&["--cacert", ca.to_str().unwrap(), "-x", &proxy.url, &over_tls]).contains("\"sha\""));
    let seen = proxy.seen();
    assert!(seen[0].starts_with(&format!("GET {revision}")), "{seen:?}");
    assert!(seen[1].starts_with(&format!("CONNECT {}", front.trim_start_matches("https://"))), "{seen:?}");
}

#[tokio::test]
async fn a_download_goes_through_the_http_proxy_with_its_credentials_unless_no_proxy_says_otherwise() {
    let hub = hub();
    let proxy = Proxy::start();
    let root = Root::new("proxied");
    let with_user = proxy.url.replace("http://", "http://user:pass@");
    let network = Network { http_proxy: with_user, ..Network::default() };
    let (ended, _) = run(job(&root, "main"), &super::Options { network: network.clone(), ..opts(&hub) }).await;
    finished(ended);
    assert_all_files(&hub, &root.dest(), "main");
    let seen = proxy.seen();
    let (api, cdn) = (format!("GET {}/api/", hub.endpoint()), format!("GET {}/", hub.cdn_endpoint()));
    assert!(seen.iter().any(|s| s.starts_with(&api)), "the Hub's API through the proxy: {seen:?}");
    assert!(seen.iter().any(|s| s.starts_with(&cdn)), "the CDN through the proxy: {seen:?}");
    assert!(seen.iter().all(|s| s.ends_with("auth=Basic dXNlcjpwYXNz")), "credentials on every request: {seen:?}");
    let direct = Root::new("no-proxy");
    let network = Network { no_proxy: "127.0.0.1".into(), ..network };
    let (ended, _) = run(job(&direct, "main"), &super::Options { network, ..opts(&hub) }).await;
    finished(ended);
    assert_eq!(proxy.seen().len(), seen.len(), "NO_PROXY: nothing more through the proxy");
}

#[tokio::test]
async fn https_needs_the_ca_bundle_and_tunnels_through_the_https_proxy() {
    // One tree page: the fake Hub writes its next-page links as http (it knows no TLS front).
    let hub = hub_with(model_agent_fakehub::Config::default());
    let root = Root::new("tls");
    let (ca, cert, key) = certificate_authority(&root.0);
    let front = tls_front(hub_addr(hub.endpoint()), &cert, &key);
    let plain = super::Options { endpoint: front.clone(), ..opts(&hub) };
    let untrusting = Root::new("tls-untrusted");
    let (ended, _) = run(job(&untrusting, "main"), &plain).await;
    let reason = ended.result.expect_err("an unknown issuer is refused").to_string();
    assert!(reason.contains("UnknownIssuer") || reason.contains("certificate"), "{reason}");
    let proxy = Proxy::start();
    let with_user = proxy.url.replace("http://", "http://user:pass@");
    let network = Network { https_proxy: with_user, ca_bundle: Some(ca), ..Network::default() };
    let (ended, _) = run(job(&root, "main"), &super::Options { network, ..plain }).await;
    if let Err(e) = &ended.result {
        panic!("through the tunnel with the CA: {e}");
    }
    finished(ended);
    assert_all_files(&hub, &root.dest(), "main");
    let seen = proxy.seen();
    let connect = format!("CONNECT {} auth=Basic dXNlcjpwYXNz", front.trim_start_matches("https://"));
    assert!(!seen.is_empty() && seen.iter().all(|s| *s == connect), "only tunnels to the front: {seen:?}");
}
