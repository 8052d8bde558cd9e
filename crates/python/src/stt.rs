//! Kyutai's speech-to-text models in Python: `SttEngine`, `Transcriber` and their `SttEvent`s, over
//! `runtime::{SttEngine, Transcriber}` (the GIL released while the model steps).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use numpy::{AllowTypeChange, PyArray1, PyArrayLike1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{err, lock, parse_kv_dtype, samples};

/// A loaded speech-to-text model (Kyutai's stt-1b-en_fr / stt-2.6b-en), shared by transcribers.
///
/// `SttEngine(path=None, threads=1, kv_dtype="f32")`: `path` is an STT bundle directory (Kyutai
/// `config.json` with `stt_config`, LM weights, Mimi weights, SentencePiece model); None opens the tiny
/// random-weight `demo-stt` model bundled in the package (its words are noise). `threads` are
/// matrix-product threads per transcriber; `kv_dtype` is "f32" or "bf16". A Moshi bundle raises
/// `MoshiError`.
#[pyclass(module = "moshi_native", frozen)]
pub(crate) struct SttEngine {
    engine: Arc<runtime::SttEngine>,
    demo: bool,
}

#[pymethods]
impl SttEngine {
    #[new]
    #[pyo3(signature = (path=None, threads=1, kv_dtype="f32"))]
    fn new(
        py: Python<'_>,
        path: Option<PathBuf>,
        threads: usize,
        kv_dtype: &str,
    ) -> PyResult<SttEngine> {
        let kv_dtype = parse_kv_dtype(kv_dtype)?;
        let demo = path.is_none();
        let engine = py.allow_threads(|| {
            let dir = match path {
                Some(p) => p,
                None => embed::demo_stt::materialize().map_err(err)?,
            };
            let opts = runtime::EngineOptions {
                device: runtime::Device::Cpu { threads },
                kv_dtype,
            };
            runtime::SttEngine::open(&dir, opts).map_err(err)
        })?;
        Ok(SttEngine { engine, demo })
    }

    /// True for the bundled random-weight demo model.
    #[getter]
    fn is_demo(&self) -> bool {
        self.demo
    }

    /// Voice-activity heads (4 for stt-1b, 0 for stt-2.6b): the length of a step's `prs`.
    #[getter]
    fn n_heads(&self) -> usize {
        self.engine.n_heads()
    }

    /// The text's delay behind the audio, in 80 ms steps (6 for stt-1b, 31 for stt-2.6b).
    #[getter]
    fn delay_steps(&self) -> usize {
        self.engine.plan().delay_tokens
    }

    /// Frames of silence fed before the audio (0 for stt-1b, 13 for stt-2.6b).
    #[getter]
    fn prefix_frames(&self) -> usize {
        self.engine.plan().prefix_frames
    }

    /// Frames of silence `Transcriber.flush` queues (the delay + 1 s).
    #[getter]
    fn flush_frames(&self) -> usize {
        self.engine.plan().flush_frames
    }

    /// A new transcriber on this engine (same keyword arguments as `Transcriber`).
    #[pyo3(signature = (**options))]
    fn transcriber<'py>(
        slf: Bound<'py, Self>,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, Transcriber>> {
        let cls = slf.py().get_type::<Transcriber>();
        Ok(cls.call((slf,), options)?.downcast_into::<Transcriber>()?)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.engine)
    }
}

/// One event of a transcriber. `type` is "Step", "EndOfTurn", "Word" or "EndWord" (Kyutai's server
/// names, plus the end of turn); the fields a type does not use are None.
#[pyclass(module = "moshi_native", frozen, get_all)]
pub(crate) struct SttEvent {
    /// "Step", "EndOfTurn", "Word" or "EndWord".
    r#type: &'static str,
    /// The model step that produced it, from 1 since the start of the stream (the silence prefix counts).
    step_idx: usize,
    /// Word: its text (surrounding spaces trimmed).
    text: Option<String>,
    /// Word: its SentencePiece token ids.
    tokens: Option<Vec<u32>>,
    /// Word: its start, seconds from the first audio sample.
    start_time: Option<f64>,
    /// EndWord: the stop time, seconds from the first audio sample.
    stop_time: Option<f64>,
    /// Step and EndOfTurn: each voice-activity head's no-voice probability (float32, `n_heads`).
    prs: Option<Py<PyArray1<f32>>>,
    /// EndOfTurn: the end-of-turn head's probability.
    probability: Option<f32>,
}

#[pymethods]
impl SttEvent {
    fn __repr__(&self) -> String {
        match self.r#type {
            "Word" => format!(
                "SttEvent(Word, step_idx={}, text={:?}, start_time={})",
                self.step_idx,
                self.text.as_deref().unwrap_or(""),
                self.start_time.unwrap_or(0.0)
            ),
            "EndWord" => format!(
                "SttEvent(EndWord, step_idx={}, stop_time={})",
                self.step_idx,
                self.stop_time.unwrap_or(0.0)
            ),
            "EndOfTurn" => format!(
                "SttEvent(EndOfTurn, step_idx={}, probability={})",
                self.step_idx,
                self.probability.unwrap_or(0.0)
            ),
            t => format!("SttEvent({t}, step_idx={})", self.step_idx),
        }
    }
}

/// An event copied out of the transcriber while the GIL is released.
enum OwnedSttEvent {
    Step(usize, Vec<f32>),
    EndOfTurn(usize, f32, Vec<f32>),
    Word(usize, String, Vec<u32>, f64),
    EndWord(usize, f64),
}

impl OwnedSttEvent {
    fn of(e: runtime::TranscriptEvent<'_>) -> OwnedSttEvent {
        use runtime::TranscriptEvent as E;
        match e {
            E::Step { step_idx, prs } => OwnedSttEvent::Step(step_idx, prs.to_vec()),
            E::EndOfTurn {
                step_idx,
                probability,
                prs,
            } => OwnedSttEvent::EndOfTurn(step_idx, probability, prs.to_vec()),
            E::Word {
                step_idx,
                text,
                tokens,
                start_time,
            } => OwnedSttEvent::Word(step_idx, text.to_string(), tokens.to_vec(), start_time),
            E::EndWord {
                step_idx,
                stop_time,
            } => OwnedSttEvent::EndWord(step_idx, stop_time),
        }
    }

    fn into_py(self, py: Python<'_>) -> SttEvent {
        let mut e = SttEvent {
            r#type: "Step",
            step_idx: 0,
            text: None,
            tokens: None,
            start_time: None,
            stop_time: None,
            prs: None,
            probability: None,
        };
        match self {
            OwnedSttEvent::Step(i, prs) => {
                e.step_idx = i;
                e.prs = Some(PyArray1::from_vec(py, prs).unbind());
            }
            OwnedSttEvent::EndOfTurn(i, p, prs) => {
                e.r#type = "EndOfTurn";
                e.step_idx = i;
                e.probability = Some(p);
                e.prs = Some(PyArray1::from_vec(py, prs).unbind());
            }
            OwnedSttEvent::Word(i, text, tokens, start) => {
                e.r#type = "Word";
                e.step_idx = i;
                e.text = Some(text);
                e.tokens = Some(tokens);
                e.start_time = Some(start);
            }
            OwnedSttEvent::EndWord(i, stop) => {
                e.r#type = "EndWord";
                e.step_idx = i;
                e.stop_time = Some(stop);
            }
        }
        e
    }
}

/// One speech-to-text stream, driven by the caller: `push` PCM (queued, never dropped), `pull` events
/// (the model steps in `pull`), `flush` at the end of the audio, `reset` for a new stream.
///
/// `Transcriber(engine, *, end_of_turn_head=2, end_of_turn_threshold=0.5, reserve_frames=64)`: an
/// "EndOfTurn" event follows the step at which that voice-activity head's probability first exceeds the
/// threshold after a word (Kyutai's rule); `reserve_frames` of input are allocated up front.
#[pyclass(module = "moshi_native", frozen)]
pub(crate) struct Transcriber {
    transcriber: Mutex<runtime::Transcriber>,
}

impl Transcriber {
    /// Every event ready now (the GIL released while the model steps).
    fn drain(&self, py: Python<'_>) -> PyResult<Vec<SttEvent>> {
        let mut guard = lock(&self.transcriber)?;
        let t: &mut runtime::Transcriber = &mut guard;
        let events = py.allow_threads(|| {
            let mut out = Vec::new();
            while let Some(e) = t.pull()? {
                out.push(OwnedSttEvent::of(e));
            }
            Ok::<_, runtime::RuntimeError>(out)
        });
        Ok(events
            .map_err(err)?
            .into_iter()
            .map(|e| e.into_py(py))
            .collect())
    }
}

#[pymethods]
impl Transcriber {
    #[new]
    #[pyo3(signature = (engine, *, end_of_turn_head=2, end_of_turn_threshold=0.5, reserve_frames=64))]
    fn new(
        engine: &SttEngine,
        end_of_turn_head: usize,
        end_of_turn_threshold: f32,
        reserve_frames: usize,
    ) -> PyResult<Transcriber> {
        let opts = runtime::TranscriberOptions {
            end_of_turn_head,
            end_of_turn_threshold,
            reserve_frames,
        };
        let t = runtime::Transcriber::new(engine.engine.clone(), opts).map_err(|e| match e {
            runtime::RuntimeError::InvalidOption(m) => PyValueError::new_err(m),
            other => err(other),
        })?;
        Ok(Transcriber {
            transcriber: Mutex::new(t),
        })
    }

    /// Queues 24 kHz mono PCM (any length, any numeric dtype); computes nothing. A NaN or infinite
    /// sample raises ValueError and queues nothing.
    fn push(&self, pcm: PyArrayLike1<'_, f32, AllowTypeChange>) -> PyResult<()> {
        let pcm = samples(&pcm);
        lock(&self.transcriber)?
            .push(&pcm)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The next event, running a model step when none waits and a whole frame is queued; None when
    /// less than a frame is queued.
    fn pull(&self, py: Python<'_>) -> PyResult<Option<SttEvent>> {
        let mut guard = lock(&self.transcriber)?;
        let t: &mut runtime::Transcriber = &mut guard;
        let e = py.allow_threads(|| t.pull().map(|e| e.map(OwnedSttEvent::of)));
        Ok(e.map_err(err)?.map(|e| e.into_py(py)))
    }

    /// Every event ready now (pulls until None).
    fn events(&self, py: Python<'_>) -> PyResult<Vec<SttEvent>> {
        self.drain(py)
    }

    /// Pushes `pcm` and returns every event ready after it.
    fn process(
        &self,
        py: Python<'_>,
        pcm: PyArrayLike1<'_, f32, AllowTypeChange>,
    ) -> PyResult<Vec<SttEvent>> {
        self.push(pcm)?;
        self.drain(py)
    }

    /// The end of the audio: queues zeros up to a whole frame, then the delay + 1 s of silence, and
    /// returns every event that brings out (the last words). The stream goes on afterwards.
    fn flush(&self, py: Python<'_>) -> PyResult<Vec<SttEvent>> {
        lock(&self.transcriber)?.flush();
        self.drain(py)
    }

    /// Starts a new stream: queued input and events are dropped.
    fn reset(&self) -> PyResult<()> {
        lock(&self.transcriber)?.reset();
        Ok(())
    }

    /// Steps run since the start of the stream (silence prefix and flush included).
    #[getter]
    fn steps(&self) -> PyResult<usize> {
        Ok(lock(&self.transcriber)?.steps())
    }

    /// Samples queued and not yet stepped.
    #[getter]
    fn pending_samples(&self) -> PyResult<usize> {
        Ok(lock(&self.transcriber)?.pending_samples())
    }
}
