//! The fake's refusals over a raw socket (what a client sees byte for byte): unsigned, stale and
//! wrong-key requests get 401 `NotAuthenticated` JSON with an `opc-request-id`; the admin endpoint needs
//! no signature and arms faults.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, Method};
use model_agent_fakeoci::{BucketFixture, FakeOci, Fixtures, ObjectFixture, PrivateKey, sign_request, test_keys};

fn start() -> FakeOci {
    let bucket = BucketFixture::new("b").object(ObjectFixture::inline("m/config.json", "{}"));
    FakeOci::start(Fixtures::new().bucket(bucket)).unwrap()
}

/// Sends one request (`Connection: close`) and returns the raw answer.
fn exchange(oci: &FakeOci, method: &str, target: &str, headers: &HeaderMap, body: &str) -> String {
    let authority = oci.endpoint().trim_start_matches("http://");
    let mut stream = TcpStream::connect(authority).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut request = format!("{method} {target} HTTP/1.1\r\nconnection: close\r\n");
    if !headers.contains_key("host") {
        request.push_str(&format!("host: {authority}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {}\r\n", value.to_str().unwrap()));
    }
    if !body.is_empty() && !headers.contains_key("content-length") {
        request.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

fn signed(oci: &FakeOci, key_pem: &str, target: &str, date: Option<SystemTime>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("host", oci.endpoint().trim_start_matches("http://").parse().unwrap());
    if let Some(date) = date {
        headers.insert("date", httpdate::fmt_http_date(date).parse().unwrap());
    }
    let key = PrivateKey::from_pem(key_pem).unwrap();
    sign_request(&key, oci.key_id(), &Method::GET, target, &mut headers, None);
    headers
}

fn assert_not_authenticated(answer: &str) {
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("\"code\":\"NotAuthenticated\""), "{answer}");
    assert!(answer.to_lowercase().contains("opc-request-id: fakeoci-"), "{answer}");
}

#[test]
fn signed_requests_pass_and_unsigned_stale_or_foreign_ones_are_refused() {
    let oci = start();
    let target = "/n/fakens/b/b/o?prefix=m%2F";
    let ok = exchange(&oci, "GET", target, &signed(&oci, test_keys::PRIVATE_KEY_PEM, target, None), "");
    assert!(ok.starts_with("HTTP/1.1 200") && ok.contains("\"name\":\"m/config.json\""), "{ok}");
    assert_not_authenticated(&exchange(&oci, "GET", target, &HeaderMap::new(), ""));
    let stale = SystemTime::now() - Duration::from_secs(600);
    let answer = exchange(&oci, "GET", target, &signed(&oci, test_keys::PRIVATE_KEY_PEM, target, Some(stale)), "");
    assert_not_authenticated(&answer);
    let wrong = signed(&oci, test_keys::OTHER_PRIVATE_KEY_PEM, target, None);
    assert_not_authenticated(&exchange(&oci, "GET", target, &wrong, ""));
    let reasons: Vec<Option<String>> = oci.requests().into_iter().map(|r| r.auth_refused).collect();
    assert_eq!(reasons[0], None);
    assert_eq!(reasons[1].as_deref(), Some("no Authorization header"));
    assert!(reasons[2].as_deref().is_some_and(|r| r.contains("more than 300 s")), "{reasons:?}");
    assert_eq!(reasons[3].as_deref(), Some("the signature does not verify with the key"));
}

#[test]
fn the_admin_endpoint_needs_no_signature_and_arms_faults() {
    let oci = start();
    let mut json = HeaderMap::new();
    json.insert("content-type", "application/json".parse().unwrap());
    let fault = r#"{"kind":"service_unavailable","count":1,"retry_after_s":4}"#;
    let armed = exchange(&oci, "POST", "/_fakeoci/faults", &json, fault);
    assert!(armed.starts_with("HTTP/1.1 204"), "{armed}");
    let target = "/n/";
    let answer = exchange(&oci, "GET", target, &signed(&oci, test_keys::PRIVATE_KEY_PEM, target, None), "");
    assert!(answer.starts_with("HTTP/1.1 503") && answer.to_lowercase().contains("retry-after: 4"), "{answer}");
    let answer = exchange(&oci, "GET", target, &signed(&oci, test_keys::PRIVATE_KEY_PEM, target, None), "");
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("\"fakens\""), "{answer}");
    let log = exchange(&oci, "GET", "/_fakeoci/requests", &HeaderMap::new(), "");
    assert!(log.contains("\"status\":503") && log.contains("\"status\":200"), "{log}");
}
