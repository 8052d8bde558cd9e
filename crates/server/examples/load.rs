//! Bounded loopback load test: N WebSocket clients talk in real time to an in-process server
//! (runtime backend on the tiny bundle in `fixtures/lm`, or `--bundle DIR`) for D seconds, then the
//! run prints frames served, drops and client-side frame latency percentiles.
//!
//! ```sh
//! cargo run --release -p moshi-server-native --example load -- --clients 8 --seconds 30
//! ```
//!
//! Frame latency = arrival time of the k-th audio message minus the send time of the input frame
//! that produced it (frame k + 1: LMGen call 0 returns nothing). The mapping is exact when no frame
//! was dropped; drops are reported.

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use server::backend::{BackendInfo, RuntimeBackend};
use server::{ServeConfig, Server};
use tokio_tungstenite::tungstenite::Message;

/// The run's size.
#[derive(Parser)]
struct Args {
    /// Concurrent clients (and server slots).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// How long every client talks.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// The model bundle (default: the tiny fixture).
    #[arg(long, default_value_os_t = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm"))]
    bundle: PathBuf,
    /// CPU threads of the engine.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[derive(Default)]
struct ClientResult {
    sent: usize,
    audio_messages: usize,
    text_messages: usize,
    latencies_ms: Vec<f64>,
}

async fn client(url: String, seconds: u64, seed: usize) -> ClientResult {
    let (ws, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("connect");
    let (mut tx, mut rx) = ws.split();
    // Wait for the handshake.
    loop {
        match rx.next().await {
            Some(Ok(Message::Binary(b))) if b.first() == Some(&0) => break,
            Some(Ok(_)) => {}
            _ => panic!("no handshake"),
        }
    }
    let send_times: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    let st = send_times.clone();
    let reader = tokio::spawn(async move {
        let mut r = ClientResult::default();
        while let Some(Ok(m)) = rx.next().await {
            if let Message::Binary(b) = m {
                match b.first() {
                    Some(1) => {
                        let now = Instant::now();
                        let k = r.audio_messages;
                        r.audio_messages += 1;
                        if let Some(t) = st.lock().unwrap().get(k + 1) {
                            r.latencies_ms
                                .push(now.duration_since(*t).as_secs_f64() * 1e3);
                        }
                    }
                    Some(2) => r.text_messages += 1,
                    _ => {}
                }
            }
        }
        r
    });
    let mut enc = server::codec::OggOpusEncoder::new().unwrap();
    let frames = (seconds * 1000 / 80) as usize;
    let start = tokio::time::Instant::now();
    for i in 0..frames {
        let pcm: Vec<f32> = (0..1920)
            .map(|j| {
                let t = (i * 1920 + j) as f32 / 24_000.0;
                0.2 * (2.0 * std::f32::consts::PI * (180.0 + 20.0 * seed as f32) * t).sin()
            })
            .collect();
        let mut bytes = vec![1u8];
        enc.push(&pcm, &mut bytes).unwrap();
        send_times.lock().unwrap().push(Instant::now());
        if tx.send(Message::Binary(bytes.into())).await.is_err() {
            break;
        }
        tokio::time::sleep_until(start + Duration::from_millis(80 * (i as u64 + 1))).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = tx.send(Message::Close(None)).await;
    let mut r = reader.await.unwrap();
    r.sent = frames;
    r
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = Args::parse();
    let engine = runtime::Engine::open(&a.bundle, runtime::EngineOptions::cpu(a.threads))
        .expect("open bundle");
    let backend = Arc::new(RuntimeBackend::new(
        engine,
        BackendInfo {
            instance_name: "load".into(),
            ..Default::default()
        },
    ));
    let server = Server::bind(
        ServeConfig {
            port: 0,
            max_sessions: a.clients,
            max_queue: 0,
            ..ServeConfig::default()
        },
        backend,
    )
    .await
    .expect("bind");
    let addr = server.local_addr();
    let metrics = server.metrics();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let srv = tokio::spawn(server.run_until(async move {
        let _ = stop_rx.await;
    }));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..a.clients {
        tasks.push(tokio::spawn(client(
            format!("ws://{addr}/api/chat?text_seed={i}&audio_seed={i}"),
            a.seconds,
            i,
        )));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let wall = t0.elapsed().as_secs_f64();
    let _ = stop_tx.send(());
    srv.await.unwrap().unwrap();

    let mut lat: Vec<f64> = results
        .iter()
        .flat_map(|r| r.latencies_ms.iter().copied())
        .collect();
    lat.sort_by(|x, y| x.partial_cmp(y).unwrap());
    let sent: usize = results.iter().map(|r| r.sent).sum();
    let audio: usize = results.iter().map(|r| r.audio_messages).sum();
    let text: usize = results.iter().map(|r| r.text_messages).sum();
    println!(
        "clients {} x {} s (wall {:.1} s, bundle {})",
        a.clients,
        a.seconds,
        wall,
        a.bundle.display()
    );
    println!(
        "frames sent {sent}, frames processed {}, input frames dropped {}, audio messages {audio}, text messages {text}, outgoing messages dropped {}",
        metrics.frames_processed.load(Relaxed),
        metrics.frames_dropped.load(Relaxed),
        metrics.messages_dropped.load(Relaxed)
    );
    println!(
        "frame latency ms: p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}  (n={})",
        pct(&lat, 0.5),
        pct(&lat, 0.9),
        pct(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN),
        lat.len()
    );
    println!(
        "max input backlog {} frames",
        metrics.lag_frames_max.load(Relaxed)
    );
    print!(
        "{}",
        metrics
            .render()
            .lines()
            .filter(|l| l.starts_with("moshi_step_seconds_bucket")
                || l.starts_with("moshi_step_seconds_sum")
                || l.starts_with("moshi_step_seconds_count"))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    );
}
