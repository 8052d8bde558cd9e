//! Replay of real client traffic (`fixtures/interop/`, recorded from Kyutai's web client in
//! headless Chromium and from `sphn`, the Python client's encoder): the server's Ogg/Opus input
//! must decode every page and packet (nothing skipped, nothing refused), give exactly the number
//! of samples the stream declares, and an energy envelope that follows the signal the clients
//! played.
mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use server::backend::{
    AudioInput, Backend, BackendError, BackendInfo, Event, EventSource, InputReport, OpenSession,
    Stopper,
};
use server::codec::OggOpusDecoder;
use server::protocol::SessionParams;
use server::ServeConfig;

const WEB: &str = "kyutai-web-client-upstream.json";
const SPHN: &str = "sphn-client-upstream.json";
/// Envelope window (matches `input_envelope.json`): 20 ms = 480 samples at 24 kHz.
const WINDOW: usize = 480;

fn fixture(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/interop")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The binary WebSocket payloads (kind byte removed) a client sent, in order.
fn messages(name: &str) -> Vec<Vec<u8>> {
    let v: serde_json::Value = serde_json::from_str(&fixture(name)).unwrap();
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let s = m.as_str().unwrap().as_bytes();
            s.chunks_exact(2)
                .map(|h| u8::from_str_radix(std::str::from_utf8(h).unwrap(), 16).unwrap())
                .collect()
        })
        .collect()
}

/// What the Ogg framing itself declares, parsed independently of the server's reader.
#[derive(Debug, Default)]
struct Declared {
    pages: u64,
    /// Opus audio packets (header packets excluded).
    packets: u64,
    /// Samples at 24 kHz implied by every audio packet's TOC (RFC 6716 §3.1).
    samples: usize,
    pre_skip_48k: u64,
    last_granule: u64,
}

/// Frame duration in 1/48000 s of TOC configuration `config` (RFC 6716 table 2).
fn frame_48k(config: u8) -> usize {
    match config {
        0..=11 => [480, 960, 1920, 2880][(config % 4) as usize],
        12..=15 => [480, 960][(config % 2) as usize],
        _ => [120, 240, 480, 960][(config % 4) as usize],
    }
}

fn packet_samples_24k(p: &[u8]) -> usize {
    let frames = match p[0] & 3 {
        0 => 1,
        1 | 2 => 2,
        _ => (p[1] & 0x3f) as usize,
    };
    frames * frame_48k(p[0] >> 3) / 2
}

fn declared(stream: &[u8]) -> Declared {
    let mut d = Declared::default();
    let mut pos = 0;
    let mut packet = Vec::new();
    let mut index = 0;
    while pos < stream.len() {
        assert_eq!(&stream[pos..pos + 4], b"OggS", "page at {pos}");
        let nseg = stream[pos + 26] as usize;
        let lacing = &stream[pos + 27..pos + 27 + nseg];
        let mut body = pos + 27 + nseg;
        let granule = u64::from_le_bytes(stream[pos + 6..pos + 14].try_into().unwrap());
        for &l in lacing {
            packet.extend_from_slice(&stream[body..body + l as usize]);
            body += l as usize;
            if l < 255 {
                if index == 0 {
                    assert!(packet.starts_with(b"OpusHead"));
                    d.pre_skip_48k = u16::from_le_bytes([packet[10], packet[11]]) as u64;
                } else if index > 1 {
                    d.packets += 1;
                    d.samples += packet_samples_24k(&packet);
                }
                index += 1;
                packet.clear();
            }
        }
        if granule != u64::MAX {
            d.last_granule = granule;
        }
        d.pages += 1;
        pos = body;
    }
    d
}

/// RMS of consecutive `WINDOW`-sample windows.
fn envelope(pcm: &[f32]) -> Vec<f64> {
    pcm.chunks_exact(WINDOW)
        .map(|w| (w.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / WINDOW as f64).sqrt())
        .collect()
}

fn correlation(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let cov: f64 = a.iter().zip(b).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = a.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|y| (y - mb).powi(2)).sum();
    cov / (va * vb).sqrt()
}

/// RMS envelope of the signal the clients played, and its length in 24 kHz samples.
fn input_envelope() -> Vec<f64> {
    let v: serde_json::Value = serde_json::from_str(&fixture("input_envelope.json")).unwrap();
    assert_eq!(v["window_ms"], 20);
    v["rms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Best correlation of the decoded envelope with the (looped) input envelope over every lag:
/// (correlation, lag in windows). The web client's fake microphone loops the file and starts
/// at an unknown point, hence the circular lag.
fn best_envelope_match(decoded: &[f64]) -> (f64, usize) {
    let input = input_envelope();
    let n = input.len();
    (0..n)
        .map(|lag| {
            let shifted: Vec<f64> = (0..decoded.len()).map(|i| input[(i + lag) % n]).collect();
            (correlation(decoded, &shifted), lag)
        })
        .fold((f64::MIN, 0), |a, b| if b.0 > a.0 { b } else { a })
}

/// Decodes a recording message by message, as the server's connection task does.
fn decode(msgs: &[Vec<u8>]) -> (Vec<f32>, server::codec::DecodeStats) {
    let mut dec = OggOpusDecoder::new().unwrap();
    let mut pcm = Vec::new();
    for m in msgs {
        dec.push(m, &mut pcm);
    }
    (pcm, dec.stats())
}

/// Checks one recording; returns (decoded PCM, envelope lag in windows).
fn check_recording(name: &str, min_correlation: f64) -> (Vec<f32>, usize) {
    let msgs = messages(name);
    let stream: Vec<u8> = msgs.concat();
    let want = declared(&stream);
    let (pcm, stats) = decode(&msgs);
    eprintln!("{name}: {want:?}; decoder {stats:?}; {} samples", pcm.len());
    assert_eq!(stats.skipped_bytes, 0, "{name}: skipped bytes");
    assert_eq!(stats.bad_packets, 0, "{name}: bad packets");
    assert_eq!(stats.pages, want.pages, "{name}: pages");
    assert_eq!(stats.packets, want.packets, "{name}: packets");
    assert_eq!(pcm.len(), want.samples, "{name}: decoded length vs TOCs");
    // The last granule position counts 48 kHz samples including the pre-skip.
    assert_eq!(
        pcm.len() as u64,
        want.last_granule / 2,
        "{name}: decoded length vs granule"
    );
    let (corr, lag) = best_envelope_match(&envelope(&pcm));
    eprintln!("{name}: envelope correlation {corr:.4} at lag {lag} windows");
    assert!(
        corr > min_correlation,
        "{name}: envelope correlation {corr}"
    );
    (pcm, lag)
}

#[test]
fn kyutai_web_client_stream_decodes_completely() {
    // Chromium's fake microphone loops the file from an arbitrary point, and the browser's
    // capture processing (gain control) reshapes the envelope: measured correlation 0.919.
    let (pcm, _) = check_recording(WEB, 0.85);
    // 386 messages: two 20 ms packets per page after the two header pages.
    assert_eq!(pcm.len(), 384 * 2 * 480);
}

#[test]
fn sphn_stream_decodes_completely() {
    // sphn encodes the file itself (resampled to 24 kHz), from its start: measured 0.994 at a
    // lag of one window.
    let (pcm, lag) = check_recording(SPHN, 0.97);
    let windows = input_envelope().len();
    assert_eq!(pcm.len(), windows * WINDOW, "the whole input, nothing more");
    assert!(
        lag <= 2 || lag >= windows - 2,
        "sphn output is aligned with its input: lag {lag}"
    );
}

/// A backend that only records the PCM the server hands it.
struct Recorder(Arc<Mutex<Vec<f32>>>);

struct RecordInput(Arc<Mutex<Vec<f32>>>);
impl AudioInput for RecordInput {
    fn push(&mut self, pcm: &[f32]) -> InputReport {
        self.0.lock().unwrap().extend_from_slice(pcm);
        InputReport::default()
    }
}

struct Silent(Arc<(Mutex<bool>, std::sync::Condvar)>);
impl EventSource for Silent {
    fn recv(&mut self) -> Option<Event> {
        let (m, cv) = &*self.0;
        let mut stop = m.lock().unwrap();
        while !*stop {
            stop = cv.wait(stop).unwrap();
        }
        None
    }
}

struct Stop(Arc<(Mutex<bool>, std::sync::Condvar)>);
impl Stopper for Stop {
    fn stop(&mut self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }
}

impl Backend for Recorder {
    fn info(&self) -> BackendInfo {
        BackendInfo::default()
    }
    fn open(&self, _: &SessionParams) -> Result<OpenSession, BackendError> {
        let flag = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        Ok(OpenSession {
            input: Box::new(RecordInput(self.0.clone())),
            events: Box::new(Silent(flag.clone())),
            stopper: Box::new(Stop(flag)),
        })
    }
}

/// The same recordings sent over a WebSocket connection: the server hands the backend exactly
/// the samples of the stream and counts no bad packet or skipped byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_accepts_real_client_streams() {
    for name in [WEB, SPHN] {
        let msgs = messages(name);
        let declared = declared(&msgs.concat());
        let (want, _) = decode(&msgs);
        let got = Arc::new(Mutex::new(Vec::new()));
        let srv = common::start(
            ServeConfig::default(),
            Arc::new(Recorder(got.clone())) as Arc<dyn Backend>,
        )
        .await;
        let mut ws = common::connect(&srv.url("")).await;
        common::expect_ready(&mut ws).await;
        for m in &msgs {
            assert!(common::send_bin(&mut ws, 1, m).await);
        }
        let t0 = Instant::now();
        while got.lock().unwrap().len() < want.len() && t0.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let got = got.lock().unwrap().clone();
        let m = &srv.metrics;
        use std::sync::atomic::Ordering::Relaxed;
        assert_eq!(m.bad_opus_packets.load(Relaxed), 0, "{name}");
        assert_eq!(m.ogg_bytes_skipped.load(Relaxed), 0, "{name}");
        assert_eq!(
            got.len(),
            declared.samples,
            "{name}: samples handed to the backend"
        );
        assert!(got == want, "{name}: PCM differs from a direct decode");
        drop(ws);
        srv.shutdown().await.unwrap();
    }
}
