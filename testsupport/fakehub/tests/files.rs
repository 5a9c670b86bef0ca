//! `resolve`, the LFS redirect, the CDN, `Range`, the request log and byte counters.

mod common;

use common::*;
use model_agent_fakehub::{Config, FakeHub, Listener, sha256_hex};

#[test]
fn regular_files_come_from_the_hub_with_etag_and_commit() {
    let hub = start();
    let c1 = hub.commit_sha(MODEL, "c1").unwrap();
    for revision in ["v1.0", "dev", c1.as_str()] {
        let reply = get(&format!("{}/{MODEL}/resolve/{revision}/tokenizer/tokenizer.json", hub.endpoint()));
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, fixture_bytes(&hub, MODEL, "v1.0", "tokenizer/tokenizer.json"));
        let oid = hub.file(MODEL, "v1.0", "tokenizer/tokenizer.json").unwrap().git_oid;
        assert_eq!(reply.header("etag"), Some(format!("\"{oid}\"").as_str()));
        assert_eq!(reply.header("x-repo-commit"), Some(c1.as_str()));
        assert_eq!(reply.content_length(), Some(reply.body.len() as u64));
        assert_eq!(reply.header("accept-ranges"), Some("bytes"));
    }
    let main = get(&format!("{}/{MODEL}/resolve/main/config.json", hub.endpoint()));
    assert_eq!(main.body, fixture_bytes(&hub, MODEL, "main", "config.json"), "a branch serves its own commit");
}

#[test]
fn head_on_regular_and_lfs_files_gives_what_huggingface_hub_reads() {
    let hub = start();
    let c2 = hub.commit_sha(MODEL, "c2").unwrap();
    let regular = request("HEAD", &format!("{}/{MODEL}/resolve/main/config.json", hub.endpoint()), &[]);
    let info = hub.file(MODEL, "main", "config.json").unwrap();
    assert_eq!(regular.status, 200);
    assert!(regular.body.is_empty());
    assert_eq!(regular.content_length(), Some(info.size_bytes));
    assert_eq!(regular.header("etag"), Some(format!("\"{}\"", info.git_oid).as_str()));
    assert_eq!(regular.header("x-repo-commit"), Some(c2.as_str()));

    let lfs = request("HEAD", &format!("{}/{MODEL}/resolve/main/{WEIGHTS}", hub.endpoint()), &[]);
    let info = hub.file(MODEL, "main", WEIGHTS).unwrap();
    assert_eq!(lfs.status, 302);
    assert!(lfs.body.is_empty());
    assert_eq!(lfs.header("x-repo-commit"), Some(c2.as_str()));
    assert_eq!(lfs.header("x-linked-etag"), Some(format!("\"{}\"", info.lfs_sha256.unwrap()).as_str()));
    assert_eq!(lfs.header("x-linked-size"), Some(WEIGHTS_BYTES.to_string().as_str()));
    assert_eq!(lfs.header("etag"), Some(format!("\"{}\"", info.git_oid).as_str()), "ETag: the pointer's git oid");
    assert!(lfs.header("location").unwrap().starts_with(&format!("{}/", hub.cdn_endpoint())));
}

#[test]
fn lfs_files_redirect_to_the_cdn_which_serves_ranges_and_refuses_authorization() {
    let hub = start();
    let bearer = format!("Bearer {GRANTED_TOKEN}");
    let redirect =
        request("GET", &format!("{}/{GATED}/resolve/main/w.bin", hub.endpoint()), &[("Authorization", &bearer)]);
    assert_eq!(redirect.status, 302);
    let location = redirect.header("location").unwrap().to_owned();
    assert_ne!(hub.cdn_endpoint(), hub.endpoint(), "another origin");
    let expected = fixture_bytes(&hub, GATED, "main", "w.bin");

    let refused = request("GET", &location, &[("Authorization", &bearer)]);
    assert_eq!(refused.status, 403, "the CDN refuses any Authorization header");
    assert!(String::from_utf8_lossy(&refused.body).contains("Authorization"));

    let whole = get(&location);
    assert_eq!(whole.status, 200);
    assert_eq!(whole.body, expected);
    assert_eq!(whole.header("etag"), Some(format!("\"{}\"", sha256_hex(&expected)).as_str()));
    assert_eq!(whole.header("accept-ranges"), Some("bytes"));

    let part = request("GET", &location, &[("Range", "bytes=100-199")]);
    assert_eq!(part.status, 206);
    assert_eq!(part.header("content-range"), Some("bytes 100-199/10000"));
    assert_eq!(part.body, expected[100..200]);
    let tail = request("GET", &location, &[("Range", "bytes=9990-")]);
    assert_eq!((tail.status, tail.body.as_slice()), (206, &expected[9990..]));
    let beyond = request("GET", &location, &[("Range", "bytes=10000-")]);
    assert_eq!((beyond.status, beyond.header("content-range")), (416, Some("bytes */10000")));
    let head = request("HEAD", &location, &[]);
    assert_eq!((head.status, head.content_length(), head.body.len()), (200, Some(10_000), 0));
}

#[test]
fn cdn_urls_are_signed_and_expire() {
    let config = Config { cdn_url_ttl_s: 0, ..Config::default() };
    let hub = FakeHub::start_with(fixtures(), config).unwrap();
    let location =
        get(&format!("{}/{MODEL}/resolve/main/{WEIGHTS}", hub.endpoint())).header("location").unwrap().to_owned();
    let tampered = location.replace("Signature=", "Signature=0");
    assert_eq!(get(&tampered).status, 403);
    let other_file = location.replace(WEIGHTS, "added.bin");
    assert_eq!(get(&other_file).status, 403, "a signature covers one file");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let expired = get(&location);
    assert_eq!(expired.status, 403);
    assert!(String::from_utf8_lossy(&expired.body).contains("expired"));
}

#[test]
fn range_on_regular_files_served_by_the_hub() {
    let hub = start();
    let url = format!("{}/{MODEL}/resolve/main/README.md", hub.endpoint());
    let expected = fixture_bytes(&hub, MODEL, "main", "README.md");
    let part = request("GET", &url, &[("Range", "bytes=2-4")]);
    assert_eq!(part.status, 206);
    assert_eq!(part.header("content-range"), Some(format!("bytes 2-4/{}", expected.len()).as_str()));
    assert_eq!(part.body, expected[2..5]);
    let suffix = request("GET", &url, &[("Range", "bytes=-3")]);
    assert_eq!((suffix.status, suffix.body.as_slice()), (206, &expected[expected.len() - 3..]));
    let several = request("GET", &url, &[("Range", "bytes=0-1,3-4")]);
    assert_eq!((several.status, several.body), (200, expected), "several ranges: the whole file");
}

#[test]
fn request_log_and_byte_counters() {
    let hub = start();
    let redirect =
        request("GET", &format!("{}/{MODEL}/resolve/main/{WEIGHTS}", hub.endpoint()), &[("Authorization", "Bearer t")]);
    let location = redirect.header("location").unwrap().to_owned();
    get(&location);
    request("GET", &location, &[("Range", "bytes=0-999")]);
    let log = hub.requests();
    assert_eq!(log.len(), 3);
    let hub_port: u16 = hub.endpoint().rsplit(':').next().unwrap().parse().unwrap();
    let cdn_port: u16 = hub.cdn_endpoint().rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(
        (log[0].listener, log[0].port, log[0].status, log[0].authorization),
        (Listener::Hub, hub_port, 302, true)
    );
    assert_eq!(log[0].uri, format!("/{MODEL}/resolve/main/{WEIGHTS}"));
    assert_eq!(
        (log[1].listener, log[1].port, log[1].authorization, log[1].range.as_deref()),
        (Listener::Cdn, cdn_port, false, None)
    );
    assert_eq!((log[2].status, log[2].range.as_deref()), (206, Some("bytes=0-999")));
    assert_eq!(log[1].host.as_deref(), Some(&hub.cdn_endpoint()["http://".len()..]));
    assert_eq!(hub.bytes_served(MODEL, WEIGHTS), WEIGHTS_BYTES + 1000);
    assert_eq!(hub.bytes_served(MODEL, "config.json"), 0);
    hub.clear_requests();
    assert!(hub.requests().is_empty());
    assert_eq!(hub.bytes_served(MODEL, WEIGHTS), 0);
}

#[test]
fn files_from_a_directory_stay_on_disk_and_serve() {
    let dir = std::env::temp_dir().join(format!("fakehub-dir-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("small.txt"), b"small\n").unwrap();
    std::fs::write(dir.join("sub/big.bin"), vec![5u8; 4096]).unwrap();
    let commit = model_agent_fakehub::CommitFixture::from_dir(&dir, 1024).unwrap();
    let repo = model_agent_fakehub::RepoFixture::new("org/fromdir").commit("c1", commit).branch("main", "c1");
    let hub = FakeHub::start(model_agent_fakehub::Fixtures::new().repo(repo)).unwrap();
    assert_eq!(hub.paths("org/fromdir", "main").unwrap(), ["small.txt", "sub/big.bin"]);
    assert!(hub.file("org/fromdir", "main", "sub/big.bin").unwrap().lfs_sha256.is_some(), "≥ 1024 bytes: LFS");
    assert_eq!(get(&format!("{}/org/fromdir/resolve/main/small.txt", hub.endpoint())).body, b"small\n");
    let location =
        get(&format!("{}/org/fromdir/resolve/main/sub/big.bin", hub.endpoint())).header("location").unwrap().to_owned();
    assert_eq!(request("GET", &location, &[("Range", "bytes=4000-")]).body, vec![5u8; 96]);
    std::fs::remove_dir_all(&dir).unwrap();
}
