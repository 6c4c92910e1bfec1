//! The server's bounds, with real TCP sockets against `serve_with` on an ephemeral port: idle
//! connections and trickled headers are closed after their timeouts, a large declared body is
//! refused before it is read, and requests are bounded in time and in number.
//!
//! Every wait is on a condition with a deadline; no test sleeps to dodge a race.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use wharf_api::{ApiState, HttpLimits};
use wharf_projections::ReadModel;
use wharf_store::{SqliteStore, Store};

/// How long any expected close or answer may take beyond its timeout.
const SLACK: Duration = Duration::from_secs(5);

struct Server {
    address: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

mod support;

async fn read_model() -> (ReadModel, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("w.db"), wharf_projections::sqlite_inline())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    (
        ReadModel::new(Store::Sqlite(store), Duration::from_secs(60)),
        dir,
    )
}

impl Server {
    async fn start(limits: HttpLimits) -> Self {
        let (read, dir) = read_model().await;
        Self::start_with(ApiState::new(read), limits, dir).await
    }

    async fn start_with(state: ApiState, limits: HttpLimits, dir: tempfile::TempDir) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(wharf_api::serve_with(listener, state, limits, async move {
            let _ = stopped.await;
        }));
        Self {
            address,
            stop,
            task,
            _dir: dir,
        }
    }

    async fn shut_down(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(SLACK, self.task)
            .await
            .expect("the server stops after the shutdown signal")
            .unwrap()
            .unwrap();
    }
}

fn limits(header: Duration, idle: Duration) -> HttpLimits {
    HttpLimits {
        header_read_timeout: header,
        idle_timeout: idle,
        ..HttpLimits::default()
    }
}

/// Reads until the peer closes (EOF or reset), within `deadline`; returns what was read.
async fn until_closed(stream: &mut TcpStream, deadline: Duration) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(deadline, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the connection was still open after {deadline:?}"));
    seen
}

/// Reads one response (head and a `Content-Length` body) from a kept-alive connection.
async fn read_response(stream: &mut TcpStream) -> (String, String) {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(SLACK, async {
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before a response: {:?}",
                String::from_utf8_lossy(&data)
            );
            data.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&data).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let head = text[..end].to_owned();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                if text.len() >= end + 4 + length {
                    return (head, text[end + 4..end + 4 + length].to_owned());
                }
            }
        }
    })
    .await
    .expect("a response within the deadline")
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let idle = Duration::from_millis(400);
    let server = Server::start(limits(Duration::from_secs(30), idle)).await;

    let mut stream = TcpStream::connect(server.address).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_response(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, r#"{"status":"pass"}"#);
    let answered = Instant::now();
    until_closed(&mut stream, idle + SLACK).await;
    assert!(
        answered.elapsed() >= idle - Duration::from_millis(50),
        "closed after {:?}, before the idle timeout",
        answered.elapsed()
    );

    // A connection that never sends anything is closed too.
    let mut silent = TcpStream::connect(server.address).await.unwrap();
    until_closed(&mut silent, idle + SLACK).await;
    server.shut_down().await;
}

#[tokio::test]
async fn a_header_trickled_line_by_line_is_closed_after_the_header_timeout() {
    let header = Duration::from_millis(500);
    let server = Server::start(limits(header, Duration::from_secs(30))).await;

    let mut stream = TcpStream::connect(server.address).await.unwrap();
    let started = Instant::now();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut sent = 0u32;
    let mut buf = [0u8; 1024];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let closed = tokio::time::timeout(header + SLACK, async {
        loop {
            tokio::select! {
                read = stream.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => panic!("answered a half-sent request: {:?}", String::from_utf8_lossy(&buf[..n])),
                },
                _ = tick.tick() => {
                    sent += 1;
                    let line = format!("X-Trickle-{sent}: a\r\n");
                    if stream.write_all(line.as_bytes()).await.is_err() {
                        return;
                    }
                }
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "a trickled header was still open after {:?}",
        started.elapsed()
    );
    assert!(
        sent >= 3,
        "the header was still trickling when it was closed ({sent} lines)"
    );
    assert!(started.elapsed() >= header - Duration::from_millis(50));
    server.shut_down().await;
}

#[tokio::test]
async fn a_large_declared_body_on_a_get_is_refused_before_it_is_read() {
    let server = Server::start(HttpLimits::default()).await;
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    let size = 10 * 1024 * 1024;
    stream
        .write_all(
            format!("GET /api/v1/groups HTTP/1.1\r\nHost: test\r\nContent-Length: {size}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    stream.write_all(&[b'x'; 1024]).await.unwrap();
    let (head, body) = read_response(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    let content_type = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    support::contract::assert_conforms("GET", "/api/v1/groups", 413, &content_type, &body);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&size.to_string()),
        "{body}"
    );
    server.shut_down().await;
}

#[tokio::test]
async fn requests_are_bounded_in_time_and_in_number() {
    let (read, dir) = read_model().await;
    let entered = Arc::new(Notify::new());
    let probe = {
        let entered = entered.clone();
        move || {
            let entered = entered.clone();
            async move {
                entered.notify_one();
                std::future::pending::<()>().await;
                Ok(())
            }
        }
    };
    let state = ApiState::with_readiness(read, probe).ready_timeout(Duration::from_secs(600));
    let request_timeout = Duration::from_millis(500);
    let limits = HttpLimits {
        request_timeout,
        max_concurrent_requests: 1,
        ..HttpLimits::default()
    };
    let server = Server::start_with(state, limits, dir).await;
    let client = reqwest::Client::new();

    // A stuck handler is answered with the JSON `timeout` error when the request timeout ends.
    let sent = Instant::now();
    let stuck = {
        let client = client.clone();
        let url = format!("http://{}/readyz", server.address);
        tokio::spawn(async move {
            let response = client.get(url).send().await.unwrap();
            let status = response.status().as_u16();
            let content_type = content_type(&response);
            let text = response.text().await.unwrap();
            support::contract::assert_conforms("GET", "/readyz", status, &content_type, &text);
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap(),
                sent.elapsed(),
            )
        })
    };
    tokio::time::timeout(SLACK, entered.notified())
        .await
        .expect("the probe runs");
    // While it holds the only permit, the liveness probe waits: it is answered only once the
    // stuck request's timeout (which began after `sent`) has released the permit.
    let response = client
        .get(format!("http://{}/healthz", server.address))
        .send()
        .await
        .unwrap();
    healthz_conforms(response).await;
    assert!(
        sent.elapsed() >= request_timeout,
        "answered after {:?}, while the only permit was held",
        sent.elapsed()
    );

    let (status, body, took) = tokio::time::timeout(SLACK, stuck).await.unwrap().unwrap();
    assert_eq!(
        (status, &body["error"]["code"]),
        (503, &Value::from("timeout")),
        "{body}"
    );
    assert!(took >= request_timeout, "{took:?}");

    // With the permit free again, requests are answered.
    let response = client
        .get(format!("http://{}/healthz", server.address))
        .send()
        .await
        .unwrap();
    healthz_conforms(response).await;
    server.shut_down().await;
}

fn content_type(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// A `/healthz` answer: 200, held to the document.
async fn healthz_conforms(response: reqwest::Response) {
    let status = response.status().as_u16();
    assert_eq!(status, 200);
    let content_type = content_type(&response);
    let text = response.text().await.unwrap();
    support::contract::assert_conforms("GET", "/healthz", status, &content_type, &text);
}
