//! Soak client for `moshi-native serve`: several concurrent WebSocket clients streaming Ogg/Opus
//! at real time, reconnecting every `--session-secs`, until `--secs` have passed. Every third
//! session of each client ends abruptly (socket dropped without a close frame) to exercise slot
//! release. Prints one summary line per client and a JSON total at the end.
//!
//! ```text
//! cargo run --release -p moshi-server-native --example soak_client -- \
//!     --url ws://127.0.0.1:8998/api/chat --clients 3 --secs 600 --session-secs 45
//! ```
//! Used by `tools/soak/soak.sh`.

use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

#[derive(Debug, Default, Clone)]
struct Stats {
    sessions: u64,
    abrupt: u64,
    refused: u64,
    connect_errors: u64,
    audio_messages: u64,
    text_messages: u64,
    error_messages: u64,
    frames_sent: u64,
}

/// The soak's size.
#[derive(Parser)]
struct Args {
    /// The server's chat route.
    #[arg(long, default_value = "ws://127.0.0.1:8998/api/chat")]
    url: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 3)]
    clients: usize,
    /// How long the soak runs, in seconds.
    #[arg(long, default_value_t = 600)]
    secs: u64,
    /// How long each session lasts before its client reconnects, in seconds.
    #[arg(long, default_value_t = 45)]
    session_secs: u64,
}

/// Voice-like test signal: a gliding tone plus a little deterministic noise.
fn signal(start: u64, n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(start as u32);
    (0..n)
        .map(|k| {
            let t = (start + k as u64) as f32 / 24_000.0;
            let f = 180.0 + 60.0 * (0.3 * t).sin();
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let noise = (x as f32 / u32::MAX as f32 - 0.5) * 0.02;
            0.25 * (2.0 * std::f32::consts::PI * f * t).sin() + noise
        })
        .collect()
}

/// One conversation; returns Err on connection failure.
async fn session(
    url: &str,
    secs: u64,
    abrupt: bool,
    seed: u32,
    st: &mut Stats,
) -> Result<(), String> {
    let (ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .map_err(|e| e.to_string())?;
    let (mut tx, mut rx) = ws.split();
    // Wait for the handshake (kind 0); metadata (4) and pings (6) may come first.
    let ready = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(m) = rx.next().await {
            match m {
                Ok(Message::Binary(b)) if b.first() == Some(&0) => return true,
                Ok(Message::Binary(b)) if b.first() == Some(&5) => return false,
                Ok(Message::Close(_)) | Err(_) => return false,
                _ => {}
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    if !ready {
        st.refused += 1;
        return Ok(());
    }
    let reader = tokio::spawn(async move {
        let (mut a, mut t, mut e) = (0u64, 0u64, 0u64);
        while let Some(m) = rx.next().await {
            match m {
                Ok(Message::Binary(b)) => match b.first() {
                    Some(1) => a += 1,
                    Some(2) => t += 1,
                    Some(5) => e += 1,
                    _ => {}
                },
                Ok(Message::Close(_)) | Err(_) => break,
                _ => {}
            }
        }
        (a, t, e)
    });
    let mut enc = server::codec::OggOpusEncoder::new().map_err(|e| e.to_string())?;
    let frames = secs * 1000 / 80;
    let mut next = tokio::time::Instant::now();
    let mut buf = Vec::new();
    for i in 0..frames {
        buf.clear();
        buf.push(1u8);
        enc.push(&signal(i * 1920, 1920, seed), &mut buf)
            .map_err(|e| e.to_string())?;
        if tx.send(Message::Binary(buf.clone().into())).await.is_err() {
            break;
        }
        st.frames_sent += 1;
        next += Duration::from_millis(80);
        tokio::time::sleep_until(next).await;
    }
    st.sessions += 1;
    if abrupt {
        st.abrupt += 1;
        reader.abort();
        drop(tx);
        return Ok(());
    }
    let _ = tx.send(Message::Close(None)).await;
    if let Ok(Ok((a, t, e))) = tokio::time::timeout(Duration::from_secs(10), reader).await {
        st.audio_messages += a;
        st.text_messages += t;
        st.error_messages += e;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = Args::parse();
    let deadline = Instant::now() + Duration::from_secs(a.secs);
    let mut handles = Vec::new();
    for c in 0..a.clients {
        let url = a.url.clone();
        let session_secs = a.session_secs;
        handles.push(tokio::spawn(async move {
            let mut st = Stats::default();
            let mut k = 0u32;
            // Stagger the clients so that sessions start and end at different times.
            tokio::time::sleep(Duration::from_millis(700 * c as u64)).await;
            while Instant::now() < deadline {
                let left = deadline.saturating_duration_since(Instant::now()).as_secs();
                let secs = session_secs.min(left).max(1);
                let abrupt = k % 3 == 2;
                if let Err(e) = session(&url, secs, abrupt, c as u32 * 1000 + k, &mut st).await {
                    eprintln!("client {c}: {e}");
                    st.connect_errors += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                k += 1;
            }
            println!("client {c}: {st:?}");
            st
        }));
    }
    let mut total = Stats::default();
    for h in handles {
        let s = h.await.expect("client task");
        total.sessions += s.sessions;
        total.abrupt += s.abrupt;
        total.refused += s.refused;
        total.connect_errors += s.connect_errors;
        total.audio_messages += s.audio_messages;
        total.text_messages += s.text_messages;
        total.error_messages += s.error_messages;
        total.frames_sent += s.frames_sent;
    }
    println!(
        "{{\"sessions\":{},\"abrupt\":{},\"refused\":{},\"connect_errors\":{},\"frames_sent\":{},\"audio_messages\":{},\"text_messages\":{},\"error_messages\":{}}}",
        total.sessions,
        total.abrupt,
        total.refused,
        total.connect_errors,
        total.frames_sent,
        total.audio_messages,
        total.text_messages,
        total.error_messages
    );
}
