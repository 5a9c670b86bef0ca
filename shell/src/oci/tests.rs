//! The client against the fake Object Storage (testsupport/fakeoci, whose signature checks and answers
//! are themselves checked against the official Python SDK by scripts/fakeoci-check).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use md5::{Digest, Md5};
use model_agent_fakeoci::{BucketFixture, Config, FakeOci, Fault, Fixtures, ObjectFixture, test_keys};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

const BUCKET: &str = "models";
const PREFIX: &str = "llama/";
const WHOLE: &str = "llama/model-00001.safetensors";
const MULTIPART_META: &str = "llama/model-00002.safetensors";
const MULTIPART_BARE: &str = "llama/model-00003.safetensors";
const ODD_NAME: &str = "llama/sub dir/naïve+name?.bin";

fn fixtures() -> Fixtures {
    let bucket = BucketFixture::new(BUCKET)
        .object(ObjectFixture::inline("llama/config.json", "{\"model_type\": \"llama\"}\n"))
        .object(ObjectFixture::generated(WHOLE, 300_000, 1))
        .object(ObjectFixture::generated(MULTIPART_META, 700_000, 2).multipart(3).with_meta_md5())
        .object(ObjectFixture::generated(MULTIPART_BARE, 200_000, 3).multipart(2))
        .object(ObjectFixture::generated(ODD_NAME, 5_000, 4))
        .object(ObjectFixture::inline("llama0/not-under-the-prefix", "x"))
        .object(ObjectFixture::inline("other/outside.txt", "x"));
    Fixtures::new().bucket(bucket)
}

fn start() -> FakeOci {
    FakeOci::start_with(fixtures(), Config { list_page_size: 2, ..Config::default() }).unwrap()
}

fn user_principal(private_key_pem: &str) -> OciAuth {
    OciAuth::UserPrincipal(UserPrincipal {
        tenancy: test_keys::TENANCY.into(),
        user: test_keys::USER.into(),
        fingerprint: test_keys::FINGERPRINT.into(),
        private_key_pem: private_key_pem.into(),
        passphrase: None,
    })
}

fn client_with(oci: &FakeOci, auth: OciAuth, network: &Network) -> Result<OciClient, OciError> {
    let config =
        OciConfig { endpoint: Some(oci.endpoint().into()), region: None, namespace: oci.namespace().into(), auth };
    OciClient::new(&config, Timeouts { connect_ms: 2_000, stall_ms: 2_000 }, network)
}

fn client(oci: &FakeOci) -> OciClient {
    client_with(oci, user_principal(test_keys::PRIVATE_KEY_PEM), &Network::default()).unwrap()
}

async fn read_all(body: ObjectBody) -> Result<Vec<u8>, OciError> {
    let mut bytes = Vec::new();
    let mut stream = std::pin::pin!(body.into_stream());
    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
        bytes.extend_from_slice(&chunk?);
    }
    Ok(bytes)
}

fn content(oci: &FakeOci, name: &str) -> Vec<u8> {
    oci.object(BUCKET, name).unwrap().content.to_vec().unwrap()
}

#[tokio::test]
async fn listing_follows_next_start_with_over_every_page() {
    let oci = start();
    let listed = client(&oci).list_objects(BUCKET, PREFIX, ListLimits::default()).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|o| o.name.as_str()).collect();
    let expected: Vec<String> = oci.names(BUCKET).into_iter().filter(|n| n.starts_with(PREFIX)).collect();
    assert_eq!(names, expected);
    for object in &listed {
        let stored = oci.object(BUCKET, &object.name).unwrap();
        assert_eq!((object.size_bytes, object.md5.as_deref()), (stored.size_bytes(), Some(stored.listed_md5.as_str())));
    }
    let pages = oci.requests().iter().filter(|r| r.uri.contains("/o?") && r.uri.contains("start=")).count();
    assert_eq!(pages, 2, "5 objects in pages of 2");
    let few = ListLimits { objects_max: 3, ..ListLimits::default() };
    let refused = client(&oci).list_objects(BUCKET, PREFIX, few).await.unwrap_err();
    assert!(refused.to_string().contains("more than 3 objects"), "{refused}");
    let empty = client(&oci).list_objects(BUCKET, "nothing/", ListLimits::default()).await.unwrap();
    assert!(empty.is_empty());
}

#[tokio::test]
async fn heads_give_the_md5_to_check_whole_multipart_with_and_without_metadata() {
    let oci = start();
    let client = client(&oci);
    let md5 = |name| -> [u8; 16] { Md5::digest(content(&oci, name)).into() };
    let whole = client.head_object(BUCKET, WHOLE).await.unwrap();
    assert_eq!(whole.size_bytes, 300_000);
    assert_eq!(whole.expected_md5().unwrap(), ExpectedMd5::ContentMd5(md5(WHOLE)));
    assert!(whole.request_id.as_deref().is_some_and(|id| id.starts_with("fakeoci-")));
    let meta = client.head_object(BUCKET, MULTIPART_META).await.unwrap();
    assert_eq!(meta.expected_md5().unwrap(), ExpectedMd5::MetaMd5(md5(MULTIPART_META)));
    assert!(meta.multipart_md5.as_deref().is_some_and(|m| m.ends_with("-3")));
    let bare = client.head_object(BUCKET, MULTIPART_BARE).await.unwrap();
    assert_eq!(bare.expected_md5().unwrap(), ExpectedMd5::SizeOnly);
    let odd = client.head_object(BUCKET, ODD_NAME).await.unwrap();
    assert_eq!(odd.expected_md5().unwrap(), ExpectedMd5::ContentMd5(md5(ODD_NAME)));
    let missing = client.head_object(BUCKET, "llama/none").await.unwrap_err();
    // A HEAD answer has no body, so no OCI code: the status says it.
    assert!(matches!(&missing, OciError::NotFoundOrDenied(a) if a.status == 404), "{missing}");
    assert!(missing.to_string().contains("404 Not Found"), "{missing}");
}

#[tokio::test]
async fn gets_stream_whole_objects_and_ranges() {
    let oci = start();
    let client = client(&oci);
    let bytes = content(&oci, MULTIPART_META);
    let whole = client.get_object(BUCKET, MULTIPART_META, None).await.unwrap();
    assert_eq!((whole.start, whole.body_bytes, whole.head.size_bytes), (0, 700_000, 700_000));
    assert!(read_all(whole).await.unwrap() == bytes);
    let range = ByteRange { start: 123_456, end: Some(456_789) };
    let part = client.get_object(BUCKET, MULTIPART_META, Some(range)).await.unwrap();
    assert_eq!((part.start, part.body_bytes, part.head.size_bytes), (123_456, 333_333, 700_000));
    assert!(read_all(part).await.unwrap() == bytes[123_456..456_789]);
    let tail = client.get_object(BUCKET, ODD_NAME, Some(ByteRange { start: 4_000, end: None })).await.unwrap();
    assert!(read_all(tail).await.unwrap() == content(&oci, ODD_NAME)[4_000..]);
    let past = client.get_object(BUCKET, ODD_NAME, Some(ByteRange { start: 5_000, end: None })).await.unwrap_err();
    assert!(matches!(&past, OciError::UnexpectedStatus(a) if a.status == 416), "{past}");
    assert_eq!(client.get_namespace().await.unwrap(), oci.namespace());
}

#[tokio::test]
async fn a_wrong_key_is_refused_as_not_authenticated() {
    let oci = start();
    let wrong = client_with(&oci, user_principal(test_keys::OTHER_PRIVATE_KEY_PEM), &Network::default()).unwrap();
    let error = wrong.list_objects(BUCKET, PREFIX, ListLimits::default()).await.unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, OciError::NotAuthenticated(_)), "{text}");
    assert!(text.contains("401 NotAuthenticated") && text.contains("opc-request-id fakeoci-"), "{text}");
    assert!(text.contains("check the API key"), "{text}");
    assert!(!error.is_transient());
    let log = oci.requests();
    assert_eq!(log[0].auth_refused.as_deref(), Some("the signature does not verify with the key"));
}

/// The fake's metadata and federation endpoints, as `OCI_METADATA_BASE_URL` and
/// `OCI_SDK_AUTH_CLIENT_REGION_URL` would give them.
fn instance_auth(oci: &FakeOci) -> OciAuth {
    OciAuth::InstancePrincipal(InstanceEndpoints {
        metadata_base_url: oci.metadata_base_url(),
        federation_base_url: Some(oci.federation_base_url().into()),
    })
}

fn start_instance(instance: model_agent_fakeoci::InstanceConfig) -> FakeOci {
    FakeOci::start_with(fixtures(), Config { instance, ..Config::default() }).unwrap()
}

fn paths(oci: &FakeOci) -> Vec<(String, String, u16)> {
    let log = oci.requests();
    log.into_iter().map(|r| (r.method, r.uri.split('?').next().unwrap_or("").to_owned(), r.status)).collect()
}

#[tokio::test]
async fn an_instance_principal_trades_its_certificate_for_a_session_token() {
    let oci = start_instance(Default::default());
    let client = client_with(&oci, instance_auth(&oci), &Network::default()).unwrap();
    let listed = client.list_objects(BUCKET, PREFIX, ListLimits::default()).await.unwrap();
    assert_eq!(listed.len(), 5);
    let body = client.get_object(BUCKET, ODD_NAME, None).await.unwrap();
    assert!(read_all(body).await.unwrap() == content(&oci, ODD_NAME));
    assert_eq!(oci.tokens_issued(), 1, "one token for every request while it is fresh");
    let seen = paths(&oci);
    let identity: Vec<&str> = seen.iter().take(4).map(|(_, path, _)| path.as_str()).collect();
    assert_eq!(
        identity,
        ["/opc/v2/identity/cert.pem", "/opc/v2/identity/key.pem", "/opc/v2/identity/intermediate.pem", "/v1/x509"]
    );
    // Object Storage took the `ST$` keyId: the client holds no API key the fake would accept.
    assert!(seen.iter().skip(4).all(|(_, path, status)| path.starts_with("/n/") && *status == 200), "{seen:?}");
}

#[tokio::test]
async fn an_instance_principal_without_endpoint_or_region_uses_the_instance_s_region() {
    let oci =
        start_instance(model_agent_fakeoci::InstanceConfig { region: "eu-frankfurt-1".into(), ..Default::default() });
    let config = OciConfig { endpoint: None, region: None, namespace: "ns".into(), auth: instance_auth(&oci) };
    let client = OciClient::new(&config, Timeouts { connect_ms: 2_000, stall_ms: 2_000 }, &Network::default()).unwrap();
    assert_eq!(client.endpoint().await.unwrap().host, "objectstorage.eu-frankfurt-1.oraclecloud.com");
    assert_eq!(paths(&oci), [("GET".into(), "/opc/v2/instance/canonicalRegionName".into(), 200)]);
    let user = OciConfig { auth: user_principal(test_keys::PRIVATE_KEY_PEM), ..config };
    let refused = OciClient::new(&user, Timeouts { connect_ms: 1, stall_ms: 1 }, &Network::default()).unwrap_err();
    assert!(refused.to_string().contains("neither an endpoint nor a region"), "{refused}");
}

#[tokio::test]
async fn a_token_is_renewed_before_its_exp_and_once_after_a_401() {
    // A 2 s token is renewed after 1 s (half its life).
    let oci = start_instance(model_agent_fakeoci::InstanceConfig { token_ttl_s: 2, ..Default::default() });
    let client = client_with(&oci, instance_auth(&oci), &Network::default()).unwrap();
    client.head_object(BUCKET, WHOLE).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    client.head_object(BUCKET, WHOLE).await.unwrap();
    assert_eq!(oci.tokens_issued(), 2, "renewed before it expired");
    assert!(oci.requests().iter().all(|r| r.status != 401), "no request was refused");
    oci.revoke_tokens();
    client.head_object(BUCKET, WHOLE).await.unwrap();
    assert_eq!(oci.tokens_issued(), 3, "a refused token is renewed");
    let refused: Vec<_> = oci.requests().into_iter().filter(|r| r.status == 401).collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].auth_refused.as_deref(), Some("the security token has expired or was revoked"));
}

#[tokio::test]
async fn a_token_refused_again_after_renewal_is_not_authenticated() {
    // Tokens from one fake's federation, requests to another fake that knows none of them: a
    // refused token is renewed once, then the 401 stands (no loop).
    let (identity, storage) = (start_instance(Default::default()), start());
    let client = client_with(&storage, instance_auth(&identity), &Network::default()).unwrap();
    let error = client.head_object(BUCKET, WHOLE).await.unwrap_err();
    assert!(matches!(error, OciError::NotAuthenticated(_)), "{error}");
    assert_eq!(storage.requests().len(), 2, "the request, then once more with a renewed token");
    assert_eq!(identity.tokens_issued(), 2);
}

#[tokio::test]
async fn a_certificate_and_key_that_do_not_match_are_refused_by_the_federation() {
    let other_key =
        model_agent_fakeoci::InstanceConfig { key_pem: test_keys::OTHER_PRIVATE_KEY_PEM.into(), ..Default::default() };
    let oci = start_instance(other_key);
    let client = client_with(&oci, instance_auth(&oci), &Network::default()).unwrap();
    let error = client.list_objects(BUCKET, PREFIX, ListLimits::default()).await.unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, OciError::InstancePrincipal { .. }) && !error.is_transient(), "{text}");
    assert!(text.contains("refused the instance certificate") && text.contains("401"), "{text}");
    let federation = oci.requests().into_iter().find(|r| r.uri == "/v1/x509").unwrap();
    assert_eq!(federation.auth_refused.as_deref(), Some("the signature does not verify with the key"));
    assert_eq!(oci.tokens_issued(), 0);
}

#[tokio::test]
async fn no_metadata_service_says_instance_principal_needs_an_oci_instance() {
    let auth = OciAuth::InstancePrincipal(InstanceEndpoints {
        metadata_base_url: "http://127.0.0.1:1/opc/v2".into(),
        federation_base_url: None,
    });
    let oci = start();
    let client = client_with(&oci, auth, &Network::default()).unwrap();
    let error = client.head_object(BUCKET, WHOLE).await.unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(error.to_string().contains("metadata service of an OCI instance"), "{error}");
    assert!(oci.requests().is_empty());
}

#[tokio::test]
async fn throttling_and_outages_surface_retry_after() {
    let oci = start();
    let client = client(&oci);
    oci.faults().add(Fault::RateLimit { count: 1, retry_after_s: 2 });
    let limited = client.head_object(BUCKET, WHOLE).await.unwrap_err();
    assert!(matches!(limited, OciError::RateLimited { .. }), "{limited}");
    assert_eq!(limited.retry_after_ms(), Some(2_000));
    let text = limited.to_string();
    assert!(text.contains("429 Too Many Requests") && text.contains("retry after 2 s"), "{text}");
    oci.faults().add(Fault::ServiceUnavailable { count: 1, retry_after_s: 3 });
    let outage = client.list_objects(BUCKET, PREFIX, ListLimits::default()).await.unwrap_err();
    assert!(matches!(outage, OciError::Server { .. }) && outage.is_transient(), "{outage}");
    assert_eq!(outage.retry_after_ms(), Some(3_000));
    assert!(client.head_object(BUCKET, WHOLE).await.is_ok(), "spent faults no longer apply");
    let bucket = client.list_objects("nope", PREFIX, ListLimits::default()).await.unwrap_err();
    assert!(matches!(&bucket, OciError::NotFoundOrDenied(a) if a.code.as_deref() == Some("BucketNotFound")));
}

#[tokio::test]
async fn cut_and_wrong_bodies_are_seen() {
    let oci = start();
    let client = client(&oci);
    let fault = Fault::Truncate { bucket: BUCKET.into(), object: WHOLE.into(), after_bytes: 1_000, count: 1 };
    oci.faults().add(fault);
    let cut = read_all(client.get_object(BUCKET, WHOLE, None).await.unwrap()).await.unwrap_err();
    assert!(matches!(cut, OciError::Cut { .. }) && cut.is_transient(), "{cut}");
    oci.faults().add(Fault::WrongBytes { bucket: BUCKET.into(), object: WHOLE.into(), count: 1 });
    let body = client.get_object(BUCKET, WHOLE, None).await.unwrap();
    let ExpectedMd5::ContentMd5(expected) = body.head.expected_md5().unwrap() else { panic!("whole object") };
    let got: [u8; 16] = Md5::digest(read_all(body).await.unwrap()).into();
    assert_ne!(got, expected, "served bytes no longer match Content-MD5 {}", BASE64.encode(expected));
}

/// A `CONNECT` proxy of one connection at a time; returns its URL and the targets it was asked for.
async fn connect_proxy() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let targets = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = targets.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                let mut byte = [0u8; 1];
                if inbound.read_exact(&mut byte).await.is_err() {
                    break;
                }
                head.push(byte[0]);
            }
            let text = String::from_utf8_lossy(&head).into_owned();
            let target = text.strip_prefix("CONNECT ").and_then(|t| t.split(' ').next()).unwrap_or("").to_owned();
            seen.lock().unwrap().push(target.clone());
            let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else { continue };
            inbound.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.unwrap();
            tokio::spawn(async move { tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await });
        }
    });
    (url, targets)
}

#[tokio::test]
async fn requests_go_through_a_proxy_tunnel_and_still_verify() {
    let oci = start();
    let (proxy, targets) = connect_proxy().await;
    let network = Network { http_proxy: proxy, ..Network::default() };
    let client = client_with(&oci, user_principal(test_keys::PRIVATE_KEY_PEM), &network).unwrap();
    let head = client.head_object(BUCKET, WHOLE).await.unwrap();
    assert_eq!(head.size_bytes, 300_000);
    let authority = oci.endpoint().trim_start_matches("http://").to_owned();
    assert_eq!(*targets.lock().unwrap(), vec![authority]);
    let bypass = Network { no_proxy: "127.0.0.1".into(), ..network };
    let direct = client_with(&oci, user_principal(test_keys::PRIVATE_KEY_PEM), &bypass).unwrap();
    direct.head_object(BUCKET, WHOLE).await.unwrap();
    assert_eq!(targets.lock().unwrap().len(), 1, "NO_PROXY bypasses the proxy");
}
