//! The transformer layer's kernels that read no quantized weights: RMS norm, attention over the
//! KV ring (split-K flash decoding: [`ATTENTION`], which also applies RoPE and stores this step's
//! k and v, then [`ATTENTION_MERGE`]), gated SiLU.
//!
//! # Attention arithmetic at Moshi's shapes
//!
//! Temporal transformer: 32 layers of 32 heads × 128 (d = 4096), a ring of 3000 entries, key
//! chunks of 64 (47 chunks per head). Per layer and row the split-K pass launches 32 × 47 = 1504
//! workgroups of 64 threads and the merge 32; per frame 48 128 + 1024 workgroups, 2 dispatches
//! per layer (the pass with RoPE and the KV store folded in, the merge: as many as the store and
//! the one-workgroup-per-head attention before).
//!
//! | position | K + V read per frame, f32 | bf16 | at 3.3 TB/s, f32 | bf16 |
//! |---|---|---|---|---|
//! | 0 (1 entry) | 1.0 MB | 0.5 MB | 0.3 µs | 0.15 µs |
//! | 3000 (full ring) | 3.15 GB (98.3 MB a layer) | 1.57 GB | 953 µs (29.8 µs a layer) | 477 µs |
//!
//! The partials add 1504 × 130 floats (0.78 MB) written and read per layer: 50 MB a frame at
//! 3000, 15 µs, 1.6 % of the f32 K + V bytes. At position 0 only 32 of a layer's 1504 workgroups
//! find a key (the rest return at their first instruction), so the layer costs what its launches
//! cost, not bytes. The Depformer (16 heads × 64, a ring of its 8 steps) fits one chunk: its
//! pass writes the normalised output itself (`M.direct`), 16 workgroups a layer and no merge,
//! reading at most 8 × 1024 × 2 × 4 B = 64 KB: one dispatch a layer where there were two
//! (48 fewer a frame).
//!
//! Why chunks of 64 keys: one key per thread of the 64-thread workgroup for the softmax of the
//! chunk (a single fixed-order tree reduction for its maximum and one for its sum, no online
//! rescaling inside the chunk), and 1504 workgroups at 3000 is 11 per SM of an H200's 132, each
//! with 64 KB (f32) of K and V to stream: enough in flight to cover DRAM latency. Chunks of 128
//! would leave 5.7 workgroups per SM and twice the serial work per thread; chunks of 32 would
//! double the partials' bytes and the merge's work and launch 3008 mostly idle workgroups per
//! layer at position 0. Before this split one workgroup per head (32 per layer) walked all 3000
//! keys, each thread ~47 keys × 128 serial multiply-adds and every output dimension all keys again
//! with a `%` per key: issue 28 read ~27 GB/s effective from it on an H200, the main part of a
//! 143 ms frame at position 3000.

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

/// Split-K attention, first pass, with RoPE and the KV store folded in: workgroup `x = c · heads +
/// h` of active row `y` rotates head `h` of the row's q as it loads it (RoPE on interleaved pairs,
/// the host's cos/sin per row and frequency; none for the Depformer); the workgroup whose chunk
/// holds the newest entry first rotates head `h` of this step's k and stores it and v in the
/// row's session's ring at this step's slot (no other workgroup of the step reads that slot, so
/// no other needs to wait for it). KV ring layout per layer: `[session][slot][d]` in 32-bit
/// words: one f32 per word, or with `M.kv16` two bf16 per word (value `2i` in the low half,
/// rounded to nearest even as the CPU's `KvDtype::Bf16` rounds; a thread's pair is exactly one
/// word). Then it scores key chunk `c` (the row's attended entries `c · chunk ..` in age order,
/// at most `chunk ≤ 64` of them) of head `h` and writes its partial: the chunk's maximum score `m`, `l = Σ exp(s − m)` and the
/// unnormalised `acc = Σ exp(s − m) v` at `part[((b · heads + h) · nchunks + c) · (head_dim + 2)
/// ..]` as `[m, l, acc..]`. A chunk past the row's count returns at once. With `M.direct` (one
/// chunk covers the whole ring: the Depformer, short contexts) it writes `acc / l` to `dst` and no
/// merge follows.
///
/// Scores: 8 keys at a time, 8 threads per key, each thread a strided eighth of the dot product,
/// so each 8-thread group reads one key's contiguous 32-byte runs and a 32-thread SIMD group reads
/// four keys' runs at once; the 8 partial dots are summed in a fixed order by the key's thread.
/// Values: thread `t` owns KV word `t` (and `t + 64`, ...) of the head and walks the chunk's keys,
/// so each step reads whole contiguous 128-byte rows. The ring position of a chunk is found once
/// (one `%` per workgroup); inside the chunk the slot advances and wraps by a compare, never a `%`.
pub(super) const ATTENTION: &str = r#"
const LANES: u32 = 8u;
const MAX_HD: u32 = 256u;

var<workgroup> qs: array<f32, MAX_HD>;
var<workgroup> dots: array<f32, 512>;
var<workgroup> probs: array<f32, 64>;

// f32 -> bf16 bits, rounded to nearest even, a NaN kept quiet (the CPU's `to_bf16`).
fn bf16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (b | 0x00400000u) >> 16u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

// Pair `v` rotated by the angle of frequency `t` of active row `b` (when the stack has RoPE).
fn rotate(v: vec2<f32>, b: u32, t: u32) -> vec2<f32> {
    if (M.rope == 0u) {
        return v;
    }
    let ri = 2u * (b * (M.head_dim / 2u) + t);
    let c = rope[ri];
    let s = rope[ri + 1u];
    return vec2<f32>(v.x * c - v.y * s, v.x * s + v.y * c);
}

// The two values of a 16-bit KV word (low half first).
fn bf16_pair(x: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(x << 16u), bitcast<f32>(x & 0xffff0000u));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x % M.heads;
    let c = wid.x / M.heads;
    let b = wid.y;
    let sess = u32(stepb[SESS + b]);
    var newest = u32(stepb[SLOT + b]);
    var count = u32(stepb[COUNT + b]);
    if (M.fixed_slot >= 0) {
        newest = u32(M.fixed_slot);
        count = newest + 1u;
    }
    let start = c * M.chunk;
    if (start >= count) {
        return;
    }
    let len = min(M.chunk, count - start);
    let d = M.d;
    let hd = M.head_dim;
    let kv16 = M.kv16 != 0u;
    // KV words per head and per ring entry.
    let hw = select(hd, hd / 2u, kv16);
    let ew = select(d, d / 2u, kv16);
    let q0 = b * 3u * d + h * hd;
    let nhalf = hd / 2u;
    for (var t = lid; t < nhalf; t += WG) {
        let q = rotate(vec2<f32>(qkv[q0 + 2u * t], qkv[q0 + 2u * t + 1u]), b, t);
        qs[2u * t] = q.x;
        qs[2u * t + 1u] = q.y;
    }
    let ring = sess * M.ctx;
    let head = h * hw;
    if (c == (count - 1u) / M.chunk) {
        let k0 = q0 + d;
        let v0 = k0 + d;
        for (var t = lid; t < nhalf; t += WG) {
            let k = rotate(vec2<f32>(qkv[k0 + 2u * t], qkv[k0 + 2u * t + 1u]), b, t);
            let v = vec2<f32>(qkv[v0 + 2u * t], qkv[v0 + 2u * t + 1u]);
            if (kv16) {
                let o = (ring + newest) * ew + head + t;
                kc[o] = bf16_bits(k.x) | (bf16_bits(k.y) << 16u);
                vc[o] = bf16_bits(v.x) | (bf16_bits(v.y) << 16u);
            } else {
                let o = (ring + newest) * ew + head + 2u * t;
                kc[o] = bitcast<u32>(k.x);
                kc[o + 1u] = bitcast<u32>(k.y);
                vc[o] = bitcast<u32>(v.x);
                vc[o + 1u] = bitcast<u32>(v.y);
            }
        }
        // This workgroup reads the entry back below.
        storageBarrier();
    }
    // The chunk's first slot: the oldest attended entry is `newest + 1 − count` (mod ctx).
    var s0 = (newest + M.ctx + 1u - count) % M.ctx + start;
    if (s0 >= M.ctx) {
        s0 -= M.ctx;
    }
    workgroupBarrier();

    let kl = lid / LANES;
    let dl = lid % LANES;
    for (var e0 = 0u; e0 < len; e0 += WG / LANES) {
        let e = e0 + kl;
        if (e < len) {
            var slot = s0 + e;
            if (slot >= M.ctx) {
                slot -= M.ctx;
            }
            let k0 = (ring + slot) * ew + head;
            var acc = 0.0;
            if (kv16) {
                for (var w = dl; w < hw; w += LANES) {
                    let kv = bf16_pair(kc[k0 + w]);
                    acc += qs[2u * w] * kv.x + qs[2u * w + 1u] * kv.y;
                }
            } else {
                for (var w = dl; w < hw; w += LANES) {
                    acc += qs[w] * bitcast<f32>(kc[k0 + w]);
                }
            }
            dots[e * LANES + dl] = acc;
        }
    }
    workgroupBarrier();
    var s = -3.0e38;
    if (lid < len) {
        var t = 0.0;
        for (var i = 0u; i < LANES; i++) {
            t += dots[lid * LANES + i];
        }
        s = t / sqrt(f32(hd));
    }
    let m = workgroup_reduce(lid, s, true);
    var p = 0.0;
    if (lid < len) {
        p = exp(s - m);
    }
    probs[lid] = p;
    // The reduction's first barrier also publishes `probs` to every thread.
    let l = workgroup_reduce(lid, p, false);

    let direct = M.direct != 0u;
    let inv_l = 1.0 / l;
    let pbase = ((b * M.heads + h) * M.nchunks + c) * (hd + 2u);
    let obase = b * d + h * hd;
    for (var w = lid; w < hw; w += WG) {
        var a = vec2<f32>(0.0, 0.0);
        var slot = s0;
        for (var e = 0u; e < len; e++) {
            let x = vc[(ring + slot) * ew + head + w];
            if (kv16) {
                a += probs[e] * bf16_pair(x);
            } else {
                a.x += probs[e] * bitcast<f32>(x);
            }
            slot += 1u;
            if (slot == M.ctx) {
                slot = 0u;
            }
        }
        if (kv16) {
            if (direct) {
                dst[obase + 2u * w] = a.x * inv_l;
                dst[obase + 2u * w + 1u] = a.y * inv_l;
            } else {
                part[pbase + 2u + 2u * w] = a.x;
                part[pbase + 3u + 2u * w] = a.y;
            }
        } else if (direct) {
            dst[obase + w] = a.x * inv_l;
        } else {
            part[pbase + 2u + w] = a.x;
        }
    }
    if (!direct && lid == 0u) {
        part[pbase] = m;
        part[pbase + 1u] = l;
    }
}
"#;

/// Split-K attention, merge: workgroup `h` of active row `y` combines the row's chunk partials of
/// head `h` in chunk order (fixed, so the result does not depend on the device's scheduling or on
/// the other rows): `M = max m_c`, `out = Σ exp(m_c − M) acc_c / Σ exp(m_c − M) l_c`.
pub(super) const ATTENTION_MERGE: &str = r#"
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let b = wid.y;
    var count = u32(stepb[COUNT + b]);
    if (M.fixed_slot >= 0) {
        count = u32(M.fixed_slot) + 1u;
    }
    let n = (count + M.chunk - 1u) / M.chunk;
    let hd = M.head_dim;
    let stride = hd + 2u;
    let base = (b * M.heads + h) * M.nchunks;
    var mx = -3.0e38;
    for (var c = 0u; c < n; c++) {
        mx = max(mx, part[(base + c) * stride]);
    }
    var l = 0.0;
    for (var c = 0u; c < n; c++) {
        let o = (base + c) * stride;
        l += part[o + 1u] * exp(part[o] - mx);
    }
    // No entry: zeros (as the CPU's attention).
    let inv = select(0.0, 1.0 / l, n > 0u);
    for (var t = lid; t < hd; t += WG) {
        var a = 0.0;
        for (var c = 0u; c < n; c++) {
            let o = (base + c) * stride;
            a += part[o + 2u + t] * exp(part[o] - mx);
        }
        dst[b * M.d + h * hd + t] = a * inv;
    }
}
"#;
