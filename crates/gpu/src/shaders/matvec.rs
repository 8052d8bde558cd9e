//! The weight-reading kernels: the matrix product (matvec over the step's rows) and the embedding
//! gather, one body each written once over a per-format `load4`.

use crate::WeightKind;

/// The group scale and bias of four consecutive weights (the kernels' uniform block `P` is
/// [`MatParams`], one bind group layout for all formats).
pub(super) const MAT_SCALES: &str = r#"

fn scale_of(r: u32, k: u32) -> u32 {
    // Group index of values 4k..4k+3 of row r (groups are multiples of 32 values).
    let s = r * (P.cols / P.group) + (4u * k) / P.group;
    return half_at(scales[s >> 1u], s);
}
fn bias_of(r: u32, k: u32) -> u32 {
    let s = r * (P.cols / P.group) + (4u * k) / P.group;
    return half_at(biases[s >> 1u], s);
}
"#;

/// `load4(r, k)`: weights `4k .. 4k+3` of row `r` of the bound chunk, as f32 (the signature
/// written once around each format's body).
pub(super) fn load4(kind: WeightKind) -> String {
    let body = match kind {
        WeightKind::F32 => {
            r#"
    let i = 4u * (r * (P.cols / 4u) + k);
    return vec4<f32>(bitcast<f32>(codes[i]), bitcast<f32>(codes[i + 1u]),
                     bitcast<f32>(codes[i + 2u]), bitcast<f32>(codes[i + 3u]));"#
        }
        // Two 16-bit values per word, low half first, decoded by the format's `half_to_f32`.
        WeightKind::F16 | WeightKind::Bf16 => {
            r#"
    let i = 2u * (r * (P.cols / 4u) + k);
    let a = codes[i];
    let b = codes[i + 1u];
    return vec4<f32>(half_to_f32(a & 0xffffu), half_to_f32(a >> 16u),
                     half_to_f32(b & 0xffffu), half_to_f32(b >> 16u));"#
        }
        WeightKind::Q8_0 => {
            r#"
    // Sign-extend each byte with an arithmetic shift (no extractBits: MSL before 1.2 lacks it).
    let w = codes[r * (P.cols / 4u) + k];
    let q = vec4<f32>(f32(bitcast<i32>(w << 24u) >> 24u), f32(bitcast<i32>(w << 16u) >> 24u),
                      f32(bitcast<i32>(w << 8u) >> 24u), f32(bitcast<i32>(w) >> 24u));
    return f16_bits_to_f32(scale_of(r, k)) * q;"#
        }
        // Per 32-value block, 4 words; byte j holds value j (low nibble) and j + 16 (high).
        WeightKind::Q4_0 => {
            r#"
    let m = k & 7u;
    let w = codes[r * (P.cols / 8u) + (k >> 3u) * 4u + (m & 3u)];
    let sh = select(0u, 4u, m >= 4u);
    let q = vec4<f32>(f32((w >> sh) & 15u), f32((w >> (8u + sh)) & 15u),
                      f32((w >> (16u + sh)) & 15u), f32((w >> (24u + sh)) & 15u));
    return f16_bits_to_f32(scale_of(r, k)) * (q - vec4<f32>(8.0));"#
        }
        // Eight values per word, low bits first.
        WeightKind::Mlx4 => {
            r#"
    let w = codes[r * (P.cols / 8u) + (k >> 1u)] >> (16u * (k & 1u));
    let q = vec4<f32>(f32(w & 15u), f32((w >> 4u) & 15u), f32((w >> 8u) & 15u), f32((w >> 12u) & 15u));
    return bf16_bits_to_f32(scale_of(r, k)) * q + vec4<f32>(bf16_bits_to_f32(bias_of(r, k)));"#
        }
        WeightKind::Mlx8 => {
            r#"
    let w = codes[r * (P.cols / 4u) + k];
    let q = vec4<f32>(f32(w & 255u), f32((w >> 8u) & 255u), f32((w >> 16u) & 255u), f32(w >> 24u));
    return bf16_bits_to_f32(scale_of(r, k)) * q + vec4<f32>(bf16_bits_to_f32(bias_of(r, k)));"#
        }
    };
    let half = match kind {
        WeightKind::F16 => "\nfn half_to_f32(h: u32) -> f32 {\n    return f16_bits_to_f32(h);\n}\n",
        WeightKind::Bf16 => {
            "\nfn half_to_f32(h: u32) -> f32 {\n    return bf16_bits_to_f32(h);\n}\n"
        }
        _ => "",
    };
    format!("{half}\nfn load4(r: u32, k: u32) -> vec4<f32> {{{body}\n}}\n")
}

/// `y[b, y_off + row0 + r] (+)= Σ_c W[r, c] · x[b, x_off + c]` for the chunk's rows `r` and the
/// step's `n` activation rows: one workgroup per weight row (the weights are read once for all
/// `n`), each thread a strided partial sum, then a fixed-order tree (deterministic, and a row's
/// result does not depend on `n`).
pub(super) const MATMUL_BODY: &str = r#"
var<workgroup> part: array<f32, 512>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let r = wid.x + wid.y * nwg.x;
    if (r >= P.rows) {
        return;
    }
    let n = min(u32(stepb[0]), MAXN);
    var acc: array<f32, 8>;
    for (var b = 0u; b < MAXN; b++) {
        acc[b] = 0.0;
    }
    let c4 = P.cols / 4u;
    for (var k = lid; k < c4; k += WG) {
        let w = load4(r, k);
        for (var b = 0u; b < n; b++) {
            let o = b * P.ld_x + P.x_off + 4u * k;
            acc[b] += dot(w, vec4<f32>(x[o], x[o + 1u], x[o + 2u], x[o + 3u]));
        }
    }
    for (var b = 0u; b < MAXN; b++) {
        part[b * WG + lid] = acc[b];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var b = 0u; b < n; b++) {
                part[b * WG + lid] += part[b * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        for (var b = 0u; b < n; b++) {
            let o = b * P.ld_y + P.y_off + P.row0 + r;
            var v = part[b * WG];
            if (P.accumulate != 0u) {
                v = y[o] + v;
            }
            y[o] = v;
        }
    }
}
"#;

/// `y[b, y_off + c] += table[token(b)][c]` for the step's `n` rows, when the row's token lies in
/// this chunk (`row0 .. row0 + rows`); token −1 adds nothing, other negative tokens read row 0
/// (the host has rejected tokens past the table). `x` is not read.
pub(super) const EMBED_BODY: &str = r#"
fn body(b: u32, k: u32) {
    let n = min(u32(stepb[0]), MAXN);
    if (b >= n || k >= P.cols / 4u) {
        return;
    }
    let t = stepb[P.tok_base + b * P.tok_stride + P.tok_slot];
    if (t == -1) {
        return;
    }
    let row = u32(max(t, 0));
    if (row < P.row0 || row >= P.row0 + P.rows) {
        return;
    }
    let w = load4(row - P.row0, k);
    let o = b * P.ld_y + P.y_off + 4u * k;
    y[o] = y[o] + w.x;
    y[o + 1u] = y[o + 1u] + w.y;
    y[o + 2u] = y[o + 2u] + w.z;
    y[o + 3u] = y[o + 3u] + w.w;
}
"#;
