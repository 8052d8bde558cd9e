"""PyTorch half of the real-tool fixtures (`fixtures/tools/`, see README "Fixtures made by the real tools").

`base SEED...`: for each seed, the tiny LM of `tools_lm_kwargs()` (every matrix dimension a multiple of 64, so
MLX q8/g64 applies to every Linear and Embedding as in the release) built and perturbed like fixtures/lm,
written to the work directory as Kyutai legacy-layout f32 (`legacy.safetensors`, input of moshi_mlx's
`load_pytorch_weights`) and candle-layout bf16 (`candle_bf16.safetensors`, the input candle's quantizer read
for the released q8 GGUF), plus its own f32 trace (`trace_f32.safetensors`, for the "vs f32" columns).

`sample DIR DEQUANT`: a few tensors of DEQUANT in full plus per-tensor sums, written into DIR.

`trace DIR DEQUANT`: moshi 0.2.13 greedy and teacher-forced traces (float32) of the candle-named f32 weights
in DEQUANT (a tool's own dequantization of the file in DIR), written into DIR."""
import sys
from pathlib import Path

from common import FIX, REPO, save_st, versions, write_json
import numpy as np
import torch
import gen_exports
import gen_lm
import quant as Q
from moshi.models import loaders
from safetensors.torch import load_file

WORK = REPO / "target" / "oracle-work"
TOOLS = FIX / "tools"


def tools_lm_kwargs() -> dict:
    kw = gen_lm.tiny_lm_kwargs()
    kw.update(
        hidden_scale=1.5,                # ff = 96 -> gated hidden 2*96//3 = 64
        depformer_dim=64, depformer_num_heads=2, depformer_num_layers=1,
        depformer_dim_feedforward=96,    # -> gated hidden 64
    )
    return kw


def build(seed: int):
    kw = tools_lm_kwargs()
    torch.manual_seed(seed)
    model = loaders.get_moshi_lm(None, lm_kwargs=kw, dtype=torch.float32)
    gen_lm.perturb(model)
    return kw, model


def forced_tokens():
    ft = load_file(str(FIX / "lm" / "trace_forced.safetensors"))
    return ft["forced_text"], ft["forced_audio"]


def traces(model, d: Path, meta: dict):
    codes = gen_lm.user_codes()
    res = gen_lm.run_lmgen(model, codes)
    again = gen_lm.run_lmgen(model, codes)
    assert all(torch.equal(res[k], again[k]) for k in res), "non-deterministic"
    ftext, faudio = forced_tokens()
    forced = gen_lm.run_lmgen(model, codes, ftext.numpy(), faudio.numpy().T)
    forced["forced_text"], forced["forced_audio"] = ftext, faudio
    meta = {**meta, **versions()}
    save_st(d / "trace.safetensors", res, meta)
    save_st(d / "trace_forced.safetensors", forced, meta)
    return res, forced


def base(seeds):
    for seed in seeds:
        kw, model = build(seed)
        d = WORK / f"seed{seed}"
        d.mkdir(parents=True, exist_ok=True)
        legacy = gen_lm.to_legacy({k: v.detach().clone() for k, v in model.state_dict().items()}, model)
        save_st(d / "legacy.safetensors", legacy, {"seed": str(seed)})
        c = gen_exports.to_candle({k: v.numpy() for k, v in legacy.items()}, kw["dep_q"])
        Q.write_safetensors(d / "candle_bf16.safetensors",
                            {k: ("BF16", v.shape, Q.to_bf16_bits(v)) for k, v in c.items()})
        cfg = gen_lm.bundle_config(kw)
        write_json(d / "config.json", cfg)
        res, _ = traces(model, d, {"seed": seed, "note": "f32 weights"})
        print(f"seed {seed}: f32 text margin {res['text_margin_per_step'].min():.4g} "
              f"audio margin {res['audio_margin_per_step'].min():.4g}", flush=True)


def trace(d: Path, dequant: Path):
    kw = tools_lm_kwargs()
    c = {k: v.float().numpy() for k, v in load_file(str(dequant)).items()}
    model = gen_exports.model_from(gen_exports.from_candle(c, kw["dep_q"]), kw)
    res, forced = traces(model, d, {"note": f"moshi float32 on {dequant.name}, the tool's dequantization"})
    stats = {"text_margin_min": res["text_margin_per_step"].min().item(),
             "audio_margin_min": res["audio_margin_per_step"].min().item()}
    print(d.name, stats)
    return stats


SAMPLE = ("text_emb.weight", "transformer.layers.1.gating.linear_out.weight", "linears.3.weight",
          "depformer.layers.0.norm1.alpha", "out_norm.alpha")


def sample(d: Path, dequant: Path):
    """The tool's dequantization as a reference for a loader's dequantized path: a few tensors in full
    (`dequant_sample.safetensors`) and, for every tensor, the float64 sum and sum of squares
    (`dequant_sums.json`), both under Kyutai's legacy (canonical) names."""
    kw = tools_lm_kwargs()
    cn = {k: v.float().numpy() for k, v in load_file(str(dequant)).items()}
    c = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in gen_exports.from_candle(cn, kw["dep_q"]).items()}
    save_st(d / "dequant_sample.safetensors", {k: c[k].contiguous() for k in SAMPLE},
            {"source": f"{dequant.name}: the tool's own dequantization of {d.name}"})
    sums = {k: [float(v.double().sum()), float((v.double() ** 2).sum()), list(v.shape)] for k, v in sorted(c.items())}
    write_json(d / "dequant_sums.json", sums)


if __name__ == "__main__":
    if sys.argv[1] == "base":
        base([int(s) for s in sys.argv[2:]])
    elif sys.argv[1] == "trace":
        trace(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1] == "sample":
        sample(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        raise SystemExit(__doc__)
