"""Optional cross-check of fixtures/mimi/mimi_hf.safetensors with Hugging Face transformers (not part of
the pinned venv). Install it beside the venv without touching the lock file:
    $ORACLE_VENV/bin/pip install --target /tmp/hfpkgs --no-deps transformers==4.57.1 tokenizers==0.22.1 regex pyyaml
    HFPKGS=/tmp/hfpkgs NO_TORCH_COMPILE=1 $ORACLE_VENV/bin/python check_hf_mimi.py
Checks: strict load with mimi_hf_config.json; HF encoder transformer == moshi's (same weights, Kyutai
layout) run with an unlimited context; HF codes == moshi codes computed from that unlimited-context latent."""
import os
import sys

sys.path.insert(0, os.environ.get("HFPKGS", "/tmp/hfpkgs"))
import json

from common import FIX
import numpy as np
import torch
import gen_mimi
from moshi.models import loaders
from safetensors.torch import load_file
from transformers import MimiConfig, MimiModel


def main():
    d = FIX / "mimi"
    c = json.loads((d / "mimi_hf_config.json").read_text())
    c.pop("model_type")
    hf = MimiModel(MimiConfig(**c)).eval()
    hf.load_state_dict(load_file(str(d / "mimi_hf.safetensors")), strict=True)
    cfg = json.loads((d / "mimi_config.json").read_text())
    cfg["transformer"]["context"] = 100000       # unlimited: HF batch attention ignores sliding_window
    ref = loaders.get_mimi(str(d / "mimi.safetensors"), cfg, num_codebooks=8)
    raw = (d / "input.wav").read_bytes()
    x = np.zeros(61440, dtype=np.float32)
    x[:61000] = np.frombuffer(raw[-61000 * 4:], dtype="<f4")
    xx = torch.from_numpy(x)[None, None]
    with torch.no_grad():
        e = ref.encoder(xx)
        h_ref = ref.encoder_transformer(e)[0]
        h_hf = hf.encoder_transformer(e.transpose(1, 2))[0].transpose(1, 2)
        codes_ref = ref.encode(xx)[0]
        codes_hf = hf.encode(xx, num_quantizers=8).audio_codes[0]
    err = (h_ref - h_hf).abs().max().item()
    print("encoder transformer max abs diff", err, "codes equal", torch.equal(codes_ref, codes_hf))
    assert err < 1e-5 and torch.equal(codes_ref, codes_hf)


if __name__ == "__main__":
    main()
