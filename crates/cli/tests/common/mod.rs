//! What the CLI's process-level `serve` tests share: a free port, plain HTTP GETs, one metric of
//! `/metrics`, the binary with its caches in the test's own folders, and a minimal blocking WebSocket client (RFC 6455 framing by hand, so the tests need
//! no extra dependency). Each test binary uses a part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use testkit::ScratchDir;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn http_get(port: u16, path: &str) -> Option<String> {
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

/// Polls `/readyz` every 100 ms until its answer contains `needle` and returns that answer; panics
/// with the last answer after `limit`.
pub fn wait_ready(port: u16, needle: &str, limit: Duration) -> String {
    let t = std::time::Instant::now();
    loop {
        match http_get(port, "/readyz") {
            Some(r) if r.contains(needle) => return r,
            _ if t.elapsed() < limit => std::thread::sleep(Duration::from_millis(100)),
            other => panic!("no readiness: {other:?}"),
        }
    }
}

/// Starts `moshi-native serve <args> --port P` on a free port P, stdout dropped and stderr piped
/// (for [`sigterm_exit`]): the process and P.
pub fn spawn_serve(args: &[&str]) -> (Child, u16) {
    let port = free_port();
    let child = bin()
        .arg("serve")
        .args(args)
        .args(["--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, port)
}

/// [`spawn_serve`] of the demo speech-to-text bundle on one thread, with `flags`.
pub fn spawn_demo_stt(flags: &[&str]) -> (Child, u16) {
    let args: Vec<&str> = ["--model", "demo-stt", "--threads", "1"]
        .iter()
        .chain(flags)
        .copied()
        .collect();
    spawn_serve(&args)
}

/// Sends SIGTERM to a `serve` child (stderr piped), waits for it, checks that it exited with 0 and
/// returns its stderr.
pub fn sigterm_exit(child: Child) -> String {
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{err}");
    err
}

/// The token ids of a JSON `Word` event (its `tokens` array).
pub fn word_tokens(word: &serde_json::Value) -> Vec<u32> {
    word["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

pub fn metric(port: u16, name: &str) -> Option<u64> {
    let body = http_get(port, "/metrics")?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Sends frame `i` (80 ms at 24 kHz of a 0.3-amplitude sine of `hz`, continuous across frames) as
/// an audio message encoded by `enc`, then sleeps until that frame's real-time end counted from
/// `start`. False when the socket is gone.
pub fn send_tone_frame(
    ws: &mut Ws,
    enc: &mut server::codec::OggOpusEncoder,
    i: u64,
    hz: f32,
    start: std::time::Instant,
) -> bool {
    let pcm: Vec<f32> = (0..1920)
        .map(|k| {
            let t = (i * 1920 + k) as f32 / 24_000.0;
            0.3 * (std::f32::consts::TAU * hz * t).sin()
        })
        .collect();
    let mut m = vec![1u8];
    enc.push(&pcm, &mut m).unwrap();
    if !ws.send_binary(&m) {
        return false;
    }
    let next = start + Duration::from_millis(80 * (i + 1));
    if let Some(d) = next.checked_duration_since(std::time::Instant::now()) {
        std::thread::sleep(d);
    }
    true
}

/// A blocking WebSocket client connection.
pub struct Ws {
    /// The connection (tests clone it to read and write from two threads).
    pub s: TcpStream,
}

impl Ws {
    pub fn connect(port: u16) -> Ws {
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
    pub fn read(&mut self) -> Option<(u8, Vec<u8>)> {
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

    pub fn send_binary(&mut self, payload: &[u8]) -> bool {
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

    pub fn close(mut self) {
        // A masked close frame with no payload, then wait for the server's close.
        let _ = self.s.write_all(&[0x88, 0x80, 1, 2, 3, 4]);
        while let Some((op, _)) = self.read() {
            if op == 8 {
                break;
            }
        }
    }

    /// Reads until the handshake (kind 0); returns the kinds seen before it.
    pub fn wait_handshake(&mut self) -> Vec<u8> {
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

/// The binary under test, with its caches inside this test process's own folders.
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moshi-native"));
    // Keep the demo bundle and any hub lookups inside the test's own folders.
    c.env("XDG_CACHE_HOME", caches().join("xdg"))
        .env("HF_HUB_CACHE", caches().join("hub"))
        .env_remove("MOSHI_MODEL_DIR");
    c
}

/// The cache folders every run of this process shares (the demo bundle is written once). A
/// static is never dropped, so they stay, as any user's cache would.
pub fn caches() -> &'static Path {
    static DIR: OnceLock<ScratchDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = ScratchDir::new("cli-caches");
        for sub in ["xdg", "hub"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        d
    })
}

/// The checkout's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fixture bundle (`fixtures/lm`) on a GPU context the test holds, to read its counters
/// (`submissions()`, `waits()`); `opts.device` must be the GPU.
pub fn gpu_fixture_engine(
    opts: runtime::EngineOptions,
) -> (std::sync::Arc<runtime::Engine>, gpu::GpuContext) {
    let ctx =
        gpu::GpuContext::new(gpu::AdapterChoice::Gpu(None), gpu::GpuOptions::default()).unwrap();
    let m = model::MoshiModel::open(&root().join("fixtures/lm")).unwrap();
    let tokenizer = Some(std::sync::Arc::new(m.tokenizer));
    let mimi = std::sync::Arc::new(m.mimi);
    let e = runtime::Engine::from_parts_on(m.lm, mimi, tokenizer, opts, ctx.clone()).unwrap();
    (e, ctx)
}
