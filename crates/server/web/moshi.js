// moshi-native web page: microphone → Opus (WebCodecs) → Ogg pages → WebSocket, and back:
// Ogg pages → Opus packets → WebCodecs decoder → AudioWorklet jitter buffer. Protocol: binary
// messages whose first byte is the kind (0 handshake, 1 audio, 2 text, 3 control, 4 metadata,
// 5 error, 6 ping). Control payloads: 2 pause, 3 restart (new conversation), 4 resume, 5 interrupt.
"use strict";

const MODEL_RATE = 24000;
const $ = (id) => document.getElementById(id);


// ---------------------------------------------------------------------------------------------
// Ogg (RFC 3533): CRC-32 with polynomial 0x04c11db7, no reflection, initial value 0.
const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let r = i << 24;
    for (let j = 0; j < 8; j++) r = r & 0x80000000 ? ((r << 1) ^ 0x04c11db7) : (r << 1);
    t[i] = r >>> 0;
  }
  return t;
})();
function oggCrc(bytes) {
  let crc = 0;
  for (let i = 0; i < bytes.length; i++) crc = ((crc << 8) ^ CRC_TABLE[((crc >>> 24) ^ bytes[i]) & 0xff]) >>> 0;
  return crc >>> 0;
}

class OggWriter {
  constructor(serial) { this.serial = serial; this.seq = 0; }
  // One page holding whole packets. flags: 2 = beginning of stream.
  page(packets, granule, flags) {
    const lacing = [];
    for (const p of packets) {
      let n = p.length;
      while (n >= 255) { lacing.push(255); n -= 255; }
      lacing.push(n);
    }
    const bodyLen = packets.reduce((a, p) => a + p.length, 0);
    const page = new Uint8Array(27 + lacing.length + bodyLen);
    const dv = new DataView(page.buffer);
    page.set([0x4f, 0x67, 0x67, 0x53, 0, flags], 0);
    dv.setUint32(6, granule % 4294967296, true);
    dv.setUint32(10, Math.floor(granule / 4294967296), true);
    dv.setUint32(14, this.serial, true);
    dv.setUint32(18, this.seq++, true);
    page[26] = lacing.length;
    page.set(lacing, 27);
    let off = 27 + lacing.length;
    for (const p of packets) { page.set(p, off); off += p.length; }
    dv.setUint32(22, oggCrc(page), true);
    return page;
  }
}

class OggReader {
  constructor() { this.buf = new Uint8Array(0); this.partial = []; }
  // Appends bytes; returns the complete packets they finish.
  push(bytes) {
    const nb = new Uint8Array(this.buf.length + bytes.length);
    nb.set(this.buf, 0); nb.set(bytes, this.buf.length);
    this.buf = nb;
    const packets = [];
    let pos = 0;
    while (this.buf.length - pos >= 27) {
      const b = this.buf;
      if (b[pos] !== 0x4f || b[pos + 1] !== 0x67 || b[pos + 2] !== 0x67 || b[pos + 3] !== 0x53) { pos++; continue; }
      const nseg = b[pos + 26];
      if (b.length - pos < 27 + nseg) break;
      let body = 0;
      for (let i = 0; i < nseg; i++) body += b[pos + 27 + i];
      if (b.length - pos < 27 + nseg + body) break;
      let off = pos + 27 + nseg;
      for (let i = 0; i < nseg; i++) {
        const l = b[pos + 27 + i];
        this.partial.push(b.subarray(off, off + l));
        off += l;
        if (l < 255) {
          const len = this.partial.reduce((a, p) => a + p.length, 0);
          const pkt = new Uint8Array(len);
          let o = 0;
          for (const p of this.partial) { pkt.set(p, o); o += p.length; }
          packets.push(pkt);
          this.partial = [];
        }
      }
      // Keep partial packet data alive after the buffer is sliced.
      this.partial = this.partial.map((p) => p.slice());
      pos = off;
    }
    this.buf = this.buf.slice(pos);
    return packets;
  }
}

// Streaming linear resampler (good enough for 24 kHz speech; the mic path is low-passed by Opus).
class Resampler {
  constructor(inRate, outRate) { this.step = inRate / outRate; this.pos = 0; this.prev = 0; this.identity = inRate === outRate; }
  process(x) {
    if (this.identity || x.length === 0) return x;
    const out = [];
    let p = this.pos;
    while (p < x.length) {
      const i = Math.floor(p), f = p - i;
      const a = i === 0 ? this.prev : x[i - 1];
      const b = x[i];
      out.push(a + (b - a) * f);
      p += this.step;
    }
    this.pos = p - x.length;
    this.prev = x[x.length - 1];
    return Float32Array.from(out);
  }
}

function textBytes(s) { return new TextEncoder().encode(s); }

function opusHead() {
  const h = new Uint8Array(19);
  h.set(textBytes("OpusHead"), 0);
  const dv = new DataView(h.buffer);
  h[8] = 1; h[9] = 1;
  dv.setUint16(10, 312, true);      // pre-skip (48 kHz units)
  dv.setUint32(12, MODEL_RATE, true);
  dv.setInt16(16, 0, true);
  h[18] = 0;
  return h;
}
function opusTags() {
  const vendor = textBytes("moshi-native-web");
  const t = new Uint8Array(8 + 4 + vendor.length + 4);
  t.set(textBytes("OpusTags"), 0);
  new DataView(t.buffer).setUint32(8, vendor.length, true);
  t.set(vendor, 12);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Recording: both voices at the model rate, kept in this tab only. Your channel is the microphone
// as sent (silence while paused), one sample per sample of the audio clock from the microphone's
// start to Stop; Moshi's voice is placed where it was heard: right after its previous piece, or at
// "now" when it fell silent for longer than the playback buffer would hide.
class Recording {
  constructor() {
    this.you = []; this.youLen = 0;
    this.moshi = []; this.moshiCursor = 0;
    this.text = []; // [seconds from the start, piece]
    this.startedAt = 0;
  }
  addYou(x) { this.you.push(x); this.youLen += x.length; }
  addMoshi(x) {
    if (this.youLen - this.moshiCursor > 0.25 * MODEL_RATE) this.moshiCursor = this.youLen;
    this.moshi.push([this.moshiCursor, x]);
    this.moshiCursor += x.length;
  }
  addText(piece) { this.text.push([(performance.now() - this.startedAt) / 1000, piece]); }
  empty() { return this.youLen === 0 && this.text.length === 0; }

  // 16-bit PCM stereo WAV (you left, Moshi right), as long as your channel.
  wav() {
    const n = this.youLen;
    const buf = new ArrayBuffer(44 + n * 4);
    const dv = new DataView(buf);
    const str = (o, s) => { for (let i = 0; i < s.length; i++) dv.setUint8(o + i, s.charCodeAt(i)); };
    str(0, "RIFF"); dv.setUint32(4, 36 + n * 4, true); str(8, "WAVE");
    str(12, "fmt "); dv.setUint32(16, 16, true); dv.setUint16(20, 1, true); dv.setUint16(22, 2, true);
    dv.setUint32(24, MODEL_RATE, true); dv.setUint32(28, MODEL_RATE * 4, true); dv.setUint16(32, 4, true); dv.setUint16(34, 16, true);
    str(36, "data"); dv.setUint32(40, n * 4, true);
    const pcm = new Int16Array(buf, 44, n * 2);
    const q = (v) => Math.max(-32768, Math.min(32767, Math.round(v * 32767)));
    let o = 0;
    for (const c of this.you) { for (let i = 0; i < c.length; i++) pcm[2 * (o + i)] = q(c[i]); o += c.length; }
    for (const [at, c] of this.moshi) {
      for (let i = 0; i < c.length && at + i < n; i++) pcm[2 * (at + i) + 1] = q(c[i]);
    }
    return new Blob([buf], { type: "audio/wav" });
  }

  // One line per burst of speech: "[mm:ss.s] words".
  transcript(header) {
    const lines = [header, ""];
    let line = null, last = -1e9;
    for (const [t, piece] of this.text) {
      if (line === null || t - last > 1.2) {
        if (line !== null) lines.push(line);
        const m = Math.floor(t / 60), s = (t - 60 * m).toFixed(1).padStart(4, "0");
        line = `[${String(m).padStart(2, "0")}:${s}] ` + piece.trimStart();
      } else {
        line += piece;
      }
      last = t;
    }
    if (line !== null) lines.push(line);
    return new Blob([lines.join("\n") + "\n"], { type: "text/plain" });
  }
}

// ---------------------------------------------------------------------------------------------
// Page state and what the server said about itself.

const stats = {
  audioIn: 0, textIn: 0, decodedSamples: 0, pagesOut: 0, bufferMs: 0, droppedMs: 0,
  state: "idle", errors: [], commands: [], paused: false,
  // Meters: the largest level seen and how often the drawn level changed, per voice.
  meters: { you: { max: 0, changes: 0 }, moshi: { max: 0, changes: 0 } },
  speakingSeen: { you: false, moshi: false },
  latencyMs: null, queuePosition: null,
  // The recording: samples per channel, and the audio-clock length of the talk (seconds).
  recordedSamples: 0, talkSeconds: 0, downloads: [],
};
window.moshiStats = stats;

let session = null;
let recording = null;
const TOKEN_KEY = "moshi-native-token";

function setState(s, label) {
  stats.state = s;
  const el = $("state");
  el.dataset.state = s;
  el.textContent = label || s;
}

function showError(msg) {
  stats.errors.push(String(msg));
  $("error").textContent = String(msg);
}

function showNotice(msg) { $("notice").textContent = msg; }

function showInfo(m) {
  const about = m.model || null;
  const parts = about ? [about.name, about.format, about.device] : [m.lm_model_file, m.instance_name];
  $("model").textContent = parts.filter(Boolean).join(" · ");
  $("demo").dataset.on = about && about.demo ? "1" : "0";
  if (m.realtime && typeof m.realtime.text === "string") {
    const holds = m.realtime.holds === true;
    $("realtime").textContent = (holds ? "✓ " : "✗ ") + m.realtime.text;
    $("realtime").dataset.holds = String(holds);
  }
}

// What the server's error messages and close codes mean for the person in front of the page.
function explainServerError(text) {
  if (text.startsWith("server busy")) return "The server is busy: every conversation slot is taken and the waiting line is full. Try again in a minute.";
  if (text.startsWith("invalid") || text.includes("parameter")) return "The server refused a setting: " + text + ". Check the sampling values under Advanced.";
  if (text.startsWith("cannot open a session")) return "The server could not start a conversation (" + text + "). Try again; if it persists, check the server log.";
  return "Server error: " + text;
}
function explainClose(e, handshaken) {
  if (e.code === 1013) return "The server is busy (all slots taken). Try again in a minute.";
  if (e.code === 1001) return "The server is shutting down.";
  if (e.code === 1008) return "The server closed the conversation: " + (e.reason || "protocol error") + ".";
  if (e.code === 1011) return "The server hit an error: " + (e.reason || "session error") + ".";
  if (e.code === 1006 && !handshaken) return "Could not connect to the server: it may be down.";
  return "Disconnected" + (e.reason ? ": " + e.reason : "") + ".";
}

// ---------------------------------------------------------------------------------------------
// Token: asked for when the server answers 401, remembered for this tab (sessionStorage).

function token() {
  return new URLSearchParams(location.search).get("worker_auth_id") || sessionStorage.getItem(TOKEN_KEY) || "";
}
function askToken(why) {
  $("token-box").dataset.on = "1";
  $("token-why").textContent = why;
  setState("token", "token needed");
  $("token").focus();
}
// The chat endpoint answers a plain GET with 401 when the token is missing or wrong (checked before
// any model work), so the page can ask for one before opening the WebSocket.
async function tokenAccepted() {
  const q = new URLSearchParams();
  const t = token();
  if (t) q.set("worker_auth_id", t);
  try {
    const r = await fetch("/api/chat?" + q.toString(), { cache: "no-store" });
    return r.status !== 401;
  } catch (_) {
    return true; // unreachable server: the WebSocket says so
  }
}

// ---------------------------------------------------------------------------------------------
// Controls.

const CONTROL = { pause: 2, reset: 3, resume: 4, interrupt: 5 };

function sendControl(s, name) {
  if (!s.ws || s.ws.readyState !== WebSocket.OPEN) return false;
  s.ws.send(new Uint8Array([3, CONTROL[name]]));
  stats.commands.push(name);
  return true;
}

function setControls(enabled) {
  for (const id of ["pause", "interrupt", "reset"]) $(id).disabled = !enabled;
  if (!enabled) { $("pause").dataset.on = "0"; $("pause").textContent = "Pause mic"; stats.paused = false; }
}

// Pause mic: the page stops sending audio and the server stops feeding the model; resume continues
// the same conversation.
function togglePause() {
  const s = session;
  if (!s) return;
  const pause = !s.micPaused;
  if (!sendControl(s, pause ? "pause" : "resume")) return;
  s.micPaused = pause;
  stats.paused = pause;
  $("pause").dataset.on = pause ? "1" : "0";
  $("pause").textContent = pause ? "Resume mic" : "Pause mic";
  showNotice(pause ? "Microphone paused: Moshi is not listening." : "");
}

// Interrupt: drop Moshi's reply in flight (server side and in the local playback buffer).
function interrupt() {
  const s = session;
  if (!s || !sendControl(s, "interrupt")) return;
  if (s.player) s.player.port.postMessage("reset");
  showNotice("Interrupted.");
}

// New conversation: same connection, fresh model state, empty transcript.
function newConversation() {
  const s = session;
  if (!s || !sendControl(s, "reset")) return;
  if (s.player) s.player.port.postMessage("reset");
  s.latency.length = 0;
  $("transcript").textContent = "";
  showNotice("New conversation started.");
}

function paramsFromForm() {
  const q = new URLSearchParams();
  const form = new FormData($("settings"));
  for (const [k, v] of form.entries()) {
    if (k === "seed" || v === "") continue;
    q.set(k, v);
  }
  const t = token();
  if (t) q.set("worker_auth_id", t);
  const seed = form.get("seed");
  const s = seed ? Number(seed) : Math.floor(Math.random() * 1e6);
  q.set("text_seed", String(s));
  q.set("audio_seed", String(s + 1));
  return q;
}

// ---------------------------------------------------------------------------------------------
// Conversation.

async function start() {
  if (typeof AudioEncoder === "undefined" || typeof AudioDecoder === "undefined") {
    setState("error", "unsupported browser");
    showError("This page needs WebCodecs (AudioEncoder/AudioDecoder): use a recent Chrome, Edge or Firefox, over HTTPS or on localhost.");
    return;
  }
  $("error").textContent = "";
  showNotice("");
  const s = {
    ws: null, ctx: null, stream: null, encoder: null, decoder: null, player: null, cap: null,
    closed: false, micPaused: false, handshaken: false,
    youLevel: 0, moshiMeter: null,
    sent: [], decoded: 0, latency: [], // [input samples at the end of a page, time sent]
  };
  session = s;
  $("toggle").dataset.running = "1";
  $("toggle").textContent = "Stop";
  setState("connecting", "connecting…");
  if (!(await tokenAccepted())) {
    stop(false);
    askToken(token() ? "The server refused this token." : "Ask whoever runs it.");
    return;
  }
  if (session !== s) return;
  $("token-box").dataset.on = "0";
  $("transcript").textContent = "";
  recording = new Recording();
  stats.latencyMs = null;
  updateDownloads();

  try {
    s.ctx = new AudioContext({ sampleRate: MODEL_RATE, latencyHint: "interactive" });
  } catch (_) {
    s.ctx = new AudioContext({ latencyHint: "interactive" });
  }
  await s.ctx.resume();
  await s.ctx.audioWorklet.addModule("/moshi-worklet.js");
  s.player = new AudioWorkletNode(s.ctx, "moshi-player", { numberOfInputs: 0, outputChannelCount: [1] });
  s.player.connect(s.ctx.destination);
  s.moshiMeter = s.ctx.createAnalyser();
  s.moshiMeter.fftSize = 1024;
  s.player.connect(s.moshiMeter);
  s.player.port.onmessage = (e) => { stats.bufferMs = e.data.bufferMs; stats.droppedMs = e.data.droppedMs; };

  // Decoder: Ogg pages from the server → packets → PCM → jitter buffer and recording.
  const reader = new OggReader();
  let outResampler = null, recResampler = null;
  let ts = 0;
  s.decoder = new AudioDecoder({
    output: (ad) => {
      const pcm = new Float32Array(ad.numberOfFrames);
      ad.copyTo(pcm, { planeIndex: 0, format: "f32-planar" });
      if (!outResampler) {
        outResampler = new Resampler(ad.sampleRate, s.ctx.sampleRate);
        recResampler = new Resampler(ad.sampleRate, MODEL_RATE);
      }
      ad.close();
      if (s.closed) return;
      const atModelRate = recResampler.process(pcm);
      stats.decodedSamples += atModelRate.length;
      noteAnswer(s, atModelRate.length);
      if (recording) recording.addMoshi(atModelRate);
      s.player.port.postMessage(outResampler.process(pcm));
    },
    error: (e) => showError("decoder: " + e.message),
  });
  s.decoder.configure({ codec: "opus", sampleRate: MODEL_RATE, numberOfChannels: 1 });

  const url = new URL("/api/chat", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.search = paramsFromForm().toString();
  const ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  s.ws = ws;
  ws.onopen = () => setState("waiting", "waiting for a slot");
  ws.onclose = (e) => {
    if (session === s && !s.closed) {
      if (e.code !== 1000) showError(explainClose(e, s.handshaken));
      if (e.code === 1013) setState("busy", "server busy");
      else if (e.code === 1000) setState("idle", "ended");
      else setState("disconnected", "disconnected");
      stop(false);
    }
  };
  ws.onerror = () => { /* the close event that follows says why */ };
  ws.onmessage = (e) => {
    const b = new Uint8Array(e.data);
    if (b.length === 0) return;
    const payload = b.subarray(1);
    switch (b[0]) {
      case 0:
        s.handshaken = true;
        stats.queuePosition = null;
        setState("connected", "talking");
        setControls(true);
        startMic(s).catch((err) => { showError("microphone: " + err.message); stop(true); });
        break;
      case 1:
        stats.audioIn++;
        for (const pkt of reader.push(payload)) {
          if (pkt.length >= 8) {
            const head = String.fromCharCode(...pkt.subarray(0, 8));
            if (head === "OpusHead" || head === "OpusTags") continue;
          }
          s.decoder.decode(new EncodedAudioChunk({ type: "key", timestamp: ts, data: pkt }));
          ts += 40000;
        }
        break;
      case 2: {
        stats.textIn++;
        const piece = new TextDecoder().decode(payload);
        if (recording) recording.addText(piece);
        const t = $("transcript");
        t.textContent += piece;
        t.scrollTop = t.scrollHeight;
        break;
      }
      case 4:
        try { showInfo(JSON.parse(new TextDecoder().decode(payload))); } catch (_) { /* ignore */ }
        break;
      case 5:
        showError(explainServerError(new TextDecoder().decode(payload)));
        if (new TextDecoder().decode(payload).startsWith("server busy")) setState("busy", "server busy");
        break;
      case 6:
        // While waiting for a slot, our server's pings carry the place in the queue.
        if (!s.handshaken && payload.length > 0) {
          const place = Number(new TextDecoder().decode(payload));
          if (Number.isFinite(place) && place > 0) {
            stats.queuePosition = place;
            setState("waiting", place === 1 ? "waiting: next in line" : `waiting: ${place} in line`);
          }
        }
        break;
      default:
        break;
    }
  };
}

// Round trip: Moshi answers every 80 ms input frame with one output frame, so the answer to the
// input that ended at sample N is the output that ends at sample N. Its latency is the time from
// sending that input to decoding that output here.
function noteAnswer(s, samples) {
  s.decoded += samples;
  let sentAt = null;
  while (s.sent.length && s.sent[0][0] <= s.decoded) sentAt = s.sent.shift()[1];
  if (sentAt === null) return;
  s.latency.push(performance.now() - sentAt);
  if (s.latency.length > 25) s.latency.shift();
  const sorted = [...s.latency].sort((a, b) => a - b);
  stats.latencyMs = sorted[sorted.length >> 1];
}

async function startMic(s) {
  s.stream = await navigator.mediaDevices.getUserMedia({
    audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
  });
  if (session !== s || s.closed) { s.stream.getTracks().forEach((t) => t.stop()); return; }
  const src = s.ctx.createMediaStreamSource(s.stream);
  const cap = new AudioWorkletNode(s.ctx, "moshi-capture", { numberOfOutputs: 1, outputChannelCount: [1] });
  s.cap = cap;
  const mute = s.ctx.createGain();
  mute.gain.value = 0;
  src.connect(cap); cap.connect(mute); mute.connect(s.ctx.destination);
  s.talkStart = s.ctx.currentTime;
  recording.startedAt = performance.now();

  const ogg = new OggWriter((Math.random() * 0x7fffffff) | 0);
  const send = (page) => {
    if (s.ws.readyState !== WebSocket.OPEN) return false;
    const m = new Uint8Array(1 + page.length);
    m[0] = 1; m.set(page, 1);
    s.ws.send(m);
    stats.pagesOut++;
    return true;
  };
  send(ogg.page([opusHead()], 0, 2));
  send(ogg.page([opusTags()], 0, 0));
  let pending = [];
  let granule = 0;
  s.encoder = new AudioEncoder({
    output: (chunk) => {
      const pkt = new Uint8Array(chunk.byteLength);
      chunk.copyTo(pkt);
      pending.push(pkt);
      granule += Math.round((chunk.duration || 20000) * 48 / 1000);
      if (pending.length === 2) { // two 20 ms packets per page, as Kyutai's client
        if (send(ogg.page(pending, granule, 0))) s.sent.push([granule / 2, performance.now()]);
        pending = [];
      }
    },
    error: (e) => showError("encoder: " + e.message),
  });
  s.encoder.configure({ codec: "opus", sampleRate: MODEL_RATE, numberOfChannels: 1, bitrate: 32000, opus: { frameDuration: 20000 } });
  const rs = new Resampler(s.ctx.sampleRate, MODEL_RATE);
  let t = 0;
  cap.port.onmessage = (e) => {
    if (e.data && e.data.flushed) { if (s.onFlushed) s.onFlushed(); return; }
    const x = rs.process(e.data);
    if (x.length === 0) return;
    // Your meter shows what Moshi hears: the samples sent (nothing while paused).
    s.youLevel = s.micPaused ? 0 : rms(x);
    // Recorded as Moshi heard it: silence while the microphone is paused.
    if (recording) recording.addYou(s.micPaused ? new Float32Array(x.length) : x);
    if (s.closed || s.micPaused || s.encoder.state !== "configured") return;
    const ad = new AudioData({ format: "f32-planar", sampleRate: MODEL_RATE, numberOfFrames: x.length, numberOfChannels: 1, timestamp: t, data: x });
    t += Math.round((x.length * 1e6) / MODEL_RATE);
    s.encoder.encode(ad);
    ad.close();
  };
}

// Ends the conversation. The microphone's last partial block is collected first (bounded wait), so
// the recording ends at Stop.
async function stop(closeSocket) {
  const s = session;
  if (!s) return;
  s.closed = true;
  session = null;
  if (closeSocket && s.ws && s.ws.readyState <= 1) s.ws.close(1000);
  $("toggle").dataset.running = "0";
  $("toggle").textContent = "Start conversation";
  setControls(false);
  if (stats.state === "connected" || stats.state === "waiting" || stats.state === "connecting") setState("idle", "ended");
  if (s.cap && s.ctx && s.ctx.state === "running") {
    const end = s.ctx.currentTime;
    await new Promise((done) => {
      s.onFlushed = done;
      s.cap.port.postMessage("flush");
      setTimeout(done, 1000);
    });
    stats.talkSeconds = end - s.talkStart;
  }
  if (s.stream) s.stream.getTracks().forEach((t) => t.stop());
  for (const c of [s.encoder, s.decoder]) { try { if (c && c.state !== "closed") c.close(); } catch (_) { /* closed */ } }
  if (s.ctx) s.ctx.close();
  updateDownloads();
}

// ---------------------------------------------------------------------------------------------
// Downloads.

function stamp() {
  const d = recording && recording.startedAt ? new Date(performance.timeOrigin + recording.startedAt) : new Date();
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}${p(d.getMonth() + 1)}${p(d.getDate())}-${p(d.getHours())}${p(d.getMinutes())}${p(d.getSeconds())}`;
}
function download(blob, name) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 60000);
  stats.downloads.push(name);
}
function updateDownloads() {
  const has = recording && !recording.empty();
  $("download-wav").disabled = !has;
  $("download-txt").disabled = !has;
  if (recording) stats.recordedSamples = recording.youLen;
  $("recinfo").textContent = has
    ? `${(recording.youLen / MODEL_RATE).toFixed(1)} s recorded in this tab (you left, Moshi right).`
    : "Recorded in this tab only, from Start to Stop.";
}
$("download-wav").addEventListener("click", () => {
  if (recording) download(recording.wav(), `moshi-conversation-${stamp()}.wav`);
});
$("download-txt").addEventListener("click", () => {
  if (!recording) return;
  const header = `Moshi's transcript, ${new Date().toISOString()} (${$("model").textContent}); times from the start of the conversation.`;
  download(recording.transcript(header), `moshi-transcript-${stamp()}.txt`);
});

// ---------------------------------------------------------------------------------------------
// Meters: a scrolling level trace per voice, and who is speaking.

const SPEAKING = 0.02; // RMS above which a voice counts as speaking (about -34 dBFS)
const meterBuf = new Float32Array(1024);
const traces = { you: new Float32Array(120), moshi: new Float32Array(120) };
function rms(x) {
  let e = 0;
  for (let i = 0; i < x.length; i++) e += x[i] * x[i];
  return x.length ? Math.sqrt(e / x.length) : 0;
}
// Moshi's meter shows what is playing now (the player's output), not what just arrived.
function level(analyser) {
  if (!analyser) return 0;
  analyser.getFloatTimeDomainData(meterBuf);
  return rms(meterBuf);
}
function drawTrace(canvas, trace, color) {
  const g = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, n = trace.length, bw = w / n;
  g.clearRect(0, 0, w, h);
  g.fillStyle = color;
  for (let i = 0; i < n; i++) {
    // Log scale from -60 dBFS to 0.
    const db = 20 * Math.log10(Math.max(trace[i], 1e-6));
    const v = Math.max(0, Math.min(1, (db + 60) / 60));
    const bh = Math.max(1, v * h);
    g.fillRect(i * bw, (h - bh) / 2, Math.max(1, bw - 1), bh);
  }
}
function meterTick() {
  const s = session;
  const css = getComputedStyle(document.documentElement);
  for (const who of ["you", "moshi"]) {
    const lv = !s ? 0 : who === "you" ? s.youLevel || 0 : level(s.moshiMeter);
    const tr = traces[who];
    const prev = tr[tr.length - 1];
    tr.copyWithin(0, 1);
    tr[tr.length - 1] = lv;
    const m = stats.meters[who];
    m.max = Math.max(m.max, lv);
    if (Math.abs(lv - prev) > 1e-3) m.changes++;
    const on = lv > SPEAKING;
    if (on) stats.speakingSeen[who] = true;
    $(who + "-speaking").dataset.on = on ? "1" : "0";
    drawTrace($(who + "-meter"), tr, css.getPropertyValue("--" + who).trim());
  }
  const youOn = $("you-speaking").dataset.on === "1", moshiOn = $("moshi-speaking").dataset.on === "1";
  $("speaking").textContent = !s ? "" : youOn && moshiOn ? "You are both speaking" : moshiOn ? "Moshi is speaking" : youOn ? "You are speaking" : "";
}
setInterval(meterTick, 80);

setInterval(() => {
  $("stat-audio-in").textContent = stats.audioIn;
  $("stat-text-in").textContent = stats.textIn;
  $("stat-decoded").textContent = (stats.decodedSamples / MODEL_RATE).toFixed(1);
  $("stat-pages-out").textContent = stats.pagesOut;
  $("stat-dropped").textContent = Math.round(stats.droppedMs);
  $("latency").textContent = stats.latencyMs === null ? "–" : Math.round(stats.latencyMs) + " ms";
  $("buffer").textContent = session && session.handshaken ? Math.round(stats.bufferMs) + " ms" : "–";
  const fill = $("lagfill");
  fill.style.width = Math.min(100, stats.bufferMs / 3) + "%";
  fill.dataset.level = stats.bufferMs > 250 ? "high" : stats.bufferMs > 150 ? "mid" : "low";
  if (session) updateDownloads();
}, 200);

// ---------------------------------------------------------------------------------------------
// Wiring and start-up.

function startConversation() {
  start().catch((e) => { showError(e.message); setState("error"); stop(true); });
}
$("toggle").addEventListener("click", () => {
  if (session) stop(true);
  else startConversation();
});
$("pause").addEventListener("click", togglePause);
$("interrupt").addEventListener("click", interrupt);
$("reset").addEventListener("click", newConversation);
$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const t = $("token").value.trim();
  if (!t) return;
  sessionStorage.setItem(TOKEN_KEY, t);
  $("token").value = "";
  $("token-box").dataset.on = "0";
  setState("idle", "ready");
  startConversation();
});

// What is served, before any conversation (our server's /api/info; other servers: said later by
// the metadata message).
fetch("/api/info", { cache: "no-store" })
  .then((r) => (r.ok ? r.json() : Promise.reject(new Error("no /api/info"))))
  .then((m) => {
    showInfo(m);
    if (m.token_required && !token() && !session) askToken("Ask whoever runs it.");
  })
  .catch(() => { $("model").textContent = ""; });

// ?autostart=1 starts at once (kiosk use); other query keys prefill the settings form.
const qs = new URLSearchParams(location.search);
for (const [k, v] of qs.entries()) {
  const input = document.querySelector(`#settings [name="${k}"]`);
  if (input) input.value = v;
}
if (qs.get("autostart") === "1") startConversation();
