//! Messages of Kyutai's `/api/chat` WebSocket protocol and the session query parameters.
//!
//! Every message is a binary WebSocket message whose first byte is the kind
//! (`moshi-architecture.md` §4.1). Multi-byte integers are little-endian.

use model::sampling::SamplingParams;
use serde::Serialize;

/// Kind byte of a handshake (server → client, once the session is ready).
pub const KIND_HANDSHAKE: u8 = 0;
/// Kind byte of an Ogg/Opus audio chunk (both directions).
pub const KIND_AUDIO: u8 = 1;
/// Kind byte of a UTF-8 text piece (server → client).
pub const KIND_TEXT: u8 = 2;
/// Kind byte of a control message (client → server): one byte, see [`SessionCommand`]. Kyutai's
/// Start (0) and EndTurn (1) are accepted and ignored in full-duplex mode.
pub const KIND_CONTROL: u8 = 3;
/// Kind byte of the JSON metadata message (server → client, first message).
pub const KIND_METADATA: u8 = 4;
/// Kind byte of an error message (UTF-8 reason; the server closes afterwards).
pub const KIND_ERROR: u8 = 5;
/// Kind byte of a ping (either direction). The server's pings to a client waiting for a slot carry
/// its place in the queue as ASCII digits (`1` = next); other pings have no payload.
pub const KIND_PING: u8 = 6;

/// Protocol version announced in the handshake.
pub const PROTOCOL_VERSION: u32 = 0;
/// Model version announced in the handshake.
pub const MODEL_VERSION: u32 = 0;

/// The handshake message: kind 0, u32 protocol version, u32 model version (as Kyutai's Rust server).
pub fn handshake() -> Vec<u8> {
    let mut m = Vec::with_capacity(9);
    m.push(KIND_HANDSHAKE);
    m.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    m.extend_from_slice(&MODEL_VERSION.to_le_bytes());
    m
}

/// A message made of a kind byte and a payload.
pub fn message(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(1 + payload.len());
    m.push(kind);
    m.extend_from_slice(payload);
    m
}

/// A command from the client to its running conversation (payload byte of a control message).
///
/// Pause (2) and Restart (3) are Kyutai's codes; Resume (4) and Interrupt (5) are moshi-native's
/// (Kyutai's servers ignore them, as they ignore every control message in full-duplex mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionCommand {
    /// Stop feeding the model (the microphone is paused); the conversation keeps its state.
    Pause,
    /// Continue after [`SessionCommand::Pause`].
    Resume,
    /// Start a new conversation on the same connection (Kyutai's Restart): state and queued input
    /// are dropped.
    Reset,
    /// Drop the output in flight and let Moshi listen; the conversation keeps its state.
    Interrupt,
}

impl SessionCommand {
    /// Every command, in [`SessionCommand::index`] order.
    pub const ALL: [SessionCommand; 4] = [
        SessionCommand::Pause,
        SessionCommand::Resume,
        SessionCommand::Reset,
        SessionCommand::Interrupt,
    ];

    /// The command of a control payload byte, `None` for Start, EndTurn and unknown codes.
    pub fn from_byte(b: u8) -> Option<SessionCommand> {
        match b {
            2 => Some(SessionCommand::Pause),
            3 => Some(SessionCommand::Reset),
            4 => Some(SessionCommand::Resume),
            5 => Some(SessionCommand::Interrupt),
            _ => None,
        }
    }

    /// The control payload byte of this command.
    pub fn to_byte(self) -> u8 {
        match self {
            SessionCommand::Pause => 2,
            SessionCommand::Reset => 3,
            SessionCommand::Resume => 4,
            SessionCommand::Interrupt => 5,
        }
    }

    /// Position in [`SessionCommand::ALL`] (for per-command counters).
    pub fn index(self) -> usize {
        match self {
            SessionCommand::Pause => 0,
            SessionCommand::Resume => 1,
            SessionCommand::Reset => 2,
            SessionCommand::Interrupt => 3,
        }
    }

    /// Lower-case name (metrics label).
    pub fn name(self) -> &'static str {
        match self {
            SessionCommand::Pause => "pause",
            SessionCommand::Resume => "resume",
            SessionCommand::Reset => "reset",
            SessionCommand::Interrupt => "interrupt",
        }
    }
}

/// Message kinds a client may send, as classified by [`parse_client_message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientMessage<'a> {
    /// Ogg/Opus bytes.
    Audio(&'a [u8]),
    /// A control byte (Start 0, EndTurn 1, Pause 2, Restart 3), or `None` if missing.
    Control(Option<u8>),
    /// A ping.
    Ping,
    /// An empty message (ignored, as the Python server does).
    Empty,
    /// Any other kind (ignored, as the protocol asks).
    Unknown(u8),
}

/// Classifies a binary message from a client.
pub fn parse_client_message(data: &[u8]) -> ClientMessage<'_> {
    match data.first() {
        None => ClientMessage::Empty,
        Some(&KIND_AUDIO) => ClientMessage::Audio(&data[1..]),
        Some(&KIND_CONTROL) => ClientMessage::Control(data.get(1).copied()),
        Some(&KIND_PING) => ClientMessage::Ping,
        Some(&k) => ClientMessage::Unknown(k),
    }
}

/// Sampling and session parameters taken from the `/api/chat` query string.
///
/// Names are those sent by Kyutai's web client and parsed by Kyutai's Rust backend. Defaults are every
/// front end's ([`SamplingParams::default`]: the Python package `moshi` 0.2.13's `LMGen`, text
/// temperature 0.7 / top-k 25, audio 0.8 / 250).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionParams {
    /// Temperature of the text token sampler (0 = greedy).
    pub text_temperature: f64,
    /// Top-k of the text token sampler.
    pub text_topk: usize,
    /// Temperature of the audio token samplers (0 = greedy).
    pub audio_temperature: f64,
    /// Top-k of the audio token samplers.
    pub audio_topk: usize,
    /// Log-space boost of the PAD text token (PAD probability × exp(pad_mult)); 0 = none.
    pub pad_mult: f64,
    /// Repetition penalty of the text sampler (1 = none).
    pub repetition_penalty: f64,
    /// Number of previous text tokens the repetition penalty looks at.
    pub repetition_penalty_context: usize,
    /// Seed of the text sampler (`None`: chosen by the server).
    pub text_seed: Option<u64>,
    /// Seed of the audio sampler (`None`: chosen by the server).
    pub audio_seed: Option<u64>,
    /// Stop the conversation after this many model frames (`None`: no limit).
    pub max_steps: Option<u64>,
}

impl Default for SessionParams {
    /// [`SamplingParams::default`]'s temperatures, top-k and penalty context; no PAD boost, no
    /// penalty, seeds chosen by the server, no step limit.
    fn default() -> Self {
        let d = SamplingParams::default();
        Self {
            text_temperature: as_written(d.text_temperature),
            text_topk: d.text_top_k,
            audio_temperature: as_written(d.audio_temperature),
            audio_topk: d.audio_top_k,
            pad_mult: 0.0,
            repetition_penalty: 1.0,
            repetition_penalty_context: d.repetition_penalty_context,
            text_seed: None,
            audio_seed: None,
            max_steps: None,
        }
    }
}

/// The `f64` written as `x` is (0.7, not `f64::from(0.7f32)` = 0.699999988...): the value a client
/// sending the default would have sent, and what the metadata (kind 4) has always echoed.
fn as_written(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// A query parameter that could not be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid query parameter {name}={value:?}: {reason}")]
pub struct ParamError {
    /// Parameter name.
    pub name: String,
    /// Raw (decoded) value.
    pub value: String,
    /// Why it was refused.
    pub reason: &'static str,
}

/// Largest accepted top-k (larger than any vocabulary in use).
pub const MAX_TOPK: usize = 100_000;
/// Largest accepted temperature.
pub const MAX_TEMPERATURE: f64 = 100.0;
/// Largest accepted |pad_mult|.
pub const MAX_PAD_MULT: f64 = 100.0;
/// Largest accepted repetition penalty.
pub const MAX_REPETITION_PENALTY: f64 = 100.0;
/// Largest accepted repetition penalty context.
pub const MAX_REPETITION_CONTEXT: usize = 4096;
/// Largest accepted `max_steps` (about 27 hours of audio).
pub const MAX_STEPS: u64 = 1_250_000;

impl SessionParams {
    /// Parses a raw query string (`a=1&b=2`, percent-encoded). Unknown names are ignored (the web
    /// client also sends `email`, `worker_auth_id`, ...); the last occurrence of a name wins.
    pub fn from_query(query: Option<&str>) -> Result<Self, ParamError> {
        let mut p = Self::default();
        let Some(q) = query else { return Ok(p) };
        for pair in q.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let name = percent_decode(k);
            let value = percent_decode(v);
            let err = |reason: &'static str| ParamError {
                name: name.clone(),
                value: value.clone(),
                reason,
            };
            let v = value.trim();
            match name.as_str() {
                "text_temperature" => p.text_temperature = parse_temp(v).map_err(err)?,
                "audio_temperature" => p.audio_temperature = parse_temp(v).map_err(err)?,
                "text_topk" => p.text_topk = parse_usize(v, 1, MAX_TOPK).map_err(err)?,
                "audio_topk" => p.audio_topk = parse_usize(v, 1, MAX_TOPK).map_err(err)?,
                "pad_mult" => {
                    p.pad_mult = parse_f64(v, -MAX_PAD_MULT, MAX_PAD_MULT).map_err(err)?
                }
                "repetition_penalty" => {
                    p.repetition_penalty =
                        parse_f64(v, f64::MIN_POSITIVE, MAX_REPETITION_PENALTY).map_err(err)?
                }
                "repetition_penalty_context" => {
                    p.repetition_penalty_context =
                        parse_usize(v, 0, MAX_REPETITION_CONTEXT).map_err(err)?
                }
                "text_seed" => p.text_seed = Some(parse_u64(v).map_err(err)?),
                "audio_seed" => p.audio_seed = Some(parse_u64(v).map_err(err)?),
                "max_steps" => {
                    p.max_steps = Some(parse_usize(v, 1, MAX_STEPS as usize).map_err(err)? as u64)
                }
                _ => {}
            }
        }
        Ok(p)
    }
}

fn parse_f64(v: &str, lo: f64, hi: f64) -> Result<f64, &'static str> {
    let x: f64 = v.parse().map_err(|_| "not a number")?;
    if !x.is_finite() {
        return Err("not finite");
    }
    if x < lo || x > hi {
        return Err("out of range");
    }
    Ok(x)
}

fn parse_temp(v: &str) -> Result<f64, &'static str> {
    parse_f64(v, 0.0, MAX_TEMPERATURE)
}

fn parse_usize(v: &str, lo: usize, hi: usize) -> Result<usize, &'static str> {
    // The web client may send integers formatted as floats ("25.0"); accept exact integers only.
    let x: usize = match v.parse::<usize>() {
        Ok(x) => x,
        Err(_) => {
            let f: f64 = v.parse().map_err(|_| "not an integer")?;
            if !f.is_finite() || f.fract() != 0.0 || f < 0.0 || f > hi as f64 {
                return Err("not an integer in range");
            }
            f as usize
        }
    };
    if x < lo || x > hi {
        return Err("out of range");
    }
    Ok(x)
}

fn parse_u64(v: &str) -> Result<u64, &'static str> {
    v.parse::<u64>()
        .map_err(|_| "not an unsigned 64-bit integer")
}

/// Decodes `%XX` escapes and `+` (as a space). Invalid escapes are kept literally; invalid UTF-8
/// is replaced.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' if i + 3 <= b.len() => {
                let h = std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match h {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Build information sent in the metadata message (all strings, as the web client's schema asks).
#[derive(Debug, Clone, Serialize)]
pub struct BuildInfo {
    /// Unix time of the build (unknown here: empty).
    pub build_timestamp: String,
    /// Date of the build.
    pub build_date: String,
    /// Git branch.
    pub git_branch: String,
    /// Git commit time.
    pub git_timestamp: String,
    /// Git commit date.
    pub git_date: String,
    /// Git commit hash.
    pub git_hash: String,
    /// `git describe`.
    pub git_describe: String,
    /// Host triple of the compiler.
    pub rustc_host_triple: String,
    /// Compiler version.
    pub rustc_version: String,
    /// Target triple.
    pub cargo_target_triple: String,
}

impl BuildInfo {
    /// What this binary knows about itself without a build script.
    pub fn current() -> Self {
        let triple = format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS);
        Self {
            build_timestamp: String::new(),
            build_date: String::new(),
            git_branch: String::new(),
            git_timestamp: String::new(),
            git_date: String::new(),
            git_hash: String::new(),
            git_describe: format!("moshi-native {}", env!("CARGO_PKG_VERSION")),
            rustc_host_triple: triple.clone(),
            rustc_version: String::new(),
            cargo_target_triple: triple,
        }
    }
}

/// Static information about the served model (sent in the metadata message).
#[derive(Debug, Clone, Default)]
pub struct BackendInfo {
    /// Name of the LM weights file.
    pub lm_model_file: String,
    /// Name of the Mimi weights file.
    pub mimi_model_file: String,
    /// Name of this server instance.
    pub instance_name: String,
    /// Whether this machine holds real time with this model, measured at start-up.
    pub realtime: Option<RealtimeNotice>,
    /// What is served, in words for the web page (absent when the backend does not say).
    pub model: Option<ServedModel>,
}

/// The served model as the web page shows it before and during a conversation: sent in the metadata
/// (an extra field; Kyutai's web client ignores it) and at `GET /api/info`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServedModel {
    /// The model's name (variant or bundle folder), e.g. `moshiko`.
    pub name: String,
    /// Weight format, e.g. `q8 (GGUF Q8_0)`.
    pub format: String,
    /// Where it runs, e.g. `cpu, 2 threads`.
    pub device: String,
    /// True for the tiny random-weight demo model (its speech is noise, not words).
    pub demo: bool,
}

/// Whether a frame pass fits in the 80 ms a frame lasts, as measured when the server started, and what
/// would help if not. Sent in the metadata (an extra field; Kyutai's web client ignores it) and shown on
/// the built-in page.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RealtimeNotice {
    /// Milliseconds of one conversation's full frame pass at KV position 0, measured at start-up after
    /// warm-up.
    pub frame_ms: f64,
    /// Milliseconds of the same pass at the full context (every KV entry in use), when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_full_ms: Option<f64>,
    /// Whether one conversation keeps up with headroom (through the full context when it was measured).
    pub holds: bool,
    /// Conversations held in real time at once, per weight format (empty when not measured).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conversations: Vec<RealtimeCapacity>,
    /// One paragraph for the user: the verdict and, when it does not hold, what would.
    pub text: String,
}

/// Conversations a server holds in real time at once with one weight format: timed for the format it
/// serves, estimated from bytes per frame for another.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RealtimeCapacity {
    /// Weight format, e.g. `q8_0`.
    pub format: String,
    /// `measured` (the loaded format) or `estimated`.
    pub basis: &'static str,
    /// Conversations at once while all are at their start (KV position 0).
    pub at_start: usize,
    /// Conversations at once through a full context (the whole length of a conversation).
    pub at_full: usize,
}

/// The metadata message (kind 4) with the fields Kyutai's web client validates.
#[derive(Debug, Clone, Serialize)]
pub struct Metadata {
    /// Effective text temperature.
    pub text_temperature: f64,
    /// Effective text top-k.
    pub text_topk: usize,
    /// Effective audio temperature.
    pub audio_temperature: f64,
    /// Effective audio top-k.
    pub audio_topk: usize,
    /// Effective PAD boost.
    pub pad_mult: f64,
    /// Effective repetition penalty context.
    pub repetition_penalty_context: usize,
    /// Effective repetition penalty.
    pub repetition_penalty: f64,
    /// Name of the LM weights file.
    pub lm_model_file: String,
    /// Name of the Mimi weights file.
    pub mimi_model_file: String,
    /// Name of this server instance.
    pub instance_name: String,
    /// Build information.
    pub build_info: BuildInfo,
    /// Real-time verdict of this server (absent when not measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub realtime: Option<RealtimeNotice>,
    /// What is served (absent when the backend does not say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<ServedModel>,
}

impl Metadata {
    /// Metadata for a session with `params`, served by a model described by `info`.
    pub fn new(params: &SessionParams, info: &BackendInfo) -> Self {
        Self {
            text_temperature: params.text_temperature,
            text_topk: params.text_topk,
            audio_temperature: params.audio_temperature,
            audio_topk: params.audio_topk,
            pad_mult: params.pad_mult,
            repetition_penalty_context: params.repetition_penalty_context,
            repetition_penalty: params.repetition_penalty,
            lm_model_file: info.lm_model_file.clone(),
            mimi_model_file: info.mimi_model_file.clone(),
            instance_name: info.instance_name.clone(),
            build_info: BuildInfo::current(),
            realtime: info.realtime.clone(),
            model: info.model.clone(),
        }
    }

    /// The encoded kind-4 message.
    pub fn to_message(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec());
        message(KIND_METADATA, &json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn web_client_query_parses() {
        let q = "text_temperature=0.7&text_topk=25&audio_temperature=0.8&audio_topk=250&pad_mult=0\
                 &repetition_penalty_context=64&repetition_penalty=1.0&text_seed=123&audio_seed=99\
                 &email=a%40b.c&worker_auth_id=x";
        let p = SessionParams::from_query(Some(q)).unwrap();
        assert_eq!(p.text_temperature, 0.7);
        assert_eq!(p.text_topk, 25);
        assert_eq!(p.audio_topk, 250);
        assert_eq!(p.text_seed, Some(123));
        assert_eq!(p.audio_seed, Some(99));
        assert_eq!(p.max_steps, None);
        assert_eq!(
            SessionParams::from_query(None).unwrap(),
            SessionParams::default()
        );
        let p = SessionParams::from_query(Some("max_steps=100&text_topk=25.0")).unwrap();
        assert_eq!(p.max_steps, Some(100));
        assert_eq!(p.text_topk, 25);
    }

    /// No query means every front end's sampling defaults (`SamplingParams::default`), as Kyutai's
    /// web client sends them: the same values, to the last bit of the f64 the metadata echoes.
    #[test]
    fn defaults_are_the_front_ends_as_the_web_client_sends_them() {
        let sent = "text_temperature=0.7&text_topk=25&audio_temperature=0.8&audio_topk=250\
                    &pad_mult=0&repetition_penalty_context=64&repetition_penalty=1.0";
        let d = SessionParams::default();
        assert_eq!(d, SessionParams::from_query(Some(sent)).unwrap());
        let s = SamplingParams::default();
        assert_eq!(
            (d.text_temperature as f32, d.text_topk),
            (s.text_temperature, s.text_top_k)
        );
        assert_eq!(
            (d.audio_temperature as f32, d.audio_topk),
            (s.audio_temperature, s.audio_top_k)
        );
        assert_eq!(d.repetition_penalty_context, s.repetition_penalty_context);
    }

    #[test]
    fn bad_values_are_refused() {
        for q in [
            "text_temperature=abc",
            "text_temperature=-1",
            "text_temperature=NaN",
            "audio_temperature=inf",
            "text_topk=0",
            "text_topk=-3",
            "audio_topk=2.5",
            "audio_topk=1e30",
            "pad_mult=1e9",
            "repetition_penalty=0",
            "repetition_penalty_context=999999",
            "text_seed=-1",
            "audio_seed=18446744073709551616",
            "max_steps=0",
            "text_topk=",
        ] {
            let e = SessionParams::from_query(Some(q)).unwrap_err();
            assert!(q.starts_with(&e.name), "{q}: {e}");
        }
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b+c"), "a b c");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%C3%A9"), "é");
    }

    #[test]
    fn messages() {
        assert_eq!(handshake(), vec![0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_client_message(&[]), ClientMessage::Empty);
        assert_eq!(
            parse_client_message(&[1, 5, 6]),
            ClientMessage::Audio(&[5, 6])
        );
        assert_eq!(parse_client_message(&[3]), ClientMessage::Control(None));
        assert_eq!(
            parse_client_message(&[3, 2]),
            ClientMessage::Control(Some(2))
        );
        assert_eq!(parse_client_message(&[6]), ClientMessage::Ping);
        assert_eq!(parse_client_message(&[200, 1]), ClientMessage::Unknown(200));
    }

    /// The real-time notice rides in the metadata as one extra object (every field Kyutai's client
    /// validates stays as it was), and is absent when the server did not measure one.
    #[test]
    fn metadata_carries_the_realtime_notice_only_when_measured() {
        let params = SessionParams::from_query(None).unwrap();
        let json = |info: &BackendInfo| -> serde_json::Value {
            let m = Metadata::new(&params, info).to_message();
            assert_eq!(m[0], KIND_METADATA);
            serde_json::from_slice(&m[1..]).unwrap()
        };
        let plain = json(&BackendInfo::default());
        assert!(plain.get("realtime").is_none(), "{plain}");
        let info = BackendInfo {
            realtime: Some(RealtimeNotice {
                frame_ms: 377.0,
                frame_full_ms: Some(465.0),
                holds: false,
                conversations: vec![RealtimeCapacity {
                    format: "q8_0".into(),
                    basis: "measured",
                    at_start: 0,
                    at_full: 0,
                }],
                text: "does NOT keep up".into(),
            }),
            ..Default::default()
        };
        let with = json(&info);
        assert_eq!(with["realtime"]["holds"], false);
        assert_eq!(with["realtime"]["frame_ms"], 377.0);
        assert_eq!(with["realtime"]["frame_full_ms"], 465.0);
        assert_eq!(with["realtime"]["conversations"][0]["format"], "q8_0");
        assert_eq!(with["realtime"]["conversations"][0]["basis"], "measured");
        assert_eq!(with["realtime"]["conversations"][0]["at_full"], 0);
        assert_eq!(with["realtime"]["text"], "does NOT keep up");
        let mut rest = with.as_object().unwrap().clone();
        rest.remove("realtime");
        assert_eq!(serde_json::Value::Object(rest), plain);
    }
}
