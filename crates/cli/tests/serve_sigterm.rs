//! SIGTERM to a real `moshi-native serve --model demo` child process with sessions active and a
//! client waiting for a slot: the process exits with code 0 within a few seconds, without a panic,
//! and every client sees its connection closed. A minimal blocking WebSocket client (RFC 6455
//! framing by hand) keeps the test free of extra dependencies; the audio is real Ogg/Opus.
#![cfg(unix)]

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{free_port, metric, send_tone_frame, Ws};

#[derive(Default)]
struct ClientLog {
    audio_messages: AtomicU64,
    closed: AtomicBool,
}

/// Streams real-time Ogg/Opus from one thread and reads everything from another.
fn converse(mut ws: Ws, seed: u32) -> (Arc<ClientLog>, std::thread::JoinHandle<()>) {
    let log = Arc::new(ClientLog::default());
    let mut rd = Ws {
        s: ws.s.try_clone().unwrap(),
    };
    let l = log.clone();
    let reader = std::thread::spawn(move || {
        while let Some((op, p)) = rd.read() {
            if op == 8 {
                break;
            }
            if op == 2 && p.first() == Some(&1) {
                l.audio_messages.fetch_add(1, Relaxed);
            }
        }
        l.closed.store(true, Relaxed);
    });
    std::thread::spawn(move || {
        let mut enc = server::codec::OggOpusEncoder::new().unwrap();
        let start = Instant::now();
        for i in 0..600u64 {
            if !send_tone_frame(&mut ws, &mut enc, i, 200.0 + seed as f32, start) {
                return;
            }
        }
    });
    (log, reader)
}

#[test]
fn sigterm_with_active_sessions_exits_cleanly() {
    let port = free_port();
    let dir = testkit::ScratchDir::new("sigterm-serve");
    let log_path = dir.join("stderr.txt");
    let mut child = Command::new(env!("CARGO_BIN_EXE_moshi-native"))
        .env("XDG_CACHE_HOME", dir.join("xdg"))
        .env("RUST_LOG", "info")
        .args(["serve", "--model", "demo", "--host", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .args(["--max-sessions", "2", "--max-queue", "1"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let up = Instant::now();
    while metric(port, "moshi_sessions_active").is_none() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "server exited early: {}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        assert!(
            up.elapsed() < Duration::from_secs(60),
            "server never came up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut a = Ws::connect(port);
    assert_eq!(a.wait_handshake(), vec![4], "metadata then handshake");
    let mut b = Ws::connect(port);
    b.wait_handshake();
    let (la, ra) = converse(a, 1);
    let (lb, rb) = converse(b, 2);
    // A third client waits for a slot.
    let mut c = Ws::connect(port);
    let (op, meta) = c.read().unwrap();
    assert_eq!((op, meta[0]), (2, 4));
    let t = Instant::now();
    while la.audio_messages.load(Relaxed) < 5 || lb.audio_messages.load(Relaxed) < 5 {
        assert!(t.elapsed() < Duration::from_secs(20), "no audio back");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric(port, "moshi_sessions_active"), Some(2));
    assert_eq!(metric(port, "moshi_sessions_waiting"), Some(1));

    let st = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("server still running 20 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stop_ms = t.elapsed().as_millis();
    let stderr = std::fs::read_to_string(&log_path).unwrap();
    eprintln!("exit {status:?} {stop_ms} ms after SIGTERM\n{stderr}");
    assert_eq!(status.code(), Some(0), "exit status; stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
    ra.join().unwrap();
    rb.join().unwrap();
    assert!(la.closed.load(Relaxed) && lb.closed.load(Relaxed));
    // The waiting client's connection ends too (close frame, then EOF).
    while c.read().is_some() {}
    // Nothing listens any more.
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}
