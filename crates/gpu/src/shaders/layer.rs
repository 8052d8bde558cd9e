//! The transformer layer's kernels that read no quantized weights: RMS norm, RoPE and KV-ring
//! store, attention over the ring, gated SiLU.

/// RMS norm of each active row: `out = x · (w · 1/√(mean(x²) + eps))` (the CPU's grouping).
pub(super) const RMS_NORM: &str = r#"
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let b = wid.y;
    let base = b * M.d;
    var ss = 0.0;
    for (var c = lid; c < M.d; c += WG) {
        let v = x[base + c];
        ss += v * v;
    }
    let inv = 1.0 / sqrt(workgroup_reduce(lid, ss, false) / f32(M.d) + M.eps);
    for (var c = lid; c < M.d; c += WG) {
        dst[base + c] = x[base + c] * (w[M.w_off + c] * inv);
    }
}
"#;

/// RoPE (interleaved pairs, the host's cos/sin per row and frequency) on q and k of each active
/// row's fused `qkv`, then k and v stored in the row's session's ring at this step's slot. KV ring
/// layout per layer: `[session][slot][d]`.
pub(super) const ROPE_STORE: &str = r#"
fn body(b: u32, p: u32) {
    let d = M.d;
    if (p >= d / 2u) {
        return;
    }
    let j = 2u * p;
    let q0 = b * 3u * d + j;
    let k0 = q0 + d;
    let v0 = k0 + d;
    var k = vec2<f32>(qkv[k0], qkv[k0 + 1u]);
    if (M.rope != 0u) {
        let nhalf = M.head_dim / 2u;
        let ri = 2u * (b * nhalf + p % nhalf);
        let c = rope[ri];
        let s = rope[ri + 1u];
        let q = vec2<f32>(qkv[q0], qkv[q0 + 1u]);
        qkv[q0] = q.x * c - q.y * s;
        qkv[q0 + 1u] = q.x * s + q.y * c;
        k = vec2<f32>(k.x * c - k.y * s, k.x * s + k.y * c);
        qkv[k0] = k.x;
        qkv[k0 + 1u] = k.y;
    }
    let sess = u32(stepb[SESS + b]);
    var slot = u32(stepb[SLOT + b]);
    if (M.fixed_slot >= 0) {
        slot = u32(M.fixed_slot);
    }
    let o = (sess * M.ctx + slot) * d + j;
    kc[o] = k.x;
    kc[o + 1u] = k.y;
    vc[o] = qkv[v0];
    vc[o + 1u] = qkv[v0 + 1u];
}
"#;

/// One head of one active row per workgroup: softmax(q·kᵀ/√hd) v over the row's `count` most
/// recent ring entries (oldest first), scores in a storage scratch `[MAXN][heads][ctx]`.
pub(super) const ATTENTION: &str = r#"
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let b = wid.y;
    let d = M.d;
    let hd = M.head_dim;
    let sess = u32(stepb[SESS + b]);
    var newest = u32(stepb[SLOT + b]);
    var count = u32(stepb[COUNT + b]);
    if (M.fixed_slot >= 0) {
        newest = u32(M.fixed_slot);
        count = newest + 1u;
    }
    let q0 = b * 3u * d + h * hd;
    let sbase = (b * M.heads + h) * M.ctx;
    let inv = 1.0 / sqrt(f32(hd));
    let first = newest + M.ctx + 1u - count;
    var mx = -3.0e38;
    for (var e = lid; e < count; e += WG) {
        let slot = (first + e) % M.ctx;
        let k0 = (sess * M.ctx + slot) * d + h * hd;
        var s = 0.0;
        for (var t = 0u; t < hd; t++) {
            s += qkv[q0 + t] * kc[k0 + t];
        }
        s = s * inv;
        scores[sbase + e] = s;
        mx = max(mx, s);
    }
    let m = workgroup_reduce(lid, mx, true);
    var sum = 0.0;
    for (var e = lid; e < count; e += WG) {
        let p = exp(scores[sbase + e] - m);
        scores[sbase + e] = p;
        sum += p;
    }
    // Every thread reads every score below.
    storageBarrier();
    let norm = 1.0 / workgroup_reduce(lid, sum, false);
    for (var t = lid; t < hd; t += WG) {
        var acc = 0.0;
        for (var e = 0u; e < count; e++) {
            let slot = (first + e) % M.ctx;
            acc += scores[sbase + e] * vc[(sess * M.ctx + slot) * d + h * hd + t];
        }
        dst[b * d + h * hd + t] = acc * norm;
    }
}
"#;

/// `u = silu(g[.., :hidden]) · g[.., hidden:]` for each active row.
pub(super) const GATE: &str = r#"
fn body(b: u32, j: u32) {
    if (j >= M.hidden) {
        return;
    }
    let a = g[b * 2u * M.hidden + j];
    u[b * M.hidden + j] = a / (1.0 + exp(-a)) * g[b * 2u * M.hidden + M.hidden + j];
}
"#;
