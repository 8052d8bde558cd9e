#!/usr/bin/env python3
"""PyTorch Mimi baseline for `tools/bench/compare.sh`: Kyutai's `moshi` 0.2.13 Mimi on CPU, float32,
streaming one 1920-sample frame at a time (encode then decode), on the same synthetic weights that
`moshi-native synth` writes. Needs the oracle environment (`$ORACLE_VENV`, see tools/oracle/README.md: moshi 0.2.13 + torch);
optional, never used by tests.

    NO_TORCH_COMPILE=1 $ORACLE_VENV/bin/python tools/bench/torch_mimi.py \
        --weights BUNDLE/tokenizer-e351c8d8-checkpoint125.safetensors --threads 1,2 --frames 20 --rounds 1

Prints the same line format as the candle baseline:
  frame impl=torch what=mimi_encode threads=1 round=0 ms=83.1
  median impl=torch what=mimi_encode threads=1 ms=83.0 min=80.2 max=90.0 n=20
Thread counts are interleaved inside each round (torch.set_num_threads between blocks).
"""
import argparse
import math
import os
import time

os.environ.setdefault("NO_TORCH_COMPILE", "1")

import torch  # noqa: E402
from moshi.models import loaders  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    t0 = time.perf_counter()
    mimi = loaders.get_mimi(a.weights, device="cpu", num_codebooks=8)
    mimi.eval()
    print(f"# torch mimi loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    fs = 1920
    n = fs * max(a.frames, 1)
    pcm = torch.tensor(
        [0.5 * math.sin(2 * math.pi * (100.0 + 1000.0 * (i / 24000.0)) * (i / 24000.0)) for i in range(n)],
        dtype=torch.float32,
    ).view(1, 1, n)
    res = {(w, t): [] for w in ("mimi_encode", "mimi_decode", "mimi_encdec") for t in threads}
    with torch.no_grad():
        for rnd in range(a.rounds + 1):  # round 0 = warm-up
            for t in threads:
                torch.set_num_threads(t)
                frames = 2 if rnd == 0 else a.frames
                with mimi.streaming(1):
                    for f in range(frames):
                        x = pcm[:, :, (f % a.frames) * fs:(f % a.frames + 1) * fs]
                        s = time.perf_counter()
                        codes = mimi.encode(x)
                        e = time.perf_counter()
                        out = mimi.decode(codes)
                        d = time.perf_counter()
                        assert out.shape[-1] == fs
                        if rnd > 0:
                            te, td = (e - s) * 1e3, (d - e) * 1e3
                            for w, v in (("mimi_encode", te), ("mimi_decode", td), ("mimi_encdec", te + td)):
                                res[(w, t)].append(v)
                                print(f"frame impl=torch what={w} threads={t} round={rnd - 1} ms={v:.3f}")
    for (w, t), v in res.items():
        v = sorted(v)
        print(f"median impl=torch what={w} threads={t} ms={v[len(v) // 2]:.3f} min={v[0]:.3f} max={v[-1]:.3f} n={len(v)}")


if __name__ == "__main__":
    main()
