"""Benchmark (not a test): Mimi streaming encode + decode per 80 ms frame, moshi_native vs rustymimi.

Both load the same Mimi weights file (e.g. the one `moshi-native synth` writes in a full-size bundle) and run
in the same process, interleaved round by round (A, B, A, B, ...); each round encodes and decodes `--frames`
consecutive frames of a synthetic signal after `--warmup` frames. Prints the median and the spread of the
per-frame times of each library and their ratio.

    pip install ./crates/python rustymimi
    python crates/python/bench/mimi_vs_rustymimi.py --mimi BUNDLE/tokenizer-e351c8d8-checkpoint125.safetensors
"""

import argparse
import os
import statistics
import time

import numpy as np


def signal(frames, frame_size=1920, rate=24000):
    t = np.arange(frames * frame_size, dtype=np.float64) / rate
    x = 0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(1.3 * t) + 0.05 * np.sin(2 * np.pi * 1234 * t)
    return x.astype(np.float32)


class Ours:
    def __init__(self, path, threads):
        import moshi_native

        self.name = f"moshi_native threads={threads}"
        self.m = moshi_native.Mimi(path, threads=threads)

    def reset(self):
        self.m.reset()

    def frame(self, pcm):
        return self.m.decode_step(self.m.encode_step(pcm))


class Rustymimi:
    def __init__(self, path):
        import rustymimi

        self.name = "rustymimi"
        self.path = path
        self.m = rustymimi.Tokenizer(path)

    def reset(self):
        self.m.reset()

    def frame(self, pcm):
        codes = self.m.encode_step(pcm[None, None, :])
        return self.m.decode_step(codes)


def run_round(impl, pcm, warmup, frames, fs=1920):
    impl.reset()
    for f in range(warmup):
        impl.frame(pcm[f * fs : (f + 1) * fs])
    times = []
    for f in range(warmup, warmup + frames):
        x = pcm[f * fs : (f + 1) * fs]
        t0 = time.perf_counter()
        impl.frame(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mimi", required=True, help="Mimi weights file (released dimensions, Kyutai names)")
    p.add_argument("--frames", type=int, default=50, help="timed frames per round")
    p.add_argument("--warmup", type=int, default=5, help="untimed frames at the start of each round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1],
                   help="moshi_native thread counts to compare (rustymimi uses candle's own threading)")
    a = p.parse_args()

    impls = [Ours(a.mimi, t) for t in dict.fromkeys(a.threads)] + [Rustymimi(a.mimi)]
    pcm = signal(a.warmup + a.frames)
    medians = {i.name: [] for i in impls}
    for r in range(a.rounds):
        for i in impls:
            medians[i.name].append(run_round(i, pcm, a.warmup, a.frames))
        print(f"round {r + 1}: " + ", ".join(f"{n} {m[-1]:.2f} ms" for n, m in medians.items()), flush=True)
    base = statistics.median(medians["rustymimi"])
    print(f"\nMimi encode + decode, ms per 80 ms frame (median of {a.rounds} round medians, [min, max]); "
          f"{a.frames} frames per round, nproc {os.cpu_count()}")
    for name, m in medians.items():
        med = statistics.median(m)
        print(f"  {name:<26} {med:8.2f} ms  [{min(m):.2f}, {max(m):.2f}]  ratio to rustymimi {med / base:.2f}")


if __name__ == "__main__":
    main()
