"""The tiny LM of fixtures/lm exported as candle bf16 safetensors, GGUF Q8_0 (candle names), MLX bf16,
MLX q4 and MLX q8; each directory is a bundle with its own reference trace computed by moshi 0.2.13 in
float32 from the *dequantized* weights of that file."""
import os
import re

from common import FIX, save_st, versions, write_json
import numpy as np
import torch
import gen_lm
import quant as Q
from moshi.models import loaders
from safetensors.torch import load_file

LM_DIR = FIX / "lm"


def canonical() -> dict:
    """Legacy-layout f32 numpy dict from fixtures/lm/model.safetensors."""
    return {k: v.numpy() for k, v in load_file(str(LM_DIR / "model.safetensors")).items()}


def n_dep_layers(sd):
    return len({k.split(".")[2] for k in sd if k.startswith("depformer.layers.")})


# ---------------------------------------------------------------- name maps
def to_candle(sd: dict, dep_q: int) -> dict:
    out = {}
    for k, v in sd.items():
        if k.startswith(("text_emb.", "text_linear.", "out_norm.", "emb.", "transformer.")):
            out[k] = v
    L = n_dep_layers(sd)
    for k in range(dep_q):
        b = f"depformer.{k}."
        out[b + "linear_in.weight"] = sd[f"depformer_in.{k}.weight"]
        out[b + "linear_out.weight"] = sd[f"linears.{k}.weight"]
        out[b + "emb.weight"] = sd["depformer_text_emb.weight"] if k == 0 else sd[f"depformer_emb.{k - 1}.weight"]
        for j in range(L):
            lb = b + f"transformer.layers.{j}."
            src = f"depformer.layers.{j}."
            out[lb + "self_attn.in_proj_weight"] = np.split(sd[src + "self_attn.in_proj_weight"], dep_q)[k]
            out[lb + "self_attn.out_proj.weight"] = np.split(sd[src + "self_attn.out_proj.weight"], dep_q)[k]
            out[lb + "norm1.alpha"] = sd[src + "norm1.alpha"]
            out[lb + "norm2.alpha"] = sd[src + "norm2.alpha"]
            out[lb + "gating.linear_in.weight"] = sd[src + f"gating.{k}.linear_in.weight"]
            out[lb + "gating.linear_out.weight"] = sd[src + f"gating.{k}.linear_out.weight"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def from_candle(c: dict, dep_q: int) -> dict:
    sd = {k: v for k, v in c.items() if not k.startswith("depformer.")}
    L = len({k.split(".")[4] for k in c if k.startswith("depformer.0.transformer.layers.")})
    for k in range(dep_q):
        b = f"depformer.{k}."
        sd[f"depformer_in.{k}.weight"] = c[b + "linear_in.weight"]
        sd[f"linears.{k}.weight"] = c[b + "linear_out.weight"]
        sd["depformer_text_emb.weight" if k == 0 else f"depformer_emb.{k - 1}.weight"] = c[b + "emb.weight"]
        for j in range(L):
            lb = b + f"transformer.layers.{j}."
            dst = f"depformer.layers.{j}."
            sd[dst + f"gating.{k}.linear_in.weight"] = c[lb + "gating.linear_in.weight"]
            sd[dst + f"gating.{k}.linear_out.weight"] = c[lb + "gating.linear_out.weight"]
            sd[dst + "norm1.alpha"] = c[lb + "norm1.alpha"]
            sd[dst + "norm2.alpha"] = c[lb + "norm2.alpha"]
    for j in range(L):
        for nm in ("self_attn.in_proj_weight", "self_attn.out_proj.weight"):
            sd[f"depformer.layers.{j}.{nm}"] = np.concatenate(
                [c[f"depformer.{k}.transformer.layers.{j}.{nm}"] for k in range(dep_q)], axis=0)
    return sd


def to_mlx(sd: dict, dep_q: int) -> dict:
    out = {"text_emb.weight": sd["text_emb.weight"], "text_linear.weight": sd["text_linear.weight"],
           "out_norm.weight": sd["out_norm.alpha"].reshape(-1)}
    for k, v in sd.items():
        m = re.match(r"emb\.(\d+)\.weight", k)
        if m:
            out[f"audio_embs.{m.group(1)}.weight"] = v
        elif k.startswith("transformer."):
            if k.endswith(".alpha"):
                v = v.reshape(-1)
            out[k.replace(".alpha", ".weight").replace(".in_proj_weight", ".in_proj.weight")] = v
    c = to_candle(sd, dep_q)
    for k, v in c.items():
        if k.startswith("depformer."):
            nk = "depformer.slices." + k[len("depformer."):]
            if nk.endswith(".alpha"):
                v = v.reshape(-1)
            nk = nk.replace(".alpha", ".weight").replace(".in_proj_weight", ".in_proj.weight")
            out[nk] = v
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def from_mlx(m: dict, dep_q: int, dim: int, ddim: int) -> dict:
    c = {}
    for k, v in m.items():
        if k == "out_norm.weight":
            c["out_norm.alpha"] = v.reshape(1, 1, -1)
        elif k.startswith("audio_embs."):
            c[k.replace("audio_embs.", "emb.")] = v
        elif k.startswith("transformer.") or k.startswith("depformer.slices."):
            nk = k.replace("depformer.slices.", "depformer.").replace(".in_proj.weight", ".in_proj_weight")
            if re.search(r"norm[12]\.weight$", nk):
                nk = nk.replace(".weight", ".alpha")
                v = v.reshape(1, 1, -1)
            c[nk] = v
        else:
            c[k] = v
    return from_candle(c, dep_q)


# ---------------------------------------------------------------- bundles
def bundle(dirname: str, model_file: str, kw: dict):
    d = FIX / dirname
    d.mkdir(parents=True, exist_ok=True)
    cfg = gen_lm.bundle_config(kw)
    cfg["moshi_name"] = model_file
    write_json(d / "config.json", cfg)
    for name, target in ((gen_lm.MIMI_FILE, "../mimi/mimi.safetensors"),
                         (gen_lm.MIMI_CONFIG_FILE, "../mimi/mimi_config.json"),
                         (gen_lm.SPM_FILE, "../lm/" + gen_lm.SPM_FILE)):
        p = d / name
        if p.is_symlink() or p.exists():
            p.unlink()
        os.symlink(target, p)
    return d


def trace_for(sd_f32: dict, kw: dict, d, label: str, ref_sd: dict):
    """Run the greedy and forced traces on the dequantized weights (float32 compute)."""
    tmp = d / "_tmp_dequant.safetensors"
    save_st(tmp, {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd_f32.items()})
    model = loaders.get_moshi_lm(str(tmp), lm_kwargs=kw, dtype=torch.float32)
    tmp.unlink()
    codes = gen_lm.user_codes()
    res = gen_lm.run_lmgen(model, codes)
    ft = load_file(str(LM_DIR / "trace_forced.safetensors"))
    forced = gen_lm.run_lmgen(model, codes, ft["forced_text"].numpy(), ft["forced_audio"].numpy().T)
    forced["forced_text"], forced["forced_audio"] = ft["forced_text"], ft["forced_audio"]
    werr = max(float(np.abs(sd_f32[k] - ref_sd[k]).max()) for k in ref_sd)
    f32 = load_file(str(LM_DIR / "trace.safetensors"))
    stats = {
        "format": label,
        "max_abs_weight_error_vs_f32": werr,
        "text_margin_min": res["text_margin_per_step"].min().item(),
        "audio_margin_min": res["audio_margin_per_step"].min().item(),
        "greedy_tokens_equal_f32_trace": bool(torch.equal(res["out_text"], f32["out_text"]) and torch.equal(res["out_audio"], f32["out_audio"])),
        "forced_text_logits_maxabs_vs_f32": (forced["text_logits"] - load_file(str(LM_DIR / "trace_forced.safetensors"))["text_logits"]).abs().max().item(),
    }
    meta = {"config": kw, "format": label, **versions(), "stats": stats,
            "note": "reference = moshi 0.2.13 float32 on the dequantized weights of this file"}
    save_st(d / "trace.safetensors", res, meta)
    save_st(d / "trace_forced.safetensors", forced, meta)
    write_json(d / "stats.json", stats)
    print(label, stats)


def q8_0_deq_2d(v):
    return Q.q8_0_dequantize(Q.q8_0_quantize(v), v.size).reshape(v.shape)


def variants(sd: dict, kw: dict) -> dict:
    """label -> canonical (legacy-layout) f32 state dict holding the dequantized weights of each export
    (in memory, same rules as the files written by main)."""
    dep_q = kw["dep_q"]
    c = to_candle(sd, dep_q)
    m = to_mlx(sd, dep_q)
    out = {"candle-bf16": from_candle({k: Q.bf16_bits_to_f32(Q.to_bf16_bits(v)).reshape(v.shape) for k, v in c.items()}, dep_q)}
    out["gguf-q8_0"] = from_candle({k: (q8_0_deq_2d(v) if v.ndim == 2 and v.shape[1] % 32 == 0 else v)
                                    for k, v in c.items()}, dep_q)
    for bits, group in ((4, 32), (8, 64)):
        deq = {}
        for k, v in m.items():
            vb = Q.bf16_bits_to_f32(Q.to_bf16_bits(v)).reshape(v.shape)
            if v.ndim == 2 and v.shape[1] % group == 0:
                deq[k] = Q.mlx_dequantize(*Q.mlx_quantize(vb, bits, group), bits, group)
            else:
                deq[k] = vb
        out[f"mlx-q{bits}-g{group}"] = from_mlx(deq, dep_q, kw["dim"], kw["depformer_dim"])
    return out


def model_from(sd_f32: dict, kw: dict):
    model = loaders.get_moshi_lm(None, lm_kwargs=kw, dtype=torch.float32)
    st = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd_f32.items()}
    # same pre-hook path as loading a legacy file
    model.load_state_dict(st)
    return model


def main():
    kw = gen_lm.tiny_lm_kwargs()
    dep_q = kw["dep_q"]
    sd = canonical()
    assert all(np.array_equal(sd[k], v) for k, v in from_candle(to_candle(sd, dep_q), dep_q).items())
    assert set(from_candle(to_candle(sd, dep_q), dep_q)) == set(sd)
    rt = from_mlx(to_mlx(sd, dep_q), dep_q, kw["dim"], kw["depformer_dim"])
    assert set(rt) == set(sd) and all(np.array_equal(sd[k], rt[k]) for k in sd)

    # 1. candle bf16 safetensors.
    d = bundle("lm_candle_bf16", "model.safetensors", kw)
    c = to_candle(sd, dep_q)
    Q.write_safetensors(d / "model.safetensors",
                        {k: ("BF16", v.shape, Q.to_bf16_bits(v)) for k, v in c.items()}, {"format": "candle-bf16"})
    deq = {k: Q.bf16_bits_to_f32(Q.to_bf16_bits(v)).reshape(v.shape) for k, v in c.items()}
    trace_for(from_candle(deq, dep_q), kw, d, "candle-bf16", sd)

    # 2. GGUF Q8_0, candle names; rank-2 tensors with last dim % 32 == 0 -> Q8_0, the rest F32.
    d = bundle("lm_gguf_q8", "model.q8.gguf", kw)
    tensors, deq = [], {}
    for k in sorted(c):
        v = c[k].astype(np.float32)
        if v.ndim == 2 and v.shape[1] % 32 == 0:
            b = Q.q8_0_quantize(v)
            tensors.append((k, Q.GGML_Q8_0, list(v.shape), b))
            deq[k] = Q.q8_0_dequantize(b, v.size).reshape(v.shape)
        else:
            tensors.append((k, Q.GGML_F32, list(v.shape), v.astype("<f4").tobytes()))
            deq[k] = v
    Q.write_gguf(d / "model.q8.gguf", tensors, metadata=[])
    ver, md, back = Q.read_gguf(d / "model.q8.gguf")
    assert ver == 3 and set(back) == set(c)
    for name, gt, shape, data in tensors:
        assert back[name][0] == gt and back[name][1] == shape and back[name][2] == data
    trace_for(from_candle(deq, dep_q), kw, d, "gguf-q8_0", sd)

    # 3. MLX bf16.
    m = to_mlx(sd, dep_q)
    d = bundle("lm_mlx_bf16", "model.safetensors", kw)
    Q.write_safetensors(d / "model.safetensors",
                        {k: ("BF16", v.shape, Q.to_bf16_bits(v)) for k, v in m.items()}, {"format": "mlx-bf16"})
    deq = {k: Q.bf16_bits_to_f32(Q.to_bf16_bits(v)).reshape(v.shape) for k, v in m.items()}
    trace_for(from_mlx(deq, dep_q, kw["dim"], kw["depformer_dim"]), kw, d, "mlx-bf16", sd)

    # 4./5. MLX affine q4 (group 32) and q8 (group 64): every Linear / Embedding weight (2-D) quantized
    # from its bf16 value; a 2-D weight whose last dim is not a multiple of the group stays bf16 (q8/64:
    # the depformer tensors with 32 input columns). Norm weights stay bf16.
    for bits, group in ((4, 32), (8, 64)):
        d = bundle(f"lm_mlx_q{bits}", f"model.q{bits}.safetensors", kw)
        out, deq, kept = {}, {}, []
        for k, v in m.items():
            vb = Q.bf16_bits_to_f32(Q.to_bf16_bits(v)).reshape(v.shape)
            if v.ndim == 2 and v.shape[1] % group == 0:
                packed, sb, bb = Q.mlx_quantize(vb, bits, group)
                base = k[: -len(".weight")]
                out[base + ".weight"] = ("U32", packed.shape, packed)
                out[base + ".scales"] = ("BF16", sb.shape, sb)
                out[base + ".biases"] = ("BF16", bb.shape, bb)
                deq[k] = Q.mlx_dequantize(packed, sb, bb, bits, group)
            else:
                out[k] = ("BF16", v.shape, Q.to_bf16_bits(v))
                deq[k] = vb
                if v.ndim == 2:
                    kept.append(k)
        Q.write_safetensors(d / f"model.q{bits}.safetensors", out,
                            {"format": f"mlx-q{bits}", "bits": bits, "group_size": group})
        write_json(d / "quantization.json", {"bits": bits, "group_size": group, "unquantized_2d_bf16": kept})
        trace_for(from_mlx(deq, dep_q, kw["dim"], kw["depformer_dim"]), kw, d, f"mlx-q{bits}-g{group}", sd)


if __name__ == "__main__":
    main()
