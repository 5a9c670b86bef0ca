//! Shared by the integration tests: the fixture repos and a minimal HTTP/1.1 client over a raw socket,
//! which shows exactly what the server sent (a short body, a closed or stalled connection).
#![allow(dead_code)] // each test binary uses a part

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use model_agent_fakehub::{CommitFixture, Config, FakeHub, Fixtures, RepoFixture};

pub const MODEL: &str = "org/model";
pub const PRIVATE: &str = "org/private";
pub const PRIVATE_TOKEN: &str = "hf_private_token";
pub const GATED: &str = "org/gated";
pub const GATED_API: &str = "org/gated-api";
pub const GRANTED_TOKEN: &str = "hf_granted_token";
pub const WEIGHTS: &str = "model.safetensors";
pub const WEIGHTS_BYTES: u64 = 300_000;

/// `org/model`: c1 (tag v1.0, branches dev and refs/pr/1) and c2 (main) differ in one regular file, one
/// LFS file and one added file; nested directories; regular and LFS files.
pub fn fixtures() -> Fixtures {
    let c1 = CommitFixture::new()
        .file("config.json", "{\"model_type\": \"llama\"}\n")
        .file("README.md", "# model\n")
        .file("tokenizer/tokenizer.json", "{\"version\": \"1.0\"}\n")
        .file("tokenizer/extra/special.txt", "<s>\n")
        .generated_lfs(WEIGHTS, WEIGHTS_BYTES, 1)
        .generated_lfs("weights/part-00001.bin", 70_000, 2);
    let c2 = c1
        .clone()
        .file("config.json", "{\"model_type\": \"llama\", \"v\": 2}\n")
        .generated_lfs("weights/part-00001.bin", 70_001, 3)
        .lfs_file("added.bin", vec![7u8; 1000]);
    let model = RepoFixture::new(MODEL)
        .commit("c1", c1)
        .commit("c2", c2)
        .branch("main", "c2")
        .branch("dev", "c1")
        .branch("refs/pr/1", "c1")
        .tag("v1.0", "c1");
    let small = || CommitFixture::new().file("config.json", "{}\n").generated_lfs("w.bin", 10_000, 9);
    let private = RepoFixture::new(PRIVATE).commit("c1", small()).branch("main", "c1").private(PRIVATE_TOKEN);
    let gated = RepoFixture::new(GATED).commit("c1", small()).branch("main", "c1").gated(&[GRANTED_TOKEN]);
    let gated_api =
        RepoFixture::new(GATED_API).commit("c1", small()).branch("main", "c1").gated_api_too(&[GRANTED_TOKEN]);
    Fixtures::new().repo(model).repo(private).repo(gated).repo(gated_api)
}

/// The fixtures with tree pages of 3 entries.
pub fn start() -> FakeHub {
    FakeHub::start_with(fixtures(), Config { tree_page_size: 3, ..Config::default() }).expect("fake hub starts")
}

/// How a response body ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The server closed the connection after the body.
    Closed,
    /// The connection was reset.
    Reset,
    /// No byte within the read timeout.
    Timeout,
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub end: End,
    pub elapsed: Duration,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length").map(|v| v.parse().expect("numeric Content-Length"))
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
}

pub fn get(url: &str) -> Reply {
    request("GET", url, &[])
}

pub fn request(method: &str, url: &str, headers: &[(&str, &str)]) -> Reply {
    request_with_timeout(method, url, headers, Duration::from_secs(10))
}

/// One request on a fresh connection (`Connection: close`); reads until the server closes, resets or
/// goes quiet for `read_timeout`.
pub fn request_with_timeout(method: &str, url: &str, headers: &[(&str, &str)], read_timeout: Duration) -> Reply {
    let rest = url.strip_prefix("http://").expect("http URL");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let mut stream = TcpStream::connect(authority).expect("connect");
    stream.set_read_timeout(Some(read_timeout)).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let started = Instant::now();
    let (raw, end) = read_all(&mut stream);
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response head");
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| l.split_once(':').expect("header line"))
        .map(|(n, v)| (n.to_owned(), v.trim().to_owned()))
        .collect();
    assert!(
        !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding")),
        "this client reads no chunked bodies"
    );
    Reply { status, headers, body: raw[split + 4..].to_vec(), end, elapsed: started.elapsed() }
}

fn read_all(stream: &mut TcpStream) -> (Vec<u8>, End) {
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (raw, End::Closed),
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return (raw, End::Timeout),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return (raw, End::Reset),
        }
    }
}

/// The bytes the fixture holds at `path` of `revision`.
pub fn fixture_bytes(hub: &FakeHub, repo: &str, revision: &str, path: &str) -> Vec<u8> {
    hub.file(repo, revision, path).expect("fixture file").content.to_vec().unwrap()
}
