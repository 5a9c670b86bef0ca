//! A Hub that lies about sizes (found by a review: sums that wrapped, or panicked in a debug build).

use super::tests::{Root, job};
use super::*;

const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

/// A Hub answering the revision and tree APIs; every other request is a 404.
async fn lying_hub(tree: String) -> String {
    let answer = move |head: &str| {
        let path = head.split(' ').nth(1).unwrap_or("");
        if path.contains("/revision/") {
            ("200 OK", format!("{{\"sha\":\"{SHA}\"}}"))
        } else if path.contains("/tree/") {
            ("200 OK", tree.clone())
        } else {
            ("404 Not Found", String::new())
        }
    };
    let (port, _) = crate::canned_http::serve(None, answer).await;
    format!("http://127.0.0.1:{port}")
}

/// A tree whose LFS sizes add up past u64::MAX must end in a clear error, never a panic.
#[tokio::test]
async fn sizes_that_would_overflow_end_in_an_error_not_a_panic() {
    let lfs = |path: &str, size: u64| {
        format!(
            "{{\"type\":\"file\",\"path\":\"{path}\",\"size\":1,\"oid\":\"{}\",\"lfs\":{{\"oid\":\"{}\",\"size\":{size}}}}}",
            "ab".repeat(20),
            "cd".repeat(32)
        )
    };
    let tree = format!("[{},{}]", lfs("huge.bin", u64::MAX), lfs("one.bin", 1));
    let endpoint = lying_hub(tree).await;
    let root = Root::new("review-overflow");
    let opts = Options {
        endpoint,
        multipart_threshold_bytes: 1 << 20,
        stall_timeout_ms: 2_000,
        request_attempts_max: 1,
        ..Options::default()
    };
    let job = job(&root, "main");
    let (_keep, cancel) = watch::channel(false);
    let ended = tokio::spawn(async move { download(job, &opts, &mut |_| {}, cancel).await }).await;
    match ended {
        Err(join) => panic!("the download panicked: {join}"),
        Ok(ended) => {
            let e = ended.result.unwrap_err().to_string();
            assert!(e.contains("more than this agent takes (1 PiB)"), "{e}");
        }
    }
}
