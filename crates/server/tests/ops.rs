//! Operations: readiness (`/readyz` 200 → 503 → 200 as the slots fill and free), the idle timeout
//! (a silent client is closed with a reason, its slot freed and the close counted; a talking one is
//! not), on the echo test double over real loopback WebSockets.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use server::ServeConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

/// Status code and body of `GET path`.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut v = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut v))
        .await
        .expect("no answer")
        .unwrap();
    let text = String::from_utf8_lossy(&v).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (code, body)
}

/// Polls `/readyz` until it answers `code` (the slot is freed by the connection's task a moment
/// after the client's close).
async fn until_ready(addr: std::net::SocketAddr, code: u16) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (c, body) = get(addr, "/readyz").await;
        if c == code {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz stayed {c} ({body}), wanted {code}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn readyz_flips_with_the_free_slots_and_healthz_does_not() {
    let srv = start_echo(2, 4).await;
    assert_eq!(get(srv.addr, "/readyz").await.0, 200);
    let a = ready(&srv, "").await;
    // One of two slots taken: still admits.
    let (code, body) = get(srv.addr, "/readyz").await;
    assert_eq!((code, body.as_str()), (200, "1 of 2 slots free\n"));
    let b = ready(&srv, "").await;
    let body = until_ready(srv.addr, 503).await;
    assert_eq!(body, "0 of 2 slots free\n");
    // Liveness is unaffected by load.
    assert_eq!(get(srv.addr, "/healthz").await.0, 200);
    drop(a);
    until_ready(srv.addr, 200).await;
    drop(b);
    // 200 already (one slot was free): wait for the second slot to come back too.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while get(srv.addr, "/readyz").await != (200, "2 of 2 slots free\n".to_string()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a slot was not freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(get(srv.addr, "/metrics")
        .await
        .1
        .contains("moshi_sessions_max 2\n"));
    srv.shutdown().await.unwrap();
}

/// An echo server of one slot that closes a conversation after `secs` seconds without audio.
async fn echo_with_idle_timeout(secs: u64) -> Running {
    let config = ServeConfig {
        idle_timeout: Some(Duration::from_secs(secs)),
        ..cfg(1, 0)
    };
    start(config, Arc::new(server::testing::EchoBackend::default())).await
}

#[tokio::test]
async fn a_silent_client_is_closed_with_a_reason_and_its_slot_freed() {
    let srv = echo_with_idle_timeout(1).await;
    let mut ws = ready(&srv, "").await;
    until_ready(srv.addr, 503).await;
    // Nothing sent: an error message naming the cause, then a close frame with the reason.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (mut error, mut close) = (None, None);
    while let Ok(Some(m)) = tokio::time::timeout_at(deadline, ws.next()).await {
        match m {
            Ok(Message::Binary(b)) if b.first() == Some(&5) => {
                error = Some(String::from_utf8_lossy(&b[1..]).into_owned())
            }
            Ok(Message::Close(f)) => {
                close = f.map(|f| (u16::from(f.code), f.reason.to_string()));
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    assert_eq!(error.as_deref(), Some("idle: no audio for 1 s"));
    assert_eq!(close, Some((1008, "idle: no audio for 1 s".to_string())));
    assert_eq!(srv.metrics.sessions_idle_closed.load(Relaxed), 1);
    until_ready(srv.addr, 200).await;
    assert!(get(srv.addr, "/metrics")
        .await
        .1
        .contains("moshi_sessions_idle_closed_total 1\n"));
    srv.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_talking_client_is_not_closed_by_the_idle_timeout() {
    let srv = echo_with_idle_timeout(1).await;
    let mut ws = ready(&srv, "").await;
    let mut enc = BrowserEncoder::new(7);
    // Three idle timeouts' worth of audio in real time.
    for i in 0..150 {
        let page = enc.push(&tone(480, i * 480, 300.0));
        if !page.is_empty() {
            let mut m = vec![1u8];
            m.extend_from_slice(&page);
            ws.send(Message::Binary(m.into())).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Read what came back, so the echo's output never backs up.
        while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(1), ws.next()).await {
            match m {
                Ok(Message::Close(f)) => panic!("closed while talking: {f:?}"),
                Ok(Message::Binary(b)) if b.first() == Some(&5) => {
                    panic!("error while talking: {}", String::from_utf8_lossy(&b[1..]))
                }
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
    }
    assert_eq!(srv.metrics.sessions_idle_closed.load(Relaxed), 0);
    assert_eq!(srv.metrics.sessions_active.load(Relaxed), 1);
    srv.shutdown().await.unwrap();
}
