//! Mimi, Kyutai's streaming neural audio codec (parity reference: `moshi` 0.2.13).
//!
//! [`Mimi`] holds the immutable weights; [`MimiEncoder`] and [`MimiDecoder`] hold the
//! streaming state (all buffers preallocated), so one model can serve several streams.
//! `encode_frame` / `decode_frame` allocate nothing. [`Mimi::encode`] / [`Mimi::decode`]
//! reproduce PyTorch's non-streaming path (attention mask without the ring limit), and
//! [`StreamEncoder`] accepts PCM chunks of any length. [`MimiBatchEncoder`] /
//! [`MimiBatchDecoder`] run several independent streams per call (a server's conversation
//! slots) with every weight read once for all of them; a stream's codes and samples are those
//! it gets alone (see `conv.rs` for why the kernels allow it).
//!
//! Pipeline (architecture reference §1.8): SEANet encoder → encoder transformer → learnt
//! stride-2 downsample (replicate padding) → split RVQ; decode: RVQ decode → depthwise
//! transposed-conv upsample → decoder transformer → SEANet decoder.

mod backend;
mod conv;
mod export;
mod load;
mod names;
mod plan;
mod quantizer;
mod seanet;
mod source;
mod stream;
mod transformer;
mod walk;

pub use backend::{CodecBackend, CpuMimi};
pub use export::{
    ConvTrWeights, ConvWeights, ResBlockWeights, RvqWeights, TransformerLayerWeights,
    TransformerWeights,
};
pub use load::{F32Tensor, Layout, MimiTensors};
pub use names::{codebook_tensors, layer_prefix, rvq_prefix, tensor_names, LAYER_TENSORS};
#[cfg(any(test, feature = "testing"))]
pub use plan::broken_plans;
pub use plan::{ConvAt, ConvTrAt, Flow, MimiPlan, ResAt, Side, Step};
pub use source::MimiSource;
pub use stream::StreamEncoder;

use crate::checkpoint::MimiConfig;
use conv::{Conv1d, ConvTr1d};
pub use kernels::Pool;
use quantizer::SplitRvq;
use seanet::{SeanetDecoder, SeanetEncoder};
use std::sync::Arc;
use transformer::Transformer;
use walk::SideState;

/// Errors of the Mimi codec.
#[derive(Debug, thiserror::Error)]
pub enum MimiError {
    /// A configuration value is missing, inconsistent or unsupported.
    #[error("mimi config: {0}")]
    Config(String),
    /// A tensor the model needs is absent from the checkpoint.
    #[error("mimi checkpoint: missing tensor `{0}`")]
    Missing(String),
    /// A tensor has an unexpected shape.
    #[error("mimi checkpoint: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape {
        /// Tensor name (as stored).
        name: String,
        /// Expected shape.
        expected: Vec<usize>,
        /// Shape found.
        found: Vec<usize>,
    },
    /// A checkpoint could not be read.
    #[error("mimi checkpoint: {0}")]
    Checkpoint(String),
    /// Input of the wrong length or content.
    #[error("mimi input: {0}")]
    Input(String),
    /// A device backend failed (the GPU's error, kept whole and boxed, as [`crate::lm::LmError::Backend`]).
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
    /// A weight tensor holds NaN or infinite values (refused at load: they would turn every
    /// frame's output into NaN).
    #[error("mimi checkpoint: `{name}` holds a non-finite value (NaN or infinity)")]
    NonFinite {
        /// Tensor name (as stored) or the derived buffer.
        name: String,
    },
}

/// Intermediate tensors reported to a trace callback, each `[C, T]` channel-major for the
/// frames of the current call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// SEANet encoder output `[dim, 2T]` (25 Hz).
    EncSeanet,
    /// Encoder transformer output `[dim, 2T]`.
    EncTransformer,
    /// Downsampled latent entering the quantizer `[dim, T]`.
    Latent,
    /// `quantizer.decode(codes)` `[dim, T]`.
    DecLatent,
    /// After the transposed-conv upsample `[dim, 2T]`.
    DecUpsample,
    /// Decoder transformer output `[dim, 2T]`.
    DecTransformer,
}

impl Stage {
    /// Every stage, in the order a frame passes them.
    pub const ALL: [Stage; 6] = [
        Stage::EncSeanet,
        Stage::EncTransformer,
        Stage::Latent,
        Stage::DecLatent,
        Stage::DecUpsample,
        Stage::DecTransformer,
    ];

    /// The stage's tensor name in the oracle's traces (`enc_seanet`, ..., `dec_transformer`).
    pub fn name(self) -> &'static str {
        match self {
            Stage::EncSeanet => "enc_seanet",
            Stage::EncTransformer => "enc_transformer",
            Stage::Latent => "latent",
            Stage::DecLatent => "dec_latent",
            Stage::DecUpsample => "dec_upsample",
            Stage::DecTransformer => "dec_transformer",
        }
    }
}

/// Optional trace callback (costs nothing when `None`).
pub type Trace<'a> = Option<&'a mut dyn FnMut(Stage, &[f32])>;

/// Load-time choices that trade exactness for speed (defaults: exact f32 everywhere).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MimiOptions {
    /// Store the encoder/decoder transformer linears in bf16 (halves the ~200 MB of weights
    /// streamed per frame at released size). Not bit-parity with PyTorch: outputs move by
    /// ~1e-3; the parity tests run with the default (f32).
    pub bf16_transformers: bool,
}

/// The Mimi codec weights.
#[derive(Debug)]
pub struct Mimi {
    config: MimiConfig,
    encoder: SeanetEncoder,
    decoder: SeanetDecoder,
    enc_tr: Transformer,
    dec_tr: Transformer,
    down: Conv1d,
    up: ConvTr1d,
    quant: SplitRvq,
    layout: Layout,
    /// The stage list both directions walk (`plan.rs`).
    plan: MimiPlan,
}

impl Mimi {
    /// Builds the model from named tensors (Kyutai or Hugging Face names, detected), using
    /// the first `n_codebooks` codebooks (Moshi uses 8).
    pub fn from_tensors(
        src: &dyn MimiTensors,
        config: &MimiConfig,
        n_codebooks: usize,
    ) -> Result<Self, MimiError> {
        Self::from_tensors_with(src, config, n_codebooks, &MimiOptions::default())
    }

    /// [`Mimi::from_tensors`] with explicit [`MimiOptions`].
    pub fn from_tensors_with(
        src: &dyn MimiTensors,
        config: &MimiConfig,
        n_codebooks: usize,
        opts: &MimiOptions,
    ) -> Result<Self, MimiError> {
        let p = load::load_parts(src, config, n_codebooks, opts)?;
        let m = Mimi {
            config: config.clone(),
            encoder: p.encoder,
            decoder: p.decoder,
            enc_tr: p.enc_tr,
            dec_tr: p.dec_tr,
            down: p.down,
            up: p.up,
            quant: p.quant,
            layout: p.layout,
            plan: MimiPlan::new(config),
        };
        m.plan.check(&m)?;
        Ok(m)
    }

    /// The model running `plan` instead of its own (tests of what a backend runs: a plan that
    /// is not the codec must fail parity). A plan that does not fit the weights is refused
    /// ([`MimiPlan::flow`]).
    pub fn with_plan(mut self, plan: MimiPlan) -> Result<Mimi, MimiError> {
        plan.check(&self)?;
        self.plan = plan;
        Ok(self)
    }

    /// The stage list both directions walk.
    pub fn plan(&self) -> &MimiPlan {
        &self.plan
    }

    /// Builds the model from opened weights and their config.
    pub fn load(
        weights: &crate::checkpoint::Weights,
        config: &MimiConfig,
        n_codebooks: usize,
    ) -> Result<Self, MimiError> {
        Self::from_tensors(weights, config, n_codebooks)
    }

    /// The configuration in use.
    pub fn config(&self) -> &MimiConfig {
        &self.config
    }

    /// The tensor naming scheme the weights were loaded from.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Codebooks produced per frame.
    pub fn n_codebooks(&self) -> usize {
        self.quant.n_q()
    }

    /// Codebook size (2048 for the release).
    pub fn cardinality(&self) -> usize {
        self.quant.bins()
    }

    /// Samples per frame (1920 for the release).
    pub fn frame_size(&self) -> usize {
        self.config.frame_size()
    }

    /// Latent dimension (512 for the release).
    pub fn dimension(&self) -> usize {
        self.config.seanet.dimension
    }

    /// Non-streaming encode of a whole signal (PyTorch `MimiModel.encode` outside
    /// streaming): right-pads with zeros to a multiple of the frame size and returns codes
    /// `[n_codebooks, T]` row-major with T = ceil(len / frame_size) (0 for empty input).
    pub fn encode(self: &Arc<Self>, pcm: &[f32]) -> Vec<u32> {
        self.encode_pool(pcm, None)
    }

    /// [`Mimi::encode`] with the matrix products split over `pool`.
    pub fn encode_pool(self: &Arc<Self>, pcm: &[f32], pool: Option<&Pool>) -> Vec<u32> {
        let fs = self.frame_size();
        let t = pcm.len().div_ceil(fs);
        let nq = self.n_codebooks();
        let mut codes = vec![0u32; nq * t];
        if t == 0 {
            return codes;
        }
        let chunk = BATCH_FRAMES.min(t);
        let mut enc = MimiEncoder::with_chunk(self.clone(), chunk, true);
        let mut buf = vec![0.0f32; chunk * fs];
        let mut f0 = 0;
        while f0 < t {
            let n = chunk.min(t - f0);
            let src = &pcm[(f0 * fs).min(pcm.len())..((f0 + n) * fs).min(pcm.len())];
            buf[..src.len()].copy_from_slice(src);
            buf[src.len()..n * fs].fill(0.0);
            let cc = enc.core.encode_chunk(&ONE, &buf[..n * fs], n, pool, None);
            for q in 0..nq {
                codes[q * t + f0..q * t + f0 + n].copy_from_slice(&cc[q * n..q * n + n]);
            }
            f0 += n;
        }
        codes
    }

    /// Non-streaming decode of codes `[n_codebooks, T]` row-major into `T * frame_size`
    /// samples. Codes out of range are refused.
    pub fn decode(self: &Arc<Self>, codes: &[u32], t: usize) -> Result<Vec<f32>, MimiError> {
        self.decode_pool(codes, t, None)
    }

    /// [`Mimi::decode`] with the matrix products split over `pool`.
    pub fn decode_pool(
        self: &Arc<Self>,
        codes: &[u32],
        t: usize,
        pool: Option<&Pool>,
    ) -> Result<Vec<f32>, MimiError> {
        let nq = self.n_codebooks();
        if codes.len() != nq * t {
            return Err(MimiError::Input(format!(
                "expected {} codes ({nq} × {t}), got {}",
                nq * t,
                codes.len()
            )));
        }
        let fs = self.frame_size();
        let mut pcm = vec![0.0f32; t * fs];
        if t == 0 {
            return Ok(pcm);
        }
        let chunk = BATCH_FRAMES.min(t);
        let mut dec = MimiDecoder::with_chunk(self.clone(), chunk, true);
        let mut cc = vec![0u32; nq * chunk];
        let mut f0 = 0;
        while f0 < t {
            let n = chunk.min(t - f0);
            for q in 0..nq {
                cc[q * n..q * n + n].copy_from_slice(&codes[q * t + f0..q * t + f0 + n]);
            }
            dec.core.decode_chunk(
                &ONE,
                &cc[..nq * n],
                n,
                &mut pcm[f0 * fs..(f0 + n) * fs],
                pool,
                None,
            )?;
            f0 += n;
        }
        Ok(pcm)
    }
}

/// Frames per call in the non-streaming paths (bounded memory for long signals).
const BATCH_FRAMES: usize = 16;

/// The one stream of the single-stream types.
const ONE: [usize; 1] = [0];

/// Hands `x`, the output of `stage`, to the trace callback when there is one.
fn report(trace: &mut Trace<'_>, stage: Stage, x: &[f32]) {
    if let Some(f) = trace.as_mut() {
        f(stage, x);
    }
}

/// Checks a set of stream indices: distinct, each below `streams`.
fn check_active(active: &[usize], streams: usize) -> Result<(), MimiError> {
    for (j, &s) in active.iter().enumerate() {
        if s >= streams {
            return Err(MimiError::Input(format!(
                "stream {s} out of range ({streams} streams)"
            )));
        }
        if active[..j].contains(&s) {
            return Err(MimiError::Input(format!("stream {s} listed twice")));
        }
    }
    Ok(())
}

/// Checks a several-stream call (`what`): `active` as [`check_active`], and `samples` (the
/// length of its audio, in or out) `frame_size` per listed stream.
fn check_batch(
    active: &[usize],
    streams: usize,
    frame_size: usize,
    samples: usize,
    what: &str,
) -> Result<(), MimiError> {
    check_active(active, streams)?;
    let want = active.len() * frame_size;
    if samples != want {
        return Err(MimiError::Input(format!(
            "{what} needs {want} samples for {} streams, got {samples}",
            active.len()
        )));
    }
    Ok(())
}

/// One side of a set of streams: their streaming states and the buffers of one call for all of
/// them (`chunk` frames per stream at most), walking the plan's steps of that side.
#[derive(Debug)]
struct Core {
    mimi: Arc<Mimi>,
    chunk: usize,
    streams: usize,
    side: SideState,
}

impl Core {
    fn new(mimi: Arc<Mimi>, side: Side, chunk: usize, exact_window: bool, streams: usize) -> Self {
        Core {
            side: SideState::new(&mimi, side, chunk, exact_window, streams),
            chunk,
            streams,
            mimi,
        }
    }

    fn reset(&mut self, i: usize) {
        self.side.reset(i);
    }

    /// Encoder: `n` frames (≤ chunk) of each stream of `active` (`pcm`: stream after stream) →
    /// codes `[m, nq, n]` (borrowed).
    fn encode_chunk(
        &mut self,
        active: &[usize],
        pcm: &[f32],
        n: usize,
        pool: Option<&Pool>,
        trace: Trace<'_>,
    ) -> &[u32] {
        debug_assert!(n <= self.chunk && active.len() <= self.streams);
        self.side.encode(&self.mimi, active, pcm, n, pool, trace)
    }

    /// Decoder: codes `[m, nq, n]` of the streams `active` → `n` frames each into `out` (stream
    /// after stream). Codes out of range are refused before any state moves.
    fn decode_chunk(
        &mut self,
        active: &[usize],
        codes: &[u32],
        n: usize,
        out: &mut [f32],
        pool: Option<&Pool>,
        trace: Trace<'_>,
    ) -> Result<(), MimiError> {
        debug_assert!(n <= self.chunk && active.len() <= self.streams);
        let m = &*self.mimi;
        let k = active.len();
        let nq = m.n_codebooks();
        if codes.len() != k * nq * n {
            return Err(MimiError::Input(format!(
                "expected {} codes, got {}",
                k * nq * n,
                codes.len()
            )));
        }
        let bins = m.cardinality() as u32;
        if let Some(bad) = codes.iter().find(|&&c| c >= bins) {
            return Err(MimiError::Input(format!(
                "code {bad} out of range (codebook size {bins})"
            )));
        }
        self.side.decode(m, active, codes, n, out, pool, trace);
        Ok(())
    }
}

/// The constructor, model accessor and reset of a one-stream wrapper around a core.
macro_rules! single_stream {
    ($ty:ident, $side:expr, $what:literal) => {
        impl $ty {
            #[doc = concat!("A fresh streaming ", $what, " fed one frame per call.")]
            pub fn new(mimi: Arc<Mimi>) -> Self {
                Self::with_chunk(mimi, 1, false)
            }

            fn with_chunk(mimi: Arc<Mimi>, chunk: usize, exact_window: bool) -> Self {
                $ty {
                    core: Core::new(mimi, $side, chunk, exact_window, 1),
                }
            }

            /// The model.
            pub fn mimi(&self) -> &Arc<Mimi> {
                &self.core.mimi
            }

            #[doc = concat!("Back to the fresh state (bit-identical results to a new ", $what, ").")]
            pub fn reset(&mut self) {
                self.core.reset(0);
            }
        }
    };
}

/// The constructor, accessors and per-stream reset of a several-stream wrapper around a core.
macro_rules! batch_streams {
    ($ty:ident, $side:expr) => {
        impl $ty {
            /// `streams` fresh streams.
            pub fn new(mimi: Arc<Mimi>, streams: usize) -> Self {
                $ty {
                    core: Core::new(mimi, $side, 1, false, streams.max(1)),
                }
            }

            /// The model.
            pub fn mimi(&self) -> &Arc<Mimi> {
                &self.core.mimi
            }

            /// Number of streams.
            pub fn streams(&self) -> usize {
                self.core.streams
            }

            /// Stream `stream` back to fresh (the others are untouched). Allocates nothing.
            pub fn reset(&mut self, stream: usize) {
                if stream < self.core.streams {
                    self.core.reset(stream);
                }
            }
        }
    };
}

/// Streaming encoder state (PyTorch `mimi.streaming(1)` + `encode` per frame).
#[derive(Debug)]
pub struct MimiEncoder {
    core: Core,
}

single_stream!(MimiEncoder, Side::Encoder, "encoder");

impl MimiEncoder {
    /// Encodes one frame of `frame_size` samples; returns its `n_codebooks` codes
    /// (borrowed from the state). Allocation-free.
    pub fn encode_frame(&mut self, pcm: &[f32]) -> Result<&[u32], MimiError> {
        self.encode_frame_with(pcm, None, None)
    }

    /// [`MimiEncoder::encode_frame`] with the matrix products split over `pool` (when
    /// given) and intermediates reported to `trace` (when given).
    pub fn encode_frame_with(
        &mut self,
        pcm: &[f32],
        pool: Option<&Pool>,
        trace: Trace<'_>,
    ) -> Result<&[u32], MimiError> {
        let fs = self.core.mimi.frame_size();
        if pcm.len() != fs {
            return Err(MimiError::Input(format!(
                "encode_frame needs {fs} samples, got {}",
                pcm.len()
            )));
        }
        Ok(self.core.encode_chunk(&ONE, pcm, 1, pool, trace))
    }
}

/// Streaming decoder state (PyTorch `mimi.streaming(1)` + `decode` per frame).
#[derive(Debug)]
pub struct MimiDecoder {
    core: Core,
}

single_stream!(MimiDecoder, Side::Decoder, "decoder");

impl MimiDecoder {
    /// Decodes one frame of `n_codebooks` codes into `out` (`frame_size` samples).
    /// Allocation-free. Codes ≥ the codebook size are refused.
    pub fn decode_frame(&mut self, codes: &[u32], out: &mut [f32]) -> Result<(), MimiError> {
        self.decode_frame_with(codes, out, None, None)
    }

    /// [`MimiDecoder::decode_frame`] with the matrix products split over `pool` (when
    /// given) and intermediates reported to `trace` (when given).
    pub fn decode_frame_with(
        &mut self,
        codes: &[u32],
        out: &mut [f32],
        pool: Option<&Pool>,
        trace: Trace<'_>,
    ) -> Result<(), MimiError> {
        let fs = self.core.mimi.frame_size();
        if out.len() != fs {
            return Err(MimiError::Input(format!(
                "decode_frame writes {fs} samples, buffer has {}",
                out.len()
            )));
        }
        self.core.decode_chunk(&ONE, codes, 1, out, pool, trace)
    }
}

/// Streaming encoders of several independent streams (e.g. a server's conversation slots),
/// run together: each call encodes one frame of every listed stream, reading each weight once
/// for all of them. A stream's codes are exactly those a [`MimiEncoder`] fed the same frames
/// gives, whatever the other streams do (which ones run, when they start or reset).
#[derive(Debug)]
pub struct MimiBatchEncoder {
    core: Core,
}

batch_streams!(MimiBatchEncoder, Side::Encoder);

impl MimiBatchEncoder {
    /// Encodes one frame of each stream in `active` (distinct indices below
    /// [`MimiBatchEncoder::streams`]; the others do not move): `pcm` holds their frames one
    /// after the other, in the order of `active`. Returns `n_codebooks` codes per stream, in
    /// the same order (borrowed from the state). Allocation-free.
    pub fn encode_frames(
        &mut self,
        active: &[usize],
        pcm: &[f32],
        pool: Option<&Pool>,
    ) -> Result<&[u32], MimiError> {
        self.encode_frames_with(active, pcm, pool, None)
    }

    /// [`MimiBatchEncoder::encode_frames`] with intermediates reported to `trace` (when given),
    /// each `[C, m·T]` with the streams side by side in the order of `active`.
    pub fn encode_frames_with(
        &mut self,
        active: &[usize],
        pcm: &[f32],
        pool: Option<&Pool>,
        trace: Trace<'_>,
    ) -> Result<&[u32], MimiError> {
        let fs = self.core.mimi.frame_size();
        check_batch(active, self.core.streams, fs, pcm.len(), "encode_frames")?;
        if active.is_empty() {
            return Ok(&[]);
        }
        Ok(self.core.encode_chunk(active, pcm, 1, pool, trace))
    }
}

/// Streaming decoders of several independent streams, run together (see
/// [`MimiBatchEncoder`]). A stream's samples are those a [`MimiDecoder`] fed the same codes
/// gives (equal as numbers: at most the sign of an exactly zero sample can differ, see
/// `conv.rs`).
#[derive(Debug)]
pub struct MimiBatchDecoder {
    core: Core,
}

batch_streams!(MimiBatchDecoder, Side::Decoder);

impl MimiBatchDecoder {
    /// Decodes one frame of each stream in `active` (distinct, below
    /// [`MimiBatchDecoder::streams`]): `codes` holds `n_codebooks` codes per stream and `out`
    /// receives `frame_size` samples per stream, both in the order of `active`. Codes out of
    /// range are refused before any stream moves. Allocation-free.
    pub fn decode_frames(
        &mut self,
        active: &[usize],
        codes: &[u32],
        out: &mut [f32],
        pool: Option<&Pool>,
    ) -> Result<(), MimiError> {
        self.decode_frames_with(active, codes, out, pool, None)
    }

    /// [`MimiBatchDecoder::decode_frames`] with intermediates reported to `trace` (when given),
    /// each `[C, m·T]` with the streams side by side in the order of `active`.
    pub fn decode_frames_with(
        &mut self,
        active: &[usize],
        codes: &[u32],
        out: &mut [f32],
        pool: Option<&Pool>,
        trace: Trace<'_>,
    ) -> Result<(), MimiError> {
        let fs = self.core.mimi.frame_size();
        check_batch(active, self.core.streams, fs, out.len(), "decode_frames")?;
        if active.is_empty() {
            return Ok(());
        }
        self.core.decode_chunk(active, codes, 1, out, pool, trace)
    }
}
