"""moshi_native against the oracle fixtures that the Rust parity tests read (fixtures/mimi, fixtures/duplex)."""

import json
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

import moshi_native as mn

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
DTYPES = {"F32": np.float32, "I64": np.int64}


def read_safetensors(path):
    """The tensors of a safetensors file as numpy arrays (the format: u64 header size, JSON header, data)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        start, end = t["data_offsets"]
        out[name] = np.frombuffer(data[start:end], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


@pytest.fixture(scope="module")
def mimi_trace():
    return read_safetensors(FIXTURES / "mimi/trace.safetensors")


@pytest.mark.parametrize("source", ["file", "bundle"])
def test_mimi_codes_and_pcm_equal_the_fixture(source, mimi_trace):
    if source == "file":
        mimi = mn.Mimi(FIXTURES / "mimi/mimi.safetensors", config=FIXTURES / "mimi/mimi_config.json")
    else:
        mimi = mn.Mimi(str(FIXTURES / "lm"), threads=2)
    assert (mimi.frame_size, mimi.codebooks, mimi.sample_rate) == (1920, 8, 24000)
    pcm = mn.read_wav(FIXTURES / "mimi/input.wav")
    assert pcm.dtype == np.float32 and pcm.shape == (61000,)
    codes = mimi.encode(pcm)
    assert codes.dtype == np.int64
    np.testing.assert_array_equal(codes, mimi_trace["codes"])
    out = mimi.decode(codes)
    assert out.dtype == np.float32 and out.shape == mimi_trace["pcm"].shape
    assert np.abs(out - mimi_trace["pcm"]).max() <= 1e-4


def test_mimi_streaming_steps_equal_the_whole_signal_calls(mimi_trace):
    mimi = mn.Mimi(FIXTURES / "lm")
    pcm = mn.read_wav(FIXTURES / "mimi/input.wav")
    pcm = np.concatenate([pcm, np.zeros(32 * 1920 - len(pcm), np.float32)])
    codes = np.stack([mimi.encode_step(pcm[f * 1920 : (f + 1) * 1920]) for f in range(32)], axis=1)
    np.testing.assert_array_equal(codes, mimi_trace["codes"])
    out = np.concatenate([mimi.decode_step(codes[:, f]) for f in range(32)])
    assert np.abs(out - mimi_trace["pcm"]).max() <= 1e-4
    # reset() starts new streams: the first frame's codes come back; float64 input is converted.
    mimi.reset()
    np.testing.assert_array_equal(mimi.encode_step(pcm[:1920].astype(np.float64)), codes[:, 0])


def test_mimi_refuses_bad_input():
    mimi = mn.Mimi(FIXTURES / "lm")
    with pytest.raises(ValueError, match="1920"):
        mimi.encode_step(np.zeros(1000, np.float32))
    with pytest.raises(ValueError, match="codes"):
        mimi.decode_step(np.zeros(7, np.int64))
    with pytest.raises(ValueError, match="not in 0..64"):
        mimi.decode_step(np.full(8, 64, np.int64))
    with pytest.raises(ValueError, match="rows"):
        mimi.decode(np.zeros((4, 3), np.int64))
    with pytest.raises(mn.MoshiError, match="no such file"):
        mn.Mimi(FIXTURES / "missing")
    with pytest.raises(mn.MoshiError):
        mn.Mimi(FIXTURES / "mimi/mimi.safetensors")  # tiny weights, released dimensions


def test_a_greedy_session_produces_the_duplex_trace_tokens():
    trace = read_safetensors(FIXTURES / "duplex/trace.safetensors")
    engine = mn.Engine(FIXTURES / "lm")
    session = engine.session(greedy=True, max_queued_frames=64)
    pcm = mn.read_wav(FIXTURES / "duplex/input.wav")
    frames = []
    sizes = [960, 1500, 2000, 1920, 700, 3840]
    pos, i = 0, 0
    while pos < len(pcm):
        end = min(pos + sizes[i % len(sizes)], len(pcm))
        frames += session.process(pcm[pos:end])
        pos, i = end, i + 1
    steps = trace["text_tokens"].shape[0]
    assert len(frames) == steps + 1
    assert frames[0].text_token is None and frames[0].audio_tokens is None
    np.testing.assert_array_equal([f.text_token for f in frames[1:]], trace["text_tokens"])
    np.testing.assert_array_equal(np.stack([f.audio_tokens for f in frames[1:]], axis=1), trace["audio_tokens"])
    out = np.concatenate([f.pcm for f in frames])
    assert out.shape == trace["pcm"].shape
    assert np.abs(out - trace["pcm"]).max() <= 1e-4
    assert [f.frame_index for f in frames] == list(range(steps + 1))


def test_session_controls_on_the_demo_model():
    engine = mn.Engine()
    assert engine.is_demo
    s = mn.Session(engine, seed=7, output_rate=48000)
    frame = np.linspace(-0.5, 0.5, 1920, dtype=np.float32)
    assert s.pull() is None
    report = s.push(np.tile(frame, 3))
    assert (report.frames_completed, report.frames_dropped, report.queued) == (3, 0, 3)
    assert s.pull().frame_index == 0
    f = s.pull()
    assert f.frame_index == 1 and f.pcm.dtype == np.float32 and 0 < len(f.pcm) <= 2 * 1920 + 64
    s.pause()
    assert s.paused and s.pull() is None
    s.resume()
    assert s.interrupt() == 1
    assert s.pull().epoch == 1
    assert s.reset() == 2
    s.push(frame)
    assert s.pull().frame_index == 0
    assert s.counters()["frames_processed"] == 4
    s.stop()
    s.push(frame)
    assert s.pull() is None and s.stopped
    # process() pushes frame by frame: a long input loses nothing to the bounded queue.
    assert len(engine.session().process(np.zeros(10 * 1920, np.float32))) == 10
    # max_steps ends the stream.
    s = engine.session(max_steps=2)
    assert len(s.process(np.tile(frame, 3))) == 2 and s.stopped


def test_bad_options_raise():
    with pytest.raises(ValueError, match="kv_dtype"):
        mn.Engine(kv_dtype="f16")
    with pytest.raises(mn.MoshiError, match="threads"):
        mn.Engine(threads=0)
    with pytest.raises(ValueError, match="max_queued_frames"):
        mn.Session(mn.Engine(), max_queued_frames=0)
    with pytest.raises(mn.MoshiError):
        mn.Engine(FIXTURES / "missing")
    with pytest.raises(ValueError, match="penalty"):
        mn.Session(mn.Engine(), repetition_penalty=0.0)
    s = mn.Session(mn.Engine(), pad_mult=0.5, repetition_penalty=1.1, repetition_penalty_context=16)
    assert len(s.process(np.zeros(3 * 1920, np.float32))) == 3


def test_sessions_run_in_parallel_threads():
    """Each thread drives its own session (the GIL is released while computing); results equal a serial run."""
    engine = mn.Engine(FIXTURES / "lm", threads=1)
    pcm = mn.read_wav(FIXTURES / "duplex/input.wav")
    serial = [f.text_token for f in engine.session(greedy=True, max_queued_frames=64).process(pcm)]
    results = [None] * 3

    def run(i):
        results[i] = [f.text_token for f in engine.session(greedy=True, max_queued_frames=64).process(pcm)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [serial] * 3


def test_inspect_and_wav_helpers(tmp_path):
    assert mn.__version__ and mn.SAMPLE_RATE == 24000 and mn.FRAME_SIZE == 1920
    d = mn.inspect(FIXTURES / "lm")
    assert d["kind"] == "bundle" and d["lm"]["dim"] == 64 and d["mimi"]["n_q"] >= 8
    f = mn.inspect(FIXTURES / "mimi/mimi_hf.safetensors")
    assert f["component"] == "mimi" and f["weights"]["tensors"] > 0
    with pytest.raises(mn.MoshiError):
        mn.inspect(FIXTURES / "missing")
    x = np.sin(np.arange(4800, dtype=np.float32) / 10) * 0.5
    mn.write_wav(tmp_path / "x.wav", x)
    np.testing.assert_array_equal(mn.read_wav(tmp_path / "x.wav"), x)
