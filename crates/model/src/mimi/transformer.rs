//! Mimi's streaming transformer (`ProjectedTransformer` without projections): pre-norm
//! layers with LayerNorm, interleaved RoPE, causal attention limited to `context` steps,
//! LayerScale, and a plain GELU(erf) FFN. No biases in the linears.
//!
//! KV cache semantics follow `RingKVCache` of `moshi` 0.2.13: a chunk of T steps is first
//! written into the ring, then every query of the chunk attends to the entries still in the
//! ring whose position p_k satisfies 0 ≤ p_q − p_k < context. With a ring capacity equal to
//! the context (streaming), the older query of a 2-step chunk therefore sees one key fewer.
//! The non-streaming PyTorch path (mask only) is reproduced with a larger ring.

use super::conv::matmul;
use kernels::attention::{Chunks, KvDtype, KvRing};
use kernels::{Matrix, Pool, Scratch};

/// Weights of one layer.
#[derive(Debug)]
pub(crate) struct Layer {
    pub norm1_w: Vec<f32>,
    pub norm1_b: Vec<f32>,
    /// `[3 * d, d]`: rows Q (head-major), K, V.
    pub in_proj: Matrix,
    /// `[d, d]`.
    pub out_proj: Matrix,
    pub ls1: Vec<f32>,
    pub norm2_w: Vec<f32>,
    pub norm2_b: Vec<f32>,
    /// `[ff, d]`.
    pub linear1: Matrix,
    /// `[d, ff]`.
    pub linear2: Matrix,
    pub ls2: Vec<f32>,
}

/// A stack of layers plus its sizes.
#[derive(Debug)]
pub(crate) struct Transformer {
    pub d: usize,
    pub heads: usize,
    pub ff: usize,
    pub context: usize,
    pub max_period: f64,
    pub layers: Vec<Layer>,
}

/// Streaming state of one stream: one KV ring per layer and the position counter.
#[derive(Debug)]
struct StreamKv {
    /// Per layer: the f32 KV ring (capacity = context when streaming exactly like PyTorch
    /// streaming); entry number = position.
    kv: Vec<KvRing>,
    /// Next absolute position.
    pos: usize,
}

/// Streaming state of a set of streams (their KV rings and positions) and the work buffers of
/// one call for all of them (rows of stream j at `j·t`).
#[derive(Debug)]
pub(crate) struct TransformerState {
    max_t: usize,
    streams: Vec<StreamKv>,
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    f: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// Attention scores of every (stream, head) pair (see [`Chunks::attend`]).
    scores: Vec<f32>,
    scratch: Scratch,
}

impl Transformer {
    /// Fresh states of `streams` streams. `max_t`: most steps per call and stream.
    /// `exact_window`: every query sees its full context (PyTorch non-streaming); otherwise the
    /// ring holds exactly `context` entries (PyTorch streaming).
    pub fn state(&self, max_t: usize, exact_window: bool, streams: usize) -> TransformerState {
        let cap = if exact_window {
            self.context + max_t
        } else {
            self.context
        };
        let d = self.d;
        let rows = max_t * streams;
        TransformerState {
            max_t,
            streams: (0..streams)
                .map(|_| StreamKv {
                    kv: self
                        .layers
                        .iter()
                        .map(|_| {
                            KvRing::new(cap, self.heads, d / self.heads, KvDtype::F32)
                                .expect("Mimi transformer sizes are validated at load")
                        })
                        .collect(),
                    pos: 0,
                })
                .collect(),
            x: vec![0.0; rows * d],
            h: vec![0.0; rows * d],
            qkv: vec![0.0; rows * 3 * d],
            att: vec![0.0; rows * d],
            o: vec![0.0; rows * d],
            f: vec![0.0; rows * self.ff],
            cos: vec![0.0; rows * d / self.heads / 2],
            sin: vec![0.0; rows * d / self.heads / 2],
            scores: vec![0.0; streams * self.heads * cap],
            scratch: Scratch::new(),
        }
    }

    /// Opens a run of layers on `t` steps of the streams `active`: `io` is `[d, m·t]` (conv
    /// layout, stream j's steps at `j·t`), taken into rows, and the RoPE angles of the streams'
    /// positions computed. Then [`Transformer::layer`] per layer of the run and
    /// [`Transformer::leave`]. The linears take the `m·t` rows at once (each weight read once per
    /// call); attention attends every stream over its own ring, in one call.
    pub fn enter(&self, st: &mut TransformerState, active: &[usize], io: &[f32], t: usize) {
        assert!(t <= st.max_t);
        let d = self.d;
        let hd = d / self.heads;
        let half = hd / 2;
        let n = active.len() * t;
        // transpose to [m·t, d]
        for c in 0..d {
            for s in 0..n {
                st.x[s * d + c] = io[c * n + s];
            }
        }
        // RoPE tables, computed like moshi's apply_rope: freqs and angles in f32.
        let scale = (-(self.max_period.ln()) * 2.0 / hd as f64) as f32;
        for (j, &sl) in active.iter().enumerate() {
            let pos = st.streams[sl].pos;
            for s in 0..t {
                let ts = (pos + s) as f32;
                let row = j * t + s;
                for i in 0..half {
                    let freq = (i as f32 * scale).exp();
                    let ang = freq * ts;
                    st.cos[row * half + i] = ang.cos();
                    st.sin[row * half + i] = ang.sin();
                }
            }
        }
    }

    /// Layer `l` on the rows [`Transformer::enter`] took, with its own KV ring.
    pub fn layer(
        &self,
        st: &mut TransformerState,
        l: usize,
        active: &[usize],
        t: usize,
        pool: Option<&Pool>,
    ) {
        let layer = &self.layers[l];
        let d = self.d;
        let hd = d / self.heads;
        let half = hd / 2;
        let n = active.len() * t;
        norm_rows(&st.x, &layer.norm1_w, &layer.norm1_b, &mut st.h, n, d);
        matmul(
            &layer.in_proj,
            &st.h[..n * d],
            n,
            &mut st.qkv,
            pool,
            &mut st.scratch,
        );
        for (j, &sl) in active.iter().enumerate() {
            let ring = &mut st.streams[sl].kv[l];
            for s in j * t..(j + 1) * t {
                let row = &mut st.qkv[s * 3 * d..(s + 1) * 3 * d];
                let (cs, sn) = (
                    &st.cos[s * half..(s + 1) * half],
                    &st.sin[s * half..(s + 1) * half],
                );
                // q then k: 2·heads heads of hd values.
                kernels::ops::rope_rotate(&mut row[..2 * d], hd, cs, sn);
                ring.push(&row[d..2 * d], &row[2 * d..3 * d]);
            }
        }
        // Query p sees the keys still in the ring within its context (see the module doc).
        // All streams in one call, so the pool gets their (stream, head) pairs at once.
        let streams = &st.streams;
        let chunks = Chunks {
            rings: |j: usize| &streams[active[j]].kv[l],
            m: active.len(),
            q: &st.qkv[..n * 3 * d],
            q_stride: 3 * d,
            t,
            context: self.context,
        };
        chunks.attend(&mut st.att[..n * d], &mut st.scores, pool);
        matmul(
            &layer.out_proj,
            &st.att[..n * d],
            n,
            &mut st.o,
            pool,
            &mut st.scratch,
        );
        add_scaled(&mut st.x, &layer.ls1, &st.o, n, d);
        norm_rows(&st.x, &layer.norm2_w, &layer.norm2_b, &mut st.h, n, d);
        matmul(
            &layer.linear1,
            &st.h[..n * d],
            n,
            &mut st.f,
            pool,
            &mut st.scratch,
        );
        gelu(&mut st.f[..n * self.ff], pool);
        matmul(
            &layer.linear2,
            &st.f[..n * self.ff],
            n,
            &mut st.o,
            pool,
            &mut st.scratch,
        );
        add_scaled(&mut st.x, &layer.ls2, &st.o, n, d);
    }

    /// Closes a run of layers: the streams' positions advance by `t` and the rows go back to
    /// `io` (`[d, m·t]`).
    pub fn leave(&self, st: &mut TransformerState, active: &[usize], io: &mut [f32], t: usize) {
        let d = self.d;
        let n = active.len() * t;
        for &sl in active {
            st.streams[sl].pos += t;
        }
        for c in 0..d {
            for s in 0..n {
                io[c * n + s] = st.x[s * d + c];
            }
        }
    }
}

/// Below this many values GELU stays on the calling thread. Measured with 2 threads at Mimi's
/// ff = 2048 and 2 steps per stream: 1 stream (4096 values, ~4 µs) loses with a dispatch,
/// 2 streams break even, 4 streams go from ~20 µs to ~13 µs.
const PAR_GELU: usize = 12 * 1024;

/// Values per GELU share are a multiple of this, so every share starts on a whole SIMD block.
const GELU_BLOCK: usize = 64;

struct SendPtr(*mut f32);
// SAFETY: hands disjoint ranges of one buffer to pool shares.
unsafe impl Sync for SendPtr {}

/// In-place GELU(erf) of `x`, split over the pool when large. The function is elementwise, so
/// the split changes no bit.
fn gelu(x: &mut [f32], pool: Option<&Pool>) {
    let len = x.len();
    let pl = match pool {
        Some(pl) if pl.n_threads() > 1 && len >= PAR_GELU => pl,
        _ => return kernels::ops::gelu_erf(x),
    };
    let nt = pl.n_threads();
    let blocks = len.div_ceil(GELU_BLOCK);
    let xp = SendPtr(x.as_mut_ptr());
    pl.run(nt, &|i| {
        let xp = &xp;
        let a = (i * blocks / nt * GELU_BLOCK).min(len);
        let b = ((i + 1) * blocks / nt * GELU_BLOCK).min(len);
        // SAFETY: share i owns x[a..b]; the shares' ranges are disjoint and inside x.
        kernels::ops::gelu_erf(unsafe { std::slice::from_raw_parts_mut(xp.0.add(a), b - a) });
    });
}

/// LayerNorm (eps 1e-5, PyTorch's default) of each of the `n` rows of `x` (`[n, d]`) into `h`.
#[inline]
fn norm_rows(x: &[f32], w: &[f32], b: &[f32], h: &mut [f32], n: usize, d: usize) {
    for s in 0..n {
        kernels::ops::layer_norm(
            &x[s * d..(s + 1) * d],
            w,
            b,
            1e-5,
            &mut h[s * d..(s + 1) * d],
        );
    }
}

/// The LayerScale residual of the `n` rows of `x` (`[n, d]`): `x[s, c] += scale[c] · y[s, c]`.
#[inline]
fn add_scaled(x: &mut [f32], scale: &[f32], y: &[f32], n: usize, d: usize) {
    for s in 0..n {
        for c in 0..d {
            x[s * d + c] += scale[c] * y[s * d + c];
        }
    }
}

impl TransformerState {
    /// Stream `i` back to the fresh state (position 0; stale ring entries are never read again).
    pub fn reset(&mut self, i: usize) {
        let sk = &mut self.streams[i];
        sk.pos = 0;
        for ring in &mut sk.kv {
            ring.reset();
        }
    }
}
