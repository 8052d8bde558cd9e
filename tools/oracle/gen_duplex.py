"""Server emulation: the tiny bundle of fixtures/lm driven by moshi 0.2.13's own `moshi.server.ServerState`
(warm-up, per-connection reset, recv_loop with the first-frame skip, decode_and_send) with the
WebSocket and Opus layers replaced by identity fakes, greedy sampling, on a deterministic float WAV."""
import asyncio

from common import FIX, FRAME, save_st, versions, write_json, write_wav_f32
import aiohttp
import numpy as np
import torch
import gen_lm
import gen_mimi
import moshi
from moshi.models import loaders


def _import_server_without_main():
    """moshi 0.2.13's server.py ends with a module-level `with torch.no_grad(): main()` (no __main__
    guard), so importing it starts the server. Execute its source without that last statement."""
    import types
    from pathlib import Path
    path = Path(moshi.__file__).parent / "server.py"
    src = path.read_text()
    tail = "with torch.no_grad():\n    main()\n"
    assert src.endswith(tail), "moshi/server.py changed; update the oracle"
    mod = types.ModuleType("moshi._server_nomain")
    mod.__package__ = "moshi"
    mod.__file__ = str(path)
    exec(compile(src[: -len(tail)], str(path), "exec"), mod.__dict__)
    return mod


srv = _import_server_without_main()

OUT = FIX / "duplex"
# Input = one 1920-sample frame of a 300 Hz tone (the server encodes it, resets Mimi, and LMGen ignores its
# codes) followed by fixtures/mimi/input.wav (61000 samples). After the reset the server encodes exactly the
# Mimi fixture's streaming frames, whose argmin margins were calibrated: user_codes[:, 1:] == mimi codes[:, :31].
# 62920 samples = 32 frames + 1480 trailing samples that the server drops.
CHUNKS = [960, 1500, 2000, 1920, 700, 3840]   # message sizes (samples) cycled through, to exercise buffering


class FakeMsg:
    def __init__(self, data: bytes):
        self.type = aiohttp.WSMsgType.BINARY
        self.data = data


class FakeWs:
    def __init__(self, messages):
        self.messages = messages
        self.sent = []

    def __aiter__(self):
        async def gen():
            for m in self.messages:
                yield m
        return gen()

    async def send_bytes(self, b: bytes):
        self.sent.append(b)

    def exception(self):
        return None


class IdentityOpusReader:
    """payload bytes = raw float32 PCM."""
    def append_bytes(self, payload: bytes):
        return np.frombuffer(payload, dtype="<f4").astype(np.float32)


class CollectingOpusWriter:
    def __init__(self):
        self.pcm = []

    def append_pcm(self, pcm):
        self.pcm.append(np.array(pcm, dtype=np.float32))
        return b""          # no audio message; PCM collected here


def load_state():
    d = FIX / "lm"
    info = loaders.CheckpointInfo.from_hf_repo(
        "unused/offline", moshi_weights=d / "model.safetensors", mimi_weights=d / gen_lm.MIMI_FILE,
        tokenizer=d / gen_lm.SPM_FILE, config_path=d / "config.json", mimi_config_path=d / gen_lm.MIMI_CONFIG_FILE)
    mimi = info.get_mimi(device="cpu")
    lm = info.get_moshi(device="cpu", dtype=torch.float32)
    tok = info.get_text_tokenizer()
    srv.seed_all(42424242)
    state = srv.ServerState(info.model_type, mimi, tok, lm, cfg_coef=1.0, device="cpu", use_sampling=False)
    return state


def input_wave() -> np.ndarray:
    t = np.arange(FRAME) / 24000.0
    first = (0.2 * np.sin(2 * np.pi * 300.0 * t)).astype(np.float32)
    wav = gen_mimi.test_waveform(gen_mimi.N_SAMPLES, gen_mimi.WAVE_SEED)
    return np.concatenate([first, wav]).astype(np.float32)


def run(wav: np.ndarray, warmup: bool = True):
    state = load_state()
    torch.cuda.synchronize = lambda *a, **k: None     # warm-up calls it unconditionally (CPU here)
    if warmup:
        state.warmup()
    mimi, lm_gen = state.mimi, state.lm_gen

    rec = {"user_codes": [], "text": [], "audio": [], "latents": [], "margins_text": [], "margins_audio": []}
    orig_step = lm_gen.step

    def step(codes, *a, **k):
        rec["user_codes"].append(codes[0, :, 0].clone())
        out = orig_step(codes, *a, **k)
        if out is not None:
            rec["text"].append(int(out[0, 0, 0]))
            rec["audio"].append(out[0, 1:, 0].clone())
        return out
    lm_gen.step = step
    h = mimi.downsample.register_forward_hook(lambda _m, _i, o: rec["latents"].append(o.detach().clone()))

    orig_sample = gen_lm.lm_mod.sample_token

    def sample(logits, use_sampling=False, temp=1.0, top_k=0):
        flat = logits.reshape(-1).float()
        t2 = flat.topk(2).values
        (rec["margins_text"] if flat.numel() == lm_gen.lm_model.text_card else rec["margins_audio"]).append(float(t2[0] - t2[1]))
        return orig_sample(logits, use_sampling, temp, top_k)
    gen_lm.lm_mod.sample_token = sample

    msgs, pos, i = [], 0, 0
    while pos < len(wav):
        n = CHUNKS[i % len(CHUNKS)]
        msgs.append(FakeMsg(b"\x01" + wav[pos:pos + n].astype("<f4").tobytes()))
        pos += n
        i += 1
    ws = FakeWs(msgs)
    writer = CollectingOpusWriter()

    async def conn():   # body of ServerState.handle_chat inside the lock
        mimi.reset_streaming()
        lm_gen.reset_streaming()
        await ws.send_bytes(b"\x00")
        await state.recv_loop(ws, IdentityOpusReader(), writer)
    with torch.no_grad():
        asyncio.run(conn())
    h.remove()
    gen_lm.lm_mod.sample_token = orig_sample
    lm_gen.step = orig_step

    # Mimi argmin margins on the latents the server encoded during the connection (frame 0 included).
    q = mimi.quantizer
    n_frames = len(rec["user_codes"])
    lat = torch.cat(rec["latents"][-n_frames:], dim=-1)
    margins = []
    with torch.no_grad():
        r = q.rvq_first.input_proj(lat)[0].T
        margins.append(gen_mimi.gaps(r, q.rvq_first.vq.layers[0]._codebook.embedding)[1])
        r = q.rvq_rest.input_proj(lat)[0].T
        for layer in q.rvq_rest.vq.layers[:7]:
            emb = layer._codebook.embedding
            c, gp = gen_mimi.gaps(r, emb)
            margins.append(gp)
            r = r - emb[c]
    margins = torch.stack(margins)  # [8, frames]
    texts = [m[1:].decode() for m in ws.sent if m[:1] == b"\x02"]
    return {
        "text_tokens": torch.tensor(rec["text"], dtype=torch.int64),
        "audio_tokens": torch.stack(rec["audio"], dim=1).to(torch.int64),
        "pcm": torch.from_numpy(np.concatenate(writer.pcm)),
        "user_codes": torch.stack(rec["user_codes"], dim=1).to(torch.int64),
        "input_pcm": torch.from_numpy(wav),
        "mimi_margin": margins.to(torch.float32),
        "text_margin_min": min(rec["margins_text"]),
        "audio_margin_min": min(rec["margins_audio"]),  # sample patch installed after warm-up
        "messages": [m.hex() if m[:1] != b"\x02" else None for m in ws.sent],
        "text_messages": texts,
    }


def main():
    wav = input_wave()
    N_FRAMES = len(wav) // FRAME
    EXTRA = len(wav) - N_FRAMES * FRAME
    res = run(wav)
    res2 = run(wav, warmup=False)
    warmup_no_effect = all(torch.equal(res[k], res2[k]) for k in ("text_tokens", "audio_tokens", "pcm", "user_codes"))
    mimi_codes = gen_lm.load_file(str(FIX / "mimi" / "trace.safetensors"))["codes"]
    assert torch.equal(res["user_codes"][:, 1:], mimi_codes[:, : N_FRAMES - 1])
    S = N_FRAMES - 1
    assert res["text_tokens"].shape == (S,) and res["audio_tokens"].shape == (8, S)
    assert res["pcm"].shape == (S * FRAME,) and res["user_codes"].shape == (8, N_FRAMES)
    stats = {
        "frames_in": N_FRAMES, "lm_outputs": S, "dropped_tail_samples": EXTRA,
        "mimi_code_margin_min_frames_1_on": res["mimi_margin"][:, 1:].min().item(),
        "mimi_code_margin_min_frame_0": res["mimi_margin"][:, 0].min().item(),
        "warmup_then_reset_equals_no_warmup": warmup_no_effect,
        "text_margin_min": res["text_margin_min"], "audio_margin_min": res["audio_margin_min"],
        "text_messages": res["text_messages"],
    }
    OUT.mkdir(parents=True, exist_ok=True)
    write_wav_f32(OUT / "input.wav", wav)
    tensors = {k: res[k] for k in ("text_tokens", "audio_tokens", "pcm", "user_codes")}
    save_st(OUT / "trace.safetensors", tensors, {"bundle": "fixtures/lm", **versions(), "stats": stats})
    write_json(OUT / "text_messages.json", {"note": "kind-2 payloads the server sent, in order (ids 0 and 3 skipped, U+2581 -> space)",
                                            "messages": res["text_messages"]})
    write_json(OUT / "stats.json", stats)
    print({k: v for k, v in stats.items() if k != "text_messages"}, len(res["text_messages"]))


if __name__ == "__main__":
    main()
