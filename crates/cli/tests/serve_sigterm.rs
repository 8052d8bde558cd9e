//! SIGTERM to a real `moshi-native serve --model demo` child process with sessions active and a
//! client waiting for a slot: the process exits with code 0 within a few seconds, without a panic,
//! and every client sees its connection closed. A minimal blocking WebSocket client (RFC 6455
//! framing by hand) keeps the test free of extra dependencies; the audio is real Ogg/Opus.
#![cfg(unix)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut v = String::new();
    s.read_to_string(&mut v).ok()?;
    Some(v)
}

fn metric(port: u16, name: &str) -> Option<u64> {
    let body = http_get(port, "/metrics")?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A blocking WebSocket client connection.
struct Ws {
    s: TcpStream,
}

impl Ws {
    fn connect(port: u16) -> Ws {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "GET /api/chat HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut b).unwrap();
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "upgrade refused: {head}");
        Ws { s }
    }

    /// Next message as (opcode, payload); None on EOF or error.
    fn read(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut h = [0u8; 2];
        self.s.read_exact(&mut h).ok()?;
        let op = h[0] & 0x0f;
        let mut len = u64::from(h[1] & 0x7f);
        if len == 126 {
            let mut b = [0u8; 2];
            self.s.read_exact(&mut b).ok()?;
            len = u64::from(u16::from_be_bytes(b));
        } else if len == 127 {
            let mut b = [0u8; 8];
            self.s.read_exact(&mut b).ok()?;
            len = u64::from_be_bytes(b);
        }
        assert!(h[1] & 0x80 == 0, "server frames are never masked");
        assert!(len < 1 << 24, "absurd frame length {len}");
        let mut p = vec![0u8; len as usize];
        self.s.read_exact(&mut p).ok()?;
        Some((op, p))
    }

    fn send_binary(&mut self, payload: &[u8]) -> bool {
        let mask = [0x12u8, 0x34, 0x56, 0x78];
        let mut f = vec![0x82u8];
        let n = payload.len();
        if n < 126 {
            f.push(0x80 | n as u8);
        } else if n < 1 << 16 {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.s.write_all(&f).is_ok()
    }

    /// Reads until the handshake (kind 0); returns the kinds seen before it.
    fn wait_handshake(&mut self) -> Vec<u8> {
        let mut kinds = Vec::new();
        while let Some((op, p)) = self.read() {
            if op == 2 && !p.is_empty() {
                if p[0] == 0 {
                    return kinds;
                }
                kinds.push(p[0]);
            }
            assert!(op != 8, "closed before the handshake");
        }
        panic!("no handshake");
    }
}

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
            let pcm: Vec<f32> = (0..1920)
                .map(|k| {
                    let t = (i * 1920 + k) as f32 / 24_000.0;
                    0.3 * (std::f32::consts::TAU * (200.0 + seed as f32) * t).sin()
                })
                .collect();
            let mut m = vec![1u8];
            enc.push(&pcm, &mut m).unwrap();
            if !ws.send_binary(&m) {
                return;
            }
            let next = start + Duration::from_millis(80 * (i + 1));
            if let Some(d) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
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
