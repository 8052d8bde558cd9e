//! Shared helpers of the server integration tests: a server on loopback, a real WebSocket client,
//! real Opus encoding (browser-like and Python-client-like framings) and decoding.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use server::backend::{Backend, BackendInfo, RuntimeBackend};
use server::{ServeConfig, Server};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The oracle's tiny Moshi bundle (`fixtures/lm`: exact architecture, random weights), default
/// engine options.
pub fn tiny_engine() -> Arc<runtime::Engine> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm");
    runtime::Engine::open(&dir, runtime::EngineOptions::default()).expect("tiny bundle")
}

/// A runtime backend on [`tiny_engine`]: its metadata names the bundle's files and
/// `instance_name`; the other settings are the defaults.
pub fn tiny_backend(instance_name: &str) -> RuntimeBackend {
    RuntimeBackend::new(
        tiny_engine(),
        BackendInfo {
            lm_model_file: "model.safetensors".into(),
            mimi_model_file: "tokenizer-e351c8d8-checkpoint125.safetensors".into(),
            instance_name: instance_name.into(),
            ..Default::default()
        },
    )
}

pub struct Running {
    pub addr: SocketAddr,
    pub metrics: Arc<server::metrics::Metrics>,
    stop: Option<oneshot::Sender<()>>,
    pub done: tokio::task::JoinHandle<Result<(), server::ServerError>>,
}

impl Running {
    /// Triggers graceful shutdown and waits for `run_until` to return.
    pub async fn shutdown(mut self) -> Result<(), server::ServerError> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(Duration::from_secs(20), &mut self.done)
            .await
            .expect("server did not stop")
            .expect("server task panicked")
    }

    pub fn url(&self, query: &str) -> String {
        format!("ws://{}/api/chat{}", self.addr, query)
    }
}

/// A server configuration with `max_sessions` slots and `max_queue` waiting places.
pub fn cfg(max_sessions: usize, max_queue: usize) -> ServeConfig {
    ServeConfig {
        max_sessions,
        max_queue,
        ..ServeConfig::default()
    }
}

/// A server of `backend` with `config` on loopback (a port the system picks), running until
/// [`Running::shutdown`].
pub async fn start(config: ServeConfig, backend: Arc<dyn Backend>) -> Running {
    launch(bind(config, backend).await)
}

/// `config` bound on loopback, on a port the system picks, not yet serving.
pub async fn bind(config: ServeConfig, backend: Arc<dyn Backend>) -> Server {
    let config = ServeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        ..config
    };
    Server::bind(config, backend).await.expect("bind")
}

/// Runs a bound server until [`Running::shutdown`].
pub fn launch(server: Server) -> Running {
    let addr = server.local_addr();
    let metrics = server.metrics();
    let (tx, rx) = oneshot::channel::<()>();
    let done = tokio::spawn(server.run_until(async move {
        let _ = rx.await;
    }));
    Running {
        addr,
        metrics,
        stop: Some(tx),
        done,
    }
}

/// A loopback server of the echo test double (no model) admitting `max_sessions` conversations
/// and queueing `max_queue` more.
pub async fn start_echo(max_sessions: usize, max_queue: usize) -> Running {
    start(
        cfg(max_sessions, max_queue),
        Arc::new(server::testing::EchoBackend::default()),
    )
    .await
}

pub async fn connect(url: &str) -> Ws {
    let (ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("connect");
    ws
}

/// Next binary message (skipping pings of kind 6), or None on close/timeout. `timeout` is one
/// deadline for the whole wait: the server's keep-alive pings (every few seconds) must not restart
/// it, or a server that never answers would keep the caller waiting forever instead of failing.
pub async fn next_bin(ws: &mut Ws, timeout: Duration) -> Option<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => {
                if b.first() == Some(&6) {
                    continue;
                }
                return Some(b.to_vec());
            }
            Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) | Err(_) => return None,
            Ok(Some(Ok(_))) => continue,
        }
    }
}

/// Waits for metadata (kind 4) then the handshake (kind 0 + 8 zero bytes); returns the metadata.
pub async fn expect_ready(ws: &mut Ws) -> serde_json::Value {
    let m = next_bin(ws, Duration::from_secs(10))
        .await
        .expect("metadata");
    assert_eq!(m[0], 4, "first message must be metadata");
    let meta: serde_json::Value = serde_json::from_slice(&m[1..]).expect("metadata json");
    let h = next_bin(ws, Duration::from_secs(30))
        .await
        .expect("handshake");
    assert_eq!(h, vec![0u8; 9], "handshake");
    meta
}

/// A client of `srv` (`query`: the URL's query string, or "") that got its metadata and handshake.
pub async fn ready(srv: &Running, query: &str) -> Ws {
    let mut ws = connect(&srv.url(query)).await;
    expect_ready(&mut ws).await;
    ws
}

pub fn tone(n: usize, start: usize, f: f32) -> Vec<f32> {
    (start..start + n)
        .map(|i| 0.3 * (2.0 * std::f32::consts::PI * f * i as f32 / 24_000.0).sin())
        .collect()
}

/// Browser-like sender (opus-recorder settings): 20 ms Opus frames (480 samples), Application
/// Audio, two packets per Ogg page, header pages first.
pub struct BrowserEncoder {
    enc: opus_rs::OpusEncoder,
    writer: ogg::PacketWriter<'static, Vec<u8>>,
    pending: Vec<f32>,
    in_page: usize,
    granule: u64,
    serial: u32,
    started: bool,
}

impl BrowserEncoder {
    pub fn new(serial: u32) -> Self {
        Self {
            enc: opus_rs::OpusEncoder::new(24_000, 1, opus_rs::Application::Audio).unwrap(),
            writer: ogg::PacketWriter::new(Vec::new()),
            pending: Vec::new(),
            in_page: 0,
            granule: 0,
            serial,
            started: false,
        }
    }

    /// Returns the bytes of every page completed by `pcm` (possibly empty).
    pub fn push(&mut self, pcm: &[f32]) -> Vec<u8> {
        if !self.started {
            self.started = true;
            let mut head = b"OpusHead".to_vec();
            head.extend_from_slice(&[1, 1, 0x38, 0x01]);
            head.extend_from_slice(&48_000u32.to_le_bytes());
            head.extend_from_slice(&[0, 0, 0]);
            let mut tags = b"OpusTags".to_vec();
            tags.extend_from_slice(&4u32.to_le_bytes());
            tags.extend_from_slice(b"test");
            tags.extend_from_slice(&0u32.to_le_bytes());
            use ogg::PacketWriteEndInfo::EndPage;
            self.writer
                .write_packet(head, self.serial, EndPage, 0)
                .unwrap();
            self.writer
                .write_packet(tags, self.serial, EndPage, 0)
                .unwrap();
        }
        self.pending.extend_from_slice(pcm);
        let mut buf = vec![0u8; 4000];
        while self.pending.len() >= 480 {
            let frame: Vec<f32> = self.pending.drain(..480).collect();
            let n = self.enc.encode(&frame, 480, &mut buf).unwrap();
            self.granule += 960;
            self.in_page += 1;
            let end = if self.in_page == 2 {
                self.in_page = 0;
                ogg::PacketWriteEndInfo::EndPage
            } else {
                ogg::PacketWriteEndInfo::NormalPacket
            };
            self.writer
                .write_packet(buf[..n].to_vec(), self.serial, end, self.granule)
                .unwrap();
        }
        std::mem::take(self.writer.inner_mut())
    }
}

/// Independent decoder of everything a client received: demux with the `ogg` crate's reader
/// over the concatenated bytes, decode with a fresh Opus decoder.
pub fn decode_all(ogg_bytes: &[u8]) -> (Vec<f32>, usize) {
    let mut r = ogg::PacketReader::new(std::io::Cursor::new(ogg_bytes.to_vec()));
    let mut dec = opus_rs::OpusDecoder::new(24_000, 1).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0f32; 5760];
    let mut packets = 0;
    let mut first = true;
    while let Ok(Some(p)) = r.read_packet() {
        if first {
            assert!(
                p.data.starts_with(b"OpusHead"),
                "first packet must be OpusHead"
            );
            first = false;
            continue;
        }
        if p.data.starts_with(b"OpusTags") {
            continue;
        }
        let n = dec.decode(&p.data, 5760, &mut buf).expect("decodable opus");
        out.extend_from_slice(&buf[..n]);
        packets += 1;
    }
    (out, packets)
}

pub async fn send_bin(ws: &mut Ws, kind: u8, payload: &[u8]) -> bool {
    let mut m = Vec::with_capacity(1 + payload.len());
    m.push(kind);
    m.extend_from_slice(payload);
    ws.send(Message::Binary(m.into())).await.is_ok()
}

/// Plain HTTP GET on loopback; returns (status, body). Reads by Content-Length (some servers keep
/// the connection open despite `Connection: close`), with a 10 s limit.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fut = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut v = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = s.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            v.extend_from_slice(&buf[..n]);
            if let Some(h) = v.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&v[..h]).to_ascii_lowercase();
                if let Some(len) = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|x| x.trim().parse::<usize>().ok())
                {
                    if v.len() >= h + 4 + len {
                        break;
                    }
                }
            }
        }
        v
    };
    let v = tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("http timeout");
    let text = String::from_utf8_lossy(&v).into_owned();
    let status = text.get(9..12).and_then(|x| x.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Polls a condition for up to `secs`.
pub async fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

/// What a client collected during a conversation.
#[derive(Debug, Default)]
pub struct Received {
    /// Bytes of all binary messages, kind bytes included.
    pub message_bytes: usize,
    pub audio_messages: usize,
    pub audio_bytes: Vec<u8>,
    pub text: String,
    pub text_messages: usize,
    pub errors: Vec<String>,
    pub closed: bool,
}

impl Received {
    /// Adds one server message (keep-alive pings of kind 6 and metadata are not counted).
    pub fn add(&mut self, m: Message) {
        match m {
            Message::Binary(b) => {
                self.message_bytes += b.len();
                match b.first() {
                    Some(1) => {
                        self.audio_messages += 1;
                        self.audio_bytes.extend_from_slice(&b[1..]);
                    }
                    Some(2) => {
                        self.text_messages += 1;
                        self.text.push_str(&String::from_utf8_lossy(&b[1..]));
                    }
                    Some(5) => self
                        .errors
                        .push(String::from_utf8_lossy(&b[1..]).into_owned()),
                    _ => {}
                }
            }
            Message::Close(_) => self.closed = true,
            _ => {}
        }
    }
}

/// [`converse`] with Python-client framing and a 300 ms tail.
pub async fn converse_briefly(ws: Ws, frames: usize, pace: Duration) -> Received {
    converse(ws, frames, pace, false, Duration::from_millis(300)).await
}

/// Sends `frames` 80 ms frames of a tone (browser framing when `browser`, else Python-client
/// framing), one frame every `pace`, while collecting everything the server sends. After the last
/// frame, keeps reading for `tail`.
pub async fn converse(
    ws: Ws,
    frames: usize,
    pace: Duration,
    browser: bool,
    tail: Duration,
) -> Received {
    converse_until(ws, frames, pace, browser, tail, || false).await
}

/// [`converse`] that stops sending early, before the first frame after which `enough()` holds.
pub async fn converse_until(
    ws: Ws,
    frames: usize,
    pace: Duration,
    browser: bool,
    tail: Duration,
    enough: impl Fn() -> bool,
) -> Received {
    let (mut tx, mut rx) = ws.split();
    let reader = tokio::spawn(async move {
        let mut r = Received::default();
        while let Some(m) = rx.next().await {
            match m {
                Ok(m) => r.add(m),
                Err(_) => r.closed = true,
            }
            if r.closed {
                break;
            }
        }
        r
    });
    let mut browser_enc = BrowserEncoder::new(1234);
    let mut py_enc = server::codec::OggOpusEncoder::new().unwrap();
    let mut next = tokio::time::Instant::now();
    for i in 0..frames {
        if enough() {
            break;
        }
        let pcm = tone(1920, i * 1920, 440.0);
        let bytes = if browser {
            browser_enc.push(&pcm)
        } else {
            let mut b = Vec::new();
            py_enc.push(&pcm, &mut b).unwrap();
            b
        };
        if !bytes.is_empty() {
            // The browser sends each page as its own message; split the chunk into pages.
            if browser {
                for page in split_pages(&bytes) {
                    let mut m = vec![1u8];
                    m.extend_from_slice(page);
                    if tx.send(Message::Binary(m.into())).await.is_err() {
                        break;
                    }
                }
            } else {
                let mut m = vec![1u8];
                m.extend_from_slice(&bytes);
                if tx.send(Message::Binary(m.into())).await.is_err() {
                    break;
                }
            }
        }
        next += pace;
        tokio::time::sleep_until(next).await;
    }
    tokio::time::sleep(tail).await;
    let _ = tx.send(Message::Close(None)).await;
    match tokio::time::timeout(Duration::from_secs(10), reader).await {
        Ok(Ok(r)) => r,
        _ => panic!("reader did not finish"),
    }
}

/// Splits a byte string made of whole Ogg pages into pages.
pub fn split_pages(bytes: &[u8]) -> Vec<&[u8]> {
    let mut v = Vec::new();
    let mut p = 0;
    while p + 27 <= bytes.len() {
        let n = bytes[p + 26] as usize;
        let body: usize = bytes[p + 27..p + 27 + n].iter().map(|&x| x as usize).sum();
        v.push(&bytes[p..p + 27 + n + body]);
        p += 27 + n + body;
    }
    v
}
