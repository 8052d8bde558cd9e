//! The WGSL of the RVQ and transformer kernels (and the transpose and counter kernels); see
//! [`super::shaders`] for how a module is put together.

/// 256 threads as 8 teams of 32 lanes; workgroup `g` computes latent channels `8g .. 8g + 8`, a
/// team per channel: the semantic centroid through its output projection plus the sum of the
/// acoustic centroids (in level order) through theirs, the lanes striding the projection rows
/// 32 values apart and summing their parts by a fixed tree.
pub(super) const RVQ_DECODE: &str = r#"
fn centroid(q: u32, j: u32) -> f32 {
    let code = min(codes[q], P.bins - 1u);
    return centroids[(q * P.bins + code) * P.cb_dim + j];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let wx = slot_x(wid.x);
    let cb = P.cb_dim;
    let c = wx * 8u + lid / 32u;
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

/// 256 threads as 8 teams of 32 lanes; workgroup `g` scores centroids `8g .. 8g + 8` of level
/// `level`, a team per centroid (its lanes read the centroid's row 32 values apart, so a team's
/// load is one contiguous 128-byte line, and sum their parts by a fixed tree). `‖x‖` comes from a
/// fixed-order tree that every workgroup evaluates identically. Writes `scored[2i] = v` and
/// `scored[2i + 1] = e` for centroid `i`: `v = ½‖c‖² − x·c` and its bound
/// `e = bound·‖c‖·‖x‖ + 4u(|½‖c‖²| + |v|)` (`bound` covers any summation order of the dot
/// product, so the tree's order keeps the proof).
pub(super) const RVQ_SCORE: &str = r#"
fn x_at(j: u32) -> f32 {
    if (P.level == 0u) {
        return x_first[j];
    }
    return resid[j];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let wx = slot_x(wid.x);
    let cb = P.cb_dim;
    let bins = P.bins;
    var sq = 0.0;
    for (var j = lid; j < cb; j += 256u) {
        let v = x_at(j);
        sq += v * v;
    }
    let xn = sqrt(reduce_256(lid, sq, false));
    let i = wx * 8u + lid / 32u;
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
pub(super) const RVQ_PICK: &str = r#"
var<workgroup> best_i: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    _ = slot_x(wid.x);
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
pub(super) const LAYER_NORM: &str = r#"
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let wx = slot_x(wid.x);
    let d = P.d;
    let base = wx * d;
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
pub(super) const LINEAR: &str = r#"
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
    let wx = slot_x(wid.x);
    let cols = P.cols;
    let outs = P.outs;
    let rows = P.rows;
    let o = wx * 8u + lid / 32u;
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
pub(super) const TRANSPOSE: &str = r#"
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
pub(super) const ROPE_STORE: &str = r#"
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
pub(super) const ATTENTION: &str = r#"
var<workgroup> q_s: array<f32, 128>;
var<workgroup> p_s: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = slot_x(wid.x);
    let d = P.d;
    let hd = P.head_dim;
    let cap = P.capacity;
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
pub(super) const ADVANCE: &str = r#"
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    _ = slot_x(wid.x);
    if (lid == 0u) {
        counters[P.counter] = counters[P.counter] + P.amount;
    }
}
"#;
