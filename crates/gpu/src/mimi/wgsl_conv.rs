//! The WGSL of the SEANet kernels (convolutions, transposed convolutions, their streaming
//! state); see [`super::shaders`] for how a module is put together.

/// The input and output sides every convolution kernel shares. Padded column `j` of input
/// channel `c` is history column `j` for `j < pad` (the first input sample on the first frame
/// under replicate padding), else input column `j − pad`. The input is read as it is: a
/// convolution that takes an ELU of its input reads the ELU buffer its producer wrote
/// ([`CONV_OUT`]), so the ELU runs once per value, not once per weight tap and output.
pub(super) const CONV_IN: &str = r#"
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
pub(super) const CONV_OUT: &str = r#"
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
pub(super) const CONV: &str = r#"
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

/// The entry point of the split kernels ([`CONV_SPLIT`], [`CONV_TR_SPLIT`]): 64 threads per
/// workgroup `(o, b)` of output channel `o` and columns `8b .. 8b + 8`. Each thread's
/// `partial(o, c0, lid)` (its share of the 8 columns from `c0`: columns 0–3, then 4–7) is summed
/// over the workgroup by one fixed tree, and thread `lid < 8` hands column `c0 + lid`'s total to
/// the kernel's `column(o, c, v)`.
pub(super) const SPLIT_MAIN: &str = r#"
var<workgroup> part0: array<vec4<f32>, 64>;
var<workgroup> part1: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = slot_x(wid.x);
    let c0 = wid.y * 8u;
    let a = partial(o, c0, lid);
    part0[lid] = a[0];
    part1[lid] = a[1];
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (lid < h) {
            part0[lid] = part0[lid] + part0[lid + h];
            part1[lid] = part1[lid] + part1[lid + h];
        }
        workgroupBarrier();
    }
    if (lid < 8u) {
        var v: f32;
        if (lid < 4u) {
            v = part0[0][lid];
        } else {
            v = part1[0][lid - 4u];
        }
        column(o, c0 + lid, v);
    }
}
"#;

/// 64 threads per workgroup `(o, b)`: output channel `o`, output columns `8b .. 8b + 8`. The
/// `cin·k` sum is split across the threads (thread `l` takes terms `l, l + 64, ...`: its weight
/// loads are one contiguous row across the workgroup, and each weight is used for the 8
/// columns), then summed by [`SPLIT_MAIN`]'s fixed tree. For long sums (the low-rate stages,
/// 256–1024 channels).
pub(super) const CONV_SPLIT: &str = r#"
fn partial(o: u32, t0: u32, lid: u32) -> array<vec4<f32>, 2> {
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
    return array<vec4<f32>, 2>(a0, a1);
}

fn column(o: u32, t: u32, v: f32) {
    let tout = P.tout;
    if (t < tout) {
        put(o * tout + t, v + bias[o]);
    }
}
"#;

/// One thread per channel, in increasing column order
/// (column `i` reads column `i + tin` of the old history, not yet overwritten).
pub(super) const CONV_HISTORY: &str = r#"
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
pub(super) const CONV_TR_FULL: &str = r#"
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
pub(super) const CONV_TRANSPOSE: &str = r#"
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
/// columns of output channel `o`, the input channels split across the threads, summed by
/// [`SPLIT_MAIN`]'s fixed tree. A column below `tout` is written with the bias and the kept tail; a column
/// `tout + i` goes to `tail_new[i]` (the next launch copies it over the tail, so no workgroup
/// reads a tail column another overwrites).
pub(super) const CONV_TR_SPLIT: &str = r#"
fn partial(o: u32, i0: u32, lid: u32) -> array<vec4<f32>, 2> {
    let a0 = vec4<f32>(full(o, i0, lid, 64u), full(o, i0 + 1u, lid, 64u),
                       full(o, i0 + 2u, lid, 64u), full(o, i0 + 3u, lid, 64u));
    let a1 = vec4<f32>(full(o, i0 + 4u, lid, 64u), full(o, i0 + 5u, lid, 64u),
                       full(o, i0 + 6u, lid, 64u), full(o, i0 + 7u, lid, 64u));
    return array<vec4<f32>, 2>(a0, a1);
}

fn column(o: u32, i: u32, v: f32) {
    let tout = P.tout;
    let pt = P.tail_len;
    if (i < tout) {
        var u = v;
        if (i < pt) {
            u += tail[o * pt + i];
        }
        put(o * tout + i, u + bias[o]);
    } else if (i < tout + pt) {
        tail_new[o * pt + i - tout] = v;
    }
}
"#;
