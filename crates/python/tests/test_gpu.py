"""Engine(device="gpu"): the LM and Mimi on a GPU adapter (lavapipe in CI) give the oracle's duplex tokens and the
CPU engine's seeded tokens exactly, samples within Mimi's parity bound. Skips with the reason when no adapter can
be opened; MOSHI_REQUIRE_GPU=1 (CI) makes that a failure, as the Rust GPU tests do."""

import os

import numpy as np
import pytest

import moshi_native as mn
from test_moshi_native import FIXTURES, read_safetensors


@pytest.fixture(scope="module")
def gpu_engine():
    try:
        engine = mn.Engine(FIXTURES / "lm", device="gpu")
    except mn.MoshiError as e:
        if os.environ.get("MOSHI_REQUIRE_GPU") == "1":
            raise
        pytest.skip(f"no GPU adapter: {e}")
    assert engine.device == "gpu" and engine.gpu_adapter, "the engine runs where it was asked to"
    return engine


def test_the_device_choice_is_checked():
    cpu = mn.Engine(FIXTURES / "lm")
    assert (cpu.device, cpu.gpu_adapter) == ("cpu", None)
    for bad in ["tpu", "gpu:", "gpu:-1", "GPU", "gpu:x"]:
        with pytest.raises(ValueError, match="device"):
            mn.Engine(device=bad)
    # No machine has adapter 4095: the device cannot be opened, whatever adapters exist.
    with pytest.raises(mn.MoshiError, match="device"):
        mn.Engine(FIXTURES / "lm", device="gpu:4095")


def test_a_device_failure_is_a_device_error_with_the_device_message():
    assert issubclass(mn.DeviceError, mn.MoshiError), "existing handlers of MoshiError still catch it"
    with pytest.raises(mn.DeviceError) as e:
        mn.Engine(FIXTURES / "lm", device="gpu:4095")
    # "device", then the GPU's own message.
    text = str(e.value)
    assert text.startswith("device: ") and "4095" in text, text


def test_a_greedy_gpu_session_produces_the_duplex_trace_tokens(gpu_engine):
    trace = read_safetensors(FIXTURES / "duplex/trace.safetensors")
    frames = gpu_engine.session(greedy=True, max_queued_frames=64).process(mn.read_wav(FIXTURES / "duplex/input.wav"))
    steps = trace["text_tokens"].shape[0]
    assert len(frames) == steps + 1
    np.testing.assert_array_equal([f.text_token for f in frames[1:]], trace["text_tokens"])
    np.testing.assert_array_equal(np.stack([f.audio_tokens for f in frames[1:]], axis=1), trace["audio_tokens"])
    out = np.concatenate([f.pcm for f in frames])
    assert np.abs(out - trace["pcm"]).max() <= 1e-4


def test_a_seeded_gpu_session_gives_the_cpu_engine_s_tokens(gpu_engine):
    pcm = mn.read_wav(FIXTURES / "duplex/input.wav")
    cpu = mn.Engine(FIXTURES / "lm").session(seed=1234, max_queued_frames=64).process(pcm)
    gpu = gpu_engine.session(seed=1234, max_queued_frames=64).process(pcm)
    assert [f.text_token for f in gpu] == [f.text_token for f in cpu]
    for g, c in zip(gpu, cpu):
        assert (g.audio_tokens is None) == (c.audio_tokens is None)
        if c.audio_tokens is not None:
            np.testing.assert_array_equal(g.audio_tokens, c.audio_tokens)
    assert np.abs(np.concatenate([f.pcm for f in gpu]) - np.concatenate([f.pcm for f in cpu])).max() <= 1e-4
