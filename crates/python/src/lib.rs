//! Python bindings of moshi-native: the module `moshi_native`.
//!
//! A thin layer over the runtime's public API (`runtime::{Engine, Session}` and, for Kyutai's
//! speech-to-text models, `runtime::{SttEngine, Transcriber}`), the streaming Mimi codec
//! (`model::mimi`) and `embed` (demo model, opening Mimi alone, describing checkpoints). Compute runs with
//! the GIL released; PCM and codes cross as numpy arrays (outputs are built from owned vectors, no copy).
//! The Python-facing documentation is in the docstrings and `moshi_native.pyi`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use kernels::attention::KvDtype;
use kernels::Pool;
use model::mimi::{MimiDecoder, MimiEncoder};
use numpy::{AllowTypeChange, PyArray1, PyArray2, PyArrayLike1, PyArrayLike2, PyArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod stt;

create_exception!(
    moshi_native,
    MoshiError,
    PyException,
    "A model file was refused, or the engine failed while computing."
);

create_exception!(
    moshi_native,
    DeviceError,
    MoshiError,
    "The compute device failed: a GPU that cannot be opened, or a GPU error while computing a frame."
);

/// The exception of a library error: a runtime error of the compute device (`RuntimeError::is_device`,
/// opening it or inside a frame) is `DeviceError`, any other error `MoshiError`; a runtime error's
/// message holds its causes (`RuntimeError::message`).
fn err<E: std::fmt::Display + 'static>(e: E) -> PyErr {
    match (&e as &dyn std::any::Any).downcast_ref::<runtime::RuntimeError>() {
        Some(r) if r.is_device() => DeviceError::new_err(r.message()),
        Some(r) => MoshiError::new_err(r.message()),
        None => MoshiError::new_err(e.to_string()),
    }
}

/// Locks an object's state; a second thread inside the same object is an error, never a wait (the
/// first thread runs without the GIL and would need it back to finish).
fn lock<T>(m: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    m.try_lock()
        .map_err(|_| PyRuntimeError::new_err("the object is in use by another thread"))
}

/// f32 samples of a 1-D array-like (converted from any numeric dtype), copied only when not contiguous.
fn samples<'a>(a: &'a PyArrayLike1<'_, f32, AllowTypeChange>) -> std::borrow::Cow<'a, [f32]> {
    match a.as_slice() {
        Ok(s) => s.into(),
        Err(_) => a.as_array().to_vec().into(),
    }
}

/// `device=`: "cpu", "gpu" (the best adapter, software ones included) or "gpu:N" (adapter N as
/// `moshi-native devices` numbers them), with `threads` per session.
fn parse_device(s: &str, threads: usize) -> PyResult<runtime::Device> {
    let bad = || {
        PyValueError::new_err(format!(
            "device {s:?}: expected \"cpu\", \"gpu\" or \"gpu:N\" (an adapter index)"
        ))
    };
    match s {
        "cpu" => Ok(runtime::Device::Cpu { threads }),
        "gpu" => Ok(runtime::Device::Gpu {
            adapter: None,
            threads,
        }),
        _ => {
            let n = s.strip_prefix("gpu:").ok_or_else(bad)?;
            let adapter = n.parse::<usize>().map_err(|_| bad())?;
            Ok(runtime::Device::Gpu {
                adapter: Some(adapter),
                threads,
            })
        }
    }
}

/// "f32" or "bf16".
fn parse_kv_dtype(s: &str) -> PyResult<KvDtype> {
    match s {
        "f32" => Ok(KvDtype::F32),
        "bf16" => Ok(KvDtype::Bf16),
        other => Err(PyValueError::new_err(format!(
            "kv_dtype {other:?}: expected \"f32\" or \"bf16\""
        ))),
    }
}

/// The Mimi neural audio codec: 24 kHz mono PCM <-> 8 codes (of 2048) per 80 ms frame.
///
/// `Mimi(path, config=None, codebooks=8, threads=1)`: `path` is a bundle directory or a Mimi weights
/// file (Kyutai or Hugging Face `transformers` tensor names); `config` is a Mimi config JSON (default:
/// the directory's `mimi_config_name`, else the released Mimi dimensions).
#[pyclass(module = "moshi_native")]
struct Mimi {
    codec: Arc<model::mimi::Mimi>,
    threads: usize,
    stream: Mutex<MimiStream>,
}

struct MimiStream {
    encoder: MimiEncoder,
    decoder: MimiDecoder,
    pool: Option<Pool>,
}

impl MimiStream {
    fn new(codec: &Arc<model::mimi::Mimi>, threads: usize) -> MimiStream {
        MimiStream {
            encoder: MimiEncoder::new(codec.clone()),
            decoder: MimiDecoder::new(codec.clone()),
            pool: (threads > 1).then(|| Pool::new(threads)),
        }
    }
}

impl Mimi {
    fn check_frame(&self, n: usize) -> PyResult<()> {
        let fs = self.codec.frame_size();
        if n == fs {
            Ok(())
        } else {
            Err(PyValueError::new_err(format!(
                "one frame is {fs} samples, got {n}"
            )))
        }
    }

    fn frame_codes(&self, codes: &[i64]) -> PyResult<Vec<u32>> {
        let (nq, card) = (self.codec.n_codebooks(), self.codec.cardinality());
        if codes.len() != nq {
            return Err(PyValueError::new_err(format!(
                "one frame has {nq} codes, got {}",
                codes.len()
            )));
        }
        codes
            .iter()
            .map(|&c| {
                u32::try_from(c)
                    .ok()
                    .filter(|&c| (c as usize) < card)
                    .ok_or_else(|| PyValueError::new_err(format!("code {c} is not in 0..{card}")))
            })
            .collect()
    }
}

#[pymethods]
impl Mimi {
    #[new]
    #[pyo3(signature = (path, config=None, codebooks=8, threads=1))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        config: Option<PathBuf>,
        codebooks: usize,
        threads: usize,
    ) -> PyResult<Mimi> {
        if codebooks == 0 || threads == 0 {
            return Err(PyValueError::new_err("codebooks and threads must be >= 1"));
        }
        let codec = py
            .allow_threads(|| embed::open_mimi(&path, config.as_deref(), codebooks))
            .map_err(err)?;
        Ok(Mimi {
            stream: Mutex::new(MimiStream::new(&codec, threads)),
            codec,
            threads,
        })
    }

    /// Samples per frame (1920: 80 ms at 24 kHz).
    #[getter]
    fn frame_size(&self) -> usize {
        self.codec.frame_size()
    }

    /// Codes per frame.
    #[getter]
    fn codebooks(&self) -> usize {
        self.codec.n_codebooks()
    }

    /// Sample rate of the PCM (24000).
    #[getter]
    fn sample_rate(&self) -> u32 {
        runtime::SAMPLE_RATE
    }

    /// Encodes a whole signal from a fresh stream (independent of the `*_step` state): float32 PCM
    /// `[n]` -> int64 codes `[codebooks, ceil(n / frame_size)]` (the tail is zero-padded to a frame).
    fn encode<'py>(
        &self,
        py: Python<'py>,
        pcm: PyArrayLike1<'py, f32, AllowTypeChange>,
    ) -> PyResult<Bound<'py, PyArray2<i64>>> {
        let pcm = samples(&pcm);
        let (fs, nq) = (self.codec.frame_size(), self.codec.n_codebooks());
        let t = pcm.len().div_ceil(fs);
        let codes = py.allow_threads(|| {
            let mut s = MimiStream::new(&self.codec, self.threads);
            let mut codes = vec![0i64; nq * t];
            let mut frame = vec![0f32; fs];
            for f in 0..t {
                let chunk = &pcm[f * fs..pcm.len().min((f + 1) * fs)];
                frame[..chunk.len()].copy_from_slice(chunk);
                frame[chunk.len()..].fill(0.0);
                let c = s.encoder.encode_frame_with(&frame, s.pool.as_ref(), None)?;
                for (q, &code) in c.iter().enumerate() {
                    codes[q * t + f] = i64::from(code);
                }
            }
            Ok::<_, model::mimi::MimiError>(codes)
        });
        PyArray1::from_vec(py, codes.map_err(err)?).reshape([nq, t])
    }

    /// Decodes codes `[codebooks, T]` (any integer dtype) from a fresh stream: float32 PCM `[T * frame_size]`.
    fn decode<'py>(
        &self,
        py: Python<'py>,
        codes: PyArrayLike2<'py, i64, AllowTypeChange>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let view = codes.as_array();
        let (nq, t) = view.dim();
        if nq != self.codec.n_codebooks() {
            return Err(PyValueError::new_err(format!(
                "codes have {nq} rows; this Mimi has {} codebooks",
                self.codec.n_codebooks()
            )));
        }
        let frames: Vec<Vec<u32>> = (0..t)
            .map(|f| self.frame_codes(&view.column(f).to_vec()))
            .collect::<PyResult<_>>()?;
        let fs = self.codec.frame_size();
        let pcm = py.allow_threads(|| {
            let mut s = MimiStream::new(&self.codec, self.threads);
            let mut pcm = vec![0f32; t * fs];
            for (f, c) in frames.iter().enumerate() {
                let out = &mut pcm[f * fs..(f + 1) * fs];
                s.decoder.decode_frame_with(c, out, s.pool.as_ref(), None)?;
            }
            Ok::<_, model::mimi::MimiError>(pcm)
        });
        Ok(PyArray1::from_vec(py, pcm.map_err(err)?))
    }

    /// Streaming encode of one frame (exactly `frame_size` samples) -> int64 codes `[codebooks]`.
    fn encode_step<'py>(
        &self,
        py: Python<'py>,
        pcm: PyArrayLike1<'py, f32, AllowTypeChange>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let pcm = samples(&pcm);
        self.check_frame(pcm.len())?;
        let mut guard = lock(&self.stream)?;
        let s: &mut MimiStream = &mut guard;
        let codes = py.allow_threads(|| {
            s.encoder
                .encode_frame_with(&pcm, s.pool.as_ref(), None)
                .map(|c| c.iter().map(|&x| i64::from(x)).collect::<Vec<_>>())
        });
        Ok(PyArray1::from_vec(py, codes.map_err(err)?))
    }

    /// Streaming decode of one frame's codes `[codebooks]` -> float32 PCM `[frame_size]`.
    fn decode_step<'py>(
        &self,
        py: Python<'py>,
        codes: PyArrayLike1<'py, i64, AllowTypeChange>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let codes = self.frame_codes(&codes.as_array().to_vec())?;
        let mut guard = lock(&self.stream)?;
        let s: &mut MimiStream = &mut guard;
        let fs = self.codec.frame_size();
        let pcm = py.allow_threads(|| {
            let mut out = vec![0f32; fs];
            s.decoder
                .decode_frame_with(&codes, &mut out, s.pool.as_ref(), None)
                .map(|()| out)
        });
        Ok(PyArray1::from_vec(py, pcm.map_err(err)?))
    }

    /// Forgets the streaming state of `encode_step` and `decode_step`.
    fn reset(&self) -> PyResult<()> {
        let mut s = lock(&self.stream)?;
        s.encoder.reset();
        s.decoder.reset();
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "Mimi(frame_size={}, codebooks={}, threads={})",
            self.codec.frame_size(),
            self.codec.n_codebooks(),
            self.threads
        )
    }
}

/// A loaded Moshi model (LM + Mimi + tokenizer), shared by sessions.
///
/// `Engine(path=None, threads=1, kv_dtype="f32", device="cpu")`: `path` is a bundle directory (Kyutai
/// `config.json`, LM weights, Mimi weights, SentencePiece model); None opens the tiny random-weight demo
/// model bundled in the package (it proves the pipeline; it does not speak). `threads` are matrix-product
/// threads per session; `kv_dtype` is "f32" or "bf16"; `device` is "cpu", "gpu" (the LM and Mimi on the
/// best GPU adapter through wgpu, software ones included) or "gpu:N" (adapter N as `moshi-native devices`
/// lists them); a GPU that cannot be opened raises `DeviceError` (a `MoshiError`), as does a GPU failure
/// while computing a frame.
#[pyclass(module = "moshi_native", frozen)]
struct Engine {
    engine: Arc<runtime::Engine>,
    demo: bool,
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (path=None, threads=1, kv_dtype="f32", device="cpu"))]
    fn new(
        py: Python<'_>,
        path: Option<PathBuf>,
        threads: usize,
        kv_dtype: &str,
        device: &str,
    ) -> PyResult<Engine> {
        let kv_dtype = parse_kv_dtype(kv_dtype)?;
        let device = parse_device(device, threads)?;
        let demo = path.is_none();
        let engine = py.allow_threads(|| {
            let dir = match path {
                Some(p) => p,
                None => embed::demo::materialize().map_err(err)?,
            };
            let opts = runtime::EngineOptions { device, kv_dtype };
            runtime::Engine::open(&dir, opts).map_err(err)
        })?;
        Ok(Engine { engine, demo })
    }

    /// True for the bundled random-weight demo model.
    #[getter]
    fn is_demo(&self) -> bool {
        self.demo
    }

    /// Where the sessions compute: "cpu" or "gpu".
    #[getter]
    fn device(&self) -> &'static str {
        match self.engine.gpu_adapter() {
            Some(_) => "gpu",
            None => "cpu",
        }
    }

    /// The GPU adapter the model runs on (its name, type and backend), or None on the CPU.
    #[getter]
    fn gpu_adapter(&self) -> Option<String> {
        self.engine.gpu_adapter()
    }

    /// A new session on this engine (same keyword arguments as `Session`).
    #[pyo3(signature = (**options))]
    fn session<'py>(
        slf: Bound<'py, Self>,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, Session>> {
        let cls = slf.py().get_type::<Session>();
        Ok(cls.call((slf,), options)?.downcast_into::<Session>()?)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.engine)
    }
}

/// One full-duplex conversation, driven by the caller: `push` input PCM, `pull` output frames.
///
/// `Session(engine, *, greedy=False, seed=42424242, text_temperature=0.7, text_top_k=25,
/// audio_temperature=0.8, audio_top_k=250, output_rate=24000, max_queued_frames=4, max_steps=None,
/// first_frame_reset=True, pad_mult=None, repetition_penalty=None, repetition_penalty_context=64)`.
/// Sampling defaults are Kyutai's `LMGen` defaults.
#[pyclass(module = "moshi_native", frozen)]
struct Session {
    control: runtime::SessionControl,
    session: Mutex<runtime::Session>,
    /// A pull saw the stream end (`max_steps`).
    ended: AtomicBool,
}

/// One output frame (80 ms of the model).
#[pyclass(module = "moshi_native", frozen, get_all)]
struct Frame {
    /// LM step index within the stream (0 after creation or reset).
    frame_index: u64,
    /// Epoch of the output (incremented by `interrupt` and `reset`).
    epoch: u64,
    /// Text token of this step (None at step 0).
    text_token: Option<u32>,
    /// Audio tokens (8 codebooks) of this step, int64, or None at step 0.
    audio_tokens: Option<Py<PyArray1<i64>>>,
    /// Text decoded this step ("" for none).
    text: String,
    /// Output PCM (float32, at the session's output rate; empty at step 0).
    pcm: Py<PyArray1<f32>>,
}

#[pymethods]
impl Frame {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Frame(frame_index={}, epoch={}, text_token={}, text={:?}, pcm=<{} samples>)",
            self.frame_index,
            self.epoch,
            self.text_token
                .map_or_else(|| "None".to_string(), |t| t.to_string()),
            self.text,
            self.pcm.bind(py).len().unwrap_or(0)
        )
    }
}

/// What the session did with one `push`.
#[pyclass(module = "moshi_native", frozen, get_all)]
struct PushReport {
    /// Whole frames this push completed (and queued).
    frames_completed: u32,
    /// Queued frames dropped (oldest first) because the queue was full.
    frames_dropped: u32,
    /// Frames waiting after this push.
    queued: usize,
}

/// Frame data copied out of the session while the GIL is released.
struct OwnedFrame {
    frame_index: u64,
    epoch: u64,
    text_token: Option<u32>,
    audio_tokens: Option<[u32; runtime::N_AUDIO]>,
    text: String,
    pcm: Vec<f32>,
}

#[pymethods]
impl Session {
    #[new]
    // The sampling defaults are embed::SamplingParams::default()'s (Kyutai's LMGen defaults), as the
    // CLI's flags: written once, in model::sampling.
    #[pyo3(signature = (engine, *, greedy=false, seed=model::sampling::DEFAULT_SEED,
        text_temperature=embed::SamplingParams::default().text_temperature,
        text_top_k=embed::SamplingParams::default().text_top_k,
        audio_temperature=embed::SamplingParams::default().audio_temperature,
        audio_top_k=embed::SamplingParams::default().audio_top_k, output_rate=24000, max_queued_frames=4,
        max_steps=None, first_frame_reset=true, pad_mult=None, repetition_penalty=None,
        repetition_penalty_context=embed::SamplingParams::default().repetition_penalty_context))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        engine: &Engine,
        greedy: bool,
        seed: u64,
        text_temperature: f32,
        text_top_k: usize,
        audio_temperature: f32,
        audio_top_k: usize,
        output_rate: u32,
        max_queued_frames: usize,
        max_steps: Option<u64>,
        first_frame_reset: bool,
        pad_mult: Option<f32>,
        repetition_penalty: Option<f32>,
        repetition_penalty_context: usize,
    ) -> PyResult<Session> {
        let sampling = embed::SamplingParams {
            greedy,
            seed,
            text_temperature,
            text_top_k,
            audio_temperature,
            audio_top_k,
            pad_mult,
            repetition_penalty,
            repetition_penalty_context,
        };
        let opts = runtime::SessionOptions {
            sampling: sampling.config(),
            max_queued_frames,
            output_rate,
            max_steps,
            first_frame_reset,
        };
        let e = engine.engine.clone();
        let session = py
            .allow_threads(|| runtime::Session::new(e, opts))
            .map_err(|e| match e {
                runtime::RuntimeError::InvalidOption(m) => PyValueError::new_err(m),
                other => err(other),
            })?;
        Ok(Session {
            control: session.control(),
            session: Mutex::new(session),
            ended: AtomicBool::new(false),
        })
    }

    /// Queues 24 kHz mono PCM (any length, any numeric dtype; cut into 1920-sample frames). Never blocks.
    fn push(&self, pcm: PyArrayLike1<'_, f32, AllowTypeChange>) -> PyResult<PushReport> {
        let pcm = samples(&pcm);
        let r = lock(&self.session)?.push_pcm(&pcm).map_err(err)?;
        Ok(PushReport {
            frames_completed: r.frames_completed,
            frames_dropped: r.frames_dropped,
            queued: r.queued,
        })
    }

    /// Runs one frame pass if a whole input frame is queued and returns its `Frame`; None when no frame
    /// is queued, the session is paused or it has stopped (see `paused`, `stopped`).
    fn pull(&self, py: Python<'_>) -> PyResult<Option<Frame>> {
        let mut guard = lock(&self.session)?;
        let s: &mut runtime::Session = &mut guard;
        let ended = &self.ended;
        let out = py.allow_threads(|| {
            Ok::<_, runtime::RuntimeError>(match s.step()? {
                runtime::Step::Frame(f) => Some(OwnedFrame {
                    frame_index: f.frame_index,
                    epoch: f.epoch,
                    text_token: f.text_token,
                    audio_tokens: f.audio_tokens,
                    text: f.text.to_string(),
                    pcm: f.pcm.to_vec(),
                }),
                runtime::Step::Stopped(_) => {
                    ended.store(true, Ordering::Relaxed);
                    None
                }
                runtime::Step::Idle | runtime::Step::Paused => None,
            })
        });
        Ok(out.map_err(err)?.map(|f| Frame {
            frame_index: f.frame_index,
            epoch: f.epoch,
            text_token: f.text_token,
            audio_tokens: f.audio_tokens.map(|a| {
                PyArray1::from_vec(py, a.iter().map(|&x| i64::from(x)).collect()).unbind()
            }),
            text: f.text,
            pcm: PyArray1::from_vec(py, f.pcm).unbind(),
        }))
    }

    /// Pushes `pcm` (any length) one frame at a time, pulling every frame each push completes, so
    /// that nothing is dropped however long `pcm` is; returns the frames.
    fn process(
        &self,
        py: Python<'_>,
        pcm: PyArrayLike1<'_, f32, AllowTypeChange>,
    ) -> PyResult<Vec<Frame>> {
        let pcm = samples(&pcm);
        let mut frames = Vec::new();
        for chunk in pcm.chunks(runtime::FRAME_SIZE) {
            lock(&self.session)?.push_pcm(chunk).map_err(err)?;
            while let Some(f) = self.pull(py)? {
                frames.push(f);
            }
        }
        Ok(frames)
    }

    /// Soft interrupt: output of the current epoch is dropped, the model state continues. Returns the new
    /// epoch. Safe from any thread, also while another thread is in `pull`.
    fn interrupt(&self) -> u64 {
        self.control.interrupt()
    }

    /// Pauses: `pull` returns None and computes nothing; pushed input queues up (bounded).
    fn pause(&self) {
        self.control.pause()
    }

    /// Resumes after `pause` (the same stream continues).
    fn resume(&self) {
        self.control.resume()
    }

    /// Starts a new stream (as if freshly created from the next `pull`); input pushed before is discarded.
    /// Returns the new epoch.
    fn reset(&self) -> u64 {
        self.control.reset()
    }

    /// Stops for good: `pull` returns None from now on.
    fn stop(&self) {
        self.control.stop()
    }

    /// True while paused.
    #[getter]
    fn paused(&self) -> bool {
        self.control.is_paused()
    }

    /// True once `stop` was called or a `pull` found `max_steps` reached.
    #[getter]
    fn stopped(&self) -> bool {
        self.control.is_stop_requested() || self.ended.load(Ordering::Relaxed)
    }

    /// LM step index of the next frame.
    #[getter]
    fn frame_index(&self) -> PyResult<u64> {
        Ok(lock(&self.session)?.frame_index())
    }

    /// Counters: frames_in, frames_dropped, frames_discarded, frames_processed, queued, epoch.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = lock(&self.session)?.counters();
        let d = PyDict::new(py);
        d.set_item("frames_in", c.frames_in)?;
        d.set_item("frames_dropped", c.frames_dropped)?;
        d.set_item("frames_discarded", c.frames_discarded)?;
        d.set_item("frames_processed", c.frames_processed)?;
        d.set_item("queued", c.queued)?;
        d.set_item("epoch", c.epoch)?;
        Ok(d)
    }
}

/// Describes a weights file or a bundle directory (format, layout, variant, tensors, sizes; a bundle's
/// LM and Mimi dimensions) as a dict. Raises `MoshiError` for files the engine would refuse.
#[pyfunction]
fn inspect<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
    let json = py
        .allow_threads(|| embed::describe(&path))
        .map_err(err)?
        .to_string();
    py.import("json")?.call_method1("loads", (json,))
}

/// Reads a WAV file (8/16/24/32-bit PCM or float, any rate, any channels) as 24 kHz mono float32.
#[pyfunction]
fn read_wav<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let audio = py
        .allow_threads(|| runtime::audio::read_wav(&path))
        .map_err(err)?;
    Ok(PyArray1::from_vec(py, audio.samples))
}

/// Writes mono float32 PCM as a 32-bit float WAV file.
#[pyfunction]
#[pyo3(signature = (path, pcm, sample_rate=24000))]
fn write_wav(
    path: PathBuf,
    pcm: PyArrayLike1<'_, f32, AllowTypeChange>,
    sample_rate: u32,
) -> PyResult<()> {
    let pcm = samples(&pcm);
    runtime::audio::write_wav_mono(&path, &pcm, sample_rate, runtime::audio::WavFormat::F32)
        .map_err(err)
}

/// moshi-native: Kyutai's Moshi (full-duplex speech LM), Mimi (neural audio codec) and speech-to-text models, in Rust.
#[pymodule(name = "moshi_native")]
fn moshi_native_py(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("SAMPLE_RATE", runtime::SAMPLE_RATE)?;
    m.add("FRAME_SIZE", runtime::FRAME_SIZE)?;
    m.add("MoshiError", m.py().get_type::<MoshiError>())?;
    m.add("DeviceError", m.py().get_type::<DeviceError>())?;
    m.add_class::<Mimi>()?;
    m.add_class::<Engine>()?;
    m.add_class::<Session>()?;
    m.add_class::<Frame>()?;
    m.add_class::<PushReport>()?;
    m.add_class::<stt::SttEngine>()?;
    m.add_class::<stt::Transcriber>()?;
    m.add_class::<stt::SttEvent>()?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    m.add_function(wrap_pyfunction!(read_wav, m)?)?;
    m.add_function(wrap_pyfunction!(write_wav, m)?)?;
    Ok(())
}
