"""moshi_native.SttEngine / Transcriber against the oracle's STT fixtures (fixtures/stt/{1b,2b6}/events.json,
the expectations of the Rust STT tests; the bundled demo-stt model is fixtures/stt/1b)."""

import json
from pathlib import Path

import numpy as np
import pytest

import moshi_native as mn

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"


def oracle(v):
    return json.loads((FIXTURES / "stt" / v / "events.json").read_text())


def transcribe(t, pcm, chunk):
    events = []
    for i in range(0, len(pcm), chunk):
        events += t.process(pcm[i : i + chunk])
    return events + t.flush()


def check_oracle(events, v):
    """Types, steps, tokens and times exact; voice-activity probabilities within 1e-4."""
    want = oracle(v)["events"]
    got = [e for e in events if e.type != "EndOfTurn"]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.type == w["type"]
        if w["type"] == "Step":
            assert g.step_idx == w["step_idx"]
            assert g.prs.dtype == np.float32 and g.prs.shape == (len(w["prs"]),)
            assert np.abs(g.prs - np.array(w["prs"])).max() <= 1e-4
        elif w["type"] == "Word":
            assert g.tokens == w["tokens"]
            assert g.start_time == w["start_time"]
            assert isinstance(g.text, str) and g.text == g.text.strip()
            assert g.stop_time is None and g.prs is None
        else:
            assert g.stop_time == w["stop_time"]


@pytest.mark.parametrize("v", ["demo", "1b", "2b6"])
def test_events_are_the_oracles(v):
    demo = v == "demo"
    engine = mn.SttEngine() if demo else mn.SttEngine(FIXTURES / "stt" / v, threads=2)
    v = "1b" if demo else v
    plan = oracle(v)["plan"]
    assert engine.is_demo == demo
    assert (engine.prefix_frames, engine.delay_steps, engine.flush_frames) == (
        plan["prefix"],
        plan["delay_tokens"],
        plan["flush"],
    )
    assert engine.n_heads == (4 if v == "1b" else 0)
    t = engine.transcriber()
    pcm = mn.read_wav(FIXTURES / "stt" / v / "input.wav")
    for chunk in [1000, 1920, len(pcm)]:
        events = transcribe(t, pcm, chunk)
        check_oracle(events, v)
        assert t.steps == plan["frames"]
        assert any(e.type == "Word" for e in events)
        t.reset()
        assert (t.steps, t.pending_samples) == (0, 0)


def test_vad_shape_and_end_of_turn():
    t = mn.Transcriber(mn.SttEngine())
    events = transcribe(t, mn.read_wav(FIXTURES / "stt/1b/input.wav"), 1920)
    steps = [e for e in events if e.type == "Step"]
    assert len(steps) == 39
    assert all(e.prs.shape == (4,) and ((0 <= e.prs) & (e.prs <= 1)).all() for e in steps)
    eot = [i for i, e in enumerate(events) if e.type == "EndOfTurn"]
    # Kyutai's rule on the oracle's probabilities: head 2 above 0.5, once until a word or word end.
    want, armed = [], True
    for e in oracle("1b")["events"]:
        if e["type"] == "Step":
            if armed and e["prs"][2] > 0.5:
                armed = False
                want.append(e["step_idx"])
        else:
            armed = True
    assert [events[i].step_idx for i in eot] == want and len(want) == 3
    for i in eot:
        assert events[i - 1].type == "Step" and events[i - 1].step_idx == events[i].step_idx
        assert events[i].probability == events[i].prs[2] > 0.5
    quiet = mn.SttEngine().transcriber(end_of_turn_threshold=1.0)
    assert not any(e.type == "EndOfTurn" for e in transcribe(quiet, mn.read_wav(FIXTURES / "stt/1b/input.wav"), 1920))


def test_reset_and_refusals_leave_a_fresh_stream():
    engine = mn.SttEngine()
    pcm = mn.read_wav(FIXTURES / "stt/1b/input.wav")
    t = engine.transcriber()
    t.push(pcm[: len(pcm) // 2])
    assert t.pull() is not None
    t.reset()
    assert t.pull() is None
    bad = pcm[:3000].astype(np.float64)
    bad[2999] = np.nan
    with pytest.raises(ValueError, match="2999"):
        t.push(bad)
    assert t.pending_samples == 0
    check_oracle(transcribe(t, pcm, 1920), "1b")


def test_errors():
    with pytest.raises(mn.MoshiError, match="speech-to-text"):
        mn.SttEngine(FIXTURES / "lm")
    with pytest.raises(mn.MoshiError):
        mn.SttEngine(FIXTURES / "missing")
    with pytest.raises(mn.MoshiError, match="threads"):
        mn.SttEngine(threads=0)
    with pytest.raises(ValueError):
        mn.SttEngine(kv_dtype="f16")
    with pytest.raises(ValueError, match="reserve_frames"):
        mn.Transcriber(mn.SttEngine(), reserve_frames=0)
    with pytest.raises(mn.MoshiError):
        mn.Engine(FIXTURES / "stt/1b")
    with pytest.raises(TypeError):
        mn.Transcriber(mn.Engine())
