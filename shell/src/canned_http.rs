//! A loopback HTTP/1.1 server for unit tests: each request is answered from its head (request
//! line and headers) by the test's function, as the lying or endless servers of the Hub and store
//! tests need, with the requests counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a test's server answers to one request: the status line's text ("200 OK") and the body.
pub type Answer = (&'static str, String);

/// Serves on a loopback port until the test ends; `content_type`, when given, is sent with every
/// answer. Returns the port and the count of requests answered.
pub async fn serve(
    content_type: Option<&'static str>,
    answer: impl Fn(&str) -> Answer + Send + Sync + 'static,
) -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (requests, answer) = (Arc::new(AtomicUsize::new(0)), Arc::new(answer));
    let counted = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (counted, answer) = (counted.clone(), answer.clone());
            tokio::spawn(async move {
                let (mut buf, mut chunk) = (Vec::new(), [0u8; 4096]);
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_string();
                        buf.drain(..end + 4);
                        counted.fetch_add(1, Ordering::Relaxed);
                        let (status, body) = answer(&head);
                        let typed = content_type.map(|t| format!("Content-Type: {t}\r\n")).unwrap_or_default();
                        let sent = format!("HTTP/1.1 {status}\r\n{typed}Content-Length: {}\r\n\r\n{body}", body.len());
                        if socket.write_all(sent.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    (port, requests)
}
