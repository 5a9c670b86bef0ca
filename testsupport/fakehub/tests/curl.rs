//! curl, a client this project did not write, against the fake: HEAD headers, the redirect, Range,
//! resume after a cut, Retry-After, a stall timeout.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::*;
use model_agent_fakehub::{Fault, Listener, Scope};

fn curl(args: &[&str]) -> Output {
    let output = Command::new("curl").args(["--silent", "--show-error"]).args(args).output();
    output.expect("curl is installed (Debian package curl)")
}

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fakehub-curl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

/// Header lines of the last response in curl's `--dump-header -` output, names lower-cased.
fn headers(stdout: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(stdout);
    let last = text.split("\r\n\r\n").filter(|block| block.starts_with("HTTP/")).last().unwrap_or("").to_owned();
    let lines = last.lines().skip(1);
    lines.filter_map(|l| l.split_once(':')).map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned())).collect()
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

#[test]
fn curl_head_shows_the_headers_huggingface_hub_reads() {
    let hub = start();
    let c2 = hub.commit_sha(MODEL, "c2").unwrap();
    let info = hub.file(MODEL, "main", WEIGHTS).unwrap();
    let out = curl(&["--head", &format!("{}/{MODEL}/resolve/main/{WEIGHTS}", hub.endpoint())]);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.starts_with(b"HTTP/1.1 302"), "{}", String::from_utf8_lossy(&out.stdout));
    let lfs = headers(&out.stdout);
    assert_eq!(header(&lfs, "x-repo-commit"), Some(c2.as_str()));
    assert_eq!(header(&lfs, "x-linked-size"), Some(WEIGHTS_BYTES.to_string().as_str()));
    assert_eq!(header(&lfs, "x-linked-etag"), Some(format!("\"{}\"", info.lfs_sha256.unwrap()).as_str()));
    assert!(header(&lfs, "location").unwrap().starts_with(hub.cdn_endpoint()));

    let out = curl(&["--head", &format!("{}/{MODEL}/resolve/main/config.json", hub.endpoint())]);
    let regular = headers(&out.stdout);
    let info = hub.file(MODEL, "main", "config.json").unwrap();
    assert_eq!(header(&regular, "content-length"), Some(info.size_bytes.to_string().as_str()));
    assert_eq!(header(&regular, "etag"), Some(format!("\"{}\"", info.git_oid).as_str()));
    assert_eq!(header(&regular, "x-repo-commit"), Some(c2.as_str()));
}

#[test]
fn curl_follows_the_redirect_without_the_token_and_the_cdn_refuses_it_with_the_token() {
    let hub = start();
    let url = format!("{}/{GATED}/resolve/main/w.bin", hub.endpoint());
    let bearer = format!("Authorization: Bearer {GRANTED_TOKEN}");
    let file = temp_path("w.bin");
    let out = curl(&["--location", "--fail", "-H", &bearer, "-o", file.to_str().unwrap(), &url]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read(&file).unwrap(), fixture_bytes(&hub, GATED, "main", "w.bin"));
    let log = hub.requests();
    assert_eq!(
        log.iter().map(|r| (r.listener, r.authorization)).collect::<Vec<_>>(),
        [(Listener::Hub, true), (Listener::Cdn, false)]
    );

    let trusted = curl(&["--location-trusted", "-o", "/dev/null", "-w", "%{http_code}", "-H", &bearer, &url]);
    assert_eq!(String::from_utf8_lossy(&trusted.stdout), "403", "forwarding the token to the CDN fails");
}

#[test]
fn curl_range_on_the_cdn_and_the_hub() {
    let hub = start();
    let expected = fixture_bytes(&hub, MODEL, "main", WEIGHTS);
    let out = curl(&[
        "--location",
        "--range",
        "1000-1999",
        "--dump-header",
        "/dev/stderr",
        &format!("{}/{MODEL}/resolve/main/{WEIGHTS}", hub.endpoint()),
    ]);
    assert_eq!(out.stdout, expected[1000..2000]);
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("content-range: bytes 1000-1999/{WEIGHTS_BYTES}")));
    let out = curl(&["--range", "-4", &format!("{}/{MODEL}/resolve/main/README.md", hub.endpoint())]);
    assert_eq!(out.stdout, b"del\n");
}

#[test]
fn curl_resumes_a_truncated_download_fetching_at_most_the_size_once_more() {
    let hub = start();
    let url = format!("{}/{MODEL}/resolve/main/{WEIGHTS}", hub.endpoint());
    hub.faults().add(Fault::Truncate { repo: MODEL.into(), path: WEIGHTS.into(), after_bytes: 123_456, count: 1 });
    let file = temp_path("weights");
    let first = curl(&["--location", "-o", file.to_str().unwrap(), &url]);
    assert_eq!(first.status.code(), Some(18), "curl: partial file: {first:?}");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 123_456);
    let resumed = curl(&["--location", "--continue-at", "-", "-o", file.to_str().unwrap(), &url]);
    assert!(resumed.status.success(), "{resumed:?}");
    assert_eq!(std::fs::read(&file).unwrap(), fixture_bytes(&hub, MODEL, "main", WEIGHTS));
    let served = hub.bytes_served(MODEL, WEIGHTS);
    assert!(served as f64 <= 1.1 * WEIGHTS_BYTES as f64, "served {served}");
    let ranges: Vec<Option<String>> =
        hub.requests().into_iter().filter(|r| r.listener == Listener::Cdn).map(|r| r.range).collect();
    assert_eq!(ranges, [None, Some("bytes=123456-".to_owned())]);
}

#[test]
fn curl_honours_retry_after() {
    let hub = start();
    hub.faults().add(Fault::RateLimit { count: 1, retry_after_s: 1, scope: Scope::Hub });
    let url = format!("{}/api/models/{MODEL}/revision/main", hub.endpoint());
    let started = std::time::Instant::now();
    // A real file: curl truncates its output before retrying, which /dev/null refuses.
    let file = temp_path("retried.json");
    let out = curl(&["--retry", "2", "-o", file.to_str().unwrap(), "-w", "%{http_code}", &url]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    assert!(started.elapsed().as_millis() >= 900, "curl waited Retry-After: {:?}", started.elapsed());
    assert_eq!(hub.requests().iter().map(|r| r.status).collect::<Vec<_>>(), [429, 200]);
}

#[test]
fn curl_times_out_on_a_stalled_body() {
    let hub = start();
    hub.faults().add(Fault::Stall {
        repo: MODEL.into(),
        path: WEIGHTS.into(),
        after_bytes: 5000,
        stall_ms: 20_000,
        count: 1,
    });
    let file = temp_path("stalled");
    let args = ["--location", "--speed-limit", "1", "--speed-time", "1", "-o", file.to_str().unwrap()];
    let out = curl(&[&args[..], &[format!("{}/{MODEL}/resolve/main/{WEIGHTS}", hub.endpoint()).as_str()]].concat());
    assert_eq!(out.status.code(), Some(28), "curl: timeout: {out:?}");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 5000);
}
