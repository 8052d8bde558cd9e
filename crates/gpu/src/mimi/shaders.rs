//! The WGSL kernels of Mimi on the device. Activations are f32; SEANet tensors are channel-major
//! `[C, T]`, transformer tensors row-major `[T, d]`. Every kernel takes its sizes from a uniform
//! block of 16 words written once at load (each kernel names the words it reads), so a frame
//! records the same launches over the same bind groups.
//!
//! Streaming state lives in device buffers: each convolution keeps its last `pad` input columns
//! ([`MimiKernel::ConvHistory`] moves them after the convolution has read them), each transposed
//! convolution its overlap tail, each transformer layer a K and a V ring, and a small counter
//! buffer the transformer positions and frames seen ([`MimiKernel::Advance`] moves them at the
//! end of a frame).

use crate::bindings::{declare_bindings, Access};

/// One Mimi kernel (each its own WGSL module with entry point `main`, 64 threads per
/// workgroup; most run one thread per index through [`PER_INDEX_MAIN`]).
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
        [&bindings, PRELUDE, body, main].concat()
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

/// The uniform block (16 words; each kernel reads the ones it names) and the ELU of the
/// convolutions' inputs.
const PRELUDE: &str = r#"
struct Params {
    w0: u32, w1: u32, w2: u32, w3: u32,
    w4: u32, w5: u32, w6: u32, w7: u32,
    w8: u32, w9: u32, w10: u32, w11: u32,
    w12: u32, w13: u32, w14: u32, w15: u32,
};

fn elu(v: f32) -> f32 {
    return select(exp(v) - 1.0, v, v > 0.0);
}
"#;

/// The entry point of a kernel with one thread per index: the launch's workgroups folded into two
/// dimensions (one dimension may not hold a large launch's), thread `i` running the kernel's
/// `body(i)`, which returns at once past the kernel's count.
const PER_INDEX_MAIN: &str = r#"
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    body((wid.y * nwg.x + wid.x) * 64u + lid);
}
"#;

/// Words: cin, cout, k, stride, dilation, pad, tin, tout, elu, replicate, counter, accumulate.
/// One thread per output `(o, t)`; padded column `j` is history column `j` for `j < pad`
/// (the first input sample on the first frame under replicate padding), else input column
/// `j − pad`.
const CONV: &str = r#"
fn body(idx: u32) {
    let cin = P.w0;
    let cout = P.w1;
    let k = P.w2;
    let stride = P.w3;
    let dil = P.w4;
    let pad = P.w5;
    let tin = P.w6;
    let tout = P.w7;
    if (idx >= cout * tout) {
        return;
    }
    let o = idx / tout;
    let t = idx % tout;
    let first = P.w9 != 0u && counters[P.w10] == 0u;
    var acc = bias[o];
    for (var c = 0u; c < cin; c++) {
        for (var i = 0u; i < k; i++) {
            let j = t * stride + i * dil;
            var v: f32;
            if (j < pad) {
                v = select(hist[c * pad + j], x[c * tin], first);
            } else {
                v = x[c * tin + j - pad];
            }
            if (P.w8 != 0u) {
                v = elu(v);
            }
            acc += w[(o * cin + c) * k + i] * v;
        }
    }
    let at = o * tout + t;
    if (P.w11 != 0u) {
        acc = y[at] + acc;
    }
    y[at] = acc;
}
"#;

/// Words: cin, pad, tin, replicate, counter. One thread per channel, in increasing column order
/// (column `i` reads column `i + tin` of the old history, not yet overwritten).
const CONV_HISTORY: &str = r#"
fn body(c: u32) {
    let cin = P.w0;
    let pad = P.w1;
    let tin = P.w2;
    if (c >= cin) {
        return;
    }
    let first = P.w3 != 0u && counters[P.w4] == 0u;
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

/// Words: cin, cout, k, stride, tin, tout (= tin·stride), tail (= k − stride ≤ tout), elu,
/// depthwise. One thread per output `(o, i)`: the full transposed convolution's column `i`
/// (without bias) plus the bias plus the kept tail; a thread with `i < tail` also replaces tail
/// column `i` with column `tout + i` of this call (it alone reads and writes it).
const CONV_TRANSPOSE: &str = r#"
fn input(c: u32, t: u32) -> f32 {
    let v = x[c * P.w4 + t];
    return select(v, elu(v), P.w7 != 0u);
}

fn full(o: u32, i: u32) -> f32 {
    let cin = P.w0;
    let cout = P.w1;
    let k = P.w2;
    let s = P.w3;
    let tin = P.w4;
    var acc = 0.0;
    // Input steps t with t·s ≤ i < t·s + k.
    var t_lo = 0u;
    if (i >= k) {
        t_lo = (i - k) / s + 1u;
    }
    let t_hi = min(i / s + 1u, tin);
    for (var t = t_lo; t < t_hi; t++) {
        let j = i - t * s;
        if (P.w8 != 0u) {
            acc += w[o * k + j] * input(o, t);
        } else {
            for (var c = 0u; c < cin; c++) {
                acc += w[(c * cout + o) * k + j] * input(c, t);
            }
        }
    }
    return acc;
}

fn body(idx: u32) {
    let cout = P.w1;
    let tout = P.w5;
    let pt = P.w6;
    if (idx >= cout * tout) {
        return;
    }
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

/// Words: dim, cb_dim, bins, n_codebooks. One thread per latent channel: the semantic
/// centroid through its output projection plus the sum of the acoustic centroids (in level
/// order) through theirs.
const RVQ_DECODE: &str = r#"
fn centroid(q: u32, j: u32) -> f32 {
    let code = min(codes[q], P.w2 - 1u);
    return centroids[(q * P.w2 + code) * P.w1 + j];
}

fn body(c: u32) {
    let dim = P.w0;
    let cb = P.w1;
    let nq = P.w3;
    if (c >= dim) {
        return;
    }
    var first = 0.0;
    var rest = 0.0;
    for (var j = 0u; j < cb; j++) {
        first += w_first[c * cb + j] * centroid(0u, j);
        var acc = 0.0;
        for (var q = 1u; q < nq; q++) {
            acc += centroid(q, j);
        }
        rest += w_rest[c * cb + j] * acc;
    }
    y[c] = first + rest;
}
"#;

/// Words: cb_dim, bins, n_codebooks, bound (f32 bits: the relative error of an f32 dot product of
/// `cb_dim` terms, γ, with margin). One workgroup. Per level: every centroid's
/// `v = ½‖c‖² − x·c` and its error bound `e = bound·‖c‖·‖x‖ + 4u(|½‖c‖²| + |v|)`; the smallest
/// `v` wins (first index on ties); the level is marked when another centroid's lower bound
/// `v − e` reaches the smallest upper bound (its code is then decided by the host). The
/// acoustic residual (a copy of its projected latent) loses the chosen centroid after each
/// level. Output `codes[q]`, then the number of marked levels.
const RVQ_SEARCH: &str = r#"
var<workgroup> best_v: array<f32, 64>;
var<workgroup> best_i: array<u32, 64>;
var<workgroup> upper: array<f32, 64>;
var<workgroup> lower_hits: array<u32, 64>;
var<workgroup> norm_part: array<f32, 64>;

fn x_at(q: u32, j: u32) -> f32 {
    if (q == 0u) {
        return x_first[j];
    }
    return resid[j];
}

// Centroid i of level q: (v, e) = (½‖c‖² − x·c in f32, its error bound) for ‖x‖ = xn.
fn value_and_error(q: u32, i: u32, xn: f32) -> vec2<f32> {
    let cb = P.w0;
    let k = q * P.w1 + i;
    var dot = 0.0;
    for (var j = 0u; j < cb; j++) {
        dot += centroids[k * cb + j] * x_at(q, j);
    }
    let h = stats[2u * k];
    let v = h - dot;
    let u = 5.9604645e-8;
    let e = bitcast<f32>(P.w3) * stats[2u * k + 1u] * xn + 4.0 * u * (abs(h) + abs(v)) + 1e-30;
    return vec2<f32>(v, e);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
    let cb = P.w0;
    let bins = P.w1;
    let nq = P.w2;
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
        norm_part[lid] = sq;
        workgroupBarrier();
        for (var s = 32u; s > 0u; s >>= 1u) {
            if (lid < s) {
                norm_part[lid] += norm_part[lid + s];
            }
            workgroupBarrier();
        }
        let xn = sqrt(norm_part[0]);
        workgroupBarrier();
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
        // Centroids that the bound cannot rule out.
        var hits = 0u;
        for (var i = lid; i < bins; i += 64u) {
            let ve = value_and_error(q, i, xn);
            if (ve.x - ve.y <= top) {
                hits += 1u;
            }
        }
        lower_hits[lid] = hits;
        workgroupBarrier();
        for (var s = 32u; s > 0u; s >>= 1u) {
            if (lid < s) {
                lower_hits[lid] += lower_hits[lid + s];
            }
            workgroupBarrier();
        }
        // A non-finite latent gives no winner: code 0, and the host decides.
        let code = select(0u, win, win < bins);
        if (lid == 0u) {
            out[q] = code;
        }
        if (lower_hits[0] != 1u || win >= bins) {
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

/// Words: a, b. `out[r·a + c] = in[c·b + r]` (channel-major `[a, b]` to row-major `[b, a]`).
const TRANSPOSE: &str = r#"
fn body(idx: u32) {
    let a = P.w0;
    let b = P.w1;
    if (idx >= a * b) {
        return;
    }
    let r = idx / a;
    let c = idx % a;
    dst[idx] = src[c * b + r];
}
"#;

/// Words: rows, d, eps (f32 bits). One thread per row: mean, then variance of the centred
/// values (two passes).
const LAYER_NORM: &str = r#"
fn body(r: u32) {
    let rows = P.w0;
    let d = P.w1;
    let eps = bitcast<f32>(P.w2);
    if (r >= rows) {
        return;
    }
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
    let inv = 1.0 / sqrt(var_sum / f32(d) + eps);
    for (var c = 0u; c < d; c++) {
        y[r * d + c] = (x[r * d + c] - mean) * inv * weight[c] + bias[c];
    }
}
"#;

/// Words: rows, cols, outs, mode (0: write, 1: `y += scale[o]·acc` (LayerScale residual),
/// 2: `y = GELU(acc)` with erf). One thread per output `(r, o)`. The erf is the Chebyshev fit of
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
    let rows = P.w0;
    let cols = P.w1;
    let outs = P.w2;
    let mode = P.w3;
    if (idx >= rows * outs) {
        return;
    }
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

/// Words: rows, d, heads, head_dim, capacity, counter. One thread per `(row, head, pair)`: the
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
    let rows = P.w0;
    let d = P.w1;
    let heads = P.w2;
    let hd = P.w3;
    let cap = P.w4;
    let half = hd / 2u;
    if (idx >= rows * heads * half) {
        return;
    }
    let r = idx / (heads * half);
    let h = (idx / half) % heads;
    let i = idx % half;
    let pos = counters[P.w5] + r;
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
    let slot = (pos % cap) * d + h * hd + 2u * i;
    kc[slot] = kr0;
    kc[slot + 1u] = kr1;
    vc[slot] = qkv[vo];
    vc[slot + 1u] = qkv[vo + 1u];
}
"#;

/// Words: rows, d, heads, head_dim (≤ 128), capacity, context, counter, scale (f32 bits). One
/// thread per `(row, head)`: query position `p = counter + row` attends to the positions still
/// in the ring (the rows of this call are stored already) within its context, `max(p + 1 −
/// context, total − capacity) ..= p`; softmax by max, then exponentials and the weighted sum.
const ATTENTION: &str = r#"
fn body(idx: u32) {
    let rows = P.w0;
    let d = P.w1;
    let heads = P.w2;
    let hd = P.w3;
    let cap = P.w4;
    let ctx = P.w5;
    let scale = bitcast<f32>(P.w7);
    if (idx >= rows * heads) {
        return;
    }
    let r = idx / heads;
    let h = idx % heads;
    let base = counters[P.w6];
    let p = base + r;
    let total = base + rows;
    var lo = 0u;
    if (p + 1u > ctx) {
        lo = p + 1u - ctx;
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

/// Words: counter, amount. One thread.
const ADVANCE: &str = r#"
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
    if (lid == 0u) {
        counters[P.w0] = counters[P.w0] + P.w1;
    }
}
"#;
