//! `--auth-token` (HTTP 401 before any model work; the token as a Bearer header or as Kyutai's
//! `worker_auth_id` query parameter) and the client commands (pause, resume, reset, interrupt)
//! reaching the backend over the control message.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures_util::SinkExt;
use server::protocol::{SessionCommand, KIND_CONTROL};
use server::testing::EchoBackend;
use server::ServeConfig;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

const TOKEN: &str = "s3cret token/ü";

fn with_token() -> ServeConfig {
    ServeConfig {
        max_sessions: 2,
        max_queue: 2,
        auth_token: Some(TOKEN.into()),
        ..ServeConfig::default()
    }
}

/// The HTTP status of a refused WebSocket upgrade, or `None` if the upgrade succeeded.
async fn refused_status(request: tungstenite::handshake::client::Request) -> Option<u16> {
    match tokio_tungstenite::connect_async(request).await {
        Ok(_) => None,
        Err(tungstenite::Error::Http(resp)) => Some(resp.status().as_u16()),
        Err(e) => panic!("unexpected client error: {e}"),
    }
}

/// A short conversation: some audio in, some echoed audio and text out.
async fn talks(mut ws: Ws) {
    expect_ready(&mut ws).await;
    let r = converse_briefly(ws, 20, Duration::from_millis(10)).await;
    let (_, packets) = decode_all(&r.audio_bytes);
    assert!(packets >= 10, "{packets} packets");
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_is_required_and_accepted_from_header_or_query() {
    let srv = start(with_token(), Arc::new(EchoBackend::default())).await;
    let encoded = "s3cret%20token%2F%C3%BC";

    // Without a token, or with a wrong one: 401, no session, no metadata.
    for url in [
        srv.url(""),
        srv.url("?worker_auth_id=s3cret"),
        srv.url("?email=a%40b.c&text_topk=9"),
    ] {
        let req = url.as_str().into_client_request().unwrap();
        assert_eq!(refused_status(req).await, Some(401), "{url}");
    }
    let mut req = srv.url("").into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", "Bearer wrong".parse().unwrap());
    assert_eq!(refused_status(req).await, Some(401));
    assert_eq!(srv.metrics.unauthorized.load(Relaxed), 4);
    assert_eq!(srv.metrics.sessions_total.load(Relaxed), 0);
    assert_eq!(srv.metrics.connections_open.load(Relaxed), 0);

    // With the token as a Bearer header.
    let mut req = srv.url("?text_seed=1").into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let (ws, _) = tokio_tungstenite::connect_async(req).await.expect("header");
    talks(ws).await;

    // With the token as Kyutai's web client sends it (among its other query parameters).
    let ws = connect(&srv.url(&format!(
        "?text_temperature=0.7&email=a%40b.c&worker_auth_id={encoded}"
    )))
    .await;
    talks(ws).await;

    assert_eq!(srv.metrics.sessions_total.load(Relaxed), 2);
    assert_eq!(srv.metrics.unauthorized.load(Relaxed), 4);
    // Other routes stay open (health checks, metrics scrapers).
    assert_eq!(http_get(srv.addr, "/healthz").await.0, 200);
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_configured_means_open() {
    let srv = start(ServeConfig::default(), Arc::new(EchoBackend::default())).await;
    talks(connect(&srv.url("?worker_auth_id=anything")).await).await;
    assert_eq!(srv.metrics.unauthorized.load(Relaxed), 0);
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_token_is_refused_at_start() {
    let r = server::Server::bind(
        ServeConfig {
            port: 0,
            auth_token: Some(String::new()),
            ..ServeConfig::default()
        },
        Arc::new(EchoBackend::default()),
    )
    .await;
    assert!(matches!(r, Err(server::ServerError::Config(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_messages_reach_the_session() {
    let backend = EchoBackend::default();
    let seen = backend.commands.clone();
    let srv = start(ServeConfig::default(), Arc::new(backend)).await;
    let mut ws = ready(&srv, "").await;
    // Kyutai's Start/EndTurn (0, 1), an unknown code and an empty control are ignored.
    let sent = [
        SessionCommand::Pause,
        SessionCommand::Resume,
        SessionCommand::Reset,
        SessionCommand::Interrupt,
    ];
    for payload in [vec![0u8], vec![1], vec![200], vec![]] {
        assert!(send_bin(&mut ws, KIND_CONTROL, &payload).await);
    }
    for c in sent {
        assert!(send_bin(&mut ws, KIND_CONTROL, &[c.to_byte()]).await);
    }
    assert!(
        eventually(10, || seen.lock().unwrap().len() == sent.len()).await,
        "{:?}",
        seen.lock().unwrap()
    );
    assert_eq!(*seen.lock().unwrap(), sent);
    for c in sent {
        assert_eq!(srv.metrics.commands[c.index()].load(Relaxed), 1, "{c:?}");
    }
    let (status, body) = http_get(srv.addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("moshi_session_commands_total{command=\"interrupt\"} 1"),
        "{body}"
    );
    // The connection is still usable after the commands.
    let _ = ws.send(Message::Close(None)).await;
    srv.shutdown().await.unwrap();
}

#[test]
fn command_bytes_round_trip() {
    for c in SessionCommand::ALL {
        assert_eq!(SessionCommand::from_byte(c.to_byte()), Some(c));
        assert_eq!(SessionCommand::ALL[c.index()], c);
    }
    assert_eq!(SessionCommand::from_byte(0), None);
    assert_eq!(SessionCommand::from_byte(1), None);
}
