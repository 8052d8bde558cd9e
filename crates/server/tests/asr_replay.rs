//! `/api/asr-streaming` against Kyutai's own client: the messages that `stt_from_file_rust_server.py`
//! (Kyutai's `delayed-streams-modeling`, unchanged) sent, recorded byte for byte by
//! `tools/oracle/gen_stt_interop.py` into `fixtures/interop/stt-from-file-client.json`, are replayed
//! to a server on the demo-stt bundle (`fixtures/stt/1b`), authenticated as the script does (header
//! `kyutai-api-key`). The replies must be what the script reads: `Ready` first, then per step `Step`
//! (4 voice-activity probabilities), `Word`, `EndWord` exactly as a lone `model::stt::SttStream`
//! gives for the same audio, the `Marker` echoed once, right after the step that consumed the audio
//! sent before it plus the model's delay, and a clean close (code 1000) when the client closes.
mod common;

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use model::checkpoint::Bundle;
use model::stt::{SttEvent, SttModel, SttStream};
use model::text::SentencePiece;
use server::asr::AsrService;
use server::asr_protocol::{parse_client, AsrClientMessage};
use server::ServeConfig;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

const TOKEN: &str = "public_token";

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Standard base64 (the fixture's encoding of each payload).
fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for &c in s.as_bytes().iter().filter(|&&c| c != b'=') {
        acc = (acc << 6) | u32::from(val(c));
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// The recorded client payloads, in the order the script sent them.
fn recorded() -> Vec<Vec<u8>> {
    let p = root().join("fixtures/interop/stt-from-file-client.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let unique: Vec<Vec<u8>> = v["unique"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| base64(s.as_str().unwrap()))
        .collect();
    v["sequence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| unique[i.as_u64().unwrap() as usize].clone())
        .collect()
}

/// A decoded server message: its type and fields (numbers as f64, `prs` as a list).
#[derive(Debug, Clone, PartialEq)]
enum V {
    Str(String),
    Num(f64),
    List(Vec<f64>),
}

/// A small MessagePack reader for the server's replies (maps of strings, numbers, float lists),
/// written apart from the server's encoder.
fn decode(b: &[u8]) -> Vec<(String, V)> {
    let mut at = 0;
    let mut take = |n: usize| {
        let s = &b[at..at + n];
        at += n;
        s
    };
    fn be(s: &[u8]) -> u64 {
        s.iter().fold(0, |a, &x| (a << 8) | u64::from(x))
    }
    fn value(take: &mut dyn FnMut(usize) -> Vec<u8>) -> V {
        let m = take(1)[0];
        match m {
            0x00..=0x7f => V::Num(f64::from(m)),
            0xa0..=0xbf => V::Str(String::from_utf8(take((m & 0x1f) as usize)).unwrap()),
            0xd9 => {
                let n = take(1)[0] as usize;
                V::Str(String::from_utf8(take(n)).unwrap())
            }
            0xca => V::Num(f64::from(f32::from_bits(be(&take(4)) as u32))),
            0xcb => V::Num(f64::from_bits(be(&take(8)))),
            0xcc => V::Num(be(&take(1)) as f64),
            0xcd => V::Num(be(&take(2)) as f64),
            0xce => V::Num(be(&take(4)) as f64),
            0x90..=0x9f => V::List(
                (0..(m & 0x0f))
                    .map(|_| match value(take) {
                        V::Num(x) => x,
                        v => panic!("list of {v:?}"),
                    })
                    .collect(),
            ),
            // str16: the tiny random model's capped words (64 tokens, `model::stt::MAX_WORD_TOKENS`).
            0xda => {
                let n = be(&take(2)) as usize;
                V::Str(String::from_utf8(take(n)).unwrap())
            }
            _ => panic!("unexpected marker 0x{m:02x}"),
        }
    }
    let mut t = |n: usize| take(n).to_vec();
    let m = t(1)[0];
    assert!((0x80..=0x8f).contains(&m), "not a fixmap: 0x{m:02x}");
    (0..(m & 0x0f))
        .map(|_| {
            let k = match value(&mut t) {
                V::Str(s) => s,
                v => panic!("key {v:?}"),
            };
            (k, value(&mut t))
        })
        .collect()
}

fn field<'a>(m: &'a [(String, V)], k: &str) -> &'a V {
    &m.iter()
        .find(|(n, _)| n == k)
        .unwrap_or_else(|| panic!("no {k} in {m:?}"))
        .1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kyutai_stt_client_recording_is_transcribed_and_its_marker_echoed() {
    let dir = root().join("fixtures/stt/1b");
    let bundle = Bundle::open(&dir).unwrap();
    let pool = kernels::Pool::new(1);
    let model = Arc::new(SttModel::load(&bundle, &pool).unwrap());
    let spm = SentencePiece::load(&bundle.files.tokenizer).unwrap();
    assert_eq!(model.n_heads(), 4, "demo-stt has stt-1b's 4 extra heads");
    let plan = model.plan();

    // What the script sent: its audio, and how much of it came before the marker.
    let msgs = recorded();
    let (mut pcm, mut scratch) = (Vec::new(), Vec::new());
    let mut before_marker = None;
    for m in &msgs {
        match parse_client(m, &mut pcm, &mut scratch).unwrap() {
            AsrClientMessage::Audio => {}
            AsrClientMessage::Marker(0) => before_marker = Some(pcm.len()),
            other => panic!("the script sends Audio and one Marker 0, not {other:?}"),
        }
    }
    let before_marker = before_marker.expect("a marker");
    // The script: 1 s of silence, the 37960-sample input, 5 s of silence | marker | 35 s of silence.
    assert_eq!(before_marker, 24_000 * 6 + 37_960);
    assert_eq!(pcm.len(), 24_000 * 41 + 37_960);

    // The reference: a lone stream of the model library fed the same audio, one entry per step.
    let mut reference: Vec<Vec<SttEvent>> = Vec::new();
    let mut lone = SttStream::cpu(&model, Arc::new(kernels::Pool::new(1))).unwrap();
    lone.push_pcm(&pcm, |_, ev| reference.push(ev.to_vec()))
        .unwrap();
    let due = plan.prefix_frames + before_marker / 1920 + plan.delay_tokens;
    assert!(due < reference.len());

    let (srv, asr) = stt_server(model.clone(), spm, 2, ServeConfig::default().max_queue).await;
    let (addr, metrics) = (srv.addr, srv.metrics.clone());

    let mut req = format!("ws://{addr}/api/asr-streaming")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("kyutai-api-key", TOKEN.parse().unwrap());
    let (ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let (mut tx, mut rx) = ws.split();
    // Sent as fast as the socket takes them (the script paces only its file audio): the server's
    // flow control must hold the rest back without losing a sample.
    let sender = tokio::spawn(async move {
        for m in msgs {
            tx.send(Message::Binary(m.into())).await.unwrap();
        }
        tx
    });
    let mut got: Vec<Vec<(String, V)>> = Vec::new();
    let mut marker_at = None;
    let read = async {
        while let Some(m) = rx.next().await {
            let m = m.unwrap();
            let Message::Binary(b) = m else { continue };
            let d = decode(&b);
            let ty = match field(&d, "type") {
                V::Str(s) => s.clone(),
                v => panic!("type {v:?}"),
            };
            if ty == "Marker" {
                marker_at = Some(got.len());
            }
            got.push(d);
            // The script stops reading at the marker; read on to the end of the audio here.
            if matches!(
                got.last().map(|d| field(d, "type")),
                Some(V::Str(s)) if s == "Step"
            ) && matches!(field(got.last().unwrap(), "step_idx"), V::Num(n) if *n as usize == reference.len())
            {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), read)
        .await
        .expect("the server transcribed the whole recording");
    let mut tx = sender.await.unwrap();
    // As the script's `websockets` does when it leaves its `async with`: a close with code 1000.
    tx.send(Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    })))
    .await
    .unwrap();
    let mut close_code = None;
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(10), rx.next()).await {
        if let Ok(Message::Close(Some(f))) = m {
            close_code = Some(u16::from(f.code));
        }
    }
    assert_eq!(close_code, Some(1000), "a clean close");

    // Ready first, then the steps, in the reference's order, with the marker after step `due`.
    assert_eq!(got[0], vec![("type".to_string(), V::Str("Ready".into()))]);
    let marker_at = marker_at.expect("the marker was echoed");
    let mut i = 1;
    let mut words = 0;
    for (s, events) in reference.iter().enumerate() {
        for e in events {
            let m = &got[i];
            i += 1;
            match e {
                SttEvent::Step { step_idx, .. } => {
                    assert_eq!(field(m, "type"), &V::Str("Step".into()), "{m:?}");
                    assert_eq!(field(m, "step_idx"), &V::Num(*step_idx as f64));
                    let V::List(prs) = field(m, "prs") else {
                        panic!("prs {m:?}")
                    };
                    assert_eq!(prs.len(), 4, "4 voice-activity probabilities: {m:?}");
                    let ours: Vec<f32> = prs.iter().map(|&p| p as f32).collect();
                    testkit::compare::assert_close(&ours, e.prs(), 1e-4, "prs");
                    // Key order as moshi-server writes it.
                    let keys: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
                    assert_eq!(keys, ["type", "step_idx", "prs", "buffered_pcm"]);
                }
                SttEvent::Word { tokens, start_time } => {
                    words += 1;
                    let text = model_text(&bundle, tokens);
                    assert_eq!(
                        m,
                        &vec![
                            ("type".to_string(), V::Str("Word".into())),
                            ("text".to_string(), V::Str(text)),
                            ("start_time".to_string(), V::Num(*start_time)),
                        ]
                    );
                }
                SttEvent::EndWord { stop_time } => assert_eq!(
                    m,
                    &vec![
                        ("type".to_string(), V::Str("EndWord".into())),
                        ("stop_time".to_string(), V::Num(*stop_time)),
                    ]
                ),
            }
        }
        if s + 1 == due {
            assert_eq!(i, marker_at, "the marker right after step {due}'s messages");
            assert_eq!(
                got[i],
                vec![
                    ("type".to_string(), V::Str("Marker".into())),
                    ("id".to_string(), V::Num(0.0))
                ]
            );
            i += 1;
        }
    }
    assert_eq!(i, got.len(), "nothing else was sent");
    assert!(words > 0, "the recording gives words");
    assert_eq!(
        got.iter()
            .filter(|m| field(m, "type") == &V::Str("Marker".into()))
            .count(),
        1
    );

    // The counters saw it, and the stream left its slot.
    let text = metrics.render();
    assert!(
        text.contains(&format!("moshi_stt_steps_total {}", reference.len())),
        "{text}"
    );
    assert!(text.contains("moshi_stt_markers_total 1"), "{text}");
    assert!(text.contains("moshi_stt_streams_total 1"), "{text}");
    srv.shutdown().await.unwrap();
    asr.stop();
}

fn model_text(bundle: &Bundle, tokens: &[u32]) -> String {
    SentencePiece::load(&bundle.files.tokenizer)
        .unwrap()
        .decode(tokens)
        .unwrap()
}

/// A loopback server of the speech-to-text route only (no `/api/chat`), with the token, over a
/// runner of `slots` streams of `model` and `max_queue` waiting places.
async fn stt_server(
    model: Arc<SttModel>,
    spm: SentencePiece,
    slots: usize,
    max_queue: usize,
) -> (common::Running, Arc<AsrService>) {
    let runner = runtime::SttRunner::spawn(
        model,
        runtime::SttRunnerOptions {
            slots,
            ..Default::default()
        },
    )
    .unwrap();
    let asr = Arc::new(AsrService::new(runner, spm, "demo-stt".into()));
    let config = ServeConfig {
        auth_token: Some(TOKEN.into()),
        max_queue,
        ..Default::default()
    };
    let srv = common::bind(config, Arc::new(server::asr::NoChat))
        .await
        .with_asr(asr.clone(), false);
    (common::launch(srv), asr)
}

/// The route's door: a wrong or missing token gets HTTP 401 before any model work, `?auth_id=` is
/// accepted as Kyutai's clients send it, `/readyz` counts the free streams, and a client beyond the
/// slots and the queue gets `Error` then a 1013 close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_readiness_and_a_full_server() {
    let dir = root().join("fixtures/stt/1b");
    let bundle = Bundle::open(&dir).unwrap();
    let model = Arc::new(SttModel::load(&bundle, &kernels::Pool::new(1)).unwrap());
    let spm = SentencePiece::load(&bundle.files.tokenizer).unwrap();
    let (srv, asr) = stt_server(model, spm, 1, 0).await;
    let addr = srv.addr;
    let readyz = || async {
        let (status, body) = common::http_get(addr, "/readyz").await;
        (status, body)
    };
    assert_eq!(
        readyz().await.1.trim(),
        "1 of 1 speech-to-text streams free"
    );
    for url in [
        format!("ws://{addr}/api/asr-streaming"),
        format!("ws://{addr}/api/asr-streaming?auth_id=wrong"),
    ] {
        match tokio_tungstenite::connect_async(url).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                assert_eq!(r.status().as_u16(), 401)
            }
            other => panic!("expected HTTP 401, got {:?}", other.map(|_| ())),
        }
    }
    let (mut first, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/api/asr-streaming?auth_id={TOKEN}"))
            .await
            .unwrap();
    let m = first.next().await.unwrap().unwrap();
    assert_eq!(decode(&m.into_data())[0].1, V::Str("Ready".into()));
    let (status, body) = readyz().await;
    assert_eq!(
        (status, body.trim()),
        (503, "0 of 1 speech-to-text streams free")
    );
    let (mut second, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/api/asr-streaming?auth_id={TOKEN}"))
            .await
            .unwrap();
    let m = second.next().await.unwrap().unwrap();
    let d = decode(&m.into_data());
    assert_eq!(d[0].1, V::Str("Error".into()), "{d:?}");
    let mut code = None;
    while let Some(Ok(m)) = second.next().await {
        if let Message::Close(Some(f)) = m {
            code = Some(u16::from(f.code));
        }
    }
    assert_eq!(code, Some(1013));
    drop(first);
    srv.shutdown().await.unwrap();
    asr.stop();
}
