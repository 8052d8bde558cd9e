"""Tiny speech-to-text fixtures (`fixtures/stt/<variant>/`): the two released STT shapes scaled down
(dep_q 0, 32 codebooks, all delays 0, extra heads, stt_config), a 32-codebook tiny Mimi, and a trace of
the whole streaming path through `moshi` 0.2.13 itself (Mimi streaming encode, `LMGen.step_with_extra_heads`
greedy), plus the word/VAD events of Kyutai's streaming word rules (moshi-server's ASR step rules,
restated below in Python from `docs/stt.md`) over the traced text tokens and over a crafted token stream.

The test signal is not a whole number of frames (zero-padded). `pad_gain` scales the text head's
PAD / EPAD rows further (after HEAD_GAIN) so that a random model emits them often, as real runs do.

Variants:
  1b   stt-1b-en_fr shape: 4 extra heads x 6, audio delay 0.5 s, silence prefix 0
  2b6  stt-2.6b-en shape:  no extra heads,   audio delay 2.5 s, silence prefix 1.0 s
"""
import copy
import math

from common import FIX, FRAME, SR, save_st, test_waveform, versions, write_json, write_wav_f32
import gen_lm
import gen_mimi
import numpy as np
import torch
from moshi.models import loaders
from moshi.models.lm import LMGen

OUT = FIX / "stt"
TEXT_CARD = 64
CARD = 64
N_Q = 32
FRAME_RATE = 12.5
MIMI_FILE = "mimi.safetensors"
MIMI_CONFIG_FILE = "mimi_config.json"
SPM_FILE = "tokenizer.model"
HEAD_GAIN = 8.0              # text_linear scaled: wide argmax margins

VARIANTS = {
    "1b": dict(num_heads=4, num_layers=2, context=12, extra_heads_num_heads=4,
               stt=dict(audio_delay_seconds=0.5, audio_silence_prefix_seconds=0.0), seed=5101,
               audio_seconds=1.6, pad_gain={3: 2.1, 0: 2.8}),
    "2b6": dict(num_heads=8, num_layers=3, context=6, extra_heads_num_heads=0,
                stt=dict(audio_delay_seconds=2.5, audio_silence_prefix_seconds=1.0), seed=5202,
                audio_seconds=4.0, pad_gain={3: 4.0, 0: 4.0}),
}


def lm_kwargs(v: dict) -> dict:
    kw = copy.deepcopy(loaders._lm_kwargs)
    kw.update(dim=64, text_card=TEXT_CARD, card=CARD, n_q=N_Q, dep_q=0, delays=[0] * (N_Q + 1),
              num_heads=v["num_heads"], num_layers=v["num_layers"], hidden_scale=3.0,
              context=v["context"], max_period=100000,
              extra_heads_num_heads=v["extra_heads_num_heads"], extra_heads_dim=6)
    return kw


def stream_plan(stt: dict, n_audio: int) -> dict:
    """The frames fed for one file (docs/stt.md "Stream"): whole frames of silence before (ceil(prefix
    x 12.5)), the audio zero-padded to whole frames, then ceil((delay + 1 s) x 12.5) frames of silence
    to flush. The word rules skip delay_tokens = floor(delay x 12.5) steps plus the prefix frames."""
    prefix = math.ceil(stt["audio_silence_prefix_seconds"] * FRAME_RATE)
    audio = -(-n_audio // FRAME)
    flush = math.ceil((stt["audio_delay_seconds"] + 1.0) * FRAME_RATE)
    delay = int(stt["audio_delay_seconds"] * FRAME_RATE)
    return dict(prefix=prefix, audio=audio, flush=flush, delay_tokens=delay, frames=prefix + audio + flush)


def stream_pcm(plan: dict, wav: np.ndarray) -> np.ndarray:
    pcm = np.zeros(plan["frames"] * FRAME, dtype=np.float32)
    s = plan["prefix"] * FRAME
    pcm[s:s + len(wav)] = wav
    return pcm


def word_events(tokens, delay_tokens, prefix_frames, prs=None, pad=3, epad=0):
    """Kyutai's streaming word rules (moshi-server ASR), restated: tokens before step `skip = delay +
    prefix` are ignored; a PAD or EPAD closes the pending word (Word with the last stop time as start);
    an EPAD sets the stop time (step - skip) / 12.5 and ends the last word (EndWord). A Step event with
    each extra head's class-0 probability comes first at every step when the model has extra heads."""
    skip = delay_tokens + prefix_frames
    ev, word, unended, last_stop = [], [], False, 0.0
    for i, tok in enumerate(tokens):
        step = i + 1
        if prs is not None:
            ev.append({"type": "Step", "step_idx": step, "prs": [float(p) for p in prs[i]]})
        if step < skip:
            continue
        if tok in (pad, epad):
            if word:
                ev.append({"type": "Word", "tokens": word, "start_time": last_stop})
                word, unended = [], True
        else:
            word = word + [int(tok)]
        if tok == epad:
            stop = (step - skip) / FRAME_RATE
            if unended:
                ev.append({"type": "EndWord", "stop_time": stop})
                unended = False
            last_stop = stop
    return ev


def perturb(model, pad_gain: dict) -> list:
    names = gen_lm.randomize_alphas(model, 4242)
    for name, p in model.named_parameters():
        if name == "text_linear.weight":
            p.data = p.data * HEAD_GAIN
            for row, gain in pad_gain.items():
                p.data[row] = p.data[row] * gain
        elif name.startswith("extra_heads."):
            p.data = p.data * 4.0   # peaked softmaxes, so a wrong head or class shows
    return names


def build_mimi(pcm: np.ndarray, seed: int):
    cfg = gen_mimi.tiny_mimi_config()
    cfg["quantizer"].update(n_q=N_Q)
    torch.manual_seed(seed)
    mimi = loaders.get_mimi(None, cfg, num_codebooks=N_Q)
    gen_mimi.perturb(mimi)
    latent = gen_mimi.streaming_latent(mimi, pcm)
    info = gen_mimi.calibrate_codebooks(mimi, latent)
    return cfg, mimi, info


def code_margins(mimi, pcm: np.ndarray) -> list:
    """Nearest vs second-nearest centroid gap per level on the streaming latent (the Rust codes are
    exact only while these stay well above float rounding)."""
    lat = gen_mimi.streaming_latent(mimi, pcm)
    q = mimi.quantizer
    out = []
    with torch.no_grad():
        r = q.rvq_first.input_proj(lat)[0].T
        _, gp = gen_mimi.gaps(r, q.rvq_first.vq.layers[0]._codebook.embedding)
        out.append(gp.min().item())
        r = q.rvq_rest.input_proj(lat)[0].T
        for layer in q.rvq_rest.vq.layers[: N_Q - 1]:
            emb = layer._codebook.embedding
            c, gp = gen_mimi.gaps(r, emb)
            out.append(gp.min().item())
            r = r - emb[c]
    return out


def trace(mimi, lm, pcm: np.ndarray, frames: int) -> dict:
    """The whole streaming path: per frame, Mimi streaming encode (32 codes) then
    `LMGen.step_with_extra_heads` (greedy). Records what `forward_text` got and returned."""
    inputs, tr_out, logits = [], [], []
    orig = lm.forward_text

    def fwd(seq, *a, **k):
        inputs.append(seq[0, :, 0].clone())
        out, lg = orig(seq, *a, **k)
        tr_out.append(out[0, 0].clone())
        logits.append(lg.reshape(-1).float().clone())
        return out, lg
    lm.forward_text = fwd
    gen = LMGen(lm, use_sampling=False, temp=0.0, temp_text=0.0, check=True)
    codes, text, heads = [], [], []
    try:
        with torch.no_grad(), mimi.streaming(1), gen.streaming(1):
            for t in range(frames):
                c = mimi.encode(torch.from_numpy(pcm[t * FRAME:(t + 1) * FRAME])[None, None])
                assert c.shape == (1, N_Q, 1)
                codes.append(c[0, :, 0])
                out = gen.step_with_extra_heads(c)
                assert out is not None, "all delays 0: a token every step"
                tok, eh = out
                assert tok.shape == (1, 1, 1)
                text.append(int(tok[0, 0, 0]))
                if eh:
                    heads.append(torch.stack([h[0, 0] for h in eh]))  # [H, 6]
    finally:
        lm.forward_text = orig
    res = {
        "codes": torch.stack(codes, dim=1).to(torch.int64),          # [32, S]
        "input_tokens": torch.stack(inputs).to(torch.int64),         # [S, 33]
        "transformer_out": torch.stack(tr_out),                      # [S, dim]
        "text_logits": torch.stack(logits),                          # [S, text_card]
        "text_tokens": torch.tensor(text, dtype=torch.int64),        # [S]
    }
    if heads:
        res["extra_heads"] = torch.stack(heads).float()              # [S, H, 6]
    top2 = res["text_logits"].topk(2, dim=-1).values
    res["text_margin_per_step"] = (top2[:, 0] - top2[:, 1]).float()
    return res


def check_alignment(res: dict, kw: dict):
    """Independent statement of LMGen's alignment with dep_q 0 and all delays 0: step 0 feeds the
    initial tokens (text_card, card x 32) and ignores frame 0's codes; step t >= 1 feeds the text token
    of step t-1 and the codes of frame t."""
    inp, codes, text = res["input_tokens"], res["codes"], res["text_tokens"]
    for t in range(inp.shape[0]):
        if t == 0:
            exp = [kw["text_card"]] + [kw["card"]] * N_Q
        else:
            exp = [int(text[t - 1])] + codes[:, t].tolist()
        assert inp[t].tolist() == exp, (t, inp[t].tolist(), exp)


CRAFTED_DELAY, CRAFTED_PREFIX = 2, 1   # the crafted stream's rules skip its first 3 steps


def crafted_tokens() -> list:
    """A token stream exercising every word rule: words of 1-3 tokens closed by PAD or EPAD, EPAD
    with no pending word, a word pending across PADs, tokens inside the skipped steps, a word left
    open at the end."""
    return [5, 0, 7, 3, 3, 9, 10, 0, 3, 3, 0, 11, 12, 13, 3, 3, 3, 0, 0, 14, 0, 15, 3, 16, 17,
            3, 0, 3, 18, 0, 0, 3, 3, 19, 20]


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    spm = gen_lm.train_spm(TEXT_CARD)
    summary = {}
    for name, v in VARIANTS.items():
        d = OUT / name
        d.mkdir(parents=True, exist_ok=True)
        wav = test_waveform(int(v["audio_seconds"] * SR) - 440, v["seed"] + 1)
        plan = stream_plan(v["stt"], len(wav))
        pcm = stream_pcm(plan, wav)
        mcfg, mimi, cbinfo = build_mimi(pcm, v["seed"])
        kw = lm_kwargs(v)
        torch.manual_seed(v["seed"])
        lm = loaders.get_moshi_lm(None, lm_kwargs=copy.deepcopy(kw), dtype=torch.float32)
        perturbed = perturb(lm, v["pad_gain"])
        assert lm.dep_q == 0 and lm.depformer is None and len(lm.extra_heads) == v["extra_heads_num_heads"]
        sd = {k: t.detach().clone().contiguous() for k, t in lm.state_dict().items()}
        legacy = gen_lm.to_legacy(sd, lm)
        save_st(d / "model.safetensors", legacy, {"format": "kyutai-lm-legacy", "seed": str(v["seed"])})
        save_st(d / MIMI_FILE, gen_mimi.to_kyutai_layout(mimi.state_dict()), {"format": "kyutai-mimi"})
        write_json(d / MIMI_CONFIG_FILE, mcfg)
        (d / SPM_FILE).write_bytes(spm)
        cfg = dict(kw)
        cfg.update(moshi_name="model.safetensors", mimi_name=MIMI_FILE, tokenizer_name=SPM_FILE,
                   mimi_config_name=MIMI_CONFIG_FILE, model_type="stt", stt_config=v["stt"],
                   lm_gen_config={"temp": 0.0, "temp_text": 0.0, "top_k": 250, "top_k_text": 50})
        write_json(d / "config.json", cfg)
        write_wav_f32(d / "input.wav", wav)

        # Everything reloaded through CheckpointInfo (the bundle path Kyutai's scripts use).
        info = loaders.CheckpointInfo.from_hf_repo(
            "unused/offline", moshi_weights=d / "model.safetensors", mimi_weights=d / MIMI_FILE,
            tokenizer=d / SPM_FILE, config_path=d / "config.json", mimi_config_path=d / MIMI_CONFIG_FILE)
        assert info.model_type == "stt" and info.stt_config == v["stt"]
        lm2 = info.get_moshi(device="cpu", dtype=torch.float32)
        for k, t in lm.state_dict().items():
            assert torch.equal(t, lm2.state_dict()[k]), k
        mimi2 = info.get_mimi(device="cpu")
        assert mimi2.num_codebooks == N_Q, mimi2.num_codebooks

        res = trace(mimi2, lm2, pcm, plan["frames"])
        res2 = trace(mimi2, lm2, pcm, plan["frames"])
        for k in res:
            assert torch.equal(res[k], res2[k]), f"non-deterministic {k}"
        check_alignment(res, kw)
        toks = res["text_tokens"].tolist()
        prs = None
        if "extra_heads" in res:
            prs = res["extra_heads"][:, :, 0].tolist()   # class 0 of each head, as the server sends
        events = word_events(toks, plan["delay_tokens"], plan["prefix"], prs)
        crafted = crafted_tokens()
        crafted_events = word_events(crafted, CRAFTED_DELAY, CRAFTED_PREFIX)
        margins = code_margins(mimi2, pcm)
        stats = {
            "plan": plan,
            "text_margin_min": res["text_margin_per_step"].min().item(),
            "code_margin_min": min(margins),
            "codebook_calibration_min_gap": min(cbinfo["min_gap"]),
            "pad_steps": toks.count(3), "epad_steps": toks.count(0),
            "words": sum(e["type"] == "Word" for e in events),
            "perturbed": perturbed,
        }
        save_st(d / "trace.safetensors", res, {"config": kw, "plan": plan, **versions(), "stats": stats})
        write_json(d / "events.json", {"plan": plan, "text_tokens": toks, "events": events,
                                       "crafted_tokens": crafted, "crafted_delay_tokens": CRAFTED_DELAY,
                                       "crafted_prefix": CRAFTED_PREFIX, "crafted_events": crafted_events})
        write_json(d / "stats.json", stats)
        summary[name] = {k: s for k, s in stats.items() if k != "perturbed"}
        print(name, summary[name], flush=True)
    return summary


if __name__ == "__main__":
    main()
