"""Tiny Mimi fixture: weights (Kyutai + Hugging Face layouts), config, streaming/batch traces."""
import copy

from common import (FIX, FRAME, SR, save_st, test_waveform, versions, write_json, write_wav_f32)
import numpy as np
import torch
from moshi.models import loaders

OUT = FIX / "mimi"
MIMI_SEED = 1234          # torch seed for module construction + perturbations
CODEBOOK_SEED = 777       # torch seed base for codebook candidate draws
WAVE_SEED = 2024          # numpy seed for the noise in the test waveform
N_FRAMES = 32
N_SAMPLES = N_FRAMES * FRAME - 440   # not a multiple of 1920: exercises right padding
N_CODEBOOKS = 8
CB_CANDIDATES = 256
CB_CLIMB_ITERS = 400


def tiny_mimi_config() -> dict:
    cfg = copy.deepcopy(loaders._mimi_config)
    cfg["seanet"].update(dimension=32, n_filters=8)
    cfg["quantizer"].update(dimension=16, n_q=10, bins=64, input_dimension=32, output_dimension=32)
    cfg["transformer"].update(d_model=32, num_heads=2, num_layers=2, dim_feedforward=64, context=8,
                              input_dimension=32, output_dimensions=[32])
    return cfg


def to_kyutai_layout(sd: dict) -> dict:
    """moshi 0.2.13 state_dict (in_projs.0 / out_projs.0) -> released-file names (legacy fused names)."""
    out = {}
    for k, v in sd.items():
        k2 = k.replace("self_attn.in_projs.0.weight", "self_attn.in_proj_weight")
        k2 = k2.replace("self_attn.out_projs.0.weight", "self_attn.out_proj.weight")
        out[k2] = v.detach().clone().contiguous()
    return out


HF_RENAMES = [
    ("conv.conv.conv", "conv"), ("convtr.convtr.convtr", "conv"), ("conv.conv", "conv"), ("convtr.convtr", "conv"),
    ("quantizer.rvq_first.vq", "quantizer.semantic_residual_vector_quantizer"),
    ("quantizer.rvq_first", "quantizer.semantic_residual_vector_quantizer"),
    ("quantizer.rvq_rest.vq", "quantizer.acoustic_residual_vector_quantizer"),
    ("quantizer.rvq_rest", "quantizer.acoustic_residual_vector_quantizer"),
    ("_codebook", "codebook"), ("_initialized", "initialized"), ("embedding_sum", "embed_sum"),
    ("encoder.model", "encoder.layers"), ("decoder.model", "decoder.layers"),
    ("encoder_transformer.transformer", "encoder_transformer"),
    ("decoder_transformer.transformer", "decoder_transformer"),
    ("linear1", "mlp.fc1"), ("linear2", "mlp.fc2"), ("self_attn.out_proj", "self_attn.o_proj"),
    ("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm"),
    ("layer_scale_1", "self_attn_layer_scale"), ("layer_scale_2", "mlp_layer_scale"),
]


def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Interleaved-pair RoPE rows -> rotate-half rows, per head (architecture §1.10)."""
    d1, d2 = w.shape
    return w.view(n_heads, d1 // n_heads // 2, 2, d2).transpose(1, 2).reshape(d1, d2).contiguous()


def to_hf_layout(kyutai: dict, n_heads: int) -> dict:
    out = {}
    for k, v in kyutai.items():
        nk = k
        for a, b in HF_RENAMES:
            if a in nk:
                nk = nk.replace(a, b)
        if "in_proj_weight" in nk:
            d = v.shape[0] // 3
            out[nk.replace("in_proj_weight", "q_proj.weight")] = hf_permute(v[:d], n_heads)
            out[nk.replace("in_proj_weight", "k_proj.weight")] = hf_permute(v[d:2 * d], n_heads)
            out[nk.replace("in_proj_weight", "v_proj.weight")] = v[2 * d:].clone().contiguous()
        else:
            out[nk] = v.clone().contiguous()
    return out


def _rope_interleaved(x, pos, max_period):
    # x [H, D]; pairs (2i, 2i+1)
    H, D = x.shape
    f = torch.exp(torch.arange(D // 2, dtype=torch.float64) * (-np.log(max_period) * 2 / D))
    c, s_ = torch.cos(pos * f), torch.sin(pos * f)
    xr, xi = x[:, 0::2], x[:, 1::2]
    out = torch.empty_like(x)
    out[:, 0::2] = xr * c - xi * s_
    out[:, 1::2] = xr * s_ + xi * c
    return out


def _rope_half(x, pos, max_period):
    # x [H, D]; rotate-half (HF): pairs (i, i + D/2)
    H, D = x.shape
    f = torch.exp(torch.arange(D // 2, dtype=torch.float64) * (-np.log(max_period) * 2 / D))
    c, s_ = torch.cos(pos * f), torch.sin(pos * f)
    a, b = x[:, : D // 2], x[:, D // 2:]
    return torch.cat([a * c - b * s_, a * s_ + b * c], dim=-1)


def check_hf_rope_equivalence(kyutai: dict, hf: dict, cfg: dict):
    """Attention scores q.k with interleaved RoPE on the Kyutai weights equal the scores with rotate-half
    RoPE on the permuted HF weights (float64), so HF-layout weights give identical codes."""
    t = cfg["transformer"]
    H, D = t["num_heads"], t["d_model"]
    g = torch.Generator().manual_seed(5)
    for side in ["encoder", "decoder"]:
        for layer in range(t["num_layers"]):
            w = kyutai[f"{side}_transformer.transformer.layers.{layer}.self_attn.in_proj_weight"].double()
            p = f"{side}_transformer.layers.{layer}.self_attn."
            wq, wk = hf[p + "q_proj.weight"].double(), hf[p + "k_proj.weight"].double()
            assert torch.equal(hf[p + "v_proj.weight"], kyutai[f"{side}_transformer.transformer.layers.{layer}.self_attn.in_proj_weight"][2 * D:])
            for _ in range(4):
                x1, x2 = torch.randn(D, generator=g, dtype=torch.float64), torch.randn(D, generator=g, dtype=torch.float64)
                p1, p2 = 13.0, 7.0
                qa = _rope_interleaved((w[:D] @ x1).view(H, -1), p1, t["max_period"])
                ka = _rope_interleaved((w[D:2 * D] @ x2).view(H, -1), p2, t["max_period"])
                qb = _rope_half((wq @ x1).view(H, -1), p1, t["max_period"])
                kb = _rope_half((wk @ x2).view(H, -1), p2, t["max_period"])
                sa, sb = (qa * ka).sum(-1), (qb * kb).sum(-1)
                assert torch.allclose(sa, sb, atol=1e-10), (sa, sb)


def hf_config(cfg: dict) -> dict:
    """transformers MimiConfig-style dict for the tiny model (field names from configuration_mimi.py)."""
    s, q, t = cfg["seanet"], cfg["quantizer"], cfg["transformer"]
    return {
        "model_type": "mimi", "sampling_rate": cfg["sample_rate"], "frame_rate": cfg["frame_rate"],
        "audio_channels": cfg["channels"], "hidden_size": s["dimension"], "num_filters": s["n_filters"],
        "num_residual_layers": s["n_residual_layers"], "upsampling_ratios": s["ratios"],
        "kernel_size": s["kernel_size"], "last_kernel_size": s["last_kernel_size"],
        "residual_kernel_size": s["residual_kernel_size"], "dilation_growth_rate": s["dilation_base"],
        "use_causal_conv": True, "pad_mode": "constant", "compress": s["compress"], "trim_right_ratio": 1.0,
        "codebook_size": q["bins"], "codebook_dim": q["dimension"], "num_quantizers": q["n_q"],
        "num_semantic_quantizers": 1, "use_conv_shortcut": False, "vector_quantization_hidden_dimension": q["dimension"],
        "upsample_groups": s["dimension"], "num_hidden_layers": t["num_layers"],
        "intermediate_size": t["dim_feedforward"], "num_attention_heads": t["num_heads"],
        "num_key_value_heads": t["num_heads"], "head_dim": t["d_model"] // t["num_heads"], "hidden_act": "gelu",
        "max_position_embeddings": 8000, "initializer_range": 0.02, "norm_eps": 1e-5, "use_cache": False,
        "rope_theta": float(t["max_period"]), "sliding_window": t["context"], "attention_dropout": 0.0,
        "layer_scale_initial_scale": t["layer_scale"],
    }


SEANET_GAIN = 1.7  # default conv init shrinks the signal ~3x in variance per conv; compensate


def perturb(model) -> list:
    """Randomise parameters that start constant (LayerNorm, LayerScale); scale SEANet conv weights."""
    names = []
    for name, p in model.named_parameters():
        if (name.startswith("encoder.model.") or name.startswith("decoder.model.")) and name.endswith("weight"):
            p.data = p.data * SEANET_GAIN
    g = torch.Generator().manual_seed(MIMI_SEED + 1)
    for name, p in model.named_parameters():
        if ".norm1." in name or ".norm2." in name:
            if name.endswith("weight"):
                p.data = torch.empty_like(p).uniform_(0.5, 1.5, generator=g)
            else:
                p.data = 0.1 * torch.randn(p.shape, generator=g)
            names.append(name)
        elif "layer_scale" in name:
            # released init 0.01; trained values are larger. U(0.05, 0.3) keeps the transformer visible.
            p.data = torch.empty_like(p).uniform_(0.05, 0.3, generator=g)
            names.append(name)
    return names


def set_codebook(cb, centroids: torch.Tensor, usage: torch.Tensor):
    cb.embedding_sum.data.copy_(centroids * usage[:, None])
    cb.cluster_usage.data.copy_(usage)
    cb._initialized.data.fill_(1.0)
    cb.register_buffer("_embedding", None, persistent=False)


def gaps(x: torch.Tensor, emb: torch.Tensor):
    """x [N, D] -> (codes, absolute gap d2-d1 between the two nearest centroid distances)."""
    d = torch.cdist(x[None].double(), emb[None].double())[0]
    s, idx = d.sort(dim=-1)
    return idx[:, 0], (s[:, 1] - s[:, 0])


def hill_climb(r, cent, scale, g):
    """Greedy: nudge the nearest centroid of the worst-margin point towards it (accept only if the
    global minimum gap grows)."""
    cent = cent.clone()
    cur = gaps(r, cent)[1].min().item()
    for _ in range(CB_CLIMB_ITERS):
        codes, gp = gaps(r, cent)
        w = int(gp.argmin())
        trial = cent.clone()
        c = int(codes[w])
        step = 0.05 + 0.1 * torch.rand((), generator=g).item()
        trial[c] = trial[c] + step * (r[w] - trial[c])
        new = gaps(r, trial)[1].min().item()
        if new > cur:
            cent, cur = trial, new
    return cent


def streaming_latent(model, wav):
    T = -(-len(wav) // FRAME)
    padded = np.zeros(T * FRAME, dtype=np.float32)
    padded[: len(wav)] = wav
    lat = []
    h = model.downsample.register_forward_hook(lambda _m, _i, o: lat.append(o.detach().clone()))
    with torch.no_grad(), model.streaming(1):
        for t in range(T):
            model.encode(torch.from_numpy(padded[t * FRAME:(t + 1) * FRAME])[None, None])
    h.remove()
    return torch.cat(lat, dim=-1)


def calibrate_codebooks(model, latent: torch.Tensor) -> dict:
    """latent [1, C, T]. Fill every codebook with random centroids matched to the residual statistics
    each level sees; keep the best of CB_CANDIDATES draws (largest minimum gap)."""
    q = model.quantizer
    info = {"min_gap": [], "rel_gap": [], "distinct_codes": []}
    bins = q.rvq_first.vq.layers[0]._codebook.embedding_sum.shape[0]
    for rvq_i, rvq in enumerate([q.rvq_first, q.rvq_rest]):
        with torch.no_grad():
            r = rvq.input_proj(latent)[0].T.contiguous()  # [T, D]
        for li, layer in enumerate(rvq.vq.layers):
            cb = layer._codebook
            mu, sd = r.mean(0), r.std(0) + 1e-3
            best = None
            for c in range(CB_CANDIDATES):
                g = torch.Generator().manual_seed(CODEBOOK_SEED + 1000 * rvq_i + 100 * li + c)
                cent = mu + sd * torch.randn(bins, r.shape[1], generator=g)
                codes, gp = gaps(r, cent)
                score = gp.min().item() / sd.norm().item()
                if best is None or score > best[0]:
                    usage = torch.empty(bins).uniform_(0.5, 1.5, generator=g)
                    best = (score, cent, usage, gp, codes)
            score, cent, usage, gp, codes = best
            cent = hill_climb(r, cent, sd.norm().item(), torch.Generator().manual_seed(CODEBOOK_SEED + 7 * li + 3 * rvq_i))
            score = gaps(r, cent)[1].min().item() / sd.norm().item()
            set_codebook(cb, cent, usage)
            with torch.no_grad():
                emb = cb.embedding
                codes, gp = gaps(r, emb)
                r = r - emb[codes]
            info["min_gap"].append(gp.min().item())
            info["rel_gap"].append(score)
            info["distinct_codes"].append(int(codes.unique().numel()))
    return info


def build():
    cfg = tiny_mimi_config()
    torch.manual_seed(MIMI_SEED)
    model = loaders.get_mimi(None, cfg, num_codebooks=N_CODEBOOKS)
    perturbed = perturb(model)
    wav = test_waveform(N_SAMPLES, WAVE_SEED)
    x = torch.from_numpy(wav)[None, None]
    # Calibrate on the *streaming* latent (batch differs once the Mimi KV ring wraps, see README).
    latent = streaming_latent(model, wav)
    cbinfo = calibrate_codebooks(model, latent)
    return cfg, model, perturbed, wav, cbinfo


class Recorder:
    def __init__(self):
        self.data = {}
        self.handles = []

    def hook(self, module, name, idx=None):
        def fn(_m, _inp, out):
            o = out[0] if isinstance(out, (tuple, list)) else out
            self.data.setdefault(name, []).append(o.detach().clone())
        self.handles.append(module.register_forward_hook(fn))

    def cat(self, name):
        return torch.cat(self.data[name], dim=-1)[0]

    def remove(self):
        for h in self.handles:
            h.remove()


def trace(model, wav: np.ndarray) -> dict:
    T = -(-len(wav) // FRAME)
    padded = np.zeros(T * FRAME, dtype=np.float32)
    padded[: len(wav)] = wav
    out = {}
    rec = Recorder()
    rec.hook(model.encoder, "enc_seanet")
    rec.hook(model.encoder_transformer, "enc_transformer")
    rec.hook(model.downsample, "latent")
    rec.hook(model.upsample, "dec_upsample")
    rec.hook(model.decoder_transformer, "dec_transformer")
    orig_decode = model.quantizer.decode
    dec_lat = []

    def qdecode(codes):
        y = orig_decode(codes)
        dec_lat.append(y.detach().clone())
        return y
    model.quantizer.decode = qdecode
    codes = []
    with torch.no_grad():
        with model.streaming(1):
            for t in range(T):
                chunk = torch.from_numpy(padded[t * FRAME:(t + 1) * FRAME])[None, None]
                c = model.encode(chunk)
                assert c.shape == (1, N_CODEBOOKS, 1)
                codes.append(c)
        codes = torch.cat(codes, dim=-1)[0]  # [K, T]
        pcm = []
        with model.streaming(1):  # fresh decoder state
            for t in range(T):
                y = model.decode(codes[None, :, t:t + 1])
                assert y.shape == (1, 1, FRAME)
                pcm.append(y[0, 0])
        pcm = torch.cat(pcm)
    model.quantizer.decode = orig_decode
    rec.remove()
    out["codes"] = codes.to(torch.int64)
    out["pcm"] = pcm
    for name in ["enc_seanet", "enc_transformer", "latent", "dec_upsample", "dec_transformer"]:
        out[name] = rec.cat(name)
    out["dec_latent"] = torch.cat(dec_lat, dim=-1)[0]
    # Margins on the streaming path itself: nearest vs second-nearest centroid per level and frame.
    q = model.quantizer
    lat = out["latent"][None]
    margins = []
    with torch.no_grad():
        r = q.rvq_first.input_proj(lat)[0].T
        _, gp = gaps(r, q.rvq_first.vq.layers[0]._codebook.embedding)
        margins.append(gp.min().item())
        r = q.rvq_rest.input_proj(lat)[0].T
        for layer in q.rvq_rest.vq.layers[: N_CODEBOOKS - 1]:
            emb = layer._codebook.embedding
            c, gp = gaps(r, emb)
            margins.append(gp.min().item())
            r = r - emb[c]
    out["code_margin_per_level"] = torch.tensor(margins, dtype=torch.float32)
    # Batch (non-streaming) paths.
    with torch.no_grad():
        x = torch.from_numpy(wav)[None, None]
        out["codes_batch"] = model.encode(x)[0].to(torch.int64)
        out["pcm_batch"] = model.decode(out["codes"][None])[0, 0]  # batch decode of the streaming codes
        out["latent_batch"] = model._encode_to_unquantized_latent(x)[0]
    return out


def main():
    cfg, model, perturbed, wav, cbinfo = build()
    kyutai = to_kyutai_layout(model.state_dict())
    OUT.mkdir(parents=True, exist_ok=True)
    meta = {"format": "kyutai-mimi", "config": cfg, "perturbed": perturbed, "seed": MIMI_SEED,
            **versions()}
    save_st(OUT / "mimi.safetensors", kyutai, {"format": "kyutai-mimi", "seed": str(MIMI_SEED)})
    write_json(OUT / "mimi_config.json", cfg)
    n_heads = cfg["transformer"]["num_heads"]
    hf = to_hf_layout(kyutai, n_heads)
    save_st(OUT / "mimi_hf.safetensors", hf, {"format": "hf-transformers-mimi"})
    write_json(OUT / "mimi_hf_config.json", hf_config(cfg))

    # Reload through the official loader (released-file code path) and check equality.
    m2 = loaders.get_mimi(str(OUT / "mimi.safetensors"), cfg, num_codebooks=N_CODEBOOKS)
    sd1, sd2 = model.state_dict(), m2.state_dict()
    assert sd1.keys() == sd2.keys()
    for k in sd1:
        assert torch.equal(sd1[k], sd2[k]), k
    tr = trace(m2, wav)
    tr2 = trace(m2, wav)
    for k in tr:
        assert torch.equal(tr[k], tr2[k]), f"non-deterministic {k}"
    check_hf_rope_equivalence(kyutai, hf, cfg)
    stats = {
        "codebook_calibration": cbinfo,
        "stream_vs_batch_pcm_maxabs": (tr["pcm"] - tr["pcm_batch"]).abs().max().item(),
        "stream_vs_batch_latent_maxabs": (tr["latent"] - tr["latent_batch"]).abs().max().item(),
        "stream_vs_batch_codes_equal_frames": int((tr["codes"] == tr["codes_batch"]).all(0).sum()),
        "code_margin_min": tr["code_margin_per_level"].min().item(),
        "distinct_codes_per_level": [int(tr["codes"][i].unique().numel()) for i in range(N_CODEBOOKS)],
        "pcm_rms": tr["pcm"].pow(2).mean().sqrt().item(),
        "latent_std": tr["latent"].std().item(),
    }
    meta["stats"] = stats
    save_st(OUT / "trace.safetensors", tr, meta)
    write_wav_f32(OUT / "input.wav", wav)
    write_json(OUT / "stats.json", stats)
    print(stats)
    return cfg


if __name__ == "__main__":
    main()
