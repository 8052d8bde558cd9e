"""MLX / gguf-py half of the real-tool fixtures (`fixtures/tools/`); runs in the MLX venv (no torch).

`check SEED`: Kyutai's `moshi_mlx` 0.3.0 modules, loaded with the f32 weights of a seed through
`Lm.load_pytorch_weights` and driven with PyTorch `LMGen`'s step rules (below), must reproduce the moshi
(PyTorch) f32 trace of that seed. That validates the driver before it is used as an oracle.

`pick SEED...`: the seed whose MLX q4 and q8 greedy runs have the largest smallest top-1/top-2 margin.

`write SEED`: MLX q4 (group 32) and q8 (group 64) files made with Kyutai's own call
(`model.set_dtype(mx.bfloat16); nn.quantize(model, bits=b, group_size=g)`; `model.save_weights`), the q4 file
again with its scales/biases stored as f16 and f32 (written by `mx.save_safetensors`), each with greedy and
teacher-forced traces computed by moshi_mlx with MLX's quantized kernels on float32 activations; and a
Q4_0 GGUF written by gguf-py (candle names; rank-2 tensors with a multiple-of-32 inner dimension as Q4_0,
the rest F32) with gguf-py's own dequantization of the file (traced by gen_tools_torch.py afterwards).

PyTorch `LMGen` step rules, as used here (moshi_mlx's own `LmGen` differs in two ways: it feeds the user
code passed at call s at step s+1+delay instead of s+delay, and its temporal attention keeps context + 1
positions instead of context; the driver sets the MLX attention context to context - 1):
step t feeds text x(t-1), Moshi stream k a(t-1)[k] once t-1 >= delay[k], user stream k the code of call
t - delay[k] once that is >= 1, the initial token otherwise; it samples x(t) and a(t)[k]; from t >= max delay
it returns frame p = t - max delay: x(p) and a(p + delay[k])[k]."""
import json
import sys
from pathlib import Path

import numpy as np
import mlx.core as mx
import mlx.nn as nn
import gguf
from gguf import GGMLQuantizationType as GQ
from safetensors.numpy import load_file, save_file
from moshi_mlx.models import lm as mlm

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "fixtures"
WORK = REPO / "target" / "oracle-work"
TOOLS = FIX / "tools"
FORMATS = {"mlx_q4": (4, 32), "mlx_q8": (8, 64)}
MIMI_FILE = "tokenizer-e351c8d8-checkpoint125.safetensors"
SPM_FILE = "tokenizer_spm_32k_3.model"


def kwargs(seed):
    return json.loads((WORK / f"seed{seed}" / "config.json").read_text())


def mlx_config(kw, for_trace):
    cfg = mlm.LmConfig.from_config_dict(kw)
    # from_config_dict hard-codes the released feed-forward ratio (4 * dim); the tiny model's is hidden_scale.
    cfg.transformer.dim_feedforward = int(kw["hidden_scale"] * kw["dim"])
    if for_trace:
        cfg.transformer.context = kw["context"] - 1     # PyTorch's window (see module doc)
    return cfg


def f32_model(seed, for_trace=True):
    kw = kwargs(seed)
    cfg = mlx_config(kw, for_trace)
    model = mlm.Lm(cfg)
    model.load_pytorch_weights(str(WORK / f"seed{seed}" / "legacy.safetensors"), cfg, strict=True)
    return kw, cfg, model


def quantized_for_trace(kw, path, bits, group):
    """A model whose parameters are exactly the file's; every float parameter cast to f32 (exact)."""
    cfg = mlx_config(kw, True)
    model = mlm.Lm(cfg)
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, bits=bits, group_size=group)
    model.load_weights(str(path), strict=True)
    model.set_dtype(mx.float32)
    return model


def inputs_and_codes():
    codes = load_file(str(FIX / "lm" / "CODES.safetensors"))["codes"]          # [8, S]
    forced = load_file(str(FIX / "lm" / "trace_forced.safetensors"))
    return codes, forced["forced_text"], forced["forced_audio"]                # [S], [8, S]


def run(model, kw, codes, forced_text=None, forced_audio=None):
    """One generator run with PyTorch's step rules; returns the trace dict (numpy)."""
    S = codes.shape[1]
    dq, tc, ac = kw["dep_q"], kw["text_card"], kw["card"]
    delays = kw["delays"]
    md = max(delays)
    for c in model.transformer_cache:
        c.reset()
    xs_hist, a_hist = [], []
    rec = {k: [] for k in ("input_tokens", "transformer_out", "text_logits", "depformer_logits",
                           "out_text", "out_audio", "step_has_output", "text_margin_per_step",
                           "audio_margin_per_step")}
    for t in range(S):
        col = [tc if t == 0 else xs_hist[t - 1]]
        for k in range(dq):
            d = delays[1 + k]
            col.append(a_hist[t - 1][k] if t - 1 >= d else ac)
        for k in range(dq):
            d = delays[1 + dq + k]
            col.append(int(codes[k, t - d]) if t - d >= 1 else ac)
        x = model.text_emb(mx.array([[col[0]]]))
        for i, emb in enumerate(model.audio_embs):
            x = x + emb(mx.array([[col[1 + i]]]))
        out = model.out_norm(model.transformer(x, cache=model.transformer_cache))
        tl = model.text_linear(out)
        tl_np = np.array(tl.astype(mx.float32)).reshape(-1)
        top = np.sort(tl_np)[::-1]
        text = int(np.argmax(tl_np)) if forced_text is None else int(forced_text[t])
        for c in model.depformer_cache:
            c.reset()
        last, audio, dls, margins = text, [], [], []
        for k, sl in enumerate(model.depformer.slices):
            h = sl.linear_in(out) + sl.emb(mx.array([[last]]))
            h = sl.transformer(h, cache=model.depformer_cache)
            lg = np.array(sl.linear_out(h).astype(mx.float32)).reshape(-1)
            s2 = np.sort(lg)[::-1]
            margins.append(float(s2[0] - s2[1]))
            dls.append(lg)
            last = int(np.argmax(lg)) if forced_audio is None else int(forced_audio[k, t])
            audio.append(last)
        xs_hist.append(text)
        a_hist.append(audio)
        rec["input_tokens"].append(col)
        rec["transformer_out"].append(np.array(out.astype(mx.float32)).reshape(-1))
        rec["text_logits"].append(tl_np)
        rec["depformer_logits"].append(np.stack(dls))
        rec["text_margin_per_step"].append(float(top[0] - top[1]))
        rec["audio_margin_per_step"].append(margins)
        if t >= md:
            p = t - md
            rec["step_has_output"].append(1)
            rec["out_text"].append(xs_hist[p])
            rec["out_audio"].append([a_hist[p + delays[1 + k]][k] for k in range(dq)])
        else:
            rec["step_has_output"].append(0)
    f32 = lambda v: np.ascontiguousarray(np.array(v, dtype=np.float32))  # noqa: E731
    i64 = lambda v: np.ascontiguousarray(np.array(v, dtype=np.int64))    # noqa: E731
    return {
        "input_tokens": i64(rec["input_tokens"]),
        "transformer_out": f32(rec["transformer_out"]),
        "text_logits": f32(rec["text_logits"]),
        "depformer_logits": f32(rec["depformer_logits"]),
        "out_text": i64(rec["out_text"]),
        "out_audio": i64(rec["out_audio"]).T.copy(),
        "step_has_output": i64(rec["step_has_output"]),
        "text_margin_per_step": f32(rec["text_margin_per_step"]),
        "audio_margin_per_step": f32(rec["audio_margin_per_step"]),
    }


def traces(model, kw):
    codes, ft, fa = inputs_and_codes()
    g = run(model, kw, codes)
    g2 = run(model, kw, codes)
    assert all(np.array_equal(g[k], g2[k]) for k in g), "non-deterministic"
    f = run(model, kw, codes, ft, fa)
    f["forced_text"], f["forced_audio"] = ft, fa
    return g, f


def max_diff(a, b):
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def check(seed):
    """The driver on the f32 weights against the PyTorch trace of the same seed."""
    kw, _, model = f32_model(seed)
    g, f = traces(model, kw)
    worst = 0.0
    for name, ours in (("trace.safetensors", g), ("trace_forced.safetensors", f)):
        ref = load_file(str(WORK / f"seed{seed}" / name))
        for k in ("input_tokens", "out_text", "out_audio", "step_has_output"):
            assert np.array_equal(ours[k], ref[k]), (name, k)
        for k in ("transformer_out", "text_logits", "depformer_logits"):
            worst = max(worst, max_diff(ours[k], ref[k]))
    print(f"seed {seed}: moshi_mlx f32 vs moshi f32: tokens equal, max |diff| {worst:.3g}")
    assert worst < 1e-4
    return worst


def quantize_and_save(seed, bits, group, path):
    kw, _, model = f32_model(seed, for_trace=False)
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, bits=bits, group_size=group)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save_weights(str(path))
    return kw


def pick(seeds):
    best = None
    for seed in seeds:
        per = {}
        for name, (bits, group) in FORMATS.items():
            path = WORK / f"seed{seed}" / f"{name}.safetensors"
            kw = quantize_and_save(seed, bits, group, path)
            g, _ = traces(quantized_for_trace(kw, path, bits, group), kw)
            per[name] = min(float(g["text_margin_per_step"].min()), float(g["audio_margin_per_step"].min()))
        score = min(per.values())
        print(f"seed {seed}: {per}", flush=True)
        if best is None or score > best[0]:
            best = (score, seed)
    print("best", best[1])
    return best[1]


def link_bundle(d: Path, model_file: str, seed: int):
    d.mkdir(parents=True, exist_ok=True)
    cfg = kwargs(seed)
    cfg["moshi_name"] = model_file
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for name, target in ((MIMI_FILE, "../../mimi/mimi.safetensors"), ("mimi_config.json", "../../mimi/mimi_config.json"),
                         (SPM_FILE, "../../lm/" + SPM_FILE)):
        p = d / name
        if p.is_symlink() or p.exists():
            p.unlink()
        p.symlink_to(target)


def save_trace(d: Path, g, f, meta):
    meta = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in meta.items()}
    save_file(g, str(d / "trace.safetensors"), meta)
    save_file(f, str(d / "trace_forced.safetensors"), meta)


def versions():
    import importlib.metadata as md
    return {p: md.version(p) for p in ("mlx", "moshi_mlx", "gguf", "numpy")}


def write(seed):
    stats = {"seed": seed, "versions": versions(), "driver_check_max_abs_vs_moshi_f32": check(seed)}
    ref_f32 = load_file(str(WORK / f"seed{seed}" / "trace_forced.safetensors"))
    for name, (bits, group) in FORMATS.items():
        d = TOOLS / name
        fname = f"model.q{bits}.safetensors"
        link_bundle(d, fname, seed)
        kw = quantize_and_save(seed, bits, group, d / fname)
        g, f = traces(quantized_for_trace(kw, d / fname, bits, group), kw)
        save_trace(d, g, f, {"source": f"moshi_mlx {versions()['moshi_mlx']} with MLX quantized kernels, "
                             "f32 activations, PyTorch LMGen step rules", "bits": bits, "group_size": group})
        stats[name] = {
            "text_margin_min": float(g["text_margin_per_step"].min()),
            "audio_margin_min": float(g["audio_margin_per_step"].min()),
            "forced_text_logits_maxabs_vs_f32": max_diff(f["text_logits"], ref_f32["text_logits"]),
            "forced_depformer_logits_maxabs_vs_f32": max_diff(f["depformer_logits"], ref_f32["depformer_logits"]),
        }
        print(name, stats[name], flush=True)
    # The q4 file with f16 / f32 scales and biases (what MLX writes for a model in that dtype).
    q4 = mx.load(str(TOOLS / "mlx_q4" / "model.q4.safetensors"))
    for dt, tag in ((mx.float16, "f16"), (mx.float32, "f32")):
        out = {}
        for k, v in q4.items():
            if k.endswith((".scales", ".biases")):
                c = v.astype(dt)
                assert mx.array_equal(c.astype(mx.float32), v.astype(mx.float32)).item(), (k, tag)
                out[k] = c
            else:
                out[k] = v
        mx.save_safetensors(str(TOOLS / "mlx_q4" / f"model.q4.scales_{tag}.safetensors"), out,
                            metadata={"format": "mlx"})
    link_bundle(TOOLS / "candle_q8_0", "model.q8.gguf", seed)   # the file itself: benches/candle-gguf
    # gguf-py Q4_0 (candle names), and gguf-py's dequantization of the file it wrote.
    d = TOOLS / "ggufpy_q4_0"
    link_bundle(d, "model.q4_0.gguf", seed)
    src = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(WORK / f"seed{seed}" / "candle_bf16.safetensors")).items()}
    w = gguf.GGUFWriter(str(d / "model.q4_0.gguf"), arch="moshi")
    for k in sorted(src):
        v = src[k]
        if v.ndim == 2 and v.shape[1] % 32 == 0:
            w.add_tensor(k, gguf.quants.quantize(v, GQ.Q4_0), raw_dtype=GQ.Q4_0)
        else:
            w.add_tensor(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = gguf.GGUFReader(str(d / "model.q4_0.gguf"))
    deq = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        deq[t.name] = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape), dtype=np.float32)
    assert set(deq) == set(src)
    save_file(deq, str(WORK / "ggufpy_q4_0.dequant.safetensors"))
    (TOOLS / "stats_mlx.json").write_text(json.dumps(stats, indent=2) + "\n")


if __name__ == "__main__":
    cmd, args = sys.argv[1], [int(s) for s in sys.argv[2:]]
    if cmd == "check":
        for s in args:
            check(s)
    elif cmd == "pick":
        pick(args)
    elif cmd == "write":
        write(args[0])
    else:
        raise SystemExit(__doc__)
