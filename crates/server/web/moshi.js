// moshi-native web page: microphone → Opus (WebCodecs) → Ogg pages → WebSocket, and back:
// Ogg pages → Opus packets → WebCodecs decoder → AudioWorklet jitter buffer. Protocol: binary
// messages whose first byte is the kind (0 handshake, 1 audio, 2 text, 3 control, 4 metadata,
// 5 error, 6 ping). Control payloads: 2 pause, 3 restart (new conversation), 4 resume, 5 interrupt.
"use strict";

const MODEL_RATE = 24000;
const $ = (id) => document.getElementById(id);

const stats = { audioIn: 0, textIn: 0, decodedSamples: 0, pagesOut: 0, bufferMs: 0, droppedMs: 0, state: "idle", errors: [], commands: [], paused: false };
window.moshiStats = stats;

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

let session = null;

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

// What the server's error messages and close codes mean for the person in front of the page.
function explainServerError(text) {
  if (text.startsWith("server busy")) return "The server is busy: every conversation slot is taken and the waiting line is full. Try again in a minute.";
  if (text.startsWith("invalid") || text.includes("parameter")) return "The server refused a setting: " + text + ". Check the sampling values.";
  if (text.startsWith("cannot open a session")) return "The server could not start a conversation (" + text + "). Try again; if it persists, check the server log.";
  return "Server error: " + text;
}
function explainClose(e, handshaken) {
  if (e.code === 1013) return "The server is busy (all slots taken). Try again in a minute.";
  if (e.code === 1001) return "The server is shutting down.";
  if (e.code === 1008) return "The server closed the conversation: " + (e.reason || "protocol error") + ".";
  if (e.code === 1011) return "The server hit an error: " + (e.reason || "session error") + ".";
  if (e.code === 1006 && !handshaken) return "Could not connect to the server. It may be down, or it may need a token: open this page as ?worker_auth_id=YOUR_TOKEN.";
  return "Disconnected" + (e.reason ? ": " + e.reason : "") + ".";
}

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
  // A token given in the page's own address is passed on (servers started with --auth-token).
  const token = new URLSearchParams(location.search).get("worker_auth_id");
  if (token) q.set("worker_auth_id", token);
  const seed = form.get("seed");
  const s = seed ? Number(seed) : Math.floor(Math.random() * 1e6);
  q.set("text_seed", String(s));
  q.set("audio_seed", String(s + 1));
  return q;
}

async function start() {
  if (typeof AudioEncoder === "undefined" || typeof AudioDecoder === "undefined") {
    setState("error", "unsupported browser");
    showError("This page needs WebCodecs (AudioEncoder/AudioDecoder): use a recent Chrome, Edge or Firefox, over HTTPS or on localhost.");
    return;
  }
  $("error").textContent = "";
  showNotice("");
  $("transcript").textContent = "";
  const s = { ws: null, ctx: null, stream: null, encoder: null, decoder: null, player: null, closed: false, micPaused: false, handshaken: false };
  session = s;
  $("toggle").dataset.running = "1";
  $("toggle").textContent = "Stop";
  setState("connecting");

  try {
    s.ctx = new AudioContext({ sampleRate: MODEL_RATE, latencyHint: "interactive" });
  } catch (_) {
    s.ctx = new AudioContext({ latencyHint: "interactive" });
  }
  await s.ctx.resume();
  await s.ctx.audioWorklet.addModule("/moshi-worklet.js");
  s.player = new AudioWorkletNode(s.ctx, "moshi-player", { numberOfInputs: 0, outputChannelCount: [1] });
  s.player.connect(s.ctx.destination);
  s.player.port.onmessage = (e) => { stats.bufferMs = e.data.bufferMs; stats.droppedMs = e.data.droppedMs; };

  // Decoder: Ogg pages from the server → packets → PCM → jitter buffer.
  const reader = new OggReader();
  let outResampler = null;
  let ts = 0;
  s.decoder = new AudioDecoder({
    output: (ad) => {
      const pcm = new Float32Array(ad.numberOfFrames);
      ad.copyTo(pcm, { planeIndex: 0, format: "f32-planar" });
      if (!outResampler) outResampler = new Resampler(ad.sampleRate, s.ctx.sampleRate);
      ad.close();
      stats.decodedSamples += pcm.length * (MODEL_RATE / outResampler.step / s.ctx.sampleRate);
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
      setState(e.code === 1000 ? "idle" : "error", e.code === 1013 ? "busy" : e.reason ? "closed: " + e.reason : "closed");
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
        setState("connected");
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
        const t = $("transcript");
        t.textContent += new TextDecoder().decode(payload);
        t.scrollTop = t.scrollHeight;
        break;
      }
      case 4:
        try {
          const m = JSON.parse(new TextDecoder().decode(payload));
          $("model").textContent = [m.instance_name, m.lm_model_file].filter(Boolean).join(" · ");
          // Our server's start-up verdict: whether this machine keeps up with real time, and what would help.
          if (m.realtime && typeof m.realtime.text === "string") {
            $("realtime").textContent = m.realtime.text;
            $("realtime").dataset.holds = String(m.realtime.holds === true);
          }
        } catch (_) { /* ignore */ }
        break;
      case 5:
        showError(explainServerError(new TextDecoder().decode(payload)));
        break;
      default:
        break; // ping and unknown kinds
    }
  };
}

async function startMic(s) {
  s.stream = await navigator.mediaDevices.getUserMedia({
    audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
  });
  if (session !== s || s.closed) { s.stream.getTracks().forEach((t) => t.stop()); return; }
  const src = s.ctx.createMediaStreamSource(s.stream);
  const cap = new AudioWorkletNode(s.ctx, "moshi-capture", { numberOfOutputs: 1, outputChannelCount: [1] });
  const mute = s.ctx.createGain();
  mute.gain.value = 0;
  src.connect(cap); cap.connect(mute); mute.connect(s.ctx.destination);

  const ogg = new OggWriter((Math.random() * 0x7fffffff) | 0);
  const send = (page) => {
    if (s.ws.readyState !== WebSocket.OPEN) return;
    const m = new Uint8Array(1 + page.length);
    m[0] = 1; m.set(page, 1);
    s.ws.send(m);
    stats.pagesOut++;
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
        send(ogg.page(pending, granule, 0));
        pending = [];
      }
    },
    error: (e) => showError("encoder: " + e.message),
  });
  s.encoder.configure({ codec: "opus", sampleRate: MODEL_RATE, numberOfChannels: 1, bitrate: 32000, opus: { frameDuration: 20000 } });
  const rs = new Resampler(s.ctx.sampleRate, MODEL_RATE);
  let t = 0;
  cap.port.onmessage = (e) => {
    if (s.closed || s.micPaused || s.encoder.state !== "configured") return;
    const x = rs.process(e.data);
    if (x.length === 0) return;
    const ad = new AudioData({ format: "f32-planar", sampleRate: MODEL_RATE, numberOfFrames: x.length, numberOfChannels: 1, timestamp: t, data: x });
    t += Math.round((x.length * 1e6) / MODEL_RATE);
    s.encoder.encode(ad);
    ad.close();
  };
}

function stop(closeSocket) {
  const s = session;
  if (!s) return;
  s.closed = true;
  session = null;
  if (closeSocket && s.ws && s.ws.readyState <= 1) s.ws.close(1000);
  if (s.stream) s.stream.getTracks().forEach((t) => t.stop());
  for (const c of [s.encoder, s.decoder]) { try { if (c && c.state !== "closed") c.close(); } catch (_) { /* closed */ } }
  if (s.ctx) s.ctx.close();
  $("toggle").dataset.running = "0";
  $("toggle").textContent = "Start conversation";
  setControls(false);
  if (stats.state !== "error") setState("idle");
}

$("toggle").addEventListener("click", () => {
  if (session) stop(true);
  else start().catch((e) => { showError(e.message); setState("error"); stop(true); });
});

$("pause").addEventListener("click", togglePause);
$("interrupt").addEventListener("click", interrupt);
$("reset").addEventListener("click", newConversation);

setInterval(() => {
  $("stat-audio-in").textContent = stats.audioIn;
  $("stat-text-in").textContent = stats.textIn;
  $("stat-decoded").textContent = (stats.decodedSamples / MODEL_RATE).toFixed(1);
  $("stat-pages-out").textContent = stats.pagesOut;
  $("stat-buffer").textContent = Math.round(stats.bufferMs);
  $("stat-dropped").textContent = Math.round(stats.droppedMs);
  const fill = $("lagfill");
  fill.style.width = Math.min(100, stats.bufferMs / 3) + "%";
  fill.dataset.level = stats.bufferMs > 250 ? "high" : stats.bufferMs > 150 ? "mid" : "low";
}, 200);

// ?autostart=1 starts at once (kiosk use and the headless browser test); other query keys
// prefill the settings form.
const qs = new URLSearchParams(location.search);
for (const [k, v] of qs.entries()) {
  const input = document.querySelector(`#settings [name="${k}"]`);
  if (input) input.value = v;
}
if (qs.get("autostart") === "1") {
  start().catch((e) => { showError(e.message); setState("error"); stop(true); });
}
