//! The store module's pure parts; the transfers run against real servers in the e2e tests
//! (`scripts/object-stores` starts them).

use super::config::{StoreAuth, open};
use super::listing::md5_of;
use super::{StoreError, join_key};
use model_agent_core::storage_uri::StorageUri;

fn client() -> &'static super::Net {
    static NET: std::sync::OnceLock<super::Net> = std::sync::OnceLock::new();
    NET.get_or_init(|| super::Net::new(&crate::hf::Network::default(), 1_000, 1_000).unwrap())
}

fn auth(parameters: &[(&str, &str)], secret: Option<&[(&str, &str)]>) -> StoreAuth {
    let map = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    StoreAuth {
        parameters: map(parameters),
        secret: secret.map(map).unwrap_or_default(),
        secret_name: secret.map(|_| "ns/creds".to_string()),
        ..StoreAuth::default()
    }
}

#[test]
fn an_md5_comes_from_content_md5_in_base64_or_hex_else_from_a_plain_etag() {
    let hex = "b1946ac92492d2347c6235b4d2611184";
    assert_eq!(md5_of(Some("sZRqySSS0jR8YjW00mERhA=="), None).as_deref(), Some(hex));
    assert_eq!(md5_of(Some(&hex.to_uppercase()), None).as_deref(), Some(hex));
    assert_eq!(md5_of(None, Some(&format!("\"{hex}\""))).as_deref(), Some(hex));
    // A multipart ETag is no hash of the content; an odd Content-MD5 falls back to the ETag.
    assert_eq!(md5_of(None, Some("\"d41d8cd98f00b204e9800998ecf8427e-3\"")), None);
    assert_eq!(md5_of(Some("bm90IGFuIG1kNQ=="), Some(hex)).as_deref(), Some(hex));
    assert_eq!(md5_of(None, None), None);
}

#[test]
fn keys_join_the_prefix_and_the_path_with_one_slash() {
    assert_eq!(join_key("models/llama", "config.json"), "models/llama/config.json");
    assert_eq!(join_key("models/llama/", "a/b.bin"), "models/llama/a/b.bin");
    assert_eq!(join_key("", "x"), "x");
    assert_eq!(join_key("/p", "x"), "p/x");
}

#[test]
fn a_secret_without_the_keys_a_scheme_needs_is_a_reason_naming_what_it_has() {
    let s3 = StorageUri::parse("s3://bucket/models/llama").unwrap();
    let only_id = auth(&[("endpoint", "http://127.0.0.1:1")], Some(&[("AWS_ACCESS_KEY_ID", "id")]));
    let reason = open(&s3, &only_id, client()).unwrap_err();
    assert!(reason.contains("ns/creds") && reason.contains("AWS_SECRET_ACCESS_KEY"), "{reason}");
    assert!(
        reason.contains("\"AWS_ACCESS_KEY_ID\"") && !reason.contains("\"id\""),
        "names keys, never values: {reason}"
    );
    let az = StorageUri::parse("az://acct/container/p").unwrap();
    let reason = open(&az, &auth(&[], Some(&[("other", "x")])), client()).unwrap_err();
    assert!(reason.contains("AZURE_STORAGE_KEY"), "{reason}");
    let gs = StorageUri::parse("gs://bucket/p").unwrap();
    let reason = open(&gs, &auth(&[], Some(&[("a", "{}"), ("b", "{}")])), client()).unwrap_err();
    assert!(reason.contains("service-account JSON"), "{reason}");
}

#[test]
fn each_scheme_opens_with_its_labels_and_others_are_refused() {
    let full = auth(
        &[("endpoint", "http://127.0.0.1:1")],
        Some(&[("AWS_ACCESS_KEY_ID", "id"), ("AWS_SECRET_ACCESS_KEY", "secret")]),
    );
    let s3 = open(&StorageUri::parse("s3://b/p/q").unwrap(), &full, client()).unwrap();
    assert_eq!(s3.label, "s3://b/p/q");
    assert!(!format!("{s3:?}").contains("secret"), "no credential in Debug");
    let gs = open(&StorageUri::parse("gs://b/p").unwrap(), &auth(&[("anonymous", "true")], None), client()).unwrap();
    assert_eq!(gs.label, "gs://b/p");
    let az_key = auth(&[("endpoint", "http://127.0.0.1:1/acct")], Some(&[("AZURE_STORAGE_KEY", "a2V5")]));
    let az = open(&StorageUri::parse("az://acct/c/p").unwrap(), &az_key, client()).unwrap();
    assert_eq!(az.label, "az://acct/c/p");
    assert!(open(&StorageUri::parse("hf://org/repo").unwrap(), &full, client()).is_err());
}

#[test]
fn failures_say_whether_to_retry_now_later_or_slowly() {
    let denied = StoreError::Denied { what: "listing s3://b/p".into(), reason: "403 Forbidden\nbody".into() };
    assert!(denied.retry_slowly() && !denied.retry_now());
    assert!(denied.to_string().contains("spec.storage.key") && !denied.to_string().contains("body"));
    let stalled = StoreError::Stalled { what: "x".into(), stall_timeout_ms: 5 };
    assert!(stalled.unreachable() && stalled.retry_now());
    let empty = StoreError::Empty { label: "s3://b/p".into() };
    assert_eq!(empty.to_string(), "no objects under s3://b/p");
    assert!(empty.retry_slowly());
}

#[test]
fn oci_auth_defaults_to_instance_principal_and_refuses_the_other_principals_clearly() {
    let oci = StorageUri::parse("oci://n/ns/b/models/o/llama").unwrap();
    let instance = open(&oci, &auth(&[("region", "us-ashburn-1")], None), client()).unwrap();
    assert_eq!(instance.label, "oci://n/ns/b/models/o/llama");
    let resource = open(&oci, &auth(&[("auth", "ResourcePrincipal")], None), client()).unwrap_err();
    assert_eq!(resource, "OCI: auth ResourcePrincipal is not supported yet");
    let workload = open(&oci, &auth(&[("auth", "OkeWorkloadIdentity")], None), client()).unwrap_err();
    assert!(workload.contains("OkeWorkloadIdentity is not supported yet"), "{workload}");
    let typo = open(&oci, &auth(&[("auth", "instance_principal")], None), client()).unwrap_err();
    assert!(typo.contains("not one of UserPrincipal, InstancePrincipal"), "{typo}");
    let user = open(&oci, &auth(&[("auth", "UserPrincipal")], Some(&[("tenancy", "t")])), client()).unwrap_err();
    assert!(user.contains("lacks user"), "{user}");
}

#[test]
fn a_refused_token_exchange_is_denied_and_a_temporary_one_is_not() {
    let refused = opendal::Error::new(opendal::ErrorKind::Unexpected, "signing http request")
        .with_context("called", "reqsign::Sign");
    let denied = StoreError::from_opendal("listing gs://b/p", &refused);
    assert!(matches!(denied, StoreError::Denied { .. }) && denied.retry_slowly(), "{denied:?}");
    let flaky = opendal::Error::new(opendal::ErrorKind::Unexpected, "signing http request")
        .with_context("called", "reqsign::Sign")
        .set_temporary();
    assert!(StoreError::from_opendal("listing gs://b/p", &flaky).retry_now());
}

// A review's hostile servers.

fn s3_store(endpoint: &str) -> super::Store {
    let full =
        auth(&[("endpoint", endpoint)], Some(&[("AWS_ACCESS_KEY_ID", "id"), ("AWS_SECRET_ACCESS_KEY", "secret")]));
    open(&StorageUri::parse("s3://b/p").unwrap(), &full, client()).unwrap()
}

/// A server answering every request with `body` (an S3 ListObjectsV2 page; nothing to a HEAD);
/// counts the requests.
async fn fake_s3(body: &'static str) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let answer = move |head: &str| ("200 OK", if head.starts_with("HEAD ") { "" } else { body }.to_string());
    crate::canned_http::serve(Some("application/xml"), answer).await
}

/// An S3-compatible server whose ListObjectsV2 says "truncated" forever with no objects.
#[tokio::test]
async fn an_endless_empty_listing_ends_in_an_error() {
    let (port, requests) = fake_s3(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>b</Name>\
         <Prefix>p/</Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys>\
         <IsTruncated>true</IsTruncated><NextContinuationToken>same</NextContinuationToken>\
         </ListBucketResult>",
    )
    .await;
    let store = s3_store(&format!("http://127.0.0.1:{port}"));
    let listed = tokio::time::timeout(std::time::Duration::from_secs(10), super::list(&store)).await;
    let n = requests.load(std::sync::atomic::Ordering::Relaxed);
    let e =
        listed.unwrap_or_else(|_| panic!("the listing never ended: {n} ListObjectsV2 requests in 10 s")).unwrap_err();
    assert!(e.to_string().contains("past 2000 pages"), "{e}");
}

/// The Hub's tree is refused when a path is listed twice or is both a file and a directory
/// (`check_unique`); a store's listing is not.
#[tokio::test]
async fn a_store_listing_with_a_key_twice_or_a_file_and_directory_clash_is_refused() {
    let (port, _) = fake_s3(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>b</Name>\
         <Prefix>p/</Prefix><KeyCount>3</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>\
         <Contents><Key>p/w.bin</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified><Size>5</Size><ETag>\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-2\"</ETag></Contents>\
         <Contents><Key>p/w.bin</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified><Size>7</Size><ETag>\"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-2\"</ETag></Contents>\
         <Contents><Key>p/w.bin/x</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified><Size>3</Size><ETag>\"cccccccccccccccccccccccccccccccc-2\"</ETag></Contents>\
         </ListBucketResult>",
    )
    .await;
    let store = s3_store(&format!("http://127.0.0.1:{port}"));
    let listed = tokio::time::timeout(std::time::Duration::from_secs(10), super::list(&store)).await.unwrap();
    let paths: Vec<_> = listed.iter().flatten().map(|f| (f.path.clone(), f.size_bytes, f.hash.clone())).collect();
    let e = listed.map(|_| ()).expect_err(&format!("accepted: {paths:?}")).to_string();
    assert!(e.contains("w.bin") && e.contains("listed twice"), "{e}");
}

/// A size no object has: refused before any sum over the listing could wrap.
#[tokio::test]
async fn a_store_listing_with_an_impossible_size_is_refused() {
    let (port, _) = fake_s3(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>b</Name>\
         <Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>\
         <Contents><Key>p/huge.bin</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified><Size>18446744073709551615</Size><ETag>\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-2\"</ETag></Contents>\
         <Contents><Key>p/one.bin</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified><Size>1</Size><ETag>\"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-2\"</ETag></Contents>\
         </ListBucketResult>",
    )
    .await;
    let store = s3_store(&format!("http://127.0.0.1:{port}"));
    let listed = tokio::time::timeout(std::time::Duration::from_secs(10), super::list(&store)).await.unwrap();
    let e = listed.unwrap_err().to_string();
    assert!(e.contains("huge.bin is listed at 18446744073709551615 bytes"), "{e}");
}

#[test]
fn a_listed_etag_is_kept_quoted_and_bounded() {
    use super::listing::listed_etag;
    assert_eq!(listed_etag(Some("\"ab-3\"")).as_deref(), Some("\"ab-3\""), "S3 quotes it");
    assert_eq!(listed_etag(Some("4a0c-uuid")).as_deref(), Some("\"4a0c-uuid\""), "OCI does not");
    assert_eq!(listed_etag(Some("W/\"x\"")), None, "If-Match compares strongly: a weak tag would fail every time");
    use super::listing::answer_is_version;
    assert!(answer_is_version("\"ab-3\"", Some("\"ab-3\"")) && answer_is_version("\"u\"", Some("u")));
    assert!(answer_is_version("\"ab-3\"", Some("W/\"ab-3\"")), "weakened by a proxy");
    assert!(answer_is_version("\"ab-3\"", None), "no ETag: cannot tell");
    assert!(!answer_is_version("\"ab-3\"", Some("\"cd-3\"")));
    for refused in ["", "  ", "a\r\nb"] {
        assert_eq!(listed_etag(Some(refused)), None, "{refused:?}");
    }
    assert_eq!(listed_etag(Some(&"e".repeat(2000))), None, "past the bound: read by size alone");
}

#[test]
fn a_failed_if_match_is_changed_and_ends_the_download_attempt() {
    let failed = opendal::Error::new(opendal::ErrorKind::ConditionNotMatch, "412 Precondition Failed");
    let changed = StoreError::from_opendal("weights.bin", &failed);
    assert!(matches!(changed, StoreError::Changed { .. }), "{changed:?}");
    assert!(!changed.retry_now() && !changed.unreachable() && !changed.retry_slowly());
    assert!(changed.to_string().contains("uploaded again"), "{changed}");
}

/// An OCI object checked by size only (uploaded in parts without `opc-meta-md5`): the listing
/// keeps its ETag, and a read answered with another one (the object uploaded again since) is
/// `Changed`, its bytes never written. The fake Object Storage is checked against OCI's SDK.
#[tokio::test]
async fn an_oci_object_checked_by_size_only_read_as_another_version_is_changed() {
    use model_agent_fakeoci::{BucketFixture, FakeOci, Fixtures, ObjectFixture, test_keys};
    let object = ObjectFixture::generated("m/w.bin", 200_000, 3).multipart(2);
    let oci = FakeOci::start(Fixtures::new().bucket(BucketFixture::new("models").object(object))).unwrap();
    let auth = crate::oci::OciAuth::UserPrincipal(crate::oci::UserPrincipal {
        tenancy: test_keys::TENANCY.into(),
        user: test_keys::USER.into(),
        fingerprint: test_keys::FINGERPRINT.into(),
        private_key_pem: test_keys::PRIVATE_KEY_PEM.into(),
        passphrase: None,
    });
    let config = crate::oci::OciConfig {
        endpoint: Some(oci.endpoint().into()),
        region: None,
        namespace: oci.namespace().into(),
        auth,
    };
    let timeouts = crate::oci::Timeouts { connect_ms: 2_000, stall_ms: 2_000 };
    let client = crate::oci::OciClient::new(&config, timeouts, &crate::hf::Network::default()).unwrap();
    let backend = super::Backend::Oci { client: Box::new(client), bucket: "models".into() };
    let label = "oci://models/m".to_string();
    let store = super::Store { backend, prefix: "m".into(), label, shape_filter: None, checks: super::Checks::None };
    let files = super::listing::list(&store).await.unwrap();
    assert!(files[0].hash == crate::hf::FileHash::SizeOnly && files[0].etag.is_some(), "{files:?}");
    let dir = tempfile::tempdir().unwrap();
    let meter = crate::hf::Meter::default();
    let partial = |name: &str| {
        std::fs::File::options().create(true).truncate(false).read(true).write(true).open(dir.path().join(name))
    };
    let listed = super::fetch::fetch_file(&store, &files[0], partial("a").unwrap(), 5_000, &meter).await;
    assert!(listed.is_ok(), "{listed:?}");
    let other = crate::hf::RemoteFile { etag: Some("\"uploaded-again\"".into()), ..files[0].clone() };
    let changed = super::fetch::fetch_file(&store, &other, partial("b").unwrap(), 5_000, &meter).await;
    assert!(matches!(changed, Err(StoreError::Changed { .. })), "{changed:?}");
    assert_eq!(std::fs::metadata(dir.path().join("b")).unwrap().len(), 0, "no byte of another version kept");
}
