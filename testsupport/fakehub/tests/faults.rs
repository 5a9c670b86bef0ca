//! Every fault switch, through the library and through the admin endpoint.

mod common;

use std::time::Duration;

use common::*;
use model_agent_fakehub::{Fault, Scope, sha256_hex};

fn revision_url(hub: &model_agent_fakehub::FakeHub) -> String {
    format!("{}/api/models/{MODEL}/revision/main", hub.endpoint())
}

fn cdn_location(hub: &model_agent_fakehub::FakeHub) -> String {
    get(&format!("{}/{MODEL}/resolve/main/{WEIGHTS}", hub.endpoint())).header("location").unwrap().to_owned()
}

#[test]
fn first_requests_answer_429_with_retry_after() {
    let hub = start();
    hub.faults().add(Fault::RateLimit { count: 2, retry_after_s: 7, scope: Scope::All });
    for _ in 0..2 {
        let reply = get(&revision_url(&hub));
        assert_eq!((reply.status, reply.header("retry-after")), (429, Some("7")));
    }
    assert_eq!(get(&revision_url(&hub)).status, 200);
    assert!(hub.faults().armed().is_empty());
    let statuses: Vec<u16> = hub.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 429, 200], "faulted requests are logged too");
}

#[test]
fn server_errors_for_the_next_requests_of_one_listener() {
    let hub = start();
    let location = cdn_location(&hub);
    hub.faults().add(Fault::ServerError { count: 2, status: 503, scope: Scope::Cdn });
    assert_eq!(get(&revision_url(&hub)).status, 200, "the Hub is not in scope");
    assert_eq!(get(&location).status, 503);
    assert_eq!(get(&location).status, 503);
    assert_eq!(get(&location).status, 200);
}

#[test]
fn truncated_body_announces_the_full_length_then_closes() {
    let hub = start();
    let location = cdn_location(&hub);
    hub.faults().add(Fault::Truncate { repo: MODEL.into(), path: WEIGHTS.into(), after_bytes: 100_000, count: 1 });
    let short = get(&location);
    assert_eq!((short.status, short.content_length()), (200, Some(WEIGHTS_BYTES)));
    assert_eq!(short.body.len(), 100_000);
    assert_ne!(short.end, End::Timeout);
    let expected = fixture_bytes(&hub, MODEL, "main", WEIGHTS);
    assert_eq!(short.body, expected[..100_000], "what came is right");
    // The resume a downloader would do: the rest, then nothing more than the file's size in total.
    let rest = request("GET", &location, &[("Range", "bytes=100000-")]);
    assert_eq!((rest.status, rest.body.as_slice()), (206, &expected[100_000..]));
    assert_eq!(hub.bytes_served(MODEL, WEIGHTS), WEIGHTS_BYTES);
}

#[test]
fn truncation_applies_to_regular_files_and_ranges_too() {
    let hub = start();
    let url = format!("{}/{MODEL}/resolve/main/tokenizer/tokenizer.json", hub.endpoint());
    let path = "tokenizer/tokenizer.json";
    hub.faults().add(Fault::Truncate { repo: MODEL.into(), path: path.into(), after_bytes: 3, count: 1 });
    let short = request("GET", &url, &[("Range", "bytes=2-")]);
    let expected = fixture_bytes(&hub, MODEL, "main", path);
    assert_eq!(short.status, 206);
    assert_eq!(short.content_length(), Some(expected.len() as u64 - 2));
    assert_eq!(short.body, expected[2..5]);
    assert_eq!(get(&url).body, expected);
}

#[test]
fn stalled_body_sends_headers_and_some_bytes_then_nothing() {
    let hub = start();
    let location = cdn_location(&hub);
    let fault =
        Fault::Stall { repo: MODEL.into(), path: WEIGHTS.into(), after_bytes: 1000, stall_ms: 30_000, count: 1 };
    hub.faults().add(fault);
    let stalled = request_with_timeout("GET", &location, &[], Duration::from_millis(700));
    assert_eq!((stalled.status, stalled.content_length()), (200, Some(WEIGHTS_BYTES)));
    assert_eq!(stalled.body.len(), 1000);
    assert_eq!(stalled.end, End::Timeout);
    assert_eq!(get(&location).body.len() as u64, WEIGHTS_BYTES, "spent: the next download is whole");
}

#[test]
fn stall_with_a_short_pause_then_closes() {
    let hub = start();
    let location = cdn_location(&hub);
    let fault = Fault::Stall { repo: MODEL.into(), path: WEIGHTS.into(), after_bytes: 0, stall_ms: 300, count: 1 };
    hub.faults().add(fault);
    let stalled = request_with_timeout("GET", &location, &[], Duration::from_secs(10));
    assert!(stalled.body.is_empty());
    assert!(stalled.elapsed >= Duration::from_millis(250), "{:?}", stalled.elapsed);
    assert_ne!(stalled.end, End::Timeout);
}

#[test]
fn corrupt_file_does_not_match_its_advertised_hash() {
    let hub = start();
    let location = cdn_location(&hub);
    hub.faults().add(Fault::Corrupt { repo: MODEL.into(), path: WEIGHTS.into(), count: 2 });
    let sha256 = hub.file(MODEL, "main", WEIGHTS).unwrap().lfs_sha256.unwrap();
    let bad = get(&location);
    assert_eq!((bad.status, bad.body.len() as u64), (200, WEIGHTS_BYTES));
    assert_ne!(sha256_hex(&bad.body), sha256);
    let expected = fixture_bytes(&hub, MODEL, "main", WEIGHTS);
    let differing = bad.body.iter().zip(&expected).filter(|(a, b)| a != b).count();
    assert_eq!(differing, 1);
    let ranged = request("GET", &location, &[("Range", "bytes=0-9")]);
    assert_eq!(ranged.body, expected[..10], "the flipped byte is in the middle");
    assert_eq!(sha256_hex(&get(&location).body), sha256, "spent after 2 bodies");
}

#[test]
fn ignore_range_answers_200_with_the_whole_file() {
    let hub = start();
    let location = cdn_location(&hub);
    hub.faults().add(Fault::IgnoreRange { repo: MODEL.into(), path: WEIGHTS.into(), count: 1 });
    let whole = request("GET", &location, &[("Range", "bytes=10-19")]);
    assert_eq!((whole.status, whole.body.len() as u64, whole.header("content-range")), (200, WEIGHTS_BYTES, None));
    assert_eq!(request("GET", &location, &[("Range", "bytes=10-19")]).status, 206);
}

fn admin_post(hub: &model_agent_fakehub::FakeHub, json: &str) -> u16 {
    let url = format!("{}/_fakehub/faults", hub.endpoint());
    let length = json.len().to_string();
    let headers = [("Content-Type", "application/json"), ("Content-Length", length.as_str())];
    post_with_body(&url, &headers, json)
}

/// POST with a body (the common client sends no body).
fn post_with_body(url: &str, headers: &[(&str, &str)], body: &str) -> u16 {
    use std::io::{Read, Write};
    let authority = &url["http://".len()..url["http://".len()..].find('/').unwrap() + "http://".len()];
    let path = &url["http://".len() + authority.len()..];
    let mut stream = std::net::TcpStream::connect(authority).unwrap();
    let mut head = format!("POST {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    stream.write_all(format!("{head}\r\n{body}").as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn admin_endpoint_flips_faults_and_reads_the_log_from_outside() {
    let hub = start();
    assert_eq!(admin_post(&hub, r#"{"kind":"rate_limit","count":1,"retry_after_s":3}"#), 204);
    assert_eq!(admin_post(&hub, r#"{"kind":"server_error","count":5,"status":502,"scope":"hub"}"#), 204);
    assert_eq!(admin_post(&hub, r#"{"kind":"no_such_fault"}"#), 422);
    let armed = get(&format!("{}/_fakehub/faults", hub.endpoint())).json();
    assert_eq!(armed.as_array().unwrap().len(), 2, "admin requests are never faulted: {armed}");
    assert_eq!(get(&revision_url(&hub)).status, 429);
    assert_eq!(get(&revision_url(&hub)).status, 502);
    assert_eq!(request("DELETE", &format!("{}/_fakehub/faults", hub.endpoint()), &[]).status, 204);
    assert_eq!(get(&revision_url(&hub)).status, 200);
    let log = get(&format!("{}/_fakehub/requests", hub.endpoint())).json();
    let statuses: Vec<u64> =
        log["requests"].as_array().unwrap().iter().map(|r| r["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [429, 502, 200], "admin requests are not logged");
    get(&cdn_location(&hub));
    let bytes = get(&format!("{}/_fakehub/bytes", hub.endpoint())).json();
    assert_eq!(bytes[0]["path"], WEIGHTS);
    assert_eq!(bytes[0]["bytes"].as_u64(), Some(WEIGHTS_BYTES));
    assert_eq!(request("DELETE", &format!("{}/_fakehub/requests", hub.endpoint()), &[]).status, 204);
    assert!(hub.requests().is_empty());
}
