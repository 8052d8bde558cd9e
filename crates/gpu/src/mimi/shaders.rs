//! The WGSL kernels of Mimi on the device. Activations are f32; SEANet tensors are channel-major
//! `[C, T]`, transformer tensors row-major `[T, d]`. Every kernel takes its sizes from a uniform
//! block of at most 16 words written once at load (each kernel declares its own fields,
//! [`MimiKernel::params`]), so a frame records the same launches over the same bind groups.
//!
//! Streaming state lives in device buffers: each convolution keeps its last `pad` input columns
//! ([`MimiKernel::ConvHistory`] moves them after the convolution has read them), each transposed
//! convolution its overlap tail, each transformer layer a K and a V ring, and a small counter
//! buffer the transformer positions and frames seen ([`MimiKernel::Advance`] moves them at the
//! end of a frame).

use crate::bindings::{declare_bindings, declare_uniform, Access};
use crate::shaders::WORKGROUP_REDUCE;

/// One Mimi kernel (each its own WGSL module with entry point `main`, 64 threads per
/// workgroup; most run one thread per index through `PER_INDEX_MAIN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MimiKernel {
    /// Causal convolution over the kept history and the new input (optional ELU on the input,
    /// replicate padding on the first frame, optional accumulation into the output).
    Conv,
    /// Moves a convolution's history forward by the columns just consumed.
    ConvHistory,
    /// Streaming transposed convolution (groups 1 or depthwise) with its overlap tail.
    ConvTranspose,
    /// RVQ decode: the latent of one frame's codes (centroid sums through both output
    /// projections).
    RvqDecode,
    /// Split-RVQ nearest-centroid search of one latent step, all levels, with the screen's
    /// rigorous error bound: marks a level whose nearest centroid the f32 arithmetic cannot
    /// prove.
    RvqSearch,
    /// `out[b, a] = in[a, b]`.
    Transpose,
    /// Row-wise LayerNorm with weight and bias.
    LayerNorm,
    /// `y = x · Wᵀ`, written, accumulated with a LayerScale, or through GELU (erf).
    Linear,
    /// RoPE on the rows' queries and keys, keys and values into the layer's rings.
    RopeStore,
    /// Causal attention of each row over its ring, limited to the context.
    Attention,
    /// Adds to one counter (positions, frames).
    Advance,
}

impl MimiKernel {
    /// Every kernel.
    pub const ALL: [MimiKernel; 11] = [
        MimiKernel::Conv,
        MimiKernel::ConvHistory,
        MimiKernel::ConvTranspose,
        MimiKernel::RvqDecode,
        MimiKernel::RvqSearch,
        MimiKernel::Transpose,
        MimiKernel::LayerNorm,
        MimiKernel::Linear,
        MimiKernel::RopeStore,
        MimiKernel::Attention,
        MimiKernel::Advance,
    ];

    /// The module's WGSL source.
    pub fn source(self) -> String {
        let body = match self {
            MimiKernel::Conv => CONV,
            MimiKernel::ConvHistory => CONV_HISTORY,
            MimiKernel::ConvTranspose => CONV_TRANSPOSE,
            MimiKernel::RvqDecode => RVQ_DECODE,
            MimiKernel::RvqSearch => RVQ_SEARCH,
            MimiKernel::Transpose => TRANSPOSE,
            MimiKernel::LayerNorm => LAYER_NORM,
            MimiKernel::Linear => LINEAR,
            MimiKernel::RopeStore => ROPE_STORE,
            MimiKernel::Attention => ATTENTION,
            MimiKernel::Advance => ADVANCE,
        };
        let main = match self {
            MimiKernel::RvqSearch | MimiKernel::Advance => "",
            _ => PER_INDEX_MAIN,
        };
        let bindings = declare_bindings(self.access(), "P: Params", self.buffers());
        let own = self.params().split(',').map(|f| match f.split_once(':') {
            Some((name, ty)) => (name.trim(), ty.trim()),
            None => (f.trim(), "u32"),
        });
        let fields: Vec<(&str, &str)> = std::iter::once(("threads", "u32")).chain(own).collect();
        assert!(
            fields.len() <= 16,
            "{self:?}: more fields than the 16-word block"
        );
        let params = declare_uniform("Params", fields);
        let reduce = match self {
            MimiKernel::RvqSearch => WORKGROUP_REDUCE,
            _ => "",
        };
        [&bindings, &params, ELU, reduce, body, main].concat()
    }

    /// How the kernel binds its buffers (binding 0 is always the uniform block).
    pub(crate) fn access(self) -> &'static [Access] {
        use Access::{Read as R, Uniform as U, Write as W};
        match self {
            MimiKernel::Conv => &[U, R, R, R, R, W, R],
            MimiKernel::ConvHistory => &[U, R, W, R],
            MimiKernel::ConvTranspose => &[U, R, W, R, R, W],
            MimiKernel::RvqDecode => &[U, R, R, R, R, W],
            MimiKernel::RvqSearch => &[U, R, R, R, R, W, W],
            MimiKernel::Transpose => &[U, R, W],
            MimiKernel::LayerNorm => &[U, R, R, R, W],
            MimiKernel::Linear => &[U, R, R, W, R],
            MimiKernel::RopeStore => &[U, W, W, W, R, R],
            MimiKernel::Attention => &[U, R, R, R, W, R],
            MimiKernel::Advance => &[U, W],
        }
    }

    /// The kernel's fields of the uniform block `P`, in the order of the words the host writes
    /// after word 0, the launch's thread count `threads` (at most 15; `u32` unless typed, an
    /// `f32` written as its bits).
    pub(crate) fn params(self) -> &'static str {
        match self {
            MimiKernel::Conv => {
                "cin, cout, k, stride, dilation, pad, tin, tout, elu, replicate, counter, accumulate"
            }
            MimiKernel::ConvHistory => "cin, pad, tin, replicate, counter",
            MimiKernel::ConvTranspose => "cin, cout, k, stride, tin, tout, tail_len, elu, depthwise",
            MimiKernel::RvqDecode => "dim, cb_dim, bins, n_codebooks",
            MimiKernel::RvqSearch => "cb_dim, bins, n_codebooks, bound: f32",
            MimiKernel::Transpose => "a, b",
            MimiKernel::LayerNorm => "rows, d, eps: f32",
            MimiKernel::Linear => "rows, cols, outs, mode",
            MimiKernel::RopeStore => "rows, d, heads, head_dim, capacity, counter",
            MimiKernel::Attention => {
                "rows, d, heads, head_dim, capacity, context, counter, scale: f32"
            }
            MimiKernel::Advance => "counter, amount",
        }
    }

    /// The WGSL names and element types of the storage bindings of [`MimiKernel::access`], in
    /// its order (binding 0 is the uniform block `P`).
    fn buffers(self) -> &'static str {
        match self {
            MimiKernel::Conv => "x: f32, hist: f32, w: f32, bias: f32, y: f32, counters: u32",
            MimiKernel::ConvHistory => "x: f32, hist: f32, counters: u32",
            MimiKernel::ConvTranspose => "x: f32, tail: f32, w: f32, bias: f32, y: f32",
            MimiKernel::RvqDecode => {
                "codes: u32, centroids: f32, w_first: f32, w_rest: f32, y: f32"
            }
            MimiKernel::RvqSearch => {
                "x_first: f32, x_rest: f32, centroids: f32, stats: f32, resid: f32, out: u32"
            }
            MimiKernel::Transpose => "src: f32, dst: f32",
            MimiKernel::LayerNorm => "x: f32, weight: f32, bias: f32, y: f32",
            MimiKernel::Linear => "x: f32, w: f32, y: f32, scale: f32",
            MimiKernel::RopeStore => "qkv: f32, kc: f32, vc: f32, freqs: f32, counters: u32",
            MimiKernel::Attention => "qkv: f32, kc: f32, vc: f32, out: f32, counters: u32",
            MimiKernel::Advance => "counters: u32",
        }
    }
}

/// The ELU of the convolutions' inputs.
const ELU: &str = r#"
fn elu(v: f32) -> f32 {
    return select(exp(v) - 1.0, v, v > 0.0);
}
"#;

/// The entry point of a kernel with one thread per index: the launch's workgroups folded into two
/// dimensions (one dimension may not hold a large launch's), thread `i` below the launch's
/// thread count running the kernel's `body(i)` (the threads past it, filling the last
/// workgroups, do nothing).
const PER_INDEX_MAIN: &str = r#"
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 64u + lid;
    if (i < P.threads) {
        body(i);
    }
}
"#;

/// One thread per output `(o, t)`; padded column `j` is history column `j` for `j < pad`
/// (the first input sample on the first frame under replicate padding), else input column
/// `j − pad`.
const CONV: &str = r#"
fn body(idx: u32) {
    let tout = P.tout;
    let o = idx / tout;
    let t = idx % tout;
    let first = P.replicate != 0u && counters[P.counter] == 0u;
    let pad = P.pad;
    var acc = bias[o];
    for (var c = 0u; c < P.cin; c++) {
        for (var i = 0u; i < P.k; i++) {
            let j = t * P.stride + i * P.dilation;
            var v: f32;
            if (j < pad) {
                v = select(hist[c * pad + j], x[c * P.tin], first);
            } else {
                v = x[c * P.tin + j - pad];
            }
            if (P.elu != 0u) {
                v = elu(v);
            }
            acc += w[(o * P.cin + c) * P.k + i] * v;
        }
    }
    let at = o * tout + t;
    if (P.accumulate != 0u) {
        acc = y[at] + acc;
    }
    y[at] = acc;
}
"#;

/// One thread per channel, in increasing column order
/// (column `i` reads column `i + tin` of the old history, not yet overwritten).
const CONV_HISTORY: &str = r#"
fn body(c: u32) {
    let pad = P.pad;
    let tin = P.tin;
    let first = P.replicate != 0u && counters[P.counter] == 0u;
    for (var i = 0u; i < pad; i++) {
        var v: f32;
        if (i + tin < pad) {
            v = select(hist[c * pad + i + tin], x[c * tin], first);
        } else {
            v = x[c * tin + i + tin - pad];
        }
        hist[c * pad + i] = v;
    }
}
"#;

/// `tout = tin·stride`, `tail_len = k − stride ≤ tout`. One thread per output `(o, i)`: the full transposed convolution's column `i`
/// (without bias) plus the bias plus the kept tail; a thread with `i < tail` also replaces tail
/// column `i` with column `tout + i` of this call (it alone reads and writes it).
const CONV_TRANSPOSE: &str = r#"
fn input(c: u32, t: u32) -> f32 {
    let v = x[c * P.tin + t];
    return select(v, elu(v), P.elu != 0u);
}

fn full(o: u32, i: u32) -> f32 {
    let k = P.k;
    let s = P.stride;
    var acc = 0.0;
    // Input steps t with t·s ≤ i < t·s + k.
    var t_lo = 0u;
    if (i >= k) {
        t_lo = (i - k) / s + 1u;
    }
    let t_hi = min(i / s + 1u, P.tin);
    for (var t = t_lo; t < t_hi; t++) {
        let j = i - t * s;
        if (P.depthwise != 0u) {
            acc += w[o * k + j] * input(o, t);
        } else {
            for (var c = 0u; c < P.cin; c++) {
                acc += w[(c * P.cout + o) * k + j] * input(c, t);
            }
        }
    }
    return acc;
}

fn body(idx: u32) {
    let tout = P.tout;
    let pt = P.tail_len;
    let o = idx / tout;
    let i = idx % tout;
    var v = full(o, i) + bias[o];
    if (i < pt) {
        v += tail[o * pt + i];
        tail[o * pt + i] = full(o, tout + i);
    }
    y[o * tout + i] = v;
}
"#;

/// One thread per latent channel: the semantic
/// centroid through its output projection plus the sum of the acoustic centroids (in level
/// order) through theirs.
const RVQ_DECODE: &str = r#"
fn centroid(q: u32, j: u32) -> f32 {
    let code = min(codes[q], P.bins - 1u);
    return centroids[(q * P.bins + code) * P.cb_dim + j];
}

fn body(c: u32) {
    let cb = P.cb_dim;
    var first = 0.0;
    var rest = 0.0;
    for (var j = 0u; j < cb; j++) {
        first += w_first[c * cb + j] * centroid(0u, j);
        var acc = 0.0;
        for (var q = 1u; q < P.n_codebooks; q++) {
            acc += centroid(q, j);
        }
        rest += w_rest[c * cb + j] * acc;
    }
    y[c] = first + rest;
}
"#;

/// `bound` is the relative error of an f32 dot product of `cb_dim` terms, γ, with margin. One
/// workgroup. Per level: every centroid's
/// `v = ½‖c‖² − x·c` and its error bound `e = bound·‖c‖·‖x‖ + 4u(|½‖c‖²| + |v|)`; the smallest
/// `v` wins (first index on ties); the level is marked when another centroid's lower bound
/// `v − e` reaches the smallest upper bound (its code is then decided by the host). The
/// acoustic residual (a copy of its projected latent) loses the chosen centroid after each
/// level. Output `codes[q]`, then the number of marked levels.
const RVQ_SEARCH: &str = r#"
var<workgroup> best_v: array<f32, 64>;
var<workgroup> best_i: array<u32, 64>;
var<workgroup> upper: array<f32, 64>;

fn x_at(q: u32, j: u32) -> f32 {
    if (q == 0u) {
        return x_first[j];
    }
    return resid[j];
}

// Centroid i of level q: (v, e) = (½‖c‖² − x·c in f32, its error bound) for ‖x‖ = xn.
fn value_and_error(q: u32, i: u32, xn: f32) -> vec2<f32> {
    let cb = P.cb_dim;
    let k = q * P.bins + i;
    var dot = 0.0;
    for (var j = 0u; j < cb; j++) {
        dot += centroids[k * cb + j] * x_at(q, j);
    }
    let h = stats[2u * k];
    let v = h - dot;
    let u = 5.9604645e-8;
    let e = P.bound * stats[2u * k + 1u] * xn + 4.0 * u * (abs(h) + abs(v)) + 1e-30;
    return vec2<f32>(v, e);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
    let cb = P.cb_dim;
    let bins = P.bins;
    let nq = P.n_codebooks;
    for (var j = lid; j < cb; j += 64u) {
        resid[j] = x_rest[j];
    }
    var marked = 0u;
    workgroupBarrier();
    for (var q = 0u; q < nq; q++) {
        // ‖x‖ by a fixed-order tree.
        var sq = 0.0;
        for (var j = lid; j < cb; j += 64u) {
            let v = x_at(q, j);
            sq += v * v;
        }
        let xn = sqrt(workgroup_reduce(lid, sq, false));
        var bv = 3.0e38;
        var bi = 0xffffffffu;
        var up = 3.0e38;
        for (var i = lid; i < bins; i += 64u) {
            let ve = value_and_error(q, i, xn);
            let v = ve.x;
            let e = ve.y;
            if (v < bv) {
                bv = v;
                bi = i;
            }
            up = min(up, v + e);
        }
        best_v[lid] = bv;
        best_i[lid] = bi;
        upper[lid] = up;
        workgroupBarrier();
        for (var s = 32u; s > 0u; s >>= 1u) {
            if (lid < s) {
                let ov = best_v[lid + s];
                let oi = best_i[lid + s];
                if (ov < best_v[lid] || (ov == best_v[lid] && oi < best_i[lid])) {
                    best_v[lid] = ov;
                    best_i[lid] = oi;
                }
                upper[lid] = min(upper[lid], upper[lid + s]);
            }
            workgroupBarrier();
        }
        let win = best_i[0];
        let top = upper[0];
        // Centroids that the bound cannot rule out (a count, exact in f32).
        var hits = 0.0;
        for (var i = lid; i < bins; i += 64u) {
            let ve = value_and_error(q, i, xn);
            if (ve.x - ve.y <= top) {
                hits += 1.0;
            }
        }
        let lower_hits = workgroup_reduce(lid, hits, false);
        // A non-finite latent gives no winner: code 0, and the host decides.
        let code = select(0u, win, win < bins);
        if (lid == 0u) {
            out[q] = code;
        }
        if (lower_hits != 1.0 || win >= bins) {
            marked += 1u;
        }
        workgroupBarrier();
        if (q > 0u) {
            for (var j = lid; j < cb; j += 64u) {
                resid[j] = resid[j] - centroids[(q * bins + code) * cb + j];
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[nq] = marked;
    }
}
"#;

/// `out[r·a + c] = in[c·b + r]` (channel-major `[a, b]` to row-major `[b, a]`).
const TRANSPOSE: &str = r#"
fn body(idx: u32) {
    let r = idx / P.a;
    let c = idx % P.a;
    dst[idx] = src[c * P.b + r];
}
"#;

/// One thread per row: mean, then variance of the centred
/// values (two passes).
const LAYER_NORM: &str = r#"
fn body(r: u32) {
    let d = P.d;
    var sum = 0.0;
    for (var c = 0u; c < d; c++) {
        sum += x[r * d + c];
    }
    let mean = sum / f32(d);
    var var_sum = 0.0;
    for (var c = 0u; c < d; c++) {
        let v = x[r * d + c] - mean;
        var_sum += v * v;
    }
    let inv = 1.0 / sqrt(var_sum / f32(d) + P.eps);
    for (var c = 0u; c < d; c++) {
        y[r * d + c] = (x[r * d + c] - mean) * inv * weight[c] + bias[c];
    }
}
"#;

/// `mode` 0: write, 1: `y += scale[o]·acc` (LayerScale residual),
/// 2: `y = GELU(acc)` with erf. One thread per output `(r, o)`. The erf is the Chebyshev fit of
/// `erfc` (fractional error below 1.2e-7) that the CPU kernels use.
const LINEAR: &str = r#"
fn gelu(a: f32) -> f32 {
    let z = abs(a) * 0.70710678118654752;
    let t = 1.0 / (0.5 * z + 1.0);
    var p = 0.17087277;
    p = p * t - 0.82215223;
    p = p * t + 1.48851587;
    p = p * t - 1.13520398;
    p = p * t + 0.27886807;
    p = p * t - 0.18628806;
    p = p * t + 0.09678418;
    p = p * t + 0.37409196;
    p = p * t + 1.00002368;
    p = p * t - 1.26551223;
    let r = t * exp(min(p - z * z, 0.0));
    let erf = select(r - 1.0, 1.0 - r, a >= 0.0);
    return 0.5 * a * (1.0 + erf);
}

fn body(idx: u32) {
    let cols = P.cols;
    let outs = P.outs;
    let mode = P.mode;
    let r = idx / outs;
    let o = idx % outs;
    var acc = 0.0;
    for (var c = 0u; c < cols; c++) {
        acc += w[o * cols + c] * x[r * cols + c];
    }
    if (mode == 1u) {
        y[idx] = y[idx] + scale[o] * acc;
    } else if (mode == 2u) {
        y[idx] = gelu(acc);
    } else {
        y[idx] = acc;
    }
}
"#;

/// One thread per `(row, head, pair)`: the
/// row's position is the counter plus the row; angle `freq[i]·pos` in f32 (frequencies computed
/// on the host exactly as the CPU computes them), its cosine and sine by a three-part
/// Cody–Waite reduction and minimax polynomials (a GPU's native `sin`/`cos` may be far less
/// accurate); interleaved pairs rotated in Q and K; K and V stored at ring slot `pos % capacity`.
const ROPE_STORE: &str = r#"
fn cos_sin(a: f32) -> vec2<f32> {
    let k = round(a * 0.63661977236758134);
    var r = a - k * 1.5703125;
    r = r - k * 4.8375129699707031e-4;
    r = r - k * 7.5497899548918822e-8;
    let z = r * r;
    let s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
    let c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
    let q = ((i32(k) % 4) + 4) % 4;
    if (q == 0) {
        return vec2<f32>(c, s);
    } else if (q == 1) {
        return vec2<f32>(-s, c);
    } else if (q == 2) {
        return vec2<f32>(-c, -s);
    }
    return vec2<f32>(s, -c);
}

fn body(idx: u32) {
    let d = P.d;
    let heads = P.heads;
    let hd = P.head_dim;
    let half = hd / 2u;
    let r = idx / (heads * half);
    let h = (idx / half) % heads;
    let i = idx % half;
    let pos = counters[P.counter] + r;
    let cs = cos_sin(freqs[i] * f32(pos));
    let qo = r * 3u * d + h * hd + 2u * i;
    let ko = qo + d;
    let vo = qo + 2u * d;
    let q0 = qkv[qo];
    let q1 = qkv[qo + 1u];
    qkv[qo] = q0 * cs.x - q1 * cs.y;
    qkv[qo + 1u] = q0 * cs.y + q1 * cs.x;
    let k0 = qkv[ko];
    let k1 = qkv[ko + 1u];
    let kr0 = k0 * cs.x - k1 * cs.y;
    let kr1 = k0 * cs.y + k1 * cs.x;
    qkv[ko] = kr0;
    qkv[ko + 1u] = kr1;
    let slot = (pos % P.capacity) * d + h * hd + 2u * i;
    kc[slot] = kr0;
    kc[slot + 1u] = kr1;
    vc[slot] = qkv[vo];
    vc[slot + 1u] = qkv[vo + 1u];
}
"#;

/// `head_dim ≤ 128`. One thread per `(row, head)`: query position `p = counter + row` attends to the positions still
/// in the ring (the rows of this call are stored already) within its context, `max(p + 1 −
/// context, total − capacity) ..= p`; softmax by max, then exponentials and the weighted sum.
const ATTENTION: &str = r#"
fn body(idx: u32) {
    let d = P.d;
    let heads = P.heads;
    let hd = P.head_dim;
    let cap = P.capacity;
    let scale = P.scale;
    let r = idx / heads;
    let h = idx % heads;
    let base = counters[P.counter];
    let p = base + r;
    let total = base + P.rows;
    var lo = 0u;
    if (p + 1u > P.context) {
        lo = p + 1u - P.context;
    }
    if (total > cap) {
        lo = max(lo, total - cap);
    }
    let qo = r * 3u * d + h * hd;
    var m = -3.0e38;
    for (var kp = lo; kp <= p; kp++) {
        let ko = (kp % cap) * d + h * hd;
        var s = 0.0;
        for (var j = 0u; j < hd; j++) {
            s += qkv[qo + j] * kc[ko + j];
        }
        m = max(m, s * scale);
    }
    var acc: array<f32, 128>;
    for (var j = 0u; j < hd; j++) {
        acc[j] = 0.0;
    }
    var sum = 0.0;
    for (var kp = lo; kp <= p; kp++) {
        let ko = (kp % cap) * d + h * hd;
        var s = 0.0;
        for (var j = 0u; j < hd; j++) {
            s += qkv[qo + j] * kc[ko + j];
        }
        let e = exp(s * scale - m);
        sum += e;
        for (var j = 0u; j < hd; j++) {
            acc[j] += e * vc[ko + j];
        }
    }
    let inv = 1.0 / sum;
    for (var j = 0u; j < hd; j++) {
        out[r * d + h * hd + j] = acc[j] * inv;
    }
}
"#;

/// One thread.
const ADVANCE: &str = r#"
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
    if (lid == 0u) {
        counters[P.counter] = counters[P.counter] + P.amount;
    }
}
"#;
