"""Copies the recorded client traffic (`../shared/interop/` next to the checkout, or the folder given as argument; recorded outside the project from Kyutai's web
client in Chromium and from `sphn`, see fixtures/README.md) into fixtures/interop/ and writes the energy
envelope of the input signal the clients played (`input_envelope.json`: RMS of consecutive 20 ms windows of
`speech-like-48k.wav`), so replay tests need neither the 1.1 MB WAV nor anything outside the repository.
numpy only: `python gen_interop.py [SOURCE_DIR]`."""
import json
import shutil
import sys
import wave
from pathlib import Path

import numpy as np

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "interop"
WINDOW_MS = 20


def main(src: Path):
    FIX.mkdir(parents=True, exist_ok=True)
    for name in ("kyutai-web-client-upstream.json", "sphn-client-upstream.json"):
        shutil.copyfile(src / name, FIX / name)
    with wave.open(str(src / "speech-like-48k.wav")) as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2
        sr = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64) / 32768.0
    win = sr * WINDOW_MS // 1000
    n = len(pcm) // win
    rms = np.sqrt((pcm[: n * win].reshape(n, win) ** 2).mean(axis=1))
    (FIX / "input_envelope.json").write_text(json.dumps({
        "source": "speech-like-48k.wav", "sample_rate": sr, "samples": len(pcm), "window_ms": WINDOW_MS,
        "rms": [round(float(x), 7) for x in rms]}) + "\n")
    print(f"{len(pcm)} samples at {sr} Hz, {n} windows")


if __name__ == "__main__":
    default = Path(__file__).resolve().parents[3] / "shared" / "interop"
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else default)
