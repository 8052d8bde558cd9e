// AudioWorklet processors of the moshi-native page.
//  - "moshi-capture": forwards microphone samples to the page in blocks (and the partial block on
//    "flush").
//  - "moshi-player": a jitter buffer for the model's voice. It starts after `startMs` of audio is
//    buffered, and when the buffer grows beyond `maxMs` (the connection delivered a burst after a
//    stall) it drops the oldest audio down to `targetMs`, so latency stays bounded.

class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Float32Array(1024);
    this.fill = 0;
    // "flush": send the partial block, then {flushed}, so the page's recording ends exactly at Stop.
    this.port.onmessage = (e) => {
      if (e.data !== "flush") return;
      if (this.fill > 0) this.port.postMessage(this.block.slice(0, this.fill));
      this.fill = 0;
      this.port.postMessage({ flushed: true });
    };
  }
  process(inputs) {
    // A render quantum without input channels (the microphone not started yet) counts as silence:
    // every quantum is forwarded, so the samples sent follow the audio clock.
    const ch = inputs[0] && inputs[0][0];
    const n = ch ? ch.length : 128;
    for (let i = 0; i < n; i++) {
      this.block[this.fill++] = ch ? ch[i] : 0;
      if (this.fill === this.block.length) {
        this.port.postMessage(this.block.slice(0));
        this.fill = 0;
      }
    }
    return true;
  }
}

class PlayerProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    const sr = sampleRate;
    this.buf = new Float32Array(sr * 4); // ring of 4 s
    this.read = 0;
    this.len = 0;
    this.playing = false;
    this.startLen = Math.round(sr * 0.08);
    this.maxLen = Math.round(sr * 0.3);
    this.targetLen = Math.round(sr * 0.12);
    this.dropped = 0;
    this.underruns = 0;
    this.frames = 0;
    this.port.onmessage = (e) => {
      if (e.data === "reset") { this.read = 0; this.len = 0; this.playing = false; return; }
      this.push(e.data);
    };
  }
  push(x) {
    const cap = this.buf.length;
    for (let i = 0; i < x.length; i++) {
      if (this.len === cap) { this.read = (this.read + 1) % cap; this.len--; this.dropped++; }
      this.buf[(this.read + this.len) % cap] = x[i];
      this.len++;
    }
    if (this.len > this.maxLen) {
      const drop = this.len - this.targetLen;
      this.read = (this.read + drop) % cap;
      this.len -= drop;
      this.dropped += drop;
    }
  }
  process(_inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.len >= this.startLen) this.playing = true;
    const cap = this.buf.length;
    for (let i = 0; i < out.length; i++) {
      if (this.playing && this.len > 0) {
        out[i] = this.buf[this.read];
        this.read = (this.read + 1) % cap;
        this.len--;
      } else {
        out[i] = 0;
      }
    }
    if (this.playing && this.len === 0) { this.playing = false; this.underruns++; }
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    if ((this.frames++ & 15) === 0) {
      this.port.postMessage({ bufferMs: (1000 * this.len) / sampleRate, droppedMs: (1000 * this.dropped) / sampleRate, underruns: this.underruns });
    }
    return true;
  }
}

registerProcessor("moshi-capture", CaptureProcessor);
registerProcessor("moshi-player", PlayerProcessor);
