"""Shared helpers for the moshi-native parity oracle (see README.md).

Must be imported before torch/moshi by every generator module: it sets NO_TORCH_COMPILE=1,
one torch thread and deterministic algorithms.
"""
import os

os.environ.setdefault("NO_TORCH_COMPILE", "1")
if os.environ["NO_TORCH_COMPILE"] != "1":
    raise SystemExit("NO_TORCH_COMPILE must be 1 for the oracle")

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # every path is local; never touch the network

import json
import struct
import wave
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

import moshi  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "fixtures"

FRAME = 1920
SR = 24000


def versions() -> dict:
    import numpy, safetensors, sentencepiece  # noqa: F401
    return {
        "moshi": moshi.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "safetensors": safetensors.__version__,
        "torch_threads": str(torch.get_num_threads()),
        "dtype": "float32",
    }


_DT = {torch.float32: ("F32", "<f4"), torch.int64: ("I64", "<i8"), torch.uint8: ("U8", "u1"),
       torch.int32: ("I32", "<i4")}


def save_st(path: Path, tensors: dict, meta: dict | None = None):
    """Write a safetensors file byte-reproducibly (tensors sorted by name, metadata sorted by key; the
    `safetensors` package stores metadata in a hash map, so its header order varies between runs).
    Metadata values are JSON strings."""
    import quant
    path.parent.mkdir(parents=True, exist_ok=True)
    out = {}
    for k, v in tensors.items():
        if isinstance(v, np.ndarray):
            v = torch.from_numpy(v)
        v = v.detach().cpu().contiguous()
        dt, npdt = _DT[v.dtype]
        out[k] = (dt, tuple(v.shape), v.numpy().astype(npdt))
    md = {k: (v if isinstance(v, str) else json.dumps(v, sort_keys=True)) for k, v in sorted((meta or {}).items())}
    quant.write_safetensors(path, out, md)


def write_json(path: Path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_wav_f32(path: Path, pcm: np.ndarray, sr: int = SR):
    """IEEE-float 32-bit mono WAV (format tag 3), exact float32 samples."""
    pcm = np.asarray(pcm, dtype="<f4")
    data = pcm.tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, sr, sr * 4, 4, 32)
    fact = struct.pack("<I", len(pcm))
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"fact" + struct.pack("<I", 4) + fact
            + b"data" + struct.pack("<I", len(data)) + data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


def write_wav_i16(path: Path, pcm: np.ndarray, sr: int = SR):
    """16-bit PCM mono WAV; samples = round(clip(x, -1, 1) * 32767)."""
    x = np.clip(np.asarray(pcm, dtype=np.float64), -1.0, 1.0)
    q = np.round(x * 32767.0).astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(q.tobytes())
    return q.astype(np.float32) / 32767.0


def test_waveform(n_samples: int, seed: int) -> np.ndarray:
    """Deterministic test signal: 100 Hz -> 4 kHz linear chirp (amp 0.3) + 440 Hz and
    1250 Hz tones (amp 0.1, 0.07) + white noise (std 0.03, numpy PCG64 seed), times a
    piecewise-constant envelope (one silent segment), 20 ms fade-in, 10 ms fade-out; float32."""
    t = np.arange(n_samples, dtype=np.float64) / SR
    dur = n_samples / SR
    f0, f1 = 100.0, 4000.0
    phase = 2 * np.pi * (f0 * t + 0.5 * (f1 - f0) / dur * t * t)
    x = 0.3 * np.sin(phase) + 0.1 * np.sin(2 * np.pi * 440 * t) + 0.07 * np.sin(2 * np.pi * 1250 * t + 0.3)
    rng = np.random.default_rng(seed)
    x += 0.03 * rng.standard_normal(n_samples)
    # Piecewise-constant envelope (segments of 0.16 s, levels 0.1..1.0, 5 ms linear ramps) with one
    # segment of exact silence, so that the codec sees varied content.
    seg = int(0.16 * SR)
    n_seg = -(-n_samples // seg)
    levels = rng.uniform(0.1, 1.0, n_seg)
    levels[n_seg // 2] = 0.0
    env = np.repeat(levels, seg)[:n_samples]
    ramp = int(0.005 * SR)
    kernel = np.ones(ramp) / ramp
    env = np.convolve(np.concatenate([np.full(ramp - 1, env[0]), env]), kernel, mode="valid")
    x *= env
    fi = int(0.02 * SR)
    x[:fi] *= np.linspace(0.0, 1.0, fi)
    fo = int(0.01 * SR)
    x[-fo:] *= np.linspace(1.0, 0.0, fo)
    return x.astype(np.float32)
