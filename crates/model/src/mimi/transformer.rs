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
use kernels::attention::{KvDtype, KvRing};
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

/// Streaming state: one KV ring per layer, the position counter and work buffers.
#[derive(Debug)]
pub(crate) struct TransformerState {
    max_t: usize,
    /// Per layer: the f32 KV ring (capacity = context when streaming exactly like PyTorch
    /// streaming); entry number = position.
    kv: Vec<KvRing>,
    /// Next absolute position.
    pos: usize,
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    f: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    scratch: Scratch,
}

impl Transformer {
    /// A fresh state. `max_t`: most steps per call. `exact_window`: every query sees its full
    /// context (PyTorch non-streaming); otherwise the ring holds exactly `context` entries
    /// (PyTorch streaming).
    pub fn state(&self, max_t: usize, exact_window: bool) -> TransformerState {
        let cap = if exact_window {
            self.context + max_t
        } else {
            self.context
        };
        let d = self.d;
        TransformerState {
            max_t,
            kv: self
                .layers
                .iter()
                .map(|_| {
                    KvRing::new(cap, self.heads, d / self.heads, KvDtype::F32)
                        .expect("Mimi transformer sizes are validated at load")
                })
                .collect(),
            pos: 0,
            x: vec![0.0; max_t * d],
            h: vec![0.0; max_t * d],
            qkv: vec![0.0; max_t * 3 * d],
            att: vec![0.0; max_t * d],
            o: vec![0.0; max_t * d],
            f: vec![0.0; max_t * self.ff],
            cos: vec![0.0; max_t * d / self.heads / 2],
            sin: vec![0.0; max_t * d / self.heads / 2],
            scratch: Scratch::new(),
        }
    }

    /// Runs `t` steps. `io` is `[d, t]` (conv layout) on input and output.
    pub fn forward(
        &self,
        st: &mut TransformerState,
        io: &mut [f32],
        t: usize,
        pool: Option<&Pool>,
    ) {
        assert!(t <= st.max_t);
        let d = self.d;
        let hd = d / self.heads;
        let half = hd / 2;
        // transpose to [t, d]
        for c in 0..d {
            for s in 0..t {
                st.x[s * d + c] = io[c * t + s];
            }
        }
        // RoPE tables, computed like moshi's apply_rope: freqs and angles in f32.
        let scale = (-(self.max_period.ln()) * 2.0 / hd as f64) as f32;
        for s in 0..t {
            let ts = (st.pos + s) as f32;
            for i in 0..half {
                let freq = (i as f32 * scale).exp();
                let ang = freq * ts;
                st.cos[s * half + i] = ang.cos();
                st.sin[s * half + i] = ang.sin();
            }
        }
        for (layer, ring) in self.layers.iter().zip(st.kv.iter_mut()) {
            for s in 0..t {
                kernels::ops::layer_norm(
                    &st.x[s * d..(s + 1) * d],
                    &layer.norm1_w,
                    &layer.norm1_b,
                    1e-5,
                    &mut st.h[s * d..(s + 1) * d],
                );
            }
            matmul(
                &layer.in_proj,
                &st.h[..t * d],
                t,
                &mut st.qkv,
                pool,
                &mut st.scratch,
            );
            for s in 0..t {
                let row = &mut st.qkv[s * 3 * d..(s + 1) * 3 * d];
                let (cs, sn) = (
                    &st.cos[s * half..(s + 1) * half],
                    &st.sin[s * half..(s + 1) * half],
                );
                // q then k: 2·heads heads of hd values.
                kernels::ops::rope_rotate(&mut row[..2 * d], hd, cs, sn);
                ring.push(&row[d..2 * d], &row[2 * d..3 * d]);
            }
            // Query p sees the keys still in the ring within its context (see the module doc).
            ring.attend_chunk(&st.qkv, 3 * d, t, self.context, &mut st.att, pool);
            matmul(
                &layer.out_proj,
                &st.att[..t * d],
                t,
                &mut st.o,
                pool,
                &mut st.scratch,
            );
            for s in 0..t {
                for c in 0..d {
                    st.x[s * d + c] += layer.ls1[c] * st.o[s * d + c];
                }
            }
            for s in 0..t {
                kernels::ops::layer_norm(
                    &st.x[s * d..(s + 1) * d],
                    &layer.norm2_w,
                    &layer.norm2_b,
                    1e-5,
                    &mut st.h[s * d..(s + 1) * d],
                );
            }
            matmul(
                &layer.linear1,
                &st.h[..t * d],
                t,
                &mut st.f,
                pool,
                &mut st.scratch,
            );
            kernels::ops::gelu_erf(&mut st.f[..t * self.ff]);
            matmul(
                &layer.linear2,
                &st.f[..t * self.ff],
                t,
                &mut st.o,
                pool,
                &mut st.scratch,
            );
            for s in 0..t {
                for c in 0..d {
                    st.x[s * d + c] += layer.ls2[c] * st.o[s * d + c];
                }
            }
        }
        st.pos += t;
        for c in 0..d {
            for s in 0..t {
                io[c * t + s] = st.x[s * d + c];
            }
        }
    }
}

impl TransformerState {
    /// Back to the fresh state (position 0; stale ring entries are never read again).
    pub fn reset(&mut self) {
        self.pos = 0;
        for ring in &mut self.kv {
            ring.reset();
        }
    }
}
