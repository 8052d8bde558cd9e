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
//!
//! # Arithmetic at Moshi's Mimi (f32 weights, 2 transformer steps per 80 ms frame)
//!
//! Bytes are what a launch must move at least (weights, plus activations where they dominate);
//! "µs" is that at 3.3 TB/s. Every launch also pays the device's dispatch and barrier cost
//! (a few µs on a Vulkan driver), which is what a frame's ~205 launches (112 encoder, 93
//! decoder) cost in the end: the kernels below are sized so that no launch runs a long serial
//! loop on a few threads (the old kernels' cost: 16 attention threads, one 64-thread workgroup
//! for all 8 RVQ levels, 2 LayerNorm threads, one thread per output over 8192-term sums).
//!
//! | launch (per frame) | bytes | workgroups | µs at 3.3 TB/s |
//! |---|---|---|---|
//! | Linear `in_proj` 512→1536 (×8 layers ×2 directions) | 3.1 MB | 192 | 0.95 |
//! | Linear `out_proj` 512→512 | 1.0 MB | 64 | 0.32 |
//! | Linear `linear1` 512→2048 (GELU) | 4.2 MB | 256 | 1.27 |
//! | Linear `linear2` 2048→512 | 4.2 MB | 64 | 1.27 |
//! | Attention, 8 heads × 64, 250 keys, 2 rows | 1.0 MB of K/V | 16 (256 threads) | 0.3 |
//! | LayerNorm 2 × 512 | 8 KB | 2 | launch-bound |
//! | RvqScore, one level: 2048 × 256 (×8 levels) | 2.1 MB | 256 | 0.64 |
//! | RvqPick, one level (×8) | 16 KB | 1 | launch-bound |
//! | RvqDecode: 8 centroids and 2 projections 512 × 256 | 1.1 MB | 64 | 0.33 |
//! | ConvSplit enc. down 512→1024 k16 s8, 2 columns | 33.5 MB | 1024 | 10.2 |
//! | ConvSplit enc. down 256→512 k12 s6, 16 columns | 6.3 MB | 1024 | 1.9 |
//! | ConvSplit enc. last 1024→512 k3, 2 columns | 6.3 MB | 512 | 1.9 |
//! | ConvSplit enc. downsample 512→512 k4 s2 | 4.2 MB | 512 | 1.3 |
//! | ConvSplit dec. conv0 512→1024 k7, 2 columns | 14.7 MB | 1024 | 4.4 |
//! | ConvTrSplit dec. 1024→512 k16 s8, 2→16 columns | 33.5 MB | 1536 | 10.2 |
//! | ConvTrSplit dec. 512→256 k12 s6, 16→96 | 6.3 MB | 3328 | 1.9 |
//! | ConvTrSplit dec. 128→64 k8 s4, 480→1920 | 0.5 MB of activations | 15424 | 0.2 |
//! | Conv (a thread per output) enc. stage-1 residual 64→32 k3, 1920 columns | 0.7 MB of activations | 960 | 0.2 |
//!
//! A frame pair moves about 333 MB of weights (201 MB of transformers, 50 + 59 MB of SEANet,
//! 17 MB of centroids), ~100 µs at 3.3 TB/s; with ~205 dependent launches at a few µs each,
//! encode + decode should come to roughly 0.6–1 ms on an H200-class card (not measured here).
//!
//! The weights are read once per slot: a batch of slots records each slot's launches in turn
//! (a slot dimension in the kernels is not done yet).

use crate::bindings::{declare_bindings, declare_uniform, Access};

/// One Mimi kernel (each its own WGSL module with entry point `main`): either one thread per
/// index through `PER_INDEX_MAIN` (64 threads per workgroup), or its own entry point over a
/// grid of workgroups the host chooses ([`MimiKernel::grid_launched`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MimiKernel {
    /// Causal convolution over the kept history and the new input (replicate padding on the
    /// first frame, optional accumulation into the output, optional ELU of the output into the
    /// output or a second buffer), one thread per output.
    Conv,
    /// [`MimiKernel::Conv`] with the input-channel sum split across a workgroup (long sums).
    ConvSplit,
    /// Moves a convolution's history forward by the columns just consumed.
    ConvHistory,
    /// Streaming transposed convolution (groups 1 or depthwise) with its overlap tail, one
    /// thread per output.
    ConvTranspose,
    /// [`MimiKernel::ConvTranspose`] (groups 1) with the input-channel sum split across a
    /// workgroup; the new tail goes to a second buffer that a [`MimiKernel::Transpose`] copy
    /// moves over the tail.
    ConvTrSplit,
    /// RVQ decode: the latent of one frame's codes (centroid sums through both output
    /// projections).
    RvqDecode,
    /// Split-RVQ search, first half of one level: every centroid's value `½‖c‖² − x·c` and its
    /// rigorous f32 error bound, one 32-lane team per centroid.
    RvqScore,
    /// Split-RVQ search, second half of one level: the argmin of the scored values (lowest index
    /// on ties), whether the bound proves it, the code, and the acoustic residual update.
    RvqPick,
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
    pub const ALL: [MimiKernel; 14] = [
        MimiKernel::Conv,
        MimiKernel::ConvSplit,
        MimiKernel::ConvHistory,
        MimiKernel::ConvTranspose,
        MimiKernel::ConvTrSplit,
        MimiKernel::RvqDecode,
        MimiKernel::RvqScore,
        MimiKernel::RvqPick,
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
            MimiKernel::Conv => [CONV_IN, CONV_OUT, CONV].concat(),
            MimiKernel::ConvSplit => [CONV_IN, CONV_OUT, CONV_SPLIT].concat(),
            MimiKernel::ConvHistory => CONV_HISTORY.to_string(),
            MimiKernel::ConvTranspose => [CONV_OUT, CONV_TR_FULL, CONV_TRANSPOSE].concat(),
            MimiKernel::ConvTrSplit => [CONV_OUT, CONV_TR_FULL, CONV_TR_SPLIT].concat(),
            MimiKernel::RvqDecode => RVQ_DECODE.to_string(),
            MimiKernel::RvqScore => RVQ_SCORE.to_string(),
            MimiKernel::RvqPick => RVQ_PICK.to_string(),
            MimiKernel::Transpose => TRANSPOSE.to_string(),
            MimiKernel::LayerNorm => LAYER_NORM.to_string(),
            MimiKernel::Linear => LINEAR.to_string(),
            MimiKernel::RopeStore => ROPE_STORE.to_string(),
            MimiKernel::Attention => ATTENTION.to_string(),
            MimiKernel::Advance => ADVANCE.to_string(),
        };
        let main = if self.grid_launched() {
            ""
        } else {
            PER_INDEX_MAIN
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
        let reduce = if self.grid_launched()
            && !matches!(
                self,
                MimiKernel::Advance | MimiKernel::ConvSplit | MimiKernel::ConvTrSplit
            ) {
            REDUCE_256
        } else {
            ""
        };
        [&bindings, &params, ELU, reduce, &body, main].concat()
    }

    /// Whether the kernel has its own entry point over a grid of workgroups the host chooses
    /// (one workgroup per row, head, centroid team...), rather than one thread per index.
    pub(crate) fn grid_launched(self) -> bool {
        matches!(
            self,
            MimiKernel::ConvSplit
                | MimiKernel::ConvTrSplit
                | MimiKernel::RvqDecode
                | MimiKernel::RvqScore
                | MimiKernel::RvqPick
                | MimiKernel::LayerNorm
                | MimiKernel::Linear
                | MimiKernel::Attention
                | MimiKernel::Advance
        )
    }

    /// How the kernel binds its buffers (binding 0 is always the uniform block).
    pub(crate) fn access(self) -> &'static [Access] {
        use Access::{Read as R, Uniform as U, Write as W};
        match self {
            MimiKernel::Conv | MimiKernel::ConvSplit => &[U, R, R, R, R, W, W, R],
            MimiKernel::ConvHistory => &[U, R, W, R],
            MimiKernel::ConvTranspose => &[U, R, W, R, R, W, W],
            MimiKernel::ConvTrSplit => &[U, R, R, R, R, W, W, W],
            MimiKernel::RvqDecode => &[U, R, R, R, R, W],
            MimiKernel::RvqScore => &[U, R, R, R, R, W],
            MimiKernel::RvqPick => &[U, R, R, R, W, W],
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
            MimiKernel::Conv | MimiKernel::ConvSplit => {
                "cin, cout, k, stride, dilation, pad, tin, tout, replicate, counter, accumulate, \
                 elu_y, dual"
            }
            MimiKernel::ConvHistory => "cin, pad, tin, replicate, counter",
            MimiKernel::ConvTranspose | MimiKernel::ConvTrSplit => {
                "cin, cout, k, stride, tin, tout, tail_len, depthwise, accumulate, elu_y, dual"
            }
            MimiKernel::RvqDecode => "dim, cb_dim, bins, n_codebooks",
            MimiKernel::RvqScore => "cb_dim, bins, level, bound: f32",
            MimiKernel::RvqPick => "cb_dim, bins, n_codebooks, level",
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
            MimiKernel::Conv | MimiKernel::ConvSplit => {
                "x: f32, hist: f32, w: f32, bias: f32, y: f32, ye: f32, counters: u32"
            }
            MimiKernel::ConvHistory => "x: f32, hist: f32, counters: u32",
            MimiKernel::ConvTranspose => "x: f32, tail: f32, w: f32, bias: f32, y: f32, ye: f32",
            MimiKernel::ConvTrSplit => {
                "x: f32, tail: f32, w: f32, bias: f32, y: f32, ye: f32, tail_new: f32"
            }
            MimiKernel::RvqDecode => {
                "codes: u32, centroids: f32, w_first: f32, w_rest: f32, y: f32"
            }
            MimiKernel::RvqScore => {
                "x_first: f32, resid: f32, centroids: f32, stats: f32, scored: f32"
            }
            MimiKernel::RvqPick => "x_rest: f32, centroids: f32, scored: f32, resid: f32, out: u32",
            MimiKernel::Transpose => "src: f32, dst: f32",
            MimiKernel::LayerNorm => "x: f32, weight: f32, bias: f32, y: f32",
            MimiKernel::Linear => "x: f32, w: f32, y: f32, scale: f32",
            MimiKernel::RopeStore => "qkv: f32, kc: f32, vc: f32, freqs: f32, counters: u32",
            MimiKernel::Attention => "qkv: f32, kc: f32, vc: f32, out: f32, counters: u32",
            MimiKernel::Advance => "counters: u32",
        }
    }
}

/// The ELU (of the convolutions' outputs that feed an ELU convolution).
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

/// The input and output sides every convolution kernel shares. Padded column `j` of input
/// channel `c` is history column `j` for `j < pad` (the first input sample on the first frame
/// under replicate padding), else input column `j − pad`. The input is read as it is: a
/// convolution that takes an ELU of its input reads the ELU buffer its producer wrote
/// ([`CONV_OUT`]), so the ELU runs once per value, not once per weight tap and output.
const CONV_IN: &str = r#"
fn xin(c: u32, j: u32, first: bool) -> f32 {
    let pad = P.pad;
    if (j < pad) {
        return select(hist[c * pad + j], x[c * P.tin], first);
    }
    return x[c * P.tin + j - pad];
}
"#;

/// The output side of every convolution kernel: the finished value `v` of output `at` (bias
/// included) added to `y[at]` when `accumulate`; then `y[at]` gets it (or its ELU when
/// `elu_y`), and `ye[at]` its ELU when `dual` (the input of the next ELU convolution).
const CONV_OUT: &str = r#"
fn put(at: u32, v: f32) {
    var r = v;
    if (P.accumulate != 0u) {
        r = y[at] + r;
    }
    if (P.dual != 0u) {
        ye[at] = elu(r);
    }
    y[at] = select(r, elu(r), P.elu_y != 0u);
}
"#;

/// One thread per output `(o, t)` (time fastest, so a warp reads adjacent input columns and one
/// weight): the whole `cin·k` sum serially. For short sums (`cin·k` < 256: the full-rate
/// SEANet stages).
const CONV: &str = r#"
fn body(idx: u32) {
    let tout = P.tout;
    let o = idx / tout;
    let t = idx % tout;
    let first = P.replicate != 0u && counters[P.counter] == 0u;
    var acc = bias[o];
    for (var c = 0u; c < P.cin; c++) {
        for (var i = 0u; i < P.k; i++) {
            acc += w[(o * P.cin + c) * P.k + i] * xin(c, t * P.stride + i * P.dilation, first);
        }
    }
    put(o * tout + t, acc);
}
"#;

/// 64 threads per workgroup `(o, b)`: output channel `o`, output columns `8b .. 8b + 8`. The
/// `cin·k` sum is split across the threads (thread `l` takes terms `l, l + 64, ...`: its weight
/// loads are one contiguous row across the workgroup, and each weight is used for the 8
/// columns), then summed by a fixed tree. For long sums (the low-rate stages, 256–1024 channels).
const CONV_SPLIT: &str = r#"
var<workgroup> part0: array<vec4<f32>, 64>;
var<workgroup> part1: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = wid.x;
    let t0 = wid.y * 8u;
    let tout = P.tout;
    let k = P.k;
    let n = P.cin * k;
    let s = P.stride;
    let first = P.replicate != 0u && counters[P.counter] == 0u;
    // Columns past the last read the last one (in bounds; never written).
    let last = tout - 1u;
    let j0 = min(t0, last) * s;
    let j1 = min(t0 + 1u, last) * s;
    let j2 = min(t0 + 2u, last) * s;
    let j3 = min(t0 + 3u, last) * s;
    let j4 = min(t0 + 4u, last) * s;
    let j5 = min(t0 + 5u, last) * s;
    let j6 = min(t0 + 6u, last) * s;
    let j7 = min(t0 + 7u, last) * s;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    for (var r = lid; r < n; r += 64u) {
        let c = r / k;
        let off = (r - c * k) * P.dilation;
        let wv = w[o * n + r];
        a0 += wv * vec4<f32>(xin(c, j0 + off, first), xin(c, j1 + off, first),
                             xin(c, j2 + off, first), xin(c, j3 + off, first));
        a1 += wv * vec4<f32>(xin(c, j4 + off, first), xin(c, j5 + off, first),
                             xin(c, j6 + off, first), xin(c, j7 + off, first));
    }
    part0[lid] = a0;
    part1[lid] = a1;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (lid < h) {
            part0[lid] = part0[lid] + part0[lid + h];
            part1[lid] = part1[lid] + part1[lid + h];
        }
        workgroupBarrier();
    }
    if (lid < 8u && t0 + lid < tout) {
        var v: f32;
        if (lid < 4u) {
            v = part0[0][lid];
        } else {
            v = part1[0][lid - 4u];
        }
        put(o * tout + t0 + lid, v + bias[o]);
    }
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

/// The full transposed convolution's column `i` (without bias or tail) of output channel `o`,
/// over the input channels `c0, c0 + step, ...` (weights `[cout, cin, k]` on the device; a
/// depthwise one `[cout, 1, k]`). `tout = tin·stride`, `tail_len = k − stride ≤ tout`.
const CONV_TR_FULL: &str = r#"
fn full(o: u32, i: u32, c0: u32, step: u32) -> f32 {
    let k = P.k;
    let s = P.stride;
    let cin = P.cin;
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
            acc += w[o * k + j] * x[o * P.tin + t];
        } else {
            for (var c = c0; c < cin; c += step) {
                acc += w[(o * cin + c) * k + j] * x[c * P.tin + t];
            }
        }
    }
    return acc;
}
"#;

/// One thread per output `(o, i)`: the full column `i` plus the bias plus the kept tail; a thread
/// with `i < tail` also replaces tail column `i` with column `tout + i` of this call (it alone
/// reads and writes it). For depthwise and short sums.
const CONV_TRANSPOSE: &str = r#"
fn body(idx: u32) {
    let tout = P.tout;
    let pt = P.tail_len;
    let o = idx / tout;
    let i = idx % tout;
    var v = full(o, i, 0u, 1u) + bias[o];
    if (i < pt) {
        v += tail[o * pt + i];
        tail[o * pt + i] = full(o, tout + i, 0u, 1u);
    }
    put(o * tout + i, v);
}
"#;

/// 64 threads per workgroup `(o, b)`: columns `8b .. 8b + 8` of the `tout + tail_len` full
/// columns of output channel `o`, the input channels split across the threads, summed by a
/// fixed tree. A column below `tout` is written with the bias and the kept tail; a column
/// `tout + i` goes to `tail_new[i]` (the next launch copies it over the tail, so no workgroup
/// reads a tail column another overwrites).
const CONV_TR_SPLIT: &str = r#"
var<workgroup> part0: array<vec4<f32>, 64>;
var<workgroup> part1: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = wid.x;
    let i0 = wid.y * 8u;
    let a0 = vec4<f32>(full(o, i0, lid, 64u), full(o, i0 + 1u, lid, 64u),
                       full(o, i0 + 2u, lid, 64u), full(o, i0 + 3u, lid, 64u));
    let a1 = vec4<f32>(full(o, i0 + 4u, lid, 64u), full(o, i0 + 5u, lid, 64u),
                       full(o, i0 + 6u, lid, 64u), full(o, i0 + 7u, lid, 64u));
    part0[lid] = a0;
    part1[lid] = a1;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (lid < h) {
            part0[lid] = part0[lid] + part0[lid + h];
            part1[lid] = part1[lid] + part1[lid + h];
        }
        workgroupBarrier();
    }
    let tout = P.tout;
    let pt = P.tail_len;
    let i = i0 + lid;
    if (lid < 8u && i < tout + pt) {
        var v: f32;
        if (lid < 4u) {
            v = part0[0][lid];
        } else {
            v = part1[0][lid - 4u];
        }
        if (i < tout) {
            if (i < pt) {
                v += tail[o * pt + i];
            }
            put(o * tout + i, v + bias[o]);
        } else {
            tail_new[o * pt + i - tout] = v;
        }
    }
}
"#;

/// 256 threads as 8 teams of 32 lanes; workgroup `g` computes latent channels `8g .. 8g + 8`, a
/// team per channel: the semantic centroid through its output projection plus the sum of the
/// acoustic centroids (in level order) through theirs, the lanes striding the projection rows
/// 32 values apart and summing their parts by a fixed tree.
const RVQ_DECODE: &str = r#"
fn centroid(q: u32, j: u32) -> f32 {
    let code = min(codes[q], P.bins - 1u);
    return centroids[(q * P.bins + code) * P.cb_dim + j];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let cb = P.cb_dim;
    let c = wid.x * 8u + lid / 32u;
    let lane = lid % 32u;
    let row = min(c, P.dim - 1u) * cb;
    var acc = 0.0;
    for (var j = lane; j < cb; j += 32u) {
        var rest = 0.0;
        for (var q = 1u; q < P.n_codebooks; q++) {
            rest += centroid(q, j);
        }
        acc += w_first[row + j] * centroid(0u, j) + w_rest[row + j] * rest;
    }
    let total = reduce_team_32(lid, acc);
    if (lane == 0u && c < P.dim) {
        y[c] = total;
    }
}
"#;

/// The 256-thread tree reductions of the grid-launched kernels (a fixed pairing order, so every
/// workgroup that reduces the same values gets the same bits). Each call begins and ends with a
/// barrier, so the shared array is free again when it returns.
const REDUCE_256: &str = r#"
var<workgroup> red: array<f32, 256>;

fn reduce_256(lid: u32, v: f32, is_max: bool) -> f32 {
    workgroupBarrier();
    red[lid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let a = red[lid];
            let o = red[lid + s];
            red[lid] = select(a + o, max(a, o), is_max);
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

// Sums `v` over each aligned team of 32 lanes; lane 0 of each team gets its team's total.
fn reduce_team_32(lid: u32, v: f32) -> f32 {
    workgroupBarrier();
    red[lid] = v;
    workgroupBarrier();
    let lane = lid % 32u;
    for (var s = 16u; s > 0u; s >>= 1u) {
        if (lane < s) {
            red[lid] = red[lid] + red[lid + s];
        }
        workgroupBarrier();
    }
    return red[lid];
}
"#;

/// 256 threads as 8 teams of 32 lanes; workgroup `g` scores centroids `8g .. 8g + 8` of level
/// `level`, a team per centroid (its lanes read the centroid's row 32 values apart, so a team's
/// load is one contiguous 128-byte line, and sum their parts by a fixed tree). `‖x‖` comes from a
/// fixed-order tree that every workgroup evaluates identically. Writes `scored[2i] = v` and
/// `scored[2i + 1] = e` for centroid `i`: `v = ½‖c‖² − x·c` and its bound
/// `e = bound·‖c‖·‖x‖ + 4u(|½‖c‖²| + |v|)` (`bound` covers any summation order of the dot
/// product, so the tree's order keeps the proof).
const RVQ_SCORE: &str = r#"
fn x_at(j: u32) -> f32 {
    if (P.level == 0u) {
        return x_first[j];
    }
    return resid[j];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let cb = P.cb_dim;
    let bins = P.bins;
    var sq = 0.0;
    for (var j = lid; j < cb; j += 256u) {
        let v = x_at(j);
        sq += v * v;
    }
    let xn = sqrt(reduce_256(lid, sq, false));
    let i = wid.x * 8u + lid / 32u;
    let lane = lid % 32u;
    let k = P.level * bins + min(i, bins - 1u);
    var dot = 0.0;
    if (i < bins) {
        for (var j = lane; j < cb; j += 32u) {
            dot += centroids[k * cb + j] * x_at(j);
        }
    }
    let total = reduce_team_32(lid, dot);
    if (lane == 0u && i < bins) {
        let h = stats[2u * k];
        let v = h - total;
        let u = 5.9604645e-8;
        let e = P.bound * stats[2u * k + 1u] * xn + 4.0 * u * (abs(h) + abs(v)) + 1e-30;
        scored[2u * i] = v;
        scored[2u * i + 1u] = e;
    }
}
"#;

/// One workgroup of 256 threads. The smallest scored `v` wins (the first index on ties, in each
/// thread's increasing scan and in the tree); the level is marked when a centroid other than the
/// winner has a lower bound `v − e` at or below the smallest upper bound `v + e` (its code is then
/// decided by the host). Level 0 also copies the acoustic latent into the residual (level 0
/// never reads it); a level above 0 then removes its chosen centroid from the residual. Writes
/// `out[level]` and adds the level's mark to `out[n_codebooks]` (level 0 sets it).
const RVQ_PICK: &str = r#"
var<workgroup> best_i: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    let cb = P.cb_dim;
    let bins = P.bins;
    let q = P.level;
    var bv = 3.0e38;
    var bi = 0xffffffffu;
    var up = 3.0e38;
    for (var i = lid; i < bins; i += 256u) {
        let v = scored[2u * i];
        if (v < bv) {
            bv = v;
            bi = i;
        }
        up = min(up, v + scored[2u * i + 1u]);
    }
    // The smallest upper bound (a min as the negated max of the negations).
    let top = -reduce_256(lid, -up, true);
    // Argmin with the lowest index on ties: the shared value array of the reductions and the
    // index array, by the same tree.
    red[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ov = red[lid + s];
            let oi = best_i[lid + s];
            if (ov < red[lid] || (ov == red[lid] && oi < best_i[lid])) {
                red[lid] = ov;
                best_i[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    let win = best_i[0];
    // Centroids that the bound cannot rule out (a count, exact in f32).
    var hits = 0.0;
    for (var i = lid; i < bins; i += 256u) {
        if (scored[2u * i] - scored[2u * i + 1u] <= top) {
            hits += 1.0;
        }
    }
    let lower_hits = reduce_256(lid, hits, false);
    // A non-finite latent gives no winner: code 0, and the host decides.
    let code = select(0u, win, win < bins);
    if (lid == 0u) {
        out[q] = code;
        let mark = select(0u, 1u, lower_hits != 1.0 || win >= bins);
        let n = P.n_codebooks;
        out[n] = select(out[n], 0u, q == 0u) + mark;
    }
    for (var j = lid; j < cb; j += 256u) {
        if (q == 0u) {
            resid[j] = x_rest[j];
        } else {
            resid[j] = resid[j] - centroids[(q * bins + code) * cb + j];
        }
    }
}
"#;

/// One workgroup of 256 threads per row (the grid's x): the mean by a tree, then the variance
/// of the centred values by a tree (two passes, as the CPU), then the normalised row.
const LAYER_NORM: &str = r#"
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let d = P.d;
    let base = wid.x * d;
    var sum = 0.0;
    for (var c = lid; c < d; c += 256u) {
        sum += x[base + c];
    }
    let mean = reduce_256(lid, sum, false) / f32(d);
    var var_sum = 0.0;
    for (var c = lid; c < d; c += 256u) {
        let v = x[base + c] - mean;
        var_sum += v * v;
    }
    let inv = 1.0 / sqrt(reduce_256(lid, var_sum, false) / f32(d) + P.eps);
    for (var c = lid; c < d; c += 256u) {
        y[base + c] = (x[base + c] - mean) * inv * weight[c] + bias[c];
    }
}
"#;

/// `mode` 0: write, 1: `y += scale[o]·acc` (LayerScale residual), 2: `y = GELU(acc)` with erf.
/// 256 threads as 8 teams of 32 lanes; workgroup `(g, b)` computes outputs `8g .. 8g + 8` of rows
/// `4b .. 4b + 4`, a team per output: its lanes stride the weight row 32 values apart (one
/// contiguous 128-byte line per step, each weight loaded once and used for the 4 rows) and sum
/// their parts by a fixed tree. The erf is the Chebyshev fit of `erfc` (fractional error below
/// 1.2e-7) that the CPU kernels use.
const LINEAR: &str = r#"
var<workgroup> part: array<vec4<f32>, 256>;

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

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let cols = P.cols;
    let outs = P.outs;
    let rows = P.rows;
    let o = wid.x * 8u + lid / 32u;
    let lane = lid % 32u;
    let r0 = wid.y * 4u;
    // Rows past the last read the last row (in bounds; their sums are never written).
    let x0 = min(r0, rows - 1u) * cols;
    let x1 = min(r0 + 1u, rows - 1u) * cols;
    let x2 = min(r0 + 2u, rows - 1u) * cols;
    let x3 = min(r0 + 3u, rows - 1u) * cols;
    var acc = vec4<f32>(0.0);
    if (o < outs) {
        let wo = o * cols;
        for (var c = lane; c < cols; c += 32u) {
            let wv = w[wo + c];
            acc += wv * vec4<f32>(x[x0 + c], x[x1 + c], x[x2 + c], x[x3 + c]);
        }
    }
    part[lid] = acc;
    workgroupBarrier();
    for (var s = 16u; s > 0u; s >>= 1u) {
        if (lane < s) {
            part[lid] = part[lid] + part[lid + s];
        }
        workgroupBarrier();
    }
    if (lane < 4u && o < outs && r0 + lane < rows) {
        let a = part[lid - lane][lane];
        let idx = (r0 + lane) * outs + o;
        if (P.mode == 1u) {
            y[idx] = y[idx] + scale[o] * a;
        } else if (P.mode == 2u) {
            y[idx] = gelu(a);
        } else {
            y[idx] = a;
        }
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

/// `head_dim ≤ 128`. One workgroup of 256 threads per `(head, row)` (the grid's x and y): query
/// position `p = counter + row` attends to the positions still in the ring (the rows of this call
/// are stored already) within its context, `max(p + 1 − context, total − capacity) ..= p`, in
/// chunks of 256 keys with an online softmax: a thread per key scores it (the query held in
/// workgroup memory), tree max and sum, then the `256 / head_dim` groups of `head_dim` threads
/// each accumulate every group-th key's values for one output dimension (coalesced rows of V),
/// and a fixed-order sum of the groups gives the output.
const ATTENTION: &str = r#"
var<workgroup> q_s: array<f32, 128>;
var<workgroup> p_s: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let d = P.d;
    let hd = P.head_dim;
    let cap = P.capacity;
    let h = wid.x;
    let r = wid.y;
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
    let n = p + 1u - lo;
    let qo = r * 3u * d + h * hd;
    if (lid < hd) {
        q_s[lid] = qkv[qo + lid];
    }
    let groups = 256u / hd;
    let g = lid / hd;
    let jj = lid % hd;
    var m = -3.0e38;
    var l = 0.0;
    var acc = 0.0;
    for (var c0 = 0u; c0 < n; c0 += 256u) {
        workgroupBarrier();
        let live = c0 + lid < n;
        var s = -3.0e38;
        if (live) {
            let ko = ((lo + c0 + lid) % cap) * d + h * hd;
            var dot = 0.0;
            for (var j = 0u; j < hd; j++) {
                dot += q_s[j] * kc[ko + j];
            }
            s = dot * P.scale;
        }
        let m_new = max(m, reduce_256(lid, s, true));
        let pr = select(0.0, exp(s - m_new), live);
        p_s[lid] = pr;
        let f = exp(m - m_new);
        l = l * f + reduce_256(lid, pr, false);
        acc *= f;
        m = m_new;
        let cnt = min(256u, n - c0);
        if (g < groups) {
            for (var k = g; k < cnt; k += groups) {
                acc += p_s[k] * vc[((lo + c0 + k) % cap) * d + h * hd + jj];
            }
        }
    }
    workgroupBarrier();
    p_s[lid] = acc;
    workgroupBarrier();
    if (lid < hd) {
        var sum = 0.0;
        for (var k = 0u; k < groups; k++) {
            sum += p_s[k * hd + lid];
        }
        out[r * d + h * hd + lid] = sum / l;
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
