//! `moshi-native serve --model demo-stt` as a process: it says it runs the demo speech-to-text model,
//! serves `/api/asr-streaming` (not `/api/chat`), `/readyz` counts its streams, `/metrics` has the
//! `moshi_stt_*` counters, and SIGTERM ends it with code 0. The protocol itself is tested in
//! `crates/server/tests/asr_replay.rs`.
#![cfg(unix)]

use std::time::Duration;

mod common;

use common::{http_get, metric, sigterm_exit, spawn_demo_stt, wait_ready};

#[test]
fn serve_demo_stt_answers_on_the_asr_route() {
    let (child, port) = spawn_demo_stt(&["--max-sessions", "3"]);
    let ready = wait_ready(port, "streams free", Duration::from_secs(60));
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    assert!(
        ready.contains("3 of 3 speech-to-text streams free"),
        "{ready}"
    );
    assert_eq!(metric(port, "moshi_stt_streams_max"), Some(3));
    let chat = http_get(port, "/api/chat").unwrap();
    assert!(chat.starts_with("HTTP/1.1 404"), "{chat}");
    // The route exists: a plain GET without the upgrade is refused by the WebSocket extractor, not 404.
    let asr = http_get(port, "/api/asr-streaming").unwrap();
    assert!(!asr.starts_with("HTTP/1.1 404"), "{asr}");
    let err = sigterm_exit(child);
    assert!(err.contains(embed::demo_stt::LABEL), "{err}");
    assert!(err.contains("/api/asr-streaming"), "{err}");
}
